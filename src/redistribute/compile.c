/* SPDX-License-Identifier: Apache-2.0 */
/* Plan compilation, run once by dtl_plan_create: checks that the steps chain legally, derives this rank's part
 * of every step (its boxes, every peer's box on the dims the step splits, the counts and facts of the whole
 * group, chunking), and places every intermediate shard in the caller's buffers or one scratch buffer so that
 * an execution allocates as little as possible. The result depends only on the plan, the mesh and the
 * transport's capabilities, so it is computed before any call and every call replays it. */
#include <stdlib.h>
#include <string.h>
#include "redistribute/executor_internal.h"
#include "redistribute/cost.h"
#include "redistribute/xmap.h"

/* Blocks that split tensor dim d of a row-major box, taken in increasing offset order, are consecutive in
 * memory exactly when every dim before d has extent 1 (or the box is empty). */
static bool dtl__split_is_contiguous(int nd, const int64_t *shape, int d) {
  int64_t outer = 1;
  for (int e = 0; e < d; e++) outer *= shape[e];
  return outer <= 1 || dtl__box_count(nd, shape) == 0;
}

static bool dtl__same_placement(dtl_placement p, dtl_placement q) {
  if (p.kind != q.kind) return false;
  if (p.kind == DTL_SHARD) return p.dim == q.dim;
  if (p.kind == DTL_PARTIAL) return p.op == q.op;
  return true;
}

/* The plan must chain from src to dst one mesh dim at a time, each kind must match its placements, and a
 * step may only undo or make the innermost split of a tensor dim (a later mesh dim splitting the same tensor
 * dim would make the group's blocks non-boxes). Mesh dims of size 1 are ignored: any placement there is a
 * relabeling (the planner writes dst's). Depends on placements only, so every rank agrees. */
static dtl_status dtl__plan_check(const char *fn, const dtl_plan *p) {
  const dtl_mesh *mesh = p->src.mesh;
  int nm = mesh->ndim;
  if (p->nsteps < 0 || p->nsteps > DTL__MAX_PLAN_STEPS)
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan has %d steps (expected 0..%d)", p->nsteps, DTL__MAX_PLAN_STEPS);
  const dtl_placement *cur = p->src.placements;
  bool cross = p->src.mesh != p->dst.mesh;
  for (int k = 0; k < p->nsteps; k++) {
    const dtl__plan_step *s = &p->steps[k];
    int md = s->mesh_dim;
    if (s->kind == DTL__STEP_EXCHANGE) {
      if (k != p->nsteps - 1) return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan step %d: an exchange that is not last", k);
      for (int d = 0; d < nm; d++) {
        if (mesh->shape[d] == 1) continue;
        if (!dtl__same_placement(s->before[d], cur[d]))
          return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan step %d: its placement before on mesh dim %d is not the one "
                               "the previous step left", k, d);
        if (cur[d].kind == DTL_PARTIAL)
          return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan step %d: an exchange from a pending Partial (mesh dim %d)", k, d);
      }
      for (int d = 0; d < p->dst.mesh->ndim; d++)
        if (!dtl__same_placement(s->after[d], p->dst.placements[d]))
          return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan step %d: an exchange that does not end at the target", k);
      return DTL_OK;
    }
    if (md < 0 || md >= nm)
      return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan step %d: mesh_dim=%d (expected 0..%d)", k, md, nm - 1);
    for (int d = 0; d < nm; d++) {
      for (int w = 0; w < 2; w++) {
        dtl_placement q = w ? s->after[d] : s->before[d];
        if (q.kind == DTL_SHARD && (q.dim < 0 || q.dim >= p->src.ndim))
          return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan step %d: S(%d) on mesh dim %d for a %d-d tensor", k, q.dim, d,
                               p->src.ndim);
      }
      if (mesh->shape[d] == 1) continue;
      if (!dtl__same_placement(s->before[d], cur[d]))
        return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan step %d: its placement before on mesh dim %d is not the one the "
                             "previous step left", k, d);
      if (d != md && !dtl__same_placement(s->before[d], s->after[d]))
        return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan step %d on mesh dim %d also changes mesh dim %d", k, md, d);
    }
    dtl_placement_kind from = s->before[md].kind, to = s->after[md].kind;
    static const dtl_placement_kind want[8][2] = {
        [DTL__STEP_ALL_GATHER] = {DTL_SHARD, DTL_REPLICATE},     [DTL__STEP_ALL_REDUCE] = {DTL_PARTIAL, DTL_REPLICATE},
        [DTL__STEP_REDUCE_SCATTER] = {DTL_PARTIAL, DTL_SHARD},   [DTL__STEP_ALL_TO_ALL] = {DTL_SHARD, DTL_SHARD},
        [DTL__STEP_LOCAL_SLICE] = {DTL_REPLICATE, DTL_SHARD},    [DTL__STEP_LOCAL_PARTIAL] = {DTL_REPLICATE, DTL_PARTIAL},
        [DTL__STEP_EXCHANGE] = {DTL_REPLICATE, DTL_REPLICATE},   [DTL__STEP_LOCAL_EMBED] = {DTL_SHARD, DTL_PARTIAL}};
    if ((unsigned)s->kind > DTL__STEP_LOCAL_EMBED || s->kind == DTL__STEP_EXCHANGE || want[s->kind][0] != from ||
        want[s->kind][1] != to)
      return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan step %d: kind %d does not turn placement kind %d into %d on mesh dim %d",
                           k, (int)s->kind, (int)from, (int)to, md);
    for (int w = 0; w < 2; w++) {
      const dtl_placement *pl = w ? s->after : s->before;
      if (pl[md].kind != DTL_SHARD) continue;
      for (int d = md + 1; d < nm; d++)
        if (pl[d].kind == DTL_SHARD && pl[d].dim == pl[md].dim && mesh->shape[d] > 1)
          return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "plan step %d (%s on mesh dim %d) changes a split of tensor dim %d "
                               "that mesh dim %d splits further; only the innermost split of a tensor dim can change",
                               k, dtl__plan_step_name(s->kind), md, pl[md].dim, d);
    }
    cur = s->after;
  }
  if (cross) return dtl__error_fn(DTL_ERR_INTERNAL, fn, "a plan between two meshes without an exchange");
  for (int d = 0; d < nm; d++)
    if (mesh->shape[d] > 1 && !dtl__same_placement(cur[d], p->dst.placements[d]))
      return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan ends on mesh dim %d with a placement other than the target's", d);
  return DTL_OK;
}

/* Bytes of one chunk of a pack/unpack pass on host memory: small enough that the pass reads the received
 * (or writes the packed) chunk from cache, large enough that the extra collective calls cost little. Device
 * memory (NCCL) takes each collective whole: its kernels copy at memory speed and launches are dear. */
#define DTL__HOST_CHUNK_BYTES ((size_t)1 << 20)
/* An all-to-all is chunked only when an average shard holds this many chunks (see dtl__chunk_all_to_all). */
#define DTL__A2A_MIN_CHUNKS 32
static size_t dtl__chunk_bytes = DTL__HOST_CHUNK_BYTES, dtl__a2a_min_chunks = DTL__A2A_MIN_CHUNKS;

void dtl__executor_set_chunking(size_t chunk_bytes, size_t a2a_min_chunks) {
  dtl__chunk_bytes = chunk_bytes ? chunk_bytes : DTL__HOST_CHUNK_BYTES;
  dtl__a2a_min_chunks = a2a_min_chunks ? a2a_min_chunks : DTL__A2A_MIN_CHUNKS;
}

/* Chunking of a pass over a box whose outermost non-trivial dim the step leaves alone: sets e->cdim and
 * e->crows for a box of count elements and returns the temporary elements one chunk needs. The values
 * depend only on the box (the same on every member of the group for the boxes used here) and the memory. */
static size_t dtl__chunking(dtl__ex_step *e, int nd, const int64_t *shape, size_t count, size_t es, dtl_memory mem,
                            size_t budget_chunk) {
  e->crows = 0;
  if ((mem != DTL_MEMORY_HOST && !budget_chunk) || count == 0) return count;
  int c0 = 0;
  while (c0 < nd - 1 && shape[c0] <= 1) c0++;
  size_t chunk = budget_chunk ? budget_chunk : dtl__chunk_bytes;
  size_t row = count / (size_t)shape[c0], per = chunk / es / (row ? row : 1);
  if (per < 1) per = 1;
  if ((int64_t)per >= shape[c0]) return count;
  e->cdim = c0;
  e->crows = (int64_t)per;
  return per * row;
}

/* Chunks an all-to-all S(i) -> S(j) over a group of g when its shards are large; otherwise returns false. Every chunk packs its send
 * blocks and unpacks its received ones through two chunk-sized regions. The group's box spans the input box
 * on every dim but i and the output box on i; its outermost dim of extent > 1 is the chunk dim, and its row
 * size fixes the rows per chunk, alike on every member. */
static bool dtl__chunk_all_to_all(dtl__ex_step *e, int nd, int i, int j, int g, size_t es, dtl_memory mem, bool displs) {
  if (mem != DTL_MEMORY_HOST || i == j) return false;
  int64_t parent[DTL_MAX_TENSOR_DIMS] = {0};
  size_t pcount = 1;
  for (int d = 0; d < nd; d++) pcount *= (size_t)(parent[d] = d == i ? e->out_shape[d] : e->in_shape[d]);
  if (pcount == 0) return false;
  int c0 = 0;
  while (c0 < nd - 1 && parent[c0] <= 1) c0++;
  size_t row = pcount / (size_t)parent[c0], per = dtl__chunk_bytes / es / row;
  if (per < 1) per = 1;
  /* Only shards of 32 chunks or more (an average member's, from the group's box, so that all members agree).
   * On a plain transport chunking adds a pass (every piece is packed and unpacked) and a collective per chunk;
   * it pays when the whole-shard temporary is large enough to cost page faults and cache misses on every call
   * (measured on 2 ranks: 8 MiB shards ran slower chunked, 32 MiB shards 1.3-1.8x faster). The chunk regions
   * then stay far inside the unchunked temporary. On a transport with all_to_allv_displs (displs) a chunk packs
   * only a side the step scatters and moves the other in place, so chunking adds no pass there; yet from
   * smaller shards (4-16 MiB on 2 and 4 ranks) it gained little on a quiet machine, and every chunk is one more
   * point where all members wait for each other, which cost more on a loaded one: the threshold stays. */
  if ((int64_t)per >= parent[c0] || pcount / (size_t)g < dtl__a2a_min_chunks * per * row) return false;
  e->cdim = c0;
  e->crows = (int64_t)per;
  e->cmode = c0 == i ? 1 : c0 == j ? 2 : 0;
  e->cbase = c0 == i ? e->out_off[c0] : e->in_off[c0];
  size_t in_row = e->a ? e->a / (size_t)e->in_shape[c0] : 0, out_row = e->b ? e->b / (size_t)e->out_shape[c0] : 0;
  /* Sender-local rows: a receiver gets a chunk from every peer; receiver-local: a sender serves every peer. */
  size_t send = per * in_row * (e->cmode == 2 ? (size_t)g : 1), recv = per * out_row * (e->cmode == 1 ? (size_t)g : 1);
  e->tsend = send < e->a ? send : e->a;
  e->t = e->tsend + (recv < e->b ? recv : e->b);
  if (displs) {
    /* Only a side the step scatters needs its region (chunk dim i leaves the receive side unscattered, j the
     * send side): at most two chunks of this rank's rows in all. */
    if (!e->pack) e->tsend = 0;
    e->t = e->tsend + (e->unpack ? (recv < e->b ? recv : e->b) : 0);
  } else {
    e->pack = e->unpack = true;
  }
  return true;
}

/* A rank as a plan sees it: its mesh rank and coordinate in the source and the target mesh (-1 outside), and its
 * local source and target elements. The plan's steps before an exchange run on the source mesh. */
typedef struct {
  int s, d;
  int scoord[DTL_MAX_MESH_DIMS], dcoord[DTL_MAX_MESH_DIMS];
  size_t a0, d0;
} dtl__view;

static void dtl__coord_of(const dtl_mesh *m, int r, int *c) {
  for (int d = m->ndim - 1; d >= 0; d--) {
    c[d] = r % m->shape[d];
    r /= m->shape[d];
  }
}

/* The rank that is source mesh rank s and target mesh rank d (-1: outside). */
static void dtl__view_of(const dtl_plan *p, int s, int d, dtl__view *v) {
  memset(v, 0, sizeof *v);
  v->s = s;
  v->d = d;
  int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
  if (s >= 0) {
    dtl__coord_of(p->src.mesh, s, v->scoord);
    dtl__xbox(p->qgeom, p->qpart, false, p->src.mesh, p->src.ndim, p->src.shape, p->src.placements, v->scoord, bs, bo);
    v->a0 = dtl__box_count(p->src.ndim, bs);
  }
  if (d >= 0) {
    dtl__coord_of(p->dst.mesh, d, v->dcoord);
    dtl__xbox(p->qgeom, p->qpart, false, p->dst.mesh, p->dst.ndim, p->dst.shape, p->dst.placements, v->dcoord, bs, bo);
    v->d0 = dtl__box_count(p->dst.ndim, bs);
  }
}

/* Part of every step for rank v: its boxes, what it does, and how much temporary room that needs (an exchange's
 * comes from its messages, dtl__exchange_messages). */
static void dtl__analyze(const dtl_plan *p, const dtl__view *v, dtl__ex_step *ex) {
  const dtl_mesh *mesh = p->src.mesh;
  int nd = p->src.ndim;
  size_t es = dtl_dtype_size(p->src.dtype);
  dtl_memory mem = dtl__mesh_mem(mesh)->ops->memory;
  bool displs = mesh->comm && mesh->comm->ops->all_to_allv_displs;
  /* Whether the rank's data is one value throughout (a fill wrote the identity of its op over it): any order of
   * its elements is then the same buffer, so a reduce-scatter of it needs no pack pass (nor its region). */
  bool uniform = false;
  for (int k = 0; k < p->nsteps; k++) {
    const dtl__plan_step *s = &p->steps[k];
    dtl__ex_step *e = &ex[k];
    memset(e, 0, sizeof *e);
    e->peers[0].dim = e->peers[1].dim = -1;
    if (s->kind == DTL__STEP_EXCHANGE) {
      e->op = EX_EXCHANGE;
      e->m = -1;
      if (v->s >= 0)
        dtl__xbox(p->qgeom, p->qpart, false, mesh, nd, p->src.shape, s->before, v->scoord, e->in_shape, e->in_off);
      if (v->d >= 0)
        dtl__xbox(p->qgeom, p->qpart, false, p->dst.mesh, nd, p->dst.shape, s->after, v->dcoord, e->out_shape,
                  e->out_off);
      e->a = v->s >= 0 ? dtl__box_count(nd, e->in_shape) : 0;
      e->b = v->d >= 0 ? dtl__box_count(nd, e->out_shape) : 0;
      continue;
    }
    e->m = s->mesh_dim;
    e->g = mesh->shape[e->m];
    if (v->s < 0) continue; /* outside the mesh these steps run on: nothing to do (EX_NONE, empty boxes) */
    dtl__local_box(mesh, nd, p->src.shape, s->before, v->scoord, e->in_shape, e->in_off);
    dtl__local_box(mesh, nd, p->src.shape, s->after, v->scoord, e->out_shape, e->out_off);
    e->a = dtl__box_count(nd, e->in_shape);
    e->b = dtl__box_count(nd, e->out_shape);
    dtl_placement from = s->before[e->m], to = s->after[e->m];
    if (mesh->shape[e->m] == 1) {
      e->op = EX_NONE; /* a group of one holds the whole box: nothing moves and no value changes */
      continue;
    }
    switch (s->kind) {
      case DTL__STEP_LOCAL_SLICE:
        e->op = (memcmp(e->in_shape, e->out_shape, sizeof(int64_t) * (size_t)nd) == 0 &&
                 memcmp(e->in_off, e->out_off, sizeof(int64_t) * (size_t)nd) == 0) ? EX_NONE : EX_SLICE;
        break;
      case DTL__STEP_LOCAL_PARTIAL:
        /* Coordinate 0 keeps the value; elsewhere sum and prod take their identity so that the pending
         * reduction gives the value back. max/min/avg keep the value everywhere: the max, min or mean of p
         * equal values is that value (zeros would divide an avg by p, so avg is not lumped with sum here). */
        e->op = (v->scoord[e->m] == 0 || (to.op != DTL_SUM && to.op != DTL_PROD)) ? EX_NONE : EX_FILL;
        e->rop = to.op;
        break;
      case DTL__STEP_LOCAL_EMBED: /* the output spans the group's extent: never over its own input */
        e->op = EX_EMBED;
        e->rop = to.op;
        break;
      case DTL__STEP_ALL_REDUCE:
        e->op = EX_ALL_REDUCE;
        e->rop = from.op;
        break;
      case DTL__STEP_ALL_GATHER:
        e->op = EX_GATHER;
        e->unpack = !dtl__split_is_contiguous(nd, e->out_shape, from.dim);
        e->t = e->unpack ? dtl__chunking(e, nd, e->out_shape, e->b, es, mem, p->chunk_bytes) : 0;
        break;
      case DTL__STEP_REDUCE_SCATTER:
        e->op = EX_REDUCE_SCATTER;
        e->rop = from.op;
        e->pack = !uniform && !dtl__split_is_contiguous(nd, e->in_shape, to.dim);
        e->t = e->pack ? dtl__chunking(e, nd, e->in_shape, e->a, es, mem, p->chunk_bytes) : 0;
        break;
      case DTL__STEP_ALL_TO_ALL:
        e->op = EX_ALL_TO_ALL;
        e->pack = !dtl__split_is_contiguous(nd, e->in_shape, to.dim);
        e->unpack = !dtl__split_is_contiguous(nd, e->out_shape, from.dim);
        if (dtl__chunk_all_to_all(e, nd, from.dim, to.dim, mesh->shape[e->m], es, mem, displs)) break;
        /* Both sides scattered: pack into the temporary, exchange into the output, copy that back into the
         * temporary and place it, so that one region of max(a, b) suffices. */
        e->t = e->pack && e->unpack ? (e->a > e->b ? e->a : e->b) : e->pack ? e->a : e->unpack ? e->b : 0;
        break;
      case DTL__STEP_EXCHANGE: break; /* above */
    }
    uniform = e->op == EX_FILL || (uniform && e->op == EX_SLICE);
  }
}

static dtl__xmsg dtl__xmsg_of(int peer, bool run, int same, size_t count, size_t at, const int64_t *shape,
                              const int64_t *off) {
  dtl__xmsg m = {.peer = peer, .run = run, .same = same, .count = count, .at = at};
  memcpy(m.shape, shape, sizeof m.shape);
  memcpy(m.off, off, sizeof m.off);
  return m;
}

/* Whether some round of plan p packs piece (s, o) of a box (bs, bo): it is no run of the box within the round.
 * Only the first and last rounds of the piece clip it to fewer rows; the ones between take xrows rows alike. */
static bool dtl__packed_in_rounds(const dtl_plan *p, int nd, const int64_t *bs, const int64_t *bo, const int64_t *s,
                                  const int64_t *o) {
  size_t at;
  if (p->xrounds <= 1) return !dtl__run_offset(nd, bs, bo, s, o, &at);
  if (p->xfine) return false; /* one index of every dim but the last: a run of any box */
  int d = p->xdim;
  int64_t lo = o[d], hi = o[d] + s[d], cs[DTL_MAX_TENSOR_DIMS], co[DTL_MAX_TENSOR_DIMS];
  if (hi <= lo) return false;
  int64_t r_lo = lo / p->xrows, r_hi = (hi - 1) / p->xrows;
  int64_t rounds[3] = {r_lo, r_lo + 1 < r_hi ? r_lo + 1 : r_lo, r_hi};
  for (int k = 0; k < 3; k++) {
    memcpy(cs, s, sizeof(int64_t) * (size_t)nd);
    memcpy(co, o, sizeof(int64_t) * (size_t)nd);
    int64_t a = rounds[k] * p->xrows, b = a + p->xrows;
    co[d] = lo > a ? lo : a;
    cs[d] = (hi < b ? hi : b) - co[d];
    if (!dtl__run_offset(nd, bs, bo, cs, co, &at)) return true;
  }
  return false;
}

/* The messages of exchange step e for rank v (xm set to the step's source placements): counts into x, and, when
 * x->send / x->recv are allocated, the messages themselves. A message's peer is a rank of the exchange's
 * communicator: the mesh rank on one mesh, the parent rank between two. A rank sends pieces of the box it owns
 * (xmap.h: its box, but for a quantized part's blocks), addressed within the box it holds (e's input box). */
static void dtl__exchange_messages(const dtl_plan *p, const dtl__xmap *xm, const dtl__view *v, const dtl__ex_step *e,
                                   dtl__xstep *x) {
  int nd = p->src.ndim;
  bool cross = p->src.mesh != p->dst.mesh, keep = x->send != NULL;
  int ns = 0, nr = 0;
  x->spack = x->rpack = x->rall = x->spack_r = x->rpack_r = 0;
  x->self = false;
  x->fill = v->d >= 0 && dtl__xmap_fills(xm, v->d, &x->fill_op);
  int64_t ts[DTL_MAX_TENSOR_DIMS], to[DTL_MAX_TENSOR_DIMS], is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS];
  int64_t os[DTL_MAX_TENSOR_DIMS], oo[DTL_MAX_TENSOR_DIMS];
  if (v->s >= 0 && e->a) {
    dtl__xmap_src_box(xm, v->s, os, oo);
    /* Target ranks with one box (replicas) get the same piece: packed once, for the first of them (tmark). */
    for (int t = 0; t < p->dst.mesh->size; t++) xm->tmark[t] = -1;
    for (int t = 0; t < p->dst.mesh->size; t++) {
      if (t == v->d || dtl__xmap_fills(xm, t, NULL)) continue;
      dtl__xmap_dst_box(xm, t, ts, to);
      if (!dtl__ex_intersect(nd, os, oo, ts, to, is, io) || dtl__xmap_holder(xm, t, v->s) != v->s) continue;
      size_t n = dtl__box_count(nd, is), at = 0;
      bool run = dtl__run_offset(nd, e->in_shape, e->in_off, is, io, &at);
      int rep = dtl__xmap_box_rep(xm, t), same = xm->tmark[rep];
      if (same < 0) xm->tmark[rep] = ns;
      if (!run && same < 0) x->spack += n;
      if (same < 0 && !run && dtl__packed_in_rounds(p, nd, e->in_shape, e->in_off, is, io)) x->spack_r += n;
      if (keep) x->send[ns] = dtl__xmsg_of(cross ? dtl__mesh_parent_rank(p->dst.mesh, t) : t, run, same, n, at, is, io);
      ns++;
    }
  }
  if (v->d >= 0 && e->b && !x->fill) {
    for (int k = 0; k < xm->nclass; k++) {
      int rep = xm->crep[k];
      dtl__xmap_src_box(xm, rep, ts, to);
      if (!dtl__ex_intersect(nd, e->out_shape, e->out_off, ts, to, is, io)) continue;
      int h = dtl__xmap_holder(xm, v->d, rep);
      if (h == v->s) {
        x->self = true;
        memcpy(x->self_shape, is, sizeof x->self_shape);
        memcpy(x->self_off, io, sizeof x->self_off);
        continue;
      }
      size_t n = dtl__box_count(nd, is), at = 0;
      bool run = dtl__run_offset(nd, e->out_shape, e->out_off, is, io, &at);
      x->rall += n;
      if (!run) x->rpack += n;
      if (!run && dtl__packed_in_rounds(p, nd, e->out_shape, e->out_off, is, io)) x->rpack_r += n;
      if (keep) x->recv[nr] = dtl__xmsg_of(cross ? dtl__mesh_parent_rank(p->src.mesh, h) : h, run, -1, n, at, is, io);
      nr++;
    }
  }
  x->nsend = ns;
  x->nrecv = nr;
}

/* Rows of the plan's round dim that a box of extent ext there takes in one round, at most. */
static size_t dtl__round_part(const dtl_plan *p, const int64_t *shape, size_t count) {
  if (p->xrounds <= 1 || count == 0) return count;
  if (p->xfine) return (size_t)shape[p->src.ndim - 1];
  int64_t ext = shape[p->xdim], rows = ext < p->xrows ? ext : p->xrows;
  return count / (size_t)ext * (size_t)rows;
}

/* The temporary of exchange step e in mode `mode`; false when the mode does not apply. In rounds, a round packs at
 * most the rows of the round dim that it takes of this rank's input box (every piece lies in that box, so the
 * pieces of one round together cannot exceed it), and likewise unpacks. */
static bool dtl__exchange_temp(const dtl_plan *p, dtl__ex_step *e, int mode) {
  dtl__xstep *x = e->x;
  if (mode != DTL__X_APART && (p->xrounds > 1 || x->spack == 0 || x->rall == 0)) return false;
  if (mode == DTL__X_SEND_IN_OUT && x->spack > e->b) return false;
  size_t ts = x->spack, tr = x->rpack;
  if (p->xrounds > 1) { /* only what some round packs, and no more than a round's rows of the box */
    size_t rs = dtl__round_part(p, e->in_shape, e->a), rr = dtl__round_part(p, e->out_shape, e->b);
    ts = x->spack_r < rs ? x->spack_r : rs;
    tr = x->rpack_r < rr ? x->rpack_r : rr;
  }
  x->mode = mode;
  x->tsend = mode == DTL__X_APART ? ts : 0;
  e->t = mode == DTL__X_APART ? ts + tr : mode == DTL__X_SEND_IN_OUT ? x->rall : (x->spack > x->rall ? x->spack : x->rall);
  return true;
}

/* Elements a step copies locally beyond its collective (staged: one more copy of its output). */
static size_t dtl__step_copies(const dtl__ex_step *e, bool staged) {
  size_t c = staged ? e->b : 0;
  if (e->op == EX_SLICE || e->op == EX_FILL || e->op == EX_EMBED) c += e->b;
  if (e->op == EX_EXCHANGE) { /* its packing, and the receives that the smaller modes move once more */
    const dtl__xstep *x = e->x;
    return c + x->spack + x->rpack + (x->mode == DTL__X_APART ? 0 : x->rall);
  }
  if (e->pack) c += e->a;
  if (e->unpack) c += e->b * (e->pack && !e->crows ? 2 : 1);
  return c;
}

typedef struct {
  bool ok, staged;
  size_t scr, copies;
  signed char prev, out, tmp;
} dtl__dp_cell;

/* Pass 1 ranks by (scratch, copies); pass 2 by (copies, scratch) under a scratch budget. */
static bool dtl__dp_better(size_t scr, size_t copies, const dtl__dp_cell *c, bool copies_first) {
  if (!c->ok) return true;
  if (copies_first && copies != c->copies) return copies < c->copies;
  return scr < c->scr || (scr == c->scr && copies < c->copies);
}

/* Chooses where every step reads, writes and keeps its temporary, by dynamic programming over where the data
 * lives between steps. Within DST and SCR the data region sits at offset 0 and a temporary region right after
 * it; DST holds at most dst_cap elements. A step may write its output over its own input only when the input
 * is dead by then: in-place all-reduce and fill, or any step that first moves its input into its temporary.
 * A step may be staged: it writes its output into a temporary region after its own, which is then copied
 * over its input; this makes a placement exist for every plan (all in SCR). budget = SIZE_MAX
 * minimizes the scratch size, then the copies; otherwise the copies within that scratch budget. */
static void dtl__place_pass(const dtl__ex_step *ex, int n, int start, size_t dst_cap, size_t dst_count, size_t budget,
                            dtl__ex_layout *L) {
  bool copies_first = budget != SIZE_MAX;
  dtl__dp_cell dp[DTL__MAX_PLAN_STEPS + 1][AT_NPLACES];
  memset(dp, 0, sizeof dp);
  dp[0][start] = (dtl__dp_cell){true, false, 0, 0, AT_NONE, AT_NONE, AT_NONE};
  for (int k = 0; k < n; k++) {
    const dtl__ex_step *e = &ex[k];
    for (int in = 0; in < AT_NPLACES; in++) {
      const dtl__dp_cell *c = &dp[k][in];
      if (!c->ok) continue;
      if (e->op == EX_NONE) {
        if (dtl__dp_better(c->scr, c->copies, &dp[k + 1][in], copies_first))
          dp[k + 1][in] = (dtl__dp_cell){true, false, c->scr, c->copies, (signed char)in, (signed char)in, AT_NONE};
        continue;
      }
      bool can_stage = e->op != EX_ALL_REDUCE && e->op != EX_FILL;
      for (int staged = 0; staged <= (int)can_stage; staged++) {
        size_t t = staged ? e->t + e->b : e->t;
        /* A chunked pass reads its input until the last chunk. A gather (whose output rows are longer than its
         * input rows) runs its chunks last to first and a reduce-scatter (shorter) first to last, so that each
         * chunk's output lands where no input is left to read; a chunked all-to-all cannot overlay. */
        bool chunk_ok = e->crows == 0 || e->op == EX_GATHER || e->op == EX_REDUCE_SCATTER;
        /* An exchange sends runs straight from its input, so only staging frees it. */
        bool over_input = staged || (t > 0 && chunk_ok && e->op != EX_EXCHANGE) || e->op == EX_ALL_REDUCE ||
                          e->op == EX_FILL;
        for (int out = AT_DST; out <= AT_SCR; out++) {
          if (out == in && !over_input) continue;
          for (int tmp = t ? AT_DST : AT_NONE; tmp <= (t ? AT_SCR : AT_NONE); tmp++) {
            size_t use[AT_NPLACES] = {0};
            for (int pl = AT_DST; pl <= AT_SCR; pl++) {
              size_t data = 0;
              if (in == pl) data = e->a;
              if (out == pl && e->b > data) data = e->b;
              use[pl] = data + (tmp == pl ? t : 0);
            }
            if (use[AT_DST] > dst_cap || use[AT_SCR] > budget) continue;
            size_t scr = use[AT_SCR] > c->scr ? use[AT_SCR] : c->scr;
            size_t copies = c->copies + dtl__step_copies(e, staged);
            if (dtl__dp_better(scr, copies, &dp[k + 1][out], copies_first))
              dp[k + 1][out] = (dtl__dp_cell){true, staged, scr, copies, (signed char)in, (signed char)out, (signed char)tmp};
          }
        }
      }
    }
  }
  /* The data must end in DST: from elsewhere one more copy (SRC only when every step left the data alone). */
  int best = AT_NONE;
  dtl__dp_cell fin = {0};
  for (int at = 0; at < AT_NPLACES; at++) {
    const dtl__dp_cell *c = &dp[n][at];
    if (!c->ok) continue;
    size_t scr = c->scr, copies = c->copies + (at == AT_DST ? 0 : dst_count);
    if (at == AT_SCR && dst_count > scr) scr = dst_count;
    if (scr > budget) continue;
    if (dtl__dp_better(scr, copies, &fin, copies_first)) {
      best = at;
      fin = (dtl__dp_cell){true, false, scr, copies, AT_NONE, AT_NONE, AT_NONE};
    }
  }
  L->final_at = best;
  L->scr = fin.scr;
  for (int k = n, at = best; k > 0 && at != AT_NONE; k--) {
    const dtl__dp_cell *c = &dp[k][at];
    L->in[k - 1] = c->prev;
    L->out[k - 1] = c->out;
    L->tmp[k - 1] = c->tmp;
    L->staged[k - 1] = c->staged;
    at = c->prev;
  }
}

/* The smallest scratch any placement needs, S; then, within max(S, the larger end), the placement with the
 * fewest copied elements. The figure is therefore at most the larger of the local source and target shards
 * whenever some placement achieves that, and otherwise the least achievable (a plan whose intermediate shard
 * is larger than both ends must keep it somewhere). */
static void dtl__place(const dtl__ex_step *ex, int n, int start, size_t dst_cap, size_t src_count, size_t dst_count,
                       dtl__ex_layout *L) {
  dtl__place_pass(ex, n, start, dst_cap, dst_count, SIZE_MAX, L);
  size_t ends = src_count > dst_count ? src_count : dst_count;
  dtl__place_pass(ex, n, start, dst_cap, dst_count, L->scr > ends ? L->scr : ends, L);
}


/* Side w (0: before, 1: after) of step s's peer table. The step's mesh dim makes the innermost split of the
 * tensor dim it shards on that side (dtl__plan_check), so every peer's range there is torch.chunk of one parent
 * range, the one that this rank's box has with that split undone; the other dims are this rank's. */
static void dtl__peer_table(const dtl_plan *p, const dtl__plan_step *s, dtl__ex_step *e, int w, int64_t *ext,
                            int64_t *off, size_t *count) {
  const dtl_mesh *mesh = p->src.mesh;
  int nd = p->src.ndim, d = -1;
  dtl_placement pl[DTL_MAX_MESH_DIMS];
  memcpy(pl, w ? s->after : s->before, sizeof pl);
  dtl__ex_peers *q = &e->peers[w];
  q->ext = ext;
  q->off = off;
  q->count = count;
  if (pl[e->m].kind == DTL_SHARD) {
    d = pl[e->m].dim;
    pl[e->m] = dtl_replicate();
  }
  q->dim = d;
  int64_t ps[DTL_MAX_TENSOR_DIMS], po[DTL_MAX_TENSOR_DIMS];
  dtl__local_box(mesh, nd, p->src.shape, pl, mesh->coord, ps, po);
  size_t rest = 1; /* elements of a peer's box per index of dim d */
  for (int k = 0; k < nd; k++) rest *= k == d ? 1 : (size_t)ps[k];
  for (int k = 0; k < e->g; k++) {
    ext[k] = off[k] = 0;
    if (d >= 0) {
      dtl__chunk(ps[d], e->g, k, &off[k], &ext[k]);
      off[k] += po[d];
    }
    count[k] = rest * (size_t)(d >= 0 ? ext[k] : 1);
  }
}

/* Extent on dim of peer k's box on side w. */
static int64_t dtl__peer_extent(const dtl__ex_step *e, int w, int k, int dim) {
  return dim == e->peers[w].dim ? e->peers[w].ext[k] : (w ? e->out_shape : e->in_shape)[dim];
}

/* dtl__split_is_contiguous for peer k's box on side w. */
static bool dtl__peer_split_contiguous(const dtl__ex_step *e, int w, int k, int d) {
  if (e->peers[w].count[k] == 0) return true;
  for (int x = 0; x < d; x++)
    if (dtl__peer_extent(e, w, k, x) > 1) return false;
  return true;
}

/* The group's facts of a communicating step (see dtl__ex_step), from its peer tables. */
static void dtl__group_facts(dtl__ex_step *e) {
  e->total = 0;
  for (int k = 0; k < e->g; k++) e->total += e->peers[0].count[k];
  if (e->op != EX_ALL_TO_ALL) return;
  int from = e->peers[0].dim, to = e->peers[1].dim;
  e->rows = 1;
  e->even = from != to;
  e->scattered = false;
  for (int k = 0; k < e->g; k++) {
    e->even = e->even && e->peers[1].count[k] == e->peers[1].count[0] && e->peers[0].count[k] == e->peers[0].count[0];
    e->scattered = e->scattered || !dtl__peer_split_contiguous(e, 1, k, from) || !dtl__peer_split_contiguous(e, 0, k, to);
    if (e->crows) {
      int64_t r = dtl__peer_extent(e, e->cmode == 1 ? 0 : 1, k, e->cdim);
      if (r > e->rows) e->rows = r;
    }
  }
}

static bool dtl__ex_communicates(dtl__ex_op op) {
  return op == EX_ALL_REDUCE || op == EX_GATHER || op == EX_REDUCE_SCATTER || op == EX_ALL_TO_ALL || op == EX_EXCHANGE;
}

/* Places rank v's steps for distinct buffers (place[0]) and, for a plan without collectives, for one buffer
 * (place[1]); returns the larger scratch, in elements. An exchange (step xk, -1: none) takes the first of its modes
 * whose scratch fits cap elements (the apart mode needs no extra copy), or the one that needs the least. */
static size_t dtl__place_view(const dtl_plan *p, const dtl__view *v, dtl__ex_step *ex, int xk, bool local, size_t cap,
                              dtl__ex_layout *place) {
  int n = p->nsteps;
  size_t a0 = v->a0, d0 = v->d0;
  int best = -1;
  size_t best_scr = SIZE_MAX;
  for (int mode = DTL__X_APART; mode <= (xk >= 0 ? DTL__X_RECV_IN_OUT : DTL__X_APART); mode++) {
    if (xk >= 0 && !dtl__exchange_temp(p, &ex[xk], mode)) continue;
    dtl__place(ex, n, AT_SRC, d0, a0, d0, &place[0]);
    if (place[0].scr < best_scr) {
      best = mode;
      best_scr = place[0].scr;
    }
    if (place[0].scr <= cap) break;
  }
  if (xk >= 0 && ex[xk].x->mode != best) {
    dtl__exchange_temp(p, &ex[xk], best);
    dtl__place(ex, n, AT_SRC, d0, a0, d0, &place[0]);
  }
  size_t scr = place[0].scr;
  place[1] = place[0];
  if (local) {
    dtl__place(ex, n, AT_DST, a0 > d0 ? a0 : d0, a0, d0, &place[1]);
    if (place[1].scr > scr) scr = place[1].scr;
  }
  return scr;
}

/* The plan's exchange step, -1 when it has none. */
static int dtl__exchange_step(const dtl_plan *p) {
  return p->nsteps > 0 && p->steps[p->nsteps - 1].kind == DTL__STEP_EXCHANGE ? p->nsteps - 1 : -1;
}

/* An exchange map with the plan's exchange step's source placements set. */
static dtl_status dtl__plan_xmap(const char *fn, const dtl_plan *p, int xk, dtl__xmap *xm) {
  DTL_TRY(dtl__xmap_init(xm, fn, &p->src, p->src.mesh, p->dst.mesh, p->dst.placements, p->qgeom, p->qpart));
  dtl__xmap_source(xm, p->steps[xk].before);
  return DTL_OK;
}

/* The budget of rank v in elements: limit bytes, or its larger end. */
static size_t dtl__cap(const dtl_plan *p, size_t limit, const dtl__view *v) {
  return limit == SIZE_MAX ? (v->a0 > v->d0 ? v->a0 : v->d0) : limit / dtl_dtype_size(p->src.dtype);
}

/* Rank v's scratch need (elements) and budget for plan p: ex holds room for p's steps, xm and xs the exchange's. */
static void dtl__fits_view(const dtl_plan *p, size_t limit, int r, int q, dtl__ex_step *ex, int xk, dtl__xmap *xm,
                           dtl__xstep *xs, size_t *need, size_t *cap) {
  dtl__view v;
  dtl__view_of(p, r, q, &v);
  dtl__analyze(p, &v, ex);
  bool local = true;
  for (int k = 0; k < p->nsteps; k++) local &= !dtl__ex_communicates(ex[k].op);
  if (xk >= 0) {
    ex[xk].x = xs;
    dtl__exchange_messages(p, xm, &v, &ex[xk], xs);
  }
  dtl__ex_layout place[2];
  *cap = dtl__cap(p, limit, &v);
  dtl__place_view(p, &v, ex, xk, local, *cap, place);
  *need = place[0].scr;
}

/* The coordinates of mesh dim m that stand for all of its coordinates in a plan without an exchange, ascending, into
 * out (room for DTL__REP_MAX); returns how many, or -1 when there would be more. Such a plan's scratch on a rank
 * depends only on the shapes of the rank's boxes under the plan's placement vectors (every pass, temporary and
 * placement is sized from them), and the extent a split of parent extent E into p chunks gives coordinate c is one
 * of three: full below E's count of full chunks nf, the remainder at nf, empty above. So coordinates between two
 * consecutive breakpoints (0, and nf and nf + 1 for every parent extent that m splits in some vector, and 1 where a
 * vector is Partial on m) have the same boxes and roles everywhere, and the first of each run represents it. */
#define DTL__REP_MAX 512
static int dtl__rep_coords(const dtl_plan *p, int m, int *out) {
  const dtl_mesh *mesh = p->src.mesh;
  int pm = mesh->shape[m], n = 0;
  const dtl_placement *vec[2 * DTL__MAX_PLAN_STEPS + 2];
  int nv = 0;
  vec[nv++] = p->src.placements;
  vec[nv++] = p->dst.placements;
  for (int k = 0; k < p->nsteps; k++) vec[nv++] = p->steps[k].before, vec[nv++] = p->steps[k].after;
  bool mark[DTL__REP_MAX] = {false}; /* breakpoints below DTL__REP_MAX, then those above in a list */
  int far[DTL__REP_MAX], nfar = 0;
  mark[0] = true;
  for (int i = 0; i < nv; i++) {
    const dtl_placement *pl = vec[i];
    /* A Partial's coordinate 0 holds the value and the others its identity, which a rank may have to build in
     * scratch (R -> P(sum) off coordinate 0): coordinate 1 stands for those. */
    if (pl[m].kind == DTL_PARTIAL && pm > 1) mark[1] = true;
    if (pl[m].kind != DTL_SHARD) continue;
    int d = pl[m].dim, ks[DTL_MAX_MESH_DIMS], nk = 0;
    for (int k = 0; k < m; k++)
      if (pl[k].kind == DTL_SHARD && pl[k].dim == d) ks[nk++] = mesh->shape[k];
    int64_t ext[DTL__EXTENT_SET_MAX];
    int ne = dtl__extent_set(p->src.shape[d], ks, nk, ext);
    for (int e = 0; e < ne; e++) {
      int64_t off, cs;
      dtl__chunk(ext[e], pm, 0, &off, &cs);
      int64_t nf = cs ? ext[e] / cs : pm;
      for (int64_t b = nf; b <= nf + 1; b++) {
        if (b >= pm) continue;
        if (b < DTL__REP_MAX) {
          mark[b] = true;
          continue;
        }
        bool dup = false;
        for (int f = 0; f < nfar; f++) dup |= far[f] == b;
        if (dup) continue;
        if (nfar == DTL__REP_MAX) return -1;
        far[nfar++] = (int)b;
      }
    }
  }
  for (int c = 0; c < DTL__REP_MAX && c < pm; c++)
    if (mark[c]) out[n++] = c;
  for (int f = 0; f < nfar; f++) { /* insertion into the ascending tail */
    if (n == DTL__REP_MAX) return -1;
    int j = n++;
    while (j > 0 && out[j - 1] > far[f]) out[j] = out[j - 1], j--;
    out[j] = far[f];
  }
  return n;
}

dtl_status dtl__plan_fits(const char *fn, const dtl_plan *p, size_t limit, bool *fits, size_t *worst) {
  int n = p->nsteps, xk = dtl__exchange_step(p);
  const dtl_mesh *sm = p->src.mesh, *dm = p->dst.mesh;
  size_t es = dtl_dtype_size(p->src.dtype);
  dtl__ex_step *ex = dtl__malloc(sizeof *ex * (size_t)(n ? n : 1));
  if (!ex) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  dtl__xmap xm;
  dtl__xstep xs;
  memset(&xs, 0, sizeof xs);
  if (xk >= 0) {
    dtl_status st = dtl__plan_xmap(fn, p, xk, &xm);
    if (st != DTL_OK) {
      dtl__free(ex);
      return st;
    }
  }
  *fits = true;
  *worst = 0;
  size_t need, cap;
  /* Without an exchange (one mesh), the representative coordinates of every mesh dim (dtl__rep_coords): planning
   * a mesh of 393k ranks then checks a few dozen instead of every rank. */
  int reps[DTL_MAX_MESH_DIMS][DTL__REP_MAX];
  int nrep[DTL_MAX_MESH_DIMS], M = sm->ndim;
  bool by_rep = xk < 0 && sm == dm;
  uint64_t combos = 1;
  for (int m = 0; by_rep && m < M; m++) {
    nrep[m] = dtl__rep_coords(p, m, reps[m]);
    by_rep = nrep[m] > 0 && (combos *= (uint64_t)nrep[m]) < (uint64_t)sm->size;
  }
  if (by_rep) {
    int idx[DTL_MAX_MESH_DIMS] = {0};
    for (uint64_t c = 0; c < combos; c++) {
      int r = 0;
      for (int m = 0; m < M; m++) r = r * sm->shape[m] + reps[m][idx[m]];
      dtl__fits_view(p, limit, r, r, ex, xk, &xm, &xs, &need, &cap);
      if (need > cap) *fits = false;
      if (need * es > *worst) *worst = need * es;
      for (int m = M - 1; m >= 0 && ++idx[m] == nrep[m]; m--) idx[m] = 0;
    }
    dtl__free(ex);
    return DTL_OK;
  }
  /* Every rank of either mesh: the source mesh's ranks (with their target rank, if any), then the target mesh's
   * ranks outside the source mesh. */
  for (int i = 0; i < sm->size + (sm != dm ? dm->size : 0); i++) {
    int r = i < sm->size ? i : -1, q = i < sm->size ? (sm == dm ? i : -1) : i - sm->size;
    if (sm != dm && r >= 0) q = dtl__xmap_s2d(&xm, r);
    if (sm != dm && r < 0 && dtl__xmap_d2s(&xm, q) >= 0) continue; /* counted with its source rank */
    dtl__fits_view(p, limit, r, q, ex, xk, &xm, &xs, &need, &cap);
    if (need > cap) *fits = false;
    if (need * es > *worst) *worst = need * es;
  }
  if (xk >= 0) dtl__xmap_free(&xm);
  dtl__free(ex);
  return DTL_OK;
}

/* Compiles p (whose exec must be NULL) and sets p->scratch_bytes. That figure is exact: the scratch that an execution
 * with distinct source and destination buffers uses, in one buffer of transport memory (none for 0), which the plan's
 * first such execution allocates. It is the least that any placement above needs, and for a plan of one step at most
 * the larger of the local source and target shards (the step's temporary is a pack or receive buffer of one of them,
 * or cache-sized chunks; the two chunk regions of a chunked all-to-all can exceed it only on a rank whose shards are
 * far below the group's average, which needs a very uneven split of shards of 32 MiB and more). For several steps it
 * exceeds that only when (a) an intermediate shard is larger than both ends: it must live somewhere, e.g. [S0,S1] ->
 * [S1,S0] on 2x2 goes through [S0,R], whose gather needs its received blocks and the unpacked [S0,R] shard at once,
 * twice that intermediate; or (b) a step must keep a packed send or receive buffer beside an intermediate that does
 * not fit the destination buffer, e.g. [S0,P] -> [S1,S0] on 2x2, whose all-to-all packs the source and receives the
 * [S1,P] shard, which is larger than the destination shard. It stays below three times the largest shard on the route.
 * With src_local == dst_local (purely local plans) the need may differ; dtl_plan_workspace_bytes covers both. */
dtl_status dtl__plan_compile(const char *fn, dtl_plan *p) {
  DTL_TRY(dtl__plan_check(fn, p));
  const dtl_mesh *mesh = p->src.mesh;
  int n = p->nsteps, gmax = 1, xk = dtl__exchange_step(p);
  dtl__view v;
  dtl__view_of(p, dtl__mesh_index(mesh), dtl__mesh_index(p->dst.mesh), &v);
  size_t words = 0; /* peer tables: two sides of extents, offsets and counts per collective that has peers */
  for (int k = 0; k < n && v.s >= 0; k++) {
    dtl__step_kind kind = p->steps[k].kind;
    if (kind == DTL__STEP_EXCHANGE) continue;
    int g = mesh->shape[p->steps[k].mesh_dim];
    if (g == 1 || kind == DTL__STEP_LOCAL_SLICE || kind == DTL__STEP_LOCAL_PARTIAL || kind == DTL__STEP_LOCAL_EMBED)
      continue;
    if (g > gmax) gmax = g;
    if (kind != DTL__STEP_ALL_REDUCE) words += 6 * (size_t)g;
  }
  /* The exchange's messages: counted first, then kept after the peer tables. */
  dtl__xmap xm;
  dtl__xstep xs;
  memset(&xs, 0, sizeof xs);
  if (xk >= 0) DTL_TRY(dtl__plan_xmap(fn, p, xk, &xm));
  dtl__ex_step *ex0 = NULL;
  if (xk >= 0) {
    if (!(ex0 = dtl__malloc(sizeof *ex0 * (size_t)n))) {
      dtl__xmap_free(&xm);
      return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory for the compiled plan");
    }
    dtl__analyze(p, &v, ex0);
    dtl__exchange_messages(p, &xm, &v, &ex0[xk], &xs);
  }
  int nmsg = xs.nsend + xs.nrecv, nlist = xs.nsend > xs.nrecv ? xs.nsend : xs.nrecv;
  /* Between two meshes, the parent ranks of both (ascending), which the DTL_CHECK agreement runs among. */
  bool cross = mesh != p->dst.mesh;
  int ngroup = 0, np = cross ? mesh->parent->size : 0;
  unsigned char *in_group = cross ? dtl__calloc((size_t)np, 1) : NULL;
  if (cross && !in_group) {
    dtl__free(ex0);
    dtl__xmap_free(&xm);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory for the compiled plan");
  }
  for (int r = 0; cross && r < mesh->size; r++) in_group[dtl__mesh_parent_rank(mesh, r)] = 1;
  for (int r = 0; cross && r < p->dst.mesh->size; r++) in_group[dtl__mesh_parent_rank(p->dst.mesh, r)] = 1;
  for (int r = 0; r < np; r++) ngroup += in_group[r];
  size_t head = sizeof(struct dtl__plan_exec) + sizeof(dtl__ex_step) * (size_t)n;
  head = (head + sizeof(int64_t) - 1) / sizeof(int64_t) * sizeof(int64_t);
  size_t tail = (5 * (size_t)gmax + words) * sizeof(int64_t);
  size_t xbytes = xk >= 0 ? sizeof(dtl__xstep) + sizeof(dtl__xmsg) * (size_t)nmsg +
                                (4 * sizeof(int) + 2 * sizeof(void *) + 2 * sizeof(size_t)) * (size_t)nlist
                          : 0;
  struct dtl__plan_exec *x = dtl__malloc(head + tail + xbytes + sizeof(int) * (size_t)ngroup);
  if (!x) {
    dtl__free(ex0);
    dtl__free(in_group);
    if (xk >= 0) dtl__xmap_free(&xm);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory for the compiled plan");
  }
  x->group = (int *)((char *)x + head + tail + xbytes);
  x->ngroup = 0;
  for (int r = 0; r < np; r++)
    if (in_group[r]) x->group[x->ngroup++] = r;
  dtl__free(in_group);
  dtl__analyze(p, &v, x->ex);
  dtl__free(ex0);
  x->comm_steps = 0;
  x->gmax = gmax;
  x->req = NULL;
  x->own = NULL;
  x->own_bytes = 0;
  x->counts = (size_t *)((char *)x + head);
  int64_t *w = (int64_t *)(x->counts + 5 * (size_t)gmax);
  if (xk >= 0) {
    dtl__xstep *xp = (dtl__xstep *)((char *)x + head + tail);
    *xp = xs;
    char *at = (char *)(xp + 1);
    xp->send = (dtl__xmsg *)at;
    xp->recv = xp->send + xs.nsend;
    at = (char *)(xp->recv + xs.nrecv);
    xp->bufs_s = (const void **)at;
    xp->bufs_r = (void **)(xp->bufs_s + nlist);
    xp->cnt_s = (size_t *)(xp->bufs_r + nlist);
    xp->cnt_r = xp->cnt_s + nlist;
    xp->peers_s = (int *)(xp->cnt_r + nlist);
    xp->peers_r = xp->peers_s + nlist;
    xp->spos = xp->peers_r + nlist;
    x->ex[xk].x = xp;
    dtl__exchange_messages(p, &xm, &v, &x->ex[xk], xp);
    xp->cross = cross;
    xp->xdim = p->xdim;
    xp->xrows = p->xrows;
    xp->xrounds = p->xrounds;
    xp->xfine = p->xfine;
    memcpy(xp->xshape, p->src.shape, sizeof(int64_t) * (size_t)p->src.ndim);
    dtl__xmap_free(&xm);
  }
  for (int k = 0; k < n; k++) {
    dtl__ex_step *e = &x->ex[k];
    if (!dtl__ex_communicates(e->op)) continue;
    x->comm_steps++;
    if (e->op == EX_ALL_REDUCE || e->op == EX_EXCHANGE) continue;
    for (int side = 0; side < 2; side++, w += 3 * (size_t)e->g)
      dtl__peer_table(p, &p->steps[k], e, side, w, w + e->g, (size_t *)(w + 2 * (size_t)e->g));
    dtl__group_facts(e);
  }
  size_t scr = dtl__place_view(p, &v, x->ex, xk, x->comm_steps == 0, dtl__cap(p, p->limit, &v), x->place);
  if (x->place[0].final_at == AT_NONE || x->place[1].final_at == AT_NONE) {
    dtl__free(x); /* cannot happen: staging every step in SCR is always a placement */
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "found no placement of the plan's %d steps in the buffers", n);
  }
  size_t es = dtl_dtype_size(p->src.dtype);
  x->ws_bytes = scr * es;
  p->scratch_bytes = x->place[0].scr * es;
  p->exec = x;
  return DTL_OK;
}

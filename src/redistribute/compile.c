/* SPDX-License-Identifier: Apache-2.0 */
/* Plan compilation, run once by dtl_plan_create: checks that the steps chain legally, derives this rank's part
 * of every step (its boxes, every peer's box on the dims the step splits, the counts and facts of the whole
 * group, chunking), and places every intermediate shard in the caller's buffers or one scratch buffer so that
 * an execution allocates as little as possible. The result depends only on the plan, the mesh and the
 * transport's capabilities, so it is computed before any call and every call replays it. */
#include <stdlib.h>
#include <string.h>
#include "redistribute/executor_internal.h"

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
  for (int k = 0; k < p->nsteps; k++) {
    const dtl__plan_step *s = &p->steps[k];
    int md = s->mesh_dim;
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
    static const dtl_placement_kind want[6][2] = {
        [DTL__STEP_ALL_GATHER] = {DTL_SHARD, DTL_REPLICATE},     [DTL__STEP_ALL_REDUCE] = {DTL_PARTIAL, DTL_REPLICATE},
        [DTL__STEP_REDUCE_SCATTER] = {DTL_PARTIAL, DTL_SHARD},   [DTL__STEP_ALL_TO_ALL] = {DTL_SHARD, DTL_SHARD},
        [DTL__STEP_LOCAL_SLICE] = {DTL_REPLICATE, DTL_SHARD},    [DTL__STEP_LOCAL_PARTIAL] = {DTL_REPLICATE, DTL_PARTIAL}};
    if ((unsigned)s->kind > DTL__STEP_LOCAL_PARTIAL || want[s->kind][0] != from || want[s->kind][1] != to)
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
static size_t dtl__chunking(dtl__ex_step *e, int nd, const int64_t *shape, size_t count, size_t es, dtl_memory mem) {
  e->crows = 0;
  if (mem != DTL_MEMORY_HOST || count == 0) return count;
  int c0 = 0;
  while (c0 < nd - 1 && shape[c0] <= 1) c0++;
  size_t row = count / (size_t)shape[c0], per = dtl__chunk_bytes / es / (row ? row : 1);
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

/* This rank's part of every step: its boxes, what it does, and how much temporary room that needs. */
static void dtl__analyze(const dtl_plan *p, dtl__ex_step *ex) {
  const dtl_mesh *mesh = p->src.mesh;
  int nd = p->src.ndim;
  size_t es = dtl_dtype_size(p->src.dtype);
  dtl_memory mem = mesh->comm ? mesh->comm->mem.ops->memory : DTL_MEMORY_HOST;
  bool displs = mesh->comm && mesh->comm->ops->all_to_allv_displs;
  for (int k = 0; k < p->nsteps; k++) {
    const dtl__plan_step *s = &p->steps[k];
    dtl__ex_step *e = &ex[k];
    memset(e, 0, sizeof *e);
    e->m = s->mesh_dim;
    e->g = mesh->shape[e->m];
    e->peers[0].dim = e->peers[1].dim = -1;
    dtl__local_box(mesh, nd, p->src.shape, s->before, mesh->coord, e->in_shape, e->in_off);
    dtl__local_box(mesh, nd, p->src.shape, s->after, mesh->coord, e->out_shape, e->out_off);
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
        e->op = (mesh->coord[e->m] == 0 || (to.op != DTL_SUM && to.op != DTL_PROD)) ? EX_NONE : EX_FILL;
        e->rop = to.op;
        break;
      case DTL__STEP_ALL_REDUCE:
        e->op = EX_ALL_REDUCE;
        e->rop = from.op;
        break;
      case DTL__STEP_ALL_GATHER:
        e->op = EX_GATHER;
        e->unpack = !dtl__split_is_contiguous(nd, e->out_shape, from.dim);
        e->t = e->unpack ? dtl__chunking(e, nd, e->out_shape, e->b, es, mem) : 0;
        break;
      case DTL__STEP_REDUCE_SCATTER:
        e->op = EX_REDUCE_SCATTER;
        e->rop = from.op;
        e->pack = !dtl__split_is_contiguous(nd, e->in_shape, to.dim);
        e->t = e->pack ? dtl__chunking(e, nd, e->in_shape, e->a, es, mem) : 0;
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
    }
  }
}

/* Elements a step copies locally beyond its collective (staged: one more copy of its output). */
static size_t dtl__step_copies(const dtl__ex_step *e, bool staged) {
  size_t c = staged ? e->b : 0;
  if (e->op == EX_SLICE || e->op == EX_FILL) c += e->b;
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
        bool over_input = staged || (t > 0 && chunk_ok) || e->op == EX_ALL_REDUCE || e->op == EX_FILL;
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
  return op == EX_ALL_REDUCE || op == EX_GATHER || op == EX_REDUCE_SCATTER || op == EX_ALL_TO_ALL;
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
  int n = p->nsteps, gmax = 1;
  size_t words = 0; /* peer tables: two sides of extents, offsets and counts per collective that has peers */
  for (int k = 0; k < n; k++) {
    int g = mesh->shape[p->steps[k].mesh_dim];
    dtl__step_kind kind = p->steps[k].kind;
    if (g == 1 || kind == DTL__STEP_LOCAL_SLICE || kind == DTL__STEP_LOCAL_PARTIAL) continue;
    if (g > gmax) gmax = g;
    if (kind != DTL__STEP_ALL_REDUCE) words += 6 * (size_t)g;
  }
  size_t head = sizeof(struct dtl__plan_exec) + sizeof(dtl__ex_step) * (size_t)n;
  head = (head + sizeof(int64_t) - 1) / sizeof(int64_t) * sizeof(int64_t);
  struct dtl__plan_exec *x = dtl__malloc(head + (5 * (size_t)gmax + words) * sizeof(int64_t));
  if (!x) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory for the compiled plan");
  dtl__analyze(p, x->ex);
  x->comm_steps = 0;
  x->gmax = gmax;
  x->own = NULL;
  x->own_bytes = 0;
  x->counts = (size_t *)((char *)x + head);
  int64_t *w = (int64_t *)(x->counts + 5 * (size_t)gmax);
  for (int k = 0; k < n; k++) {
    dtl__ex_step *e = &x->ex[k];
    if (!dtl__ex_communicates(e->op)) continue;
    x->comm_steps++;
    if (e->op == EX_ALL_REDUCE) continue;
    for (int side = 0; side < 2; side++, w += 3 * (size_t)e->g)
      dtl__peer_table(p, &p->steps[k], e, side, w, w + e->g, (size_t *)(w + 2 * (size_t)e->g));
    dtl__group_facts(e);
  }
  size_t a0 = p->src.local_count, d0 = p->dst.local_count;
  dtl__place(x->ex, n, AT_SRC, d0, a0, d0, &x->place[0]);
  size_t scr = x->place[0].scr;
  x->place[1] = x->place[0];
  if (x->comm_steps == 0) {
    dtl__place(x->ex, n, AT_DST, a0 > d0 ? a0 : d0, a0, d0, &x->place[1]);
    if (x->place[1].scr > scr) scr = x->place[1].scr;
  }
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

/* SPDX-License-Identifier: Apache-2.0 */
/* The executor: runs a plan's steps, each on the communicator of its mesh dim, and decides where every
 * intermediate shard lives (the caller's source, the caller's destination, or one scratch buffer) so that a
 * call allocates as little as possible. It moves bytes only through the transport vtable (collectives,
 * copy_box, mem_*), so the same code runs on host (MPI) and device (NCCL) buffers. */
#include <stdlib.h>
#include <string.h>
#include "redistribute/redistribute_internal.h"

/* What one step does on this rank. Local steps that leave this rank's values as they are, and every step on
 * a mesh dim of size 1, become EX_NONE: the data stays where it is (no copy). */
typedef enum { EX_NONE, EX_FILL, EX_SLICE, EX_ALL_REDUCE, EX_GATHER, EX_REDUCE_SCATTER, EX_ALL_TO_ALL } dtl__ex_op;

/* Places a shard can live in. SRC is read-only; DST and SCR hold a data region at offset 0 and, during a
 * step, a temporary region right after it. */
enum { AT_SRC, AT_DST, AT_SCR, AT_NPLACES, AT_NONE = -1 };

typedef struct {
  dtl__ex_op op;
  int m;        /* mesh dim */
  size_t a, b;  /* elements of this rank's box before / after the step */
  size_t t;     /* elements of the step's temporary region (0: none) */
  bool pack;    /* the send side is not in peer order: pack into the temporary first */
  bool unpack;  /* the receive side is not in final order: receive into the temporary, then place the blocks */
  /* A pack or unpack pass runs in chunks of crows indices of tensor dim cdim (the outermost dim of the box
   * with extent > 1, which the step does not split), one collective per chunk, so that its temporary is a
   * cache-sized chunk rather than a whole shard. crows == 0: one pass over everything. */
  int cdim;
  int64_t crows;
  /* Chunked all-to-all: which rows of cdim a chunk takes (0: the same absolute rows on every rank; 1: rows
   * counted within each sender's input box; 2: within each receiver's output box), the first row of the
   * group's box on cdim, and the elements of the send region (the receive region follows it). */
  int cmode;
  int64_t cbase;
  size_t tsend;
  int64_t in_shape[DTL_MAX_TENSOR_DIMS], in_off[DTL_MAX_TENSOR_DIMS];
  int64_t out_shape[DTL_MAX_TENSOR_DIMS], out_off[DTL_MAX_TENSOR_DIMS];
} dtl__ex_step;

/* Where each step reads, writes and keeps its temporary; scr is the scratch size in elements. */
typedef struct {
  int in[DTL__MAX_PLAN_STEPS], out[DTL__MAX_PLAN_STEPS], tmp[DTL__MAX_PLAN_STEPS];
  bool staged[DTL__MAX_PLAN_STEPS]; /* the step writes into its temporary, then that is copied to out */
  int final_at; /* where the data is after the last step (a final copy moves it to DST when it is not there) */
  size_t scr;
} dtl__ex_layout;

static size_t dtl__box_count(int nd, const int64_t *shape) {
  size_t n = 1;
  for (int d = 0; d < nd; d++) n *= (size_t)shape[d];
  return n;
}

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
        break;
      case DTL__STEP_ALL_REDUCE: e->op = EX_ALL_REDUCE; break;
      case DTL__STEP_ALL_GATHER:
        e->op = EX_GATHER;
        e->unpack = !dtl__split_is_contiguous(nd, e->out_shape, from.dim);
        e->t = e->unpack ? dtl__chunking(e, nd, e->out_shape, e->b, es, mem) : 0;
        break;
      case DTL__STEP_REDUCE_SCATTER:
        e->op = EX_REDUCE_SCATTER;
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

/* The figure is exact: an execution with distinct source and destination buffers allocates exactly this many
 * bytes of transport memory, in one buffer (none for 0). It is the least that any placement above needs, and
 * for a plan of one step at most the larger of the local source and target shards (the step's temporary is
 * a pack or receive buffer of one of them, or cache-sized chunks; the two chunk regions of a chunked
 * all-to-all can exceed it only on a rank whose shards are far below the group's average, which needs a
 * very uneven split of shards of 32 MiB and more). For several steps it exceeds that only
 * when (a) an intermediate shard is larger than both ends: it must live somewhere, e.g. [S0,S1] -> [S1,S0]
 * on 2x2 goes through [S0,R], whose gather needs its received blocks and the unpacked [S0,R] shard at once,
 * twice that intermediate; or (b) a step must keep a packed send or receive buffer beside an intermediate
 * that does not fit the destination buffer, e.g. [S0,P] -> [S1,S0] on 2x2, whose all-to-all packs the source
 * and receives the [S1,P] shard, which is larger than the destination shard. It stays below three times the
 * largest shard on the route. With src_local == dst_local (purely local plans) the figure may differ. */
size_t dtl__executor_scratch_bytes(const struct dtl_plan *p) {
  dtl__ex_step ex[DTL__MAX_PLAN_STEPS];
  dtl__ex_layout L;
  if (p->nsteps < 0 || p->nsteps > DTL__MAX_PLAN_STEPS) return 0;
  dtl__analyze(p, ex);
  dtl__place(ex, p->nsteps, AT_SRC, p->dst.local_count, p->src.local_count, p->dst.local_count, &L);
  return L.scr * dtl_dtype_size(p->src.dtype);
}

/* --- execution ------------------------------------------------------------------------------------------ */

typedef struct {
  const dtl_plan *p;
  const dtl_mesh *mesh;
  int nd;
  size_t es;
  dtl_dtype t;
  size_t *cnt_a, *cnt_b, *cnt_c; /* per-peer counts, sized for the largest group */
  size_t *dsp_a, *dsp_b;         /* per-peer displacements (send, receive) of all_to_allv_displs */
} dtl__ex_ctx;

/* base + elems elements, without arithmetic on a NULL base (empty buffers may be NULL). */
static char *dtl__at(void *base, size_t elems, size_t es) { return elems ? (char *)base + elems * es : (char *)base; }

static dtl__box_copy dtl__box(int nd, size_t es, const int64_t *ext, const int64_t *src_shape, const int64_t *src_off,
                              const int64_t *dst_shape, const int64_t *dst_off) {
  dtl__box_copy b;
  memset(&b, 0, sizeof b);
  b.ndim = nd;
  b.elem_size = es;
  for (int d = 0; d < nd; d++) {
    b.extent[d] = ext[d];
    b.src_shape[d] = src_shape[d];
    b.src_off[d] = src_off ? src_off[d] : 0;
    b.dst_shape[d] = dst_shape[d];
    b.dst_off[d] = dst_off ? dst_off[d] : 0;
  }
  return b;
}

/* The box of the peer at position k along mesh dim m, before (w = 0) or after (w = 1) step s. */
static void dtl__peer_box(const dtl__ex_ctx *x, const dtl__plan_step *s, int w, int k, int64_t *shape, int64_t *off) {
  int coord[DTL_MAX_MESH_DIMS];
  memcpy(coord, x->mesh->coord, sizeof coord);
  coord[s->mesh_dim] = k;
  dtl__local_box(x->mesh, x->nd, x->p->src.shape, w ? s->after : s->before, coord, shape, off);
}

/* Intersection of two boxes; false when empty. */
static bool dtl__intersect(int nd, const int64_t *as, const int64_t *ao, const int64_t *bs, const int64_t *bo, int64_t *s,
                           int64_t *o) {
  bool nonempty = true;
  for (int d = 0; d < nd; d++) {
    int64_t lo = ao[d] > bo[d] ? ao[d] : bo[d];
    int64_t hi = ao[d] + as[d] < bo[d] + bs[d] ? ao[d] + as[d] : bo[d] + bs[d];
    o[d] = lo;
    s[d] = hi > lo ? hi - lo : 0;
    if (s[d] == 0) nonempty = false;
  }
  return nonempty;
}

/* Equal blocks take the engine's regular collective (MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall,
 * or NCCL's own): the v-variants often run other, slower algorithms. The counts are the group's, the same on
 * every member, so all choose alike. */
static bool dtl__all_equal(const size_t *c, int n) {
  for (int k = 1; k < n; k++)
    if (c[k] != c[0]) return false;
  return true;
}

static dtl_status dtl__gather(dtl_comm *c, const void *send, size_t n, void *recv, const size_t *counts, dtl_dtype t) {
  if (dtl__all_equal(counts, c->size)) return c->ops->all_gather(c, send, recv, n, t);
  return c->ops->all_gatherv(c, send, n, recv, counts, t);
}

static dtl_status dtl__reduce_scatter(dtl_comm *c, const void *send, void *recv, const size_t *counts, dtl_dtype t,
                                      dtl_reduce_op op) {
  if (dtl__all_equal(counts, c->size)) return c->ops->reduce_scatter(c, send, recv, counts[0], t, op);
  return c->ops->reduce_scatterv(c, send, recv, counts, t, op);
}

/* even: every block between every pair of the group has one size (the caller knows it from the group's boxes).
 * Regions in one place never overlap unless one is empty, so equal pointers mean an empty side: pass NULL
 * for it rather than look like an in-place exchange, which some engines refuse. */
static dtl_status dtl__exchange(dtl_comm *c, bool even, const void *send, const size_t *sc, void *recv, const size_t *rc,
                                dtl_dtype t) {
  if (send == recv) {
    size_t sent = 0;
    for (int k = 0; k < c->size; k++) sent += sc[k];
    if (sent) recv = NULL;
    else send = NULL;
  }
  if (even) return c->ops->all_to_all(c, send, recv, sc[0], t);
  return c->ops->all_to_allv(c, send, sc, recv, rc, t);
}

/* The own block. On a transport that takes explicit displacements (all_to_allv_displs), a gather or all-to-all
 * that packs or unpacks (scattered) leaves this rank's own block out of the exchange and copies it straight from
 * the input box into the output box: one strided copy instead of a copy into the pack or receive buffer, the
 * transport's local copy, and a copy out again. The group then uses all_to_allv_displs throughout (the choice
 * of collective must agree across it); each member skips its own block only when its input and output are
 * different buffers (a strided copy over an input of another shape would clobber it). Returns the rank whose
 * block is skipped, or -1. */
static int dtl__own_block(dtl_comm *c, bool scattered, const void *in, const void *out) {
  return scattered && in != out ? c->rank : -1;
}

/* Drops block self (-1: none) from counts and sets the displacements of the others back to back in peer order. */
static void dtl__packed_displs(int g, size_t *counts, size_t *displs, int self) {
  if (self >= 0) counts[self] = 0;
  size_t off = 0;
  for (int k = 0; k < g; k++) {
    displs[k] = off;
    off += counts[k];
  }
}

/* all_to_allv_displs; like dtl__exchange, an empty side that shares the other side's pointer is passed as NULL. */
static dtl_status dtl__exchange_displs(dtl_comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                                       const size_t *rc, const size_t *rd, dtl_dtype t) {
  if (send == recv) {
    size_t sent = 0;
    for (int k = 0; k < c->size; k++) sent += sc[k];
    if (sent) recv = NULL;
    else send = NULL;
  }
  return c->ops->all_to_allv_displs(c, send, sc, sd, recv, rc, rd, t);
}

/* Copies the part of the step's input box that its output box keeps (an all-to-all's own piece) from the input
 * to the output. */
static dtl_status dtl__copy_own(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, const void *in, void *out) {
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS], ri[DTL_MAX_TENSOR_DIMS], ro[DTL_MAX_TENSOR_DIMS];
  if (!dtl__intersect(x->nd, e->in_shape, e->in_off, e->out_shape, e->out_off, is, io)) return DTL_OK;
  for (int d = 0; d < x->nd; d++) {
    ri[d] = io[d] - e->in_off[d];
    ro[d] = io[d] - e->out_off[d];
  }
  dtl__box_copy b = dtl__box(x->nd, x->es, is, e->in_shape, ri, e->out_shape, ro);
  return dtl__mem_copy_box(&c->mem, in, out, &b);
}

static dtl_status dtl__run_gather(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e, dtl_comm *c,
                                  const void *in, void *out, void *tmp) {
  int g = c->size, nd = x->nd;
  int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
  size_t total = 0;
  for (int k = 0; k < g; k++) {
    dtl__peer_box(x, s, 0, k, bs, bo);
    x->cnt_a[k] = dtl__box_count(nd, bs);
    total += x->cnt_a[k];
  }
  if (total == 0) return DTL_OK; /* the group's box is empty on every member alike */
  if (!e->unpack) return dtl__gather(c, in, e->a, out, x->cnt_a, x->t);
  /* Every peer's block spans the same indices of the chunk dim (the gather splits another dim), so chunk r
   * of the output gathers chunk r of every block. Last chunk first: the output may overlay the input. */
  int cd = e->cdim;
  int64_t rows = e->crows ? e->out_shape[cd] : 1, step = e->crows ? e->crows : 1;
  bool displs = c->ops->all_to_allv_displs != NULL;
  int self = displs ? dtl__own_block(c, true, in, out) : -1;
  for (int64_t r0 = (rows - 1) / step * step; r0 >= 0; r0 -= step) {
    int64_t nr = rows - r0 < step ? rows - r0 : step;
    for (int k = 0; k < g; k++) x->cnt_c[k] = e->crows ? x->cnt_a[k] / (size_t)rows * (size_t)nr : x->cnt_a[k];
    size_t mine = e->crows ? e->a / (size_t)rows : 0, n = x->cnt_c[c->rank];
    const void *send = dtl__at((void *)(uintptr_t)in, mine * (size_t)r0, x->es);
    if (displs) {
      /* This rank's chunk goes to every peer from one place. */
      for (int k = 0; k < g; k++) {
        x->cnt_b[k] = k == self ? 0 : n;
        x->dsp_a[k] = 0;
      }
      dtl__packed_displs(g, x->cnt_c, x->dsp_b, self);
      DTL_TRY(dtl__exchange_displs(c, send, x->cnt_b, x->dsp_a, tmp, x->cnt_c, x->dsp_b, x->t));
    } else {
      DTL_TRY(dtl__gather(c, send, n, tmp, x->cnt_c, x->t));
    }
    /* Placed in peer order; this rank's own rows of the chunk come straight from its input when it skipped them. */
    size_t off = 0;
    for (int k = 0; k < g; k++) {
      if (k == self ? n : x->cnt_c[k]) {
        dtl__peer_box(x, s, 0, k, bs, bo);
        int64_t rel[DTL_MAX_TENSOR_DIMS], first[DTL_MAX_TENSOR_DIMS] = {0};
        for (int d = 0; d < nd; d++) rel[d] = bo[d] - e->out_off[d];
        if (e->crows) {
          bs[cd] = nr;
          rel[cd] += r0;
          first[cd] = r0;
        }
        dtl__box_copy b = k == self ? dtl__box(nd, x->es, bs, e->in_shape, first, e->out_shape, rel)
                                    : dtl__box(nd, x->es, bs, bs, NULL, e->out_shape, rel);
        DTL_TRY(dtl__mem_copy_box(&c->mem, k == self ? in : dtl__at(tmp, off, x->es), out, &b));
      }
      off += x->cnt_c[k];
    }
  }
  return DTL_OK;
}

static dtl_status dtl__run_reduce_scatter(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e,
                                          dtl_comm *c, const void *in, void *out, void *tmp) {
  int g = c->size, nd = x->nd;
  if (e->a == 0) return DTL_OK; /* the input box is the same on every member of the group */
  dtl_reduce_op op = s->before[s->mesh_dim].op;
  int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
  for (int k = 0; k < g; k++) {
    dtl__peer_box(x, s, 1, k, bs, bo);
    x->cnt_b[k] = dtl__box_count(nd, bs);
  }
  if (!e->pack) return dtl__reduce_scatter(c, in, out, x->cnt_b, x->t, op);
  /* Pack chunk by chunk of the chunk dim, which the step does not split: every peer's block spans the same
   * rows, and the rows reduced into this rank's output are contiguous there. */
  int cd = e->cdim;
  int64_t rows = e->crows ? e->in_shape[cd] : 1, step = e->crows ? e->crows : 1;
  size_t out_row = e->crows ? e->b / (size_t)rows : 0;
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    int64_t nr = rows - r0 < step ? rows - r0 : step;
    size_t off = 0;
    for (int k = 0; k < g; k++) {
      x->cnt_c[k] = e->crows ? x->cnt_b[k] / (size_t)rows * (size_t)nr : x->cnt_b[k];
      if (x->cnt_c[k]) {
        dtl__peer_box(x, s, 1, k, bs, bo);
        int64_t rel[DTL_MAX_TENSOR_DIMS];
        for (int d = 0; d < nd; d++) rel[d] = bo[d] - e->in_off[d];
        if (e->crows) {
          bs[cd] = nr;
          rel[cd] += r0;
        }
        dtl__box_copy b = dtl__box(nd, x->es, bs, e->in_shape, rel, bs, NULL);
        DTL_TRY(dtl__mem_copy_box(&c->mem, in, dtl__at(tmp, off, x->es), &b));
      }
      off += x->cnt_c[k];
    }
    DTL_TRY(dtl__reduce_scatter(c, tmp, dtl__at(out, out_row * (size_t)r0, x->es), x->cnt_c, x->t, op));
  }
  return DTL_OK;
}

/* Clips box (s, o) on dim d to the rows [lo, lo + n); false when nothing is left. */
static bool dtl__clip(int64_t *s, int64_t *o, int d, int64_t lo, int64_t n) {
  int64_t a = o[d] > lo ? o[d] : lo, b = o[d] + s[d] < lo + n ? o[d] + s[d] : lo + n;
  o[d] = a;
  s[d] = b > a ? b - a : 0;
  return s[d] > 0;
}

/* The piece of an all-to-all between this rank and peer k: what it sends to k (my input box within k's output
 * box) or receives from k (k's input box within mine), cut to the rows of chunk r0 when the step is chunked
 * (e->cmode says whose rows). Returns its element count (0: empty). */
static size_t dtl__a2a_piece(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e, int k, bool recv,
                             int64_t r0, int64_t *is, int64_t *io) {
  int nd = x->nd, cd = e->cdim;
  int64_t ps[DTL_MAX_TENSOR_DIMS], po[DTL_MAX_TENSOR_DIMS];
  dtl__peer_box(x, s, recv ? 0 : 1, k, ps, po);
  bool ok = recv ? dtl__intersect(nd, ps, po, e->out_shape, e->out_off, is, io)
                 : dtl__intersect(nd, e->in_shape, e->in_off, ps, po, is, io);
  if (ok && e->crows) {
    /* Sender-local rows (mode 1) start at the sender's first input row, receiver-local (2) at the receiver's
     * first output row, absolute (0) at the group's first row. */
    int64_t lo = e->cmode == 1 ? (recv ? po[cd] : e->in_off[cd]) : e->cmode == 2 ? (recv ? e->out_off[cd] : po[cd]) : e->cbase;
    ok = dtl__clip(is, io, cd, lo + r0, e->crows);
  }
  return ok ? dtl__box_count(nd, is) : 0;
}

/* Sets the send counts of chunk r0 and, when packing, packs the pieces into send in peer order. */
static dtl_status dtl__a2a_pack(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e, dtl_comm *c,
                                int64_t r0, const void *in, void *send) {
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS];
  size_t off = 0;
  for (int k = 0; k < c->size; k++) {
    x->cnt_a[k] = dtl__a2a_piece(x, s, e, k, false, r0, is, io);
    if (e->pack && x->cnt_a[k]) {
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < x->nd; d++) rel[d] = io[d] - e->in_off[d];
      dtl__box_copy b = dtl__box(x->nd, x->es, is, e->in_shape, rel, is, NULL);
      DTL_TRY(dtl__mem_copy_box(&c->mem, in, dtl__at(send, off, x->es), &b));
    }
    off += x->cnt_a[k];
  }
  return DTL_OK;
}

/* Places the pieces of chunk r0 received in peer order (counts in cnt_b) into the output box. */
static dtl_status dtl__a2a_unpack(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e, dtl_comm *c,
                                  int64_t r0, const void *recv, void *out) {
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS];
  size_t off = 0;
  for (int k = 0; k < c->size; k++) {
    if (x->cnt_b[k]) {
      dtl__a2a_piece(x, s, e, k, true, r0, is, io);
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < x->nd; d++) rel[d] = io[d] - e->out_off[d];
      dtl__box_copy b = dtl__box(x->nd, x->es, is, is, NULL, e->out_shape, rel);
      DTL_TRY(dtl__mem_copy_box(&c->mem, dtl__at((void *)(uintptr_t)recv, off, x->es), out, &b));
    }
    off += x->cnt_b[k];
  }
  return DTL_OK;
}

/* Element offset of piece (ps, po) in the row-major box (bs, bo) when the piece is one contiguous run of it
 * (extent 1 on every dim outside its outermost dim of extent > 1, the box's whole extent inside); false when not. */
static bool dtl__run_offset(int nd, const int64_t *bs, const int64_t *bo, const int64_t *ps, const int64_t *po,
                            size_t *offset) {
  int d0 = 0;
  while (d0 < nd - 1 && ps[d0] == 1) d0++;
  for (int d = d0 + 1; d < nd; d++)
    if (ps[d] != bs[d]) return false;
  size_t off = 0;
  for (int d = 0; d < nd; d++) off = off * (size_t)bs[d] + (size_t)(po[d] - bo[d]);
  *offset = off;
  return true;
}

/* One side of an all-to-all at explicit displacements, for chunk r0: the pieces this rank sends (recv false:
 * pieces of the input box) or receives (recv true: of the output box), self's (-1: none) left out. They move in
 * place, at displacements into the box, when each is one contiguous run of it and the box is not overlaid by
 * the other side's (an input that the output overwrites must be packed away first; a side the step does not
 * scatter moves in place as it always did); else back to back through a pack or receive buffer. Sets the
 * counts and displacements (cnt_a/dsp_a or cnt_b/dsp_b); returns whether the side is in place. */
static bool dtl__a2a_side(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e, dtl_comm *c, int64_t r0,
                          bool recv, int self, bool overlaid) {
  size_t *cnt = recv ? x->cnt_b : x->cnt_a, *dsp = recv ? x->dsp_b : x->dsp_a;
  const int64_t *bs = recv ? e->out_shape : e->in_shape, *bo = recv ? e->out_off : e->in_off;
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS];
  bool runs = true;
  for (int k = 0; k < c->size; k++) {
    cnt[k] = k == self ? 0 : dtl__a2a_piece(x, s, e, k, recv, r0, is, io);
    dsp[k] = 0;
    if (cnt[k] && !dtl__run_offset(x->nd, bs, bo, is, io, &dsp[k])) runs = false;
  }
  bool scattered = recv ? e->unpack : e->pack;
  if (runs && (!scattered || !overlaid)) return true;
  dtl__packed_displs(c->size, cnt, dsp, -1);
  return false;
}

/* Packs the send pieces of chunk r0 back to back at their displacements in send (counts from dtl__a2a_side). */
static dtl_status dtl__a2a_pack_displs(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e,
                                       dtl_comm *c, int64_t r0, const void *in, void *send) {
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS], rel[DTL_MAX_TENSOR_DIMS];
  for (int k = 0; k < c->size; k++) {
    if (!x->cnt_a[k]) continue;
    dtl__a2a_piece(x, s, e, k, false, r0, is, io);
    for (int d = 0; d < x->nd; d++) rel[d] = io[d] - e->in_off[d];
    dtl__box_copy b = dtl__box(x->nd, x->es, is, e->in_shape, rel, is, NULL);
    DTL_TRY(dtl__mem_copy_box(&c->mem, in, dtl__at(send, x->dsp_a[k], x->es), &b));
  }
  return DTL_OK;
}

/* The all-to-all on a transport with all_to_allv_displs: each side moves in place where its pieces allow, and
 * this rank's own piece is copied directly unless self < 0. Chunked (e->crows), through the two chunk regions
 * of tmp; otherwise through tmp as the unchunked analysis sized it. */
static dtl_status dtl__all_to_all_displs(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e,
                                         dtl_comm *c, int64_t rows, int self, const void *in, void *out, void *tmp) {
  bool overlaid = in == out;
  void *tsend = tmp, *trecv = e->crows ? dtl__at(tmp, e->tsend, x->es) : tmp;
  for (int64_t r0 = 0; r0 < (e->crows ? rows : 1); r0 += e->crows ? e->crows : 1) {
    bool sin = dtl__a2a_side(x, s, e, c, r0, false, self, overlaid);
    bool rin = dtl__a2a_side(x, s, e, c, r0, true, self, overlaid);
    if (!sin) DTL_TRY(dtl__a2a_pack_displs(x, s, e, c, r0, in, tsend));
    /* Unchunked with both sides packed, tmp holds the send: the blocks arrive in the output, then move to tmp
     * (free again once sent) to be placed. */
    bool via_out = !rin && !sin && !e->crows;
    void *recv = rin || via_out ? out : trecv;
    DTL_TRY(dtl__exchange_displs(c, sin ? in : tsend, x->cnt_a, x->dsp_a, recv, x->cnt_b, x->dsp_b, x->t));
    if (rin) continue;
    if (via_out) {
      size_t got = 0;
      for (int k = 0; k < c->size; k++) got += x->cnt_b[k];
      DTL_TRY(dtl__mem_copy(&c->mem, tmp, out, got * x->es));
    }
    DTL_TRY(dtl__a2a_unpack(x, s, e, c, r0, trecv, out));
  }
  return self >= 0 ? dtl__copy_own(x, e, c, in, out) : DTL_OK;
}

static dtl_status dtl__run_all_to_all(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e, dtl_comm *c,
                                      const void *in, void *out, void *tmp) {
  int g = c->size, nd = x->nd;
  int64_t ps[DTL_MAX_TENSOR_DIMS], po[DTL_MAX_TENSOR_DIMS], is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS];
  size_t total = 0, in0 = 0, out0 = 0;
  int64_t rows = 1; /* chunked: the most rows of the chunk dim that any peer's chunk domain has */
  int from = s->before[s->mesh_dim].dim, to = s->after[s->mesh_dim].dim;
  bool even = from != to, scattered = false; /* scattered: some member of the group packs or unpacks */
  for (int k = 0; k < g; k++) {
    dtl__peer_box(x, s, 1, k, ps, po);
    size_t outk = dtl__box_count(nd, ps);
    if (k == 0) out0 = outk;
    even = even && outk == out0;
    scattered = scattered || !dtl__split_is_contiguous(nd, ps, from);
    if (e->crows && e->cmode != 1 && ps[e->cdim] > rows) rows = ps[e->cdim];
    dtl__peer_box(x, s, 0, k, ps, po);
    size_t ink = dtl__box_count(nd, ps);
    if (k == 0) in0 = ink;
    even = even && ink == in0;
    scattered = scattered || !dtl__split_is_contiguous(nd, ps, to);
    total += ink;
    if (e->crows && e->cmode == 1 && ps[e->cdim] > rows) rows = ps[e->cdim];
  }
  if (total == 0) return DTL_OK; /* the group's box is empty on every member alike */
  if (c->ops->all_to_allv_displs && (scattered || e->crows))
    return dtl__all_to_all_displs(x, s, e, c, rows, dtl__own_block(c, e->pack || e->unpack, in, out), in, out, tmp);
  if (e->crows) {
    /* Chunk by chunk through two chunk regions; equal blocks stay equal in every chunk (same clipping). */
    void *tsend = tmp, *trecv = dtl__at(tmp, e->tsend, x->es);
    for (int64_t r0 = 0; r0 < rows; r0 += e->crows) {
      DTL_TRY(dtl__a2a_pack(x, s, e, c, r0, in, tsend));
      for (int k = 0; k < g; k++) x->cnt_b[k] = dtl__a2a_piece(x, s, e, k, true, r0, is, io);
      DTL_TRY(dtl__exchange(c, even, tsend, x->cnt_a, trecv, x->cnt_b, x->t));
      DTL_TRY(dtl__a2a_unpack(x, s, e, c, r0, trecv, out));
    }
    return DTL_OK;
  }
  DTL_TRY(dtl__a2a_pack(x, s, e, c, 0, in, tmp));
  for (int k = 0; k < g; k++) x->cnt_b[k] = dtl__a2a_piece(x, s, e, k, true, 0, is, io);
  const void *send = e->pack ? tmp : in;
  if (!e->unpack) return dtl__exchange(c, even, send, x->cnt_a, out, x->cnt_b, x->t);
  if (e->pack) {
    /* tmp still holds what is being sent: receive into the output, then move it to tmp to place it. */
    DTL_TRY(dtl__exchange(c, even, send, x->cnt_a, out, x->cnt_b, x->t));
    DTL_TRY(dtl__mem_copy(&c->mem, tmp, out, e->b * x->es));
  } else {
    DTL_TRY(dtl__exchange(c, even, send, x->cnt_a, tmp, x->cnt_b, x->t));
  }
  return dtl__a2a_unpack(x, s, e, c, 0, tmp, out);
}

static dtl_status dtl__run_step(const dtl__ex_ctx *x, int k, const dtl__ex_step *e, const void *in, void *out, void *tmp) {
  const dtl__plan_step *s = &x->p->steps[k];
  dtl_comm *c = x->mesh->dim_comm[s->mesh_dim];
  switch (e->op) {
    case EX_NONE: return DTL_OK;
    case EX_FILL: return dtl__mem_fill_identity(&c->mem, out, e->b, x->t, s->after[s->mesh_dim].op);
    case EX_SLICE: {
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < x->nd; d++) rel[d] = e->out_off[d] - e->in_off[d];
      dtl__box_copy b = dtl__box(x->nd, x->es, e->out_shape, e->in_shape, rel, e->out_shape, NULL);
      return dtl__mem_copy_box(&c->mem, in, out, &b);
    }
    case EX_ALL_REDUCE:
      return e->a ? c->ops->all_reduce(c, in, out, e->a, x->t, s->before[s->mesh_dim].op) : DTL_OK;
    case EX_GATHER: return dtl__run_gather(x, s, e, c, in, out, tmp);
    case EX_REDUCE_SCATTER: return dtl__run_reduce_scatter(x, s, e, c, in, out, tmp);
    case EX_ALL_TO_ALL: return dtl__run_all_to_all(x, s, e, c, in, out, tmp);
  }
  return dtl__error(DTL_ERR_INTERNAL, "dtl_plan_execute: step op %d", (int)e->op);
}

/* Steps that communicate on this mesh (a mesh dim of size 1 never does). */
static int dtl__plan_comm_steps(const dtl_plan *p) {
  int n = 0;
  for (int k = 0; k < p->nsteps; k++) {
    const dtl__plan_step *s = &p->steps[k];
    if (s->kind != DTL__STEP_LOCAL_SLICE && s->kind != DTL__STEP_LOCAL_PARTIAL && p->src.mesh->shape[s->mesh_dim] > 1) n++;
  }
  return n;
}

/* The checks of one execution that depend on this rank's buffers; *aliased tells whether they share one. */
static dtl_status dtl__execute_args(const char *fn, const dtl_plan *p, const void *src_local, void *dst_local,
                                    bool *aliased) {
  size_t es = dtl_dtype_size(p->src.dtype), a0 = p->src.local_count, d0 = p->dst.local_count;
  DTL_CHECK_ARG(src_local != NULL || a0 == 0, fn, "src_local=NULL with %zu local elements", a0);
  DTL_CHECK_ARG(dst_local != NULL || d0 == 0, fn, "dst_local=NULL with %zu local elements", d0);
  DTL_TRY(dtl__plan_check(fn, p));
  /* The same pointer counts as aliased even where this rank's shards are empty, so that every rank of a
   * caller that passes one buffer decides alike. */
  *aliased = src_local != NULL && src_local == dst_local;
  if (!*aliased && src_local && dst_local && a0 && d0) {
    const char *s0 = src_local, *d = dst_local;
    *aliased = s0 < d + d0 * es && d < s0 + a0 * es;
  }
  if (*aliased && (src_local != dst_local || dtl__plan_comm_steps(p) > 0))
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "src_local=%p and dst_local=%p overlap, which only a purely "
                         "local plan allows when they are the same pointer (this plan has %d collective steps)",
                         src_local, dst_local, dtl__plan_comm_steps(p));
  return DTL_OK;
}

dtl_status dtl_plan_execute(const dtl_plan *p, const void *src_local, void *dst_local) {
  static const char fn[] = "dtl_plan_execute";
  DTL_CHECK_ARG(p != NULL, fn, "plan=NULL");
  const dtl_mesh *mesh = p->src.mesh;
  DTL_CHECK_ARG(mesh != NULL && mesh == p->dst.mesh, fn, "plan's source and target layouts are on different meshes");
  DTL_CHECK_ARG(mesh->comm != NULL, fn, "the plan's mesh is abstract (dtl_mesh_create_abstract): it has no "
                "communicators, so its plans can be explained but not executed");
  if (mesh->comm->aborted) return dtl__error_fn(DTL_ERR_COMM, fn, "the mesh's communicator was aborted");
  size_t es = dtl_dtype_size(p->src.dtype), a0 = p->src.local_count, d0 = p->dst.local_count;
  bool aliased = false;
  dtl_status st = dtl__execute_args(fn, p, src_local, dst_local, &aliased);

  dtl__ex_step ex[DTL__MAX_PLAN_STEPS];
  dtl__ex_layout L = {.final_at = AT_NONE};
  if (st == DTL_OK) {
    dtl__analyze(p, ex);
    dtl__place(ex, p->nsteps, aliased ? AT_DST : AT_SRC, aliased ? (a0 > d0 ? a0 : d0) : d0, a0, d0, &L);
    if (L.final_at == AT_NONE) /* cannot happen: staging every step in SCR is always a placement */
      st = dtl__error_fn(DTL_ERR_INTERNAL, fn, "found no placement of the plan's %d steps in the buffers", p->nsteps);
  }

  int gmax = 1;
  for (int md = 0; md < mesh->ndim; md++)
    if (mesh->shape[md] > gmax) gmax = mesh->shape[md];
  size_t small[5 * 64], *counts = small;
  if (st == DTL_OK && gmax > 64 && !(counts = dtl__malloc(sizeof(size_t) * 5 * (size_t)gmax))) {
    counts = small;
    st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  dtl__ex_ctx x = {p, mesh, p->src.ndim, es, p->src.dtype, counts, counts + gmax, counts + 2 * gmax,
                   counts + 3 * gmax, counts + 4 * gmax};

  dtl_comm *mc = mesh->comm;
  void *scr = NULL;
  if (st == DTL_OK && L.scr) st = dtl__mem_alloc(&mc->mem, L.scr * es, &scr);
  /* Every check and allocation is behind us: with DTL_CHECK the ranks agree here, before the first step. */
  DTL_TRY_GOTO(dtl__plan_agree(fn, p, st), st, done);
  void *base[AT_NPLACES] = {(void *)(uintptr_t)src_local, dst_local, scr};
  for (int k = 0; k < p->nsteps; k++) {
    const dtl__ex_step *e = &ex[k];
    if (e->op == EX_NONE) continue;
    int in = L.in[k], out = L.out[k], tmp = L.tmp[k];
    void *tp = NULL;
    if (tmp != AT_NONE) {
      size_t data = 0;
      if (in == tmp) data = e->a;
      if (out == tmp && e->b > data) data = e->b;
      tp = dtl__at(base[tmp], data, es);
    }
    if (L.staged[k]) {
      char *staging = dtl__at(tp, e->t, es);
      st = dtl__run_step(&x, k, e, base[in], staging, e->t ? tp : NULL);
      if (st == DTL_OK && e->b) st = dtl__mem_copy(&mesh->dim_comm[e->m]->mem, base[out], staging, e->b * es);
    } else {
      st = dtl__run_step(&x, k, e, base[in], base[out], tp);
    }
    if (st != DTL_OK) {
      st = dtl__error_prefix(st, "%s: step %d (%s on mesh dim %d)", fn, k, dtl__plan_step_name(p->steps[k].kind),
                             p->steps[k].mesh_dim);
      goto done;
    }
  }
  if (L.final_at != AT_DST && d0) DTL_TRY_GOTO(dtl__mem_copy(&mc->mem, dst_local, base[L.final_at], d0 * es), st, done);
done:
  if (scr) dtl__mem_free(&mc->mem, scr);
  if (counts != small) dtl__free(counts);
  return st;
}

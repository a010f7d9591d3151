/* SPDX-License-Identifier: Apache-2.0 */
/* The executor: runs a plan's steps, each on the communicator of its mesh dim, and decides where every
 * intermediate shard lives (the caller's source, the caller's destination, or one scratch buffer) so that a
 * call allocates as little as possible. It moves bytes only through the transport vtable (collectives,
 * copy_box, mem_*), so the same code runs on host (MPI) and device (NCCL) buffers. */
#include <stdlib.h>
#include <string.h>
#include "redistribute/plan_internal.h"

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

static const char *dtl__step_name(dtl__step_kind k) {
  switch (k) {
    case DTL__STEP_ALL_GATHER: return "all-gather";
    case DTL__STEP_ALL_REDUCE: return "all-reduce";
    case DTL__STEP_REDUCE_SCATTER: return "reduce-scatter";
    case DTL__STEP_ALL_TO_ALL: return "all-to-all";
    case DTL__STEP_LOCAL_SLICE: return "local slice";
    case DTL__STEP_LOCAL_PARTIAL: return "local partial";
  }
  return "?";
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
                               k, dtl__step_name(s->kind), md, pl[md].dim, d);
    }
    cur = s->after;
  }
  for (int d = 0; d < nm; d++)
    if (mesh->shape[d] > 1 && !dtl__same_placement(cur[d], p->dst.placements[d]))
      return dtl__error_fn(DTL_ERR_INTERNAL, fn, "plan ends on mesh dim %d with a placement other than the target's", d);
  return DTL_OK;
}

/* This rank's part of every step: its boxes, what it does, and how much temporary room that needs. */
static void dtl__analyze(const dtl_plan *p, dtl__ex_step *ex) {
  const dtl_mesh *mesh = p->src.mesh;
  int nd = p->src.ndim;
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
        e->t = e->unpack ? e->b : 0;
        break;
      case DTL__STEP_REDUCE_SCATTER:
        e->op = EX_REDUCE_SCATTER;
        e->pack = !dtl__split_is_contiguous(nd, e->in_shape, to.dim);
        e->t = e->pack ? e->a : 0;
        break;
      case DTL__STEP_ALL_TO_ALL:
        e->op = EX_ALL_TO_ALL;
        e->pack = !dtl__split_is_contiguous(nd, e->in_shape, to.dim);
        e->unpack = !dtl__split_is_contiguous(nd, e->out_shape, from.dim);
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
  if (e->unpack) c += e->b * (e->pack ? 2 : 1);
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
 * A step without a temporary may be staged: it writes into a temporary of its output's size, which is then
 * copied over its input; this makes a placement exist for every plan (all in SCR). budget = SIZE_MAX
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
      bool can_stage = e->t == 0 && e->op != EX_ALL_REDUCE && e->op != EX_FILL;
      for (int staged = 0; staged <= (int)can_stage; staged++) {
        size_t t = staged ? e->b : e->t;
        bool over_input = t > 0 || e->op == EX_ALL_REDUCE || e->op == EX_FILL;
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
  size_t *cnt_a, *cnt_b; /* per-peer counts, sized for the largest group */
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
  if (!e->unpack) return c->ops->all_gatherv(c, in, e->a, out, x->cnt_a, x->t);
  DTL_TRY(c->ops->all_gatherv(c, in, e->a, tmp, x->cnt_a, x->t));
  size_t off = 0;
  for (int k = 0; k < g; k++) {
    dtl__peer_box(x, s, 0, k, bs, bo);
    int64_t rel[DTL_MAX_TENSOR_DIMS];
    for (int d = 0; d < nd; d++) rel[d] = bo[d] - e->out_off[d];
    dtl__box_copy b = dtl__box(nd, x->es, bs, bs, NULL, e->out_shape, rel);
    DTL_TRY(c->ops->copy_box(c, dtl__at(tmp, off, x->es), out, &b));
    off += x->cnt_a[k];
  }
  return DTL_OK;
}

static dtl_status dtl__run_reduce_scatter(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e,
                                          dtl_comm *c, const void *in, void *out, void *tmp) {
  int g = c->size, nd = x->nd;
  if (e->a == 0) return DTL_OK; /* the input box is the same on every member of the group */
  int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
  size_t off = 0;
  for (int k = 0; k < g; k++) {
    dtl__peer_box(x, s, 1, k, bs, bo);
    x->cnt_b[k] = dtl__box_count(nd, bs);
    if (e->pack) {
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < nd; d++) rel[d] = bo[d] - e->in_off[d];
      dtl__box_copy b = dtl__box(nd, x->es, bs, e->in_shape, rel, bs, NULL);
      DTL_TRY(c->ops->copy_box(c, in, dtl__at(tmp, off, x->es), &b));
    }
    off += x->cnt_b[k];
  }
  return c->ops->reduce_scatterv(c, e->pack ? tmp : in, out, x->cnt_b, x->t, s->before[s->mesh_dim].op);
}

static dtl_status dtl__run_all_to_all(const dtl__ex_ctx *x, const dtl__plan_step *s, const dtl__ex_step *e, dtl_comm *c,
                                      const void *in, void *out, void *tmp) {
  int g = c->size, nd = x->nd;
  int64_t ps[DTL_MAX_TENSOR_DIMS], po[DTL_MAX_TENSOR_DIMS], is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS];
  size_t total = 0, off = 0;
  for (int k = 0; k < g; k++) {
    /* To peer k: my input box within k's output box; from peer k: k's input box within my output box. */
    dtl__peer_box(x, s, 1, k, ps, po);
    x->cnt_a[k] = dtl__intersect(nd, e->in_shape, e->in_off, ps, po, is, io) ? dtl__box_count(nd, is) : 0;
    if (e->pack && x->cnt_a[k]) {
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < nd; d++) rel[d] = io[d] - e->in_off[d];
      dtl__box_copy b = dtl__box(nd, x->es, is, e->in_shape, rel, is, NULL);
      DTL_TRY(c->ops->copy_box(c, in, dtl__at(tmp, off, x->es), &b));
    }
    off += x->cnt_a[k];
    dtl__peer_box(x, s, 0, k, ps, po);
    total += dtl__box_count(nd, ps);
    x->cnt_b[k] = dtl__intersect(nd, ps, po, e->out_shape, e->out_off, is, io) ? dtl__box_count(nd, is) : 0;
  }
  if (total == 0) return DTL_OK; /* the group's box is empty on every member alike */
  const void *send = e->pack ? tmp : in;
  if (!e->unpack) return c->ops->all_to_allv(c, send, x->cnt_a, out, x->cnt_b, x->t);
  void *recv = tmp;
  if (e->pack) {
    /* tmp still holds what is being sent: receive into the output, then move it to tmp to place it. */
    DTL_TRY(c->ops->all_to_allv(c, send, x->cnt_a, out, x->cnt_b, x->t));
    DTL_TRY(c->ops->mem_copy(c, tmp, out, e->b * x->es));
  } else {
    DTL_TRY(c->ops->all_to_allv(c, send, x->cnt_a, recv, x->cnt_b, x->t));
  }
  off = 0;
  for (int k = 0; k < g; k++) {
    if (x->cnt_b[k]) {
      dtl__peer_box(x, s, 0, k, ps, po);
      dtl__intersect(nd, ps, po, e->out_shape, e->out_off, is, io);
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < nd; d++) rel[d] = io[d] - e->out_off[d];
      dtl__box_copy b = dtl__box(nd, x->es, is, is, NULL, e->out_shape, rel);
      DTL_TRY(c->ops->copy_box(c, dtl__at(tmp, off, x->es), out, &b));
    }
    off += x->cnt_b[k];
  }
  return DTL_OK;
}

static dtl_status dtl__run_step(const dtl__ex_ctx *x, int k, const dtl__ex_step *e, const void *in, void *out, void *tmp) {
  const dtl__plan_step *s = &x->p->steps[k];
  dtl_comm *c = x->mesh->dim_comm[s->mesh_dim];
  switch (e->op) {
    case EX_NONE: return DTL_OK;
    case EX_FILL: return c->ops->mem_fill_identity(c, out, e->b, x->t, s->after[s->mesh_dim].op);
    case EX_SLICE: {
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < x->nd; d++) rel[d] = e->out_off[d] - e->in_off[d];
      dtl__box_copy b = dtl__box(x->nd, x->es, e->out_shape, e->in_shape, rel, e->out_shape, NULL);
      return c->ops->copy_box(c, in, out, &b);
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

dtl_status dtl_plan_execute(const dtl_plan *p, const void *src_local, void *dst_local) {
  static const char fn[] = "dtl_plan_execute";
  DTL_CHECK_ARG(p != NULL, fn, "plan=NULL");
  const dtl_mesh *mesh = p->src.mesh;
  DTL_CHECK_ARG(mesh != NULL && mesh == p->dst.mesh, fn, "plan's source and target layouts are on different meshes");
  DTL_CHECK_ARG(mesh->comm != NULL, fn, "the plan's mesh is abstract (dtl_mesh_create_abstract): it has no "
                "communicators, so its plans can be explained but not executed");
  if (mesh->comm->aborted) return dtl__error_fn(DTL_ERR_COMM, fn, "the mesh's communicator was aborted");
  size_t es = dtl_dtype_size(p->src.dtype), a0 = p->src.local_count, d0 = p->dst.local_count;
  DTL_CHECK_ARG(src_local != NULL || a0 == 0, fn, "src_local=NULL with %zu local elements", a0);
  DTL_CHECK_ARG(dst_local != NULL || d0 == 0, fn, "dst_local=NULL with %zu local elements", d0);
  DTL_TRY(dtl__plan_check(fn, p));
  /* The same pointer counts as aliased even where this rank's shards are empty, so that every rank of a
   * caller that passes one buffer decides alike. */
  bool aliased = src_local != NULL && src_local == dst_local;
  if (!aliased && src_local && dst_local && a0 && d0) {
    const char *s0 = src_local, *d = dst_local;
    aliased = s0 < d + d0 * es && d < s0 + a0 * es;
  }
  if (aliased) {
    if (src_local != dst_local || dtl__plan_comm_steps(p) > 0)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "src_local=%p and dst_local=%p overlap, which only a purely "
                           "local plan allows when they are the same pointer (this plan has %d collective steps)",
                           src_local, dst_local, dtl__plan_comm_steps(p));
  }

  dtl__ex_step ex[DTL__MAX_PLAN_STEPS];
  dtl__ex_layout L;
  dtl__analyze(p, ex);
  dtl__place(ex, p->nsteps, aliased ? AT_DST : AT_SRC, aliased ? (a0 > d0 ? a0 : d0) : d0, a0, d0, &L);

  int gmax = 1;
  for (int md = 0; md < mesh->ndim; md++)
    if (mesh->shape[md] > gmax) gmax = mesh->shape[md];
  size_t small[2 * 64], *counts = small;
  if (gmax > 64 && !(counts = malloc(sizeof(size_t) * 2 * (size_t)gmax)))
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  dtl__ex_ctx x = {p, mesh, p->src.ndim, es, p->src.dtype, counts, counts + gmax};

  dtl_comm *mc = mesh->comm;
  void *scr = NULL;
  dtl_status st = DTL_OK;
  if (L.scr) DTL_TRY_GOTO(mc->ops->mem_alloc(mc, L.scr * es, &scr), st, done);
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
      st = dtl__run_step(&x, k, e, base[in], tp, NULL);
      if (st == DTL_OK && e->b) st = mesh->dim_comm[e->m]->ops->mem_copy(mesh->dim_comm[e->m], base[out], tp, e->b * es);
    } else {
      st = dtl__run_step(&x, k, e, base[in], base[out], tp);
    }
    if (st != DTL_OK) {
      st = dtl__error_prefix(st, "%s: step %d (%s on mesh dim %d)", fn, k, dtl__step_name(p->steps[k].kind),
                             p->steps[k].mesh_dim);
      goto done;
    }
  }
  if (L.final_at != AT_DST && d0) DTL_TRY_GOTO(mc->ops->mem_copy(mc, dst_local, base[L.final_at], d0 * es), st, done);
done:
  if (scr) mc->ops->mem_free(mc, scr);
  if (counts != small) free(counts);
  return st;
}

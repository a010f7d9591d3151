/* SPDX-License-Identifier: Apache-2.0 */
/* The step runners: each carries out one compiled step on this rank, part by part (executor_internal.h), with the
 * transport's collectives, blocking or nonblocking, and the memory interface's copies, so the same code runs on host
 * (MPI) and device (NCCL) buffers. Here the local steps, all-reduce, the gather and the reduce-scatter, the dispatch
 * over step kinds, and what the all-to-all runner (all_to_all.c) shares with them. Runners only read the compiled step and write counts into the plan's
 * count arrays: they allocate nothing. */
#include <stdlib.h>
#include <string.h>
#include "redistribute/executor_internal.h"

dtl__box_copy dtl__ex_box(int nd, size_t es, const int64_t *ext, const int64_t *src_shape, const int64_t *src_off,
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

bool dtl__ex_intersect(int nd, const int64_t *as, const int64_t *ao, const int64_t *bs, const int64_t *bo, int64_t *s,
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

/* The collectives below run blocking (req NULL) or start nonblocking: then *req gets the transfer in flight, or
 * stays NULL when the transport has no nonblocking form of the call and ran it blocking (every transport dtl
 * builds on MPI has them all; the rule only keeps a plan correct on one that lacks some). */
static dtl_status dtl__gather(dtl_comm *c, const void *send, size_t n, void *recv, const size_t *counts, dtl_dtype t,
                              dtl_request **req) {
  const dtl__comm_ops *o = c->ops;
  bool even = dtl__all_equal(counts, c->size);
  if (req && even && o->all_gather_async) return o->all_gather_async(c, send, recv, n, t, req);
  if (req && !even && o->all_gatherv_async) return o->all_gatherv_async(c, send, n, recv, counts, t, req);
  return even ? o->all_gather(c, send, recv, n, t) : o->all_gatherv(c, send, n, recv, counts, t);
}

static dtl_status dtl__reduce_scatter(dtl_comm *c, const void *send, void *recv, const size_t *counts, dtl_dtype t,
                                      dtl_reduce_op op, dtl_request **req) {
  const dtl__comm_ops *o = c->ops;
  bool even = dtl__all_equal(counts, c->size);
  if (req && even && o->reduce_scatter_async) return o->reduce_scatter_async(c, send, recv, counts[0], t, op, req);
  if (req && !even && o->reduce_scatterv_async) return o->reduce_scatterv_async(c, send, recv, counts, t, op, req);
  return even ? o->reduce_scatter(c, send, recv, counts[0], t, op) : o->reduce_scatterv(c, send, recv, counts, t, op);
}

static dtl_status dtl__all_reduce(dtl_comm *c, const void *send, void *recv, size_t n, dtl_dtype t, dtl_reduce_op op,
                                  dtl_request **req) {
  if (req && c->ops->all_reduce_async) return c->ops->all_reduce_async(c, send, recv, n, t, op, req);
  return c->ops->all_reduce(c, send, recv, n, t, op);
}

/* Regions in one place never overlap unless one is empty, so equal pointers mean an empty side: pass NULL for
 * it rather than look like an in-place exchange, which some engines refuse. */
static void dtl__empty_side(const dtl_comm *c, const void **send, const size_t *sc, void **recv) {
  if (*send != *recv) return;
  size_t sent = 0;
  for (int k = 0; k < c->size; k++) sent += sc[k];
  if (sent) *recv = NULL;
  else *send = NULL;
}

dtl_status dtl__ex_exchange(dtl_comm *c, bool even, const void *send, const size_t *sc, void *recv, const size_t *rc,
                            dtl_dtype t, dtl_request **req) {
  const dtl__comm_ops *o = c->ops;
  dtl__empty_side(c, &send, sc, &recv);
  if (req && even && o->all_to_all_async) return o->all_to_all_async(c, send, recv, sc[0], t, req);
  if (req && !even && o->all_to_allv_async) return o->all_to_allv_async(c, send, sc, recv, rc, t, req);
  return even ? o->all_to_all(c, send, recv, sc[0], t) : o->all_to_allv(c, send, sc, recv, rc, t);
}

dtl_status dtl__ex_exchange_displs(dtl_comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                                   const size_t *rc, const size_t *rd, dtl_dtype t, dtl_request **req) {
  dtl__empty_side(c, &send, sc, &recv);
  if (req && c->ops->all_to_allv_displs_async) return c->ops->all_to_allv_displs_async(c, send, sc, sd, recv, rc, rd, t, req);
  return c->ops->all_to_allv_displs(c, send, sc, sd, recv, rc, rd, t);
}

/* The own block. On a transport that takes explicit displacements (all_to_allv_displs), a gather or all-to-all
 * that packs or unpacks (scattered) leaves this rank's own block out of the exchange and copies it straight from
 * the input box into the output box: one strided copy instead of a copy into the pack or receive buffer, the
 * transport's local copy, and a copy out again. The group then uses all_to_allv_displs throughout (the choice
 * of collective must agree across it); each member skips its own block only when its input and output are
 * different buffers (a strided copy over an input of another shape would clobber it). Returns the rank whose
 * block is skipped, or -1. */
int dtl__ex_own_block(dtl_comm *c, bool scattered, const void *in, const void *out) {
  return scattered && in != out ? c->rank : -1;
}

void dtl__ex_packed_displs(int g, size_t *counts, size_t *displs, int self) {
  if (self >= 0) counts[self] = 0;
  size_t off = 0;
  for (int k = 0; k < g; k++) {
    displs[k] = off;
    off += counts[k];
  }
}

/* Element offset of piece (ps, po) in the row-major box (bs, bo) when the piece is one contiguous run of it
 * (extent 1 on every dim outside its outermost dim of extent > 1, the box's whole extent inside); false when not. */
bool dtl__run_offset(int nd, const int64_t *bs, const int64_t *bo, const int64_t *ps, const int64_t *po,
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

dtl_status dtl__ex_copy_own(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, const void *in, void *out) {
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS], ri[DTL_MAX_TENSOR_DIMS], ro[DTL_MAX_TENSOR_DIMS];
  if (!dtl__ex_intersect(x->nd, e->in_shape, e->in_off, e->out_shape, e->out_off, is, io)) return DTL_OK;
  for (int d = 0; d < x->nd; d++) {
    ri[d] = io[d] - e->in_off[d];
    ro[d] = io[d] - e->out_off[d];
  }
  dtl__box_copy b = dtl__ex_box(x->nd, x->es, is, e->in_shape, ri, e->out_shape, ro);
  return dtl__mem_copy_box(&c->mem, in, out, &b);
}

int64_t dtl__ex_nchunks(int64_t rows, int64_t crows) { return crows ? (rows + crows - 1) / crows : 1; }

/* The gather: one collective, or with an unpack pass one part per chunk of the chunk dim. Every peer's block spans
 * the same indices of the chunk dim (the gather splits another dim), so chunk r of the output gathers chunk r of
 * every block. Last chunk first: the output may overlay the input. */
static int dtl__gather_parts(const dtl__ex_step *e) {
  if (e->total == 0) return 0; /* the group's box is empty on every member alike */
  return e->unpack ? (int)dtl__ex_nchunks(e->out_shape[e->cdim], e->crows) : 1;
}

/* The first row and the rows of the gather's chunk j. */
static int64_t dtl__gather_rows(const dtl__ex_step *e, int j, int64_t *nr) {
  int64_t rows = e->crows ? e->out_shape[e->cdim] : 1, step = e->crows ? e->crows : 1;
  int64_t r0 = (dtl__ex_nchunks(rows, e->crows) - 1 - j) * step;
  *nr = rows - r0 < step ? rows - r0 : step;
  return r0;
}

/* The rank whose block the gather's transport leaves out (it copies its own rows straight from its input), or -1. */
static int dtl__gather_self(dtl_comm *c, const void *in, const void *out) {
  return c->ops->all_to_allv_displs ? dtl__ex_own_block(c, true, in, out) : -1;
}

static dtl_status dtl__gather_part(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, int j, const void *in,
                                   void *out, void *tmp, dtl_request **req) {
  int g = c->size;
  const size_t *counts = e->peers[0].count;
  if (!e->unpack) return dtl__gather(c, in, e->a, out, counts, x->t, req);
  int64_t nr, r0 = dtl__gather_rows(e, j, &nr), rows = e->crows ? e->out_shape[e->cdim] : 1;
  int self = dtl__gather_self(c, in, out);
  for (int k = 0; k < g; k++) x->cnt_c[k] = e->crows ? counts[k] / (size_t)rows * (size_t)nr : counts[k];
  size_t mine = e->crows ? e->a / (size_t)rows : 0, n = x->cnt_c[c->rank];
  const void *send = dtl__at((void *)(uintptr_t)in, mine * (size_t)r0, x->es);
  if (c->ops->all_to_allv_displs) {
    /* This rank's chunk goes to every peer from one place. */
    for (int k = 0; k < g; k++) {
      x->cnt_b[k] = k == self ? 0 : n;
      x->dsp_a[k] = 0;
    }
    dtl__ex_packed_displs(g, x->cnt_c, x->dsp_b, self);
    DTL_TRY(dtl__ex_exchange_displs(c, send, x->cnt_b, x->dsp_a, tmp, x->cnt_c, x->dsp_b, x->t, req));
  } else {
    DTL_TRY(dtl__gather(c, send, n, tmp, x->cnt_c, x->t, req));
  }
  return DTL_OK;
}

/* Places the gather's chunk j, received in peer order; this rank's own rows of the chunk come straight from its
 * input when the transport left them out. */
static dtl_status dtl__gather_place(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, int j, const void *in,
                                    void *out, void *tmp) {
  if (!e->unpack) return DTL_OK;
  int g = c->size, nd = x->nd, cd = e->cdim;
  int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
  int64_t nr, r0 = dtl__gather_rows(e, j, &nr), rows = e->crows ? e->out_shape[cd] : 1;
  int self = dtl__gather_self(c, in, out);
  const size_t *counts = e->peers[0].count;
  size_t off = 0, n = e->crows ? counts[c->rank] / (size_t)rows * (size_t)nr : counts[c->rank];
  for (int k = 0; k < g; k++) {
    if (k == self ? n : x->cnt_c[k]) {
      dtl__ex_peer_box(e, nd, 0, k, bs, bo);
      int64_t rel[DTL_MAX_TENSOR_DIMS], first[DTL_MAX_TENSOR_DIMS] = {0};
      for (int d = 0; d < nd; d++) rel[d] = bo[d] - e->out_off[d];
      if (e->crows) {
        bs[cd] = nr;
        rel[cd] += r0;
        first[cd] = r0;
      }
      dtl__box_copy b = k == self ? dtl__ex_box(nd, x->es, bs, e->in_shape, first, e->out_shape, rel)
                                  : dtl__ex_box(nd, x->es, bs, bs, NULL, e->out_shape, rel);
      DTL_TRY(dtl__mem_copy_box(&c->mem, k == self ? in : dtl__at(tmp, off, x->es), out, &b));
    }
    off += x->cnt_c[k];
  }
  return DTL_OK;
}

/* The reduce-scatter: one collective, or with a pack pass one part per chunk of the chunk dim, which the step does
 * not split: every peer's block spans the same rows, and the rows reduced into this rank's output are contiguous
 * there. */
static int dtl__reduce_scatter_parts(const dtl__ex_step *e) {
  if (e->a == 0) return 0; /* the input box is the same on every member of the group */
  return e->pack ? (int)dtl__ex_nchunks(e->in_shape[e->cdim], e->crows) : 1;
}

static dtl_status dtl__reduce_scatter_part(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, int j,
                                           const void *in, void *out, void *tmp, dtl_request **req) {
  int g = c->size, nd = x->nd, cd = e->cdim;
  const size_t *counts = e->peers[1].count;
  if (!e->pack) return dtl__reduce_scatter(c, in, out, counts, x->t, e->rop, req);
  int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
  int64_t rows = e->crows ? e->in_shape[cd] : 1, step = e->crows ? e->crows : 1, r0 = (int64_t)j * step;
  int64_t nr = rows - r0 < step ? rows - r0 : step;
  size_t out_row = e->crows ? e->b / (size_t)rows : 0, off = 0;
  for (int k = 0; k < g; k++) {
    x->cnt_c[k] = e->crows ? counts[k] / (size_t)rows * (size_t)nr : counts[k];
    if (x->cnt_c[k]) {
      dtl__ex_peer_box(e, nd, 1, k, bs, bo);
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < nd; d++) rel[d] = bo[d] - e->in_off[d];
      if (e->crows) {
        bs[cd] = nr;
        rel[cd] += r0;
      }
      dtl__box_copy b = dtl__ex_box(nd, x->es, bs, e->in_shape, rel, bs, NULL);
      DTL_TRY(dtl__mem_copy_box(&c->mem, in, dtl__at(tmp, off, x->es), &b));
    }
    off += x->cnt_c[k];
  }
  return dtl__reduce_scatter(c, tmp, dtl__at(out, out_row * (size_t)r0, x->es), x->cnt_c, x->t, e->rop, req);
}

int dtl__ex_parts(const dtl__ex_step *e, dtl_comm *c, const void *in, const void *out) {
  switch (e->op) {
    case EX_NONE: return 0;
    case EX_FILL: case EX_SLICE: case EX_EMBED: return 1;
    case EX_ALL_REDUCE: return e->a ? 1 : 0;
    case EX_GATHER: return dtl__gather_parts(e);
    case EX_REDUCE_SCATTER: return dtl__reduce_scatter_parts(e);
    case EX_ALL_TO_ALL: return dtl__a2a_parts(e, c, in, out);
    case EX_EXCHANGE: return dtl__xchg_parts(e);
  }
  return 0;
}

dtl_status dtl__ex_part_start(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, dtl__ex_part *s, const void *in,
                        void *out, void *tmp, dtl_request **req) {
  if (req) *req = NULL;
  dtl_status st = DTL_OK;
  switch (e->op) {
    case EX_NONE: return DTL_OK;
    case EX_FILL: return dtl__mem_fill_identity(&c->mem, out, e->b, x->t, e->rop);
    case EX_SLICE: {
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < x->nd; d++) rel[d] = e->out_off[d] - e->in_off[d];
      dtl__box_copy b = dtl__ex_box(x->nd, x->es, e->out_shape, e->in_shape, rel, e->out_shape, NULL);
      return dtl__mem_copy_box(&c->mem, in, out, &b);
    }
    case EX_EMBED: {
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < x->nd; d++) rel[d] = e->in_off[d] - e->out_off[d];
      DTL_TRY(dtl__mem_fill_identity(&c->mem, out, e->b, x->t, e->rop));
      if (e->a == 0) return DTL_OK;
      dtl__box_copy b = dtl__ex_box(x->nd, x->es, e->in_shape, e->in_shape, NULL, e->out_shape, rel);
      return dtl__mem_copy_box(&c->mem, in, out, &b);
    }
    case EX_ALL_REDUCE: return dtl__all_reduce(c, in, out, e->a, x->t, e->rop, req);
    case EX_GATHER: st = dtl__gather_part(x, e, c, s->j, in, out, tmp, req); break;
    case EX_REDUCE_SCATTER: return dtl__reduce_scatter_part(x, e, c, s->j, in, out, tmp, req);
    case EX_ALL_TO_ALL: st = dtl__a2a_part_start(x, e, c, s, in, out, tmp, req); break;
    case EX_EXCHANGE: return dtl__xchg_part_start(x, e, c, s->j, in, out, tmp, req); /* finishes what completed itself */
  }
  /* A part that completed at once (blocking, or nothing left in flight) is finished here. */
  if (st == DTL_OK && !(req && *req)) st = dtl__ex_part_done(x, e, c, s, in, out, tmp);
  return st;
}

dtl_status dtl__ex_part_done(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, dtl__ex_part *s,
                             const void *in, void *out, void *tmp) {
  switch (e->op) {
    case EX_GATHER: return dtl__gather_place(x, e, c, s->j, in, out, tmp);
    case EX_ALL_TO_ALL: return dtl__a2a_part_done(x, e, c, s, in, out, tmp);
    case EX_EXCHANGE: return dtl__xchg_part_done(x, e, c, s->j, out, tmp);
    default: return DTL_OK;
  }
}

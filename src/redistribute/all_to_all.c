/* SPDX-License-Identifier: Apache-2.0 */
/* The all-to-all runner, S(i) -> S(j) over one mesh dim: which piece of its box each rank sends to and
 * receives from every peer (clipped to a chunk when the step is chunked), the pack and unpack passes, and the
 * two ways to exchange: back to back through pack and receive buffers (any transport), or at explicit
 * displacements (all_to_allv_displs), moving pieces in place wherever they are contiguous runs; in parts, one per
 * chunk (executor_internal.h). */
#include <stdlib.h>
#include <string.h>
#include "redistribute/executor_internal.h"

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
static size_t dtl__a2a_piece(const dtl__ex_ctx *x, const dtl__ex_step *e, int k, bool recv,
                             int64_t r0, int64_t *is, int64_t *io) {
  int nd = x->nd, cd = e->cdim;
  int64_t ps[DTL_MAX_TENSOR_DIMS], po[DTL_MAX_TENSOR_DIMS];
  dtl__ex_peer_box(e, nd, recv ? 0 : 1, k, ps, po);
  bool ok = recv ? dtl__ex_intersect(nd, ps, po, e->out_shape, e->out_off, is, io)
                 : dtl__ex_intersect(nd, e->in_shape, e->in_off, ps, po, is, io);
  if (ok && e->crows) {
    /* Sender-local rows (mode 1) start at the sender's first input row, receiver-local (2) at the receiver's
     * first output row, absolute (0) at the group's first row. */
    int64_t lo = e->cmode == 1 ? (recv ? po[cd] : e->in_off[cd]) : e->cmode == 2 ? (recv ? e->out_off[cd] : po[cd]) : e->cbase;
    ok = dtl__clip(is, io, cd, lo + r0, e->crows);
  }
  return ok ? dtl__box_count(nd, is) : 0;
}

/* Sets the send counts of chunk r0 and, when packing, packs the pieces into send in peer order. */
static dtl_status dtl__a2a_pack(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c,
                                int64_t r0, const void *in, void *send) {
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS];
  size_t off = 0;
  for (int k = 0; k < c->size; k++) {
    x->cnt_a[k] = dtl__a2a_piece(x, e, k, false, r0, is, io);
    if (e->pack && x->cnt_a[k]) {
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < x->nd; d++) rel[d] = io[d] - e->in_off[d];
      dtl__box_copy b = dtl__ex_box(x->nd, x->es, is, e->in_shape, rel, is, NULL);
      DTL_TRY(dtl__mem_copy_box(&c->mem, in, dtl__at(send, off, x->es), &b));
    }
    off += x->cnt_a[k];
  }
  return DTL_OK;
}

/* Places the pieces of chunk r0 received in peer order (counts in cnt_b) into the output box. */
static dtl_status dtl__a2a_unpack(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c,
                                  int64_t r0, const void *recv, void *out) {
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS];
  size_t off = 0;
  for (int k = 0; k < c->size; k++) {
    if (x->cnt_b[k]) {
      dtl__a2a_piece(x, e, k, true, r0, is, io);
      int64_t rel[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < x->nd; d++) rel[d] = io[d] - e->out_off[d];
      dtl__box_copy b = dtl__ex_box(x->nd, x->es, is, is, NULL, e->out_shape, rel);
      DTL_TRY(dtl__mem_copy_box(&c->mem, dtl__at((void *)(uintptr_t)recv, off, x->es), out, &b));
    }
    off += x->cnt_b[k];
  }
  return DTL_OK;
}

/* One side of an all-to-all at explicit displacements, for chunk r0: the pieces this rank sends (recv false:
 * pieces of the input box) or receives (recv true: of the output box), self's (-1: none) left out. They move in
 * place, at displacements into the box, when each is one contiguous run of it and the box is not overlaid by
 * the other side's (an input that the output overwrites must be packed away first; a side the step does not
 * scatter moves in place as it always did); else back to back through a pack or receive buffer. Sets the
 * counts and displacements (cnt_a/dsp_a or cnt_b/dsp_b); returns whether the side is in place. */
static bool dtl__a2a_side(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, int64_t r0,
                          bool recv, int self, bool overlaid) {
  size_t *cnt = recv ? x->cnt_b : x->cnt_a, *dsp = recv ? x->dsp_b : x->dsp_a;
  const int64_t *bs = recv ? e->out_shape : e->in_shape, *bo = recv ? e->out_off : e->in_off;
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS];
  bool runs = true;
  for (int k = 0; k < c->size; k++) {
    cnt[k] = k == self ? 0 : dtl__a2a_piece(x, e, k, recv, r0, is, io);
    dsp[k] = 0;
    if (cnt[k] && !dtl__run_offset(x->nd, bs, bo, is, io, &dsp[k])) runs = false;
  }
  bool scattered = recv ? e->unpack : e->pack;
  if (runs && (!scattered || !overlaid)) return true;
  dtl__ex_packed_displs(c->size, cnt, dsp, -1);
  return false;
}

/* Packs the send pieces of chunk r0 back to back at their displacements in send (counts from dtl__a2a_side). */
static dtl_status dtl__a2a_pack_displs(const dtl__ex_ctx *x, const dtl__ex_step *e,
                                       dtl_comm *c, int64_t r0, const void *in, void *send) {
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS], rel[DTL_MAX_TENSOR_DIMS];
  for (int k = 0; k < c->size; k++) {
    if (!x->cnt_a[k]) continue;
    dtl__a2a_piece(x, e, k, false, r0, is, io);
    for (int d = 0; d < x->nd; d++) rel[d] = io[d] - e->in_off[d];
    dtl__box_copy b = dtl__ex_box(x->nd, x->es, is, e->in_shape, rel, is, NULL);
    DTL_TRY(dtl__mem_copy_box(&c->mem, in, dtl__at(send, x->dsp_a[k], x->es), &b));
  }
  return DTL_OK;
}

/* The all-to-all's parts: on a transport with all_to_allv_displs, when the step scatters or is chunked, each side
 * moves in place where its pieces allow (dtl__a2a_side), one part per chunk (through the two chunk regions of
 * tmp) or one through tmp as the unchunked analysis sized it, and a last part copies this rank's own piece
 * directly (self >= 0); otherwise one part per chunk through the two chunk regions, or one part. */
static bool dtl__a2a_displs(const dtl__ex_step *e, dtl_comm *c) {
  return c->ops->all_to_allv_displs && (e->scattered || e->crows);
}

static int dtl__a2a_self(const dtl__ex_step *e, dtl_comm *c, const void *in, const void *out) {
  return dtl__a2a_displs(e, c) ? dtl__ex_own_block(c, e->pack || e->unpack, in, out) : -1;
}

int dtl__a2a_parts(const dtl__ex_step *e, dtl_comm *c, const void *in, const void *out) {
  if (e->total == 0) return 0; /* the group's box is empty on every member alike */
  int chunks = (int)(e->crows ? dtl__ex_nchunks(e->rows, e->crows) : 1);
  return chunks + (dtl__a2a_self(e, c, in, out) >= 0);
}

/* Unchunked with both sides packed, tmp holds the send: the blocks arrive in the output, then move to tmp (free
 * again once sent) to be placed. */
static bool dtl__a2a_via_out(const dtl__ex_step *e, const dtl__ex_part *s) { return !s->rin && !s->sin && !e->crows; }

dtl_status dtl__a2a_part_start(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, dtl__ex_part *s, const void *in,
                         void *out, void *tmp, dtl_request **req) {
  int g = c->size;
  int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS], r0 = (int64_t)s->j * e->crows;
  if (dtl__a2a_displs(e, c)) {
    int self = dtl__a2a_self(e, c, in, out);
    if (self >= 0 && s->j == dtl__a2a_parts(e, c, in, out) - 1) return DTL_OK; /* the own piece: in part_done */
    bool overlaid = in == out;
    void *tsend = tmp, *trecv = e->crows ? dtl__at(tmp, e->tsend, x->es) : tmp;
    s->sin = dtl__a2a_side(x, e, c, r0, false, self, overlaid);
    s->rin = dtl__a2a_side(x, e, c, r0, true, self, overlaid);
    if (!s->sin) DTL_TRY(dtl__a2a_pack_displs(x, e, c, r0, in, tsend));
    void *recv = s->rin || dtl__a2a_via_out(e, s) ? out : trecv;
    return dtl__ex_exchange_displs(c, s->sin ? in : tsend, x->cnt_a, x->dsp_a, recv, x->cnt_b, x->dsp_b, x->t, req);
  }
  if (e->crows) { /* equal blocks stay equal in every chunk (same clipping) */
    void *tsend = tmp, *trecv = dtl__at(tmp, e->tsend, x->es);
    DTL_TRY(dtl__a2a_pack(x, e, c, r0, in, tsend));
    for (int k = 0; k < g; k++) x->cnt_b[k] = dtl__a2a_piece(x, e, k, true, r0, is, io);
    return dtl__ex_exchange(c, e->even, tsend, x->cnt_a, trecv, x->cnt_b, x->t, req);
  }
  DTL_TRY(dtl__a2a_pack(x, e, c, 0, in, tmp));
  for (int k = 0; k < g; k++) x->cnt_b[k] = dtl__a2a_piece(x, e, k, true, 0, is, io);
  /* Unpacking while tmp still holds what is being sent: receive into the output, then move it to tmp to place it. */
  void *recv = !e->unpack || e->pack ? out : tmp;
  return dtl__ex_exchange(c, e->even, e->pack ? tmp : in, x->cnt_a, recv, x->cnt_b, x->t, req);
}

dtl_status dtl__a2a_part_done(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, dtl__ex_part *s,
                              const void *in, void *out, void *tmp) {
  int64_t r0 = (int64_t)s->j * e->crows;
  if (dtl__a2a_displs(e, c)) {
    int self = dtl__a2a_self(e, c, in, out);
    if (self >= 0 && s->j == dtl__a2a_parts(e, c, in, out) - 1) return dtl__ex_copy_own(x, e, c, in, out);
    if (s->rin) return DTL_OK;
    void *trecv = e->crows ? dtl__at(tmp, e->tsend, x->es) : tmp;
    if (dtl__a2a_via_out(e, s)) {
      size_t got = 0;
      for (int k = 0; k < c->size; k++) got += x->cnt_b[k];
      DTL_TRY(dtl__mem_copy(&c->mem, tmp, out, got * x->es));
    }
    return dtl__a2a_unpack(x, e, c, r0, trecv, out);
  }
  if (e->crows) return dtl__a2a_unpack(x, e, c, r0, dtl__at(tmp, e->tsend, x->es), out);
  if (!e->unpack) return DTL_OK;
  if (e->pack) DTL_TRY(dtl__mem_copy(&c->mem, tmp, out, e->b * x->es));
  return dtl__a2a_unpack(x, e, c, 0, tmp, out);
}

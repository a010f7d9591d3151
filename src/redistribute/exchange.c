/* SPDX-License-Identifier: Apache-2.0 */
/* The exchange runner: this rank's messages of an exchange step (compile.c took them from the exchange map), round by
 * round. A piece that is one contiguous run of this rank's box moves in place; the others are packed into, or
 * unpacked from, the regions the step's mode names; the rank's own piece is one box copy; a rank that holds the
 * identity of a Partial target fills instead of receiving. The messages go point to point (the transport's
 * exchange), so ranks with nothing to move take no part. It runs in parts (executor_internal.h), blocking or started
 * nonblocking and finished once complete. */
#include <string.h>
#include "redistribute/executor_internal.h"

/* Message m clipped to round r0 (rows [r0, r0 + xrows) of the round dim): its box in s, o; false when empty. */
static bool dtl__xclip(const dtl__xstep *x, int nd, const dtl__xmsg *m, int64_t r0, int64_t *s, int64_t *o) {
  memcpy(s, m->shape, sizeof(int64_t) * (size_t)nd);
  memcpy(o, m->off, sizeof(int64_t) * (size_t)nd);
  if (x->xrounds <= 1) return true;
  if (x->xfine) { /* round r0 is one index of every dim but the last, row-major */
    for (int d = nd - 2, r = (int)r0; d >= 0; d--) {
      int64_t i = r % x->xshape[d];
      r /= (int)x->xshape[d];
      if (i < o[d] || i >= o[d] + s[d]) return false;
      o[d] = i;
      s[d] = 1;
    }
    return s[nd - 1] > 0;
  }
  int d = x->xdim;
  int64_t lo = o[d] > r0 ? o[d] : r0, hi = o[d] + s[d] < r0 + x->xrows ? o[d] + s[d] : r0 + x->xrows;
  o[d] = lo;
  s[d] = hi > lo ? hi - lo : 0;
  return s[d] > 0;
}

/* The regions of the mode: where packed sends and packed receives go. */
static void dtl__xregions(const dtl__xstep *x, size_t es, void *out, void *tmp, char **sreg, char **rreg) {
  *sreg = x->mode == DTL__X_SEND_IN_OUT ? out : tmp;
  *rreg = x->mode == DTL__X_APART ? dtl__at(tmp, x->tsend, es) : x->mode == DTL__X_RECV_IN_OUT ? out : tmp;
}

/* One send of round r0 (message i, clipped to s, o): its buffer, packing it unless `defer` (then the caller packs
 * it with dtl__xpack before it goes out). Returns whether it is packed (not a run and not a copy of another). */
static bool dtl__xsend_buf(const dtl__ex_ctx *c_, const dtl__ex_step *e, int i, const int64_t *s, const int64_t *o,
                           const void *in, char *sreg, size_t *soff, int *ns) {
  const dtl__xstep *x = e->x;
  const dtl__xmsg *m = &x->send[i];
  size_t at = 0;
  x->spos[i] = *ns;
  x->peers_s[*ns] = m->peer;
  x->cnt_s[*ns] = dtl__box_count(c_->nd, s);
  if (m->same >= 0) { /* the same box as an earlier send, which is in this round too */
    x->bufs_s[(*ns)++] = x->bufs_s[x->spos[m->same]];
    return false;
  }
  if (dtl__run_offset(c_->nd, e->in_shape, e->in_off, s, o, &at)) { /* a run of the input in this round */
    x->bufs_s[(*ns)++] = dtl__at((void *)(uintptr_t)in, at, c_->es);
    return false;
  }
  x->bufs_s[(*ns)++] = dtl__at(sreg, *soff, c_->es);
  *soff += dtl__box_count(c_->nd, s);
  return true;
}

/* Packs send piece (s, o) of the input into buf. */
static dtl_status dtl__xpack(const dtl__ex_ctx *c_, const dtl__ex_step *e, dtl_comm *c, const int64_t *s,
                             const int64_t *o, const void *in, const void *buf) {
  int64_t rel[DTL_MAX_TENSOR_DIMS];
  for (int d = 0; d < c_->nd; d++) rel[d] = o[d] - e->in_off[d];
  dtl__box_copy b = dtl__ex_box(c_->nd, c_->es, s, e->in_shape, rel, s, NULL);
  return dtl__mem_copy_box(&c->mem, in, (void *)(uintptr_t)buf, &b);
}

/* The receives of round r0: in place where they are runs (apart mode), else back to back in the receive region. */
static void dtl__xrecv_bufs(const dtl__ex_ctx *c_, const dtl__ex_step *e, int64_t r0, void *out, char *rreg, int *nr) {
  const dtl__xstep *x = e->x;
  int nd = c_->nd;
  size_t roff = 0, at = 0;
  int64_t s[DTL_MAX_TENSOR_DIMS], o[DTL_MAX_TENSOR_DIMS];
  *nr = 0;
  for (int i = 0; i < x->nrecv; i++) {
    const dtl__xmsg *m = &x->recv[i];
    if (!dtl__xclip(x, nd, m, r0, s, o)) continue;
    size_t n = dtl__box_count(nd, s);
    if (x->mode == DTL__X_APART && dtl__run_offset(nd, e->out_shape, e->out_off, s, o, &at)) {
      x->bufs_r[*nr] = dtl__at(out, at, c_->es);
    } else {
      x->bufs_r[*nr] = dtl__at(rreg, roff, c_->es);
      roff += n;
    }
    x->peers_r[*nr] = m->peer;
    x->cnt_r[(*nr)++] = n;
  }
}

static dtl_status dtl__xround_finish(const dtl__ex_ctx *c_, const dtl__ex_step *e, dtl_comm *c, int64_t r0, void *out,
                                     void *tmp);

/* Lays out round r0: packs the sends that are no runs, points the runs in place, and fills the transport's lists
 * (the counts of a round are what both sides of each message clip alike). Returns the number of sends and receives. */
static dtl_status dtl__xround_start(const dtl__ex_ctx *c_, const dtl__ex_step *e, dtl_comm *c, int64_t r0,
                                    const void *in, void *out, void *tmp, int *ns, int *nr) {
  const dtl__xstep *x = e->x;
  size_t soff = 0;
  char *sreg, *rreg;
  dtl__xregions(x, c_->es, out, tmp, &sreg, &rreg);
  int64_t s[DTL_MAX_TENSOR_DIMS], o[DTL_MAX_TENSOR_DIMS];
  *ns = 0;
  for (int i = 0; i < x->nsend; i++) {
    x->spos[i] = -1;
    if (!dtl__xclip(x, c_->nd, &x->send[i], r0, s, o)) continue;
    if (dtl__xsend_buf(c_, e, i, s, o, in, sreg, &soff, ns)) DTL_TRY(dtl__xpack(c_, e, c, s, o, in, x->bufs_s[*ns - 1]));
  }
  dtl__xrecv_bufs(c_, e, r0, out, rreg, nr);
  return DTL_OK;
}

/* At most this many packed sends of a round go out one by one (each one pooled transport request). */
#define DTL__XPIPE 6

/* A blocking round on host memory that packs some of its sends: the receives and the sends that need no packing go
 * out first, then every packed send as soon as it is packed, so that packing the next one overlaps the transfer of
 * the ones before. False when the round does not qualify (device memory, another mode, nothing or too much to pack):
 * the caller runs it the plain way. */
static bool dtl__xround_pipelined(const dtl__ex_ctx *c_, const dtl__ex_step *e, dtl_comm *c, int64_t r0,
                                  const void *in, void *out, void *tmp, dtl_status *st) {
  const dtl__xstep *x = e->x;
  if (x->mode != DTL__X_APART || x->spack == 0 || c->mem.ops->memory != DTL_MEMORY_HOST) return false;
  int64_t s[DTL_MAX_TENSOR_DIMS], o[DTL_MAX_TENSOR_DIMS];
  int npack = 0;
  size_t at = 0;
  for (int i = 0; i < x->nsend; i++)
    npack += x->send[i].same < 0 && dtl__xclip(x, c_->nd, &x->send[i], r0, s, o) &&
             !dtl__run_offset(c_->nd, e->in_shape, e->in_off, s, o, &at);
  if (npack == 0 || npack > DTL__XPIPE) return false;
  char *sreg, *rreg;
  dtl__xregions(x, c_->es, out, tmp, &sreg, &rreg);
  /* The lists: sends that go out at once first (runs, and copies of runs), then the packed ones in message order. */
  size_t soff = 0;
  int ns = 0, nr = 0, first = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < x->nsend; i++) {
      const dtl__xmsg *m = &x->send[i];
      if (pass == 0) x->spos[i] = -1;
      if (!dtl__xclip(x, c_->nd, m, r0, s, o)) continue;
      /* Whether a piece needs packing is decided per round (a piece clipped to its round may be contiguous where
       * the whole message is not); a copy of another send is packed when that one is (same box, so the same
       * run-ness in this round). dtl__xsend_buf decides it alike for an original. */
      bool packed = !dtl__run_offset(c_->nd, e->in_shape, e->in_off, s, o, &at);
      if (packed != (pass == 1)) continue;
      bool got = dtl__xsend_buf(c_, e, i, s, o, in, sreg, &soff, &ns); /* a copy shares its original's buffer */
      if (m->same < 0 && got != packed) {
        *st = dtl__error_fn(DTL_ERR_INTERNAL, "dtl_plan_execute", "send %d of round %lld: the packing of its piece "
                            "was decided two ways", i, (long long)r0);
        return true;
      }
    }
    if (pass == 0) first = ns;
  }
  dtl__xrecv_bufs(c_, e, r0, out, rreg, &nr);
  dtl_request *req[DTL__XPIPE * 2 + 1];
  int nreq = 0;
  *st = c->ops->exchange(c, first, x->peers_s, x->bufs_s, x->cnt_s, nr, x->peers_r, x->bufs_r, x->cnt_r, c_->t,
                         &req[nreq]);
  if (*st == DTL_OK && req[nreq]) nreq++;
  for (int i = 0; i < x->nsend && *st == DTL_OK; i++) {
    int j = x->spos[i];
    if (j < first) continue; /* not in the round, or gone out at once */
    if (x->send[i].same < 0) {
      dtl__xclip(x, c_->nd, &x->send[i], r0, s, o);
      *st = dtl__xpack(c_, e, c, s, o, in, x->bufs_s[j]);
    } /* a copy of a send packed in this round shares its buffer, packed above (it comes earlier in the list) */
    if (*st == DTL_OK) *st = c->ops->exchange(c, 1, &x->peers_s[j], &x->bufs_s[j], &x->cnt_s[j], 0, NULL, NULL, NULL,
                                              c_->t, &req[nreq]);
    if (*st == DTL_OK && req[nreq]) nreq++;
  }
  for (int k = 0; k < nreq; k++) { /* every started transfer completes before its buffers are released */
    dtl_status w = req[k]->wait ? req[k]->wait(req[k]) : req[k]->comm->ops->wait(req[k]);
    if (*st == DTL_OK) *st = w;
  }
  if (*st == DTL_OK) *st = dtl__xround_finish(c_, e, c, r0, out, tmp);
  return true;
}

/* Places the packed receives of round r0 into the output (RECV_IN_OUT: first moved from the output to the
 * temporary, whose send region is free once the round is complete). */
static dtl_status dtl__xround_finish(const dtl__ex_ctx *c_, const dtl__ex_step *e, dtl_comm *c, int64_t r0, void *out,
                                     void *tmp) {
  const dtl__xstep *x = e->x;
  int nd = c_->nd;
  size_t es = c_->es, roff = 0;
  char *sreg, *rreg;
  dtl__xregions(x, es, out, tmp, &sreg, &rreg);
  if (x->mode == DTL__X_RECV_IN_OUT && x->rall) {
    DTL_TRY(dtl__mem_copy(&c->mem, tmp, out, x->rall * es));
    rreg = tmp;
  }
  int64_t s[DTL_MAX_TENSOR_DIMS], o[DTL_MAX_TENSOR_DIMS], rel[DTL_MAX_TENSOR_DIMS];
  for (int i = 0; i < x->nrecv; i++) {
    const dtl__xmsg *m = &x->recv[i];
    if (!dtl__xclip(x, nd, m, r0, s, o)) continue;
    size_t n = dtl__box_count(nd, s), at = 0;
    if (x->mode == DTL__X_APART && dtl__run_offset(nd, e->out_shape, e->out_off, s, o, &at)) continue;
    for (int d = 0; d < nd; d++) rel[d] = o[d] - e->out_off[d];
    dtl__box_copy b = dtl__ex_box(nd, es, s, s, NULL, e->out_shape, rel);
    DTL_TRY(dtl__mem_copy_box(&c->mem, dtl__at(rreg, roff, es), out, &b));
    roff += n;
  }
  return DTL_OK;
}

/* The rank's own piece, and the identity of a Partial target: in the apart mode before the rounds (the output has
 * no other use), else after them. */
static dtl_status dtl__xlocal(const dtl__ex_ctx *c_, const dtl__ex_step *e, dtl_comm *c, const void *in, void *out) {
  const dtl__xstep *x = e->x;
  if (x->fill) return e->b ? dtl__mem_fill_identity(&c->mem, out, e->b, c_->t, x->fill_op) : DTL_OK;
  if (!x->self) return DTL_OK;
  int64_t ri[DTL_MAX_TENSOR_DIMS], ro[DTL_MAX_TENSOR_DIMS];
  for (int d = 0; d < c_->nd; d++) {
    ri[d] = x->self_off[d] - e->in_off[d];
    ro[d] = x->self_off[d] - e->out_off[d];
  }
  dtl__box_copy b = dtl__ex_box(c_->nd, c_->es, x->self_shape, e->in_shape, ri, e->out_shape, ro);
  return dtl__mem_copy_box(&c->mem, in, out, &b);
}

/* The exchange's parts: the own piece or fill (the apart mode), each round, the own piece or fill (the other
 * modes). A round started nonblocking is placed in dtl__xchg_part_done once it completed; a round in which this
 * rank moves nothing, and every blocking one, is placed at once. */
int dtl__xchg_parts(const dtl__ex_step *e) { return e->x->xrounds + 2; }

dtl_status dtl__xchg_part_start(const dtl__ex_ctx *c_, const dtl__ex_step *e, dtl_comm *c, int j, const void *in, void *out,
                          void *tmp, dtl_request **req) {
  const dtl__xstep *x = e->x;
  if (j == 0) {
    if (!c->ops->exchange)
      return dtl__error(DTL_ERR_UNSUPPORTED, "the %s transport has no point-to-point exchange", c->ops->name);
    return x->mode == DTL__X_APART ? dtl__xlocal(c_, e, c, in, out) : DTL_OK;
  }
  if (j > x->xrounds) return x->mode == DTL__X_APART ? DTL_OK : dtl__xlocal(c_, e, c, in, out);
  int64_t r0 = (int64_t)(j - 1) * x->xrows;
  int ns, nr;
  dtl_status st = DTL_OK;
  if (!req && dtl__xround_pipelined(c_, e, c, r0, in, out, tmp, &st)) return st;
  DTL_TRY(dtl__xround_start(c_, e, c, r0, in, out, tmp, &ns, &nr));
  if (ns || nr)
    DTL_TRY(c->ops->exchange(c, ns, x->peers_s, x->bufs_s, x->cnt_s, nr, x->peers_r, x->bufs_r, x->cnt_r, c_->t, req));
  return req && *req ? DTL_OK : dtl__xround_finish(c_, e, c, r0, out, tmp);
}

dtl_status dtl__xchg_part_done(const dtl__ex_ctx *c_, const dtl__ex_step *e, dtl_comm *c, int j, void *out, void *tmp) {
  return j >= 1 && j <= e->x->xrounds ? dtl__xround_finish(c_, e, c, (int64_t)(j - 1) * e->x->xrows, out, tmp) : DTL_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* All-to-all (DeepSpeed-Ulysses) context parallelism: one all-to-all turns this rank's tokens of every head
 * into every token of this rank's heads (the TP head rule over the CP group, kv heads replicated when the
 * group is larger than their number), attention over the whole sequence in global token order, and one
 * all-to-all back, and a second, of f32, for lse (on every call: a rank without tokens cannot tell whether its
 * peers asked for it). */
#include "cp/cp_internal.h"

dtl_status dtl_cp_ulysses_heads(const dtl_cp_context *ctx, int64_t q_heads, int64_t kv_heads, dtl_cp_range *q,
                                dtl_cp_range *kv) {
  static const char fn[] = "dtl_cp_ulysses_heads";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl__attn_range qr, kr;
  DTL_TRY(dtl__attn_heads(fn, "cp", q_heads, kv_heads, ctx->size, ctx->rank, &qr, &kr));
  if (q) *q = (dtl_cp_range){qr.offset, qr.count};
  if (kv) *kv = (dtl_cp_range){kr.offset, kr.count};
  return DTL_OK;
}

/* Rank j's heads (already validated for this group). */
static void dtl__cp_heads_of(const dtl_cp_context *ctx, const dtl__cp_args *a, int j, dtl__attn_range *q,
                             dtl__attn_range *kv) {
  (void)dtl__attn_heads("dtl_cp_ulysses_attention", "cp", a->qh, a->kvh, ctx->size, j, q, kv);
}

/* Copies the rows of rank j's segments between its packed block (rows in its local order, stride ld) and a
 * [T, ld] array in global order: to_global = true scatters the block into the array, false gathers it. */
static dtl_status dtl__cp_by_segments(dtl_cp_context *ctx, const dtl__cp_args *a, int j, size_t elem, int64_t ld,
                                      bool to_global, const void *src, void *dst) {
  dtl__cp_seg seg[2];
  int64_t n;
  int k = dtl__cp_segments(a->layout, a->T, ctx->size, j, seg, &n);
  for (int i = 0; i < k; i++) {
    size_t local = (size_t)(seg[i].row * ld) * elem, global = (size_t)(seg[i].pos * ld) * elem;
    const char *s = (const char *)src + (to_global ? local : global);
    char *d = (char *)dst + (to_global ? global : local);
    DTL_TRY(dtl__cp_copy2d(ctx, elem, seg[i].count, ld, s, ld, d, ld));
  }
  return DTL_OK;
}

/* The checks and the scratch of a Ulysses call: *mq and *mk this rank's heads, *s its core call. */
static dtl_status dtl__cp_ulysses_prepare(dtl_cp_context *ctx, const char *fn, const dtl_cp_attention_params *p,
                                          const void *q, const void *k, const void *v, void *out, dtl__cp_args *ap, dtl__attn_range *mqp, dtl__attn_range *mkp,
                                          dtl__attn_shape *sp) {
  DTL_TRY(dtl__cp_attention_args(ctx, fn, p, q, k, v, out, ap));
  const dtl__cp_args a = *ap;
  const int P = ctx->size, r = ctx->rank;
  DTL_TRY(dtl__attn_heads(fn, "cp", a.qh, a.kvh, P, r, mqp, mkp));
  const dtl__attn_range mq = *mqp, mk = *mkp;
  const int64_t D = a.D, T = a.T, n = a.n, w = (mq.count + 2 * mk.count) * D; /* a row of this rank's q|k|v */
  int64_t out_cols = 0; /* sum over ranks of the q|k|v columns each receives from this rank */
  for (int j = 0; j < P; j++) {
    dtl__attn_range qj, kj;
    dtl__cp_heads_of(ctx, &a, j, &qj, &kj);
    out_cols += (qj.count + 2 * kj.count) * D;
  }
  dtl__attn_shape s = {.tq = T, .tk = T, .qn = mq.count, .kn = mk.count, .head_dim = D, .q_off = mq.offset,
                       .kv_off = mk.offset, .group = a.group, .ldq = mq.count * D, .ldk = mk.count * D,
                       .ldv = mk.count * D, .ldo = mq.count * D, .causal = a.causal, .scale = a.scale};
  size_t e = ctx->elem, f = sizeof(float);
  /* KV0: outgoing q|k|v columns, later the returning outputs (n x qw <= n x out_cols); KV1: incoming columns,
   * later the outgoing outputs (T x qc D <= T x w); ACC: q, k, v of this rank's heads in global order. */
  const dtl__cp_ws slots[] = {DTL__CP_WS_KV0, DTL__CP_WS_KV1, DTL__CP_WS_ACC, DTL__CP_WS_PART,
                              DTL__CP_WS_LSE, DTL__CP_WS_LSE2, DTL__CP_WS_LSE3, DTL__CP_WS_CORE};
  const size_t bytes[] = {(size_t)(n * out_cols) * e, (size_t)(T * w) * e, (size_t)(T * w) * e,
                          (size_t)(T * mq.count * D) * e, (size_t)(T * mq.count) * f, (size_t)(T * mq.count) * f,
                          (size_t)(n * a.qh) * f,
                          dtl__cp_attend_scratch(ctx, &s)};
  *sp = s;
  return dtl__cp_scratch(ctx, fn, 8, slots, bytes);
}

dtl_status dtl_cp_ulysses_attention(dtl_cp_context *ctx, const dtl_cp_attention_params *p, const void *q,
                                    const void *k, const void *v, void *out, float *lse) {
  static const char fn[] = "dtl_cp_ulysses_attention";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl__cp_args a;
  dtl__attn_range mq = {0, 0}, mk = {0, 0};
  dtl__attn_shape s;
  dtl_status ready = dtl__cp_ulysses_prepare(ctx, fn, p, q, k, v, out, &a, &mq, &mk, &s);
  int64_t fp[DTL__CP_PREFILL_FP];
  dtl__cp_prefill_fp(p, fp);
  DTL_TRY(dtl__cp_agree(ctx, fn, DTL__CP_PREFILL_FP, fp, ready));
  const int P = ctx->size;
  const int64_t D = a.D, T = a.T, n = a.n, w = (mq.count + 2 * mk.count) * D;
  size_t e = ctx->elem, f = sizeof(float);
  char *send = ctx->ws[DTL__CP_WS_KV0], *recv = ctx->ws[DTL__CP_WS_KV1], *full = ctx->ws[DTL__CP_WS_ACC];
  char *o = ctx->ws[DTL__CP_WS_PART];
  float *l = ctx->ws[DTL__CP_WS_LSE], *lsend = ctx->ws[DTL__CP_WS_LSE2], *lrecv = ctx->ws[DTL__CP_WS_LSE3];
  size_t *sc = ctx->counts[0], *rc = ctx->counts[1];

  /* Tokens -> heads: to rank j this rank's rows of j's q heads, then of its k heads, then of its v heads. */
  char *at = send;
  for (int j = 0; j < P; j++) {
    dtl__attn_range qj, kj;
    dtl__cp_heads_of(ctx, &a, j, &qj, &kj);
    DTL_TRY(dtl__cp_copy2d(ctx, e, n, qj.count * D, (const char *)q + (size_t)(qj.offset * D) * e, a.qw, at,
                           qj.count * D));
    at += (size_t)(n * qj.count * D) * e;
    DTL_TRY(dtl__cp_copy2d(ctx, e, n, kj.count * D, (const char *)k + (size_t)(kj.offset * D) * e, a.kvw, at,
                           kj.count * D));
    at += (size_t)(n * kj.count * D) * e;
    DTL_TRY(dtl__cp_copy2d(ctx, e, n, kj.count * D, (const char *)v + (size_t)(kj.offset * D) * e, a.kvw, at,
                           kj.count * D));
    at += (size_t)(n * kj.count * D) * e;
    sc[j] = (size_t)(n * (qj.count + 2 * kj.count) * D);
    rc[j] = (size_t)(dtl__cp_rows(&a, P, j) * w);
  }
  dtl_status st = dtl_all_to_allv(ctx->comm, send, sc, recv, rc, ctx->dtype);
  if (st != DTL_OK) return dtl__error_prefix(st, "%s: tokens to heads", fn);
  /* Each rank's rows into global order: q [T, qc D], k and v [T, kc D] one after the other in ACC. */
  char *fq = full, *fk = fq + (size_t)(T * mq.count * D) * e, *fv = fk + (size_t)(T * mk.count * D) * e;
  at = recv;
  for (int j = 0; j < P; j++) {
    int64_t nj = dtl__cp_rows(&a, P, j);
    DTL_TRY(dtl__cp_by_segments(ctx, &a, j, e, mq.count * D, true, at, fq));
    at += (size_t)(nj * mq.count * D) * e;
    DTL_TRY(dtl__cp_by_segments(ctx, &a, j, e, mk.count * D, true, at, fk));
    at += (size_t)(nj * mk.count * D) * e;
    DTL_TRY(dtl__cp_by_segments(ctx, &a, j, e, mk.count * D, true, at, fv));
    at += (size_t)(nj * mk.count * D) * e;
  }
  /* lse is computed and returned whether this rank asked for it or not: a rank that holds no token may pass
   * lse = NULL (it has no element), and it cannot tell whether its peers want the lse of its heads, so that the
   * lse exchange below runs on every call, never on an optional output's say. */
  DTL_TRY(dtl__cp_attend(ctx, &s, fq, fk, fv, o, l, ctx->ws[DTL__CP_WS_CORE],
                         ctx->ws_bytes[DTL__CP_WS_CORE]));

  /* Heads -> tokens: to rank j its rows of this rank's heads; from rank i this rank's rows of i's heads. */
  at = recv;
  char *lat = (char *)lsend;
  for (int j = 0; j < P; j++) {
    dtl__attn_range qj, kj;
    dtl__cp_heads_of(ctx, &a, j, &qj, &kj);
    int64_t nj = dtl__cp_rows(&a, P, j);
    DTL_TRY(dtl__cp_by_segments(ctx, &a, j, e, mq.count * D, false, o, at));
    at += (size_t)(nj * mq.count * D) * e;
    DTL_TRY(dtl__cp_by_segments(ctx, &a, j, f, mq.count, false, l, lat));
    lat += (size_t)(nj * mq.count) * f;
    sc[j] = (size_t)(nj * mq.count * D);
    rc[j] = (size_t)(n * qj.count * D);
  }
  st = dtl_all_to_allv(ctx->comm, recv, sc, send, rc, ctx->dtype);
  if (st != DTL_OK) return dtl__error_prefix(st, "%s: heads to tokens", fn);
  for (int j = 0; j < P; j++) sc[j] /= (size_t)D, rc[j] /= (size_t)D;
  st = dtl_all_to_allv(ctx->comm, lsend, sc, lrecv, rc, DTL_FLOAT32);
  if (st != DTL_OK) return dtl__error_prefix(st, "%s: lse heads to tokens", fn);
  /* Only now the outputs: rank i's heads into their columns. */
  at = send;
  lat = (char *)lrecv;
  for (int i = 0; i < P; i++) {
    dtl__attn_range qi, ki;
    dtl__cp_heads_of(ctx, &a, i, &qi, &ki);
    DTL_TRY(dtl__cp_copy2d(ctx, e, n, qi.count * D, at, qi.count * D, (char *)out + (size_t)(qi.offset * D) * e, a.qw));
    at += (size_t)(n * qi.count * D) * e;
    if (lse) DTL_TRY(dtl__cp_copy2d(ctx, f, n, qi.count, lat, qi.count, lse + qi.offset, a.qh));
    lat += (size_t)(n * qi.count) * f;
  }
  return DTL_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Ring context parallelism: each rank keeps its queries; the K/V blocks travel around the ring, one step per
 * rank, the transfer of the next block overlapping the attention on the one in hand (progressed between the
 * attention core's tiles); each block's partial result merges into an f32 accumulator by lse. Chunk pairs
 * wholly in a query's future are skipped and those wholly in its past computed without a mask, which with
 * the zig-zag layout gives every rank the same work at every step. */
#include <string.h>
#include "cp/cp_internal.h"

/* The transfer in flight during a step, polled by the attention core between tiles. */
typedef struct {
  dtl_request *req;
  bool done;
  double comm_seconds;
} dtl__cp_poll;

static void dtl__cp_progress(void *arg) {
  dtl__cp_poll *p = arg;
  if (!p->req || p->done) return;
  double t0 = dtl__cp_now();
  int done = 0;
  /* A failed poll ends polling; dtl_wait then reports the transfer's status. */
  p->done = dtl_test(p->req, &done) != DTL_OK || done;
  p->comm_seconds += dtl__cp_now() - t0;
}

/* Query segment i against tk keys of the block from row krow (positions from kpos0; masked: by the causal
 * mask, else every key visible), into the accumulator (acc [n, qw] f32, acc_lse [n, qh]) directly the first
 * time, else into the partial result merged into it by lse. */
static dtl_status dtl__cp_ring_attend(dtl_cp_context *ctx, const dtl__cp_args *a, int i, const void *q, const void *k,
                                     const void *v, int64_t krow, int64_t tk, int64_t kpos0, bool masked,
                                     bool *filled, dtl__cp_poll *poll) {
  const dtl__cp_seg *qs = &a->seg[i];
  float *acc = (float *)ctx->ws[DTL__CP_WS_ACC] + qs->row * a->qw;
  float *acc_lse = (float *)ctx->ws[DTL__CP_WS_LSE] + qs->row * a->qh;
  float *part = ctx->ws[DTL__CP_WS_PART], *part_lse = ctx->ws[DTL__CP_WS_LSE2];
  size_t e = ctx->elem;
  dtl__attn_shape s = {.tq = qs->count, .tk = tk, .qn = a->qh, .kn = a->kvh, .head_dim = a->D, .group = a->group,
                       .ldq = a->qw, .ldk = a->kvw, .ldv = a->kvw, .ldo = a->qw, .q_pos0 = qs->pos, .k_pos0 = kpos0,
                       .causal = masked, .scale = a->scale, .out_f32 = true,
                       .progress = poll->req ? dtl__cp_progress : NULL, .progress_arg = poll};
  DTL_TRY(dtl__cp_attend(ctx, &s, (const char *)q + (size_t)(qs->row * a->qw) * e,
                         (const char *)k + (size_t)(krow * a->kvw) * e, (const char *)v + (size_t)(krow * a->kvw) * e,
                         filled[i] ? part : acc, filled[i] ? part_lse : acc_lse, ctx->ws[DTL__CP_WS_CORE],
                         ctx->ws_bytes[DTL__CP_WS_CORE]));
  if (filled[i])
    DTL_TRY(dtl__cp_merge(ctx, DTL_FLOAT32, qs->count, a->qh, a->D, acc, a->qw, acc_lse, part, a->qw, part_lse));
  filled[i] = true;
  return DTL_OK;
}

/* This rank's query segments against the key segments of block src (k, v: its rows, packed with row stride
 * kvw). Per query segment, a key segment wholly in its future is skipped, one that straddles it is attended
 * with the causal mask, and a run of key segments wholly in its past (every one without the mask) is attended
 * in one call: the block's segments are consecutive rows. */
static dtl_status dtl__cp_ring_block(dtl_cp_context *ctx, const dtl__cp_args *a, int src, const void *q, const void *k,
                                     const void *v, bool *filled, dtl__cp_poll *poll) {
  dtl__cp_seg ks[2];
  int64_t nsrc;
  int nk = dtl__cp_segments(a->layout, a->T, ctx->size, src, ks, &nsrc);
  for (int i = 0; i < a->nseg; i++) {
    const dtl__cp_seg *qs = &a->seg[i];
    int kind[2]; /* 0 skipped, 1 masked, 2 visible */
    for (int j = 0; j < nk; j++) {
      bool future = ks[j].pos > qs->pos + qs->count - 1, past = ks[j].pos + ks[j].count - 1 <= qs->pos;
      kind[j] = !a->causal || past ? 2 : future ? 0 : 1;
    }
    for (int j = 0, j1; j < nk; j = j1) {
      j1 = j + 1;
      if (kind[j] == 0) {
        ctx->stats.pairs_skipped++;
        continue;
      }
      while (kind[j] == 2 && j1 < nk && kind[j1] == 2) j1++;
      int64_t tk = ks[j1 - 1].row + ks[j1 - 1].count - ks[j].row;
      DTL_TRY(dtl__cp_ring_attend(ctx, a, i, q, k, v, ks[j].row, tk, ks[j].pos, kind[j] == 1, filled, poll));
      ctx->stats.pairs_computed += j1 - j;
    }
  }
  return DTL_OK;
}

/* The checks and the scratch of a ring call: *nmax the most rows a rank holds, *cmax the longest segment. */
static dtl_status dtl__cp_ring_prepare(dtl_cp_context *ctx, const char *fn, const dtl_cp_attention_params *p,
                                       const void *q, const void *k, const void *v, void *out, dtl__cp_args *ap,
                                       int64_t *nmax_out, int64_t *cmax_out) {
  DTL_TRY(dtl__cp_attention_args(ctx, fn, p, q, k, v, out, ap));
  const dtl__cp_args a = *ap;
  const int P = ctx->size;
  int64_t nmax = 0, cmax = 0;
  for (int j = 0; j < P; j++) {
    dtl__cp_seg seg[2];
    int64_t nj;
    int k = dtl__cp_segments(a.layout, a.T, P, j, seg, &nj);
    for (int i = 0; i < k; i++) cmax = seg[i].count > cmax ? seg[i].count : cmax;
    nmax = nj > nmax ? nj : nmax;
  }
  /* Everything before the first transfer: the two block buffers, accumulator, partial result, core scratch
   * (the largest call: the longest segment against a whole block). */
  dtl__attn_shape big = {.tq = cmax, .tk = nmax, .qn = a.qh, .kn = a.kvh, .head_dim = a.D, .group = a.group,
                         .ldq = a.qw, .ldk = a.kvw, .ldv = a.kvw, .ldo = a.qw, .causal = a.causal, .scale = a.scale,
                         .out_f32 = true};
  size_t block = P > 1 ? (size_t)(2 * nmax * a.kvw) * ctx->elem : 0;
  const dtl__cp_ws slots[] = {DTL__CP_WS_KV0, DTL__CP_WS_KV1, DTL__CP_WS_ACC, DTL__CP_WS_LSE,
                              DTL__CP_WS_PART, DTL__CP_WS_LSE2, DTL__CP_WS_CORE};
  const size_t bytes[] = {block, block, (size_t)(a.n * a.qw) * sizeof(float), (size_t)(a.n * a.qh) * sizeof(float),
                          (size_t)(cmax * a.qw) * sizeof(float), (size_t)(cmax * a.qh) * sizeof(float),
                          dtl__cp_attend_scratch(ctx, &big)};
  *nmax_out = nmax;
  *cmax_out = cmax;
  return dtl__cp_scratch(ctx, fn, 7, slots, bytes);
}

dtl_status dtl_cp_ring_attention(dtl_cp_context *ctx, const dtl_cp_attention_params *p, const void *q, const void *k,
                                 const void *v, void *out, float *lse) {
  static const char fn[] = "dtl_cp_ring_attention";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl__cp_args a;
  int64_t nmax = 0, cmax = 0;
  dtl_status ready = dtl__cp_ring_prepare(ctx, fn, p, q, k, v, out, &a, &nmax, &cmax);
  int64_t fp[DTL__CP_PREFILL_FP];
  dtl__cp_prefill_fp(p, fp);
  DTL_TRY(dtl__cp_agree(ctx, fn, DTL__CP_PREFILL_FP, fp, ready));
  const int P = ctx->size, r = ctx->rank;

  memset(&ctx->stats, 0, sizeof ctx->stats);
  double t_start = dtl__cp_now(), comm = 0.0;
  const dtl__mem *mem = &ctx->comm->mem;
  size_t e = ctx->elem, local = (size_t)(a.n * a.kvw) * e;
  char *buf[2] = {ctx->ws[DTL__CP_WS_KV0], ctx->ws[DTL__CP_WS_KV1]};
  if (P > 1 && a.n > 0) { /* the block this rank sends first: its K rows, then its V rows */
    DTL_TRY(dtl__mem_copy(mem, buf[0], k, local));
    DTL_TRY(dtl__mem_copy(mem, buf[0] + local, v, local));
  }
  bool filled[2] = {false, false};
  for (int s = 0; s < P; s++) {
    int src = (r - s + P) % P, next_src = (r - s - 1 + P) % P;
    int64_t nsrc = dtl__cp_rows(&a, P, src), nnext = dtl__cp_rows(&a, P, next_src);
    const char *kb = s == 0 ? k : buf[s % 2], *vb = s == 0 ? v : buf[s % 2] + (size_t)(nsrc * a.kvw) * e;
    dtl__cp_poll poll = {NULL, false, 0.0};
    if (s < P - 1) { /* pass the block in hand on to rank r + 1 while receiving the next from rank r - 1 */
      size_t ns = (size_t)(2 * nsrc * a.kvw), nr = (size_t)(2 * nnext * a.kvw);
      double t0 = dtl__cp_now();
      dtl_status st = ctx->ring_blocking
                          ? dtl_sendrecv(ctx->comm, buf[s % 2], ns, (r + 1) % P, buf[(s + 1) % 2], nr, (r - 1 + P) % P,
                                         ctx->dtype)
                          : dtl_sendrecv_async(ctx->comm, buf[s % 2], ns, (r + 1) % P, buf[(s + 1) % 2], nr,
                                               (r - 1 + P) % P, ctx->dtype, &poll.req);
      comm += dtl__cp_now() - t0;
      if (st != DTL_OK) return dtl__error_prefix(st, "%s: step %d", fn, s);
      ctx->stats.bytes_received += (int64_t)(nr * e);
    }
    dtl_status st = dtl__cp_ring_block(ctx, &a, src, q, kb, vb, filled, &poll);
    if (poll.req) {
      double t0 = dtl__cp_now();
      dtl_status ws = dtl_wait(poll.req);
      comm += poll.comm_seconds + dtl__cp_now() - t0;
      if (st == DTL_OK && ws != DTL_OK) st = dtl__error_prefix(ws, "%s: step %d", fn, s);
    }
    if (st != DTL_OK) return st;
    ctx->stats.steps++;
  }
  /* Rows no block reached (none under self-attention; kept for safety): empty states. */
  float *acc = ctx->ws[DTL__CP_WS_ACC], *acc_lse = ctx->ws[DTL__CP_WS_LSE];
  for (int i = 0; i < a.nseg; i++)
    if (!filled[i]) {
      const dtl__cp_seg *qs = &a.seg[i];
      DTL_TRY(dtl__mem_set(mem, acc + qs->row * a.qw, 0, (size_t)(qs->count * a.qw) * sizeof(float)));
      DTL_TRY(dtl__mem_fill_identity(mem, acc_lse + qs->row * a.qh, (size_t)(qs->count * a.qh), DTL_FLOAT32, DTL_MAX));
    }
  /* The accumulator to out, rounded once to the dtype (a rescale by each row's own lse multiplies by 1). */
  DTL_TRY(dtl__cp_rescale(ctx, a.n, a.qh, a.D, acc, a.qw, true, acc_lse, acc_lse, out, a.qw));
  if (lse && a.n > 0) DTL_TRY(dtl__mem_copy(mem, lse, acc_lse, (size_t)(a.n * a.qh) * sizeof(float)));
  ctx->stats.seconds = dtl__cp_now() - t_start;
  ctx->stats.comm_seconds = comm;
  ctx->stats.compute_seconds = ctx->stats.seconds - comm;
  return DTL_OK;
}

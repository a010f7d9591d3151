/* SPDX-License-Identifier: Apache-2.0 */
/* Decode over a KV cache split by tokens (flash-decoding across ranks): every rank attends the same new
 * queries to its part of the cache, and the partial states merge by the collective merge of state.c (one
 * all-gather of lse, one all-reduce of o). No key or value leaves its rank. */
#include "cp/cp_internal.h"

/* The checks and the scratch of a decode call; *sp gets its core call. */
static dtl_status dtl__cp_decode_prepare(dtl_cp_context *ctx, const char *fn, const dtl_cp_decode_params *p,
                                         const void *q, const void *k_cache, const void *v_cache, void *out,
                                         dtl__attn_shape *sp) {
  DTL_CHECK_ARG(p != NULL, fn, "params=NULL");
  DTL_TRY(dtl__check_bits(fn, "params.mask", p->mask, DTL__BITS(DTL_CP_SCALE, DTL_CP_KV_POSITIONS)));
  DTL_TRY(dtl__check_bits(fn, "params.flags", p->flags, DTL__BITS(DTL_CP_CAUSAL)));
  DTL_CHECK_ARG(p->tokens >= 0, fn, "tokens=%lld (expected >= 0)", (long long)p->tokens);
  DTL_CHECK_ARG(p->kv_tokens >= 0, fn, "kv_tokens=%lld (expected >= 0)", (long long)p->kv_tokens);
  DTL_TRY(dtl__cp_check_heads(fn, p->q_heads, p->kv_heads, p->head_dim));
  int64_t nq, nkv, nl;
  DTL_TRY(dtl__cp_count(fn, "q", p->tokens, p->q_heads, p->head_dim, &nq));
  DTL_TRY(dtl__cp_count(fn, "k_cache", p->kv_tokens, p->kv_heads, p->head_dim, &nkv));
  DTL_TRY(dtl__cp_count(fn, "the gathered lse", p->tokens, p->q_heads, ctx->size, &nl));
  DTL_TRY(dtl__cp_check_compute(ctx, fn));
  float scale;
  DTL_TRY(dtl__cp_scale(fn, p->mask, p->scale, p->head_dim, &scale));
  bool positions = (p->mask & DTL_CP_KV_POSITIONS) != 0;
  DTL_CHECK_ARG(nq == 0 || q != NULL, fn, "q=NULL");
  DTL_CHECK_ARG(nq == 0 || out != NULL, fn, "out=NULL");
  DTL_CHECK_ARG(nkv == 0 || k_cache != NULL, fn, "k_cache=NULL (this rank holds kv_tokens=%lld)",
                (long long)p->kv_tokens);
  DTL_CHECK_ARG(nkv == 0 || v_cache != NULL, fn, "v_cache=NULL (this rank holds kv_tokens=%lld)",
                (long long)p->kv_tokens);
  DTL_CHECK_ARG(!positions || p->kv_tokens == 0 || p->kv_pos != NULL, fn,
                "kv_pos=NULL with DTL_CP_KV_POSITIONS (expected kv_tokens=%lld positions)", (long long)p->kv_tokens);

  const int64_t T = p->tokens, qh = p->q_heads, D = p->head_dim, qw = qh * D, kvw = p->kv_heads * D;
  dtl__attn_shape s = {.tq = T, .tk = p->kv_tokens, .qn = qh, .kn = p->kv_heads, .head_dim = D,
                       .group = qh / p->kv_heads, .ldq = qw, .ldk = kvw, .ldv = kvw, .ldo = qw,
                       .k_pos = positions ? p->kv_pos : NULL, .q_pos0 = p->q_pos0, .k_pos0 = p->kv_pos0,
                       .causal = (p->flags & DTL_CP_CAUSAL) != 0, .scale = scale, .out_f32 = true};
  /* This rank's partial state (f32) and the collective merge's scratch, all before the first collective. */
  dtl__cp_ws slots[3 + DTL__CP_REDUCE_SLOTS] = {DTL__CP_WS_PART, DTL__CP_WS_LSE2, DTL__CP_WS_CORE};
  size_t bytes[3 + DTL__CP_REDUCE_SLOTS] = {(size_t)nq * sizeof(float), (size_t)(T * qh) * sizeof(float),
                                            dtl__cp_attend_scratch(ctx, &s)};
  dtl__cp_state_reduce_needs(ctx, T, qh, D, slots + 3, bytes + 3);
  *sp = s;
  return dtl__cp_scratch(ctx, fn, 3 + DTL__CP_REDUCE_SLOTS, slots, bytes);
}

dtl_status dtl_cp_decode_attention(dtl_cp_context *ctx, const dtl_cp_decode_params *p, const void *q,
                                   const void *k_cache, const void *v_cache, void *out, float *lse) {
  static const char fn[] = "dtl_cp_decode_attention";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl__attn_shape s;
  dtl_status ready = dtl__cp_decode_prepare(ctx, fn, p, q, k_cache, v_cache, out, &s);
  /* kv_tokens, kv_pos0 and kv_pos differ between ranks by design (each holds its part of the cache): not part
   * of what must agree. Whether positions are given (a mask bit) and everything else that shapes the call is. */
  const int64_t fp[] = {p ? (int64_t)p->mask : 0, p ? (int64_t)p->flags : 0, p ? p->tokens : 0,
                        p ? p->q_heads : 0, p ? p->kv_heads : 0, p ? p->head_dim : 0, p ? p->q_pos0 : 0,
                        p && (p->mask & DTL_CP_SCALE) ? dtl__cp_float_bits(p->scale) : 0};
  DTL_TRY(dtl__cp_agree(ctx, fn, (int)(sizeof fp / sizeof *fp), fp, ready));
  const int64_t T = p->tokens, qh = p->q_heads, D = p->head_dim, qw = qh * D;
  float *part = ctx->ws[DTL__CP_WS_PART], *part_lse = ctx->ws[DTL__CP_WS_LSE2];
  DTL_TRY(dtl__cp_attend(ctx, &s, q, k_cache, v_cache, part, part_lse, ctx->ws[DTL__CP_WS_CORE],
                         ctx->ws_bytes[DTL__CP_WS_CORE]));
  return dtl__cp_state_reduce(ctx, fn, T, qh, D, part, qw, true, part_lse, false, out, lse);
}

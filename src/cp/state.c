/* SPDX-License-Identifier: Apache-2.0 */
/* Attention states in public: the local merge (host f32, and on a communicator's memory in any of f32, f16
 * and bf16) and the collective merge of one state per rank (all-gather of lse, local rescale, one reduction
 * of o), which split-KV decode uses too. */
#include "cp/cp_internal.h"

/* T, H, D >= 0 whose product fits, and the four arrays given unless empty. */
static dtl_status dtl__cp_merge_args(const char *fn, int64_t T, int64_t H, int64_t D, const void *o_a,
                                     const float *lse_a, const void *o_b, const float *lse_b) {
  int64_t n;
  DTL_CHECK_ARG(T >= 0 && H >= 0 && D >= 0, fn, "T=%lld H=%lld D=%lld (expected >= 0)", (long long)T, (long long)H,
                (long long)D);
  DTL_TRY(dtl__cp_count(fn, "o", T, H, D, &n));
  bool rows = T * H > 0, vals = n > 0;
  DTL_CHECK_ARG(!vals || o_a, fn, "o_a=NULL");
  DTL_CHECK_ARG(!rows || lse_a, fn, "lse_a=NULL");
  DTL_CHECK_ARG(!vals || o_b, fn, "o_b=NULL");
  DTL_CHECK_ARG(!rows || lse_b, fn, "lse_b=NULL");
  DTL_CHECK_ARG(!vals || (const void *)o_a != (const void *)o_b, fn, "o_b=o_a (expected two different states)");
  return DTL_OK;
}

dtl_status dtl_attn_state_merge(int64_t T, int64_t H, int64_t D, float *o_a, float *lse_a, const float *o_b,
                                const float *lse_b) {
  DTL_TRY(dtl__cp_merge_args("dtl_attn_state_merge", T, H, D, o_a, lse_a, o_b, lse_b));
  if (T * H == 0) return DTL_OK;
  return dtl__attn_merge_host(T, H, D, o_a, H * D, lse_a, o_b, H * D, lse_b, DTL_FLOAT32);
}

dtl_status dtl_attn_state_merge_on(const dtl_comm *c, dtl_dtype t, int64_t T, int64_t H, int64_t D, void *o_a,
                                   float *lse_a, const void *o_b, const float *lse_b) {
  static const char fn[] = "dtl_attn_state_merge_on";
  DTL_CHECK_ARG(c != NULL, fn, "c=NULL");
  DTL_CHECK_ARG(t == DTL_FLOAT32 || t == DTL_FLOAT16 || t == DTL_BFLOAT16, fn, "t=%s (expected f32, f16 or bf16)",
                dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
  DTL_TRY(dtl__cp_merge_args(fn, T, H, D, o_a, lse_a, o_b, lse_b));
  if (T * H == 0) return DTL_OK;
  dtl__cp_kernels k = dtl_comm_memory(c) == DTL_MEMORY_DEVICE ? DTL__CP_DEVICE : DTL__CP_HOST;
  return dtl__cp_merge_in(&c->mem, k, t, T, H, D, o_a, H * D, lse_a, o_b, H * D, lse_b);
}

/* --- the collective merge ----------------------------------------------------------------------------- */
void dtl__cp_state_reduce_needs(const dtl_cp_context *ctx, int64_t T, int64_t H, int64_t D, dtl__cp_ws *slots,
                                size_t *bytes) {
  slots[0] = DTL__CP_WS_ACC; /* the rescaled o, in the context's dtype */
  slots[1] = DTL__CP_WS_LSE; /* every rank's lse */
  slots[2] = DTL__CP_WS_LSE3; /* the merged lse */
  bytes[0] = (size_t)(T * H * D) * ctx->elem;
  bytes[1] = (size_t)(T * H) * sizeof(float) * (size_t)ctx->size;
  bytes[2] = (size_t)(T * H) * sizeof(float);
}

dtl_status dtl__cp_state_reduce(dtl_cp_context *ctx, const char *fn, int64_t T, int64_t H, int64_t D, const void *o,
                                int64_t lds, bool src_f32, const float *lse, bool shard, void *out, float *out_lse) {
  dtl__cp_ws slots[DTL__CP_REDUCE_SLOTS];
  size_t bytes[DTL__CP_REDUCE_SLOTS];
  dtl__cp_state_reduce_needs(ctx, T, H, D, slots, bytes);
  DTL_TRY(dtl__cp_scratch(ctx, fn, DTL__CP_REDUCE_SLOTS, slots, bytes));
  void *scaled = ctx->ws[DTL__CP_WS_ACC];
  float *all = ctx->ws[DTL__CP_WS_LSE], *L = ctx->ws[DTL__CP_WS_LSE3];
  int p = ctx->size;
  size_t n = (size_t)(T * H);
  dtl_status st = dtl_all_gather(ctx->comm, lse, all, n, DTL_FLOAT32);
  if (st != DTL_OK) return dtl__error_prefix(st, "%s", fn);
  DTL_TRY(dtl__cp_combine(ctx, (int64_t)n, p, all, (int64_t)n, L));
  DTL_TRY(dtl__cp_rescale(ctx, T, H, D, o, lds, src_f32, lse, L, scaled, H * D));
  int64_t off = 0, rows = T;
  if (shard) {
    for (int r = 0; r < p; r++) {
      int64_t ro, rc;
      dtl__chunk(T, p, r, &ro, &rc);
      ctx->counts[0][r] = (size_t)(rc * H * D);
      if (r == ctx->rank) off = ro, rows = rc;
    }
    st = dtl_reduce_scatterv(ctx->comm, scaled, out, ctx->counts[0], ctx->dtype, DTL_SUM);
  } else {
    st = dtl_all_reduce(ctx->comm, scaled, out, (size_t)(T * H * D), ctx->dtype, DTL_SUM);
  }
  if (st != DTL_OK) return dtl__error_prefix(st, "%s", fn);
  if (out_lse && rows > 0)
    DTL_TRY(dtl__mem_copy(&ctx->comm->mem, out_lse, L + off * H, (size_t)(rows * H) * sizeof(float)));
  return DTL_OK;
}

/* The checks and the scratch of a collective merge. */
static dtl_status dtl__cp_state_reduce_prepare(dtl_cp_context *ctx, const char *fn, int64_t T, int64_t H, int64_t D,
                                               const void *o, const float *lse, dtl_placement out_placement,
                                               void *out) {
  int64_t n;
  DTL_CHECK_ARG(T >= 0 && H >= 0 && D >= 0, fn, "T=%lld H=%lld D=%lld (expected >= 0)", (long long)T, (long long)H,
                (long long)D);
  DTL_TRY(dtl__cp_count(fn, "o", T, H, D, &n));
  int64_t nl;
  DTL_TRY(dtl__cp_count(fn, "the gathered lse", T, H, ctx->size, &nl));
  bool shard = out_placement.kind == DTL_SHARD;
  DTL_CHECK_ARG(out_placement.kind == DTL_REPLICATE || (shard && out_placement.dim == 0), fn,
                "out_placement is not R or S(0) (the merged state is replicated or split over tokens)");
  int64_t ro = 0, rows = T;
  if (shard) dtl__chunk(T, ctx->size, ctx->rank, &ro, &rows);
  DTL_CHECK_ARG(n == 0 || o != NULL, fn, "o=NULL");
  DTL_CHECK_ARG(T * H == 0 || lse != NULL, fn, "lse=NULL");
  DTL_CHECK_ARG(rows * H * D == 0 || out != NULL, fn, "out=NULL");
  dtl__cp_ws slots[DTL__CP_REDUCE_SLOTS];
  size_t bytes[DTL__CP_REDUCE_SLOTS];
  dtl__cp_state_reduce_needs(ctx, T, H, D, slots, bytes);
  return dtl__cp_scratch(ctx, fn, DTL__CP_REDUCE_SLOTS, slots, bytes);
}

dtl_status dtl_cp_state_reduce(dtl_cp_context *ctx, int64_t T, int64_t H, int64_t D, const void *o, const float *lse,
                               dtl_placement out_placement, void *out, float *out_lse) {
  static const char fn[] = "dtl_cp_state_reduce";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl_status ready = dtl__cp_state_reduce_prepare(ctx, fn, T, H, D, o, lse, out_placement, out);
  const int64_t fp[] = {T, H, D, out_placement.kind, out_placement.kind == DTL_SHARD ? out_placement.dim : 0};
  DTL_TRY(dtl__cp_agree(ctx, fn, (int)(sizeof fp / sizeof *fp), fp, ready));
  return dtl__cp_state_reduce(ctx, fn, T, H, D, o, H * D, false, lse, out_placement.kind == DTL_SHARD, out, out_lse);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The FP8 sequence-parallel gather of a context made with DTL_TP_FP8_GATHER (tp.h): this rank's token rows
 * quantized to packed e4m3 codes + per-128 f32 scales (quant/act_fp8.h), one all-gather-v of those bytes, then
 * every gathered row dequantized into the context's dtype. The quantization runs in the check half, before the
 * agreement, so that a NaN is bad input that every rank hears of and nothing is written. */
#include "comm/agree.h"
#include "quant/act_fp8.h"
#include "tp/tp_internal.h"

/* The DTL__TP_WS_FP8 slot: the packed rows of all tokens (the all-gather's output), then this rank's own (its
 * input). */
static dtl_status dtl__tp_fp8_slot(dtl_tp_context *ctx, int64_t tokens, int64_t features, char **all, char **mine) {
  size_t rb = dtl__act_fp8_row_bytes(features);
  int64_t local = dtl__tp_chunk(ctx, tokens, ctx->rank).count;
  void *p;
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_FP8, (size_t)(tokens + local) * rb, &p));
  *all = p;
  *mine = (char *)p + (size_t)tokens * rb;
  return DTL_OK;
}

dtl_status dtl__tp_fp8_gather_check(dtl_tp_context *ctx, const char *fn, int64_t tokens, int64_t features,
                                    const void *x_local) {
  if (features == 0) return DTL_OK; /* nothing moves, on every rank alike */
  char *all, *mine;
  DTL_TRY(dtl__tp_fp8_slot(ctx, tokens, features, &all, &mine));
  dtl_tp_range r = dtl__tp_chunk(ctx, tokens, ctx->rank);
  dtl__act_fp8_rows q = dtl__act_fp8_packed(mine, r.count, features);
  if (dtl__tp_on_device(ctx)) {
#if DTL_HAVE_NCCL
    return dtl__act_fp8_quantize_cuda(&ctx->comm->mem, x_local, ctx->dtype, features, &q);
#endif
  }
  return dtl__act_fp8_quantize(fn, x_local, ctx->dtype, features, r.offset, &q);
}

dtl_status dtl__tp_fp8_gather(dtl_tp_context *ctx, int64_t tokens, int64_t features, void *x) {
  if (features == 0) return DTL_OK;
  char *all, *mine;
  DTL_TRY(dtl__tp_fp8_slot(ctx, tokens, features, &all, &mine));
  size_t rb = dtl__act_fp8_row_bytes(features);
  for (int r = 0; r < ctx->size; r++) ctx->counts[r] = (size_t)dtl__tp_chunk(ctx, tokens, r).count * rb;
  DTL_TRY(dtl__all_gatherv_agreed(ctx->comm, mine, ctx->counts[ctx->rank], all, ctx->counts, DTL_UINT8));
  dtl__act_fp8_rows q = dtl__act_fp8_packed(all, tokens, features);
  if (dtl__tp_on_device(ctx)) {
#if DTL_HAVE_NCCL
    return dtl__act_fp8_dequantize_cuda(&ctx->comm->mem, &q, ctx->dtype, x, features);
#endif
  }
  return dtl__act_fp8_dequantize(&q, ctx->dtype, x, features);
}

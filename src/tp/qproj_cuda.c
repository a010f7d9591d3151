/* SPDX-License-Identifier: Apache-2.0 */
/* The device halves of the quantized projections: a weight tile dequantized by the CUDA tile kernel of src/quant (in
 * f32, rounded once into a half context's dtype), and the FP8 GEMM of FP8_TENSOR e4m3 weights on devices that have
 * it (compute/gemm_fp8.h): its choice at creation, the weight's scale on the device, the per-call activation
 * quantization and the cuBLASLt call. */
#include <string.h>
#include "compute/gemm_fp8.h"
#include "compute/gemm_tiled.h"
#include "tp/qproj.h"

dtl_status dtl__tp_qtile_cuda(dtl_tp_context *ctx, const dtl__tp_qsub *q, int64_t r0, int64_t nr, int64_t c0,
                              int64_t nc, void *tile, int64_t ldt) {
  void *stream = ctx->gemm.stream;
  if (ctx->dtype == DTL_FLOAT32)
    return dtl__qshard_dequant_tile_cuda(&q->own->s, 0, r0, nr, c0, nc, (float *)tile, ldt, stream);
  int64_t elems = dtl__gemm_tiling_elems(dtl__gemm_tiling_for(DTL_MEMORY_DEVICE, q->rows, q->cols));
  float *stage = (float *)((char *)ctx->ws[DTL__TP_WS_QTILE] + dtl__tp_qtile_stage_offset(elems, ctx->elem));
  DTL_TRY(dtl__qshard_dequant_tile_cuda(&q->own->s, 0, r0, nr, c0, nc, stage, nc, stream));
  return dtl__tp_cast_f32_cuda(stage, nr, nc, nc, tile, ldt, ctx->dtype, stream);
}

void dtl__tp_qsub_fp8_fini(dtl__tp_qsub *q) {
  dtl__gemm_fp8_destroy(q->lt);
  q->lt = NULL;
  if (q->w_scale) dtl__mem_free(&q->own->mem, q->w_scale);
  q->w_scale = NULL;
  q->fp8 = false;
}

dtl_status dtl__tp_qsub_fp8_init(dtl_tp_context *ctx, const char *fn, dtl__tp_qsub *q) {
  const dtl_quant_format *f = &q->own->g.fmt;
  if (f->kind != DTL_QUANT_FP8_TENSOR || f->code_dtype != DTL_FLOAT8_E4M3 || q->rows % 16 || q->cols % 16 ||
      q->rows == 0 || !dtl__gemm_fp8_available(ctx->comm->mem.device))
    return DTL_OK; /* the tiled path */
  /* The scale (f32, f16 or bf16 [], a scalar) as one device f32 for cuBLASLt's scale pointer. */
  uint8_t raw[4] = {0};
  DTL_TRY(dtl__qshard_own_to_host(&q->own->mem, raw, q->own->part[DTL_QPART_SCALES],
                                  dtl_dtype_size(f->scale_dtype)));
  uint16_t h;
  memcpy(&h, raw, sizeof h);
  float s;
  if (f->scale_dtype == DTL_FLOAT16) s = dtl__f16_to_f32(h);
  else if (f->scale_dtype == DTL_BFLOAT16) s = dtl__bf16_to_f32(h);
  else memcpy(&s, raw, sizeof s);
  dtl_status st = dtl__mem_alloc(&q->own->mem, 16, (void **)&q->w_scale);
  if (st == DTL_OK) st = dtl__mem_copy(&q->own->mem, q->w_scale, &s, sizeof s);
  if (st == DTL_OK) st = dtl__gemm_fp8_create(&q->lt);
  if (st != DTL_OK) {
    dtl__tp_qsub_fp8_fini(q);
    return dtl__error_prefix(st, "%s", fn);
  }
  q->fp8 = true;
  return DTL_OK;
}

dtl_status dtl__tp_qsub_fp8_apply(dtl_tp_context *ctx, const dtl__tp_qsub *q, float beta, int64_t T, const void *x,
                                  int64_t ldx, void *y, int64_t ldy, void *act) {
  int64_t ldq = dtl__tp_qact_ld(q->cols);
  uint8_t *xq = act;
  float *amax_scale = (float *)((char *)act + ((size_t)(T * ldq) + 15) / 16 * 16);
  void *stream = ctx->gemm.stream;
  DTL_TRY(dtl__fp8_quantize_cuda(x, ctx->dtype, T, q->cols, ldx, xq, ldq, amax_scale, stream));
  return dtl__gemm_fp8_run(q->lt, stream, T, q->rows, q->cols, xq, ldq, amax_scale + 1,
                           (const uint8_t *)q->own->part[DTL_QPART_CODES], q->cols, q->w_scale, beta, y, ctx->dtype,
                           ldy);
}

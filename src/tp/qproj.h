/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The state of a quantized projection's sub-weight (qproj.c) and its device halves
 * (qproj_cuda.c): the kept shard, where its rows go in the projection's output, and the FP8 GEMM choice. */
#ifndef DTL_TP_QPROJ_H
#define DTL_TP_QPROJ_H

#include "quant/shard.h"
#include "tp/tp_internal.h"

struct dtl__tp_qsub {
  int64_t row0, rows, cols; /* output columns [row0, row0 + rows) of the projection, from cols inputs */
  dtl__qshard_own *own;     /* this rank's box of the sub-weight: rows x cols, local rows and cols from 0 */
  bool fp8;                 /* FP8 x FP8 on cuBLASLt (DTL_TP_FP8_GEMM taken) */
  struct dtl__gemm_fp8 *lt; /* its cuBLASLt state (fp8 only) */
  float *w_scale;           /* fp8: the weight's per-tensor scale as one device f32 */
};

#if DTL_HAVE_NCCL
/* Fills a device tile of the context's dtype: rows [r0, r0 + nr) x cols [c0, c0 + nc) of q dequantized by the
 * device kernel (into f32; half types then rounded once into tile, through f32 staging that follows the tile's
 * dtl__tp_qtile_stage_offset bytes in DTL__TP_WS_QTILE). */
dtl_status dtl__tp_qtile_cuda(dtl_tp_context *ctx, const dtl__tp_qsub *q, int64_t r0, int64_t nr, int64_t c0,
                              int64_t nc, void *tile, int64_t ldt);
/* Whether q can take the FP8 GEMM on ctx's device (compute capability >= 8.9, FP8_TENSOR e4m3 codes, shapes the
 * FP8 kernels take), and its set-up (q->fp8, q->lt) when it can. */
dtl_status dtl__tp_qsub_fp8_init(dtl_tp_context *ctx, const char *fn, dtl__tp_qsub *q);
void dtl__tp_qsub_fp8_fini(dtl__tp_qsub *q);
/* The FP8 GEMM of q: y[T, q->rows] (ldy) = beta y + quant(x) codes(W)^T scale(x) scale(W), x [T, cols] (ldx),
 * with act the DTL__TP_WS_QACT scratch of dtl__tp_qact_bytes. */
dtl_status dtl__tp_qsub_fp8_apply(dtl_tp_context *ctx, const dtl__tp_qsub *q, float beta, int64_t T, const void *x,
                                  int64_t ldx, void *y, int64_t ldy, void *act);
#endif
/* The DTL__TP_WS_QACT bytes an FP8 sub-weight of cols inputs takes for T tokens: e4m3 codes [T, cols] with rows
 * padded to 16 bytes (cuBLASLt's alignment), then f32 {amax, scale} 16-byte aligned. */
size_t dtl__tp_qact_bytes(int64_t T, int64_t cols);
int64_t dtl__tp_qact_ld(int64_t cols);
/* Where a device tile's f32 staging starts in DTL__TP_WS_QTILE: after a tile of elems elements of elem bytes. */
static inline size_t dtl__tp_qtile_stage_offset(int64_t elems, size_t elem) { return ((size_t)elems * elem + 15) / 16 * 16; }
/* A cast of f32 src [rows, cols] (leading dim lds) into dst of dtype t (leading dim ldd), on stream (qproj.cu). */
#if DTL_HAVE_NCCL
#ifdef __cplusplus
extern "C"
#endif
dtl_status dtl__tp_cast_f32_cuda(const float *src, int64_t rows, int64_t cols, int64_t lds, void *dst, int64_t ldd,
                                 dtl_dtype t, void *stream);
#endif

#endif

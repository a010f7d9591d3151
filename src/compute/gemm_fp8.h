/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The FP8 GEMM of the quantized layers: activations quantized to e4m3 with one
 * per-tensor scale computed on the device (amax / 448), then C = (sa A) (sb B)^T + beta C from e4m3 codes A [m, k] and
 * B [n, k] on cuBLASLt (CUDA_R_8F_E4M3 operands, f32 accumulation and scale pointers), on devices of compute
 * capability 8.9 and later. The quantization kernel's code also runs on the host (dtl__fp8_quantize_emulate), and
 * dtl__gemm_fp8_emulate computes the cuBLASLt call's result up to its summation order, so that tests check the
 * arithmetic without a GPU. */
#ifndef DTL_COMPUTE_GEMM_FP8_H
#define DTL_COMPUTE_GEMM_FP8_H

#include "common/half.h"
#include "compute/gemm.h"
#include "compute/math.h"
#ifdef __CUDACC__
#include <cuda_fp8.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DTL__FP8_ACT_MAX 448.0f /* e4m3fn's largest finite value */

/* The per-tensor scale of activations whose largest magnitude is amax: amax / 448, so that the largest maps to 448;
 * 1 when amax is 0 (all zeros: codes 0) or not finite (NaN and infinite inputs then saturate or stay NaN). */
static DTL_HD inline float dtl__fp8_act_scale(float amax) {
  return amax > 0.0f && amax <= 3.402823466e38f ? amax / DTL__FP8_ACT_MAX : 1.0f;
}
/* The e4m3 code of x / scale: round to nearest even, saturating at +-448 (the host conversion of common/half.h and
 * CUDA's __NV_SATFINITE conversion agree on every finite input). */
static DTL_HD inline uint8_t dtl__fp8_act_code(float x, float scale) {
#ifdef __CUDA_ARCH__
  return (uint8_t)__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
#else
  return dtl__f32_to_f8e4m3(x / scale);
#endif
}

#if DTL_HAVE_NCCL
/* Whether cuBLASLt can run the FP8 GEMM on device: compute capability >= 8.9 and a CUDA with FP8 (11.8+). */
bool dtl__gemm_fp8_available(int device);

/* x [rows, cols] (leading dim ldx, dtype t: f32/f16/bf16, device memory) -> q [rows, cols] e4m3 codes (leading dim
 * ldq), amax_scale (device f32 [2]) = {max |x| (NaN ignored), dtl__fp8_act_scale of it}: two kernels on stream. */
dtl_status dtl__fp8_quantize_cuda(const void *x, dtl_dtype t, int64_t rows, int64_t cols, int64_t ldx, uint8_t *q,
                                  int64_t ldq, float *amax_scale, void *stream);
/* The same kernels' code on host memory. */
dtl_status dtl__fp8_quantize_emulate(const void *x, dtl_dtype t, int64_t rows, int64_t cols, int64_t ldx, uint8_t *q,
                                     int64_t ldq, float *amax_scale);
/* What dtl__gemm_fp8_run computes, on the host: C[m, n] = beta C + sa sb sum_j dec(A[i, j]) dec(B[l, j]) (f32 C,
 * accumulated in double, rounded once). */
void dtl__gemm_fp8_emulate(int64_t m, int64_t n, int64_t k, const uint8_t *a, int64_t lda, float sa, const uint8_t *b,
                           int64_t ldb, float sb, float beta, float *c, int64_t ldc);

/* A cuBLASLt handle and the descriptors of the last shape it ran (remade when the shape changes). */
typedef struct dtl__gemm_fp8 dtl__gemm_fp8;
dtl_status dtl__gemm_fp8_create(dtl__gemm_fp8 **out);
void dtl__gemm_fp8_destroy(dtl__gemm_fp8 *g);
/* Row-major C[m, n] (dtype ct: f32/f16/bf16, leading dim ldc) = (*a_scale A) (*b_scale B)^T + beta C, A [m, k] and B
 * [n, k] e4m3 codes (leading dims lda, ldb), scales device f32 pointers; enqueued on stream. DTL_ERR_UNSUPPORTED when
 * cuBLASLt has no FP8 kernel for these shapes or alignments (nothing was enqueued: the caller takes another path). */
dtl_status dtl__gemm_fp8_run(dtl__gemm_fp8 *g, void *stream, int64_t m, int64_t n, int64_t k, const uint8_t *a,
                             int64_t lda, const float *a_scale, const uint8_t *b, int64_t ldb, const float *b_scale,
                             float beta, void *c, dtl_dtype ct, int64_t ldc);
#endif

#ifdef __cplusplus
}
#endif
#endif

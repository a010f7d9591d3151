/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The bias epilogue of a projection: host loops (bias.c) or one CUDA kernel
 * (bias.cu), f32/f16/bf16 (half types add in f32 and round to nearest even), chosen by the GEMM engine. */
#ifndef DTL_COMPUTE_BIAS_H
#define DTL_COMPUTE_BIAS_H

#include "compute/gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For each of rows rows of y (leading dim ldy): y[r, 0..cols) = bias (add false: seeds a GEMM that then
 * accumulates with beta = 1) or += bias (add true: after a reduction), on the engine's memory. */
dtl_status dtl__bias_rows(const dtl__gemm_engine *g, void *y, const void *bias, int64_t rows, int64_t cols, int64_t ldy,
                          bool add, dtl_dtype t);
/* The host half. */
dtl_status dtl__bias_rows_host(void *y, const void *bias, int64_t rows, int64_t cols, int64_t ldy, bool add,
                                  dtl_dtype t);
#if DTL_HAVE_NCCL
/* The same, enqueued on stream (a cudaStream_t); the caller's current device owns y and bias. */
dtl_status dtl__bias_rows_cuda(void *y, const void *bias, int64_t rows, int64_t cols, int64_t ldy, bool add,
                                  dtl_dtype t, void *stream);
#endif

#ifdef __cplusplus
}
#endif
#endif

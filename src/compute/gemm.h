/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The one local GEMM of every layer (tensor parallel, MoE, attention): row-major
 * C = alpha * A * B^T + beta * C with B stored [n, k], the way checkpoints store a linear weight [out, in].
 * Host memory goes to OpenBLAS (f32), device memory to cuBLAS (f32, f16, bf16; accumulation in f32). */
#ifndef DTL_COMPUTE_GEMM_H
#define DTL_COMPUTE_GEMM_H

#include "comm/memory.h"

/* Where the operands live. A host engine needs nothing else; a device engine owns a cuBLAS handle bound to
 * the stream its work is ordered on (dtl__gemm_engine_init_device). */
typedef struct {
  dtl_memory memory;
  void *cublas; /* cublasHandle_t, device engines only */
  void *stream; /* cudaStream_t the handle is bound to, device engines only */
} dtl__gemm_engine;

/* The host engine (no state). */
dtl__gemm_engine dtl__gemm_engine_host(void);
/* The engine for a memory (memory.h): the host engine for host memory, a cuBLAS handle on the memory's
 * stream for device memory (the calling thread's current device must be the memory's). */
dtl_status dtl__gemm_engine_for_mem(dtl__gemm_engine *e, const dtl__mem *m);
/* A cuBLAS handle on stream (a cudaStream_t; NULL = the legacy default stream). DTL_ERR_UNSUPPORTED when
 * dtl was built without CUDA, DTL_ERR_CUDA when cuBLAS cannot start (e.g. no device). */
dtl_status dtl__gemm_engine_init_device(dtl__gemm_engine *e, void *stream);
/* Releases a device engine's handle; a no-op for the host engine. */
void dtl__gemm_engine_fini(dtl__gemm_engine *e);

/* C[m, n] = alpha * A[m, k] * B[n, k]^T + beta * C[m, n], all row-major with leading dims lda >= k,
 * ldb >= k, ldc >= n (elements). A, B and C have dtype t: f32 on the host; f32/f16/bf16 on the device.
 * beta == 0 overwrites C without reading it (BLAS semantics). m, n or k may be 0 (k == 0 scales C by beta).
 * Sizes above INT_MAX are DTL_ERR_UNSUPPORTED (BLAS takes int). On the device the call is enqueued on the
 * engine's stream and returns before the result is ready. */
dtl_status dtl__gemm(const dtl__gemm_engine *e, dtl_dtype t, int64_t m, int64_t n, int64_t k, float alpha,
                     const void *a, int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc);

#if DTL_HAVE_NCCL
/* The cuBLAS half of dtl__gemm (gemm_cuda.c); arguments already validated. */
dtl_status dtl__gemm_device(const dtl__gemm_engine *e, dtl_dtype t, int m, int n, int k, float alpha, const void *a,
                            int lda, const void *b, int ldb, float beta, void *c, int ldc);
#endif

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* The cuBLAS half of dtl__gemm: a row-major C = A * B^T is the column-major C^T = B * A^T, so B goes first
 * with CUBLAS_OP_T and A second untransposed. f16/bf16 operands accumulate in f32 (CUBLAS_COMPUTE_32F). */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include "compute/gemm.h"

static dtl_status dtl__cublas_error(const char *what, cublasStatus_t s) {
  return dtl__error(DTL_ERR_CUDA, "dtl__gemm: %s failed: %s (%d)", what, cublasGetStatusString(s), (int)s);
}

dtl_status dtl__gemm_engine_init_device(dtl__gemm_engine *e, void *stream) {
  DTL_CHECK_ARG(e != NULL, "dtl__gemm_engine_init_device", "engine=NULL");
  cublasHandle_t h = NULL;
  cublasStatus_t s = cublasCreate(&h);
  if (s != CUBLAS_STATUS_SUCCESS) return dtl__cublas_error("cublasCreate", s);
  s = cublasSetStream(h, (cudaStream_t)stream);
  if (s != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(h);
    return dtl__cublas_error("cublasSetStream", s);
  }
  e->memory = DTL_MEMORY_DEVICE;
  e->cublas = h;
  e->stream = stream;
  return DTL_OK;
}

void dtl__gemm_engine_fini(dtl__gemm_engine *e) {
  if (!e || e->memory != DTL_MEMORY_DEVICE || !e->cublas) return;
  cublasDestroy((cublasHandle_t)e->cublas);
  e->cublas = NULL;
}

dtl_status dtl__gemm_device(const dtl__gemm_engine *e, dtl_dtype t, int m, int n, int k, float alpha, const void *a,
                            int lda, const void *b, int ldb, float beta, void *c, int ldc) {
  cudaDataType ct = t == DTL_FLOAT16 ? CUDA_R_16F : t == DTL_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasStatus_t s = cublasGemmEx((cublasHandle_t)e->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, ct, ldb, a,
                                  ct, lda, &beta, c, ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) return dtl__cublas_error("cublasGemmEx", s);
  return DTL_OK;
}

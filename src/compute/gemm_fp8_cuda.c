/* SPDX-License-Identifier: Apache-2.0 */
/* The FP8 GEMM on cuBLASLt: a row-major C = A B^T is the column-major C^T = B A^T, so the weights B go first as the
 * transposed operand and the activations A second (cuBLASLt's FP8 kernels take exactly this "TN" form), each with its
 * per-tensor scale pointer; f32 accumulation. The descriptors of the last shape are kept, so that a steady stream of
 * calls of one shape makes none. */
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include "compute/gemm_fp8.h"

#if defined(CUDA_VERSION) && CUDA_VERSION >= 11080
#define DTL__HAVE_FP8_LT 1
#else
#define DTL__HAVE_FP8_LT 0
#endif

struct dtl__gemm_fp8 {
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (the weights), B (the activations), C = D */
  int64_t m, n, k, lda, ldb, ldc;
  dtl_dtype ct;
};

static dtl_status dtl__lt_error(const char *what, cublasStatus_t s) {
  return dtl__error(DTL_ERR_CUDA, "dtl__gemm_fp8: %s failed: %s (%d)", what, cublasGetStatusString(s), (int)s);
}

bool dtl__gemm_fp8_available(int device) {
#if DTL__HAVE_FP8_LT
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major > 8 || (major == 8 && minor >= 9);
#else
  (void)device;
  return false;
#endif
}

static void dtl__gemm_fp8_layouts_free(dtl__gemm_fp8 *g) {
  if (g->la) cublasLtMatrixLayoutDestroy(g->la);
  if (g->lb) cublasLtMatrixLayoutDestroy(g->lb);
  if (g->lc) cublasLtMatrixLayoutDestroy(g->lc);
  g->la = g->lb = g->lc = NULL;
  g->m = -1;
}

void dtl__gemm_fp8_destroy(dtl__gemm_fp8 *g) {
  if (!g) return;
  dtl__gemm_fp8_layouts_free(g);
  if (g->op) cublasLtMatmulDescDestroy(g->op);
  if (g->h) cublasLtDestroy(g->h);
  dtl__free(g);
}

dtl_status dtl__gemm_fp8_create(dtl__gemm_fp8 **out) {
#if DTL__HAVE_FP8_LT
  dtl__gemm_fp8 *g = dtl__calloc(1, sizeof *g);
  if (!g) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl__gemm_fp8_create: out of host memory");
  g->m = -1;
  cublasStatus_t s = cublasLtCreate(&g->h);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (s != CUBLAS_STATUS_SUCCESS) {
    dtl__gemm_fp8_destroy(g);
    return dtl__lt_error("cublasLtCreate / cublasLtMatmulDescCreate", s);
  }
  *out = g;
  return DTL_OK;
#else
  (void)out;
  return dtl__error(DTL_ERR_UNSUPPORTED, "dtl__gemm_fp8_create: this CUDA has no FP8 GEMM (11.8 or later needed)");
#endif
}

dtl_status dtl__gemm_fp8_run(dtl__gemm_fp8 *g, void *stream, int64_t m, int64_t n, int64_t k, const uint8_t *a,
                             int64_t lda, const float *a_scale, const uint8_t *b, int64_t ldb, const float *b_scale,
                             float beta, void *c, dtl_dtype ct, int64_t ldc) {
#if DTL__HAVE_FP8_LT
  if (m == 0 || n == 0) return DTL_OK;
  size_t es = dtl_dtype_size(ct);
  /* What the FP8 kernels take: 16-byte aligned operands and leading dims, k and n multiples of 16. */
  if (k % 16 || n % 16 || lda % 16 || ldb % 16 || (ldc * (int64_t)es) % 16 || (uintptr_t)a % 16 || (uintptr_t)b % 16 ||
      (uintptr_t)c % 16 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
    return dtl__error(DTL_ERR_UNSUPPORTED, "dtl__gemm_fp8_run: m=%lld n=%lld k=%lld or the alignment is not what the "
                      "FP8 kernels take", (long long)m, (long long)n, (long long)k);
  cudaDataType t = ct == DTL_FLOAT16 ? CUDA_R_16F : ct == DTL_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (g->m != m || g->n != n || g->k != k || g->lda != lda || g->ldb != ldb || g->ldc != ldc || g->ct != ct) {
    dtl__gemm_fp8_layouts_free(g);
    s = cublasLtMatrixLayoutCreate(&g->la, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, ldb);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)m, lda);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&g->lc, t, (uint64_t)n, (uint64_t)m, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) {
      dtl__gemm_fp8_layouts_free(g);
      return dtl__lt_error("cublasLtMatrixLayoutCreate", s);
    }
    g->m = m, g->n = n, g->k = k, g->lda = lda, g->ldb = ldb, g->ldc = ldc, g->ct = ct;
  }
  s = cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof b_scale);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof a_scale);
  if (s != CUBLAS_STATUS_SUCCESS) return dtl__lt_error("cublasLtMatmulDescSetAttribute", s);
  float alpha = 1.0f;
  s = cublasLtMatmul(g->h, g->op, &alpha, b, g->la, a, g->lb, &beta, c, g->lc, c, g->lc, NULL, NULL, 0,
                     (cudaStream_t)stream);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED)
    return dtl__error(DTL_ERR_UNSUPPORTED, "dtl__gemm_fp8_run: cuBLASLt has no FP8 kernel for m=%lld n=%lld k=%lld",
                      (long long)m, (long long)n, (long long)k);
  return s == CUBLAS_STATUS_SUCCESS ? DTL_OK : dtl__lt_error("cublasLtMatmul", s);
#else
  (void)g, (void)stream, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)a_scale, (void)b, (void)ldb, (void)b_scale;
  (void)beta, (void)c, (void)ct, (void)ldc;
  return dtl__error(DTL_ERR_UNSUPPORTED, "dtl__gemm_fp8_run: this CUDA has no FP8 GEMM");
#endif
}

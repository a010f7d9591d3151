/* SPDX-License-Identifier: Apache-2.0 */
/* The validated GEMM entry point and its host half on OpenBLAS. One place checks shapes and leading dims
 * for both engines, so the TP and MoE layers never call a BLAS directly. */
#include <limits.h>
#include <cblas.h>
#include "compute/gemm.h"

dtl__gemm_engine dtl__gemm_engine_host(void) { return (dtl__gemm_engine){DTL_MEMORY_HOST, NULL, NULL}; }

dtl_status dtl__gemm_engine_for_mem(dtl__gemm_engine *e, const dtl__mem *m) {
  if (m->ops->memory == DTL_MEMORY_HOST) {
    *e = dtl__gemm_engine_host();
    return DTL_OK;
  }
  return dtl__gemm_engine_init_device(e, m->stream);
}

#if !DTL_HAVE_NCCL
dtl_status dtl__gemm_engine_init_device(dtl__gemm_engine *e, void *stream) {
  (void)e;
  (void)stream;
  return dtl__error(DTL_ERR_UNSUPPORTED, "dtl__gemm_engine_init_device: dtl was built without CUDA");
}
void dtl__gemm_engine_fini(dtl__gemm_engine *e) { (void)e; }
#endif

dtl_status dtl__gemm(const dtl__gemm_engine *e, dtl_dtype t, int64_t m, int64_t n, int64_t k, float alpha,
                     const void *a, int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc) {
  static const char fn[] = "dtl__gemm";
  DTL_CHECK_ARG(e != NULL, fn, "engine=NULL");
  DTL_CHECK_ARG(m >= 0 && n >= 0 && k >= 0, fn, "m=%lld n=%lld k=%lld (expected >= 0)", (long long)m, (long long)n,
                (long long)k);
  DTL_CHECK_ARG(lda >= k && ldb >= k && ldc >= n, fn, "lda=%lld ldb=%lld ldc=%lld (expected lda,ldb >= k=%lld, ldc >= n=%lld)",
                (long long)lda, (long long)ldb, (long long)ldc, (long long)k, (long long)n);
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "m=%lld n=%lld k=%lld or a leading dim exceeds INT_MAX", (long long)m,
                         (long long)n, (long long)k);
  if (m == 0 || n == 0) return DTL_OK;
  DTL_CHECK_ARG(c != NULL, fn, "C=NULL");
  DTL_CHECK_ARG(k == 0 || (a != NULL && b != NULL), fn, "%s=NULL", a ? "B" : "A");
  /* BLAS insists on leading dims >= 1 even when a dim is empty. */
  int ia = lda > 0 ? (int)lda : 1, ib = ldb > 0 ? (int)ldb : 1, ic = (int)ldc;
  if (e->memory == DTL_MEMORY_DEVICE) {
#if DTL_HAVE_NCCL
    DTL_CHECK_ARG(t == DTL_FLOAT32 || t == DTL_FLOAT16 || t == DTL_BFLOAT16, fn, "dtype=%s (expected f32, f16 or bf16)",
                  dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
    return dtl__gemm_device(e, t, (int)m, (int)n, (int)k, alpha, a, ia, b, ib, beta, c, ic);
#else
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "device memory, but dtl was built without CUDA");
#endif
  }
  if (t != DTL_FLOAT32)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "dtype=%s on the host (expected f32; f16/bf16 run on the device)",
                         dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, alpha, a, ia, b, ib, beta, c, ic);
  return DTL_OK;
}

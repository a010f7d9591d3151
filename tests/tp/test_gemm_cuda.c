/* SPDX-License-Identifier: Apache-2.0 */
/* The cuBLAS half of the internal GEMM against the host (OpenBLAS) half, in f32, f16 and bf16. Operands are
 * small integers whose products and sums stay exact in every one of these types (|C| <= 64 < 2^8), so the
 * device result must equal the host result bit for bit. Exits 77 (skipped) without a CUDA device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <cuda_runtime.h>
#include "common/half.h"
#include "compute/gemm.h"

static dtl__gemm_engine dev;

static void to_type(const float *src, void *dst, size_t n, dtl_dtype t) {
  for (size_t i = 0; i < n; i++) {
    if (t == DTL_FLOAT32) ((float *)dst)[i] = src[i];
    else if (t == DTL_FLOAT16) ((uint16_t *)dst)[i] = dtl__f32_to_f16(src[i]);
    else ((uint16_t *)dst)[i] = dtl__f32_to_bf16(src[i]);
  }
}
static float from_type(const void *src, size_t i, dtl_dtype t) {
  if (t == DTL_FLOAT32) return ((const float *)src)[i];
  if (t == DTL_FLOAT16) return dtl__f16_to_f32(((const uint16_t *)src)[i]);
  return dtl__bf16_to_f32(((const uint16_t *)src)[i]);
}

static void *upload(const float *host, size_t n, dtl_dtype t) {
  size_t es = dtl_dtype_size(t);
  void *tmp = malloc(n * es + 1), *d = NULL;
  to_type(host, tmp, n, t);
  assert_int_equal(cudaMalloc(&d, n * es + 1), cudaSuccess);
  assert_int_equal(cudaMemcpy(d, tmp, n * es, cudaMemcpyHostToDevice), cudaSuccess);
  free(tmp);
  return d;
}

static void check(dtl_dtype t, int m, int n, int k, int pad, float beta) {
  int lda = k + pad, ldb = k + pad, ldc = n + pad;
  size_t na = (size_t)(m * lda), nb = (size_t)(n * ldb), nc = (size_t)(m * ldc);
  float *a = malloc(na * 4 + 4), *b = malloc(nb * 4 + 4), *c = malloc(nc * 4 + 4);
  unsigned s = (unsigned)(m * 7 + n * 3 + k);
  for (size_t i = 0; i < na; i++) a[i] = (float)((int)((s = s * 1103515245u + 12345u) >> 16) % 3 - 1);
  for (size_t i = 0; i < nb; i++) b[i] = (float)((int)((s = s * 1103515245u + 12345u) >> 16) % 3 - 1);
  for (size_t i = 0; i < nc; i++) c[i] = (float)((int)((s = s * 1103515245u + 12345u) >> 16) % 5 - 2);
  void *da = upload(a, na, t), *db = upload(b, nb, t), *dc = upload(c, nc, t);
  dtl__gemm_engine host = dtl__gemm_engine_host();
  assert_int_equal(dtl__gemm(&host, DTL_FLOAT32, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc), DTL_OK);
  assert_int_equal(dtl__gemm(&dev, t, m, n, k, 1.0f, da, lda, db, ldb, beta, dc, ldc), DTL_OK);
  size_t es = dtl_dtype_size(t);
  void *got = malloc(nc * es + 1);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  assert_int_equal(cudaMemcpy(got, dc, nc * es, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) assert_true(from_type(got, (size_t)(i * ldc + j), t) == c[i * ldc + j]);
  cudaFree(da), cudaFree(db), cudaFree(dc);
  free(a), free(b), free(c), free(got);
}

static void cublas_gemm_equals_host_gemm_in_f32_f16_and_bf16(void **state) {
  (void)state;
  dtl_dtype types[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};
  for (int t = 0; t < 3; t++) {
    check(types[t], 1, 7, 16, 0, 0.0f);
    check(types[t], 5, 3, 9, 2, 1.0f);
    check(types[t], 33, 17, 64, 1, 0.0f);
  }
}

static void device_gemm_rejects_integer_dtypes(void **state) {
  (void)state;
  float x = 0;
  assert_int_equal(dtl__gemm(&dev, DTL_INT32, 1, 1, 1, 1.0f, &x, 1, &x, 1, 0.0f, &x, 1), DTL_ERR_INVALID_ARGUMENT);
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  if (dtl__gemm_engine_init_device(&dev, NULL) != DTL_OK) {
    printf("cuBLAS did not start: %s\n", dtl_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cublas_gemm_equals_host_gemm_in_f32_f16_and_bf16),
      cmocka_unit_test(device_gemm_rejects_integer_dtypes),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  dtl__gemm_engine_fini(&dev);
  return rc;
}

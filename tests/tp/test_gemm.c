/* SPDX-License-Identifier: Apache-2.0 */
/* The internal GEMM (C = alpha A B^T + beta C, B stored [n, k]) on the host against a naive triple loop.
 * Small integers keep every f32 sum exact, so results compare with ==. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "compute/gemm_tiled.h"

static float small_int(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (float)((int)((*s >> 16) % 9u) - 4);
}

static void naive(int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                  float *c, int ldc) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float s = 0;
      for (int p = 0; p < k; p++) s += a[i * lda + p] * b[j * ldb + p];
      c[i * ldc + j] = alpha * s + (beta == 0 ? 0 : beta * c[i * ldc + j]);
    }
}

static void check_case(int m, int n, int k, int pad, float alpha, float beta) {
  unsigned s = (unsigned)(m * 131 + n * 17 + k);
  int lda = k + pad, ldb = k + pad, ldc = n + pad;
  float *a = malloc(sizeof(float) * (size_t)(m * lda + 1)), *b = malloc(sizeof(float) * (size_t)(n * ldb + 1));
  float *c = malloc(sizeof(float) * (size_t)(m * ldc + 1)), *r = malloc(sizeof(float) * (size_t)(m * ldc + 1));
  for (int i = 0; i < m * lda; i++) a[i] = small_int(&s);
  for (int i = 0; i < n * ldb; i++) b[i] = small_int(&s);
  for (int i = 0; i < m * ldc; i++) c[i] = r[i] = small_int(&s);
  dtl__gemm_engine e = dtl__gemm_engine_host();
  assert_int_equal(dtl__gemm(&e, DTL_FLOAT32, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), DTL_OK);
  naive(m, n, k, alpha, a, lda, b, ldb, beta, r, ldc);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < ldc; j++) assert_true(c[i * ldc + j] == r[i * ldc + j]); /* padding untouched too */
  free(a);
  free(b);
  free(c);
  free(r);
}

static void product_with_transposed_weight_matches_naive_loop(void **state) {
  (void)state;
  int dims[] = {1, 2, 3, 7, 16};
  for (int x = 0; x < 5; x++)
    for (int y = 0; y < 5; y++)
      for (int z = 0; z < 5; z++) check_case(dims[x], dims[y], dims[z], 0, 1.0f, 0.0f);
}

static void leading_dims_alpha_and_beta_accumulate_into_c(void **state) {
  (void)state;
  check_case(5, 6, 7, 3, 2.0f, 1.0f);
  check_case(4, 3, 9, 1, -1.0f, 3.0f);
}

static void empty_inner_dim_scales_c_by_beta(void **state) {
  (void)state;
  float c[6] = {1, 2, 3, 4, 5, 6};
  dtl__gemm_engine e = dtl__gemm_engine_host();
  assert_int_equal(dtl__gemm(&e, DTL_FLOAT32, 2, 3, 0, 1.0f, NULL, 0, NULL, 0, 2.0f, c, 3), DTL_OK);
  for (int i = 0; i < 6; i++) assert_true(c[i] == 2.0f * (float)(i + 1));
  assert_int_equal(dtl__gemm(&e, DTL_FLOAT32, 0, 3, 4, 1.0f, NULL, 4, NULL, 4, 0.0f, NULL, 3), DTL_OK);
}

static void bad_leading_dim_null_operand_and_half_on_host_are_rejected(void **state) {
  (void)state;
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 1, 1, 1}, c[4] = {9, 9, 9, 9};
  dtl__gemm_engine e = dtl__gemm_engine_host();
  assert_int_equal(dtl__gemm(&e, DTL_FLOAT32, 2, 2, 2, 1, a, 1, b, 2, 0, c, 2), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "lda=1"));
  assert_int_equal(dtl__gemm(&e, DTL_FLOAT32, 2, 2, 2, 1, NULL, 2, b, 2, 0, c, 2), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "A=NULL"));
  assert_int_equal(dtl__gemm(&e, DTL_FLOAT16, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2), DTL_ERR_UNSUPPORTED);
  assert_non_null(strstr(dtl_last_error(), "f16"));
  assert_int_equal(dtl__gemm(&e, DTL_FLOAT32, -1, 2, 2, 1, a, 2, b, 2, 0, c, 2), DTL_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < 4; i++) assert_true(c[i] == 9.0f);
}

/* The tile-by-tile GEMM: B given through a callback that copies the asked block out of a dense B, recording the
 * largest tile and that every element of B is asked for exactly once per product. */
typedef struct {
  const float *b;
  int k, calls, *seen;
  int64_t max_elems;
} tile_src;

static dtl_status fill_from(void *user, int64_t r0, int64_t nr, int64_t c0, int64_t nc, void *tile, int64_t ldt) {
  tile_src *t = user;
  t->calls++;
  if (nr * nc > t->max_elems) t->max_elems = nr * nc;
  for (int64_t r = 0; r < nr; r++)
    for (int64_t c = 0; c < nc; c++) {
      ((float *)tile)[r * ldt + c] = t->b[(r0 + r) * t->k + c0 + c];
      t->seen[(r0 + r) * t->k + c0 + c]++;
    }
  return DTL_OK;
}

static void tiled_check(int m, int n, int k, dtl__gemm_tiling tl, float beta) {
  unsigned s = (unsigned)(m * 7 + n * 3 + k + 11);
  int ldc = n + 2;
  float *a = malloc(sizeof(float) * (size_t)(m * k + 1)), *b = malloc(sizeof(float) * (size_t)(n * k + 1));
  float *c = malloc(sizeof(float) * (size_t)(m * ldc + 1)), *r = malloc(sizeof(float) * (size_t)(m * ldc + 1));
  float *tile = malloc(sizeof(float) * (size_t)(dtl__gemm_tiling_elems(tl) + 1));
  int *seen = calloc((size_t)(n * k + 1), sizeof(int));
  for (int i = 0; i < m * k; i++) a[i] = small_int(&s);
  for (int i = 0; i < n * k; i++) b[i] = small_int(&s);
  for (int i = 0; i < m * ldc; i++) c[i] = r[i] = small_int(&s);
  tile_src src = {b, k, 0, seen, 0};
  dtl__gemm_engine e = dtl__gemm_engine_host();
  assert_int_equal(dtl__gemm_tiled(&e, DTL_FLOAT32, m, n, k, a, k, fill_from, &src, tile, tl, beta, c, ldc), DTL_OK);
  naive(m, n, k, 1.0f, a, k, b, k, beta, r, ldc);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < ldc; j++) assert_true(c[i * ldc + j] == r[i * ldc + j]); /* padding untouched too */
  for (int i = 0; i < n * k && m > 0; i++) assert_int_equal(seen[i], 1);
  assert_true(src.max_elems <= dtl__gemm_tiling_elems(tl));
  free(a), free(b), free(c), free(r), free(tile), free(seen);
}

static void tiled_product_visits_each_weight_element_once_and_matches_naive_loop(void **state) {
  (void)state;
  dtl__gemm_tiling small = {3, 4};
  int dims[] = {1, 3, 4, 7, 13};
  for (int x = 0; x < 5; x++)
    for (int y = 0; y < 5; y++)
      for (int z = 0; z < 5; z++) tiled_check(dims[x], dims[y], dims[z], small, z % 2 ? 1.0f : 0.0f);
  /* The host tiling of a weight larger than one tile each way: 2 x 3 tiles, the last ones partial. */
  dtl__gemm_tiling host = dtl__gemm_tiling_for(DTL_MEMORY_HOST, 200, 1100);
  assert_int_equal(host.rows, DTL__GEMM_TILE_HOST_ROWS);
  assert_int_equal(host.cols, DTL__GEMM_TILE_HOST_COLS);
  tiled_check(5, 200, 1100, host, 1.0f);
  /* Small weights are one tile; an empty inner dim only scales C. */
  dtl__gemm_tiling one = dtl__gemm_tiling_for(DTL_MEMORY_HOST, 5, 9);
  assert_true(one.rows == 5 && one.cols == 9);
  tiled_check(4, 3, 0, small, 2.0f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(product_with_transposed_weight_matches_naive_loop),
      cmocka_unit_test(leading_dims_alpha_and_beta_accumulate_into_c),
      cmocka_unit_test(empty_inner_dim_scales_c_by_beta),
      cmocka_unit_test(bad_leading_dim_null_operand_and_half_on_host_are_rejected),
      cmocka_unit_test(tiled_product_visits_each_weight_element_once_and_matches_naive_loop),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

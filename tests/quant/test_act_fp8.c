/* SPDX-License-Identifier: Apache-2.0 */
/* The FP8 activation kernels of src/quant/act_fp8.h against a straightforward reference of DeepEP's rule (per row
 * and 128-column block: amax = max(max |x|, 1e-4), code = e4m3(x * (448 / amax)) by dtl__f32_to_f8e4m3, scale =
 * amax * (1 / 448)), bit for bit: f32, f16 and bf16 rows, widths on both sides of the block edges, strided and
 * packed rows, every rounding boundary of the conversion, zero and tiny blocks, dequantization, the error bound of
 * the round trip, and bad input. The reference is tests/common/act_fp8_ref.h. In CUDA builds also the device
 * kernels' code, run on the host, against the host kernels. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "common/half.h"
#include "quant/act_fp8.h"
#include "act_fp8_ref.h"

static const dtl_dtype kTypes[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};
static const int64_t kCols[] = {1, 5, 127, 128, 129, 200, 256, 300, 515};

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng >> 16);
}

/* Values over many binades, both signs, some exact zeros and blocks of a much smaller magnitude than others. */
static void *random_rows(dtl_dtype t, int64_t rows, int64_t ldx) {
  size_t n = (size_t)(rows * ldx), es = dtl_dtype_size(t);
  void *x = malloc(n * es + 4);
  for (size_t i = 0; i < n; i++) {
    int e = (int)(rnd() % 24) - 16 - (int)((i / 128) % 3) * 6;
    float v = ldexpf((float)(rnd() % 1000000) / 1e6f + 0.5f, e) * (rnd() & 1 ? -1.0f : 1.0f);
    if (rnd() % 17 == 0) v = 0.0f;
    ref_fp8_store(x, i, t, v);
  }
  return x;
}

static dtl__act_fp8_rows strided(uint8_t *codes, int64_t ldc, float *scales, int64_t lds, int64_t rows, int64_t cols) {
  return (dtl__act_fp8_rows){.rows = rows, .cols = cols, .codes = codes, .ldc = ldc, .scales = scales, .lds = lds};
}

static void expect_rows_equal(const dtl__act_fp8_rows *q, const uint8_t *codes, const float *scales, const char *what) {
  int64_t nb = dtl__act_fp8_blocks(q->cols);
  for (int64_t r = 0; r < q->rows; r++) {
    for (int64_t c = 0; c < q->cols; c++)
      if (q->codes[r * q->ldc + c] != codes[r * q->cols + c])
        fail_msg("%s: cols %lld row %lld column %lld: code 0x%02x, reference 0x%02x", what, (long long)q->cols,
                 (long long)r, (long long)c, q->codes[r * q->ldc + c], codes[r * q->cols + c]);
    for (int64_t b = 0; b < nb; b++)
      if (dtl__f32_to_bits(q->scales[r * q->lds + b]) != dtl__f32_to_bits(scales[r * nb + b]))
        fail_msg("%s: cols %lld row %lld block %lld: scale %.9g, reference %.9g", what, (long long)q->cols,
                 (long long)r, (long long)b, q->scales[r * q->lds + b], scales[r * nb + b]);
  }
}

/* ---------------------------------------------------------------------------------------------------------- */
static void packed_rows_hold_codes_padded_to_four_bytes_then_one_scale_per_128_columns(void **state) {
  (void)state;
  assert_int_equal(dtl__act_fp8_row_bytes(1), 4 + 4);
  assert_int_equal(dtl__act_fp8_row_bytes(128), 128 + 4);
  assert_int_equal(dtl__act_fp8_row_bytes(129), 132 + 8);
  assert_int_equal(dtl__act_fp8_row_bytes(4096), 4096 + 128);
  char buf[3 * 140];
  dtl__act_fp8_rows q = dtl__act_fp8_packed(buf, 3, 129);
  assert_ptr_equal(q.codes, buf);
  assert_int_equal(q.ldc, 140);
  assert_ptr_equal((char *)q.scales, buf + 132);
  assert_int_equal(q.lds, 35);
}

static void quantize_equals_the_reference_rule_bit_for_bit_on_both_sides_of_block_edges(void **state) {
  (void)state;
  for (int ti = 0; ti < 3; ti++)
    for (size_t ci = 0; ci < sizeof kCols / sizeof *kCols; ci++) {
      dtl_dtype t = kTypes[ti];
      const int64_t rows = 5, cols = kCols[ci], ldx = cols + 3, nb = dtl__act_fp8_blocks(cols);
      void *x = random_rows(t, rows, ldx);
      uint8_t *rc = malloc((size_t)(rows * cols)), *pk = malloc(rows * dtl__act_fp8_row_bytes(cols));
      float *rs = malloc(sizeof(float) * (size_t)(rows * nb));
      ref_fp8_quantize(x, t, rows, cols, ldx, rc, rs);
      /* Packed rows, as they travel. */
      dtl__act_fp8_rows q = dtl__act_fp8_packed(pk, rows, cols);
      assert_int_equal(dtl__act_fp8_quantize("test", x, t, ldx, 0, &q), DTL_OK);
      expect_rows_equal(&q, rc, rs, dtl_dtype_name(t));
      /* Separate, strided arrays (an FP8 GEMM's operands). */
      uint8_t *codes = malloc((size_t)(rows * (cols + 7)));
      float *scales = malloc(sizeof(float) * (size_t)(rows * (nb + 2)));
      dtl__act_fp8_rows s = strided(codes, cols + 7, scales, nb + 2, rows, cols);
      assert_int_equal(dtl__act_fp8_quantize("test", x, t, ldx, 0, &s), DTL_OK);
      expect_rows_equal(&s, rc, rs, dtl_dtype_name(t));
      free(x), free(rc), free(pk), free(rs), free(codes), free(scales);
    }
}

/* With 448 in a block its multiplier is exactly 1, so the block's other elements reach the conversion as they
 * are: every midpoint between two codes and its neighbours, then a sweep over the f32 patterns below 448 (f32
 * subnormals, e4m3 subnormals, every binade). */
static void every_rounding_boundary_rounds_to_nearest_even_as_dtl__f32_to_f8e4m3(void **state) {
  (void)state;
  enum { N = 127 * 3 * 2 + 300000 };
  float *v = malloc(sizeof(float) * N);
  size_t n = 0;
  for (uint8_t k = 0; k < 0x7e; k++) {
    float mid = (dtl__f8e4m3_to_f32(k) + dtl__f8e4m3_to_f32((uint8_t)(k + 1))) / 2;
    float three[3] = {nextafterf(mid, 0), mid, nextafterf(mid, INFINITY)};
    for (int j = 0; j < 3; j++) v[n++] = three[j], v[n++] = -three[j];
  }
  for (uint32_t u = 0; u < 0x43e00000u && n < N; u += 4523u) v[n++] = dtl__bits_to_f32(u) * (u & 1 ? -1.0f : 1.0f);
  const int64_t cols = 128, rows = (int64_t)((n + 126) / 127);
  float *x = calloc((size_t)(rows * cols), sizeof(float));
  for (size_t i = 0; i < n; i++) x[(i / 127) * 128 + 1 + i % 127] = v[i];
  for (int64_t r = 0; r < rows; r++) x[r * 128] = 448.0f;
  uint8_t *pk = malloc((size_t)rows * dtl__act_fp8_row_bytes(cols));
  dtl__act_fp8_rows q = dtl__act_fp8_packed(pk, rows, cols);
  assert_int_equal(dtl__act_fp8_quantize("test", x, DTL_FLOAT32, cols, 0, &q), DTL_OK);
  for (int64_t r = 0; r < rows; r++) {
    assert_true(q.scales[r * q.lds] == 1.0f);
    for (int64_t c = 0; c < cols; c++)
      if (q.codes[r * q.ldc + c] != dtl__f32_to_f8e4m3(x[r * cols + c]))
        fail_msg("%.9g (0x%08x): code 0x%02x, dtl__f32_to_f8e4m3 0x%02x", x[r * cols + c],
                 dtl__f32_to_bits(x[r * cols + c]), q.codes[r * q.ldc + c], dtl__f32_to_f8e4m3(x[r * cols + c]));
  }
  free(v), free(x), free(pk);
}

static void zero_and_tiny_blocks_take_amax_1e_4_so_their_scale_is_1e_4_over_448(void **state) {
  (void)state;
  const int64_t rows = 3, cols = 300;
  float *x = calloc((size_t)(rows * cols), sizeof(float));
  for (int64_t c = 0; c < cols; c++) x[1 * cols + c] = c % 2 ? -3e-5f : 2e-5f; /* below the margin */
  x[2 * cols + 200] = -0.0f;                                                    /* signed zero: code 0x80 */
  x[2 * cols + 5] = 7.0f;                                                       /* block 0 of row 2 not tiny */
  uint8_t *pk = malloc((size_t)rows * dtl__act_fp8_row_bytes(cols));
  dtl__act_fp8_rows q = dtl__act_fp8_packed(pk, rows, cols);
  assert_int_equal(dtl__act_fp8_quantize("test", x, DTL_FLOAT32, cols, 0, &q), DTL_OK);
  const float margin_scale = 1e-4f * (1.0f / 448.0f);
  for (int64_t b = 0; b < 3; b++) {
    assert_true(q.scales[0 * q.lds + b] == margin_scale);
    assert_true(q.scales[1 * q.lds + b] == margin_scale);
  }
  assert_true(q.scales[2 * q.lds + 0] == 7.0f * (1.0f / 448.0f));
  for (int64_t c = 0; c < cols; c++) {
    assert_int_equal(q.codes[0 * q.ldc + c], 0);
    assert_int_equal(q.codes[1 * q.ldc + c], dtl__f32_to_f8e4m3(x[1 * cols + c] * (448.0f / 1e-4f)));
  }
  assert_int_equal(q.codes[2 * q.ldc + 200], 0x80);
  assert_int_equal(q.codes[2 * q.ldc + 5], 0x7e); /* the block's maximum is 448 */
  float y[3 * 300];
  assert_int_equal(dtl__act_fp8_dequantize(&q, DTL_FLOAT32, y, cols), DTL_OK);
  for (int64_t c = 0; c < cols; c++) assert_true(y[c] == 0.0f);
  free(x), free(pk);
}

static void dequantize_is_code_times_scale_in_f32_rounded_once_to_the_dtype(void **state) {
  (void)state;
  /* Every code, NaN codes included, under a few scales; two rows of 256 columns plus a short third row. */
  const int64_t rows = 3, cols = 256;
  uint8_t codes[3 * 256];
  float scales[3 * 2] = {1.0f, 0.0625f, 3.1f, 1e-7f, 448.0f, 0.5f};
  for (int64_t i = 0; i < rows * cols; i++) codes[i] = (uint8_t)(i * 37 + i / 256);
  dtl__act_fp8_rows q = strided(codes, cols, scales, 2, rows, cols);
  for (int ti = 0; ti < 3; ti++) {
    dtl_dtype t = kTypes[ti];
    size_t es = dtl_dtype_size(t);
    char *y = malloc((size_t)(rows * (cols + 1)) * es), *want = malloc((size_t)(rows * (cols + 1)) * es);
    assert_int_equal(dtl__act_fp8_dequantize(&q, t, y, cols + 1), DTL_OK);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++) {
        size_t i = (size_t)(r * (cols + 1) + c);
        float v = dtl__f8e4m3_to_f32(codes[r * cols + c]) * scales[r * 2 + c / 128];
        ref_fp8_store(want, i, t, v);
        if (isnan(v)) assert_true(isnan(ref_fp8_load(y, i, t)));
        else if (memcmp(y + i * es, want + i * es, es))
          fail_msg("%s code 0x%02x scale %g: %.9g, want %.9g", dtl_dtype_name(t), codes[r * cols + c],
                   scales[r * 2 + c / 128], ref_fp8_load(y, i, t), ref_fp8_load(want, i, t));
      }
    free(y), free(want);
  }
}

/* |dequantize(quantize(x)) - x| <= 2^-4 |x| (half an ulp of e4m3's 3 mantissa bits) for results of e4m3's normal
 * range, <= 2^-10 scale (half its subnormal step) below it, plus the f32 roundings of x * s and code * scale. */
static void the_round_trip_error_is_within_half_an_e4m3_ulp(void **state) {
  (void)state;
  const int64_t rows = 64, cols = 515, nb = dtl__act_fp8_blocks(cols);
  float *x = random_rows(DTL_FLOAT32, rows, cols), *y = malloc(sizeof(float) * (size_t)(rows * cols));
  uint8_t *pk = malloc((size_t)rows * dtl__act_fp8_row_bytes(cols));
  dtl__act_fp8_rows q = dtl__act_fp8_packed(pk, rows, cols);
  assert_int_equal(dtl__act_fp8_quantize("test", x, DTL_FLOAT32, cols, 0, &q), DTL_OK);
  assert_int_equal(dtl__act_fp8_dequantize(&q, DTL_FLOAT32, y, cols), DTL_OK);
  double worst_rel = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      double s = q.scales[r * q.lds + c / 128], v = x[r * cols + c], e = fabs(y[r * cols + c] - v);
      double bound = ref_fp8_bound(v, s);
      if (!(e <= bound))
        fail_msg("row %lld column %lld: %.9g -> %.9g (error %.3g > %.3g)", (long long)r, (long long)c, v,
                 (double)y[r * cols + c], e, bound);
      if (fabs(v) >= 448.0 / 64 * s) worst_rel = fmax(worst_rel, e / fabs(v)); /* e4m3's normal range */
    }
  assert_true(worst_rel <= 0.0625 + 1e-6);
  print_message("max relative error in e4m3's normal range: %.4g (bound 2^-4); %lld blocks\n", worst_rel,
                (long long)(rows * nb));
  free(x), free(y), free(pk);
}

static void nan_or_infinity_is_refused_naming_the_row_and_column_and_later_rows_are_not_written(void **state) {
  (void)state;
  const int64_t rows = 4, cols = 200;
  const float bad[3] = {NAN, INFINITY, -INFINITY};
  const char *name[3] = {"nan", "inf", "-inf"};
  for (int ti = 0; ti < 3; ti++)
    for (int k = 0; k < 3; k++) {
      dtl_dtype t = kTypes[ti];
      void *x = random_rows(t, rows, cols);
      ref_fp8_store(x, (size_t)(2 * cols + 130), t, bad[k]);
      uint8_t *pk = malloc((size_t)rows * dtl__act_fp8_row_bytes(cols));
      size_t rb = dtl__act_fp8_row_bytes(cols);
      memset(pk, 0xa5, (size_t)rows * rb);
      dtl__act_fp8_rows q = dtl__act_fp8_packed(pk, rows, cols);
      assert_int_equal(dtl__act_fp8_quantize("dtl_f", x, t, cols, 10, &q), DTL_ERR_INVALID_ARGUMENT);
      char want[128];
      snprintf(want, sizeof want, "dtl_f: x row 12 column 130 is %s", name[k]);
      if (!strstr(dtl_last_error(), want)) fail_msg("message \"%s\" lacks \"%s\"", dtl_last_error(), want);
      for (size_t i = 3 * rb; i < 4 * rb; i++) assert_int_equal(pk[i], 0xa5);
      free(x), free(pk);
    }
}

static void bad_shapes_and_dtypes_are_refused_naming_the_argument(void **state) {
  (void)state;
  float x[256] = {0}, y[256];
  uint8_t pk[2 * 140];
  const struct {
    int64_t rows, cols, ldc, lds, ldx;
    dtl_dtype t;
    const char *says;
  } cases[] = {
      {1, 1, 8, 1, 1, DTL_FLOAT64, "dtype=f64"},   {1, 1, 8, 1, 1, DTL_INT32, "dtype=i32"},
      {1, 1, 8, 1, 1, DTL_FLOAT8_E4M3, "dtype=f8e4m3"},
      {-1, 1, 8, 1, 1, DTL_FLOAT32, "rows=-1"},    {1, 0, 8, 1, 1, DTL_FLOAT32, "cols=0"},
      {1, 129, 140, 2, 128, DTL_FLOAT32, "ldx=128"}, {1, 129, 128, 2, 129, DTL_FLOAT32, "ldc=128"},
      {1, 129, 140, 1, 129, DTL_FLOAT32, "lds=1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    dtl__act_fp8_rows q = strided(pk, cases[i].ldc, (float *)(pk + 132), cases[i].lds, cases[i].rows, cases[i].cols);
    memset(y, 0x5a, sizeof y);
    assert_int_equal(dtl__act_fp8_quantize("dtl_f", x, cases[i].t, cases[i].ldx, 0, &q), DTL_ERR_INVALID_ARGUMENT);
    if (!strstr(dtl_last_error(), cases[i].says)) fail_msg("\"%s\" lacks \"%s\"", dtl_last_error(), cases[i].says);
    assert_int_equal(dtl__act_fp8_dequantize(&q, cases[i].t, y, cases[i].ldx), DTL_ERR_INVALID_ARGUMENT);
    char says[32];
    snprintf(says, sizeof says, "%s", cases[i].says);
    if (!strncmp(says, "ldx", 3)) says[2] = 'y'; /* the dense side is y there */
    if (!strstr(dtl_last_error(), says)) fail_msg("\"%s\" lacks \"%s\"", dtl_last_error(), says);
    for (size_t j = 0; j < 256; j++) assert_int_equal(dtl__f32_to_bits(y[j]), 0x5a5a5a5au);
  }
  dtl__act_fp8_rows q = dtl__act_fp8_packed(pk, 2, 129);
  assert_int_equal(dtl__act_fp8_quantize("dtl_f", NULL, DTL_FLOAT32, 129, 0, &q), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "x=NULL"));
  assert_int_equal(dtl__act_fp8_dequantize(&q, DTL_FLOAT32, NULL, 129), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "y=NULL"));
  q.rows = 0;
  assert_int_equal(dtl__act_fp8_quantize("dtl_f", NULL, DTL_FLOAT32, 129, 0, &q), DTL_OK);
}

#if DTL_HAVE_NCCL
/* The device kernels' code (warp per block, shuffle maximum, cuda_fp8.h conversions) equals the host kernels. */
static void device_kernels_emulated_equal_the_host_kernels_bit_for_bit(void **state) {
  (void)state;
  for (int ti = 0; ti < 3; ti++)
    for (size_t ci = 0; ci < sizeof kCols / sizeof *kCols; ci++) {
      dtl_dtype t = kTypes[ti];
      const int64_t rows = 4, cols = kCols[ci];
      size_t rb = dtl__act_fp8_row_bytes(cols), es = dtl_dtype_size(t);
      void *x = random_rows(t, rows, cols);
      uint8_t *a = calloc(rows, rb), *b = calloc(rows, rb);
      dtl__act_fp8_rows qa = dtl__act_fp8_packed(a, rows, cols), qb = dtl__act_fp8_packed(b, rows, cols);
      assert_int_equal(dtl__act_fp8_quantize("test", x, t, cols, 0, &qa), DTL_OK);
      assert_int_equal(dtl__act_fp8_quantize_emulate(x, t, cols, &qb), DTL_OK);
      assert_memory_equal(a, b, (size_t)rows * rb);
      char *ya = malloc((size_t)(rows * cols) * es), *yb = malloc((size_t)(rows * cols) * es);
      assert_int_equal(dtl__act_fp8_dequantize(&qa, t, ya, cols), DTL_OK);
      assert_int_equal(dtl__act_fp8_dequantize_emulate(&qa, t, yb, cols), DTL_OK);
      assert_memory_equal(ya, yb, (size_t)(rows * cols) * es);
      free(x), free(a), free(b), free(ya), free(yb);
    }
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(packed_rows_hold_codes_padded_to_four_bytes_then_one_scale_per_128_columns),
      cmocka_unit_test(quantize_equals_the_reference_rule_bit_for_bit_on_both_sides_of_block_edges),
      cmocka_unit_test(every_rounding_boundary_rounds_to_nearest_even_as_dtl__f32_to_f8e4m3),
      cmocka_unit_test(zero_and_tiny_blocks_take_amax_1e_4_so_their_scale_is_1e_4_over_448),
      cmocka_unit_test(dequantize_is_code_times_scale_in_f32_rounded_once_to_the_dtype),
      cmocka_unit_test(the_round_trip_error_is_within_half_an_e4m3_ulp),
      cmocka_unit_test(nan_or_infinity_is_refused_naming_the_row_and_column_and_later_rows_are_not_written),
      cmocka_unit_test(bad_shapes_and_dtypes_are_refused_naming_the_argument),
#if DTL_HAVE_NCCL
      cmocka_unit_test(device_kernels_emulated_equal_the_host_kernels_bit_for_bit),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

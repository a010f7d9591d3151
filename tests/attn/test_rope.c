/* SPDX-License-Identifier: Apache-2.0 */
/* Rotary position embedding (src/attn/rope.h) against formulas written here in double precision: Hugging
 * Face's own expression of the neox layout (x * cos(emb) + rotate_half(x) * sin(emb) with emb = cat(freqs,
 * freqs) and rotate_half(x) = cat(-x2, x1)), hand-checked values that tell it from GPT-J's interleaved
 * layout, and a per-pair rotation; for the host half and, where dtl is built with CUDA, the device half's
 * code emulated on the host in f32, f16 and bf16. Positions reach long contexts, rows carry several heads
 * and padding columns that must stay untouched, and bad shapes are rejected with x untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "attn/rope.h"
#include "dtype_data.h"

/* Hugging Face's apply_rotary_pos_emb for one head x [D] at position p, literally, in double:
 *   inv_freq = 1 / theta^(arange(0, D, 2) / D); freqs = p * inv_freq; emb = cat(freqs, freqs)
 *   out = x * cos(emb) + rotate_half(x) * sin(emb),  rotate_half(x) = cat(-x[D/2:], x[:D/2]) */
static void hf_rope(const double *x, int64_t D, int64_t p, double theta, double *out) {
  double emb[1024], rot[1024];
  for (int64_t j = 0; j < D / 2; j++) emb[j] = emb[j + D / 2] = (double)p * (1.0 / pow(theta, (double)(2 * j) / D));
  for (int64_t j = 0; j < D; j++) rot[j] = j < D / 2 ? -x[j + D / 2] : x[j - D / 2];
  for (int64_t j = 0; j < D; j++) out[j] = x[j] * cos(emb[j]) + rot[j] * sin(emb[j]);
}

typedef struct {
  const char *what;
  int64_t rows, heads, D, pad, pos0;
  bool pos_array;
  float theta;
} rope_case;

static const rope_case kCases[] = {
    {"one head, D 2", 3, 1, 2, 0, 0, false, 10000.0f},
    {"q and k heads side by side (6 heads), D 8, padded rows", 5, 6, 8, 3, 0, false, 10000.0f},
    {"decode: one row at position 4095, D 64", 1, 4, 64, 0, 4095, false, 10000.0f},
    {"Llama 3 base 500000, D 128, rows 100..107", 8, 2, 128, 1, 100, false, 500000.0f},
    {"explicit positions (zigzag chunks of context parallelism)", 6, 3, 16, 2, 0, true, 10000.0f},
    {"empty", 0, 2, 4, 0, 0, false, 10000.0f},
};
#define NCASES (sizeof kCases / sizeof kCases[0])

static const int64_t kZigzag[] = {0, 1, 14, 15, 7, 8};

static dtl__rope_shape shape_of(const rope_case *c) {
  return (dtl__rope_shape){.rows = c->rows, .heads = c->heads, .head_dim = c->D, .ld = c->heads * c->D + c->pad,
                           .pos = c->pos_array ? kZigzag : NULL, .pos0 = c->pos0, .theta = c->theta};
}

/* got (the turned x of storage type t) against hf_rope of the input x (f32 values, already rounded to t):
 * within the f32 angle's error (HF computes the angle in f32 too: a few ulps of p * inv_freq, times the
 * pair's magnitude), plus one rounding to t; padding columns equal to the input bit for bit. */
static void check(const rope_case *c, const float *x, const void *got, dtl_dtype t, const char *what) {
  dtl__rope_shape s = shape_of(c);
  double in[1024], want[1024];
  for (int64_t r = 0; r < c->rows; r++) {
    int64_t p = dtl__rope_pos(&s, r);
    double ang_err = 4.0 * 6e-8 * fabs((double)p) + 1e-6;
    for (int64_t h = 0; h < c->heads; h++) {
      for (int64_t j = 0; j < c->D; j++) in[j] = x[r * s.ld + h * c->D + j];
      hf_rope(in, c->D, p, c->theta, want);
      for (int64_t j = 0; j < c->D; j++) {
        double mag = fabs(in[j]) + fabs(in[(j + c->D / 2) % c->D]);
        double g = t_load(got, (size_t)(r * s.ld + h * c->D + j), t), tol = mag * ang_err + t_half_unit(t) * fabs(want[j]);
        if (!(fabs(g - want[j]) <= tol))
          fail_msg("%s, %s %s: row %lld (position %lld) head %lld element %lld is %.9g, Hugging Face's formula "
                   "%.9g (tolerance %.3g)", c->what, what, dtl_dtype_name(t), (long long)r, (long long)p,
                   (long long)h, (long long)j, g, want[j], tol);
      }
    }
    for (int64_t j = c->heads * c->D; j < s.ld; j++) {
      float g = t_load(got, (size_t)(r * s.ld + j), t), w = x[r * s.ld + j];
      if (memcmp(&g, &w, sizeof g)) fail_msg("%s, %s: padding column %lld of row %lld changed", c->what, what,
                                             (long long)j, (long long)r);
    }
  }
}

static void host_rope_matches_hugging_face_formula(void **state) {
  (void)state;
  for (size_t i = 0; i < NCASES; i++) {
    const rope_case *c = &kCases[i];
    dtl__rope_shape s = shape_of(c);
    size_t n = (size_t)(c->rows * s.ld);
    float *x = t_rand_reals(n, 2.0f, DTL_FLOAT32), *y = malloc(n * sizeof(float) + 4);
    memcpy(y, x, n * sizeof(float));
    assert_int_equal(dtl__rope_host(&s, y), DTL_OK);
    check(c, x, y, DTL_FLOAT32, "host");
    free(x), free(y);
  }
}

/* The layout itself, by hand: D = 4, theta = 10000, so inv_freq = (1, 1/100). Element 0 pairs with element
 * 2 and element 1 with element 3 (neox rotate half); GPT-J's interleaved layout would pair 0 with 1. Position
 * 0 is the identity, bit for bit. */
static void rope_pairs_element_i_with_i_plus_half_the_head(void **state) {
  (void)state;
  float x[8] = {1, 0, 0, 0, 1, 2, 3, 4};
  dtl__rope_shape s = {.rows = 1, .heads = 2, .head_dim = 4, .ld = 8, .pos0 = 1, .theta = 10000.0f};
  assert_int_equal(dtl__rope_host(&s, x), DTL_OK);
  double c1 = cos(1.0), s1 = sin(1.0), c2 = cos(0.01), s2 = sin(0.01);
  double want[8] = {c1, 0, s1, 0, /* (1, 0, 0, 0): its first element turns into the third, not the second */
                    1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2};
  for (int j = 0; j < 8; j++) assert_true(fabs(x[j] - want[j]) <= 1e-6);
  float y[4] = {0.5f, -1.25f, 3.0f, 1e-3f}, y0[4];
  memcpy(y0, y, sizeof y);
  dtl__rope_shape z = {.rows = 1, .heads = 1, .head_dim = 4, .ld = 4, .pos0 = 0, .theta = 10000.0f};
  assert_int_equal(dtl__rope_host(&z, y), DTL_OK);
  assert_memory_equal(y, y0, sizeof y);
}

static void rope_rejects_an_odd_head_dim_a_narrow_row_and_a_bad_theta(void **state) {
  (void)state;
  float x[12], x0[12];
  for (int i = 0; i < 12; i++) x[i] = x0[i] = (float)i;
  dtl__rope_shape bad[] = {
      {.rows = 1, .heads = 1, .head_dim = 3, .ld = 12, .theta = 10000.0f},
      {.rows = 1, .heads = 1, .head_dim = 0, .ld = 12, .theta = 10000.0f},
      {.rows = 1, .heads = 2, .head_dim = 8, .ld = 12, .theta = 10000.0f},
      {.rows = -1, .heads = 1, .head_dim = 4, .ld = 12, .theta = 10000.0f},
      {.rows = 1, .heads = 1, .head_dim = 4, .ld = 12, .theta = 0.0f},
      {.rows = 1, .heads = 1, .head_dim = 4, .ld = 12, .theta = NAN},
  };
  const char *field[] = {"head_dim=3", "head_dim=0", "ld=12", "rows=-1", "theta=0", "theta=nan"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(dtl__rope_host(&bad[i], x), DTL_ERR_INTERNAL);
    if (!strstr(dtl_last_error(), field[i])) fail_msg("message '%s' lacks '%s'", dtl_last_error(), field[i]);
#if DTL_HAVE_NCCL
    assert_int_equal(dtl__rope_emulate(&bad[i], x, DTL_FLOAT32), DTL_ERR_INTERNAL);
#endif
    assert_memory_equal(x, x0, sizeof x);
  }
}

#if DTL_HAVE_NCCL
static void emulated_kernel_matches_hugging_face_formula_in_every_storage_type(void **state) {
  (void)state;
  const dtl_dtype types[] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};
  for (size_t ti = 0; ti < 3; ti++)
    for (size_t i = 0; i < NCASES; i++) {
      const rope_case *c = &kCases[i];
      dtl_dtype t = types[ti];
      dtl__rope_shape s = shape_of(c);
      size_t n = (size_t)(c->rows * s.ld);
      float *x = t_rand_reals(n, 2.0f, t);
      void *y = t_pack(x, n, t);
      assert_int_equal(dtl__rope_emulate(&s, y, t), DTL_OK);
      check(c, x, y, t, "emulated kernel");
      free(x), free(y);
    }
  float x[4] = {1, 2, 3, 4};
  dtl__rope_shape s = {.rows = 1, .heads = 1, .head_dim = 4, .ld = 4, .theta = 10000.0f};
  assert_int_equal(dtl__rope_emulate(&s, x, DTL_INT32), DTL_ERR_UNSUPPORTED);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(host_rope_matches_hugging_face_formula),
      cmocka_unit_test(rope_pairs_element_i_with_i_plus_half_the_head),
      cmocka_unit_test(rope_rejects_an_odd_head_dim_a_narrow_row_and_a_bad_theta),
#if DTL_HAVE_NCCL
      cmocka_unit_test(emulated_kernel_matches_hugging_face_formula_in_every_storage_type),
#endif
  };
  return cmocka_run_group_tests_name("rotary position embedding", tests, NULL, NULL);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* DeepEP's FP8 activation rule restated plainly, for the tests of the kernels (tests/quant) and of the paths that
 * use them (FP8 dispatch in tests/moe, the FP8 sequence gather in tests/tp): per row and 128-column block,
 * amax = max(max |x|, 1e-4), code = dtl__f32_to_f8e4m3(x * (448 / amax)), scale = amax * (1 / 448), and back
 * code * scale; by loops over the elements, independent of the kernels' vectorized code. Also the test data: real
 * values over many binades (so that blocks of one row have very different scales) and its error bound. */
#ifndef DTL_TESTS_ACT_FP8_REF_H
#define DTL_TESTS_ACT_FP8_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "common/half.h"
#include "dtl/types.h"

static inline float ref_fp8_load(const void *x, size_t i, dtl_dtype t) {
  if (t == DTL_FLOAT32) return ((const float *)x)[i];
  uint16_t h = ((const uint16_t *)x)[i];
  return t == DTL_BFLOAT16 ? dtl__bf16_to_f32(h) : dtl__f16_to_f32(h);
}

static inline void ref_fp8_store(void *y, size_t i, dtl_dtype t, float v) {
  if (t == DTL_FLOAT32) ((float *)y)[i] = v;
  else ((uint16_t *)y)[i] = t == DTL_BFLOAT16 ? dtl__f32_to_bf16(v) : dtl__f32_to_f16(v);
}

static inline int64_t ref_fp8_blocks(int64_t cols) { return (cols + 127) / 128; }

/* x [rows, cols] (row stride ldx elements of t) -> codes [rows, cols], scales [rows, ceil(cols / 128)]. */
static inline void ref_fp8_quantize(const void *x, dtl_dtype t, int64_t rows, int64_t cols, int64_t ldx, uint8_t *codes,
                                    float *scales) {
  int64_t nb = ref_fp8_blocks(cols);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < nb; b++) {
      int64_t c1 = (b + 1) * 128 < cols ? (b + 1) * 128 : cols;
      float amax = 0;
      for (int64_t c = b * 128; c < c1; c++) amax = fmaxf(amax, fabsf(ref_fp8_load(x, (size_t)(r * ldx + c), t)));
      amax = fmaxf(amax, 1e-4f);
      float s = 448.0f / amax;
      for (int64_t c = b * 128; c < c1; c++)
        codes[r * cols + c] = dtl__f32_to_f8e4m3(ref_fp8_load(x, (size_t)(r * ldx + c), t) * s);
      scales[r * nb + b] = amax * (1.0f / 448.0f);
    }
}

/* codes and scales as above -> y [rows, cols] of t: code * scale in f32, rounded once to t. */
static inline void ref_fp8_dequantize(const uint8_t *codes, const float *scales, int64_t rows, int64_t cols,
                                      dtl_dtype t, void *y) {
  int64_t nb = ref_fp8_blocks(cols);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      ref_fp8_store(y, (size_t)(r * cols + c), t, dtl__f8e4m3_to_f32(codes[r * cols + c]) * scales[r * nb + c / 128]);
}

/* y = dequantize(quantize(x)), both [rows, cols] of t, packed; scales (optional: NULL) gets the scales. */
static inline void ref_fp8_round_trip(const void *x, dtl_dtype t, int64_t rows, int64_t cols, void *y, float *scales) {
  size_t n = (size_t)(rows * cols) + 1, nb = (size_t)(rows * ref_fp8_blocks(cols)) + 1;
  uint8_t *codes = malloc(n);
  float *s = scales ? scales : malloc(sizeof(float) * nb);
  ref_fp8_quantize(x, t, rows, cols, cols, codes, s);
  ref_fp8_dequantize(codes, s, rows, cols, t, y);
  free(codes);
  if (!scales) free(s);
}

/* Value i of a stream from seed: magnitudes over 2^-16..2^8 that change from one 128-column block to the next,
 * both signs, some exact zeros. */
static inline float ref_fp8_value(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
  z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
  z ^= z >> 29;
  if (z % 19 == 0) return 0.0f;
  int e = (int)((z >> 8) % 12) - 8 - (int)((i / 128) % 3) * 4;
  float m = 0.5f + (float)((z >> 20) % 1000003) / 1000003.0f;
  return ldexpf(m, e) * ((z >> 40) & 1 ? -1.0f : 1.0f);
}

/* The bound of one element of a round trip: half an ulp of e4m3's 3 mantissa bits (2^-4 relative) in its normal
 * range, half its subnormal step (2^-10 scale) below it, and the f32 roundings of x * s and code * scale. */
static inline double ref_fp8_bound(double x, double scale) {
  return ldexp(fabs(x), -4) + ldexp(scale, -10) + ldexp(fabs(x), -21);
}

#endif

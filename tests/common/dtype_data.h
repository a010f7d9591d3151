/* SPDX-License-Identifier: Apache-2.0 */
/* Test data in a storage dtype (f32, f16, bf16): reading and writing elements as f32, packing f32 data into
 * the type, rounding f32 data to the values the type holds (so that an f32 computation sees exactly what a
 * half-typed one sees), the error of one rounding, and deterministic random data. For the kernel tests of
 * every area. */
#ifndef DTL_TESTS_DTYPE_DATA_H
#define DTL_TESTS_DTYPE_DATA_H

#include <stdint.h>
#include <stdlib.h>
#include "common/half.h"
#include "dtl.h"

/* Half an ulp of t relative to the value: the error of one rounding to nearest even. 0 for f32. */
static inline double t_half_unit(dtl_dtype t) {
  return t == DTL_FLOAT16 ? 1.0 / 2048.0 : t == DTL_BFLOAT16 ? 1.0 / 256.0 : 0.0;
}

/* p[i] as a value of t. */
static inline float t_load(const void *p, size_t i, dtl_dtype t) {
  if (t == DTL_FLOAT16) return dtl__f16_to_f32(((const uint16_t *)p)[i]);
  if (t == DTL_BFLOAT16) return dtl__bf16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}
static inline void t_store(void *p, size_t i, float v, dtl_dtype t) {
  if (t == DTL_FLOAT16) ((uint16_t *)p)[i] = dtl__f32_to_f16(v);
  else if (t == DTL_BFLOAT16) ((uint16_t *)p)[i] = dtl__f32_to_bf16(v);
  else ((float *)p)[i] = v;
}

/* A new array of n elements of t holding src rounded to t (malloc; NULL src gives NULL). */
static inline void *t_pack(const float *src, size_t n, dtl_dtype t) {
  if (!src) return NULL;
  void *p = malloc(n * dtl_dtype_size(t) + 4);
  for (size_t i = 0; i < n; i++) t_store(p, i, src[i], t);
  return p;
}
/* In place: every value of v becomes the f32 value of its rounding to t. */
static inline void t_round(float *v, size_t n, dtl_dtype t) {
  for (size_t i = 0; v && i < n; i++) {
    unsigned char tmp[4];
    t_store(tmp, 0, v[i], t);
    v[i] = t_load(tmp, 0, t);
  }
}

/* A deterministic generator (splitmix64) for test data; each test program has its own state. */
static uint64_t t_rand_state;
static inline uint64_t t_rand(void) {
  uint64_t z = (t_rand_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* A new array (malloc) of n reals in [-r, r), rounded to t. */
static inline float *t_rand_reals(size_t n, float r, dtl_dtype t) {
  float *p = malloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) p[i] = r * (2.0f * (float)(t_rand() >> 40) / 16777216.0f - 1.0f);
  t_round(p, n, t);
  return p;
}

/* Element i of an array of any dtype, written from and read as a double (integer-valued data in the range
 * of the dtype is exact in all of them, except the 8-bit floats, which hold the integers up to 16 (e4m3) or 8
 * (e5m2) exactly and round others to nearest even, saturating e4m3 at 448). */
static inline void t_put(dtl_dtype t, void *p, size_t i, double v) {
  switch (t) {
    case DTL_FLOAT32: ((float *)p)[i] = (float)v; break;
    case DTL_FLOAT64: ((double *)p)[i] = v; break;
    case DTL_FLOAT16: ((uint16_t *)p)[i] = dtl__f32_to_f16((float)v); break;
    case DTL_BFLOAT16: ((uint16_t *)p)[i] = dtl__f32_to_bf16((float)v); break;
    case DTL_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
    case DTL_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case DTL_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DTL_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    case DTL_FLOAT8_E4M3: ((uint8_t *)p)[i] = dtl__f32_to_f8e4m3((float)v); break;
    case DTL_FLOAT8_E5M2: ((uint8_t *)p)[i] = dtl__f32_to_f8e5m2((float)v); break;
  }
}
static inline double t_get(dtl_dtype t, const void *p, size_t i) {
  switch (t) {
    case DTL_FLOAT32: return ((const float *)p)[i];
    case DTL_FLOAT64: return ((const double *)p)[i];
    case DTL_FLOAT16: return dtl__f16_to_f32(((const uint16_t *)p)[i]);
    case DTL_BFLOAT16: return dtl__bf16_to_f32(((const uint16_t *)p)[i]);
    case DTL_INT8: return ((const int8_t *)p)[i];
    case DTL_UINT8: return ((const uint8_t *)p)[i];
    case DTL_INT32: return ((const int32_t *)p)[i];
    case DTL_INT64: return (double)((const int64_t *)p)[i];
    case DTL_FLOAT8_E4M3: return dtl__f8e4m3_to_f32(((const uint8_t *)p)[i]);
    case DTL_FLOAT8_E5M2: return dtl__f8e5m2_to_f32(((const uint8_t *)p)[i]);
  }
  return 0;
}

#endif

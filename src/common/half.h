/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. Bit-exact f16 and bf16 conversions (round to nearest even, overflow to
 * infinity), so host code never depends on a compiler's _Float16 support. Every non-NaN f16/bf16 value
 * round-trips through f32 unchanged; a NaN stays a NaN of the same sign and payload, made quiet (as the
 * hardware conversions do). */
#ifndef DTL_HALF_H
#define DTL_HALF_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static inline float dtl__bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t dtl__f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float dtl__bf16_to_f32(uint16_t h) { return dtl__bits_to_f32((uint32_t)h << 16); }
static inline uint16_t dtl__f32_to_bf16(float f) {
  uint32_t u = dtl__f32_to_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float dtl__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return dtl__bits_to_f32(sign);
    float v = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24 */
    return sign ? -v : v;
  }
  if (exp == 31) return dtl__bits_to_f32(sign | 0x7f800000u | (man << 13));
  return dtl__bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t dtl__f32_to_f16(float f) {
  uint32_t u = dtl__f32_to_bits(f), sign = (u >> 16) & 0x8000u;
  int32_t exp = (int32_t)((u >> 23) & 0xffu);
  uint32_t man = u & 0x7fffffu;
  if (exp == 255) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
  int32_t e = exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    man |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - e);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1u), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;
  return (uint16_t)half;
}

/* The 8-bit floats: a finite f32 rounds to nearest even on the target's grid of m mantissa bits and exponent bias
 * `bias` (subnormals included); the caller handles NaN, infinity and overflow past the largest code `max_code`.
 * Returns the magnitude's code, or max_code + 1 when the rounded value is beyond max_code. */
static inline uint32_t dtl__f8_round(uint32_t mag, int m, int bias, uint32_t max_code) {
  int32_t exp = (int32_t)(mag >> 23) - 127 + bias;
  uint32_t man = mag & 0x7fffffu, q, rem, half;
  int shift;
  if ((mag >> 23) == 0) return 0; /* f32 zero and subnormals are far below the smallest 8-bit subnormal */
  if (exp > 0) {
    shift = 23 - m;
    q = ((uint32_t)exp << m) | (man >> shift);
  } else {
    shift = 23 - m + 1 - exp;
    if (shift > 24) return 0; /* below half the smallest subnormal */
    man |= 0x800000u;
    q = man >> shift;
  }
  rem = man & ((1u << shift) - 1u);
  half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++; /* a carry moves into the exponent, as it should */
  return q > max_code ? max_code + 1 : q;
}

static inline uint8_t dtl__f32_to_f8e4m3(float f) {
  uint32_t u = dtl__f32_to_bits(f), sign = (u >> 24) & 0x80u, mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return (uint8_t)(sign | 0x7fu); /* NaN */
  uint32_t q = mag == 0x7f800000u ? 0x7fu : dtl__f8_round(mag, 3, 7, 0x7eu);
  return (uint8_t)(sign | (q > 0x7eu ? 0x7eu : q)); /* saturate to 448, as torch does */
}

static inline float dtl__f8e4m3_to_f32(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, exp = (c >> 3) & 0xfu, man = c & 7u;
  if ((c & 0x7fu) == 0x7fu) return dtl__bits_to_f32(sign | 0x7fc00000u);
  if (exp == 0) {
    float v = (float)man * (1.0f / 512.0f); /* subnormal: man * 2^-9 */
    return dtl__bits_to_f32(dtl__f32_to_bits(v) | sign);
  }
  return dtl__bits_to_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

static inline uint8_t dtl__f32_to_f8e5m2(float f) {
  uint32_t u = dtl__f32_to_bits(f), sign = (u >> 24) & 0x80u, mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return (uint8_t)(sign | 0x7eu | ((mag >> 21) & 1u)); /* NaN, made quiet */
  if (mag == 0x7f800000u) return (uint8_t)(sign | 0x7cu);
  uint32_t q = dtl__f8_round(mag, 2, 15, 0x7bu);
  return (uint8_t)(sign | (q > 0x7bu ? 0x7cu : q)); /* overflow to infinity */
}

static inline float dtl__f8e5m2_to_f32(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, exp = (c >> 2) & 0x1fu, man = c & 3u;
  if (exp == 31) return dtl__bits_to_f32(sign | 0x7f800000u | (man << 21) | (man ? 0x400000u : 0u));
  if (exp == 0) {
    float v = (float)man * (1.0f / 65536.0f); /* subnormal: man * 2^-16 */
    return dtl__bits_to_f32(dtl__f32_to_bits(v) | sign);
  }
  return dtl__bits_to_f32(sign | ((exp + 112u) << 23) | (man << 21));
}

/* The value order of the 8-bit floats without converting them: a code is a sign and a magnitude, and the magnitude
 * codes ascend with the value (e5m2's infinity included), so x > y as values exactly when neither is a NaN and
 * dtl__f8_order(x) > dtl__f8_order(y) (-0 and +0 are equal). What max and min of them compare with. */
static inline int dtl__f8_order(uint8_t c) { return c & 0x80 ? -(int)(c & 0x7f) : (int)(c & 0x7f); }
static inline bool dtl__f8e4m3_isnan(uint8_t c) { return (c & 0x7f) == 0x7f; }
static inline bool dtl__f8e5m2_isnan(uint8_t c) { return (c & 0x7f) > 0x7c; }
/* (& rather than &&: no branches in the reduction loops) */
static inline bool dtl__f8e4m3_gt(uint8_t x, uint8_t y) {
  return (int)!dtl__f8e4m3_isnan(x) & (int)!dtl__f8e4m3_isnan(y) & (int)(dtl__f8_order(x) > dtl__f8_order(y));
}
static inline bool dtl__f8e5m2_gt(uint8_t x, uint8_t y) {
  return (int)!dtl__f8e5m2_isnan(x) & (int)!dtl__f8e5m2_isnan(y) & (int)(dtl__f8_order(x) > dtl__f8_order(y));
}

#endif

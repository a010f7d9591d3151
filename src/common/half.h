/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. Bit-exact f16 and bf16 conversions (round to nearest even, overflow to
 * infinity), so host code never depends on a compiler's _Float16 support. Every non-NaN f16/bf16 value
 * round-trips through f32 unchanged; a NaN stays a NaN of the same sign and payload, made quiet (as the
 * hardware conversions do). */
#ifndef DTL_HALF_H
#define DTL_HALF_H

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

#endif

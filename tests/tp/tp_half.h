/* SPDX-License-Identifier: Apache-2.0 */
/* What the TP tests of f16/bf16 compute share: packing f32 test data into a storage type and back, and the
 * tolerance of a block run with that storage against the f32 host path on the same (rounded) inputs.
 *
 * The tolerance. Both sides read identical inputs; they differ by the roundings the half-typed side makes
 * to its stored intermediates (the GEMM outputs, the activation or attention output, the row-parallel
 * partial, the output after the bias: at most 5 of them on a path, each within a relative u = half an ulp,
 * 2^-11 for f16 and 2^-8 for bf16) and by f32 reordering (1e-5 relative, the host path's own tolerance
 * against its double oracle). A rounding of an intermediate of size m moves the output by at most u m times
 * the gain of what follows, which for the test data (|x| <= 1, |w| <= 0.5, at most a dozen terms per dot)
 * stays near 1, so 5 roundings bound the error by about 5 u (1 + max |y|). The bound used is 8 u (1 + max
 * |y|) (0.4% for f16, 3% for bf16): far below the O(1) error of a wrong index. test_tp_kernels.c checks on
 * the host that the MLP and attention pipelines rounded this way stay within it for the test shapes, and
 * prints how much of it they use (about 1 u). */
#ifndef DTL_TP_HALF_H
#define DTL_TP_HALF_H

#include <stdint.h>
#include <stdlib.h>
#include "common/half.h"
#include "dtl.h"

/* Half an ulp of t relative to the value: the error of one rounding to nearest even. 0 for f32. */
static inline double t_half_unit(dtl_dtype t) {
  return t == DTL_FLOAT16 ? 1.0 / 2048.0 : t == DTL_BFLOAT16 ? 1.0 / 256.0 : 0.0;
}

/* The tolerance of a block output of t storage against the f32 host path, given max |host output|. */
static inline double t_block_tol(dtl_dtype t, double ref_max) {
  return (1e-5 + 8.0 * t_half_unit(t)) * (1.0 + ref_max);
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
/* In place: every value of v becomes the f32 value of its rounding to t, so that an f32 computation sees
 * exactly the inputs a t computation sees. */
static inline void t_round(float *v, size_t n, dtl_dtype t) {
  for (size_t i = 0; v && i < n; i++) {
    unsigned char tmp[4];
    t_store(tmp, 0, v[i], t);
    v[i] = t_load(tmp, 0, t);
  }
}

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* The host half of the attention-state operations (state.h): merge, lse combine and rescale as loops over
 * host memory, in f32, f16 or bf16 storage with f32 arithmetic. f32 takes a plain loop the compiler can keep
 * in registers; the half types convert element by element with the bit-exact conversions of half.h. */
#include "attn/state.h"
#include "common/half.h"

static float dtl__state_load(const void *p, int64_t i, dtl_dtype t) {
  switch (t) {
    case DTL_FLOAT16: return dtl__f16_to_f32(((const uint16_t *)p)[i]);
    case DTL_BFLOAT16: return dtl__bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
  }
}
static void dtl__state_store(void *p, int64_t i, float v, dtl_dtype t) {
  switch (t) {
    case DTL_FLOAT16: ((uint16_t *)p)[i] = dtl__f32_to_f16(v); break;
    case DTL_BFLOAT16: ((uint16_t *)p)[i] = dtl__f32_to_bf16(v); break;
    default: ((float *)p)[i] = v; break;
  }
}

static dtl_status dtl__state_check_type(const char *fn, dtl_dtype t) {
  if (t == DTL_FLOAT32 || t == DTL_FLOAT16 || t == DTL_BFLOAT16) return DTL_OK;
  return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "dtype=%s (expected f32, f16 or bf16)",
                       dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
}

/* Blocks of 8 with a fixed inner trip count, which GCC's -O2 vectoriser takes (a loop of unknown length that
 * would need a scalar epilogue it leaves alone). */
#define DTL__STATE_LANES 8

/* a = wa a + wb b over n f32 values (a and b do not overlap). */
static void dtl__state_blend_f32(float *restrict a, const float *restrict b, float wa, float wb, int64_t n) {
  int64_t d = 0;
  for (; d + DTL__STATE_LANES <= n; d += DTL__STATE_LANES)
    for (int l = 0; l < DTL__STATE_LANES; l++) a[d + l] = wa * a[d + l] + wb * b[d + l];
  for (; d < n; d++) a[d] = wa * a[d] + wb * b[d];
}

/* o = w s over n f32 values. */
static void dtl__state_scale_f32(float *restrict o, const float *restrict s, float w, int64_t n) {
  int64_t d = 0;
  for (; d + DTL__STATE_LANES <= n; d += DTL__STATE_LANES)
    for (int l = 0; l < DTL__STATE_LANES; l++) o[d + l] = w * s[d + l];
  for (; d < n; d++) o[d] = w * s[d];
}

dtl_status dtl__attn_merge_host(int64_t rows, int64_t H, int64_t D, void *o_a, int64_t lda, float *lse_a,
                                const void *o_b, int64_t ldb, const float *lse_b, dtl_dtype t) {
  DTL_TRY(dtl__state_check_type("dtl__attn_merge_host", t));
  size_t es = dtl_dtype_size(t);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t h = 0; h < H; h++) {
      float wa, wb;
      float l = dtl__attn_merge_weights(lse_a[i * H + h], lse_b[i * H + h], &wa, &wb);
      lse_a[i * H + h] = l;
      if (wb == 0.0f) continue; /* b is empty (or negligible): a keeps its bits */
      char *a = (char *)o_a + (size_t)(i * lda + h * D) * es;
      const char *b = (const char *)o_b + (size_t)(i * ldb + h * D) * es;
      if (wa == 0.0f) {
        memcpy(a, b, (size_t)D * es);
      } else if (t == DTL_FLOAT32) {
        dtl__state_blend_f32((float *)a, (const float *)b, wa, wb, D);
      } else {
        for (int64_t d = 0; d < D; d++)
          dtl__state_store(a, d, wa * dtl__state_load(a, d, t) + wb * dtl__state_load(b, d, t), t);
      }
    }
  return DTL_OK;
}

dtl_status dtl__attn_combine_host(int64_t n, int p, const float *lse, int64_t stride, float *L) {
  for (int64_t i = 0; i < n; i++) L[i] = dtl__attn_lse_combine(lse + i, p, stride);
  return DTL_OK;
}

dtl_status dtl__attn_rescale_host(int64_t rows, int64_t H, int64_t D, const void *src, int64_t lds, bool src_f32,
                                  const float *lse, const float *L, void *dst, int64_t ldd, dtl_dtype t) {
  DTL_TRY(dtl__state_check_type("dtl__attn_rescale_host", t));
  dtl_dtype ts = src_f32 ? DTL_FLOAT32 : t;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t h = 0; h < H; h++) {
      float w = dtl__attn_rescale_weight(lse[i * H + h], L[i * H + h]);
      int64_t s0 = i * lds + h * D, d0 = i * ldd + h * D;
      if (w == 0.0f) { /* an empty state contributes exact zeros, whatever its o holds */
        for (int64_t d = 0; d < D; d++) dtl__state_store(dst, d0 + d, 0.0f, t);
      } else if (ts == DTL_FLOAT32 && t == DTL_FLOAT32) {
        const float *x = (const float *)src + s0;
        float *o = (float *)dst + d0;
        if (x != o) dtl__state_scale_f32(o, x, w, D);
        else
          for (int64_t d = 0; d < D; d++) o[d] *= w;
      } else {
        for (int64_t d = 0; d < D; d++) dtl__state_store(dst, d0 + d, w * dtl__state_load(src, s0 + d, ts), t);
      }
    }
  return DTL_OK;
}

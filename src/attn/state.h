/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. Attention states and their merge: a partial attention result over one set of
 * keys is o [rows, H, D] (normalised over those keys) plus lse [rows, H] (f32, the natural log of the softmax
 * denominator, max included; -inf for a state that saw no key). Two states over disjoint keys merge exactly
 * by their lse; p of them (one per rank) by the log-sum-exp of all their lse. Host loops (state.c) and CUDA
 * kernels (state.cu, with host emulations for tests) share the per-state arithmetic below, so the weights
 * are the same numbers on both sides. No allocation. */
#ifndef DTL_ATTN_STATE_H
#define DTL_ATTN_STATE_H

#include "compute/math.h"
#include "common/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The merge of state a (lse la) and state b (lb): returns the merged lse and the weights of a and b. An
 * empty side (-inf) weighs exactly nothing and the other exactly 1, so merging with an empty state is the
 * identity and two empty states stay empty (-inf) with no -inf - -inf ever formed. Symmetric: swapping a
 * and b swaps the weights and gives the same lse bit for bit. lse values are finite or -inf. */
static DTL_HD inline float dtl__attn_merge_weights(float la, float lb, float *wa, float *wb) {
  if (lb == -INFINITY) {
    *wa = 1.0f, *wb = 0.0f;
    return la;
  }
  if (la == -INFINITY) {
    *wa = 0.0f, *wb = 1.0f;
    return lb;
  }
  /* The larger side's exponential is exactly 1: one exp, one log1p, one division. */
  float d = la - lb, e = expf(-fabsf(d)), inv = 1.0f / (1.0f + e);
  *wa = d >= 0.0f ? inv : e * inv;
  *wb = d >= 0.0f ? e * inv : inv;
  return (d >= 0.0f ? la : lb) + log1pf(e);
}

/* log sum_r exp(l[r * stride]) over r < p: -inf when every term is -inf. */
static DTL_HD inline float dtl__attn_lse_combine(const float *l, int p, int64_t stride) {
  float m = -INFINITY, s = 0.0f;
  for (int r = 0; r < p; r++) m = fmaxf(m, l[r * stride]);
  if (m == -INFINITY) return -INFINITY;
  for (int r = 0; r < p; r++) s += expf(l[r * stride] - m);
  return m + logf(s);
}

/* The weight of a state with lse l in a merge whose combined lse is L: exactly 1 when l == L (so rescaling a
 * state by its own lse copies it), 0 for an empty state or an empty merge. */
static DTL_HD inline float dtl__attn_rescale_weight(float l, float L) {
  return l == -INFINITY || L == -INFINITY ? 0.0f : expf(l - L);
}

/* The three operations, each on host memory (_host, the calling thread), device memory (_cuda, enqueued on
 * stream, a cudaStream_t) or host memory through the device code (_emulate, for tests). o arrays have dtype
 * t (f32, f16 or bf16; the host forms take the same three) and row strides in elements (a row holds the H
 * states of one token, H * D elements from column 0); lse arrays are f32, packed [rows, H]. Arithmetic is
 * f32 with one rounding to t on store.
 *
 * merge:   a <- merge(a, b), in place: lse_a and o_a get the merged state; b is only read. A state whose b
 *          side is empty keeps a's o bits; one whose a side is empty gets b's o.
 * combine: L[i] = dtl__attn_lse_combine(lse + i, p, stride) for i < n (p states of n values each, state r
 *          at lse + r * stride).
 * rescale: dst[i, h, :] = w * src[i, h, :] with w = dtl__attn_rescale_weight(lse[i, h], L[i, h]) (+0 where
 *          w is 0, whatever src holds); src is f32 when src_f32, else t; dst is t. dst may be src (same type
 *          and stride). */
dtl_status dtl__attn_merge_host(int64_t rows, int64_t H, int64_t D, void *o_a, int64_t lda, float *lse_a,
                                const void *o_b, int64_t ldb, const float *lse_b, dtl_dtype t);
dtl_status dtl__attn_combine_host(int64_t n, int p, const float *lse, int64_t stride, float *L);
dtl_status dtl__attn_rescale_host(int64_t rows, int64_t H, int64_t D, const void *src, int64_t lds, bool src_f32,
                                  const float *lse, const float *L, void *dst, int64_t ldd, dtl_dtype t);
#if DTL_HAVE_NCCL
dtl_status dtl__attn_merge_cuda(int64_t rows, int64_t H, int64_t D, void *o_a, int64_t lda, float *lse_a,
                                const void *o_b, int64_t ldb, const float *lse_b, dtl_dtype t, void *stream);
dtl_status dtl__attn_combine_cuda(int64_t n, int p, const float *lse, int64_t stride, float *L, void *stream);
dtl_status dtl__attn_rescale_cuda(int64_t rows, int64_t H, int64_t D, const void *src, int64_t lds, bool src_f32,
                                  const float *lse, const float *L, void *dst, int64_t ldd, dtl_dtype t,
                                  void *stream);
dtl_status dtl__attn_merge_emulate(int64_t rows, int64_t H, int64_t D, void *o_a, int64_t lda, float *lse_a,
                                   const void *o_b, int64_t ldb, const float *lse_b, dtl_dtype t);
dtl_status dtl__attn_combine_emulate(int64_t n, int p, const float *lse, int64_t stride, float *L);
dtl_status dtl__attn_rescale_emulate(int64_t rows, int64_t H, int64_t D, const void *src, int64_t lds, bool src_f32,
                                     const float *lse, const float *L, void *dst, int64_t ldd, dtl_dtype t);
#endif

#ifdef __cplusplus
}
#endif
#endif

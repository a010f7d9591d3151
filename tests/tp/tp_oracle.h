/* SPDX-License-Identifier: Apache-2.0 */
/* What the TP tests compute on their own: deterministic generators, an independent torch.chunk, and dense
 * double-precision oracles of every layer. */
#ifndef DTL_TP_ORACLE_H
#define DTL_TP_ORACLE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* torch.chunk, written independently of dtl: chunks of ceil(n/k), the tail takes the rest. */
static inline void t_chunk(int64_t n, int k, int i, int64_t *off, int64_t *cnt) {
  int64_t c = (n + k - 1) / k, lo = c * i, hi = lo + c;
  if (lo > n) lo = n;
  if (hi > n) hi = n;
  *off = lo;
  *cnt = hi - lo;
}

/* Deterministic data: small integers in [-r, r] (exact in f32 sums) or reals in [-r, r). The data-parallel
 * coordinate is mixed into the seed so that replicas feed different data. */
static inline float *t_ints(unsigned seed, int64_t n, int r) {
  float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = (float)((int64_t)((s >> 33) % (uint64_t)(2 * r + 1)) - r);
  }
  return p;
}
static inline float *t_reals(unsigned seed, int64_t n, float r) {
  float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = r * (2.0f * (float)((s >> 40) & 0xffffff) / 16777216.0f - 1.0f);
  }
  return p;
}

/* y[T, out] = x[T, in] w[out, in]^T + b, in double. */
static inline void t_linear(int64_t T, int64_t in, int64_t out, const float *x, const float *w, const float *b, double *y) {
  for (int64_t t = 0; t < T; t++)
    for (int64_t o = 0; o < out; o++) {
      double s = b ? b[o] : 0.0;
      for (int64_t i = 0; i < in; i++) s += (double)x[t * in + i] * w[o * in + i];
      y[t * out + o] = s;
    }
}
static inline void t_linear_d(int64_t T, int64_t in, int64_t out, const double *x, const float *w, const float *b, double *y) {
  for (int64_t t = 0; t < T; t++)
    for (int64_t o = 0; o < out; o++) {
      double s = b ? b[o] : 0.0;
      for (int64_t i = 0; i < in; i++) s += x[t * in + i] * w[o * in + i];
      y[t * out + o] = s;
    }
}

/* Dense MLP: gated = silu(x Wg^T) * (x Wu^T) with W = [gate; up]; else gelu(x Wu^T); then down. */
static inline void t_mlp(int64_t T, int64_t H, int64_t F, int gated, const float *x, const float *gu, const float *gub,
                  const float *down, const float *downb, double *y) {
  int64_t w = gated ? 2 * F : F;
  double *h = malloc(sizeof(double) * (size_t)(T * w + 1)), *a = malloc(sizeof(double) * (size_t)(T * F + 1));
  t_linear(T, H, w, x, gu, gub, h);
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < F; j++) {
      double g = h[t * w + j];
      a[t * F + j] = gated ? g / (1.0 + exp(-g)) * h[t * w + F + j] : 0.5 * g * (1.0 + erf(g / sqrt(2.0)));
    }
  t_linear_d(T, F, H, a, down, downb, y);
  free(h);
  free(a);
}

/* Rotary embedding of one head x [D] at position p in double, written from its definition: pair
 * (x[j], x[j + D/2]) turned by the angle p / theta^(2j/D) (the neox "rotate half" layout). */
static inline void t_rope(double *x, int64_t D, int64_t p, double theta) {
  for (int64_t j = 0; j < D / 2; j++) {
    double ang = (double)p / pow(theta, (double)(2 * j) / (double)D), a = x[j], b = x[j + D / 2];
    x[j] = a * cos(ang) - b * sin(ang);
    x[j + D / 2] = b * cos(ang) + a * sin(ang);
  }
}

/* Dense causal GQA attention: qkv = x Wqkv^T + b, every q and k head turned by t_rope at its token's position
 * when theta > 0, per q head h softmax(scale q k^T) v with kv head h / g. */
static inline void t_attention_rope(int64_t T, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, float scale, double theta,
                                    const float *x, const float *wqkv, const float *bqkv, const float *wo,
                                    const float *bo, double *y) {
  int64_t W = (Hq + 2 * Hkv) * D, g = Hq / Hkv;
  double *qkv = malloc(sizeof(double) * (size_t)(T * W + 1)), *o = malloc(sizeof(double) * (size_t)(T * Hq * D + 1));
  double *p = malloc(sizeof(double) * (size_t)(T + 1));
  t_linear(T, H, W, x, wqkv, bqkv, qkv);
  for (int64_t t = 0; t < T && theta > 0; t++)
    for (int64_t h = 0; h < Hq + Hkv; h++) t_rope(qkv + t * W + h * D, D, t, theta);
  for (int64_t h = 0; h < Hq; h++) {
    int64_t kh = h / g;
    for (int64_t i = 0; i < T; i++) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; j++) {
        double s = 0;
        for (int64_t d = 0; d < D; d++) s += qkv[i * W + h * D + d] * qkv[j * W + (Hq + kh) * D + d];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
      }
      for (int64_t j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
      for (int64_t d = 0; d < D; d++) {
        double acc = 0;
        for (int64_t j = 0; j <= i; j++) acc += p[j] / sum * qkv[j * W + (Hq + Hkv + kh) * D + d];
        o[i * Hq * D + h * D + d] = acc;
      }
    }
  }
  t_linear_d(T, Hq * D, H, o, wo, bo, y);
  free(qkv);
  free(o);
  free(p);
}
static inline void t_attention(int64_t T, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, float scale, const float *x,
                               const float *wqkv, const float *bqkv, const float *wo, const float *bo, double *y) {
  t_attention_rope(T, H, Hq, Hkv, D, scale, 0.0, x, wqkv, bqkv, wo, bo, y);
}

/* The local block [rows r0.., cols c0..] of a dense [*, ld] double array vs got [rows, cols]: max error. */
static inline double t_block_err(const double *dense, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                          const float *got, double *ref_max) {
  double err = 0, mx = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      double ref = dense[(r0 + r) * ld + c0 + c], e = fabs(ref - (double)got[r * cols + c]);
      if (!(e <= err)) err = e; /* NaN propagates */
      if (fabs(ref) > mx) mx = fabs(ref);
    }
  if (ref_max) *ref_max = mx;
  return err;
}

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* The dense oracle of the MoE tests: a deterministic generator every rank can replay for any rank's tokens
 * and routing, and a single-rank MoE (drops by capacity included) written without any dtl code, so that
 * the distributed result is checked against an independent computation. */
#ifndef DTL_MOE_ORACLE_H
#define DTL_MOE_ORACLE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  uint64_t s;
} oracle_rng;

static inline uint64_t oracle_next(oracle_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline oracle_rng oracle_seed(uint64_t a, uint64_t b) {
  oracle_rng r = {a * 1000003u + b * 7919u + 17u};
  oracle_next(&r);
  return r;
}
static inline double oracle_uniform(oracle_rng *r) { return (double)(oracle_next(r) >> 11) * (1.0 / 9007199254740992.0); }
static inline int oracle_int(oracle_rng *r, int lo, int hi) { return lo + (int)(oracle_next(r) % (uint64_t)(hi - lo + 1)); }

/* Routing of one rank's tokens: k distinct experts per token, dyadic weights (exact in any float sum). */
static inline void oracle_routing(uint64_t seed, int rank, int64_t tokens, int k, int experts, int32_t *ids,
                                  float *weights) {
  static const float dyadic[] = {0.25f, 0.5f, 0.75f, 1.0f, 1.5f, 2.0f};
  oracle_rng r = oracle_seed(seed, (uint64_t)rank + 100);
  for (int64_t t = 0; t < tokens; t++)
    for (int s = 0; s < k; s++) {
      int e, dup;
      do {
        e = oracle_int(&r, 0, experts - 1);
        dup = 0;
        for (int q = 0; q < s; q++) dup |= ids[t * k + q] == e;
      } while (dup);
      ids[t * k + s] = e;
      weights[t * k + s] = dyadic[oracle_int(&r, 0, 5)];
    }
}

/* Integer-valued token rows in -8..8 (exact in f32, f64, f16 and bf16 sums of a few dyadic terms). */
static inline void oracle_tokens(uint64_t seed, int rank, int64_t tokens, int64_t hidden, float *x) {
  oracle_rng r = oracle_seed(seed, (uint64_t)rank + 5000);
  for (int64_t i = 0; i < tokens * hidden; i++) x[i] = (float)oracle_int(&r, -8, 8);
}

/* The capacity rule, restated: ceil(tokens * k / experts * factor). */
static inline int64_t oracle_capacity(int64_t tokens, int k, int experts, double factor) {
  return (int64_t)ceil((double)tokens * (double)k / (double)experts * factor);
}

/* keep[t*k+s] = 1 when the pair survives. capacity < 0: dropless. policy 0 = position, 1 = probability.
 * Selection is by repeated scans (not a sort), an algorithm independent of the library's. */
static inline void oracle_keep(const int32_t *ids, const float *weights, int64_t tokens, int k, int experts,
                               int64_t capacity, int policy, int *keep) {
  int64_t pairs = tokens * k;
  for (int64_t i = 0; i < pairs; i++) keep[i] = ids[i] >= 0;
  if (capacity < 0) return;
  for (int e = 0; e < experts; e++) {
    if (policy == 0) {
      int64_t seen = 0;
      for (int64_t i = 0; i < pairs; i++)
        if (ids[i] == e && seen++ >= capacity) keep[i] = 0;
      continue;
    }
    for (int64_t i = 0; i < pairs; i++)
      if (ids[i] == e) keep[i] = 0;
    for (int64_t c = 0; c < capacity; c++) { /* pick the best not yet kept: highest weight, then position */
      int64_t best = -1;
      for (int64_t i = 0; i < pairs; i++)
        if (ids[i] == e && !keep[i] && (best < 0 || weights[i] > weights[best])) best = i;
      if (best < 0) break;
      keep[best] = 1;
    }
  }
}

/* A per-expert function on one row: out = f(expert, in). */
typedef void (*oracle_expert)(int expert, const float *in, float *out, int64_t hidden, const void *ctx);

/* y[t] = sum over kept slots, in slot order, of w * expert(x[t]); double accumulation is exact for the
 * integer data used where results are compared exactly. */
static inline void oracle_moe(const float *x, int64_t tokens, int64_t hidden, int k, const int32_t *ids,
                              const float *weights, const int *keep, oracle_expert f, const void *ctx, float *y) {
  float *row = malloc(sizeof(float) * (size_t)(hidden ? hidden : 1));
  double *acc = malloc(sizeof(double) * (size_t)(hidden ? hidden : 1));
  for (int64_t t = 0; t < tokens; t++) {
    for (int64_t h = 0; h < hidden; h++) acc[h] = 0;
    for (int s = 0; s < k; s++) {
      if (!keep[t * k + s]) continue;
      f(ids[t * k + s], x + t * hidden, row, hidden, ctx);
      for (int64_t h = 0; h < hidden; h++) acc[h] += (double)weights[t * k + s] * row[h];
    }
    for (int64_t h = 0; h < hidden; h++) y[t * hidden + h] = (float)acc[h];
  }
  free(row);
  free(acc);
}

/* The identity-like expert: out = in * (expert + 1). */
static inline void oracle_scale_expert(int expert, const float *in, float *out, int64_t hidden, const void *ctx) {
  (void)ctx;
  for (int64_t h = 0; h < hidden; h++) out[h] = in[h] * (float)(expert + 1);
}

/* The SiLU-gated MLP by plain loops: ctx is an oracle_mlp. */
typedef struct {
  int64_t hidden, ffn;
  const float *w_gate, *w_up, *w_down; /* per global expert e at offset e * ffn * hidden */
} oracle_mlp;

static inline void oracle_mlp_expert(int expert, const float *in, float *out, int64_t hidden, const void *ctx) {
  const oracle_mlp *m = ctx;
  size_t stride = (size_t)m->ffn * (size_t)hidden;
  const float *wg = m->w_gate + expert * stride, *wu = m->w_up + expert * stride, *wd = m->w_down + expert * stride;
  double *a = malloc(sizeof(double) * (size_t)m->ffn);
  for (int64_t f = 0; f < m->ffn; f++) {
    double g = 0, u = 0;
    for (int64_t h = 0; h < hidden; h++) {
      g += (double)in[h] * wg[f * hidden + h];
      u += (double)in[h] * wu[f * hidden + h];
    }
    a[f] = g / (1.0 + exp(-g)) * u;
  }
  for (int64_t h = 0; h < hidden; h++) {
    double o = 0;
    for (int64_t f = 0; f < m->ffn; f++) o += a[f] * wd[h * m->ffn + f];
    out[h] = (float)o;
  }
  free(a);
}

#endif

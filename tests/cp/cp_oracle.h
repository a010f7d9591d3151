/* SPDX-License-Identifier: Apache-2.0 */
/* The dense reference of the context-parallel tests: a whole sequence's Q, K, V from a deterministic
 * generator (rounded to the storage dtype, so the reference sees exactly what dtl sees), attention over any
 * set of query rows and key rows in double precision (token index = position, GQA by q_head / group), and
 * the comparisons with their tolerances. Independent of dtl: it never calls the library's attention. */
#ifndef DTL_TESTS_CP_ORACLE_H
#define DTL_TESTS_CP_ORACLE_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include "dtype_data.h"

typedef struct {
  int64_t T, qh, kvh, D;
  float *Q, *K, *V; /* [T, qh D], [T, kvh D], [T, kvh D], values of the dtype */
} cp_data;

static inline void cp_data_make(cp_data *d, int64_t T, int64_t qh, int64_t kvh, int64_t D, uint64_t seed,
                                dtl_dtype t) {
  d->T = T, d->qh = qh, d->kvh = kvh, d->D = D;
  t_rand_state = seed;
  d->Q = t_rand_reals((size_t)(T * qh * D), 1.5f, t);
  d->K = t_rand_reals((size_t)(T * kvh * D), 1.5f, t);
  d->V = t_rand_reals((size_t)(T * kvh * D), 1.5f, t);
}
static inline void cp_data_free(cp_data *d) { free(d->Q), free(d->K), free(d->V); }

/* o [nq, qh D] and lse [nq, qh] of the query tokens qrow[0..nq) over the key tokens krow[0..nk) (global token
 * indices; causal: key j visible to query i iff j <= i). A query that sees no key gets o = 0, lse = -inf. */
static inline void cp_oracle(const cp_data *d, int64_t nq, const int64_t *qrow, int64_t nk, const int64_t *krow,
                             bool causal, double scale, double *o, double *lse) {
  const int64_t D = d->D, qw = d->qh * D, kvw = d->kvh * D, group = d->qh / d->kvh;
  double *s = malloc(sizeof(double) * (size_t)(nk + 1));
  for (int64_t i = 0; i < nq; i++)
    for (int64_t h = 0; h < d->qh; h++) {
      const float *q = d->Q + qrow[i] * qw + h * D;
      int64_t kh = h / group;
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < nk; j++) {
        s[j] = -INFINITY;
        if (causal && krow[j] > qrow[i]) continue;
        const float *k = d->K + krow[j] * kvw + kh * D;
        double dot = 0;
        for (int64_t e = 0; e < D; e++) dot += (double)q[e] * k[e];
        s[j] = scale * dot;
        mx = fmax(mx, s[j]);
      }
      double *out = o + i * qw + h * D;
      for (int64_t e = 0; e < D; e++) out[e] = 0;
      if (mx == -INFINITY) {
        lse[i * d->qh + h] = -INFINITY;
        continue;
      }
      for (int64_t j = 0; j < nk; j++) sum += exp(s[j] - mx);
      for (int64_t j = 0; j < nk; j++) {
        if (s[j] == -INFINITY) continue;
        double w = exp(s[j] - mx) / sum;
        const float *v = d->V + krow[j] * kvw + kh * D;
        for (int64_t e = 0; e < D; e++) out[e] += w * v[e];
      }
      lse[i * d->qh + h] = mx + log(sum);
    }
  free(s);
}

/* The rows rows[0..n) of a [*, w] f32 array, packed into a new array of dtype t. */
static inline void *cp_pack_rows(const float *a, int64_t w, const int64_t *rows, int64_t n, dtl_dtype t) {
  size_t es = dtl_dtype_size(t);
  char *p = malloc((size_t)(n * w) * es + 4);
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < w; c++) t_store(p, (size_t)(i * w + c), a[rows[i] * w + c], t);
  return p;
}

/* The global token rows of rank r in layout (its local order); returns how many. rows needs T entries. */
static inline int64_t cp_rows_of(dtl_cp_token_layout layout, int64_t T, int p, int r, int64_t *rows) {
  dtl_cp_range rg[2];
  if (dtl_cp_token_ranges(layout, T, p, r, rg) != DTL_OK) return -1;
  int64_t n = 0;
  for (int k = 0; k < 2; k++)
    for (int64_t i = 0; i < rg[k].count; i++) rows[n++] = rg[k].offset + i;
  return n;
}

/* The largest error of got (n values of t) against ref, or -1 (and a message in why) at the first value
 * outside unit |ref| + noise (1 + max |ref|), unit = rounds x half an ulp of t. */
static inline double cp_compare(const double *ref, const void *got, size_t n, dtl_dtype t, double rounds, double noise,
                                char *why, size_t cap) {
  double mx = 0, worst = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
  for (size_t i = 0; i < n; i++) {
    double g = t_load(got, i, t), e = fabs(g - ref[i]);
    double tol = rounds * t_half_unit(t) * (fabs(ref[i]) + mx) + noise * (1.0 + mx);
    if (!(e <= tol)) {
      snprintf(why, cap, "element %zu is %.9g, reference %.9g (tolerance %.3g)", i, g, ref[i], tol);
      return -1;
    }
    worst = fmax(worst, e);
  }
  return worst;
}

/* lse: -inf exactly where the reference is, else within 1e-5 (1 + |ref|). */
static inline bool cp_compare_lse(const double *ref, const float *got, size_t n, char *why, size_t cap) {
  for (size_t i = 0; i < n; i++) {
    bool ok = ref[i] == -INFINITY ? (isinf(got[i]) && got[i] < 0) : fabs(got[i] - ref[i]) <= 1e-5 * (1 + fabs(ref[i]));
    if (!ok) {
      snprintf(why, cap, "lse %zu is %.9g, reference %.9g", i, (double)got[i], ref[i]);
      return false;
    }
  }
  return true;
}

#endif

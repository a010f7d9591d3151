/* SPDX-License-Identifier: Apache-2.0 */
/* The host half of the attention core (attn.h) and the shape rules both halves share. Per tile of query
 * rows and q head: one GEMM for the scores against the keys some row of the tile can see (a causal tile
 * skips the keys after its last position), masked exponentials per row (in vector lanes) that also yield
 * the log-sum-exp, one GEMM with the values (transposed once per call into the B^T operand the one GEMM entry
 * point takes), then each output row divided by its sum (D values, not the row of scores). Tiles bound the
 * scores held at once, so long sequences need no Tq x Tk buffer. */
#include <stdint.h>
#include <string.h>
#include "attn/attn.h"
#include "common/chunk.h"

/* The scores one pass holds at most (floats), on either side. */
#define DTL__ATTN_SCORE_FLOATS (((int64_t)64 << 20) / (int64_t)sizeof(float))
/* Query rows per host tile: few enough that a causal tile skips most of the keys it cannot see, enough for
 * efficient GEMMs (64, 128 and 256 rows measured within 15% of one another, each faster than one tile). */
#define DTL__ATTN_HOST_TILE 128

static int64_t dtl__attn_min(int64_t a, int64_t b) { return a < b ? a : b; }

dtl_status dtl__attn_check(const char *fn, const dtl__attn_shape *s) {
  if (s->tq < 0 || s->tk < 0 || s->qn < 0 || s->kn < 0)
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "tq=%lld tk=%lld qn=%lld kn=%lld (expected >= 0)", (long long)s->tq,
                         (long long)s->tk, (long long)s->qn, (long long)s->kn);
  if (s->head_dim < 1 || s->group < 1)
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "head_dim=%lld group=%lld (expected >= 1)", (long long)s->head_dim,
                         (long long)s->group);
  int64_t qw = s->qn * s->head_dim, kw = s->kn * s->head_dim;
  if (s->ldq < qw || s->ldo < qw || s->ldk < kw || s->ldv < kw)
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "ldq=%lld ldo=%lld ldk=%lld ldv=%lld (expected >= %lld, %lld, %lld, "
                         "%lld)", (long long)s->ldq, (long long)s->ldo, (long long)s->ldk, (long long)s->ldv,
                         (long long)qw, (long long)qw, (long long)kw, (long long)kw);
  if (s->qn > 0) { /* the map is monotone in h: its ends bound it */
    int64_t lo = dtl__attn_kv_head(s->q_off, 0, s->group, s->kv_off);
    int64_t hi = dtl__attn_kv_head(s->q_off, s->qn - 1, s->group, s->kv_off);
    if (lo < 0 || hi >= s->kn)
      return dtl__error_fn(DTL_ERR_INTERNAL, fn, "q_off=%lld group=%lld kv_off=%lld map q heads to kv heads %lld..%lld "
                           "(expected 0..%lld)", (long long)s->q_off, (long long)s->group, (long long)s->kv_off,
                           (long long)lo, (long long)hi, (long long)s->kn - 1);
  }
  if (!isfinite(s->scale)) return dtl__error_fn(DTL_ERR_INTERNAL, fn, "scale=%g (expected finite)", (double)s->scale);
  return DTL_OK;
}

dtl_status dtl__attn_heads(const char *fn, const char *group_name, int64_t q_heads, int64_t kv_heads, int n, int r,
                           dtl__attn_range *q, dtl__attn_range *kv) {
  DTL_CHECK_ARG(q_heads >= 1 && kv_heads >= 1, fn, "q_heads=%lld kv_heads=%lld (expected >= 1)", (long long)q_heads,
                (long long)kv_heads);
  DTL_CHECK_ARG(q_heads % kv_heads == 0, fn,
                "q_heads=%lld is not a multiple of kv_heads=%lld (grouped-query attention needs whole groups)",
                (long long)q_heads, (long long)kv_heads);
  int64_t g = q_heads / kv_heads;
  dtl__attn_range qr, kr;
  if (n <= kv_heads) {
    dtl__chunk(kv_heads, n, r, &kr.offset, &kr.count);
    qr = (dtl__attn_range){kr.offset * g, kr.count * g};
  } else {
    DTL_CHECK_ARG(n % kv_heads == 0, fn,
                  "kv_heads=%lld does not divide %s=%d (with %s > kv_heads every kv head is replicated on "
                  "%s / kv_heads ranks)",
                  (long long)kv_heads, group_name, n, group_name, group_name);
    DTL_CHECK_ARG(q_heads % n == 0, fn,
                  "q_heads=%lld is not a multiple of %s=%d (needed when %s > kv_heads=%lld, so that the ranks "
                  "sharing a kv head split its q heads evenly)",
                  (long long)q_heads, group_name, n, group_name, (long long)kv_heads);
    int64_t replicas = n / kv_heads, per = q_heads / n;
    kr = (dtl__attn_range){r / replicas, 1};
    qr = (dtl__attn_range){r * per, per};
  }
  if (q) *q = qr;
  if (kv) *kv = kr;
  return DTL_OK;
}

/* The values transposed once, [kn * D][tk]: scratch floats the host half keeps for the whole call. */
static int64_t dtl__attn_vt_floats(const dtl__attn_shape *s) { return s->kn * s->head_dim * s->tk; }

int64_t dtl__attn_tile_rows(const dtl__attn_shape *s, dtl_memory where, size_t scratch_bytes) {
  int64_t tk = s->tk > 0 ? s->tk : 1, floats = (int64_t)(scratch_bytes / sizeof(float));
  int64_t budget = DTL__ATTN_SCORE_FLOATS / tk > 0 ? DTL__ATTN_SCORE_FLOATS / tk : 1;
  if (where == DTL_MEMORY_HOST) {
    int64_t want = dtl__attn_min(dtl__attn_min(s->tq, DTL__ATTN_HOST_TILE), budget);
    if (s->tk == 0) return want;
    int64_t room = floats - dtl__attn_vt_floats(s);
    return room > 0 ? dtl__attn_min(want, room / s->tk) : 0;
  }
  int64_t want = dtl__attn_min(s->tq * s->qn, budget);
  return s->tk == 0 ? want : dtl__attn_min(want, floats / s->tk);
}

size_t dtl__attn_scratch_bytes(const dtl__attn_shape *s, dtl_memory where) {
  int64_t rows = dtl__attn_tile_rows(s, where, SIZE_MAX);
  int64_t floats = rows * s->tk + (where == DTL_MEMORY_HOST ? dtl__attn_vt_floats(s) : 0);
  return (size_t)floats * sizeof(float);
}

static void dtl__attn_transpose_values(const dtl__attn_shape *s, const float *v, float *vt) {
  const int64_t cols = s->kn * s->head_dim, tk = s->tk, step = 32; /* row blocks: strided reads stay in cache */
  for (int64_t j0 = 0; j0 < tk; j0 += step) {
    int64_t j1 = dtl__attn_min(j0 + step, tk);
    for (int64_t c = 0; c < cols; c++)
      for (int64_t j = j0; j < j1; j++) vt[c * tk + j] = v[j * s->ldv + c];
  }
}

/* The keys [*kb, *ke) that some query row i0..i0+m-1 sees (empty: *kb == *ke). */
static void dtl__attn_tile_keys(const dtl__attn_shape *s, int64_t i0, int64_t m, int64_t *kb, int64_t *ke) {
  *kb = 0;
  *ke = s->tk;
  if (!s->causal) return;
  int64_t qmax = INT64_MIN;
  for (int64_t r = 0; r < m; r++) {
    int64_t p = dtl__attn_qpos(s, i0 + r);
    qmax = p > qmax ? p : qmax;
  }
  if (!s->k_pos) {
    *ke = dtl__attn_key_end(s, qmax);
    return;
  }
  int64_t b = s->tk, e = 0;
  for (int64_t j = 0; j < s->tk; j++)
    if (s->k_pos[j] <= qmax) {
      b = j < b ? j : b;
      e = j + 1;
    }
  *kb = b < e ? b : 0;
  *ke = b < e ? e : 0;
}

/* The max and the sum of n floats, in DTL__ATTN_LANES independent partial results: a single running max
 * or sum is one long dependency chain that no compiler may reorder into vector lanes. */
#define DTL__ATTN_LANES 8
static float dtl__attn_row_max(const float *x, int64_t n) {
  float m[DTL__ATTN_LANES];
  for (int l = 0; l < DTL__ATTN_LANES; l++) m[l] = -INFINITY;
  int64_t j = 0;
  for (; j + DTL__ATTN_LANES <= n; j += DTL__ATTN_LANES)
    for (int l = 0; l < DTL__ATTN_LANES; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  for (; j < n; j++) m[0] = x[j] > m[0] ? x[j] : m[0];
  float r = m[0];
  for (int l = 1; l < DTL__ATTN_LANES; l++) r = m[l] > r ? m[l] : r;
  return r;
}
/* The exponentials of the softmax run in vector lanes. GCC keeps a float comparison that could raise an FP
 * exception (its default -ftrapping-math) from becoming a lane select, so these two functions are compiled
 * without it: dtl never reads the FP exception flags. */
#if defined(__GNUC__) && !defined(__clang__)
#define DTL__ATTN_VECTOR_MATH __attribute__((optimize("no-trapping-math")))
#else
#define DTL__ATTN_VECTOR_MATH
#endif

/* exp(t) for t <= 0 (a score minus its row's max) in straight-line code the compiler can run in vector lanes:
 * t = k ln2 + r with |r| <= ln2/2, exp(r) by Cephes' expf polynomial (relative error about 1e-7, as expf),
 * 2^k from the exponent bits. Below -87.3 (where f32 would go subnormal) and at -inf it is 0; NaN stays NaN. */
DTL__ATTN_VECTOR_MATH static inline float dtl__attn_exp_neg(float t) {
  float tc = t > -87.3f ? t : -87.3f; /* finite, so the conversion below is defined */
  int32_t k = (int32_t)(tc * 1.44269504088896341f - 0.5f);
  float kf = (float)k, r = tc - kf * 0.693359375f + kf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = p * r * r + r + 1.0f;
  union {
    int32_t i;
    float f;
  } two_k = {.i = (k + 127) << 23};
  e = e * two_k.f + (t - t); /* t - t: 0, or NaN for a NaN score */
  return t < -87.3f ? 0.0f : e; /* a select of computed values, so the loop needs no branch */
}

/* x[j] = exp(x[j] - mx) over n floats, returning their sum (in DTL__ATTN_LANES partial sums). */
DTL__ATTN_VECTOR_MATH static float dtl__attn_exp_sum(float *x, int64_t n, float mx) {
  float a[DTL__ATTN_LANES] = {0};
  int64_t j = 0;
  for (; j + DTL__ATTN_LANES <= n; j += DTL__ATTN_LANES)
    for (int l = 0; l < DTL__ATTN_LANES; l++) a[l] += (x[j + l] = dtl__attn_exp_neg(x[j + l] - mx));
  for (; j < n; j++) a[0] += (x[j] = dtl__attn_exp_neg(x[j] - mx));
  float r = 0.0f;
  for (int l = 0; l < DTL__ATTN_LANES; l++) r += a[l];
  return r;
}

/* One row of n scores, of keys kb.., for a query at position qp: in place exp(score - max) (0 for a key it
 * does not see), *inv gets 1 / their sum (0 for a row that saw nothing), the caller scales the row's output by
 * it after the value GEMM (D values instead of n); returns the row's log-sum-exp. */
static float dtl__attn_softmax_row(const dtl__attn_shape *s, int64_t qp, int64_t kb, float *row, int64_t n,
                                   float *inv) {
  int64_t lim = n; /* contiguous causal keys: the row sees exactly [0, lim) */
  if (s->causal && !s->k_pos) lim = dtl__attn_min(dtl__attn_key_end(s, qp) - kb, n);
  else if (s->causal)
    for (int64_t j = 0; j < n; j++)
      if (!dtl__attn_sees(s, qp, kb + j)) row[j] = -INFINITY;
  float mx = dtl__attn_row_max(row, lim);
  if (mx == -INFINITY) lim = 0;
  float sum = dtl__attn_exp_sum(row, lim, mx);
  *inv = lim ? 1.0f / sum : 0.0f;
  if (lim < n) memset(row + lim, 0, (size_t)(n - lim) * sizeof(float));
  return dtl__attn_lse(mx, sum);
}

/* Rows i0..i0+m-1 of head h that see no key: zero output, lse -inf. */
static void dtl__attn_empty_rows(const dtl__attn_shape *s, int64_t i0, int64_t m, int64_t h, float *out, float *lse) {
  for (int64_t r = 0; r < m; r++) {
    memset(out + (i0 + r) * s->ldo + h * s->head_dim, 0, (size_t)s->head_dim * sizeof(float));
    if (lse) lse[(i0 + r) * s->qn + h] = -INFINITY;
  }
}

dtl_status dtl__attn_host(const dtl__gemm_engine *g, const dtl__attn_shape *s, const float *q, const float *k,
                          const float *v, float *out, float *lse, void *scratch, size_t scratch_bytes) {
  static const char fn[] = "dtl__attn_host";
  DTL_TRY(dtl__attn_check(fn, s));
  if (s->tq == 0 || s->qn == 0) return DTL_OK;
  if (s->tk == 0) {
    for (int64_t h = 0; h < s->qn; h++) dtl__attn_empty_rows(s, 0, s->tq, h, out, lse);
    return DTL_OK;
  }
  int64_t rows = dtl__attn_tile_rows(s, DTL_MEMORY_HOST, scratch_bytes);
  if (rows < 1)
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "scratch_bytes=%zu (expected >= %zu: the transposed values and one "
                         "score row)", scratch_bytes, (size_t)(dtl__attn_vt_floats(s) + s->tk) * sizeof(float));
  const int64_t D = s->head_dim, tk = s->tk;
  float *vt = scratch, *scores = vt + dtl__attn_vt_floats(s);
  dtl__attn_transpose_values(s, v, vt);
  for (int64_t i0 = 0; i0 < s->tq; i0 += rows) {
    int64_t m = dtl__attn_min(rows, s->tq - i0), kb, ke;
    dtl__attn_tile_keys(s, i0, m, &kb, &ke);
    int64_t n = ke - kb;
    for (int64_t h = 0; h < s->qn; h++) {
      if (n == 0) {
        dtl__attn_empty_rows(s, i0, m, h, out, lse);
        continue;
      }
      int64_t kh = dtl__attn_kv_head(s->q_off, h, s->group, s->kv_off);
      DTL_TRY(dtl__gemm(g, DTL_FLOAT32, m, n, D, s->scale, q + i0 * s->ldq + h * D, s->ldq, k + kb * s->ldk + kh * D,
                        s->ldk, 0.0f, scores, n));
      float inv[DTL__ATTN_HOST_TILE];
      for (int64_t r = 0; r < m; r++) {
        float l = dtl__attn_softmax_row(s, dtl__attn_qpos(s, i0 + r), kb, scores + r * n, n, &inv[r]);
        if (lse) lse[(i0 + r) * s->qn + h] = l;
      }
      float *o = out + i0 * s->ldo + h * D;
      DTL_TRY(dtl__gemm(g, DTL_FLOAT32, m, D, n, 1.0f, scores, n, vt + kh * D * tk + kb, tk, 0.0f, o, s->ldo));
      for (int64_t r = 0; r < m; r++)
        for (int64_t d = 0; d < D; d++) o[r * s->ldo + d] *= inv[r];
      if (s->progress) s->progress(s->progress_arg);
    }
  }
  return DTL_OK;
}

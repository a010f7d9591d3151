/* SPDX-License-Identifier: Apache-2.0 */
/* The attention core (src/attn) against an independent dense reference in double precision: the host half
 * (GEMMs) and, where dtl is built with CUDA, the device half's code emulated on the host (every launch block
 * by block and thread by thread, f32/f16/bf16 storage). Shapes reach every index path: GQA groups at the head
 * offsets a rank gets under tensor parallelism, rows longer than a block's threads, head dims longer than
 * a block, padded leading dims, decode (few queries late in the sequence against a long KV cache), KV blocks
 * wholly before or after the queries (ring context parallelism), explicit position arrays, queries that
 * see no key (out 0, lse -inf), empty query or key sets, and scratch that forces many tiles or launches.
 * The log-sum-exp is checked too, and the rule that makes ring attention exact: attending to two key
 * chunks and merging by the log-sum-exp equals attending to all the keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "attn/attn.h"
#include "dtype_data.h"


/* --- cases -------------------------------------------------------------------------------------------- */
typedef enum { POS_CONTIGUOUS, POS_ARRAYS } pos_kind;

typedef struct {
  const char *what;
  int64_t tq, tk, qn, kn, D, q_off, kv_off, group;
  bool causal;
  pos_kind pos;
  int64_t q_pos0, k_pos0; /* POS_CONTIGUOUS */
  int64_t pad;            /* extra columns of every leading dim */
  float scale;            /* 0: 1/sqrt(D) */
} attn_case;

static const attn_case kCases[] = {
    {"one head", 5, 5, 1, 1, 3, 0, 0, 1, true, POS_CONTIGUOUS, 0, 0, 0, 0},
    {"GQA group 2 (tp 1)", 19, 19, 4, 2, 8, 0, 0, 2, true, POS_CONTIGUOUS, 0, 0, 0, 0},
    {"q 8 / kv 2 at tp 4, rank 3 (replicated kv head); rows > 128 threads", 150, 150, 2, 1, 3, 6, 1, 4, true,
     POS_CONTIGUOUS, 0, 0, 0, 0},
    {"q 9 / kv 3 at tp 3, rank 1; head_dim > 128 threads", 4, 4, 3, 1, 130, 3, 1, 3, true, POS_CONTIGUOUS, 0, 0, 0, 0},
    {"q 12 / kv 6 at tp 2, rank 1; explicit scale; padded rows", 33, 33, 6, 3, 4, 6, 3, 2, true, POS_CONTIGUOUS, 0, 0,
     3, 2.5f},
    {"decode: one query at 299 against a cache of 300 keys", 1, 300, 4, 2, 16, 0, 0, 2, true, POS_CONTIGUOUS, 299, 0, 0,
     0},
    {"decode: 3 new queries at 37.. against 40 keys", 3, 40, 2, 1, 8, 0, 0, 2, true, POS_CONTIGUOUS, 37, 0, 1, 0},
    {"cross attention (not causal), tq != tk", 7, 11, 3, 3, 5, 0, 0, 1, false, POS_CONTIGUOUS, 0, 0, 0, 0},
    {"ring: a KV block wholly in the past", 16, 16, 2, 2, 6, 0, 0, 1, true, POS_CONTIGUOUS, 100, 0, 0, 0},
    {"ring: a KV block wholly in the future (no row sees a key)", 16, 16, 2, 2, 6, 0, 0, 1, true, POS_CONTIGUOUS, 0,
     100, 0, 0},
    {"ring: keys starting after the first queries", 12, 9, 2, 1, 4, 0, 0, 2, true, POS_CONTIGUOUS, 10, 14, 0, 0},
    {"position arrays, causal (zigzag queries, shuffled keys, one query before every key)", 9, 14, 4, 2, 5, 0, 0, 2,
     true, POS_ARRAYS, 0, 0, 2, 0},
    {"position arrays, not causal", 6, 10, 2, 1, 7, 0, 0, 2, false, POS_ARRAYS, 0, 0, 0, 0},
    {"empty query set", 0, 8, 2, 1, 4, 0, 0, 2, true, POS_CONTIGUOUS, 0, 0, 0, 0},
    {"empty key set", 4, 0, 2, 1, 4, 0, 0, 2, true, POS_CONTIGUOUS, 0, 0, 0, 0},
};
#define NCASES (sizeof kCases / sizeof kCases[0])

/* One case's data: inputs (already rounded to the storage type) and positions. */
typedef struct {
  attn_case c;
  dtl__attn_shape s;
  float *q, *k, *v;
  int64_t *qpos, *kpos; /* always filled (the reference reads them); s points at them for POS_ARRAYS */
} attn_data;

static void data_make(const attn_case *c, dtl_dtype t, attn_data *d) {
  memset(d, 0, sizeof *d);
  d->c = *c;
  int64_t ldq = c->qn * c->D + c->pad, ldk = c->kn * c->D + c->pad + 1, ldv = c->kn * c->D + 2 * c->pad;
  d->s = (dtl__attn_shape){.tq = c->tq, .tk = c->tk, .qn = c->qn, .kn = c->kn, .head_dim = c->D, .q_off = c->q_off,
                           .kv_off = c->kv_off, .group = c->group, .ldq = ldq, .ldk = ldk, .ldv = ldv,
                           .ldo = c->qn * c->D + c->pad, .q_pos0 = c->q_pos0, .k_pos0 = c->k_pos0,
                           .causal = c->causal, .scale = c->scale ? c->scale : 1.0f / sqrtf((float)c->D)};
  d->q = t_rand_reals((size_t)(c->tq * ldq), 1.5f, t);
  d->k = t_rand_reals((size_t)(c->tk * ldk), 1.5f, t);
  d->v = t_rand_reals((size_t)(c->tk * ldv), 1.5f, t);
  d->qpos = malloc(sizeof(int64_t) * (size_t)(c->tq + 1));
  d->kpos = malloc(sizeof(int64_t) * (size_t)(c->tk + 1));
  for (int64_t i = 0; i < c->tq; i++) d->qpos[i] = c->q_pos0 + i;
  for (int64_t j = 0; j < c->tk; j++) d->kpos[j] = c->k_pos0 + j;
  if (c->pos == POS_ARRAYS) {
    /* Queries: a zigzag of two chunks (as a ring rank holds them) and one query at -1, before every key.
     * Keys: positions 0, 2, 4, ... shuffled. */
    for (int64_t i = 0; i < c->tq; i++) d->qpos[i] = i < c->tq / 2 ? i * 2 + 1 : 3 * c->tk / 2 + i;
    d->qpos[c->tq / 3] = -1;
    for (int64_t j = 0; j < c->tk; j++) d->kpos[j] = 2 * j;
    for (int64_t j = c->tk - 1; j > 0; j--) {
      int64_t r = (int64_t)(t_rand() % (uint64_t)(j + 1)), x = d->kpos[j];
      d->kpos[j] = d->kpos[r];
      d->kpos[r] = x;
    }
    d->s.q_pos = d->qpos;
    d->s.k_pos = d->kpos;
  }
}

static void data_free(attn_data *d) { free(d->q), free(d->k), free(d->v), free(d->qpos), free(d->kpos); }

/* The dense reference in double: out [tq, qn * D] (packed) and lse [tq, qn], from the case's own definition
 * (positions, the GQA map, softmax over the keys each query sees). */
static void reference(const attn_data *d, double *out, double *lse) {
  const attn_case *c = &d->c;
  const dtl__attn_shape *s = &d->s;
  double *sc = malloc(sizeof(double) * (size_t)(c->tk + 1));
  for (int64_t i = 0; i < c->tq; i++)
    for (int64_t h = 0; h < c->qn; h++) {
      int64_t kh = (c->q_off + h) / c->group - c->kv_off;
      double mx = -INFINITY;
      for (int64_t j = 0; j < c->tk; j++) {
        sc[j] = -INFINITY;
        if (c->causal && d->kpos[j] > d->qpos[i]) continue;
        double dot = 0;
        const float *qi = d->q + i * s->ldq + h * c->D, *kj = d->k + j * s->ldk + kh * c->D;
        for (int64_t e = 0; e < c->D; e++) dot += (double)qi[e] * kj[e];
        sc[j] = (double)s->scale * dot;
        mx = fmax(mx, sc[j]);
      }
      double *o = out + (i * c->qn + h) * c->D, sum = 0;
      for (int64_t e = 0; e < c->D; e++) o[e] = 0;
      if (mx == -INFINITY) {
        lse[i * c->qn + h] = -INFINITY;
        continue;
      }
      for (int64_t j = 0; j < c->tk; j++) sum += exp(sc[j] - mx);
      for (int64_t j = 0; j < c->tk; j++)
        for (int64_t e = 0; e < c->D; e++) o[e] += exp(sc[j] - mx) / sum * d->v[j * s->ldv + kh * c->D + e];
      lse[i * c->qn + h] = mx + log(sum);
    }
  free(sc);
}

/* --- checks ------------------------------------------------------------------------------------------- */
/* Every output element within unit(t) |ref| + noise (1 + max |ref|), exactly 0 where the row saw nothing;
 * padding columns of out untouched (still the fill byte 0x5a). */
static void check_out(const attn_data *d, const double *ref, const double *ref_lse, const void *got, dtl_dtype t,
                      double noise, const char *what) {
  const attn_case *c = &d->c;
  size_t es = dtl_dtype_size(t);
  double mx = 0;
  for (int64_t i = 0; i < c->tq * c->qn * c->D; i++) mx = fmax(mx, fabs(ref[i]));
  for (int64_t i = 0; i < c->tq; i++) {
    for (int64_t h = 0; h < c->qn; h++)
      for (int64_t e = 0; e < c->D; e++) {
        double r = ref[(i * c->qn + h) * c->D + e], g = t_load(got, (size_t)(i * d->s.ldo + h * c->D + e), t);
        double tol = ref_lse[i * c->qn + h] == -INFINITY ? 0.0 : t_half_unit(t) * fabs(r) + noise * (1.0 + mx);
        if (!(fabs(g - r) <= tol))
          fail_msg("%s, %s %s: out[%lld, head %lld, %lld] is %.9g, reference %.9g (tolerance %.3g)", c->what, what,
                   dtl_dtype_name(t), (long long)i, (long long)h, (long long)e, g, r, tol);
      }
    for (int64_t p = c->qn * c->D; p < d->s.ldo; p++) {
      unsigned char pad[4];
      memset(pad, 0x5a, sizeof pad);
      assert_memory_equal((const char *)got + (size_t)(i * d->s.ldo + p) * es, pad, es);
    }
  }
}

static void check_lse(const attn_data *d, const double *ref, const float *got, const char *what) {
  const attn_case *c = &d->c;
  for (int64_t i = 0; i < c->tq * c->qn; i++) {
    bool ok = ref[i] == -INFINITY ? isinf(got[i]) && got[i] < 0 : fabs(got[i] - ref[i]) <= 1e-5 * (1.0 + fabs(ref[i]));
    if (!ok)
      fail_msg("%s, %s: lse[%lld, head %lld] is %.9g, reference %.9g", c->what, what, (long long)(i / c->qn),
               (long long)(i % c->qn), (double)got[i], ref[i]);
  }
}

/* Output and lse buffers filled with 0x5a (a NaN-free poison: 0x5a5a5a5a is 1.5e16 in f32). */
static void *poisoned(size_t bytes) {
  void *p = malloc(bytes + 4);
  memset(p, 0x5a, bytes + 4);
  return p;
}

/* Runs the host half with scratch_bytes of scratch (0: the default) and checks it. */
static void run_host(const attn_data *d, size_t scratch_bytes, const char *what) {
  const attn_case *c = &d->c;
  dtl__gemm_engine g = dtl__gemm_engine_host();
  size_t no = (size_t)(c->tq * d->s.ldo), nl = (size_t)(c->tq * c->qn), nr = (size_t)(c->tq * c->qn * c->D);
  if (!scratch_bytes) scratch_bytes = dtl__attn_scratch_bytes(&d->s, DTL_MEMORY_HOST);
  float *out = poisoned(no * sizeof(float)), *lse = poisoned(nl * sizeof(float));
  void *scratch = malloc(scratch_bytes + 4);
  double *ref = malloc(sizeof(double) * (nr + 1)), *ref_lse = malloc(sizeof(double) * (nl + 1));
  reference(d, ref, ref_lse);
  assert_int_equal(dtl__attn_host(&g, &d->s, d->q, d->k, d->v, out, lse, scratch, scratch_bytes), DTL_OK);
  check_out(d, ref, ref_lse, out, DTL_FLOAT32, 1e-5, what);
  check_lse(d, ref_lse, lse, what);
  free(out), free(lse), free(scratch), free(ref), free(ref_lse);
}

/* --- the host half ------------------------------------------------------------------------------------ */
static void host_core_matches_the_dense_reference_with_its_lse(void **state) {
  (void)state;
  for (size_t i = 0; i < NCASES; i++) {
    attn_data d;
    data_make(&kCases[i], DTL_FLOAT32, &d);
    run_host(&d, 0, "host");
    data_free(&d);
  }
}

static void host_core_gives_the_same_result_whatever_tiles_its_scratch_allows(void **state) {
  (void)state;
  for (size_t i = 0; i < NCASES; i++) {
    attn_data d;
    data_make(&kCases[i], DTL_FLOAT32, &d);
    size_t vt = (size_t)(d.c.kn * d.c.D * d.c.tk) * sizeof(float), row = (size_t)d.c.tk * sizeof(float);
    run_host(&d, vt + row, "host, one query row per tile");
    run_host(&d, vt + 3 * row + 1, "host, three query rows per tile");
    data_free(&d);
  }
}

static void host_core_rejects_too_little_scratch_and_an_inconsistent_shape(void **state) {
  (void)state;
  attn_data d;
  data_make(&kCases[1], DTL_FLOAT32, &d);
  dtl__gemm_engine g = dtl__gemm_engine_host();
  float out[19 * 32], lse[19 * 4], scratch[8];
  size_t need = (size_t)(d.c.kn * d.c.D * d.c.tk + d.c.tk) * sizeof(float);
  assert_int_equal(dtl__attn_tile_rows(&d.s, DTL_MEMORY_HOST, need - 1), 0);
  assert_int_equal(dtl__attn_host(&g, &d.s, d.q, d.k, d.v, out, lse, scratch, need - 1), DTL_ERR_INTERNAL);
  assert_non_null(strstr(dtl_last_error(), "scratch_bytes="));
  dtl__attn_shape bad = d.s;
  bad.kv_off = 1; /* q heads 0..3 of group 2 map to kv heads -1..0 */
  assert_int_equal(dtl__attn_host(&g, &bad, d.q, d.k, d.v, out, lse, scratch, sizeof scratch), DTL_ERR_INTERNAL);
  assert_non_null(strstr(dtl_last_error(), "kv_off=1"));
  bad = d.s;
  bad.ldk = 3;
  assert_int_equal(dtl__attn_host(&g, &bad, d.q, d.k, d.v, out, lse, scratch, sizeof scratch), DTL_ERR_INTERNAL);
  assert_non_null(strstr(dtl_last_error(), "ldk=3"));
  data_free(&d);
}

/* Scores that are all -inf (finite inputs whose products overflow): the row saw nothing, so out is 0 and
 * lse is -inf, with no NaN on either path. */
static float *overflowing(int64_t rows, int64_t cols, float x) {
  float *p = malloc(sizeof(float) * (size_t)(rows * cols));
  for (int64_t i = 0; i < rows * cols; i++) p[i] = x;
  return p;
}

static void every_score_minus_infinity_gives_zero_output_and_lse_minus_infinity(void **state) {
  (void)state;
  const int64_t T = 3, D = 2;
  dtl__attn_shape s = {.tq = T, .tk = T, .qn = 1, .kn = 1, .head_dim = D, .group = 1, .ldq = D, .ldk = D, .ldv = D,
                       .ldo = D, .causal = true, .scale = 1.0f};
  float *q = overflowing(T, D, 1e30f), *k = overflowing(T, D, -1e30f), *v = overflowing(T, D, 1.0f);
  float out[6], lse[3];
  size_t sb = dtl__attn_scratch_bytes(&s, DTL_MEMORY_HOST);
  void *scratch = malloc(sb);
  dtl__gemm_engine g = dtl__gemm_engine_host();
  assert_int_equal(dtl__attn_host(&g, &s, q, k, v, out, lse, scratch, sb), DTL_OK);
  for (int i = 0; i < 6; i++) assert_true(out[i] == 0.0f);
  for (int i = 0; i < 3; i++) assert_true(isinf(lse[i]) && lse[i] < 0);
#if DTL_HAVE_NCCL
  free(scratch);
  sb = dtl__attn_scratch_bytes(&s, DTL_MEMORY_DEVICE);
  scratch = malloc(sb);
  memset(out, 0x5a, sizeof out);
  assert_int_equal(dtl__attn_emulate(&s, q, k, v, out, lse, scratch, sb, DTL_FLOAT32), DTL_OK);
  for (int i = 0; i < 6; i++) assert_true(out[i] == 0.0f);
  for (int i = 0; i < 3; i++) assert_true(isinf(lse[i]) && lse[i] < 0);
#endif
  free(q), free(k), free(v), free(scratch);
}

/* The host half's exponentials (a vectorised polynomial, not expf): scores spread over the whole f32 range
 * below the row max (down to where exp underflows) against double precision, and a NaN score, which must
 * reach the output rather than vanish. */
static void host_softmax_is_accurate_over_the_exponent_range_and_keeps_nan(void **state) {
  (void)state;
  const int64_t tk = 200, D = 1;
  dtl__attn_shape s = {.tq = 1, .tk = tk, .qn = 1, .kn = 1, .head_dim = D, .group = 1, .ldq = D, .ldk = D,
                       .ldv = D, .ldo = D, .scale = 1.0f};
  float q[1] = {1.0f}, k[200], v[200], out[1], lse[1];
  double num = 0, den = 0;
  for (int64_t j = 0; j < tk; j++) { /* scores 0, -0.53, ..., -105: exp from 1 down past f32's normal range */
    k[j] = -0.53f * (float)j;
    v[j] = (float)(j % 7) - 3.0f;
    den += exp((double)k[j]);
    num += exp((double)k[j]) * v[j];
  }
  size_t sb = dtl__attn_scratch_bytes(&s, DTL_MEMORY_HOST);
  void *scratch = malloc(sb);
  dtl__gemm_engine g = dtl__gemm_engine_host();
  assert_int_equal(dtl__attn_host(&g, &s, q, k, v, out, lse, scratch, sb), DTL_OK);
  assert_true(fabs(out[0] - num / den) <= 1e-6 * (1 + fabs(num / den)));
  assert_true(fabs(lse[0] - log(den)) <= 1e-6);
  k[17] = NAN;
  assert_int_equal(dtl__attn_host(&g, &s, q, k, v, out, lse, scratch, sb), DTL_OK);
  assert_true(isnan(out[0]) && isnan(lse[0]));
  free(scratch);
}

/* --- the merge property --------------------------------------------------------------------------------- */
/* Runs the core (host, or the emulated device half when dev) on keys [j0, j1) of d into out [tq, qn * D]
 * (packed, f32) and lse. */
static void attend_keys(const attn_data *d, int64_t j0, int64_t j1, bool dev, float *out, float *lse) {
  dtl__attn_shape s = d->s;
  s.tk = j1 - j0;
  s.k_pos0 = d->s.k_pos0 + j0;
  if (s.k_pos) s.k_pos = d->kpos + j0;
  s.ldo = s.qn * s.head_dim;
  const float *k = d->k + j0 * s.ldk, *v = d->v + j0 * s.ldv;
  size_t sb = dtl__attn_scratch_bytes(&s, dev ? DTL_MEMORY_DEVICE : DTL_MEMORY_HOST);
  void *scratch = malloc(sb + 4);
  if (!dev) {
    dtl__gemm_engine g = dtl__gemm_engine_host();
    assert_int_equal(dtl__attn_host(&g, &s, d->q, k, v, out, lse, scratch, sb), DTL_OK);
  }
#if DTL_HAVE_NCCL
  else assert_int_equal(dtl__attn_emulate(&s, d->q, k, v, out, lse, scratch, sb, DTL_FLOAT32), DTL_OK);
#endif
  free(scratch);
}

/* Two partial results over disjoint key sets, merged: lse = log(e^l1 + e^l2) and out = e^(l1 - lse) o1 +
 * e^(l2 - lse) o2, with the empty side (lse -inf) weighing nothing and two empty sides giving 0 and -inf. */
static void merge(int64_t rows, int64_t qn, int64_t D, const float *o1, const float *l1, const float *o2,
                  const float *l2, double *out, double *lse) {
  for (int64_t r = 0; r < rows * qn; r++) {
    double a = l1[r], b = l2[r], m = fmax(a, b);
    double l = m == -INFINITY ? -INFINITY : m + log(exp(a - m) + exp(b - m));
    double wa = l == -INFINITY ? 0 : exp(a - l), wb = l == -INFINITY ? 0 : exp(b - l);
    for (int64_t e = 0; e < D; e++) out[r * D + e] = wa * o1[r * D + e] + wb * o2[r * D + e];
    lse[r] = l;
  }
}

static void merging_two_key_chunks_by_lse_equals_attending_to_all_keys(void **state) {
  (void)state;
  for (int dev = 0; dev < 1 + DTL_HAVE_NCCL; dev++)
    for (size_t i = 0; i < NCASES; i++) {
      attn_data d;
      data_make(&kCases[i], DTL_FLOAT32, &d);
      const attn_case *c = &d.c;
      size_t nr = (size_t)(c->tq * c->qn * c->D), nl = (size_t)(c->tq * c->qn);
      float *o1 = malloc(sizeof(float) * (nr + 1)), *o2 = malloc(sizeof(float) * (nr + 1));
      float *l1 = malloc(sizeof(float) * (nl + 1)), *l2 = malloc(sizeof(float) * (nl + 1));
      float *all = malloc(sizeof(float) * (nr + 1)), *all_lse = malloc(sizeof(float) * (nl + 1));
      double *m = malloc(sizeof(double) * (nr + 1)), *ml = malloc(sizeof(double) * (nl + 1));
      attend_keys(&d, 0, c->tk, dev, all, all_lse);
      const int64_t cuts[] = {0, c->tk / 3, c->tk / 2 + 1, c->tk};
      for (int k = 0; k < 4; k++) {
        int64_t cut = cuts[k] < c->tk ? cuts[k] : c->tk;
        attend_keys(&d, 0, cut, dev, o1, l1);
        attend_keys(&d, cut, c->tk, dev, o2, l2);
        merge(c->tq, c->qn, c->D, o1, l1, o2, l2, m, ml);
        for (size_t r = 0; r < nl; r++) {
          bool ok = all_lse[r] == -INFINITY ? ml[r] == -INFINITY : fabs(ml[r] - all_lse[r]) <= 1e-5 * (1 + fabs(ml[r]));
          if (!ok) fail_msg("%s (%s), cut %lld: merged lse[%zu] %.9g, all keys %.9g", c->what, dev ? "device" : "host",
                            (long long)cut, r, ml[r], (double)all_lse[r]);
        }
        for (size_t e = 0; e < nr; e++)
          if (!(fabs(m[e] - all[e]) <= 2e-5 * (1 + fabs(all[e]))))
            fail_msg("%s (%s), cut %lld: merged out[%zu] %.9g, all keys %.9g", c->what, dev ? "device" : "host",
                     (long long)cut, e, m[e], (double)all[e]);
      }
      free(o1), free(o2), free(l1), free(l2), free(all), free(all_lse), free(m), free(ml);
      data_free(&d);
    }
}

/* --- tiling rules --------------------------------------------------------------------------------------- */
static void tiles_fit_the_scratch_budget_and_cover_short_sequences(void **state) {
  (void)state;
  dtl__attn_shape s = {.tq = 5, .tk = 5, .qn = 3, .kn = 1, .head_dim = 4, .group = 3};
  /* device: score rows (query, head) of tk floats, about 64 MiB of them at most */
  assert_int_equal(dtl__attn_tile_rows(&s, DTL_MEMORY_DEVICE, SIZE_MAX), 15); /* all in one launch */
  assert_int_equal(dtl__attn_scratch_bytes(&s, DTL_MEMORY_DEVICE), 15 * 5 * sizeof(float));
  assert_int_equal(dtl__attn_tile_rows(&s, DTL_MEMORY_DEVICE, 7 * 5 * sizeof(float) + 3), 7);
  s.tq = s.tk = 1 << 20;
  assert_int_equal(dtl__attn_tile_rows(&s, DTL_MEMORY_DEVICE, SIZE_MAX), 16); /* 64 MiB of f32 rows of 2^20 */
  s.tk = (int64_t)1 << 25;
  assert_int_equal(dtl__attn_tile_rows(&s, DTL_MEMORY_DEVICE, SIZE_MAX), 1); /* longer than the budget: one row */
  assert_int_equal(dtl__attn_tile_rows(&s, DTL_MEMORY_DEVICE, ((size_t)1 << 27) - 1), 0); /* less than a row */
  /* host: tiles of at most 128 query rows, fewer for long key sets, plus the transposed values */
  s.tq = 1000;
  s.tk = 10;
  assert_int_equal(dtl__attn_tile_rows(&s, DTL_MEMORY_HOST, SIZE_MAX), 128);
  assert_int_equal(dtl__attn_scratch_bytes(&s, DTL_MEMORY_HOST), (128 * 10 + 1 * 4 * 10) * sizeof(float));
  s.tk = 1 << 20;
  assert_int_equal(dtl__attn_tile_rows(&s, DTL_MEMORY_HOST, SIZE_MAX), 16);
  s.tq = 1;
  assert_int_equal(dtl__attn_tile_rows(&s, DTL_MEMORY_HOST, SIZE_MAX), 1);
}

#if DTL_HAVE_NCCL
/* --- the device half, emulated ------------------------------------------------------------------------ */
static const dtl_dtype kTypes[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};

/* Runs the emulated device half in storage t with scratch_bytes (0: the default) and checks it. */
static void run_device(const attn_data *d, dtl_dtype t, size_t scratch_bytes, const char *what) {
  const attn_case *c = &d->c;
  size_t nl = (size_t)(c->tq * c->qn), nr = (size_t)(c->tq * c->qn * c->D), es = dtl_dtype_size(t);
  if (!scratch_bytes) scratch_bytes = dtl__attn_scratch_bytes(&d->s, DTL_MEMORY_DEVICE);
  void *q = t_pack(d->q, (size_t)(c->tq * d->s.ldq), t), *k = t_pack(d->k, (size_t)(c->tk * d->s.ldk), t);
  void *v = t_pack(d->v, (size_t)(c->tk * d->s.ldv), t), *out = poisoned((size_t)(c->tq * d->s.ldo) * es);
  float *lse = poisoned(nl * sizeof(float));
  void *scratch = malloc(scratch_bytes + 4);
  double *ref = malloc(sizeof(double) * (nr + 1)), *ref_lse = malloc(sizeof(double) * (nl + 1));
  reference(d, ref, ref_lse);
  assert_int_equal(dtl__attn_emulate(&d->s, q, k, v, out, lse, scratch, scratch_bytes, t), DTL_OK);
  check_out(d, ref, ref_lse, out, t, 1e-5, what);
  check_lse(d, ref_lse, lse, what);
  free(q), free(k), free(v), free(out), free(lse), free(scratch), free(ref), free(ref_lse);
}

static void device_core_matches_the_dense_reference_in_every_storage_type(void **state) {
  (void)state;
  for (size_t i = 0; i < NCASES; i++)
    for (int ti = 0; ti < 3; ti++) {
      attn_data d;
      data_make(&kCases[i], kTypes[ti], &d); /* inputs rounded to the type: the reference sees them too */
      run_device(&d, kTypes[ti], 0, "device (emulated)");
      data_free(&d);
    }
}

static void device_core_gives_the_same_result_over_many_launches(void **state) {
  (void)state;
  for (size_t i = 0; i < NCASES; i++) {
    attn_data d;
    data_make(&kCases[i], DTL_FLOAT32, &d);
    size_t row = (size_t)d.c.tk * sizeof(float);
    run_device(&d, DTL_FLOAT32, row ? row : 1, "device (emulated), one score row per launch");
    run_device(&d, DTL_FLOAT32, row ? 7 * row + 3 : 1, "device (emulated), seven score rows per launch");
    data_free(&d);
  }
}

static void device_core_rejects_too_little_scratch_and_other_dtypes(void **state) {
  (void)state;
  attn_data d;
  data_make(&kCases[1], DTL_FLOAT32, &d);
  float out[19 * 32], scratch[8];
  assert_int_equal(dtl__attn_emulate(&d.s, d.q, d.k, d.v, out, NULL, scratch, 19 * sizeof(float) - 1, DTL_FLOAT32),
                   DTL_ERR_INTERNAL);
  assert_non_null(strstr(dtl_last_error(), "scratch_bytes="));
  assert_int_equal(dtl__attn_emulate(&d.s, d.q, d.k, d.v, out, NULL, scratch, sizeof scratch, DTL_INT32),
                   DTL_ERR_UNSUPPORTED);
  data_free(&d);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(host_core_matches_the_dense_reference_with_its_lse),
      cmocka_unit_test(host_core_gives_the_same_result_whatever_tiles_its_scratch_allows),
      cmocka_unit_test(host_core_rejects_too_little_scratch_and_an_inconsistent_shape),
      cmocka_unit_test(every_score_minus_infinity_gives_zero_output_and_lse_minus_infinity),
      cmocka_unit_test(host_softmax_is_accurate_over_the_exponent_range_and_keeps_nan),
      cmocka_unit_test(merging_two_key_chunks_by_lse_equals_attending_to_all_keys),
      cmocka_unit_test(tiles_fit_the_scratch_budget_and_cover_short_sequences),
#if DTL_HAVE_NCCL
      cmocka_unit_test(device_core_matches_the_dense_reference_in_every_storage_type),
      cmocka_unit_test(device_core_gives_the_same_result_over_many_launches),
      cmocka_unit_test(device_core_rejects_too_little_scratch_and_other_dtypes),
#endif
  };
  return cmocka_run_group_tests_name("attention core", tests, NULL, NULL);
}

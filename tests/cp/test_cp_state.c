/* SPDX-License-Identifier: Apache-2.0 */
/* Attention states on one process: the merge's identities (an empty state is the identity, two empty states
 * stay empty without NaN, merging is symmetric bit for bit and associative up to rounding), the merge against
 * its formula in double (lse far apart included), lse combine and rescale, in f32, f16 and bf16, on the host
 * loops and (CUDA builds) the device kernels' code emulated on the host; the public host merge and its bad
 * input; and the token layouts of dtl_cp_token_ranges. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "attn/state.h"
#include "dtype_data.h"

static const dtl_dtype kTypes[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};

/* The merge on one side: the host loops, or the device code emulated. */
typedef dtl_status (*merge_fn)(int64_t, int64_t, int64_t, void *, int64_t, float *, const void *, int64_t,
                               const float *, dtl_dtype);
static const merge_fn kMerges[] = {dtl__attn_merge_host,
#if DTL_HAVE_NCCL
                                   dtl__attn_merge_emulate
#endif
};
#define NMERGES (sizeof kMerges / sizeof kMerges[0])
static const char *merge_name(size_t i) { return i == 0 ? "host" : "device (emulated)"; }

/* rows x H states of D values; lse per state from the list, cycling. */
enum { ROWS = 5, H = 3, D = 7, N = ROWS * H * D, S = ROWS * H };

static void fill_lse(float *l, const float *from, int nfrom) {
  for (int i = 0; i < S; i++) l[i] = from[i % nfrom];
}

static void merging_with_an_empty_state_is_the_identity(void **state) {
  (void)state;
  const float some[] = {0.25f, -3.0f, 12.0f, 0.0f, -INFINITY};
  for (size_t m = 0; m < NMERGES; m++)
    for (int ti = 0; ti < 3; ti++) {
      dtl_dtype t = kTypes[ti];
      size_t bytes = N * dtl_dtype_size(t);
      t_rand_state = 5;
      float *x = t_rand_reals(N, 3.0f, t), *y = t_rand_reals(N, 3.0f, t);
      void *a = t_pack(x, N, t), *b = t_pack(y, N, t), *a0 = t_pack(x, N, t);
      float la[S], lb[S], la0[S];
      fill_lse(la, some, 5);
      memcpy(la0, la, sizeof la);
      for (int i = 0; i < S; i++) lb[i] = -INFINITY;
      /* b empty: a keeps every bit, o and lse */
      assert_int_equal(kMerges[m](ROWS, H, D, a, H * D, la, b, H * D, lb, t), DTL_OK);
      if (memcmp(a, a0, bytes) || memcmp(la, la0, sizeof la))
        fail_msg("%s %s: merging an empty state changed a", merge_name(m), dtl_dtype_name(t));
      /* a empty: a becomes b, bit for bit */
      float lempty[S], lb2[S];
      for (int i = 0; i < S; i++) lempty[i] = -INFINITY;
      fill_lse(lb2, some, 4);
      assert_int_equal(kMerges[m](ROWS, H, D, a, H * D, lempty, b, H * D, lb2, t), DTL_OK);
      if (memcmp(a, b, bytes) || memcmp(lempty, lb2, sizeof lb2))
        fail_msg("%s %s: merging into an empty state did not copy b", merge_name(m), dtl_dtype_name(t));
      free(x), free(y), free(a), free(b), free(a0);
    }
}

static void two_empty_states_stay_empty_without_nan(void **state) {
  (void)state;
  for (size_t m = 0; m < NMERGES; m++) {
    float a[N] = {0}, b[N] = {0}, la[S], lb[S];
    for (int i = 0; i < S; i++) la[i] = lb[i] = -INFINITY;
    assert_int_equal(kMerges[m](ROWS, H, D, a, H * D, la, b, H * D, lb, DTL_FLOAT32), DTL_OK);
    for (int i = 0; i < S; i++) assert_true(isinf(la[i]) && la[i] < 0);
    for (int i = 0; i < N; i++) assert_true(a[i] == 0.0f);
  }
}

/* merge(a, b) in double from the definition. */
static void merge_double(const float *oa, const float *la, const float *ob, const float *lb, double *o, double *l) {
  for (int s = 0; s < S; s++) {
    double m = fmax(la[s], lb[s]);
    double L = m == -INFINITY ? -INFINITY : m + log(exp(la[s] - m) + exp(lb[s] - m));
    double wa = L == -INFINITY ? 0 : exp(la[s] - L), wb = L == -INFINITY ? 0 : exp(lb[s] - L);
    for (int d = 0; d < D; d++) o[s * D + d] = wa * oa[s * D + d] + wb * ob[s * D + d];
    l[s] = L;
  }
}

static void merge_equals_its_formula_in_double_even_for_lse_far_apart(void **state) {
  (void)state;
  const float las[] = {0.5f, 3.0f, -INFINITY, 80.0f, -2.0f, 0.0f, 1e-3f};
  const float lbs[] = {1.5f, -100.0f, 2.0f, 79.5f, -INFINITY, 0.0f};
  for (size_t m = 0; m < NMERGES; m++)
    for (int ti = 0; ti < 3; ti++) {
      dtl_dtype t = kTypes[ti];
      t_rand_state = 11;
      float *x = t_rand_reals(N, 2.0f, t), *y = t_rand_reals(N, 2.0f, t);
      void *a = t_pack(x, N, t), *b = t_pack(y, N, t);
      float la[S], lb[S], la_in[S];
      fill_lse(la, las, 7);
      fill_lse(lb, lbs, 6);
      memcpy(la_in, la, sizeof la);
      double ref[N], ref_l[S];
      merge_double(x, la_in, y, lb, ref, ref_l);
      assert_int_equal(kMerges[m](ROWS, H, D, a, H * D, la, b, H * D, lb, t), DTL_OK);
      for (int s = 0; s < S; s++) {
        bool ok = ref_l[s] == -INFINITY ? la[s] == -INFINITY : fabs(la[s] - ref_l[s]) <= 1e-6 * (1 + fabs(ref_l[s]));
        if (!ok) fail_msg("%s %s: lse[%d] %.9g, formula %.9g", merge_name(m), dtl_dtype_name(t), s, la[s], ref_l[s]);
        for (int d = 0; d < D; d++) {
          double g = t_load(a, (size_t)(s * D + d), t), r = ref[s * D + d];
          if (!(fabs(g - r) <= t_half_unit(t) * fabs(r) + 1e-6 * (1 + fabs(r))))
            fail_msg("%s %s: o[%d, %d] %.9g, formula %.9g", merge_name(m), dtl_dtype_name(t), s, d, g, r);
        }
      }
      free(x), free(y), free(a), free(b);
    }
}

static void merging_is_symmetric_and_its_grouping_changes_only_rounding(void **state) {
  (void)state;
  const float l1[] = {0.5f, 3.0f, -INFINITY, -7.0f}, l2[] = {1.0f, -INFINITY, 2.0f, 6.0f};
  const float l3[] = {-1.0f, 2.5f, 0.0f, -INFINITY, 4.0f};
  for (size_t m = 0; m < NMERGES; m++) {
    t_rand_state = 21;
    float *x = t_rand_reals(N, 2.0f, DTL_FLOAT32), *y = t_rand_reals(N, 2.0f, DTL_FLOAT32);
    float *z = t_rand_reals(N, 2.0f, DTL_FLOAT32);
    float a[N], b[N], c[N], la[S], lb[S], lc[S];
    /* a + b versus b + a: the same bits */
    memcpy(a, x, sizeof a), memcpy(b, y, sizeof b);
    fill_lse(la, l1, 4), fill_lse(lb, l2, 4);
    assert_int_equal(kMerges[m](ROWS, H, D, a, H * D, la, y, H * D, lb, DTL_FLOAT32), DTL_OK);
    float lb2[S], la2[S];
    fill_lse(lb2, l2, 4), fill_lse(la2, l1, 4);
    assert_int_equal(kMerges[m](ROWS, H, D, b, H * D, lb2, x, H * D, la2, DTL_FLOAT32), DTL_OK);
    assert_memory_equal(la, lb2, sizeof la);
    for (int i = 0; i < N; i++)
      if (la[i / D] != -INFINITY && a[i] != b[i]) fail_msg("%s: a+b and b+a differ at %d", merge_name(m), i);
    /* (a + b) + c versus a + (b + c) */
    float lc2[S];
    fill_lse(lc, l3, 5), fill_lse(lc2, l3, 5);
    assert_int_equal(kMerges[m](ROWS, H, D, a, H * D, la, z, H * D, lc, DTL_FLOAT32), DTL_OK); /* (a+b)+c */
    memcpy(c, y, sizeof c);
    float lbc[S];
    fill_lse(lbc, l2, 4);
    assert_int_equal(kMerges[m](ROWS, H, D, c, H * D, lbc, z, H * D, lc2, DTL_FLOAT32), DTL_OK); /* b+c */
    float a2[N], la3[S];
    memcpy(a2, x, sizeof a2), fill_lse(la3, l1, 4);
    assert_int_equal(kMerges[m](ROWS, H, D, a2, H * D, la3, c, H * D, lbc, DTL_FLOAT32), DTL_OK); /* a+(b+c) */
    for (int s = 0; s < S; s++) {
      assert_true(fabs(la[s] - la3[s]) <= 1e-6 * (1 + fabs(la[s])) || (la[s] == -INFINITY && la3[s] == -INFINITY));
      for (int d = 0; d < D; d++)
        if (!(fabs(a[s * D + d] - a2[s * D + d]) <= 1e-6 * (1 + fabs(a[s * D + d]))))
          fail_msg("%s: grouping changed o[%d, %d] beyond rounding: %.9g vs %.9g", merge_name(m), s, d, a[s * D + d],
                   a2[s * D + d]);
    }
    free(x), free(y), free(z);
  }
}

/* combine and rescale: the log-sum-exp of p states (some empty), and rescaling by one's own lse copies (and
 * rounds once to the type). */
static void combine_and_rescale_follow_their_definitions(void **state) {
  (void)state;
  const int p = 3;
  float l[3 * S];
  for (int r = 0; r < p; r++)
    for (int i = 0; i < S; i++) l[r * S + i] = (i + r) % 4 == 0 ? -INFINITY : 0.7f * (float)(i - 2 * r);
  for (int i = 0; i < S; i++) l[2 * S + i] = i == 4 ? -INFINITY : l[2 * S + i];
  for (int i = 0; i < p; i++) l[i * S + 4] = -INFINITY; /* state 4: empty everywhere */
  for (int side = 0; side < 1 + DTL_HAVE_NCCL; side++) {
    float L[S];
#if DTL_HAVE_NCCL
    if (side) assert_int_equal(dtl__attn_combine_emulate(S, p, l, S, L), DTL_OK);
    else
#endif
      assert_int_equal(dtl__attn_combine_host(S, p, l, S, L), DTL_OK);
    for (int i = 0; i < S; i++) {
      double m = -INFINITY, sum = 0;
      for (int r = 0; r < p; r++) m = fmax(m, l[r * S + i]);
      for (int r = 0; r < p && m != -INFINITY; r++) sum += exp(l[r * S + i] - m);
      double ref = m == -INFINITY ? -INFINITY : m + log(sum);
      assert_true(ref == -INFINITY ? L[i] == -INFINITY : fabs(L[i] - ref) <= 1e-6 * (1 + fabs(ref)));
    }
    for (int ti = 0; ti < 3; ti++) {
      dtl_dtype t = kTypes[ti];
      t_rand_state = 3;
      float *x = t_rand_reals(N, 5.0f, DTL_FLOAT32);
      void *dst = malloc(N * sizeof(float)), *want = t_pack(x, N, t);
      for (int i = 0; i < N; i++) /* empty states rescale to 0 */
        if (l[i / D] == -INFINITY) t_store(want, (size_t)i, 0.0f, t);
#if DTL_HAVE_NCCL
      if (side) assert_int_equal(dtl__attn_rescale_emulate(ROWS, H, D, x, H * D, true, l, l, dst, H * D, t), DTL_OK);
      else
#endif
        assert_int_equal(dtl__attn_rescale_host(ROWS, H, D, x, H * D, true, l, l, dst, H * D, t), DTL_OK);
      assert_memory_equal(dst, want, N * dtl_dtype_size(t));
      /* rescale against the combined lse: w = exp(l - L) */
      void *src = t_pack(x, N, t);
      assert_int_equal(dtl__attn_rescale_host(ROWS, H, D, src, H * D, false, l, L, dst, H * D, t), DTL_OK);
      for (int i = 0; i < N; i++) {
        double w = l[i / D] == -INFINITY || L[i / D] == -INFINITY ? 0 : exp((double)l[i / D] - L[i / D]);
        double r = w * t_load(src, (size_t)i, t), g = t_load(dst, (size_t)i, t);
        if (!(fabs(g - r) <= t_half_unit(t) * fabs(r) + 1e-6 * (1 + fabs(r))))
          fail_msg("rescale %s [%d]: %.9g vs %.9g", dtl_dtype_name(t), i, g, r);
      }
      free(x), free(dst), free(want), free(src);
    }
  }
}

/* --- the public host merge ------------------------------------------------------------------------------ */
static void public_merge_merges_and_names_bad_input_leaving_outputs_untouched(void **state) {
  (void)state;
  float oa[6] = {1, 2, 3, 4, 5, 6}, ob[6] = {6, 5, 4, 3, 2, 1}, la[2] = {0.0f, -INFINITY}, lb[2] = {0.0f, 1.0f};
  assert_int_equal(dtl_attn_state_merge(1, 2, 3, oa, la, ob, lb), DTL_OK);
  /* row head 0: equal lse, the mean; head 1: a empty, b's values and lse */
  const float want[6] = {3.5f, 3.5f, 3.5f, 3, 2, 1};
  assert_memory_equal(oa, want, sizeof want);
  assert_true(fabsf(la[0] - logf(2.0f)) < 1e-6f && la[1] == 1.0f);
  float keep[6], keep_l[2];
  memcpy(keep, oa, sizeof keep), memcpy(keep_l, la, sizeof keep_l);
  assert_int_equal(dtl_attn_state_merge(1, 2, 3, NULL, la, ob, lb), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "o_a=NULL"));
  assert_int_equal(dtl_attn_state_merge(1, 2, 3, oa, la, ob, NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "lse_b=NULL"));
  assert_int_equal(dtl_attn_state_merge(-1, 2, 3, oa, la, ob, lb), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "T=-1"));
  assert_int_equal(dtl_attn_state_merge(1, 2, 3, oa, la, oa, lb), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "o_b=o_a"));
  assert_int_equal(dtl_attn_state_merge(INT64_MAX / 2, 4, 3, oa, la, ob, lb), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "overflowing"));
  assert_memory_equal(oa, keep, sizeof keep);
  assert_memory_equal(la, keep_l, sizeof keep_l);
  /* nothing to merge: NULL is fine */
  assert_int_equal(dtl_attn_state_merge(0, 2, 3, NULL, NULL, NULL, NULL), DTL_OK);
  assert_int_equal(dtl_attn_state_merge_on(NULL, DTL_FLOAT32, 1, 2, 3, oa, la, ob, lb), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "c=NULL"));
}

/* --- token layouts ---------------------------------------------------------------------------------------- */
static void token_ranges_cover_the_sequence_once_in_the_documented_order(void **state) {
  (void)state;
  dtl_cp_range rg[2];
  /* the header's example: T = 10, cp = 2, zig-zag chunks of 3,3,3,1 */
  assert_int_equal(dtl_cp_token_ranges(DTL_CP_ZIGZAG, 10, 2, 0, rg), DTL_OK);
  assert_true(rg[0].offset == 0 && rg[0].count == 3 && rg[1].offset == 9 && rg[1].count == 1);
  assert_int_equal(dtl_cp_token_ranges(DTL_CP_ZIGZAG, 10, 2, 1, rg), DTL_OK);
  assert_true(rg[0].offset == 3 && rg[0].count == 3 && rg[1].offset == 6 && rg[1].count == 3);
  /* T < cp: chunks of one token, trailing ranks empty */
  assert_int_equal(dtl_cp_token_ranges(DTL_CP_ZIGZAG, 2, 4, 1, rg), DTL_OK);
  assert_true(rg[0].offset == 1 && rg[0].count == 1 && rg[1].count == 0);
  assert_int_equal(dtl_cp_token_ranges(DTL_CP_ZIGZAG, 2, 4, 3, rg), DTL_OK);
  assert_true(rg[0].count == 0 && rg[1].count == 0);
  for (int layout = 0; layout < 2; layout++)
    for (int cp = 1; cp <= 5; cp++)
      for (int64_t T = 0; T <= 23; T++) {
        int seen[23] = {0};
        for (int r = 0; r < cp; r++) {
          assert_int_equal(dtl_cp_token_ranges((dtl_cp_token_layout)layout, T, cp, r, rg), DTL_OK);
          if (layout == DTL_CP_CONTIGUOUS) assert_int_equal(rg[1].count, 0);
          for (int k = 0; k < 2; k++)
            for (int64_t i = 0; i < rg[k].count; i++) seen[rg[k].offset + i]++;
          if (layout == DTL_CP_ZIGZAG && T % (2 * cp) == 0) /* even chunks: the same tokens on every rank */
            assert_true(rg[0].count == T / (2 * cp) && rg[1].count == T / (2 * cp) &&
                        rg[1].offset == (2 * cp - 1 - r) * (T / (2 * cp)));
        }
        for (int64_t j = 0; j < T; j++) assert_int_equal(seen[j], 1);
      }
  assert_int_equal(dtl_cp_token_ranges(DTL_CP_ZIGZAG, 10, 2, 2, rg), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "rank=2"));
  assert_int_equal(dtl_cp_token_ranges((dtl_cp_token_layout)9, 10, 2, 0, rg), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "layout=9"));
  assert_int_equal(dtl_cp_token_ranges(DTL_CP_ZIGZAG, -1, 2, 0, rg), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "T=-1"));
  assert_int_equal(dtl_cp_token_ranges(DTL_CP_ZIGZAG, 10, 0, 0, rg), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "cp=0"));
  assert_int_equal(dtl_cp_token_ranges(DTL_CP_ZIGZAG, 10, 2, 0, NULL), DTL_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(merging_with_an_empty_state_is_the_identity),
      cmocka_unit_test(two_empty_states_stay_empty_without_nan),
      cmocka_unit_test(merge_equals_its_formula_in_double_even_for_lse_far_apart),
      cmocka_unit_test(merging_is_symmetric_and_its_grouping_changes_only_rounding),
      cmocka_unit_test(combine_and_rescale_follow_their_definitions),
      cmocka_unit_test(public_merge_merges_and_names_bad_input_leaving_outputs_untouched),
      cmocka_unit_test(token_ranges_cover_the_sequence_once_in_the_documented_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The router against an independent top-k: softmax in double and a brute-force ordering of every expert by
 * (probability descending, id ascending); its bad-input rules, each leaving the outputs unwritten. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "dtl.h"
#include "moe_oracle.h"

/* ids/weights of the k best experts of one row, by brute force over probabilities p. */
static void brute_topk(const double *p, int experts, int k, int32_t *ids, double *w) {
  int used[64] = {0};
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < experts; e++)
      if (!used[e] && (best < 0 || p[e] > p[best])) best = e; /* strict: the lower id wins a tie */
    used[best] = 1;
    ids[j] = best;
    w[j] = p[best];
  }
}

static void check_against_brute_force(int experts, int k, int renorm, int probabilities, uint64_t seed) {
  enum { T = 9 };
  float scores[T * 64];
  oracle_rng r = oracle_seed(seed, (uint64_t)(experts * 10 + k));
  for (int i = 0; i < T * experts; i++) {
    /* Coarse values make ties frequent. */
    double v = (double)oracle_int(&r, 0, 6) / 2.0;
    scores[i] = (float)(probabilities ? v / 3.0 : v - 1.5);
  }
  int32_t ids[T * 64];
  float w[T * 64];
  dtl_moe_router_params prm = {.mask = DTL_MOE_ROUTER_SCORES | DTL_MOE_ROUTER_RENORMALIZE,
                               .scores = probabilities ? DTL_MOE_SCORES_PROBABILITIES : DTL_MOE_SCORES_LOGITS,
                               .renormalize = renorm};
  assert_int_equal(dtl_moe_router_topk(scores, T, experts, k, &prm, ids, w), DTL_OK);
  for (int t = 0; t < T; t++) {
    double p[64], sum = 0, wp[64];
    int32_t want[64];
    for (int e = 0; e < experts; e++) {
      p[e] = probabilities ? scores[t * experts + e] : exp((double)scores[t * experts + e]);
      sum += p[e];
    }
    if (!probabilities)
      for (int e = 0; e < experts; e++) p[e] /= sum;
    brute_topk(p, experts, k, want, wp);
    double kept = 0;
    for (int j = 0; j < k; j++) kept += wp[j] > 0 ? wp[j] : 0;
    for (int j = 0; j < k; j++) {
      double ww = wp[j] > 0 ? wp[j] : 0;
      if (renorm && kept > 0) ww /= kept;
      assert_int_equal(ids[t * k + j], wp[j] > 0 ? want[j] : -1);
      assert_true(fabs((double)w[t * k + j] - ww) <= 1e-6);
    }
  }
}

static void topk_matches_brute_force_softmax(void **state) {
  (void)state;
  for (int experts = 1; experts <= 9; experts += 2)
    for (int k = 1; k <= experts; k++)
      for (int renorm = 0; renorm < 2; renorm++) check_against_brute_force(experts, k, renorm, 0, 11);
}

static void topk_uses_probabilities_as_given(void **state) {
  (void)state;
  for (int experts = 2; experts <= 8; experts += 3)
    for (int k = 1; k <= experts; k++)
      for (int renorm = 0; renorm < 2; renorm++) check_against_brute_force(experts, k, renorm, 1, 12);
}

static void ties_go_to_the_lowest_expert_id(void **state) {
  (void)state;
  float logits[6] = {1, 3, 3, 0, 3, 1};
  int32_t ids[3];
  float w[3];
  assert_int_equal(dtl_moe_router_topk(logits, 1, 6, 3, NULL, ids, w), DTL_OK);
  assert_int_equal(ids[0], 1);
  assert_int_equal(ids[1], 2);
  assert_int_equal(ids[2], 4);
  assert_true(w[0] == w[1] && w[1] == w[2]);
}

static void renormalized_weights_sum_to_one(void **state) {
  (void)state;
  float logits[2 * 5] = {0.1f, 2, -1, 0.5f, 0.7f, -3, -3, 4, 0, 1};
  int32_t ids[2 * 2];
  float w[2 * 2];
  dtl_moe_router_params prm = {.mask = DTL_MOE_ROUTER_RENORMALIZE, .renormalize = 1};
  assert_int_equal(dtl_moe_router_topk(logits, 2, 5, 2, &prm, ids, w), DTL_OK);
  for (int t = 0; t < 2; t++) assert_true(fabs((double)w[2 * t] + w[2 * t + 1] - 1.0) < 1e-6);
  assert_true(w[0] >= w[1] && w[2] >= w[3]);
}

static void zero_probability_picks_are_masked(void **state) {
  (void)state;
  float logits[4] = {-INFINITY, 1, -INFINITY, -INFINITY};
  int32_t ids[3];
  float w[3];
  assert_int_equal(dtl_moe_router_topk(logits, 1, 4, 3, NULL, ids, w), DTL_OK);
  assert_int_equal(ids[0], 1);
  assert_true(w[0] == 1.0f);
  assert_int_equal(ids[1], -1);
  assert_int_equal(ids[2], -1);
  assert_true(w[1] == 0.0f && w[2] == 0.0f);
  float probs[4] = {0, 0.5f, 0, 0.25f};
  dtl_moe_router_params prm = {.mask = DTL_MOE_ROUTER_SCORES, .scores = DTL_MOE_SCORES_PROBABILITIES};
  assert_int_equal(dtl_moe_router_topk(probs, 1, 4, 3, &prm, ids, w), DTL_OK);
  assert_int_equal(ids[0], 1);
  assert_int_equal(ids[1], 3);
  assert_int_equal(ids[2], -1);
}

/* Each bad input: DTL_ERR_INVALID_ARGUMENT, a message naming it, outputs untouched. */
static void expect_rejected(const float *scores, int64_t tokens, int experts, int k, const dtl_moe_router_params *prm,
                            const char *needle) {
  int32_t ids[16];
  float w[16];
  for (int i = 0; i < 16; i++) {
    ids[i] = 77;
    w[i] = 77;
  }
  assert_int_equal(dtl_moe_router_topk(scores, tokens, experts, k, prm, ids, w), DTL_ERR_INVALID_ARGUMENT);
  if (!strstr(dtl_last_error(), needle)) fail_msg("message '%s' does not name '%s'", dtl_last_error(), needle);
  for (int i = 0; i < 16; i++) assert_true(ids[i] == 77 && w[i] == 77);
}

static void bad_input_is_rejected_without_writing(void **state) {
  (void)state;
  float ok[2 * 4] = {0, 1, 2, 3, 3, 2, 1, 0};
  expect_rejected(ok, 2, 4, 5, NULL, "k=5");
  expect_rejected(ok, 2, 4, 0, NULL, "k=0");
  expect_rejected(ok, 2, 0, 1, NULL, "experts=0");
  expect_rejected(ok, -1, 4, 1, NULL, "tokens=-1");
  float nan_logit[2 * 4] = {0, 1, NAN, 3, 3, 2, 1, 0};
  expect_rejected(nan_logit, 2, 4, 2, NULL, "logit[0][2]");
  float inf_logit[2 * 4] = {0, 1, 2, 3, 3, INFINITY, 1, 0};
  expect_rejected(inf_logit, 2, 4, 2, NULL, "logit[1][1]");
  float all_masked[2 * 4] = {0, 1, 2, 3, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  expect_rejected(all_masked, 2, 4, 2, NULL, "token 1");
  dtl_moe_router_params probs = {.mask = DTL_MOE_ROUTER_SCORES, .scores = DTL_MOE_SCORES_PROBABILITIES};
  float negative[2 * 4] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, -0.1f, 0.3f, 0.3f};
  expect_rejected(negative, 2, 4, 2, &probs, "probability[1][1]");
  float nan_prob[2 * 4] = {0.1f, NAN, 0.3f, 0.4f, 0.5f, 0.1f, 0.3f, 0.3f};
  expect_rejected(nan_prob, 2, 4, 2, &probs, "probability[0][1]");
  float inf_prob[2 * 4] = {0.1f, 0.2f, 0.3f, INFINITY, 0.5f, 0.1f, 0.3f, 0.3f};
  expect_rejected(inf_prob, 2, 4, 2, &probs, "probability[0][3]");
  dtl_moe_router_params unknown = {.mask = DTL_MOE_ROUTER_SCORES | DTL_BIT(9)};
  expect_rejected(ok, 2, 4, 2, &unknown, "dtl_moe_router_topk: params.mask=0x201 has unknown bits 0x200");
  dtl_moe_router_params unknown_flag = {.flags = DTL_BIT(0)};
  expect_rejected(ok, 2, 4, 2, &unknown_flag, "params.flags=0x1 has unknown bits 0x1");
  dtl_moe_router_params bad_kind = {.mask = DTL_MOE_ROUTER_SCORES, .scores = (dtl_moe_scores)7};
  expect_rejected(ok, 2, 4, 2, &bad_kind, "scores=7");
  expect_rejected(NULL, 2, 4, 2, NULL, "scores=NULL");
}

static void zero_tokens_write_nothing(void **state) {
  (void)state;
  assert_int_equal(dtl_moe_router_topk(NULL, 0, 4, 2, NULL, NULL, NULL), DTL_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(topk_matches_brute_force_softmax),
      cmocka_unit_test(topk_uses_probabilities_as_given),
      cmocka_unit_test(ties_go_to_the_lowest_expert_id),
      cmocka_unit_test(renormalized_weights_sum_to_one),
      cmocka_unit_test(zero_probability_picks_are_masked),
      cmocka_unit_test(bad_input_is_rejected_without_writing),
      cmocka_unit_test(zero_tokens_write_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The pure parts of a dispatch layout: the capacity formula, both drop policies against an independent
 * selection (tests/moe/moe_oracle.h), the stable expert-major permutation and its inverse, and the expert
 * placement (torch.chunk blocks and tables). Exhaustive over small sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "moe/moe_internal.h"
#include "moe_oracle.h"

static void capacity_follows_the_documented_formula(void **state) {
  (void)state;
  /* ceil(tokens * k / experts * factor) */
  assert_int_equal(dtl__moe_capacity(10, 2, 8, 1.0), 3);   /* 2.5 -> 3 */
  assert_int_equal(dtl__moe_capacity(16, 2, 8, 1.0), 4);   /* exact */
  assert_int_equal(dtl__moe_capacity(16, 2, 8, 1.25), 5);  /* 5 */
  assert_int_equal(dtl__moe_capacity(16, 2, 8, 1.1), 5);   /* 4.4 -> 5 */
  assert_int_equal(dtl__moe_capacity(7, 1, 4, 0.5), 1);    /* 0.875 -> 1 */
  assert_int_equal(dtl__moe_capacity(0, 2, 8, 2.0), 0);
  for (int64_t t = 0; t < 40; t++)
    for (int k = 1; k <= 4; k++)
      for (int e = k; e <= 9; e++) assert_int_equal(dtl__moe_capacity(t, k, e, 0.75), oracle_capacity(t, k, e, 0.75));
}

/* Random routing with masked slots and duplicate picks allowed (the layout accepts both). */
static void random_routing(oracle_rng *r, int64_t tokens, int k, int experts, int32_t *ids, float *w) {
  for (int64_t i = 0; i < tokens * k; i++) {
    ids[i] = oracle_int(r, -1, experts - 1);
    w[i] = (float)oracle_int(r, 0, 3) / 4.0f; /* ties are frequent */
  }
}

static void check_route(const int32_t *ids, const float *w, int64_t tokens, int k, int experts, int64_t cap,
                        dtl_moe_drop_policy policy) {
  dtl__moe_route r;
  assert_int_equal(dtl__moe_route_build(ids, w, tokens, k, experts, cap, policy, &r), DTL_OK);
  int keep[512];
  oracle_keep(ids, w, tokens, k, experts, cap, policy == DTL_MOE_DROP_PROBABILITY, keep);
  int64_t pairs = tokens * k, kept_all = 0;
  assert_int_equal(r.pairs, pairs);
  for (int e = 0; e < experts; e++) {
    int64_t kept = 0, dropped = 0;
    for (int64_t i = 0; i < pairs; i++)
      if (ids[i] == e) {
        if (keep[i])
          kept++;
        else
          dropped++;
      }
    assert_int_equal(r.kept[e], kept);
    assert_int_equal(r.dropped[e], dropped);
    assert_int_equal(r.start[e + 1] - r.start[e], kept);
    assert_int_equal(r.start[e], kept_all);
    kept_all += kept;
    /* Expert e's block of the permutation: exactly its kept pairs, in (token, slot) order. */
    int64_t at = r.start[e];
    for (int64_t i = 0; i < pairs; i++)
      if (ids[i] == e && keep[i]) {
        assert_int_equal(r.perm[at], i);
        at++;
      }
  }
  assert_int_equal(r.kept_all, kept_all);
  for (int64_t i = 0; i < pairs; i++) {
    if (keep[i]) {
      assert_true(r.inv[i] >= 0 && r.inv[i] < kept_all);
      assert_int_equal(r.perm[r.inv[i]], i);
    } else {
      assert_int_equal(r.inv[i], -1);
    }
  }
  dtl__moe_route_free(&r);
}

static void drops_and_permutation_match_the_reference(void **state) {
  (void)state;
  int32_t ids[512];
  float w[512];
  oracle_rng rng = oracle_seed(3, 4);
  for (int64_t tokens = 0; tokens <= 24; tokens += 3)
    for (int k = 1; k <= 4; k++)
      for (int experts = 1; experts <= 6; experts++)
        for (int rep = 0; rep < 3; rep++) {
          random_routing(&rng, tokens, k, experts, ids, w);
          for (int64_t cap = -1; cap <= 5; cap++) {
            check_route(ids, w, tokens, k, experts, cap, DTL_MOE_DROP_POSITION);
            check_route(ids, w, tokens, k, experts, cap, DTL_MOE_DROP_PROBABILITY);
          }
        }
}

static void position_policy_keeps_the_first_pairs(void **state) {
  (void)state;
  /* tokens 0..4, k=1, all to expert 0, capacity 2: tokens 0 and 1 survive. */
  int32_t ids[5] = {0, 0, 0, 0, 0};
  float w[5] = {0.1f, 0.2f, 0.9f, 0.9f, 0.3f};
  dtl__moe_route r;
  assert_int_equal(dtl__moe_route_build(ids, w, 5, 1, 1, 2, DTL_MOE_DROP_POSITION, &r), DTL_OK);
  assert_int_equal(r.kept[0], 2);
  assert_int_equal(r.dropped[0], 3);
  assert_int_equal(r.perm[0], 0);
  assert_int_equal(r.perm[1], 1);
  dtl__moe_route_free(&r);
}

static void probability_policy_keeps_the_heaviest_ties_by_position(void **state) {
  (void)state;
  int32_t ids[5] = {0, 0, 0, 0, 0};
  float w[5] = {0.1f, 0.2f, 0.9f, 0.9f, 0.9f};
  dtl__moe_route r;
  assert_int_equal(dtl__moe_route_build(ids, w, 5, 1, 1, 2, DTL_MOE_DROP_PROBABILITY, &r), DTL_OK);
  assert_int_equal(r.kept[0], 2);
  assert_int_equal(r.perm[0], 2); /* the two earliest of the three 0.9s, listed in token order */
  assert_int_equal(r.perm[1], 3);
  assert_int_equal(r.inv[4], -1);
  dtl__moe_route_free(&r);
}

static void routing_check_names_the_bad_entry(void **state) {
  (void)state;
  int32_t ids[4] = {0, 1, 2, 3};
  float w[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  assert_int_equal(dtl__moe_check_routing("f", ids, w, 2, 2, 4), DTL_OK);
  ids[3] = 4;
  assert_int_equal(dtl__moe_check_routing("f", ids, w, 2, 2, 4), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "ids[1][1]=4"));
  ids[3] = -1;
  w[3] = -1.0f; /* a masked slot's weight is ignored */
  assert_int_equal(dtl__moe_check_routing("f", ids, w, 2, 2, 4), DTL_OK);
  w[2] = -0.0f;
  assert_int_equal(dtl__moe_check_routing("f", ids, w, 2, 2, 4), DTL_OK);
  w[2] = -0.25f;
  assert_int_equal(dtl__moe_check_routing("f", ids, w, 2, 2, 4), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "weights[1][0]"));
}

/* torch.chunk over ranks: ceil(experts / ranks) each, the tail gets the rest (possibly nothing). */
static void chunk_placement_matches_torch_chunk(void **state) {
  (void)state;
  for (int experts = 1; experts <= 12; experts++)
    for (int ranks = 1; ranks <= 6; ranks++) {
      dtl_moe_placement *p = NULL;
      assert_int_equal(dtl_moe_placement_create(experts, ranks, NULL, &p), DTL_OK);
      int c = (experts + ranks - 1) / ranks, total = 0;
      for (int r = 0; r < ranks; r++) {
        int lo = r * c < experts ? r * c : experts, hi = (r + 1) * c < experts ? (r + 1) * c : experts;
        assert_int_equal(dtl_moe_placement_local_count(p, r), hi - lo);
        for (int j = 0; j < hi - lo; j++) assert_int_equal(dtl_moe_placement_local_expert(p, r, j), lo + j);
        assert_int_equal(dtl_moe_placement_local_expert(p, r, hi - lo), -1);
        total += hi - lo;
      }
      assert_int_equal(total, experts);
      for (int e = 0; e < experts; e++) assert_int_equal(dtl_moe_placement_owner(p, e), e / c);
      dtl_moe_placement_destroy(p);
    }
  dtl_moe_placement *p = NULL;
  assert_int_equal(dtl_moe_placement_create(5, 4, NULL, &p), DTL_OK); /* the header's example: 2,2,1,0 */
  assert_int_equal(dtl_moe_placement_local_count(p, 0), 2);
  assert_int_equal(dtl_moe_placement_local_count(p, 2), 1);
  assert_int_equal(dtl_moe_placement_local_count(p, 3), 0);
  dtl_moe_placement_destroy(p);
}

static void table_placement_orders_local_experts_by_id(void **state) {
  (void)state;
  int owner[6] = {2, 0, 2, 1, 0, 2};
  dtl_moe_placement *p = NULL;
  assert_int_equal(dtl_moe_placement_create(6, 4, owner, &p), DTL_OK);
  assert_int_equal(dtl_moe_placement_local_count(p, 0), 2);
  assert_int_equal(dtl_moe_placement_local_expert(p, 0, 0), 1);
  assert_int_equal(dtl_moe_placement_local_expert(p, 0, 1), 4);
  assert_int_equal(dtl_moe_placement_local_count(p, 2), 3);
  assert_int_equal(dtl_moe_placement_local_expert(p, 2, 2), 5);
  assert_int_equal(dtl_moe_placement_local_count(p, 3), 0);
  assert_int_equal(dtl_moe_placement_owner(p, 3), 1);
  assert_int_equal(dtl_moe_placement_owner(p, 6), -1);
  assert_int_equal(dtl_moe_placement_local_count(p, 4), -1);
  dtl_moe_placement_destroy(p);
}

static void bad_placements_are_rejected(void **state) {
  (void)state;
  dtl_moe_placement *p = (dtl_moe_placement *)(uintptr_t)0x1;
  int owner[3] = {0, 3, 1};
  assert_int_equal(dtl_moe_placement_create(3, 3, owner, &p), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "owner[1]=3"));
  owner[1] = -1;
  assert_int_equal(dtl_moe_placement_create(3, 3, owner, &p), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_moe_placement_create(0, 3, NULL, &p), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_moe_placement_create(3, 0, NULL, &p), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_moe_placement_create(3, 3, NULL, NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_true(p == (dtl_moe_placement *)(uintptr_t)0x1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(capacity_follows_the_documented_formula),
      cmocka_unit_test(drops_and_permutation_match_the_reference),
      cmocka_unit_test(position_policy_keeps_the_first_pairs),
      cmocka_unit_test(probability_policy_keeps_the_heaviest_ties_by_position),
      cmocka_unit_test(routing_check_names_the_bad_entry),
      cmocka_unit_test(chunk_placement_matches_torch_chunk),
      cmocka_unit_test(table_placement_orders_local_experts_by_id),
      cmocka_unit_test(bad_placements_are_rejected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

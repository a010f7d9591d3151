/* SPDX-License-Identifier: Apache-2.0 */
/* The planner at the edges of its cost model: step prices that reach their cap (huge tensors, alpha =
 * 1e300) and models under which long chains of collectives cost nothing (alpha = beta = 0). Every such
 * request is valid and must get a legal plan of at most DTL__MAX_PLAN_STEPS steps, the cheapest of that
 * length (checked against the exhaustive search); DTL_ERR_INTERNAL must be unreachable. */
#include "test_planner_common.h"

static int setup(void **state) {
  unsetenv("DTL_PLAN_TUNE");
  return 0;
}

/* Plans src -> dst (placement text) under c, checks the plan against the restated rules and returns it. */
static dtl_plan *plan_ok(dtl_mesh *m, dtl_dtype t, int nd, const int64_t *shape, const char *from, const char *to,
                         const dtl_cost_model *c, dtl_layout **src, dtl_layout **dst) {
  *src = tp_layout(m, t, nd, shape, from);
  *dst = tp_layout(m, t, nd, shape, to);
  dtl_plan *p = NULL;
  dtl_status st = dtl_plan_create_with_cost(*src, *dst, c, &p);
  if (st != DTL_OK) fail_msg("%s -> %s: %s: %s", from, to, dtl_status_name(st), dtl_last_error());
  assert_true(p->nsteps <= DTL__MAX_PLAN_STEPS);
  tp_check_plan(p, c);
  return p;
}

/* Each step of a 2^30-element i8 redistribution over four mesh dims costs more than the cap; four or more
 * capped prices once added up to the search's "never reached" value, so every route looked unreachable.
 * (Today one exchange does it, itself priced at the cap; the per-dim routes it beat cost four capped steps.) */
static void routes_of_capped_step_prices_still_plan(void **state) {
  dtl_cost_model def;
  dtl_cost_model_default(DTL_MEMORY_HOST, &def);
  dtl_mesh *m = tp_mesh(4, (int[]){2, 2, 2, 2}, NULL);
  dtl_layout *src, *dst;
  dtl_plan *p =
      plan_ok(m, DTL_INT8, 2, (int64_t[]){1000000000, 1000000000}, "S0,S1,S0,S1", "S1,S0,S1,S0", &def, &src, &dst);
  assert_true(p->nsteps >= 1);
  assert_true(dtl_plan_cost(p) > 1e5); /* at least one capped step, priced 2.9e5 s */
  dtl_plan_destroy(p);
  dtl_layout_destroy(src);
  dtl_layout_destroy(dst);
  /* alpha = 1e300 caps every collective of any request; the search must still tell routes apart by length. */
  const dtl_cost_model huge = {.mask = DTL_COST_ALPHA, .alpha_s = 1e300};
  p = plan_ok(m, DTL_FLOAT32, 2, (int64_t[]){8, 8}, "S0,S1,S0,S1", "S1,S0,S1,S0", &huge, &src, &dst);
  assert_int_equal(p->nsteps, 1); /* the exchange: one capped step, where per-dim routes need four */
  dtl_plan_destroy(p);
  dtl_layout_destroy(src);
  dtl_layout_destroy(dst);
  const dtl_cost_model all_huge = {
      .mask = DTL__COST_ALL, .alpha_s = 1e300, .beta_s_per_byte = 1e300, .local_beta_s_per_byte = 1e300};
  p = plan_ok(m, DTL_FLOAT32, 2, (int64_t[]){8, 8}, "P,R,S0,R", "S1,S0,R,P", &all_huge, &src, &dst);
  dtl_plan_destroy(p);
  dtl_layout_destroy(src);
  dtl_layout_destroy(dst);
  dtl_mesh_destroy(m);
}

/* With free collectives and paid local steps the cheapest unlimited route of this request has 17 steps;
 * the planner must return the cheapest route of at most 16 (the exhaustive search over the same
 * placements to depth 16 agrees), not fail after searching. */
static void free_collectives_plan_within_the_step_limit(void **state) {
  const dtl_cost_model free_coll = {.mask = DTL_COST_ALPHA | DTL_COST_BETA};
  dtl_mesh *m = tp_mesh(4, (int[]){3, 2, 4, 3}, NULL);
  const int64_t shape[3] = {1, 16, 8};
  dtl_layout *src, *dst;
  dtl_plan *p = plan_ok(m, DTL_FLOAT32, 3, shape, "P,R,R,P", "S0,S0,S1,S1", &free_coll, &src, &dst);
  dtl_cost_model c = p->cost; /* resolved: local_beta is the default */
  int64_t planned = tp_check_plan(p, &c);
  const dtl_placement alpha[] = {dtl_replicate(), dtl_shard(0), dtl_shard(1), dtl_shard(2), dtl_partial(DTL_SUM)};
  int len = 0;
  int64_t best = tp_brute_force(src, dst, &c, alpha, 5, DTL__MAX_PLAN_STEPS, &len, NULL);
  if (planned != best)
    fail_msg("planner %lld ps in %d steps, exhaustive (depth %d) %lld ps in %d steps", (long long)planned, p->nsteps,
             DTL__MAX_PLAN_STEPS, (long long)best, len);
  dtl_plan_destroy(p);
  dtl_layout_destroy(src);
  dtl_layout_destroy(dst);
  dtl_mesh_destroy(m);
}

/* A sweep of 4-d meshes, tensors of 1 to 4 dims and extreme models (every field 0, 1e-300, the default or
 * 1e300): each request is planned (or refused as unsupported), never an internal error, and its plan is
 * legal and within the step limit. */
static void extreme_cost_models_never_fail_internally(void **state) {
  static const double values[] = {0, 1e-300, -1 /* default */, 1e300};
  static const int meshes[][4] = {{2, 2, 2, 2}, {3, 2, 4, 3}, {1, 4, 1, 2}, {4, 4, 4, 4}};
  static const int64_t shapes[][4] = {{1, 16, 8, 0}, {5, 7, 3, 2}, {1000000000, 1000000000, 0, 0}, {0, 4, 0, 0}};
  static const int ndims[] = {3, 4, 2, 2};
  unsigned seed = 12345;
  int planned = 0, unsupported = 0;
  for (int it = 0; it < 400; it++) {
    int mi = it % 4, si = (it / 4) % 4, nd = ndims[si];
    dtl_cost_model c = {.mask = DTL__COST_ALL};
    double *f[3] = {&c.alpha_s, &c.beta_s_per_byte, &c.local_beta_s_per_byte};
    for (int k = 0; k < 3; k++) {
      seed = seed * 1103515245u + 12345u;
      double v = values[(seed >> 16) % 4];
      if (v < 0)
        c.mask &= ~(uint64_t)(DTL_COST_ALPHA << k);
      else
        *f[k] = v;
    }
    dtl_placement pl[2][DTL_MAX_MESH_DIMS];
    for (int e = 0; e < 2; e++)
      for (int md = 0; md < 4; md++) {
        seed = seed * 1103515245u + 12345u;
        int r = (int)((seed >> 16) % (unsigned)(nd + 2));
        pl[e][md] = r == 0 ? dtl_replicate() : r == 1 ? dtl_partial(DTL_SUM) : dtl_shard(r - 2);
      }
    dtl_mesh *m = tp_mesh(4, meshes[mi], NULL);
    dtl_layout *src = NULL, *dst = NULL;
    assert_int_equal(dtl_layout_create(m, DTL_INT8, nd, shapes[si], pl[0], &src), DTL_OK);
    assert_int_equal(dtl_layout_create(m, DTL_INT8, nd, shapes[si], pl[1], &dst), DTL_OK);
    dtl_plan *p = NULL;
    dtl_status st = dtl_plan_create_with_cost(src, dst, &c, &p);
    if (st == DTL_OK) {
      assert_true(p->nsteps <= DTL__MAX_PLAN_STEPS);
      tp_check_plan(p, &p->cost);
      planned++;
    } else {
      if (st != DTL_ERR_UNSUPPORTED) fail_msg("request %d: %s: %s", it, dtl_status_name(st), dtl_last_error());
      unsupported++;
    }
    dtl_plan_destroy(p);
    dtl_layout_destroy(src);
    dtl_layout_destroy(dst);
    dtl_mesh_destroy(m);
  }
  print_message("%d planned, %d refused as unsupported\n", planned, unsupported);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(routes_of_capped_step_prices_still_plan),
      cmocka_unit_test(free_collectives_plan_within_the_step_limit),
      cmocka_unit_test(extreme_cost_models_never_fail_internally),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}

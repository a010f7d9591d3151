/* SPDX-License-Identifier: Apache-2.0 */
/* The scratch bound of dtl_plan_create on one mesh (include/dtl/plan.h, Memory): on every coordinate of the mesh,
 * dtl_plan_scratch_bytes is at most the larger of that coordinate's local source and target bytes, for the cases
 * that independent checks found over it and for random layout pairs; and the planner's own check of a plan over
 * every rank (dtl__plan_fits, which visits representative coordinates on large meshes) reports the largest
 * scratch of any coordinate. Between two meshes the same bound is checked under MPI (test_plan_scratch_meshes). */
#include "scratch_cases.h"
#include "test_planner_common.h"

static int setup(void **state) {
  (void)state;
  unsetenv("DTL_PLAN_TUNE");
  unsetenv("DTL_PROFILE");
  return 0;
}

static size_t local_bytes(const dtl_layout *l) { return l->local_count * dtl_dtype_size(l->dtype); }

/* Plans from -> to on every coordinate of the mesh; fails naming the first coordinate over the bound. Returns the
 * largest scratch of any coordinate, or SIZE_MAX when the pair is refused (UNSUPPORTED). */
static size_t check_every_coordinate(int M, const int *mshape, dtl_dtype t, int nd, const int64_t *shape,
                                     const dtl_placement *from, const dtl_placement *to) {
  int coord[DTL_MAX_MESH_DIMS] = {0}, size = 1;
  for (int m = 0; m < M; m++) size *= mshape[m];
  size_t worst = 0;
  for (int r = 0; r < size; r++) {
    for (int m = M - 1, x = r; m >= 0; m--) coord[m] = x % mshape[m], x /= mshape[m];
    dtl_mesh *mesh = tp_mesh(M, mshape, coord);
    dtl_layout *a = NULL, *b = NULL;
    assert_int_equal(dtl_layout_create(mesh, t, nd, shape, from, &a), DTL_OK);
    assert_int_equal(dtl_layout_create(mesh, t, nd, shape, to, &b), DTL_OK);
    dtl_plan *p = NULL;
    dtl_status st = dtl_plan_create(a, b, &p);
    if (st == DTL_ERR_UNSUPPORTED) {
      dtl_layout_destroy(a);
      dtl_layout_destroy(b);
      dtl_mesh_destroy(mesh);
      return SIZE_MAX;
    }
    if (st != DTL_OK) fail_msg("dtl_plan_create: %s", dtl_last_error());
    size_t scr = dtl_plan_scratch_bytes(p), ia = local_bytes(a), ib = local_bytes(b), ends = ia > ib ? ia : ib;
    if (scr > ends) {
      char fa[64], fb[64], ex[4096] = "";
      tp_format(from, M, fa, sizeof fa);
      tp_format(to, M, fb, sizeof fb);
      dtl_plan_explain(p, ex, sizeof ex);
      fail_msg("%s [%s] -> [%s], rank %d: scratch %zu B > max(src %zu B, dst %zu B)\n%s", dtl_dtype_name(t), fa, fb, r,
               scr, ia, ib, ex);
    }
    if (scr > worst) worst = scr;
    dtl_plan_destroy(p);
    dtl_layout_destroy(a);
    dtl_layout_destroy(b);
    dtl_mesh_destroy(mesh);
  }
  return worst;
}

static void parse(const char *text, int M, dtl_placement *out) {
  int n = 0;
  if (dtl_placements_parse(text, out, DTL_MAX_MESH_DIMS, &n) != DTL_OK || n != M) fail_msg("parse %s", text);
}

/* The one-mesh cases of issue 17 (scratch_cases.h; each was over the bound on some rank), and the 4x2x3 pair whose
 * bound cost a collective, on every coordinate. */
static void scratch_never_exceeds_max_local_src_dst_on_listed_cases(void **state) {
  (void)state;
  static const scratch_case more = {3, {4, 2, 3}, DTL_FLOAT32, 2, {8, 16}, "P,S0,P", "S0,R,P"};
  for (int i = 0; i <= SCRATCH_LISTED_CASES; i++) {
    const scratch_case *c = i < SCRATCH_LISTED_CASES ? &scratch_listed_cases[i] : &more;
    dtl_placement a[3], b[3];
    parse(c->from, c->mesh_ndim, a);
    parse(c->to, c->mesh_ndim, b);
    assert_true(check_every_coordinate(c->mesh_ndim, c->mesh, c->t, c->nd, c->shape, a, b) != SIZE_MAX);
  }
}

/* A pair fuzz_plan found: R -> P(sum) off coordinate 0 builds the identity in scratch, so coordinate 1 of a Partial
 * mesh dim must stand for its others when the planner checks the bound (free local copies make that route cheapest). */
static void scratch_bound_counts_the_identity_a_partial_coordinate_builds(void **state) {
  (void)state;
  setenv("DTL_PLAN_TUNE", "local_beta=0", 1);
  dtl_placement a[3], b[3];
  parse("R,P(sum),P(sum)", 3, a);
  parse("P(sum),S(0),S(0)", 3, b);
  assert_true(check_every_coordinate(3, (int[]){2, 2, 2}, DTL_FLOAT32, 1, (int64_t[]){8}, a, b) != SIZE_MAX);
  unsetenv("DTL_PLAN_TUNE");
}

static uint64_t rng_next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}
static int rng_below(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }

static dtl_placement random_placement(uint64_t *s, int nd, dtl_reduce_op op) {
  int k = rng_below(s, 4);
  if (k == 0) return dtl_replicate();
  if (k == 3) return dtl_partial(op);
  return dtl_shard(rng_below(s, nd));
}

/* Random pairs on meshes of 1-3 dims of 1-4 (at most 12 ranks), tensors of 1-3 dims of 0-12 (uneven and empty
 * splits), Partials of one op per layout (sum, max, prod or avg), every pair on every coordinate. */
static void scratch_never_exceeds_max_local_src_dst_on_random_plans(void **state) {
  (void)state;
  static const dtl_reduce_op ops[] = {DTL_SUM, DTL_MAX, DTL_PROD, DTL_AVG};
  static const dtl_dtype types[] = {DTL_FLOAT32, DTL_FLOAT64, DTL_INT32, DTL_FLOAT16, DTL_FLOAT8_E4M3};
  uint64_t seed = 17;
  int planned = 0;
  for (int it = 0; it < 1500; it++) {
    int M = 1 + rng_below(&seed, 3), mshape[3], size = 1;
    for (int m = 0; m < M; m++) size *= mshape[m] = 1 + rng_below(&seed, 4);
    if (size > 12) continue;
    int nd = 1 + rng_below(&seed, 3);
    int64_t shape[3];
    for (int d = 0; d < nd; d++) shape[d] = rng_below(&seed, 13);
    dtl_dtype t = types[rng_below(&seed, 5)];
    dtl_reduce_op oa = ops[rng_below(&seed, 4)], ob = rng_below(&seed, 2) ? oa : ops[rng_below(&seed, 4)];
    if (t == DTL_INT32 && oa == DTL_AVG) oa = DTL_SUM;
    if (t == DTL_INT32 && ob == DTL_AVG) ob = DTL_SUM;
    if (t == DTL_FLOAT8_E4M3) oa = oa == DTL_SUM ? DTL_MIN : DTL_MAX, ob = ob == DTL_SUM ? DTL_MIN : DTL_MAX; /* only */
    dtl_placement a[3], b[3];
    for (int m = 0; m < M; m++) a[m] = random_placement(&seed, nd, oa);
    for (int m = 0; m < M; m++) b[m] = random_placement(&seed, nd, ob);
    planned += check_every_coordinate(M, mshape, t, nd, shape, a, b) != SIZE_MAX;
  }
  assert_true(planned > 500);
}

/* dtl__plan_fits' largest scratch over the ranks (by representative coordinates when the plan has no exchange) is
 * the largest scratch that any coordinate's own plan reports, on meshes where the two can be compared. */
static void fits_reports_the_largest_scratch_of_any_coordinate(void **state) {
  (void)state;
  static const struct {
    int M, mesh[3];
    int nd;
    int64_t shape[3];
    const char *from, *to;
  } cases[] = {
      {3, {3, 7, 5}, 2, {11, 13}, "S0,S1,R", "R,S0,S1"},
      {3, {3, 7, 5}, 3, {5, 9, 3}, "P,S1,S0", "S0,R,S2"},
      {2, {7, 6}, 2, {20, 3}, "S1,S0", "S0,S1"},
      {3, {2, 9, 2}, 2, {8, 16}, "P,S1,R", "R,S0,S1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    dtl_placement a[3], b[3];
    parse(cases[i].from, cases[i].M, a);
    parse(cases[i].to, cases[i].M, b);
    int coord[3] = {0};
    dtl_mesh *mesh = tp_mesh(cases[i].M, cases[i].mesh, coord);
    dtl_layout *la = NULL, *lb = NULL;
    assert_int_equal(dtl_layout_create(mesh, DTL_FLOAT32, cases[i].nd, cases[i].shape, a, &la), DTL_OK);
    assert_int_equal(dtl_layout_create(mesh, DTL_FLOAT32, cases[i].nd, cases[i].shape, b, &lb), DTL_OK);
    dtl_plan *p = NULL;
    assert_int_equal(dtl__plan_create("test", la, lb, NULL, (size_t)1 << 40, &p), DTL_OK);
    bool fits = false;
    size_t worst = 0;
    assert_int_equal(dtl__plan_fits("test", p, (size_t)1 << 40, &fits, &worst), DTL_OK);
    /* Every coordinate's figure for the same route: the cheapest route (a limit no plan reaches). */
    size_t each = 0;
    for (int r = 0; r < mesh->size; r++) {
      int c[3];
      for (int m = cases[i].M - 1, x = r; m >= 0; m--) c[m] = x % cases[i].mesh[m], x /= cases[i].mesh[m];
      dtl_mesh *mc = tp_mesh(cases[i].M, cases[i].mesh, c);
      dtl_layout *ca = NULL, *cb = NULL;
      assert_int_equal(dtl_layout_create(mc, DTL_FLOAT32, cases[i].nd, cases[i].shape, a, &ca), DTL_OK);
      assert_int_equal(dtl_layout_create(mc, DTL_FLOAT32, cases[i].nd, cases[i].shape, b, &cb), DTL_OK);
      dtl_plan *q = NULL;
      assert_int_equal(dtl__plan_create("test", ca, cb, NULL, (size_t)1 << 40, &q), DTL_OK);
      if (dtl_plan_scratch_bytes(q) > each) each = dtl_plan_scratch_bytes(q);
      dtl_plan_destroy(q);
      dtl_layout_destroy(ca);
      dtl_layout_destroy(cb);
      dtl_mesh_destroy(mc);
    }
    assert_true(fits);
    assert_int_equal(worst, each);
    dtl_plan_destroy(p);
    dtl_layout_destroy(la);
    dtl_layout_destroy(lb);
    dtl_mesh_destroy(mesh);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(scratch_never_exceeds_max_local_src_dst_on_listed_cases),
      cmocka_unit_test(scratch_bound_counts_the_identity_a_partial_coordinate_builds),
      cmocka_unit_test(scratch_never_exceeds_max_local_src_dst_on_random_plans),
      cmocka_unit_test(fits_reports_the_largest_scratch_of_any_coordinate),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}

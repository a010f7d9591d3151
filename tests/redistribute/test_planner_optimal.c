/* SPDX-License-Identifier: Apache-2.0 */
/* The planner finds the cheapest legal plan: for every pair of placement vectors over {R, S0, S1, P} on
 * 2x2, 2x3 and 4x2 meshes (also 2x4 and 2x3 over several nodes, and a sample on 2x2x2), even, uneven, tiny and
 * empty 2-D shapes, and several cost models, its plan is legal under the restated rules, ends at the target, and costs exactly what an
 * exhaustive search over transition sequences (per-dim steps, and one exchange to finish) finds, when no scratch
 * budget holds it back (the plans here are made with an unreachable limit; the budget has its own tests). Pairs the
 * rules leave without a route (S -> P, P(a) -> P(b) on a mesh dim) must be refused as unsupported. */
#include "test_planner_common.h"

typedef struct {
  long pairs, unsupported, steps, collectives, visited, detours;
} tp_tally;

static dtl_cost_model tp_models[4];
static const char *tp_model_names[4] = {"mpi", "nccl", "bandwidth-only", "latency-only"};

static int setup_models(void **state) {
  dtl_cost_model_default(DTL_MEMORY_HOST, &tp_models[0]);
  dtl_cost_model_default(DTL_MEMORY_DEVICE, &tp_models[1]);
  tp_models[2] = (dtl_cost_model){
      .mask = DTL__COST_ALL, .beta_s_per_byte = 1e-9, .local_beta_s_per_byte = 1e-11, .inter_beta_s_per_byte = 4e-9};
  tp_models[3] = (dtl_cost_model){.mask = DTL__COST_ALL, .alpha_s = 1e-6, .inter_alpha_s = 3e-6};
  unsetenv("DTL_PLAN_TUNE");
  return 0;
}

/* Whether the rules leave src -> dst without any route: some mesh dim (size > 1) must go from S to P or
 * between two Partial ops, and no step ever enters P from anything but R. */
static bool tp_refused(const dtl_layout *src, const dtl_layout *dst) {
  for (int md = 0; md < src->mesh->ndim; md++) {
    dtl_placement a = src->placements[md], b = dst->placements[md];
    if (src->mesh->shape[md] == 1) continue;
    if (a.kind == DTL_SHARD && b.kind == DTL_PARTIAL && b.op == DTL_AVG) return true;
    if (a.kind == DTL_PARTIAL && b.kind == DTL_PARTIAL && a.op != b.op) return true;
  }
  return false;
}

/* Plans src -> dst under model c and compares with the exhaustive search over alpha. */
static void tp_check_pair(const dtl_layout *src, const dtl_layout *dst, const dtl_cost_model *c, const char *cname,
                          const dtl_placement *alpha, int nalpha, int depth, tp_tally *t) {
  static unsigned long tp_seen; /* under ASan one pair in six (sanitized.h): still thousands of pairs */
  if (!DTL_TEST_SAMPLED(tp_seen, 6)) return;
  dtl_plan *p = NULL;
  dtl_status st = dtl__plan_create("test", src, dst, c, SIZE_MAX - 1, &p);
  char a[64], b[64];
  tp_format(src->placements, src->mesh->ndim, a, sizeof a);
  tp_format(dst->placements, dst->mesh->ndim, b, sizeof b);
  t->pairs++;
  if (tp_refused(src, dst)) {
    if (st != DTL_ERR_UNSUPPORTED) fail_msg("%s -> %s: expected DTL_ERR_UNSUPPORTED, got %s", a, b, dtl_status_name(st));
    TP_EXPECT_MESSAGE("is unsupported");
    t->unsupported++;
    return;
  }
  if (st != DTL_OK) fail_msg("%s -> %s (%s): %s", a, b, cname, dtl_last_error());
  int64_t planned = tp_check_plan(p, c);
  int len = 0;
  uint64_t best_bytes = 0;
  int64_t best = tp_brute_force_bytes(src, dst, c, alpha, nalpha, depth, &len, &best_bytes, &t->visited);
  if (planned != best || p->nsteps > depth)
    fail_msg("%s -> %s on %dx%d... shape [%lld,%lld] model %s: planner %lld ps in %d steps, exhaustive %lld ps in %d steps",
             a, b, src->mesh->shape[0], src->mesh->shape[1], (long long)src->shape[0], (long long)src->shape[1], cname,
             (long long)planned, p->nsteps, (long long)best, len);
  /* Among the cheapest, the planner takes the fewest bytes over all ranks, then the fewest steps. */
  uint64_t planned_bytes = tp_plan_bytes(p);
  if (planned_bytes != best_bytes || p->nsteps != len)
    fail_msg("%s -> %s (%s): planner %llu B over all ranks in %d steps, exhaustive %llu B in %d steps", a, b, cname,
             (unsigned long long)planned_bytes, p->nsteps, (unsigned long long)best_bytes, len);
  assert_true(fabs(dtl_plan_cost(p) - (double)planned * 1e-12) <= 1e-15 + 1e-12 * (double)planned * 1e-12);
  t->steps += p->nsteps;
  for (int k = 0; k < p->nsteps; k++) /* plans that shard a tensor dim neither end shards */
    if (p->steps[k].kind != DTL__STEP_EXCHANGE && p->steps[k].after[p->steps[k].mesh_dim].kind == DTL_SHARD) {
      bool ends = false;
      for (int md = 0; md < src->mesh->ndim; md++)
        ends |= (src->placements[md].kind == DTL_SHARD && src->placements[md].dim == p->steps[k].after[p->steps[k].mesh_dim].dim) ||
                (dst->placements[md].kind == DTL_SHARD && dst->placements[md].dim == p->steps[k].after[p->steps[k].mesh_dim].dim);
      if (!ends) {
        t->detours++;
        break;
      }
    }
  t->collectives += dtl_plan_num_collectives(p);
  dtl_plan_destroy(p);
}

/* Every placement vector over alpha on mesh m, as layouts of shape. */
static int tp_all_layouts(const dtl_mesh *m, const int64_t *shape, const dtl_placement *alpha, int nalpha,
                          dtl_layout **out) {
  int M = dtl_mesh_ndim(m), n = 1;
  for (int md = 0; md < M; md++) n *= nalpha;
  for (int i = 0; i < n; i++) {
    dtl_placement pl[DTL_MAX_MESH_DIMS];
    for (int md = M - 1, r = i; md >= 0; md--, r /= nalpha) pl[md] = alpha[r % nalpha];
    assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 2, shape, pl, &out[i]), DTL_OK);
  }
  return n;
}

static const int64_t tp_shapes[][2] = {{8, 6}, {5, 7}, {1, 3}, {0, 4}, {13, 2}};
#define TP_NSHAPES ((int)(sizeof tp_shapes / sizeof *tp_shapes))

/* rpn > 0: nodes of rpn consecutive ranks, so that steps over the dims that cross them pay the inter-node class. */
static void tp_exhaustive_2d(int r, int c, int rpn) {
  const dtl_placement alpha[] = {dtl_replicate(), dtl_shard(0), dtl_shard(1), dtl_partial(DTL_SUM)};
  dtl_mesh *m = tp_mesh(2, (int[]){r, c}, NULL);
  if (rpn) assert_int_equal(dtl_mesh_set_ranks_per_node(m, rpn), DTL_OK);
  tp_tally t = {0};
  for (int s = 0; s < TP_NSHAPES; s++) {
    dtl_layout *ls[16];
    int n = tp_all_layouts(m, tp_shapes[s], alpha, 4, ls);
    for (int mi = 0; mi < 4; mi++)
      for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) tp_check_pair(ls[i], ls[j], &tp_models[mi], tp_model_names[mi], alpha, 4, 6, &t);
    for (int i = 0; i < n; i++) dtl_layout_destroy(ls[i]);
  }
  print_message("mesh %dx%d: %ld pairs (%d shapes x 4 cost models x 256), %ld refused as unsupported, %ld planned: "
                "%ld steps, %ld collectives; exhaustive search visited %ld prefixes\n",
                r, c, t.pairs, TP_NSHAPES, t.unsupported, t.pairs - t.unsupported, t.steps, t.collectives, t.visited);
  dtl_mesh_destroy(m);
}

static void every_pair_on_2x2_costs_what_exhaustive_search_finds(void **state) { tp_exhaustive_2d(2, 2, 0); }
static void every_pair_on_2x3_costs_what_exhaustive_search_finds(void **state) { tp_exhaustive_2d(2, 3, 0); }
static void every_pair_on_4x2_costs_what_exhaustive_search_finds(void **state) { tp_exhaustive_2d(4, 2, 0); }
/* Two link classes: 2x4 with 4 ranks per node (mesh dim 0 crosses nodes, dim 1 does not), 2x3 with 2 per node
 * (both cross). Every model's inter class is dearer than its intra class, as between real nodes. */
static void every_pair_on_2x4_over_two_nodes_costs_what_exhaustive_search_finds(void **state) {
  tp_exhaustive_2d(2, 4, 4);
}
static void every_pair_on_2x3_over_three_nodes_costs_what_exhaustive_search_finds(void **state) {
  tp_exhaustive_2d(2, 3, 2);
}

/* 2x2x2: one pair in five of the 4096 (a fixed stride), two shapes, two models. */
static void sampled_pairs_on_2x2x2_cost_what_exhaustive_search_finds(void **state) {
  const dtl_placement alpha[] = {dtl_replicate(), dtl_shard(0), dtl_shard(1), dtl_partial(DTL_SUM)};
  dtl_mesh *m = tp_mesh(3, (int[]){2, 2, 2}, NULL);
  const int64_t shapes[][2] = {{8, 8}, {5, 3}};
  tp_tally t = {0};
  for (int s = 0; s < 2; s++) {
    dtl_layout *ls[64];
    int n = tp_all_layouts(m, shapes[s], alpha, 4, ls);
    for (int mi = 0; mi < 4; mi += 2)
      for (int k = s + mi; k < n * n; k += 5) tp_check_pair(ls[k / n], ls[k % n], &tp_models[mi], tp_model_names[mi], alpha, 4, 8, &t);
    for (int i = 0; i < n; i++) dtl_layout_destroy(ls[i]);
  }
  print_message("mesh 2x2x2: %ld sampled pairs, %ld refused, %ld planned: %ld steps, %ld collectives; %ld prefixes\n",
                t.pairs, t.unsupported, t.pairs - t.unsupported, t.steps, t.collectives, t.visited);
  dtl_mesh_destroy(m);
}

/* The nested-sharding examples of the issue, on 3-D tensors so S2 is in play, searched over {R,S0,S1,S2,P}. */
static void nested_sharding_examples_cost_what_exhaustive_search_finds(void **state) {
  const dtl_placement alpha[] = {dtl_replicate(), dtl_shard(0), dtl_shard(1), dtl_shard(2), dtl_partial(DTL_SUM)};
  static const struct {
    int mesh_ndim, mesh[3];
    const char *from, *to;
  } cases[] = {
      {2, {2, 2}, "S0,S1", "S1,S0"},       {2, {2, 2}, "S0,S0", "S1,S1"},       {3, {2, 2, 2}, "S0,S1,S2", "S2,S1,S0"},
      {3, {2, 2, 2}, "S1,R,S0", "R,S0,S0"}, {2, {2, 2}, "P,P", "R,R"},           {2, {2, 2}, "P,S0", "S0,R"},
      {2, {2, 2}, "R,R", "P,S1"},           {2, {4, 2}, "S0,S0", "S1,S1"},       {3, {2, 2, 2}, "S0,S0,S0", "S1,S1,S1"},
      {3, {2, 3, 2}, "S0,S1,S0", "S1,S0,S0"},
  };
  const int64_t shapes[][3] = {{8, 8, 8}, {7, 5, 3}, {2, 9, 1}};
  tp_tally t = {0};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    dtl_mesh *m = tp_mesh(cases[i].mesh_ndim, cases[i].mesh, NULL);
    for (int s = 0; s < 3; s++) {
      dtl_layout *a = tp_layout(m, DTL_FLOAT32, 3, shapes[s], cases[i].from);
      dtl_layout *b = tp_layout(m, DTL_FLOAT32, 3, shapes[s], cases[i].to);
      for (int mi = 0; mi < 4; mi++)
        tp_check_pair(a, b, &tp_models[mi], tp_model_names[mi], alpha, 5, 2 * cases[i].mesh_ndim + 2, &t);
      dtl_layout_destroy(a);
      dtl_layout_destroy(b);
    }
    dtl_mesh_destroy(m);
  }
  assert_int_equal(t.unsupported, 0);
}

/* 4-D tensors whose dims 1 and 2 (and in one shape 3) have equal sizes while source and target shard only
 * dims 0 and 1: routes may detour through the unused dims, which the planner treats as interchangeable
 * (it tries only the lowest free one of each size); the exhaustive search tries them all. */
static void detours_through_unused_dims_cost_what_exhaustive_search_finds(void **state) {
  const dtl_placement ends[] = {dtl_replicate(), dtl_shard(0), dtl_shard(1), dtl_partial(DTL_SUM)};
  const dtl_placement alpha[] = {dtl_replicate(), dtl_shard(0), dtl_shard(1), dtl_shard(2), dtl_shard(3), dtl_partial(DTL_SUM)};
  const int64_t shapes[][4] = {{6, 4, 4, 4}, {5, 3, 3, 2}, {8, 8, 8, 8}};
  tp_tally t = {0};
  for (int mesh_ndim = 2; mesh_ndim <= 3; mesh_ndim++) {
    dtl_mesh *m = tp_mesh(mesh_ndim, (int[]){2, 2, 2}, NULL);
    int n = mesh_ndim == 2 ? 16 : 64, stride = mesh_ndim == 2 ? 1 : 19;
    for (int s = 0; s < 3; s++) {
      dtl_layout *ls[64];
      for (int i = 0; i < n; i++) {
        dtl_placement pl[3];
        for (int md = mesh_ndim - 1, r = i; md >= 0; md--, r /= 4) pl[md] = ends[r % 4];
        assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 4, shapes[s], pl, &ls[i]), DTL_OK);
      }
      for (int mi = 0; mi < 4; mi += 2)
        for (int k = s; k < n * n; k += stride)
          tp_check_pair(ls[k / n], ls[k % n], &tp_models[mi], tp_model_names[mi], alpha, 6, 2 * mesh_ndim + 2, &t);
      for (int i = 0; i < n; i++) dtl_layout_destroy(ls[i]);
    }
    dtl_mesh_destroy(m);
  }
  print_message("unused interchangeable dims: %ld pairs, %ld refused, %ld planned (%ld through an unused dim): %ld steps, "
                "%ld collectives; %ld prefixes\n",
                t.pairs, t.unsupported, t.pairs - t.unsupported, t.detours, t.steps, t.collectives, t.visited);
  assert_true(t.detours > 0);
}

/* Mixed Partial ops: every pair over {R, S0, P(sum), P(max), P(prod), P(avg)} on 2x2 and 2x3. The search
 * may use any op on any mesh dim, and S1 on the way; pending ops that do not commute must be reduced innermost
 * first. */
static void mixed_partial_ops_cost_what_exhaustive_search_finds(void **state) {
  const dtl_placement alpha[] = {dtl_replicate(),      dtl_shard(0),          dtl_partial(DTL_SUM), dtl_partial(DTL_MAX),
                                 dtl_partial(DTL_PROD), dtl_partial(DTL_AVG), dtl_shard(1)};
  const int64_t shape[2] = {6, 5};
  tp_tally t = {0};
  for (int c = 2; c <= 3; c++) {
    dtl_mesh *m = tp_mesh(2, (int[]){2, c}, NULL);
    dtl_layout *ls[36];
    int n = tp_all_layouts(m, shape, alpha, 6, ls); /* the ends: every alpha but S1 */
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) tp_check_pair(ls[i], ls[j], &tp_models[0], tp_model_names[0], alpha, 7, 6, &t);
    for (int i = 0; i < n; i++) dtl_layout_destroy(ls[i]);
    dtl_mesh_destroy(m);
  }
  print_message("mixed Partial ops: %ld pairs, %ld refused, %ld planned: %ld steps, %ld collectives\n", t.pairs,
                t.unsupported, t.pairs - t.unsupported, t.steps, t.collectives);
}

/* Of two routes whose slowest rank takes equally long, the one that sends fewer bytes over all ranks: on 5x3, [16,1]
 * R,P(max) -> S1,S0 either reduce-scatters every row group (5 groups of 3, 640 B) or first slices the column of
 * extent 1, which leaves it on mesh coordinate 0 alone (a slice that keeps the whole box copies nothing), so that
 * one group of 3 reduces it (128 B); both cost one reduce-scatter of 40 B on the busiest rank. */
static void equal_cost_plans_break_ties_on_total_bytes_over_all_ranks(void **state) {
  (void)state;
  dtl_mesh *m = tp_mesh(2, (int[]){5, 3}, NULL);
  dtl_layout *a = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){16, 1}, "R,P(max)");
  dtl_layout *b = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){16, 1}, "S1,S0");
  dtl_plan *p = NULL;
  assert_int_equal(dtl_plan_create(a, b, &p), DTL_OK);
  assert_int_equal(p->nsteps, 2);
  assert_int_equal(p->steps[0].kind, DTL__STEP_LOCAL_SLICE);
  assert_int_equal(p->steps[1].kind, DTL__STEP_REDUCE_SCATTER);
  assert_int_equal(tp_plan_bytes(p), 128);
  /* The other order, priced alike: the same cost, five times the bytes. */
  dtl_placement mid[2] = {dtl_replicate(), dtl_shard(0)}, end[2] = {dtl_shard(1), dtl_shard(0)};
  int64_t other = tp_step_ps(a, &p->cost, DTL__STEP_REDUCE_SCATTER, 1, a->placements, mid) +
                  tp_step_ps(a, &p->cost, DTL__STEP_LOCAL_SLICE, 0, mid, end);
  assert_int_equal(other, (int64_t)llround(dtl_plan_cost(p) * 1e12));
  assert_int_equal(tp_step_bytes(a, DTL__STEP_REDUCE_SCATTER, 1, a->placements, mid), 640);
  dtl_plan_destroy(p);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  dtl_mesh_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_pair_on_2x2_costs_what_exhaustive_search_finds),
      cmocka_unit_test(every_pair_on_2x3_costs_what_exhaustive_search_finds),
      cmocka_unit_test(every_pair_on_4x2_costs_what_exhaustive_search_finds),
      cmocka_unit_test(every_pair_on_2x4_over_two_nodes_costs_what_exhaustive_search_finds),
      cmocka_unit_test(every_pair_on_2x3_over_three_nodes_costs_what_exhaustive_search_finds),
      cmocka_unit_test(sampled_pairs_on_2x2x2_cost_what_exhaustive_search_finds),
      cmocka_unit_test(nested_sharding_examples_cost_what_exhaustive_search_finds),
      cmocka_unit_test(detours_through_unused_dims_cost_what_exhaustive_search_finds),
      cmocka_unit_test(mixed_partial_ops_cost_what_exhaustive_search_finds),
      cmocka_unit_test(equal_cost_plans_break_ties_on_total_bytes_over_all_ranks),
  };
  return cmocka_run_group_tests(tests, setup_models, NULL);
}

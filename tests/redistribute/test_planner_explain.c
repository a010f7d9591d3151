/* SPDX-License-Identifier: Apache-2.0 */
/* Plans as values: the same layouts give the same steps every time and on every coordinate; the EXPLAIN
 * text shows what the plan holds; the per-rank byte figures agree with box arithmetic over the ranks'
 * actual (uneven) shards, and the figure the model charges is the largest over the mesh. */
#include "test_planner_common.h"

static int clear_tune(void **state) {
  unsetenv("DTL_PLAN_TUNE");
  return 0;
}

static bool tp_steps_equal(const dtl__plan_step *a, const dtl__plan_step *b, int M) {
  if (a->kind != b->kind || a->mesh_dim != b->mesh_dim || a->cost_s != b->cost_s) return false;
  for (int md = 0; md < M; md++)
    if (!tp_same(a->before[md], b->before[md]) || !tp_same(a->after[md], b->after[md])) return false;
  return true;
}

/* Deterministic pseudo-random numbers (xorshift), so failures reproduce. */
static uint64_t tp_rng = 88172645463325252ull;
static int tp_rand(int n) {
  tp_rng ^= tp_rng << 13;
  tp_rng ^= tp_rng >> 7;
  tp_rng ^= tp_rng << 17;
  return (int)(tp_rng % (uint64_t)n);
}

static dtl_placement tp_random_placement(int nd) {
  int r = tp_rand(nd + 2);
  return r == 0 ? dtl_replicate() : r == 1 ? dtl_partial(DTL_SUM) : dtl_shard(r - 2);
}

static void same_layouts_give_identical_plans_every_time(void **state) {
  static const char *pairs[][2] = {{"S0,S1,S2", "S2,S1,S0"}, {"S1,R,S0", "R,S0,S0"}, {"P,S0,P", "S0,R,R"}};
  dtl_mesh *m = tp_mesh(3, (int[]){2, 3, 2}, NULL);
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
    dtl_layout *a = tp_layout(m, DTL_BFLOAT16, 3, (int64_t[]){7, 12, 5}, pairs[i][0]);
    dtl_layout *b = tp_layout(m, DTL_BFLOAT16, 3, (int64_t[]){7, 12, 5}, pairs[i][1]);
    dtl_plan *p, *q;
    assert_int_equal(dtl_plan_create(a, b, &p), DTL_OK);
    assert_int_equal(dtl_plan_create(a, b, &q), DTL_OK);
    assert_int_equal(p->nsteps, q->nsteps);
    for (int s = 0; s < p->nsteps; s++) {
      assert_true(tp_steps_equal(&p->steps[s], &q->steps[s], 3));
      assert_true(p->steps[s].send_bytes == q->steps[s].send_bytes && p->steps[s].recv_bytes == q->steps[s].recv_bytes);
    }
    assert_true(p->total_cost_s == q->total_cost_s);
    char x[4096], y[4096];
    assert_int_equal(dtl_plan_explain(p, x, sizeof x), DTL_OK);
    assert_int_equal(dtl_plan_explain(q, y, sizeof y), DTL_OK);
    assert_string_equal(x, y);
    dtl_plan_destroy(p);
    dtl_plan_destroy(q);
    dtl_layout_destroy(a);
    dtl_layout_destroy(b);
  }
  dtl_mesh_destroy(m);
}

/* Every rank plans alone; they agree because nothing in the search depends on the coordinate. */
static void every_coordinate_derives_the_same_steps(void **state) {
  const int shape[3] = {2, 3, 2};
  for (int trial = 0; trial < 200; trial++) {
    int nd = 1 + tp_rand(3);
    int64_t ts[3];
    for (int d = 0; d < nd; d++) ts[d] = tp_rand(14);
    dtl_placement pa[3], pb[3];
    for (int md = 0; md < 3; md++) {
      pa[md] = tp_random_placement(nd);
      pb[md] = tp_random_placement(nd);
      if (pa[md].kind == DTL_SHARD && pb[md].kind == DTL_PARTIAL) pb[md] = dtl_replicate();
    }
    dtl_plan *ref = NULL;
    for (int r = 0; r < 12; r++) {
      int coord[3] = {r / 6, (r / 2) % 3, r % 2};
      dtl_mesh *m = tp_mesh(3, shape, coord);
      dtl_layout *a, *b;
      assert_int_equal(dtl_layout_create(m, DTL_INT32, nd, ts, pa, &a), DTL_OK);
      assert_int_equal(dtl_layout_create(m, DTL_INT32, nd, ts, pb, &b), DTL_OK);
      dtl_plan *p;
      assert_int_equal(dtl_plan_create(a, b, &p), DTL_OK);
      if (!ref) {
        ref = p;
      } else {
        assert_int_equal(p->nsteps, ref->nsteps);
        for (int s = 0; s < p->nsteps; s++) assert_true(tp_steps_equal(&p->steps[s], &ref->steps[s], 3));
        assert_true(p->total_cost_s == ref->total_cost_s);
        dtl_plan_destroy(p);
      }
      dtl_layout_destroy(a);
      dtl_layout_destroy(b);
      dtl_mesh_destroy(m);
    }
    dtl_plan_destroy(ref);
  }
}

static int64_t tp_prod(const int64_t *s, int nd) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= s[d];
  return n;
}

/* Elements two boxes share. */
static int64_t tp_overlap(const int64_t *s1, const int64_t *o1, const int64_t *s2, const int64_t *o2, int nd) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) {
    int64_t lo = o1[d] > o2[d] ? o1[d] : o2[d], hi1 = o1[d] + s1[d], hi2 = o2[d] + s2[d];
    int64_t hi = hi1 < hi2 ? hi1 : hi2;
    n *= hi > lo ? hi - lo : 0;
  }
  return n;
}

/* For random layouts and every legal step from them: what a rank receives in an all-gather is its target
 * box less its source box; what leaves it in an all-to-all is its source box less the overlap with its
 * target box; the ring volumes of all-reduce and reduce-scatter follow from the box sizes; over the mesh,
 * sends and receives balance; and the charged figure of dtl__step_volume_max is the largest per rank. */
static void per_rank_bytes_follow_the_boxes_and_the_charge_is_the_largest(void **state) {
  static const int meshes[][4] = {{3, 2, 3, 2}, {2, 4, 3, 0}, {1, 5, 0, 0}, {3, 2, 2, 2}};
  long steps_checked = 0;
  for (int trial = 0; trial < 400; trial++) {
    const int *ms = meshes[trial % 4];
    int M = ms[0], nd = 1 + tp_rand(3);
    dtl_mesh *m = tp_mesh(M, ms + 1, NULL);
    int64_t ts[3];
    for (int d = 0; d < nd; d++) ts[d] = tp_rand(14);
    dtl_placement pl[DTL_MAX_MESH_DIMS];
    for (int md = 0; md < M; md++) pl[md] = tp_random_placement(nd);
    dtl_layout *g;
    assert_int_equal(dtl_layout_create(m, DTL_FLOAT64, nd, ts, pl, &g), DTL_OK);
    for (int md = 0; md < M; md++)
      for (int a = 0; a < nd + 2; a++) {
        dtl_placement to = a == 0 ? dtl_replicate() : a == 1 ? dtl_partial(DTL_SUM) : dtl_shard(a - 2);
        dtl__step_kind k;
        if (!tp_legal(m, pl, md, to, &k)) continue;
        dtl_placement nx[DTL_MAX_MESH_DIMS];
        memcpy(nx, pl, sizeof nx);
        nx[md] = to;
        dtl__step_volume vmax;
        dtl__step_volume_max(g, k, md, pl, nx, &vmax);
        uint64_t largest = 0, sent = 0, received = 0;
        int p = m->shape[md];
        for (int r = 0; r < m->size; r++) {
          int c[DTL_MAX_MESH_DIMS];
          assert_int_equal(dtl_mesh_coord_of(m, r, c), DTL_OK);
          int64_t bs[3], bo[3], as[3], ao[3];
          dtl__local_box(m, nd, ts, pl, c, bs, bo);
          dtl__local_box(m, nd, ts, nx, c, as, ao);
          int64_t before = tp_prod(bs, nd) * 8, after = tp_prod(as, nd) * 8, both = tp_overlap(bs, bo, as, ao, nd) * 8;
          dtl__step_volume v;
          dtl__step_volume_at(g, k, md, pl, nx, c, &v);
          switch (k) {
            case DTL__STEP_ALL_GATHER: assert_int_equal(v.recv, after - before); break;
            case DTL__STEP_ALL_TO_ALL:
              assert_int_equal(v.send, before - both);
              assert_int_equal(v.recv, after - both);
              break;
            case DTL__STEP_REDUCE_SCATTER: assert_int_equal(v.send, before - after); break;
            case DTL__STEP_ALL_REDUCE: assert_int_equal(v.send, (uint64_t)(before / 8 * 2 * (p - 1) / p) * 8); break;
            case DTL__STEP_LOCAL_SLICE:
            case DTL__STEP_LOCAL_PARTIAL:
            case DTL__STEP_LOCAL_EMBED:
              assert_int_equal(v.send + v.recv, 0);
              /* A slice that keeps the rank's whole box copies nothing (the executor leaves it in place). */
              assert_int_equal(v.charged, k == DTL__STEP_LOCAL_SLICE && after == before ? 0 : after);
              break;
            case DTL__STEP_EXCHANGE: fail_msg("the exchange has no per-dim volume"); break;
          }
          sent += v.send;
          received += v.recv;
          if (v.charged > largest) largest = v.charged;
        }
        assert_int_equal(sent, received);
        assert_int_equal(vmax.charged, largest);
        /* The total the search breaks ties on is what every rank sends, summed (an all-reduce's per-rank figure
         * rounds 2 (p-1)/p of the shard down, the total does not: less than one element per rank apart). */
        uint64_t total = dtl__step_volume_total(g, k, md, pl, nx);
        if (k == DTL__STEP_ALL_REDUCE) assert_true(total >= sent && total - sent < (uint64_t)m->size * 8);
        else assert_int_equal(total, sent);
        steps_checked++;
      }
    dtl_layout_destroy(g);
    dtl_mesh_destroy(m);
  }
  print_message("%ld steps checked on every rank\n", steps_checked);
}

static void explain_shows_each_step_and_the_total(void **state) {
  dtl_mesh *m = tp_mesh(2, (int[]){2, 4}, (int[]){1, 1});
  dtl_layout *a = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){8, 6}, "P,R"), *b = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){8, 6}, "R,S1");
  dtl_plan *p;
  assert_int_equal(dtl_plan_create(a, b, &p), DTL_OK);
  char text[4096];
  assert_int_equal(dtl_plan_explain(p, text, sizeof text), DTL_OK);
  print_message("%s", text);
  assert_non_null(strstr(text, "plan P(sum),R -> R,S(1)  mesh 2x4  shape [8,6] f32  (coordinate [1,1])\n"));
  assert_non_null(strstr(text, "cost model  alpha 2e-06 s  beta 2e-10 s/B  local_beta 1e-10 s/B\n"));
  /* One line per step naming its mesh dim, collective and transition, in order. */
  const char *at = text;
  assert_int_equal(p->nsteps, 2);
  for (int s = 0; s < p->nsteps; s++) {
    char head[32];
    snprintf(head, sizeof head, "step %-2d mesh dim %d  ", s + 1, p->steps[s].mesh_dim);
    const char *line = strstr(at, head);
    assert_non_null(line);
    const char *end = strchr(line, '\n');
    char row[256];
    snprintf(row, sizeof row, "%.*s", (int)(end - line), line);
    const char *name = p->steps[s].kind == DTL__STEP_ALL_REDUCE ? "all-reduce" : "local slice";
    assert_non_null(strstr(row, name));
    char sent[48];
    snprintf(sent, sizeof sent, "send %llu B", (unsigned long long)p->steps[s].send_bytes);
    assert_non_null(strstr(row, sent));
    at = end;
  }
  /* Slicing first shrinks what the all-reduce moves: this coordinate reduces only its own column block. */
  int64_t s[2];
  assert_int_equal(dtl_layout_local_box(b, NULL, s, NULL), DTL_OK);
  assert_int_equal(p->steps[0].kind, DTL__STEP_LOCAL_SLICE);
  assert_int_equal(p->steps[1].send_bytes, (uint64_t)(s[0] * s[1] * 4));
  char total[96];
  snprintf(total, sizeof total, "total  %d steps, %d collective, est ", p->nsteps, dtl_plan_num_collectives(p));
  assert_non_null(strstr(text, total));
  assert_non_null(strstr(text, ", scratch "));
  assert_int_equal(strlen(text) + 1, dtl_plan_explain_needed(p));
  dtl_plan_destroy(p);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  dtl_mesh_destroy(m);
}

/* Rows split over mesh dim 0 to columns split over mesh dim 1 on 2x4: one exchange (an all-gather after a slice
 * costs the same, in two steps), named with both placement vectors; this coordinate receives the rows of its column
 * block that it does not hold, and dtl_plan_bytes gives the same totals. */
static void explain_names_the_exchange_and_its_bytes(void **state) {
  dtl_mesh *m = tp_mesh(2, (int[]){2, 4}, (int[]){1, 1});
  dtl_layout *a = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){8, 6}, "S0,R"), *b = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){8, 6}, "R,S1");
  dtl_plan *p;
  assert_int_equal(dtl_plan_create(a, b, &p), DTL_OK);
  char text[4096];
  assert_int_equal(dtl_plan_explain(p, text, sizeof text), DTL_OK);
  print_message("%s", text);
  assert_int_equal(p->nsteps, 1);
  assert_int_equal(p->steps[0].kind, DTL__STEP_EXCHANGE);
  assert_int_equal(dtl_plan_num_collectives(p), 1);
  int64_t s[2];
  assert_int_equal(dtl_layout_local_box(b, NULL, s, NULL), DTL_OK);
  uint64_t sent = 0, received = 0;
  assert_int_equal(dtl_plan_bytes(p, &sent, &received), DTL_OK);
  assert_int_equal(received, (uint64_t)(s[0] / 2 * s[1] * 4)); /* the other half of the rows of its columns */
  char line[160];
  snprintf(line, sizeof line, "step 1  mesh dims * exchange        S(0),R->R,S(1)  send %llu B", (unsigned long long)sent);
  assert_non_null(strstr(text, line));
  assert_non_null(strstr(text, "total  1 step, 1 collective, est "));
  assert_int_equal(dtl_plan_bytes(NULL, &sent, &received), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_plan_bytes(p, NULL, &received), DTL_ERR_INVALID_ARGUMENT);
  dtl_plan_destroy(p);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  dtl_mesh_destroy(m);
}

static void identical_layouts_explain_as_no_steps(void **state) {
  dtl_mesh *m = tp_mesh(1, (int[]){4}, NULL);
  dtl_layout *a = tp_layout(m, DTL_INT8, 1, (int64_t[]){10}, "S0");
  dtl_plan *p;
  assert_int_equal(dtl_plan_create(a, a, &p), DTL_OK);
  assert_int_equal(dtl_plan_num_steps(p), 0);
  assert_int_equal(dtl_plan_num_collectives(p), 0);
  assert_true(dtl_plan_cost(p) == 0);
  char text[1024];
  assert_int_equal(dtl_plan_explain(p, text, sizeof text), DTL_OK);
  assert_non_null(strstr(text, "(no steps: every rank already holds its target shard)"));
  assert_non_null(strstr(text, "total  0 steps, 0 collectives, est 0 s"));
  dtl_plan_destroy(p);
  dtl_layout_destroy(a);
  dtl_mesh_destroy(m);
}

/* Mesh dims of one rank never communicate: their placement changes are relabelings and get no step. */
static void mesh_dims_of_size_one_get_no_steps(void **state) {
  dtl_mesh *m = tp_mesh(3, (int[]){1, 4, 1}, NULL);
  const int64_t shape[2] = {9, 4};
  dtl_layout *a = tp_layout(m, DTL_FLOAT32, 2, shape, "S1,S0,P");
  dtl_layout *b = tp_layout(m, DTL_FLOAT32, 2, shape, "P(max),R,S0");
  dtl_plan *p;
  assert_int_equal(dtl_plan_create(a, b, &p), DTL_OK);
  assert_int_equal(p->nsteps, 1);
  assert_int_equal(p->steps[0].mesh_dim, 1);
  assert_int_equal(p->steps[0].kind, DTL__STEP_ALL_GATHER);
  /* The step vectors carry the target's placements on the size-1 dims, so the plan ends exactly at dst. */
  for (int md = 0; md < 3; md++) assert_true(tp_same(p->steps[0].after[md], b->placements[md]));
  tp_check_plan(p, &p->cost);
  dtl_plan_destroy(p);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  dtl_mesh_destroy(m);
}

/* When bandwidth is all that costs, two all-reduces become the hierarchical reduce-scatter, all-reduce,
 * all-gather (less data per rank); when latency dominates (here through DTL_PLAN_TUNE), the two
 * all-reduces stay. */
static void the_cost_model_decides_between_direct_and_hierarchical_all_reduce(void **state) {
  dtl_mesh *m = tp_mesh(2, (int[]){4, 4}, NULL);
  const int64_t shape[2] = {1024, 1024};
  dtl_layout *a = tp_layout(m, DTL_FLOAT32, 2, shape, "P,P"), *b = tp_layout(m, DTL_FLOAT32, 2, shape, "R,R");
  dtl_plan *p;
  dtl_cost_model bw = {.mask = DTL__COST_ALL, .beta_s_per_byte = 1e-9, .local_beta_s_per_byte = 1e-12};
  assert_int_equal(dtl_plan_create_with_cost(a, b, &bw, &p), DTL_OK);
  /* Reduce-scatter first on both mesh dims, then gather (an all-gather, or one exchange at the same bytes). */
  assert_int_equal(dtl_plan_num_collectives(p), 3);
  assert_int_equal(p->steps[0].kind, DTL__STEP_REDUCE_SCATTER);
  assert_true(p->steps[2].kind == DTL__STEP_ALL_GATHER || p->steps[2].kind == DTL__STEP_EXCHANGE);
  /* The direct form, priced step by step with the same model, is dearer. */
  dtl_placement rp[2] = {dtl_replicate(), dtl_partial(DTL_SUM)}, rr[2] = {dtl_replicate(), dtl_replicate()};
  int64_t direct = tp_step_ps(a, &bw, DTL__STEP_ALL_REDUCE, 0, a->placements, rp) +
                   tp_step_ps(a, &bw, DTL__STEP_ALL_REDUCE, 1, rp, rr);
  assert_true((double)direct * 1e-12 > dtl_plan_cost(p) * 1.5);
  dtl_plan_destroy(p);
  setenv("DTL_PLAN_TUNE", "alpha=1e-5,beta=1e-13", 1);
  assert_int_equal(dtl_plan_create(a, b, &p), DTL_OK);
  unsetenv("DTL_PLAN_TUNE");
  assert_int_equal(dtl_plan_num_collectives(p), 2);
  assert_int_equal(p->steps[0].kind, DTL__STEP_ALL_REDUCE);
  assert_int_equal(p->steps[1].kind, DTL__STEP_ALL_REDUCE);
  dtl_plan_destroy(p);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  dtl_mesh_destroy(m);
}

/* The mesh dims' nodes: an abstract 2x4 mesh with 4 ranks per node has nodes {0-3} and {4-7}, so groups along mesh
 * dim 0 ({r, r+4}) cross nodes and groups along dim 1 do not; 2 per node makes dim 1 cross as well; 8 per node
 * (or none given) is one node. Bad input: a mesh with communicators has no settable nodes (here: none), a
 * ranks_per_node < 1 and a dim out of range are refused naming the value. */
static void abstract_meshes_cross_nodes_where_their_groups_do(void **state) {
  static const struct {
    int rpn, cross0, cross1;
  } cases[] = {{0, 0, 0}, {8, 0, 0}, {4, 1, 0}, {2, 1, 1}, {1, 1, 1}, {16, 0, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    dtl_mesh *m = tp_mesh(2, (int[]){2, 4}, NULL);
    if (cases[i].rpn) assert_int_equal(dtl_mesh_set_ranks_per_node(m, cases[i].rpn), DTL_OK);
    int c0 = -1, c1 = -1, node = -1;
    assert_int_equal(dtl_mesh_dim_crosses_nodes(m, 0, &c0), DTL_OK);
    assert_int_equal(dtl_mesh_dim_crosses_nodes(m, 1, &c1), DTL_OK);
    assert_int_equal(c0, cases[i].cross0);
    assert_int_equal(c1, cases[i].cross1);
    assert_int_equal(dtl_mesh_node_of(m, 5, &node), DTL_OK);
    assert_int_equal(node, cases[i].rpn ? 5 / cases[i].rpn : 0);
    dtl_mesh_destroy(m);
  }
  /* 3x2x2 with 4 per node: nodes {0-3} {4-7} {8-11}: dim 0 (stride 4) crosses, dims 1 (stride 2) and 2 do not;
   * with 3 per node, dim 1's group {2, 4} crosses and so does dim 2's {2, 3}. */
  dtl_mesh *m = tp_mesh(3, (int[]){3, 2, 2}, NULL);
  int c[3];
  assert_int_equal(dtl_mesh_set_ranks_per_node(m, 4), DTL_OK);
  for (int d = 0; d < 3; d++) assert_int_equal(dtl_mesh_dim_crosses_nodes(m, d, &c[d]), DTL_OK);
  assert_true(c[0] == 1 && c[1] == 0 && c[2] == 0);
  assert_int_equal(dtl_mesh_set_ranks_per_node(m, 3), DTL_OK);
  for (int d = 0; d < 3; d++) assert_int_equal(dtl_mesh_dim_crosses_nodes(m, d, &c[d]), DTL_OK);
  assert_true(c[0] == 1 && c[1] == 1 && c[2] == 1);
  assert_int_equal(dtl_mesh_set_ranks_per_node(m, 0), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("ranks_per_node=0 (expected >= 1)");
  assert_int_equal(dtl_mesh_dim_crosses_nodes(m, 3, &c[0]), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("mesh_dim=3 (expected 0..2)");
  assert_int_equal(dtl_mesh_dim_crosses_nodes(m, 0, NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_mesh_node_of(m, 12, &c[0]), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("rank=12 (expected 0..11)");
  assert_int_equal(dtl_mesh_set_ranks_per_node(NULL, 2), DTL_ERR_INVALID_ARGUMENT);
  dtl_mesh_destroy(m);
}

/* The bytes a plan moves over mesh dim md, at the explained coordinate. */
static uint64_t tp_bytes_on_dim(const dtl_plan *p, int md) {
  uint64_t b = 0;
  for (int k = 0; k < p->nsteps; k++)
    if (p->steps[k].mesh_dim == md) b += p->steps[k].send_bytes;
  return b;
}

/* P(sum),P(sum) -> R,R of f32[32,32] on 2x4 under the MPI defaults. On one node the planner all-reduces the whole
 * 4 KiB shard over mesh dim 0, then over dim 1 (2 collectives beat 3). With 4 ranks per node, dim 0 crosses nodes
 * (inter_alpha 5 us, inter_beta 0.8 ns/B): the planner reduce-scatters over dim 1 first, so that only a quarter
 * (1 KiB) goes over dim 0, then all-gathers over dim 1. Each plan is the cheapest under its own model: the
 * single-node route, priced with nodes, costs more than the node-aware one. */
static void nodes_make_the_planner_move_bytes_over_the_mesh_dim_within_a_node(void **state) {
  dtl_cost_model c;
  dtl_cost_model_default(DTL_MEMORY_HOST, &c);
  dtl_mesh *one = tp_mesh(2, (int[]){2, 4}, NULL), *two = tp_mesh(2, (int[]){2, 4}, NULL);
  assert_int_equal(dtl_mesh_set_ranks_per_node(two, 4), DTL_OK);
  dtl_plan *p[2];
  for (int i = 0; i < 2; i++) {
    dtl_mesh *m = i ? two : one;
    dtl_layout *a = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){32, 32}, "P,P");
    dtl_layout *b = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){32, 32}, "R,R");
    assert_int_equal(dtl_plan_create_with_cost(a, b, &c, &p[i]), DTL_OK);
    dtl_layout_destroy(a);
    dtl_layout_destroy(b);
  }
  assert_int_equal(p[0]->nsteps, 2);
  assert_int_equal(p[0]->steps[0].mesh_dim, 0);
  assert_int_equal(p[0]->steps[0].kind, DTL__STEP_ALL_REDUCE);
  assert_int_equal(p[1]->nsteps, 3);
  assert_int_equal(p[1]->steps[0].kind, DTL__STEP_REDUCE_SCATTER);
  assert_int_equal(p[1]->steps[0].mesh_dim, 1);
  assert_int_equal(p[1]->steps[1].mesh_dim, 0);
  assert_int_equal(tp_bytes_on_dim(p[0], 0), 4096);
  assert_int_equal(tp_bytes_on_dim(p[1], 0), 1024);
  assert_true(p[1]->steps[1].inter && !p[1]->steps[0].inter && !p[1]->steps[2].inter);
  assert_int_equal(p[1]->steps[1].remote_bytes, 1024); /* its ring successor on dim 0 is on the other node */
  assert_int_equal(p[1]->steps[0].remote_bytes, 0);
  /* The single-node route priced on the two-node mesh: the same steps, dim 0's in the inter class. */
  int64_t single = 0;
  dtl_layout *g = tp_layout(two, DTL_FLOAT32, 2, (int64_t[]){32, 32}, "R,R");
  for (int k = 0; k < p[0]->nsteps; k++)
    single += tp_step_ps(g, &p[1]->cost, p[0]->steps[k].kind, p[0]->steps[k].mesh_dim, p[0]->steps[k].before,
                         p[0]->steps[k].after);
  assert_true((double)single * 1e-12 > dtl_plan_cost(p[1]));
  assert_true(dtl_plan_cost(p[1]) > dtl_plan_cost(p[0])); /* the inter class is dearer */
  /* The explain text: the inter-node parameters, and per step its link class and bytes to other nodes. */
  char x[4096];
  assert_int_equal(dtl_plan_explain(p[1], x, sizeof x), DTL_OK);
  assert_non_null(strstr(x, "inter_alpha 5e-06 s  inter_beta 8e-10 s/B\n"));
  assert_non_null(strstr(x, "link intra  xnode 0 B"));
  assert_non_null(strstr(x, "step 2  mesh dim 0  all-reduce      P(sum)->R   whole shard       send 1.0 KiB     recv 1.0 "
                            "KiB     link inter  xnode 1.0 KiB     est "));
  /* On one node neither shows. */
  assert_int_equal(dtl_plan_explain(p[0], x, sizeof x), DTL_OK);
  assert_null(strstr(x, "link "));
  assert_null(strstr(x, "inter_alpha"));
  dtl_layout_destroy(g);
  dtl_plan_destroy(p[0]);
  dtl_plan_destroy(p[1]);
  dtl_mesh_destroy(one);
  dtl_mesh_destroy(two);
}

/* An exchange is priced in the inter class when one of its messages crosses nodes, and its explain line counts the
 * bytes this rank sends to other nodes: S(0),R -> R,S(0) of f32[8,4] on 2x2 with 2 per node (nodes = mesh dim 0's
 * coordinate). At [1,1] the rank holds rows 4:8 and keeps them (its target is rows 4:8 too); [0,1] needs them, and
 * takes them from the holder with its own coordinate on the replicated dim 1, [1,1]: 4 x 4 x 4 = 64 bytes, all to
 * the other node. */
static void an_exchange_across_nodes_pays_the_inter_class(void **state) {
  dtl_cost_model c;
  dtl_cost_model_default(DTL_MEMORY_HOST, &c);
  for (int nodes = 0; nodes < 2; nodes++) {
    dtl_mesh *m = tp_mesh(2, (int[]){2, 2}, (int[]){1, 1});
    if (nodes) assert_int_equal(dtl_mesh_set_ranks_per_node(m, 2), DTL_OK);
    dtl_layout *a = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){8, 4}, "S0,R");
    dtl_layout *b = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){8, 4}, "R,S0");
    dtl_plan *p;
    assert_int_equal(dtl__plan_create("test", a, b, &c, SIZE_MAX - 1, &p), DTL_OK);
    assert_int_equal(p->nsteps, 1);
    assert_int_equal(p->steps[0].kind, DTL__STEP_EXCHANGE);
    assert_int_equal(p->steps[0].inter, nodes);
    assert_int_equal(p->steps[0].send_bytes, 64);
    assert_int_equal(p->steps[0].remote_bytes, nodes ? 64 : 0);
    assert_int_equal(tp_exchange_ps(a, b, &c, a->placements, p->xrounds), (int64_t)llround(p->total_cost_s * 1e12));
    double alpha = nodes ? c.inter_alpha_s : c.alpha_s, beta = nodes ? c.inter_beta_s_per_byte : c.beta_s_per_byte;
    /* One round, one peer: (1 + 1) alpha + 64 bytes (the largest any rank moves) x beta. */
    assert_true(fabs(p->total_cost_s - (2 * alpha + 64 * beta)) < 1e-12);
    dtl_plan_destroy(p);
    dtl_layout_destroy(a);
    dtl_layout_destroy(b);
    dtl_mesh_destroy(m);
  }
}

/* When the scratch bound turns the cheapest route down, explain says what that cost (collectives, time) and which
 * limit gives the cheapest route back; dtl_plan_create_with_limit with that limit returns it. On 4x2x3, [8,16]
 * P,S0,P -> S0,R,P: two collectives (12 us) need 512 B on some rank, over the bound, so the plan takes three (24 us). */
static void explain_says_when_the_scratch_bound_cost_a_collective_and_the_limit_that_lifts_it(void **state) {
  (void)state;
  dtl_mesh *m = tp_mesh(3, (int[]){4, 2, 3}, NULL);
  dtl_layout *a = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){8, 16}, "P,S0,P");
  dtl_layout *b = tp_layout(m, DTL_FLOAT32, 2, (int64_t[]){8, 16}, "S0,R,P");
  dtl_plan *p = NULL, *q = NULL;
  assert_int_equal(dtl_plan_create(a, b, &p), DTL_OK);
  char text[4096];
  assert_int_equal(dtl_plan_explain(p, text, sizeof text), DTL_OK);
  print_message("%s", text);
  assert_int_equal(dtl_plan_num_collectives(p), 3);
  const char *line = strstr(text, "\nscratch bound  the cheapest route (2 collectives, est 12.1 us) needs 512 B of scratch "
                                  "on some rank, more than the larger of its local source and target: this plan costs 1 "
                                  "collective and 11.9 us more; dtl_plan_create_with_limit(src, dst, 512) returns that "
                                  "route\n");
  assert_non_null(line);
  assert_int_equal(dtl_plan_create_with_limit(a, b, 512, &q), DTL_OK);
  assert_int_equal(dtl_plan_num_collectives(q), 2);
  assert_true(dtl_plan_cost(q) < dtl_plan_cost(p));
  /* That plan is the cheapest route, so its explain has no such line; nor does a plan the bound left alone. */
  assert_int_equal(dtl_plan_explain(q, text, sizeof text), DTL_OK);
  assert_null(strstr(text, "scratch bound"));
  dtl_plan_destroy(q);
  dtl_plan_destroy(p);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  dtl_mesh_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(explain_says_when_the_scratch_bound_cost_a_collective_and_the_limit_that_lifts_it),
      cmocka_unit_test(same_layouts_give_identical_plans_every_time),
      cmocka_unit_test(every_coordinate_derives_the_same_steps),
      cmocka_unit_test(per_rank_bytes_follow_the_boxes_and_the_charge_is_the_largest),
      cmocka_unit_test(explain_shows_each_step_and_the_total),
      cmocka_unit_test(explain_names_the_exchange_and_its_bytes),
      cmocka_unit_test(identical_layouts_explain_as_no_steps),
      cmocka_unit_test(mesh_dims_of_size_one_get_no_steps),
      cmocka_unit_test(the_cost_model_decides_between_direct_and_hierarchical_all_reduce),
      cmocka_unit_test(abstract_meshes_cross_nodes_where_their_groups_do),
      cmocka_unit_test(nodes_make_the_planner_move_bytes_over_the_mesh_dim_within_a_node),
      cmocka_unit_test(an_exchange_across_nodes_pays_the_inter_class),
  };
  return cmocka_run_group_tests(tests, clear_tune, clear_tune);
}

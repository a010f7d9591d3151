/* SPDX-License-Identifier: Apache-2.0 */
/* Bad input to plan creation and explain: each case gets its status, a message naming the argument and the
 * bad value, and leaves the caller's output as it was. */
#include "test_planner_common.h"

#define UNTOUCHED_PLAN ((dtl_plan *)0x5a5a)

typedef struct {
  dtl_mesh *mesh, *other;
  dtl_layout *s0r, *rs1;
} fixture;

static int setup(void **state) {
  static fixture f;
  const int64_t shape[2] = {8, 6};
  unsetenv("DTL_PLAN_TUNE");
  f.mesh = tp_mesh(2, (int[]){2, 4}, NULL);
  f.other = tp_mesh(2, (int[]){2, 4}, NULL);
  f.s0r = tp_layout(f.mesh, DTL_FLOAT32, 2, shape, "S0,R");
  f.rs1 = tp_layout(f.mesh, DTL_FLOAT32, 2, shape, "R,S1");
  *state = &f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  dtl_layout_destroy(f->s0r);
  dtl_layout_destroy(f->rs1);
  dtl_mesh_destroy(f->mesh);
  dtl_mesh_destroy(f->other);
  unsetenv("DTL_PLAN_TUNE");
  return 0;
}

static void null_arguments_are_named(void **state) {
  fixture *f = *state;
  dtl_plan *p = UNTOUCHED_PLAN;
  assert_int_equal(dtl_plan_create(NULL, f->rs1, &p), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("dtl_plan_create", "src=NULL");
  assert_int_equal(dtl_plan_create(f->s0r, NULL, &p), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("dtl_plan_create", "dst=NULL");
  assert_int_equal(dtl_plan_create(f->s0r, f->rs1, NULL), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("dtl_plan_create", "out=NULL");
  assert_int_equal(dtl_plan_create_with_cost(f->s0r, f->rs1, NULL, &p), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("dtl_plan_create_with_cost", "cost=NULL");
  assert_ptr_equal(p, UNTOUCHED_PLAN);
  char buf[16] = "untouched";
  assert_int_equal(dtl_plan_explain(NULL, buf, sizeof buf), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("dtl_plan_explain", "plan=NULL");
  assert_string_equal(buf, "untouched");
  /* The accessors answer NULL with an impossible value instead of crashing. */
  assert_int_equal(dtl_plan_num_steps(NULL), -1);
  assert_int_equal(dtl_plan_num_collectives(NULL), -1);
  assert_true(dtl_plan_cost(NULL) < 0);
  assert_int_equal(dtl_plan_scratch_bytes(NULL), 0);
  assert_int_equal(dtl_plan_explain_needed(NULL), 0);
  dtl_plan_destroy(NULL);
}

static void layouts_on_different_meshes_are_rejected(void **state) {
  fixture *f = *state;
  dtl_layout *elsewhere = tp_layout(f->other, DTL_FLOAT32, 2, (int64_t[]){8, 6}, "R,S1");
  dtl_plan *p = UNTOUCHED_PLAN;
  assert_int_equal(dtl_plan_create(f->s0r, elsewhere, &p), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("dtl_plan_create", "meshes without a common parent", "src mesh 2x4", "dst mesh 2x4");
  assert_ptr_equal(p, UNTOUCHED_PLAN);
  dtl_layout_destroy(elsewhere);
}

static void different_dtypes_are_rejected(void **state) {
  fixture *f = *state;
  dtl_layout *f64 = tp_layout(f->mesh, DTL_FLOAT64, 2, (int64_t[]){8, 6}, "R,S1");
  dtl_plan *p = UNTOUCHED_PLAN;
  assert_int_equal(dtl_plan_create(f->s0r, f64, &p), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("src dtype=f32 but dst dtype=f64");
  assert_ptr_equal(p, UNTOUCHED_PLAN);
  dtl_layout_destroy(f64);
}

static void different_global_shapes_are_rejected(void **state) {
  fixture *f = *state;
  dtl_layout *wider = tp_layout(f->mesh, DTL_FLOAT32, 2, (int64_t[]){8, 7}, "R,S1");
  dtl_layout *deeper = tp_layout(f->mesh, DTL_FLOAT32, 3, (int64_t[]){8, 6, 1}, "R,S1");
  dtl_plan *p = UNTOUCHED_PLAN;
  assert_int_equal(dtl_plan_create(f->s0r, wider, &p), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("src global shape [8,6] but dst global shape [8,7]");
  assert_int_equal(dtl_plan_create(f->s0r, deeper, &p), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("src global shape [8,6] but dst global shape [8,6,1]");
  assert_ptr_equal(p, UNTOUCHED_PLAN);
  dtl_layout_destroy(wider);
  dtl_layout_destroy(deeper);
}

/* A shard becomes a Partial by a local embed in the op's identity; avg has none, so S -> P(avg) is refused. */
static void shard_to_partial_avg_is_unsupported_with_the_reason(void **state) {
  fixture *f = *state;
  dtl_layout *rp = tp_layout(f->mesh, DTL_FLOAT32, 2, (int64_t[]){8, 6}, "R,P(avg)");
  dtl_layout *s1s1 = tp_layout(f->mesh, DTL_FLOAT32, 2, (int64_t[]){8, 6}, "S1,S1");
  dtl_layout *s1p = tp_layout(f->mesh, DTL_FLOAT32, 2, (int64_t[]){8, 6}, "S1,P(avg)");
  dtl_plan *p = UNTOUCHED_PLAN;
  assert_int_equal(dtl_plan_create(f->rs1, rp, &p), DTL_ERR_UNSUPPORTED);
  TP_EXPECT_MESSAGE("dtl_plan_create", "mesh dim 1: S(1) -> P(avg) is unsupported", "identity", "ask for P(sum) or R on mesh dim 1");
  assert_int_equal(dtl_plan_create(s1s1, s1p, &p), DTL_ERR_UNSUPPORTED);
  TP_EXPECT_MESSAGE("mesh dim 1: S(1) -> P(avg) is unsupported");
  assert_ptr_equal(p, UNTOUCHED_PLAN);
  dtl_layout_destroy(rp);
  dtl_layout_destroy(s1s1);
  dtl_layout_destroy(s1p);
}

/* S(d) -> P(op) is local (DTensor's Shard -> Partial fills the rest with zeros): no collective, and each rank's
 * target spans the group's extent of d. */
static void shard_to_partial_is_a_local_embed(void **state) {
  fixture *f = *state;
  static const char *ops[] = {"R,P(sum)", "R,P(max)", "R,P(prod)", "R,P(min)"};
  for (int i = 0; i < 4; i++) {
    dtl_layout *rp = tp_layout(f->mesh, DTL_FLOAT32, 2, (int64_t[]){8, 6}, ops[i]);
    dtl_plan *p = NULL;
    assert_int_equal(dtl_plan_create(f->rs1, rp, &p), DTL_OK);
    assert_int_equal(dtl_plan_num_collectives(p), 0);
    assert_int_equal(p->nsteps, 1);
    assert_int_equal(p->steps[0].kind, DTL__STEP_LOCAL_EMBED);
    assert_int_equal(p->steps[0].mesh_dim, 1);
    assert_int_equal(dtl_plan_scratch_bytes(p), 0);
    dtl_plan_destroy(p);
    dtl_layout_destroy(rp);
  }
}

static void changing_the_partial_op_is_unsupported_with_the_reason(void **state) {
  fixture *f = *state;
  dtl_layout *psum = tp_layout(f->mesh, DTL_FLOAT32, 2, (int64_t[]){8, 6}, "P(sum),R");
  dtl_layout *pmax = tp_layout(f->mesh, DTL_FLOAT32, 2, (int64_t[]){8, 6}, "P(max),S0");
  dtl_plan *p = UNTOUCHED_PLAN;
  assert_int_equal(dtl_plan_create(psum, pmax, &p), DTL_ERR_UNSUPPORTED);
  TP_EXPECT_MESSAGE("mesh dim 0: P(sum) -> P(max) is unsupported", "the pending sum must be applied");
  assert_ptr_equal(p, UNTOUCHED_PLAN);
  dtl_layout_destroy(psum);
  dtl_layout_destroy(pmax);
}

/* On a mesh dim of one rank every placement holds the same data, so nothing there is unsupported. */
static void unsupported_pairs_on_a_mesh_dim_of_size_one_are_relabelings(void **state) {
  dtl_mesh *m = tp_mesh(2, (int[]){4, 1}, NULL);
  const int64_t shape[2] = {8, 6};
  dtl_layout *a = tp_layout(m, DTL_FLOAT32, 2, shape, "S0,S1"), *b = tp_layout(m, DTL_FLOAT32, 2, shape, "S0,P(sum)");
  dtl_layout *c = tp_layout(m, DTL_FLOAT32, 2, shape, "S0,P(max)");
  dtl_plan *p;
  assert_int_equal(dtl_plan_create(a, b, &p), DTL_OK);
  assert_int_equal(dtl_plan_num_steps(p), 0);
  dtl_plan_destroy(p);
  assert_int_equal(dtl_plan_create(b, c, &p), DTL_OK);
  assert_int_equal(dtl_plan_num_steps(p), 0);
  dtl_plan_destroy(p);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  dtl_layout_destroy(c);
  dtl_mesh_destroy(m);
}

static void explain_into_a_small_buffer_names_the_size_needed_and_writes_nothing(void **state) {
  fixture *f = *state;
  dtl_plan *p;
  assert_int_equal(dtl_plan_create(f->s0r, f->rs1, &p), DTL_OK);
  size_t need = dtl_plan_explain_needed(p);
  assert_true(need > 1);
  char *buf = malloc(need + 8);
  memset(buf, 'x', need + 8);
  char want[64];
  snprintf(want, sizeof want, "cap=%zu is too small (%zu bytes needed)", need - 1, need);
  assert_int_equal(dtl_plan_explain(p, buf, need - 1), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("dtl_plan_explain", want);
  assert_int_equal(dtl_plan_explain(p, buf, 0), DTL_ERR_INVALID_ARGUMENT);
  for (size_t i = 0; i < need + 8; i++) assert_int_equal(buf[i], 'x');
  assert_int_equal(dtl_plan_explain(p, NULL, need), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("buf=NULL");
  assert_int_equal(dtl_plan_explain(p, buf, need), DTL_OK);
  assert_int_equal(strlen(buf), need - 1);
  free(buf);
  dtl_plan_destroy(p);
}

static void malformed_plan_tune_is_rejected_naming_the_entry(void **state) {
  fixture *f = *state;
  static const struct {
    const char *text, *names;
  } bad[] = {
      {"alpha", "entry \"alpha\" has no known key"},
      {"gamma=1e-6", "entry \"gamma=1e-6\" has no known key"},
      {"Alpha=1e-6", "entry \"Alpha=1e-6\" has no known key"},
      {"alpha=", "alpha=\"\" is not a finite number >= 0"},
      {"alpha=fast", "alpha=\"fast\" is not a finite number >= 0"},
      {"beta=2e-10x", "beta=\"2e-10x\" is not a finite number >= 0"},
      {"beta= 2e-10", "beta=\" 2e-10\" is not a finite number >= 0"},
      {"local_beta=-1e-10", "local_beta=\"-1e-10\" is not a finite number >= 0"},
      {"alpha=nan", "alpha=\"nan\" is not a finite number >= 0"},
      {"alpha=inf", "alpha=\"inf\" is not a finite number >= 0"},
      {"alpha=1e999", "alpha=\"1e999\" is not a finite number >= 0"},
      {"alpha=1e-6,", "trailing comma"},
      {",alpha=1e-6", "empty entry at offset 0"},
      {"alpha=1e-6,,beta=1e-9", "empty entry at offset 11"},
      {"alpha=1e-6, beta=1e-9", "entry \" beta=1e-9\" has no known key"},
      {"alpha=1e-6,alpha=2e-6", "alpha is given twice"},
      {"alpha=1e-6;beta=1e-9", "alpha=\"1e-6;beta=1e-9\" is not a finite number"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv("DTL_PLAN_TUNE", bad[i].text, 1);
    dtl_plan *p = UNTOUCHED_PLAN;
    assert_int_equal(dtl_plan_create(f->s0r, f->rs1, &p), DTL_ERR_INVALID_ARGUMENT);
    char quoted[96];
    snprintf(quoted, sizeof quoted, "DTL_PLAN_TUNE=\"%s\"", bad[i].text);
    TP_EXPECT_MESSAGE("dtl_plan_create", quoted, bad[i].names, "alpha=2e-6,beta=2e-10,local_beta=1e-10");
    assert_ptr_equal(p, UNTOUCHED_PLAN);
  }
  unsetenv("DTL_PLAN_TUNE");
}

static void plan_tune_overrides_the_defaults_and_explicit_fields_override_it(void **state) {
  fixture *f = *state;
  dtl_cost_model def;
  assert_int_equal(dtl_cost_model_default(DTL_MEMORY_HOST, &def), DTL_OK);
  setenv("DTL_PLAN_TUNE", "beta=1e-9,alpha=5e-6", 1);
  dtl_plan *p;
  assert_int_equal(dtl_plan_create(f->s0r, f->rs1, &p), DTL_OK);
  assert_true(p->cost.alpha_s == 5e-6 && p->cost.beta_s_per_byte == 1e-9);
  assert_true(p->cost.local_beta_s_per_byte == def.local_beta_s_per_byte);
  dtl_plan_destroy(p);
  dtl_cost_model only_alpha = {.mask = DTL_COST_ALPHA, .alpha_s = 7e-6, .beta_s_per_byte = -1,
                               .local_beta_s_per_byte = -1}; /* unmasked fields are not read */
  assert_int_equal(dtl_plan_create_with_cost(f->s0r, f->rs1, &only_alpha, &p), DTL_OK);
  assert_true(p->cost.alpha_s == 7e-6 && p->cost.beta_s_per_byte == 1e-9);
  dtl_plan_destroy(p);
  setenv("DTL_PLAN_TUNE", "", 1); /* set but empty: nothing to override */
  assert_int_equal(dtl_plan_create(f->s0r, f->rs1, &p), DTL_OK);
  assert_true(p->cost.alpha_s == def.alpha_s && p->cost.beta_s_per_byte == def.beta_s_per_byte);
  dtl_plan_destroy(p);
  unsetenv("DTL_PLAN_TUNE");
}

static void bad_cost_models_are_rejected_naming_the_field(void **state) {
  fixture *f = *state;
  static const struct {
    dtl_cost_model c;
    const char *names;
  } bad[] = {
      {{.mask = DTL_BIT(5)},
       "cost->mask=0x20 has unknown bits 0x20 (known: DTL_COST_ALPHA, DTL_COST_BETA, DTL_COST_LOCAL_BETA, "
       "DTL_COST_INTER_ALPHA, DTL_COST_INTER_BETA)"},
      {{.mask = DTL_COST_INTER_BETA, .inter_beta_s_per_byte = -1}, "cost->inter_beta_s_per_byte=-1"},
      {{.mask = DTL_COST_ALPHA | DTL_BIT(40)}, "cost->mask=0x10000000001 has unknown bits 0x10000000000"},
      {{.flags = DTL_BIT(0)}, "cost->flags=0x1 has unknown bits 0x1 (none are defined)"},
      {{.mask = DTL_COST_ALPHA, .alpha_s = -1e-6}, "cost->alpha_s=-1e-06 (expected finite and >= 0)"},
      {{.mask = DTL_COST_BETA, .beta_s_per_byte = 1.0 / 0.0}, "cost->beta_s_per_byte=inf"},
      {{.mask = DTL_COST_LOCAL_BETA, .local_beta_s_per_byte = 0.0 / 0.0}, "cost->local_beta_s_per_byte=nan"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dtl_plan *p = UNTOUCHED_PLAN;
    assert_int_equal(dtl_plan_create_with_cost(f->s0r, f->rs1, &bad[i].c, &p), DTL_ERR_INVALID_ARGUMENT);
    TP_EXPECT_MESSAGE("dtl_plan_create_with_cost", bad[i].names);
    assert_ptr_equal(p, UNTOUCHED_PLAN);
  }
  dtl_cost_model out = {0};
  assert_int_equal(dtl_cost_model_default((dtl_memory)7, &out), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("dtl_cost_model_default", "memory=7");
  assert_int_equal(out.mask, 0);
  assert_int_equal(dtl_cost_model_default(DTL_MEMORY_HOST, NULL), DTL_ERR_INVALID_ARGUMENT);
  TP_EXPECT_MESSAGE("out=NULL");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(null_arguments_are_named),
      cmocka_unit_test(layouts_on_different_meshes_are_rejected),
      cmocka_unit_test(different_dtypes_are_rejected),
      cmocka_unit_test(different_global_shapes_are_rejected),
      cmocka_unit_test(shard_to_partial_avg_is_unsupported_with_the_reason),
      cmocka_unit_test(shard_to_partial_is_a_local_embed),
      cmocka_unit_test(changing_the_partial_op_is_unsupported_with_the_reason),
      cmocka_unit_test(unsupported_pairs_on_a_mesh_dim_of_size_one_are_relabelings),
      cmocka_unit_test(explain_into_a_small_buffer_names_the_size_needed_and_writes_nothing),
      cmocka_unit_test(malformed_plan_tune_is_rejected_naming_the_entry),
      cmocka_unit_test(plan_tune_overrides_the_defaults_and_explicit_fields_override_it),
      cmocka_unit_test(bad_cost_models_are_rejected_naming_the_field),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

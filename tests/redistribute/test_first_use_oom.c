/* SPDX-License-Identifier: Apache-2.0 */
/* Out of memory at every allocation of the first use of fresh objects (issue 17, part 1): what an agreement or a
 * first run needs is acquired when its communicator, mesh or plan is made, so a rank whose allocation fails still
 * takes part and every rank returns an error, never one alone while the others wait. Each case's undo destroys its
 * objects and makes them anew, so that every call of the sweep (tests/common/dt_oom.h) is a first use: a plan
 * between two meshes run for the first time, a dtl_redistribute between meshes that fails to plan, a plan's first
 * execution (also without DTL_CHECK: it allocates nothing), and the first TP forward, MoE dispatch and CP ring
 * call. Runs at 1, 2 and 3 ranks. */
#include "dt_oom.h"
#include "dtl.h"
#include "dtl_test_ranks.h"

static dt_oom_tally tally;
static dtl_comm *world; /* DTL_CHECK=1 */
static dtl_comm *plain; /* DTL_CHECK=0 */

/* --- plans -------------------------------------------------------------------------------------------------- */
typedef struct {
  dtl_comm *c;
  bool cross; /* between a 1-d mesh of every rank and the same ranks reversed, as a 1 x p mesh */
  dtl_mesh *a, *b;
  dtl_layout *src, *dst;
  dtl_plan *plan;
  float in[64], out[64 * 8];
} plan_ctx;

static void plan_make(plan_ctx *x) {
  int p = dt_size, shape2[2] = {1, p};
  int *rev = malloc(sizeof(int) * (size_t)p);
  for (int r = 0; r < p; r++) rev[r] = p - 1 - r;
  REQUIRE_OK(dtl_mesh_create(x->c, 1, &p, &x->a));
  if (x->cross) REQUIRE_OK(dtl_mesh_create_from_ranks(x->c, p, rev, 2, shape2, &x->b));
  free(rev);
  int64_t n = 8 * p, m = 8;
  REQUIRE_OK(dtl_layout_create(x->a, DTL_FLOAT32, 2, (int64_t[]){n, m}, (dtl_placement[]){dtl_shard(0)}, &x->src));
  if (x->cross)
    REQUIRE_OK(dtl_layout_create(x->b, DTL_FLOAT32, 2, (int64_t[]){n, m},
                                 (dtl_placement[]){dtl_replicate(), dtl_shard(1)}, &x->dst));
  else
    REQUIRE_OK(dtl_layout_create(x->a, DTL_FLOAT32, 2, (int64_t[]){n, m}, (dtl_placement[]){dtl_shard(1)}, &x->dst));
  REQUIRE_OK(dtl_plan_create(x->src, x->dst, &x->plan));
}

static void plan_free(plan_ctx *x) {
  dtl_plan_destroy(x->plan);
  dtl_layout_destroy(x->src);
  dtl_layout_destroy(x->dst);
  dtl_mesh_destroy(x->b);
  dtl_mesh_destroy(x->a);
  x->plan = NULL, x->src = x->dst = NULL, x->a = x->b = NULL;
}

static void plan_renew(void *c) {
  plan_free(c);
  plan_make(c);
}

static dtl_status plan_first_execution(void *c) {
  plan_ctx *x = c;
  return dtl_plan_execute(x->plan, x->in, x->out);
}

static dtl_status redistribute_first_call(void *c) {
  plan_ctx *x = c;
  return dtl_redistribute(x->src, x->in, x->dst, x->out);
}

static void plans_acquire_what_their_first_run_needs(void) {
  const struct {
    const char *what;
    dtl_comm **c;
    bool cross;
    dtl_status (*call)(void *);
  } cases[] = {
      {"first dtl_plan_execute, one mesh, DTL_CHECK=1", &world, false, plan_first_execution},
      {"first dtl_plan_execute, one mesh, DTL_CHECK=0", &plain, false, plan_first_execution},
      {"first dtl_plan_execute between meshes, DTL_CHECK=1", &world, true, plan_first_execution},
      {"first dtl_plan_execute between meshes, DTL_CHECK=0", &plain, true, plan_first_execution},
      {"first dtl_redistribute between meshes (plans, caches)", &world, true, redistribute_first_call},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    plan_ctx *x = calloc(1, sizeof *x);
    x->c = *cases[i].c;
    x->cross = cases[i].cross;
    for (int k = 0; k < 64; k++) x->in[k] = (float)(dt_rank * 64 + k);
    plan_make(x);
    /* dtl_redistribute keeps what its first call made (the plan cache and workspace) in the mesh: undo renews
     * the meshes. Without DTL_CHECK a plan's first execution must allocate nothing at all (a rank failing there
     * would return alone), which the sweep sees as zero allocations. */
    dt_oom_case c = {.what = cases[i].what, .call = cases[i].call, .undo = plan_renew, .ctx = x, .collective = true,
                     .caches = cases[i].call == redistribute_first_call};
    uint64_t n = dt_oom_sweep(&c, -1, &tally);
    if (cases[i].call == plan_first_execution)
      CHECK(n == 0, "%s: %llu allocations (expected none: the plan acquired them when it was made)", cases[i].what,
            (unsigned long long)n);
    if (dt_size > 1) {
      dt_oom_sweep(&c, 0, &tally);
      dt_oom_sweep(&c, dt_size - 1, &tally);
    }
    if (dt_rank == 0) printf("  %-60s %4llu allocations swept\n", cases[i].what, (unsigned long long)n);
    plan_free(x);
    free(x);
  }
}

/* --- TP ------------------------------------------------------------------------------------------------------ */
typedef struct {
  dtl_mesh *m;
  dtl_tp_context *ctx;
  dtl_tp_linear *l;
  dtl_layout *xl;
  dtl_tp_linear_kind kind;
  float w[64], x[4 * 8], y[4 * 8];
} tp_ctx;

static void tp_make(tp_ctx *t) {
  int p = dt_size;
  REQUIRE_OK(dtl_mesh_create(world, 1, &p, &t->m));
  REQUIRE_OK(dtl_tp_context_create(t->m, 0, NULL, &t->ctx));
  dtl_tp_linear_params lp = {.kind = t->kind, .in_features = 8, .out_features = 8, .weight = t->w,
                             .flags = t->kind == DTL_TP_COLUMN ? DTL_TP_GATHER_OUTPUT : 0};
  REQUIRE_OK(dtl_tp_linear_create(t->ctx, &lp, &t->l));
  REQUIRE_OK(dtl_tp_activation_layout(t->ctx, 4, 8, t->kind == DTL_TP_ROW ? dtl_shard(1) : dtl_replicate(), &t->xl));
}

static void tp_renew(void *c) {
  tp_ctx *t = c;
  dtl_layout_destroy(t->xl);
  dtl_tp_linear_destroy(t->l);
  dtl_tp_context_destroy(t->ctx);
  dtl_mesh_destroy(t->m);
  tp_make(t);
}

static dtl_status tp_first_forward(void *c) {
  tp_ctx *t = c;
  return dtl_tp_linear_forward(t->l, t->xl, t->x, t->y);
}

static void the_first_tp_forward_fails_every_rank_or_none(void) {
  dtl_tp_linear_kind kinds[] = {DTL_TP_ROW, DTL_TP_COLUMN};
  const char *names[] = {"first row-parallel forward", "first column-parallel forward (gathered)"};
  for (int i = 0; i < 2; i++) {
    tp_ctx *t = calloc(1, sizeof *t);
    t->kind = kinds[i];
    tp_make(t);
    dt_oom_case c = {.what = names[i], .call = tp_first_forward, .undo = tp_renew, .ctx = t, .collective = true,
                     .caches = true};
    dt_oom_every_way(&c, &tally);
    tp_renew(t);
    dtl_layout_destroy(t->xl);
    dtl_tp_linear_destroy(t->l);
    dtl_tp_context_destroy(t->ctx);
    dtl_mesh_destroy(t->m);
    free(t);
  }
}

/* --- MoE ----------------------------------------------------------------------------------------------------- */
enum { MT = 4, MK = 2, MH = 4 };
typedef struct {
  dtl_moe_placement *pl;
  dtl_moe_layout *L;
  int32_t ids[MT * MK];
  float wts[MT * MK], x[MT * MH], in[MT * MK * 8 * MH];
} moe_ctx;

static void moe_renew(void *c) {
  moe_ctx *m = c;
  dtl_moe_layout_destroy(m->L);
  m->L = NULL;
  REQUIRE_OK(dtl_moe_layout_create(world, m->pl, MT, MK, m->ids, m->wts, MH, DTL_FLOAT32, NULL, &m->L));
}

static dtl_status moe_first_dispatch(void *c) {
  moe_ctx *m = c;
  return dtl_moe_layout_dispatch(m->L, m->x, m->in);
}

static void the_first_moe_dispatch_fails_every_rank_or_none(void) {
  if (dt_size > 8) return;
  moe_ctx *m = calloc(1, sizeof *m);
  int experts = 2 * dt_size;
  for (int t = 0; t < MT; t++) {
    m->ids[t * MK] = (int32_t)((t + dt_rank) % experts);
    m->ids[t * MK + 1] = (int32_t)((t + dt_rank + 1) % experts);
    m->wts[t * MK] = m->wts[t * MK + 1] = 0.5f;
  }
  REQUIRE_OK(dtl_moe_placement_create(experts, dt_size, NULL, &m->pl));
  moe_renew(m);
  dt_oom_case c = {.what = "first dtl_moe_layout_dispatch", .call = moe_first_dispatch, .undo = moe_renew, .ctx = m,
                   .collective = true, .caches = true};
  dt_oom_every_way(&c, &tally);
  dtl_moe_layout_destroy(m->L);
  dtl_moe_placement_destroy(m->pl);
  free(m);
}

/* --- CP ------------------------------------------------------------------------------------------------------ */
typedef struct {
  dtl_mesh *m;
  dtl_cp_context *ctx;
  float q[4 * 8], out[4 * 8];
} cp_ctx;

static void cp_renew(void *c) {
  cp_ctx *x = c;
  dtl_cp_context_destroy(x->ctx);
  dtl_mesh_destroy(x->m);
  int p = dt_size;
  REQUIRE_OK(dtl_mesh_create(world, 1, &p, &x->m));
  REQUIRE_OK(dtl_cp_context_create(x->m, 0, NULL, &x->ctx));
}

static dtl_status cp_first_ring(void *c) {
  cp_ctx *x = c;
  dtl_cp_attention_params prm = {.tokens = 4 * dt_size, .q_heads = 2, .kv_heads = 2, .head_dim = 4,
                                 .layout = DTL_CP_CONTIGUOUS};
  return dtl_cp_ring_attention(x->ctx, &prm, x->q, x->q, x->q, x->out, NULL);
}

static void the_first_cp_ring_call_fails_every_rank_or_none(void) {
  cp_ctx *x = calloc(1, sizeof *x);
  for (int i = 0; i < 32; i++) x->q[i] = (float)(i % 7) * 0.125f;
  cp_renew(x);
  dt_oom_case c = {.what = "first dtl_cp_ring_attention", .call = cp_first_ring, .undo = cp_renew, .ctx = x,
                   .collective = true, .caches = true};
  dt_oom_every_way(&c, &tally);
  dtl_cp_context_destroy(x->ctx);
  dtl_mesh_destroy(x->m);
  free(x);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  dt_ranks_init();
  world = dt_comm_with_check(true);
  plain = dt_comm_with_check(false);
  if (!world || !plain) return dt_skip(dtl_last_error());
  RUN(plans_acquire_what_their_first_run_needs);
  RUN(the_first_tp_forward_fails_every_rank_or_none);
  RUN(the_first_moe_dispatch_fails_every_rank_or_none);
  RUN(the_first_cp_ring_call_fails_every_rank_or_none);
  if (dt_rank == 0) printf("%ld calls, %ld of them failed as injected or agreed\n", tally.calls, tally.failures);
  dtl_comm_destroy(plain);
  dtl_comm_destroy(world);
  return dt_finish();
}

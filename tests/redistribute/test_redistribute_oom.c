/* SPDX-License-Identifier: Apache-2.0 */
/* Out of memory at every allocation of every entry point of meshes, layouts, plans and redistribution
 * (tests/common/dt_oom.h): abstract and MPI meshes, layouts, plan creation (the plain search and the
 * step-limited one), explain and visualize, and the collective ones (plan execution, dtl_redistribute with
 * its plan cache, distribute, full_tensor) with the failure on every rank and on one. Each failure is
 * DTL_ERR_OUT_OF_MEMORY (or the agreed error on the other ranks), frees what it allocated, writes no output,
 * and the next call works. Runs at 1 and 2 ranks with DTL_CHECK=1. */
#include "dt_oom.h"

#define POISON ((void *)0x5a5a)
enum { N0 = 6, N1 = 5 }; /* the distributed tensor */

static dtl_comm *world;
static dt_oom_tally tally;

/* --- local entry points ----------------------------------------------------------------------------- */

typedef struct {
  dtl_mesh *abstract, *mesh;
  dtl_layout *l, *other, *to;
  dtl_plan *plan;
  char *text;
  size_t cap;
} local_ctx;

static bool mesh_untouched(void *c) { return ((local_ctx *)c)->mesh == POISON; }
static void mesh_undo(void *c) {
  local_ctx *x = c;
  dtl_mesh_destroy(x->mesh);
  x->mesh = POISON;
}
static dtl_status mesh_abstract(void *c) {
  return dtl_mesh_create_abstract(3, (int[]){2, 3, 2}, (int[]){1, 2, 0}, &((local_ctx *)c)->mesh);
}

static bool layout_untouched(void *c) { return ((local_ctx *)c)->l == POISON; }
static void layout_undo(void *c) {
  local_ctx *x = c;
  dtl_layout_destroy(x->l);
  x->l = POISON;
}
static dtl_status layout_create(void *c) {
  local_ctx *x = c;
  return dtl_layout_create(x->abstract, DTL_FLOAT32, 3, (int64_t[]){7, 5, 3},
                           (dtl_placement[]){dtl_shard(0), dtl_partial(DTL_SUM), dtl_shard(-1)}, &x->l);
}
static dtl_status layout_with(void *c) {
  local_ctx *x = c;
  return dtl_layout_with_placements(x->other, (dtl_placement[]){dtl_replicate(), dtl_shard(1), dtl_shard(0)}, &x->l);
}

static bool plan_untouched(void *c) { return ((local_ctx *)c)->plan == POISON; }
static void plan_undo(void *c) {
  local_ctx *x = c;
  dtl_plan_destroy(x->plan);
  x->plan = POISON;
}
static dtl_status plan_create(void *c) {
  local_ctx *x = c;
  return dtl_plan_create(x->other, x->to, &x->plan);
}
/* Free collectives: the one-label search gives up and the step-limited search runs. */
static dtl_status plan_create_limited(void *c) {
  local_ctx *x = c;
  static const dtl_cost_model free_coll = {.mask = DTL_COST_ALPHA | DTL_COST_BETA};
  return dtl_plan_create_with_cost(x->l, x->other, &free_coll, &x->plan);
}

static bool text_untouched(void *c) {
  local_ctx *x = c;
  for (size_t i = 0; i < x->cap; i++)
    if (x->text[i] != 'u') return false;
  return true;
}
static void text_undo(void *c) {
  local_ctx *x = c;
  memset(x->text, 'u', x->cap);
}
static dtl_status plan_explain(void *c) {
  local_ctx *x = c;
  return dtl_plan_explain(x->plan, x->text, x->cap);
}
static dtl_status layout_visualize(void *c) {
  local_ctx *x = c;
  return dtl_layout_visualize(x->l, x->text, x->cap);
}

static void every_local_entry_point_survives_each_failed_allocation(void) {
  local_ctx x = {.mesh = POISON, .l = POISON, .plan = POISON, .cap = 4096};
  x.text = malloc(x.cap);
  memset(x.text, 'u', x.cap);
  REQUIRE_OK(dtl_mesh_create_abstract(3, (int[]){2, 3, 2}, NULL, &x.abstract));
  REQUIRE_OK(dtl_layout_create(x.abstract, DTL_FLOAT32, 3, (int64_t[]){7, 5, 3},
                               (dtl_placement[]){dtl_shard(0), dtl_shard(1), dtl_shard(2)}, &x.other));
  REQUIRE_OK(dtl_layout_with_placements(x.other, (dtl_placement[]){dtl_shard(2), dtl_shard(1), dtl_shard(0)}, &x.to));
  const dt_oom_case cases[] = {
      {.what = "dtl_mesh_create_abstract",
       .call = mesh_abstract,
       .untouched = mesh_untouched,
       .undo = mesh_undo,
       .ctx = &x},
      {.what = "dtl_layout_create",
       .call = layout_create,
       .untouched = layout_untouched,
       .undo = layout_undo,
       .ctx = &x},
      {.what = "dtl_layout_with_placements",
       .call = layout_with,
       .untouched = layout_untouched,
       .undo = layout_undo,
       .ctx = &x},
      {.what = "dtl_plan_create", .call = plan_create, .untouched = plan_untouched, .undo = plan_undo, .ctx = &x},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) dt_oom_every_way(&cases[i], &tally);
  /* The step-limited search, from P,R,R,P: on a 3x2x4x3 mesh its cheapest free route has 17 steps. */
  dtl_layout_destroy(x.to);
  dtl_mesh *big;
  REQUIRE_OK(dtl_mesh_create_abstract(4, (int[]){3, 2, 4, 3}, NULL, &big));
  dtl_layout_destroy(x.other);
  REQUIRE_OK(dtl_layout_create(
      big, DTL_FLOAT32, 3, (int64_t[]){1, 16, 8},
      (dtl_placement[]){dtl_partial(DTL_SUM), dtl_replicate(), dtl_replicate(), dtl_partial(DTL_SUM)}, &x.l));
  REQUIRE_OK(dtl_layout_with_placements(x.l, (dtl_placement[]){dtl_shard(0), dtl_shard(0), dtl_shard(1), dtl_shard(1)},
                                        &x.other));
  const dt_oom_case limited = {.what = "dtl_plan_create_with_cost (step-limited search)",
                               .call = plan_create_limited,
                               .untouched = plan_untouched,
                               .undo = plan_undo,
                               .ctx = &x};
  dt_oom_every_way(&limited, &tally);
  REQUIRE_OK(plan_create_limited(&x));
  const dt_oom_case explain = {
      .what = "dtl_plan_explain", .call = plan_explain, .untouched = text_untouched, .undo = text_undo, .ctx = &x};
  dt_oom_every_way(&explain, &tally);
  dtl_plan_destroy(x.plan);
  dtl_layout_destroy(x.l);
  REQUIRE_OK(dtl_layout_create(big, DTL_FLOAT32, 2, (int64_t[]){9, 7},
                               (dtl_placement[]){dtl_shard(0), dtl_replicate(), dtl_shard(1), dtl_partial(DTL_MAX)},
                               &x.l));
  const dt_oom_case vis = {.what = "dtl_layout_visualize",
                           .call = layout_visualize,
                           .untouched = text_untouched,
                           .undo = text_undo,
                           .ctx = &x};
  dt_oom_every_way(&vis, &tally);
  dtl_layout_destroy(x.l);
  dtl_layout_destroy(x.other);
  dtl_mesh_destroy(big);
  dtl_mesh_destroy(x.abstract);
  free(x.text);
}

/* --- collective entry points ------------------------------------------------------------------------ */

/* A fresh mesh over world, layouts S(0) and S(1) of [N0, N1] and an S(0) -> S(1) plan: every call under test
 * starts from objects that have cached nothing (no plan workspace, no redistribute cache). */
typedef struct {
  dtl_mesh *mesh, *made;
  dtl_layout *s0, *s1, *r;
  dtl_plan *plan;
  float src[N0 * N1], dst[N0 * N1], dense[N0 * N1];
  size_t dst_n;
} coll_ctx;

static void fresh(coll_ctx *x) {
  REQUIRE_OK(dtl_mesh_create(world, 1, &dt_size, &x->mesh));
  REQUIRE_OK(dtl_layout_create(x->mesh, DTL_FLOAT32, 2, (int64_t[]){N0, N1}, (dtl_placement[]){dtl_shard(0)}, &x->s0));
  REQUIRE_OK(dtl_layout_create(x->mesh, DTL_FLOAT32, 2, (int64_t[]){N0, N1}, (dtl_placement[]){dtl_shard(1)}, &x->s1));
  REQUIRE_OK(
      dtl_layout_create(x->mesh, DTL_FLOAT32, 2, (int64_t[]){N0, N1}, (dtl_placement[]){dtl_replicate()}, &x->r));
  REQUIRE_OK(dtl_plan_create(x->s0, x->s1, &x->plan));
  for (int i = 0; i < N0 * N1; i++) x->src[i] = x->dense[i] = (float)(i + 1);
  for (int i = 0; i < N0 * N1; i++) x->dst[i] = -7;
  x->made = POISON;
}
static void release(coll_ctx *x) {
  dtl_plan_destroy(x->plan);
  dtl_layout_destroy(x->s0);
  dtl_layout_destroy(x->s1);
  dtl_layout_destroy(x->r);
  dtl_mesh_destroy(x->mesh);
}
static void coll_undo(void *c) {
  coll_ctx *x = c;
  if (x->made != POISON) dtl_mesh_destroy(x->made);
  release(x);
  fresh(x);
}
static bool coll_untouched(void *c) {
  coll_ctx *x = c;
  for (int i = 0; i < N0 * N1; i++)
    if (x->dst[i] != -7) return false;
  return x->made == POISON;
}
static dtl_status mesh_create(void *c) {
  int shape[2] = {1, dt_size};
  return dtl_mesh_create(world, 2, shape, &((coll_ctx *)c)->made);
}
static dtl_status plan_execute(void *c) {
  coll_ctx *x = c;
  return dtl_plan_execute(x->plan, x->src, x->dst);
}
static dtl_status redistribute(void *c) {
  coll_ctx *x = c;
  return dtl_redistribute(x->s1, x->src, x->s0, x->dst);
}
static dtl_status distribute(void *c) {
  coll_ctx *x = c;
  return dtl_distribute(x->s1, x->dense, 0, x->dst);
}
static dtl_status full_tensor(void *c) {
  coll_ctx *x = c;
  return dtl_full_tensor(x->s0, x->src, x->dst);
}

/* These calls may leave a cached plan (dtl_redistribute's cache) or the agreement's buffer (kept by the
 * mesh's communicators) behind a failure: the sweep counts what is live after remaking the objects. */
static void every_collective_entry_point_survives_each_failed_allocation_on_any_rank(void) {
  coll_ctx x;
  fresh(&x);
  const dt_oom_case cases[] = {
      {.what = "dtl_mesh_create",
       .call = mesh_create,
       .untouched = coll_untouched,
       .undo = coll_undo,
       .ctx = &x,
       .collective = true,
       .caches = true},
      {.what = "dtl_plan_execute (first run: its workspace)",
       .call = plan_execute,
       .untouched = coll_untouched,
       .undo = coll_undo,
       .ctx = &x,
       .collective = true,
       .caches = true},
      {.what = "dtl_redistribute (plans and caches)",
       .call = redistribute,
       .untouched = coll_untouched,
       .undo = coll_undo,
       .ctx = &x,
       .collective = true,
       .caches = true},
      {.what = "dtl_distribute",
       .call = distribute,
       .untouched = coll_untouched,
       .undo = coll_undo,
       .ctx = &x,
       .collective = true,
       .caches = true},
      {.what = "dtl_full_tensor",
       .call = full_tensor,
       .untouched = coll_untouched,
       .undo = coll_undo,
       .ctx = &x,
       .collective = true,
       .caches = true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) dt_oom_every_way(&cases[i], &tally);
  release(&x);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  unsetenv("DTL_PLAN_TUNE");
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  RUN(every_local_entry_point_survives_each_failed_allocation);
  RUN(every_collective_entry_point_survives_each_failed_allocation_on_any_rank);
  if (dt_rank == 0)
    printf("%ld calls, %ld of them failed by an injected allocation failure\n", tally.calls, tally.failures);
  dtl_comm_destroy(world);
  return dt_finish();
}

/* SPDX-License-Identifier: Apache-2.0 */
/* One rank's bad argument, missing memory or different call fails every rank of a redistribution, under the
 * watchdog. With DTL_CHECK on the mesh's communicator, dtl_plan_execute, dtl_redistribute and
 * dtl_full_tensor agree on the plan's fingerprint (layouts, mesh, steps, cost model) and every rank's
 * verdict (arguments and scratch) before the first step; dtl_distribute, whose root alone reads and packs,
 * agrees with or without DTL_CHECK. No destination is written by a failed call. */
#include "common/alloc.h"
#include "dtl_test_ranks.h"

#define ROWS 8
#define COLS 6
#define SENTINEL -7

static dtl_comm *checked, *plain;
static dtl_mesh *mesh, *other_mesh, *plain_mesh;

static dtl_layout *layout(dtl_mesh *m, int64_t rows, dtl_placement p) {
  int64_t shape[2] = {rows, COLS};
  dtl_layout *l = NULL;
  CHECK_OK(dtl_layout_create(m, DTL_INT32, 2, shape, &p, &l));
  return l;
}

typedef struct {
  int32_t dense[ROWS * COLS], src[ROWS * COLS], dst[ROWS * COLS];
} bufs;

static void arm(bufs *b) {
  for (int i = 0; i < ROWS * COLS; i++) {
    b->dense[i] = i;
    b->src[i] = i;
    b->dst[i] = SENTINEL;
  }
}
static bool untouched(const bufs *b) {
  for (int i = 0; i < ROWS * COLS; i++)
    if (b->dst[i] != SENTINEL) return false;
  return true;
}

static void a_null_buffer_on_one_rank_fails_every_rank(void) {
  bool me = dt_rank == dt_bad;
  dtl_layout *s0 = layout(mesh, ROWS, dtl_shard(0)), *r = layout(mesh, ROWS, dtl_replicate());
  dtl_plan *plan = NULL;
  CHECK_OK(dtl_plan_create(s0, r, &plan));
  bufs b;
  arm(&b);
  dt_expect_every_rank_fails("plan_execute", dtl_plan_execute(plan, b.src, me ? NULL : b.dst), DTL_ERR_INVALID_ARGUMENT,
                             "dst_local=NULL");
  dt_expect_every_rank_fails("redistribute", dtl_redistribute(s0, me ? NULL : b.src, r, b.dst),
                             DTL_ERR_INVALID_ARGUMENT, "src_local=NULL");
  dt_expect_every_rank_fails("full_tensor", dtl_full_tensor(s0, b.src, me ? NULL : b.dst), DTL_ERR_INVALID_ARGUMENT,
                             "dst_local=NULL");
  /* The source and target buffer are one: only a purely local plan may do that (one rank's plan is). */
  if (dt_size > 1)
    dt_expect_every_rank_fails("aliased", dtl_plan_execute(plan, b.src, me ? b.src : b.dst), DTL_ERR_INVALID_ARGUMENT,
                               "overlap");
  CHECK(untouched(&b), "a failed call wrote dst");
  CHECK_OK(dtl_plan_execute(plan, b.src, b.dst)); /* and the same plan still runs */
  dtl_plan_destroy(plan);
  dtl_layout_destroy(s0);
  dtl_layout_destroy(r);
}

/* The scratch is the plan's from its creation: a rank without memory learns it from dtl_plan_create (local, before
 * any collective), and an execution, the first included, allocates nothing that could fail on one rank. */
static void a_rank_without_scratch_memory_fails_at_plan_creation_never_in_an_execution(void) {
  bool me = dt_rank == dt_bad;
  /* S(1) -> R gathers columns: the received blocks need unpacking, through scratch. */
  dtl_layout *s1 = layout(mesh, ROWS, dtl_shard(1)), *r = layout(mesh, ROWS, dtl_replicate());
  dtl_plan *plan = NULL;
  CHECK_OK(dtl_plan_create(s1, r, &plan));
  bufs b;
  arm(&b);
  CHECK(dt_size == 1 || dtl_plan_scratch_bytes(plan) > 0, "S(1) -> R needs no scratch: the case tests nothing");
  if (dtl_plan_scratch_bytes(plan) > 0) {
    /* Every allocation fails on the bad rank from here on: the plan it has runs all the same. */
    dtl__alloc_hook_reset(me ? 1 : 0, true);
    dtl_status st = dtl_plan_execute(plan, b.src, b.dst);
    uint64_t allocs = dtl__alloc_hook_count();
    dtl_plan *other = NULL;
    dtl_status made = me ? dtl_plan_create(s1, r, &other) : DTL_ERR_OUT_OF_MEMORY;
    dtl__alloc_hook_reset(0, false);
    CHECK(st == DTL_OK, "an execution without memory on rank %d: %s: %s", dt_bad, dtl_status_name(st), dtl_last_error());
    CHECK(allocs == 0 || !me, "the execution allocated %llu times", (unsigned long long)allocs);
    CHECK(made == DTL_ERR_OUT_OF_MEMORY && other == NULL, "dtl_plan_create without memory: %s", dtl_status_name(made));
  }
  dtl_plan_destroy(plan);
  dtl_layout_destroy(s1);
  dtl_layout_destroy(r);
}

/* Each of these pairs of calls would run mismatched collectives without DTL_CHECK: another shape makes the
 * counts differ (MPI may complete with wrong data), another cost model may make another plan, another mesh of
 * the same shape runs on other communicators (the peers would match this rank's next call). */
static void a_rank_that_makes_another_call_gets_every_rank_a_mismatch(void) {
  bool me = dt_rank == dt_bad;
  dtl_layout *s0 = layout(mesh, ROWS, dtl_shard(0)), *r = layout(mesh, ROWS, dtl_replicate());
  dtl_layout *s0_short = layout(mesh, ROWS - 1, dtl_shard(0)), *r_short = layout(mesh, ROWS - 1, dtl_replicate());
  dtl_layout *s1 = layout(mesh, ROWS, dtl_shard(1));
  dtl_layout *s0_other = layout(other_mesh, ROWS, dtl_shard(0)), *r_other = layout(other_mesh, ROWS, dtl_replicate());
  bufs b;
  arm(&b);
  dt_expect_mismatch("shape", dtl_redistribute(me ? s0_short : s0, b.src, me ? r_short : r, b.dst));
  dt_expect_mismatch("target", dtl_redistribute(s0, b.src, me ? s1 : r, b.dst));
  dt_expect_mismatch("mesh", dtl_redistribute(me ? s0_other : s0, b.src, me ? r_other : r, b.dst));
  dt_expect_mismatch("full_tensor", dtl_full_tensor(me ? s1 : s0, b.src, b.dst));
  /* The same layouts and steps, another cost model: the plan's fingerprint includes the resolved model (as
   * ranks with different DTL_PLAN_TUNE would make). */
  dtl_cost_model tuned = {.mask = DTL_COST_ALPHA, .alpha_s = 5e-6};
  dtl_plan *plan = NULL;
  CHECK_OK(me ? dtl_plan_create_with_cost(s0, r, &tuned, &plan) : dtl_plan_create(s0, r, &plan));
  dt_expect_mismatch("cost model", dtl_plan_execute(plan, b.src, b.dst));
  dtl_plan_destroy(plan);
  /* Another plan between the same layouts' meshes. */
  CHECK_OK(dtl_plan_create(s0, me ? s1 : r, &plan));
  dt_expect_mismatch("plan", dtl_plan_execute(plan, b.src, b.dst));
  dtl_plan_destroy(plan);
  CHECK(dt_size == 1 || untouched(&b), "a mismatched call wrote dst");
  dtl_layout *ls[] = {s0, r, s0_short, r_short, s1, s0_other, r_other};
  for (size_t i = 0; i < sizeof ls / sizeof *ls; i++) dtl_layout_destroy(ls[i]);
}

/* Root alone reads the dense tensor and allocates its send lists and the pack buffer of boxes that are no runs of
 * the dense tensor (column blocks here): dtl_distribute agrees on every call. */
static void distribute_fails_every_rank_with_or_without_dtl_check(void) {
  bool me = dt_rank == dt_bad;
  dtl_mesh *meshes[2] = {plain_mesh, mesh};
  for (int k = 0; k < 2; k++) {
    dtl_layout *s0 = layout(meshes[k], ROWS, dtl_shard(0));
    bufs b;
    arm(&b);
    dt_expect_every_rank_fails("dense", dtl_distribute(s0, me ? NULL : b.dense, dt_bad, b.dst),
                               DTL_ERR_INVALID_ARGUMENT, "dense_on_root=NULL");
    dt_expect_every_rank_fails("local", dtl_distribute(s0, b.dense, 0, me ? NULL : b.dst), DTL_ERR_INVALID_ARGUMENT,
                               "local=NULL");
    dt_expect_every_rank_fails("root", dtl_distribute(s0, b.dense, me ? -1 : 0, b.dst), DTL_ERR_INVALID_ARGUMENT,
                               "root=-1");
    if (dt_size > 1) {
      dt_expect_mismatch("root", dtl_distribute(s0, b.dense, me ? 1 : 0, b.dst));
      dtl__alloc_hook_reset(me ? 1 : 0, false); /* the root's first allocation: its send lists */
      dtl_status st = dtl_distribute(s0, b.dense, dt_bad, b.dst);
      dtl__alloc_hook_reset(0, false);
      dt_expect_every_rank_fails("lists", st, DTL_ERR_OUT_OF_MEMORY, "out of host memory");
      dtl_layout *s1 = layout(meshes[k], ROWS, dtl_shard(1));
      dtl__alloc_hook_reset(me ? 2 : 0, false); /* the second: the buffer a column block is packed in */
      st = dtl_distribute(s1, b.dense, dt_bad, b.dst);
      dtl__alloc_hook_reset(0, false);
      dt_expect_every_rank_fails("pack", st, DTL_ERR_OUT_OF_MEMORY, "allocate");
      dtl_layout_destroy(s1);
    }
    CHECK(untouched(&b), "a failed call wrote local");
    CHECK_OK(dtl_distribute(s0, b.dense, dt_bad, b.dst));
    dtl_layout_destroy(s0);
  }
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  dt_watchdog_s = 30;
  dt_ranks_init();
  int shape[1] = {dt_size};
  checked = dt_comm_with_check(true);
  plain = dt_comm_with_check(false);
  int ok = checked && plain;
  ok = ok && dtl_mesh_create(checked, 1, shape, &mesh) == DTL_OK &&
       dtl_mesh_create(checked, 1, shape, &other_mesh) == DTL_OK;
  ok = ok && dtl_mesh_create(plain, 1, shape, &plain_mesh) == DTL_OK;
  if (!ok) return dt_skip(dtl_last_error());
  RUN(a_null_buffer_on_one_rank_fails_every_rank);
  RUN(a_rank_without_scratch_memory_fails_at_plan_creation_never_in_an_execution);
  RUN(a_rank_that_makes_another_call_gets_every_rank_a_mismatch);
  RUN(distribute_fails_every_rank_with_or_without_dtl_check);
  dtl_mesh_destroy(mesh);
  dtl_mesh_destroy(other_mesh);
  dtl_mesh_destroy(plain_mesh);
  dtl_comm_destroy(checked);
  dtl_comm_destroy(plain);
  return dt_finish();
}

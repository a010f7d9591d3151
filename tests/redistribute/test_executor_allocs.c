/* SPDX-License-Identifier: Apache-2.0 */
/* Compiled plans: once a plan has run, running it again allocates nothing (the library's allocation counter,
 * common/alloc.h, which device memory reports to as well, stays still over 100 calls), for every kind of step
 * (all-gather with unpack, reduce-scatter with pack, chunked and unchunked all-to-all, local steps, multi-step
 * plans, uneven shards), through dtl_plan_execute, the cached dtl_redistribute, a caller's workspace (which
 * allocates nothing even on the first call) and dtl_plan_execute_async (in the blocking call's workspace); every result is checked against the dense tensor. Then the
 * workspace rules: too small or NULL is rejected naming the bytes needed, and in-place local plans fit in
 * dtl_plan_workspace_bytes. */
#include "dtl_test.h"
#include "common/alloc.h"
#include "redistribute/executor_internal.h"

#define REPEAT 100

static dtl_comm *world;
static dtl_mesh *line; /* 1-D over all ranks */

/* The dense tensor: element i (row-major) is i % 1009 - 500, exact in every dtype used and in sums over ranks. */
static double value(int64_t i) { return (double)(i % 1009 - 500); }

typedef struct {
  dtl_mesh *mesh;
  dtl_layout *src, *dst;
  dtl_plan *plan;
  float *in, *out;
  char what[160];
} pair;

/* Whether this rank holds the identity (0) of a P(sum) placement: a Partial mesh dim where its coordinate is
 * not 0 (the source shard of coordinate 0 then carries the whole value). */
static int holds_zero(const dtl_layout *l) {
  dtl_placement p[DTL_MAX_MESH_DIMS];
  int coord[DTL_MAX_MESH_DIMS];
  const dtl_mesh *m = dtl_layout_mesh(l);
  dtl_layout_placements(l, p);
  dtl_mesh_coord(m, coord);
  for (int d = 0; d < dtl_mesh_ndim(m); d++)
    if (p[d].kind == DTL_PARTIAL && coord[d] != 0) return 1;
  return 0;
}

/* This rank's shard of l for the dense tensor (Partial: the value on coordinate 0, zero elsewhere). */
static void fill(const dtl_layout *l, float *buf) {
  int64_t shape[DTL_MAX_TENSOR_DIMS], off[DTL_MAX_TENSOR_DIMS], g[DTL_MAX_TENSOR_DIMS];
  int nd = dtl_layout_ndim(l);
  dtl_layout_local_box(l, NULL, shape, off);
  dtl_layout_global_shape(l, g);
  int zero = holds_zero(l);
  size_t n = dtl_layout_local_count(l);
  for (size_t i = 0; i < n; i++) {
    int64_t rest = (int64_t)i, gi = 0, idx[DTL_MAX_TENSOR_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
      idx[d] = rest % shape[d];
      rest /= shape[d];
    }
    for (int d = 0; d < nd; d++) gi = gi * g[d] + idx[d] + off[d];
    buf[i] = zero ? 0.0f : (float)value(gi);
  }
}

/* Elements of the (non-Partial) shard buf of l that differ from the dense tensor. */
static long wrong(const dtl_layout *l, const float *buf) {
  size_t n = dtl_layout_local_count(l);
  float *want = malloc(n * sizeof *want + 4);
  fill(l, want);
  long bad = 0;
  for (size_t i = 0; i < n; i++) bad += buf[i] != want[i];
  free(want);
  return bad;
}

static dtl_layout *layout(dtl_mesh *m, int nd, const int64_t *shape, const char *text) {
  dtl_placement p[DTL_MAX_MESH_DIMS];
  int n = 0;
  dtl_layout *l = NULL;
  CHECK_OK(dtl_placements_parse(text, p, DTL_MAX_MESH_DIMS, &n));
  CHECK_OK(dtl_layout_create(m, DTL_FLOAT32, nd, shape, p, &l));
  return l;
}

/* A pair of 2-d layouts and its plan, with the source shard filled. */
static void pair_open(pair *q, dtl_mesh *m, const int64_t *shape, const char *from, const char *to) {
  memset(q, 0, sizeof *q);
  q->mesh = m;
  q->src = layout(m, 2, shape, from);
  q->dst = layout(m, 2, shape, to);
  snprintf(q->what, sizeof q->what, "mesh of %d, [%lld,%lld] %s -> %s", dtl_mesh_size(m), (long long)shape[0],
           (long long)shape[1], from, to);
  CHECK_OK(dtl_plan_create(q->src, q->dst, &q->plan));
  q->in = malloc(dtl_layout_local_count(q->src) * sizeof(float) + 4);
  q->out = malloc(dtl_layout_local_count(q->dst) * sizeof(float) + 4);
  fill(q->src, q->in);
}

static void pair_close(pair *q) {
  dtl_plan_destroy(q->plan);
  dtl_layout_destroy(q->src);
  dtl_layout_destroy(q->dst);
  free(q->in);
  free(q->out);
}

typedef enum { VIA_EXECUTE, VIA_REDISTRIBUTE, VIA_WORKSPACE, VIA_ASYNC } via;

/* dtl_plan_execute_async, then dtl_test until done on even calls (dtl_wait alone on odd ones), then dtl_wait. */
static dtl_status execute_async(pair *q, int i) {
  dtl_request *req = NULL;
  dtl_status st = dtl_plan_execute_async(q->plan, q->in, q->out, &req);
  for (int done = 0; st == DTL_OK && !done && i % 2 == 0;) st = dtl_test(req, &done);
  if (req) {
    dtl_status w = dtl_wait(req);
    if (st == DTL_OK) st = w;
  }
  return st;
}

/* One warm-up call (none through a caller's workspace), then REPEAT calls that must not allocate; the
 * output is checked after the first and the last. Nonblocking: the warm-up is a blocking call, and the first
 * nonblocking one makes its requests (the plan's and the transport's) but runs in the same workspace, which stays
 * as the blocking call left it; the calls after it allocate nothing. */
static void repeat_pair(pair *q, via how) {
  size_t wsb = dtl_plan_workspace_bytes(q->plan), own = 0;
  void *ws = how == VIA_WORKSPACE ? malloc(wsb + 1) : NULL;
  for (int i = -1; i < REPEAT; i++) {
    if (i == (how == VIA_WORKSPACE ? -1 : how == VIA_ASYNC ? 1 : 0)) dtl__alloc_hook_reset(0, false);
    if (how == VIA_ASYNC && i == 0 && q->plan) own = q->plan->exec->own_bytes;
    memset(q->out, 0x5a, dtl_layout_local_count(q->dst) * sizeof(float));
    dtl_status st = how == VIA_EXECUTE || (how == VIA_ASYNC && i == -1) ? dtl_plan_execute(q->plan, q->in, q->out)
                    : how == VIA_WORKSPACE ? dtl_plan_execute_with_workspace(q->plan, q->in, q->out, ws, wsb)
                    : how == VIA_ASYNC     ? execute_async(q, i)
                                           : dtl_redistribute(q->src, q->in, q->dst, q->out);
    CHECK(st == DTL_OK, "%s (call %d): %s", q->what, i, dtl_last_error());
    if (i <= 0 || i == REPEAT - 1) CHECK(wrong(q->dst, q->out) == 0, "%s (call %d): wrong values", q->what, i);
    if (how == VIA_ASYNC && i == 0 && q->plan)
      CHECK(q->plan->exec->own_bytes == own, "%s: the nonblocking execution grew the workspace from %zu to %zu bytes",
            q->what, own, q->plan->exec->own_bytes);
  }
  uint64_t n = dtl__alloc_hook_count();
  static const char *name[] = {"dtl_plan_execute", "dtl_redistribute", "dtl_plan_execute_with_workspace",
                               "dtl_plan_execute_async"};
  CHECK(n == 0, "%s: %llu allocations in %d repeated %s calls", q->what, (unsigned long long)n, REPEAT, name[how]);
  free(ws);
}

/* The plans every case runs: one per kind of step on a 1-D mesh of all ranks (uneven where p does not divide
 * the dims), chunked passes with small chunks, and multi-step plans on a 2 x (p/2) mesh. */
static void for_each_pair(via how) {
  int p = dt_size;
  dtl_mesh *m2 = NULL;
  static const struct {
    int64_t shape[2];
    const char *from, *to;
    size_t chunk; /* executor chunk bytes (0: default) */
  } one_d[] = {
      {{7, 5}, "S1", "R", 0},      /* all-gather with unpack, uneven */
      {{6, 9}, "P", "S1", 0},      /* reduce-scatter with pack, uneven */
      {{9, 7}, "S0", "S1", 0},     /* all-to-all, uneven */
      {{13, 3}, "S0", "R", 0},     /* contiguous all-gather, uneven */
      {{5, 6}, "P", "R", 0},       /* all-reduce */
      {{5, 6}, "R", "S1", 0},      /* local slice */
      {{40, 12}, "S1", "R", 48},   /* chunked gather */
      {{40, 12}, "P", "S1", 48},   /* chunked reduce-scatter */
      {{40, 12}, "S0", "S1", 256}, /* chunked all-to-all */
      {{41, 13}, "S1", "S0", 256}, /* chunked all-to-all, uneven */
  };
  for (size_t i = 0; i < sizeof one_d / sizeof one_d[0]; i++) {
    dtl__executor_set_chunking(one_d[i].chunk, one_d[i].chunk ? 2 : 0);
    pair q;
    pair_open(&q, line, one_d[i].shape, one_d[i].from, one_d[i].to);
    dtl__executor_set_chunking(0, 0);
    if (one_d[i].chunk && p > 1 && q.plan)
      CHECK(q.plan->exec->ex[0].crows > 0, "%s: the step is not chunked (the case would not cover chunking)", q.what);
    repeat_pair(&q, how);
    pair_close(&q);
  }
  if (p % 2 == 0) {
    int shape2[2] = {2, p / 2};
    CHECK_OK(dtl_mesh_create(world, 2, shape2, &m2));
    static const struct {
      int64_t shape[2];
      const char *from, *to;
    } two_d[] = {
        {{8, 8}, "S0,S1", "S1,S0"}, /* through [S0,R]: an intermediate larger than both ends */
        {{7, 9}, "S0,S0", "S1,S1"},
        {{6, 10}, "P,S0", "S1,R"},
        {{5, 7}, "R,R", "S1,S0"}, /* two local slices */
        {{8, 6}, "P,S1", "S0,R"}, /* a reduce-scatter, then an all-gather of an inner dim */
    };
    for (size_t i = 0; i < sizeof two_d / sizeof two_d[0]; i++) {
      pair q;
      pair_open(&q, m2, two_d[i].shape, two_d[i].from, two_d[i].to);
      repeat_pair(&q, how);
      pair_close(&q);
    }
  }
  dtl_mesh_destroy(m2);
}

static void repeated_plan_executions_allocate_nothing(void) { for_each_pair(VIA_EXECUTE); }
static void repeated_cached_redistributions_allocate_nothing(void) { for_each_pair(VIA_REDISTRIBUTE); }
static void a_callers_workspace_means_no_allocation_even_on_the_first_call(void) { for_each_pair(VIA_WORKSPACE); }
static void repeated_nonblocking_executions_allocate_nothing_and_share_the_workspace(void) { for_each_pair(VIA_ASYNC); }

/* too_small_or_null_workspace_is_rejected_naming_the_bytes_needed: S1 -> R of [4, 4p] unpacks on every rank, so
 * every rank needs scratch and every rank refuses alike (no rank is left in the collective). */
static void too_small_or_null_workspace_is_rejected_naming_the_bytes_needed(void) {
  pair q;
  int64_t shape[2] = {4, 4 * (int64_t)dt_size};
  pair_open(&q, line, shape, "S1", "R");
  size_t need = dtl_plan_scratch_bytes(q.plan);
  CHECK(dtl_plan_workspace_bytes(q.plan) == need, "%s: workspace %zu, scratch %zu", q.what,
        dtl_plan_workspace_bytes(q.plan), need);
  CHECK(dtl_plan_workspace_bytes(NULL) == 0, "workspace bytes of NULL");
  char text[64];
  snprintf(text, sizeof text, "needs %zu bytes", need);
  void *ws = malloc(need + 1);
  size_t n = dtl_layout_local_count(q.dst);
  memset(q.out, 0x5a, n * sizeof(float));
  if (dt_size > 1) {
    CHECK(need > 0, "%s: no scratch", q.what);
    CHECK_ERROR(dtl_plan_execute_with_workspace(q.plan, q.in, q.out, ws, need - 1), DTL_ERR_INVALID_ARGUMENT, text);
    CHECK_ERROR(dtl_plan_execute_with_workspace(q.plan, q.in, q.out, NULL, need), DTL_ERR_INVALID_ARGUMENT, "ws=NULL");
    CHECK(((unsigned char *)q.out)[0] == 0x5a, "a refused call wrote the destination");
  }
  CHECK_OK(dtl_plan_execute_with_workspace(q.plan, q.in, q.out, ws, need));
  CHECK(wrong(q.dst, q.out) == 0, "%s: wrong values", q.what);
  CHECK_ERROR(dtl_plan_execute_with_workspace(NULL, q.in, q.out, ws, need), DTL_ERR_INVALID_ARGUMENT, "plan=NULL");
  free(ws);
  pair_close(&q);
  /* A plan that needs no scratch (a contiguous gather) runs with no workspace at all. */
  int64_t rows[2] = {4 * (int64_t)dt_size, 3};
  pair_open(&q, line, rows, "S0", "R");
  CHECK(dtl_plan_workspace_bytes(q.plan) == 0, "%s: workspace %zu", q.what, dtl_plan_workspace_bytes(q.plan));
  CHECK_OK(dtl_plan_execute_with_workspace(q.plan, q.in, q.out, NULL, 0));
  CHECK(wrong(q.dst, q.out) == 0, "%s: wrong values", q.what);
  pair_close(&q);
}

/* in_place_local_plans_fit_in_the_workspace_bytes: R -> S1 with src_local == dst_local works within
 * dtl_plan_workspace_bytes, allocating nothing. */
static void in_place_local_plans_fit_in_the_workspace_bytes(void) {
  pair q;
  int64_t shape[2] = {5, 3 * (int64_t)dt_size + 1};
  pair_open(&q, line, shape, "R", "S1");
  size_t wsb = dtl_plan_workspace_bytes(q.plan);
  void *ws = malloc(wsb + 1);
  float *buf = malloc(dtl_layout_local_count(q.src) * sizeof(float) + 4);
  dtl__alloc_hook_reset(0, false);
  for (int i = 0; i < 3; i++) {
    fill(q.src, buf);
    CHECK_OK(dtl_plan_execute_with_workspace(q.plan, buf, buf, ws, wsb));
    CHECK(wrong(q.dst, buf) == 0, "%s in place: wrong values", q.what);
  }
  CHECK(dtl__alloc_hook_count() == 0, "%s in place: %llu allocations", q.what,
        (unsigned long long)dtl__alloc_hook_count());
  free(buf);
  free(ws);
  pair_close(&q);
}

/* plans_on_abstract_meshes_are_explained_not_run: no communicator, so no workspace and no execution. */
static void plans_on_abstract_meshes_are_explained_not_run(void) {
  int shape1[1] = {2};
  dtl_mesh *m = NULL;
  CHECK_OK(dtl_mesh_create_abstract(1, shape1, NULL, &m));
  pair q;
  int64_t shape[2] = {4, 6};
  pair_open(&q, m, shape, "S1", "R");
  CHECK(dtl_plan_scratch_bytes(q.plan) > 0, "%s: the figure is still computed", q.what);
  char ws[256];
  CHECK_ERROR(dtl_plan_execute_with_workspace(q.plan, q.in, q.out, ws, sizeof ws), DTL_ERR_INVALID_ARGUMENT, "abstract");
  CHECK_ERROR(dtl_plan_execute(q.plan, q.in, q.out), DTL_ERR_INVALID_ARGUMENT, "abstract");
  pair_close(&q);
  dtl_mesh_destroy(m);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  unsetenv("DTL_CHECK"); /* its fingerprint exchange is not the executor's */
  CHECK_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  CHECK_OK(dtl_mesh_create(world, 1, &dt_size, &line));
  RUN(repeated_plan_executions_allocate_nothing);
  RUN(repeated_cached_redistributions_allocate_nothing);
  RUN(a_callers_workspace_means_no_allocation_even_on_the_first_call);
  RUN(repeated_nonblocking_executions_allocate_nothing_and_share_the_workspace);
  RUN(too_small_or_null_workspace_is_rejected_naming_the_bytes_needed);
  RUN(in_place_local_plans_fit_in_the_workspace_bytes);
  RUN(plans_on_abstract_meshes_are_explained_not_run);
  dtl_mesh_destroy(line);
  dtl_comm_destroy(world);
  return dt_finish();
}

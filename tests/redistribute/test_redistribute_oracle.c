/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_redistribute, dtl_distribute and dtl_full_tensor against the dense oracle: random layouts on every mesh
 * that fits the world size, every ordered pair (Partial sources included), exact results on every rank,
 * sources intact, scratch within the larger local end, at most one workspace allocation (the plan's workspace
 * figure, when the mesh's shared one is smaller), repeated calls served by the plan cache without allocating, and
 * every plan again through dtl_plan_execute_async with the same result. */
#include <stdlib.h>
#include <string.h>
#include "redistribute/redistribute_internal.h"
#include "dtl_test.h"
#include "scratch_cases.h"
#include "test_redistribute_util.h"

static int world_rank, world_size;

typedef struct {
  long pairs, unsupported, multi_step, over_bound, over_small, cache_hits, async_runs;
} pair_stats;

/* Largest local shard (bytes) among the plan's intermediate layouts on this rank. */
static size_t intermediate_peak(const dtl_plan *p) {
  size_t peak = 0;
  for (int k = 0; k + 1 < p->nsteps; k++)
    if (tu_shard_bytes(p, p->steps[k].after) > peak) peak = tu_shard_bytes(p, p->steps[k].after);
  return peak;
}

/* The planner's rule: on a mesh dim of size > 1, S -> P(avg) and P(a) -> P(b != a) have no route (S -> P of the
 * other ops is a local embed). */
static bool expect_unsupported(const dtl_layout *a, const dtl_layout *b) {
  for (int md = 0; md < a->mesh->ndim; md++) {
    if (a->mesh->shape[md] == 1) continue;
    dtl_placement p = a->placements[md], q = b->placements[md];
    if (q.kind == DTL_PARTIAL && ((p.kind == DTL_SHARD && q.op == DTL_AVG) || (p.kind == DTL_PARTIAL && p.op != q.op)))
      return true;
  }
  return false;
}

static void label(const tu_mesh *m, const dtl_layout *a, const dtl_layout *b, char *buf, size_t cap) {
  char x[128], y[128];
  size_t o = (size_t)snprintf(buf, cap, "mesh %s %s [", tu_mesh_text(m), dtl_dtype_name(a->dtype));
  for (int d = 0; d < a->ndim; d++) o += (size_t)snprintf(buf + o, cap - o, d ? ",%lld" : "%lld", (long long)a->shape[d]);
  snprintf(buf + o, cap - o, "] %s -> %s", tu_placements_text(a->placements, m->ndim, x, sizeof x),
           tu_placements_text(b->placements, m->ndim, y, sizeof y));
}

/* every_pair_matches_the_dense_oracle: one pair, run twice (the second call must hit the cache). */
static void every_pair_matches_the_dense_oracle(const tu_mesh *m, const dtl_layout *src, const dtl_layout *dst,
                                                const void *dense, uint64_t seed, pair_stats *ps) {
  char what[300];
  label(m, src, dst, what, sizeof what);
  size_t sb = src->local_count * dtl_dtype_size(src->dtype), db = dst->local_count * dtl_dtype_size(dst->dtype);
  char *in = malloc(sb + 1), *out = malloc(db + 1);
  tu_make_local(src, dense, seed, in);
  memset(out, 0x5a, db);
  uint64_t sum_in = tu_checksum(in, sb), sum_out = tu_checksum(out, db);
  uint64_t h0, m0, h1, m1;
  dtl__plan_cache_stats(m->mesh, &h0, &m0);
  tu_alloc_stats a0 = tu_allocs;
  dtl_status st = dtl_redistribute(src, in, dst, out);
  int calls = tu_allocs.calls - a0.calls;
  size_t bytes = tu_allocs.bytes_total - a0.bytes_total;
  dtl__plan_cache_stats(m->mesh, &h1, &m1);
  CHECK(tu_checksum(in, sb) == sum_in, "%s: the source was written", what);
  ps->pairs++;
  if (expect_unsupported(src, dst)) {
    ps->unsupported++;
    CHECK(st == DTL_ERR_UNSUPPORTED, "%s: status %s (%s), expected DTL_ERR_UNSUPPORTED", what, dtl_status_name(st),
          dtl_last_error());
    CHECK(tu_checksum(out, db) == sum_out, "%s: a failed call wrote the destination", what);
    free(in);
    free(out);
    return;
  }
  CHECK(st == DTL_OK, "%s: %s", what, dtl_last_error());
  long wrong = tu_check_state(m, dst, out, dense, what);
  CHECK(wrong == 0, "%s: %ld wrong elements", what, wrong);
  /* The cached plan runs in the mesh's one workspace for cached plans: a call allocates only when its plan
   * needs more than any before it, then exactly the plan's workspace figure, which covers its scratch figure. */
  const dtl_plan *plan = NULL;
  CHECK(dtl__plan_cached(src, dst, &plan) == DTL_OK, "%s: %s", what, dtl_last_error());
  if (!plan) return;
  size_t fig = dtl_plan_scratch_bytes(plan), ends = sb > db ? sb : db, wsb = dtl_plan_workspace_bytes(plan);
  bool fresh = m1 > m0;
  CHECK(fig <= wsb, "%s: scratch %zu > workspace %zu", what, fig, wsb);
  CHECK(fresh ? calls == 0 || (calls == 1 && bytes == wsb) : calls == 0, "%s: allocated %d buffers of %zu bytes in "
        "all; the plan's workspace is %zu (%s plan)", what, calls, bytes, wsb, fresh ? "a new" : "a cached");
  /* Every plan within the larger end (include/dtl/plan.h, Memory: by construction on meshes of up to 1024 ranks). */
  CHECK(fig <= ends, "%s: scratch %zu > max(src %zu, dst %zu)", what, fig, sb, db);
  if (plan->nsteps > 1) ps->multi_step++;
  if (fig > ends) ps->over_bound++;
  if (fig > ends && intermediate_peak(plan) <= ends) ps->over_small++;
  /* TU_VERBOSE=1 explains the plans whose scratch exceeds both ends although no intermediate does. */
  if (fig > ends && intermediate_peak(plan) <= ends && getenv("TU_VERBOSE")) {
    char buf[4096];
    dtl_plan_explain(plan, buf, sizeof buf);
    fprintf(stderr, "[over] %s: scratch %zu, src %zu, dst %zu\n%s\n", what, fig, sb, db, buf);
  }
  /* Again: same plan from the cache, same result. */
  memset(out, 0x5a, db);
  a0 = tu_allocs;
  st = dtl_redistribute(src, in, dst, out);
  CHECK(tu_allocs.calls == a0.calls, "%s: the repeated call allocated %d buffers", what, tu_allocs.calls - a0.calls);
  uint64_t h2, m2;
  dtl__plan_cache_stats(m->mesh, &h2, &m2);
  CHECK(st == DTL_OK, "%s: repeated call: %s", what, dtl_last_error());
  CHECK(m2 == m1 && h2 == h1 + 2, "%s: the repeated call was not a cache hit (misses %llu -> %llu, hits %llu -> %llu, "
        "one of them the lookup above)", what, (unsigned long long)m1, (unsigned long long)m2,
        (unsigned long long)h1, (unsigned long long)h2);
  const dtl_plan *again = NULL;
  dtl__plan_cached(src, dst, &again);
  CHECK(again == plan, "%s: the cache returned another plan", what);
  ps->cache_hits += (long)(h2 - h1);
  CHECK(tu_check_state(m, dst, out, dense, what) == 0, "%s: repeated call wrong", what);
  /* Nonblocking, the same plan: the same result, finished by dtl_wait or (every other pair) driven by dtl_test alone
   * (the target complete when it says done); at most the plan's own workspace of the blocking figure on the first
   * start (the cached calls above ran in the mesh's), nothing on a second. */
  for (int run = 0; run < (plan->nsteps > 1 ? 2 : 1); run++) {
    memset(out, 0x5a, db);
    a0 = tu_allocs;
    dtl_request *req = NULL;
    bool test_alone = (ps->pairs + run) % 2 == 0;
    st = dtl_plan_execute_async(plan, in, out, &req);
    int done = 0;
    for (int polls = 0; st == DTL_OK && !done && (test_alone || polls < 2); polls++) st = dtl_test(req, &done);
    if (test_alone && st == DTL_OK)
      CHECK(tu_check_state(m, dst, out, dense, what) == 0, "%s (async): wrong once dtl_test said done", what);
    if (req) {
      dtl_status w = dtl_wait(req);
      if (st == DTL_OK) st = w;
    }
    CHECK(st == DTL_OK, "%s (async): %s", what, dtl_last_error());
    CHECK(tu_check_state(m, dst, out, dense, what) == 0, "%s (async): wrong", what);
    calls = tu_allocs.calls - a0.calls;
    bytes = tu_allocs.bytes_total - a0.bytes_total;
    CHECK(run ? calls == 0 : calls == 0 || (calls == 1 && bytes <= wsb), "%s (async run %d): allocated %d buffers of "
          "%zu bytes in all; the plan's workspace is %zu", what, run, calls, bytes, wsb);
    ps->async_runs++;
  }
  CHECK(tu_checksum(in, sb) == sum_in, "%s (async): the source was written", what);
  free(in);
  free(out);
}

/* distribute_and_full_tensor_round_trip: dense on a root -> shard (Partial: value on coordinate 0, identity
 * elsewhere; max/min/avg: the value) -> the oracle; and a shard with Partial noise -> dense on every rank. */
static void distribute_and_full_tensor_round_trip(const tu_mesh *m, const dtl_layout *l, const void *dense, int root,
                                                  uint64_t seed) {
  char what[300];
  label(m, l, l, what, sizeof what);
  size_t es = dtl_dtype_size(l->dtype), lb = l->local_count * es, gb = l->global_count * es;
  char *local = malloc(lb + 1), *full = malloc(gb + 1), *copy = malloc(gb + 1);
  memcpy(copy, dense, gb);
  memset(local, 0x5a, lb);
  int me = dtl_comm_rank(m->comm);
  tu_alloc_stats a0 = tu_allocs;
  dtl_status st = dtl_distribute(l, me == root ? copy : NULL, root, local);
  CHECK(st == DTL_OK, "distribute %s root %d: %s", what, root, dtl_last_error());
  /* Root holds at most one shard beyond the dense tensor: the largest box that is no run of it, packed one at a time
   * (boxes that are runs go out in place); the other ranks allocate nothing. */
  size_t most = 0;
  for (int r = 0; r < dtl_mesh_size(l->mesh) && me == root; r++) {
    int c[DTL_MAX_MESH_DIMS];
    int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
    dtl_mesh_coord_of(l->mesh, r, c);
    dtl_layout_local_box(l, c, bs, bo);
    size_t n = es;
    bool run = true;
    int d0 = 0;
    while (d0 < l->ndim - 1 && bs[d0] == 1) d0++;
    for (int d = 0; d < l->ndim; d++) n *= (size_t)bs[d];
    for (int d = d0 + 1; d < l->ndim; d++) run &= bs[d] == l->shape[d];
    if (r != root && !run && n > most) most = n;
  }
  CHECK(tu_allocs.bytes_total - a0.bytes_total <= most && tu_allocs.calls - a0.calls <= (most > 0),
        "distribute %s root %d: allocated %zu bytes in %d buffers (at most one shard, %zu bytes)", what, root,
        tu_allocs.bytes_total - a0.bytes_total, tu_allocs.calls - a0.calls, most);
  CHECK(memcmp(copy, dense, gb) == 0, "distribute %s: the dense input was written", what);
  CHECK(tu_check_state(m, l, local, dense, what) == 0, "distribute %s root %d: wrong shard", what, root);
  tu_make_local(l, dense, seed, local);
  memset(full, 0x5a, gb);
  st = dtl_full_tensor(l, local, full);
  CHECK(st == DTL_OK, "full_tensor %s: %s", what, dtl_last_error());
  long wrong = 0;
  for (size_t i = 0; i < l->global_count; i++) wrong += tu_get(full, l->dtype, i) != tu_get(dense, l->dtype, i);
  CHECK(wrong == 0, "full_tensor %s: %ld wrong elements", what, wrong);
  free(local);
  free(full);
  free(copy);
}

/* distribute_partial_puts_the_value_on_coordinate_0_and_the_identity_elsewhere: on the first mesh dim,
 * Partial(sum) and (prod) hold the value on coordinate 0 and 0 or 1 elsewhere; max, min and avg hold the value
 * everywhere. */
static void distribute_partial_puts_the_value_on_coordinate_0_and_the_identity_elsewhere(const tu_mesh *m) {
  if (!m->mesh) return; /* a rank outside the mesh */
  static const dtl_reduce_op ops[] = {DTL_SUM, DTL_PROD, DTL_MAX, DTL_MIN, DTL_AVG};
  int64_t shape[2] = {5, 3};
  float dense[15], local[15];
  for (int i = 0; i < 15; i++) dense[i] = (float)(i * 3 - 20);
  int coord[DTL_MAX_MESH_DIMS];
  dtl_mesh_coord(m->mesh, coord);
  for (int o = 0; o < 5; o++) {
    dtl_placement pl[DTL_MAX_MESH_DIMS];
    for (int md = 0; md < m->ndim; md++) pl[md] = md == 0 ? dtl_partial(ops[o]) : dtl_replicate();
    dtl_layout *l;
    if (dtl_layout_create(m->mesh, DTL_FLOAT32, 2, shape, pl, &l) != DTL_OK) {
      CHECK(0, "%s", dtl_last_error());
      continue;
    }
    memset(local, 0x5a, sizeof local);
    CHECK(dtl_distribute(l, dense, dtl_mesh_size(m->mesh) - 1, local) == DTL_OK, "%s", dtl_last_error());
    bool identity = coord[0] != 0 && (ops[o] == DTL_SUM || ops[o] == DTL_PROD);
    long wrong = 0;
    for (int i = 0; i < 15; i++) wrong += local[i] != (identity ? (ops[o] == DTL_SUM ? 0.0f : 1.0f) : dense[i]);
    CHECK(wrong == 0, "P(%s) at coordinate %d: %ld elements are not the %s", dtl_reduce_op_name(ops[o]), coord[0],
          wrong, identity ? "identity" : "value");
    dtl_layout_destroy(l);
  }
}

/* every_pair_matches_the_dense_oracle and distribute_and_full_tensor_round_trip on random layouts. */
static void random_layouts_round_trip_and_every_pair_matches_the_dense_oracle(const tu_mesh *m, int mi, int trials,
                                                                              int nlayouts) {
  if (!m->mesh) return; /* a rank outside the mesh */
  pair_stats ps = {0};
  for (int t = 0; t < trials; t++) {
    tu_rng r = {tu_hash(1000u + (uint64_t)mi, (uint64_t)t)};
    int nd = 1 + tu_uniform(&r, 3);
    int64_t shape[3];
    size_t count = 1;
    for (int d = 0; d < nd; d++) count *= (size_t)(shape[d] = tu_uniform(&r, 14));
    static const dtl_dtype types[] = {DTL_INT32, DTL_INT64, DTL_FLOAT32, DTL_FLOAT8_E4M3};
    dtl_dtype dt = types[tu_uniform(&r, 4)];
    void *dense = malloc(count * dtl_dtype_size(dt) + 1);
    tu_dense(r.s, dt, count, dense);
    dtl_layout *ls[8];
    dtl_reduce_op pop = dt == DTL_FLOAT8_E4M3 ? DTL_MAX : DTL_SUM; /* e4m3 holds no pending sum */
    for (int i = 0; i < nlayouts; i++) {
      dtl_placement pl[DTL_MAX_MESH_DIMS];
      tu_random_placements(&r, m->ndim, nd, dt, pl);
      if (i == 0) /* one fully sharded-or-partial source per shape at least */
        for (int md = 0; md < m->ndim; md++) pl[md] = md % 2 ? dtl_partial(pop) : dtl_shard(md % nd);
      if (dtl_layout_create(m->mesh, dt, nd, shape, pl, &ls[i]) != DTL_OK) {
        CHECK(0, "layout: %s", dtl_last_error());
        ls[i] = NULL;
      }
    }
    for (int i = 0; i < nlayouts; i++) {
      if (!ls[i]) continue;
      distribute_and_full_tensor_round_trip(m, ls[i], dense, tu_uniform(&r, dtl_mesh_size(m->mesh)), r.s + (uint64_t)i);
      for (int j = 0; j < nlayouts; j++)
        if (ls[j]) every_pair_matches_the_dense_oracle(m, ls[i], ls[j], dense, tu_hash(r.s, (uint64_t)(i * 16 + j)), &ps);
    }
    for (int i = 0; i < nlayouts; i++) dtl_layout_destroy(ls[i]);
    free(dense);
  }
  long over = 0, over_small = 0;
  MPI_Allreduce(&ps.over_bound, &over, 1, MPI_LONG, MPI_SUM, m->mpi);
  MPI_Allreduce(&ps.over_small, &over_small, 1, MPI_LONG, MPI_SUM, m->mpi);
  if (world_rank == 0)
    printf("every_pair_matches_the_dense_oracle: mesh %s: %ld pairs (%ld unsupported as documented, %ld multi-step "
           "plans), %ld cache hits, %ld nonblocking runs; scratch above max(src, dst) on %ld rank-executions (%ld of "
           "them with no intermediate shard above it)\n",
           tu_mesh_text(m), ps.pairs, ps.unsupported, ps.multi_step, ps.cache_hits, ps.async_runs, over, over_small);
}

/* shard_to_partial_matches_the_dense_oracle: S(d) -> P(op) on each mesh dim, for sum, prod, max and min, on an
 * uneven tensor: each rank's target is its shard in the op's identity, so the group's reduction is the tensor
 * (DTensor's Shard -> Partial); also from a nested split, where the embed undoes the inner one. And e4m3's max and
 * min, whose identities are -448 and +448 (e4m3fn has no infinity; its values here are negative too). */
static void shard_to_partial_matches_the_dense_oracle(const tu_mesh *m) {
  if (!m->mesh) return;
  static const struct {
    dtl_dtype t;
    dtl_reduce_op op;
  } cases[] = {{DTL_INT32, DTL_SUM}, {DTL_INT32, DTL_PROD}, {DTL_INT32, DTL_MAX},
               {DTL_INT32, DTL_MIN}, {DTL_FLOAT8_E4M3, DTL_MAX}, {DTL_FLOAT8_E4M3, DTL_MIN}};
  const int64_t shape[2] = {7, 5};
  pair_stats ps = {0};
  for (int o = 0; o < 6; o++)
    for (int md = 0; md < m->ndim; md++) {
      const dtl_dtype t = cases[o].t;
      const dtl_reduce_op op = cases[o].op;
      int32_t dense[35]; /* 35 elements of t (at most 4 bytes each) */
      tu_dense(77, t, 35, dense);
      dtl_placement a[DTL_MAX_MESH_DIMS], b[DTL_MAX_MESH_DIMS], c[DTL_MAX_MESH_DIMS];
      for (int k = 0; k < m->ndim; k++) a[k] = b[k] = c[k] = dtl_replicate();
      a[md] = dtl_shard(md % 2);
      b[md] = dtl_partial(op);
      for (int k = 0; k < m->ndim; k++) c[k] = k < md ? dtl_shard(0) : a[k]; /* outer splits of dim 0 too */
      c[md] = dtl_shard(0);
      dtl_layout *la = NULL, *lb = NULL, *lc = NULL, *ld = NULL;
      dtl_placement d[DTL_MAX_MESH_DIMS];
      memcpy(d, c, sizeof d);
      d[md] = dtl_partial(op);
      CHECK(dtl_layout_create(m->mesh, t, 2, shape, a, &la) == DTL_OK, "%s", dtl_last_error());
      CHECK(dtl_layout_create(m->mesh, t, 2, shape, b, &lb) == DTL_OK, "%s", dtl_last_error());
      CHECK(dtl_layout_create(m->mesh, t, 2, shape, c, &lc) == DTL_OK, "%s", dtl_last_error());
      CHECK(dtl_layout_create(m->mesh, t, 2, shape, d, &ld) == DTL_OK, "%s", dtl_last_error());
      if (la && lb) every_pair_matches_the_dense_oracle(m, la, lb, dense, 5u + (uint64_t)o, &ps);
      if (lc && ld) every_pair_matches_the_dense_oracle(m, lc, ld, dense, 9u + (uint64_t)o, &ps);
      dtl_layout_destroy(la);
      dtl_layout_destroy(lb);
      dtl_layout_destroy(lc);
      dtl_layout_destroy(ld);
    }
  CHECK(ps.unsupported == 0, "%ld S -> P pairs refused", ps.unsupported);
}

/* scratch_never_exceeds_max_local_src_dst_on_listed_cases (issue 17; before, over the bound on some rank): executed
 * against the oracle on the meshes they name, within the bound on every rank (every_pair_matches_the_dense_oracle
 * checks it), among them plans whose exchange runs one row at a time. */
static void scratch_never_exceeds_max_local_src_dst_on_listed_cases(const tu_mesh *m) {
  if (!m->mesh) return;
  const scratch_case *cases = scratch_listed_cases;
  pair_stats ps = {0};
  for (int i = 0; i < SCRATCH_LISTED_CASES; i++) {
    bool same = m->ndim == cases[i].mesh_ndim;
    for (int d = 0; same && d < m->ndim; d++) same = m->shape[d] == cases[i].mesh[d];
    if (!same) continue;
    dtl_placement a[DTL_MAX_MESH_DIMS], b[DTL_MAX_MESH_DIMS];
    int na = 0, nb = 0;
    CHECK(dtl_placements_parse(cases[i].from, a, DTL_MAX_MESH_DIMS, &na) == DTL_OK, "%s", dtl_last_error());
    CHECK(dtl_placements_parse(cases[i].to, b, DTL_MAX_MESH_DIMS, &nb) == DTL_OK, "%s", dtl_last_error());
    size_t count = 1;
    for (int d = 0; d < cases[i].nd; d++) count *= (size_t)cases[i].shape[d];
    void *dense = malloc(count * dtl_dtype_size(cases[i].t));
    tu_dense(31 + i, cases[i].t, count, dense);
    dtl_layout *la = NULL, *lb = NULL;
    CHECK(dtl_layout_create(m->mesh, cases[i].t, cases[i].nd, cases[i].shape, a, &la) == DTL_OK, "%s", dtl_last_error());
    CHECK(dtl_layout_create(m->mesh, cases[i].t, cases[i].nd, cases[i].shape, b, &lb) == DTL_OK, "%s", dtl_last_error());
    if (la && lb) every_pair_matches_the_dense_oracle(m, la, lb, dense, 41 + i, &ps);
    dtl_layout_destroy(la);
    dtl_layout_destroy(lb);
    free(dense);
  }
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  world_rank = dt_rank;
  world_size = dt_size;
  int trials = argc > 1 ? atoi(argv[1]) : 8, nlayouts = argc > 2 ? atoi(argv[2]) : 6;
  /* Default chunks, then 48-byte chunks so that small tensors take the chunked pack/unpack paths too; each on
   * the MPI transport, then on it without its optional entries (all_to_allv_displs). */
  static const size_t chunks[] = {0, 48};
  for (int pass = 0; pass < 4; pass++) {
    tu_begin_pass(pass, chunks, 2, world_rank);
    for (size_t i = 0; i < (size_t)tu_nmeshes; i++) {
      tu_mesh m;
      if (!tu_mesh_open_spec((int)i, &m)) continue;
      RUN_NAMED(tu_case_name("distribute_partial_puts_the_value_on_coordinate_0_and_the_identity_elsewhere", &m),
                distribute_partial_puts_the_value_on_coordinate_0_and_the_identity_elsewhere(&m));
      RUN_NAMED(tu_case_name("shard_to_partial_matches_the_dense_oracle", &m), shard_to_partial_matches_the_dense_oracle(&m));
      RUN_NAMED(tu_case_name("scratch_never_exceeds_max_local_src_dst_on_listed_cases", &m),
                scratch_never_exceeds_max_local_src_dst_on_listed_cases(&m));
      RUN_NAMED(tu_case_name("random_layouts_round_trip_and_every_pair_matches_the_dense_oracle", &m),
                random_layouts_round_trip_and_every_pair_matches_the_dense_oracle(&m, (int)i, trials, nlayouts));
      tu_mesh_close(&m);
    }
  }
  return dt_finish();
}

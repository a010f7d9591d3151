/* SPDX-License-Identifier: Apache-2.0 */
/* The scratch bound between two meshes of one parent (include/dtl/plan.h, Memory): on every rank of either mesh,
 * dtl_plan_scratch_bytes is at most the larger of its local source and target bytes, for the cases that independent
 * checks found over it (issue 17) and for random layout pairs over random pairs of meshes (each a random shape over
 * a random subset of the world's ranks, in random order). Planning only: planning is pure, so every rank checks its
 * own figure; the oracle tests run such plans. */
#include <stdlib.h>
#include <string.h>
#include "dtl_test.h"
#include "redistribute/redistribute_internal.h"

static dtl_comm *parent;

static dtl_mesh *mesh_of(int nranks, const int *ranks, int ndim, const int *shape) {
  dtl_mesh *m = NULL;
  CHECK(dtl_mesh_create_from_ranks(parent, nranks, ranks, ndim, shape, &m) == DTL_OK, "mesh: %s", dtl_last_error());
  return m;
}

static size_t local_bytes(const dtl_layout *l) { return dtl_layout_local_count(l) * dtl_dtype_size(l->dtype); }

/* Plans a -> b and checks this rank's scratch; 1 when planned, 0 when refused. */
static int check_pair(const dtl_mesh *ma, const dtl_mesh *mb, dtl_dtype t, int nd, const int64_t *shape,
                      const dtl_placement *pa, const dtl_placement *pb, const char *what) {
  dtl_layout *a = NULL, *b = NULL;
  CHECK(dtl_layout_create(ma, t, nd, shape, pa, &a) == DTL_OK, "%s: %s", what, dtl_last_error());
  CHECK(dtl_layout_create(mb, t, nd, shape, pb, &b) == DTL_OK, "%s: %s", what, dtl_last_error());
  int planned = 0;
  dtl_plan *p = NULL;
  if (a && b) {
    dtl_status st = dtl_plan_create(a, b, &p);
    CHECK(st == DTL_OK, "%s: %s", what, dtl_last_error());
    if (p) {
      size_t scr = dtl_plan_scratch_bytes(p), ia = local_bytes(a), ib = local_bytes(b), ends = ia > ib ? ia : ib;
      if (scr > ends) {
        char ex[4096] = "";
        dtl_plan_explain(p, ex, sizeof ex);
        CHECK(0, "%s: rank %d: scratch %zu B > max(src %zu B, dst %zu B)\n%s", what, dt_rank, scr, ia, ib, ex);
      }
      planned = 1;
    }
  }
  dtl_plan_destroy(p);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  return planned;
}

static void parse(const char *text, dtl_placement *out) {
  int n = 0;
  CHECK(dtl_placements_parse(text, out, DTL_MAX_MESH_DIMS, &n) == DTL_OK, "parse %s: %s", text, dtl_last_error());
}

/* The issue's cases between meshes: 2x2x2 -> 2x4 (all 8 ranks) and 1x2 on ranks 0 and 2 -> 3x1 on ranks 0-2. */
static void scratch_never_exceeds_max_local_src_dst_between_meshes_on_listed_cases(void) {
  if (dt_size < 8) return;
  int all[8] = {0, 1, 2, 3, 4, 5, 6, 7}, two[2] = {0, 2};
  dtl_mesh *m222 = mesh_of(8, all, 3, (int[]){2, 2, 2}), *m24 = mesh_of(8, all, 2, (int[]){2, 4});
  dtl_mesh *m12 = mesh_of(2, two, 2, (int[]){1, 2}), *m31 = mesh_of(3, all, 2, (int[]){3, 1});
  dtl_placement a[DTL_MAX_MESH_DIMS], b[DTL_MAX_MESH_DIMS];
  parse("S(-1),S(-3),P", a);
  parse("S(0),R", b);
  check_pair(m222, m24, DTL_INT32, 3, (int64_t[]){3, 6, 6}, a, b, "2x2x2 -> 2x4 i32[3,6,6]");
  parse("R,S(0),P", a);
  parse("S(1),R", b);
  check_pair(m222, m24, DTL_FLOAT64, 3, (int64_t[]){4, 8, 11}, a, b, "2x2x2 -> 2x4 f64[4,8,11]");
  parse("S(-1),P", a);
  parse("S(1),S(1)", b);
  check_pair(m12, m31, DTL_INT32, 3, (int64_t[]){2, 3, 11}, a, b, "1x2@[0,2] -> 3x1 i32[2,3,11]");
  dtl_mesh_destroy(m222);
  dtl_mesh_destroy(m24);
  dtl_mesh_destroy(m12);
  dtl_mesh_destroy(m31);
}

static uint64_t next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}
static int below(uint64_t *s, int n) { return (int)(next(s) % (uint64_t)n); }

/* A random mesh over a random subset of the world's ranks (the same on every rank: one seed). */
static dtl_mesh *random_mesh(uint64_t *s) {
  int n = 1 + below(s, dt_size), ranks[64], perm[64];
  for (int i = 0; i < dt_size; i++) perm[i] = i;
  for (int i = dt_size - 1; i > 0; i--) {
    int j = below(s, i + 1), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int i = 0; i < n; i++) ranks[i] = perm[i];
  int shape[3] = {n, 1, 1}, ndim = 1 + below(s, 3);
  for (int k = 1; k < ndim; k++) /* split n into ndim factors */
    for (int f = 2; f <= shape[0]; f++)
      if (shape[0] % f == 0 && below(s, 2)) {
        shape[k] = f;
        shape[0] /= f;
        break;
      }
  return mesh_of(n, ranks, ndim, shape);
}

static dtl_placement random_placement(uint64_t *s, int nd, dtl_reduce_op op) {
  int k = below(s, 4);
  return k == 0 ? dtl_replicate() : k == 3 ? dtl_partial(op) : dtl_shard(below(s, nd));
}

/* Random pairs of meshes and layouts (Partial sources and targets of sum, max or prod, uneven and empty dims). */
static void scratch_never_exceeds_max_local_src_dst_between_meshes_on_random_plans(void) {
  static const dtl_reduce_op ops[] = {DTL_SUM, DTL_MAX, DTL_PROD};
  static const dtl_dtype types[] = {DTL_FLOAT32, DTL_FLOAT64, DTL_INT32, DTL_FLOAT16};
  uint64_t seed = 2026;
  int planned = 0;
  for (int it = 0; it < 40; it++) {
    dtl_mesh *ma = random_mesh(&seed), *mb = random_mesh(&seed);
    for (int k = 0; k < 12 && ma && mb; k++) {
      int nd = 1 + below(&seed, 3);
      int64_t shape[3];
      for (int d = 0; d < nd; d++) shape[d] = below(&seed, 12);
      dtl_dtype t = types[below(&seed, 4)];
      dtl_reduce_op op = ops[below(&seed, 3)];
      dtl_placement a[DTL_MAX_MESH_DIMS], b[DTL_MAX_MESH_DIMS];
      for (int m = 0; m < dtl_mesh_ndim(ma); m++) a[m] = random_placement(&seed, nd, op);
      for (int m = 0; m < dtl_mesh_ndim(mb); m++) b[m] = random_placement(&seed, nd, op);
      char what[64];
      snprintf(what, sizeof what, "random pair %d.%d", it, k);
      planned += check_pair(ma, mb, t, nd, shape, a, b, what);
    }
    dtl_mesh_destroy(ma);
    dtl_mesh_destroy(mb);
  }
  CHECK(planned >= 400, "only %d pairs planned", planned);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  CHECK(dtl_comm_from_mpi(MPI_COMM_WORLD, &parent) == DTL_OK, "parent: %s", dtl_last_error());
  RUN(scratch_never_exceeds_max_local_src_dst_between_meshes_on_listed_cases);
  RUN(scratch_never_exceeds_max_local_src_dst_between_meshes_on_random_plans);
  dtl_comm_destroy(parent);
  return dt_finish();
}

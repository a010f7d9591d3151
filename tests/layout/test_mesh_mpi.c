/* SPDX-License-Identifier: Apache-2.0 */
/* Meshes over MPI_COMM_WORLD: for every ordered factorisation of the world size into 1-4 dims, each rank's
 * coordinate is its row-major position, each mesh-dim communicator has the dim's size and ranks its
 * members by that coordinate, and an all-gather of world ranks over it returns exactly the ranks that
 * differ only on that dim. Bad shapes fail on every rank with a message naming the shape and sizes. Meshes over
 * part of the world (dtl_mesh_create_from_ranks, ranks in a shuffled order): members get the coordinate of their
 * place in the list and dim communicators over members only; the others get a non-member handle whose layouts are
 * empty; a bad list fails every rank, also the ranks outside it. A transport without FP8 reductions refuses them in
 * its collectives and its meshes' layouts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layout/layout_internal.h"
#include "dtl_test.h"

static int world_rank, world_size;
static dtl_comm *world;

static const char *shape_text(int ndim, const int *shape) {
  static char txt[64];
  int o = 0;
  for (int d = 0; d < ndim; d++) o += snprintf(txt + o, sizeof txt - (size_t)o, d ? "x%d" : "%d", shape[d]);
  return txt;
}

/* The coordinate of rank r found by counting through the mesh in row-major order (last dim fastest). */
static void counted_coord(int ndim, const int *shape, int r, int *c) {
  for (int d = 0; d < ndim; d++) c[d] = 0;
  for (int k = 0; k < r; k++)
    for (int d = ndim - 1; d >= 0; d--) {
      if (++c[d] < shape[d]) break;
      c[d] = 0;
    }
}

static int counted_rank(int ndim, const int *shape, const int *c) {
  for (int r = 0; r < world_size; r++) {
    int rc[DTL_MAX_MESH_DIMS];
    counted_coord(ndim, shape, r, rc);
    if (memcmp(rc, c, sizeof(int) * (size_t)ndim) == 0) return r;
  }
  return -1;
}

static void check_mesh(int ndim, const int *shape) {
  const char *txt = shape_text(ndim, shape);
  dtl_mesh *m = NULL;
  dtl_status st = dtl_mesh_create(world, ndim, shape, &m);
  CHECK(st == DTL_OK, "mesh %s: %s", txt, dtl_last_error());
  if (st != DTL_OK) return;
  CHECK(dtl_mesh_ndim(m) == ndim, "mesh %s: ndim %d", txt, dtl_mesh_ndim(m));
  CHECK(dtl_mesh_size(m) == world_size, "mesh %s: size %d", txt, dtl_mesh_size(m));
  CHECK(dtl_mesh_is_abstract(m) == 0, "mesh %s: reports abstract", txt);
  CHECK(dtl_mesh_comm(m) == world, "mesh %s: mesh comm is not the one given", txt);
  int want[DTL_MAX_MESH_DIMS], got[DTL_MAX_MESH_DIMS];
  counted_coord(ndim, shape, world_rank, want);
  dtl_mesh_coord(m, got);
  for (int d = 0; d < ndim; d++) {
    CHECK(dtl_mesh_dim_size(m, d) == shape[d], "mesh %s: dim %d size %d", txt, d, dtl_mesh_dim_size(m, d));
    CHECK(got[d] == want[d], "mesh %s: coord[%d]=%d, expected %d", txt, d, got[d], want[d]);
  }
  int back = -1;
  CHECK(dtl_mesh_rank_of(m, want, &back) == DTL_OK && back == world_rank, "mesh %s: rank_of gives %d", txt, back);

  for (int d = 0; d < ndim; d++) {
    dtl_comm *dc = dtl_mesh_dim_comm(m, d);
    CHECK(dc != NULL, "mesh %s: dim %d has no communicator", txt, d);
    if (!dc) continue;
    CHECK(dtl_comm_size(dc) == shape[d], "mesh %s: dim %d comm size %d, expected %d", txt, d, dtl_comm_size(dc), shape[d]);
    CHECK(dtl_comm_rank(dc) == want[d], "mesh %s: dim %d comm rank %d, expected coord %d", txt, d, dtl_comm_rank(dc), want[d]);
    /* Along dim d: the world ranks whose coordinates equal ours except on d, in the order of coord d. */
    int32_t mine = world_rank, all[65];
    for (int j = 0; j < 65; j++) all[j] = -1;
    st = dtl_all_gather(dc, &mine, all, 1, DTL_INT32);
    CHECK(st == DTL_OK, "mesh %s: all-gather on dim %d: %s", txt, d, dtl_last_error());
    for (int j = 0; j < shape[d]; j++) {
      int c[DTL_MAX_MESH_DIMS];
      memcpy(c, want, sizeof c);
      c[d] = j;
      int expect = counted_rank(ndim, shape, c);
      CHECK(all[j] == expect, "mesh %s: dim %d member %d is world rank %d, expected %d", txt, d, j, all[j], expect);
    }
    CHECK(all[shape[d]] == -1, "mesh %s: dim %d all-gather wrote past %d entries", txt, d, shape[d]);
  }
  CHECK(dtl_mesh_dim_comm(m, ndim) == NULL && dtl_mesh_dim_comm(m, -1) == NULL, "mesh %s: dim comm out of range", txt);

  /* A layout on the live mesh answers this rank's box like the same coordinate asked explicitly. */
  dtl_placement p[DTL_MAX_MESH_DIMS];
  for (int d = 0; d < ndim; d++) p[d] = d % 2 ? dtl_replicate() : dtl_shard(0);
  const int64_t gshape[2] = {2 * world_size + 1, 3};
  dtl_layout *l;
  st = dtl_layout_create(m, DTL_FLOAT32, 2, gshape, p, &l);
  CHECK(st == DTL_OK, "mesh %s: layout: %s", txt, dtl_last_error());
  if (st == DTL_OK) {
    int64_t s0[2], o0[2], s1[2], o1[2];
    dtl_layout_local_box(l, NULL, s0, o0);
    dtl_layout_local_box(l, want, s1, o1);
    CHECK(s0[0] == s1[0] && o0[0] == o1[0] && s0[1] == 3, "mesh %s: own box differs from the explicit one", txt);
    CHECK(dtl_layout_local_count(l) == (size_t)(s1[0] * s1[1]), "mesh %s: local count", txt);
    dtl_layout_destroy(l);
  }
  dtl_mesh_destroy(m);
}

/* Every ordered factorisation of world_size into ndim factors (>= 1 each). */
static int check_factorisations(int ndim, int d, int rest, int *shape) {
  if (d == ndim - 1) {
    shape[d] = rest;
    check_mesh(ndim, shape);
    return 1;
  }
  int n = 0;
  for (int f = 1; f <= rest; f++)
    if (rest % f == 0) {
      shape[d] = f;
      n += check_factorisations(ndim, d + 1, rest / f, shape);
    }
  return n;
}

static void expect_reject(dtl_comm *c, int ndim, const int *shape, const char *need1, const char *need2) {
  dtl_mesh *m = (dtl_mesh *)0x5a5a;
  dtl_status st = dtl_mesh_create(c, ndim, shape, &m);
  CHECK(st == DTL_ERR_INVALID_ARGUMENT, "ndim=%d: %s, expected DTL_ERR_INVALID_ARGUMENT", ndim, dtl_status_name(st));
  CHECK(m == (dtl_mesh *)0x5a5a, "ndim=%d: out was written on failure", ndim);
  const char *msg = dtl_last_error();
  CHECK(strstr(msg, "dtl_mesh_create") && strstr(msg, need1) && (!need2 || strstr(msg, need2)),
        "message \"%s\" lacks \"%s\" / \"%s\"", msg, need1, need2 ? need2 : "");
}

static void bad_shapes_fail_on_every_rank_naming_the_shape_and_sizes(void) {
  char a[96], b[96];
  int one_more[1] = {world_size + 1};
  snprintf(a, sizeof a, "shape=%d has %d ranks", world_size + 1, world_size + 1);
  snprintf(b, sizeof b, "the communicator has %d", world_size);
  expect_reject(world, 1, one_more, a, b);
  int doubled[2] = {2, world_size};
  snprintf(a, sizeof a, "shape=2x%d has %d ranks", world_size, 2 * world_size);
  expect_reject(world, 2, doubled, a, b);
  if (world_size > 1) {
    int fewer[3] = {1, 1, world_size - 1};
    snprintf(a, sizeof a, "shape=1x1x%d has %d ranks", world_size - 1, world_size - 1);
    expect_reject(world, 3, fewer, a, b);
  }
  int ones[5] = {1, 1, 1, 1, 1};
  int full[5] = {world_size, 1, 1, 1, 1};
  expect_reject(world, 0, full, "ndim=0 (expected 1..4)", NULL);
  expect_reject(world, 5, ones, "ndim=5 (expected 1..4)", NULL);
  expect_reject(world, 5, full, "ndim=5 (expected 1..4)", NULL);
  expect_reject(world, -1, full, "ndim=-1", NULL);
  int zero[2] = {world_size, 0};
  expect_reject(world, 2, zero, "shape[1]=0 (expected >= 1)", NULL);
  expect_reject(world, 2, NULL, "shape=NULL", NULL);
  expect_reject(NULL, 1, full, "comm=NULL", NULL);
  CHECK(dtl_mesh_create(world, 1, full, NULL) == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "out=NULL"),
        "out=NULL accepted");
}

/* Mesh rank i is world rank list[i]: a member's coordinate is its place in the list, its dim communicators hold
 * exactly the listed ranks that differ on that dim; a non-member has no communicators and empty layouts. */
static void check_sub_mesh(int n, const int *list, int ndim, const int *shape) {
  const char *txt = shape_text(ndim, shape);
  dtl_mesh *m = NULL;
  dtl_status st = dtl_mesh_create_from_ranks(world, n, list, ndim, shape, &m);
  CHECK(st == DTL_OK, "sub-mesh %s of %d: %s", txt, n, dtl_last_error());
  if (st != DTL_OK) return;
  int index = -1;
  for (int i = 0; i < n; i++)
    if (list[i] == world_rank) index = i;
  CHECK(dtl_mesh_is_member(m) == (index >= 0), "sub-mesh %s: is_member %d for list place %d", txt, dtl_mesh_is_member(m),
        index);
  CHECK(dtl_mesh_parent(m) == world && dtl_mesh_size(m) == n && !dtl_mesh_is_abstract(m), "sub-mesh %s: parent/size", txt);
  for (int i = 0; i < n; i++) {
    int pr = -1;
    CHECK(dtl_mesh_parent_rank(m, i, &pr) == DTL_OK && pr == list[i], "sub-mesh %s: mesh rank %d is parent rank %d", txt,
          i, pr);
  }
  int got[DTL_MAX_MESH_DIMS];
  dtl_mesh_coord(m, got);
  dtl_placement p[DTL_MAX_MESH_DIMS];
  for (int d = 0; d < ndim; d++) p[d] = dtl_shard(0);
  const int64_t gshape[2] = {5, 3};
  dtl_layout *l = NULL;
  CHECK(dtl_layout_create(m, DTL_FLOAT32, 2, gshape, p, &l) == DTL_OK, "sub-mesh %s: layout: %s", txt, dtl_last_error());
  if (index < 0) {
    CHECK(dtl_mesh_comm(m) == NULL && dtl_mesh_dim_comm(m, 0) == NULL, "sub-mesh %s: a non-member has communicators", txt);
    CHECK(got[0] == -1, "sub-mesh %s: a non-member's coordinate is %d", txt, got[0]);
    CHECK(l && dtl_layout_local_count(l) == 0, "sub-mesh %s: a non-member's shard is not empty", txt);
  } else {
    int want[DTL_MAX_MESH_DIMS];
    counted_coord(ndim, shape, index, want);
    for (int d = 0; d < ndim; d++) CHECK(got[d] == want[d], "sub-mesh %s: coord[%d]=%d, expected %d", txt, d, got[d], want[d]);
    CHECK(dtl_comm_size(dtl_mesh_comm(m)) == n && dtl_comm_rank(dtl_mesh_comm(m)) == index,
          "sub-mesh %s: mesh communicator rank %d of %d", txt, dtl_comm_rank(dtl_mesh_comm(m)), dtl_comm_size(dtl_mesh_comm(m)));
    for (int d = 0; d < ndim; d++) {
      dtl_comm *dc = dtl_mesh_dim_comm(m, d);
      int32_t mine = world_rank, all[65];
      CHECK(dtl_all_gather(dc, &mine, all, 1, DTL_INT32) == DTL_OK, "%s", dtl_last_error());
      for (int j = 0; j < shape[d]; j++) {
        int c[DTL_MAX_MESH_DIMS];
        memcpy(c, want, sizeof c);
        c[d] = j;
        int r = 0;
        dtl_mesh_rank_of(m, c, &r);
        CHECK(all[j] == list[r], "sub-mesh %s: dim %d member %d is world rank %d, expected %d", txt, d, j, all[j], list[r]);
      }
    }
    int64_t s0[2], o0[2], s1[2], o1[2];
    dtl_layout_local_box(l, NULL, s0, o0);
    dtl_layout_local_box(l, want, s1, o1);
    CHECK(s0[0] == s1[0] && o0[0] == o1[0], "sub-mesh %s: own box differs from the explicit one", txt);
  }
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

/* The last ranks of the world in reverse order (1-D), all but rank 0 as 2 x k when that fits, and the whole world
 * shuffled. */
static void meshes_over_listed_ranks_number_members_in_list_order(void) {
  int list[64];
  for (int k = 1; k <= world_size; k++) {
    for (int i = 0; i < k; i++) list[i] = world_size - 1 - i;
    check_sub_mesh(k, list, 1, (int[]){k});
  }
  if (world_size >= 5 && (world_size - 1) % 2 == 0) {
    for (int i = 0; i < world_size - 1; i++) list[i] = i + 1;
    check_sub_mesh(world_size - 1, list, 2, (int[]){2, (world_size - 1) / 2});
  }
  for (int i = 0; i < world_size; i++) list[i] = (i * 3 + 1) % world_size;
  bool distinct = true;
  for (int i = 0; i < world_size; i++)
    for (int j = 0; j < i; j++) distinct &= list[i] != list[j];
  if (distinct) check_sub_mesh(world_size, list, 1, (int[]){world_size});
}

static void expect_reject_list(int n, const int *list, int ndim, const int *shape, const char *need) {
  dtl_mesh *m = (dtl_mesh *)0x5a5a;
  dtl_status st = dtl_mesh_create_from_ranks(world, n, list, ndim, shape, &m);
  CHECK(st == DTL_ERR_INVALID_ARGUMENT, "%s: %s, expected DTL_ERR_INVALID_ARGUMENT", need, dtl_status_name(st));
  CHECK(m == (dtl_mesh *)0x5a5a, "%s: out was written on failure", need);
  CHECK(strstr(dtl_last_error(), "dtl_mesh_create_from_ranks") && strstr(dtl_last_error(), need),
        "message \"%s\" lacks \"%s\"", dtl_last_error(), need);
}

static void bad_rank_lists_fail_on_every_rank(void) {
  int list[2] = {0, 0};
  if (world_size >= 2) expect_reject_list(2, list, 1, (int[]){2}, "ranks[1]=0 appears twice");
  list[0] = world_size;
  expect_reject_list(1, list, 1, (int[]){1}, "ranks[0]=");
  list[0] = 0;
  expect_reject_list(1, list, 1, (int[]){2}, "shape=2 has 2 ranks but the rank list has 1");
  expect_reject_list(0, list, 1, (int[]){1}, "nranks=0");
  expect_reject_list(1, NULL, 1, (int[]){1}, "ranks=NULL");
}

/* For every ordered factorisation of the world size into 1-4 dims. */
static void every_factorisation_gives_row_major_coordinates_and_dim_communicators(void) {
  int meshes = 0, shape[DTL_MAX_MESH_DIMS];
  for (int ndim = 1; ndim <= DTL_MAX_MESH_DIMS; ndim++) meshes += check_factorisations(ndim, 0, world_size, shape);
  if (world_rank == 0) printf("%d meshes over %d ranks\n", meshes, world_size);
}

/* A transport that cannot reduce the 8-bit floats (an NCCL before 2.24, a device before sm_90: nccl.c writes the
 * reason when it makes the communicator) refuses their max and min with that reason, in its collectives and in the
 * Partial layouts of its meshes, and still moves them. Simulated here on MPI by setting the reason. */
static void a_transport_without_fp8_reductions_refuses_their_max_and_min_naming_why(void) {
  static const char why[] = "device 0 has compute capability 8.0 and NCCL reduces FP8 from 9.0 (sm_90) on";
  dtl_comm *c = NULL;
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &c));
  c->fp8_reduce_refusal = why;
  dtl_mesh *m = NULL;
  int shape[1] = {world_size};
  REQUIRE_OK(dtl_mesh_create(c, 1, shape, &m));
  const int64_t gshape[1] = {6};
  dtl_layout *l = (dtl_layout *)0x5a5a;
  CHECK_ERROR(dtl_layout_create(m, DTL_FLOAT8_E4M3, 1, gshape, (dtl_placement[]){dtl_partial(DTL_MAX)}, &l),
              DTL_ERR_UNSUPPORTED, "placements[0]=P(max) cannot hold dtype f8e4m3: device 0 has compute capability 8.0");
  CHECK(l == (dtl_layout *)0x5a5a, "a refused layout was written");
  CHECK_OK(dtl_layout_create(m, DTL_FLOAT8_E4M3, 1, gshape, (dtl_placement[]){dtl_shard(0)}, &l));
  dtl_layout_destroy(l);
  uint8_t in[4] = {0x38, 0xb8, 0x7e, 0x01}, out[4 * 64];
  memset(out, 0xa5, sizeof out);
  CHECK_ERROR(dtl_all_reduce(c, in, out, 4, DTL_FLOAT8_E5M2, DTL_MIN), DTL_ERR_UNSUPPORTED,
              "dtl_all_reduce: op=min on dtype f8e5m2 is unsupported: device 0 has compute capability 8.0");
  CHECK(out[0] == 0xa5, "a refused all_reduce wrote recv");
  /* the sum's own reason comes first: it is refused everywhere */
  CHECK_ERROR(dtl_all_reduce(c, in, out, 4, DTL_FLOAT8_E4M3, DTL_SUM), DTL_ERR_UNSUPPORTED, "f8e4m3 sum would round");
  CHECK_OK(dtl_all_gather(c, in, out, 4, DTL_FLOAT8_E4M3));
  for (int r = 0; r < world_size; r++) CHECK(!memcmp(out + 4 * r, in, 4), "all_gather block %d", r);
  float f[2] = {1, 2}, g[2];
  CHECK_OK(dtl_all_reduce(c, f, g, 2, DTL_FLOAT32, DTL_MAX));
  dtl_mesh_destroy(m);
  dtl_comm_destroy(c);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  world_rank = dt_rank;
  world_size = dt_size;
  if (world_size > 64) return dt_skip("the test's buffers hold at most 64 ranks");
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  RUN(bad_shapes_fail_on_every_rank_naming_the_shape_and_sizes); /* first: none may reach a collective */
  RUN(every_factorisation_gives_row_major_coordinates_and_dim_communicators);
  RUN(bad_rank_lists_fail_on_every_rank);
  RUN(meshes_over_listed_ranks_number_members_in_list_order);
  RUN(a_transport_without_fp8_reductions_refuses_their_max_and_min_naming_why);
  dtl_comm_destroy(world);
  return dt_finish();
}

/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_mesh_create is collective and agreed, with or without DTL_CHECK: one rank's bad argument, another
 * shape, missing memory or a failed split fails every rank (under the watchdog) and leaves no mesh; ranks
 * that disagree about DTL_CHECK itself are caught here, before any checked call could pair up wrongly. */
#include "common/alloc.h"
#include "dtl_test_ranks.h"

static dtl_comm *world;

static void one_rank_with_a_bad_argument_fails_every_rank(void) {
  bool me = dt_rank == dt_bad;
  dtl_mesh *m = NULL;
  int shape[1] = {dt_size}, wrong[1] = {dt_size + 1};
  dt_expect_every_rank_fails("out", dtl_mesh_create(world, 1, shape, me ? NULL : &m), DTL_ERR_INVALID_ARGUMENT,
                             "out=NULL");
  dt_expect_every_rank_fails("size", dtl_mesh_create(world, 1, me ? wrong : shape, &m), DTL_ERR_INVALID_ARGUMENT,
                             "ranks but the communicator has");
  dt_expect_every_rank_fails("ndim", dtl_mesh_create(world, me ? 0 : 1, shape, &m), DTL_ERR_INVALID_ARGUMENT, "ndim=0");
  dt_expect_every_rank_fails("shape", dtl_mesh_create(world, 1, me ? NULL : shape, &m), DTL_ERR_INVALID_ARGUMENT,
                             "shape=NULL");
  CHECK(m == NULL, "a failed creation returned a mesh");
}

/* 2 x 2 and 4 have the same rank count: without the agreement the splits would pair up ranks of different
 * groups. */
static void another_shape_of_the_same_size_is_a_mismatch_on_every_rank(void) {
  if (dt_size != 4) return;
  dtl_mesh *m = NULL;
  int square[2] = {2, 2}, line[1] = {4};
  bool me = dt_rank == dt_bad;
  dtl_status st = me ? dtl_mesh_create(world, 1, line, &m) : dtl_mesh_create(world, 2, square, &m);
  CHECK(st == DTL_ERR_MISMATCH && strstr(dtl_last_error(), "rank 3 made another call") && m == NULL, "%s %s",
        dtl_status_name(st), dtl_last_error());
}

static void one_rank_without_memory_fails_every_rank_before_or_after_its_splits(void) {
  bool me = dt_rank == dt_bad;
  int shape[2] = {1, dt_size};
  /* 1: the mesh itself; 2, 3: the first split's communicator (transport state, then the dtl_comm). */
  for (uint64_t at = 1; at <= 3; at++) {
    dtl_mesh *m = NULL;
    dtl__alloc_hook_reset(me ? at : 0, false);
    dtl_status st = dtl_mesh_create(world, 2, shape, &m);
    dtl__alloc_hook_reset(0, false);
    char what[32];
    snprintf(what, sizeof what, "allocation %llu", (unsigned long long)at);
    dt_expect_every_rank_fails(what, st, DTL_ERR_OUT_OF_MEMORY, "memory");
    CHECK(m == NULL, "%s: a failed creation returned a mesh", what);
  }
  dtl_mesh *m = NULL;
  CHECK_OK(dtl_mesh_create(world, 2, shape, &m));
  dtl_mesh_destroy(m);
}

static void ranks_that_disagree_about_dtl_check_fail_at_mesh_creation(void) {
  if (dt_size == 1) return;
  dtl_comm *c = dt_comm_with_check(dt_rank == dt_bad);
  dtl_mesh *m = NULL;
  int shape[1] = {dt_size};
  dtl_status st = dtl_mesh_create(c, 1, shape, &m);
  CHECK(st == DTL_ERR_MISMATCH && m == NULL, "%s %s", dtl_status_name(st), dtl_last_error());
  dtl_comm_destroy(c);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  dt_watchdog_s = 30;
  dt_ranks_init();
  if (!(world = dt_comm_with_check(false))) return dt_skip(dtl_last_error()); /* creation agrees without it */
  RUN(one_rank_with_a_bad_argument_fails_every_rank);
  RUN(another_shape_of_the_same_size_is_a_mismatch_on_every_rank);
  RUN(one_rank_without_memory_fails_every_rank_before_or_after_its_splits);
  RUN(ranks_that_disagree_about_dtl_check_fail_at_mesh_creation);
  dtl_comm_destroy(world);
  return dt_finish();
}

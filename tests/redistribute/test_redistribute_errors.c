/* SPDX-License-Identifier: Apache-2.0 */
/* Bad input to dtl_redistribute, dtl_distribute and dtl_full_tensor: each gets a status and a message naming
 * what was wrong, the destination stays untouched and the source intact. With DTL_CHECK=1, calls that
 * disagree across ranks return DTL_ERR_MISMATCH on every rank (naming the ranks) instead of hanging. */
#include <stdlib.h>
#include <string.h>
#include "dtl_test.h"
#include "test_redistribute_util.h"

static int rank, size;
static dtl_comm *world;
static dtl_mesh *m;
static dtl_comm *checked; /* made with DTL_CHECK=1 (read when a communicator is made) */
static dtl_mesh *mc;      /* over checked: another parent than m's */

#define N 24
typedef struct {
  int32_t src[N * 8], dst[N * 8];
  uint64_t src_sum, dst_sum;
} bufs;

static void arm(bufs *b) {
  for (int i = 0; i < N * 8; i++) b->src[i] = i * 7 - 3;
  memset(b->dst, 0x5a, sizeof b->dst);
  b->src_sum = tu_checksum(b->src, sizeof b->src);
  b->dst_sum = tu_checksum(b->dst, sizeof b->dst);
}

static bool untouched(const bufs *b) {
  return tu_checksum(b->src, sizeof b->src) == b->src_sum && tu_checksum(b->dst, sizeof b->dst) == b->dst_sum;
}

static dtl_layout *layout(const dtl_mesh *m, dtl_dtype t, int64_t n0, int64_t n1, dtl_placement p) {
  int64_t shape[2] = {n0, n1};
  dtl_layout *l = NULL;
  if (dtl_layout_create(m, t, 2, shape, &p, &l) != DTL_OK) CHECK(0, "layout: %s", dtl_last_error());
  return l;
}

/* mismatched_layout_pairs_are_rejected: meshes of different parents, different dtypes or shapes; NULL layouts and
 * buffers. */
static void mismatched_layout_pairs_are_rejected(void) {
  bufs b;
  dtl_layout *s0 = layout(m, DTL_INT32, N, 4, dtl_shard(0)), *r = layout(m, DTL_INT32, N, 4, dtl_replicate());
  dtl_layout *other_mesh = layout(mc, DTL_INT32, N, 4, dtl_replicate());
  dtl_layout *other_type = layout(m, DTL_FLOAT32, N, 4, dtl_replicate());
  dtl_layout *other_shape = layout(m, DTL_INT32, N, 5, dtl_replicate());
  arm(&b);
  CHECK_ERROR(dtl_redistribute(s0, b.src, other_mesh, b.dst), DTL_ERR_INVALID_ARGUMENT, "without a common parent");
  CHECK_ERROR(dtl_redistribute(s0, b.src, other_type, b.dst), DTL_ERR_INVALID_ARGUMENT, "dst dtype=f32");
  CHECK_ERROR(dtl_redistribute(s0, b.src, other_shape, b.dst), DTL_ERR_INVALID_ARGUMENT, "dst global shape [24,5]");
  CHECK_ERROR(dtl_redistribute(NULL, b.src, r, b.dst), DTL_ERR_INVALID_ARGUMENT, "src=NULL");
  CHECK_ERROR(dtl_redistribute(s0, b.src, NULL, b.dst), DTL_ERR_INVALID_ARGUMENT, "dst=NULL");
  CHECK_ERROR(dtl_redistribute(s0, NULL, r, b.dst), DTL_ERR_INVALID_ARGUMENT, "src_local=NULL");
  CHECK_ERROR(dtl_redistribute(s0, b.src, r, NULL), DTL_ERR_INVALID_ARGUMENT, "dst_local=NULL");
  CHECK_ERROR(dtl_full_tensor(NULL, b.src, b.dst), DTL_ERR_INVALID_ARGUMENT, "layout=NULL");
  CHECK_ERROR(dtl_full_tensor(s0, b.src, NULL), DTL_ERR_INVALID_ARGUMENT, "dst_local=NULL");
  CHECK_ERROR(dtl_distribute(NULL, b.src, 0, b.dst), DTL_ERR_INVALID_ARGUMENT, "layout=NULL");
  CHECK_ERROR(dtl_distribute(s0, b.src, size, b.dst), DTL_ERR_INVALID_ARGUMENT, "root=");
  CHECK_ERROR(dtl_distribute(s0, b.src, -1, b.dst), DTL_ERR_INVALID_ARGUMENT, "root=-1");
  CHECK_ERROR(dtl_distribute(s0, b.src, 0, NULL), DTL_ERR_INVALID_ARGUMENT, "local=NULL");
  CHECK(untouched(&b), "a rejected call wrote a buffer");
  dtl_layout_destroy(s0);
  dtl_layout_destroy(r);
  dtl_layout_destroy(other_mesh);
  dtl_layout_destroy(other_type);
  dtl_layout_destroy(other_shape);
}

/* unsupported_transitions_and_aliasing_are_rejected: S -> P(avg) and P(sum) -> P(max) have no route; the same
 * buffer for source and target is only allowed for a purely local plan. */
static void unsupported_transitions_and_aliasing_are_rejected(void) {
  bufs b;
  dtl_layout *s0 = layout(m, DTL_INT32, N, 4, dtl_shard(0)), *r = layout(m, DTL_INT32, N, 4, dtl_replicate());
  dtl_layout *p = layout(m, DTL_FLOAT32, N, 4, dtl_partial(DTL_SUM)), *pm = layout(m, DTL_FLOAT32, N, 4, dtl_partial(DTL_MAX));
  dtl_layout *ps = layout(m, DTL_FLOAT32, N, 4, dtl_partial(DTL_AVG)), *sf = layout(m, DTL_FLOAT32, N, 4, dtl_shard(0));
  arm(&b);
  if (size > 1) {
    CHECK_ERROR(dtl_redistribute(sf, b.src, ps, b.dst), DTL_ERR_UNSUPPORTED, "unsupported");
    CHECK_ERROR(dtl_redistribute(p, b.src, pm, b.dst), DTL_ERR_UNSUPPORTED, "unsupported");
    CHECK_ERROR(dtl_redistribute(s0, b.src, r, b.src), DTL_ERR_INVALID_ARGUMENT, "dst_local");
    CHECK(untouched(&b), "a rejected call wrote a buffer");
  }
  /* R -> S(0) is a local slice: in place is fine, and gives this rank's rows. */
  int32_t buf[N * 4], want[N * 4];
  for (int i = 0; i < N * 4; i++) buf[i] = want[i] = i;
  CHECK(dtl_redistribute(r, buf, s0, buf) == DTL_OK, "in-place slice: %s", dtl_last_error());
  int64_t off[2];
  dtl_layout_local_box(s0, NULL, NULL, off);
  CHECK(memcmp(buf, want + off[0] * 4, dtl_layout_local_count(s0) * sizeof(int32_t)) == 0, "in-place slice values");
  dtl_layout_destroy(s0);
  dtl_layout_destroy(r);
  dtl_layout_destroy(p);
  dtl_layout_destroy(pm);
  dtl_layout_destroy(ps);
  dtl_layout_destroy(sf);
}

/* abstract_meshes_cannot_move_data */
static void abstract_meshes_cannot_move_data(void) {
  int shape[1] = {size};
  dtl_mesh *am;
  CHECK(dtl_mesh_create_abstract(1, shape, NULL, &am) == DTL_OK, "%s", dtl_last_error());
  dtl_layout *s0 = layout(am, DTL_INT32, N, 4, dtl_shard(0)), *r = layout(am, DTL_INT32, N, 4, dtl_replicate());
  bufs b;
  arm(&b);
  CHECK_ERROR(dtl_redistribute(s0, b.src, r, b.dst), DTL_ERR_INVALID_ARGUMENT, "abstract");
  CHECK_ERROR(dtl_full_tensor(s0, b.src, b.dst), DTL_ERR_INVALID_ARGUMENT, "abstract");
  CHECK_ERROR(dtl_distribute(s0, b.src, 0, b.dst), DTL_ERR_INVALID_ARGUMENT, "abstract");
  CHECK(untouched(&b), "a rejected call wrote a buffer");
  dtl_layout_destroy(s0);
  dtl_layout_destroy(r);
  dtl_mesh_destroy(am);
}

/* disagreeing_ranks_get_mismatch_under_dtl_check: rank size-1 asks for another target (or passes a NULL
 * buffer): every rank returns at once, the others with DTL_ERR_MISMATCH (or that rank's error) naming that
 * rank. */
static void disagreeing_ranks_get_mismatch_under_dtl_check(void) {
  bufs b;
  dtl_layout *s0 = layout(mc, DTL_INT32, N, 4, dtl_shard(0)), *r = layout(mc, DTL_INT32, N, 4, dtl_replicate());
  dtl_layout *s1 = layout(mc, DTL_INT32, N, 4, dtl_shard(1));
  char odd[32];
  snprintf(odd, sizeof odd, "rank %d ", size - 1);
  /* Agreeing calls pass the check and work. */
  arm(&b);
  CHECK(dtl_redistribute(r, b.src, s0, b.dst) == DTL_OK, "%s", dtl_last_error());
  if (size > 1) {
    arm(&b);
    bool me_odd = rank == size - 1;
    dtl_status st = dtl_redistribute(s0, b.src, me_odd ? s1 : r, b.dst);
    if (rank == 0) printf("  rank 0 was told: %s\n", dtl_last_error());
    CHECK(st == DTL_ERR_MISMATCH && strstr(dtl_last_error(), odd) && strstr(dtl_last_error(), "another call"),
          "different targets: %s %s", dtl_status_name(st), dtl_last_error());
    CHECK(untouched(&b), "a mismatched call wrote a buffer");
    /* One rank's own argument error: it gets that error, the others the same status naming it. */
    st = dtl_redistribute(s0, b.src, r, me_odd ? NULL : b.dst);
    if (me_odd) CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "dst_local=NULL"), "%s", dtl_last_error());
    else CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), odd), "%s %s", dtl_status_name(st), dtl_last_error());
    /* distribute with a root that one rank gets wrong, and with a NULL dense tensor on root. */
    st = dtl_distribute(s0, b.src, me_odd ? 1 : 0, b.dst);
    CHECK(st == DTL_ERR_MISMATCH, "distribute roots: %s %s", dtl_status_name(st), dtl_last_error());
    st = dtl_distribute(s0, rank == 0 ? NULL : b.src, 0, b.dst);
    if (rank == 0) CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "dense_on_root=NULL"), "%s", dtl_last_error());
    else CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "rank 0 "), "%s %s", dtl_status_name(st), dtl_last_error());
    CHECK(untouched(&b), "a mismatched call wrote a buffer");
    /* full_tensor of different layouts. */
    st = dtl_full_tensor(me_odd ? s1 : s0, b.src, b.dst);
    CHECK(st == DTL_ERR_MISMATCH, "full_tensor: %s %s", dtl_status_name(st), dtl_last_error());
    CHECK(untouched(&b), "a mismatched call wrote a buffer");
  }
  dtl_layout_destroy(s0);
  dtl_layout_destroy(s1);
  dtl_layout_destroy(r);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  rank = dt_rank;
  size = dt_size;
  int shape[1] = {size};
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  REQUIRE_OK(dtl_mesh_create(world, 1, shape, &m));
  setenv("DTL_CHECK", "1", 1);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &checked));
  unsetenv("DTL_CHECK");
  REQUIRE_OK(dtl_mesh_create(checked, 1, shape, &mc));
  RUN(mismatched_layout_pairs_are_rejected);
  RUN(unsupported_transitions_and_aliasing_are_rejected);
  RUN(abstract_meshes_cannot_move_data);
  RUN(disagreeing_ranks_get_mismatch_under_dtl_check);
  dtl_mesh_destroy(m);
  dtl_mesh_destroy(mc);
  dtl_comm_destroy(world);
  dtl_comm_destroy(checked);
  return dt_finish();
}

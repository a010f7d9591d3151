/* SPDX-License-Identifier: Apache-2.0 */
/* One rank's bad argument to a collective entry point fails every rank, under the watchdog: with DTL_CHECK
 * on the communicator each blocking collective agrees before it communicates, so the rank
 * with the bad argument gets its own message and the others an error naming it; a rank that makes another
 * call (count, root, op, dtype, in-place form, another collective) makes every rank return
 * DTL_ERR_MISMATCH instead of a hang or wrong data. dtl_comm_split agrees with or without DTL_CHECK. No
 * buffer is written by a failed call. */
#include "common/alloc.h"
#include "dtl_test_ranks.h"

#define N 4
#define SENTINEL -7

static dtl_comm *checked, *plain;

static void fill(int32_t *p, size_t n, int32_t v) {
  for (size_t i = 0; i < n; i++) p[i] = v;
}
static bool untouched(const int32_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != SENTINEL) return false;
  return true;
}

typedef struct {
  int32_t send[N * 8], recv[N * 8];
  size_t counts[8], zero[8];
} bufs;

static void arm(bufs *b) {
  fill(b->send, N * 8, dt_rank);
  fill(b->recv, N * 8, SENTINEL);
  for (int i = 0; i < 8; i++) {
    b->counts[i] = N;
    b->zero[i] = 0;
  }
}

static void root_collectives_fail_every_rank_when_one_rank_passes_a_null_buffer(void) {
  bool me = dt_rank == dt_bad;
  bufs b;
  arm(&b);
  dt_expect_every_rank_fails("broadcast", dtl_broadcast(checked, me ? NULL : b.recv, N, DTL_INT32, 0),
                             DTL_ERR_INVALID_ARGUMENT, "buf=NULL");
  /* The root alone reads send (scatter) or writes recv (gather, reduce): the classic one-rank failure. */
  dt_expect_every_rank_fails("scatter", dtl_scatter(checked, me ? NULL : b.send, b.recv, N, DTL_INT32, dt_bad),
                             DTL_ERR_INVALID_ARGUMENT, "send=NULL");
  dt_expect_every_rank_fails("gather", dtl_gather(checked, b.send, me ? NULL : b.recv, N, DTL_INT32, dt_bad),
                             DTL_ERR_INVALID_ARGUMENT, "recv=NULL");
  dt_expect_every_rank_fails("reduce", dtl_reduce(checked, b.send, me ? NULL : b.recv, N, DTL_INT32, DTL_SUM, dt_bad),
                             DTL_ERR_INVALID_ARGUMENT, "recv=NULL");
  dt_expect_every_rank_fails("broadcast root", dtl_broadcast(checked, b.recv, N, DTL_INT32, me ? dt_size : 0),
                             DTL_ERR_INVALID_ARGUMENT, "root=");
  CHECK(untouched(b.recv, N * 8), "a failed call wrote recv");
}

static void all_rank_collectives_fail_every_rank_when_one_rank_passes_a_bad_argument(void) {
  bool me = dt_rank == dt_bad;
  bufs b;
  arm(&b);
  dt_expect_every_rank_fails("all_gather", dtl_all_gather(checked, b.send, me ? NULL : b.recv, N, DTL_INT32),
                             DTL_ERR_INVALID_ARGUMENT, "recv=NULL");
  dt_expect_every_rank_fails("all_gatherv",
                             dtl_all_gatherv(checked, b.send, N, b.recv, me ? NULL : b.counts, DTL_INT32),
                             DTL_ERR_INVALID_ARGUMENT, "recv_counts=NULL");
  dt_expect_every_rank_fails("all_reduce", dtl_all_reduce(checked, me ? NULL : b.send, b.recv, N, DTL_INT32, DTL_SUM),
                             DTL_ERR_INVALID_ARGUMENT, "send=NULL");
  dt_expect_every_rank_fails("all_reduce op", dtl_all_reduce(checked, b.send, b.recv, N, DTL_INT32, me ? 99 : DTL_SUM),
                             DTL_ERR_INVALID_ARGUMENT, "op=99");
  dt_expect_every_rank_fails("reduce_scatter",
                             dtl_reduce_scatter(checked, b.send, me ? NULL : b.recv, 1, DTL_INT32, DTL_SUM),
                             DTL_ERR_INVALID_ARGUMENT, "recv=NULL");
  dt_expect_every_rank_fails("reduce_scatterv",
                             dtl_reduce_scatterv(checked, me ? NULL : b.send, b.recv, b.counts, DTL_INT32, DTL_SUM),
                             DTL_ERR_INVALID_ARGUMENT, "send=NULL");
  dt_expect_every_rank_fails("all_to_all", dtl_all_to_all(checked, b.send, me ? NULL : b.recv, 1, DTL_INT32),
                             DTL_ERR_INVALID_ARGUMENT, "recv=NULL");
  dt_expect_every_rank_fails("all_to_allv",
                             dtl_all_to_allv(checked, b.send, me ? NULL : b.counts, b.recv, b.counts, DTL_INT32),
                             DTL_ERR_INVALID_ARGUMENT, "send_counts=NULL");
  dt_expect_every_rank_fails("dtype", dtl_all_reduce(checked, b.send, b.recv, N, me ? 77 : DTL_INT32, DTL_SUM),
                             DTL_ERR_INVALID_ARGUMENT, "dtype=77");
  CHECK(untouched(b.recv, N * 8), "a failed call wrote recv");
}

/* Without DTL_CHECK these calls would pair up wrongly: an all-reduce of 4 elements with one of 3 can
 * complete on MPI with truncated or mixed data; a rank with another root or op computes something else. */
static void a_rank_that_makes_another_call_gets_every_rank_a_mismatch(void) {
  bool me = dt_rank == dt_bad;
  bufs b;
  arm(&b);
  dt_expect_mismatch("count", dtl_all_reduce(checked, b.send, b.recv, me ? N - 1 : N, DTL_INT32, DTL_SUM));
  dt_expect_mismatch("op", dtl_all_reduce(checked, b.send, b.recv, N, DTL_INT32, me ? DTL_MAX : DTL_SUM));
  dt_expect_mismatch("dtype", dtl_all_reduce(checked, b.send, b.recv, N / 2, me ? DTL_INT64 : DTL_FLOAT64, DTL_SUM));
  dt_expect_mismatch("root", dtl_broadcast(checked, b.recv, N, DTL_INT32, me && dt_size > 1 ? 1 : 0));
  dt_expect_mismatch("reduce root",
                     dtl_reduce(checked, b.send, b.recv, N, DTL_INT32, DTL_SUM, me && dt_size > 1 ? 1 : 0));
  size_t other[8];
  for (int i = 0; i < 8; i++) other[i] = i == 0 ? N - 1 : N;
  dt_expect_mismatch("gatherv counts", dtl_all_gatherv(checked, b.send, me && dt_bad == 0 ? N - 1 : N, b.recv,
                                                       me ? other : b.counts, DTL_INT32));
  /* MPI's rule: every rank uses the in-place form of an all-rank collective, or none. */
  int32_t io[N];
  fill(io, N, 1);
  dt_expect_mismatch("in place", dtl_all_reduce(checked, me ? (const void *)io : b.send, io, N, DTL_INT32, DTL_SUM));
  /* Another collective altogether. */
  dtl_status st = me ? dtl_barrier(checked) : dtl_all_reduce(checked, b.send, b.recv, N, DTL_INT32, DTL_SUM);
  dt_expect_mismatch("barrier vs all_reduce", st);
}

static void comm_split_fails_every_rank_with_or_without_dtl_check(void) {
  bool me = dt_rank == dt_bad;
  dtl_comm *child = NULL;
  dtl_comm *comms[2] = {plain, checked};
  for (int k = 0; k < 2; k++) {
    dt_expect_every_rank_fails("split out", dtl_comm_split(comms[k], 0, dt_rank, me ? NULL : &child),
                               DTL_ERR_INVALID_ARGUMENT, "out=NULL");
    dt_expect_every_rank_fails("split color", dtl_comm_split(comms[k], me ? -1 : 0, dt_rank, &child),
                               DTL_ERR_INVALID_ARGUMENT, "color=-1");
    CHECK(child == NULL, "a failed split returned a communicator");
  }
  /* A failure after splitting (this rank cannot wrap its new communicator) also reaches every rank. */
  dtl__alloc_hook_reset(me ? 1 : 0, false);
  dtl_status st = dtl_comm_split(plain, 0, dt_rank, &child);
  dtl__alloc_hook_reset(0, false);
  char want[48];
  snprintf(want, sizeof want, "rank %d failed", dt_bad);
  CHECK(st == DTL_ERR_OUT_OF_MEMORY && child == NULL && (me || strstr(dtl_last_error(), want)), "%s %s",
        dtl_status_name(st), dtl_last_error());
  CHECK_OK(dtl_comm_split(plain, 0, dt_rank, &child));
  dtl_comm_destroy(child);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  dt_watchdog_s = 30;
  dt_ranks_init();
  checked = dt_comm_with_check(true);
  plain = dt_comm_with_check(false);
  if (!checked || !plain) return dt_skip(dtl_last_error());
  RUN(root_collectives_fail_every_rank_when_one_rank_passes_a_null_buffer);
  RUN(all_rank_collectives_fail_every_rank_when_one_rank_passes_a_bad_argument);
  RUN(a_rank_that_makes_another_call_gets_every_rank_a_mismatch);
  RUN(comm_split_fails_every_rank_with_or_without_dtl_check);
  dtl_comm_destroy(checked);
  dtl_comm_destroy(plain);
  return dt_finish();
}

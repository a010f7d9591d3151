/* SPDX-License-Identifier: Apache-2.0 */
/* Bad input to the communicator API: every call gets the documented status, a dtl_last_error() message that
 * names the function, the argument and the bad value, and writes none of its buffers (they hold a sentinel
 * before the call and must still hold it after). Every rank makes the same bad call, so the rejection is
 * collective and nothing waits; checks that only a root makes run on a one-rank communicator. */
#include <limits.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include "dtl_test.h"

static dtl_comm *comm, *self;
static int rank, size;

#define BUF 512
#define SENTINEL 0xa5
static unsigned char sbuf[BUF], rbuf[BUF];
static size_t counts[64], counts2[64];

/* Two disjoint spans of address space larger than INT_MAX elements, for calls that must be refused for
 * their size before anything reads or writes them (reserved lazily: no page is used unless touched). */
#define HUGE_SPAN ((size_t)16 << 30)
static unsigned char *hsend, *hrecv;

static void reset_buffers(void) {
  memset(sbuf, SENTINEL, sizeof sbuf);
  memset(rbuf, SENTINEL, sizeof rbuf);
  if (hsend) memset(hsend, SENTINEL, BUF), memset(hrecv, SENTINEL, BUF);
}

static bool buffers_untouched(void) {
  for (size_t i = 0; i < BUF; i++)
    if (sbuf[i] != SENTINEL || rbuf[i] != SENTINEL || (hsend && (hsend[i] != SENTINEL || hrecv[i] != SENTINEL)))
      return false;
  return true;
}

/* The call returns want, its message contains every needle, and neither buffer changed. */
static void expect_failure(const char *expr, dtl_status got, dtl_status want, const char *const *needles) {
  const char *msg = dtl_last_error();
  CHECK(got == want, "%s -> %s (expected %s): %s", expr, dtl_status_name(got), dtl_status_name(want), msg);
  for (int i = 0; needles[i]; i++)
    CHECK(strstr(msg, needles[i]) != NULL, "%s: message \"%s\" lacks \"%s\"", expr, msg, needles[i]);
  CHECK(buffers_untouched(), "%s wrote a buffer although it failed", expr);
}
#define EXPECT_FAIL(call, want, ...)                                         \
  do {                                                                       \
    reset_buffers();                                                         \
    dtl_status got_ = (call);                                                \
    expect_failure(#call, got_, (want), (const char *const[]){__VA_ARGS__, NULL}); \
  } while (0)
#define INVALID DTL_ERR_INVALID_ARGUMENT

static char text[64];
static const char *num(long long v) {
  snprintf(text, sizeof text, "%lld", v);
  return text;
}

static void null_communicator_is_rejected_by_every_call(void) {
  dtl_request *req = NULL;
  EXPECT_FAIL(dtl_broadcast(NULL, sbuf, 1, DTL_FLOAT32, 0), INVALID, "dtl_broadcast", "comm=NULL");
  EXPECT_FAIL(dtl_scatter(NULL, sbuf, rbuf, 1, DTL_FLOAT32, 0), INVALID, "dtl_scatter", "comm=NULL");
  EXPECT_FAIL(dtl_gather(NULL, sbuf, rbuf, 1, DTL_FLOAT32, 0), INVALID, "dtl_gather", "comm=NULL");
  EXPECT_FAIL(dtl_reduce(NULL, sbuf, rbuf, 1, DTL_FLOAT32, DTL_SUM, 0), INVALID, "dtl_reduce", "comm=NULL");
  EXPECT_FAIL(dtl_all_gather(NULL, sbuf, rbuf, 1, DTL_FLOAT32), INVALID, "dtl_all_gather", "comm=NULL");
  EXPECT_FAIL(dtl_all_gatherv(NULL, sbuf, 1, rbuf, counts, DTL_FLOAT32), INVALID, "dtl_all_gatherv", "comm=NULL");
  EXPECT_FAIL(dtl_all_reduce(NULL, sbuf, rbuf, 1, DTL_FLOAT32, DTL_SUM), INVALID, "dtl_all_reduce", "comm=NULL");
  EXPECT_FAIL(dtl_reduce_scatter(NULL, sbuf, rbuf, 1, DTL_FLOAT32, DTL_SUM), INVALID, "dtl_reduce_scatter", "comm=NULL");
  EXPECT_FAIL(dtl_reduce_scatterv(NULL, sbuf, rbuf, counts, DTL_FLOAT32, DTL_SUM), INVALID, "dtl_reduce_scatterv",
              "comm=NULL");
  EXPECT_FAIL(dtl_all_to_all(NULL, sbuf, rbuf, 1, DTL_FLOAT32), INVALID, "dtl_all_to_all", "comm=NULL");
  EXPECT_FAIL(dtl_all_to_allv(NULL, sbuf, counts, rbuf, counts, DTL_FLOAT32), INVALID, "dtl_all_to_allv", "comm=NULL");
  EXPECT_FAIL(dtl_send(NULL, sbuf, 1, DTL_FLOAT32, 0), INVALID, "dtl_send", "comm=NULL");
  EXPECT_FAIL(dtl_recv(NULL, rbuf, 1, DTL_FLOAT32, 0), INVALID, "dtl_recv", "comm=NULL");
  EXPECT_FAIL(dtl_barrier(NULL), INVALID, "dtl_barrier", "comm=NULL");
  EXPECT_FAIL(dtl_all_reduce_async(NULL, sbuf, rbuf, 1, DTL_FLOAT32, DTL_SUM, &req), INVALID, "dtl_all_reduce_async",
              "comm=NULL");
  CHECK(req == NULL, "a failed start stored a request");
  dtl_comm *out = NULL;
  EXPECT_FAIL(dtl_comm_split(NULL, 0, 0, &out), INVALID, "dtl_comm_split", "comm=NULL");
  EXPECT_FAIL(dtl_comm_from_mpi(MPI_COMM_NULL, &out), INVALID, "dtl_comm_from_mpi", "comm=MPI_COMM_NULL");
  EXPECT_FAIL(dtl_comm_from_mpi(MPI_COMM_WORLD, NULL), INVALID, "dtl_comm_from_mpi", "out=NULL");
  CHECK(out == NULL, "a failed constructor stored a communicator");
  CHECK(dtl_comm_rank(NULL) == -1 && dtl_comm_size(NULL) == -1, "rank/size of NULL are not -1");
  CHECK(dtl_comm_mpi_handle(NULL) == MPI_COMM_NULL, "MPI handle of NULL");
}

static void null_buffer_with_elements_is_rejected_and_named(void) {
  for (int r = 0; r < size; r++) counts[r] = 1;
  EXPECT_FAIL(dtl_broadcast(comm, NULL, 3, DTL_FLOAT32, 0), INVALID, "dtl_broadcast", "buf=NULL", "3 elements");
  EXPECT_FAIL(dtl_all_reduce(comm, NULL, rbuf, 2, DTL_INT32, DTL_SUM), INVALID, "dtl_all_reduce", "send=NULL");
  EXPECT_FAIL(dtl_all_reduce(comm, sbuf, NULL, 2, DTL_INT32, DTL_SUM), INVALID, "dtl_all_reduce", "recv=NULL");
  EXPECT_FAIL(dtl_all_gather(comm, sbuf, NULL, 1, DTL_INT8), INVALID, "dtl_all_gather", "recv=NULL");
  EXPECT_FAIL(dtl_all_gatherv(comm, sbuf, 1, NULL, counts, DTL_INT8), INVALID, "dtl_all_gatherv", "recv=NULL");
  EXPECT_FAIL(dtl_reduce_scatter(comm, NULL, rbuf, 1, DTL_FLOAT64, DTL_MAX), INVALID, "dtl_reduce_scatter", "send=NULL");
  EXPECT_FAIL(dtl_reduce_scatterv(comm, sbuf, NULL, counts, DTL_FLOAT64, DTL_MAX), INVALID, "dtl_reduce_scatterv",
              "recv=NULL");
  EXPECT_FAIL(dtl_all_to_all(comm, NULL, rbuf, 1, DTL_UINT8), INVALID, "dtl_all_to_all", "send=NULL");
  EXPECT_FAIL(dtl_all_to_allv(comm, sbuf, counts, NULL, counts, DTL_UINT8), INVALID, "dtl_all_to_allv", "recv=NULL");
  EXPECT_FAIL(dtl_reduce(comm, NULL, rbuf, 1, DTL_INT64, DTL_SUM, 0), INVALID, "dtl_reduce", "send=NULL");
  EXPECT_FAIL(dtl_gather(comm, NULL, rbuf, 1, DTL_INT64, 0), INVALID, "dtl_gather", "send=NULL");
  EXPECT_FAIL(dtl_scatter(comm, sbuf, NULL, 1, DTL_INT64, 0), INVALID, "dtl_scatter", "recv=NULL");
  /* Root-only buffers are checked on the root; on a one-rank communicator every rank is the root. */
  EXPECT_FAIL(dtl_scatter(self, NULL, rbuf, 2, DTL_FLOAT16, 0), INVALID, "dtl_scatter", "send=NULL");
  EXPECT_FAIL(dtl_gather(self, sbuf, NULL, 2, DTL_FLOAT16, 0), INVALID, "dtl_gather", "recv=NULL");
  EXPECT_FAIL(dtl_reduce(self, sbuf, NULL, 2, DTL_BFLOAT16, DTL_MIN, 0), INVALID, "dtl_reduce", "recv=NULL");
}

static void null_count_arrays_are_rejected_and_named(void) {
  for (int r = 0; r < size; r++) counts[r] = 1;
  EXPECT_FAIL(dtl_all_gatherv(comm, sbuf, 1, rbuf, NULL, DTL_FLOAT32), INVALID, "dtl_all_gatherv", "recv_counts=NULL");
  EXPECT_FAIL(dtl_reduce_scatterv(comm, sbuf, rbuf, NULL, DTL_FLOAT32, DTL_SUM), INVALID, "dtl_reduce_scatterv",
              "recv_counts=NULL");
  EXPECT_FAIL(dtl_all_to_allv(comm, sbuf, NULL, rbuf, counts, DTL_FLOAT32), INVALID, "dtl_all_to_allv",
              "send_counts=NULL");
  EXPECT_FAIL(dtl_all_to_allv(comm, sbuf, counts, rbuf, NULL, DTL_FLOAT32), INVALID, "dtl_all_to_allv",
              "recv_counts=NULL");
  dtl_request *req = NULL;
  EXPECT_FAIL(dtl_all_to_allv_async(comm, sbuf, NULL, rbuf, counts, DTL_FLOAT32, &req), INVALID,
              "dtl_all_to_allv_async", "send_counts=NULL");
}

static void count_overflow_is_rejected_with_the_count(void) {
  char max[32];
  snprintf(max, sizeof max, "%zu", SIZE_MAX);
  char half[32];
  snprintf(half, sizeof half, "%zu", SIZE_MAX / 2 + 1);
  EXPECT_FAIL(dtl_broadcast(comm, sbuf, SIZE_MAX, DTL_FLOAT32, 0), INVALID, "dtl_broadcast", "count=", max, "overflow");
  EXPECT_FAIL(dtl_all_reduce(comm, sbuf, rbuf, SIZE_MAX / 2, DTL_FLOAT32, DTL_SUM), INVALID, "dtl_all_reduce",
              "count=");
  EXPECT_FAIL(dtl_all_gather(comm, sbuf, rbuf, SIZE_MAX / 2 + 1, DTL_INT32), INVALID, "dtl_all_gather", "send_count=",
              half);
  EXPECT_FAIL(dtl_all_to_all(comm, sbuf, rbuf, SIZE_MAX / 2 + 1, DTL_INT32), INVALID, "dtl_all_to_all",
              "count_per_peer=", half);
  if (size > 1)
    EXPECT_FAIL(dtl_send(comm, sbuf, SIZE_MAX / 4, DTL_INT64, (rank + 1) % size), INVALID, "dtl_send", "count=");
  /* Counts whose sum overflows size_t. */
  for (int r = 0; r < size; r++) counts[r] = SIZE_MAX / 2 + 1;
  if (size > 1) {
    EXPECT_FAIL(dtl_all_gatherv(comm, sbuf, counts[rank], rbuf, counts, DTL_UINT8), INVALID, "dtl_all_gatherv",
                "recv_counts[1]=", half);
    EXPECT_FAIL(dtl_reduce_scatterv(comm, sbuf, rbuf, counts, DTL_UINT8, DTL_SUM), INVALID, "dtl_reduce_scatterv",
                "recv_counts[1]=");
    EXPECT_FAIL(dtl_all_to_allv(comm, sbuf, counts, rbuf, counts, DTL_UINT8), INVALID, "dtl_all_to_allv",
                "send_counts[1]=");
  }
}

static void root_and_peer_out_of_range_are_rejected_with_the_valid_range(void) {
  char range[32];
  snprintf(range, sizeof range, "0..%d", size - 1);
  EXPECT_FAIL(dtl_broadcast(comm, sbuf, 1, DTL_FLOAT32, -1), INVALID, "dtl_broadcast", "root=-1", range);
  EXPECT_FAIL(dtl_broadcast(comm, sbuf, 1, DTL_FLOAT32, size), INVALID, "dtl_broadcast", "root=", num(size), range);
  EXPECT_FAIL(dtl_scatter(comm, sbuf, rbuf, 1, DTL_FLOAT32, size), INVALID, "dtl_scatter", "root=", num(size));
  EXPECT_FAIL(dtl_gather(comm, sbuf, rbuf, 1, DTL_FLOAT32, INT_MIN), INVALID, "dtl_gather", "root=", num(INT_MIN));
  EXPECT_FAIL(dtl_reduce(comm, sbuf, rbuf, 1, DTL_FLOAT32, DTL_SUM, size + 7), INVALID, "dtl_reduce", "root=",
              num(size + 7));
  EXPECT_FAIL(dtl_send(comm, sbuf, 1, DTL_FLOAT32, size), INVALID, "dtl_send", "peer=", num(size), range);
  EXPECT_FAIL(dtl_recv(comm, rbuf, 1, DTL_FLOAT32, -2), INVALID, "dtl_recv", "peer=-2", range);
  /* A blocking message to oneself can deadlock: refused before MPI sees it. */
  char me[32];
  snprintf(me, sizeof me, "peer=%d is this rank", rank);
  EXPECT_FAIL(dtl_send(comm, sbuf, 1, DTL_FLOAT32, rank), DTL_ERR_UNSUPPORTED, "dtl_send", me);
  EXPECT_FAIL(dtl_recv(comm, rbuf, 1, DTL_FLOAT32, rank), DTL_ERR_UNSUPPORTED, "dtl_recv", me);
}

static void invalid_dtype_and_op_enums_are_rejected_with_their_value(void) {
  EXPECT_FAIL(dtl_all_reduce(comm, sbuf, rbuf, 1, (dtl_dtype)99, DTL_SUM), INVALID, "dtl_all_reduce", "dtype=99");
  EXPECT_FAIL(dtl_broadcast(comm, sbuf, 1, (dtl_dtype)-1, 0), INVALID, "dtl_broadcast", "dtype=-1");
  EXPECT_FAIL(dtl_all_to_all(comm, sbuf, rbuf, 1, (dtl_dtype)DTL_NUM_DTYPES), INVALID, "dtl_all_to_all",
              "dtype=", num(DTL_NUM_DTYPES));
  EXPECT_FAIL(dtl_all_reduce(comm, sbuf, rbuf, 1, DTL_FLOAT32, (dtl_reduce_op)5), INVALID, "dtl_all_reduce", "op=5");
  EXPECT_FAIL(dtl_reduce(comm, sbuf, rbuf, 1, DTL_INT32, (dtl_reduce_op)-3, 0), INVALID, "dtl_reduce", "op=-3");
  EXPECT_FAIL(dtl_reduce_scatter(comm, sbuf, rbuf, 1, DTL_INT32, (dtl_reduce_op)42), INVALID, "dtl_reduce_scatter",
              "op=42");
  for (int r = 0; r < size; r++) counts[r] = 1;
  EXPECT_FAIL(dtl_reduce_scatterv(comm, sbuf, rbuf, counts, DTL_INT32, (dtl_reduce_op)9), INVALID,
              "dtl_reduce_scatterv", "op=9");
}

/* Counts beyond INT_MAX move in pieces (tests/comm/test_large_counts.c), except in all_to_allv with the MPI call
 * forced (DTL_ALGO=all_to_allv:mpi): its counts differ by rank, so it cannot switch to pieces, and it refuses
 * them, naming the argument, before anything is read or written (here every rank's counts are large alike). */
static void forced_mpi_all_to_allv_refuses_counts_beyond_int_max(void) {
  void *span = mmap(NULL, 2 * HUGE_SPAN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (span == MAP_FAILED) {
    if (rank == 0) printf("# skipped: cannot reserve %zu bytes of address space\n", 2 * HUGE_SPAN);
    return;
  }
  setenv("DTL_ALGO", "all_to_allv:mpi", 1);
  dtl_comm *forced = NULL;
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &forced));
  unsetenv("DTL_ALGO");
  hsend = span;
  hrecv = hsend + HUGE_SPAN;
  size_t big = (size_t)INT_MAX + 1;
  for (int r = 0; r < size; r++) counts[r] = r == size - 1 ? big : 1;
  char named[48];
  snprintf(named, sizeof named, "send_counts[%d]=%zu", size - 1, big);
  EXPECT_FAIL(dtl_all_to_allv(forced, hsend, counts, hrecv, counts, DTL_UINT8), DTL_ERR_UNSUPPORTED, "dtl_all_to_allv",
              named, "all_to_allv:direct");
  dtl_request *req = NULL;
  EXPECT_FAIL(dtl_all_to_allv_async(forced, hsend, counts, hrecv, counts, DTL_UINT8, &req), DTL_ERR_UNSUPPORTED,
              "dtl_all_to_allv_async", named);
  CHECK(req == NULL, "a failed start stored a request");
  if (size >= 3) { /* counts that fit but a displacement that does not */
    for (int r = 0; r < size; r++) counts[r] = r < 2 ? (size_t)INT_MAX : 0;
    EXPECT_FAIL(dtl_all_to_allv(forced, hsend, counts, hrecv, counts, DTL_UINT8), DTL_ERR_UNSUPPORTED, "dtl_all_to_allv",
                "send_counts[2]=0", "offset 4294967294");
  }
  hsend = hrecv = NULL;
  munmap(span, 2 * HUGE_SPAN);
  dtl_comm_destroy(forced);
}

static void overlapping_buffers_outside_the_in_place_form_are_rejected(void) {
  for (int r = 0; r < size; r++) counts[r] = 2, counts2[r] = r == 0 ? 3 : 1;
  EXPECT_FAIL(dtl_all_reduce(comm, sbuf, sbuf + 4, 4, DTL_FLOAT32, DTL_SUM), INVALID, "dtl_all_reduce", "overlap",
              "send == recv");
  EXPECT_FAIL(dtl_all_gather(comm, sbuf + 1, sbuf, 4, DTL_UINT8), INVALID, "dtl_all_gather", "overlap",
              "send == recv + rank*send_count");
  EXPECT_FAIL(dtl_reduce_scatter(comm, sbuf, sbuf + 1, 4, DTL_UINT8, DTL_SUM), INVALID, "dtl_reduce_scatter", "overlap",
              "recv == send + rank*recv_count");
  EXPECT_FAIL(dtl_all_to_all(comm, sbuf, sbuf + 2, 4, DTL_UINT8), INVALID, "dtl_all_to_all", "overlap");
  EXPECT_FAIL(dtl_all_gatherv(comm, sbuf + 1, 2, sbuf, counts, DTL_UINT8), INVALID, "dtl_all_gatherv", "overlap");
  EXPECT_FAIL(dtl_reduce_scatterv(comm, sbuf, sbuf + 1, counts, DTL_UINT8, DTL_SUM), INVALID, "dtl_reduce_scatterv",
              "overlap");
  EXPECT_FAIL(dtl_reduce(self, sbuf, sbuf + 1, 4, DTL_UINT8, DTL_SUM, 0), INVALID, "dtl_reduce", "overlap");
  EXPECT_FAIL(dtl_gather(self, sbuf + 1, sbuf, 4, DTL_UINT8, 0), INVALID, "dtl_gather", "overlap");
  EXPECT_FAIL(dtl_scatter(self, sbuf, sbuf + 1, 4, DTL_UINT8, 0), INVALID, "dtl_scatter", "overlap");
  /* In place all-to-all-v needs the same counts both ways. */
  EXPECT_FAIL(dtl_all_to_allv(comm, sbuf, counts, sbuf, counts2, DTL_UINT8), INVALID, "dtl_all_to_allv", "in place",
              "send_counts[0]=2", "recv_counts[0]=3");
}

static void all_gatherv_send_count_must_match_its_own_entry(void) {
  for (int r = 0; r < size; r++) counts[r] = 2;
  char want[48];
  snprintf(want, sizeof want, "expected recv_counts[%d]=2", rank);
  EXPECT_FAIL(dtl_all_gatherv(comm, sbuf, 3, rbuf, counts, DTL_INT32), INVALID, "dtl_all_gatherv", "send_count=3", want);
}

static void nonblocking_calls_check_their_request_arguments(void) {
  EXPECT_FAIL(dtl_all_reduce_async(comm, sbuf, rbuf, 1, DTL_FLOAT32, DTL_SUM, NULL), INVALID, "dtl_all_reduce_async",
              "req=NULL");
  dtl_request *req = NULL;
  EXPECT_FAIL(dtl_reduce_scatter_async(comm, sbuf, rbuf, 1, DTL_FLOAT32, (dtl_reduce_op)8, &req), INVALID,
              "dtl_reduce_scatter_async", "op=8");
  EXPECT_FAIL(dtl_all_to_all_async(comm, NULL, rbuf, 1, DTL_FLOAT32, &req), INVALID, "dtl_all_to_all_async",
              "send=NULL");
  CHECK(req == NULL, "a failed start stored a request");
  EXPECT_FAIL(dtl_wait(NULL), INVALID, "dtl_wait", "req=NULL");
  int done = 7;
  EXPECT_FAIL(dtl_test(NULL, &done), INVALID, "dtl_test", "req=NULL");
  CHECK(done == 7, "dtl_test wrote done although it failed");
  /* A valid request with a NULL done pointer is rejected too, and the request still completes. */
  int one = 1, sum = 0;
  CHECK_OK(dtl_all_reduce_async(comm, &one, &sum, 1, DTL_INT32, DTL_SUM, &req));
  EXPECT_FAIL(dtl_test(req, NULL), INVALID, "dtl_test", "done=NULL");
  CHECK_OK(dtl_wait(req));
  CHECK(sum == size, "async sum %d (expected %d)", sum, size);
}

/* MPI_ERRORS_RETURN is in force: an MPI failure comes back as DTL_ERR_COMM instead of aborting the job. */
static void engine_errors_return_as_status_not_abort(void) {
  if (size < 2) return;
  int32_t out[4] = {1, 2, 3, 4}, in[4] = {0};
  if (rank == 0) {
    CHECK_OK(dtl_send(comm, out, 4, DTL_INT32, 1));
    CHECK_OK(dtl_send(comm, out, 2, DTL_INT32, 1));
  } else if (rank == 1) {
    dtl_status st = dtl_recv(comm, in, 2, DTL_INT32, 0); /* 4 sent, room for 2: MPI_ERR_TRUNCATE */
    CHECK(st == DTL_ERR_COMM, "truncated recv -> %s (expected DTL_ERR_COMM): %s", dtl_status_name(st), dtl_last_error());
    CHECK(strstr(dtl_last_error(), "dtl_recv: MPI error") != NULL, "message \"%s\"", dtl_last_error());
    st = dtl_recv(comm, in, 4, DTL_INT32, 0); /* 2 sent, 4 expected */
    CHECK(st == DTL_ERR_MISMATCH, "short recv -> %s (expected DTL_ERR_MISMATCH)", dtl_status_name(st));
    CHECK(strstr(dtl_last_error(), "count=4 but peer 0 sent 2") != NULL, "message \"%s\"", dtl_last_error());
  }
  CHECK_OK(dtl_barrier(comm));
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  if (dt_size > 64) return dt_skip("the count tables hold at most 64 ranks");
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &comm));
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_SELF, &self));
  rank = dtl_comm_rank(comm);
  size = dtl_comm_size(comm);
  RUN(null_communicator_is_rejected_by_every_call);
  RUN(null_buffer_with_elements_is_rejected_and_named);
  RUN(null_count_arrays_are_rejected_and_named);
  RUN(count_overflow_is_rejected_with_the_count);
  RUN(root_and_peer_out_of_range_are_rejected_with_the_valid_range);
  RUN(invalid_dtype_and_op_enums_are_rejected_with_their_value);
  RUN(forced_mpi_all_to_allv_refuses_counts_beyond_int_max);
  RUN(overlapping_buffers_outside_the_in_place_form_are_rejected);
  RUN(all_gatherv_send_count_must_match_its_own_entry);
  RUN(nonblocking_calls_check_their_request_arguments);
  RUN(engine_errors_return_as_status_not_abort);
  dtl_comm_destroy(self);
  dtl_comm_destroy(comm);
  return dt_finish();
}

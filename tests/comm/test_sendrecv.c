/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_sendrecv and dtl_sendrecv_async on the MPI transport: ring shifts in both directions at every world
 * size (a ring of one is a local copy), every dtype, zero and uneven counts; messages to oneself; meeting
 * dtl_send/dtl_recv on the other side; the count rules (fewer elements than recv_count is DTL_ERR_MISMATCH,
 * more is DTL_ERR_COMM); bad input named in the message and writing nothing; the nonblocking form
 * overlapping local work and completing in dtl_wait. Each rank builds the bytes every rank sends from one
 * generator, so received blocks are checked exactly, and receive buffers start as a sentinel with a guard
 * tail, so short or long writes show. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "dtl_test.h"

static dtl_comm *comm;
static int rank, size;

static const dtl_dtype kTypes[] = {DTL_FLOAT32, DTL_FLOAT64, DTL_FLOAT16, DTL_BFLOAT16,
                                   DTL_INT8,    DTL_UINT8,   DTL_INT32,   DTL_INT64};
#define NTYPES (sizeof kTypes / sizeof kTypes[0])
#define SENTINEL 0x5a
#define GUARD 16 /* sentinel bytes after every receive buffer */

/* Byte b of element i of what rank r sends under salt: transports move bytes, so one pattern serves every
 * dtype. */
static unsigned char pattern(int r, size_t i, size_t b, int salt) {
  return (unsigned char)((unsigned)(r * 131 + salt * 17) + (unsigned)(i * 7 + b * 29) % 251u);
}

static void *block_of(int r, size_t n, dtl_dtype t, int salt) {
  size_t es = dtl_dtype_size(t);
  unsigned char *p = malloc(n * es + 1);
  for (size_t i = 0; i < n; i++)
    for (size_t b = 0; b < es; b++) p[i * es + b] = pattern(r, i, b, salt);
  return p;
}

static void *sentinel_buf(size_t n, dtl_dtype t) {
  size_t bytes = n * dtl_dtype_size(t) + GUARD;
  void *p = malloc(bytes);
  memset(p, SENTINEL, bytes);
  return p;
}

static bool untouched(const void *buf, size_t from, size_t to) {
  for (size_t i = from; i < to; i++)
    if (((const unsigned char *)buf)[i] != SENTINEL) return false;
  return true;
}

/* buf holds rank r's n elements of salt and nothing past them. */
static void expect_block(const void *buf, int r, size_t n, dtl_dtype t, int salt, const char *what) {
  size_t es = dtl_dtype_size(t);
  const unsigned char *p = buf;
  for (size_t i = 0; i < n * es; i++)
    if (p[i] != pattern(r, i / es, i % es, salt)) {
      CHECK(false, "%s %s n=%zu: byte %zu is %u (expected rank %d's %u)", what, dtl_dtype_name(t), n, i, p[i], r,
            pattern(r, i / es, i % es, salt));
      return;
    }
  CHECK(untouched(buf, n * es, n * es + GUARD), "%s %s n=%zu: written past the %zu elements", what,
        dtl_dtype_name(t), n, n);
}

/* Elements rank r sends in the uneven rounds: zero for some ranks, different for the others. */
static size_t uneven(int r, int round) { return (size_t)((r * 5 + round) % 4) * 3; }

/* ---------------------------------------------------------------------------------------------------------- */
static void ring_shift_moves_each_block_to_the_next_rank_for_every_dtype_and_count(void) {
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const size_t fixed[] = {0, 1, 7, 25000};
  for (size_t ti = 0; ti < NTYPES; ti++)
    for (int k = 0; k < 7; k++) {
      dtl_dtype t = kTypes[ti];
      /* rounds 0..3: every rank the same count; 4..6: uneven counts, zeros included */
      size_t mine = k < 4 ? fixed[k] : uneven(rank, k), theirs = k < 4 ? fixed[k] : uneven(prev, k);
      void *out = block_of(rank, mine, t, k), *in = sentinel_buf(theirs, t);
      CHECK_OK(dtl_sendrecv(comm, out, mine, next, in, theirs, prev, t));
      expect_block(in, prev, theirs, t, k, "ring to next");
      free(in);
      /* the other direction: receive from the next rank what it sends to its previous one */
      size_t back = k < 4 ? fixed[k] : uneven(next, k);
      in = sentinel_buf(back, t);
      CHECK_OK(dtl_sendrecv(comm, out, mine, prev, in, back, next, t));
      expect_block(in, next, back, t, k, "ring to previous");
      free(out);
      free(in);
    }
}

static void a_message_to_oneself_is_a_local_copy_at_every_world_size(void) {
  for (size_t ti = 0; ti < NTYPES; ti++) {
    dtl_dtype t = kTypes[ti];
    void *out = block_of(rank, 3000, t, 40), *in = sentinel_buf(3000, t);
    CHECK_OK(dtl_sendrecv(comm, out, 3000, rank, in, 3000, rank, t));
    expect_block(in, rank, 3000, t, 40, "to oneself");
    free(out);
    free(in);
  }
  CHECK_OK(dtl_sendrecv(comm, NULL, 0, rank, NULL, 0, rank, DTL_INT8));
}

/* A sendrecv message is an ordinary message: rank 1 answers rank 0's dtl_sendrecv with dtl_recv, then dtl_send. */
static void sendrecv_messages_meet_dtl_send_and_dtl_recv(void) {
  if (size < 2 || rank > 1) return;
  const size_t n = 5000;
  void *out = block_of(rank, n, DTL_INT32, 41), *in = sentinel_buf(n, DTL_INT32);
  if (rank == 0) {
    CHECK_OK(dtl_sendrecv(comm, out, n, 1, in, n, 1, DTL_INT32));
  } else {
    CHECK_OK(dtl_recv(comm, in, n, DTL_INT32, 0));
    CHECK_OK(dtl_send(comm, out, n, DTL_INT32, 0));
  }
  expect_block(in, 1 - rank, n, DTL_INT32, 41, "send/recv peer");
  free(out);
  free(in);
}

/* Fewer elements than recv_count: DTL_ERR_MISMATCH; more: DTL_ERR_COMM (MPI's truncation). To oneself the
 * same statuses come from the argument check, before anything is copied. */
static void fewer_elements_than_recv_count_is_a_mismatch_and_more_is_a_comm_error(void) {
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const size_t n = 6;
  void *out = block_of(rank, n, DTL_FLOAT32, 42), *in = sentinel_buf(n + 1, DTL_FLOAT32);
  CHECK_ERROR(dtl_sendrecv(comm, out, n, next, in, n + 1, prev, DTL_FLOAT32), DTL_ERR_MISMATCH, "recv_count=7");
  if (size == 1) CHECK(untouched(in, 0, (n + 1) * 4 + GUARD), "a failed message to oneself wrote its recv buffer");
  CHECK_STATUS(dtl_sendrecv(comm, out, n, next, in, n - 1, prev, DTL_FLOAT32), DTL_ERR_COMM);
  CHECK_OK(dtl_sendrecv(comm, out, n, next, in, n, prev, DTL_FLOAT32)); /* the communicator still works */
  expect_block(in, prev, n, DTL_FLOAT32, 42, "after the count errors");
  free(out);
  free(in);
}

static void bad_input_is_rejected_naming_the_argument_and_writes_nothing(void) {
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  char big[64];
  snprintf(big, sizeof big, "dest=%d", size);
  float out[8] = {1, 2, 3, 4, 5, 6, 7, 8}, *in = sentinel_buf(8, DTL_FLOAT32);
  dtl_request *req = NULL;
  const dtl_status bad = DTL_ERR_INVALID_ARGUMENT;
  CHECK_ERROR(dtl_sendrecv(NULL, out, 4, next, in, 4, prev, DTL_FLOAT32), bad, "comm=NULL");
  CHECK_ERROR(dtl_sendrecv(comm, NULL, 4, next, in, 4, prev, DTL_FLOAT32), bad, "send=NULL");
  CHECK_ERROR(dtl_sendrecv(comm, out, 4, next, NULL, 4, prev, DTL_FLOAT32), bad, "recv=NULL");
  CHECK_ERROR(dtl_sendrecv(comm, out, 4, size, in, 4, prev, DTL_FLOAT32), bad, big);
  CHECK_ERROR(dtl_sendrecv(comm, out, 4, -1, in, 4, prev, DTL_FLOAT32), bad, "dest=-1");
  CHECK_ERROR(dtl_sendrecv(comm, out, 4, next, in, 4, -3, DTL_FLOAT32), bad, "source=-3");
  CHECK_ERROR(dtl_sendrecv(comm, out, 4, next, in, 4, prev, (dtl_dtype)99), bad, "dtype=99");
  CHECK_ERROR(dtl_sendrecv(comm, in, 4, next, in + 2, 4, prev, DTL_FLOAT32), bad, "overlap");
  CHECK_ERROR(dtl_sendrecv(comm, out, 4, rank, in, 3, rank, DTL_FLOAT32), DTL_ERR_COMM, "send_count=4");
  CHECK_ERROR(dtl_sendrecv(comm, out, 3, rank, in, 4, rank, DTL_FLOAT32), DTL_ERR_MISMATCH, "recv_count=4");
  if (size > 1) { /* a message to oneself must be received by the same call */
    CHECK_ERROR(dtl_sendrecv(comm, out, 4, rank, in, 4, prev, DTL_FLOAT32), bad, "both or neither");
    CHECK_ERROR(dtl_sendrecv(comm, out, 4, next, in, 4, rank, DTL_FLOAT32), bad, "source=");
  }
  CHECK_ERROR(dtl_sendrecv_async(comm, out, 4, next, in, 4, prev, DTL_FLOAT32, NULL), bad, "req=NULL");
  CHECK_ERROR(dtl_sendrecv_async(comm, out, 4, next, in, 4, size + 1, DTL_FLOAT32, &req), bad, "source=");
  CHECK(req == NULL, "a failed dtl_sendrecv_async stored a request");
  CHECK(untouched(in, 0, 8 * 4 + GUARD), "a rejected call wrote its recv buffer");
  CHECK_OK(dtl_sendrecv(comm, NULL, 0, next, NULL, 0, prev, DTL_FLOAT32)); /* empty buffers may be NULL */
  free(in);
}

/* Two shifts in flight (one each way) while the rank works on its own data, polled with dtl_test, then
 * waited for in the other order; one more shows a count mismatch reported by dtl_wait. */
static void async_sendrecv_overlaps_local_work_and_completes_in_wait(void) {
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const size_t n = 1 << 18; /* 1 MiB of f32: past the eager limit, so the transfer needs progress */
  void *out = block_of(rank, n, DTL_FLOAT32, 43), *to_next = sentinel_buf(n, DTL_FLOAT32);
  void *to_prev = sentinel_buf(n, DTL_FLOAT32);
  dtl_request *a = NULL, *b = NULL;
  CHECK_OK(dtl_sendrecv_async(comm, out, n, next, to_next, n, prev, DTL_FLOAT32, &a));
  CHECK_OK(dtl_sendrecv_async(comm, out, n, prev, to_prev, n, next, DTL_FLOAT32, &b));
  double work = 0; /* the local compute a ring step overlaps with the transfer */
  for (int step = 0, done = 0; step < 1000000 && !done; step++) {
    for (int i = 0; i < 1000; i++) work += (double)(i % 7) * 0.5;
    CHECK_OK(dtl_test(a, &done));
  }
  CHECK(work > 0, "the local work ran");
  CHECK_OK(dtl_wait(b));
  CHECK_OK(dtl_wait(a));
  expect_block(to_next, prev, n, DTL_FLOAT32, 43, "async ring to next");
  expect_block(to_prev, next, n, DTL_FLOAT32, 43, "async ring to previous");
  if (size == 1) { /* to oneself the count rule is an argument check */
    CHECK_ERROR(dtl_sendrecv_async(comm, out, 4, next, to_next, 5, prev, DTL_FLOAT32, &a), DTL_ERR_MISMATCH,
                "recv_count=5");
  } else {
    CHECK_OK(dtl_sendrecv_async(comm, out, 4, next, to_next, 5, prev, DTL_FLOAT32, &a));
    CHECK_ERROR(dtl_wait(a), DTL_ERR_MISMATCH, "recv_count=5");
  }
  free(out);
  free(to_next);
  free(to_prev);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  rank = dt_rank;
  size = dt_size;
  if (dtl_comm_from_mpi(MPI_COMM_WORLD, &comm) != DTL_OK) {
    fprintf(stderr, "dtl_comm_from_mpi: %s\n", dtl_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  RUN(ring_shift_moves_each_block_to_the_next_rank_for_every_dtype_and_count);
  RUN(a_message_to_oneself_is_a_local_copy_at_every_world_size);
  RUN(sendrecv_messages_meet_dtl_send_and_dtl_recv);
  RUN(fewer_elements_than_recv_count_is_a_mismatch_and_more_is_a_comm_error);
  RUN(bad_input_is_rejected_naming_the_argument_and_writes_nothing);
  RUN(async_sendrecv_overlaps_local_work_and_completes_in_wait);
  dtl_comm_destroy(comm);
  return dt_finish();
}

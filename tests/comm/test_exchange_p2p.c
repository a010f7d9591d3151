/* SPDX-License-Identifier: Apache-2.0 */
/* The transports' optional sparse exchange (point-to-point messages with listed peers), called through the
 * vtable on MPI. Every rank derives the whole message pattern from one seed, so each one knows what it must
 * receive; ranks with nothing to move make no call at all; two exchanges in a row between the same ranks
 * match in order; a dtl_send posted between them never matches an exchange message; the nonblocking form
 * completes in dtl_wait (and dtl_test reports it). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "comm/backend.h"
#include "dtl_test.h"

static dtl_comm *comm;
static int rank, size;

#define MAXP 16

static uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

/* counts[s][r]: elements from s to r (0: no message; never to oneself); value of element i of that message. */
typedef struct {
  size_t counts[MAXP][MAXP];
} pattern;

static pattern make_pattern(uint64_t seed) {
  pattern p;
  memset(&p, 0, sizeof p);
  for (int s = 0; s < size; s++)
    for (int r = 0; r < size; r++)
      if (s != r && mix(seed, (uint64_t)(s * MAXP + r)) % 3 == 0) p.counts[s][r] = 1 + mix(seed + 1, (uint64_t)(s * MAXP + r)) % 300;
  return p;
}

static int32_t value(uint64_t seed, int s, int r, size_t i) { return (int32_t)(mix(seed, (uint64_t)(s * MAXP + r) * 100003u + i) & 0x7fffffff); }

/* Runs pattern seed on every rank that moves something; checks what arrived. async: the nonblocking form. */
static void run_pattern(uint64_t seed, bool async) {
  pattern p = make_pattern(seed);
  int sp[MAXP], rp[MAXP], ns = 0, nr = 0;
  const void *sb[MAXP];
  void *rb[MAXP];
  size_t sc[MAXP], rc[MAXP];
  for (int r = 0; r < size; r++)
    if (p.counts[rank][r]) {
      int32_t *b = malloc(p.counts[rank][r] * sizeof *b);
      for (size_t i = 0; i < p.counts[rank][r]; i++) b[i] = value(seed, rank, r, i);
      sp[ns] = r, sb[ns] = b, sc[ns++] = p.counts[rank][r];
    }
  for (int s = 0; s < size; s++)
    if (p.counts[s][rank]) {
      rp[nr] = s, rb[nr] = calloc(p.counts[s][rank], sizeof(int32_t)), rc[nr++] = p.counts[s][rank];
    }
  if (ns || nr) { /* a rank with nothing to move stays out */
    if (async) {
      dtl_request *req = NULL;
      dtl_status st = comm->ops->exchange(comm, ns, sp, sb, sc, nr, rp, rb, rc, DTL_INT32, &req);
      CHECK(st == DTL_OK, "start: %s", dtl_last_error());
      if (st == DTL_OK) {
        int done = 0;
        CHECK(dtl_test(req, &done) == DTL_OK, "test: %s", dtl_last_error());
        CHECK(dtl_wait(req) == DTL_OK, "wait: %s", dtl_last_error());
      }
    } else {
      CHECK(comm->ops->exchange(comm, ns, sp, sb, sc, nr, rp, rb, rc, DTL_INT32, NULL) == DTL_OK, "%s",
            dtl_last_error());
    }
  }
  for (int k = 0; k < nr; k++) {
    long wrong = 0;
    for (size_t i = 0; i < rc[k]; i++) wrong += ((int32_t *)rb[k])[i] != value(seed, rp[k], rank, i);
    CHECK(wrong == 0, "seed %llu: %ld wrong elements from rank %d", (unsigned long long)seed, wrong, rp[k]);
    free(rb[k]);
  }
  for (int k = 0; k < ns; k++) free((void *)sb[k]);
}

static void the_mpi_transport_offers_the_exchange(void) { CHECK(comm->ops->exchange != NULL, "no exchange entry"); }

static void random_sparse_patterns_arrive_and_idle_ranks_make_no_call(void) {
  for (uint64_t seed = 1; seed <= 20; seed++) run_pattern(seed, seed % 2 == 0);
}

/* Two exchanges back to back between the same ranks, with a dtl_send of another value in between: every
 * message lands in its own exchange (posting order), and the plain message in the plain receive. */
static void messages_match_in_order_and_never_with_plain_sends(void) {
  if (size < 2) return;
  int peer = rank ^ 1;
  if (peer >= size) return;
  int32_t a = 100 + rank, b = 200 + rank, plain = 300 + rank, ga = 0, gb = 0, gplain = 0;
  const void *sa[1] = {&a}, *sb1[1] = {&b};
  void *ra[1] = {&ga}, *rb1[1] = {&gb};
  size_t one[1] = {1};
  int pp[1] = {peer};
  dtl_request *r1 = NULL, *r2 = NULL;
  CHECK(comm->ops->exchange(comm, 1, pp, sa, one, 1, pp, ra, one, DTL_INT32, &r1) == DTL_OK, "%s", dtl_last_error());
  if (rank % 2 == 0) {
    CHECK(dtl_send(comm, &plain, 1, DTL_INT32, peer) == DTL_OK, "%s", dtl_last_error());
  } else {
    CHECK(dtl_recv(comm, &gplain, 1, DTL_INT32, peer) == DTL_OK, "%s", dtl_last_error());
    CHECK(gplain == 300 + peer, "the plain receive got %d", gplain);
  }
  CHECK(comm->ops->exchange(comm, 1, pp, sb1, one, 1, pp, rb1, one, DTL_INT32, &r2) == DTL_OK, "%s", dtl_last_error());
  CHECK(dtl_wait(r2) == DTL_OK, "%s", dtl_last_error());
  CHECK(dtl_wait(r1) == DTL_OK, "%s", dtl_last_error());
  CHECK(ga == 100 + peer && gb == 200 + peer, "first exchange got %d, second %d", ga, gb);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  rank = dt_rank;
  size = dt_size;
  if (size > MAXP) return dt_skip("the test's tables hold at most 16 ranks (MAXP)");
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &comm));
  RUN(the_mpi_transport_offers_the_exchange);
  if (comm->ops->exchange) {
    RUN(random_sparse_patterns_arrive_and_idle_ranks_make_no_call);
    RUN(messages_match_in_order_and_never_with_plain_sends);
  }
  dtl_comm_destroy(comm);
  return dt_finish();
}

/* SPDX-License-Identifier: Apache-2.0 */
/* all_to_allv_displs, the MPI transport's optional all-to-all at explicit displacements, called through the
 * vtable. Every rank derives every rank's counts and displacements from one seeded generator, and every
 * element's value from its sender and its position in the sender's buffer, so each rank computes what it must
 * receive on its own. Receive buffers start as a sentinel: gaps between blocks and skipped blocks must keep it. */
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "comm/backend.h"
#include "comm/mpi_algo.h"
#include "dtl_test.h"

/* The communicator under test: dtl's direct exchange (the default), the MPI call (DTL_ALGO forcing it), and the
 * direct exchange in pieces of at most 3 elements (the path of counts beyond INT_MAX, on small buffers). */
static dtl_comm *comm, *direct, *forced_mpi, *pieces;
static int rank, size;

#define SENTINEL 0x5a
#define MAXP 16

/* f16 and bf16 travel as 2-byte words; one dtype of every element size. */
static const dtl_dtype dtypes[] = {DTL_FLOAT32, DTL_FLOAT64, DTL_FLOAT16, DTL_BFLOAT16, DTL_INT8, DTL_INT64};
#define NDTYPES 6

static uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

/* The bytes of element i of sender s's send buffer: any bit pattern moves unchanged, so they are hashed. */
static void element(int s, size_t i, size_t es, unsigned char *out) {
  uint64_t h = mix((uint64_t)s + 1, i);
  for (size_t b = 0; b < es; b++) out[b] = (unsigned char)(h >> (8 * (b % 8)));
}

/* One exchange, known to every rank: counts[s][r] elements from s to r, taken from s's send buffer at
 * sd[s][r] and put at rd[r][s] in r's receive buffer; slen/rlen are the buffers' lengths in elements. */
typedef struct {
  size_t counts[MAXP][MAXP], sd[MAXP][MAXP], rd[MAXP][MAXP], slen[MAXP], rlen[MAXP];
} exchange;

/* Places blocks of the given counts in a random order with random gaps (shared: all at displacement 0, as one
 * block sent to every peer). Returns the buffer length. */
static size_t place(uint64_t seed, const size_t *cnt, bool shared, size_t *displ) {
  int order[MAXP];
  for (int k = 0; k < size; k++) order[k] = k;
  for (int k = size - 1; k > 0; k--) {
    int j = (int)(mix(seed, (uint64_t)k) % (uint64_t)(k + 1)), t = order[k];
    order[k] = order[j];
    order[j] = t;
  }
  size_t off = 0, len = 0;
  for (int q = 0; q < size; q++) {
    int k = order[q];
    displ[k] = shared ? 0 : off + mix(seed, 100u + (uint64_t)q) % 4;
    if (displ[k] + cnt[k] > len) len = displ[k] + cnt[k];
    off = len;
  }
  return len;
}

/* Random counts (a quarter of them empty) up to maxc; each sender's blocks shared or apart at random. */
static void random_exchange(uint64_t seed, size_t maxc, exchange *x) {
  for (int s = 0; s < size; s++)
    for (int r = 0; r < size; r++) {
      uint64_t h = mix(seed, (uint64_t)(s * MAXP + r));
      x->counts[s][r] = h % 4 == 0 ? 0 : 1 + (h >> 8) % maxc;
    }
  for (int s = 0; s < size; s++) x->slen[s] = place(mix(seed, 1000u + (uint64_t)s), x->counts[s], mix(seed, 2000u + (uint64_t)s) % 3 == 0, x->sd[s]);
  for (int r = 0; r < size; r++) {
    size_t col[MAXP];
    for (int s = 0; s < size; s++) col[s] = x->counts[s][r];
    x->rlen[r] = place(mix(seed, 3000u + (uint64_t)r), col, false, x->rd[r]);
  }
}

/* Runs x on this rank and checks every byte of the receive buffer and that the send buffer is unchanged. */
static void run_and_check(const exchange *x, dtl_dtype t, const char *what) {
  size_t es = dtl_dtype_size(t), sl = x->slen[rank], rl = x->rlen[rank];
  unsigned char *send = malloc(sl * es + 1), *recv = malloc(rl * es + 1), *want = malloc(rl * es + 1);
  unsigned char *orig = malloc(sl * es + 1);
  for (size_t i = 0; i < sl; i++) element(rank, i, es, send + i * es);
  memcpy(orig, send, sl * es);
  memset(recv, SENTINEL, rl * es);
  memset(want, SENTINEL, rl * es);
  size_t sc[MAXP], sd[MAXP], rc[MAXP], rd[MAXP];
  for (int k = 0; k < size; k++) {
    sc[k] = x->counts[rank][k];
    sd[k] = x->sd[rank][k];
    rc[k] = x->counts[k][rank];
    rd[k] = x->rd[rank][k];
    for (size_t i = 0; i < rc[k]; i++) element(k, x->sd[k][rank] + i, es, want + (rd[k] + i) * es);
  }
  CHECK_OK(comm->ops->all_to_allv_displs(comm, send, sc, sd, recv, rc, rd, t));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < rl * es; i++)
    if (recv[i] != want[i] && bad++ == 0) first = i / es;
  CHECK(bad == 0, "%s, %s: %zu wrong bytes of %zu, first in element %zu", what, dtl_dtype_name(t), bad, rl * es, first);
  CHECK(memcmp(send, orig, sl * es) == 0, "%s, %s: the send buffer changed", what, dtl_dtype_name(t));
  free(send);
  free(recv);
  free(want);
  free(orig);
}

static void blocks_land_at_their_displacements_for_random_layouts(void) {
  for (int trial = 0; trial < 24; trial++) {
    exchange x;
    random_exchange(mix(42, (uint64_t)trial), trial % 3 == 2 ? 3000 : 7, &x);
    char what[32];
    snprintf(what, sizeof what, "trial %d", trial);
    run_and_check(&x, dtypes[trial % NDTYPES], what);
  }
}

static void all_empty_exchange_moves_nothing(void) {
  exchange x;
  memset(&x, 0, sizeof x);
  run_and_check(&x, DTL_FLOAT32, "all empty");
  size_t z[MAXP] = {0};
  CHECK_OK(comm->ops->all_to_allv_displs(comm, NULL, z, z, NULL, z, z, DTL_INT8));
}

/* How the executor gathers a strided shard: each rank sends its block of n_r elements from one place to every
 * peer but itself, and receives the others' blocks where a full gather would put them; its own block's place
 * keeps what was there. */
static void one_block_to_every_peer_but_self_leaves_the_own_place_alone(void) {
  exchange x;
  memset(&x, 0, sizeof x);
  size_t total = 0, at[MAXP];
  for (int s = 0; s < size; s++) {
    size_t n = 1 + (size_t)(s * 37 % 11) * 50; /* uneven */
    at[s] = total;
    total += n;
    for (int r = 0; r < size; r++) {
      x.counts[s][r] = r == s ? 0 : n;
      x.sd[s][r] = 0;
    }
    x.slen[s] = n;
  }
  for (int r = 0; r < size; r++) {
    x.rlen[r] = total;
    for (int s = 0; s < size; s++) x.rd[r][s] = at[s];
  }
  for (int i = 0; i < NDTYPES; i++) run_and_check(&x, dtypes[i], "gather but self");
}

/* MPI takes int counts and displacements. dtl's direct exchange (the default) moves larger ones in pieces
 * (tests/comm/test_large_counts.c); with the MPI call forced (DTL_ALGO=all_to_allv:mpi), a count or
 * displacement beyond INT_MAX is refused, naming the argument, before anything is read or written (the
 * buffers here are far smaller than the counts). */
static void with_mpi_forced_counts_or_displacements_beyond_int_max_are_unsupported(void) {
  comm = forced_mpi;
  unsigned char sbuf[16], rbuf[16];
  memset(sbuf, SENTINEL, sizeof sbuf);
  memset(rbuf, SENTINEL, sizeof rbuf);
  size_t one[MAXP], zero[MAXP], big[MAXP], big_displ[MAXP];
  for (int k = 0; k < size; k++) {
    one[k] = 1;
    zero[k] = 0;
    big[k] = k == size - 1 ? (size_t)INT_MAX + 1 : 1;
    big_displ[k] = k == size - 1 ? (size_t)INT_MAX + 1 : 0;
  }
  char named[64];
  dtl_status st = comm->ops->all_to_allv_displs(comm, sbuf, big, zero, rbuf, one, zero, DTL_UINT8);
  snprintf(named, sizeof named, "send_counts[%d]=%zu", size - 1, (size_t)INT_MAX + 1);
  CHECK(st == DTL_ERR_UNSUPPORTED && strstr(dtl_last_error(), named), "got %s: %s", dtl_status_name(st), dtl_last_error());
  st = comm->ops->all_to_allv_displs(comm, sbuf, one, zero, rbuf, one, big_displ, DTL_UINT8);
  snprintf(named, sizeof named, "recv_displs[%d]=%zu", size - 1, (size_t)INT_MAX + 1);
  CHECK(st == DTL_ERR_UNSUPPORTED && strstr(dtl_last_error(), named), "got %s: %s", dtl_status_name(st), dtl_last_error());
  bool untouched = true;
  for (size_t i = 0; i < sizeof sbuf; i++) untouched = untouched && sbuf[i] == SENTINEL && rbuf[i] == SENTINEL;
  CHECK(untouched, "a refused call wrote a buffer");
}

static void the_mpi_transport_offers_all_to_allv_displs(void) {
  CHECK(comm->ops->all_to_allv_displs != NULL, "the MPI transport offers no all_to_allv_displs");
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  rank = dt_rank;
  size = dt_size;
  if (size > MAXP) return dt_skip("the test's tables hold at most 16 ranks (MAXP)");
  setenv("DTL_ALGO", "all_to_allv:direct", 1);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &direct));
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &pieces));
  REQUIRE_OK(dtl__mpi_set_limit(pieces, 3));
  setenv("DTL_ALGO", "all_to_allv:mpi", 1);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &forced_mpi));
  unsetenv("DTL_ALGO");
  comm = direct;
  RUN(the_mpi_transport_offers_all_to_allv_displs);
  dtl_comm *const under_test[3] = {direct, forced_mpi, pieces};
  const char *const names[3] = {"direct", "mpi", "direct in pieces of 3"};
  for (int v = 0; v < 3 && comm->ops->all_to_allv_displs; v++) {
    char name[160];
    comm = under_test[v];
    snprintf(name, sizeof name, "blocks_land_at_their_displacements_for_random_layouts (%s)", names[v]);
    RUN_NAMED(name, blocks_land_at_their_displacements_for_random_layouts());
    snprintf(name, sizeof name, "all_empty_exchange_moves_nothing (%s)", names[v]);
    RUN_NAMED(name, all_empty_exchange_moves_nothing());
    snprintf(name, sizeof name, "one_block_to_every_peer_but_self_leaves_the_own_place_alone (%s)", names[v]);
    RUN_NAMED(name, one_block_to_every_peer_but_self_leaves_the_own_place_alone());
  }
  if (comm->ops->all_to_allv_displs) RUN(with_mpi_forced_counts_or_displacements_beyond_int_max_are_unsupported);
  dtl_comm_destroy(forced_mpi);
  dtl_comm_destroy(pieces);
  dtl_comm_destroy(direct);
  return dt_finish();
}

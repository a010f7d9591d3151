/* SPDX-License-Identifier: Apache-2.0 */
/* The MPI transport allocates nothing per call once warm: the v-collectives take their int counts from
 * arrays sized with the communicator, and nonblocking requests (with the count arrays MPI reads until they
 * complete) come back to a small pool of the communicator when waited for. Counted with the library's
 * allocation counter over 100 rounds after a warm-up one; every round's results are checked. More requests
 * in flight than the pool keeps still work (the surplus is allocated and freed). */
#include "dtl_test.h"
#include "common/alloc.h"

#define REPEAT 100

static dtl_comm *world;

/* Rank r contributes r + 1 elements (uneven, zero-free); block q of a gathered vector holds q + 1 copies of q. */
typedef struct {
  size_t counts[64], total;
  int32_t send[64], gathered[2100], mine[64], a2a_send[2100], a2a_recv[2100];
  size_t scounts[64], rcounts[64];
} bufs;

static void setup(bufs *b) {
  int p = dt_size, r = dt_rank;
  b->total = 0;
  for (int q = 0; q < p; q++) {
    b->counts[q] = (size_t)q + 1;
    b->total += b->counts[q];
    b->scounts[q] = (size_t)(q + r) % 3; /* all-to-all-v: rank r sends (q + r) % 3 elements to q */
    b->rcounts[q] = (size_t)(r + q) % 3;
  }
  for (int i = 0; i < r + 1; i++) b->send[i] = r;
  size_t o = 0;
  for (int q = 0; q < p; q++)
    for (size_t i = 0; i < b->scounts[q]; i++) b->a2a_send[o++] = 1000 * r + q;
}

static long check(const bufs *b, int with_rs) {
  long bad = 0;
  size_t o = 0;
  for (int q = 0; q < dt_size; q++)
    for (size_t i = 0; i < b->counts[q]; i++) bad += b->gathered[o++] != q;
  o = 0;
  for (int q = 0; q < dt_size; q++)
    for (size_t i = 0; i < b->rcounts[q]; i++) bad += b->a2a_recv[o++] != 1000 * q + dt_rank;
  /* reduce-scatterv of the gathered vector (the same on every rank): p copies of this rank's block */
  for (int i = 0; with_rs && i < dt_rank + 1; i++) bad += b->mine[i] != dt_size * dt_rank;
  return bad;
}

static void blocking_v_collectives_allocate_nothing_after_the_first(void) {
  static bufs b;
  setup(&b);
  for (int i = -1; i < REPEAT; i++) {
    if (i == 0) dtl__alloc_hook_reset(0, false);
    memset(b.gathered, 0x5a, sizeof b.gathered);
    CHECK_OK(dtl_all_gatherv(world, b.send, (size_t)dt_rank + 1, b.gathered, b.counts, DTL_INT32));
    CHECK_OK(dtl_reduce_scatterv(world, b.gathered, b.mine, b.counts, DTL_INT32, DTL_SUM));
    CHECK_OK(dtl_all_to_allv(world, b.a2a_send, b.scounts, b.a2a_recv, b.rcounts, DTL_INT32));
    if (i == -1 || i == REPEAT - 1) CHECK(check(&b, 1) == 0, "round %d: wrong values", i);
  }
  CHECK(dtl__alloc_hook_count() == 0, "%llu allocations in %d rounds", (unsigned long long)dtl__alloc_hook_count(),
        REPEAT);
}

static void nonblocking_requests_come_from_the_pool(void) {
  static bufs b;
  setup(&b);
  int32_t x[4] = {1, 2, 3, 4}, sum[4];
  for (int i = -1; i < REPEAT; i++) {
    if (i == 0) dtl__alloc_hook_reset(0, false);
    dtl_request *r[3] = {NULL, NULL, NULL};
    CHECK_OK(dtl_all_gatherv_async(world, b.send, (size_t)dt_rank + 1, b.gathered, b.counts, DTL_INT32, &r[0]));
    CHECK_OK(dtl_all_to_allv_async(world, b.a2a_send, b.scounts, b.a2a_recv, b.rcounts, DTL_INT32, &r[1]));
    CHECK_OK(dtl_all_reduce_async(world, x, sum, 4, DTL_INT32, DTL_SUM, &r[2]));
    for (int k = 0; k < 3; k++)
      if (r[k]) CHECK_OK(dtl_wait(r[k]));
    if (i == -1 || i == REPEAT - 1) {
      CHECK(check(&b, 0) == 0, "round %d: wrong values", i);
      CHECK(sum[3] == 4 * dt_size, "round %d: all-reduce %d", i, sum[3]);
    }
  }
  CHECK(dtl__alloc_hook_count() == 0, "%llu allocations in %d rounds", (unsigned long long)dtl__alloc_hook_count(),
        REPEAT);
  /* Twelve in flight at once: more than the pool keeps. */
  int32_t s[12], t[12];
  dtl_request *r[12];
  for (int k = 0; k < 12; k++) {
    s[k] = k;
    CHECK_OK(dtl_all_reduce_async(world, &s[k], &t[k], 1, DTL_INT32, DTL_SUM, &r[k]));
  }
  for (int k = 0; k < 12; k++) {
    CHECK_OK(dtl_wait(r[k]));
    CHECK(t[k] == k * dt_size, "request %d: %d", k, t[k]);
  }
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  if (dt_size > 64) return dt_skip("sized for at most 64 ranks");
  CHECK_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  RUN(blocking_v_collectives_allocate_nothing_after_the_first);
  RUN(nonblocking_requests_come_from_the_pool);
  dtl_comm_destroy(world);
  return dt_finish();
}

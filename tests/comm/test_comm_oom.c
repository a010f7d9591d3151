/* SPDX-License-Identifier: Apache-2.0 */
/* Out of memory at every allocation of the communicator entry points (tests/common/dt_oom.h): making a
 * communicator (dtl_comm_from_mpi, dtl_comm_split: agreed, so one rank's failure fails every rank) and
 * every collective, blocking and nonblocking, on a fresh communicator (its first call allocates the
 * agreement's buffer under DTL_CHECK; a nonblocking start allocates its request). Each failure is
 * DTL_ERR_OUT_OF_MEMORY (or the agreed error), frees what it allocated, writes no output, and the next call
 * works. Runs at 1, 2 and 3 ranks with DTL_CHECK=1. */
#include "dt_oom.h"

#define POISON ((dtl_comm *)0x5a5a)
enum { N = 6 };

static dt_oom_tally tally;

typedef struct {
  dtl_comm *c, *made;
  int op;
  float send[N * 8], recv[N * 8];
  size_t counts[8], sendc[8], recvc[8]; /* v-collectives; all-to-all-v: rank a sends (a + b) % 3 to b */
} ctx;

static void fresh(ctx *x) {
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &x->c));
  for (int i = 0; i < N * 8; i++) x->send[i] = (float)(dt_rank * 100 + i), x->recv[i] = -7;
  for (int r = 0; r < 8; r++) x->counts[r] = x->sendc[r] = x->recvc[r] = (size_t)((r + dt_rank) % 3);
  for (int r = 0; r < 8; r++) x->counts[r] = (size_t)(r % 3);
  x->made = POISON;
}
static void undo(void *v) {
  ctx *x = v;
  if (x->made != POISON) dtl_comm_destroy(x->made);
  dtl_comm_destroy(x->c);
  fresh(x);
}
static bool untouched(void *v) {
  ctx *x = v;
  for (int i = 0; i < N * 8; i++)
    if (x->recv[i] != -7) return false;
  return x->made == POISON;
}

static dtl_status from_mpi(void *v) { return dtl_comm_from_mpi(MPI_COMM_WORLD, &((ctx *)v)->made); }
static dtl_status split(void *v) { return dtl_comm_split(((ctx *)v)->c, dt_rank % 2, -dt_rank, &((ctx *)v)->made); }

/* One collective (x->op), a nonblocking one started and waited for. */
static dtl_status collective(void *v) {
  ctx *x = v;
  dtl_comm *c = x->c;
  const int p = dt_size, next = (dt_rank + 1) % p, prev = (dt_rank + p - 1) % p;
  size_t mine = x->counts[dt_rank];
  dtl_request *req = NULL;
  dtl_status st;
  switch (x->op) {
    case 0: return dtl_barrier(c);
    case 1: return dtl_broadcast(c, dt_rank == 0 ? x->send : x->recv, N, DTL_FLOAT32, 0);
    case 2: return dtl_scatter(c, x->send, x->recv, 1, DTL_FLOAT32, 0);
    case 3: return dtl_gather(c, x->send, x->recv, 1, DTL_FLOAT32, 0);
    case 4: return dtl_reduce(c, x->send, x->recv, N, DTL_FLOAT32, DTL_SUM, p - 1);
    case 5: return dtl_all_gather(c, x->send, x->recv, 2, DTL_FLOAT32);
    case 6: return dtl_all_gatherv(c, x->send, mine, x->recv, x->counts, DTL_FLOAT32);
    case 7: return dtl_all_reduce(c, x->send, x->recv, N, DTL_FLOAT16, DTL_MAX);
    case 8: return dtl_reduce_scatter(c, x->send, x->recv, 2, DTL_FLOAT32, DTL_SUM);
    case 9: return dtl_reduce_scatterv(c, x->send, x->recv, x->counts, DTL_FLOAT32, DTL_AVG);
    case 10: return dtl_all_to_all(c, x->send, x->recv, 1, DTL_FLOAT32);
    case 11: return dtl_all_to_allv(c, x->send, x->sendc, x->recv, x->recvc, DTL_FLOAT32);
    case 12: return dtl_sendrecv(c, x->send, 3, next, x->recv, 3, prev, DTL_FLOAT32);
    case 13: st = dtl_all_reduce_async(c, x->send, x->recv, N, DTL_FLOAT32, DTL_SUM, &req); break;
    case 14: st = dtl_all_gather_async(c, x->send, x->recv, 2, DTL_FLOAT32, &req); break;
    case 15: st = dtl_all_gatherv_async(c, x->send, mine, x->recv, x->counts, DTL_FLOAT32, &req); break;
    case 16: st = dtl_reduce_scatter_async(c, x->send, x->recv, 2, DTL_FLOAT32, DTL_SUM, &req); break;
    case 17: st = dtl_all_to_all_async(c, x->send, x->recv, 1, DTL_FLOAT32, &req); break;
    case 18: st = dtl_all_to_allv_async(c, x->send, x->sendc, x->recv, x->recvc, DTL_FLOAT32, &req); break;
    default: st = dtl_sendrecv_async(c, x->send, 3, next, x->recv, 3, prev, DTL_FLOAT32, &req); break;
  }
  return st == DTL_OK ? dtl_wait(req) : st;
}

static const char *const names[] = {"dtl_barrier",
                                    "dtl_broadcast",
                                    "dtl_scatter",
                                    "dtl_gather",
                                    "dtl_reduce",
                                    "dtl_all_gather",
                                    "dtl_all_gatherv",
                                    "dtl_all_reduce (f16)",
                                    "dtl_reduce_scatter",
                                    "dtl_reduce_scatterv (avg)",
                                    "dtl_all_to_all",
                                    "dtl_all_to_allv",
                                    "dtl_sendrecv",
                                    "dtl_all_reduce_async + wait",
                                    "dtl_all_gather_async + wait",
                                    "dtl_all_gatherv_async + wait",
                                    "dtl_reduce_scatter_async + wait",
                                    "dtl_all_to_all_async + wait",
                                    "dtl_all_to_allv_async + wait",
                                    "dtl_sendrecv_async + wait"};

static void making_a_communicator_fails_every_rank_alike_at_each_failed_allocation(void) {
  ctx x;
  fresh(&x);
  const dt_oom_case cases[] = {
      {.what = "dtl_comm_from_mpi",
       .call = from_mpi,
       .untouched = untouched,
       .undo = undo,
       .ctx = &x,
       .collective = true,
       .caches = true},
      {.what = "dtl_comm_split",
       .call = split,
       .untouched = untouched,
       .undo = undo,
       .ctx = &x,
       .collective = true,
       .caches = true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) dt_oom_every_way(&cases[i], &tally);
  dtl_comm_destroy(x.c);
}

/* The same over nodes: DTL_RANKS_PER_NODE=1 puts every rank on a node of its own, so that a communicator gathers
 * its node table and a split derives its own from its parent's (allocations that one node skips). */
static void making_a_communicator_over_nodes_fails_every_rank_alike_at_each_failed_allocation(void) {
  setenv("DTL_RANKS_PER_NODE", "1", 1);
  making_a_communicator_fails_every_rank_alike_at_each_failed_allocation();
  unsetenv("DTL_RANKS_PER_NODE");
}

/* The blocking collectives agree under DTL_CHECK (every rank fails alike); a nonblocking start never
 * waits for its peers, so only the rank whose allocation failed fails: the sweep injects on every rank. */
static void every_collective_survives_each_failed_allocation(void) {
  ctx x;
  fresh(&x);
  for (int op = 0; op < (int)(sizeof names / sizeof *names); op++) {
    x.op = op;
    const dt_oom_case c = {.what = names[op],
                           .call = collective,
                           .untouched = untouched,
                           .undo = undo,
                           .ctx = &x,
                           .collective = true,
                           .caches = true};
    dt_oom_sweeps(&c, op < 13, &tally);
  }
  dtl_comm_destroy(x.c);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  RUN(making_a_communicator_fails_every_rank_alike_at_each_failed_allocation);
  RUN(making_a_communicator_over_nodes_fails_every_rank_alike_at_each_failed_allocation);
  RUN(every_collective_survives_each_failed_allocation);
  if (dt_rank == 0)
    printf("%ld calls, %ld of them failed by an injected allocation failure\n", tally.calls, tally.failures);
  return dt_finish();
}

/* SPDX-License-Identifier: Apache-2.0 */
/* What a deadline costs (comm.h, dtl_comm_set_timeout): two communicators over the same ranks, one without a
 * deadline and one with a 600 s deadline, whose calls interleave round by round, so that load that comes and goes
 * on a shared machine hits both alike. Reported per line: the median over rounds of the slowest rank's time on
 * each, and the median of the per-round ratios timed / untimed.
 *   cached dtl_redistribute: a one-element R -> R plan (no communication) and a 16-element S0 -> R on a 1-D mesh:
 *     the per-call overhead, target <= 100 ns more with a deadline at p = 2;
 *   collectives of -s bytes (default 16 MiB): all_reduce, all_gather, reduce_scatter, all_to_all, broadcast:
 *     target ratio <= 1.02.
 * Options: -s bytes (K/M/G), -n rounds (default 20), -i calls per overhead round (default 2000). */
#include <stdbool.h>
#include <time.h>
#include "bench_util.h"
#include "dtl/mpi.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double slowest(double t) {
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

#define TRY_B(call)                                                                                   \
  do {                                                                                                \
    dtl_status st_ = (call);                                                                          \
    if (st_ != DTL_OK) {                                                                              \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, dtl_status_name(st_),       \
              dtl_last_error());                                                                      \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                   \
    }                                                                                                 \
  } while (0)

typedef struct {
  dtl_comm *c;
  dtl_mesh *m;
  dtl_layout *r1, *s0, *r16;
} side;

static void side_make(side *s, double timeout) {
  int p = 0;
  TRY_B(dtl_comm_from_mpi(MPI_COMM_WORLD, &s->c));
  TRY_B(dtl_comm_set_timeout(s->c, timeout));
  p = dtl_comm_size(s->c);
  TRY_B(dtl_mesh_create(s->c, 1, &p, &s->m));
  int64_t one = 1, n = 16 * p;
  dtl_placement r = dtl_replicate(), s0 = dtl_shard(0);
  TRY_B(dtl_layout_create(s->m, DTL_FLOAT32, 1, &one, &r, &s->r1));
  TRY_B(dtl_layout_create(s->m, DTL_FLOAT32, 1, &n, &s0, &s->s0));
  TRY_B(dtl_layout_create(s->m, DTL_FLOAT32, 1, &n, &r, &s->r16));
}

/* One round of calls on s: kind 0 the R -> R plan, 1 S0 -> R, 2.. the collectives; returns the slowest rank's
 * seconds per call. */
static double round_of(side *s, int kind, int calls, void *a, void *b, size_t n) {
  float x[64] = {0}, y[64 * 64];
  dtl_comm *c = s->c;
  int p = dtl_comm_size(c);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_s();
  for (int i = 0; i < calls; i++) {
    switch (kind) {
      case 0: TRY_B(dtl_redistribute(s->r1, x, s->r1, y)); break;
      case 1: TRY_B(dtl_redistribute(s->s0, x, s->r16, y)); break;
      case 2: TRY_B(dtl_all_reduce(c, a, b, n, DTL_FLOAT32, DTL_SUM)); break;
      case 3: TRY_B(dtl_all_gather(c, a, b, n / (size_t)p, DTL_FLOAT32)); break;
      case 4: TRY_B(dtl_reduce_scatter(c, a, b, n / (size_t)p, DTL_FLOAT32, DTL_SUM)); break;
      case 5: TRY_B(dtl_all_to_all(c, a, b, n / (size_t)p, DTL_FLOAT32)); break;
      default: TRY_B(dtl_broadcast(c, a, n, DTL_FLOAT32, 0)); break;
    }
  }
  return slowest((now_s() - t0) / calls);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  long long bytes = 16 << 20;
  int rounds = 20, calls = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-s")) bytes = bench_parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-i")) calls = atoi(argv[i + 1]);
  }
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  side plain = {0}, timed = {0};
  side_make(&plain, 0);
  side_make(&timed, 600);
  size_t n = (size_t)bytes / sizeof(float) / (size_t)p * (size_t)p;
  float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float));
  for (size_t i = 0; i < n; i++) a[i] = (float)(i % 7);
  static const char *names[] = {"cached dtl_redistribute R->R (1 elt)", "cached dtl_redistribute S0->R (16/rank)",
                                "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"};
  if (rank == 0)
    printf("# dtl_deadline_perf: %d ranks, deadline 600 s vs none, %d rounds interleaved; collectives of %lld bytes\n"
           "# %-40s %14s %14s %10s %12s\n", p, rounds, (long long)n * 4, "call", "none", "deadline", "ratio",
           "difference");
  for (int kind = 0; kind < 7; kind++) {
    int k = kind < 2 ? calls : 3;
    double *t0 = malloc(sizeof(double) * (size_t)rounds), *t1 = malloc(sizeof(double) * (size_t)rounds),
           *ratio = malloc(sizeof(double) * (size_t)rounds);
    round_of(&plain, kind, k, a, b, n); /* warm-up: plans, caches, scratch */
    round_of(&timed, kind, k, a, b, n);
    for (int r = 0; r < rounds; r++) {
      bool first = r % 2 == 0; /* alternate which goes first */
      double x = first ? round_of(&plain, kind, k, a, b, n) : 0, y = round_of(&timed, kind, k, a, b, n);
      if (!first) x = round_of(&plain, kind, k, a, b, n);
      t0[r] = x;
      t1[r] = y;
      ratio[r] = y / x;
    }
    double m0 = bench_median(t0, rounds), m1 = bench_median(t1, rounds), mr = bench_median(ratio, rounds);
    if (rank == 0) {
      if (kind < 2) printf("  %-40s %11.1f ns %11.1f ns %10.3f %+9.1f ns\n", names[kind], m0 * 1e9, m1 * 1e9, mr,
                           (m1 - m0) * 1e9);
      else printf("  %-40s %11.3f ms %11.3f ms %10.3f %+9.3f ms\n", names[kind], m0 * 1e3, m1 * 1e3, mr, (m1 - m0) * 1e3);
    }
    free(t0);
    free(t1);
    free(ratio);
  }
  free(a);
  free(b);
  side *sides[] = {&plain, &timed};
  for (int i = 0; i < 2; i++) {
    dtl_layout_destroy(sides[i]->r1);
    dtl_layout_destroy(sides[i]->s0);
    dtl_layout_destroy(sides[i]->r16);
    dtl_mesh_destroy(sides[i]->m);
    dtl_comm_destroy(sides[i]->c);
  }
  MPI_Finalize();
  return 0;
}

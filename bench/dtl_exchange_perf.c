/* SPDX-License-Identifier: Apache-2.0 */
/* The exchange step, on 4 ranks (mpirun -n 4 dtl_exchange_perf):
 * 1. [S0,S1]->[S1,S0] and [S0,S0]->[S1,S1] on a 2x2 mesh: the plan dtl_plan_create chooses (one exchange) next to
 *    the per-dim route the planner took before the exchange existed (all-gather on mesh dim 1, all-to-all on mesh
 *    dim 0, local slice on mesh dim 1), run here as its three single-step plans over the intermediate layouts, with
 *    the intermediates in buffers of their own. Rounds interleave; times are the slowest rank's, medians over -n
 *    rounds; speedup = median of the per-round ratios route/chosen (target >= 1.3 where the exchange moves fewer
 *    bytes). Beside them: the bytes the busiest rank receives, the scratch of each (the route's: its steps'
 *    scratch plus its intermediate shards), and the peak resident memory growth (VmHWM after a first execution on a
 *    fresh plan minus VmRSS before it, the largest over the ranks) next to the local shard.
 * 2. Between two meshes: ranks {0,1} (S0) -> ranks {2,3} (S1), the exchange against a raw MPI_Alltoallv over the
 *    world moving the same bytes from prepacked buffers into the same places; ratio = median of the per-round
 *    ratios dtl/raw (target <= 1.15 from 1 MiB). S0 -> S1 packs every piece on the sender (column blocks of its
 *    rows); S0 -> S0 (rank s's rows to rank 2 + s) moves runs only, so it shows the exchange without its pack.
 * The tensor is a square f32 matrix of -b..-e bytes (factor -f); every result is checked (#wrong).
 * Options: -b min bytes, -e max bytes, -f factor, -n rounds, -w warmup rounds, -p part (1, 2; 0 = both). */
#define _GNU_SOURCE
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <dtl/mpi.h>
#include "bench_util.h"

static int rank, nranks;
static dtl_comm *world;

static float *shard_of(const dtl_layout *l, int64_t n) {
  size_t c = dtl_layout_local_count(l);
  float *b = malloc(c * sizeof *b + 4);
  int64_t s[2], o[2];
  dtl_layout_local_box(l, NULL, s, o);
  for (int64_t i = 0; i < s[0]; i++)
    for (int64_t j = 0; j < s[1]; j++) b[i * s[1] + j] = bench_value(o[0] + i, o[1] + j, n);
  return b;
}

static dtl_layout *layout(const dtl_mesh *m, const char *text, int64_t n) {
  dtl_placement p[4];
  int k;
  BENCH_TRY(dtl_placements_parse(text, p, 4, &k));
  dtl_layout *l;
  BENCH_TRY(dtl_layout_create(m, DTL_FLOAT32, 2, (int64_t[]){n, n}, p, &l));
  return l;
}

/* The slowest rank's seconds for f(arg). */
static double slowest(void (*f)(void *), void *arg) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  f(arg);
  double t = MPI_Wtime() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

static long long peak_growth(void (*f)(void *), void *arg) {
  bench_reset_peak();
  long long before = bench_status_bytes("VmRSS");
  f(arg);
  long long g = bench_status_bytes("VmHWM") - before;
  MPI_Allreduce(MPI_IN_PLACE, &g, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return g;
}

/* --- part 1: the chosen plan and the per-dim route on 2x2 ---------------------------------------------------- */
typedef struct {
  dtl_plan *chosen, *step[3];
  float *in, *out, *mid[2];
} route;

static void run_chosen(void *a) {
  route *r = a;
  BENCH_TRY(dtl_plan_execute(r->chosen, r->in, r->out));
}

static void run_route(void *a) {
  route *r = a;
  BENCH_TRY(dtl_plan_execute(r->step[0], r->in, r->mid[0]));
  BENCH_TRY(dtl_plan_execute(r->step[1], r->mid[0], r->mid[1]));
  BENCH_TRY(dtl_plan_execute(r->step[2], r->mid[1], r->out));
}

static unsigned long long max_recv(dtl_plan *const *p, int np) {
  uint64_t sent = 0, got = 0;
  unsigned long long total = 0;
  for (int i = 0; i < np; i++) {
    BENCH_TRY(dtl_plan_bytes(p[i], &sent, &got));
    total += got;
  }
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return total;
}

static unsigned long long max_ull(unsigned long long v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

static void part1(long long b0, long long b1, int factor, int rounds, int warmup) {
  dtl_mesh *mesh;
  BENCH_TRY(dtl_mesh_create(world, 2, (int[]){2, 2}, &mesh));
  static const char *cases[][5] = {{"S0,S1", "S1,S0", "S0,R", "S1,R", "[S0,S1]->[S1,S0]"},
                                   {"S0,S0", "S1,S1", "S0,R", "S1,R", "[S0,S0]->[S1,S1]"}};
  if (rank == 0)
    printf("# 2x2 mesh, f32 square tensor; chosen = dtl_plan_create's plan, route = the per-dim route (all-gather, "
           "all-to-all, slice); times: slowest rank, median of %d rounds\n"
           "# %-18s %9s %10s %10s %8s %11s %11s %9s %10s %9s %9s %9s %6s\n",
           rounds, "case", "size", "chosen_us", "route_us", "speedup", "recv_chosen", "recv_route", "shard", "scr_chosen",
           "scr_route", "hwm_ch", "hwm_rt", "#wrong");
  for (int c = 0; c < 2; c++)
    for (long long bytes = b0; bytes <= b1; bytes *= factor) {
      int64_t n = (int64_t)sqrt((double)bytes / 4);
      n -= n % 2;
      dtl_layout *src = layout(mesh, cases[c][0], n), *dst = layout(mesh, cases[c][1], n);
      dtl_layout *m0 = layout(mesh, cases[c][2], n), *m1 = layout(mesh, cases[c][3], n);
      route r = {0};
      BENCH_TRY(dtl_plan_create(src, dst, &r.chosen));
      BENCH_TRY(dtl_plan_create(src, m0, &r.step[0]));
      BENCH_TRY(dtl_plan_create(m0, m1, &r.step[1]));
      BENCH_TRY(dtl_plan_create(m1, dst, &r.step[2]));
      r.in = shard_of(src, n);
      r.out = malloc(dtl_layout_local_count(dst) * 4 + 4);
      r.mid[0] = malloc(dtl_layout_local_count(m0) * 4 + 4);
      r.mid[1] = malloc(dtl_layout_local_count(m1) * 4 + 4);
      memset(r.out, 0, dtl_layout_local_count(dst) * 4); /* touched: the growth is the execution's own */
      /* First executions on fresh plans: they allocate and touch their scratch (the route its intermediates too). */
      long long hwm = peak_growth(run_chosen, &r), hwm_route = peak_growth(run_route, &r);
      double *tc = malloc(sizeof(double) * (size_t)rounds), *tr = malloc(sizeof(double) * (size_t)rounds),
             *ratio = malloc(sizeof(double) * (size_t)rounds);
      for (int i = 0; i < warmup + rounds; i++) {
        double a = slowest(run_chosen, &r), b = slowest(run_route, &r);
        if (i >= warmup) tc[i - warmup] = a, tr[i - warmup] = b, ratio[i - warmup] = b / a;
      }
      long wrong = bench_count_wrong(dst, r.out, n);
      run_chosen(&r);
      wrong += bench_count_wrong(dst, r.out, n);
      MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
      unsigned long long rc = max_recv(&r.chosen, 1), rr = max_recv(r.step, 3);
      unsigned long long scr_route = dtl_plan_scratch_bytes(r.step[0]) + dtl_plan_scratch_bytes(r.step[1]) +
                                     dtl_plan_scratch_bytes(r.step[2]) + (dtl_layout_local_count(m0) +
                                                                          dtl_layout_local_count(m1)) * 4;
      unsigned long long scr_chosen = max_ull(dtl_plan_scratch_bytes(r.chosen)), scr_r = max_ull(scr_route);
      unsigned long long shard = max_ull(dtl_layout_local_count(src) * 4);
      double mc = bench_median(tc, rounds), mr = bench_median(tr, rounds), sp = bench_median(ratio, rounds);
      if (rank == 0)
        printf("  %-18s %9lld %10.1f %10.1f %8.2f %11llu %11llu %9llu %10llu %9llu %9lld %9lld %6ld\n", cases[c][4],
               bytes, mc * 1e6, mr * 1e6, sp, rc, rr, shard, scr_chosen, scr_r, hwm, hwm_route, wrong);
      free(tc), free(tr), free(ratio);
      free(r.in), free(r.out), free(r.mid[0]), free(r.mid[1]);
      dtl_plan_destroy(r.chosen);
      for (int i = 0; i < 3; i++) dtl_plan_destroy(r.step[i]);
      dtl_layout *ls[] = {src, dst, m0, m1};
      for (int i = 0; i < 4; i++) dtl_layout_destroy(ls[i]);
    }
  dtl_mesh_destroy(mesh);
}

/* --- part 2: between two meshes, against MPI_Alltoallv from prepacked buffers --------------------------------- */
typedef struct {
  dtl_plan *plan;
  const float *in;
  float *out, *packed;
  int sc[4], sd[4], rc[4], rd[4];
} cross;

static void run_dtl(void *a) {
  cross *x = a;
  BENCH_TRY(dtl_plan_execute(x->plan, x->in, x->out));
}

static void run_raw(void *a) {
  cross *x = a;
  MPI_Alltoallv(x->packed, x->sc, x->sd, MPI_FLOAT, x->out, x->rc, x->rd, MPI_FLOAT, MPI_COMM_WORLD);
}

static void part2(long long b0, long long b1, int factor, int rounds, int warmup) {
  dtl_mesh *a, *b;
  BENCH_TRY(dtl_mesh_create_from_ranks(world, 2, (int[]){0, 1}, 1, (int[]){2}, &a));
  BENCH_TRY(dtl_mesh_create_from_ranks(world, 2, (int[]){2, 3}, 1, (int[]){2}, &b));
  if (rank == 0)
    printf("# two meshes: ranks 0,1 -> ranks 2,3, f32 square tensor; raw = MPI_Alltoallv of the same bytes from "
           "prepacked buffers; times: slowest rank, median of %d rounds\n# %-8s %10s %10s %10s %8s %8s\n", rounds,
           "case", "size", "dtl_us", "raw_us", "dtl/raw", "#wrong");
  for (int c = 0; c < 2; c++)
    for (long long bytes = b0; bytes <= b1; bytes *= factor) {
      int64_t n = (int64_t)sqrt((double)bytes / 4);
      n -= n % 2;
      bool cols = c == 0; /* S0 -> S1, else S0 -> S0 */
      dtl_layout *src = layout(a, "S0", n), *dst = layout(b, cols ? "S1" : "S0", n);
      cross x = {0};
      BENCH_TRY(dtl_plan_create(src, dst, &x.plan));
      bool in_a = rank < 2, in_b = rank >= 2;
      float *in = in_a ? shard_of(src, n) : NULL;
      x.in = in;
      x.out = in_b ? malloc(dtl_layout_local_count(dst) * 4 + 4) : NULL;
      /* S0 -> S1: rank s (0, 1) sends rows s of column half q to rank 2 + q, packed; rank 2 + q receives rows s at
       * their place in its column block (a contiguous run). S0 -> S0: rank s sends its rows to rank 2 + s. */
      int64_t h = n / 2;
      x.packed = in_a ? malloc((size_t)h * (size_t)n * 4 + 4) : NULL;
      for (int q = 0; q < 2 && in_a; q++)
        for (int64_t i = 0; i < h; i++)
          memcpy(x.packed + (size_t)q * h * h + (size_t)i * h, in + (size_t)i * n + q * h, (size_t)h * 4);
      if (in_a && !cols) memcpy(x.packed, in, (size_t)h * (size_t)n * 4);
      for (int p = 0; p < 4; p++) {
        bool peer = cols || (in_a ? p == rank + 2 : p == rank - 2);
        int cnt = (int)(cols ? h * h : h * n);
        x.sc[p] = in_a && p >= 2 && peer ? cnt : 0;
        x.sd[p] = in_a && p >= 2 && cols ? (int)((p - 2) * h * h) : 0;
        x.rc[p] = in_b && p < 2 && peer ? cnt : 0;
        x.rd[p] = in_b && p < 2 && cols ? (int)(p * h * h) : 0;
      }
      run_dtl(&x);
      double *ratio = malloc(sizeof(double) * (size_t)rounds), *td = malloc(sizeof(double) * (size_t)rounds),
             *tw = malloc(sizeof(double) * (size_t)rounds);
      for (int i = 0; i < warmup + rounds; i++) {
        double d = slowest(run_dtl, &x), w = slowest(run_raw, &x);
        if (i >= warmup) td[i - warmup] = d, tw[i - warmup] = w, ratio[i - warmup] = d / w;
      }
      run_dtl(&x);
      long wrong = in_b ? bench_count_wrong(dst, x.out, n) : 0;
      MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
      double md = bench_median(td, rounds), mw = bench_median(tw, rounds), mr = bench_median(ratio, rounds);
      if (rank == 0)
        printf("  %-8s %10lld %10.1f %10.1f %8.3f %8ld\n", cols ? "S0->S1" : "S0->S0", bytes, md * 1e6, mw * 1e6, mr,
               wrong);
      free(ratio), free(td), free(tw), free(in), free(x.out), free(x.packed);
      dtl_plan_destroy(x.plan);
      dtl_layout_destroy(src);
      dtl_layout_destroy(dst);
    }
  dtl_mesh_destroy(a);
  dtl_mesh_destroy(b);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  long long b0 = 1 << 20, b1 = 64 << 20;
  int factor = 4, rounds = 9, warmup = 2, part = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) b0 = bench_parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) b1 = bench_parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) factor = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warmup = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-p")) part = atoi(argv[i + 1]);
  }
  if (nranks != 4) {
    if (rank == 0) fprintf(stderr, "dtl_exchange_perf: run it on 4 ranks (mpirun -n 4)\n");
    MPI_Finalize();
    return 2;
  }
  if (factor < 2) factor = 2;
  if (rounds < 1) rounds = 1;
  BENCH_TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  if (part != 2) part1(b0, b1, factor, rounds, warmup);
  if (part != 1) part2(b0, b1, factor, rounds, warmup);
  dtl_comm_destroy(world);
  MPI_Finalize();
  return 0;
}

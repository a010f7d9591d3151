/* SPDX-License-Identifier: Apache-2.0 */
/* MoE dispatch + combine against the two raw MPI_Alltoallv calls that move the same bytes (the floor of any
 * expert-parallel exchange), in the conventions of nccl-tests. Target: ratio <= 1.3 from 256 tokens x 1024
 * hidden (f32) per rank, at 2 and 4 ranks. dtl and raw rounds alternate; each round's time is the slowest
 * rank's, the table shows medians. The expert is the identity (combine reads the dispatched rows back), so
 * y must equal the weighted sum of each token's slots: #wrong counts the elements that do not.
 *   mpirun -n 4 ./dtl_moe_perf -b 64 -e 2K -f 2 [-d hidden] [-E experts] [-k topk] [-n iters] [-w warmup]
 *                              [-x auto|per_expert|single] [-v verify 0|1]
 * -b/-e/-f step the tokens per rank (K/M/G suffixes). Columns: size = bytes each rank sends per direction,
 * count = tokens per rank, time = dispatch + combine (us), algbw = 2 x size / time, busbw = algbw x (p-1)/p,
 * raw = the two MPI_Alltoallv (us), ratio = time / raw, layout = dtl_moe_layout_create (us), xchg = the
 * exchange the layout chose (per_expert: one all-to-all-v per local-expert index; single: one, plus a regroup). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "bench_util.h"

/* The slowest rank's time of one round. */
static double slowest(double t) {
  double m;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

static uint64_t g_state = 12345;
static float uniform(void) {
  g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)(g_state >> 40) / (float)(1ull << 24);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  long long tmin = 64, tmax = 2048;
  int factor = 2, hidden = 1024, experts = 8, k = 2, iters = 20, warmup = 5, verify = 1;
  dtl_moe_exchange exchange = DTL_MOE_EXCHANGE_AUTO;
  const char *exchange_name = "auto";
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *o = argv[i], *v = argv[i + 1];
    if (!strcmp(o, "-b")) tmin = bench_parse_size(v);
    else if (!strcmp(o, "-e")) tmax = bench_parse_size(v);
    else if (!strcmp(o, "-f")) factor = atoi(v);
    else if (!strcmp(o, "-d")) hidden = (int)bench_parse_size(v);
    else if (!strcmp(o, "-E")) experts = atoi(v);
    else if (!strcmp(o, "-k")) k = atoi(v);
    else if (!strcmp(o, "-n")) iters = atoi(v);
    else if (!strcmp(o, "-w")) warmup = atoi(v);
    else if (!strcmp(o, "-v")) verify = atoi(v);
    else if (!strcmp(o, "-x")) {
      exchange_name = v;
      exchange = !strcmp(v, "per_expert") ? DTL_MOE_EXCHANGE_PER_EXPERT
                 : !strcmp(v, "single")   ? DTL_MOE_EXCHANGE_SINGLE
                                          : DTL_MOE_EXCHANGE_AUTO;
    } else {
      fprintf(stderr, "unknown option %s\n", o);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (factor < 2) factor = 2;
  if (iters < 1) iters = 1;

  dtl_comm *comm;
  BENCH_TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &comm));
  MPI_Comm raw = dtl_comm_mpi_handle(comm);
  const int rank = dtl_comm_rank(comm), size = dtl_comm_size(comm);
  dtl_moe_placement *pl;
  BENCH_TRY(dtl_moe_placement_create(experts, size, NULL, &pl));
  if (rank == 0) {
    printf("# dtl_moe_perf: %d ranks, %d experts, top-%d, hidden %d, f32, exchange %s, verify %d, iters %d, warmup %d\n",
           size, experts, k, hidden, exchange_name, verify, iters, warmup);
    printf("# %12s %8s %5s %10s %8s %8s %7s %10s %6s %10s %11s\n", "size(B)", "count", "type", "time(us)", "algbw",
           "busbw", "#wrong", "raw(us)", "ratio", "layout(us)", "xchg");
  }
  double *td = malloc(sizeof(double) * (size_t)iters), *tr = malloc(sizeof(double) * (size_t)iters);
  for (long long tokens = tmin; tokens <= tmax; tokens *= factor) {
    const int64_t T = tokens, H = hidden;
    g_state = 12345 + (uint64_t)rank * 7919 + (uint64_t)T;
    float *x = malloc(sizeof(float) * (size_t)(T * H)), *y = malloc(sizeof(float) * (size_t)(T * H));
    float *logits = malloc(sizeof(float) * (size_t)(T * experts));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * k));
    float *w = malloc(sizeof(float) * (size_t)(T * k));
    for (int64_t i = 0; i < T * H; i++) x[i] = uniform() * 2 - 1;
    for (int64_t i = 0; i < T * experts; i++) logits[i] = uniform() * 4;
    dtl_moe_router_params rp = {.mask = DTL_MOE_ROUTER_RENORMALIZE, .renormalize = 1};
    BENCH_TRY(dtl_moe_router_topk(logits, T, experts, k, &rp, ids, w));
    dtl_moe_layout_params lp = {.mask = DTL_MOE_LAYOUT_EXCHANGE | DTL_MOE_LAYOUT_VERIFY, .exchange = exchange,
                                .verify = verify};

    /* Layout creation, timed over a few rounds (the last layout is kept). */
    dtl_moe_layout *L = NULL;
    double tl[5];
    for (int r = 0; r < 5; r++) {
      if (L) dtl_moe_layout_destroy(L);
      MPI_Barrier(raw);
      double t0 = MPI_Wtime();
      BENCH_TRY(dtl_moe_layout_create(comm, pl, T, k, ids, w, H, DTL_FLOAT32, &lp, &L));
      tl[r] = slowest(MPI_Wtime() - t0);
    }
    const int64_t rows = dtl_moe_layout_expert_rows(L);
    float *ein = malloc(sizeof(float) * (size_t)(rows * H) + 4);

    /* The raw baseline moves the same rows: per-peer counts from the layout's per-expert counts. */
    int64_t *kept = malloc(sizeof(int64_t) * (size_t)experts);
    BENCH_TRY(dtl_moe_layout_token_counts(L, kept, NULL));
    int *sc = calloc((size_t)size, sizeof(int)), *rc = calloc((size_t)size, sizeof(int));
    int *sd = calloc((size_t)size, sizeof(int)), *rd = calloc((size_t)size, sizeof(int));
    int64_t sent = 0;
    for (int e = 0; e < experts; e++) {
      sc[dtl_moe_placement_owner(pl, e)] += (int)(kept[e] * H);
      sent += kept[e];
    }
    MPI_Alltoall(sc, 1, MPI_INT, rc, 1, MPI_INT, raw);
    int64_t rtotal = 0;
    for (int r = 0; r < size; r++) {
      sd[r] = r ? sd[r - 1] + sc[r - 1] : 0;
      rd[r] = r ? rd[r - 1] + rc[r - 1] : 0;
      rtotal += rc[r];
    }
    float *rs = malloc(sizeof(float) * (size_t)(sent * H) + 4), *rr = malloc(sizeof(float) * (size_t)rtotal + 4);
    memset(rs, 0, sizeof(float) * (size_t)(sent * H));

    for (int it = -warmup; it < iters; it++) {
      MPI_Barrier(raw);
      double t0 = MPI_Wtime();
      BENCH_TRY(dtl_moe_layout_dispatch(L, x, ein));
      BENCH_TRY(dtl_moe_layout_combine(L, ein, y));
      double a = slowest(MPI_Wtime() - t0);
      MPI_Barrier(raw);
      t0 = MPI_Wtime();
      MPI_Alltoallv(rs, sc, sd, MPI_FLOAT, rr, rc, rd, MPI_FLOAT, raw);
      MPI_Alltoallv(rr, rc, rd, MPI_FLOAT, rs, sc, sd, MPI_FLOAT, raw);
      double b = slowest(MPI_Wtime() - t0);
      if (it >= 0) {
        td[it] = a;
        tr[it] = b;
      }
    }
    /* Identity experts and no drops: y[t] = sum over slots of w * x[t], in slot order. */
    long long wrong = 0, gwrong = 0;
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H; h++) {
        float want = 0;
        int used = 0;
        for (int s = 0; s < k; s++)
          if (ids[t * k + s] >= 0) want = used++ ? want + w[t * k + s] * x[t * H + h] : w[t * k + s] * x[t * H + h];
        wrong += y[t * H + h] != want;
      }
    MPI_Allreduce(&wrong, &gwrong, 1, MPI_LONG_LONG, MPI_SUM, raw);
    double time = bench_median(td, iters), rawt = bench_median(tr, iters), layout = bench_median(tl, 5);
    double bytes = (double)T * k * H * sizeof(float);
    double algbw = 2 * bytes / time / 1e9;
    if (rank == 0)
      printf("  %12.0f %8lld %5s %10.1f %8.2f %8.2f %7lld %10.1f %6.2f %10.1f %11s\n", bytes, tokens, "f32", time * 1e6,
             algbw, algbw * (size - 1) / size, gwrong, rawt * 1e6, time / rawt, layout * 1e6,
             dtl_moe_layout_exchange(L) == DTL_MOE_EXCHANGE_SINGLE ? "single" : "per_expert");
    dtl_moe_layout_destroy(L);
    free(x); free(y); free(logits); free(ids); free(w); free(ein); free(kept);
    free(sc); free(rc); free(sd); free(rd); free(rs); free(rr);
  }
  free(td);
  free(tr);
  dtl_moe_placement_destroy(pl);
  dtl_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}

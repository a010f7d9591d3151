/* SPDX-License-Identifier: Apache-2.0 */
/* FP8 dispatch + BF16 combine against BF16 dispatch + BF16 combine on the same routing (issue 18: bytes 0.5x and
 * time <= 0.7x from 4 MiB messages, at 2048 tokens x 4096 hidden, p = 2 and 4), in the conventions of
 * nccl-tests. The two layouts' rounds alternate; each round's time is the slowest rank's, the table shows
 * medians. The expert is the identity (combine reads the dispatched rows back), so the BF16 path's y must equal
 * the weighted sum of each token's slots (#wrong counts the elements that do not), and the FP8 path's error is
 * that of the FP8 round trip, reported against the BF16 path and against the exact sum.
 *   mpirun -n 4 ./dtl_moe_fp8_perf -b 256 -e 2K -f 2 [-d hidden] [-E experts] [-k topk] [-n iters] [-w warmup]
 *                                  [-x auto|per_expert|single]
 * -b/-e/-f step the tokens per rank (K/M/G suffixes). Columns: count = tokens per rank; bf16(B) and fp8(B) = the
 * bytes each rank's dispatch sends to other ranks (BF16 rows; FP8 codes + scales); bytes = their ratio; d+c = the
 * same ratio for dispatch + combine (combine moves BF16 rows both times); bf16(us), fp8(us) = dispatch + combine;
 * time = fp8 / bf16; disp = the ratio of the dispatches alone; raw = dtl_moe_layout_dispatch_fp8 (codes and scales
 * for an FP8 GEMM, no dequantization) over the BF16 dispatch; err = max |y_fp8 - y_bf16| / max |y_bf16| over a
 * token's row (the worst token), and max |y_fp8 - y_bf16| (abs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "bench_util.h"

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

/* bf16 <-> f32, round to nearest even (finite values). */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The bytes of one row as FP8 dispatch moves it (moe.h): hidden codes, padded to 4 bytes, then the f32 scales. */
static int64_t fp8_row_bytes(int64_t H) { return (H + 3) / 4 * 4 + 4 * ((H + 127) / 128); }

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  long long tmin = 256, tmax = 2048;
  int factor = 2, hidden = 4096, experts = 8, k = 2, iters = 10, warmup = 3;
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
    printf("# dtl_moe_fp8_perf: %d ranks, %d experts, top-%d, hidden %d, bf16 activations, exchange %s, iters %d, "
           "warmup %d\n", size, experts, k, hidden, exchange_name, iters, warmup);
    printf("# %6s %11s %11s %5s %5s %9s %9s %5s %5s %5s %7s %9s %9s %10s\n", "count", "bf16(B)", "fp8(B)", "bytes",
           "d+c", "bf16(us)", "fp8(us)", "time", "disp", "raw", "#wrong", "err(rel)", "err(abs)", "xchg");
  }
  double *tb = malloc(sizeof(double) * (size_t)iters), *t8 = malloc(sizeof(double) * (size_t)iters);
  double *db = malloc(sizeof(double) * (size_t)iters), *d8 = malloc(sizeof(double) * (size_t)iters);
  double *dr = malloc(sizeof(double) * (size_t)iters);
  for (long long tokens = tmin; tokens <= tmax; tokens *= factor) {
    const int64_t T = tokens, H = hidden, nb = (H + 127) / 128;
    g_state = 12345 + (uint64_t)rank * 7919 + (uint64_t)T;
    uint16_t *x = malloc(2 * (size_t)(T * H) + 4), *yb = malloc(2 * (size_t)(T * H) + 4);
    uint16_t *y8 = malloc(2 * (size_t)(T * H) + 4);
    float *logits = malloc(sizeof(float) * (size_t)(T * experts));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * k));
    float *w = malloc(sizeof(float) * (size_t)(T * k));
    for (int64_t i = 0; i < T * H; i++) x[i] = to_bf16(uniform() * 2 - 1);
    for (int64_t i = 0; i < T * experts; i++) logits[i] = uniform() * 4;
    dtl_moe_router_params rp = {.mask = DTL_MOE_ROUTER_RENORMALIZE, .renormalize = 1};
    BENCH_TRY(dtl_moe_router_topk(logits, T, experts, k, &rp, ids, w));
    dtl_moe_layout_params lp = {.mask = DTL_MOE_LAYOUT_EXCHANGE, .exchange = exchange};
    dtl_moe_layout_params lp8 = {.mask = DTL_MOE_LAYOUT_EXCHANGE, .flags = DTL_MOE_LAYOUT_FP8_DISPATCH,
                                 .exchange = exchange};
    dtl_moe_layout *Lb = NULL, *L8 = NULL;
    BENCH_TRY(dtl_moe_layout_create(comm, pl, T, k, ids, w, H, DTL_BFLOAT16, &lp, &Lb));
    BENCH_TRY(dtl_moe_layout_create(comm, pl, T, k, ids, w, H, DTL_BFLOAT16, &lp8, &L8));
    const int64_t rows = dtl_moe_layout_expert_rows(Lb);
    uint16_t *eb = malloc(2 * (size_t)(rows * H) + 4), *e8 = malloc(2 * (size_t)(rows * H) + 4);
    uint8_t *codes = malloc((size_t)(rows * H) + 4);
    float *scales = malloc(sizeof(float) * (size_t)(rows * nb) + 4);

    /* The bytes this rank sends to other ranks in one dispatch. */
    int64_t *kept = malloc(sizeof(int64_t) * (size_t)experts), remote = 0;
    BENCH_TRY(dtl_moe_layout_token_counts(Lb, kept, NULL));
    for (int e = 0; e < experts; e++)
      if (dtl_moe_placement_owner(pl, e) != rank) remote += kept[e];
    double bbytes = (double)remote * (double)H * 2, fbytes = (double)remote * (double)fp8_row_bytes(H), mb, mf;
    MPI_Allreduce(&bbytes, &mb, 1, MPI_DOUBLE, MPI_MAX, raw);
    MPI_Allreduce(&fbytes, &mf, 1, MPI_DOUBLE, MPI_MAX, raw);

    for (int it = -warmup; it < iters; it++) {
      MPI_Barrier(raw);
      double t0 = MPI_Wtime();
      BENCH_TRY(dtl_moe_layout_dispatch(Lb, x, eb));
      double t1 = MPI_Wtime();
      BENCH_TRY(dtl_moe_layout_combine(Lb, eb, yb));
      double t2 = MPI_Wtime();
      double a_disp = slowest(t1 - t0), a = slowest(t2 - t0);
      MPI_Barrier(raw);
      t0 = MPI_Wtime();
      BENCH_TRY(dtl_moe_layout_dispatch(L8, x, e8));
      t1 = MPI_Wtime();
      BENCH_TRY(dtl_moe_layout_combine(L8, e8, y8));
      t2 = MPI_Wtime();
      double b_disp = slowest(t1 - t0), b = slowest(t2 - t0);
      MPI_Barrier(raw);
      t0 = MPI_Wtime();
      BENCH_TRY(dtl_moe_layout_dispatch_fp8(L8, x, codes, scales));
      double c_disp = slowest(MPI_Wtime() - t0);
      if (it >= 0) {
        tb[it] = a, db[it] = a_disp, t8[it] = b, d8[it] = b_disp, dr[it] = c_disp;
      }
    }
    /* Identity experts, no drops: y[t] = the slots' weighted sum of x[t], in slot order, rounded once to bf16. */
    long long wrong = 0, gwrong = 0;
    double rel = 0, abs_err = 0;
    for (int64_t t = 0; t < T; t++) {
      double rowmax = 0, rowerr = 0;
      for (int64_t h = 0; h < H; h++) {
        float want = 0, xv = from_bf16(x[t * H + h]);
        int used = 0;
        for (int s = 0; s < k; s++)
          if (ids[t * k + s] >= 0) want = used++ ? want + w[t * k + s] * xv : w[t * k + s] * xv;
        wrong += yb[t * H + h] != to_bf16(want);
        double ref = from_bf16(yb[t * H + h]), e = fabs(from_bf16(y8[t * H + h]) - ref);
        rowmax = fmax(rowmax, fabs(ref));
        rowerr = fmax(rowerr, e);
      }
      abs_err = fmax(abs_err, rowerr);
      if (rowmax > 0) rel = fmax(rel, rowerr / rowmax);
    }
    double grel, gabs;
    MPI_Allreduce(&wrong, &gwrong, 1, MPI_LONG_LONG, MPI_SUM, raw);
    MPI_Allreduce(&rel, &grel, 1, MPI_DOUBLE, MPI_MAX, raw);
    MPI_Allreduce(&abs_err, &gabs, 1, MPI_DOUBLE, MPI_MAX, raw);
    double time_b = bench_median(tb, iters), time_8 = bench_median(t8, iters), disp_b = bench_median(db, iters);
    double disp_8 = bench_median(d8, iters), disp_r = bench_median(dr, iters);
    if (rank == 0)
      printf("  %6lld %11.0f %11.0f %5.3f %5.3f %9.1f %9.1f %5.2f %5.2f %5.2f %7lld %9.3g %9.3g %10s\n", tokens, mb, mf,
             mf / mb, (mf + mb) / (2 * mb), time_b * 1e6, time_8 * 1e6, time_8 / time_b, disp_8 / disp_b,
             disp_r / disp_b, gwrong, grel, gabs,
             dtl_moe_layout_exchange(L8) == DTL_MOE_EXCHANGE_SINGLE ? "single" : "per_expert");
    dtl_moe_layout_destroy(Lb);
    dtl_moe_layout_destroy(L8);
    free(x), free(yb), free(y8), free(logits), free(ids), free(w), free(eb), free(e8), free(codes), free(scales);
    free(kept);
  }
  free(tb), free(t8), free(db), free(d8), free(dr);
  dtl_moe_placement_destroy(pl);
  dtl_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}

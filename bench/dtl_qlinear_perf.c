/* SPDX-License-Identifier: Apache-2.0 */
/* Forward time of the column-parallel linear layer on quantized weights (DTL_TP_QUANT_WEIGHTS: each weight tile
 * dequantized into the context's scratch, then the f32 GEMM) against the same layer on the dense f32 weights of the
 * same shape (the dequantized ones), on the host. ratio = quantized / dense, of the wall time and of the calling
 * thread's CPU time (with one OpenBLAS thread that is all the work, and a loaded machine does not inflate it); the
 * issue's target is <= 1.3. #wrong counts outputs that differ from the dense layer's by more than 1e-4 x (1 + max
 * |dense|).
 * Sizes in the nccl-tests manner: -b/-e/-f the range of out = in (K suffixes accepted), -t the token counts, -n/-w
 * timed and warm-up iterations, -q the formats (fp8-block, fp8-channel, fp8-tensor, gptq, awq, q8_0, q4_0). The
 * weights are quantized (dtl_quant_quantize) from uniform reals on the layer's own cut (every block whole there:
 * out / tp must be a multiple of 128 for fp8-block). OpenBLAS runs one thread per rank unless OPENBLAS_NUM_THREADS is
 * set. Run: mpirun -n 1 ./dtl_qlinear_perf -b 1024 -e 4096 -f 2 -t 1,64 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cblas.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "bench_util.h"

typedef struct {
  dtl_tp_linear *l;
  dtl_layout *in;
  const float *x;
  float *y;
} run_arg;

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Median wall and thread-CPU seconds per call of each of the two layers, their calls alternating so that both see
 * the same load (the CPU time of the calling thread is what a loaded machine does not inflate: one OpenBLAS thread). */
static void timed2(MPI_Comm comm, int warmup, int iters, run_arg *a, run_arg *b, double *wall, double *cpu) {
  for (int i = 0; i < warmup; i++) {
    BENCH_TRY(dtl_tp_linear_forward(a->l, a->in, a->x, a->y));
    BENCH_TRY(dtl_tp_linear_forward(b->l, b->in, b->x, b->y));
  }
  double *t = malloc(sizeof(double) * (size_t)(4 * iters));
  run_arg *ab[2] = {a, b};
  for (int i = 0; i < iters; i++)
    for (int k = 0; k < 2; k++) {
      MPI_Barrier(comm);
      double w0 = MPI_Wtime(), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
      BENCH_TRY(dtl_tp_linear_forward(ab[k]->l, ab[k]->in, ab[k]->x, ab[k]->y));
      double dw = MPI_Wtime() - w0, dc = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
      MPI_Allreduce(&dw, &t[(2 * k) * iters + i], 1, MPI_DOUBLE, MPI_MAX, comm);
      MPI_Allreduce(&dc, &t[(2 * k + 1) * iters + i], 1, MPI_DOUBLE, MPI_MAX, comm);
    }
  for (int k = 0; k < 2; k++) {
    wall[k] = bench_median(t + (2 * k) * iters, iters);
    cpu[k] = bench_median(t + (2 * k + 1) * iters, iters);
  }
  free(t);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, np;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  long long lo = 4096, hi = 4096, mul = 2;
  int iters = 10, warmup = 2, ntok = 0, nq = 0;
  int64_t tokens[16];
  dtl_quant_kind kinds[8];
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) break;
    if (!strcmp(a, "-b")) lo = bench_parse_size(v), i++;
    else if (!strcmp(a, "-e")) hi = bench_parse_size(v), i++;
    else if (!strcmp(a, "-f")) mul = bench_parse_size(v), i++;
    else if (!strcmp(a, "-n")) iters = atoi(v), i++;
    else if (!strcmp(a, "-w")) warmup = atoi(v), i++;
    else if (!strcmp(a, "-t") || !strcmp(a, "-q")) {
      char *s = strdup(v);
      for (char *p = s, *tok; (tok = strtok(p, ",")); p = NULL) {
        if (a[1] == 't' && ntok < 16) tokens[ntok++] = (int64_t)bench_parse_size(tok);
        else if (a[1] == 'q' && nq < 8) BENCH_TRY(dtl_quant_kind_parse(tok, &kinds[nq++]));
      }
      free(s);
      i++;
    } else {
      if (rank == 0) fprintf(stderr, "unknown option %s\n", a);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (!ntok) tokens[ntok++] = 64;
  if (!nq) kinds[nq++] = DTL_QUANT_FP8_BLOCK, kinds[nq++] = DTL_QUANT_GPTQ;
  if (iters < 1) iters = 1;
  if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
  dtl_comm *world;
  dtl_mesh *mesh;
  dtl_tp_context *ctx;
  BENCH_TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  BENCH_TRY(dtl_mesh_create(world, 1, &np, &mesh));
  BENCH_TRY(dtl_tp_context_create(mesh, 0, NULL, &ctx));
  if (rank == 0) {
    printf("# dtl_qlinear_perf: column-parallel linear, tp=%d, f32 host, OpenBLAS threads per rank: %s, iters %d "
           "(median), warmup %d\n", np, getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "1", iters,
           warmup);
    printf("# wall and thread CPU time per forward (ms, medians, dense and quantized calls alternating); ratio = "
           "quantized / dense\n");
    printf("%-11s %6s %6s %6s %10s %10s %6s %10s %10s %6s %6s\n", "format", "tokens", "out", "in", "dense", "quant",
           "ratio", "dense cpu", "quant cpu", "ratio", "#wrong");
  }
  for (long long n = lo; n <= hi; n = mul > 1 ? n * mul : hi + 1)
    for (int qi = 0; qi < nq; qi++)
      for (int ti = 0; ti < ntok; ti++) {
        int64_t out = n, in = n, T = tokens[ti];
        dtl_quant_format f = {.kind = kinds[qi]};
        dtl_placement cut = dtl_shard(0);
        int64_t shape[2] = {out, in};
        dtl_qlayout *ql;
        BENCH_TRY(dtl_qlayout_create(mesh, &f, 2, shape, &cut, &ql));
        dtl_qbox box;
        BENCH_TRY(dtl_qlayout_local_boxes(ql, NULL, &box));
        dtl_tp_qweight qw = {.layout = ql};
        for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
          if (box.part[p].ndim >= 0) qw.local.part[p] = malloc(box.part[p].bytes + 8);
        size_t local = (size_t)(box.shape[0] * in);
        float *dense = bench_uniform(7 + (uint64_t)rank, local, 1.0f), *dq = malloc(local * sizeof(float) + 4);
        BENCH_TRY(dtl_quant_quantize(ql, dense, &qw.local));
        BENCH_TRY(dtl_quant_dequantize(ql, &qw.local, dq));
        dtl_tp_linear_params qp = {.mask = DTL_TP_QUANT_WEIGHTS, .kind = DTL_TP_COLUMN, .in_features = in,
                                   .out_features = out, .qweight = &qw};
        dtl_tp_linear_params dp = {.flags = DTL_TP_SHARDED_WEIGHTS, .kind = DTL_TP_COLUMN, .in_features = in,
                                   .out_features = out, .weight = dq};
        run_arg aq = {0}, ad = {0};
        BENCH_TRY(dtl_tp_linear_create(ctx, &qp, &aq.l));
        BENCH_TRY(dtl_tp_linear_create(ctx, &dp, &ad.l));
        BENCH_TRY(dtl_tp_linear_layouts(aq.l, T, &aq.in, NULL));
        ad.in = aq.in;
        float *x = bench_uniform(99, (size_t)(T * in), 1.0f);
        aq.x = ad.x = x;
        aq.y = malloc(sizeof(float) * (size_t)(T * box.shape[0]) + 4);
        ad.y = malloc(sizeof(float) * (size_t)(T * box.shape[0]) + 4);
        double wall[2], cpu[2];
        timed2(MPI_COMM_WORLD, warmup, iters, &ad, &aq, wall, cpu);
        double mx = 0;
        long wrong = 0, all;
        for (int64_t i = 0; i < T * box.shape[0]; i++) mx = fmax(mx, fabs(ad.y[i]));
        for (int64_t i = 0; i < T * box.shape[0]; i++) wrong += !(fabs(aq.y[i] - ad.y[i]) <= 1e-4 * (1 + mx));
        MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0)
          printf("%-11s %6lld %6lld %6lld %10.1f %10.1f %6.2f %10.1f %10.1f %6.2f %6ld\n", dtl_quant_kind_name(kinds[qi]),
                 (long long)T, (long long)out, (long long)in, wall[0] * 1e3, wall[1] * 1e3, wall[1] / wall[0],
                 cpu[0] * 1e3, cpu[1] * 1e3, cpu[1] / cpu[0], all);
        dtl_tp_linear_destroy(aq.l);
        dtl_tp_linear_destroy(ad.l);
        dtl_layout_destroy(aq.in);
        for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(qw.local.part[p]);
        dtl_qlayout_destroy(ql);
        free(dense), free(dq), free(x), free(aq.y), free(ad.y);
      }
  dtl_tp_context_destroy(ctx);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  MPI_Finalize();
  return 0;
}

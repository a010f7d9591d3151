/* SPDX-License-Identifier: Apache-2.0 */
/* Host dequantization throughput of every quantized format on one rank: a -s x -s tensor (default 4096 x 4096) of
 * uniform values in [-1, 1) quantized by dtl_quant_quantize (Q4_K, which dtl cannot quantize: random blocks with
 * finite scales), then dtl_quant_dequantize timed -n times after -w warm-ups. Per format: the bytes of the quantized
 * parts, the median wall time and the median CPU time of the thread (what a loaded machine does not inflate), GB/s of
 * f32 output from each, and the largest |dequantize(quantize(x)) - x|.
 *   dtl_quant_perf [-s 4096] [-n 5] [-w 1] */
#include <math.h>
#include <stdbool.h>
#include <time.h>
#include "bench_util.h"

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int64_t n = 4096;
  int iters = 5, warm = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-s")) n = bench_parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warm = atoi(argv[i + 1]);
  }
  if (iters < 1) iters = 1;
  const struct {
    const char *name;
    dtl_quant_format f;
  } formats[] = {
      {"fp8-block 128x128 e4m3", {.kind = DTL_QUANT_FP8_BLOCK}},
      {"fp8-channel e4m3", {.kind = DTL_QUANT_FP8_CHANNEL}},
      {"fp8-tensor e5m2", {.kind = DTL_QUANT_FP8_TENSOR, .mask = DTL_QFMT_CODE_DTYPE, .code_dtype = DTL_FLOAT8_E5M2}},
      {"gptq g128", {.kind = DTL_QUANT_GPTQ}},
      {"gptq g128 act-order", {.kind = DTL_QUANT_GPTQ, .flags = DTL_QFMT_ACT_ORDER}},
      {"awq g128", {.kind = DTL_QUANT_AWQ}},
      {"q8_0", {.kind = DTL_QUANT_GGUF_Q8_0}},
      {"q4_0", {.kind = DTL_QUANT_GGUF_Q4_0}},
      {"q4_k", {.kind = DTL_QUANT_GGUF_Q4_K}},
  };
  dtl_mesh *m;
  BENCH_TRY(dtl_mesh_create_abstract(1, (int[]){1}, NULL, &m));
  int64_t shape[2] = {n, n};
  size_t count = (size_t)(n * n);
  float *x = bench_uniform(18, count, 1.0f), *y = malloc(count * sizeof *y);
  printf("# dtl_quant_perf: host dtl_quant_dequantize of a %lld x %lld tensor, 1 thread, median of %d\n", (long long)n,
         (long long)n, iters);
  printf("# %-22s %12s %9s %9s %9s %9s %10s\n", "format", "part bytes", "wall(ms)", "GB/s", "cpu(ms)", "GB/s(cpu)",
         "max|err|");
  for (size_t k = 0; k < sizeof formats / sizeof *formats; k++) {
    dtl_qlayout *l;
    BENCH_TRY(dtl_qlayout_create(m, &formats[k].f, 2, shape, (dtl_placement[]){dtl_replicate()}, &l));
    dtl_qbox b;
    BENCH_TRY(dtl_qlayout_local_boxes(l, NULL, &b));
    dtl_qbuf q = {{NULL}};
    size_t bytes = 0;
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
      if (b.part[p].ndim >= 0) {
        q.part[p] = malloc(b.part[p].bytes + 1);
        bytes += b.part[p].bytes;
      }
    bool q4k = formats[k].f.kind == DTL_QUANT_GGUF_Q4_K;
    if (q4k) { /* random blocks, d and dmin 2^-8 (0x1c00) */
      uint8_t *c = q.part[DTL_QPART_CODES];
      uint64_t s = 7;
      for (size_t i = 0; i < b.part[DTL_QPART_CODES].bytes; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        c[i] = (uint8_t)(s >> 56);
      }
      for (size_t at = 0; at < b.part[DTL_QPART_CODES].bytes; at += 144) c[at] = c[at + 2] = 0, c[at + 1] = c[at + 3] = 0x1c;
    } else {
      BENCH_TRY(dtl_quant_quantize(l, x, &q));
    }
    double t[64], tc[64];
    if (iters > 64) iters = 64;
    for (int i = 0; i < warm; i++) BENCH_TRY(dtl_quant_dequantize(l, &q, y));
    for (int i = 0; i < iters; i++) {
      double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
      BENCH_TRY(dtl_quant_dequantize(l, &q, y));
      t[i] = clock_s(CLOCK_MONOTONIC) - t0;
      tc[i] = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    }
    double med = bench_median(t, iters), cpu = bench_median(tc, iters), err = 0, gb = 4.0 * (double)count / 1e9;
    if (!q4k)
      for (size_t i = 0; i < count; i++) err = fmax(err, fabs((double)y[i] - (double)x[i]));
    printf("  %-22s %12zu %9.2f %9.2f %9.2f %9.2f %10.3g%s\n", formats[k].name, bytes, med * 1e3, gb / med, cpu * 1e3,
           gb / cpu, q4k ? 0.0 : err, q4k ? " (random blocks)" : "");
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(q.part[p]);
    dtl_qlayout_destroy(l);
  }
  free(x);
  free(y);
  dtl_mesh_destroy(m);
  MPI_Finalize();
  return 0;
}

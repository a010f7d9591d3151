/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoint loading: rank 0 writes a safetensors file of -s bytes (tensors of [4096, C] f32, 64 MiB each),
 * then every rank loads its shard of every tensor for a few layouts with dtl_safetensors_read. Per layout:
 * the shard bytes of a rank, the growth of its peak resident memory while loading (VmHWM after the load
 * minus VmRSS before it, peak reset through /proc/self/clear_refs; target: at most shard + 64 MiB), the
 * slowest rank's load time and the aggregate bytes/s of all ranks, next to `cat file > /dev/null` timed in
 * the same run (the page cache is warm for both: the file was just written), and next to the time it takes
 * only to allocate and first touch the shard memory (page faults: the floor of any load into new memory,
 * which cat, reusing one small buffer, does not pay). Every element is checked.
 * Then the quantized shards (-q 0 skips them): as many [4096, 4096] weights as the dense file has, once FP8
 * block-scaled (DeepSeek-V3's F8_E4M3 weight + F32 weight_scale_inv [32, 32]) and once GPTQ int4 with group 128
 * and act-order g_idx (qweight [512, 4096] I32, scales [32, 4096] F16, qzeros [32, 512] I32, g_idx [4096] I32),
 * each loaded column-parallel and row-parallel with dtl_tp_qweight_read_column/_row (every part of every rank's
 * shard, allocated by the reader); the same figures, the target being growth <= shard + 4 MiB. Every byte of every
 * part is checked.
 *   mpirun -n 4 dtl_load_perf [-s 256M] [-n 3] [-d /tmp] [-q 1] */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <dtl/mpi.h>
#include "bench_util.h"

#define ROWS 4096
static const int64_t COLS = 4096; /* 64 MiB of f32 per tensor */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static float value(int t, int64_t r, int64_t c) { return (float)((r * COLS + c + 7919 * t) % 65521); }

/* --- Quantized shards -------------------------------------------------------------------------------------------- */
#define QN 4096 /* the weights are [QN, QN] */
#define QG 128  /* FP8 blocks QG x QG, GPTQ groups of QG */

/* Element e of part p of quantized tensor t: a hash, as codes and zeros (FP8 codes never NaN), finite scales, g_idx
 * inside the groups. */
static uint32_t qhash(int t, int p, uint64_t e) {
  uint64_t h = (e + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)(t * 4 + p) << 40);
  return (uint32_t)(h >> 29);
}
typedef struct {
  const char *suffix, *dtype;
  int64_t rows, cols;
  size_t es;
} qpart;
/* The parts of format fp8 (else GPTQ with act-order) of one weight. */
static int qparts(bool fp8, qpart *q) {
  if (fp8) {
    q[0] = (qpart){"weight", "F8_E4M3", QN, QN, 1};
    q[1] = (qpart){"weight_scale_inv", "F32", QN / QG, QN / QG, 4};
    return 2;
  }
  q[0] = (qpart){"qweight", "I32", QN / 8, QN, 4};
  q[1] = (qpart){"scales", "F16", QN / QG, QN, 2};
  q[2] = (qpart){"qzeros", "I32", QN / QG, QN / 8, 4};
  q[3] = (qpart){"g_idx", "I32", 1, QN, 4};
  return 4;
}
static void qvalue(bool fp8, int t, int p, uint64_t e, void *out) {
  uint32_t h = qhash(t, p, e);
  if (p == 0 && fp8) {
    *(uint8_t *)out = (uint8_t)(h & 0x7e);
  } else if (p == 1) {
    float v = 1.0f + (float)(h & 1023) / 1024.0f;
    if (fp8) memcpy(out, &v, 4);
    else {
      uint16_t x = dtl_f32_to_f16(v);
      memcpy(out, &x, 2);
    }
  } else if (p == 3) {
    int32_t g = (int32_t)((e * 37) % (QN / QG));
    memcpy(out, &g, 4);
  } else {
    memcpy(out, &h, 4);
  }
}

/* Writes the file by hand (the FP8 codes' dtype string F8_E4M3 is not one dtl_safetensors_write_add takes yet). */
static void write_quant_file(const char *path, bool fp8, int ntensors) {
  qpart q[4];
  int np = qparts(fp8, q);
  size_t cap = 256 + (size_t)ntensors * np * 160, at = 0;
  char *h = malloc(cap);
  uint64_t off = 0;
  at += (size_t)snprintf(h + at, cap - at, "{");
  for (int t = 0; t < ntensors; t++)
    for (int p = 0; p < np; p++) {
      uint64_t bytes = (uint64_t)q[p].rows * (uint64_t)q[p].cols * q[p].es;
      char shape[48];
      if (p == 3) snprintf(shape, sizeof shape, "[%lld]", (long long)q[p].cols); /* g_idx is 1-D */
      else snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)q[p].rows, (long long)q[p].cols);
      at += (size_t)snprintf(h + at, cap - at, "%s\"layers.%d.%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}",
                             at > 1 ? "," : "", t, q[p].suffix, q[p].dtype, shape, (unsigned long long)off,
                             (unsigned long long)(off + bytes));
      off += bytes;
    }
  at += (size_t)snprintf(h + at, cap - at, "}");
  while (at % 8) h[at++] = ' ';
  FILE *fp = fopen(path, "wb");
  if (!fp) MPI_Abort(MPI_COMM_WORLD, 1);
  unsigned char l8[8];
  for (int i = 0; i < 8; i++) l8[i] = (unsigned char)((uint64_t)at >> (8 * i));
  fwrite(l8, 1, 8, fp);
  fwrite(h, 1, at, fp);
  unsigned char *buf = malloc((size_t)QN * QN);
  for (int t = 0; t < ntensors; t++)
    for (int p = 0; p < np; p++) {
      size_t n = (size_t)(q[p].rows * q[p].cols);
      for (size_t e = 0; e < n; e++) qvalue(fp8, t, p, e, buf + e * q[p].es);
      if (fwrite(buf, q[p].es, n, fp) != n) MPI_Abort(MPI_COMM_WORLD, 1);
    }
  free(buf);
  free(h);
  if (fclose(fp) != 0) MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Elements of the shard's parts that differ from the file's values, and the shard's bytes. */
static long long qcheck(const dtl_tp_qweight *w, bool fp8, int t, size_t *bytes) {
  dtl_qbox b;
  BENCH_TRY(dtl_qlayout_local_boxes(w->layout, NULL, &b));
  long long wrong = 0;
  qpart q[4];
  int np = qparts(fp8, q);
  for (int p = 0; p < np; p++) {
    const dtl_qpart_box *pb = &b.part[p];
    *bytes += pb->bytes;
    int64_t rows = pb->ndim == 2 ? pb->shape[0] : 1, r0 = pb->ndim == 2 ? pb->offset[0] : 0;
    int64_t cols = pb->shape[pb->ndim - 1], c0 = pb->offset[pb->ndim - 1], gcols = pb->global_shape[pb->ndim - 1];
    const unsigned char *got = w->local.part[p];
    unsigned char want[4];
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) {
        qvalue(fp8, t, p, (uint64_t)((r0 + i) * gcols + c0 + j), want);
        wrong += memcmp(got + (size_t)(i * cols + j) * q[p].es, want, q[p].es) != 0;
      }
  }
  return wrong;
}

static void quant_loads(dtl_comm *world, dtl_mesh *mesh, const char *dir, int ntensors, int rounds) {
  int rank = dtl_comm_rank(world), np = dtl_comm_size(world);
  dtl_tp_context *ctx;
  BENCH_TRY(dtl_tp_context_create(mesh, 0, NULL, &ctx));
  if (rank == 0)
    printf("# quantized: %d weights of [%d, %d] per file, dtl_tp_qweight_read_column (S(0)) / _row (S(1)), %d rounds\n"
           "# format | layout | shard MiB/rank | peak RSS growth MiB (max rank) | growth - shard MiB | load s (slowest "
           "rank) | aggregate GB/s | #wrong\n",
           ntensors, QN, QN, rounds);
  for (int fi = 0; fi < 2; fi++) {
    bool fp8 = fi == 0;
    char path[512];
    snprintf(path, sizeof path, "%s/dtl_load_perf_q%d_%d.safetensors", dir, fi, (int)getpid());
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) write_quant_file(path, fp8, ntensors);
    malloc_trim(0);
    MPI_Barrier(MPI_COMM_WORLD);
    dtl_quant_format fmt = fp8 ? (dtl_quant_format){.kind = DTL_QUANT_FP8_BLOCK}
                               : (dtl_quant_format){.kind = DTL_QUANT_GPTQ, .flags = DTL_QFMT_ACT_ORDER};
    for (int row = 0; row < 2; row++) {
      double *times = malloc(sizeof(double) * (size_t)rounds);
      long long growth = 0, wrong = 0;
      size_t shard = 0;
      for (int k = 0; k < rounds; k++) {
        MPI_Barrier(MPI_COMM_WORLD);
        malloc_trim(0);
        bench_reset_peak();
        long long before = bench_status_bytes("VmRSS");
        double t0 = now();
        dtl_safetensors *f;
        BENCH_TRY(dtl_safetensors_open(path, &f));
        dtl_tp_qshard **s = malloc(sizeof *s * (size_t)ntensors);
        for (int t = 0; t < ntensors; t++) {
          char prefix[64];
          snprintf(prefix, sizeof prefix, "layers.%d", t);
          if (row) BENCH_TRY(dtl_tp_qweight_read_row(ctx, f, &fmt, prefix, QN, QN, &s[t]));
          else BENCH_TRY(dtl_tp_qweight_read_column(ctx, f, &fmt, prefix, QN, QN, &s[t]));
        }
        dtl_safetensors_close(f);
        double mine = now() - t0;
        long long g = bench_status_bytes("VmHWM") - before;
        if (g > growth) growth = g;
        MPI_Allreduce(&mine, &times[k], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        shard = 0;
        for (int t = 0; t < ntensors; t++) {
          wrong += qcheck(dtl_tp_qshard_weight(s[t], 0), fp8, t, &shard);
          dtl_tp_qshard_destroy(s[t]);
        }
        free(s);
      }
      long long max_growth, all_wrong, my_shard = (long long)shard, sum_shard;
      MPI_Reduce(&growth, &max_growth, 1, MPI_LONG_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
      MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
      MPI_Reduce(&my_shard, &sum_shard, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
      double t = bench_median(times, rounds);
      if (rank == 0) {
        double mib = (double)shard / (1 << 20);
        printf("%-9s | %-4s | %8.2f | %8.2f | %+7.2f | %.3f | %.2f | %lld\n", fp8 ? "fp8-block" : "gptq-act",
               row ? "S(1)" : "S(0)", mib, (double)max_growth / (1 << 20), (double)max_growth / (1 << 20) - mib, t,
               (double)sum_shard / t / 1e9, all_wrong);
      }
      free(times);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) unlink(path);
  }
  dtl_tp_context_destroy(ctx);
  (void)np;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  long long size = 256ll << 20;
  int rounds = 3, quant = 1;
  const char *dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-s")) size = bench_parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-d")) dir = argv[i + 1];
    else if (!strcmp(argv[i], "-q")) quant = atoi(argv[i + 1]);
  }
  dtl_comm *world;
  BENCH_TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  int rank = dtl_comm_rank(world), np = dtl_comm_size(world);
  int ntensors = (int)(size / (ROWS * COLS * 4));
  if (ntensors < 1) ntensors = 1;
  long long file_bytes = (long long)ntensors * ROWS * COLS * 4;
  char path[512];
  snprintf(path, sizeof path, "%s/dtl_load_perf_%d.safetensors", dir, (int)getpid());
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    float *d = malloc(sizeof(float) * ROWS * COLS);
    dtl_safetensors_writer *w;
    BENCH_TRY(dtl_safetensors_write_begin(path, &w));
    for (int t = 0; t < ntensors; t++) {
      for (int64_t r = 0; r < ROWS; r++)
        for (int64_t c = 0; c < COLS; c++) d[r * COLS + c] = value(t, r, c);
      char name[64];
      snprintf(name, sizeof name, "layers.%d.weight", t);
      int64_t shape[2] = {ROWS, COLS};
      BENCH_TRY(dtl_safetensors_write_add(w, name, DTL_FLOAT32, 2, shape, d));
    }
    BENCH_TRY(dtl_safetensors_write_end(w));
    free(d);
    printf("# dtl_load_perf: %d ranks, %d tensors of [%d, %lld] f32, file %.0f MiB, %d rounds (median), warm page cache\n",
           np, ntensors, ROWS, (long long)COLS, (double)file_bytes / (1 << 20), rounds);
    printf("# layout | shard MiB/rank | peak RSS growth MiB (max rank) | growth - shard MiB | load s (slowest rank) | "
           "aggregate GB/s | cat GB/s | alloc+touch s | #wrong\n");
  }
  malloc_trim(0);
  MPI_Barrier(MPI_COMM_WORLD);
  dtl_mesh *mesh;
  BENCH_TRY(dtl_mesh_create(world, 1, &np, &mesh));
  const char *names[] = {"S(0)", "S(1)", "R"};
  for (int li = 0; li < 3; li++) {
    dtl_placement p;
    int n;
    BENCH_TRY(dtl_placements_parse(names[li], &p, 1, &n));
    dtl_layout *l;
    int64_t shape[2] = {ROWS, COLS};
    BENCH_TRY(dtl_layout_create(mesh, DTL_FLOAT32, 2, shape, &p, &l));
    int64_t s[2], o[2];
    BENCH_TRY(dtl_layout_local_box(l, NULL, s, o));
    size_t local = dtl_layout_local_count(l);
    double *times = malloc(sizeof(double) * (size_t)rounds), *cats = malloc(sizeof(double) * (size_t)rounds),
           *touches = malloc(sizeof(double) * (size_t)rounds);
    long long growth = 0, wrong = 0;
    for (int k = 0; k < rounds; k++) {
      /* cat, alone: every rank waits. */
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "cat '%s' > /dev/null", path);
        double t0 = now();
        if (system(cmd) != 0) fprintf(stderr, "cat failed\n");
        cats[k] = now() - t0;
      }
      MPI_Barrier(MPI_COMM_WORLD);
      /* Allocating and touching the same shard memory, without reading anything. */
      double t1 = now();
      for (int t = 0; t < ntensors; t++) {
        float *p = malloc(sizeof(float) * (local ? local : 1));
        memset(p, 1, sizeof(float) * local);
        __asm__ volatile("" : : "r"(p) : "memory");
        free(p);
      }
      double touch = now() - t1;
      MPI_Allreduce(&touch, &touches[k], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      malloc_trim(0);
      bench_reset_peak();
      long long before = bench_status_bytes("VmRSS");
      double t0 = now();
      dtl_safetensors *f;
      BENCH_TRY(dtl_safetensors_open(path, &f));
      float **shards = malloc(sizeof(float *) * (size_t)ntensors);
      for (int t = 0; t < ntensors; t++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.weight", t);
        shards[t] = malloc(sizeof(float) * (local ? local : 1));
        BENCH_TRY(dtl_safetensors_read(f, name, l, shards[t]));
      }
      dtl_safetensors_close(f);
      double mine = now() - t0;
      long long g = bench_status_bytes("VmHWM") - before;
      if (g > growth) growth = g;
      MPI_Allreduce(&mine, &times[k], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      for (int t = 0; t < ntensors; t++) {
        for (int64_t r = 0; r < s[0]; r++)
          for (int64_t c = 0; c < s[1]; c++) wrong += shards[t][r * s[1] + c] != value(t, o[0] + r, o[1] + c);
        free(shards[t]);
      }
      free(shards);
    }
    long long max_growth, all_wrong;
    MPI_Reduce(&growth, &max_growth, 1, MPI_LONG_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    double shard_mib = (double)local * 4 * ntensors / (1 << 20);
    double t = bench_median(times, rounds);
    if (rank == 0) {
      double c = bench_median(cats, rounds);
      double moved = (double)local * 4 * ntensors * np; /* every rank's shard bytes */
      printf("%-5s | %8.1f | %8.1f | %+7.1f | %.3f | %.2f | %.2f | %.3f | %lld\n", names[li], shard_mib,
             (double)max_growth / (1 << 20), (double)max_growth / (1 << 20) - shard_mib, t, moved / t / 1e9,
             (double)file_bytes / c / 1e9, bench_median(touches, rounds), all_wrong);
    }
    free(times);
    free(cats);
    free(touches);
    dtl_layout_destroy(l);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) unlink(path);
  if (quant) quant_loads(world, mesh, dir, ntensors, rounds);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  MPI_Finalize();
  return 0;
}

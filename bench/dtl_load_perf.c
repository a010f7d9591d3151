/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoint loading: rank 0 writes a safetensors file of -s bytes (tensors of [4096, C] f32, 64 MiB each),
 * then every rank loads its shard of every tensor for a few layouts with dtl_safetensors_read. Per layout:
 * the shard bytes of a rank, the growth of its peak resident memory while loading (VmHWM after the load
 * minus VmRSS before it, peak reset through /proc/self/clear_refs; target: at most shard + 64 MiB), the
 * slowest rank's load time and the aggregate bytes/s of all ranks, next to `cat file > /dev/null` timed in
 * the same run (the page cache is warm for both: the file was just written), and next to the time it takes
 * only to allocate and first touch the shard memory (page faults: the floor of any load into new memory,
 * which cat, reusing one small buffer, does not pay). Every element is checked.
 *   mpirun -n 4 dtl_load_perf [-s 256M] [-n 3] [-d /tmp] */
#define _GNU_SOURCE
#include <malloc.h>
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

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  long long size = 256ll << 20;
  int rounds = 3;
  const char *dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-s")) size = bench_parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-d")) dir = argv[i + 1];
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
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  MPI_Finalize();
  return 0;
}

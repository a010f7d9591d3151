/* SPDX-License-Identifier: Apache-2.0 */
/* What every dtl benchmark shares: nccl-tests size arguments (1K, 64M, 1G), medians, and ending the run on
 * the first failure (a benchmark has nothing to fall back to). Header-only so each bench stays one file. */
#ifndef DTL_BENCH_UTIL_H
#define DTL_BENCH_UTIL_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dtl.h>

/* "1K" -> 1024, "64M", "1G", plain numbers; anything else ends the run with a message naming the text. */
static inline long long bench_parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'G': case 'g': v *= 1024; /* fall through */
    case 'M': case 'm': v *= 1024; /* fall through */
    case 'K': case 'k': v *= 1024; end++; break;
    default: break;
  }
  if (end == s || *end != '\0' || v < 0) {
    fprintf(stderr, "bad size \"%s\" (use e.g. 64, 1K, 64M, 1G)\n", s);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return (long long)v;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v. */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* n deterministic floats in [-scale, scale) from seed (an LCG: the same data on every rank and run). */
static inline float *bench_uniform(uint64_t seed, size_t n, float scale) {
  float *p = malloc(n * sizeof *p + 4);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = scale * (2.0f * (float)(s >> 40) / 16777216.0f - 1.0f);
  }
  return p;
}

/* A field of /proc/self/status in bytes ("VmHWM", "VmRSS"); -1024 when it cannot be read. */
static inline long long bench_status_bytes(const char *field) {
  FILE *fp = fopen("/proc/self/status", "r");
  char line[256];
  long long kb = -1;
  size_t n = strlen(field);
  while (fp && fgets(line, sizeof line, fp))
    if (!strncmp(line, field, n) && line[n] == ':') kb = atoll(line + n + 1);
  if (fp) fclose(fp);
  return kb * 1024;
}

/* Resets VmHWM to the current VmRSS (Linux >= 4.0), so that a later VmHWM is the peak since. */
static inline void bench_reset_peak(void) {
  FILE *fp = fopen("/proc/self/clear_refs", "w");
  if (fp) fputs("5", fp), fclose(fp);
}

static inline void bench_check(dtl_status s, const char *file, int line, const char *call) {
  if (s == DTL_OK) return;
  fprintf(stderr, "%s:%d %s: %s (%s)\n", file, line, call, dtl_status_name(s), dtl_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define BENCH_TRY(call) bench_check((call), __FILE__, __LINE__, #call)

/* The dense oracle of the 2-D benchmarks: global element (i, j) of an n-column f32 tensor (integers, exact in f32
 * after sums over p ranks), and how many elements of this rank's shard of l (NULL: none) differ from it. */
static inline float bench_value(int64_t i, int64_t j, int64_t n) { return (float)((i * n + j) % 4093); }

static inline long bench_count_wrong(const dtl_layout *l, const float *buf, int64_t n) {
  if (!buf) return 0;
  int64_t shape[2], off[2];
  dtl_layout_local_box(l, NULL, shape, off);
  long wrong = 0;
  for (int64_t i = 0; i < shape[0]; i++)
    for (int64_t j = 0; j < shape[1]; j++) wrong += buf[i * shape[1] + j] != bench_value(off[0] + i, off[1] + j, n);
  return wrong;
}

#endif

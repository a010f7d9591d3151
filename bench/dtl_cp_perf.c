/* SPDX-License-Identifier: Apache-2.0 */
/* Context-parallel prefill and the attention-state merge on the host (f32, one OpenBLAS thread per rank).
 *
 * Attention: causal self-attention of one sequence of T tokens, q_heads = kv_heads = -H heads of -d dims.
 * dense = one rank doing the whole sequence (a CP context of one rank), run on every rank at once; ring and
 * ulysses = the sequence split over p ranks (zig-zag layout), the world split into P/p groups of p that all
 * run at once, so every measurement sees the same load on the cores. effic = dense / (p x time). comm = the
 * ring's K/V transfers alone (the same p - 1 dtl_sendrecv steps on buffers of the same size, blocking);
 * exposed = the time the ring spent inside communication calls (dtl_cp_ring_last_stats); hidden = 1 -
 * exposed / comm, the share of the transfers that the attention covered. maxrel = the largest error of ring
 * and ulysses outputs against the dense run, relative to max |dense|; #wrong counts values beyond 1e-4 of it.
 * Times are the slowest rank's, medians over -n iterations after -w warm-up ones.
 *
 * Merge: dtl_attn_state_merge of two [T, H, D] f32 states on every rank at once, GB/s = bytes read and
 * written (both o and lse: 3 x T H D x 4 + 3 x T H x 4) per second, next to memcpy of the o bytes it reads and
 * writes (a copy of 1.5 x T H D x 4 bytes moves the same 3 x T H D x 4), ratio = merge / memcpy.
 *
 * Sizes: -T 2048,8192 (a list) or -b/-e/-f (nccl-tests: first, last, factor; K/M suffixes), -H 8, -d 64,
 * -n 3, -w 1. Run: mpirun -n 4 ./dtl_cp_perf -T 2048,8192 (p = 2 and 4 beside the dense run). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "bench_util.h"

/* The rows of rank r of p (zig-zag), packed from a [T, w] array. */
static float *rows_of(const float *a, int64_t T, int64_t w, int p, int r, int64_t *n) {
  dtl_cp_range rg[2];
  BENCH_TRY(dtl_cp_token_ranges(DTL_CP_ZIGZAG, T, p, r, rg));
  *n = rg[0].count + rg[1].count;
  float *out = malloc(sizeof(float) * (size_t)(*n * w) + 4);
  memcpy(out, a + rg[0].offset * w, sizeof(float) * (size_t)(rg[0].count * w));
  memcpy(out + rg[0].count * w, a + rg[1].offset * w, sizeof(float) * (size_t)(rg[1].count * w));
  return out;
}

/* Median seconds of iters calls (after warmup), the slowest rank of the world each time. */
typedef void (*step_fn)(void *arg);
static double timed(int warmup, int iters, step_fn fn, void *arg) {
  double t[64];
  if (iters > 64) iters = 64;
  for (int i = 0; i < warmup; i++) fn(arg);
  for (int i = 0; i < iters; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    fn(arg);
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(&dt, &t[i], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  }
  return bench_median(t, iters);
}

typedef struct {
  dtl_cp_context *ctx;
  dtl_cp_attention_params p;
  const float *q, *k, *v;
  float *out;
  int ulysses;
  double exposed; /* the ring's time in communication calls, summed over the timed calls */
  int calls;
} attn_arg;
static void attn_step(void *arg) {
  attn_arg *a = arg;
  if (a->ulysses) BENCH_TRY(dtl_cp_ulysses_attention(a->ctx, &a->p, a->q, a->k, a->v, a->out, NULL));
  else {
    BENCH_TRY(dtl_cp_ring_attention(a->ctx, &a->p, a->q, a->k, a->v, a->out, NULL));
    dtl_cp_ring_stats s;
    BENCH_TRY(dtl_cp_ring_last_stats(a->ctx, &s));
    a->exposed += s.comm_seconds;
    a->calls++;
  }
}

/* The ring's transfers alone: p - 1 shifts of the K/V block each rank holds at that step. */
typedef struct {
  dtl_comm *c;
  int64_t T, kvw;
  float *buf[2];
} comm_arg;
static void comm_step(void *arg) {
  comm_arg *a = arg;
  int p = dtl_comm_size(a->c), r = dtl_comm_rank(a->c);
  for (int s = 0; s < p - 1; s++) {
    dtl_cp_range here[2], next[2];
    BENCH_TRY(dtl_cp_token_ranges(DTL_CP_ZIGZAG, a->T, p, (r - s + p) % p, here));
    BENCH_TRY(dtl_cp_token_ranges(DTL_CP_ZIGZAG, a->T, p, (r - s - 1 + p) % p, next));
    size_t ns = (size_t)(2 * (here[0].count + here[1].count) * a->kvw);
    size_t nr = (size_t)(2 * (next[0].count + next[1].count) * a->kvw);
    BENCH_TRY(dtl_sendrecv(a->c, a->buf[s % 2], ns, (r + 1) % p, a->buf[(s + 1) % 2], nr, (r - 1 + p) % p,
                           DTL_FLOAT32));
  }
}

typedef struct {
  int64_t n, states;
  float *oa, *la, *ob, *lb, *src, *copy; /* src, copy: 1.5 x n floats */
  int memcpy_instead;
} merge_arg;
static void merge_step(void *arg) {
  merge_arg *a = arg;
  if (a->memcpy_instead) memcpy(a->copy, a->src, (size_t)a->n * sizeof(float) * 3 / 2);
  else BENCH_TRY(dtl_attn_state_merge(a->states, 1, a->n / a->states, a->oa, a->la, a->ob, a->lb));
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, P;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  int64_t Ts[16] = {2048, 8192}, heads = 8, D = 64, b = 0, e = 0, f = 2;
  int nT = 2, iters = 3, warmup = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "-T")) {
      nT = 0;
      for (char *s = argv[i + 1], *tok; nT < 16 && (tok = strtok(s, ",")); s = NULL) Ts[nT++] = bench_parse_size(tok);
    } else if (!strcmp(a, "-b")) b = bench_parse_size(v);
    else if (!strcmp(a, "-e")) e = bench_parse_size(v);
    else if (!strcmp(a, "-f")) f = bench_parse_size(v);
    else if (!strcmp(a, "-H")) heads = atoi(v);
    else if (!strcmp(a, "-d")) D = atoi(v);
    else if (!strcmp(a, "-n")) iters = atoi(v);
    else if (!strcmp(a, "-w")) warmup = atoi(v);
    else {
      if (rank == 0) fprintf(stderr, "unknown option %s\n", a);
      MPI_Finalize();
      return 2;
    }
  }
  if (b > 0) {
    nT = 0;
    for (int64_t T = b; T <= (e > b ? e : b) && nT < 16; T *= (f > 1 ? f : 2)) Ts[nT++] = T;
  }
  if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
  if (iters < 1) iters = 1;

  dtl_comm *self;
  dtl_mesh *mesh1;
  dtl_cp_context *dense;
  int one = 1;
  BENCH_TRY(dtl_comm_from_mpi(MPI_COMM_SELF, &self));
  BENCH_TRY(dtl_mesh_create(self, 1, &one, &mesh1));
  BENCH_TRY(dtl_cp_context_create(mesh1, 0, NULL, &dense));
  /* The groups of p ranks, p = 2, 4, 8, ... dividing the world. */
  int ps[8], ngroups = 0;
  dtl_comm *gcomm[8];
  dtl_mesh *gmesh[8];
  dtl_cp_context *gctx[8];
  for (int p = 2; p <= P && ngroups < 8; p *= 2) {
    if (P % p) continue;
    MPI_Comm c;
    MPI_Comm_split(MPI_COMM_WORLD, rank / p, rank % p, &c);
    BENCH_TRY(dtl_comm_from_mpi(c, &gcomm[ngroups]));
    MPI_Comm_free(&c);
    BENCH_TRY(dtl_mesh_create(gcomm[ngroups], 1, &p, &gmesh[ngroups]));
    BENCH_TRY(dtl_cp_context_create(gmesh[ngroups], 0, NULL, &gctx[ngroups]));
    ps[ngroups++] = p;
  }
  if (rank == 0) {
    printf("# dtl_cp_perf: %d ranks, causal prefill, %lld heads x %lld, host f32, OpenBLAS threads per rank: %s, "
           "median of %d after %d warm-up\n", P, (long long)heads, (long long)D,
           getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "1", iters, warmup);
    printf("# every measurement runs on all %d ranks at once (dense: each rank alone; p: %d/p groups)\n", P, P);
    printf("%6s %3s %10s %10s %6s %10s %10s %7s %10s %6s %9s %6s\n", "T", "p", "dense(ms)", "ring(ms)", "effic",
           "comm(ms)", "exposed", "hidden", "ulys(ms)", "effic", "maxrel", "#wrong");
  }
  const int64_t w = heads * D;
  for (int ti = 0; ti < nT; ti++) {
    int64_t T = Ts[ti];
    float *Q = bench_uniform(1, (size_t)(T * w), 1.0f), *K = bench_uniform(2, (size_t)(T * w), 1.0f);
    float *V = bench_uniform(3, (size_t)(T * w), 1.0f), *Od = malloc(sizeof(float) * (size_t)(T * w) + 4);
    dtl_cp_attention_params prm = {.flags = DTL_CP_CAUSAL, .tokens = T, .q_heads = heads, .kv_heads = heads,
                                   .head_dim = D};
    /* dense: ring and ulysses on one rank are the same core calls; the faster is the baseline */
    attn_arg ad = {dense, prm, Q, K, V, Od, 0, 0, 0};
    double t_ring1 = timed(warmup, iters, attn_step, &ad);
    ad.ulysses = 1;
    double t_ulys1 = timed(warmup, iters, attn_step, &ad);
    double t_dense = t_ring1 < t_ulys1 ? t_ring1 : t_ulys1;
    double mx = 0;
    for (int64_t i = 0; i < T * w; i++) mx = fmax(mx, fabs(Od[i]));
    if (rank == 0)
      printf("%6lld %3d %10.1f %10.1f %6s %10s %10s %7s %10.1f %6s %9s %6s\n", (long long)T, 1, t_dense * 1e3,
             t_ring1 * 1e3, "-", "-", "-", "-", t_ulys1 * 1e3, "-", "-", "-");
    for (int g = 0; g < ngroups; g++) {
      int p = ps[g], r = rank % p;
      int64_t n;
      float *q = rows_of(Q, T, w, p, r, &n), *k = rows_of(K, T, w, p, r, &n), *v = rows_of(V, T, w, p, r, &n);
      float *o = malloc(sizeof(float) * (size_t)(n * w) + 4), *od = rows_of(Od, T, w, p, r, &n);
      attn_arg ar = {gctx[g], prm, q, k, v, o, 0, 0, 0};
      double t_ring = timed(warmup, iters, attn_step, &ar);
      double exposed = ar.exposed / (ar.calls ? ar.calls : 1), exp_max;
      MPI_Allreduce(&exposed, &exp_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double err = 0;
      long wrong = 0;
      for (int64_t i = 0; i < n * w; i++) {
        double d = fabs((double)o[i] - od[i]);
        err = fmax(err, d);
        wrong += !(d <= 1e-4 * mx);
      }
      ar.ulysses = 1;
      double t_ulys = timed(warmup, iters, attn_step, &ar);
      for (int64_t i = 0; i < n * w; i++) {
        double d = fabs((double)o[i] - od[i]);
        err = fmax(err, d);
        wrong += !(d <= 1e-4 * mx);
      }
      int64_t nmax = (T + 2 * p - 1) / (2 * p) * 2;
      comm_arg ca = {gcomm[g], T, w, {malloc(sizeof(float) * (size_t)(2 * nmax * w) + 4),
                                      malloc(sizeof(float) * (size_t)(2 * nmax * w) + 4)}};
      memset(ca.buf[0], 0, sizeof(float) * (size_t)(2 * nmax * w));
      double t_comm = timed(warmup, iters, comm_step, &ca);
      double err_all, rel;
      long wrong_all;
      MPI_Allreduce(&err, &err_all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
      rel = err_all / (mx > 0 ? mx : 1);
      double hidden = t_comm > 0 ? 1.0 - exp_max / t_comm : 0;
      if (rank == 0)
        printf("%6lld %3d %10.1f %10.1f %6.2f %10.2f %10.2f %6.0f%% %10.1f %6.2f %9.1e %6ld\n", (long long)T, p,
               t_dense * 1e3, t_ring * 1e3, t_dense / (p * t_ring), t_comm * 1e3, exp_max * 1e3,
               100 * (hidden < 0 ? 0 : hidden), t_ulys * 1e3, t_dense / (p * t_ulys), rel, wrong_all);
      fflush(stdout);
      free(q), free(k), free(v), free(o), free(od), free(ca.buf[0]), free(ca.buf[1]);
    }
    free(Q), free(K), free(V), free(Od);
  }

  /* The merge alone against memcpy of the same bytes. */
  if (rank == 0)
    printf("#\n%6s %5s %5s %10s %10s %8s %10s %8s %6s\n", "T", "heads", "dim", "MiB moved", "merge(us)", "GB/s",
           "memcpy(us)", "GB/s", "ratio");
  for (int ti = 0; ti < nT; ti++) {
    int64_t T = Ts[ti], states = T * heads, n = states * D;
    merge_arg m = {n, states, bench_uniform(4, (size_t)n, 1.0f), bench_uniform(5, (size_t)states, 2.0f),
                   bench_uniform(6, (size_t)n, 1.0f),
                   bench_uniform(7, (size_t)states, 2.0f), bench_uniform(8, (size_t)n * 3 / 2, 1.0f),
                   malloc(sizeof(float) * (size_t)n * 3 / 2 + 4), 0};
    double bytes = 3.0 * (double)n * 4 + 3.0 * (double)states * 4;
    double t_merge = timed(warmup, iters * 4, merge_step, &m);
    m.memcpy_instead = 1;
    double t_copy = timed(warmup, iters * 4, merge_step, &m);
    double copy_bytes = 2.0 * (double)((size_t)n * sizeof(float) * 3 / 2);
    if (rank == 0)
      printf("%6lld %5lld %5lld %10.1f %10.1f %8.2f %10.1f %8.2f %6.2f\n", (long long)T, (long long)heads,
             (long long)D, bytes / 1048576.0, t_merge * 1e6, bytes / t_merge / 1e9, t_copy * 1e6,
             copy_bytes / t_copy / 1e9, (bytes / t_merge) / (copy_bytes / t_copy));
    free(m.oa), free(m.la), free(m.ob), free(m.lb), free(m.src), free(m.copy);
  }

  for (int g = 0; g < ngroups; g++) {
    dtl_cp_context_destroy(gctx[g]);
    dtl_mesh_destroy(gmesh[g]);
    dtl_comm_destroy(gcomm[g]);
  }
  dtl_cp_context_destroy(dense);
  dtl_mesh_destroy(mesh1);
  dtl_comm_destroy(self);
  MPI_Finalize();
  return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Collective benchmark in the conventions of nccl-tests: for each collective and message size it prints dtl's
 * time, algbw, busbw and #wrong, beside the time of the raw MPI call dtl makes (same call, same duplicated
 * communicator from dtl_comm_mpi_handle) and the ratio dtl/raw, which measures what dtl adds.
 *
 *   mpirun -n 4 dtl_coll_perf -b 1K -e 64M -f 2 -n 20 -w 5 -c 1 [-o sum] [-d f32] [-t all_reduce]
 *
 * Timing: every iteration runs both, dtl and raw, each after a barrier, alternating which goes first; an
 * iteration's time is the slowest rank's; the time columns show the minimum over the -n iterations (-s min,
 * the default: noise on a shared machine only ever adds time) or their median (-s median). dtl/raw is the
 * median over iterations of the ratio of the two back-to-back runs of one iteration, so that load which
 * comes and goes on a shared machine slows both sides of a ratio alike. size is the bytes of the larger buffer per rank (nccl-tests: the gathered
 * output, the reduce-scatter input), count its elements; busbw = algbw x (2(p-1)/p all-reduce, (p-1)/p
 * all-gather, reduce-scatter, all-to-all, gather, scatter; 1 broadcast, reduce). The last column names the
 * algorithm dtl ran (dtl_comm_mpi_last_algorithm: the MPI call, or one of dtl's own; README, "Collective
 * algorithms"); DTL_ALGO=coll:algo,... forces one. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "bench_util.h"

typedef enum { BCAST, REDUCE, ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, ALL_TO_ALL, GATHER, SCATTER, NCOLLS } coll;
static const char *const coll_names[NCOLLS] = {"broadcast",      "reduce",     "all_gather", "all_reduce",
                                               "reduce_scatter", "all_to_all", "gather",     "scatter"};

static struct {
  size_t min_bytes, max_bytes;
  double factor;
  int iters, warmup, check, root;
  dtl_dtype t;
  dtl_reduce_op op;
  int only;       /* a coll, or -1 for all */
  bool use_median; /* -s median; default -s min */
} opt = {1024, 64u << 20, 2, 20, 5, 1, 0, DTL_FLOAT32, DTL_SUM, -1, false};

static int rank, p;
static dtl_comm *comm;
static MPI_Comm raw_comm;

static void die(const char *what) {
  if (rank == 0) fprintf(stderr, "dtl_coll_perf: %s\n", what);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static void parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (a[0] != '-' || !a[1] || a[2] || !v) {
      if (rank == 0)
        fprintf(stderr, "usage: dtl_coll_perf [-b min] [-e max] [-f factor] [-n iters] [-w warmup] [-c 0|1] "
                        "[-o sum|prod|max|min|avg] [-d f32|f64|f16|bf16|i8|u8|i32|i64|f8e4m3|f8e5m2] [-r root] "
                        "[-t coll|all] [-s min|median]\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    i++;
    switch (a[1]) {
      case 'b': opt.min_bytes = (size_t)bench_parse_size(v); break;
      case 'e': opt.max_bytes = (size_t)bench_parse_size(v); break;
      case 'f': opt.factor = atof(v); break;
      case 'n': opt.iters = atoi(v); break;
      case 'w': opt.warmup = atoi(v); break;
      case 'c': opt.check = atoi(v); break;
      case 'r': opt.root = atoi(v); break;
      case 's':
        if (strcmp(v, "min") != 0 && strcmp(v, "median") != 0) die("bad statistic (min, median)");
        opt.use_median = strcmp(v, "median") == 0;
        break;
      case 'd':
        if (dtl_dtype_parse(v, &opt.t) != DTL_OK) die(dtl_last_error());
        break;
      case 'o': {
        int k = 0;
        while (k < 5 && strcmp(v, dtl_reduce_op_name((dtl_reduce_op)k)) != 0) k++;
        if (k == 5) die("bad op (sum, prod, max, min, avg)");
        opt.op = (dtl_reduce_op)k;
        break;
      }
      case 't':
        opt.only = -1;
        if (strcmp(v, "all") != 0) {
          int k = 0;
          while (k < NCOLLS && strcmp(v, coll_names[k]) != 0) k++;
          if (k == NCOLLS) die("bad collective (broadcast reduce all_gather all_reduce reduce_scatter all_to_all gather scatter all)");
          opt.only = k;
        }
        break;
      default: die("unknown flag");
    }
  }
  if (opt.factor <= 1 || opt.iters < 1 || opt.warmup < 0 || opt.min_bytes > opt.max_bytes) die("bad -f/-n/-w/-b/-e");
  if (opt.root < 0 || opt.root >= p) die("root out of range");
}

/* --- the two implementations of each call --------------------------------------------------------------------- */
static MPI_Datatype mpi_type(dtl_dtype t) {
  switch (t) {
    case DTL_FLOAT32: return MPI_FLOAT;
    case DTL_FLOAT64: return MPI_DOUBLE;
    case DTL_FLOAT16: /* fall through */
    case DTL_BFLOAT16: return MPI_UINT16_T;
    case DTL_INT8: return MPI_INT8_T;
    case DTL_UINT8: /* fall through */
    case DTL_FLOAT8_E4M3: /* fall through */
    case DTL_FLOAT8_E5M2: return MPI_UINT8_T;
    case DTL_INT32: return MPI_INT32_T;
    case DTL_INT64: break;
  }
  return MPI_INT64_T;
}

/* MPI has no f16/bf16 or 8-bit float reductions (dtl brings its own ops), so those have no raw counterpart.
 * DTL_AVG's raw counterpart is the MPI_SUM dtl calls; its division is part of what dtl adds. */
static bool raw_available(coll k) {
  bool reduces = k == REDUCE || k == ALL_REDUCE || k == REDUCE_SCATTER;
  bool own_ops = opt.t == DTL_FLOAT16 || opt.t == DTL_BFLOAT16 || opt.t == DTL_FLOAT8_E4M3 || opt.t == DTL_FLOAT8_E5M2;
  return !(reduces && own_ops);
}

static MPI_Op mpi_op(dtl_reduce_op op) {
  static const MPI_Op ops[] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN, MPI_SUM};
  return ops[op];
}

/* n is the per-rank block (elements) of the rooted/gathering collectives, or the whole count of bcast,
 * reduce and all-reduce. */
static void run_dtl(coll k, void *s, void *r, size_t n) {
  dtl_status st = DTL_OK;
  switch (k) {
    case BCAST: st = dtl_broadcast(comm, s, n, opt.t, opt.root); break;
    case REDUCE: st = dtl_reduce(comm, s, r, n, opt.t, opt.op, opt.root); break;
    case ALL_GATHER: st = dtl_all_gather(comm, s, r, n, opt.t); break;
    case ALL_REDUCE: st = dtl_all_reduce(comm, s, r, n, opt.t, opt.op); break;
    case REDUCE_SCATTER: st = dtl_reduce_scatter(comm, s, r, n, opt.t, opt.op); break;
    case ALL_TO_ALL: st = dtl_all_to_all(comm, s, r, n, opt.t); break;
    case GATHER: st = dtl_gather(comm, s, r, n, opt.t, opt.root); break;
    case SCATTER: st = dtl_scatter(comm, s, r, n, opt.t, opt.root); break;
    default: break;
  }
  if (st != DTL_OK) die(dtl_last_error());
}

static void run_raw(coll k, void *s, void *r, size_t n) {
  int c = (int)n, rc = MPI_SUCCESS;
  MPI_Datatype dt = mpi_type(opt.t);
  switch (k) {
    case BCAST: rc = MPI_Bcast(s, c, dt, opt.root, raw_comm); break;
    case REDUCE: rc = MPI_Reduce(s, r, c, dt, mpi_op(opt.op), opt.root, raw_comm); break;
    case ALL_GATHER: rc = MPI_Allgather(s, c, dt, r, c, dt, raw_comm); break;
    case ALL_REDUCE: rc = MPI_Allreduce(s, r, c, dt, mpi_op(opt.op), raw_comm); break;
    case REDUCE_SCATTER: rc = MPI_Reduce_scatter_block(s, r, c, dt, mpi_op(opt.op), raw_comm); break;
    case ALL_TO_ALL: rc = MPI_Alltoall(s, c, dt, r, c, dt, raw_comm); break;
    case GATHER: rc = MPI_Gather(s, c, dt, r, c, dt, opt.root, raw_comm); break;
    case SCATTER: rc = MPI_Scatter(s, c, dt, r, c, dt, opt.root, raw_comm); break;
    default: break;
  }
  if (rc != MPI_SUCCESS) die("raw MPI call failed");
}

/* --- data and checking ------------------------------------------------------------------------------------------ */
/* Small integers, so every reduction is exact in every dtype (products: at most two 2s among 8 ranks). */
static double value(int r, size_t i) {
  if (opt.op == DTL_PROD) return ((size_t)r + i) % 5 == 0 ? 2 : 1;
  int v = (int)(((size_t)r * 3 + i) % 7);
  return opt.t == DTL_UINT8 ? v : v - 3;
}

static void put(void *buf, size_t i, double v) {
  switch (opt.t) {
    case DTL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DTL_FLOAT64: ((double *)buf)[i] = v; break;
    case DTL_FLOAT16: ((uint16_t *)buf)[i] = dtl_f32_to_f16((float)v); break;
    case DTL_BFLOAT16: ((uint16_t *)buf)[i] = dtl_f32_to_bf16((float)v); break;
    case DTL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DTL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DTL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DTL_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DTL_FLOAT8_E4M3: ((uint8_t *)buf)[i] = dtl_f32_to_f8e4m3((float)v); break;
    case DTL_FLOAT8_E5M2: ((uint8_t *)buf)[i] = dtl_f32_to_f8e5m2((float)v); break;
  }
}

static double get(const void *buf, size_t i) {
  switch (opt.t) {
    case DTL_FLOAT32: return ((const float *)buf)[i];
    case DTL_FLOAT64: return ((const double *)buf)[i];
    case DTL_FLOAT16: return dtl_f16_to_f32(((const uint16_t *)buf)[i]);
    case DTL_BFLOAT16: return dtl_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DTL_INT8: return ((const int8_t *)buf)[i];
    case DTL_UINT8: return ((const uint8_t *)buf)[i];
    case DTL_INT32: return ((const int32_t *)buf)[i];
    case DTL_FLOAT8_E4M3: return dtl_f8e4m3_to_f32(((const uint8_t *)buf)[i]);
    case DTL_FLOAT8_E5M2: return dtl_f8e5m2_to_f32(((const uint8_t *)buf)[i]);
    case DTL_INT64: break;
  }
  return (double)((const int64_t *)buf)[i];
}

/* The reduction of element i over the ranks, with DTL_AVG's documented rounding. */
static double reduced(size_t i) {
  double acc = value(0, i);
  for (int r = 1; r < p; r++) {
    double x = value(r, i);
    acc = opt.op == DTL_PROD ? acc * x : opt.op == DTL_MAX ? (x > acc ? x : acc) : opt.op == DTL_MIN ? (x < acc ? x : acc) : acc + x;
  }
  if (opt.op != DTL_AVG) return acc;
  switch (opt.t) {
    case DTL_FLOAT64: return acc / p;
    case DTL_FLOAT32: return (float)acc / (float)p;
    case DTL_FLOAT16: return dtl_f16_to_f32(dtl_f32_to_f16((float)acc / (float)p));
    case DTL_BFLOAT16: return dtl_bf16_to_f32(dtl_f32_to_bf16((float)acc / (float)p));
    default: return (double)((int64_t)acc / p);
  }
}

/* Element i of rank r's input, laid out as each collective reads it (global index for the block forms). */
static void fill_input(coll k, void *s, size_t n) {
  size_t total = (k == ALL_GATHER || k == GATHER || k == BCAST || k == REDUCE || k == ALL_REDUCE) ? n : n * (size_t)p;
  if (k == BCAST && rank != opt.root) total = 0;
  if (k == SCATTER && rank != opt.root) total = 0;
  for (size_t i = 0; i < total; i++) put(s, i, value(rank, i));
}

/* Runs dtl once more on fresh input and counts the wrong output elements on this rank. */
static long check(coll k, void *s, void *r, size_t n) {
  fill_input(k, s, n);
  run_dtl(k, s, r, n);
  long wrong = 0;
  size_t np = (size_t)p;
  switch (k) {
    case BCAST:
      for (size_t i = 0; i < n; i++) wrong += get(s, i) != value(opt.root, i);
      break;
    case REDUCE:
      if (rank == opt.root)
        for (size_t i = 0; i < n; i++) wrong += get(r, i) != reduced(i);
      break;
    case ALL_REDUCE:
      for (size_t i = 0; i < n; i++) wrong += get(r, i) != reduced(i);
      break;
    case REDUCE_SCATTER:
      for (size_t i = 0; i < n; i++) wrong += get(r, i) != reduced((size_t)rank * n + i);
      break;
    case ALL_GATHER:
    case GATHER:
      if (k == ALL_GATHER || rank == opt.root)
        for (size_t i = 0; i < n * np; i++) wrong += get(r, i) != value((int)(i / n), i % n);
      break;
    case ALL_TO_ALL: /* rank j's block i came from rank i's block j */
      for (size_t i = 0; i < n * np; i++) wrong += get(r, i) != value((int)(i / n), (size_t)rank * n + i % n);
      break;
    case SCATTER:
      for (size_t i = 0; i < n; i++) wrong += get(r, i) != value(opt.root, (size_t)rank * n + i);
      break;
    default: break;
  }
  return wrong;
}

/* --- timing ----------------------------------------------------------------------------------------------------- */
/* The statistic of -s over the iterations: the minimum (default) or the median. Sorts v. */
static double statistic(double *v, int n) {
  double m = bench_median(v, n);
  return opt.use_median ? m : v[0];
}

static double timed(bool use_dtl, coll k, void *s, void *r, size_t n) {
  MPI_Barrier(raw_comm);
  double t0 = MPI_Wtime();
  if (use_dtl) run_dtl(k, s, r, n);
  else run_raw(k, s, r, n);
  return MPI_Wtime() - t0;
}

static double bus_factor(coll k) {
  double f = (double)(p - 1) / p;
  return k == ALL_REDUCE ? 2 * f : (k == BCAST || k == REDUCE) ? 1 : f;
}

/* Worst ratio per collective at >= 1 MiB, for the summary line. */
static double worst_ratio[NCOLLS];

static void bench(coll k, void *s, void *r, double *t_dtl, double *t_raw, double *t_ratio) {
  size_t es = dtl_dtype_size(opt.t), np = (size_t)p;
  bool blocks = !(k == BCAST || k == REDUCE || k == ALL_REDUCE);
  bool raw = raw_available(k);
  for (double bytes = (double)opt.min_bytes; bytes <= (double)opt.max_bytes * 1.0000001; bytes *= opt.factor) {
    size_t count = (size_t)bytes / es;
    size_t n = blocks ? count / np : count; /* elements per call argument */
    if (blocks) count = n * np;
    if (n == 0) continue;
    fill_input(k, s, n);
    for (int w = 0; w < opt.warmup; w++) {
      run_dtl(k, s, r, n);
      if (raw) run_raw(k, s, r, n);
    }
    for (int it = 0; it < opt.iters; it++) {
      bool dtl_first = it % 2 == 0;
      if (dtl_first) t_dtl[it] = timed(true, k, s, r, n);
      if (raw) t_raw[it] = timed(false, k, s, r, n);
      if (!dtl_first) t_dtl[it] = timed(true, k, s, r, n);
    }
    /* An iteration takes as long as its slowest rank. */
    MPI_Allreduce(MPI_IN_PLACE, t_dtl, opt.iters, MPI_DOUBLE, MPI_MAX, raw_comm);
    if (raw) MPI_Allreduce(MPI_IN_PLACE, t_raw, opt.iters, MPI_DOUBLE, MPI_MAX, raw_comm);
    double ratio = 0;
    if (raw) {
      for (int it = 0; it < opt.iters; it++) t_ratio[it] = t_dtl[it] / t_raw[it];
      ratio = bench_median(t_ratio, opt.iters);
    }
    double td = statistic(t_dtl, opt.iters), tr = raw ? statistic(t_raw, opt.iters) : 0;
    long wrong = 0;
    if (opt.check) {
      long mine = check(k, s, r, n);
      MPI_Allreduce(&mine, &wrong, 1, MPI_LONG, MPI_SUM, raw_comm);
    }
    size_t size = count * es;
    double algbw = (double)size / td / 1e9;
    if (raw && size >= (1u << 20) && ratio > worst_ratio[k]) worst_ratio[k] = ratio;
    /* what dtl ran: broadcast, gather and scatter have no choice */
    const char *algo = k == BCAST || k == GATHER || k == SCATTER ? "mpi" : strchr(dtl_comm_mpi_last_algorithm(comm), ':');
    algo = algo ? (algo[0] == ':' ? algo + 1 : algo) : "?";
    if (rank == 0) {
      char rawtxt[64] = "        -       -", wrongtxt[24] = "N/A";
      if (raw) snprintf(rawtxt, sizeof rawtxt, "%9.1f %7.3f", tr * 1e6, ratio);
      if (opt.check) snprintf(wrongtxt, sizeof wrongtxt, "%ld", wrong);
      bool reduces = k == REDUCE || k == ALL_REDUCE || k == REDUCE_SCATTER;
      bool rooted = k == BCAST || k == REDUCE || k == GATHER || k == SCATTER;
      printf("%14s %12zu %11zu %5s %5s %4d %10.1f %7.3f %7.3f %7s %s  %s\n", coll_names[k], size, count,
             dtl_dtype_name(opt.t), reduces ? dtl_reduce_op_name(opt.op) : "none", rooted ? opt.root : -1, td * 1e6,
             algbw, algbw * bus_factor(k), wrongtxt, rawtxt, algo);
      fflush(stdout);
    }
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  parse_args(argc, argv);
  if (dtl_comm_from_mpi(MPI_COMM_WORLD, &comm) != DTL_OK) die(dtl_last_error());
  raw_comm = dtl_comm_mpi_handle(comm);

  /* One pair of buffers large enough for every collective at the largest size, touched before timing. */
  size_t bytes = opt.max_bytes + 64;
  void *s = malloc(bytes), *r = malloc(bytes);
  double *t_dtl = malloc(sizeof(double) * (size_t)opt.iters), *t_raw = malloc(sizeof(double) * (size_t)opt.iters),
         *t_ratio = malloc(sizeof(double) * (size_t)opt.iters);
  if (!s || !r || !t_dtl || !t_raw || !t_ratio) die("out of memory");
  memset(s, 0, bytes);
  memset(r, 0, bytes);

  if (rank == 0) {
    printf("# dtl_coll_perf: dtl %s, %d ranks, dtype %s, op %s, iters %d, warmup %d, check %d\n", dtl_version_string(), p,
           dtl_dtype_name(opt.t), dtl_reduce_op_name(opt.op), opt.iters, opt.warmup, opt.check);
    printf("# time: %s over iterations of the slowest rank's time; raw: the same MPI call on dtl's communicator;\n"
           "# dtl/raw: median over iterations of the ratio of the back-to-back dtl and raw runs\n",
           opt.use_median ? "median" : "minimum");
    printf("#%13s %12s %11s %5s %5s %4s %10s %7s %7s %7s %9s %7s  %s\n", "coll", "size", "count", "type", "redop",
           "root", "time(us)", "algbw", "busbw", "#wrong", "raw(us)", "dtl/raw", "algorithm");
    printf("#%13s %12s %11s %5s %5s %4s %10s %7s %7s %7s %9s %7s\n", "", "(B)", "(elements)", "", "", "", "", "(GB/s)",
           "(GB/s)", "", "", "");
  }
  for (int k = 0; k < NCOLLS; k++)
    if (opt.only < 0 || opt.only == k) bench((coll)k, s, r, t_dtl, t_raw, t_ratio);
  if (rank == 0) {
    printf("# worst dtl/raw at >= 1 MiB:");
    for (int k = 0; k < NCOLLS; k++)
      if ((opt.only < 0 || opt.only == k) && worst_ratio[k] > 0) printf(" %s %.3f", coll_names[k], worst_ratio[k]);
    printf("\n");
  }
  free(s);
  free(r);
  free(t_dtl);
  free(t_raw);
  free(t_ratio);
  dtl_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}

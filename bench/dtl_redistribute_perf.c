/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_redistribute against the one raw MPI collective that moves the same bytes, on a 1-D mesh over all
 * ranks (run with mpirun -n 2 and -n 4): S0->R and S1->R (MPI_Allgather), P->R (MPI_Allreduce), P->S0
 * (MPI_Reduce_scatter_block), S0->S1 (MPI_Alltoall), on the mesh dim's own MPI communicator. The tensor is a
 * square f32 matrix whose side is a multiple of p; size is its global bytes. dtl and raw rounds interleave;
 * each time is the slowest rank's; times are medians over -n rounds, and the ratio is the median of the
 * per-round ratios dtl/raw (robust to load that comes and goes on a shared machine). #wrong checks dtl's
 * result.
 * Then the cached-plan overhead: dtl_redistribute minus dtl_plan_execute of the same prebuilt plan (a
 * one-element R->R plan, so no communication hides it), and both calls' time on a plan of one local step (R->S0);
 * the cost of DTL_CHECK per call: the same small redistributions on a mesh whose communicator was made with
 * DTL_CHECK=0 and on one made with DTL_CHECK=1 (target: < 2 us per call).
 * Targets (issue 3): ratio <= 1.05 where the shard is contiguous (S0->R, P->R, P->S0), <= 1.25 for S1->R and
 * S0->S1 from 1 MiB; cached-plan overhead < 1 us. S1->R and S0->S1 pay one local pass over the shard (unpack
 * or pack), on one node the same cost class as the shared-memory transfer itself.
 * The cost model's prediction: each case prints dtl_plan_cost of the plan dtl_redistribute runs beside the measured
 * time, and the end the median of |predicted - measured| / measured (target, calibrated: <= 25%). The model is the
 * one plans resolve (DTL_PROFILE, DTL_PLAN_TUNE), or with -k one dtl_cost_model_calibrate measures first (passed
 * to every plan through DTL_PLAN_TUNE). -r times every route the planner considered for each case (the plans that
 * other cost models choose: latency only, bandwidth only, costly local copies; and the smaller scratch limit),
 * each by dtl_plan_execute, and reports the chosen plan's time against the fastest (target: within 10%).
 * Options (nccl-tests style): -b min bytes, -e max bytes, -f factor (K/M/G suffixes), -n rounds, -w warmup;
 * -c CASE runs one case only (e.g. -c S1-\>R; -c check: only the overhead and DTL_CHECK lines); -k calibrate
 * first; -r time the routes; -s skip the overhead and DTL_CHECK lines. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "bench_util.h"

static int rank, nranks;

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    case 'M': case 'm': v *= 1024.0 * 1024; break;
    case 'K': case 'k': v *= 1024.0; break;
    default: break;
  }
  return (size_t)v;
}

static double median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
      double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef enum { C_S0_R, C_S1_R, C_P_R, C_P_S0, C_S0_S1, C_COUNT } bench_case;
static const char *case_name[] = {"S0->R", "S1->R", "P->R", "P->S0", "S0->S1"};
static const char *raw_name[] = {"MPI_Allgather", "MPI_Allgather", "MPI_Allreduce", "MPI_Reduce_scatter_block",
                                 "MPI_Alltoall"};

typedef struct {
  dtl_layout *src, *dst;
  float *in, *out, *raw_in, *raw_out;
  size_t raw_count; /* elements per rank of the raw call's send (allgather, alltoall: per peer) */
} bench_buf;

/* Fills this rank's source shard: shards of the dense tensor, or (P) parts whose sum is the dense tensor. */
static void fill_source(const dtl_layout *l, float *buf, int64_t n, bool partial) {
  int64_t shape[2], off[2];
  dtl_layout_local_box(l, NULL, shape, off);
  for (int64_t i = 0; i < shape[0]; i++)
    for (int64_t j = 0; j < shape[1]; j++) {
      float v = bench_value(off[0] + i, off[1] + j, n);
      buf[i * shape[1] + j] = partial ? (rank == 0 ? v - (float)(nranks - 1) : 1.0f) : v;
    }
}

static void raw_call(bench_case c, bench_buf *b, MPI_Comm comm) {
  int cnt = (int)b->raw_count;
  switch (c) {
    case C_S0_R:
    case C_S1_R: MPI_Allgather(b->raw_in, cnt, MPI_FLOAT, b->raw_out, cnt, MPI_FLOAT, comm); break;
    case C_P_R: MPI_Allreduce(b->raw_in, b->raw_out, cnt, MPI_FLOAT, MPI_SUM, comm); break;
    case C_P_S0: MPI_Reduce_scatter_block(b->raw_in, b->raw_out, cnt, MPI_FLOAT, MPI_SUM, comm); break;
    default: MPI_Alltoall(b->raw_in, cnt, MPI_FLOAT, b->raw_out, cnt, MPI_FLOAT, comm); break;
  }
}

/* Slowest rank's time of one call. */
static double timed(int is_dtl, bench_case c, bench_buf *b, MPI_Comm comm, int *failed) {
  MPI_Barrier(comm);
  double t0 = MPI_Wtime();
  if (is_dtl) {
    if (dtl_redistribute(b->src, b->in, b->dst, b->out) != DTL_OK) {
      if (!*failed) fprintf(stderr, "[rank %d] %s: %s\n", rank, case_name[c], dtl_last_error());
      *failed = 1;
    }
  } else {
    raw_call(c, b, comm);
  }
  double t = MPI_Wtime() - t0, tmax;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, comm);
  return tmax;
}

static dtl_placement parse1(const char *t) {
  dtl_placement p;
  int n;
  dtl_placements_parse(t, &p, 1, &n);
  return p;
}

/* The slowest rank's time of one dtl_plan_execute of plan. */
static double plan_time(const dtl_plan *plan, bench_buf *b, MPI_Comm comm) {
  MPI_Barrier(comm);
  double t0 = MPI_Wtime();
  dtl_plan_execute(plan, b->in, b->out);
  double t = MPI_Wtime() - t0, tmax;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, comm);
  return tmax;
}

/* "all-gather" or "reduce-scatter+local-slice": the step kinds of explain's lines ("step N  [mesh dim M]  kind"). */
static void route_name(const dtl_plan *p, char *out, size_t cap) {
  size_t need = dtl_plan_explain_needed(p), o = 0;
  char *text = malloc(need);
  out[0] = '\0';
  if (!text || dtl_plan_explain(p, text, need) != DTL_OK) {
    free(text);
    return;
  }
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    char w[6][48];
    int n = sscanf(line, "%47s %47s %47s %47s %47s %47s", w[0], w[1], w[2], w[3], w[4], w[5]);
    if (n < 3 || strcmp(w[0], "step")) continue;
    const char *kind = n >= 6 && !strcmp(w[2], "mesh") ? w[5] : w[2];
    o += (size_t)snprintf(out + o, o < cap ? cap - o : 0, "%s%s", o ? "+" : "", kind);
    if (o >= cap) break;
  }
  free(text);
}

/* Every route the planner considered for src -> dst: the plan of each cost model that favours another trade-off,
 * and the plan under half the chosen plan's scratch; each distinct one timed. Returns chosen / fastest. */
static double time_routes(const char *cname, size_t bytes, bench_buf *b, MPI_Comm comm, int iters) {
  dtl_plan *cand[8];
  const char *why[8];
  int nc = 0;
  if (dtl_plan_create(b->src, b->dst, &cand[nc]) != DTL_OK) return NAN;
  why[nc++] = "chosen";
  static const struct {
    const char *why;
    dtl_cost_model m;
  } alt[] = {
      {"latency only", {.mask = DTL_COST_BETA | DTL_COST_INTER_BETA | DTL_COST_LOCAL_BETA}},
      {"bandwidth only", {.mask = DTL_COST_ALPHA | DTL_COST_INTER_ALPHA}},
      {"costly copies", {.mask = DTL_COST_LOCAL_BETA, .local_beta_s_per_byte = 1e-6}},
      {"costly links", {.mask = DTL_COST_BETA | DTL_COST_INTER_BETA, .beta_s_per_byte = 1e-6, .inter_beta_s_per_byte = 1e-6}},
  };
  for (size_t k = 0; k < sizeof alt / sizeof *alt; k++)
    if (dtl_plan_create_with_cost(b->src, b->dst, &alt[k].m, &cand[nc]) == DTL_OK) why[nc++] = alt[k].why;
  size_t sc = dtl_plan_scratch_bytes(cand[0]);
  if (sc > 0 && dtl_plan_create_with_limit(b->src, b->dst, sc / 2, &cand[nc]) == DTL_OK) why[nc++] = "half scratch";
  int uniq[8], nu = 0;
  for (int i = 0; i < nc; i++) {
    uint64_t si, ri, sj, rj;
    dtl_plan_bytes(cand[i], &si, &ri);
    bool dup = false;
    for (int u = 0; u < nu && !dup; u++) {
      const dtl_plan *o = cand[uniq[u]];
      dtl_plan_bytes(o, &sj, &rj);
      dup = dtl_plan_num_steps(cand[i]) == dtl_plan_num_steps(o) &&
            dtl_plan_num_collectives(cand[i]) == dtl_plan_num_collectives(o) && si == sj && ri == rj &&
            dtl_plan_scratch_bytes(cand[i]) == dtl_plan_scratch_bytes(o);
    }
    if (!dup) uniq[nu++] = i;
  }
  /* Rounds interleave the routes, so that load coming and going on a shared machine falls on all of them. */
  double *t = malloc(sizeof(double) * (size_t)(nu * iters));
  for (int u = 0; u < nu; u++) dtl_plan_execute(cand[uniq[u]], b->in, b->out); /* warm-up: workspaces */
  for (int r = 0; r < iters; r++)
    for (int u = 0; u < nu; u++) t[u * iters + r] = plan_time(cand[uniq[u]], b, comm);
  double chosen = NAN, best = INFINITY;
  for (int u = 0; u < nu; u++) {
    double m = median(t + u * iters, iters);
    if (u == 0) chosen = m;
    if (m < best) best = m;
    char name[128];
    route_name(cand[uniq[u]], name, sizeof name);
    if (rank == 0) printf("#   route %-7s %10zu  %-34s %-15s %12.1f us\n", cname, bytes, name, why[uniq[u]], m * 1e6);
  }
  free(t);
  for (int i = 0; i < nc; i++) dtl_plan_destroy(cand[i]);
  return chosen / best;
}

/* Per-call time (best of 5 rounds) of dtl_redistribute and of dtl_plan_execute on the same prebuilt plan from
 * placement `from` to `to` of an n-element f32 vector (plans with no collective, so no communication hides
 * the host-side work). */
static void per_call(dtl_mesh *mesh, const char *from, const char *to, int64_t n, double *redistribute_s,
                     double *execute_s) {
  int64_t shape[1] = {n};
  dtl_placement pa = parse1(from), pb = parse1(to);
  dtl_layout *a, *b;
  dtl_layout_create(mesh, DTL_FLOAT32, 1, shape, &pa, &a);
  dtl_layout_create(mesh, DTL_FLOAT32, 1, shape, &pb, &b);
  dtl_plan *plan;
  dtl_plan_create(a, b, &plan);
  float *x = calloc((size_t)n, sizeof *x), *y = calloc((size_t)n, sizeof *y);
  const int iters = 200000;
  double best_r = 1e9, best_e = 1e9;
  for (int round = 0; round < 5; round++) {
    struct timespec t0, t1, t2;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < iters; i++) dtl_redistribute(a, x, b, y);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int i = 0; i < iters; i++) dtl_plan_execute(plan, x, y);
    clock_gettime(CLOCK_MONOTONIC, &t2);
    double tr = ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)) / iters;
    double te = ((double)(t2.tv_sec - t1.tv_sec) + 1e-9 * (double)(t2.tv_nsec - t1.tv_nsec)) / iters;
    if (tr < best_r) best_r = tr;
    if (te < best_e) best_e = te;
  }
  *redistribute_s = best_r;
  *execute_s = best_e;
  free(x);
  free(y);
  dtl_plan_destroy(plan);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
}

/* Seconds per uncached dtl_plan_create + destroy on this (real) mesh, best of 5 rounds: creation compiles what
 * execution needs for this rank (boxes, peer tables, buffer placement), which abstract meshes skip. */
static double create_time(dtl_mesh *mesh, const char *from, const char *to) {
  int64_t shape[2] = {4096, 4096};
  dtl_placement pa = parse1(from), pb = parse1(to);
  dtl_layout *a, *b;
  dtl_layout_create(mesh, DTL_FLOAT32, 2, shape, &pa, &a);
  dtl_layout_create(mesh, DTL_FLOAT32, 2, shape, &pb, &b);
  const int iters = 2000;
  double best = 1e9;
  for (int round = 0; round < 5; round++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < iters; i++) {
      dtl_plan *plan;
      dtl_plan_create(a, b, &plan);
      dtl_plan_destroy(plan);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double t = ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)) / iters;
    if (t < best) best = t;
  }
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  return best;
}

/* Cached-plan overhead: dtl_redistribute minus dtl_plan_execute on a one-element R->R plan (no steps); then
 * the driver's own per-call cost on a plan with one local step (R->S0 of 4p elements, a slice). */
static void overhead(dtl_mesh *mesh) {
  double r0, e0, r1, e1;
  per_call(mesh, "R", "R", 1, &r0, &e0);
  per_call(mesh, "R", "S(0)", 4 * (int64_t)nranks, &r1, &e1);
  if (rank == 0)
    printf("# cached-plan overhead (rank 0, 1-element R->R plan, best of 5 rounds of 200000 calls):\n"
           "#   dtl_redistribute %.1f ns/call, dtl_plan_execute %.1f ns/call, overhead %.1f ns/call (target < 1000)\n"
           "# one local step (R->S0, %d elements): dtl_redistribute %.1f ns/call, dtl_plan_execute %.1f ns/call\n",
           r0 * 1e9, e0 * 1e9, (r0 - e0) * 1e9, 4 * nranks, r1 * 1e9, e1 * 1e9);
  double c0 = create_time(mesh, "S(0)", "R"), c1 = create_time(mesh, "S(0)", "S(1)");
  if (rank == 0)
    printf("# uncached dtl_plan_create + destroy on this mesh, f32 [4096,4096]: S0->R %.2f us, S0->S1 %.2f us\n",
           c0 * 1e6, c1 * 1e6);
}

/* Per-call time of dtl_redistribute with DTL_CHECK off and on: many short rounds of back-to-back calls on
 * each mesh, interleaved; each rank keeps its fastest round (load on a shared machine only ever adds), and
 * the slowest rank's figure is reported. The collectives themselves keep the ranks in step. */
static void check_cost(void) {
  char saved[64] = "";
  const char *env = getenv("DTL_CHECK");
  if (env) snprintf(saved, sizeof saved, "%s", env);
  dtl_comm *comm[2];
  dtl_mesh *mesh[2];
  int shape1[1] = {nranks};
  for (int on = 0; on < 2; on++) { /* DTL_CHECK is read when the communicator is made */
    setenv("DTL_CHECK", on ? "1" : "0", 1);
    if (dtl_comm_from_mpi(MPI_COMM_WORLD, &comm[on]) != DTL_OK || dtl_mesh_create(comm[on], 1, shape1, &mesh[on]) != DTL_OK) {
      fprintf(stderr, "dtl_redistribute_perf: %s\n", dtl_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  if (env) setenv("DTL_CHECK", saved, 1);
  else unsetenv("DTL_CHECK");
  if (rank == 0)
    printf("# DTL_CHECK cost per call (dtl_redistribute, f32, fastest of 41 rounds of 500 (1 KiB) or 50 calls, slowest rank; "
           "target < 2 us):\n#   %-7s %10s %12s %12s %12s\n", "case", "size", "off us/call", "on us/call", "check us");
  static const char *from[] = {"S0", "P"}, *to[] = {"R", "R"}, *name[] = {"S0->R", "P->R"};
  const int64_t sides[] = {16, 128}; /* 1 KiB and 64 KiB */
  const int rounds = 41; /* many short rounds: one is likely to fall in a quiet moment of a shared machine */
  for (int si = 0; si < 2; si++) {
    const int calls = si ? 50 : 500;
    int64_t n = (sides[si] + nranks - 1) / nranks * nranks, gshape[2] = {n, n};
    for (int c = 0; c < 2; c++) {
      dtl_layout *src[2], *dst[2];
      dtl_placement ps = parse1(from[c]), pd = parse1(to[c]);
      for (int on = 0; on < 2; on++) {
        dtl_layout_create(mesh[on], DTL_FLOAT32, 2, gshape, &ps, &src[on]);
        dtl_layout_create(mesh[on], DTL_FLOAT32, 2, gshape, &pd, &dst[on]);
      }
      float *in = calloc((size_t)(n * n) + 1, 4), *out = calloc((size_t)(n * n) + 1, 4);
      double best[2] = {1e9, 1e9};
      int failed = 0;
      for (int r = 0; r < rounds; r++)
        for (int on = 0; on < 2; on++) {
          double t0 = MPI_Wtime();
          for (int i = 0; i < calls; i++) failed |= dtl_redistribute(src[on], in, dst[on], out) != DTL_OK;
          double t = (MPI_Wtime() - t0) / calls;
          if (t < best[on]) best[on] = t;
        }
      MPI_Allreduce(MPI_IN_PLACE, best, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
      if (rank == 0)
        printf("    %-7s %10lld %12.2f %12.2f %12.2f%s\n", name[c], (long long)(n * n * 4), best[0] * 1e6, best[1] * 1e6,
               (best[1] - best[0]) * 1e6, failed ? "  (a call failed)" : "");
      free(in);
      free(out);
      for (int on = 0; on < 2; on++) {
        dtl_layout_destroy(src[on]);
        dtl_layout_destroy(dst[on]);
      }
    }
  }
  /* The floor: the one all-reduce of three integers that the agreement adds, as a bare MPI call. */
  double bare = 1e9;
  for (int r = 0; r < rounds; r++) {
    int64_t v[3] = {rank, -rank, 0}, g[3];
    double t0 = MPI_Wtime();
    for (int i = 0; i < 500; i++) MPI_Allreduce(v, g, 3, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / 500;
    if (t < bare) bare = t;
  }
  MPI_Allreduce(MPI_IN_PLACE, &bare, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) printf("#   bare MPI_Allreduce of 3 int64 (what the check adds at least): %.2f us/call\n", bare * 1e6);
  for (int on = 0; on < 2; on++) {
    dtl_mesh_destroy(mesh[on]);
    dtl_comm_destroy(comm[on]);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  size_t minb = 1024, maxb = 64u << 20, factor = 4;
  int iters = 20, warmup = 3, opt, calibrate = 0, routes = 0, skip = 0;
  const char *only = NULL;
  while ((opt = getopt(argc, argv, "b:e:f:n:w:c:krs")) != -1) {
    switch (opt) {
      case 'b': minb = parse_size(optarg); break;
      case 'e': maxb = parse_size(optarg); break;
      case 'f': factor = parse_size(optarg); break;
      case 'n': iters = atoi(optarg); break;
      case 'w': warmup = atoi(optarg); break;
      case 'c': only = optarg; break;
      case 'k': calibrate = 1; break;
      case 'r': routes = 1; break;
      case 's': skip = 1; break;
      default:
        if (rank == 0)
          fprintf(stderr, "usage: dtl_redistribute_perf [-b min] [-e max] [-f factor] [-n rounds] [-w warmup] [-c case] "
                          "[-k] [-r] [-s]\n");
        MPI_Finalize();
        return 2;
    }
  }
  if (minb < 4 || maxb < minb || factor < 2 || iters < 1 || warmup < 0) {
    if (rank == 0) fprintf(stderr, "dtl_redistribute_perf: need 4 <= -b <= -e, -f >= 2, -n >= 1, -w >= 0\n");
    MPI_Finalize();
    return 2;
  }
  dtl_comm *comm;
  dtl_mesh *mesh;
  int shape1[1] = {nranks};
  if (dtl_comm_from_mpi(MPI_COMM_WORLD, &comm) != DTL_OK || dtl_mesh_create(comm, 1, shape1, &mesh) != DTL_OK) {
    fprintf(stderr, "dtl_redistribute_perf: %s\n", dtl_last_error());
    return 1;
  }
  MPI_Comm mc = dtl_comm_mpi_handle(dtl_mesh_dim_comm(mesh, 0));
  if (calibrate) { /* every rank gets the same model: every plan prices with it through DTL_PLAN_TUNE */
    dtl_cost_model m;
    double t0 = MPI_Wtime();
    if (dtl_cost_model_calibrate(mesh, &m) != DTL_OK) {
      fprintf(stderr, "dtl_redistribute_perf: %s\n", dtl_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    char tune[320];
    snprintf(tune, sizeof tune, "alpha=%.17g,beta=%.17g,local_beta=%.17g,inter_alpha=%.17g,inter_beta=%.17g", m.alpha_s,
             m.beta_s_per_byte, m.local_beta_s_per_byte, m.inter_alpha_s, m.inter_beta_s_per_byte);
    setenv("DTL_PLAN_TUNE", tune, 1);
    if (rank == 0)
      printf("# calibrated in %.2f s: alpha %.3g s, beta %.3g s/B (%.2f GB/s), local_beta %.3g s/B (%.2f GB/s)\n",
             MPI_Wtime() - t0, m.alpha_s, m.beta_s_per_byte, 1e-9 / m.beta_s_per_byte, m.local_beta_s_per_byte,
             1e-9 / m.local_beta_s_per_byte);
  }
  double errs[64], quality[64];
  int nerr = 0, nq = 0;
  double *td = malloc(sizeof(double) * (size_t)iters), *tr = malloc(sizeof(double) * (size_t)iters);
  double *tq = malloc(sizeof(double) * (size_t)iters);
  if (rank == 0)
    printf("# dtl_redistribute vs the raw MPI collective on a 1-D mesh of %d ranks: square f32 tensor, size = global "
           "bytes;\n# %d interleaved rounds after %d warmup, slowest rank per round; times: medians; ratio: median of the "
           "per-round dtl/raw\n"
           "# pred us: dtl_plan_cost of the plan (cost model: %s); pred/meas: it over the dtl time\n"
           "# %-7s %10s %10s %5s %12s %9s %9s %12s %7s %7s %10s %9s  %s\n",
           nranks, iters, warmup, calibrate ? "calibrated (-k)" : getenv("DTL_PROFILE") ? "DTL_PROFILE" : "defaults",
           "case", "size", "count", "type", "dtl time us", "algbw", "busbw", "raw time us", "ratio", "#wrong", "pred us",
           "pred/meas", "raw call");
  int failed = 0;
  for (size_t bytes = minb; bytes <= maxb; bytes *= factor) {
    int64_t n = (int64_t)llround(sqrt((double)bytes / 4.0) / nranks) * nranks;
    if (n < nranks) n = nranks;
    int64_t gshape[2] = {n, n};
    size_t count = (size_t)(n * n), real = count * 4;
    for (int c = 0; c < C_COUNT; c++) {
      if (only && strcmp(only, case_name[c]) != 0) continue;
      static const char *from[] = {"S0", "S1", "P", "P", "S0"}, *to[] = {"R", "R", "R", "S0", "S1"};
      bench_buf b;
      dtl_placement ps = parse1(from[c]), pd = parse1(to[c]);
      dtl_layout_create(mesh, DTL_FLOAT32, 2, gshape, &ps, &b.src);
      dtl_layout_create(mesh, DTL_FLOAT32, 2, gshape, &pd, &b.dst);
      size_t in_n = dtl_layout_local_count(b.src), out_n = dtl_layout_local_count(b.dst);
      b.in = malloc(in_n * 4 + 4);
      b.out = malloc(out_n * 4 + 4);
      b.raw_in = malloc(in_n * 4 + 4);
      b.raw_out = malloc(out_n * 4 + 4);
      b.raw_count = c == C_S0_S1 ? in_n / (size_t)nranks : c == C_P_S0 ? out_n : in_n;
      fill_source(b.src, b.in, n, c == C_P_R || c == C_P_S0);
      memcpy(b.raw_in, b.in, in_n * 4);
      memset(b.out, 0, out_n * 4);
      memset(b.raw_out, 0, out_n * 4);
      for (int i = 0; i < warmup; i++) {
        timed(1, (bench_case)c, &b, mc, &failed);
        timed(0, (bench_case)c, &b, mc, &failed);
      }
      for (int i = 0; i < iters; i++) {
        td[i] = timed(1, (bench_case)c, &b, mc, &failed);
        tr[i] = timed(0, (bench_case)c, &b, mc, &failed);
        tq[i] = td[i] / tr[i];
      }
      long wrong = bench_count_wrong(b.dst, b.out, n), total_wrong = 0;
      MPI_Allreduce(&wrong, &total_wrong, 1, MPI_LONG, MPI_SUM, mc);
      double md = median(td, iters), mr = median(tr, iters), ratio = median(tq, iters);
      double busf = c == C_P_R ? 2.0 * (nranks - 1) / nranks : (double)(nranks - 1) / nranks;
      double algbw = (double)real / md / 1e9;
      dtl_plan *plan = NULL;
      double pred = dtl_plan_create(b.src, b.dst, &plan) == DTL_OK ? dtl_plan_cost(plan) : NAN;
      dtl_plan_destroy(plan);
      if (nerr < 64) errs[nerr++] = fabs(pred - md) / md;
      if (rank == 0)
        printf("  %-7s %10zu %10zu %5s %12.1f %9.3f %9.3f %12.1f %7.3f %7ld %10.1f %9.3f  %s\n", case_name[c], real, count,
               "f32", md * 1e6, algbw, algbw * busf, mr * 1e6, ratio, total_wrong, pred * 1e6, pred / md, raw_name[c]);
      if (routes && nq < 64) quality[nq++] = time_routes(case_name[c], real, &b, mc, iters);
      free(b.in);
      free(b.out);
      free(b.raw_in);
      free(b.raw_out);
      dtl_layout_destroy(b.src);
      dtl_layout_destroy(b.dst);
    }
  }
  if (rank == 0 && nerr) {
    double e = median(errs, nerr);
    printf("# cost model: median |predicted - measured| / measured over %d cases: %.1f%% (target <= 25%%)\n", nerr, e * 100);
  }
  if (rank == 0 && nq) {
    double worst = 1;
    for (int i = 0; i < nq; i++) worst = quality[i] > worst ? quality[i] : worst;
    printf("# routes: the chosen plan's time over the fastest route's, worst of %d cases: %.3f, median %.3f (target <= 1.10)\n",
           nq, worst, median(quality, nq));
  }
  if (!skip) {
    overhead(mesh);
    check_cost();
  }
  free(td);
  free(tr);
  free(tq);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(comm);
  MPI_Finalize();
  return failed;
}

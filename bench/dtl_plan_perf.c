/* SPDX-License-Identifier: Apache-2.0 */
/* Uncached dtl_plan_create: plans per second for a set of placement pairs on 1-D, 2-D, 3-D and 4-D meshes
 * (abstract meshes: planning is pure, so this needs no MPI launch and runs on one process).
 * Options: -n iterations per pair, split into 5 timed rounds of which the fastest is reported (default
 * 2000), -w warmup iterations (default 100). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <dtl.h>

typedef struct {
  int mesh_ndim, mesh[4];
  int ndim;
  int64_t shape[8];
  const char *from, *to;
} pair;

static const pair pairs[] = {
    {1, {8}, 2, {4096, 4096}, "S0", "R"},
    {1, {8}, 2, {4096, 4096}, "P", "R"},
    {1, {8}, 2, {4096, 4096}, "S0", "S1"},
    {1, {8}, 2, {4096, 4096}, "P", "S1"},
    {2, {4, 2}, 2, {4096, 4096}, "S0,S1", "S1,S0"},
    {2, {4, 2}, 2, {4096, 4096}, "S0,S0", "S1,S1"},
    {2, {4, 2}, 2, {4096, 4096}, "P,P", "R,R"},
    {2, {4, 2}, 2, {4096, 4096}, "S0,R", "R,S1"},
    {2, {8, 8}, 3, {512, 512, 512}, "S0,S1", "S2,S0"},
    {3, {2, 2, 2}, 3, {256, 256, 256}, "S0,S1,S2", "S2,S1,S0"},
    {3, {2, 2, 2}, 3, {256, 256, 256}, "S1,R,S0", "R,S0,S0"},
    {3, {2, 2, 2}, 3, {256, 256, 256}, "S0,S0,S0", "S1,S1,S1"},
    {3, {4, 4, 4}, 3, {1023, 257, 129}, "P,S0,R", "S1,R,P"},
    {4, {2, 2, 2, 2}, 4, {64, 64, 64, 64}, "S0,S1,S2,S3", "S3,S2,S1,S0"},
    {4, {4, 4, 4, 4}, 8, {16, 16, 16, 16, 16, 16, 16, 16}, "S0,S1,S2,S3", "S7,S6,S5,S4"},
    {4, {4, 4, 4, 4}, 8, {16, 16, 16, 16, 16, 16, 16, 16}, "P,S0,P,S1", "S7,S6,P,R"},
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int layout(const dtl_mesh *m, const pair *p, const char *text, dtl_layout **out) {
  dtl_placement pl[DTL_MAX_MESH_DIMS];
  int n;
  if (dtl_placements_parse(text, pl, DTL_MAX_MESH_DIMS, &n) != DTL_OK || n != p->mesh_ndim ||
      dtl_layout_create(m, DTL_FLOAT32, p->ndim, p->shape, pl, out) != DTL_OK) {
    fprintf(stderr, "dtl_plan_perf: %s: %s\n", text, dtl_last_error());
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  int iters = 2000, warmup = 100, opt;
  while ((opt = getopt(argc, argv, "n:w:")) != -1) {
    if (opt == 'n') iters = atoi(optarg);
    else if (opt == 'w') warmup = atoi(optarg);
    else {
      fprintf(stderr, "usage: dtl_plan_perf [-n iterations] [-w warmup]\n");
      return 2;
    }
  }
  if (iters < 1 || warmup < 0) {
    fprintf(stderr, "dtl_plan_perf: -n must be >= 1 and -w >= 0\n");
    return 2;
  }
  printf("# uncached dtl_plan_create (create + destroy): fastest of 5 rounds of %d after %d warmup; MPI default costs\n",
         (iters + 4) / 5, warmup);
  printf("# %-9s %-6s %-18s %-12s %-12s %5s %5s %10s %12s\n", "mesh", "ndim", "shape", "from", "to", "steps", "coll",
         "us/plan", "plans/s");
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
    const pair *p = &pairs[i];
    dtl_mesh *m;
    dtl_layout *a, *b;
    if (dtl_mesh_create_abstract(p->mesh_ndim, p->mesh, NULL, &m) != DTL_OK) return 1;
    if (layout(m, p, p->from, &a) || layout(m, p, p->to, &b)) return 1;
    dtl_plan *plan = NULL;
    for (int k = 0; k < warmup; k++) {
      if (dtl_plan_create(a, b, &plan) != DTL_OK) {
        fprintf(stderr, "dtl_plan_perf: %s -> %s: %s\n", p->from, p->to, dtl_last_error());
        return 1;
      }
      dtl_plan_destroy(plan);
    }
    /* The fastest of five rounds: on a shared machine the slow rounds measure the neighbours. */
    double us = 1e300;
    for (int round = 0; round < 5; round++) {
      int n = (iters + 4) / 5;
      double t0 = now();
      for (int k = 0; k < n; k++) {
        dtl_plan_create(a, b, &plan);
        dtl_plan_destroy(plan);
      }
      double t = (now() - t0) / n * 1e6;
      if (t < us) us = t;
    }
    dtl_plan_create(a, b, &plan);
    char mesh[24], shape[40];
    int o = 0;
    for (int d = 0; d < p->mesh_ndim; d++) o += snprintf(mesh + o, sizeof mesh - (size_t)o, d ? "x%d" : "%d", p->mesh[d]);
    o = 0;
    for (int d = 0; d < p->ndim; d++) o += snprintf(shape + o, sizeof shape - (size_t)o, d ? ",%lld" : "%lld", (long long)p->shape[d]);
    printf("  %-9s %-6d %-18s %-12s %-12s %5d %5d %10.2f %12.0f\n", mesh, p->mesh_ndim, shape, p->from, p->to,
           dtl_plan_num_steps(plan), dtl_plan_num_collectives(plan), us, 1e6 / us);
    dtl_plan_destroy(plan);
    dtl_layout_destroy(a);
    dtl_layout_destroy(b);
    dtl_mesh_destroy(m);
  }
  return 0;
}

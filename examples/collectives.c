/* SPDX-License-Identifier: Apache-2.0 */
/* The worked numbers of the two collective-communication notes (../shared/seeds), reproduced with dtl on MPI
 * and checked: first the note's two-process Gloo experiment (all-gather, reduce-scatter, all-reduce), then the
 * other note's PyTorch example (all-reduce, all-gather, reduce-scatter, all-to-all) with the root-based
 * collectives it describes (broadcast, scatter, gather, reduce). Every value is compared with its closed form
 * for p ranks; any mismatch makes every rank exit with status 1.
 *
 *   mpirun -n 4 ./collectives      (any p >= 1; the notes use p = 2 and print
 *   [rank 0] local=[1,2] all_gather=[1,2,3,4] reduce_scatter=[3,30] all_reduce=[4,6]
 *   [rank 1] local=[3,4] all_gather=[1,2,3,4] reduce_scatter=[6,60] all_reduce=[4,6]) */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "example.h"

static int rank, p, mismatches;

/* A line of text per rank, appended to piece by piece. */
typedef struct {
  char text[2048];
  size_t len;
} line;

static void add(line *l, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(l->text + l->len, sizeof l->text - l->len, fmt, ap);
  va_end(ap);
  if (n > 0) l->len = l->len + (size_t)n < sizeof l->text ? l->len + (size_t)n : sizeof l->text - 1;
}

/* Appends " name=[a,b,...]" and compares each value with want[i]. */
static void show_f32(line *l, const char *name, const float *v, const double *want, size_t n) {
  add(l, " %s=[", name);
  for (size_t i = 0; i < n; i++) {
    add(l, "%s%g", i ? "," : "", (double)v[i]);
    if ((double)v[i] != want[i]) {
      fprintf(stderr, "[rank %d] MISMATCH %s[%zu] = %g (expected %g)\n", rank, name, i, (double)v[i], want[i]);
      mismatches++;
    }
  }
  add(l, "]");
}

static void show_i64(line *l, const char *name, const int64_t *v, const int64_t *want, size_t n) {
  add(l, " %s=[", name);
  for (size_t i = 0; i < n; i++) {
    add(l, "%s%lld", i ? "," : "", (long long)v[i]);
    if (v[i] != want[i]) {
      fprintf(stderr, "[rank %d] MISMATCH %s[%zu] = %lld (expected %lld)\n", rank, name, i, (long long)v[i],
              (long long)want[i]);
      mismatches++;
    }
  }
  add(l, "]");
}

/* Prints every rank's line in rank order: the lines are gathered to rank 0 (with dtl itself), so the
 * output never interleaves. */
static void print_in_rank_order(dtl_comm *c, const line *l) {
  char *all = rank == 0 ? malloc(sizeof l->text * (size_t)p) : NULL;
  if (rank == 0 && !all) MPI_Abort(MPI_COMM_WORLD, 1);
  TRY(dtl_gather(c, l->text, all, sizeof l->text, DTL_UINT8, 0));
  if (rank == 0) {
    for (int r = 0; r < p; r++) puts(all + (size_t)r * sizeof l->text);
    fflush(stdout);
  }
  free(all);
}

/* Note 1: local = [2r+1, 2r+2] (float32).
 *   all_gather     = [1, 2, ..., 2p] on every rank.
 *   reduce_scatter : rank r's input is, for each block j, [j+1, 10(j+1)] * (r+1), so the sum over ranks of
 *                    block j is (j+1) * [1, 10] * (1 + 2 + ... + p) = (j+1) * [1, 10] * p(p+1)/2, which rank j
 *                    receives (p = 2: [3,30] and [6,60]).
 *   all_reduce     = sum_r [2r+1, 2r+2] = [p^2, p^2 + p] (p = 2: [4,6]). */
static void gloo_experiment(dtl_comm *c) {
  float local[2] = {2.0f * (float)rank + 1, 2.0f * (float)rank + 2};
  float *gathered = malloc(sizeof(float) * 2 * (size_t)p), *rs_in = malloc(sizeof(float) * 2 * (size_t)p);
  double *want = malloc(sizeof(double) * 2 * (size_t)p);
  float rs_out[2], reduced[2];
  if (!gathered || !rs_in || !want) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int j = 0; j < p; j++) {
    rs_in[2 * j] = (float)((j + 1) * (rank + 1));
    rs_in[2 * j + 1] = (float)(10 * (j + 1) * (rank + 1));
  }
  TRY(dtl_all_gather(c, local, gathered, 2, DTL_FLOAT32));
  TRY(dtl_reduce_scatter(c, rs_in, rs_out, 2, DTL_FLOAT32, DTL_SUM));
  TRY(dtl_all_reduce(c, local, reduced, 2, DTL_FLOAT32, DTL_SUM));

  line l = {.len = 0};
  double tri = (double)p * (p + 1) / 2;
  add(&l, "[rank %d]", rank);
  show_f32(&l, "local", local, (double[]){2.0 * rank + 1, 2.0 * rank + 2}, 2);
  for (int i = 0; i < 2 * p; i++) want[i] = i + 1;
  show_f32(&l, "all_gather", gathered, want, 2 * (size_t)p);
  show_f32(&l, "reduce_scatter", rs_out, (double[]){(rank + 1) * tri, 10 * (rank + 1) * tri}, 2);
  show_f32(&l, "all_reduce", reduced, (double[]){(double)p * p, (double)p * p + p}, 2);
  print_in_rank_order(c, &l);
  free(gathered);
  free(rs_in);
  free(want);
}

/* Note 2's PyTorch example, then the root-based collectives of its table:
 *   all_reduce     x = full(4, r+1)            -> every element p(p+1)/2
 *   all_gather     arange(2) + 2r (int64)      -> [0, 1, ..., 2p-1]
 *   reduce_scatter full(2p, r+1)               -> [p(p+1)/2, p(p+1)/2]
 *   all_to_all     arange(p) + r*p (int64)     -> rank j receives [j, p+j, 2p+j, ...] (element i = i*p + j)
 *   broadcast      [100r+1, 100r+2], root p-1  -> [100(p-1)+1, 100(p-1)+2] everywhere
 *   scatter        arange(2p) on root 0        -> rank r receives [2r, 2r+1]
 *   gather         [2r+1, 2r+2] to root 0      -> [1, 2, ..., 2p] on root only
 *   reduce         full(4, r+1), sum, root 0   -> p(p+1)/2 on root only */
static void torch_example(dtl_comm *c) {
  size_t np = (size_t)p;
  int64_t tri = (int64_t)p * (p + 1) / 2;
  float x[4], rs_out[2], red[4];
  int64_t ag_in[2] = {2 * rank, 2 * rank + 1}, bc[2] = {100 * rank + 1, 100 * rank + 2}, sc_out[2];
  int64_t gt_in[2] = {2 * rank + 1, 2 * rank + 2};
  int64_t *ag = malloc(sizeof(int64_t) * 2 * np), *a2a_in = malloc(sizeof(int64_t) * np),
          *a2a_out = malloc(sizeof(int64_t) * np), *sc_in = malloc(sizeof(int64_t) * 2 * np),
          *gt = malloc(sizeof(int64_t) * 2 * np), *want = malloc(sizeof(int64_t) * 2 * np);
  float *rs_in = malloc(sizeof(float) * 2 * np);
  if (!ag || !a2a_in || !a2a_out || !sc_in || !gt || !want || !rs_in) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int i = 0; i < 4; i++) x[i] = (float)(rank + 1);
  for (size_t i = 0; i < 2 * np; i++) rs_in[i] = (float)(rank + 1);
  for (int i = 0; i < p; i++) a2a_in[i] = i + (int64_t)rank * p;
  for (size_t i = 0; i < 2 * np; i++) sc_in[i] = (int64_t)i;

  TRY(dtl_all_reduce(c, x, x, 4, DTL_FLOAT32, DTL_SUM)); /* in place, as torch's all_reduce */
  TRY(dtl_all_gather(c, ag_in, ag, 2, DTL_INT64));
  TRY(dtl_reduce_scatter(c, rs_in, rs_out, 2, DTL_FLOAT32, DTL_SUM));
  TRY(dtl_all_to_all(c, a2a_in, a2a_out, 1, DTL_INT64));
  TRY(dtl_broadcast(c, bc, 2, DTL_INT64, p - 1));
  TRY(dtl_scatter(c, rank == 0 ? sc_in : NULL, sc_out, 2, DTL_INT64, 0));
  TRY(dtl_gather(c, gt_in, rank == 0 ? gt : NULL, 2, DTL_INT64, 0));
  for (int i = 0; i < 4; i++) red[i] = (float)(rank + 1);
  TRY(dtl_reduce(c, red, red, 4, DTL_FLOAT32, DTL_SUM, 0)); /* in place on root; the others keep their input */

  line l = {.len = 0};
  double t = (double)tri;
  add(&l, "[rank %d] torch:", rank);
  show_f32(&l, "all_reduce", x, (double[]){t, t, t, t}, 4);
  for (size_t i = 0; i < 2 * np; i++) want[i] = (int64_t)i;
  show_i64(&l, "all_gather", ag, want, 2 * np);
  show_f32(&l, "reduce_scatter", rs_out, (double[]){t, t}, 2);
  for (int i = 0; i < p; i++) want[i] = (int64_t)i * p + rank;
  show_i64(&l, "all_to_all", a2a_out, want, np);
  show_i64(&l, "broadcast", bc, (int64_t[]){100 * (int64_t)(p - 1) + 1, 100 * (int64_t)(p - 1) + 2}, 2);
  show_i64(&l, "scatter", sc_out, (int64_t[]){2 * rank, 2 * rank + 1}, 2);
  if (rank == 0) {
    for (size_t i = 0; i < 2 * np; i++) want[i] = (int64_t)i + 1;
    show_i64(&l, "gather", gt, want, 2 * np);
    show_f32(&l, "reduce", red, (double[]){t, t, t, t}, 4);
  } else {
    add(&l, " gather=(root only) reduce=(root only)");
  }
  print_in_rank_order(c, &l);
  free(ag);
  free(a2a_in);
  free(a2a_out);
  free(sc_in);
  free(gt);
  free(want);
  free(rs_in);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  dtl_comm *c = NULL;
  TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &c));
  rank = dtl_comm_rank(c);
  p = dtl_comm_size(c);
  if (rank == 0) printf("dtl %s, backend %s, %d ranks\n", dtl_version_string(), dtl_comm_backend_name(c), p);
  gloo_experiment(c);
  torch_example(c);

  int32_t bad = mismatches, any = 0;
  TRY(dtl_all_reduce(c, &bad, &any, 1, DTL_INT32, DTL_SUM));
  if (rank == 0) printf("%s\n", any ? "MISMATCH: see the lines above" : "all values match the closed forms");
  dtl_comm_destroy(c);
  MPI_Finalize();
  return any ? 1 : 0;
}

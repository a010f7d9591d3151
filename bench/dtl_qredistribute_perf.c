/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized redistribution (dtl_qplan): a DeepSeek-V3-sized FP8-block weight ([7168, 18432] e4m3 codes, 128 x 128
 * f32 scale blocks) from TP 4 to TP 2, as an engine resharding a checkpoint onto fewer ranks: between two meshes of
 * one parent (the 4 ranks to the first 2), and on one 2x2 mesh ([S, S] -> [S, R]), both for the rows (column
 * parallel, S(0)) and the cols (row parallel, S(1)); then from TP 3 (rows cut inside scale blocks: 7168 / 3 is no
 * multiple of 128, so the blocks a cut splits go to both sides, each from its one owner). Each case prints the bytes
 * this rank receives of codes and of scales (the codes alone through dtl_plan_create on an f8e4m3 layout, the
 * scales the qplan's rest), the time of the qplan and of the codes' plan alone (medians over -n rounds of the
 * slowest rank), the qplan's predicted cost, and #wrong (target parts compared with the source's slices).
 * Run with mpirun -n 4. Options: -n rounds (default 10), -w warmup (default 2), -r rows, -c cols. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "bench_util.h"

static int rank, nranks;

/* Code (i, j) of the dense tensor and scale block (bi, bj): deterministic, compared exactly. */
static uint8_t code_at(int64_t i, int64_t j) { return (uint8_t)((i * 131 + j * 7) % 251); }
static float scale_at(int64_t bi, int64_t bj) { return (float)(bi * 1000 + bj) * 0.5f + 1.0f; }

static void fill(const dtl_qbox *b, dtl_qbuf *q, bool dense) {
  const dtl_qpart_box *c = &b->part[DTL_QPART_CODES], *s = &b->part[DTL_QPART_SCALES];
  q->part[DTL_QPART_CODES] = malloc(c->bytes + 1);
  q->part[DTL_QPART_SCALES] = malloc(s->bytes + 4);
  uint8_t *cp = q->part[DTL_QPART_CODES];
  float *sp = q->part[DTL_QPART_SCALES];
  for (int64_t i = 0; i < c->shape[0]; i++)
    for (int64_t j = 0; j < c->shape[1]; j++) cp[i * c->shape[1] + j] = dense ? code_at(c->offset[0] + i, c->offset[1] + j) : 0;
  for (int64_t i = 0; i < s->shape[0]; i++)
    for (int64_t j = 0; j < s->shape[1]; j++)
      sp[i * s->shape[1] + j] = dense ? scale_at(s->offset[0] + i, s->offset[1] + j) : 0;
}

static long long wrong(const dtl_qbox *b, const dtl_qbuf *q) {
  const dtl_qpart_box *c = &b->part[DTL_QPART_CODES], *s = &b->part[DTL_QPART_SCALES];
  const uint8_t *cp = q->part[DTL_QPART_CODES];
  const float *sp = q->part[DTL_QPART_SCALES];
  long long n = 0;
  for (int64_t i = 0; i < c->shape[0]; i++)
    for (int64_t j = 0; j < c->shape[1]; j++) n += cp[i * c->shape[1] + j] != code_at(c->offset[0] + i, c->offset[1] + j);
  for (int64_t i = 0; i < s->shape[0]; i++)
    for (int64_t j = 0; j < s->shape[1]; j++)
      n += sp[i * s->shape[1] + j] != scale_at(s->offset[0] + i, s->offset[1] + j);
  return n;
}

static double slowest(double t) {
  double m;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

static void text_bytes(double b, char *buf, size_t cap) {
  if (b >= 1048576) snprintf(buf, cap, "%.1f MiB", b / 1048576);
  else if (b >= 1024) snprintf(buf, cap, "%.1f KiB", b / 1024);
  else snprintf(buf, cap, "%.0f B", b);
}

static int rounds = 10, warmup = 2;

/* One case: the qplan from (sm, sp) to (dm, dp) and the codes' plan alone, timed and checked. */
static void run_case(const char *name, const dtl_quant_format *f, const int64_t *shape, dtl_mesh *sm,
                     const dtl_placement *sp, dtl_mesh *dm, const dtl_placement *dp) {
  dtl_qlayout *qs = NULL, *qd = NULL;
  BENCH_TRY(dtl_qlayout_create(sm, f, 2, shape, sp, &qs));
  BENCH_TRY(dtl_qlayout_create(dm, f, 2, shape, dp, &qd));
  dtl_layout *cs = NULL, *cd = NULL;
  BENCH_TRY(dtl_layout_create(sm, DTL_FLOAT8_E4M3, 2, shape, sp, &cs));
  BENCH_TRY(dtl_layout_create(dm, DTL_FLOAT8_E4M3, 2, shape, dp, &cd));
  dtl_qplan *q = NULL;
  dtl_plan *codes = NULL;
  BENCH_TRY(dtl_qplan_create(qs, qd, &q));
  BENCH_TRY(dtl_plan_create(cs, cd, &codes));
  dtl_qbox bs, bd;
  BENCH_TRY(dtl_qlayout_local_boxes(qs, NULL, &bs));
  BENCH_TRY(dtl_qlayout_local_boxes(qd, NULL, &bd));
  bool in_s = dtl_mesh_is_member(sm), in_d = dtl_mesh_is_member(dm);
  dtl_qbuf in = {{NULL}}, out = {{NULL}};
  if (in_s) fill(&bs, &in, true);
  if (in_d) fill(&bd, &out, false);
  double tq[64], tc[64];
  for (int r = -warmup; r < rounds; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    BENCH_TRY(dtl_qplan_execute(q, in_s ? &in : NULL, in_d ? &out : NULL));
    double t1 = slowest(MPI_Wtime() - t0);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    BENCH_TRY(dtl_plan_execute(codes, in_s ? in.part[DTL_QPART_CODES] : NULL, in_d ? out.part[DTL_QPART_CODES] : NULL));
    double t2 = slowest(MPI_Wtime() - t0);
    if (r >= 0) tq[r] = t1, tc[r] = t2;
  }
  BENCH_TRY(dtl_qplan_execute(q, in_s ? &in : NULL, in_d ? &out : NULL)); /* the codes' plan wrote the codes last */
  long long bad = in_d ? wrong(&bd, &out) : 0, all_bad = 0;
  MPI_Allreduce(&bad, &all_bad, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  uint64_t qsent, qrecv, csent, crecv;
  BENCH_TRY(dtl_qplan_bytes(q, &qsent, &qrecv));
  BENCH_TRY(dtl_plan_bytes(codes, &csent, &crecv));
  /* The busiest receiver's figures. */
  double mine[2] = {(double)crecv, (double)(qrecv - crecv)}, most[2];
  MPI_Allreduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  double mq = bench_median(tq, rounds), mc = bench_median(tc, rounds);
  if (rank == 0) {
    char a[24], b[24];
    text_bytes(most[0], a, sizeof a);
    text_bytes(most[1], b, sizeof b);
    printf("%-34s recv codes %-10s scales %-9s  qplan %8.2f ms  codes alone %8.2f ms  (%+6.1f%%)  est %8.2f ms  #wrong %lld\n",
           name, a, b, mq * 1e3, mc * 1e3, (mq / mc - 1) * 100, dtl_qplan_cost(q) * 1e3, all_bad);
  }
  if (rank == 0 && getenv("DTL_BENCH_EXPLAIN")) {
    size_t n = dtl_qplan_explain_needed(q);
    char *t = malloc(n);
    BENCH_TRY(dtl_qplan_explain(q, t, n));
    printf("%s", t);
    free(t);
  }
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(in.part[p]), free(out.part[p]);
  dtl_plan_destroy(codes);
  dtl_qplan_destroy(q);
  dtl_layout_destroy(cs);
  dtl_layout_destroy(cd);
  dtl_qlayout_destroy(qs);
  dtl_qlayout_destroy(qd);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int64_t shape[2] = {7168, 18432};
  int opt;
  while ((opt = getopt(argc, argv, "n:w:r:c:")) != -1) {
    if (opt == 'n') rounds = atoi(optarg);
    else if (opt == 'w') warmup = atoi(optarg);
    else if (opt == 'r') shape[0] = bench_parse_size(optarg);
    else if (opt == 'c') shape[1] = bench_parse_size(optarg);
  }
  if (rounds < 1 || rounds > 64) rounds = 10;
  if (nranks != 4) {
    if (rank == 0) fprintf(stderr, "dtl_qredistribute_perf: run with mpirun -n 4 (TP 4 -> TP 2)\n");
    MPI_Finalize();
    return 2;
  }
  dtl_comm *world = NULL;
  BENCH_TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  int four = 4, two = 2, three = 3, sq[2] = {2, 2}, first2[2] = {0, 1}, first3[3] = {0, 1, 2};
  dtl_mesh *tp4 = NULL, *tp2 = NULL, *tp3 = NULL, *grid = NULL;
  BENCH_TRY(dtl_mesh_create(world, 1, &four, &tp4));
  BENCH_TRY(dtl_mesh_create_from_ranks(world, 2, first2, 1, &two, &tp2));
  BENCH_TRY(dtl_mesh_create_from_ranks(world, 3, first3, 1, &three, &tp3));
  BENCH_TRY(dtl_mesh_create(world, 2, sq, &grid));
  dtl_quant_format f = {.kind = DTL_QUANT_FP8_BLOCK};
  if (rank == 0)
    printf("fp8-block(128x128) [%lld, %lld]: codes %.1f MiB, scales %.1f KiB; %d rounds, slowest rank, medians\n",
           (long long)shape[0], (long long)shape[1], (double)shape[0] * (double)shape[1] / 1048576,
           (double)((shape[0] + 127) / 128) * (double)((shape[1] + 127) / 128) * 4 / 1024, rounds);
  dtl_placement s0 = dtl_shard(0), s1 = dtl_shard(1), ss0[2] = {dtl_shard(0), dtl_shard(0)},
                sr0[2] = {dtl_shard(0), dtl_replicate()}, ss1[2] = {dtl_shard(1), dtl_shard(1)},
                sr1[2] = {dtl_shard(1), dtl_replicate()};
  run_case("TP4 S(0) -> TP2 S(0), two meshes", &f, shape, tp4, &s0, tp2, &s0);
  run_case("TP4 S(1) -> TP2 S(1), two meshes", &f, shape, tp4, &s1, tp2, &s1);
  run_case("2x2 [S(0),S(0)] -> [S(0),R]", &f, shape, grid, ss0, grid, sr0);
  run_case("2x2 [S(1),S(1)] -> [S(1),R]", &f, shape, grid, ss1, grid, sr1);
  run_case("TP3 S(0) -> TP2 S(0), two meshes", &f, shape, tp3, &s0, tp2, &s0);
  dtl_mesh_destroy(grid);
  dtl_mesh_destroy(tp3);
  dtl_mesh_destroy(tp2);
  dtl_mesh_destroy(tp4);
  dtl_comm_destroy(world);
  MPI_Finalize();
  return 0;
}

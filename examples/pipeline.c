/* SPDX-License-Identifier: Apache-2.0 */
/* A two-stage pipeline: ranks [0, n/2) run stage 0 and [n/2, n) stage 1, each stage two tensor-parallel MLP blocks
 * over a mesh of its own ranks (dtl_mesh_create_from_ranks). Micro-batches of tokens flow through: stage 0's output
 * of micro-batch k crosses to stage 1 by a plan between the two meshes, started with dtl_plan_execute_async, so that
 * the transfer of k overlaps stage 0's compute of k+1, and stage 1 posts the receive of k+1 before it computes k.
 * Every stage-1 rank checks every output against the dense model (4 MLP blocks in a row, computed with cblas), and
 * rank 0 and the first stage-1 rank print how much of the transfer time the pipeline hid.
 * Run: mpirun -n 4 ./pipeline (any even number of ranks). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "example.h"

enum { T = 64, HID = 256, FFN = 512, MICRO = 6, BLOCKS = 2 /* per stage */ };
#define TOLERANCE 1e-4

static float *uniform(uint64_t seed, size_t n, float scale) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = scale * (2.0f * (float)(seed >> 40) / 16777216.0f - 1.0f);
  }
  return p;
}

/* Block b's weights: fused gate/up [2 FFN, HID] and down [HID, FFN]; micro-batch k's input [T, HID]. */
static float *gate_up_of(int b) { return uniform(100u + (uint64_t)b, (size_t)2 * FFN * HID, 1.0f / sqrtf(HID)); }
static float *down_of(int b) { return uniform(200u + (uint64_t)b, (size_t)HID * FFN, 1.0f / sqrtf(FFN)); }
static float *input_of(int k) { return uniform(300u + (uint64_t)k, (size_t)T * HID, 1.0f); }

/* The dense SwiGLU MLP block: y = down (silu(gate x) * up x). */
static void dense_mlp(const float *gu, const float *down, const float *x, float *y) {
  float *h = malloc(sizeof *h * (size_t)T * 2 * FFN);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, 2 * FFN, HID, 1.0f, x, HID, gu, HID, 0.0f, h, 2 * FFN);
  for (int t = 0; t < T; t++)
    for (int f = 0; f < FFN; f++) {
      float g = h[(size_t)t * 2 * FFN + f], u = h[(size_t)t * 2 * FFN + FFN + f];
      h[(size_t)t * 2 * FFN + f] = g / (1.0f + expf(-g)) * u;
    }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, HID, FFN, 1.0f, h, 2 * FFN, down, FFN, 0.0f, y, HID);
  free(h);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2 || size % 2) {
    if (rank == 0) fprintf(stderr, "pipeline: run it on an even number of ranks (mpirun -n 4)\n");
    MPI_Finalize();
    return 2;
  }
  dtl_comm *world;
  TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  /* The two stages: every rank makes both meshes (collective over the world) and is a member of one. */
  int half = size / 2, ranks[2][64];
  for (int i = 0; i < half; i++) ranks[0][i] = i, ranks[1][i] = half + i;
  dtl_mesh *stage[2];
  for (int s = 0; s < 2; s++) TRY(dtl_mesh_create_from_ranks(world, half, ranks[s], 1, (int[]){half}, &stage[s]));
  int me = rank < half ? 0 : 1;

  /* This stage's tensor-parallel MLP blocks (the weights of blocks 2 me and 2 me + 1 of the model). */
  dtl_tp_context *ctx;
  TRY(dtl_tp_context_create(stage[me], 0, NULL, &ctx));
  dtl_tp_mlp *mlp[BLOCKS];
  for (int b = 0; b < BLOCKS; b++) {
    float *gu = gate_up_of(BLOCKS * me + b), *dn = down_of(BLOCKS * me + b);
    dtl_tp_mlp_params mp = {.activation = DTL_TP_ACT_SILU_GATED, .hidden = HID, .ffn = FFN, .gate_up = gu, .down = dn};
    TRY(dtl_tp_mlp_create(ctx, &mp, &mlp[b]));
    free(gu);
    free(dn);
  }
  dtl_layout *act_in, *act_out;
  TRY(dtl_tp_mlp_layouts(mlp[0], T, &act_in, &act_out));

  /* The activations cross as R on stage 0 -> R on stage 1: each stage-1 rank receives them from one stage-0 rank.
   * Two plans, so that two micro-batches can be in flight (a plan runs one execution at a time). */
  dtl_layout *from, *to;
  dtl_placement r = dtl_replicate();
  TRY(dtl_layout_create(stage[0], DTL_FLOAT32, 2, (int64_t[]){T, HID}, &r, &from));
  TRY(dtl_layout_create(stage[1], DTL_FLOAT32, 2, (int64_t[]){T, HID}, &r, &to));
  dtl_plan *cross[2];
  for (int i = 0; i < 2; i++) TRY(dtl_plan_create(from, to, &cross[i]));
  if (rank == 0) {
    char text[1024];
    TRY(dtl_plan_explain(cross[0], text, sizeof text));
    printf("%s", text);
  }

  size_t n = (size_t)T * HID;
  float *buf[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))}, *tmp = malloc(n * sizeof(float));
  float *out = malloc(n * sizeof(float) * MICRO);

  /* A blocking transfer of one micro-batch, timed: the cost the pipeline tries to hide. */
  double t_block = 0;
  for (int rep = 0; rep < 5; rep++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    TRY(dtl_plan_execute(cross[0], me == 0 ? buf[0] : NULL, me == 1 ? buf[0] : NULL));
    double t = MPI_Wtime() - t0;
    if (rep == 0 || t < t_block) t_block = t;
  }

  /* The pipeline. waited: seconds spent in dtl_wait, the transfer time left exposed. */
  double waited = 0, t_start = 0;
  dtl_request *req[2] = {NULL, NULL};
  MPI_Barrier(MPI_COMM_WORLD);
  t_start = MPI_Wtime();
  if (me == 0) {
    for (int k = 0; k < MICRO; k++) {
      int slot = k % 2;
      float *x = input_of(k);
      TRY(dtl_tp_mlp_forward(mlp[0], act_in, x, tmp));
      free(x);
      if (req[slot]) { /* the transfer of k - 2 still owns this slot */
        double t0 = MPI_Wtime();
        TRY(dtl_wait(req[slot]));
        waited += MPI_Wtime() - t0;
      }
      TRY(dtl_tp_mlp_forward(mlp[1], act_in, tmp, buf[slot]));
      TRY(dtl_plan_execute_async(cross[slot], buf[slot], NULL, &req[slot]));
    }
    for (int slot = 0; slot < 2; slot++) {
      double t0 = MPI_Wtime();
      if (req[slot]) TRY(dtl_wait(req[slot]));
      waited += MPI_Wtime() - t0;
    }
  } else {
    TRY(dtl_plan_execute_async(cross[0], NULL, buf[0], &req[0]));
    for (int k = 0; k < MICRO; k++) {
      int slot = k % 2;
      if (k + 1 < MICRO) TRY(dtl_plan_execute_async(cross[1 - slot], NULL, buf[1 - slot], &req[1 - slot]));
      double t0 = MPI_Wtime();
      TRY(dtl_wait(req[slot]));
      waited += MPI_Wtime() - t0;
      TRY(dtl_tp_mlp_forward(mlp[0], act_in, buf[slot], tmp));
      TRY(dtl_tp_mlp_forward(mlp[1], act_in, tmp, out + (size_t)k * n));
    }
  }
  double elapsed = MPI_Wtime() - t_start;

  /* Stage 1 checks every micro-batch against the dense model. */
  int bad = 0;
  if (me == 1) {
    float *gu[2 * BLOCKS], *dn[2 * BLOCKS], *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    for (int i = 0; i < 2 * BLOCKS; i++) gu[i] = gate_up_of(i), dn[i] = down_of(i);
    double worst = 0;
    for (int k = 0; k < MICRO; k++) {
      float *x = input_of(k);
      memcpy(a, x, n * sizeof(float));
      for (int i = 0; i < 2 * BLOCKS; i++) {
        dense_mlp(gu[i], dn[i], a, b);
        memcpy(a, b, n * sizeof(float));
      }
      double err = 0, mag = 0;
      for (size_t i = 0; i < n; i++) {
        double d = fabs((double)out[(size_t)k * n + i] - a[i]);
        if (d > err) err = d;
        if (fabs(a[i]) > mag) mag = fabs(a[i]);
      }
      if (err / (mag > 0 ? mag : 1) > worst) worst = err / (mag > 0 ? mag : 1);
      free(x);
    }
    bad = worst > TOLERANCE;
    if (rank == half)
      printf("[stage 1] %d micro-batches of [%d,%d] through %d MLP blocks: max rel error vs dense %.2e  %s\n", MICRO, T,
             HID, 2 * BLOCKS, worst, bad ? "WRONG" : "ok");
    for (int i = 0; i < 2 * BLOCKS; i++) free(gu[i]), free(dn[i]);
    free(a);
    free(b);
  }
  /* Stage 0 sends: what it waited for is transfer time the compute did not hide. Stage 1 waits for stage 0's compute
   * as well, so its waiting time is the pipeline's fill, not a transfer figure. */
  double hidden = 1.0 - waited / (t_block * MICRO);
  if (rank == 0)
    printf("[stage 0] a blocking transfer takes %.1f us per micro-batch; in the pipeline the sends waited %.1f us of "
           "%.1f us in all: %.0f%% of the transfer time hidden behind compute (%.2f ms for %d micro-batches)\n",
           t_block * 1e6, waited * 1e6, t_block * MICRO * 1e6, hidden > 0 ? hidden * 100 : 0.0, elapsed * 1e3, MICRO);
  if (rank == half)
    printf("[stage 1] waited %.2f ms for stage 0 (its compute and the transfers), %.2f ms in all\n", waited * 1e3,
           elapsed * 1e3);
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);

  for (int i = 0; i < 2; i++) dtl_plan_destroy(cross[i]);
  dtl_layout_destroy(from);
  dtl_layout_destroy(to);
  dtl_layout_destroy(act_in);
  dtl_layout_destroy(act_out);
  for (int b = 0; b < BLOCKS; b++) dtl_tp_mlp_destroy(mlp[b]);
  dtl_tp_context_destroy(ctx);
  for (int s = 0; s < 2; s++) dtl_mesh_destroy(stage[s]);
  dtl_comm_destroy(world);
  free(buf[0]);
  free(buf[1]);
  free(tmp);
  free(out);
  MPI_Finalize();
  return bad;
}

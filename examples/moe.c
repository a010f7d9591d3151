/* SPDX-License-Identifier: Apache-2.0 */
/* One expert-parallel MoE layer (8 SiLU-gated MLP experts, top-2 routing, capacity factor 1.25) over all ranks
 * of MPI_COMM_WORLD, checked against a dense single-rank MoE with the same weights that every rank computes
 * for its own tokens. Prints the tokens each rank sends to each expert, the tokens dropped for capacity and
 * the largest error; exits non-zero when that error exceeds TOLERANCE * max(1, max |y|).
 *   mpirun -n 4 ./moe        (any rank count works: 1, 2, 4, ...) */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "example.h"

enum { EXPERTS = 8, TOPK = 2, TOKENS = 64, HIDDEN = 64, FFN = 128 };
#define CAPACITY_FACTOR 1.25
/* f32 GEMMs that sum in different orders (grouped rows here, one token at a time there) agree to ~1e-6. */
#define TOLERANCE 1e-4

/* A fixed-seed generator, so that every rank can build every expert's weights. */
static uint64_t g_state;
static float uniform(float scale) {
  g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
  return scale * ((float)(g_state >> 40) / (float)(1ull << 24) * 2.0f - 1.0f);
}

/* The dense reference: one token through expert e's SiLU-gated MLP, by matrix-vector products. */
static void dense_expert(const float *wg, const float *wu, const float *wd, const float *x, float *out) {
  float g[FFN], u[FFN];
  cblas_sgemv(CblasRowMajor, CblasNoTrans, FFN, HIDDEN, 1.0f, wg, HIDDEN, x, 1, 0.0f, g, 1);
  cblas_sgemv(CblasRowMajor, CblasNoTrans, FFN, HIDDEN, 1.0f, wu, HIDDEN, x, 1, 0.0f, u, 1);
  for (int f = 0; f < FFN; f++) g[f] = g[f] / (1.0f + expf(-g[f])) * u[f];
  cblas_sgemv(CblasRowMajor, CblasNoTrans, HIDDEN, FFN, 1.0f, wd, FFN, g, 1, 0.0f, out, 1);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  dtl_comm *comm;
  TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &comm));
  const int rank = dtl_comm_rank(comm), size = dtl_comm_size(comm);

  /* Weights, the same on every rank: the router's [EXPERTS, HIDDEN] and each expert's three matrices. */
  const size_t per = (size_t)FFN * HIDDEN;
  float *w_router = malloc(sizeof(float) * EXPERTS * HIDDEN);
  float *w_gate = malloc(sizeof(float) * EXPERTS * per), *w_up = malloc(sizeof(float) * EXPERTS * per),
        *w_down = malloc(sizeof(float) * EXPERTS * per);
  g_state = 2024;
  for (int i = 0; i < EXPERTS * HIDDEN; i++) w_router[i] = uniform(0.5f);
  for (size_t i = 0; i < EXPERTS * per; i++) {
    w_gate[i] = uniform(0.15f);
    w_up[i] = uniform(0.15f);
    w_down[i] = uniform(0.1f);
  }
  /* This rank's tokens, from a seed of its own. */
  float *x = malloc(sizeof(float) * TOKENS * HIDDEN), *logits = malloc(sizeof(float) * TOKENS * EXPERTS);
  g_state = 77 + (uint64_t)rank;
  for (int i = 0; i < TOKENS * HIDDEN; i++) x[i] = uniform(1.0f);

  /* Router: logits = x W_router^T, softmax, top-2, renormalised. */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, TOKENS, EXPERTS, HIDDEN, 1.0f, x, HIDDEN, w_router, HIDDEN, 0.0f,
              logits, EXPERTS);
  int32_t ids[TOKENS * TOPK];
  float weights[TOKENS * TOPK];
  dtl_moe_router_params rp = {.mask = DTL_MOE_ROUTER_RENORMALIZE, .renormalize = 1};
  TRY(dtl_moe_router_topk(logits, TOKENS, EXPERTS, TOPK, &rp, ids, weights));

  /* Experts in contiguous blocks over the ranks; this rank keeps only its own experts' weights. */
  dtl_moe_placement *placement;
  TRY(dtl_moe_placement_create(EXPERTS, size, NULL, &placement));
  const int nl = dtl_moe_placement_local_count(placement, rank);
  const float *lg[EXPERTS], *lu[EXPERTS], *ld[EXPERTS];
  for (int j = 0; j < nl; j++) {
    int e = dtl_moe_placement_local_expert(placement, rank, j);
    lg[j] = w_gate + (size_t)e * per;
    lu[j] = w_up + (size_t)e * per;
    ld[j] = w_down + (size_t)e * per;
  }
  dtl_moe_mlp mlp = {.hidden = HIDDEN, .ffn = FFN, .local_experts = nl, .w_gate = lg, .w_up = lu, .w_down = ld};

  /* The distributed layer: layout, dispatch, experts, combine. */
  dtl_moe_layout_params lp = {.mask = DTL_MOE_LAYOUT_CAPACITY_FACTOR | DTL_MOE_LAYOUT_DROP_POLICY,
                              .capacity_factor = CAPACITY_FACTOR, .drop_policy = DTL_MOE_DROP_POSITION};
  dtl_moe_layout *layout;
  TRY(dtl_moe_layout_create(comm, placement, TOKENS, TOPK, ids, weights, HIDDEN, DTL_FLOAT32, &lp, &layout));
  const int64_t rows = dtl_moe_layout_expert_rows(layout);
  float *expert_in = malloc(sizeof(float) * (size_t)(rows * HIDDEN) + 1);
  float *expert_out = malloc(sizeof(float) * (size_t)(rows * HIDDEN) + 1);
  float *y = malloc(sizeof(float) * TOKENS * HIDDEN);
  TRY(dtl_moe_layout_dispatch(layout, x, expert_in));
  TRY(dtl_moe_experts_run(layout, expert_in, expert_out, dtl_moe_mlp_forward, &mlp));
  TRY(dtl_moe_layout_combine(layout, expert_out, y));

  /* The dense MoE for this rank's tokens, with the same capacity rule applied independently: per expert,
   * the first ceil(TOKENS * TOPK / EXPERTS * factor) (token, slot) pairs are kept. */
  const int64_t capacity = (int64_t)ceil((double)TOKENS * TOPK / EXPERTS * CAPACITY_FACTOR);
  int64_t seen[EXPERTS] = {0}, dense_dropped[EXPERTS] = {0};
  float *y_dense = calloc(TOKENS * HIDDEN, sizeof(float)), out[HIDDEN];
  for (int t = 0; t < TOKENS; t++)
    for (int s = 0; s < TOPK; s++) {
      int e = ids[t * TOPK + s];
      if (e < 0) continue;
      if (seen[e]++ >= capacity) {
        dense_dropped[e]++;
        continue;
      }
      dense_expert(w_gate + (size_t)e * per, w_up + (size_t)e * per, w_down + (size_t)e * per, x + t * HIDDEN, out);
      for (int h = 0; h < HIDDEN; h++) y_dense[t * HIDDEN + h] += weights[t * TOPK + s] * out[h];
    }
  double err = 0, mag = 0;
  for (int i = 0; i < TOKENS * HIDDEN; i++) {
    err = fmax(err, fabs((double)y[i] - y_dense[i]));
    mag = fmax(mag, fabs((double)y_dense[i]));
  }

  /* Report: tokens each rank sends to each expert, drops, rows each rank's experts received, the error. */
  int64_t kept[EXPERTS], dropped[EXPERTS], recv_rows[EXPERTS] = {0};
  TRY(dtl_moe_layout_token_counts(layout, kept, dropped));
  TRY(dtl_moe_layout_expert_counts(layout, recv_rows, NULL));
  int drops_agree = memcmp(dropped, dense_dropped, sizeof dropped) == 0;
  int64_t *all_kept = malloc(sizeof(int64_t) * EXPERTS * (size_t)size);
  int64_t *all_dropped = malloc(sizeof(int64_t) * EXPERTS * (size_t)size);
  MPI_Gather(kept, EXPERTS, MPI_INT64_T, all_kept, EXPERTS, MPI_INT64_T, 0, MPI_COMM_WORLD);
  MPI_Gather(dropped, EXPERTS, MPI_INT64_T, all_dropped, EXPERTS, MPI_INT64_T, 0, MPI_COMM_WORLD);
  double stats[2] = {err, mag}, gstats[2];
  int agree_all = 0;
  MPI_Allreduce(stats, gstats, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&drops_agree, &agree_all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("MoE: %d ranks, %d experts (top-%d), %d tokens x %d hidden per rank, ffn %d, capacity %lld per rank "
           "and expert (factor %.2f)\n", size, EXPERTS, TOPK, TOKENS, HIDDEN, FFN, (long long)capacity,
           CAPACITY_FACTOR);
    printf("tokens sent (kept/dropped) from rank to expert:\n        ");
    for (int e = 0; e < EXPERTS; e++) printf("  e%d(r%d)", e, dtl_moe_placement_owner(placement, e));
    printf("\n");
    int64_t total_dropped = 0;
    for (int r = 0; r < size; r++) {
      printf("rank %-3d", r);
      for (int e = 0; e < EXPERTS; e++) {
        printf(" %3lld/%-3lld", (long long)all_kept[r * EXPERTS + e], (long long)all_dropped[r * EXPERTS + e]);
        total_dropped += all_dropped[r * EXPERTS + e];
      }
      printf("\n");
    }
    printf("dropped (token, slot) pairs: %lld of %d\n", (long long)total_dropped, size * TOKENS * TOPK);
  }
  /* Each rank's received rows per local expert and its error, printed by rank 0 (one writer keeps the
   * lines in order under mpirun). */
  double mine[EXPERTS + 1];
  for (int j = 0; j < EXPERTS; j++) mine[j] = j < nl ? (double)recv_rows[j] : -1;
  mine[EXPERTS] = err;
  double *all = malloc(sizeof(double) * (EXPERTS + 1) * (size_t)size);
  MPI_Gather(mine, EXPERTS + 1, MPI_DOUBLE, all, EXPERTS + 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  for (int r = 0; r < size && rank == 0; r++) {
    printf("[rank %d] rows received:", r);
    for (int j = 0; j < EXPERTS && all[r * (EXPERTS + 1) + j] >= 0; j++)
      printf(" e%d=%.0f", dtl_moe_placement_local_expert(placement, r, j), all[r * (EXPERTS + 1) + j]);
    printf("%s; max |y - y_dense| = %.3g\n", dtl_moe_placement_local_count(placement, r) ? "" : " (no experts)",
           all[r * (EXPERTS + 1) + EXPERTS]);
  }
  free(all);
  int ok = gstats[0] <= TOLERANCE * fmax(1.0, gstats[1]) && agree_all;
  if (rank == 0)
    printf("max error %.3g (max |y| %.3g, tolerance %.1g relative), drops %s the dense reference: %s\n", gstats[0],
           gstats[1], TOLERANCE, agree_all ? "match" : "DIFFER FROM", ok ? "OK" : "FAILED");

  dtl_moe_layout_destroy(layout);
  dtl_moe_placement_destroy(placement);
  dtl_comm_destroy(comm);
  free(w_router); free(w_gate); free(w_up); free(w_down); free(x); free(logits);
  free(expert_in); free(expert_out); free(y); free(y_dense); free(all_kept); free(all_dropped);
  MPI_Finalize();
  return ok ? 0 : 1;
}

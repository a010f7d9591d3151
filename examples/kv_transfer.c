/* SPDX-License-Identifier: Apache-2.0 */
/* KV-cache handoff from prefill to decode: a cache [layers, kv_heads, tokens, head_dim] (f16) sharded on kv heads
 * over a prefill mesh of 4 ranks moves to a decode mesh of 2 ranks, sharded on kv heads there too, in one exchange.
 * With 6 ranks the meshes are disjoint (prefill 0-3, decode 4-5); with 4 they overlap (decode on ranks 0 and 2), and
 * each decode rank keeps the heads it already holds, so it receives only the others. Every rank prints the bytes it
 * sends and receives next to the minimum (the target shard less what its own prefill shard holds), and every decode
 * rank checks every element.
 * Run: mpirun -n 6 ./kv_transfer (or -n 4). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "example.h"

enum { LAYERS = 4, KV_HEADS = 8, TOKENS = 512, HEAD_DIM = 64 };

/* The cache's element at (l, h, t, d): an integer in [-1000, 1000], exact in f16. */
static float value(int64_t l, int64_t h, int64_t t, int64_t d) {
  return (float)((l * 7919 + h * 104729 + t * 31 + d * 7) % 2001 - 1000);
}

/* Visits every element of this rank's box of l: f(element index in the shard, l, h, t, d). */
#define FOR_BOX(shape, off, i, body)                                                       \
  for (int64_t i##l = 0, i = 0; i##l < shape[0]; i##l++)                                   \
    for (int64_t i##h = 0; i##h < shape[1]; i##h++)                                        \
      for (int64_t i##t = 0; i##t < shape[2]; i##t++)                                      \
        for (int64_t i##d = 0; i##d < shape[3]; i##d++, i++) {                             \
          int64_t L = off[0] + i##l, H = off[1] + i##h, TK = off[2] + i##t, D = off[3] + i##d; \
          body;                                                                            \
        }

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 4) {
    if (rank == 0) fprintf(stderr, "kv_transfer: run it on 4 or more ranks (mpirun -n 6 or -n 4)\n");
    MPI_Finalize();
    return 2;
  }
  dtl_comm *world;
  TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  bool disjoint = size >= 6;
  int prefill_ranks[4] = {0, 1, 2, 3}, decode_ranks[2] = {disjoint ? 4 : 0, disjoint ? 5 : 2};
  dtl_mesh *prefill, *decode;
  TRY(dtl_mesh_create_from_ranks(world, 4, prefill_ranks, 1, (int[]){4}, &prefill));
  TRY(dtl_mesh_create_from_ranks(world, 2, decode_ranks, 1, (int[]){2}, &decode));

  int64_t shape[4] = {LAYERS, KV_HEADS, TOKENS, HEAD_DIM};
  dtl_placement heads = dtl_shard(1);
  dtl_layout *src, *dst;
  TRY(dtl_layout_create(prefill, DTL_FLOAT16, 4, shape, &heads, &src));
  TRY(dtl_layout_create(decode, DTL_FLOAT16, 4, shape, &heads, &dst));
  int64_t ss[4], so[4], ds[4], dso[4];
  TRY(dtl_layout_local_box(src, NULL, ss, so));
  TRY(dtl_layout_local_box(dst, NULL, ds, dso));

  /* This rank's prefill shard (none outside the prefill mesh), and room for its decode shard. */
  size_t ns = dtl_layout_local_count(src), nd = dtl_layout_local_count(dst);
  uint16_t *kv = ns ? malloc(ns * 2) : NULL, *out = nd ? malloc(nd * 2) : NULL;
  FOR_BOX(ss, so, i, kv[i] = dtl_f32_to_f16(value(L, H, TK, D)));

  dtl_plan *plan;
  TRY(dtl_plan_create(src, dst, &plan));
  if (rank == 0) {
    char text[1024];
    TRY(dtl_plan_explain(plan, text, sizeof text));
    printf("%s meshes, prefill ranks 0-3 -> decode ranks %d,%d\n%s", disjoint ? "disjoint" : "overlapping",
           decode_ranks[0], decode_ranks[1], text);
  }
  double t0 = MPI_Wtime();
  TRY(dtl_plan_execute(plan, dtl_mesh_is_member(prefill) ? kv : NULL, dtl_mesh_is_member(decode) ? out : NULL));
  double elapsed = MPI_Wtime() - t0;

  /* The minimum this rank must receive: its decode shard less the part of it that its prefill shard holds. */
  uint64_t sent, received, minimum = 0;
  TRY(dtl_plan_bytes(plan, &sent, &received));
  if (dtl_mesh_is_member(decode)) {
    uint64_t kept = dtl_mesh_is_member(prefill) ? 1 : 0;
    for (int d = 0; d < 4 && kept; d++) {
      int64_t lo = so[d] > dso[d] ? so[d] : dso[d], hi = so[d] + ss[d] < dso[d] + ds[d] ? so[d] + ss[d] : dso[d] + ds[d];
      kept *= hi > lo ? (uint64_t)(hi - lo) : 0;
    }
    minimum = (nd - kept) * 2;
  }
  long wrong = 0;
  FOR_BOX(ds, dso, i, wrong += out[i] != dtl_f32_to_f16(value(L, H, TK, D)));
  for (int r = 0; r < size; r++) {
    if (r == rank)
      printf("[rank %d] %-8s sent %8llu B, received %8llu B (minimum %8llu B) in %.2f ms  %s\n", rank,
             dtl_mesh_is_member(decode) ? (dtl_mesh_is_member(prefill) ? "both" : "decode")
                                        : (dtl_mesh_is_member(prefill) ? "prefill" : "idle"),
             (unsigned long long)sent, (unsigned long long)received, (unsigned long long)minimum, elapsed * 1e3,
             wrong || received != minimum ? "WRONG" : "ok");
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  int bad = wrong != 0 || received != minimum || dtl_plan_num_collectives(plan) != 1;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  dtl_plan_destroy(plan);
  dtl_layout_destroy(src);
  dtl_layout_destroy(dst);
  dtl_mesh_destroy(prefill);
  dtl_mesh_destroy(decode);
  dtl_comm_destroy(world);
  free(kv);
  free(out);
  MPI_Finalize();
  return bad;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* An FP8 block-scaled model, written once and run at three tensor-parallel degrees from that one file. The model is
 * 2 transformer layers (GQA attention with 8 q heads over 4 kv heads of 32, then a SwiGLU MLP with ffn 512, each
 * with a residual) at hidden 256, its 14 weights quantized as DeepSeek-V3 and Qwen3-FP8 store them: "<name>.weight"
 * F8_E4M3 [out, in] and "<name>.weight_scale_inv" F32 [ceil(out/128), ceil(in/128)], one scale per 128 x 128 block.
 * Rank 0 writes the checkpoint (dtl_safetensors_write_*); then for TP 1, 2 and 4 (each that divides the world: a
 * (world/tp) x tp data x tensor mesh, every TP group a replica) every rank reads only its shard of codes and scales
 * (dtl_tp_qweight_read_*: at TP 4 q is cut at 64 rows and k, v at 32, inside the 128-row scale blocks, whose scales
 * then go to both sides) and runs the layers on them (DTL_TP_QUANT_WEIGHTS: each weight tile dequantized in the
 * GEMM, no dense weight held). Every run is checked against the dense model on the dequantized weights (one rank,
 * f32); it prints the max error and exits non-zero when the relative error (max |err| over max |dense|) passes 1e-4.
 * Run: mpirun -n 4 ./quantized [checkpoint path] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "example.h"

enum { LAYERS = 2, T = 9, HID = 256, QH = 8, KVH = 4, HD = 32, FFN = 512 };
#define TOLERANCE 1e-4
#define SEED 4242u

/* The weights of one layer, in the order they are named and written. */
enum { WQ, WK, WV, WO, WG, WU, WD, NW };
static const char *const wname[NW] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
static const int64_t wshape[NW][2] = {{QH * HD, HID}, {KVH * HD, HID}, {KVH * HD, HID}, {HID, QH * HD},
                                      {FFN, HID},     {FFN, HID},      {HID, FFN}};

static float *uniform(uint64_t *s, size_t n, float scale) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = scale * (2.0f * (float)(*s >> 40) / 16777216.0f - 1.0f);
  }
  return p;
}

/* What one rank of a TP degree runs: the quantized shards read from the file and the blocks made from them. */
typedef struct {
  dtl_tp_qshard *qkv, *o, *gate_up, *down;
  dtl_tp_attention *attn;
  dtl_tp_mlp *mlp;
} qlayer;

/* x [T, HID] through the layers (R in and out): h = x + attn(x), x = h + mlp(h). */
static void forward(dtl_tp_context *ctx, dtl_tp_attention *const *attn, dtl_tp_mlp *const *mlp, float *x) {
  dtl_layout *l = NULL;
  TRY(dtl_tp_activation_layout(ctx, T, HID, dtl_replicate(), &l));
  float *y = malloc(sizeof(float) * T * HID);
  for (int i = 0; i < LAYERS; i++) {
    TRY(dtl_tp_attention_forward(attn[i], l, x, y));
    for (int j = 0; j < T * HID; j++) x[j] += y[j];
    TRY(dtl_tp_mlp_forward(mlp[i], l, x, y));
    for (int j = 0; j < T * HID; j++) x[j] += y[j];
  }
  free(y);
  dtl_layout_destroy(l);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, np;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  char path[512];
  if (argc > 1) snprintf(path, sizeof path, "%s", argv[1]);
  else if (rank == 0) {
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/dtl_quantized_example_%ld.safetensors", dir, (long)getpid());
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);

  /* The model, the same on every rank: dense weights from a seed, quantized to FP8 blocks of 128 x 128 on a one-rank
   * (abstract) mesh, and their dequantization, the dense reference's weights. */
  dtl_quant_format fmt = {.kind = DTL_QUANT_FP8_BLOCK}; /* defaults: 128 x 128 blocks, e4m3 codes, f32 scales */
  int one = 1, zero = 0;
  dtl_mesh *solo;
  TRY(dtl_mesh_create_abstract(1, &one, &zero, &solo));
  dtl_placement rep = dtl_replicate();
  dtl_qbuf q[LAYERS][NW];
  float *dq[LAYERS][NW];
  size_t qbytes = 0, dbytes = 0;
  uint64_t s = SEED;
  for (int i = 0; i < LAYERS; i++)
    for (int w = 0; w < NW; w++) {
      dtl_qlayout *l;
      TRY(dtl_qlayout_create(solo, &fmt, 2, wshape[w], &rep, &l));
      dtl_qbox b;
      TRY(dtl_qlayout_local_boxes(l, NULL, &b));
      memset(&q[i][w], 0, sizeof q[i][w]);
      for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
        if (b.part[p].ndim >= 0) q[i][w].part[p] = malloc(b.part[p].bytes), qbytes += b.part[p].bytes;
      size_t n = (size_t)(wshape[w][0] * wshape[w][1]);
      float *dense = uniform(&s, n, 1.0f / sqrtf((float)wshape[w][1]));
      dq[i][w] = malloc(n * sizeof(float));
      dbytes += n * sizeof(float);
      TRY(dtl_quant_quantize(l, dense, &q[i][w]));
      TRY(dtl_quant_dequantize(l, &q[i][w], dq[i][w]));
      free(dense);
      dtl_qlayout_destroy(l);
    }
  dtl_mesh_destroy(solo);

  /* Rank 0 writes the checkpoint; the others open it after the barrier. */
  if (rank == 0) {
    dtl_safetensors_writer *wr;
    TRY(dtl_safetensors_write_begin(path, &wr));
    for (int i = 0; i < LAYERS; i++)
      for (int w = 0; w < NW; w++) {
        char name[128];
        int64_t sshape[2] = {(wshape[w][0] + 127) / 128, (wshape[w][1] + 127) / 128};
        snprintf(name, sizeof name, "model.layers.%d.%s.weight", i, wname[w]);
        TRY(dtl_safetensors_write_add(wr, name, DTL_FLOAT8_E4M3, 2, wshape[w], q[i][w].part[DTL_QPART_CODES]));
        snprintf(name, sizeof name, "model.layers.%d.%s.weight_scale_inv", i, wname[w]);
        TRY(dtl_safetensors_write_add(wr, name, DTL_FLOAT32, 2, sshape, q[i][w].part[DTL_QPART_SCALES]));
      }
    TRY(dtl_safetensors_write_metadata(wr, "quantization", "fp8 block 128x128 (weight_scale_inv)"));
    TRY(dtl_safetensors_write_end(wr));
    printf("wrote %s: %d layers, %.1f KiB of FP8 codes and scales (the dense f32 weights: %.1f KiB)\n", path, LAYERS,
           qbytes / 1024.0, dbytes / 1024.0);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  /* The dense reference on the dequantized weights, on one rank (each rank's own MPI_COMM_SELF). */
  dtl_comm *self, *world;
  dtl_mesh *self_mesh;
  dtl_tp_context *self_ctx;
  TRY(dtl_comm_from_mpi(MPI_COMM_SELF, &self));
  TRY(dtl_mesh_create(self, 1, &one, &self_mesh));
  TRY(dtl_tp_context_create(self_mesh, 0, NULL, &self_ctx));
  dtl_tp_attention *dattn[LAYERS];
  dtl_tp_mlp *dmlp[LAYERS];
  for (int i = 0; i < LAYERS; i++) {
    float *qkv = malloc(sizeof(float) * (QH + 2 * KVH) * HD * HID), *gu = malloc(sizeof(float) * 2 * FFN * HID);
    memcpy(qkv, dq[i][WQ], sizeof(float) * QH * HD * HID);
    memcpy(qkv + QH * HD * HID, dq[i][WK], sizeof(float) * KVH * HD * HID);
    memcpy(qkv + (QH + KVH) * HD * HID, dq[i][WV], sizeof(float) * KVH * HD * HID);
    memcpy(gu, dq[i][WG], sizeof(float) * FFN * HID);
    memcpy(gu + FFN * HID, dq[i][WU], sizeof(float) * FFN * HID);
    dtl_tp_attention_params ap = {.hidden = HID, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .qkv = qkv,
                                  .out = dq[i][WO]};
    dtl_tp_mlp_params mp = {.activation = DTL_TP_ACT_SILU_GATED, .hidden = HID, .ffn = FFN, .gate_up = gu,
                            .down = dq[i][WD]};
    TRY(dtl_tp_attention_create(self_ctx, &ap, &dattn[i]));
    TRY(dtl_tp_mlp_create(self_ctx, &mp, &dmlp[i]));
    free(qkv), free(gu);
  }
  uint64_t xs = SEED + 1;
  float *x0 = uniform(&xs, (size_t)T * HID, 1.0f), *ref = malloc(sizeof(float) * T * HID);
  memcpy(ref, x0, sizeof(float) * T * HID);
  forward(self_ctx, dattn, dmlp, ref);
  double ref_max = 0;
  for (int j = 0; j < T * HID; j++) ref_max = fmax(ref_max, fabs(ref[j]));

  /* Each TP degree from the one file. */
  TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  int failed = 0, degrees[3] = {1, 2, 4};
  for (int di = 0; di < 3; di++) {
    int tp = degrees[di];
    if (tp > np || np % tp) {
      if (rank == 0) printf("tp=%d: skipped (%d ranks)\n", tp, np);
      continue;
    }
    int shape[2] = {np / tp, tp};
    dtl_mesh *mesh;
    dtl_tp_context *ctx;
    dtl_safetensors *f;
    TRY(dtl_mesh_create(world, 2, shape, &mesh));
    TRY(dtl_tp_context_create(mesh, 1, NULL, &ctx));
    TRY(dtl_safetensors_open(path, &f));
    qlayer L[LAYERS];
    dtl_tp_attention *attn[LAYERS];
    dtl_tp_mlp *mlp[LAYERS];
    size_t held = 0;
    for (int i = 0; i < LAYERS; i++) {
      char n[NW][96];
      for (int w = 0; w < NW; w++) snprintf(n[w], sizeof n[w], "model.layers.%d.%s", i, wname[w]);
      TRY(dtl_tp_qweight_read_qkv(ctx, f, &fmt, n[WQ], n[WK], n[WV], QH, KVH, HD, HID, &L[i].qkv));
      TRY(dtl_tp_qweight_read_attention_out(ctx, f, &fmt, n[WO], QH, KVH, HD, HID, &L[i].o));
      TRY(dtl_tp_qweight_read_gate_up(ctx, f, &fmt, n[WG], n[WU], FFN, HID, &L[i].gate_up));
      TRY(dtl_tp_qweight_read_row(ctx, f, &fmt, n[WD], HID, FFN, &L[i].down));
      dtl_tp_attention_params ap = {.mask = DTL_TP_QUANT_WEIGHTS, .hidden = HID, .q_heads = QH, .kv_heads = KVH,
                                    .head_dim = HD, .qq = dtl_tp_qshard_weight(L[i].qkv, 0),
                                    .qk = dtl_tp_qshard_weight(L[i].qkv, 1), .qv = dtl_tp_qshard_weight(L[i].qkv, 2),
                                    .qout = dtl_tp_qshard_weight(L[i].o, 0)};
      dtl_tp_mlp_params mp = {.mask = DTL_TP_QUANT_WEIGHTS, .activation = DTL_TP_ACT_SILU_GATED, .hidden = HID,
                              .ffn = FFN, .qgate = dtl_tp_qshard_weight(L[i].gate_up, 0),
                              .qup = dtl_tp_qshard_weight(L[i].gate_up, 1), .qdown = dtl_tp_qshard_weight(L[i].down, 0)};
      TRY(dtl_tp_attention_create(ctx, &ap, &attn[i]));
      TRY(dtl_tp_mlp_create(ctx, &mp, &mlp[i]));
      /* The layers keep their own copies: the shards read from the file can go at once. */
      dtl_tp_qshard *sh[4] = {L[i].qkv, L[i].o, L[i].gate_up, L[i].down};
      for (int k = 0; k < 4; k++) {
        for (int w = 0; w < dtl_tp_qshard_count(sh[k]); w++) {
          dtl_qbox b;
          TRY(dtl_qlayout_local_boxes(dtl_tp_qshard_weight(sh[k], w)->layout, NULL, &b));
          for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) held += b.part[p].ndim >= 0 ? b.part[p].bytes : 0;
        }
        dtl_tp_qshard_destroy(sh[k]);
      }
    }
    dtl_safetensors_close(f);
    float *x = malloc(sizeof(float) * T * HID);
    memcpy(x, x0, sizeof(float) * T * HID);
    forward(ctx, attn, mlp, x);
    double err = 0;
    for (int j = 0; j < T * HID; j++) err = fmax(err, fabs((double)x[j] - ref[j]));
    double worst = err, held_max = (double)held;
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &held_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int bad = !(worst <= TOLERANCE * ref_max);
    failed |= bad;
    if (rank == 0)
      printf("tp=%d (%d replica%s): read %.1f KiB of codes and scales per rank at most; max |err| %.3g against the "
             "dense model on the dequantized weights (max |y| %.3g, relative %.2g)%s\n",
             tp, np / tp, np / tp > 1 ? "s" : "", held_max / 1024.0, worst, ref_max, worst / ref_max,
             bad ? "  FAILED" : "");
    for (int i = 0; i < LAYERS; i++) dtl_tp_attention_destroy(attn[i]), dtl_tp_mlp_destroy(mlp[i]);
    free(x);
    dtl_tp_context_destroy(ctx);
    dtl_mesh_destroy(mesh);
  }

  for (int i = 0; i < LAYERS; i++) {
    dtl_tp_attention_destroy(dattn[i]);
    dtl_tp_mlp_destroy(dmlp[i]);
    for (int w = 0; w < NW; w++) {
      free(dq[i][w]);
      for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(q[i][w].part[p]);
    }
  }
  dtl_tp_context_destroy(self_ctx);
  dtl_mesh_destroy(self_mesh);
  dtl_comm_destroy(self);
  dtl_comm_destroy(world);
  free(x0), free(ref);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && argc <= 1) remove(path);
  if (rank == 0) printf("%s\n", failed ? "FAILED" : "all TP degrees match the dense model");
  MPI_Finalize();
  return failed;
}

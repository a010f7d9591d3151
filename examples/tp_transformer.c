/* SPDX-License-Identifier: Apache-2.0 */
/* One transformer layer, dense on every rank and tensor-parallel over all ranks, with and without sequence
 * parallelism: embedding -> RMSNorm -> GQA attention -> residual -> RMSNorm -> SwiGLU MLP -> residual ->
 * RMSNorm -> LM head -> argmax. Random weights from a fixed seed. Prints the max absolute and relative
 * error of every output against the dense run and exits non-zero when a relative error (max |err| over
 * max |dense|) passes 1e-4 (f32) or an argmax differs.
 *
 * The sizes exercise uneven splits: 13 tokens (odd: S(0) shards differ), ffn 170 and vocab 1000 (not
 * divisible by 3 or 4), 8 q heads over 2 kv heads (replicated on tp = 4). Grouped-query heads need
 * tp <= 2 or tp dividing both heads counts evenly: run it on 1, 2, 4 or 8 ranks.
 * Run: mpirun -n 4 ./tp_transformer */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "example.h"

enum { T = 13, HID = 64, QH = 8, KVH = 2, HD = 8, FFN = 170, VOCAB = 1000 };
#define TOLERANCE 1e-4
#define SEED 1234u

typedef struct {
  float *embed, *norm1, *qkv, *wo, *norm2, *gate_up, *down, *norm_f, *head;
} weights;

static float *uniform(uint64_t *s, size_t n, float scale) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = scale * (2.0f * (float)(*s >> 40) / 16777216.0f - 1.0f);
  }
  return p;
}

static weights make_weights(void) {
  uint64_t s = SEED;
  weights w;
  w.embed = uniform(&s, (size_t)VOCAB * HID, 1.0f);
  w.norm1 = uniform(&s, HID, 0.2f);
  w.qkv = uniform(&s, (size_t)(QH + 2 * KVH) * HD * HID, 1.0f / sqrtf(HID));
  w.wo = uniform(&s, (size_t)HID * QH * HD, 1.0f / sqrtf(QH * HD));
  w.norm2 = uniform(&s, HID, 0.2f);
  w.gate_up = uniform(&s, (size_t)2 * FFN * HID, 1.0f / sqrtf(HID));
  w.down = uniform(&s, (size_t)HID * FFN, 1.0f / sqrtf(FFN));
  w.norm_f = uniform(&s, HID, 0.2f);
  w.head = uniform(&s, (size_t)VOCAB * HID, 1.0f / sqrtf(HID));
  for (int i = 0; i < HID; i++) w.norm1[i] += 1.0f, w.norm2[i] += 1.0f, w.norm_f[i] += 1.0f;
  return w;
}

/* RMSNorm of rows token rows (purely local, so it runs unchanged on S(0) shards). */
static void rmsnorm(const float *x, const float *g, float *y, int64_t rows) {
  for (int64_t t = 0; t < rows; t++) {
    double ss = 0;
    for (int i = 0; i < HID; i++) ss += (double)x[t * HID + i] * x[t * HID + i];
    float inv = 1.0f / sqrtf((float)(ss / HID) + 1e-6f);
    for (int i = 0; i < HID; i++) y[t * HID + i] = x[t * HID + i] * inv * g[i];
  }
}

/* ---- the dense reference: plain loops and cblas_sgemm, no dtl ---------------------------------------- */
static void linear(const float *x, const float *w, float *y, int m, int n, int k) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
}

static void dense_layer(const weights *w, const int64_t *ids, float *attn_out, float *layer_out, float *logits) {
  enum { W = (QH + 2 * KVH) * HD };
  static float x[T * HID], h[T * HID], qkv[T * W], o[T * QH * HD], gu[T * 2 * FFN], a[T * FFN], tmp[T * HID];
  for (int t = 0; t < T; t++) memcpy(x + t * HID, w->embed + ids[t] * HID, HID * sizeof(float));
  rmsnorm(x, w->norm1, h, T);
  linear(h, w->qkv, qkv, T, W, HID);
  for (int hq = 0; hq < QH; hq++) {
    int kh = hq / (QH / KVH);
    for (int i = 0; i < T; i++) {
      float p[T], mx = -INFINITY, sum = 0;
      for (int j = 0; j <= i; j++) {
        float d = 0;
        for (int e = 0; e < HD; e++) d += qkv[i * W + hq * HD + e] * qkv[j * W + (QH + kh) * HD + e];
        p[j] = d / sqrtf(HD);
        mx = p[j] > mx ? p[j] : mx;
      }
      for (int j = 0; j <= i; j++) sum += (p[j] = expf(p[j] - mx));
      for (int e = 0; e < HD; e++) {
        float acc = 0;
        for (int j = 0; j <= i; j++) acc += p[j] / sum * qkv[j * W + (QH + KVH + kh) * HD + e];
        o[i * QH * HD + hq * HD + e] = acc;
      }
    }
  }
  linear(o, w->wo, attn_out, T, HID, QH * HD);
  for (int i = 0; i < T * HID; i++) x[i] += attn_out[i];
  rmsnorm(x, w->norm2, h, T);
  linear(h, w->gate_up, gu, T, 2 * FFN, HID);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < FFN; j++) {
      float g = gu[t * 2 * FFN + j];
      a[t * FFN + j] = g / (1.0f + expf(-g)) * gu[t * 2 * FFN + FFN + j];
    }
  linear(a, w->down, tmp, T, HID, FFN);
  for (int i = 0; i < T * HID; i++) layer_out[i] = x[i] + tmp[i];
  rmsnorm(layer_out, w->norm_f, h, T);
  linear(h, w->head, logits, T, VOCAB, HID);
}

/* ---- the tensor-parallel run ----------------------------------------------------------------------- */
typedef struct {
  double abs_err, ref_max;
} error;

static void compare(error *e, const float *got, const float *ref, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - ref[i]);
    if (!(d <= e->abs_err)) e->abs_err = d;
    if (fabs(ref[i]) > e->ref_max) e->ref_max = fabs(ref[i]);
  }
}

/* Runs the layer on the TP context; errors[0..2] get the attention output, layer output and the logits
 * (each rank compares its own local shard with the matching slice of the dense run); returns the number
 * of tokens whose argmax differs from the dense one. */
static int tp_layer(dtl_tp_context *ctx, const weights *w, int sp, const int64_t *ids, const float *d_attn,
                    const float *d_out, const float *d_logits, error *errors) {
  uint64_t flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0;
  dtl_tp_embedding *emb;
  dtl_tp_attention *attn;
  dtl_tp_mlp *mlp;
  dtl_tp_linear *head;
  dtl_tp_embedding_params ep = {.flags = flags, .vocab = VOCAB, .hidden = HID, .table = w->embed};
  dtl_tp_attention_params ap = {.flags = flags, .hidden = HID, .q_heads = QH, .kv_heads = KVH, .head_dim = HD,
                                .qkv = w->qkv, .out = w->wo};
  dtl_tp_mlp_params mp = {.flags = flags, .activation = DTL_TP_ACT_SILU_GATED, .hidden = HID, .ffn = FFN,
                          .gate_up = w->gate_up, .down = w->down};
  dtl_tp_linear_params hp = {.flags = flags, .kind = DTL_TP_COLUMN, .in_features = HID, .out_features = VOCAB,
                             .weight = w->head};
  TRY(dtl_tp_embedding_create(ctx, &ep, &emb));
  TRY(dtl_tp_attention_create(ctx, &ap, &attn));
  TRY(dtl_tp_mlp_create(ctx, &mp, &mlp));
  TRY(dtl_tp_linear_create(ctx, &hp, &head));
  /* The residual stream's layout: R, or S(0) on tokens with sequence parallelism. */
  dtl_layout *stream, *logits_l;
  TRY(dtl_tp_attention_layouts(attn, T, &stream, NULL));
  TRY(dtl_tp_linear_layouts(head, T, NULL, &logits_l));
  int64_t shape[2], off[2], lshape[2], loff[2];
  TRY(dtl_layout_local_box(stream, NULL, shape, off));
  TRY(dtl_layout_local_box(logits_l, NULL, lshape, loff));
  int64_t rows = shape[0], r0 = off[0];
  size_t n = (size_t)rows * HID;
  float *x = malloc(n * sizeof(float) + 4), *h = malloc(n * sizeof(float) + 4), *y = malloc(n * sizeof(float) + 4);
  float *logits = malloc(dtl_layout_local_count(logits_l) * sizeof(float) + 4);
  TRY(dtl_tp_embedding_forward(emb, T, ids, x));
  rmsnorm(x, w->norm1, h, rows);
  TRY(dtl_tp_attention_forward(attn, stream, h, y));
  compare(&errors[0], y, d_attn + r0 * HID, n);
  for (size_t i = 0; i < n; i++) x[i] += y[i];
  rmsnorm(x, w->norm2, h, rows);
  TRY(dtl_tp_mlp_forward(mlp, stream, h, y));
  for (size_t i = 0; i < n; i++) x[i] += y[i];
  compare(&errors[1], x, d_out + r0 * HID, n);
  rmsnorm(x, w->norm_f, h, rows);
  TRY(dtl_tp_linear_forward(head, stream, h, logits));
  for (int64_t t = 0; t < lshape[0]; t++) compare(&errors[2], logits + t * lshape[1], d_logits + t * VOCAB + loff[1], (size_t)lshape[1]);
  int64_t am[T];
  TRY(dtl_tp_logits_argmax(ctx, logits_l, logits, am));
  int wrong = 0;
  for (int t = 0; t < T; t++) {
    int best = 0;
    for (int v = 1; v < VOCAB; v++)
      if (d_logits[t * VOCAB + v] > d_logits[t * VOCAB + best]) best = v;
    wrong += am[t] != best;
  }
  free(x), free(h), free(y), free(logits);
  dtl_layout_destroy(stream);
  dtl_layout_destroy(logits_l);
  dtl_tp_linear_destroy(head);
  dtl_tp_mlp_destroy(mlp);
  dtl_tp_attention_destroy(attn);
  dtl_tp_embedding_destroy(emb);
  return wrong;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, np;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  double t0 = MPI_Wtime();
  dtl_comm *world;
  dtl_mesh *mesh;
  dtl_tp_context *ctx;
  TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  TRY(dtl_mesh_create(world, 1, &np, &mesh));
  TRY(dtl_tp_context_create(mesh, 0, NULL, &ctx));
  if (dtl_tp_attention_heads(ctx, QH, KVH, NULL, NULL) != DTL_OK) {
    if (rank == 0) fprintf(stderr, "tp_transformer: cannot run on %d ranks: %s\n", np, dtl_last_error());
    dtl_tp_context_destroy(ctx);
    dtl_mesh_destroy(mesh);
    dtl_comm_destroy(world);
    MPI_Finalize();
    return 2;
  }
  weights w = make_weights();
  int64_t ids[T];
  for (int t = 0; t < T; t++) ids[t] = (int64_t)((t * 7919u + SEED) % VOCAB);
  static float d_attn[T * HID], d_out[T * HID], d_logits[T * VOCAB];
  dense_layer(&w, ids, d_attn, d_out, d_logits);
  if (rank == 0)
    printf("tp_transformer: tp=%d, tokens=%d, hidden=%d, heads q=%d kv=%d x %d, ffn=%d, vocab=%d, seed=%u, f32\n"
           "tolerance: max|err| / max|dense| <= %.0e and identical argmax\n"
           "%-18s %-12s %12s %12s\n",
           np, T, HID, QH, KVH, HD, FFN, VOCAB, SEED, TOLERANCE, "mode", "output", "max_abs_err", "max_rel_err");
  static const char *names[3] = {"attention", "layer", "logits"};
  int bad = 0;
  for (int sp = 0; sp < 2; sp++) {
    error e[3] = {{0, 0}, {0, 0}, {0, 0}};
    int wrong = tp_layer(ctx, &w, sp, ids, d_attn, d_out, d_logits, e);
    for (int i = 0; i < 3; i++) {
      double local[2] = {e[i].abs_err, e[i].ref_max}, all[2];
      MPI_Allreduce(local, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double rel = all[0] / (all[1] > 0 ? all[1] : 1);
      bad += !(rel <= TOLERANCE);
      if (rank == 0)
        printf("%-18s %-12s %12.3e %12.3e%s\n", sp ? "sequence-parallel" : "tensor-parallel", names[i], all[0], rel,
               rel <= TOLERANCE ? "" : "  FAIL");
    }
    if (rank == 0)
      printf("%-18s %-12s %d of %d tokens differ%s\n", sp ? "sequence-parallel" : "tensor-parallel", "argmax", wrong, T,
             wrong ? "  FAIL" : "");
    bad += wrong != 0;
  }
  if (rank == 0) printf("%s in %.2f s\n", bad ? "FAILED" : "OK", MPI_Wtime() - t0);
  free(w.embed), free(w.norm1), free(w.qkv), free(w.wo), free(w.norm2), free(w.gate_up), free(w.down), free(w.norm_f),
      free(w.head);
  dtl_tp_context_destroy(ctx);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  MPI_Finalize();
  return bad ? 1 : 0;
}

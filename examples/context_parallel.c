/* SPDX-License-Identifier: Apache-2.0 */
/* Context parallelism by hand and at scale. First a two-chunk softmax merge with small numbers, so the
 * arithmetic can be followed on paper. Then one causal sequence of 1500 tokens (GQA: 8 q heads, 2 kv heads,
 * head_dim 32) split over the ranks three ways: ring attention and all-to-all (Ulysses) attention on the
 * zig-zag layout, and decode of the last token against a KV cache split by tokens. Each result is checked
 * against dense causal attention computed here without dtl (OpenBLAS for the products, the softmax in
 * double); the program exits non-zero past a relative error of 1e-4. Run: mpirun -n 4 ./context_parallel */
#include <cblas.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T = 1500, QH = 8, KVH = 2, HD = 32, QW = QH * HD, KVW = KVH * HD };

static float value(unsigned seed, int64_t i) { /* deterministic data in [-1, 1) */
  uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
  return (float)((z >> 40) & 0xFFFF) / 32768.0f - 1.0f;
}
static float Q(int64_t t, int64_t c) { return value(1, t * QW + c); }
static float K(int64_t t, int64_t c) { return value(2, t * KVW + c); }
static float V(int64_t t, int64_t c) { return value(3, t * KVW + c); }

/* The dense reference, with no dtl: causal attention of the query tokens rows[0..n) over the whole sequence,
 * scores and weighted values by cblas_sgemm, the softmax in double. Qd, Kd, Vd: the whole sequence. */
static void dense(const int64_t *rows, int64_t n, const float *Qd, const float *Kd, const float *Vd, double *out) {
  float *q = malloc(sizeof(float) * (size_t)(n * HD + 1)), *s = malloc(sizeof(float) * (size_t)(n * T + 1));
  float *o = malloc(sizeof(float) * (size_t)(n * HD + 1));
  for (int64_t h = 0; h < QH; h++) {
    int64_t kh = h / (QH / KVH);
    for (int64_t i = 0; i < n; i++) memcpy(q + i * HD, Qd + rows[i] * QW + h * HD, sizeof(float) * HD);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, T, HD, (float)(1.0 / sqrt((double)HD)), q, HD,
                Kd + kh * HD, KVW, 0.0f, s, T);
    for (int64_t i = 0; i < n; i++) { /* row i sees keys 0..rows[i] */
      float *r = s + i * T;
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= rows[i]; j++) mx = fmax(mx, r[j]);
      for (int64_t j = 0; j <= rows[i]; j++) sum += exp(r[j] - mx);
      for (int64_t j = 0; j < T; j++) r[j] = j <= rows[i] ? (float)(exp(r[j] - mx) / sum) : 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, HD, T, 1.0f, s, T, Vd + kh * HD, KVW, 0.0f, o, HD);
    for (int64_t i = 0; i < n; i++)
      for (int64_t d = 0; d < HD; d++) out[i * QW + h * HD + d] = o[i * HD + d];
  }
  free(q), free(s), free(o);
}

/* max |got - ref| / max |ref| over the given rows. */
static double rel_error(const float *got, const double *ref, int64_t n) {
  double err = 0, mx = 0;
  for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i])), err = fmax(err, fabs(got[i] - ref[i]));
  return err / (mx > 0 ? mx : 1);
}

/* Part 1: one query, one head, head_dim 2, three keys in two chunks. */
static int merge_by_hand(void) {
  const float q[2] = {1, 0}, k[3][2] = {{1, 0}, {0, 0}, {2, 0}}, v[3][2] = {{1, 0}, {0, 1}, {1, 1}};
  float o[2][2], lse[2];
  const int chunk[2][2] = {{0, 2}, {2, 3}}; /* keys 0-1 and key 2 */
  printf("== a two-chunk softmax merge (one query q = [1, 0], scale 1)\n");
  for (int c = 0; c < 2; c++) { /* each chunk's own softmax: o normalised by its denominator, lse = log(denominator) */
    float den = 0, acc[2] = {0, 0};
    for (int j = chunk[c][0]; j < chunk[c][1]; j++) {
      float s = q[0] * k[j][0] + q[1] * k[j][1], e = expf(s);
      den += e, acc[0] += e * v[j][0], acc[1] += e * v[j][1];
      printf("   chunk %c: key %d score %.0f, e^score %.4f, value [%.0f, %.0f]\n", 'A' + c, j, s, e, v[j][0], v[j][1]);
    }
    o[c][0] = acc[0] / den, o[c][1] = acc[1] / den, lse[c] = logf(den);
    printf("   chunk %c: denominator %.4f  lse = log(%.4f) = %.4f  o = [%.4f, %.4f]\n", 'A' + c, den, den, lse[c],
           o[c][0], o[c][1]);
  }
  float L = logf(expf(lse[0]) + expf(lse[1]));
  printf("   merge: lse = log(e^%.4f + e^%.4f) = %.4f; weights e^(lse_A - lse) = %.4f, e^(lse_B - lse) = %.4f\n",
         lse[0], lse[1], L, expf(lse[0] - L), expf(lse[1] - L));
  if (dtl_attn_state_merge(1, 1, 2, o[0], &lse[0], o[1], &lse[1]) != DTL_OK) {
    fprintf(stderr, "dtl_attn_state_merge: %s\n", dtl_last_error());
    return 1;
  }
  float den = expf(1) + expf(0) + expf(2), full[2] = {(expf(1) + expf(2)) / den, (expf(0) + expf(2)) / den};
  printf("   dtl_attn_state_merge: o = [%.4f, %.4f], lse = %.4f\n", o[0][0], o[0][1], lse[0]);
  printf("   softmax over all three keys: o = [%.4f, %.4f], lse = log(%.4f) = %.4f\n", full[0], full[1], den,
         logf(den));
  return fabsf(o[0][0] - full[0]) > 1e-6f || fabsf(o[0][1] - full[1]) > 1e-6f || fabsf(lse[0] - logf(den)) > 1e-6f;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  dtl_comm *world;
  dtl_mesh *mesh;
  dtl_cp_context *ctx;
  dtl_comm_from_mpi(MPI_COMM_WORLD, &world);
  int p = dtl_comm_size(world), r = dtl_comm_rank(world), bad = 0;
  if (dtl_mesh_create(world, 1, &p, &mesh) != DTL_OK || dtl_cp_context_create(mesh, 0, NULL, &ctx) != DTL_OK) {
    fprintf(stderr, "context_parallel: %s\n", dtl_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (r == 0) bad |= merge_by_hand();

  /* Part 2: this rank's tokens under the zig-zag layout (2p chunks; rank r holds chunk r, then 2p-1-r). */
  dtl_cp_range rg[2];
  dtl_cp_token_ranges(DTL_CP_ZIGZAG, T, p, r, rg);
  int64_t n = rg[0].count + rg[1].count, *rows = malloc(sizeof(int64_t) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) rows[i] = i < rg[0].count ? rg[0].offset + i : rg[1].offset + i - rg[0].count;
  if (r == 0) {
    printf("== one sequence of %d tokens (%d q heads, %d kv heads, head_dim %d) over %d ranks, zig-zag layout:\n", T,
           QH, KVH, HD, p);
    for (int j = 0; j < p; j++) {
      dtl_cp_range x[2];
      dtl_cp_token_ranges(DTL_CP_ZIGZAG, T, p, j, x);
      printf("   rank %d holds tokens %lld-%lld and %lld-%lld\n", j, (long long)x[0].offset,
             (long long)(x[0].offset + x[0].count - 1), (long long)x[1].offset,
             (long long)(x[1].offset + x[1].count - 1));
    }
  }
  float *q = malloc(sizeof(float) * (size_t)(n * QW + 1)), *k = malloc(sizeof(float) * (size_t)(n * KVW + 1));
  float *v = malloc(sizeof(float) * (size_t)(n * KVW + 1)), *out = malloc(sizeof(float) * (size_t)(n * QW + 1));
  double *ref = malloc(sizeof(double) * (size_t)(n * QW + 1));
  float *Qd = malloc(sizeof(float) * T * QW), *Kd = malloc(sizeof(float) * T * KVW);
  float *Vd = malloc(sizeof(float) * T * KVW);
  for (int64_t t = 0; t < T; t++) {
    for (int64_t c = 0; c < QW; c++) Qd[t * QW + c] = Q(t, c);
    for (int64_t c = 0; c < KVW; c++) Kd[t * KVW + c] = K(t, c), Vd[t * KVW + c] = V(t, c);
  }
  for (int64_t i = 0; i < n; i++) {
    memcpy(q + i * QW, Qd + rows[i] * QW, sizeof(float) * QW);
    memcpy(k + i * KVW, Kd + rows[i] * KVW, sizeof(float) * KVW);
    memcpy(v + i * KVW, Vd + rows[i] * KVW, sizeof(float) * KVW);
  }
  dense(rows, n, Qd, Kd, Vd, ref);
  dtl_cp_attention_params prm = {.flags = DTL_CP_CAUSAL, .tokens = T, .q_heads = QH, .kv_heads = KVH, .head_dim = HD};
  double err[3] = {0, 0, 0}, all[3];
  const char *names[3] = {"ring attention", "all-to-all (Ulysses) attention", "split-KV decode of the last token"};
  dtl_status st[3];
  st[0] = dtl_cp_ring_attention(ctx, &prm, q, k, v, out, NULL);
  if (st[0] == DTL_OK) err[0] = rel_error(out, ref, n * QW);
  st[1] = dtl_cp_ulysses_attention(ctx, &prm, q, k, v, out, NULL);
  if (st[1] == DTL_OK) err[1] = rel_error(out, ref, n * QW);
  else if (r == 0) printf("   ulysses: %s\n", dtl_last_error());

  /* Decode: the cache of all T tokens split contiguously by tokens; the new query is token T - 1. */
  dtl_cp_range part[2];
  dtl_cp_token_ranges(DTL_CP_CONTIGUOUS, T, p, r, part);
  size_t cache = sizeof(float) * (size_t)(part[0].count * KVW + 1);
  float *kc = malloc(cache), *vc = malloc(cache);
  float qlast[QW], olast[QW];
  double rlast[QW];
  memcpy(kc, Kd + part[0].offset * KVW, sizeof(float) * (size_t)(part[0].count * KVW));
  memcpy(vc, Vd + part[0].offset * KVW, sizeof(float) * (size_t)(part[0].count * KVW));
  int64_t last = T - 1;
  memcpy(qlast, Qd + last * QW, sizeof qlast);
  dense(&last, 1, Qd, Kd, Vd, rlast);
  dtl_cp_decode_params dp = {.flags = DTL_CP_CAUSAL, .tokens = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD,
                             .q_pos0 = T - 1, .kv_tokens = part[0].count, .kv_pos0 = part[0].offset};
  st[2] = dtl_cp_decode_attention(ctx, &dp, qlast, kc, vc, olast, NULL);
  if (st[2] == DTL_OK) err[2] = rel_error(olast, rlast, QW);

  MPI_Allreduce(err, all, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  for (int i = 0; i < 3; i++) {
    int ok = st[i] == DTL_OK && all[i] <= 1e-4;
    bad |= st[i] != DTL_OK && !(i == 1 && st[i] == DTL_ERR_INVALID_ARGUMENT); /* heads that do not split: said above */
    bad |= st[i] == DTL_OK && !ok;
    if (st[i] != DTL_OK && i != 1) fprintf(stderr, "[rank %d] %s: %s\n", r, names[i], dtl_last_error());
    if (r == 0 && st[i] == DTL_OK)
      printf("   %-36s max relative error vs dense causal attention %.1e  %s\n", names[i], all[i], ok ? "ok" : "WRONG");
  }
  free(rows), free(q), free(k), free(v), free(out), free(ref), free(kc), free(vc), free(Qd), free(Kd), free(Vd);
  dtl_cp_context_destroy(ctx);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  int any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any != 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Context parallelism on an NCCL context (world size 1: one GPU holds one NCCL rank) against the dense
 * reference of cp_oracle.h, in f32, f16 and bf16: ring and all-to-all prefill (causal, GQA, uneven T), decode
 * against a cache, the collective merge, and the local merge on device memory against the host merge. The
 * device sees inputs rounded to its dtype, as the reference does; outputs are within two roundings of the
 * dtype (f32: 2e-5). Runs under mpirun with one rank; exits 77 (skipped) without a CUDA device. What this
 * cannot reach at one rank (the ring's transfers, the all-to-alls between ranks) runs in test_cp_attention.c
 * through the device code emulated on the host. */
#include "dt_nccl.h"
#include "cp_oracle.h"

static dt_nccl G;
static dtl_cp_context *D;
static dtl_dtype DT;

#define CUDA_CHECK(call) CHECK((call) == cudaSuccess, "%s", #call)

/* A device copy of n elements of DT (or of raw bytes with DT ignored when bytes), synchronised. */
static void *up_bytes(const void *h, size_t bytes) {
  void *d = NULL;
  CUDA_CHECK(cudaMalloc(&d, bytes + 4));
  CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, G.stream));
  CUDA_CHECK(cudaStreamSynchronize(G.stream));
  return d;
}
static void down_bytes(const void *d, void *h, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, G.stream));
  CUDA_CHECK(cudaStreamSynchronize(G.stream));
}

/* One prefill (ring or ulysses) of T tokens on the device against the reference. */
static void prefill_on_the_device_matches_dense_attention(int ulysses) {
  const int64_t T = 45, qh = 6, kvh = 2, hd = 16, qw = qh * hd, kvw = kvh * hd;
  cp_data d;
  cp_data_make(&d, T, qh, kvh, hd, 31, DT);
  int64_t rows[45];
  for (int64_t i = 0; i < T; i++) rows[i] = i;
  double *ref = malloc(sizeof(double) * (size_t)(T * qw)), *ref_lse = malloc(sizeof(double) * (size_t)(T * qh));
  cp_oracle(&d, T, rows, T, rows, true, 1.0 / sqrt((double)hd), ref, ref_lse);
  size_t es = dtl_dtype_size(DT);
  void *hq = cp_pack_rows(d.Q, qw, rows, T, DT), *hk = cp_pack_rows(d.K, kvw, rows, T, DT);
  void *hv = cp_pack_rows(d.V, kvw, rows, T, DT), *hout = malloc((size_t)(T * qw) * es);
  float *hlse = malloc(sizeof(float) * (size_t)(T * qh));
  void *q = up_bytes(hq, (size_t)(T * qw) * es), *k = up_bytes(hk, (size_t)(T * kvw) * es);
  void *v = up_bytes(hv, (size_t)(T * kvw) * es), *out = up_bytes(hout, (size_t)(T * qw) * es);
  float *lse = up_bytes(hlse, sizeof(float) * (size_t)(T * qh));
  dtl_cp_attention_params p = {.flags = DTL_CP_CAUSAL, .tokens = T, .q_heads = qh, .kv_heads = kvh, .head_dim = hd};
  CHECK_OK(ulysses ? dtl_cp_ulysses_attention(D, &p, q, k, v, out, lse)
                   : dtl_cp_ring_attention(D, &p, q, k, v, out, lse));
  down_bytes(out, hout, (size_t)(T * qw) * es);
  down_bytes(lse, hlse, sizeof(float) * (size_t)(T * qh));
  char why[200];
  CHECK(cp_compare(ref, hout, (size_t)(T * qw), DT, 2, 2e-5, why, sizeof why) >= 0, "%s: %s",
        ulysses ? "ulysses" : "ring", why);
  CHECK(cp_compare_lse(ref_lse, hlse, (size_t)(T * qh), why, sizeof why), "%s: %s", ulysses ? "ulysses" : "ring", why);
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse);
  free(hq), free(hk), free(hv), free(hout), free(hlse), free(ref), free(ref_lse);
  cp_data_free(&d);
}
static void ring_on_the_device_matches_dense_attention(void) { prefill_on_the_device_matches_dense_attention(0); }
static void ulysses_on_the_device_matches_dense_attention(void) { prefill_on_the_device_matches_dense_attention(1); }

/* Decode: three new tokens against a cache of 40 whose positions come as an array in device memory. */
static void decode_on_the_device_matches_dense_attention(void) {
  const int64_t C = 40, tq = 3, qh = 4, kvh = 2, hd = 8, qw = qh * hd, kvw = kvh * hd;
  cp_data d;
  cp_data_make(&d, C, qh, kvh, hd, 32, DT);
  int64_t all[40], qrows[3];
  for (int64_t j = 0; j < C; j++) all[j] = j;
  for (int64_t i = 0; i < tq; i++) qrows[i] = C - tq + i;
  double ref[3 * 32], ref_lse[3 * 4];
  cp_oracle(&d, tq, qrows, C, all, true, 1.0 / sqrt((double)hd), ref, ref_lse);
  size_t es = dtl_dtype_size(DT);
  void *hq = cp_pack_rows(d.Q, qw, qrows, tq, DT), *hk = cp_pack_rows(d.K, kvw, all, C, DT);
  void *hv = cp_pack_rows(d.V, kvw, all, C, DT), *hout = malloc((size_t)(tq * qw) * es);
  void *q = up_bytes(hq, (size_t)(tq * qw) * es), *k = up_bytes(hk, (size_t)(C * kvw) * es);
  void *v = up_bytes(hv, (size_t)(C * kvw) * es), *out = up_bytes(hout, (size_t)(tq * qw) * es);
  int64_t *pos = up_bytes(all, sizeof all);
  dtl_cp_decode_params p = {.mask = DTL_CP_KV_POSITIONS, .flags = DTL_CP_CAUSAL, .tokens = tq, .q_heads = qh,
                            .kv_heads = kvh, .head_dim = hd, .q_pos0 = C - tq, .kv_tokens = C, .kv_pos = pos};
  CHECK_OK(dtl_cp_decode_attention(D, &p, q, k, v, out, NULL));
  down_bytes(out, hout, (size_t)(tq * qw) * es);
  char why[200];
  CHECK(cp_compare(ref, hout, (size_t)(tq * qw), DT, 3, 2e-5, why, sizeof why) >= 0, "decode: %s", why);
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(pos);
  free(hq), free(hk), free(hv), free(hout);
  cp_data_free(&d);
}

/* The local merge on device memory against the host merge of the same (rounded) states. */
static void merge_on_device_memory_matches_the_host_merge(void) {
  enum { T = 5, H = 3, HD = 33, N = T * H * HD };
  t_rand_state = 7;
  float *a = t_rand_reals(N, 2.0f, DT), *b = t_rand_reals(N, 2.0f, DT);
  float la[T * H], lb[T * H];
  for (int i = 0; i < T * H; i++)
    la[i] = i % 4 == 0 ? -INFINITY : 0.3f * (float)i, lb[i] = i % 5 == 0 ? -INFINITY : 1.0f;
  void *ha = t_pack(a, N, DT), *hb = t_pack(b, N, DT);
  size_t es = dtl_dtype_size(DT);
  void *da = up_bytes(ha, N * es), *db = up_bytes(hb, N * es);
  float *dla = up_bytes(la, sizeof la), *dlb = up_bytes(lb, sizeof lb);
  CHECK_OK(dtl_attn_state_merge(T, H, HD, a, la, b, lb));
  CHECK_OK(dtl_attn_state_merge_on(G.comm, DT, T, H, HD, da, dla, db, dlb));
  float got_l[T * H];
  down_bytes(da, ha, N * es);
  down_bytes(dla, got_l, sizeof got_l);
  for (int i = 0; i < T * H; i++)
    CHECK(got_l[i] == la[i] || fabsf(got_l[i] - la[i]) <= 1e-6f * (1 + fabsf(la[i])), "lse[%d] %g vs %g", i, got_l[i],
          la[i]);
  for (int i = 0; i < N; i++)
    CHECK(fabs(t_load(ha, (size_t)i, DT) - a[i]) <= 2 * t_half_unit(DT) * (fabs(a[i]) + 2) + 1e-6, "o[%d] %g vs %g", i,
          (double)t_load(ha, (size_t)i, DT), (double)a[i]);
  cudaFree(da), cudaFree(db), cudaFree(dla), cudaFree(dlb);
  free(a), free(b), free(ha), free(hb);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  if (dt_size != 1 || dtl_cuda_device_count() == 0)
    return dt_skip(dt_size != 1 ? "runs at one rank (one GPU holds one NCCL rank)"
                                : "no CUDA device (context parallelism on NCCL was not run)");
  dt_nccl_setup(&G);
  const dtl_dtype types[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};
  for (int ti = 0; ti < 3; ti++) {
    DT = types[ti];
    dtl_cp_options o = {.mask = DTL_CP_OPT_DTYPE, .dtype = DT};
    REQUIRE_OK(dtl_cp_context_create(G.mesh, 0, &o, &D));
    char name[128];
#define DEVICE_CASE(fn)                                                  \
  snprintf(name, sizeof name, "%s (%s)", #fn, dtl_dtype_name(DT)); \
  RUN_NAMED(name, fn())
    DEVICE_CASE(ring_on_the_device_matches_dense_attention);
    DEVICE_CASE(ulysses_on_the_device_matches_dense_attention);
    DEVICE_CASE(decode_on_the_device_matches_dense_attention);
    DEVICE_CASE(merge_on_device_memory_matches_the_host_merge);
    dtl_cp_context_destroy(D);
  }
  dt_nccl_teardown(&G);
  return dt_finish();
}

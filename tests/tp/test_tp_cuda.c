/* SPDX-License-Identifier: Apache-2.0 */
/* Every TP layer on a device context (NCCL at world size 1: one GPU holds one NCCL rank) against the host
 * path on an MPI context in the same process, in f32, f16 and bf16. The host path gets the device's inputs
 * rounded to the device's dtype, so only the device's own roundings and summation order differ:
 * - linear layers and the row-parallel reduction: integer data exact in every type, compared with ==;
 * - MLP (SiLU-gated and GELU) and attention (GQA, causal rows longer than a thread block; RoPE with a KV cache
 *   over prefill and decode steps, and its overflow) blocks, with and
 *   without biases and sequence parallelism: within tp_half.h's tolerance (f32: the host path's 1e-5);
 * - embedding: exact; an id outside the vocabulary is named and leaves the device output untouched;
 * - top-k/argmax (ties, NaN, a column-parallel LM head): the same indices and values as the host path.
 * Runs under mpirun with one rank; exits 77 (skipped) without a CUDA device. */
#include "tp_half.h"
#include "tp_env.h"
#include "dt_nccl.h"

static t_env E; /* the host path: an MPI context, one rank */
static dt_nccl G;
static dtl_tp_context *D; /* the device context of the dtype under test */
static dtl_dtype DT;

#define CUDA_CHECK(call) CHECK((call) == cudaSuccess, "%s", #call)

/* A device copy of h rounded to DT (NULL for NULL), ordered before anything later enqueued on stream. */
static void *up(const float *h, size_t n) {
  if (!h) return NULL;
  void *tmp = t_pack(h, n, DT), *d = NULL;
  CUDA_CHECK(cudaMalloc(&d, n * dtl_dtype_size(DT) + 4));
  CUDA_CHECK(cudaMemcpyAsync(d, tmp, n * dtl_dtype_size(DT), cudaMemcpyHostToDevice, G.stream));
  CUDA_CHECK(cudaStreamSynchronize(G.stream));
  free(tmp);
  return d;
}
/* The f32 values of n DT elements at d, once the stream has finished. */
static void down(const void *d, float *h, size_t n) {
  void *tmp = malloc(n * dtl_dtype_size(DT) + 4);
  CUDA_CHECK(cudaMemcpyAsync(tmp, d, n * dtl_dtype_size(DT), cudaMemcpyDeviceToHost, G.stream));
  CUDA_CHECK(cudaStreamSynchronize(G.stream));
  for (size_t i = 0; i < n; i++) h[i] = t_load(tmp, i, DT);
  free(tmp);
}
static void *dev_alloc(size_t n) {
  void *d = NULL;
  CUDA_CHECK(cudaMalloc(&d, n * dtl_dtype_size(DT) + 4));
  return d;
}
/* Frees after the stream is done (layers copy their weights asynchronously). */
static void release(void *d) {
  CUDA_CHECK(cudaStreamSynchronize(G.stream));
  cudaFree(d);
}
/* The test data as the device sees it: reals or integers rounded to DT. */
static float *reals(unsigned seed, int64_t n, float r) {
  float *p = t_reals(seed, n, r);
  t_round(p, (size_t)n, DT);
  return p;
}
static float *ints(unsigned seed, int64_t n, int r) {
  float *p = t_ints(seed, n, r);
  t_round(p, (size_t)n, DT);
  return p;
}

static dtl_layout *layout(dtl_tp_context *c, int64_t T, int64_t F, dtl_placement p) {
  dtl_layout *l = NULL;
  CHECK_OK(dtl_tp_activation_layout(c, T, F, p, &l));
  return l;
}

/* max |dev - host| within tp_half.h's tolerance. */
static void compare(const float *host, const float *dev, size_t n, const char *fmt, int a, int b, int c) {
  double mx = 0, err = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(host[i]));
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)dev[i] - host[i]);
    if (!(e <= err)) err = e; /* NaN propagates */
  }
  char what[96];
  snprintf(what, sizeof what, fmt, a, b, c);
  CHECK(err <= t_block_tol(DT, mx), "%s %s: max error %g against the host path (max |y| %g, tolerance %g)",
        dtl_dtype_name(DT), what, err, mx, t_block_tol(DT, mx));
}

/* ---------------------------------------------------------------------------------------------------- */
static void linear_layers_and_the_row_reduction_equal_the_host_exactly(void) {
  enum { T = 5, IN = 8, OUT = 6 };
  float *w = ints(1, OUT * IN, 2), *b = ints(2, OUT, 2), *x = ints(3, T * IN, 2), want[T * OUT], got[T * OUT];
  void *dw = up(w, OUT * IN), *db = up(b, OUT), *dx = up(x, T * IN), *dy = dev_alloc(T * OUT);
  for (int mode = 0; mode < 4; mode++) { /* column, column gathered, column sequence-parallel, row */
    dtl_tp_linear_params p = {.flags = mode == 1 ? DTL_TP_GATHER_OUTPUT : mode == 2 ? DTL_TP_SEQUENCE_PARALLEL : 0,
                              .kind = mode == 3 ? DTL_TP_ROW : DTL_TP_COLUMN, .in_features = IN, .out_features = OUT,
                              .weight = w, .bias = b};
    dtl_tp_linear *lh = NULL, *ld = NULL;
    dtl_layout *lih = NULL, *lid = NULL;
    CHECK_OK(dtl_tp_linear_create(E.ctx, &p, &lh));
    p.weight = dw, p.bias = db;
    CHECK_OK(dtl_tp_linear_create(D, &p, &ld));
    CHECK_OK(dtl_tp_linear_layouts(lh, T, &lih, NULL));
    CHECK_OK(dtl_tp_linear_layouts(ld, T, &lid, NULL));
    CHECK_OK(dtl_tp_linear_forward(lh, lih, x, want));
    CHECK_OK(dtl_tp_linear_forward(ld, lid, dx, dy));
    down(dy, got, T * OUT);
    for (int i = 0; i < T * OUT; i++) CHECK(got[i] == want[i], "mode %d y[%d]=%g, host %g", mode, i, got[i], want[i]);
    dtl_layout_destroy(lih), dtl_layout_destroy(lid);
    dtl_tp_linear_destroy(lh), dtl_tp_linear_destroy(ld);
  }
  /* The communication half with its bias, on device buffers. */
  dtl_layout *lo = layout(D, T, OUT, dtl_replicate());
  float *part = ints(4, T * OUT, 8);
  void *dp = up(part, T * OUT);
  CHECK_OK(dtl_tp_row_parallel_reduce(D, lo, dp, db, dy));
  down(dy, got, T * OUT);
  for (int i = 0; i < T * OUT; i++) CHECK(got[i] == part[i] + b[i % OUT], "reduce y[%d]=%g", i, got[i]);
  dtl_layout_destroy(lo);
  release(dw), release(db), release(dx), release(dy), release(dp);
  free(w), free(b), free(x), free(part);
}

/* ---------------------------------------------------------------------------------------------------- */
static void mlp_block_on_the_device_matches_the_host_path(void) {
  const int64_t H = 12, F = 10;
  for (int gated = 0; gated < 2; gated++)
    for (int sp = 0; sp < 2; sp++)
      for (int with_bias = 0; with_bias < 2; with_bias++) {
        int64_t T = sp ? 7 : 4, w = gated ? 2 * F : F;
        float *x = reals(51, T * H, 1.0f), *gu = reals(52, w * H, 0.5f), *dn = reals(53, H * F, 0.5f);
        float *gub = with_bias ? reals(54, w, 0.5f) : NULL, *dnb = with_bias ? reals(55, H, 0.5f) : NULL;
        float *want = malloc(sizeof(float) * (size_t)(T * H)), *got = malloc(sizeof(float) * (size_t)(T * H));
        dtl_tp_mlp_params p = {.flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0,
                               .activation = gated ? DTL_TP_ACT_SILU_GATED : DTL_TP_ACT_GELU, .hidden = H, .ffn = F,
                               .gate_up = gu, .down = dn, .gate_up_bias = gub, .down_bias = dnb};
        dtl_tp_mlp *mh = NULL, *md = NULL;
        CHECK_OK(dtl_tp_mlp_create(E.ctx, &p, &mh));
        void *dx = up(x, (size_t)(T * H)), *dy = dev_alloc((size_t)(T * H));
        p.gate_up = up(gu, (size_t)(w * H)), p.down = up(dn, (size_t)(H * F));
        p.gate_up_bias = up(gub, (size_t)w), p.down_bias = up(dnb, (size_t)H);
        CHECK_OK(dtl_tp_mlp_create(D, &p, &md));
        dtl_layout *lh = NULL, *ld = NULL;
        CHECK_OK(dtl_tp_mlp_layouts(mh, T, &lh, NULL));
        CHECK_OK(dtl_tp_mlp_layouts(md, T, &ld, NULL));
        CHECK_OK(dtl_tp_mlp_forward(mh, lh, x, want));
        CHECK_OK(dtl_tp_mlp_forward(md, ld, dx, dy));
        down(dy, got, (size_t)(T * H));
        compare(want, got, (size_t)(T * H), "gated=%d sp=%d bias=%d", gated, sp, with_bias);
        dtl_layout_destroy(lh), dtl_layout_destroy(ld);
        dtl_tp_mlp_destroy(mh), dtl_tp_mlp_destroy(md);
        release(dx), release(dy), release((void *)p.gate_up), release((void *)p.down);
        if (with_bias) release((void *)p.gate_up_bias), release((void *)p.down_bias);
        free(x), free(gu), free(dn), free(gub), free(dnb), free(want), free(got);
      }
}

static void attention_block_on_the_device_matches_the_host_path(void) {
  /* q heads, kv heads, head_dim, tokens; the last has causal rows longer than a block's 128 threads. */
  const int64_t cfg[][4] = {{4, 4, 3, 5}, {8, 2, 2, 7}, {12, 1, 2, 5}, {6, 3, 4, 7}, {4, 2, 8, 200}};
  const int64_t H = 8;
  for (unsigned c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
    for (int sp = 0; sp < 2; sp++) {
      int64_t Hq = cfg[c][0], Hkv = cfg[c][1], Dh = cfg[c][2], T = cfg[c][3], W = (Hq + 2 * Hkv) * Dh;
      int with_bias = sp, explicit_scale = c == 1; /* biases with sequence parallelism, none without */
      float *x = reals(61, T * H, 1.0f), *wqkv = reals(62, W * H, 0.5f), *wo = reals(63, H * Hq * Dh, 0.5f);
      float *bqkv = with_bias ? reals(64, W, 0.5f) : NULL, *bo = with_bias ? reals(65, H, 0.5f) : NULL;
      float *want = malloc(sizeof(float) * (size_t)(T * H)), *got = malloc(sizeof(float) * (size_t)(T * H));
      dtl_tp_attention_params p = {.mask = explicit_scale ? DTL_TP_SCALE : 0,
                                   .flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0,
                                   .hidden = H, .q_heads = Hq, .kv_heads = Hkv, .head_dim = Dh, .qkv = wqkv,
                                   .out = wo, .qkv_bias = bqkv, .out_bias = bo, .scale = 2.5f};
      dtl_tp_attention *ah = NULL, *ad = NULL;
      CHECK_OK(dtl_tp_attention_create(E.ctx, &p, &ah));
      void *dx = up(x, (size_t)(T * H)), *dy = dev_alloc((size_t)(T * H));
      p.qkv = up(wqkv, (size_t)(W * H)), p.out = up(wo, (size_t)(H * Hq * Dh));
      p.qkv_bias = up(bqkv, (size_t)W), p.out_bias = up(bo, (size_t)H);
      CHECK_OK(dtl_tp_attention_create(D, &p, &ad));
      dtl_layout *lh = NULL, *ld = NULL;
      CHECK_OK(dtl_tp_attention_layouts(ah, T, &lh, NULL));
      CHECK_OK(dtl_tp_attention_layouts(ad, T, &ld, NULL));
      CHECK_OK(dtl_tp_attention_forward(ah, lh, x, want));
      CHECK_OK(dtl_tp_attention_forward(ad, ld, dx, dy));
      down(dy, got, (size_t)(T * H));
      compare(want, got, (size_t)(T * H), "config %d sp=%d T=%d", (int)c, sp, (int)T);
      dtl_layout_destroy(lh), dtl_layout_destroy(ld);
      dtl_tp_attention_destroy(ah), dtl_tp_attention_destroy(ad);
      release(dx), release(dy), release((void *)p.qkv), release((void *)p.out);
      if (with_bias) release((void *)p.qkv_bias), release((void *)p.out_bias);
      free(x), free(wqkv), free(wo), free(bqkv), free(bo), free(want), free(got);
    }
}

/* RoPE and the KV cache on the device: a prefill, decode steps and a 2-token step, each against the same
 * call on the host path; then an overflow that leaves the device output and the cache as they were. */
static void cached_attention_with_rope_on_the_device_matches_the_host_path(void) {
  const int64_t H = 8, Hq = 8, Hkv = 2, Dh = 4, N = 9, W = (Hq + 2 * Hkv) * Dh, sched[] = {5, 1, 2, 1};
  const size_t es = dtl_dtype_size(DT);
  for (int sp = 0; sp < 2; sp++) {
    float *x = reals(71, N * H, 1.0f), *wqkv = reals(72, W * H, 0.5f), *wo = reals(73, H * Hq * Dh, 0.5f);
    float want[5 * 8], got[5 * 8];
    dtl_tp_attention_params p = {.mask = DTL_TP_ROPE, .flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0, .hidden = H,
                                 .q_heads = Hq, .kv_heads = Hkv, .head_dim = Dh, .qkv = wqkv, .out = wo,
                                 .rope_theta = 10000.0f};
    dtl_tp_attention *ah = NULL, *ad = NULL;
    dtl_tp_kv_cache *ch = NULL, *cd = NULL;
    CHECK_OK(dtl_tp_attention_create(E.ctx, &p, &ah));
    p.qkv = up(wqkv, (size_t)(W * H)), p.out = up(wo, (size_t)(H * Hq * Dh));
    CHECK_OK(dtl_tp_attention_create(D, &p, &ad));
    CHECK_OK(dtl_tp_kv_cache_create(ah, N, &ch));
    CHECK_OK(dtl_tp_kv_cache_create(ad, N, &cd));
    char *dx = up(x, (size_t)(N * H));
    void *dy = dev_alloc(5 * 8);
    for (int64_t i = 0, s0 = 0; i < 4; s0 += sched[i], i++) {
      int64_t T = sched[i];
      dtl_layout *lh = NULL, *ld = NULL;
      CHECK_OK(dtl_tp_attention_layouts(ah, T, &lh, NULL));
      CHECK_OK(dtl_tp_attention_layouts(ad, T, &ld, NULL));
      CHECK_OK(dtl_tp_attention_forward_cached(ah, ch, lh, x + s0 * H, want));
      CHECK_OK(dtl_tp_attention_forward_cached(ad, cd, ld, dx + (size_t)(s0 * H) * es, dy));
      down(dy, got, (size_t)(T * H));
      compare(want, got, (size_t)(T * H), "cached sp=%d tokens %d..%d", sp, (int)s0, (int)(s0 + T - 1));
      dtl_layout_destroy(lh), dtl_layout_destroy(ld);
    }
    CHECK(dtl_tp_kv_cache_length(cd) == N, "device cache length %lld", (long long)dtl_tp_kv_cache_length(cd));
    float sentinel[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    void *ds = up(sentinel, 8);
    dtl_layout *one = NULL;
    CHECK_OK(dtl_tp_attention_layouts(ad, 1, &one, NULL));
    CHECK_ERROR(dtl_tp_attention_forward_cached(ad, cd, one, dx, ds), DTL_ERR_INVALID_ARGUMENT, "max_tokens=9");
    down(ds, got, 8);
    for (int i = 0; i < 8; i++) CHECK(got[i] == 7.0f, "y[%d]=%g written by an overflowing call", i, got[i]);
    dtl_layout_destroy(one);
    dtl_tp_kv_cache_destroy(ch), dtl_tp_kv_cache_destroy(cd);
    dtl_tp_attention_destroy(ah), dtl_tp_attention_destroy(ad);
    release(dx), release(dy), release(ds), release((void *)p.qkv), release((void *)p.out);
    free(x), free(wqkv), free(wo);
  }
}

/* ---------------------------------------------------------------------------------------------------- */
static void embedding_on_the_device_is_exact_and_names_ids_outside_the_vocabulary(void) {
  const int64_t V = 11, H = 6, T = 9, ids[9] = {0, 10, 5, 5, 3, 7, 1, 9, 2};
  float *table = ints(71, V * H, 100), got[9 * 6];
  void *dtable = up(table, (size_t)(V * H)), *dy = dev_alloc((size_t)(T * H));
  for (int sp = 0; sp < 2; sp++) {
    dtl_tp_embedding_params p = {.flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0, .vocab = V, .hidden = H, .table = dtable};
    dtl_tp_embedding *e = NULL;
    CHECK_OK(dtl_tp_embedding_create(D, &p, &e));
    CHECK_OK(dtl_tp_embedding_forward(e, T, ids, dy));
    down(dy, got, (size_t)(T * H));
    for (int64_t r = 0; r < T; r++)
      for (int64_t c = 0; c < H; c++)
        CHECK(got[r * H + c] == table[ids[r] * H + c], "sp=%d token %lld column %lld", sp, (long long)r, (long long)c);
    dtl_tp_embedding_destroy(e);
  }
  /* A bad id: the error names it and its position, and the device output keeps every byte. */
  dtl_tp_embedding_params p = {.vocab = V, .hidden = H, .table = dtable};
  dtl_tp_embedding *e = NULL;
  CHECK_OK(dtl_tp_embedding_create(D, &p, &e));
  size_t bytes = (size_t)(T * H) * dtl_dtype_size(DT);
  unsigned char *after = malloc(bytes);
  CUDA_CHECK(cudaMemsetAsync(dy, 0x7b, bytes, G.stream));
  int64_t bad[5] = {1, 2, 3, 11, 0};
  CHECK_ERROR(dtl_tp_embedding_forward(e, 5, bad, dy), DTL_ERR_INVALID_ARGUMENT, "ids[3]=11");
  CUDA_CHECK(cudaMemcpyAsync(after, dy, bytes, cudaMemcpyDeviceToHost, G.stream));
  CUDA_CHECK(cudaStreamSynchronize(G.stream));
  size_t changed = 0;
  for (size_t i = 0; i < bytes; i++) changed += after[i] != 0x7b;
  CHECK(changed == 0, "%zu bytes of y changed by a failed call", changed);
  dtl_tp_embedding_destroy(e);
  release(dtable), release(dy);
  free(table), free(after);
}

/* The same top-k entry: equal index, and equal value or both NaN. */
static int same_pick(float a, int64_t ia, float b, int64_t ib) {
  return ia == ib && (!memcmp(&a, &b, sizeof a) || (isnan(a) && isnan(b)));
}

static void topk_and_argmax_on_the_device_equal_the_host_path(void) {
  const int64_t T = 6, V = 13;
  float *lg = ints(81, T * V, 2); /* many ties */
  for (int64_t v = 0; v < V; v++) lg[0 * V + v] = 1.0f;
  lg[1 * V + 2] = lg[1 * V + 11] = 7.0f;
  lg[3 * V + 12] = NAN;
  lg[4 * V + 5] = -0.0f;
  void *dlg = up(lg, (size_t)(T * V));
  dtl_layout *lh = layout(E.ctx, T, V, dtl_shard(1)), *ld = layout(D, T, V, dtl_shard(1));
  const int ks[] = {1, 3, 5, 13};
  for (int ki = 0; ki < 4; ki++) {
    int k = ks[ki];
    float hv[6 * 13], dv[6 * 13];
    int64_t hi[6 * 13], di[6 * 13];
    CHECK_OK(dtl_tp_logits_topk(E.ctx, lh, lg, k, hv, hi));
    CHECK_OK(dtl_tp_logits_topk(D, ld, dlg, k, dv, di));
    for (int64_t i = 0; i < T * k; i++)
      CHECK(same_pick(dv[i], di[i], hv[i], hi[i]), "k=%d entry %lld: device (%g, %lld), host (%g, %lld)", k,
            (long long)i, dv[i], (long long)di[i], hv[i], (long long)hi[i]);
  }
  int64_t ha[6], da[6];
  CHECK_OK(dtl_tp_logits_argmax(E.ctx, lh, lg, ha));
  CHECK_OK(dtl_tp_logits_argmax(D, ld, dlg, da));
  CHECK(!memcmp(ha, da, sizeof ha), "argmax differs from the host path");
  /* A bad k writes nothing. */
  for (int i = 0; i < 6; i++) da[i] = -7;
  CHECK_ERROR(dtl_tp_logits_topk(D, ld, dlg, (int)V + 1, NULL, da), DTL_ERR_INVALID_ARGUMENT, "k=14");
  for (int i = 0; i < 6; i++) CHECK(da[i] == -7, "indices[%d] written by a failed call", i);
  dtl_layout_destroy(lh), dtl_layout_destroy(ld);
  release(dlg);
  free(lg);
}

static void lm_head_then_argmax_on_the_device_equals_the_host_path(void) {
  const int64_t T = 4, H = 6, V = 23;
  float *w = ints(91, V * H, 2), *x = ints(92, T * H, 2);
  dtl_tp_linear_params p = {.kind = DTL_TP_COLUMN, .in_features = H, .out_features = V, .weight = w};
  dtl_tp_linear *hh = NULL, *hd = NULL;
  CHECK_OK(dtl_tp_linear_create(E.ctx, &p, &hh));
  void *dw = up(w, (size_t)(V * H)), *dx = up(x, (size_t)(T * H)), *dlogits = dev_alloc((size_t)(T * V));
  p.weight = dw;
  CHECK_OK(dtl_tp_linear_create(D, &p, &hd));
  dtl_layout *lih = NULL, *loh = NULL, *lid = NULL, *lod = NULL;
  CHECK_OK(dtl_tp_linear_layouts(hh, T, &lih, &loh));
  CHECK_OK(dtl_tp_linear_layouts(hd, T, &lid, &lod));
  float logits[4 * 23];
  int64_t ha[4], da[4];
  CHECK_OK(dtl_tp_linear_forward(hh, lih, x, logits));
  CHECK_OK(dtl_tp_logits_argmax(E.ctx, loh, logits, ha));
  CHECK_OK(dtl_tp_linear_forward(hd, lid, dx, dlogits));
  CHECK_OK(dtl_tp_logits_argmax(D, lod, dlogits, da));
  for (int64_t t = 0; t < T; t++) CHECK(da[t] == ha[t], "token %lld argmax %lld, host %lld", (long long)t, (long long)da[t], (long long)ha[t]);
  dtl_layout_destroy(lih), dtl_layout_destroy(loh), dtl_layout_destroy(lid), dtl_layout_destroy(lod);
  dtl_tp_linear_destroy(hh), dtl_tp_linear_destroy(hd);
  release(dw), release(dx), release(dlogits);
  free(w), free(x);
}

int main(int argc, char **argv) {
  t_setup(&argc, &argv, &E);
  if (E.tp != 1 || dtl_cuda_device_count() == 0) {
    t_teardown(&E);
    return dt_skip(E.tp != 1 ? "runs at one rank (one GPU holds one NCCL rank)"
                             : "no CUDA device (the TP layers on NCCL were not run)");
  }
  dt_nccl_setup(&G);
  const dtl_dtype types[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};
#define DEVICE_CASE(fn) {fn, #fn}
  static const struct {
    void (*fn)(void);
    const char *name;
  } cases[] = {DEVICE_CASE(linear_layers_and_the_row_reduction_equal_the_host_exactly),
               DEVICE_CASE(mlp_block_on_the_device_matches_the_host_path),
               DEVICE_CASE(attention_block_on_the_device_matches_the_host_path),
               DEVICE_CASE(cached_attention_with_rope_on_the_device_matches_the_host_path),
               DEVICE_CASE(embedding_on_the_device_is_exact_and_names_ids_outside_the_vocabulary),
               DEVICE_CASE(topk_and_argmax_on_the_device_equal_the_host_path),
               DEVICE_CASE(lm_head_then_argmax_on_the_device_equals_the_host_path)};
  for (int ti = 0; ti < 3; ti++) {
    DT = types[ti];
    dtl_tp_options o = {.mask = DTL_TP_OPT_DTYPE, .dtype = DT};
    REQUIRE_OK(dtl_tp_context_create(G.mesh, 0, &o, &D));
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
      char name[128];
      snprintf(name, sizeof name, "%s (%s)", cases[c].name, dtl_dtype_name(DT));
      RUN_NAMED(name, cases[c].fn());
    }
    dtl_tp_context_destroy(D);
    D = NULL;
  }
  dt_nccl_teardown(&G);
  t_teardown(&E);
  return dt_finish();
}

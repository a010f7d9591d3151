/* SPDX-License-Identifier: Apache-2.0 */
/* The TP device kernels' code, run on the host by their *_emulate twins (in the .cu files of src/tp: each
 * launch block by block and thread by thread, with the kernel's block size and reduction tree), against
 * the host path's stages (stages.h), in f32, f16 and bf16. Shapes reach every index path: head dims longer
 * than a block's threads, vocab shards shorter than k, ties, NaN, infinities and signed zeros. Half types:
 * both sides see the same rounded inputs, the host in f32, so they differ by the kernel's one rounding on
 * store. Then the f16/bf16 block pipelines (the attention core's emulation included, tested on its own in
 * tests/attn) are rounded as a device rounds them, to check the tolerance that test_tp_cuda.c uses on a GPU
 * (tp_half.h). Needs no GPU: what it cannot reach is the launch itself (grid shapes, shared memory,
 * barriers), which test_tp_cuda.c runs on a device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "attn/attn.h"
#include "attn/rope.h"
#include "tp/stages.h"
#include "tp/tp_math.h"
#include "tp_half.h"

static const dtl_dtype kTypes[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};


/* |got - ref| <= unit(t) |ref| + noise (1 + max |ref|) for every element; returns the largest error. */
static double check_close(const float *ref, const void *got, size_t n, dtl_dtype t, double noise, const char *what) {
  double mx = 0, worst = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
  for (size_t i = 0; i < n; i++) {
    double g = t_load(got, i, t), e = fabs(g - ref[i]);
    double tol = t_half_unit(t) * fabs(ref[i]) + noise * (1.0 + mx);
    if (!(e <= tol)) fail_msg("%s %s: element %zu is %.9g, host path %.9g (tolerance %.3g)", what, dtl_dtype_name(t), i, g, ref[i], tol);
    worst = fmax(worst, e);
  }
  return worst;
}

/* ---------------------------------------------------------------------------------------------------- */
static void activation_kernel_equals_the_host_activation_and_leaves_other_columns_alone(void **state) {
  (void)state;
  const int64_t T = 7, f = 5;
  for (int gated = 0; gated < 2; gated++)
    for (int ti = 0; ti < 3; ti++) {
      dtl_dtype t = kTypes[ti];
      dtl_tp_activation act = gated ? DTL_TP_ACT_SILU_GATED : DTL_TP_ACT_GELU;
      int64_t width = gated ? 2 * f + 3 : f + 2; /* columns past the activated ones must not change */
      size_t n = (size_t)(T * width);
      float *host = t_rand_reals(n, 4.0f, t);
      void *dev = t_pack(host, n, t), *orig = t_pack(host, n, t);
      dtl__tp_activate_host(act, host, T, f, width);
      assert_int_equal(dtl__tp_activate_emulate(act, dev, T, f, width, t), DTL_OK);
      for (int64_t r = 0; r < T; r++) {
        check_close(host + r * width, (char *)dev + (size_t)(r * width) * dtl_dtype_size(t), (size_t)f, t, 1e-6, "activation");
        size_t es = dtl_dtype_size(t), skip = (size_t)(r * width + f) * es;
        assert_memory_equal((char *)dev + skip, (char *)orig + skip, (size_t)(width - f) * es);
      }
      free(host), free(dev), free(orig);
    }
  float x = 0;
  assert_int_equal(dtl__tp_activate_emulate(DTL_TP_ACT_GELU, &x, 1, 1, 1, DTL_INT32), DTL_ERR_UNSUPPORTED);
}

/* ---------------------------------------------------------------------------------------------------- */
/* Logits rows with ties everywhere (-2..2), plus: all equal, two NaNs, infinities, signed zeros, the max
 * in the last column. Every value is exact in f16 and bf16. */
static float *topk_logits(int64_t T, int64_t n) {
  float *p = malloc((size_t)(T * n) * sizeof(float) + 4);
  for (int64_t i = 0; i < T * n; i++) p[i] = (float)((int64_t)(t_rand() % 5) - 2);
  for (int64_t j = 0; j < n; j++) p[0 * n + j] = 1.0f;
  if (T > 1) p[1 * n + n / 2] = p[1 * n + n - 1] = NAN;
  if (T > 2) p[2 * n + 0] = INFINITY, p[2 * n + n - 1] = -INFINITY;
  for (int64_t j = 0; T > 3 && j < n; j++) p[3 * n + j] = j % 2 ? 0.0f : -0.0f;
  if (T > 4) p[4 * n + n - 1] = 9.0f;
  return p;
}

/* The same candidate: equal index, and equal value bits or both NaN (a half NaN widens to an f32 NaN whose
 * payload depends on the conversion). */
static bool same_candidate(const int64_t *a, const int64_t *b) {
  float va = dtl__tp_cand_value(a), vb = dtl__tp_cand_value(b);
  return a[1] == b[1] && (a[0] == b[0] || (isnan(va) && isnan(vb)));
}

static void topk_kernel_picks_the_host_candidates_in_the_same_order(void **state) {
  (void)state;
  const int64_t T = 6, off = 1000, ns[] = {3, 13, 300};
  const int ks[] = {1, 4, 5, 20};
  for (int ni = 0; ni < 3; ni++)
    for (int ki = 0; ki < 4; ki++)
      for (int ti = 0; ti < 3; ti++) {
        int64_t n = ns[ni];
        int k = ks[ki];
        dtl_dtype t = kTypes[ti];
        float *lg = topk_logits(T, n);
        void *in = t_pack(lg, (size_t)(T * n), t);
        t_round(lg, (size_t)(T * n), t);
        size_t nc = (size_t)(T * k * 2);
        int64_t *want = malloc(nc * sizeof(int64_t)), *got = malloc(nc * sizeof(int64_t));
        memset(got, 0x5a, nc * sizeof(int64_t));
        dtl__tp_topk_local_host(lg, T, n, off, k, want);
        assert_int_equal(dtl__tp_topk_local_emulate(in, T, n, off, k, got, t), DTL_OK);
        for (size_t i = 0; i < nc; i += 2)
          if (!same_candidate(want + i, got + i))
            fail_msg("n=%lld k=%d %s: token %zu pick %zu is (%g, %lld), host (%g, %lld)", (long long)n, k,
                     dtl_dtype_name(t), i / (2 * (size_t)k), i / 2 % (size_t)k, dtl__tp_cand_value(got + i),
                     (long long)got[i + 1], dtl__tp_cand_value(want + i), (long long)want[i + 1]);
        free(lg), free(in), free(want), free(got);
      }
}

/* ---------------------------------------------------------------------------------------------------- */
static void embedding_kernel_copies_owned_rows_and_zeros_the_rest(void **state) {
  (void)state;
  const int64_t off = 4, count = 5, T = 9, ids[9] = {0, 4, 8, 9, 3, 5, 13, 4, 6}, hs[] = {7, 130};
  for (int hi = 0; hi < 2; hi++)
    for (int ti = 0; ti < 3; ti++) {
      int64_t H = hs[hi];
      dtl_dtype t = kTypes[ti];
      size_t es = dtl_dtype_size(t), out_bytes = (size_t)(T * H) * es;
      float *tab = t_rand_reals((size_t)(count * H), 10.0f, t);
      void *table = t_pack(tab, (size_t)(count * H), t);
      unsigned char *want = malloc(out_bytes), *got = malloc(out_bytes);
      memset(want, 0x77, out_bytes);
      memset(got, 0x77, out_bytes);
      dtl__tp_embed_host(ids, T, table, off, count, H, es, want);
      assert_int_equal(dtl__tp_embed_emulate(ids, T, table, off, count, H, t, got), DTL_OK);
      assert_memory_equal(got, want, out_bytes);
      /* And the rows are right, independently: ids 4..8 are rows 0..4 of the shard, others zero. */
      for (int64_t r = 0; r < T; r++)
        for (int64_t c = 0; c < H; c++) {
          float v = t_load(got, (size_t)(r * H + c), t);
          float e = ids[r] >= off && ids[r] < off + count ? tab[(ids[r] - off) * H + c] : 0.0f;
          assert_true(v == e);
        }
      free(tab), free(table), free(want), free(got);
    }
}

/* ---------------------------------------------------------------------------------------------------- */
/* The f16/bf16 blocks rounded as a device rounds them (every stored intermediate in t, the kernels by
 * their emulations), against the f32 host path on the same inputs, for the shapes and data ranges of
 * test_tp_cuda.c: within the tolerance that test uses. Returns the share of the tolerance used. */
static void gemm_rounded(int64_t m, int64_t n, int64_t k, const float *a, const float *b, const float *bias, float *c,
                         dtl_dtype t) {
  dtl__gemm_engine g = dtl__gemm_engine_host();
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) c[i * n + j] = bias ? bias[j] : 0.0f; /* the seeded bias, already in t */
  assert_int_equal(dtl__gemm(&g, DTL_FLOAT32, m, n, k, 1.0f, a, k, b, k, bias ? 1.0f : 0.0f, c, n), DTL_OK);
  t_round(c, (size_t)(m * n), t);
}

/* y += bias, then y rounded to t: the bias epilogue after the reduction. */
static void add_bias_rounded(float *y, int64_t rows, int64_t cols, const float *bias, dtl_dtype t) {
  for (int64_t i = 0; bias && i < rows * cols; i++) y[i] += bias[i % cols];
  t_round(y, (size_t)(rows * cols), t);
}

static double share_of_tolerance(const float *ref, const float *got, size_t n, dtl_dtype t) {
  double mx = 0, e = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
  for (size_t i = 0; i < n; i++) e = fmax(e, fabs((double)got[i] - ref[i]));
  return e / t_block_tol(t, mx);
}

/* The MLP block with t storage (t = f32 gives the host path). */
static void mlp_in(dtl_dtype t, int gated, int64_t T, int64_t H, int64_t F, const float *x, const float *gu,
                   const float *gub, const float *dn, const float *dnb, float *y) {
  int64_t w = gated ? 2 * F : F;
  float *h = malloc(sizeof(float) * (size_t)(T * w)), *a = malloc(sizeof(float) * (size_t)(T * F));
  gemm_rounded(T, w, H, x, gu, gub, h, t);
  void *hp = t_pack(h, (size_t)(T * w), t);
  assert_int_equal(dtl__tp_activate_emulate(gated ? DTL_TP_ACT_SILU_GATED : DTL_TP_ACT_GELU, hp, T, F, w, t), DTL_OK);
  for (int64_t r = 0; r < T; r++)
    for (int64_t j = 0; j < F; j++) a[r * F + j] = t_load(hp, (size_t)(r * w + j), t);
  gemm_rounded(T, H, F, a, dn, NULL, y, t);
  add_bias_rounded(y, T, H, dnb, t);
  free(h), free(a), free(hp);
}

/* The attention block with t storage (t = f32 gives the host path up to summation order), with RoPE on q and
 * k when theta > 0. */
static void attention_in(dtl_dtype t, int64_t T, int64_t H, int64_t Hq, int64_t Hkv, int64_t Dh, float scale,
                         float theta, const float *x, const float *wqkv, const float *bqkv, const float *wo,
                         const float *bo, float *y) {
  int64_t W = (Hq + 2 * Hkv) * Dh, A = Hq * Dh;
  dtl__attn_shape s = {.tq = T, .tk = T, .qn = Hq, .kn = Hkv, .head_dim = Dh, .group = Hq / Hkv, .ldq = W, .ldk = W,
                       .ldv = W, .ldo = A, .causal = true, .scale = scale};
  float *qkv = malloc(sizeof(float) * (size_t)(T * W)), *o = malloc(sizeof(float) * (size_t)(T * A));
  size_t sb = dtl__attn_scratch_bytes(&s, DTL_MEMORY_DEVICE);
  void *scores = malloc(sb + 4);
  gemm_rounded(T, W, H, x, wqkv, bqkv, qkv, t);
  void *qp = t_pack(qkv, (size_t)(T * W), t), *op = malloc((size_t)(T * A) * dtl_dtype_size(t));
  size_t es = dtl_dtype_size(t);
  dtl__rope_shape rs = {.rows = T, .heads = Hq + Hkv, .head_dim = Dh, .ld = W, .theta = theta};
  if (theta > 0) assert_int_equal(dtl__rope_emulate(&rs, qp, t), DTL_OK);
  const char *kp = (const char *)qp + (size_t)(Hq * Dh) * es, *vp = kp + (size_t)(Hkv * Dh) * es;
  assert_int_equal(dtl__attn_emulate(&s, qp, kp, vp, op, NULL, scores, sb, t), DTL_OK);
  for (int64_t i = 0; i < T * A; i++) o[i] = t_load(op, (size_t)i, t);
  gemm_rounded(T, H, A, o, wo, NULL, y, t);
  add_bias_rounded(y, T, H, bo, t);
  free(qkv), free(o), free(scores), free(qp), free(op);
}

static void rounded_half_blocks_stay_within_the_device_test_tolerance(void **state) {
  (void)state;
  for (int ti = 1; ti < 3; ti++) {
    dtl_dtype t = kTypes[ti];
    double used = 0;
    /* test_tp_cuda.c's MLP: hidden 12, ffn 10, 4 or 7 tokens, x in [-1, 1), weights and biases in [-0.5, 0.5). */
    const int64_t H = 12, F = 10;
    for (int gated = 0; gated < 2; gated++)
      for (int64_t T = 4; T <= 7; T += 3) {
        int64_t w = gated ? 2 * F : F;
        float *x = t_rand_reals((size_t)(T * H), 1.0f, t), *gu = t_rand_reals((size_t)(w * H), 0.5f, t);
        float *gub = t_rand_reals((size_t)w, 0.5f, t), *dn = t_rand_reals((size_t)(H * F), 0.5f, t);
        float *dnb = t_rand_reals((size_t)H, 0.5f, t);
        float *y32 = malloc(sizeof(float) * (size_t)(T * H)), *yt = malloc(sizeof(float) * (size_t)(T * H));
        mlp_in(DTL_FLOAT32, gated, T, H, F, x, gu, gub, dn, dnb, y32);
        mlp_in(t, gated, T, H, F, x, gu, gub, dn, dnb, yt);
        used = fmax(used, share_of_tolerance(y32, yt, (size_t)(T * H), t));
        free(x), free(gu), free(gub), free(dn), free(dnb), free(y32), free(yt);
      }
    /* test_tp_cuda.c's attention: hidden 8, its (q heads, kv heads, head_dim, tokens), with biases; the last
     * is its cached block with RoPE (the cache holds keys and values in t, as the uncached block's QKV). */
    const int64_t cfg[][4] = {{4, 4, 3, 5}, {8, 2, 2, 7}, {12, 1, 2, 5}, {6, 3, 4, 7}, {4, 2, 8, 200}, {8, 2, 4, 9}};
    const int64_t HA = 8;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
      int64_t Hq = cfg[c][0], Hkv = cfg[c][1], Dh = cfg[c][2], T = cfg[c][3], W = (Hq + 2 * Hkv) * Dh;
      float scale = c == 1 ? 2.5f : 1.0f / sqrtf((float)Dh);
      float *x = t_rand_reals((size_t)(T * HA), 1.0f, t), *wq = t_rand_reals((size_t)(W * HA), 0.5f, t);
      float *bq = t_rand_reals((size_t)W, 0.5f, t);
      float *wo = t_rand_reals((size_t)(HA * Hq * Dh), 0.5f, t), *bo = t_rand_reals((size_t)HA, 0.5f, t);
      float *y32 = malloc(sizeof(float) * (size_t)(T * HA)), *yt = malloc(sizeof(float) * (size_t)(T * HA));
      float theta = c == 5 ? 10000.0f : 0.0f;
      attention_in(DTL_FLOAT32, T, HA, Hq, Hkv, Dh, scale, theta, x, wq, bq, wo, bo, y32);
      attention_in(t, T, HA, Hq, Hkv, Dh, scale, theta, x, wq, bq, wo, bo, yt);
      used = fmax(used, share_of_tolerance(y32, yt, (size_t)(T * HA), t));
      free(x), free(wq), free(bq), free(wo), free(bo), free(y32), free(yt);
    }
    printf("%s blocks use up to %.0f%% of the device test's tolerance\n", dtl_dtype_name(t), 100 * used);
    assert_true(used <= 1.0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(activation_kernel_equals_the_host_activation_and_leaves_other_columns_alone),
      cmocka_unit_test(topk_kernel_picks_the_host_candidates_in_the_same_order),
      cmocka_unit_test(embedding_kernel_copies_owned_rows_and_zeros_the_rest),
      cmocka_unit_test(rounded_half_blocks_stay_within_the_device_test_tolerance),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

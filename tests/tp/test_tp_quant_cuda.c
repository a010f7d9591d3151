/* SPDX-License-Identifier: Apache-2.0 */
/* The layers on quantized weights on a device context (NCCL at world size 1) against the dense host path on an MPI
 * context in the same process, in f32, f16 and bf16: the host layers run on the dequantized weights rounded to the
 * device's dtype (what the device's tiles hold), the device layers on the quantized weights (tests/common/
 * dt_qweights.h, uploaded), so that only the device's own roundings and summation order differ:
 * - linear (column, row, with bias; FP8 block, GPTQ, Q8_0, and a weight of several 4 Mi-element device tiles),
 *   MLP and attention blocks: the device dequantizes tiles with the CUDA tile kernel (bit for bit the host's, then
 *   rounded once to a half dtype) and multiplies on cuBLAS, so only the rounding of the half types and the
 *   summation order differ: within tp_half.h's tolerance;
 * - DTL_TP_FP8_GEMM on FP8_TENSOR e4m3 weights: on a device of compute capability 8.9+ the activations are quantized
 *   to e4m3 and cuBLASLt multiplies in FP8, within sum_j |w_j| (2^-4 |x_j| + s_x 2^-10) of the dense product (plus
 *   the tolerance above); elsewhere, and for a shape the FP8 kernels do not take (in = 50), the tiled path's result;
 * - a NaN scale in device memory is found at creation (through a host copy), nothing created.
 * Runs under mpirun with one rank; exits 77 (skipped) without a CUDA device. */
#include "tp_half.h"
#include "tp_env.h"
#include "dt_nccl.h"
#include "dt_qweights.h"

static t_env E; /* the host path: an MPI context, one rank */
static dt_nccl G;
static dtl_tp_context *D;
static dtl_dtype DT;

#define CUDA_CHECK(call) CHECK((call) == cudaSuccess, "%s", #call)

static void *up(const void *h, size_t bytes) {
  void *d = NULL;
  CUDA_CHECK(cudaMalloc(&d, bytes + 16));
  if (bytes) CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}
static void *up_dt(const float *h, size_t n) { /* rounded to DT */
  if (!h) return NULL;
  void *tmp = t_pack(h, n, DT), *d = up(tmp, n * dtl_dtype_size(DT));
  free(tmp);
  return d;
}
static void down(const void *d, float *h, size_t n) {
  void *tmp = malloc(n * dtl_dtype_size(DT) + 4);
  CUDA_CHECK(cudaStreamSynchronize(G.stream));
  CUDA_CHECK(cudaMemcpy(tmp, d, n * dtl_dtype_size(DT), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) h[i] = t_load(tmp, i, DT);
  free(tmp);
}
static float *rounded(float *p, size_t n) {
  t_round(p, n, DT);
  return p;
}
static float *rounded_copy(const float *p, size_t n) {
  float *c = malloc(n * sizeof(float) + 4);
  memcpy(c, p, n * sizeof(float));
  return rounded(c, n);
}

/* A quantized weight on both contexts: the host one (dt_qweight on E's mesh) and its parts uploaded under a layout of
 * the same format, shape and cut on the device mesh. */
typedef struct {
  dt_qweight h;
  dtl_qlayout *dl;
  dtl_tp_qweight d;
} qpair;

static int qpair_make(qpair *q, const dtl_quant_format *f, int64_t R, int64_t C, dtl_placement cut, unsigned seed) {
  memset(q, 0, sizeof *q);
  int64_t shape[2] = {R, C};
  dtl_status st = dt_qweight_make(&q->h, E.mesh, f, 2, shape, &cut, seed);
  if (st == DTL_OK) st = dtl_qlayout_create(G.mesh, f, 2, shape, &cut, &q->dl);
  CHECK(st == DTL_OK, "quantized [%lld, %lld]: %s", (long long)R, (long long)C, dtl_last_error());
  if (st != DTL_OK) return 0;
  dtl_qbox b;
  dtl_qlayout_local_boxes(q->dl, NULL, &b);
  q->d.layout = q->dl;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    if (b.part[p].ndim >= 0) q->d.local.part[p] = up(q->h.local.part[p], b.part[p].bytes);
  return 1;
}
static void qpair_free(qpair *q) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) cudaFree(q->d.local.part[p]);
  dtl_qlayout_destroy(q->dl);
  dt_qweight_free(&q->h);
}

static void compare(const float *host, const float *dev, size_t n, double extra, const char *what) {
  double mx = 0, err = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(host[i]));
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)dev[i] - host[i]);
    if (!(e <= err)) err = e;
  }
  double tol = t_block_tol(DT, mx) + extra;
  CHECK(err <= tol, "%s %s: max error %g against the host path (max |y| %g, tolerance %g)", dtl_dtype_name(DT), what,
        err, mx, tol);
}

/* One linear layer of weight q on both contexts; extra: an added tolerance (the FP8 GEMM's). */
static void linear_case(const qpair *q, dtl_tp_linear_kind kind, int64_t out, int64_t in, int64_t T, uint64_t flags,
                        const char *what, int fp8_bound) {
  float *x = rounded(t_reals(71, T * in, 1.0f), (size_t)(T * in)), *b = rounded(t_reals(72, out, 0.5f), (size_t)out);
  float *w = rounded_copy(q->h.w, (size_t)(out * in));
  dtl_tp_linear_params hp = {.kind = kind, .in_features = in, .out_features = out, .weight = w, .bias = b};
  void *db = up_dt(b, (size_t)out), *dx = up_dt(x, (size_t)(T * in)), *dy = NULL;
  dtl_tp_linear_params dp = {.mask = DTL_TP_QUANT_WEIGHTS, .flags = flags, .kind = kind, .in_features = in,
                             .out_features = out, .bias = db, .qweight = &q->d};
  dtl_tp_linear *lh = NULL, *ld = NULL;
  CHECK_OK(dtl_tp_linear_create(E.ctx, &hp, &lh));
  CHECK_OK(dtl_tp_linear_create(D, &dp, &ld));
  dtl_layout *li = NULL, *lj = NULL;
  dtl_placement pin = kind == DTL_TP_COLUMN ? dtl_replicate() : dtl_shard(1);
  CHECK_OK(dtl_tp_activation_layout(E.ctx, T, in, pin, &li));
  CHECK_OK(dtl_tp_activation_layout(D, T, in, pin, &lj));
  float *yh = calloc((size_t)(T * out), sizeof(float)), *yd = calloc((size_t)(T * out), sizeof(float));
  CUDA_CHECK(cudaMalloc(&dy, (size_t)(T * out) * dtl_dtype_size(DT) + 4));
  if (lh && ld) {
    CHECK_OK(dtl_tp_linear_forward(lh, li, x, yh));
    CHECK_OK(dtl_tp_linear_forward(ld, lj, dx, dy));
    down(dy, yd, (size_t)(T * out));
  }
  double extra = 0;
  /* The FP8 GEMM reads the weight's codes, not their rounding to a half dtype that the host's dense weight holds:
   * its bound is the activations' e4m3 rounding, sum_j |w_j| (2^-4 |x_j| + s_x 2^-10), plus that rounding,
   * u sum_j |w_j x_j|, on the worst output. */
  if (fp8_bound) {
    double amax = 0;
    for (int64_t i = 0; i < T * in; i++) amax = fmax(amax, fabs(x[i]));
    for (int64_t t = 0; t < T; t++)
      for (int64_t o = 0; o < out; o++) {
        double s = 0;
        for (int64_t j = 0; j < in; j++)
          s += fabs(q->h.w[o * in + j]) * ((ldexp(1.0, -4) + t_half_unit(DT)) * fabs(x[t * in + j]) +
                                           amax / 448 * ldexp(1.0, -10));
        extra = fmax(extra, s);
      }
  }
  compare(yh, yd, (size_t)(T * out), extra, what);
  dtl_layout_destroy(li), dtl_layout_destroy(lj);
  dtl_tp_linear_destroy(lh), dtl_tp_linear_destroy(ld);
  CUDA_CHECK(cudaStreamSynchronize(G.stream));
  cudaFree(db), cudaFree(dx), cudaFree(dy);
  free(x), free(b), free(w), free(yh), free(yd);
}

static void linear_layers_on_quantized_weights_match_the_host_path(void) {
  struct {
    dtl_quant_format f;
    int64_t out, in;
    const char *name;
  } cs[] = {
      {{.kind = DTL_QUANT_FP8_BLOCK}, 96, 200, "fp8-block"},
      {{.mask = DTL_QFMT_GROUP, .kind = DTL_QUANT_GPTQ, .group = 64}, 64, 128, "gptq"},
      {{.kind = DTL_QUANT_GGUF_Q8_0}, 40, 96, "q8_0"},
      {{.kind = DTL_QUANT_FP8_CHANNEL}, 1100, 4096, "fp8-channel over two device tiles"},
  };
  for (unsigned c = 0; c < sizeof cs / sizeof *cs; c++)
    for (int row = 0; row < 2; row++) {
      qpair q;
      if (!qpair_make(&q, &cs[c].f, cs[c].out, cs[c].in, row ? dtl_shard(1) : dtl_shard(0), 10 + c)) continue;
      char what[96];
      snprintf(what, sizeof what, "%s %s", cs[c].name, row ? "row" : "column");
      linear_case(&q, row ? DTL_TP_ROW : DTL_TP_COLUMN, cs[c].out, cs[c].in, c == 3 ? 3 : 5, 0, what, 0);
      qpair_free(&q);
    }
}

static void fp8_gemm_on_fp8_tensor_weights_is_within_the_activation_rounding(void) {
  dtl_quant_format f = {.kind = DTL_QUANT_FP8_TENSOR};
  int64_t shapes[2][2] = {{64, 96}, {48, 50}}; /* in = 50: not a multiple of 16, the tiled path */
  for (int i = 0; i < 2; i++) {
    qpair q;
    if (!qpair_make(&q, &f, shapes[i][0], shapes[i][1], dtl_shard(0), 30 + (unsigned)i)) continue;
    linear_case(&q, DTL_TP_COLUMN, shapes[i][0], shapes[i][1], 7, DTL_TP_FP8_GEMM,
                i == 0 ? "fp8-tensor, FP8 GEMM" : "fp8-tensor, FP8 GEMM asked, tiled", i == 0);
    linear_case(&q, DTL_TP_ROW, shapes[i][0], shapes[i][1], 7, DTL_TP_FP8_GEMM, "fp8-tensor row, FP8 GEMM", i == 0);
    qpair_free(&q);
  }
}

static void mlp_and_attention_on_quantized_weights_match_the_host_path(void) {
  dtl_quant_format f = {.mask = DTL_QFMT_BLOCK, .kind = DTL_QUANT_FP8_BLOCK, .block_rows = 32, .block_cols = 64};
  int64_t H = 64, F = 96, T = 6, Hq = 4, Hkv = 2, Dh = 16;
  qpair g, u, dn, wq, wk, wv, wo;
  if (!qpair_make(&g, &f, F, H, dtl_shard(0), 40) || !qpair_make(&u, &f, F, H, dtl_shard(0), 41) ||
      !qpair_make(&dn, &f, H, F, dtl_shard(1), 42) || !qpair_make(&wq, &f, Hq * Dh, H, dtl_shard(0), 43) ||
      !qpair_make(&wk, &f, Hkv * Dh, H, dtl_shard(0), 44) || !qpair_make(&wv, &f, Hkv * Dh, H, dtl_shard(0), 45) ||
      !qpair_make(&wo, &f, H, Hq * Dh, dtl_shard(1), 46))
    return;
  float *x = rounded(t_reals(81, T * H, 1.0f), (size_t)(T * H));
  void *dx = up_dt(x, (size_t)(T * H)), *dy = NULL;
  CUDA_CHECK(cudaMalloc(&dy, (size_t)(T * H) * dtl_dtype_size(DT) + 4));
  float *yh = calloc((size_t)(T * H), sizeof(float)), *yd = calloc((size_t)(T * H), sizeof(float));
  dtl_layout *li = NULL, *lj = NULL;
  CHECK_OK(dtl_tp_activation_layout(E.ctx, T, H, dtl_replicate(), &li));
  CHECK_OK(dtl_tp_activation_layout(D, T, H, dtl_replicate(), &lj));
  float *gu = malloc(sizeof(float) * (size_t)(2 * F * H)), *wd = rounded_copy(dn.h.w, (size_t)(H * F));
  memcpy(gu, g.h.w, sizeof(float) * (size_t)(F * H));
  memcpy(gu + F * H, u.h.w, sizeof(float) * (size_t)(F * H));
  rounded(gu, (size_t)(2 * F * H));
  dtl_tp_mlp_params hm = {.activation = DTL_TP_ACT_SILU_GATED, .hidden = H, .ffn = F, .gate_up = gu, .down = wd};
  dtl_tp_mlp_params dm = {.mask = DTL_TP_QUANT_WEIGHTS, .activation = DTL_TP_ACT_SILU_GATED, .hidden = H, .ffn = F,
                          .qgate = &g.d, .qup = &u.d, .qdown = &dn.d};
  dtl_tp_mlp *mh = NULL, *md = NULL;
  CHECK_OK(dtl_tp_mlp_create(E.ctx, &hm, &mh));
  CHECK_OK(dtl_tp_mlp_create(D, &dm, &md));
  if (mh && md) {
    CHECK_OK(dtl_tp_mlp_forward(mh, li, x, yh));
    CHECK_OK(dtl_tp_mlp_forward(md, lj, dx, dy));
    down(dy, yd, (size_t)(T * H));
    compare(yh, yd, (size_t)(T * H), 0, "MLP");
  }
  int64_t W = (Hq + 2 * Hkv) * Dh;
  float *wqkv = malloc(sizeof(float) * (size_t)(W * H)), *wout = rounded_copy(wo.h.w, (size_t)(H * Hq * Dh));
  memcpy(wqkv, wq.h.w, sizeof(float) * (size_t)(Hq * Dh * H));
  memcpy(wqkv + Hq * Dh * H, wk.h.w, sizeof(float) * (size_t)(Hkv * Dh * H));
  memcpy(wqkv + (Hq + Hkv) * Dh * H, wv.h.w, sizeof(float) * (size_t)(Hkv * Dh * H));
  rounded(wqkv, (size_t)(W * H));
  dtl_tp_attention_params ha = {.hidden = H, .q_heads = Hq, .kv_heads = Hkv, .head_dim = Dh, .qkv = wqkv, .out = wout};
  dtl_tp_attention_params da = {.mask = DTL_TP_QUANT_WEIGHTS, .hidden = H, .q_heads = Hq, .kv_heads = Hkv,
                                .head_dim = Dh, .qq = &wq.d, .qk = &wk.d, .qv = &wv.d, .qout = &wo.d};
  dtl_tp_attention *ah = NULL, *ad = NULL;
  CHECK_OK(dtl_tp_attention_create(E.ctx, &ha, &ah));
  CHECK_OK(dtl_tp_attention_create(D, &da, &ad));
  if (ah && ad) {
    CHECK_OK(dtl_tp_attention_forward(ah, li, x, yh));
    CHECK_OK(dtl_tp_attention_forward(ad, lj, dx, dy));
    down(dy, yd, (size_t)(T * H));
    compare(yh, yd, (size_t)(T * H), 0, "attention");
  }
  dtl_tp_mlp_destroy(mh), dtl_tp_mlp_destroy(md);
  dtl_tp_attention_destroy(ah), dtl_tp_attention_destroy(ad);
  dtl_layout_destroy(li), dtl_layout_destroy(lj);
  CUDA_CHECK(cudaStreamSynchronize(G.stream));
  cudaFree(dx), cudaFree(dy);
  free(x), free(yh), free(yd), free(gu), free(wd), free(wqkv), free(wout);
  qpair_free(&g), qpair_free(&u), qpair_free(&dn), qpair_free(&wq), qpair_free(&wk), qpair_free(&wv), qpair_free(&wo);
}

static void a_nan_scale_in_device_memory_is_found_at_creation(void) {
  dtl_quant_format f = {.kind = DTL_QUANT_FP8_BLOCK};
  qpair q;
  if (!qpair_make(&q, &f, 40, 64, dtl_shard(0), 50)) return;
  float nan = NAN;
  CUDA_CHECK(cudaMemcpy(q.d.local.part[DTL_QPART_SCALES], &nan, sizeof nan, cudaMemcpyHostToDevice));
  dtl_tp_linear_params p = {.mask = DTL_TP_QUANT_WEIGHTS, .kind = DTL_TP_COLUMN, .in_features = 64, .out_features = 40,
                            .qweight = &q.d};
  dtl_tp_linear *l = NULL;
  CHECK_ERROR(dtl_tp_linear_create(D, &p, &l), DTL_ERR_INVALID_ARGUMENT, "scales");
  CHECK(l == NULL, "a failed creation wrote its output");
  qpair_free(&q);
}

int main(int argc, char **argv) {
  t_setup(&argc, &argv, &E);
  if (E.tp != 1 || dtl_cuda_device_count() == 0) {
    t_teardown(&E);
    return dt_skip(E.tp != 1 ? "runs at one rank (one GPU holds one NCCL rank)"
                             : "no CUDA device (the quantized layers on NCCL were not run)");
  }
  dt_nccl_setup(&G);
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  printf("device %d: compute capability %d.%d (FP8 GEMM %s)\n", dev, major, minor,
         major > 8 || (major == 8 && minor >= 9) ? "taken" : "not available: tiled path");
  const dtl_dtype types[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};
#define DEVICE_CASE(fn) {fn, #fn}
  static const struct {
    void (*fn)(void);
    const char *name;
  } cases[] = {DEVICE_CASE(linear_layers_on_quantized_weights_match_the_host_path),
               DEVICE_CASE(fp8_gemm_on_fp8_tensor_weights_is_within_the_activation_rounding),
               DEVICE_CASE(mlp_and_attention_on_quantized_weights_match_the_host_path),
               DEVICE_CASE(a_nan_scale_in_device_memory_is_found_at_creation)};
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

/* SPDX-License-Identifier: Apache-2.0 */
/* The TP layers on quantized weights against the dense layers on the dequantized weights: every rank builds the
 * whole quantized tensor from a seed (dt_qweights.h: quantized on a replicated layout, then sliced to its shard of
 * the layer's cut), dequantizes it whole (the oracle's weight), runs the quantized layer and the dense layer on the
 * same inputs, and compares its output shard.
 * Tolerance. Both layers multiply the same f32 values (dequantization is exact: the tile kernel gives the dense
 * tensor's bits whatever the cut), so they differ only in the order of their f32 sums (tiles of 512 columns,
 * fused sub-weights, bias seeds). A sum of k products in f32, in any order, is within k * 2^-24 * sum |x_j w_j| of
 * the exact value (Higham, 3.1, to first order); two such sums differ by at most twice that. The linear layers
 * are checked elementwise against that bound with k = in + tp + 1 (the reduction across ranks and the bias add
 * at most tp + 1 more roundings); the gathered output (shard + concat) against a double-precision oracle with half
 * of it. The blocks (SiLU, GELU, softmax in between) are checked like the dense blocks of test_tp_layers.c, within
 * 1e-5 x (1 + max |ref|) of a double-precision oracle on the dequantized weights, and the quantized block within
 * the same of the dense block.
 * Formats: FP8 block (cuts inside 64 x 64 and 32 x 48 blocks), FP8 channel and tensor, GPTQ (cuts inside groups
 * of 48; act order with a scrambled g_idx), AWQ, GGUF Q8_0, Q4_0 and Q4_K; uneven sizes (97 x 75 at tp 4 is
 * 25, 25, 25, 22). Bad input: a wrong cut, shape or mesh, a NULL part, a NaN scale on one rank, dense weights
 * besides quantized ones, FP8_GEMM without quantized weights. */
#include "tp_env.h"
#include "common/alloc.h"
#include "dt_qweights.h"

static t_env E;
static const double TOL = 1e-5;

static unsigned seed(unsigned s) { return s * 31u + (unsigned)E.data_coord * 1000003u; }

static dtl_layout *act(int64_t T, int64_t F, dtl_placement p) {
  dtl_layout *l = NULL;
  CHECK_OK(dtl_tp_activation_layout(E.ctx, T, F, p, &l));
  return l;
}

static float *slice(const float *full, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  float *p = malloc(sizeof(float) * (size_t)(rows * cols + 1));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) p[r * cols + c] = full[(r0 + r) * ld + c0 + c];
  return p;
}

/* The cut of a weight for the layer: on_tp on the TP mesh dim, Replicate elsewhere. */
static void cut(dtl_placement on_tp, dtl_placement *p) {
  for (int d = 0; d < dtl_mesh_ndim(E.mesh); d++) p[d] = d == E.tp_dim ? on_tp : dtl_replicate();
}

static int make(dt_qweight *w, const dtl_quant_format *f, int64_t R, int64_t C, dtl_placement on_tp, unsigned s) {
  dtl_placement p[DTL_MAX_MESH_DIMS];
  cut(on_tp, p);
  int64_t shape[2] = {R, C};
  dtl_status st = dt_qweight_make(w, E.mesh, f, 2, shape, p, seed(s));
  CHECK(st == DTL_OK, "quantized weight [%lld, %lld]: %s", (long long)R, (long long)C, dtl_last_error());
  return st == DTL_OK;
}

typedef struct {
  const char *name;
  dtl_quant_format f;
  int64_t out, in; /* the linear layers' shape */
} qcase;

static dtl_quant_format fmt_block(int64_t br, int64_t bc, dtl_dtype code, dtl_dtype scale) {
  return (dtl_quant_format){.mask = DTL_QFMT_BLOCK | DTL_QFMT_CODE_DTYPE | DTL_QFMT_SCALE_DTYPE,
                            .kind = DTL_QUANT_FP8_BLOCK, .block_rows = br, .block_cols = bc, .code_dtype = code,
                            .scale_dtype = scale};
}
static dtl_quant_format fmt_group(dtl_quant_kind k, int64_t group, uint64_t flags) {
  return (dtl_quant_format){.mask = DTL_QFMT_GROUP, .flags = flags, .kind = k, .group = group};
}
static dtl_quant_format fmt_kind(dtl_quant_kind k) { return (dtl_quant_format){.kind = k}; }

static qcase cases[] = {
    {"fp8-block 64x64", {0}, 96, 96},
    {"fp8-block 32x48 e5m2 bf16", {0}, 97, 75},
    {"fp8-channel f16", {0}, 97, 75},
    {"fp8-tensor", {0}, 40, 50},
    {"gptq g48", {0}, 96, 96},
    {"gptq g32 act-order", {0}, 64, 96},
    {"awq g40", {0}, 96, 100},
    {"q8_0", {0}, 50, 128},
    {"q4_0", {0}, 33, 128},
    /* Larger than one host tile (128 rows x 512 columns) each way, so tiles and panels add up. */
    {"fp8-block 128x128, several tiles", {0}, 320, 1088},
    {"gptq g128, several tiles", {0}, 320, 1088},
};
#define NCASES (sizeof cases / sizeof cases[0])

static void init_cases(void) {
  cases[0].f = fmt_block(64, 64, DTL_FLOAT8_E4M3, DTL_FLOAT32);
  cases[1].f = fmt_block(32, 48, DTL_FLOAT8_E5M2, DTL_BFLOAT16);
  cases[2].f = (dtl_quant_format){.mask = DTL_QFMT_SCALE_DTYPE, .kind = DTL_QUANT_FP8_CHANNEL, .scale_dtype = DTL_FLOAT16};
  cases[3].f = fmt_kind(DTL_QUANT_FP8_TENSOR);
  cases[4].f = fmt_group(DTL_QUANT_GPTQ, 48, 0);
  cases[5].f = fmt_group(DTL_QUANT_GPTQ, 32, DTL_QFMT_ACT_ORDER);
  cases[6].f = fmt_group(DTL_QUANT_AWQ, 40, 0);
  cases[7].f = fmt_kind(DTL_QUANT_GGUF_Q8_0);
  cases[8].f = fmt_kind(DTL_QUANT_GGUF_Q4_0);
  cases[9].f = fmt_kind(DTL_QUANT_FP8_BLOCK);
  cases[10].f = fmt_group(DTL_QUANT_GPTQ, 128, 0);
}

/* The summation-order bound of an output block: 2 * k * 2^-24 * (|x| |W|^T + |b|) elementwise (see the header),
 * max over the block of |got - want| / bound, so <= 1 passes. want and got are [rows, cols] with cols of the
 * global [*, out] starting at c0; x [T, in] and w [out, in] are whole. */
static double bound_ratio(const float *got, const float *want, const float *x, const float *w, const float *b,
                          int64_t in, int64_t out, int64_t r0, int64_t rows, int64_t c0, int64_t cols, double k) {
  double worst = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      double s = b ? fabs(b[c0 + c]) : 0;
      for (int64_t j = 0; j < in; j++) s += fabs((double)x[(r0 + r) * in + j] * w[(c0 + c) * in + j]);
      double bound = 2 * k * ldexp(1.0, -24) * s + 1e-30, e = fabs((double)got[r * cols + c] - want[r * cols + c]);
      if (!(e / bound <= worst)) worst = e / bound;
    }
  (void)out;
  return worst;
}

/* ---------------------------------------------------------------------------------------------------- */
static void column_linear_on_quantized_weights_equals_dense_on_dequantized_and_concatenates(void) {
  for (unsigned ci = 0; ci < NCASES; ci++) {
    const qcase *q = &cases[ci];
    dt_qweight w;
    if (!make(&w, &q->f, q->out, q->in, dtl_shard(0), 100 + ci)) continue;
    for (int mode = 0; mode < 3; mode++) { /* 0: R -> S(1); 1: R -> R (gathered); 2: S(0) -> S(1) */
      int64_t out = q->out, in = q->in, T = mode == 2 ? 7 : 5, o0, on, t0, tn;
      float *b = t_reals(seed(21), out, 0.5f), *x = t_reals(seed(22), T * in, 1.0f);
      uint64_t flags = mode == 1 ? DTL_TP_GATHER_OUTPUT : mode == 2 ? DTL_TP_SEQUENCE_PARALLEL : 0;
      dtl_tp_linear_params qp = {.mask = DTL_TP_QUANT_WEIGHTS, .flags = flags, .kind = DTL_TP_COLUMN,
                                 .in_features = in, .out_features = out, .bias = b, .qweight = &w.q};
      dtl_tp_linear_params dp = {.flags = flags, .kind = DTL_TP_COLUMN, .in_features = in, .out_features = out,
                                 .weight = w.w, .bias = b};
      dtl_tp_linear *lq = NULL, *ld = NULL;
      CHECK_OK(dtl_tp_linear_create(E.ctx, &qp, &lq));
      CHECK_OK(dtl_tp_linear_create(E.ctx, &dp, &ld));
      t_chunk(out, E.tp, E.rank, &o0, &on);
      t_chunk(T, E.tp, E.rank, &t0, &tn);
      dtl_layout *li = act(T, in, mode == 2 ? dtl_shard(0) : dtl_replicate());
      float *xl = mode == 2 ? slice(x, in, t0, tn, 0, in) : slice(x, in, 0, T, 0, in);
      int64_t ycols = mode == 1 ? out : on, c0 = mode == 1 ? 0 : o0;
      float *yq = calloc((size_t)(T * ycols + 1), sizeof(float)), *yd = calloc((size_t)(T * ycols + 1), sizeof(float));
      if (lq && ld) {
        CHECK_OK(dtl_tp_linear_forward(lq, li, xl, yq));
        CHECK_OK(dtl_tp_linear_forward(ld, li, xl, yd));
      }
      double r = bound_ratio(yq, yd, x, w.w, b, in, out, 0, T, c0, ycols, (double)(in + E.tp + 1));
      CHECK(r <= 1.0, "%s out=%lld in=%lld mode=%d: |quantized - dense| reaches %g x the f32 bound", q->name,
            (long long)out, (long long)in, mode, r);
      if (mode == 1) { /* shard + concat: the gathered output against the double oracle on dequantize(W) */
        double *ref = malloc(sizeof(double) * (size_t)(T * out));
        t_linear(T, in, out, x, w.w, b, ref);
        float *rf = malloc(sizeof(float) * (size_t)(T * out));
        for (int64_t i = 0; i < T * out; i++) rf[i] = (float)ref[i];
        double r2 = bound_ratio(yq, rf, x, w.w, b, in, out, 0, T, 0, out, (double)(in + E.tp + 2) / 2 + 1);
        CHECK(r2 <= 1.0, "%s: the gathered output reaches %g x the f32 bound of the dense oracle", q->name, r2);
        free(ref), free(rf);
      }
      dtl_layout_destroy(li);
      dtl_tp_linear_destroy(lq), dtl_tp_linear_destroy(ld);
      free(b), free(x), free(xl), free(yq), free(yd);
    }
    dt_qweight_free(&w);
  }
}

static void row_linear_on_quantized_weights_equals_dense_on_dequantized(void) {
  for (unsigned ci = 0; ci < NCASES; ci++) {
    const qcase *q = &cases[ci];
    dt_qweight w;
    if (!make(&w, &q->f, q->out, q->in, dtl_shard(1), 200 + ci)) continue;
    for (int sp = 0; sp < 2; sp++) {
      int64_t out = q->out, in = q->in, T = sp ? 7 : 4, i0, inn, t0, tn;
      float *b = t_reals(seed(31), out, 0.5f), *x = t_reals(seed(32), T * in, 1.0f);
      uint64_t flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0;
      dtl_tp_linear_params qp = {.mask = DTL_TP_QUANT_WEIGHTS, .flags = flags, .kind = DTL_TP_ROW, .in_features = in,
                                 .out_features = out, .bias = b, .qweight = &w.q};
      dtl_tp_linear_params dp = {.flags = flags, .kind = DTL_TP_ROW, .in_features = in, .out_features = out,
                                 .weight = w.w, .bias = b};
      dtl_tp_linear *lq = NULL, *ld = NULL;
      CHECK_OK(dtl_tp_linear_create(E.ctx, &qp, &lq));
      CHECK_OK(dtl_tp_linear_create(E.ctx, &dp, &ld));
      t_chunk(in, E.tp, E.rank, &i0, &inn);
      t_chunk(T, E.tp, E.rank, &t0, &tn);
      dtl_layout *li = act(T, in, dtl_shard(1));
      float *xl = slice(x, in, 0, T, i0, inn);
      int64_t rows = sp ? tn : T, r0 = sp ? t0 : 0;
      float *yq = calloc((size_t)(rows * out + 1), sizeof(float)), *yd = calloc((size_t)(rows * out + 1), sizeof(float));
      if (lq && ld) {
        CHECK_OK(dtl_tp_linear_forward(lq, li, xl, yq));
        CHECK_OK(dtl_tp_linear_forward(ld, li, xl, yd));
      }
      double r = bound_ratio(yq, yd, x, w.w, b, in, out, r0, rows, 0, out, (double)(in + E.tp + 1));
      CHECK(r <= 1.0, "%s out=%lld in=%lld sp=%d: |quantized - dense| reaches %g x the f32 bound", q->name,
            (long long)out, (long long)in, sp, r);
      dtl_layout_destroy(li);
      dtl_tp_linear_destroy(lq), dtl_tp_linear_destroy(ld);
      free(b), free(x), free(xl), free(yq), free(yd);
    }
    dt_qweight_free(&w);
  }
}

/* Q4_K super-blocks are 256 columns: column-parallel only at these sizes (a row cut of 256 at tp 2 would be 128). */
static void column_linear_on_q4_k_equals_dense_on_dequantized(void) {
  int64_t out = 21, in = 256, T = 3, o0, on;
  dtl_quant_format f = fmt_kind(DTL_QUANT_GGUF_Q4_K);
  dt_qweight w;
  if (!make(&w, &f, out, in, dtl_shard(0), 300)) return;
  float *x = t_reals(seed(41), T * in, 1.0f);
  dtl_tp_linear_params qp = {.mask = DTL_TP_QUANT_WEIGHTS, .kind = DTL_TP_COLUMN, .in_features = in,
                             .out_features = out, .qweight = &w.q};
  dtl_tp_linear_params dp = {.kind = DTL_TP_COLUMN, .in_features = in, .out_features = out, .weight = w.w};
  dtl_tp_linear *lq = NULL, *ld = NULL;
  CHECK_OK(dtl_tp_linear_create(E.ctx, &qp, &lq));
  CHECK_OK(dtl_tp_linear_create(E.ctx, &dp, &ld));
  t_chunk(out, E.tp, E.rank, &o0, &on);
  dtl_layout *li = act(T, in, dtl_replicate());
  float *yq = calloc((size_t)(T * on + 1), sizeof(float)), *yd = calloc((size_t)(T * on + 1), sizeof(float));
  if (lq && ld) {
    CHECK_OK(dtl_tp_linear_forward(lq, li, x, yq));
    CHECK_OK(dtl_tp_linear_forward(ld, li, x, yd));
  }
  double r = bound_ratio(yq, yd, x, w.w, NULL, in, out, 0, T, o0, on, (double)(in + 2));
  CHECK(r <= 1.0, "q4_k: |quantized - dense| reaches %g x the f32 bound", r);
  dtl_layout_destroy(li);
  dtl_tp_linear_destroy(lq), dtl_tp_linear_destroy(ld);
  dt_qweight_free(&w);
  free(x), free(yq), free(yd);
}

/* The three MLP formats cover a block format with cuts inside blocks, int4 groups and GGUF blocks. */
static void mlp_on_quantized_weights_matches_dense_on_dequantized(void) {
  dtl_quant_format fmts[3] = {fmt_block(48, 40, DTL_FLOAT8_E4M3, DTL_FLOAT32), fmt_group(DTL_QUANT_GPTQ, 32, 0),
                              fmt_kind(DTL_QUANT_GGUF_Q8_0)};
  int64_t H = 64, F = 128;
  for (int fi = 0; fi < 3; fi++)
    for (int gated = 0; gated < 2; gated++)
      for (int sp = 0; sp < 2; sp++) {
        int with_bias = sp, wd = gated ? 2 * F : F;
        int64_t T = sp ? 7 : 4, t0, tn;
        dt_qweight g = {0}, u, d;
        int ok = (!gated || make(&g, &fmts[fi], F, H, dtl_shard(0), 400)) && make(&u, &fmts[fi], F, H, dtl_shard(0), 401) &&
                 make(&d, &fmts[fi], H, F, dtl_shard(1), 402);
        if (!ok) continue;
        float *gu = malloc(sizeof(float) * (size_t)(wd * H)); /* the dense fused [gate; up] */
        if (gated) memcpy(gu, g.w, sizeof(float) * (size_t)(F * H));
        memcpy(gu + (gated ? F * H : 0), u.w, sizeof(float) * (size_t)(F * H));
        float *x = t_reals(seed(51), T * H, 1.0f);
        float *gub = with_bias ? t_reals(seed(54), wd, 0.5f) : NULL, *dnb = with_bias ? t_reals(seed(55), H, 0.5f) : NULL;
        double *ref = malloc(sizeof(double) * (size_t)(T * H));
        t_mlp(T, H, F, gated, x, gu, gub, d.w, dnb, ref);
        dtl_tp_activation a = gated ? DTL_TP_ACT_SILU_GATED : DTL_TP_ACT_GELU;
        dtl_tp_mlp_params qp = {.mask = DTL_TP_QUANT_WEIGHTS, .flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0,
                                .activation = a, .hidden = H, .ffn = F, .gate_up_bias = gub, .down_bias = dnb,
                                .qgate = gated ? &g.q : NULL, .qup = &u.q, .qdown = &d.q};
        dtl_tp_mlp_params dp = {.flags = qp.flags, .activation = a, .hidden = H, .ffn = F, .gate_up = gu, .down = d.w,
                                .gate_up_bias = gub, .down_bias = dnb};
        dtl_tp_mlp *mq = NULL, *md = NULL;
        CHECK_OK(dtl_tp_mlp_create(E.ctx, &qp, &mq));
        CHECK_OK(dtl_tp_mlp_create(E.ctx, &dp, &md));
        t_chunk(T, E.tp, E.rank, &t0, &tn);
        int64_t rows = sp ? tn : T, r0 = sp ? t0 : 0;
        dtl_layout *li = act(T, H, sp ? dtl_shard(0) : dtl_replicate());
        float *xl = slice(x, H, r0, rows, 0, H);
        float *yq = calloc((size_t)(rows * H + 1), sizeof(float)), *yd = calloc((size_t)(rows * H + 1), sizeof(float));
        if (mq && md) {
          CHECK_OK(dtl_tp_mlp_forward(mq, li, xl, yq));
          CHECK_OK(dtl_tp_mlp_forward(md, li, xl, yd));
        }
        double mx, err = t_block_err(ref, H, r0, rows, 0, H, yq, &mx), diff = 0;
        for (int64_t i = 0; i < rows * H; i++) diff = fmax(diff, fabs((double)yq[i] - yd[i]));
        CHECK(err <= TOL * (1 + mx), "format %d gated=%d sp=%d: max error %g against the oracle (max |ref| %g)", fi,
              gated, sp, err, mx);
        CHECK(diff <= TOL * (1 + mx), "format %d gated=%d sp=%d: max difference %g from the dense block", fi, gated,
              sp, diff);
        dtl_layout_destroy(li);
        dtl_tp_mlp_destroy(mq), dtl_tp_mlp_destroy(md);
        if (gated) dt_qweight_free(&g);
        dt_qweight_free(&u), dt_qweight_free(&d);
        free(gu), free(x), free(gub), free(dnb), free(ref), free(xl), free(yq), free(yd);
      }
}

/* q, k, v cut by heads (k, v Replicate when tp > kv_heads: each rank keeps its kv head's rows; or v in the
 * repeat_kv form) and out by q heads. */
static void attention_on_quantized_weights_matches_dense_on_dequantized(void) {
  dtl_quant_format fmts[3] = {fmt_block(64, 64, DTL_FLOAT8_E4M3, DTL_FLOAT32), fmt_group(DTL_QUANT_AWQ, 32, 0),
                              fmt_kind(DTL_QUANT_GGUF_Q8_0)};
  int64_t H = 64, Hq = 4, Hkv = 2, D = 32, W = (Hq + 2 * Hkv) * D;
  dtl_placement kv_cut = E.tp > Hkv ? dtl_replicate() : dtl_shard(0);
  for (int fi = 0; fi < 3; fi++)
    for (int sp = 0; sp < 2; sp++) {
      int with_bias = sp;
      int64_t T = sp ? 7 : 5, t0, tn;
      dt_qweight wq, wk, wv, wo;
      int ok = make(&wq, &fmts[fi], Hq * D, H, dtl_shard(0), 500) && make(&wk, &fmts[fi], Hkv * D, H, kv_cut, 501) &&
               make(&wv, &fmts[fi], Hkv * D, H, kv_cut, 502) && make(&wo, &fmts[fi], H, Hq * D, dtl_shard(1), 503);
      if (!ok) continue;
      /* Q8_0 quantizes each row on its own, so v in dtl_tp_qweight_read_qkv's repeat_kv form ([tp * D, H], rank r's
       * rows its kv head's) dequantizes to the same rows: the block takes that form too when tp > kv_heads. */
      dt_qweight wrep = {0};
      if (fi == 2 && E.tp > Hkv) {
        dtl_quant_format f8 = fmts[fi];
        int64_t R = E.tp * D, shape[2] = {R, H};
        float *rep = malloc(sizeof(float) * (size_t)(R * H));
        for (int64_t r = 0; r < E.tp; r++) memcpy(rep + r * D * H, wv.w + r / (E.tp / Hkv) * D * H, sizeof(float) * (size_t)(D * H));
        dtl_placement pc[DTL_MAX_MESH_DIMS];
        cut(dtl_shard(0), pc);
        CHECK_OK(dt_qweight_make_from(&wrep, E.mesh, &f8, 2, shape, pc, rep));
        free(rep);
      }
      float *wqkv = malloc(sizeof(float) * (size_t)(W * H));
      memcpy(wqkv, wq.w, sizeof(float) * (size_t)(Hq * D * H));
      memcpy(wqkv + Hq * D * H, wk.w, sizeof(float) * (size_t)(Hkv * D * H));
      memcpy(wqkv + (Hq + Hkv) * D * H, wv.w, sizeof(float) * (size_t)(Hkv * D * H));
      float *x = t_reals(seed(61), T * H, 1.0f);
      float *bqkv = with_bias ? t_reals(seed(64), W, 0.5f) : NULL, *bo = with_bias ? t_reals(seed(65), H, 0.5f) : NULL;
      float scale = 1.0f / sqrtf((float)D);
      double *ref = malloc(sizeof(double) * (size_t)(T * H));
      t_attention(T, H, Hq, Hkv, D, scale, x, wqkv, bqkv, wo.w, bo, ref);
      dtl_tp_attention_params qp = {.mask = DTL_TP_QUANT_WEIGHTS, .flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0,
                                    .hidden = H, .q_heads = Hq, .kv_heads = Hkv, .head_dim = D, .qkv_bias = bqkv,
                                    .out_bias = bo, .qq = &wq.q, .qk = &wk.q, .qv = wrep.cut ? &wrep.q : &wv.q,
                                    .qout = &wo.q};
      dtl_tp_attention_params dp = {.flags = qp.flags, .hidden = H, .q_heads = Hq, .kv_heads = Hkv, .head_dim = D,
                                    .qkv = wqkv, .out = wo.w, .qkv_bias = bqkv, .out_bias = bo};
      dtl_tp_attention *aq = NULL, *ad = NULL;
      CHECK_OK(dtl_tp_attention_create(E.ctx, &qp, &aq));
      CHECK_OK(dtl_tp_attention_create(E.ctx, &dp, &ad));
      t_chunk(T, E.tp, E.rank, &t0, &tn);
      int64_t rows = sp ? tn : T, r0 = sp ? t0 : 0;
      dtl_layout *li = act(T, H, sp ? dtl_shard(0) : dtl_replicate());
      float *xl = slice(x, H, r0, rows, 0, H);
      float *yq = calloc((size_t)(rows * H + 1), sizeof(float)), *yd = calloc((size_t)(rows * H + 1), sizeof(float));
      if (aq && ad) {
        CHECK_OK(dtl_tp_attention_forward(aq, li, xl, yq));
        CHECK_OK(dtl_tp_attention_forward(ad, li, xl, yd));
      }
      double mx, err = t_block_err(ref, H, r0, rows, 0, H, yq, &mx), diff = 0;
      for (int64_t i = 0; i < rows * H; i++) diff = fmax(diff, fabs((double)yq[i] - yd[i]));
      CHECK(err <= TOL * (1 + mx), "format %d sp=%d: max error %g against the oracle (max |ref| %g)", fi, sp, err, mx);
      CHECK(diff <= TOL * (1 + mx), "format %d sp=%d: max difference %g from the dense block", fi, sp, diff);
      dtl_layout_destroy(li);
      dtl_tp_attention_destroy(aq), dtl_tp_attention_destroy(ad);
      dt_qweight_free(&wq), dt_qweight_free(&wk), dt_qweight_free(&wv), dt_qweight_free(&wo), dt_qweight_free(&wrep);
      free(wqkv), free(x), free(bqkv), free(bo), free(ref), free(xl), free(yq), free(yd);
    }
}

/* ---------------------------------------------------------------------------------------------------- */
static void bad_quantized_weights_fail_every_rank_and_create_nothing(void) {
  dtl_quant_format f = fmt_block(64, 64, DTL_FLOAT8_E4M3, DTL_FLOAT32);
  int64_t out = 96, in = 96;
  dt_qweight w, wrow, wbig;
  if (!make(&w, &f, out, in, dtl_shard(0), 600) || !make(&wrow, &f, out, in, dtl_shard(1), 601) ||
      !make(&wbig, &f, out + 1, in, dtl_shard(0), 602))
    return;
  dtl_tp_linear *l = NULL;
  dtl_tp_linear_params p = {.mask = DTL_TP_QUANT_WEIGHTS, .kind = DTL_TP_COLUMN, .in_features = in, .out_features = out,
                            .qweight = &w.q};
  /* A row-parallel cut for a column-parallel layer: the rank's box lacks columns (tp 1 holds everything). */
  p.qweight = &wrow.q;
  if (E.tp > 1) CHECK_ERROR(dtl_tp_linear_create(E.ctx, &p, &l), DTL_ERR_INVALID_ARGUMENT, "which do not hold");
  else CHECK_OK(dtl_tp_linear_create(E.ctx, &p, &l));
  dtl_tp_linear_destroy(l);
  l = NULL;
  p.qweight = &wbig.q;
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &p, &l), DTL_ERR_INVALID_ARGUMENT, "expected a [96, 96] matrix");
  CHECK(l == NULL, "a failed creation wrote its output");
  p.qweight = NULL;
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &p, &l), DTL_ERR_INVALID_ARGUMENT, "qweight=NULL");
  /* Dense and quantized weights at once; FP8_GEMM without quantized weights. */
  p.qweight = &w.q;
  p.weight = w.w;
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &p, &l), DTL_ERR_INVALID_ARGUMENT, "weight is not NULL");
  dtl_tp_linear_params dp = {.flags = DTL_TP_FP8_GEMM, .kind = DTL_TP_COLUMN, .in_features = in, .out_features = out,
                             .weight = w.w};
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &dp, &l), DTL_ERR_INVALID_ARGUMENT, "DTL_TP_FP8_GEMM");
  p.weight = NULL;
  /* A NULL part buffer. */
  dtl_tp_qweight nopart = w.q;
  nopart.local.part[DTL_QPART_SCALES] = NULL;
  p.qweight = &nopart;
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &p, &l), DTL_ERR_INVALID_ARGUMENT, "qweight.local.part[1] (scales)=NULL");
  /* A NaN scale on rank 0 only: rank 0 names it, every rank fails (creation agrees), nothing is created. */
  float *s = w.local.part[DTL_QPART_SCALES], keep = s[0];
  if (dt_rank == 0) s[0] = NAN;
  p.qweight = &w.q;
  dtl_status st = dtl_tp_linear_create(E.ctx, &p, &l);
  CHECK(st == DTL_ERR_INVALID_ARGUMENT, "NaN scale on rank 0: %s (%s)", dtl_status_name(st), dtl_last_error());
  if (dt_rank == 0) CHECK(strstr(dtl_last_error(), "scales") != NULL, "the message names the scales: %s", dtl_last_error());
  CHECK(l == NULL, "a failed creation wrote its output");
  s[0] = keep;
  /* Another mesh over the same ranks. */
  dtl_mesh *other = NULL;
  int np = dt_size;
  REQUIRE_OK(dtl_mesh_create(E.world, 1, &np, &other));
  dtl_placement pl = dtl_shard(0);
  int64_t shape[2] = {out, in};
  dt_qweight wo;
  REQUIRE_OK(dt_qweight_make(&wo, other, &f, 2, shape, &pl, 603));
  p.qweight = &wo.q;
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &p, &l), DTL_ERR_INVALID_ARGUMENT, "another mesh");
  dt_qweight_free(&wo);
  dtl_mesh_destroy(other);
  /* The MLP: a gate for GELU, a dense down besides the quantized ones. */
  dtl_tp_mlp *m = NULL;
  dtl_tp_mlp_params mp = {.mask = DTL_TP_QUANT_WEIGHTS, .activation = DTL_TP_ACT_GELU, .hidden = in, .ffn = out,
                          .qgate = &w.q, .qup = &w.q, .qdown = &wrow.q};
  CHECK_ERROR(dtl_tp_mlp_create(E.ctx, &mp, &m), DTL_ERR_INVALID_ARGUMENT, "qgate is not NULL with DTL_TP_ACT_GELU");
  mp.qgate = NULL;
  mp.down = w.w;
  CHECK_ERROR(dtl_tp_mlp_create(E.ctx, &mp, &m), DTL_ERR_INVALID_ARGUMENT, "down is not NULL");
  CHECK(m == NULL, "a failed creation wrote its output");
  mp.down = NULL;
  CHECK_OK(dtl_tp_mlp_create(E.ctx, &mp, &m)); /* the same, right */
  dtl_tp_mlp_destroy(m);
  dt_qweight_free(&w), dt_qweight_free(&wrow), dt_qweight_free(&wbig);
}

/* Forwards take their tile from the context's grow-only scratch: none allocates after the first. A creation that
 * runs out of memory at any of its allocations fails on every rank and leaves nothing allocated. */
static void quantized_forwards_allocate_nothing_and_out_of_memory_leaks_nothing(void) {
  dtl_quant_format f = fmt_group(DTL_QUANT_GPTQ, 32, 0);
  int64_t H = 64, F = 128, T = 5;
  dt_qweight g, u, d;
  if (!make(&g, &f, F, H, dtl_shard(0), 700) || !make(&u, &f, F, H, dtl_shard(0), 701) ||
      !make(&d, &f, H, F, dtl_shard(1), 702))
    return;
  float *b = t_reals(seed(71), F, 0.5f);
  dtl_tp_mlp_params mp = {.mask = DTL_TP_QUANT_WEIGHTS, .activation = DTL_TP_ACT_SILU_GATED, .hidden = H, .ffn = F,
                          .qgate = &g.q, .qup = &u.q, .qdown = &d.q};
  dtl_tp_linear_params lp = {.mask = DTL_TP_QUANT_WEIGHTS, .kind = DTL_TP_COLUMN, .in_features = H, .out_features = F,
                             .bias = b, .qweight = &u.q};
  dtl_tp_mlp *m = NULL;
  dtl_tp_linear *l = NULL;
  int64_t live = dtl__alloc_hook_live();
  dtl__alloc_hook_reset(0, false);
  CHECK_OK(dtl_tp_mlp_create(E.ctx, &mp, &m));
  uint64_t n = dtl__alloc_hook_count();
  dtl_tp_mlp_destroy(m);
  m = NULL;
  for (uint64_t k = 1; k <= n; k++) {
    dtl__alloc_hook_reset(k, false);
    dtl_status st = dtl_tp_mlp_create(E.ctx, &mp, &m);
    dtl__alloc_hook_reset(0, false);
    CHECK(st != DTL_OK && m == NULL, "allocation %llu of %llu failing: %s", (unsigned long long)k,
          (unsigned long long)n, dtl_status_name(st));
    CHECK(dtl__alloc_hook_live() == live, "allocation %llu failing leaves %lld buffers", (unsigned long long)k,
          (long long)(dtl__alloc_hook_live() - live));
    dtl_tp_mlp_destroy(m);
    m = NULL;
  }
  CHECK_OK(dtl_tp_mlp_create(E.ctx, &mp, &m));
  CHECK_OK(dtl_tp_linear_create(E.ctx, &lp, &l));
  dtl_layout *li = act(T, H, dtl_replicate());
  float *x = t_reals(seed(72), T * H, 1.0f), *y = calloc((size_t)(T * F), sizeof(float));
  if (m && l) {
    CHECK_OK(dtl_tp_mlp_forward(m, li, x, y));
    CHECK_OK(dtl_tp_linear_forward(l, li, x, y));
    dtl__alloc_hook_reset(0, false);
    for (int i = 0; i < 10; i++) {
      CHECK_OK(dtl_tp_mlp_forward(m, li, x, y));
      CHECK_OK(dtl_tp_linear_forward(l, li, x, y));
    }
    CHECK(dtl__alloc_hook_count() == 0, "%llu allocations in 20 warm forwards",
          (unsigned long long)dtl__alloc_hook_count());
  }
  dtl_layout_destroy(li);
  dtl_tp_mlp_destroy(m);
  dtl_tp_linear_destroy(l);
  dt_qweight_free(&g), dt_qweight_free(&u), dt_qweight_free(&d);
  free(b), free(x), free(y);
}

int main(int argc, char **argv) {
  t_setup(&argc, &argv, &E);
  init_cases();
  RUN(column_linear_on_quantized_weights_equals_dense_on_dequantized_and_concatenates);
  RUN(row_linear_on_quantized_weights_equals_dense_on_dequantized);
  RUN(column_linear_on_q4_k_equals_dense_on_dequantized);
  RUN(mlp_on_quantized_weights_matches_dense_on_dequantized);
  RUN(attention_on_quantized_weights_matches_dense_on_dequantized);
  RUN(bad_quantized_weights_fail_every_rank_and_create_nothing);
  RUN(quantized_forwards_allocate_nothing_and_out_of_memory_leaks_nothing);
  t_teardown(&E);
  return dt_finish();
}

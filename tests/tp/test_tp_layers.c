/* SPDX-License-Identifier: Apache-2.0 */
/* Every TP layer and block against its dense computation: each rank builds the full weights and inputs
 * from a fixed seed, runs the sharded layer on its TP group, and compares its local output with the matching
 * slice of a double-precision dense oracle. Integer data (exact in f32) gives exact checks for the linear
 * layers, the communication halves, the embedding and top-k; the blocks with SiLU/GELU/softmax use a
 * tolerance of 1e-5 x (1 + max |ref|). Uneven sizes everywhere: out/in/ffn/vocab not divisible by tp, odd
 * token counts for sequence parallelism, kv heads replicated when tp > kv_heads. */
#include "tp_env.h"
#include "common/half.h"

static t_env E;
static const double TOL = 1e-5;

static float *t_slice(const float *full, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  float *p = malloc(sizeof(float) * (size_t)(rows * cols + 1));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) p[r * cols + c] = full[(r0 + r) * ld + c0 + c];
  return p;
}

static unsigned seed(unsigned s) { return s * 31u + (unsigned)E.data_coord * 1000003u; }

static dtl_layout *act(int64_t T, int64_t F, dtl_placement p) {
  dtl_layout *l = NULL;
  CHECK_OK(dtl_tp_activation_layout(E.ctx, T, F, p, &l));
  return l;
}

/* ---------------------------------------------------------------------------------------------------- */
static void weight_shards_follow_torch_chunk_and_keep_heads_whole(void) {
  int64_t dims[] = {1, 3, 5, 7, 8};
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 5; b++) {
      int64_t out = dims[a], in = dims[b], o0, on, i0, inn;
      float *w = t_ints(seed(11), out * in, 50);
      t_chunk(out, E.tp, E.rank, &o0, &on);
      t_chunk(in, E.tp, E.rank, &i0, &inn);
      float *col = malloc(sizeof(float) * (size_t)(on * in + 1)), *row = malloc(sizeof(float) * (size_t)(out * inn + 1));
      CHECK_OK(dtl_tp_weight_shard_column(E.ctx, w, out, in, col));
      CHECK_OK(dtl_tp_weight_shard_row(E.ctx, w, out, in, row));
      for (int64_t r = 0; r < on; r++)
        for (int64_t c = 0; c < in; c++) CHECK(col[r * in + c] == w[(o0 + r) * in + c], "column shard out=%lld in=%lld", (long long)out, (long long)in);
      for (int64_t r = 0; r < out; r++)
        for (int64_t c = 0; c < inn; c++) CHECK(row[r * inn + c] == w[r * in + i0 + c], "row shard out=%lld in=%lld", (long long)out, (long long)in);
      dtl_tp_range sr;
      CHECK_OK(dtl_tp_split(E.ctx, out, &sr));
      CHECK(sr.offset == o0 && sr.count == on, "dtl_tp_split(%lld)", (long long)out);
      free(w);
      free(col);
      free(row);
    }
  /* Fused gate/up: each part split on its own. */
  int64_t F = 7, H = 3, f0, fn;
  t_chunk(F, E.tp, E.rank, &f0, &fn);
  float *gu = t_ints(seed(12), 2 * F * H, 50), *s = malloc(sizeof(float) * (size_t)(2 * fn * H + 1));
  CHECK_OK(dtl_tp_weight_shard_gate_up(E.ctx, gu, F, H, s));
  for (int64_t r = 0; r < fn; r++)
    for (int64_t c = 0; c < H; c++) {
      CHECK(s[r * H + c] == gu[(f0 + r) * H + c], "gate row %lld", (long long)r);
      CHECK(s[(fn + r) * H + c] == gu[(F + f0 + r) * H + c], "up row %lld", (long long)r);
    }
  free(gu);
  free(s);
  /* Fused QKV and the output projection: whole heads of this rank, q then k then v (replicated kv heads
   * when tp > kv_heads, uneven kv heads when tp does not divide them). */
  int64_t cfgs[][2] = {{8, 2}, {8, 4}, {6, 1}};
  for (int ci = 0; ci < 3; ci++) {
    int64_t Hq = cfgs[ci][0], Hkv = cfgs[ci][1], D = 3, in = 4;
    dtl_tp_range q, kv;
    if (dtl_tp_attention_heads(E.ctx, Hq, Hkv, &q, &kv) != DTL_OK) continue; /* rejections: the heads test */
    float *w = t_ints(seed(13), (Hq + 2 * Hkv) * D * in, 50), *sh = malloc(sizeof(float) * (size_t)((q.count + 2 * kv.count) * D * in + 1));
    CHECK_OK(dtl_tp_weight_shard_qkv(E.ctx, w, Hq, Hkv, D, in, sh));
    int64_t at = 0;
    int64_t starts[3] = {q.offset * D, (Hq + kv.offset) * D, (Hq + Hkv + kv.offset) * D}, lens[3] = {q.count * D, kv.count * D, kv.count * D};
    for (int part = 0; part < 3; part++)
      for (int64_t r = 0; r < lens[part]; r++, at++)
        for (int64_t c = 0; c < in; c++) CHECK(sh[at * in + c] == w[(starts[part] + r) * in + c], "qkv part %d row %lld", part, (long long)r);
    float *wo = t_ints(seed(14), in * Hq * D, 50), *so = malloc(sizeof(float) * (size_t)(in * q.count * D + 1));
    CHECK_OK(dtl_tp_weight_shard_attention_out(E.ctx, wo, Hq, Hkv, D, in, so));
    for (int64_t r = 0; r < in; r++)
      for (int64_t c = 0; c < q.count * D; c++) CHECK(so[r * q.count * D + c] == wo[r * Hq * D + q.offset * D + c], "attention out shard");
    free(w);
    free(sh);
    free(wo);
    free(so);
  }
}

/* Whether (Hq, Hkv) can be split over tp by the documented rule, decided independently of dtl. */
static int heads_valid(int64_t Hq, int64_t Hkv, int tp) {
  if (Hq % Hkv) return 0;
  return tp <= Hkv || (tp % Hkv == 0 && Hq % tp == 0);
}

static void attention_heads_partition_q_heads_and_replicate_kv_when_tp_exceeds_kv_heads(void) {
  int64_t cfg[][2] = {{4, 4}, {8, 2}, {12, 1}, {6, 3}, {10, 5}, {8, 8}, {16, 4}};
  for (unsigned c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    int64_t Hq = cfg[c][0], Hkv = cfg[c][1], g = Hq / Hkv;
    dtl_tp_range q, kv;
    dtl_status st = dtl_tp_attention_heads(E.ctx, Hq, Hkv, &q, &kv);
    if (!heads_valid(Hq, Hkv, E.tp)) {
      CHECK(st == DTL_ERR_INVALID_ARGUMENT, "q=%lld kv=%lld tp=%d should be rejected", (long long)Hq, (long long)Hkv, E.tp);
      continue;
    }
    CHECK(st == DTL_OK, "q=%lld kv=%lld tp=%d", (long long)Hq, (long long)Hkv, E.tp);
    if (E.tp > Hkv) {
      CHECK(kv.count == 1 && kv.offset == (int64_t)E.rank * Hkv / E.tp, "replicated kv head of rank %d is %lld", E.rank, (long long)kv.offset);
      CHECK(q.count == Hq / E.tp && q.offset == E.rank * (Hq / E.tp), "q heads of rank %d", E.rank);
    } else {
      int64_t o, n;
      t_chunk(Hkv, E.tp, E.rank, &o, &n);
      CHECK(kv.offset == o && kv.count == n, "kv heads follow torch.chunk");
    }
    /* Every q head of this rank finds its kv head here. */
    for (int64_t h = q.offset; h < q.offset + q.count; h++)
      CHECK(h / g >= kv.offset && h / g < kv.offset + kv.count, "q head %lld lacks kv head %lld", (long long)h, (long long)(h / g));
    /* The q ranges of all ranks tile [0, Hq) in rank order. */
    int64_t mine[2] = {q.offset, q.count}, *all = malloc(sizeof(int64_t) * 2 * (size_t)E.tp);
    MPI_Allgather(mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, dtl_comm_mpi_handle(dtl_tp_context_comm(E.ctx)));
    int64_t next = 0;
    for (int r = 0; r < E.tp; r++) {
      CHECK(all[2 * r] == next, "q heads of rank %d start at %lld, expected %lld", r, (long long)all[2 * r], (long long)next);
      next += all[2 * r + 1];
    }
    CHECK(next == Hq, "q heads cover %lld of %lld", (long long)next, (long long)Hq);
    free(all);
  }
}

/* ---------------------------------------------------------------------------------------------------- */
static void column_linear_with_uneven_out_matches_dense_exactly(void) {
  int64_t in = 5, outs[] = {7, 3, 9};
  for (int oi = 0; oi < 3; oi++)
    for (int mode = 0; mode < 3; mode++) { /* 0: R -> S(1), 1: R -> R (gathered), 2: S(0) -> S(1) (sequence parallel) */
      int64_t out = outs[oi], T = mode == 2 ? 5 : 3, o0, on, t0, tn;
      float *w = t_ints(seed(21), out * in, 3), *b = t_ints(seed(22), out, 3), *x = t_ints(seed(23), T * in, 3);
      double *ref = malloc(sizeof(double) * (size_t)(T * out));
      t_linear(T, in, out, x, w, b, ref);
      dtl_tp_linear_params p = {.flags = mode == 1 ? DTL_TP_GATHER_OUTPUT : mode == 2 ? DTL_TP_SEQUENCE_PARALLEL : 0,
                                .kind = DTL_TP_COLUMN, .in_features = in, .out_features = out, .weight = w, .bias = b};
      dtl_tp_linear *l = NULL;
      CHECK_OK(dtl_tp_linear_create(E.ctx, &p, &l));
      dtl_layout *li = NULL, *lo = NULL;
      CHECK_OK(dtl_tp_linear_layouts(l, T, &li, &lo));
      t_chunk(out, E.tp, E.rank, &o0, &on);
      t_chunk(T, E.tp, E.rank, &t0, &tn);
      float *xl = mode == 2 ? t_slice(x, in, t0, tn, 0, in) : t_slice(x, in, 0, T, 0, in);
      int64_t ycols = mode == 1 ? out : on;
      CHECK(dtl_layout_local_count(lo) == (size_t)(T * ycols), "output layout local count %zu", dtl_layout_local_count(lo));
      float *y = malloc(sizeof(float) * (size_t)(T * ycols + 1));
      CHECK_OK(dtl_tp_linear_forward(l, li, xl, y));
      double err = t_block_err(ref, out, 0, T, mode == 1 ? 0 : o0, ycols, y, NULL);
      CHECK(err == 0.0, "out=%lld mode=%d: max error %g (expected exact)", (long long)out, mode, err);
      dtl_layout_destroy(li);
      dtl_layout_destroy(lo);
      dtl_tp_linear_destroy(l);
      free(w), free(b), free(x), free(ref), free(xl), free(y);
    }
}

static void row_linear_with_uneven_in_matches_dense_exactly_and_adds_bias_once(void) {
  int64_t out = 5, ins[] = {7, 2, 10};
  for (int ii = 0; ii < 3; ii++)
    for (int sp = 0; sp < 2; sp++) {
      int64_t in = ins[ii], T = sp ? 7 : 4, i0, inn, t0, tn;
      float *w = t_ints(seed(31), out * in, 3), *b = t_ints(seed(32), out, 3), *x = t_ints(seed(33), T * in, 3);
      double *ref = malloc(sizeof(double) * (size_t)(T * out));
      t_linear(T, in, out, x, w, b, ref);
      dtl_tp_linear_params p = {.flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0, .kind = DTL_TP_ROW, .in_features = in,
                                .out_features = out, .weight = w, .bias = b};
      dtl_tp_linear *l = NULL;
      CHECK_OK(dtl_tp_linear_create(E.ctx, &p, &l));
      dtl_layout *li = NULL, *lo = NULL;
      CHECK_OK(dtl_tp_linear_layouts(l, T, &li, &lo));
      t_chunk(in, E.tp, E.rank, &i0, &inn);
      t_chunk(T, E.tp, E.rank, &t0, &tn);
      float *xl = t_slice(x, in, 0, T, i0, inn);
      int64_t rows = sp ? tn : T;
      float *y = malloc(sizeof(float) * (size_t)(rows * out + 1));
      CHECK_OK(dtl_tp_linear_forward(l, li, xl, y));
      double err = t_block_err(ref, out, sp ? t0 : 0, rows, 0, out, y, NULL);
      CHECK(err == 0.0, "in=%lld sp=%d: max error %g (expected exact)", (long long)in, sp, err);
      dtl_layout_destroy(li);
      dtl_layout_destroy(lo);
      dtl_tp_linear_destroy(l);
      free(w), free(b), free(x), free(ref), free(xl), free(y);
    }
}

static void communication_halves_move_exactly_what_the_layers_move(void) {
  int64_t T = 5, F = 7, t0, tn, f0, fn;
  t_chunk(T, E.tp, E.rank, &t0, &tn);
  t_chunk(F, E.tp, E.rank, &f0, &fn);
  /* Row reduce: the partials of rank r are (r+1) * base, so the sum is base * tp(tp+1)/2, plus the bias once. */
  float *base = t_ints(seed(41), T * F, 4), *bias = t_ints(seed(42), F, 4), *partial = malloc(sizeof(float) * (size_t)(T * F));
  for (int64_t i = 0; i < T * F; i++) partial[i] = base[i] * (float)(E.rank + 1);
  for (int sp = 0; sp < 2; sp++) {
    dtl_layout *lo = act(T, F, sp ? dtl_shard(0) : dtl_replicate());
    int64_t rows = sp ? tn : T, r0 = sp ? t0 : 0;
    float *y = malloc(sizeof(float) * (size_t)(rows * F + 1));
    CHECK_OK(dtl_tp_row_parallel_reduce(E.ctx, lo, partial, bias, y));
    for (int64_t r = 0; r < rows; r++)
      for (int64_t f = 0; f < F; f++) {
        float want = base[(r0 + r) * F + f] * (float)(E.tp * (E.tp + 1) / 2) + bias[f];
        CHECK(y[r * F + f] == want, "sp=%d y[%lld,%lld]=%g want %g", sp, (long long)r, (long long)f, y[r * F + f], want);
      }
    free(y);
    dtl_layout_destroy(lo);
  }
  /* Column gather S(1) -> R and sequence gather S(0) -> R, for T = 1 (the decode fast path) and T = 5. */
  int64_t Ts[2] = {1, 5};
  for (int i = 0; i < 2; i++) {
    int64_t TT = Ts[i], s0, sn;
    t_chunk(TT, E.tp, E.rank, &s0, &sn);
    float *full = t_ints(seed(43), TT * F, 9), *y = malloc(sizeof(float) * (size_t)(TT * F));
    float *cols = t_slice(full, F, 0, TT, f0, fn), *rows = t_slice(full, F, s0, sn, 0, F);
    dtl_layout *l1 = act(TT, F, dtl_shard(1)), *l0 = act(TT, F, dtl_shard(0));
    memset(y, 0, sizeof(float) * (size_t)(TT * F));
    CHECK_OK(dtl_tp_column_parallel_gather(E.ctx, l1, cols, y));
    CHECK(!memcmp(y, full, sizeof(float) * (size_t)(TT * F)), "column gather T=%lld", (long long)TT);
    memset(y, 0, sizeof(float) * (size_t)(TT * F));
    CHECK_OK(dtl_tp_sequence_gather(E.ctx, l0, rows, y));
    CHECK(!memcmp(y, full, sizeof(float) * (size_t)(TT * F)), "sequence gather T=%lld", (long long)TT);
    dtl_layout_destroy(l1);
    dtl_layout_destroy(l0);
    free(full), free(y), free(cols), free(rows);
  }
  free(base), free(bias), free(partial);
}

/* The halves only copy and communicate, so they take the half types too (the bias adds in f32). */
static void communication_halves_carry_f16_and_bf16_with_a_bias(void) {
  int64_t T = 5, F = 3, t0, tn;
  t_chunk(T, E.tp, E.rank, &t0, &tn);
  for (int bf = 0; bf < 2; bf++) {
    dtl_tp_options o = {.mask = DTL_TP_OPT_DTYPE, .dtype = bf ? DTL_BFLOAT16 : DTL_FLOAT16};
    dtl_tp_context *c = NULL;
    CHECK_OK(dtl_tp_context_create(E.mesh, E.tp_dim, &o, &c));
    float *base = t_ints(seed(44), T * F, 4), *bias = t_ints(seed(45), F, 4);
    uint16_t part[15], b16[3], y[15];
    for (int i = 0; i < T * F; i++) part[i] = bf ? dtl__f32_to_bf16(base[i] * (float)(E.rank + 1)) : dtl__f32_to_f16(base[i] * (float)(E.rank + 1));
    for (int i = 0; i < F; i++) b16[i] = bf ? dtl__f32_to_bf16(bias[i]) : dtl__f32_to_f16(bias[i]);
    dtl_layout *lo = NULL;
    CHECK_OK(dtl_tp_activation_layout(c, T, F, dtl_shard(0), &lo));
    CHECK_OK(dtl_tp_row_parallel_reduce(c, lo, part, b16, y));
    for (int64_t r = 0; r < tn; r++)
      for (int64_t f = 0; f < F; f++) {
        float got = bf ? dtl__bf16_to_f32(y[r * F + f]) : dtl__f16_to_f32(y[r * F + f]);
        float want = base[(t0 + r) * F + f] * (float)(E.tp * (E.tp + 1) / 2) + bias[f];
        CHECK(got == want, "%s y[%lld,%lld]=%g want %g", bf ? "bf16" : "f16", (long long)r, (long long)f, got, want);
      }
    dtl_layout_destroy(lo);
    dtl_tp_context_destroy(c);
    free(base), free(bias);
  }
}

/* ---------------------------------------------------------------------------------------------------- */
static void mlp_block_matches_dense_with_uneven_ffn_and_odd_tokens(void) {
  int64_t H = 12, F = 10;
  for (int gated = 0; gated < 2; gated++)
    for (int sp = 0; sp < 2; sp++)
      for (int with_bias = 0; with_bias < 2; with_bias++) {
        int64_t T = sp ? 7 : 4, t0, tn, w = gated ? 2 * F : F;
        float *x = t_reals(seed(51), T * H, 1.0f), *gu = t_reals(seed(52), w * H, 0.5f), *dn = t_reals(seed(53), H * F, 0.5f);
        float *gub = with_bias ? t_reals(seed(54), w, 0.5f) : NULL, *dnb = with_bias ? t_reals(seed(55), H, 0.5f) : NULL;
        double *ref = malloc(sizeof(double) * (size_t)(T * H));
        t_mlp(T, H, F, gated, x, gu, gub, dn, dnb, ref);
        dtl_tp_mlp_params p = {.flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0,
                               .activation = gated ? DTL_TP_ACT_SILU_GATED : DTL_TP_ACT_GELU,
                               .hidden = H, .ffn = F, .gate_up = gu, .down = dn, .gate_up_bias = gub, .down_bias = dnb};
        dtl_tp_mlp *m = NULL;
        CHECK_OK(dtl_tp_mlp_create(E.ctx, &p, &m));
        dtl_layout *li = NULL, *lo = NULL;
        CHECK_OK(dtl_tp_mlp_layouts(m, T, &li, &lo));
        t_chunk(T, E.tp, E.rank, &t0, &tn);
        int64_t rows = sp ? tn : T, r0 = sp ? t0 : 0;
        float *xl = t_slice(x, H, r0, rows, 0, H), *y = malloc(sizeof(float) * (size_t)(rows * H + 1));
        CHECK_OK(dtl_tp_mlp_forward(m, li, xl, y));
        double mx, err = t_block_err(ref, H, r0, rows, 0, H, y, &mx);
        CHECK(err <= TOL * (1 + mx), "gated=%d sp=%d bias=%d: max error %g (max |ref| %g)", gated, sp, with_bias, err, mx);
        dtl_layout_destroy(li), dtl_layout_destroy(lo);
        dtl_tp_mlp_destroy(m);
        free(x), free(gu), free(dn), free(gub), free(dnb), free(ref), free(xl), free(y);
      }
}

static void attention_block_matches_dense_with_gqa_and_replicated_kv_heads(void) {
  int64_t cfg[][3] = {{4, 4, 3}, {8, 2, 2}, {12, 1, 2}, {6, 3, 4}, {10, 5, 2}};
  int64_t H = 8;
  for (unsigned c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    int64_t Hq = cfg[c][0], Hkv = cfg[c][1], D = cfg[c][2];
    if (!heads_valid(Hq, Hkv, E.tp)) continue; /* the rejection is checked in the heads test */
    for (int sp = 0; sp < 2; sp++) {
      int with_bias = sp; /* cover both: biases with sequence parallelism, none without */
      int64_t T = sp ? 7 : 5, t0, tn, W = (Hq + 2 * Hkv) * D;
      float *x = t_reals(seed(61), T * H, 1.0f), *wqkv = t_reals(seed(62), W * H, 0.5f), *wo = t_reals(seed(63), H * Hq * D, 0.5f);
      float *bqkv = with_bias ? t_reals(seed(64), W, 0.5f) : NULL, *bo = with_bias ? t_reals(seed(65), H, 0.5f) : NULL;
      float scale = 1.0f / sqrtf((float)D);
      double *ref = malloc(sizeof(double) * (size_t)(T * H));
      t_attention(T, H, Hq, Hkv, D, scale, x, wqkv, bqkv, wo, bo, ref);
      dtl_tp_attention_params p = {.flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0, .hidden = H, .q_heads = Hq,
                                   .kv_heads = Hkv, .head_dim = D, .qkv = wqkv, .out = wo, .qkv_bias = bqkv, .out_bias = bo};
      dtl_tp_attention *a = NULL;
      CHECK_OK(dtl_tp_attention_create(E.ctx, &p, &a));
      dtl_layout *li = NULL, *lo = NULL;
      CHECK_OK(dtl_tp_attention_layouts(a, T, &li, &lo));
      t_chunk(T, E.tp, E.rank, &t0, &tn);
      int64_t rows = sp ? tn : T, r0 = sp ? t0 : 0;
      float *xl = t_slice(x, H, r0, rows, 0, H), *y = malloc(sizeof(float) * (size_t)(rows * H + 1));
      CHECK_OK(dtl_tp_attention_forward(a, li, xl, y));
      double mx, err = t_block_err(ref, H, r0, rows, 0, H, y, &mx);
      CHECK(err <= TOL * (1 + mx), "q=%lld kv=%lld sp=%d: max error %g (max |ref| %g)", (long long)Hq, (long long)Hkv, sp, err, mx);
      dtl_layout_destroy(li), dtl_layout_destroy(lo);
      dtl_tp_attention_destroy(a);
      free(x), free(wqkv), free(wo), free(bqkv), free(bo), free(ref), free(xl), free(y);
    }
  }
  /* An explicit scale reaches the softmax. */
  int64_t T = 3, Hq = 2, Hkv = 2, D = 2;
  if (heads_valid(Hq, Hkv, E.tp)) {
    float *x = t_reals(seed(66), T * H, 1.0f), *wqkv = t_reals(seed(67), 6 * D * H, 0.5f), *wo = t_reals(seed(68), H * Hq * D, 0.5f);
    double *ref = malloc(sizeof(double) * (size_t)(T * H));
    t_attention(T, H, Hq, Hkv, D, 2.5f, x, wqkv, NULL, wo, NULL, ref);
    dtl_tp_attention_params p = {.mask = DTL_TP_SCALE, .hidden = H, .q_heads = Hq, .kv_heads = Hkv, .head_dim = D,
                                 .qkv = wqkv, .out = wo, .scale = 2.5f};
    dtl_tp_attention *a = NULL;
    CHECK_OK(dtl_tp_attention_create(E.ctx, &p, &a));
    dtl_layout *li = act(T, H, dtl_replicate());
    float *y = malloc(sizeof(float) * (size_t)(T * H));
    CHECK_OK(dtl_tp_attention_forward(a, li, x, y));
    double mx, err = t_block_err(ref, H, 0, T, 0, H, y, &mx);
    CHECK(err <= TOL * (1 + mx), "scale=2.5: max error %g", err);
    dtl_layout_destroy(li);
    dtl_tp_attention_destroy(a);
    free(x), free(wqkv), free(wo), free(ref), free(y);
  }
}

/* ---------------------------------------------------------------------------------------------------- */
static void vocab_parallel_embedding_is_exact_with_uneven_vocab(void) {
  int64_t V = 11, H = 6;
  float *table = t_ints(seed(71), V * H, 100);
  for (int sp = 0; sp < 2; sp++) {
    int64_t T = 9, t0, tn, ids[9] = {0, 10, 5, 5, 3, 7, 1, 9, 2};
    dtl_tp_embedding_params p = {.flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0, .vocab = V, .hidden = H, .table = table};
    dtl_tp_embedding *e = NULL;
    CHECK_OK(dtl_tp_embedding_create(E.ctx, &p, &e));
    dtl_layout *lo = NULL;
    CHECK_OK(dtl_tp_embedding_layout(e, T, &lo));
    t_chunk(T, E.tp, E.rank, &t0, &tn);
    int64_t rows = sp ? tn : T, r0 = sp ? t0 : 0;
    CHECK(dtl_layout_local_count(lo) == (size_t)(rows * H), "embedding layout local count");
    float *y = malloc(sizeof(float) * (size_t)(rows * H + 1));
    CHECK_OK(dtl_tp_embedding_forward(e, T, ids, y));
    for (int64_t r = 0; r < rows; r++)
      CHECK(!memcmp(y + r * H, table + ids[r0 + r] * H, sizeof(float) * (size_t)H), "sp=%d token %lld", sp, (long long)(r0 + r));
    dtl_layout_destroy(lo);
    dtl_tp_embedding_destroy(e);
    free(y);
  }
  free(table);
}

/* Dense top-k: a stable order over (NaN first, larger value, lower index). */
static int better(float a, int64_t ia, float b, int64_t ib) {
  if (isnan(a) != isnan(b)) return isnan(a);
  if (!isnan(a) && a != b) return a > b;
  return ia < ib;
}
static void dense_topk(const float *row, int64_t V, int k, int64_t *idx) {
  char *taken = calloc((size_t)V, 1);
  for (int j = 0; j < k; j++) {
    int64_t best = -1;
    for (int64_t v = 0; v < V; v++)
      if (!taken[v] && (best < 0 || better(row[v], v, row[best], best))) best = v;
    taken[best] = 1;
    idx[j] = best;
  }
  free(taken);
}

static void topk_and_argmax_over_sharded_logits_break_ties_by_lowest_index(void) {
  int64_t T = 6, V = 13, v0, vn;
  float *lg = t_ints(seed(81), T * V, 2); /* values in -2..2: many ties inside and across shards */
  for (int64_t v = 0; v < V; v++) lg[0 * V + v] = 1.0f;       /* token 0: all equal */
  lg[1 * V + 2] = lg[1 * V + 11] = 7.0f;                     /* token 1: a tie at the top across shards */
  for (int64_t v = 0; v < V; v++) lg[2 * V + v] = (float)(v % 3 == 2 ? 5 : -1); /* token 2: ties spaced out */
  lg[3 * V + 12] = NAN;                                       /* token 3: NaN ranks first, as in torch.topk */
  lg[4 * V + 12] = 9.0f;                                      /* token 4: the max in the last (maybe empty-tailed) shard */
  t_chunk(V, E.tp, E.rank, &v0, &vn);
  float *local = t_slice(lg, V, 0, T, v0, vn);
  dtl_layout *l = act(T, V, dtl_shard(1));
  int ks[] = {1, 3, 5, 13};
  for (int ki = 0; ki < 4; ki++) {
    int k = ks[ki];
    float *vals = malloc(sizeof(float) * (size_t)(T * k));
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(T * k)), *want = malloc(sizeof(int64_t) * (size_t)k);
    CHECK_OK(dtl_tp_logits_topk(E.ctx, l, local, k, vals, idx));
    for (int64_t t = 0; t < T; t++) {
      dense_topk(lg + t * V, V, k, want);
      for (int j = 0; j < k; j++) {
        CHECK(idx[t * k + j] == want[j], "k=%d token %lld rank-%d pick is %lld, dense %lld", k, (long long)t, j,
              (long long)idx[t * k + j], (long long)want[j]);
        float wv = lg[t * V + want[j]];
        CHECK(!memcmp(&vals[t * k + j], &wv, sizeof wv), "k=%d token %lld value %d", k, (long long)t, j);
      }
    }
    free(vals), free(idx), free(want);
  }
  int64_t am[6];
  CHECK_OK(dtl_tp_logits_argmax(E.ctx, l, local, am));
  CHECK(am[0] == 0 && am[1] == 2 && am[2] == 2 && am[3] == 12 && am[4] == 12, "argmax %lld %lld %lld %lld %lld",
        (long long)am[0], (long long)am[1], (long long)am[2], (long long)am[3], (long long)am[4]);
  dtl_layout_destroy(l);
  free(lg), free(local);
}

static void lm_head_column_parallel_then_argmax_equals_dense_argmax(void) {
  int64_t T = 4, H = 6, V = 23;
  float *w = t_ints(seed(91), V * H, 2), *x = t_ints(seed(92), T * H, 2);
  double *ref = malloc(sizeof(double) * (size_t)(T * V));
  t_linear(T, H, V, x, w, NULL, ref);
  dtl_tp_linear_params p = {.kind = DTL_TP_COLUMN, .in_features = H, .out_features = V, .weight = w};
  dtl_tp_linear *head = NULL;
  CHECK_OK(dtl_tp_linear_create(E.ctx, &p, &head));
  dtl_layout *li = NULL, *lo = NULL;
  CHECK_OK(dtl_tp_linear_layouts(head, T, &li, &lo));
  float *logits = malloc(sizeof(float) * (dtl_layout_local_count(lo) + 1));
  CHECK_OK(dtl_tp_linear_forward(head, li, x, logits));
  int64_t am[4];
  CHECK_OK(dtl_tp_logits_argmax(E.ctx, lo, logits, am));
  for (int64_t t = 0; t < T; t++) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
      if (ref[t * V + v] > ref[t * V + best]) best = v;
    CHECK(am[t] == best, "token %lld argmax %lld dense %lld", (long long)t, (long long)am[t], (long long)best);
  }
  dtl_layout_destroy(li), dtl_layout_destroy(lo);
  dtl_tp_linear_destroy(head);
  free(w), free(x), free(ref), free(logits);
}

int main(int argc, char **argv) {
  t_setup(&argc, &argv, &E);
  RUN(weight_shards_follow_torch_chunk_and_keep_heads_whole);
  RUN(attention_heads_partition_q_heads_and_replicate_kv_when_tp_exceeds_kv_heads);
  RUN(column_linear_with_uneven_out_matches_dense_exactly);
  RUN(row_linear_with_uneven_in_matches_dense_exactly_and_adds_bias_once);
  RUN(communication_halves_move_exactly_what_the_layers_move);
  RUN(communication_halves_carry_f16_and_bf16_with_a_bias);
  RUN(mlp_block_matches_dense_with_uneven_ffn_and_odd_tokens);
  RUN(attention_block_matches_dense_with_gqa_and_replicated_kv_heads);
  RUN(vocab_parallel_embedding_is_exact_with_uneven_vocab);
  RUN(topk_and_argmax_over_sharded_logits_break_ties_by_lowest_index);
  RUN(lm_head_column_parallel_then_argmax_equals_dense_argmax);
  t_teardown(&E);
  return dt_finish();
}

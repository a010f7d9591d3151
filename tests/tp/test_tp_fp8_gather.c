/* SPDX-License-Identifier: Apache-2.0 */
/* FP8 sequence-parallel gathers (DTL_TP_FP8_GATHER): dtl_tp_sequence_gather on such a context gives, on every rank,
 * dequantize(quantize(x)) of the dense [T, F] tensor bit for bit (the rule restated in tests/common/act_fp8_ref.h),
 * within the e4m3 bound of x (rank 0 prints the measured errors); the sequence-parallel layers and blocks of such a
 * context equal the plain context's on that round trip bit for bit, and a row-parallel layer (no token gather) is
 * unchanged. Uneven and empty shards, widths on both sides of the 128-column blocks, f32/f16/bf16. Bad input: a NaN
 * or infinity on one rank fails every rank (DTL_CHECK, as ctest runs) naming the global token row, with nothing
 * written; contexts that disagree on the flag; unknown option bits. Repeated FP8 forwards allocate nothing. */
#include "tp_env.h"
#include "act_fp8_ref.h"
#include "common/alloc.h"

static t_env E;
static const dtl_dtype kTypes[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};

static dtl_tp_context *fp8_context(dtl_dtype t) {
  dtl_tp_options o = {.mask = DTL_TP_OPT_DTYPE, .flags = DTL_TP_FP8_GATHER, .dtype = t};
  dtl_tp_context *c = NULL;
  REQUIRE_OK(dtl_tp_context_create(E.mesh, E.tp_dim, &o, &c));
  return c;
}

/* The dense [T, F] tensor of dtype t (every rank builds all of it; data-parallel replicas differ). */
static void *dense(dtl_dtype t, int64_t T, int64_t F, uint64_t seed) {
  void *x = malloc(dtl_dtype_size(t) * (size_t)(T * F + 1));
  for (int64_t i = 0; i < T * F; i++)
    ref_fp8_store(x, (size_t)i, t, ref_fp8_value(seed * 131 + (uint64_t)E.data_coord, (uint64_t)i));
  return x;
}

/* This rank's token rows of x [T, F] (S(0)): a pointer into x. */
static const void *my_rows(const void *x, dtl_dtype t, int64_t T, int64_t F, int64_t *off, int64_t *n) {
  t_chunk(T, E.tp, E.rank, off, n);
  return (const char *)x + (size_t)(*off * F) * dtl_dtype_size(t);
}

static double g_abs, g_rel_row, g_rel_normal;

static void sequence_gather_is_the_round_trip_of_the_dense_tensor_bit_for_bit(void) {
  static const int64_t Ts[] = {1, 7, 13}, Fs[] = {5, 128, 300};
  for (int ti = 0; ti < 3; ti++) {
    dtl_dtype t = kTypes[ti];
    size_t es = dtl_dtype_size(t);
    dtl_tp_context *c8 = fp8_context(t);
    for (int a = 0; a < 3; a++)
      for (int b = 0; b < 3; b++) {
        int64_t T = Ts[a], F = Fs[b], off, n, nb = ref_fp8_blocks(F);
        void *x = dense(t, T, F, (uint64_t)(a * 3 + b)), *want = malloc(es * (size_t)(T * F + 1));
        float *scales = malloc(sizeof(float) * (size_t)(T * nb + 1));
        ref_fp8_round_trip(x, t, T, F, want, scales);
        const void *mine = my_rows(x, t, T, F, &off, &n);
        dtl_layout *l = NULL;
        CHECK_OK(dtl_tp_activation_layout(c8, T, F, dtl_shard(0), &l));
        char *got = malloc(es * (size_t)(T * F + 1));
        CHECK_OK(dtl_tp_sequence_gather(c8, l, n ? mine : NULL, got));
        CHECK(memcmp(got, want, es * (size_t)(T * F)) == 0,
              "%s T=%lld F=%lld: the gathered tensor is not the round trip", dtl_dtype_name(t), (long long)T,
              (long long)F);
        for (int64_t r = 0; r < T; r++) {
          double rowmax = 0, rowerr = 0;
          for (int64_t h = 0; h < F; h++) rowmax = fmax(rowmax, fabs(ref_fp8_load(x, (size_t)(r * F + h), t)));
          for (int64_t h = 0; h < F; h++) {
            size_t i = (size_t)(r * F + h);
            double v = ref_fp8_load(x, i, t), g = ref_fp8_load(got, i, t), e = fabs(g - v);
            double s = scales[r * nb + h / 128];
            double bound = ref_fp8_bound(v, s) + (t == DTL_FLOAT32 ? 0 : ldexp(fabs(v), t == DTL_FLOAT16 ? -10 : -7));
            CHECK(e <= bound, "%s T=%lld F=%lld row %lld column %lld: %.9g -> %.9g (error %.3g > %.3g)",
                  dtl_dtype_name(t), (long long)T, (long long)F, (long long)r, (long long)h, v, g, e, bound);
            if (t != DTL_FLOAT32) continue; /* the report is the f32 path's */
            g_abs = fmax(g_abs, e);
            rowerr = fmax(rowerr, e);
            if (fabs(v) >= ldexp(s, -6)) g_rel_normal = fmax(g_rel_normal, e / fabs(v));
          }
          if (rowmax > 0 && t == DTL_FLOAT32) g_rel_row = fmax(g_rel_row, rowerr / rowmax);
        }
        dtl_layout_destroy(l);
        free(x), free(want), free(scales), free(got);
      }
    dtl_tp_context_destroy(c8);
  }
  double v[3] = {g_abs, g_rel_row, g_rel_normal}, m[3];
  MPI_Allreduce(v, m, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (dt_rank == 0)
    printf("# FP8 sequence gather vs the dense f32 tensor, tp=%d: max abs error %.4g, max error / row max %.4g, max "
           "relative error in e4m3's normal range %.4g\n", E.tp, m[0], m[1], m[2]);
}

/* --- layers ------------------------------------------------------------------------------------------------ */
typedef dtl_status (*forward_fn)(void *layer, const dtl_layout *xl, const void *x, void *y);
static dtl_status fwd_linear(void *l, const dtl_layout *xl, const void *x, void *y) {
  return dtl_tp_linear_forward(l, xl, x, y);
}
static dtl_status fwd_mlp(void *l, const dtl_layout *xl, const void *x, void *y) {
  return dtl_tp_mlp_forward(l, xl, x, y);
}
static dtl_status fwd_attn(void *l, const dtl_layout *xl, const void *x, void *y) {
  return dtl_tp_attention_forward(l, xl, x, y);
}

/* The layer of kind `which` on ctx: 0 column SP, 1 column SP + gather output, 2 row SP, 3 MLP SP, 4 attention SP. */
static void *make_layer(dtl_tp_context *ctx, int which, int64_t H, const float *w1, const float *w2, forward_fn *f,
                        dtl_layout **in, dtl_layout **out, int64_t T) {
  void *layer = NULL;
  if (which <= 2) {
    dtl_tp_linear_params p = {.flags = DTL_TP_SEQUENCE_PARALLEL | (which == 1 ? DTL_TP_GATHER_OUTPUT : 0),
                              .kind = which == 2 ? DTL_TP_ROW : DTL_TP_COLUMN, .in_features = H, .out_features = 9,
                              .weight = w1, .bias = w2};
    CHECK_OK(dtl_tp_linear_create(ctx, &p, (dtl_tp_linear **)&layer));
    if (layer) CHECK_OK(dtl_tp_linear_layouts(layer, T, in, out));
    *f = fwd_linear;
  } else if (which == 3) {
    dtl_tp_mlp_params p = {.flags = DTL_TP_SEQUENCE_PARALLEL, .activation = DTL_TP_ACT_SILU_GATED, .hidden = H,
                           .ffn = 6, .gate_up = w1, .down = w2};
    CHECK_OK(dtl_tp_mlp_create(ctx, &p, (dtl_tp_mlp **)&layer));
    if (layer) CHECK_OK(dtl_tp_mlp_layouts(layer, T, in, out));
    *f = fwd_mlp;
  } else {
    dtl_tp_attention_params p = {.flags = DTL_TP_SEQUENCE_PARALLEL, .hidden = H, .q_heads = 4, .kv_heads = 2,
                                 .head_dim = 4, .qkv = w1, .out = w2};
    CHECK_OK(dtl_tp_attention_create(ctx, &p, (dtl_tp_attention **)&layer));
    if (layer) CHECK_OK(dtl_tp_attention_layouts(layer, T, in, out));
    *f = fwd_attn;
  }
  return layer;
}

static void destroy_layer(int which, void *l) {
  if (which <= 2) dtl_tp_linear_destroy(l);
  else if (which == 3) dtl_tp_mlp_destroy(l);
  else dtl_tp_attention_destroy(l);
}

static void sp_layers_equal_the_plain_layers_on_the_round_trip_and_row_parallel_is_unchanged(void) {
  const int64_t T = 11, H = 136;
  dtl_tp_context *c8 = fp8_context(DTL_FLOAT32);
  float *x = dense(DTL_FLOAT32, T, H, 77), *xq = malloc(sizeof(float) * (size_t)(T * H));
  ref_fp8_round_trip(x, DTL_FLOAT32, T, H, xq, NULL);
  float *w1 = t_reals(5, 64 * H, 0.1f), *w2 = t_reals(6, 64 * H, 0.1f), *bias = t_reals(7, 64, 0.5f);
  static const char *names[5] = {"column", "column + gather output", "row", "MLP", "attention"};
  for (int which = 0; which < 5; which++) {
    forward_fn f;
    dtl_layout *in8 = NULL, *out8 = NULL, *in = NULL, *out = NULL;
    void *l8 = make_layer(c8, which, H, w1, which <= 2 ? bias : w2, &f, &in8, &out8, T);
    void *lp = make_layer(E.ctx, which, H, w1, which <= 2 ? bias : w2, &f, &in, &out, T);
    if (!l8 || !lp || !in || !out) {
      destroy_layer(which, l8), destroy_layer(which, lp);
      continue;
    }
    int64_t s[2], o[2];
    dtl_layout_local_box(in, NULL, s, o);
    size_t ny = dtl_layout_local_count(out);
    float *xin = malloc(sizeof(float) * (size_t)(s[0] * s[1] + 1));
    float *xqin = malloc(sizeof(float) * (size_t)(s[0] * s[1] + 1));
    for (int64_t r = 0; r < s[0]; r++)
      for (int64_t c = 0; c < s[1]; c++) {
        int64_t g = (o[0] + r) * H + o[1] + c;
        xin[r * s[1] + c] = x[g];
        xqin[r * s[1] + c] = xq[g];
      }
    float *y8 = malloc(sizeof(float) * (ny + 1)), *yp = malloc(sizeof(float) * (ny + 1));
    CHECK_OK(f(l8, in8, xin, y8));
    /* A row-parallel input is S(1): nothing is gathered, so the plain layer sees x itself. */
    CHECK_OK(f(lp, in, which == 2 ? xin : xqin, yp));
    CHECK(memcmp(y8, yp, sizeof(float) * ny) == 0, "%s: the FP8-gather layer differs from the plain one on %s",
          names[which], which == 2 ? "x (no token gather)" : "dequantize(quantize(x))");
    /* Repeated forwards allocate nothing. */
    dtl__alloc_hook_reset(0, false);
    for (int i = 0; i < 3; i++) CHECK_OK(f(l8, in8, xin, y8));
    CHECK(dtl__alloc_hook_count() == 0, "%s: %llu allocations in repeated forwards", names[which],
          (unsigned long long)dtl__alloc_hook_count());
    free(xin), free(xqin), free(y8), free(yp);
    dtl_layout_destroy(in8), dtl_layout_destroy(out8), dtl_layout_destroy(in), dtl_layout_destroy(out);
    destroy_layer(which, l8), destroy_layer(which, lp);
  }
  free(x), free(xq), free(w1), free(w2), free(bias);
  dtl_tp_context_destroy(c8);
}

/* --- bad input --------------------------------------------------------------------------------------------- */
static void nan_or_inf_on_one_rank_fails_every_rank_naming_the_global_token_row(void) {
  const int64_t T = 9, F = 130;
  dtl_tp_context *c8 = fp8_context(DTL_FLOAT32);
  float *x = dense(DTL_FLOAT32, T, F, 3);
  int bad = 0; /* the last TP rank that holds rows */
  for (int r = 0; r < E.tp; r++) {
    int64_t o, n;
    t_chunk(T, E.tp, r, &o, &n);
    if (n) bad = r;
  }
  int64_t off, n;
  float *mine = (float *)my_rows(x, DTL_FLOAT32, T, F, &off, &n);
  dtl_layout *l = NULL;
  CHECK_OK(dtl_tp_activation_layout(c8, T, F, dtl_shard(0), &l));
  float w[9 * 130] = {0};
  dtl_tp_linear_params lp = {.flags = DTL_TP_SEQUENCE_PARALLEL, .kind = DTL_TP_COLUMN, .in_features = F,
                             .out_features = 9, .weight = w};
  dtl_tp_linear *lin = NULL;
  CHECK_OK(dtl_tp_linear_create(c8, &lp, &lin));
  float *y = malloc(sizeof(float) * (size_t)(T * F));
  for (int round = 0; round < 3; round++) {
    if (E.rank == bad) mine[F + 129 - (n > 1 ? 0 : F)] = round == 1 ? INFINITY : NAN;
    memset(y, 0x5a, sizeof(float) * (size_t)(T * F));
    dtl_status st = round < 2 ? dtl_tp_sequence_gather(c8, l, n ? mine : NULL, y)
                              : dtl_tp_linear_forward(lin, l, mine, y);
    CHECK(st == DTL_ERR_INVALID_ARGUMENT, "round %d: %s (%s)", round, dtl_status_name(st), dtl_last_error());
    if (E.rank == bad) {
      char want[96];
      snprintf(want, sizeof want, "x row %lld column 129 is %s", (long long)(off + (n > 1 ? 1 : 0)),
               round == 1 ? "inf" : "nan");
      CHECK(strstr(dtl_last_error(), want), "message '%s' lacks '%s'", dtl_last_error(), want);
    }
    bool untouched = true;
    for (int64_t i = 0; i < T * F; i++) untouched &= ((uint32_t *)y)[i] == 0x5a5a5a5au;
    CHECK(untouched, "round %d: a failed gather wrote its output", round);
    if (E.rank == bad) mine[F + 129 - (n > 1 ? 0 : F)] = 0.5f;
  }
  CHECK_OK(dtl_tp_sequence_gather(c8, l, n ? mine : NULL, y)); /* the context still works */
  free(y), free(x);
  dtl_tp_linear_destroy(lin);
  dtl_layout_destroy(l);
  dtl_tp_context_destroy(c8);
}

static void contexts_that_disagree_on_the_flag_or_pass_unknown_bits_are_refused(void) {
  dtl_tp_context *c = NULL;
  dtl_tp_options o = {.flags = DTL_TP_FP8_GATHER | DTL_BIT(7)};
  CHECK_ERROR(dtl_tp_context_create(E.mesh, E.tp_dim, &o, &c), DTL_ERR_INVALID_ARGUMENT,
              "opt.flags=0xc0 has unknown bits 0x80 (known: DTL_TP_FP8_GATHER)");
  CHECK(c == NULL, "out written by a failed creation");
  if (dt_size > 1) {
    o = (dtl_tp_options){.flags = dt_rank == 0 ? DTL_TP_FP8_GATHER : 0};
    CHECK_STATUS(dtl_tp_context_create(E.mesh, E.tp_dim, &o, &c), DTL_ERR_MISMATCH);
    CHECK(c == NULL, "out written by a failed creation");
  }
}

int main(int argc, char **argv) {
  t_setup(&argc, &argv, &E);
  RUN(sequence_gather_is_the_round_trip_of_the_dense_tensor_bit_for_bit);
  RUN(sp_layers_equal_the_plain_layers_on_the_round_trip_and_row_parallel_is_unchanged);
  RUN(nan_or_inf_on_one_rank_fails_every_rank_naming_the_global_token_row);
  RUN(contexts_that_disagree_on_the_flag_or_pass_unknown_bits_are_refused);
  t_teardown(&E);
  return dt_finish();
}

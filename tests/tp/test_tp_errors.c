/* SPDX-License-Identifier: Apache-2.0 */
/* Bad input to the TP layers: each case gets its status and a message naming the argument and value, on
 * every rank alike (checks run before any collective), and leaves the output buffer untouched. */
#include "tp_env.h"

static t_env E;
#define SENTINEL 12345.0f

static void fill(float *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = SENTINEL;
}
static int untouched(const float *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != SENTINEL) return 0;
  return 1;
}

static void heads_that_cannot_be_split_are_rejected_with_the_numbers(void) {
  float w[64 * 8] = {0};
  dtl_tp_attention *a = NULL;
  dtl_tp_attention_params p = {.hidden = 8, .q_heads = 6, .kv_heads = 4, .head_dim = 2, .qkv = w, .out = w};
  CHECK_ERROR(dtl_tp_attention_heads(E.ctx, 6, 4, NULL, NULL), DTL_ERR_INVALID_ARGUMENT,
              "q_heads=6 is not a multiple of kv_heads=4");
  CHECK_ERROR(dtl_tp_attention_create(E.ctx, &p, &a), DTL_ERR_INVALID_ARGUMENT, "q_heads=6 is not a multiple of kv_heads=4");
  CHECK(a == NULL, "no layer on failure");
  CHECK_ERROR(dtl_tp_attention_heads(E.ctx, 0, 1, NULL, NULL), DTL_ERR_INVALID_ARGUMENT, "q_heads=0");
  if (E.tp >= 3) { /* tp > kv_heads that do not divide tp */
    char want[64];
    snprintf(want, sizeof want, "kv_heads=%d does not divide tp=%d", E.tp - 1, E.tp);
    CHECK_ERROR(dtl_tp_attention_heads(E.ctx, 2 * (E.tp - 1), E.tp - 1, NULL, NULL), DTL_ERR_INVALID_ARGUMENT, want);
    p.q_heads = 2 * (E.tp - 1);
    p.kv_heads = E.tp - 1;
    CHECK_ERROR(dtl_tp_attention_create(E.ctx, &p, &a), DTL_ERR_INVALID_ARGUMENT, want);
    float shard[64 * 8];
    CHECK_ERROR(dtl_tp_weight_shard_qkv(E.ctx, w, p.q_heads, p.kv_heads, 2, 8, shard), DTL_ERR_INVALID_ARGUMENT, want);
  }
  if (E.tp >= 2) { /* replicated kv heads whose q heads do not split evenly over tp */
    char want[64];
    snprintf(want, sizeof want, "q_heads=%d is not a multiple of tp=%d", E.tp + 1, E.tp);
    CHECK_ERROR(dtl_tp_attention_heads(E.ctx, E.tp + 1, 1, NULL, NULL), DTL_ERR_INVALID_ARGUMENT, want);
  }
}

static void layouts_that_differ_from_what_a_layer_takes_are_a_mismatch(void) {
  int64_t T = 5, in = 6, out = 4;
  float *w = t_ints(1, out * in, 2), *x = t_ints(2, T * in, 2), y[64];
  dtl_tp_linear *col = NULL, *row = NULL;
  dtl_tp_linear_params p = {.kind = DTL_TP_COLUMN, .in_features = in, .out_features = out, .weight = w};
  CHECK_OK(dtl_tp_linear_create(E.ctx, &p, &col));
  p.kind = DTL_TP_ROW;
  p.in_features = out;
  p.out_features = in;
  CHECK_OK(dtl_tp_linear_create(E.ctx, &p, &row));
  dtl_layout *s0 = NULL, *r = NULL, *s1 = NULL, *wide = NULL, *f64 = NULL;
  CHECK_OK(dtl_tp_activation_layout(E.ctx, T, in, dtl_shard(0), &s0));
  CHECK_OK(dtl_tp_activation_layout(E.ctx, T, in, dtl_replicate(), &r));
  CHECK_OK(dtl_tp_activation_layout(E.ctx, T, out, dtl_shard(1), &s1));
  CHECK_OK(dtl_tp_activation_layout(E.ctx, T, in + 1, dtl_replicate(), &wide));
  dtl_placement pl[2] = {dtl_replicate(), dtl_replicate()};
  int64_t shape[2] = {T, in};
  CHECK_OK(dtl_layout_create(E.mesh, DTL_FLOAT64, 2, shape, pl, &f64));
  fill(y, 64);
  /* A column layer without sequence parallelism takes R, not the token-sharded S(0). */
  CHECK_ERROR(dtl_tp_linear_forward(col, s0, x, y), DTL_ERR_MISMATCH, "x_layout is [5,6]");
  CHECK(strstr(dtl_last_error(), "S(0)") && strstr(dtl_last_error(), "but this takes [5,6]"), "message: %s", dtl_last_error());
  CHECK_ERROR(dtl_tp_linear_forward(col, wide, x, y), DTL_ERR_MISMATCH, "[5,7]");
  CHECK_ERROR(dtl_tp_linear_forward(col, f64, x, y), DTL_ERR_MISMATCH, "f64");
  /* A row layer takes S(1) on its in features. */
  CHECK_ERROR(dtl_tp_linear_forward(row, r, x, y), DTL_ERR_MISMATCH, "x_layout");
  CHECK_ERROR(dtl_tp_linear_forward(col, NULL, x, y), DTL_ERR_INVALID_ARGUMENT, "x_layout=NULL");
  CHECK(untouched(y, 64), "y untouched after a rejected call");
  /* A layout on another mesh. */
  dtl_mesh *other = NULL;
  int n = dtl_comm_size(E.world);
  CHECK_OK(dtl_mesh_create(E.world, 1, &n, &other));
  dtl_layout *lo = NULL;
  dtl_placement rp[1] = {dtl_replicate()};
  CHECK_OK(dtl_layout_create(other, DTL_FLOAT32, 2, shape, rp, &lo));
  CHECK_ERROR(dtl_tp_linear_forward(col, lo, x, y), DTL_ERR_MISMATCH, "another mesh");
  /* The communication halves check their layouts too. */
  CHECK_ERROR(dtl_tp_column_parallel_gather(E.ctx, r, x, y), DTL_ERR_MISMATCH, "in_layout");
  CHECK_ERROR(dtl_tp_sequence_gather(E.ctx, s1, x, y), DTL_ERR_MISMATCH, "in_layout");
  CHECK_ERROR(dtl_tp_row_parallel_reduce(E.ctx, s1, x, NULL, y), DTL_ERR_MISMATCH, "out_layout");
  CHECK(untouched(y, 64), "y untouched after a rejected call");
  /* A sequence-parallel MLP takes S(0) and rejects R. */
  float *gu = t_ints(3, 2 * 4 * in, 2), *dn = t_ints(4, in * 4, 2);
  dtl_tp_mlp_params mp = {.flags = DTL_TP_SEQUENCE_PARALLEL, .activation = DTL_TP_ACT_SILU_GATED, .hidden = in,
                          .ffn = 4, .gate_up = gu, .down = dn};
  dtl_tp_mlp *m = NULL;
  CHECK_OK(dtl_tp_mlp_create(E.ctx, &mp, &m));
  CHECK_ERROR(dtl_tp_mlp_forward(m, r, x, y), DTL_ERR_MISMATCH, "x_layout");
  CHECK(untouched(y, 64), "y untouched after a rejected call");
  dtl_tp_mlp_destroy(m);
  dtl_layout_destroy(lo);
  dtl_mesh_destroy(other);
  dtl_layout_destroy(s0), dtl_layout_destroy(r), dtl_layout_destroy(s1), dtl_layout_destroy(wide), dtl_layout_destroy(f64);
  dtl_tp_linear_destroy(col);
  dtl_tp_linear_destroy(row);
  free(w), free(x), free(gu), free(dn);
}

static void null_weights_and_missing_arguments_are_named(void) {
  float w[16] = {0};
  dtl_tp_linear *l = NULL;
  dtl_tp_linear_params lp = {.kind = DTL_TP_COLUMN, .in_features = 2, .out_features = 2, .weight = NULL};
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &lp, &l), DTL_ERR_INVALID_ARGUMENT, "weight=NULL");
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, NULL, &l), DTL_ERR_INVALID_ARGUMENT, "params=NULL");
  CHECK_ERROR(dtl_tp_linear_create(NULL, &lp, &l), DTL_ERR_INVALID_ARGUMENT, "ctx=NULL");
  lp.weight = w;
  lp.kind = DTL_TP_ROW;
  lp.flags = DTL_TP_GATHER_OUTPUT;
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &lp, &l), DTL_ERR_INVALID_ARGUMENT, "DTL_TP_GATHER_OUTPUT");
  lp.kind = (dtl_tp_linear_kind)7;
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &lp, &l), DTL_ERR_INVALID_ARGUMENT, "kind=7");
  CHECK(l == NULL, "no layer on failure");
  dtl_tp_mlp *m = NULL;
  dtl_tp_mlp_params mp = {.activation = DTL_TP_ACT_GELU, .hidden = 2, .ffn = 2, .gate_up = w, .down = NULL};
  CHECK_ERROR(dtl_tp_mlp_create(E.ctx, &mp, &m), DTL_ERR_INVALID_ARGUMENT, "down=NULL");
  mp.down = w;
  mp.gate_up = NULL;
  CHECK_ERROR(dtl_tp_mlp_create(E.ctx, &mp, &m), DTL_ERR_INVALID_ARGUMENT, "gate_up=NULL");
  dtl_tp_attention *a = NULL;
  dtl_tp_attention_params ap = {.hidden = 2, .q_heads = 1, .kv_heads = 1, .head_dim = 1, .qkv = NULL, .out = w};
  if (E.tp == 1) {
    CHECK_ERROR(dtl_tp_attention_create(E.ctx, &ap, &a), DTL_ERR_INVALID_ARGUMENT, "qkv=NULL");
    ap.qkv = w;
    ap.out = NULL;
    CHECK_ERROR(dtl_tp_attention_create(E.ctx, &ap, &a), DTL_ERR_INVALID_ARGUMENT, "out=NULL");
  }
  dtl_tp_embedding *e = NULL;
  dtl_tp_embedding_params ep = {.vocab = 4, .hidden = 2, .table = NULL};
  CHECK_ERROR(dtl_tp_embedding_create(E.ctx, &ep, &e), DTL_ERR_INVALID_ARGUMENT, "table=NULL");
  CHECK(m == NULL && a == NULL && e == NULL, "no layer on failure");
  float shard[16];
  CHECK_ERROR(dtl_tp_weight_shard_column(E.ctx, NULL, 4, 4, shard), DTL_ERR_INVALID_ARGUMENT, "w=NULL");
  CHECK_ERROR(dtl_tp_weight_shard_row(E.ctx, w, -1, 4, shard), DTL_ERR_INVALID_ARGUMENT, "-1");
  /* Contexts. */
  dtl_tp_context *c = NULL;
  CHECK_ERROR(dtl_tp_context_create(E.mesh, 5, NULL, &c), DTL_ERR_INVALID_ARGUMENT, "tp_dim=5");
  dtl_tp_options o = {.mask = DTL_TP_OPT_DTYPE, .dtype = DTL_INT32};
  CHECK_ERROR(dtl_tp_context_create(E.mesh, 0, &o, &c), DTL_ERR_INVALID_ARGUMENT, "dtype=i32");
  dtl_mesh *abstract = NULL;
  int shape = 2;
  CHECK_OK(dtl_mesh_create_abstract(1, &shape, NULL, &abstract));
  CHECK_ERROR(dtl_tp_context_create(abstract, 0, NULL, &c), DTL_ERR_INVALID_ARGUMENT, "abstract");
  dtl_mesh_destroy(abstract);
  /* Host layers compute in f32: an f16 context may shard and communicate, not run layers. */
  o.dtype = DTL_FLOAT16;
  CHECK_OK(dtl_tp_context_create(E.mesh, dtl_mesh_ndim(E.mesh) - 1, &o, &c));
  lp.kind = DTL_TP_COLUMN;
  lp.flags = 0;
  CHECK_ERROR(dtl_tp_linear_create(c, &lp, &l), DTL_ERR_UNSUPPORTED, "f16");
  dtl_tp_context_destroy(c);
}

/* mask holds field-presence bits, flags behaviour bits; any other bit (a behaviour bit in mask included)
 * is rejected, naming the field and the unknown bits. */
static void unknown_or_misplaced_mask_and_flags_bits_are_rejected_naming_the_field(void) {
  float w[64] = {0};
  dtl_tp_linear *l = NULL;
  dtl_tp_linear_params lp = {.mask = DTL_TP_SEQUENCE_PARALLEL, .kind = DTL_TP_COLUMN, .in_features = 2,
                             .out_features = 2, .weight = w};
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &lp, &l), DTL_ERR_INVALID_ARGUMENT,
              "dtl_tp_linear_create: params.mask=0x1 has unknown bits 0x1 (known: DTL_TP_QUANT_WEIGHTS)");
  lp.mask = 0;
  lp.flags = DTL_TP_GATHER_OUTPUT | DTL_BIT(5);
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &lp, &l), DTL_ERR_INVALID_ARGUMENT,
              "params.flags=0x22 has unknown bits 0x20 (known: DTL_TP_SEQUENCE_PARALLEL, DTL_TP_GATHER_OUTPUT, "
              "DTL_TP_SHARDED_WEIGHTS, DTL_TP_FP8_GEMM)");
  dtl_tp_mlp *m = NULL;
  dtl_tp_mlp_params mp = {.flags = DTL_BIT(5), .activation = DTL_TP_ACT_GELU, .hidden = 2, .ffn = 2, .gate_up = w,
                          .down = w};
  CHECK_ERROR(dtl_tp_mlp_create(E.ctx, &mp, &m), DTL_ERR_INVALID_ARGUMENT,
              "dtl_tp_mlp_create: params.flags=0x20 has unknown bits 0x20");
  mp.flags = DTL_TP_GATHER_OUTPUT; /* a bit another struct defines */
  CHECK_ERROR(dtl_tp_mlp_create(E.ctx, &mp, &m), DTL_ERR_INVALID_ARGUMENT, "params.flags=0x2 has unknown bits 0x2");
  dtl_tp_attention *a = NULL;
  dtl_tp_attention_params ap = {.mask = DTL_TP_SEQUENCE_PARALLEL | DTL_TP_SCALE, .hidden = 2, .q_heads = E.tp,
                                .kv_heads = E.tp, .head_dim = 1, .qkv = w, .out = w, .scale = 1};
  CHECK_ERROR(dtl_tp_attention_create(E.ctx, &ap, &a), DTL_ERR_INVALID_ARGUMENT,
              "dtl_tp_attention_create: params.mask=0x5 has unknown bits 0x1 (known: DTL_TP_SCALE, DTL_TP_ROPE, "
              "DTL_TP_QUANT_WEIGHTS)");
  ap.mask = DTL_TP_SCALE;
  ap.flags = DTL_TP_SCALE;
  CHECK_ERROR(dtl_tp_attention_create(E.ctx, &ap, &a), DTL_ERR_INVALID_ARGUMENT,
              "params.flags=0x4 has unknown bits 0x4");
  dtl_tp_embedding *e = NULL;
  dtl_tp_embedding_params ep = {.mask = DTL_BIT(63), .vocab = 4, .hidden = 2, .table = w};
  CHECK_ERROR(dtl_tp_embedding_create(E.ctx, &ep, &e), DTL_ERR_INVALID_ARGUMENT,
              "dtl_tp_embedding_create: params.mask=0x8000000000000000 has unknown bits 0x8000000000000000");
  ep.mask = 0;
  ep.flags = DTL_BIT(1);
  CHECK_ERROR(dtl_tp_embedding_create(E.ctx, &ep, &e), DTL_ERR_INVALID_ARGUMENT,
              "params.flags=0x2 has unknown bits 0x2");
  dtl_tp_context *c = NULL;
  dtl_tp_options o = {.mask = DTL_TP_OPT_DTYPE | DTL_TP_SCALE, .dtype = DTL_FLOAT32};
  CHECK_ERROR(dtl_tp_context_create(E.mesh, 0, &o, &c), DTL_ERR_INVALID_ARGUMENT,
              "dtl_tp_context_create: opt.mask=0xc has unknown bits 0x4 (known: DTL_TP_OPT_DTYPE)");
  o = (dtl_tp_options){.flags = DTL_TP_SEQUENCE_PARALLEL};
  CHECK_ERROR(dtl_tp_context_create(E.mesh, 0, &o, &c), DTL_ERR_INVALID_ARGUMENT, "opt.flags=0x1 has unknown bits 0x1");
  CHECK(l == NULL && m == NULL && a == NULL && e == NULL && c == NULL, "no object on failure");
}

/* Outputs documented as optional may be NULL (all of them: the call only checks its arguments); every other
 * output is required and named when NULL. */
static void optional_outputs_may_be_null_and_required_ones_are_named(void) {
  float w[64] = {0};
  dtl_tp_linear *l = NULL;
  dtl_tp_linear_params lp = {.kind = DTL_TP_COLUMN, .in_features = 4, .out_features = 4, .weight = w};
  CHECK_OK(dtl_tp_linear_create(E.ctx, &lp, &l));
  dtl_layout *in = NULL, *out = NULL;
  CHECK_OK(dtl_tp_linear_layouts(l, 3, NULL, NULL));
  CHECK_ERROR(dtl_tp_linear_layouts(l, -1, NULL, NULL), DTL_ERR_INVALID_ARGUMENT, "tokens=-1");
  CHECK_OK(dtl_tp_linear_layouts(l, 3, &in, NULL));
  CHECK(in != NULL && dtl_layout_local_count(in) == 12, "in layout of [3, 4] R");
  CHECK_OK(dtl_tp_linear_layouts(l, 3, NULL, &out));
  CHECK(out != NULL, "out layout");
  dtl_tp_embedding *e = NULL;
  dtl_tp_embedding_params ep = {.vocab = 4, .hidden = 2, .table = w};
  CHECK_OK(dtl_tp_embedding_create(E.ctx, &ep, &e));
  CHECK_ERROR(dtl_tp_embedding_layout(e, 3, NULL), DTL_ERR_INVALID_ARGUMENT, "dtl_tp_embedding_layout: out=NULL");
  CHECK_ERROR(dtl_tp_split(E.ctx, 5, NULL), DTL_ERR_INVALID_ARGUMENT, "dtl_tp_split: out=NULL");
  CHECK_OK(dtl_tp_attention_heads(E.ctx, E.tp, E.tp, NULL, NULL));
  dtl_tp_range q = {-1, -1};
  CHECK_OK(dtl_tp_attention_heads(E.ctx, 2 * E.tp, E.tp, &q, NULL));
  CHECK(q.offset == 2 * E.rank && q.count == 2, "q heads [%lld, +%lld)", (long long)q.offset, (long long)q.count);
  /* top-k: values are optional, indices are not. */
  dtl_layout *lg = NULL;
  int64_t V = 5, v0, vn, idx[2] = {-7, -7};
  t_chunk(V, E.tp, E.rank, &v0, &vn);
  float logits[5] = {0};
  for (int64_t v = 0; v < vn; v++) logits[v] = (float)(v0 + v == 3);
  CHECK_OK(dtl_tp_activation_layout(E.ctx, 1, V, dtl_shard(1), &lg));
  CHECK_OK(dtl_tp_logits_topk(E.ctx, lg, logits, 2, NULL, idx));
  CHECK(idx[0] == 3 && idx[1] == 0, "top-2 indices %lld %lld (expected 3 0)", (long long)idx[0], (long long)idx[1]);
  dtl_layout_destroy(lg);
  dtl_tp_embedding_destroy(e);
  dtl_layout_destroy(in), dtl_layout_destroy(out);
  dtl_tp_linear_destroy(l);
}

static void token_ids_outside_the_vocabulary_name_the_id_and_position(void) {
  int64_t V = 11, H = 3;
  float *table = t_ints(5, V * H, 3), y[64];
  dtl_tp_embedding *e = NULL;
  dtl_tp_embedding_params p = {.vocab = V, .hidden = H, .table = table};
  CHECK_OK(dtl_tp_embedding_create(E.ctx, &p, &e));
  int64_t ids[5] = {1, 2, 3, 11, 0}, neg[2] = {-1, 4};
  fill(y, 64);
  CHECK_ERROR(dtl_tp_embedding_forward(e, 5, ids, y), DTL_ERR_INVALID_ARGUMENT, "ids[3]=11");
  CHECK(strstr(dtl_last_error(), "0..10") != NULL, "names the valid range: %s", dtl_last_error());
  CHECK_ERROR(dtl_tp_embedding_forward(e, 2, neg, y), DTL_ERR_INVALID_ARGUMENT, "ids[0]=-1");
  CHECK_ERROR(dtl_tp_embedding_forward(e, 2, NULL, y), DTL_ERR_INVALID_ARGUMENT, "ids=NULL");
  CHECK(untouched(y, 64), "y untouched");
  /* The layer still works after the rejections (no collective was left half-done). */
  ids[3] = 10;
  CHECK_OK(dtl_tp_embedding_forward(e, 5, ids, y));
  CHECK(!memcmp(y + 3 * H, table + 10 * H, sizeof(float) * (size_t)H), "lookup after rejection");
  dtl_tp_embedding_destroy(e);
  free(table);
}

static void topk_rejects_k_outside_one_to_vocab(void) {
  int64_t T = 2, V = 5, v0, vn;
  t_chunk(V, E.tp, E.rank, &v0, &vn);
  float lg[10] = {0};
  int64_t idx[16];
  float vals[16];
  for (int i = 0; i < 16; i++) idx[i] = -7;
  dtl_layout *l = NULL, *r = NULL;
  CHECK_OK(dtl_tp_activation_layout(E.ctx, T, V, dtl_shard(1), &l));
  CHECK_OK(dtl_tp_activation_layout(E.ctx, T, V, dtl_replicate(), &r));
  CHECK_ERROR(dtl_tp_logits_topk(E.ctx, l, lg, 0, vals, idx), DTL_ERR_INVALID_ARGUMENT, "k=0");
  CHECK_ERROR(dtl_tp_logits_topk(E.ctx, l, lg, 6, vals, idx), DTL_ERR_INVALID_ARGUMENT, "k=6 (expected 1..vocab=5)");
  CHECK_ERROR(dtl_tp_logits_topk(E.ctx, l, lg, 1, vals, NULL), DTL_ERR_INVALID_ARGUMENT, "indices=NULL");
  CHECK_ERROR(dtl_tp_logits_argmax(E.ctx, r, lg, idx), DTL_ERR_MISMATCH, "logits_layout");
  for (int i = 0; i < 16; i++) CHECK(idx[i] == -7, "indices untouched");
  dtl_layout_destroy(l);
  dtl_layout_destroy(r);
}

int main(int argc, char **argv) {
  t_setup(&argc, &argv, &E);
  RUN(heads_that_cannot_be_split_are_rejected_with_the_numbers);
  RUN(layouts_that_differ_from_what_a_layer_takes_are_a_mismatch);
  RUN(null_weights_and_missing_arguments_are_named);
  RUN(unknown_or_misplaced_mask_and_flags_bits_are_rejected_naming_the_field);
  RUN(optional_outputs_may_be_null_and_required_ones_are_named);
  RUN(token_ids_outside_the_vocabulary_name_the_id_and_position);
  RUN(topk_rejects_k_outside_one_to_vocab);
  t_teardown(&E);
  return dt_finish();
}

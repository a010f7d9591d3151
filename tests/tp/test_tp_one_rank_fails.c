/* SPDX-License-Identifier: Apache-2.0 */
/* One rank's bad argument, missing scratch or different call fails every TP rank, under the watchdog.
 * Creation (context, layers) agrees with or without DTL_CHECK; with DTL_CHECK every forward and
 * communication half checks its arguments and takes its scratch, then agrees, before its first collective
 * (a sequence-parallel forward's all-gather included), so a NULL output on one rank no longer leaves the
 * others in the reduce-scatter. */
#include "common/alloc.h"
#include "dtl.h"
#include "dtl_test_ranks.h"

#define T 8
#define H 8
#define FFN 4
#define VOCAB 8
#define SENTINEL 12345.0f

static dtl_comm *checked, *plain;
static dtl_mesh *mesh, *plain_mesh;
static dtl_tp_context *ctx, *plain_ctx;
static float w[4096], x[T * 64], y[T * 64];

static void arm(void) {
  for (size_t i = 0; i < sizeof y / sizeof *y; i++) y[i] = SENTINEL;
}
static bool untouched(void) {
  for (size_t i = 0; i < sizeof y / sizeof *y; i++)
    if (y[i] != SENTINEL) return false;
  return true;
}

static dtl_layout *act(dtl_tp_context *c, int64_t tokens, int64_t features, dtl_placement p) {
  dtl_layout *l = NULL;
  CHECK_OK(dtl_tp_activation_layout(c, tokens, features, p, &l));
  return l;
}

/* The verified hang: a sequence-parallel block whose output is NULL on one rank returned there, after the
 * all-gather, while the others waited in the reduce-scatter. */
static void forwards_with_a_null_output_on_one_rank_fail_every_rank(void) {
  bool me = dt_rank == dt_bad;
  dtl_tp_linear *col = NULL, *row = NULL, *col_sp = NULL, *row_sp = NULL;
  dtl_tp_mlp *mlp = NULL, *mlp_sp = NULL;
  dtl_tp_attention *attn = NULL, *attn_sp = NULL;
  dtl_tp_linear_params lp = {.kind = DTL_TP_COLUMN, .in_features = H, .out_features = H, .weight = w};
  CHECK_OK(dtl_tp_linear_create(ctx, &lp, &col));
  lp.flags = DTL_TP_SEQUENCE_PARALLEL | DTL_TP_GATHER_OUTPUT;
  CHECK_OK(dtl_tp_linear_create(ctx, &lp, &col_sp));
  lp.kind = DTL_TP_ROW;
  lp.flags = 0;
  CHECK_OK(dtl_tp_linear_create(ctx, &lp, &row));
  lp.flags = DTL_TP_SEQUENCE_PARALLEL;
  CHECK_OK(dtl_tp_linear_create(ctx, &lp, &row_sp));
  dtl_tp_mlp_params mp = {.activation = DTL_TP_ACT_SILU_GATED, .hidden = H, .ffn = FFN, .gate_up = w, .down = w};
  CHECK_OK(dtl_tp_mlp_create(ctx, &mp, &mlp));
  mp.flags = DTL_TP_SEQUENCE_PARALLEL;
  CHECK_OK(dtl_tp_mlp_create(ctx, &mp, &mlp_sp));
  dtl_tp_attention_params ap = {.hidden = H, .q_heads = 4, .kv_heads = 4, .head_dim = 2, .qkv = w, .out = w};
  CHECK_OK(dtl_tp_attention_create(ctx, &ap, &attn));
  ap.flags = DTL_TP_SEQUENCE_PARALLEL;
  CHECK_OK(dtl_tp_attention_create(ctx, &ap, &attn_sp));
  dtl_layout *r = act(ctx, T, H, dtl_replicate()), *s0 = act(ctx, T, H, dtl_shard(0)),
             *s1 = act(ctx, T, H, dtl_shard(1));
  void *out = me ? NULL : y;
  arm();
  dt_expect_every_rank_fails("column", dtl_tp_linear_forward(col, r, x, out), DTL_ERR_INVALID_ARGUMENT, "y=NULL");
  dt_expect_every_rank_fails("column sp", dtl_tp_linear_forward(col_sp, s0, x, out), DTL_ERR_INVALID_ARGUMENT,
                             "y=NULL");
  dt_expect_every_rank_fails("row", dtl_tp_linear_forward(row, s1, x, out), DTL_ERR_INVALID_ARGUMENT, "y=NULL");
  dt_expect_every_rank_fails("row sp", dtl_tp_linear_forward(row_sp, s1, x, out), DTL_ERR_INVALID_ARGUMENT, "y=NULL");
  dt_expect_every_rank_fails("mlp", dtl_tp_mlp_forward(mlp, r, x, out), DTL_ERR_INVALID_ARGUMENT, "y=NULL");
  dt_expect_every_rank_fails("mlp sp", dtl_tp_mlp_forward(mlp_sp, s0, x, out), DTL_ERR_INVALID_ARGUMENT, "y=NULL");
  dt_expect_every_rank_fails("attention", dtl_tp_attention_forward(attn, r, x, out), DTL_ERR_INVALID_ARGUMENT,
                             "y=NULL");
  dt_expect_every_rank_fails("attention sp", dtl_tp_attention_forward(attn_sp, s0, x, out), DTL_ERR_INVALID_ARGUMENT,
                             "y=NULL");
  /* A NULL input, and an input layout of another width, on one rank. */
  dtl_layout *wide = act(ctx, T, H + 1, dtl_shard(0));
  dt_expect_every_rank_fails("x", dtl_tp_mlp_forward(mlp_sp, s0, me ? NULL : x, y), DTL_ERR_INVALID_ARGUMENT, "x=NULL");
  dt_expect_every_rank_fails("layout", dtl_tp_attention_forward(attn_sp, me ? wide : s0, x, y), DTL_ERR_MISMATCH,
                             "x_layout is");
  CHECK(untouched(), "a failed forward wrote y");
  /* A rank with another token count: every rank a mismatch (without the check the counts would disagree). */
  dtl_layout *s0_short = act(ctx, T - 1, H, dtl_shard(0));
  dt_expect_mismatch("tokens", dtl_tp_mlp_forward(mlp_sp, me ? s0_short : s0, x, y));
  CHECK_OK(dtl_tp_mlp_forward(mlp_sp, s0, x, y)); /* and the block still runs */
  dtl_layout *ls[] = {r, s0, s1, wide, s0_short};
  for (size_t i = 0; i < sizeof ls / sizeof *ls; i++) dtl_layout_destroy(ls[i]);
  dtl_tp_linear_destroy(col);
  dtl_tp_linear_destroy(col_sp);
  dtl_tp_linear_destroy(row);
  dtl_tp_linear_destroy(row_sp);
  dtl_tp_mlp_destroy(mlp);
  dtl_tp_mlp_destroy(mlp_sp);
  dtl_tp_attention_destroy(attn);
  dtl_tp_attention_destroy(attn_sp);
}

static void communication_halves_with_a_bad_buffer_on_one_rank_fail_every_rank(void) {
  bool me = dt_rank == dt_bad;
  dtl_layout *r = act(ctx, T, H, dtl_replicate()), *s0 = act(ctx, T, H, dtl_shard(0)),
             *s1 = act(ctx, T, H, dtl_shard(1));
  arm();
  dt_expect_every_rank_fails("reduce", dtl_tp_row_parallel_reduce(ctx, s0, x, NULL, me ? NULL : y),
                             DTL_ERR_INVALID_ARGUMENT, "y=NULL");
  dt_expect_every_rank_fails("reduce layout", dtl_tp_row_parallel_reduce(ctx, me ? NULL : r, x, NULL, y),
                             DTL_ERR_INVALID_ARGUMENT, "out_layout=NULL");
  dt_expect_every_rank_fails("reduce overlap",
                             dtl_tp_row_parallel_reduce(ctx, r, me ? (const void *)(y + 1) : x, NULL, y),
                             DTL_ERR_INVALID_ARGUMENT, "overlap");
  dt_expect_every_rank_fails("column gather", dtl_tp_column_parallel_gather(ctx, s1, x, me ? NULL : y),
                             DTL_ERR_INVALID_ARGUMENT, "y=NULL");
  dt_expect_every_rank_fails("sequence gather", dtl_tp_sequence_gather(ctx, s0, x, me ? NULL : y),
                             DTL_ERR_INVALID_ARGUMENT, "x=NULL");
  CHECK(untouched(), "a failed half wrote y");
  dtl_layout_destroy(r);
  dtl_layout_destroy(s0);
  dtl_layout_destroy(s1);
}

static void embedding_and_top_k_fail_or_mismatch_on_every_rank(void) {
  bool me = dt_rank == dt_bad;
  dtl_tp_embedding *e = NULL;
  dtl_tp_embedding_params ep = {.vocab = VOCAB, .hidden = H, .table = w};
  CHECK_OK(dtl_tp_embedding_create(ctx, &ep, &e));
  int64_t ids[T] = {0, 1, 2, 3, 4, 5, 6, 7}, other[T] = {0, 1, 2, 3, 4, 5, 6, 6},
          out_of_range[T] = {0, 1, 2, 3, 4, 5, 6, VOCAB};
  arm();
  dt_expect_every_rank_fails("ids", dtl_tp_embedding_forward(e, T, me ? out_of_range : ids, y),
                             DTL_ERR_INVALID_ARGUMENT, "outside the vocabulary");
  /* Ids must be equal on every TP rank: other ids would sum rows of different tokens, silently. */
  dt_expect_mismatch("other ids", dtl_tp_embedding_forward(e, T, me ? other : ids, y));
  dtl_layout *logits = act(ctx, T, VOCAB, dtl_shard(1));
  int64_t idx[T * 2];
  dt_expect_every_rank_fails("topk", dtl_tp_logits_topk(ctx, logits, x, 2, NULL, me ? NULL : idx),
                             DTL_ERR_INVALID_ARGUMENT, "indices=NULL");
  dt_expect_mismatch("topk k", dtl_tp_logits_topk(ctx, logits, x, me ? 1 : 2, NULL, idx));
  dtl_layout_destroy(logits);
  dtl_tp_embedding_destroy(e);
}

/* A forward grows its scratch before its first collective: one rank that cannot fails every rank. */
static void a_rank_that_cannot_grow_its_scratch_fails_every_rank(void) {
  bool me = dt_rank == dt_bad;
  dtl_tp_mlp *mlp = NULL;
  dtl_tp_mlp_params mp = {.flags = DTL_TP_SEQUENCE_PARALLEL,
                          .activation = DTL_TP_ACT_GELU,
                          .hidden = H,
                          .ffn = FFN,
                          .gate_up = w,
                          .down = w};
  CHECK_OK(dtl_tp_mlp_create(ctx, &mp, &mlp));
  dtl_layout *big = act(ctx, 4 * T, H, dtl_shard(0)); /* more tokens than any call before: new scratch */
  arm();
  dtl__alloc_hook_reset(me ? 1 : 0, false);
  dtl_status st = dtl_tp_mlp_forward(mlp, big, x, y);
  dtl__alloc_hook_reset(0, false);
  dt_expect_every_rank_fails("scratch", st, DTL_ERR_OUT_OF_MEMORY, "allocate");
  CHECK(untouched(), "a failed forward wrote y");
  CHECK_OK(dtl_tp_mlp_forward(mlp, big, x, y));
  dtl_layout_destroy(big);
  dtl_tp_mlp_destroy(mlp);
}

/* Creation agrees without DTL_CHECK too: a rank's bad weight, missing output or memory fails every rank. */
static void creation_fails_every_rank_without_dtl_check(void) {
  bool me = dt_rank == dt_bad;
  dtl_tp_context *c2 = NULL;
  dt_expect_every_rank_fails("context", dtl_tp_context_create(plain_mesh, me ? 1 : 0, NULL, &c2),
                             DTL_ERR_INVALID_ARGUMENT, "tp_dim=1");
  CHECK(c2 == NULL, "a failed creation returned a context");
  dtl_tp_linear *l = NULL;
  dtl_tp_linear_params lp = {.kind = DTL_TP_COLUMN, .in_features = H, .out_features = H, .weight = me ? NULL : w};
  dt_expect_every_rank_fails("linear", dtl_tp_linear_create(plain_ctx, &lp, &l), DTL_ERR_INVALID_ARGUMENT,
                             "weight=NULL");
  lp.weight = w;
  dt_expect_every_rank_fails("linear out", dtl_tp_linear_create(plain_ctx, &lp, me ? NULL : &l),
                             DTL_ERR_INVALID_ARGUMENT, "out=NULL");
  dtl_tp_mlp *m = NULL;
  dtl_tp_mlp_params mp = {.activation = DTL_TP_ACT_GELU, .hidden = H, .ffn = FFN, .gate_up = w, .down = me ? NULL : w};
  dt_expect_every_rank_fails("mlp", dtl_tp_mlp_create(plain_ctx, &mp, &m), DTL_ERR_INVALID_ARGUMENT, "down=NULL");
  dtl_tp_attention *a = NULL;
  dtl_tp_attention_params ap = {
      .hidden = H, .q_heads = 4, .kv_heads = 4, .head_dim = 2, .qkv = me ? NULL : w, .out = w};
  dt_expect_every_rank_fails("attention", dtl_tp_attention_create(plain_ctx, &ap, &a), DTL_ERR_INVALID_ARGUMENT,
                             "qkv=NULL");
  dtl_tp_embedding *e = NULL;
  dtl_tp_embedding_params ep = {.vocab = VOCAB, .hidden = H, .table = me ? NULL : w};
  dt_expect_every_rank_fails("embedding", dtl_tp_embedding_create(plain_ctx, &ep, &e), DTL_ERR_INVALID_ARGUMENT,
                             "table=NULL");
  /* Memory: the layer struct (allocation 1) or its weight shard (allocation 2) on one rank. */
  for (uint64_t at = 1; at <= 2; at++) {
    dtl__alloc_hook_reset(me ? at : 0, false);
    dtl_status st = dtl_tp_linear_create(plain_ctx, &lp, &l);
    dtl__alloc_hook_reset(0, false);
    dt_expect_every_rank_fails("linear memory", st, DTL_ERR_OUT_OF_MEMORY, "memory");
  }
  CHECK(l == NULL && m == NULL && a == NULL && e == NULL, "a failed creation returned a layer");
}

/* Layer creation agrees on its whole call, DTL_CHECK or not: each argument that shapes a layer, changed alone on
 * one rank (every value valid on its own), makes every rank fail with DTL_ERR_MISMATCH and keep no layer. */
static void creation_with_one_argument_changed_on_one_rank_is_a_mismatch_on_every_rank(void) {
  bool me = dt_rank == dt_bad;
  char call[64];
  static const char *const linear_args[] = {"kind", "in_features", "out_features", "sequence parallel",
                                            "gather output", "sharded weights", "bias"};
  for (int i = 0; i < 7; i++) {
    dtl_tp_linear_params lp = {.kind = DTL_TP_COLUMN, .in_features = H, .out_features = H, .weight = w};
    if (me && i == 0) lp.kind = DTL_TP_ROW;
    if (me && i == 1) lp.in_features = H / 2;
    if (me && i == 2) lp.out_features = 2 * H;
    if (me && i == 3) lp.flags = DTL_TP_SEQUENCE_PARALLEL;
    if (me && i == 4) lp.flags = DTL_TP_GATHER_OUTPUT;
    if (me && i == 5) lp.flags = DTL_TP_SHARDED_WEIGHTS;
    if (me && i == 6) lp.bias = w;
    dtl_tp_linear *l = NULL;
    snprintf(call, sizeof call, "linear, %s", linear_args[i]);
    dt_expect_mismatch(call, dtl_tp_linear_create(plain_ctx, &lp, &l));
    CHECK(dt_size == 1 || l == NULL, "%s: a layer was kept", call);
    dtl_tp_linear_destroy(l);
  }
  static const char *const mlp_args[] = {"activation", "hidden", "ffn", "sequence parallel", "sharded weights",
                                         "gate_up_bias", "down_bias"};
  for (int i = 0; i < 7; i++) {
    dtl_tp_mlp_params mp = {.activation = DTL_TP_ACT_GELU, .hidden = H, .ffn = FFN, .gate_up = w, .down = w};
    if (me && i == 0) mp.activation = DTL_TP_ACT_SILU_GATED;
    if (me && i == 1) mp.hidden = H / 2;
    if (me && i == 2) mp.ffn = 2 * FFN;
    if (me && i == 3) mp.flags = DTL_TP_SEQUENCE_PARALLEL;
    if (me && i == 4) mp.flags = DTL_TP_SHARDED_WEIGHTS;
    if (me && i == 5) mp.gate_up_bias = w;
    if (me && i == 6) mp.down_bias = w;
    dtl_tp_mlp *m = NULL;
    snprintf(call, sizeof call, "mlp, %s", mlp_args[i]);
    dt_expect_mismatch(call, dtl_tp_mlp_create(plain_ctx, &mp, &m));
    CHECK(dt_size == 1 || m == NULL, "%s: a layer was kept", call);
    dtl_tp_mlp_destroy(m);
  }
  static const char *const attn_args[] = {"hidden", "q_heads", "kv_heads", "head_dim", "scale", "rope",
                                          "sequence parallel", "sharded weights", "qkv_bias", "out_bias"};
  for (int i = 0; i < 10; i++) {
    dtl_tp_attention_params ap = {.hidden = H, .q_heads = 4, .kv_heads = 4, .head_dim = 2, .qkv = w, .out = w};
    if (me && i == 0) ap.hidden = H / 2;
    if (me && i == 1) ap.q_heads = 8;
    if (me && i == 2) ap.kv_heads = 2, ap.q_heads = 4;
    if (me && i == 3) ap.head_dim = 4;
    if (me && i == 4) ap.mask = DTL_TP_SCALE, ap.scale = 0.125f;
    if (me && i == 5) ap.mask = DTL_TP_ROPE, ap.rope_theta = 10000.0f;
    if (me && i == 6) ap.flags = DTL_TP_SEQUENCE_PARALLEL;
    if (me && i == 7) ap.flags = DTL_TP_SHARDED_WEIGHTS;
    if (me && i == 8) ap.qkv_bias = w;
    if (me && i == 9) ap.out_bias = w;
    dtl_tp_attention *a = NULL;
    snprintf(call, sizeof call, "attention, %s", attn_args[i]);
    dtl_status st = dtl_tp_attention_create(plain_ctx, &ap, &a);
    /* kv_heads 2 does not split over more than 2 ranks: that rank's own error then, not a mismatch */
    if (i == 2 && dt_size > 2) {
      CHECK(st != DTL_OK, "%s: %s", call, dtl_status_name(st));
    } else {
      dt_expect_mismatch(call, st);
    }
    CHECK(dt_size == 1 || a == NULL, "%s: a layer was kept", call);
    dtl_tp_attention_destroy(a);
  }
  static const char *const emb_args[] = {"vocab", "hidden", "sequence parallel", "sharded weights"};
  for (int i = 0; i < 4; i++) {
    dtl_tp_embedding_params ep = {.vocab = VOCAB, .hidden = H, .table = w};
    if (me && i == 0) ep.vocab = 2 * VOCAB;
    if (me && i == 1) ep.hidden = H / 2;
    if (me && i == 2) ep.flags = DTL_TP_SEQUENCE_PARALLEL;
    if (me && i == 3) ep.flags = DTL_TP_SHARDED_WEIGHTS;
    dtl_tp_embedding *e = NULL;
    snprintf(call, sizeof call, "embedding, %s", emb_args[i]);
    dt_expect_mismatch(call, dtl_tp_embedding_create(plain_ctx, &ep, &e));
    CHECK(dt_size == 1 || e == NULL, "%s: a layer was kept", call);
    dtl_tp_embedding_destroy(e);
  }
  dtl_tp_attention_params ap = {.hidden = H, .q_heads = 4, .kv_heads = 4, .head_dim = 2, .qkv = w, .out = w};
  dtl_tp_attention *a = NULL;
  REQUIRE_OK(dtl_tp_attention_create(plain_ctx, &ap, &a));
  dtl_tp_kv_cache *kc = NULL;
  dt_expect_mismatch("kv cache, max_tokens", dtl_tp_kv_cache_create(a, me ? 2 * T : T, &kc));
  dtl_tp_kv_cache_destroy(kc);
  dtl_tp_attention_destroy(a);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  dt_watchdog_s = 30;
  dt_ranks_init();
  if (dt_size > 4) return dt_skip("the attention heads here split over at most 4 ranks");
  for (size_t i = 0; i < sizeof w / sizeof *w; i++) w[i] = (float)(i % 7) - 3.0f;
  for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = (float)(i % 5) - 2.0f;
  int shape[1] = {dt_size};
  checked = dt_comm_with_check(true);
  plain = dt_comm_with_check(false);
  int ok = checked && plain;
  ok = ok && dtl_mesh_create(checked, 1, shape, &mesh) == DTL_OK &&
       dtl_mesh_create(plain, 1, shape, &plain_mesh) == DTL_OK;
  ok = ok && dtl_tp_context_create(mesh, 0, NULL, &ctx) == DTL_OK;
  ok = ok && dtl_tp_context_create(plain_mesh, 0, NULL, &plain_ctx) == DTL_OK;
  if (!ok) return dt_skip(dtl_last_error());
  RUN(forwards_with_a_null_output_on_one_rank_fail_every_rank);
  RUN(communication_halves_with_a_bad_buffer_on_one_rank_fail_every_rank);
  RUN(embedding_and_top_k_fail_or_mismatch_on_every_rank);
  RUN(a_rank_that_cannot_grow_its_scratch_fails_every_rank);
  RUN(creation_fails_every_rank_without_dtl_check);
  RUN(creation_with_one_argument_changed_on_one_rank_is_a_mismatch_on_every_rank);
  dtl_tp_context_destroy(ctx);
  dtl_tp_context_destroy(plain_ctx);
  dtl_mesh_destroy(mesh);
  dtl_mesh_destroy(plain_mesh);
  dtl_comm_destroy(checked);
  dtl_comm_destroy(plain);
  return dt_finish();
}

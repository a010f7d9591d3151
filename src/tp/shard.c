/* SPDX-License-Identifier: Apache-2.0 */
/* Which piece of each dim a TP rank owns (torch.chunk through the layout math; whole attention heads with
 * grouped-query replication) and the copies that cut this rank's shard out of a dense checkpoint weight. */
#include "attn/attn.h"
#include "tp/tp_internal.h"

dtl_status dtl_tp_split(const dtl_tp_context *ctx, int64_t n, dtl_tp_range *out) {
  static const char fn[] = "dtl_tp_split";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_CHECK_ARG(n >= 0, fn, "n=%lld (expected >= 0)", (long long)n);
  *out = dtl__tp_chunk(ctx, n, ctx->rank);
  return DTL_OK;
}

dtl_status dtl__tp_heads(const dtl_tp_context *ctx, const char *fn, int64_t q_heads, int64_t kv_heads, int r,
                         dtl_tp_range *q, dtl_tp_range *kv) {
  dtl__attn_range qr, kr;
  DTL_TRY(dtl__attn_heads(fn, "tp", q_heads, kv_heads, ctx->size, r, &qr, &kr));
  if (q) *q = (dtl_tp_range){qr.offset, qr.count};
  if (kv) *kv = (dtl_tp_range){kr.offset, kr.count};
  return DTL_OK;
}

dtl_status dtl_tp_attention_heads(const dtl_tp_context *ctx, int64_t q_heads, int64_t kv_heads, dtl_tp_range *q,
                                  dtl_tp_range *kv) {
  DTL_CHECK_ARG(ctx != NULL, "dtl_tp_attention_heads", "ctx=NULL");
  return dtl__tp_heads(ctx, "dtl_tp_attention_heads", q_heads, kv_heads, ctx->rank, q, kv);
}

dtl_status dtl__tp_pack_rows(const dtl_tp_context *ctx, const void *src, int64_t src_rows, int64_t ld,
                             const dtl__tp_rows *ranges, int nranges, int64_t col_off, int64_t cols, void *dst) {
  int64_t dst_rows = 0;
  for (int i = 0; i < nranges; i++) dst_rows += ranges[i].rows;
  int64_t at = 0;
  for (int i = 0; i < nranges; i++) {
    if (ranges[i].rows == 0 || cols == 0) continue;
    dtl__box_copy b = {.ndim = 2, .elem_size = ctx->elem};
    b.extent[0] = ranges[i].rows;
    b.extent[1] = cols;
    b.src_shape[0] = src_rows;
    b.src_shape[1] = ld;
    b.src_off[0] = ranges[i].row_off;
    b.src_off[1] = col_off;
    b.dst_shape[0] = dst_rows;
    b.dst_shape[1] = cols;
    b.dst_off[0] = at;
    b.dst_off[1] = 0;
    DTL_TRY(dtl__mem_copy_box(&ctx->comm->mem, src, dst, &b));
    at += ranges[i].rows;
  }
  return DTL_OK;
}

/* Shared checks of the public shard functions: dims >= 0, the weight and shard present unless empty. */
static dtl_status dtl__tp_shard_args(const char *fn, const dtl_tp_context *ctx, const void *w, int64_t rows, int64_t cols,
                                     const void *shard, size_t shard_count) {
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  size_t n;
  DTL_TRY(dtl__tp_count(fn, "weight", rows, cols, &n));
  DTL_CHECK_ARG(w != NULL || n == 0, fn, "w=NULL");
  DTL_CHECK_ARG(shard != NULL || shard_count == 0, fn, "shard=NULL");
  return DTL_OK;
}

dtl_status dtl_tp_weight_shard_column(const dtl_tp_context *ctx, const void *w, int64_t out, int64_t in, void *shard) {
  static const char fn[] = "dtl_tp_weight_shard_column";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl_tp_range r = dtl__tp_chunk(ctx, out < 0 ? 0 : out, ctx->rank);
  DTL_TRY(dtl__tp_shard_args(fn, ctx, w, out, in, shard, (size_t)(r.count * (in < 0 ? 0 : in))));
  dtl__tp_rows rows = {r.offset, r.count};
  return dtl__tp_pack_rows(ctx, w, out, in, &rows, 1, 0, in, shard);
}

dtl_status dtl_tp_weight_shard_row(const dtl_tp_context *ctx, const void *w, int64_t out, int64_t in, void *shard) {
  static const char fn[] = "dtl_tp_weight_shard_row";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl_tp_range r = dtl__tp_chunk(ctx, in < 0 ? 0 : in, ctx->rank);
  DTL_TRY(dtl__tp_shard_args(fn, ctx, w, out, in, shard, (size_t)(r.count * (out < 0 ? 0 : out))));
  dtl__tp_rows rows = {0, out};
  return dtl__tp_pack_rows(ctx, w, out, in, &rows, 1, r.offset, r.count, shard);
}

dtl_status dtl__tp_qkv_rows(const dtl_tp_context *ctx, const char *fn, int64_t q_heads, int64_t kv_heads,
                           int64_t head_dim, dtl__tp_rows *rows) {
  dtl_tp_range q, kv;
  DTL_CHECK_ARG(head_dim >= 1, fn, "head_dim=%lld (expected >= 1)", (long long)head_dim);
  DTL_TRY(dtl__tp_heads(ctx, fn, q_heads, kv_heads, ctx->rank, &q, &kv));
  rows[0] = (dtl__tp_rows){q.offset * head_dim, q.count * head_dim};
  rows[1] = (dtl__tp_rows){(q_heads + kv.offset) * head_dim, kv.count * head_dim};
  rows[2] = (dtl__tp_rows){(q_heads + kv_heads + kv.offset) * head_dim, kv.count * head_dim};
  return DTL_OK;
}

dtl_status dtl_tp_weight_shard_qkv(const dtl_tp_context *ctx, const void *w, int64_t q_heads, int64_t kv_heads,
                                   int64_t head_dim, int64_t in, void *shard) {
  static const char fn[] = "dtl_tp_weight_shard_qkv";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl__tp_rows rows[3] = {{0, 0}, {0, 0}, {0, 0}};
  DTL_TRY(dtl__tp_qkv_rows(ctx, fn, q_heads, kv_heads, head_dim, rows));
  int64_t total = (q_heads + 2 * kv_heads) * head_dim;
  int64_t shard_rows = rows[0].rows + rows[1].rows + rows[2].rows;
  DTL_TRY(dtl__tp_shard_args(fn, ctx, w, total, in, shard, (size_t)(shard_rows * (in < 0 ? 0 : in))));
  return dtl__tp_pack_rows(ctx, w, total, in, rows, 3, 0, in, shard);
}

dtl_status dtl_tp_weight_shard_attention_out(const dtl_tp_context *ctx, const void *w, int64_t q_heads,
                                             int64_t kv_heads, int64_t head_dim, int64_t out, void *shard) {
  static const char fn[] = "dtl_tp_weight_shard_attention_out";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl_tp_range q;
  DTL_TRY(dtl__tp_heads(ctx, fn, q_heads, kv_heads, ctx->rank, &q, NULL));
  DTL_CHECK_ARG(head_dim >= 1, fn, "head_dim=%lld (expected >= 1)", (long long)head_dim);
  int64_t in = q_heads * head_dim;
  DTL_TRY(dtl__tp_shard_args(fn, ctx, w, out, in, shard, (size_t)(q.count * head_dim * (out < 0 ? 0 : out))));
  dtl__tp_rows rows = {0, out};
  return dtl__tp_pack_rows(ctx, w, out, in, &rows, 1, q.offset * head_dim, q.count * head_dim, shard);
}

dtl_status dtl_tp_weight_shard_gate_up(const dtl_tp_context *ctx, const void *w, int64_t ffn, int64_t in, void *shard) {
  static const char fn[] = "dtl_tp_weight_shard_gate_up";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(ffn >= 0, fn, "ffn=%lld (expected >= 0)", (long long)ffn);
  dtl_tp_range r = dtl__tp_chunk(ctx, ffn, ctx->rank);
  DTL_TRY(dtl__tp_shard_args(fn, ctx, w, 2 * ffn, in, shard, (size_t)(2 * r.count * (in < 0 ? 0 : in))));
  dtl__tp_rows rows[2] = {{r.offset, r.count}, {ffn + r.offset, r.count}};
  return dtl__tp_pack_rows(ctx, w, 2 * ffn, in, rows, 2, 0, in, shard);
}

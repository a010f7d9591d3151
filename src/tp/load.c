/* SPDX-License-Identifier: Apache-2.0 */
/* TP weight shards read straight from a safetensors checkpoint: the same row ranges and column slices that
 * shard.c cuts out of a dense array, each read from the file by the checkpoint's box reader into the
 * context's memory, so that a rank reads (and holds) only its shard. */
#include <string.h>
#include "checkpoint/checkpoint_internal.h"
#include "tp/tp_internal.h"

/* One tensor of the file that a shard is cut from: it must be [rows, cols] (or [rows] when cols == 1, a
 * bias); the shard takes the listed row ranges, columns [col_off, col_off + ncols), in order. */
typedef struct {
  const char *name;
  int64_t rows, cols;
  dtl__tp_rows ranges[3];
  int nranges;
  int64_t col_off, ncols;
  const dtl__st_tensor *t;
} dtl__tp_src;

/* Checks every source (present, the context's dtype, the stated shape) and the shard pointer, then reads. */
static dtl_status dtl__tp_read(const dtl_tp_context *ctx, const char *fn, const dtl_safetensors *f, dtl__tp_src *src,
                               int n, void *shard) {
  DTL_CHECK_ARG(f != NULL, fn, "file=NULL");
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    dtl__tp_src *s = &src[i];
    DTL_TRY(dtl__st_find(f, fn, s->name, &s->t));
    DTL_TRY(dtl__st_check_dtype(f, fn, s->t, ctx->dtype));
    const dtl__st_tensor *t = s->t;
    bool ok = (t->ndim == 2 && t->shape[0] == s->rows && t->shape[1] == s->cols) ||
              (s->cols == 1 && t->ndim == 1 && t->shape[0] == s->rows);
    if (!ok) {
      char q[96], a[160];
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: tensor \"%s\": shape=%s in the file, expected [%lld,%lld]%s",
                           f->path, dtl__st_quote(t->name, q, sizeof q), dtl__st_shape_str(t->ndim, t->shape, a, sizeof a),
                           (long long)s->rows, (long long)s->cols, s->cols == 1 ? " or a 1-D bias" : "");
    }
    for (int r = 0; r < s->nranges; r++) total += (size_t)(s->ranges[r].rows * s->ncols);
  }
  DTL_CHECK_ARG(shard != NULL || total == 0, fn, "shard=NULL");
  dtl_comm *dev = dtl__tp_on_device(ctx) ? ctx->comm : NULL;
  char *at = shard;
  for (int i = 0; i < n; i++)
    for (int r = 0; r < src[i].nranges; r++) {
      const dtl__tp_src *s = &src[i];
      int64_t view[2] = {s->rows, s->cols}, off[2] = {s->ranges[r].row_off, s->col_off},
              box[2] = {s->ranges[r].rows, s->ncols};
      DTL_TRY(dtl__st_read_box(f, fn, s->t, 2, view, off, box, dev, at));
      at += (size_t)(box[0] * box[1]) * ctx->elem;
    }
  return DTL_OK;
}

dtl_status dtl_tp_weight_read_column(const dtl_tp_context *ctx, const dtl_safetensors *f, const char *name, int64_t out,
                                     int64_t in, void *shard) {
  static const char fn[] = "dtl_tp_weight_read_column";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  size_t n;
  DTL_TRY(dtl__tp_count(fn, "weight", out, in, &n));
  dtl_tp_range r = dtl__tp_chunk(ctx, out, ctx->rank);
  dtl__tp_src s = {name, out, in, {{r.offset, r.count}}, 1, 0, in, NULL};
  return dtl__tp_read(ctx, fn, f, &s, 1, shard);
}

dtl_status dtl_tp_weight_read_row(const dtl_tp_context *ctx, const dtl_safetensors *f, const char *name, int64_t out,
                                  int64_t in, void *shard) {
  static const char fn[] = "dtl_tp_weight_read_row";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  size_t n;
  DTL_TRY(dtl__tp_count(fn, "weight", out, in, &n));
  dtl_tp_range r = dtl__tp_chunk(ctx, in, ctx->rank);
  dtl__tp_src s = {name, out, in, {{0, out}}, 1, r.offset, r.count, NULL};
  return dtl__tp_read(ctx, fn, f, &s, 1, shard);
}

dtl_status dtl_tp_weight_read_qkv(const dtl_tp_context *ctx, const dtl_safetensors *f, const char *q, const char *k,
                                  const char *v, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t in,
                                  void *shard) {
  static const char fn[] = "dtl_tp_weight_read_qkv";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG((k == NULL) == (v == NULL), fn, "k=%s v=%s (give both for separate q, k, v tensors, or neither for a fused q)",
                k ? "given" : "NULL", v ? "given" : "NULL");
  int64_t qn, kn, kn2, total;
  DTL_CHECK_ARG(dtl__mul_i64(q_heads, head_dim, &qn) && dtl__mul_i64(kv_heads, head_dim, &kn) &&
                    dtl__mul_i64(kn, 2, &kn2) && !__builtin_add_overflow(qn, kn2, &total),
                fn, "q_heads=%lld kv_heads=%lld head_dim=%lld overflow the row count", (long long)q_heads,
                (long long)kv_heads, (long long)head_dim);
  dtl__tp_rows rows[3] = {{0, 0}, {0, 0}, {0, 0}};
  DTL_TRY(dtl__tp_qkv_rows(ctx, fn, q_heads, kv_heads, head_dim, rows));
  size_t n;
  DTL_TRY(dtl__tp_count(fn, "qkv", total, in, &n));
  if (!k) {
    dtl__tp_src s = {q, total, in, {rows[0], rows[1], rows[2]}, 3, 0, in, NULL};
    return dtl__tp_read(ctx, fn, f, &s, 1, shard);
  }
  dtl__tp_src s[3] = {
      {q, qn, in, {rows[0]}, 1, 0, in, NULL},
      {k, kn, in, {{rows[1].row_off - qn, rows[1].rows}}, 1, 0, in, NULL},
      {v, kn, in, {{rows[2].row_off - qn - kn, rows[2].rows}}, 1, 0, in, NULL},
  };
  return dtl__tp_read(ctx, fn, f, s, 3, shard);
}

dtl_status dtl_tp_weight_read_attention_out(const dtl_tp_context *ctx, const dtl_safetensors *f, const char *name,
                                            int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t out,
                                            void *shard) {
  static const char fn[] = "dtl_tp_weight_read_attention_out";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl_tp_range q;
  DTL_TRY(dtl__tp_heads(ctx, fn, q_heads, kv_heads, ctx->rank, &q, NULL));
  DTL_CHECK_ARG(head_dim >= 1, fn, "head_dim=%lld (expected >= 1)", (long long)head_dim);
  int64_t in;
  DTL_CHECK_ARG(dtl__mul_i64(q_heads, head_dim, &in), fn, "q_heads=%lld head_dim=%lld overflow the column count",
                (long long)q_heads, (long long)head_dim);
  size_t n;
  DTL_TRY(dtl__tp_count(fn, "weight", out, in, &n));
  dtl__tp_src s = {name, out, in, {{0, out}}, 1, q.offset * head_dim, q.count * head_dim, NULL};
  return dtl__tp_read(ctx, fn, f, &s, 1, shard);
}

dtl_status dtl_tp_weight_read_gate_up(const dtl_tp_context *ctx, const dtl_safetensors *f, const char *gate,
                                      const char *up, int64_t ffn, int64_t in, void *shard) {
  static const char fn[] = "dtl_tp_weight_read_gate_up";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(ffn >= 0 && ffn <= INT64_MAX / 2, fn, "ffn=%lld (expected >= 0)", (long long)ffn);
  size_t n;
  DTL_TRY(dtl__tp_count(fn, "gate_up", 2 * ffn, in, &n));
  dtl_tp_range r = dtl__tp_chunk(ctx, ffn, ctx->rank);
  if (!up) {
    dtl__tp_src s = {gate, 2 * ffn, in, {{r.offset, r.count}, {ffn + r.offset, r.count}}, 2, 0, in, NULL};
    return dtl__tp_read(ctx, fn, f, &s, 1, shard);
  }
  dtl__tp_src s[2] = {{gate, ffn, in, {{r.offset, r.count}}, 1, 0, in, NULL},
                      {up, ffn, in, {{r.offset, r.count}}, 1, 0, in, NULL}};
  return dtl__tp_read(ctx, fn, f, s, 2, shard);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The tensor-parallel attention block: fused QKV column-parallel by whole heads, causal scaled-dot-product
 * attention of this rank's heads (each q head with the kv head of its group, replicated when tp > kv_heads)
 * by the attention core (src/attn), the output projection row-parallel over those heads, and one reduction
 * out (one gather in with sequence parallelism). */
#include <math.h>
#include <stdlib.h>
#include "attn/attn.h"
#include "tp/tp_internal.h"

struct dtl_tp_attention {
  dtl_tp_context *ctx;
  bool sp;
  int64_t hidden, q_heads, kv_heads, head_dim, group;
  dtl_tp_range q, kv; /* this rank's heads */
  float scale;
  dtl__tp_proj qkv, out;
};

static dtl_placement dtl__tp_attn_p(const dtl_tp_attention *a) { return a->sp ? dtl_shard(0) : dtl_replicate(); }

dtl_status dtl_tp_attention_create(dtl_tp_context *ctx, const dtl_tp_attention_params *p, dtl_tp_attention **out) {
  static const char fn[] = "dtl_tp_attention_create";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(p != NULL, fn, "params=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_TRY(dtl__tp_check_bits(fn, "params", p->mask, DTL__BITS(DTL_TP_SCALE), p->flags,
                             DTL__BITS(DTL_TP_SEQUENCE_PARALLEL, DTL_TP_SHARDED_WEIGHTS)));
  DTL_CHECK_ARG(p->hidden >= 1 && p->head_dim >= 1, fn, "hidden=%lld head_dim=%lld (expected >= 1)",
                (long long)p->hidden, (long long)p->head_dim);
  dtl_tp_range q, kv;
  DTL_TRY(dtl__tp_heads(ctx, fn, p->q_heads, p->kv_heads, ctx->rank, &q, &kv));
  DTL_CHECK_ARG(p->qkv != NULL, fn, "qkv=NULL (the fused [(q_heads + 2 kv_heads) * head_dim, hidden] weight is required)");
  DTL_CHECK_ARG(p->out != NULL, fn, "out=NULL (the [hidden, q_heads * head_dim] output weight is required)");
  DTL_CHECK_ARG(!(p->mask & DTL_TP_SCALE) || isfinite(p->scale), fn, "scale=%g (expected a finite number)",
                (double)p->scale);
  DTL_TRY(dtl__tp_check_compute(ctx, fn));
  size_t n;
  DTL_TRY(dtl__tp_count(fn, "qkv", (p->q_heads + 2 * p->kv_heads) * p->head_dim, p->hidden, &n));
  dtl_tp_attention *a = dtl__calloc(1, sizeof *a);
  if (!a) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  a->ctx = ctx;
  a->sp = (p->flags & DTL_TP_SEQUENCE_PARALLEL) != 0;
  a->hidden = p->hidden;
  a->q_heads = p->q_heads;
  a->kv_heads = p->kv_heads;
  a->head_dim = p->head_dim;
  a->group = p->q_heads / p->kv_heads;
  a->q = q;
  a->kv = kv;
  a->scale = (p->mask & DTL_TP_SCALE) ? p->scale : 1.0f / sqrtf((float)p->head_dim);
  int64_t D = p->head_dim;
  dtl__tp_rows rows[3] = {{0, 0}, {0, 0}, {0, 0}};
  dtl_status st;
  DTL_TRY_GOTO(dtl__tp_qkv_rows(ctx, fn, p->q_heads, p->kv_heads, D, rows), st, fail);
  dtl__tp_rows all = {0, p->hidden};
  bool sharded = (p->flags & DTL_TP_SHARDED_WEIGHTS) != 0;
  DTL_TRY_GOTO(dtl__tp_proj_init(ctx, fn, &a->qkv, sharded, p->qkv, p->hidden, rows, 3, 0, p->hidden, p->qkv_bias), st, fail);
  DTL_TRY_GOTO(dtl__tp_proj_init(ctx, fn, &a->out, sharded, p->out, p->q_heads * D, &all, 1, q.offset * D, q.count * D,
                                 p->out_bias), st, fail);
  *out = a;
  return DTL_OK;
fail:
  dtl_tp_attention_destroy(a);
  return st;
}

dtl_status dtl_tp_attention_layouts(const dtl_tp_attention *a, int64_t tokens, dtl_layout **in, dtl_layout **out) {
  DTL_CHECK_ARG(a != NULL, "dtl_tp_attention_layouts", "block=NULL");
  return dtl__tp_layouts(a->ctx, "dtl_tp_attention_layouts", tokens, a->hidden, dtl__tp_attn_p(a), a->hidden,
                         dtl__tp_attn_p(a), in, out);
}

/* attn[T, q.count * D] of this rank's q heads from qkv [T, width] (q heads, then k heads, then v heads of
 * each token), on the host or the device: causal self-attention of tokens 0..T-1. */
static dtl_status dtl__tp_attend(dtl_tp_attention *a, const void *qkv, int64_t T, void *attn) {
  dtl_tp_context *ctx = a->ctx;
  int64_t D = a->head_dim, qn = a->q.count, kn = a->kv.count, W = a->qkv.rows;
  dtl__attn_shape s = {.tq = T, .tk = T, .qn = qn, .kn = kn, .head_dim = D, .q_off = a->q.offset,
                       .kv_off = a->kv.offset, .group = a->group, .ldq = W, .ldk = W, .ldv = W, .ldo = qn * D,
                       .causal = true, .scale = a->scale};
  if (T == 0 || qn == 0) return DTL_OK;
  size_t e = ctx->elem;
  const char *k = (const char *)qkv + (size_t)(qn * D) * e, *v = k + (size_t)(kn * D) * e;
  bool dev = dtl__tp_on_device(ctx);
  size_t bytes = dtl__attn_scratch_bytes(&s, dev ? DTL_MEMORY_DEVICE : DTL_MEMORY_HOST);
  void *scratch;
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_AUX, bytes, &scratch));
#if DTL_HAVE_NCCL
  if (dev) return dtl__attn_cuda(&s, qkv, k, v, attn, NULL, scratch, bytes, ctx->dtype, ctx->gemm.stream);
#endif
  return dtl__attn_host(&ctx->gemm, &s, qkv, (const float *)k, (const float *)v, attn, NULL, scratch, bytes);
}

dtl_status dtl_tp_attention_forward(dtl_tp_attention *a, const dtl_layout *x_layout, const void *x, void *y) {
  static const char fn[] = "dtl_tp_attention_forward";
  DTL_CHECK_ARG(a != NULL, fn, "block=NULL");
  dtl_tp_context *ctx = a->ctx;
  int64_t T;
  const void *xin;
  DTL_TRY(dtl__tp_input(ctx, fn, x_layout, a->hidden, dtl__tp_attn_p(a), x, &T, &xin));
  DTL_CHECK_ARG(y != NULL || dtl_layout_local_count(x_layout) == 0, fn, "y=NULL");
  size_t e = ctx->elem;
  int64_t width = a->qkv.rows, attn_w = a->out.cols;
  void *qkv, *attn, *partial;
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_MID, (size_t)(T * width) * e, &qkv));
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_ATTN, (size_t)(T * attn_w) * e, &attn));
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_PARTIAL, (size_t)(T * a->hidden) * e, &partial));
  DTL_TRY(dtl__tp_proj_apply(ctx, &a->qkv, true, T, xin, a->hidden, qkv, width));
  DTL_TRY(dtl__tp_attend(a, qkv, T, attn));
  DTL_TRY(dtl__tp_proj_apply(ctx, &a->out, false, T, attn, attn_w, partial, a->hidden));
  return dtl__tp_reduce(ctx, T, a->hidden, a->sp, partial, a->out.bias, y);
}

void dtl_tp_attention_destroy(dtl_tp_attention *a) {
  if (!a) return;
  dtl__tp_proj_fini(a->ctx, &a->qkv);
  dtl__tp_proj_fini(a->ctx, &a->out);
  dtl__free(a);
}

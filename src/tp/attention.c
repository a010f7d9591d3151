/* SPDX-License-Identifier: Apache-2.0 */
/* The tensor-parallel attention block: fused QKV column-parallel by whole heads, rotary embedding of q and k
 * (src/attn/rope.h), causal scaled-dot-product attention of this rank's heads (each q head with the kv head of
 * its group, replicated when tp > kv_heads) by the attention core (src/attn), the output projection
 * row-parallel over those heads, and one reduction out (one gather in with sequence parallelism); and the KV
 * cache of this rank's kv heads that a cached forward appends to and attends over. */
#include <math.h>
#include <stdlib.h>
#include "attn/attn.h"
#include "attn/rope.h"
#include "comm/agree.h"
#include "tp/tp_internal.h"

struct dtl_tp_attention {
  dtl_tp_context *ctx;
  bool sp;
  int64_t hidden, q_heads, kv_heads, head_dim, group;
  dtl_tp_range q, kv; /* this rank's heads */
  float scale;
  bool rope;
  float rope_theta;
  dtl__tp_proj qkv, out;
};

struct dtl_tp_kv_cache {
  const dtl_tp_attention *attn;
  int64_t max_tokens, length;
  void *k, *v; /* [max_tokens, kv.count * head_dim] each, in the TP communicator's memory (one allocation) */
};

static dtl_placement dtl__tp_attn_p(const dtl_tp_attention *a) { return a->sp ? dtl_shard(0) : dtl_replicate(); }

/* This rank's block: the checks and copies of dtl_tp_attention_create, before its agreement. */
static dtl_status dtl__tp_attention_build(dtl_tp_context *ctx, const dtl_tp_attention_params *p,
                                          dtl_tp_attention **out) {
  static const char fn[] = "dtl_tp_attention_create";
  DTL_CHECK_ARG(p != NULL, fn, "params=NULL");
  DTL_TRY(dtl__tp_check_bits(fn, "params", p->mask, DTL__BITS(DTL_TP_SCALE, DTL_TP_ROPE, DTL_TP_QUANT_WEIGHTS), p->flags,
                             DTL__BITS(DTL_TP_SEQUENCE_PARALLEL, DTL_TP_SHARDED_WEIGHTS, DTL_TP_FP8_GEMM)));
  bool quant = DTL__TP_QUANT(p->mask);
  DTL_TRY(dtl__tp_check_quant(fn, quant, p->flags, "qkv", p->qkv, "out", p->out));
  DTL_CHECK_ARG(p->hidden >= 1 && p->head_dim >= 1, fn, "hidden=%lld head_dim=%lld (expected >= 1)",
                (long long)p->hidden, (long long)p->head_dim);
  dtl_tp_range q, kv;
  DTL_TRY(dtl__tp_heads(ctx, fn, p->q_heads, p->kv_heads, ctx->rank, &q, &kv));
  DTL_CHECK_ARG(quant || p->qkv != NULL, fn, "qkv=NULL (the fused [(q_heads + 2 kv_heads) * head_dim, hidden] weight is required)");
  DTL_CHECK_ARG(quant || p->out != NULL, fn, "out=NULL (the [hidden, q_heads * head_dim] output weight is required)");
  DTL_CHECK_ARG(!(p->mask & DTL_TP_SCALE) || isfinite(p->scale), fn, "scale=%g (expected a finite number)",
                (double)p->scale);
  bool rope = (p->mask & DTL_TP_ROPE) != 0;
  DTL_CHECK_ARG(!rope || (isfinite(p->rope_theta) && p->rope_theta > 0.0f), fn,
                "rope_theta=%g (expected a finite number > 0)", (double)p->rope_theta);
  DTL_CHECK_ARG(!rope || p->head_dim % 2 == 0, fn,
                "head_dim=%lld with DTL_TP_ROPE (expected even: RoPE turns pairs of elements i, i + head_dim/2)",
                (long long)p->head_dim);
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
  a->rope = rope;
  a->rope_theta = rope ? p->rope_theta : 0.0f;
  int64_t D = p->head_dim;
  dtl__tp_rows rows[3] = {{0, 0}, {0, 0}, {0, 0}};
  dtl_status st;
  DTL_TRY_GOTO(dtl__tp_qkv_rows(ctx, fn, p->q_heads, p->kv_heads, D, rows), st, fail);
  dtl__tp_rows all = {0, p->hidden};
  bool sharded = (p->flags & DTL_TP_SHARDED_WEIGHTS) != 0;
  if (quant) {
    /* Each sub-weight's rows are numbered from 0: the fused rows less the parts before it. */
    int64_t Hq = p->q_heads * D, Hkv = p->kv_heads * D;
    bool fp8 = (p->flags & DTL_TP_FP8_GEMM) != 0;
    dtl__tp_qneed qkv[3] = {{"qq", p->qq, Hq, p->hidden, rows[0].row_off, rows[0].rows, 0, p->hidden},
                            {"qk", p->qk, Hkv, p->hidden, rows[1].row_off - Hq, rows[1].rows, 0, p->hidden},
                            {"qv", p->qv, Hkv, p->hidden, rows[2].row_off - Hq - Hkv, rows[2].rows, 0, p->hidden}};
    /* With tp > kv_heads, k and v may also come in the repeat_kv form of dtl_tp_qweight_read_qkv, [tp * head_dim,
     * hidden], whose rows [r D, (r + 1) D) are rank r's kv head. */
    for (int i = 1; i < 3 && ctx->size > p->kv_heads; i++)
      if (dtl__tp_qweight_rows(qkv[i].w) == ctx->size * D) {
        qkv[i].R = ctx->size * D;
        qkv[i].row0 = ctx->rank * D;
      }
    dtl__tp_qneed out = {"qout", p->qout, p->hidden, Hq, 0, p->hidden, q.offset * D, q.count * D};
    DTL_TRY_GOTO(dtl__tp_proj_init_quant(ctx, fn, &a->qkv, qkv, 3, fp8, sharded, p->qkv_bias, rows, 3), st, fail);
    DTL_TRY_GOTO(dtl__tp_proj_init_quant(ctx, fn, &a->out, &out, 1, fp8, false, p->out_bias, &all, 1), st, fail);
  } else {
    DTL_TRY_GOTO(dtl__tp_proj_init(ctx, fn, &a->qkv, sharded, p->qkv, p->hidden, rows, 3, 0, p->hidden, p->qkv_bias), st,
                 fail);
    DTL_TRY_GOTO(dtl__tp_proj_init(ctx, fn, &a->out, sharded, p->out, p->q_heads * D, &all, 1, q.offset * D, q.count * D,
                                   p->out_bias), st, fail);
  }
  *out = a;
  return DTL_OK;
fail:
  dtl_tp_attention_destroy(a);
  return st;
}

dtl_status dtl_tp_attention_create(dtl_tp_context *ctx, const dtl_tp_attention_params *p, dtl_tp_attention **out) {
  static const char fn[] = "dtl_tp_attention_create";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl_tp_attention *a = NULL;
  dtl_status st = out ? dtl__tp_attention_build(ctx, p, &a) : dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "out=NULL");
  uint64_t fp = 0;
  if (st == DTL_OK) {
    fp = DTL__TP_FP(ctx, fn, p->hidden, p->q_heads, p->kv_heads, p->head_dim, a->rope, (int64_t)p->flags, (int64_t)p->mask,
                    p->qkv_bias != NULL, p->out_bias != NULL);
    fp = dtl__fp_double(fp, (double)a->scale);
    fp = dtl__fp_double(fp, (double)a->rope_theta);
  }
  st = dtl__agree(ctx->comm, fn, fp, st);
  if (st != DTL_OK) {
    dtl_tp_attention_destroy(a);
    return st;
  }
  *out = a;
  return DTL_OK;
}

dtl_status dtl_tp_attention_layouts(const dtl_tp_attention *a, int64_t tokens, dtl_layout **in, dtl_layout **out) {
  DTL_CHECK_ARG(a != NULL, "dtl_tp_attention_layouts", "block=NULL");
  return dtl__tp_layouts(a->ctx, "dtl_tp_attention_layouts", tokens, a->hidden, dtl__tp_attn_p(a), a->hidden,
                         dtl__tp_attn_p(a), in, out);
}

/* The attention core's view of one forward: the T queries of qkv [T, width] (q heads, then k heads, then v
 * heads of each token) at positions past..past+T-1, against keys 0..past+T-1: those of qkv itself without a
 * cache (past = 0), the cache's rows [max_tokens, kv.count * D] with one. */
static dtl__attn_shape dtl__tp_attn_shape_of(const dtl_tp_attention *a, int64_t T, const dtl_tp_kv_cache *c) {
  int64_t D = a->head_dim, qn = a->q.count, W = a->qkv.rows, past = c ? c->length : 0, ldkv = c ? a->kv.count * D : W;
  return (dtl__attn_shape){.tq = T, .tk = past + T, .qn = qn, .kn = a->kv.count, .head_dim = D, .q_off = a->q.offset,
                           .kv_off = a->kv.offset, .group = a->group, .ldq = W, .ldk = ldkv, .ldv = ldkv,
                           .ldo = qn * D, .q_pos0 = past, .causal = true, .scale = a->scale};
}

/* The scratch bytes (DTL__TP_WS_AUX) the attention core takes for that view; with a cache, for the keys of a
 * full cache: the most any call of T tokens may need, so that the context's scratch stops growing after the
 * first decode step instead of growing with every token (the core tiles by the scratch it is given). */
static size_t dtl__tp_attend_bytes(const dtl_tp_attention *a, int64_t T, const dtl_tp_kv_cache *c) {
  dtl__attn_shape s = dtl__tp_attn_shape_of(a, T, c);
  if (T == 0 || s.qn == 0) return 0;
  if (c) s.tk = c->max_tokens;
  return dtl__attn_scratch_bytes(&s, dtl__tp_on_device(a->ctx) ? DTL_MEMORY_DEVICE : DTL_MEMORY_HOST);
}

/* RoPE on this rank's q and k heads of qkv [T, width] (side by side from column 0) at positions past.. */
static dtl_status dtl__tp_rope(dtl_tp_attention *a, void *qkv, int64_t T, int64_t past) {
  if (!a->rope || T == 0 || a->q.count + a->kv.count == 0) return DTL_OK;
  dtl__rope_shape s = {.rows = T, .heads = a->q.count + a->kv.count, .head_dim = a->head_dim, .ld = a->qkv.rows,
                       .pos0 = past, .theta = a->rope_theta};
#if DTL_HAVE_NCCL
  if (dtl__tp_on_device(a->ctx)) return dtl__rope_cuda(&s, qkv, a->ctx->dtype, a->ctx->gemm.stream);
#endif
  return dtl__rope_host(&s, (float *)qkv);
}

/* The k and v heads of qkv [T, width] into the cache's rows length..length+T-1 (a box copy in the
 * communicator's memory: host, or device on its stream). */
static dtl_status dtl__tp_kv_append(dtl_tp_attention *a, dtl_tp_kv_cache *c, const void *qkv, int64_t T) {
  int64_t kvw = a->kv.count * a->head_dim, qw = a->q.count * a->head_dim;
  if (T == 0 || kvw == 0) return DTL_OK;
  dtl__box_copy b = {.ndim = 2, .elem_size = a->ctx->elem};
  b.extent[0] = b.src_shape[0] = T;
  b.extent[1] = b.dst_shape[1] = kvw;
  b.src_shape[1] = a->qkv.rows;
  b.dst_shape[0] = c->max_tokens;
  b.dst_off[0] = c->length;
  b.src_off[1] = qw;
  DTL_TRY(dtl__mem_copy_box(&a->ctx->comm->mem, qkv, c->k, &b));
  b.src_off[1] = qw + kvw;
  return dtl__mem_copy_box(&a->ctx->comm->mem, qkv, c->v, &b);
}

/* attn[T, q.count * D] of this rank's q heads from qkv [T, width] and, with a cache, its rows: on the host or
 * the device. */
static dtl_status dtl__tp_attend(dtl_tp_attention *a, const void *qkv, int64_t T, const dtl_tp_kv_cache *c,
                                 void *attn) {
  dtl_tp_context *ctx = a->ctx;
  dtl__attn_shape s = dtl__tp_attn_shape_of(a, T, c);
  if (T == 0 || s.qn == 0) return DTL_OK;
  size_t e = ctx->elem, bytes = dtl__tp_attend_bytes(a, T, c);
  const char *k = (const char *)qkv + (size_t)(s.qn * s.head_dim) * e, *v = k + (size_t)(s.kn * s.head_dim) * e;
  if (c) k = c->k, v = c->v;
  void *scratch;
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_AUX, bytes, &scratch));
#if DTL_HAVE_NCCL
  if (dtl__tp_on_device(ctx))
    return dtl__attn_cuda(&s, qkv, k, v, attn, NULL, scratch, bytes, ctx->dtype, ctx->gemm.stream);
#endif
  return dtl__attn_host(&ctx->gemm, &s, qkv, (const float *)k, (const float *)v, attn, NULL, scratch, bytes);
}

/* The cache checks of a cached forward of T tokens (before the agreement, so that an overflow fails every
 * rank alike and writes nothing). */
static dtl_status dtl__tp_cache_check(const dtl_tp_attention *a, const dtl_tp_kv_cache *c, const char *fn, int64_t T) {
  DTL_CHECK_ARG(c != NULL, fn, "cache=NULL");
  DTL_CHECK_ARG(c->attn == a, fn, "cache=%p belongs to another attention block than block=%p", (const void *)c,
                (const void *)a);
  DTL_CHECK_ARG(T <= c->max_tokens - c->length, fn,
                "tokens=%lld at cache length %lld exceed max_tokens=%lld (reset the cache or make a larger one)",
                (long long)T, (long long)c->length, (long long)c->max_tokens);
  return DTL_OK;
}

/* One forward of the block: uncached (the T tokens alone, at positions 0..T-1; cache is NULL) or cached. */
static dtl_status dtl__tp_attention_run(dtl_tp_attention *a, bool cached, dtl_tp_kv_cache *cache, const char *fn,
                                        const dtl_layout *x_layout, const void *x, void *y) {
  dtl_tp_context *ctx = a->ctx;
  size_t e = ctx->elem, aux_bytes = 0;
  int64_t T = 0, width = a->qkv.rows, attn_w = a->out.cols, past = 0;
  void *qkv = NULL, *attn = NULL, *partial = NULL, *aux;
  dtl_status st = dtl__tp_input_check(ctx, fn, x_layout, a->hidden, dtl__tp_attn_p(a), x, &T);
  if (st == DTL_OK && !y && dtl_layout_local_count(x_layout))
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "y=NULL with %zu elements", dtl_layout_local_count(x_layout));
  if (st == DTL_OK && cached) {
    st = dtl__tp_cache_check(a, cache, fn, T);
    past = st == DTL_OK ? cache->length : 0;
  }
  if (st == DTL_OK) st = dtl__tp_scratch(ctx, DTL__TP_WS_MID, (size_t)(T * width) * e, &qkv);
  if (st == DTL_OK) st = dtl__tp_scratch(ctx, DTL__TP_WS_ATTN, (size_t)(T * attn_w) * e, &attn);
  if (st == DTL_OK) st = dtl__tp_scratch(ctx, DTL__TP_WS_PARTIAL, (size_t)(T * a->hidden) * e, &partial);
  if (st == DTL_OK && (aux_bytes = dtl__tp_attend_bytes(a, T, cache)))
    st = dtl__tp_scratch(ctx, DTL__TP_WS_AUX, aux_bytes, &aux);
  if (st == DTL_OK) st = dtl__tp_proj_reserve(ctx, &a->qkv, T);
  if (st == DTL_OK) st = dtl__tp_proj_reserve(ctx, &a->out, T);
  DTL_TRY(dtl__agree_checked(ctx->comm, fn,
                             DTL__TP_FP(ctx, fn, a->hidden, a->q_heads, a->kv_heads, a->head_dim, T, a->sp, past),
                             st));

  const void *xin;
  DTL_TRY(dtl__tp_input(ctx, a->hidden, dtl__tp_attn_p(a), x, T, &xin));
  DTL_TRY(dtl__tp_proj_apply(ctx, &a->qkv, true, T, xin, a->hidden, qkv, width));
  DTL_TRY(dtl__tp_rope(a, qkv, T, past));
  if (cache) DTL_TRY(dtl__tp_kv_append(a, cache, qkv, T));
  DTL_TRY(dtl__tp_attend(a, qkv, T, cache, attn));
  DTL_TRY(dtl__tp_proj_apply(ctx, &a->out, false, T, attn, attn_w, partial, a->hidden));
  DTL_TRY(dtl__tp_reduce(ctx, T, a->hidden, a->sp, partial, a->out.bias, y));
  if (cache) cache->length = past + T;
  return DTL_OK;
}

dtl_status dtl_tp_attention_forward(dtl_tp_attention *a, const dtl_layout *x_layout, const void *x, void *y) {
  static const char fn[] = "dtl_tp_attention_forward";
  DTL_CHECK_ARG(a != NULL, fn, "block=NULL");
  return dtl__tp_attention_run(a, false, NULL, fn, x_layout, x, y);
}

dtl_status dtl_tp_attention_forward_cached(dtl_tp_attention *a, dtl_tp_kv_cache *cache, const dtl_layout *x_layout,
                                           const void *x, void *y) {
  static const char fn[] = "dtl_tp_attention_forward_cached";
  DTL_CHECK_ARG(a != NULL, fn, "block=NULL");
  return dtl__tp_attention_run(a, true, cache, fn, x_layout, x, y);
}

/* This rank's cache: the checks and the allocation of dtl_tp_kv_cache_create, before its agreement. */
static dtl_status dtl__tp_kv_cache_build(const dtl_tp_attention *a, int64_t max_tokens, dtl_tp_kv_cache **out) {
  static const char fn[] = "dtl_tp_kv_cache_create";
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_CHECK_ARG(max_tokens >= 1, fn, "max_tokens=%lld (expected >= 1)", (long long)max_tokens);
  size_t n; /* elements of the keys (and of the values) */
  DTL_TRY(dtl__tp_count(fn, "cache keys", max_tokens, a->kv.count * a->head_dim, &n));
  dtl_tp_kv_cache *c = dtl__calloc(1, sizeof *c);
  if (!c) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  dtl_status st = dtl__mem_alloc(&a->ctx->comm->mem, n ? 2 * n * a->ctx->elem : 1, &c->k);
  if (st != DTL_OK) {
    dtl__free(c);
    return dtl__error_prefix(st, "%s: keys and values of %lld tokens", fn, (long long)max_tokens);
  }
  c->v = (char *)c->k + n * a->ctx->elem;
  c->attn = a;
  c->max_tokens = max_tokens;
  *out = c;
  return DTL_OK;
}

dtl_status dtl_tp_kv_cache_create(const dtl_tp_attention *a, int64_t max_tokens, dtl_tp_kv_cache **out) {
  static const char fn[] = "dtl_tp_kv_cache_create";
  DTL_CHECK_ARG(a != NULL, fn, "block=NULL");
  dtl_tp_kv_cache *c = NULL;
  dtl_status st = dtl__tp_kv_cache_build(a, max_tokens, out ? &c : NULL);
  uint64_t fp = DTL__TP_FP(a->ctx, fn, max_tokens, a->hidden, a->q_heads, a->kv_heads, a->head_dim);
  st = dtl__agree(a->ctx->comm, fn, st == DTL_OK ? fp : 0, st);
  if (st != DTL_OK) {
    dtl_tp_kv_cache_destroy(c);
    return st;
  }
  *out = c;
  return DTL_OK;
}

void dtl_tp_kv_cache_destroy(dtl_tp_kv_cache *c) {
  if (!c) return;
  dtl__mem_free(&c->attn->ctx->comm->mem, c->k);
  dtl__free(c);
}

int64_t dtl_tp_kv_cache_length(const dtl_tp_kv_cache *c) { return c ? c->length : -1; }

dtl_status dtl_tp_kv_cache_reset(dtl_tp_kv_cache *c) {
  DTL_CHECK_ARG(c != NULL, "dtl_tp_kv_cache_reset", "cache=NULL");
  c->length = 0;
  return DTL_OK;
}

void dtl_tp_attention_destroy(dtl_tp_attention *a) {
  if (!a) return;
  dtl__tp_proj_fini(a->ctx, &a->qkv);
  dtl__tp_proj_fini(a->ctx, &a->out);
  dtl__free(a);
}

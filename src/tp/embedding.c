/* SPDX-License-Identifier: Apache-2.0 */
/* The vocab-parallel embedding: this rank's rows of the table, a lookup of the ids it owns with zeros for
 * the others (a Partial(sum) of [T, hidden]), and the one reduction that resolves it. The lookup runs here
 * on the host and in embedding.cu on a device; the ids are checked on the host either way. */
#include <stdlib.h>
#include <string.h>
#include "comm/agree.h"
#include "tp/stages.h"
#include "tp/tp_internal.h"
#include "tp/tp_math.h"

struct dtl_tp_embedding {
  dtl_tp_context *ctx;
  bool sp;
  int64_t vocab, hidden;
  dtl_tp_range rows; /* this rank's vocab ids */
  void *table;       /* [rows.count, hidden] */
};

static dtl_placement dtl__tp_emb_p(const dtl_tp_embedding *e) { return e->sp ? dtl_shard(0) : dtl_replicate(); }

/* This rank's table: the checks and copies of dtl_tp_embedding_create, before its agreement. */
static dtl_status dtl__tp_embedding_build(dtl_tp_context *ctx, const dtl_tp_embedding_params *p,
                                          dtl_tp_embedding **out) {
  static const char fn[] = "dtl_tp_embedding_create";
  DTL_CHECK_ARG(p != NULL, fn, "params=NULL");
  DTL_TRY(dtl__tp_check_bits(fn, "params", p->mask, DTL__NO_BITS, p->flags,
                             DTL__BITS(DTL_TP_SEQUENCE_PARALLEL, DTL_TP_SHARDED_WEIGHTS)));
  DTL_CHECK_ARG(p->vocab >= 1 && p->hidden >= 1, fn, "vocab=%lld hidden=%lld (expected >= 1)", (long long)p->vocab,
                (long long)p->hidden);
  DTL_CHECK_ARG(p->table != NULL, fn, "table=NULL (the dense [vocab, hidden] table is required)");
  DTL_TRY(dtl__tp_check_compute(ctx, fn));
  size_t n;
  DTL_TRY(dtl__tp_count(fn, "table", p->vocab, p->hidden, &n));
  dtl_tp_embedding *e = dtl__calloc(1, sizeof *e);
  if (!e) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  e->ctx = ctx;
  e->sp = (p->flags & DTL_TP_SEQUENCE_PARALLEL) != 0;
  e->vocab = p->vocab;
  e->hidden = p->hidden;
  e->rows = dtl__tp_chunk(ctx, p->vocab, ctx->rank);
  size_t bytes = (size_t)(e->rows.count * e->hidden) * ctx->elem;
  dtl_status st;
  /* With DTL_TP_SHARDED_WEIGHTS the table holds only this rank's rows: copy them whole. */
  bool sharded = (p->flags & DTL_TP_SHARDED_WEIGHTS) != 0;
  dtl__tp_rows r = {sharded ? 0 : e->rows.offset, e->rows.count};
  DTL_TRY_GOTO(dtl__mem_alloc(&ctx->comm->mem, bytes ? bytes : 1, &e->table), st, fail);
  DTL_TRY_GOTO(dtl__tp_pack_rows(ctx, p->table, sharded ? e->rows.count : p->vocab, p->hidden, &r, 1, 0, p->hidden,
                                 e->table), st, fail);
  *out = e;
  return DTL_OK;
fail:
  dtl_tp_embedding_destroy(e);
  return dtl__error_prefix(st, "%s", fn);
}

dtl_status dtl_tp_embedding_create(dtl_tp_context *ctx, const dtl_tp_embedding_params *p, dtl_tp_embedding **out) {
  static const char fn[] = "dtl_tp_embedding_create";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl_tp_embedding *e = NULL;
  dtl_status st = out ? dtl__tp_embedding_build(ctx, p, &e) : dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "out=NULL");
  st = dtl__agree(ctx->comm, fn, st == DTL_OK ? DTL__TP_FP(ctx, fn, p->vocab, p->hidden, (int64_t)p->flags) : 0, st);
  if (st != DTL_OK) {
    dtl_tp_embedding_destroy(e);
    return st;
  }
  *out = e;
  return DTL_OK;
}

dtl_status dtl_tp_embedding_layout(const dtl_tp_embedding *e, int64_t tokens, dtl_layout **out) {
  DTL_CHECK_ARG(e != NULL, "dtl_tp_embedding_layout", "embedding=NULL");
  DTL_CHECK_ARG(out != NULL, "dtl_tp_embedding_layout", "out=NULL");
  return dtl__tp_layouts(e->ctx, "dtl_tp_embedding_layout", tokens, 0, dtl_replicate(), e->hidden, dtl__tp_emb_p(e),
                         NULL, out);
}

void dtl__tp_embed_host(const int64_t *ids, int64_t tokens, const void *table, int64_t off, int64_t count,
                        int64_t hidden, size_t elem, void *out) {
  size_t row_bytes = (size_t)hidden * elem;
  for (int64_t t = 0; t < tokens; t++) {
    int64_t row = dtl__tp_embed_row(ids[t], off, count);
    char *dst = (char *)out + (size_t)t * row_bytes;
    if (row >= 0) memcpy(dst, (const char *)table + (size_t)row * row_bytes, row_bytes);
    else memset(dst, 0, row_bytes);
  }
}

/* The Partial(sum) addend [tokens, hidden] of this rank. On a device the ids go through a host copy of our
 * own (pageable, so the upload has read them when mem_copy returns, whatever memory the caller's are in);
 * the forward has taken both staging buffers before its agreement. */
static dtl_status dtl__tp_embed(dtl_tp_embedding *e, int64_t tokens, const int64_t *ids, void *partial) {
  dtl_tp_context *ctx = e->ctx;
  if (dtl__tp_on_device(ctx)) {
#if DTL_HAVE_NCCL
    size_t bytes = (size_t)tokens * sizeof(int64_t);
    void *staged, *dev_ids;
    DTL_TRY(dtl__tp_host_scratch(ctx, bytes, &staged));
    DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_AUX, bytes, &dev_ids));
    if (bytes) memcpy(staged, ids, bytes);
    DTL_TRY(dtl__mem_copy(&ctx->comm->mem, dev_ids, staged, bytes));
    return dtl__tp_embed_cuda(dev_ids, tokens, e->table, e->rows.offset, e->rows.count, e->hidden, ctx->dtype,
                              partial, ctx->gemm.stream);
#endif
  }
  dtl__tp_embed_host(ids, tokens, e->table, e->rows.offset, e->rows.count, e->hidden, ctx->elem, partial);
  return DTL_OK;
}

/* Every rank checks every id (they are replicated), so all ranks fail together before any collective. */
static dtl_status dtl__tp_embedding_args(const dtl_tp_embedding *e, const char *fn, int64_t tokens,
                                         const int64_t *ids, const void *y) {
  DTL_CHECK_ARG(tokens >= 0, fn, "tokens=%lld (expected >= 0)", (long long)tokens);
  DTL_CHECK_ARG(ids != NULL || tokens == 0, fn, "ids=NULL");
  int64_t rows = e->sp ? dtl__tp_chunk(e->ctx, tokens, e->ctx->rank).count : tokens;
  DTL_CHECK_ARG(y != NULL || rows == 0, fn, "y=NULL");
  for (int64_t t = 0; t < tokens; t++)
    if (ids[t] < 0 || ids[t] >= e->vocab)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                           "ids[%lld]=%lld is outside the vocabulary (expected 0..%lld); nothing was written",
                           (long long)t, (long long)ids[t], (long long)(e->vocab - 1));
  return DTL_OK;
}

static uint64_t dtl__tp_ids_fp(const dtl_tp_embedding *e, const char *fn, int64_t tokens, const int64_t *ids) {
  uint64_t h = 0;
  for (int64_t t = 0; t < tokens; t++) h = dtl__fp_mix(h, (uint64_t)ids[t]);
  return DTL__TP_FP(e->ctx, fn, e->vocab, e->hidden, tokens, e->sp, (int64_t)h);
}

dtl_status dtl_tp_embedding_forward(dtl_tp_embedding *e, int64_t tokens, const int64_t *ids, void *y) {
  static const char fn[] = "dtl_tp_embedding_forward";
  DTL_CHECK_ARG(e != NULL, fn, "embedding=NULL");
  dtl_tp_context *ctx = e->ctx;
  void *partial, *staged;
  dtl_status st = dtl__tp_embedding_args(e, fn, tokens, ids, y);
  if (st == DTL_OK) st = dtl__tp_scratch(ctx, DTL__TP_WS_PARTIAL, (size_t)(tokens * e->hidden) * ctx->elem, &partial);
  if (st == DTL_OK && dtl__tp_on_device(ctx)) st = dtl__tp_host_scratch(ctx, (size_t)tokens * sizeof(int64_t), &staged);
  if (st == DTL_OK && dtl__tp_on_device(ctx))
    st = dtl__tp_scratch(ctx, DTL__TP_WS_AUX, (size_t)tokens * sizeof(int64_t), &staged);
  /* The ids are part of the fingerprint: ranks that look up different tokens would sum unrelated rows. */
  DTL_TRY(dtl__agree_checked(ctx->comm, fn, st == DTL_OK ? dtl__tp_ids_fp(e, fn, tokens, ids) : 0, st));
  DTL_TRY(dtl__tp_embed(e, tokens, ids, partial));
  return dtl__tp_reduce(ctx, tokens, e->hidden, e->sp, partial, NULL, y);
}

void dtl_tp_embedding_destroy(dtl_tp_embedding *e) {
  if (!e) return;
  if (e->table) dtl__mem_free(&e->ctx->comm->mem, e->table);
  dtl__free(e);
}

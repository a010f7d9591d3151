/* SPDX-License-Identifier: Apache-2.0 */
/* One local projection of a TP layer: this rank's weight shard (and bias) copied out of the dense
 * weight (or copied whole when the caller passes the shard), and Y = X W^T + b through the context's GEMM. Column- and row-parallel layers, the fused QKV
 * and gate/up projections and the LM head all run through here (a quantized weight's GEMM is qproj.c's).
 * Purely local: the collectives are comm_half.c's. */
#include <string.h>
#include "compute/bias.h"
#include "tp/tp_internal.h"

dtl_status dtl__tp_proj_init(dtl_tp_context *ctx, const char *fn, dtl__tp_proj *p, bool sharded, const void *w,
                             int64_t in, const dtl__tp_rows *ranges, int nranges, int64_t col_off, int64_t cols,
                             const void *bias) {
  memset(p, 0, sizeof *p);
  dtl__tp_rows whole = {0, 0};
  if (sharded) { /* w is already [rows, cols] and bias [rows]: copied whole */
    for (int i = 0; i < nranges; i++) whole.rows += ranges[i].rows;
    ranges = &whole;
    nranges = 1;
    in = cols;
    col_off = 0;
  }
  int64_t rows = 0, src_rows = 0;
  for (int i = 0; i < nranges; i++) {
    rows += ranges[i].rows;
    if (ranges[i].row_off + ranges[i].rows > src_rows) src_rows = ranges[i].row_off + ranges[i].rows;
  }
  size_t wn;
  DTL_TRY(dtl__tp_count(fn, "weight shard", rows, cols, &wn));
  dtl_comm *c = ctx->comm;
  dtl_status st = DTL_OK;
  DTL_TRY_GOTO(dtl__mem_alloc(&c->mem, wn ? wn * ctx->elem : 1, &p->w), st, fail);
  DTL_TRY_GOTO(dtl__tp_pack_rows(ctx, w, src_rows, in, ranges, nranges, col_off, cols, p->w), st, fail);
  p->rows = rows;
  p->cols = cols;
  if ((st = dtl__tp_proj_bias(ctx, fn, p, false, bias, ranges, nranges)) != DTL_OK) {
    dtl__tp_proj_fini(ctx, p);
    return st;
  }
  return DTL_OK;
fail:
  dtl__tp_proj_fini(ctx, p);
  return dtl__error_prefix(st, "%s", fn);
}

dtl_status dtl__tp_proj_bias(dtl_tp_context *ctx, const char *fn, dtl__tp_proj *p, bool sharded, const void *bias,
                             const dtl__tp_rows *ranges, int nranges) {
  if (!bias) return DTL_OK;
  dtl__tp_rows whole = {0, 0};
  int64_t rows = 0, src_rows = 0;
  for (int i = 0; i < nranges; i++) {
    rows += ranges[i].rows;
    if (ranges[i].row_off + ranges[i].rows > src_rows) src_rows = ranges[i].row_off + ranges[i].rows;
  }
  if (sharded) {
    whole.rows = src_rows = rows;
    ranges = &whole;
    nranges = 1;
  }
  dtl_status st = dtl__mem_alloc(&ctx->comm->mem, rows ? (size_t)rows * ctx->elem : 1, &p->bias);
  if (st == DTL_OK) st = dtl__tp_pack_rows(ctx, bias, src_rows, 1, ranges, nranges, 0, 1, p->bias);
  return st == DTL_OK ? DTL_OK : dtl__error_prefix(st, "%s: bias", fn);
}

void dtl__tp_proj_fini(dtl_tp_context *ctx, dtl__tp_proj *p) {
  dtl__tp_qproj_fini(ctx, p);
  if (p->w) dtl__mem_free(&ctx->comm->mem, p->w);
  if (p->bias) dtl__mem_free(&ctx->comm->mem, p->bias);
  memset(p, 0, sizeof *p);
}

dtl_status dtl__tp_proj_apply(dtl_tp_context *ctx, const dtl__tp_proj *p, bool with_bias, int64_t tokens, const void *x,
                              int64_t ldx, void *y, int64_t ldy) {
  float beta = 0.0f;
  if (with_bias && p->bias && p->rows > 0) {
    /* Seed every output row with the bias and let the GEMM accumulate onto it (beta = 1). */
    DTL_TRY(dtl__bias_rows(&ctx->gemm, y, p->bias, tokens, p->rows, ldy, false, ctx->dtype));
    beta = 1.0f;
  }
  if (p->nq) return dtl__tp_qproj_apply(ctx, p, beta, tokens, x, ldx, y, ldy);
  return dtl__gemm(&ctx->gemm, ctx->dtype, tokens, p->rows, p->cols, 1.0f, x, ldx, p->w, p->cols, beta, y, ldy);
}

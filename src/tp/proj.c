/* SPDX-License-Identifier: Apache-2.0 */
/* One local projection of a TP layer: this rank's weight shard (and bias) copied out of the dense
 * checkpoint, and Y = X W^T + b through the context's GEMM. Column- and row-parallel layers, the fused QKV
 * and gate/up projections and the LM head all run through here. */
#include <string.h>
#include "tp/bias.h"
#include "tp/tp_internal.h"

dtl_status dtl__tp_bias_rows(dtl_tp_context *ctx, void *y, const void *bias, int64_t rows, int64_t cols, int64_t ldy,
                             bool add) {
  if (rows <= 0 || cols <= 0) return DTL_OK;
  if (ctx->gemm.memory == DTL_MEMORY_DEVICE) {
#if DTL_HAVE_NCCL
    return dtl__tp_bias_rows_cuda(y, bias, rows, cols, ldy, add, ctx->dtype, ctx->gemm.stream);
#else
    return dtl__error(DTL_ERR_INTERNAL, "dtl__tp_bias_rows: a device engine in a build without CUDA");
#endif
  }
  return dtl__tp_bias_rows_host(y, bias, rows, cols, ldy, add, ctx->dtype);
}

dtl_status dtl__tp_proj_init(dtl_tp_context *ctx, const char *fn, dtl__tp_proj *p, const void *w, int64_t in,
                             const dtl__tp_rows *ranges, int nranges, int64_t col_off, int64_t cols, const void *bias) {
  memset(p, 0, sizeof *p);
  int64_t rows = 0, src_rows = 0;
  for (int i = 0; i < nranges; i++) {
    rows += ranges[i].rows;
    if (ranges[i].row_off + ranges[i].rows > src_rows) src_rows = ranges[i].row_off + ranges[i].rows;
  }
  size_t wn;
  DTL_TRY(dtl__tp_count(fn, "weight shard", rows, cols, &wn));
  dtl_comm *c = ctx->comm;
  dtl_status st = DTL_OK;
  DTL_TRY_GOTO(c->ops->mem_alloc(c, wn ? wn * ctx->elem : 1, &p->w), st, fail);
  DTL_TRY_GOTO(dtl__tp_pack_rows(ctx, w, src_rows, in, ranges, nranges, col_off, cols, p->w), st, fail);
  if (bias) {
    DTL_TRY_GOTO(c->ops->mem_alloc(c, rows ? (size_t)rows * ctx->elem : 1, &p->bias), st, fail);
    DTL_TRY_GOTO(dtl__tp_pack_rows(ctx, bias, src_rows, 1, ranges, nranges, 0, 1, p->bias), st, fail);
  }
  p->rows = rows;
  p->cols = cols;
  return DTL_OK;
fail:
  dtl__tp_proj_fini(ctx, p);
  return dtl__error_prefix(st, "%s", fn);
}

void dtl__tp_proj_fini(dtl_tp_context *ctx, dtl__tp_proj *p) {
  if (p->w) ctx->comm->ops->mem_free(ctx->comm, p->w);
  if (p->bias) ctx->comm->ops->mem_free(ctx->comm, p->bias);
  memset(p, 0, sizeof *p);
}

dtl_status dtl__tp_input(dtl_tp_context *ctx, const char *fn, const dtl_layout *x_layout, int64_t features,
                         dtl_placement on_tp, const void *x, int64_t *tokens, const void **xin) {
  int64_t T;
  DTL_TRY(dtl__tp_check_layout(ctx, fn, "x_layout", x_layout, features, on_tp, &T));
  DTL_CHECK_ARG(x != NULL || dtl_layout_local_count(x_layout) == 0, fn, "x=NULL");
  *tokens = T;
  *xin = x;
  if (on_tp.kind != DTL_SHARD || on_tp.dim != 0) return DTL_OK; /* only S(0) (sequence parallel) gathers */
  void *full;
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_INPUT, (size_t)(T * features) * ctx->elem, &full));
  DTL_TRY(dtl__tp_gather_tokens(ctx, T, features, x, full));
  *xin = full;
  return DTL_OK;
}

dtl_status dtl__tp_proj_apply(dtl_tp_context *ctx, const dtl__tp_proj *p, bool with_bias, int64_t tokens, const void *x,
                              int64_t ldx, void *y, int64_t ldy) {
  float beta = 0.0f;
  if (with_bias && p->bias && p->rows > 0) {
    /* Seed every output row with the bias and let the GEMM accumulate onto it (beta = 1). */
    DTL_TRY(dtl__tp_bias_rows(ctx, y, p->bias, tokens, p->rows, ldy, false));
    beta = 1.0f;
  }
  return dtl__gemm(&ctx->gemm, ctx->dtype, tokens, p->rows, p->cols, 1.0f, x, ldx, p->w, p->cols, beta, y, ldy);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Column- and row-parallel linear layers: a projection of this rank's weight shard plus the layer's one
 * communication half (sequence-parallel gather in, column gather or row reduction out). */
#include <stdlib.h>
#include "comm/agree.h"
#include "tp/tp_internal.h"

struct dtl_tp_linear {
  dtl_tp_context *ctx;
  dtl_tp_linear_kind kind;
  bool sp, gather;
  int64_t in, out;
  dtl__tp_proj proj;
};

static dtl_placement dtl__tp_linear_in_p(const dtl_tp_linear *l) {
  if (l->kind == DTL_TP_ROW) return dtl_shard(1);
  return l->sp ? dtl_shard(0) : dtl_replicate();
}
static dtl_placement dtl__tp_linear_out_p(const dtl_tp_linear *l) {
  if (l->kind == DTL_TP_ROW) return l->sp ? dtl_shard(0) : dtl_replicate();
  return l->gather ? dtl_replicate() : dtl_shard(1);
}

/* This rank's layer: the checks and copies of dtl_tp_linear_create, before its agreement. */
static dtl_status dtl__tp_linear_build(dtl_tp_context *ctx, const dtl_tp_linear_params *p, dtl_tp_linear **out) {
  static const char fn[] = "dtl_tp_linear_create";
  DTL_CHECK_ARG(p != NULL, fn, "params=NULL");
  DTL_TRY(dtl__tp_check_bits(fn, "params", p->mask, DTL__BITS(DTL_TP_QUANT_WEIGHTS), p->flags,
                             DTL__BITS(DTL_TP_SEQUENCE_PARALLEL, DTL_TP_GATHER_OUTPUT, DTL_TP_SHARDED_WEIGHTS,
                                       DTL_TP_FP8_GEMM)));
  bool quant = DTL__TP_QUANT(p->mask);
  DTL_TRY(dtl__tp_check_quant(fn, quant, p->flags, "weight", p->weight, NULL, NULL));
  DTL_CHECK_ARG(p->kind == DTL_TP_COLUMN || p->kind == DTL_TP_ROW, fn, "kind=%d (expected DTL_TP_COLUMN or DTL_TP_ROW)",
                (int)p->kind);
  DTL_CHECK_ARG(p->in_features >= 0 && p->out_features >= 0, fn, "in_features=%lld out_features=%lld (expected >= 0)",
                (long long)p->in_features, (long long)p->out_features);
  DTL_CHECK_ARG(quant || p->weight != NULL, fn, "weight=NULL (the dense [out=%lld, in=%lld] weight is required)",
                (long long)p->out_features, (long long)p->in_features);
  DTL_CHECK_ARG(p->kind == DTL_TP_COLUMN || !(p->flags & DTL_TP_GATHER_OUTPUT), fn,
                "params.flags has DTL_TP_GATHER_OUTPUT on a row-parallel layer (its output is already R or S(0))");
  DTL_TRY(dtl__tp_check_compute(ctx, fn));
  size_t n;
  DTL_TRY(dtl__tp_count(fn, "weight", p->out_features, p->in_features, &n));
  dtl_tp_linear *l = dtl__calloc(1, sizeof *l);
  if (!l) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  l->ctx = ctx;
  l->kind = p->kind;
  l->sp = (p->flags & DTL_TP_SEQUENCE_PARALLEL) != 0;
  l->gather = (p->flags & DTL_TP_GATHER_OUTPUT) != 0;
  l->in = p->in_features;
  l->out = p->out_features;
  dtl_status st;
  bool sharded = (p->flags & DTL_TP_SHARDED_WEIGHTS) != 0;
  if (quant) {
    bool col = p->kind == DTL_TP_COLUMN;
    dtl_tp_range r = dtl__tp_chunk(ctx, col ? l->out : l->in, ctx->rank);
    dtl__tp_qneed need = {"qweight", p->qweight, l->out, l->in, col ? r.offset : 0, col ? r.count : l->out,
                          col ? 0 : r.offset, col ? l->in : r.count};
    dtl__tp_rows brows = {col ? r.offset : 0, col ? r.count : l->out};
    DTL_TRY_GOTO(dtl__tp_proj_init_quant(ctx, fn, &l->proj, &need, 1, (p->flags & DTL_TP_FP8_GEMM) != 0,
                                         sharded || !col, p->bias, &brows, 1), st, fail);
  } else if (p->kind == DTL_TP_COLUMN) {
    dtl_tp_range r = dtl__tp_chunk(ctx, l->out, ctx->rank);
    dtl__tp_rows rows = {r.offset, r.count};
    DTL_TRY_GOTO(dtl__tp_proj_init(ctx, fn, &l->proj, sharded, p->weight, l->in, &rows, 1, 0, l->in, p->bias), st, fail);
  } else {
    dtl_tp_range c = dtl__tp_chunk(ctx, l->in, ctx->rank);
    dtl__tp_rows rows = {0, l->out};
    DTL_TRY_GOTO(dtl__tp_proj_init(ctx, fn, &l->proj, sharded, p->weight, l->in, &rows, 1, c.offset, c.count, p->bias), st,
                 fail);
  }
  *out = l;
  return DTL_OK;
fail:
  dtl_tp_linear_destroy(l);
  return st;
}

dtl_status dtl_tp_linear_create(dtl_tp_context *ctx, const dtl_tp_linear_params *p, dtl_tp_linear **out) {
  static const char fn[] = "dtl_tp_linear_create";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl_tp_linear *l = NULL;
  dtl_status st = out ? dtl__tp_linear_build(ctx, p, &l) : dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "out=NULL");
  uint64_t fp = st == DTL_OK ? DTL__TP_FP(ctx, fn, p->kind, p->in_features, p->out_features,
                                          (int64_t)p->flags, (int64_t)p->mask, p->bias != NULL) : 0;
  st = dtl__agree(ctx->comm, fn, fp, st);
  if (st != DTL_OK) {
    dtl_tp_linear_destroy(l);
    return st;
  }
  *out = l;
  return DTL_OK;
}

dtl_status dtl_tp_linear_layouts(const dtl_tp_linear *l, int64_t tokens, dtl_layout **in, dtl_layout **out) {
  DTL_CHECK_ARG(l != NULL, "dtl_tp_linear_layouts", "layer=NULL");
  return dtl__tp_layouts(l->ctx, "dtl_tp_linear_layouts", tokens, l->in, dtl__tp_linear_in_p(l), l->out,
                         dtl__tp_linear_out_p(l), in, out);
}

dtl_status dtl_tp_linear_forward(dtl_tp_linear *l, const dtl_layout *x_layout, const void *x, void *y) {
  static const char fn[] = "dtl_tp_linear_forward";
  DTL_CHECK_ARG(l != NULL, fn, "layer=NULL");
  dtl_tp_context *ctx = l->ctx;
  size_t e = ctx->elem;
  bool column = l->kind == DTL_TP_COLUMN;
  int64_t T = 0;
  void *mid = NULL, *partial = NULL, *stage;
  dtl_status st = dtl__tp_input_check(ctx, fn, x_layout, l->in, dtl__tp_linear_in_p(l), x, &T);
  if (st == DTL_OK) {
    size_t y_count = (size_t)(column && !l->gather ? T * l->proj.rows
                              : l->sp && !column ? dtl__tp_chunk(ctx, T, ctx->rank).count * l->out
                                                 : T * l->out);
    if (!y && y_count) st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "y=NULL with %zu elements", y_count);
  }
  size_t gather_bytes = st == DTL_OK && column && l->gather ? dtl__tp_gather_columns_bytes(ctx, T, l->out) : 0;
  if (st == DTL_OK && column && l->gather) st = dtl__tp_scratch(ctx, DTL__TP_WS_MID, (size_t)(T * l->proj.rows) * e, &mid);
  if (st == DTL_OK && gather_bytes) st = dtl__tp_scratch(ctx, DTL__TP_WS_COMM, gather_bytes, &stage);
  if (st == DTL_OK && !column) st = dtl__tp_scratch(ctx, DTL__TP_WS_PARTIAL, (size_t)(T * l->out) * e, &partial);
  if (st == DTL_OK) st = dtl__tp_proj_reserve(ctx, &l->proj, T);
  DTL_TRY(dtl__agree_checked(ctx->comm, fn, DTL__TP_FP(ctx, fn, l->kind, l->in, l->out, T, l->sp, l->gather), st));

  const void *xin;
  DTL_TRY(dtl__tp_input(ctx, l->in, dtl__tp_linear_in_p(l), x, T, &xin));
  if (column) {
    if (!l->gather) return dtl__tp_proj_apply(ctx, &l->proj, true, T, xin, l->in, y, l->proj.rows);
    DTL_TRY(dtl__tp_proj_apply(ctx, &l->proj, true, T, xin, l->in, mid, l->proj.rows));
    return dtl__tp_gather_columns(ctx, T, l->out, mid, y);
  }
  DTL_TRY(dtl__tp_proj_apply(ctx, &l->proj, false, T, xin, l->proj.cols, partial, l->out));
  return dtl__tp_reduce(ctx, T, l->out, l->sp, partial, l->proj.bias, y);
}

void dtl_tp_linear_destroy(dtl_tp_linear *l) {
  if (!l) return;
  dtl__tp_proj_fini(l->ctx, &l->proj);
  dtl__free(l);
}

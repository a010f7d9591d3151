/* SPDX-License-Identifier: Apache-2.0 */
/* The communication half of every TP layer, on the TP dim's communicator: the row-parallel reduction
 * (all-reduce, or reduce-scatter on tokens for sequence parallelism) with its once-only bias, the
 * column-parallel gather of S(1) outputs, the sequence-parallel gather of S(0) inputs and a layer's input
 * step built on it. The layers call the cores after their own checks, allocations and agreement; the
 * public wrappers add the layout checks (and the DTL_CHECK agreement) for engines that run their own GEMMs. */
#include <string.h>
#include "comm/agree.h"
#include "compute/bias.h"
#include "tp/tp_internal.h"

uint64_t dtl__tp_fp(const dtl_tp_context *ctx, const char *fn, int n, const int64_t *v) {
  uint64_t h = dtl__fp_mix(dtl__fp_mix(dtl__fp_str(ctx->mesh->id, fn), (uint64_t)ctx->tp_dim), (uint64_t)ctx->dtype);
  return dtl__fp_i64s(h, v, n);
}

/* counts[r] = rows(r) * per_row, rows(r) = chunk(n, tp, r) */
static void dtl__tp_counts(dtl_tp_context *ctx, int64_t n, int64_t per_row) {
  for (int r = 0; r < ctx->size; r++) ctx->counts[r] = (size_t)(dtl__tp_chunk(ctx, n, r).count * per_row);
}

dtl_status dtl__tp_reduce(dtl_tp_context *ctx, int64_t tokens, int64_t features, bool sequence_parallel,
                          const void *partial, const void *bias, void *y) {
  int64_t rows = tokens;
  if (!sequence_parallel) {
    DTL_TRY(dtl__all_reduce_agreed(ctx->comm, partial, y, (size_t)(tokens * features), ctx->dtype, DTL_SUM));
  } else {
    dtl__tp_counts(ctx, tokens, features);
    DTL_TRY(dtl__reduce_scatterv_agreed(ctx->comm, partial, y, ctx->counts, ctx->dtype, DTL_SUM));
    rows = dtl__tp_chunk(ctx, tokens, ctx->rank).count;
  }
  return bias ? dtl__bias_rows(&ctx->gemm, y, bias, rows, features, features, true, ctx->dtype) : DTL_OK;
}

/* One token row (decode) or one rank: rank-major blocks already are the row-major [T, F], no staging. */
size_t dtl__tp_gather_columns_bytes(const dtl_tp_context *ctx, int64_t tokens, int64_t features) {
  return tokens <= 1 || ctx->size == 1 ? 0 : (size_t)(tokens * features) * ctx->elem;
}

dtl_status dtl__tp_gather_columns(dtl_tp_context *ctx, int64_t tokens, int64_t features, const void *y_local, void *y) {
  dtl__tp_counts(ctx, features, tokens);
  size_t mine = ctx->counts[ctx->rank], bytes = dtl__tp_gather_columns_bytes(ctx, tokens, features);
  if (bytes == 0) return dtl__all_gatherv_agreed(ctx->comm, y_local, mine, y, ctx->counts, ctx->dtype);
  void *stage;
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_COMM, bytes, &stage));
  DTL_TRY(dtl__all_gatherv_agreed(ctx->comm, y_local, mine, stage, ctx->counts, ctx->dtype));
  size_t at = 0;
  for (int r = 0; r < ctx->size; r++) {
    dtl_tp_range c = dtl__tp_chunk(ctx, features, r);
    if (c.count > 0) {
      dtl__box_copy b = {.ndim = 2, .elem_size = ctx->elem};
      b.extent[0] = b.src_shape[0] = b.dst_shape[0] = tokens;
      b.extent[1] = b.src_shape[1] = c.count;
      b.dst_shape[1] = features;
      b.dst_off[1] = c.offset;
      DTL_TRY(dtl__mem_copy_box(&ctx->comm->mem, (const char *)stage + at * ctx->elem, y, &b));
    }
    at += ctx->counts[r];
  }
  return DTL_OK;
}

dtl_status dtl__tp_gather_tokens(dtl_tp_context *ctx, int64_t tokens, int64_t features, const void *x_local, void *x) {
  dtl__tp_counts(ctx, tokens, features);
  return dtl__all_gatherv_agreed(ctx->comm, x_local, ctx->counts[ctx->rank], x, ctx->counts, ctx->dtype);
}

static bool dtl__tp_gathers_input(dtl_placement on_tp) { return on_tp.kind == DTL_SHARD && on_tp.dim == 0; }

dtl_status dtl__tp_input_check(dtl_tp_context *ctx, const char *fn, const dtl_layout *x_layout, int64_t features,
                               dtl_placement on_tp, const void *x, int64_t *tokens) {
  int64_t T;
  DTL_TRY(dtl__tp_check_layout(ctx, fn, "x_layout", x_layout, features, on_tp, &T));
  DTL_CHECK_ARG(x != NULL || dtl_layout_local_count(x_layout) == 0, fn, "x=NULL");
  *tokens = T;
  void *full;
  if (!dtl__tp_gathers_input(on_tp)) return DTL_OK; /* only S(0) (sequence parallel) gathers */
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_INPUT, (size_t)(T * features) * ctx->elem, &full));
  return ctx->fp8_gather ? dtl__tp_fp8_gather_check(ctx, fn, T, features, x) : DTL_OK;
}

dtl_status dtl__tp_input(dtl_tp_context *ctx, int64_t features, dtl_placement on_tp, const void *x, int64_t tokens,
                         const void **xin) {
  *xin = x;
  if (!dtl__tp_gathers_input(on_tp)) return DTL_OK;
  void *full;
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_INPUT, (size_t)(tokens * features) * ctx->elem, &full));
  DTL_TRY(ctx->fp8_gather ? dtl__tp_fp8_gather(ctx, tokens, features, full)
                          : dtl__tp_gather_tokens(ctx, tokens, features, x, full));
  *xin = full;
  return DTL_OK;
}

/* The checks of a public half, all before its agreement so that the core's collectives cannot fail on one
 * rank: its layout ([tokens, features] with on_tp on the TP dim) and its two buffers a and b, each the
 * layout's local shard or (whole) the full tensor, non-NULL unless empty and apart (the halves have no
 * in-place form: an input is never modified). */
static dtl_status dtl__tp_half_args(dtl_tp_context *ctx, const char *fn, const char *what, const dtl_layout *l,
                                    dtl_placement on_tp, const char *a, const void *pa, bool a_whole, const char *b,
                                    const void *pb, bool b_whole, int64_t *tokens, int64_t *features) {
  *tokens = *features = 0;
  DTL_CHECK_ARG(l != NULL, fn, "%s=NULL", what);
  *features = l->ndim == 2 ? l->shape[1] : -1;
  DTL_TRY(dtl__tp_check_layout(ctx, fn, what, l, *features, on_tp, tokens));
  size_t na = a_whole ? dtl_layout_global_count(l) : dtl_layout_local_count(l);
  size_t nb = b_whole ? dtl_layout_global_count(l) : dtl_layout_local_count(l);
  DTL_CHECK_ARG(pa != NULL || na == 0, fn, "%s=NULL with %zu elements", a, na);
  DTL_CHECK_ARG(pb != NULL || nb == 0, fn, "%s=NULL with %zu elements", b, nb);
  DTL_CHECK_ARG(!dtl__overlap(pa, na * ctx->elem, pb, nb * ctx->elem), fn, "%s=%p and %s=%p overlap", a, pa, b, pb);
  return DTL_OK;
}

dtl_status dtl_tp_row_parallel_reduce(dtl_tp_context *ctx, const dtl_layout *out_layout, const void *partial,
                                      const void *bias, void *y) {
  static const char fn[] = "dtl_tp_row_parallel_reduce";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  bool sp = out_layout && out_layout->ndim == 2 && ctx->tp_dim < out_layout->mesh->ndim &&
            out_layout->placements[ctx->tp_dim].kind == DTL_SHARD;
  int64_t tokens, features;
  dtl_status st = dtl__tp_half_args(ctx, fn, "out_layout", out_layout, sp ? dtl_shard(0) : dtl_replicate(), "partial",
                                    partial, true, "y", y, false, &tokens, &features);
  DTL_TRY(dtl__agree_checked(ctx->comm, fn, DTL__TP_FP(ctx, fn, tokens, features, sp, bias != NULL), st));
  return dtl__tp_reduce(ctx, tokens, features, sp, partial, bias, y);
}

dtl_status dtl_tp_column_parallel_gather(dtl_tp_context *ctx, const dtl_layout *in_layout, const void *y_local, void *y) {
  static const char fn[] = "dtl_tp_column_parallel_gather";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  int64_t tokens, features;
  dtl_status st = dtl__tp_half_args(ctx, fn, "in_layout", in_layout, dtl_shard(1), "y_local", y_local, false, "y", y,
                                    true, &tokens, &features);
  void *stage;
  size_t bytes = st == DTL_OK ? dtl__tp_gather_columns_bytes(ctx, tokens, features) : 0;
  if (bytes) st = dtl__tp_scratch(ctx, DTL__TP_WS_COMM, bytes, &stage);
  DTL_TRY(dtl__agree_checked(ctx->comm, fn, DTL__TP_FP(ctx, fn, tokens, features), st));
  return dtl__tp_gather_columns(ctx, tokens, features, y_local, y);
}

dtl_status dtl_tp_sequence_gather(dtl_tp_context *ctx, const dtl_layout *in_layout, const void *x_local, void *x) {
  static const char fn[] = "dtl_tp_sequence_gather";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  int64_t tokens, features;
  dtl_status st = dtl__tp_half_args(ctx, fn, "in_layout", in_layout, dtl_shard(0), "x_local", x_local, false, "x", x,
                                    true, &tokens, &features);
  if (st == DTL_OK && ctx->fp8_gather) st = dtl__tp_fp8_gather_check(ctx, fn, tokens, features, x_local);
  DTL_TRY(dtl__agree_checked(ctx->comm, fn, DTL__TP_FP(ctx, fn, tokens, features), st));
  return ctx->fp8_gather ? dtl__tp_fp8_gather(ctx, tokens, features, x)
                         : dtl__tp_gather_tokens(ctx, tokens, features, x_local, x);
}

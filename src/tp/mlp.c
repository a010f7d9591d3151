/* SPDX-License-Identifier: Apache-2.0 */
/* The tensor-parallel MLP block: gate/up column-parallel on ffn, the activation on this rank's ffn columns
 * (no communication: SiLU-gating pairs gate and up columns of the same rank), down row-parallel on ffn, and
 * one reduction out (plus one gather in with sequence parallelism). The activation runs here on the host
 * and in mlp.cu on a device. */
#include <stdlib.h>
#include "comm/agree.h"
#include "tp/stages.h"
#include "tp/tp_internal.h"
#include "tp/tp_math.h"

struct dtl_tp_mlp {
  dtl_tp_context *ctx;
  dtl_tp_activation act;
  bool sp;
  int64_t hidden, ffn, f_local;
  dtl__tp_proj gate_up, down;
};

static dtl_placement dtl__tp_mlp_p(const dtl_tp_mlp *m) { return m->sp ? dtl_shard(0) : dtl_replicate(); }

/* This rank's block: the checks and copies of dtl_tp_mlp_create, before its agreement. */
static dtl_status dtl__tp_mlp_build(dtl_tp_context *ctx, const dtl_tp_mlp_params *p, dtl_tp_mlp **out) {
  static const char fn[] = "dtl_tp_mlp_create";
  DTL_CHECK_ARG(p != NULL, fn, "params=NULL");
  DTL_TRY(dtl__tp_check_bits(fn, "params", p->mask, DTL__BITS(DTL_TP_QUANT_WEIGHTS), p->flags,
                             DTL__BITS(DTL_TP_SEQUENCE_PARALLEL, DTL_TP_SHARDED_WEIGHTS, DTL_TP_FP8_GEMM)));
  bool quant = DTL__TP_QUANT(p->mask);
  DTL_TRY(dtl__tp_check_quant(fn, quant, p->flags, "gate_up", p->gate_up, "down", p->down));
  DTL_CHECK_ARG(p->activation == DTL_TP_ACT_SILU_GATED || p->activation == DTL_TP_ACT_GELU, fn,
                "activation=%d (expected DTL_TP_ACT_SILU_GATED or DTL_TP_ACT_GELU)", (int)p->activation);
  DTL_CHECK_ARG(p->hidden >= 1 && p->ffn >= 1, fn, "hidden=%lld ffn=%lld (expected >= 1)", (long long)p->hidden,
                (long long)p->ffn);
  DTL_CHECK_ARG(quant || p->gate_up != NULL, fn, "gate_up=NULL (the dense %s weight is required)",
                p->activation == DTL_TP_ACT_SILU_GATED ? "fused [2 ffn, hidden] gate/up" : "[ffn, hidden] up");
  DTL_CHECK_ARG(!quant || p->activation == DTL_TP_ACT_SILU_GATED || p->qgate == NULL, fn,
                "qgate is not NULL with DTL_TP_ACT_GELU (a GELU MLP has no gate: its [ffn, hidden] weight is qup)");
  DTL_CHECK_ARG(quant || p->down != NULL, fn, "down=NULL (the dense [hidden, ffn] weight is required)");
  DTL_TRY(dtl__tp_check_compute(ctx, fn));
  bool gated = p->activation == DTL_TP_ACT_SILU_GATED;
  size_t n;
  DTL_TRY(dtl__tp_count(fn, "gate_up", (gated ? 2 : 1) * p->ffn, p->hidden, &n));
  dtl_tp_mlp *m = dtl__calloc(1, sizeof *m);
  if (!m) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  m->ctx = ctx;
  m->act = p->activation;
  m->sp = (p->flags & DTL_TP_SEQUENCE_PARALLEL) != 0;
  m->hidden = p->hidden;
  m->ffn = p->ffn;
  dtl_tp_range f = dtl__tp_chunk(ctx, p->ffn, ctx->rank);
  m->f_local = f.count;
  /* Gate and up are split on their own and concatenated, so this rank's gate column j pairs with its up column j. */
  dtl__tp_rows rows[2] = {{f.offset, f.count}, {p->ffn + f.offset, f.count}};
  dtl__tp_rows all = {0, p->hidden};
  dtl_status st;
  bool sharded = (p->flags & DTL_TP_SHARDED_WEIGHTS) != 0;
  if (quant) {
    bool fp8 = (p->flags & DTL_TP_FP8_GEMM) != 0;
    dtl__tp_qneed gu[2] = {{"qgate", p->qgate, p->ffn, p->hidden, f.offset, f.count, 0, p->hidden},
                           {"qup", p->qup, p->ffn, p->hidden, f.offset, f.count, 0, p->hidden}};
    dtl__tp_qneed down = {"qdown", p->qdown, p->hidden, p->ffn, 0, p->hidden, f.offset, f.count};
    DTL_TRY_GOTO(dtl__tp_proj_init_quant(ctx, fn, &m->gate_up, gated ? gu : gu + 1, gated ? 2 : 1, fp8, sharded,
                                         p->gate_up_bias, rows, gated ? 2 : 1), st, fail);
    DTL_TRY_GOTO(dtl__tp_proj_init_quant(ctx, fn, &m->down, &down, 1, fp8, false, p->down_bias, &all, 1), st, fail);
  } else {
    DTL_TRY_GOTO(dtl__tp_proj_init(ctx, fn, &m->gate_up, sharded, p->gate_up, p->hidden, rows, gated ? 2 : 1, 0,
                                   p->hidden, p->gate_up_bias), st, fail);
    DTL_TRY_GOTO(dtl__tp_proj_init(ctx, fn, &m->down, sharded, p->down, p->ffn, &all, 1, f.offset, f.count,
                                   p->down_bias), st, fail);
  }
  *out = m;
  return DTL_OK;
fail:
  dtl_tp_mlp_destroy(m);
  return st;
}

dtl_status dtl_tp_mlp_create(dtl_tp_context *ctx, const dtl_tp_mlp_params *p, dtl_tp_mlp **out) {
  static const char fn[] = "dtl_tp_mlp_create";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  dtl_tp_mlp *m = NULL;
  dtl_status st = out ? dtl__tp_mlp_build(ctx, p, &m) : dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "out=NULL");
  uint64_t fp = st == DTL_OK ? DTL__TP_FP(ctx, fn, p->activation, p->hidden, p->ffn, (int64_t)p->flags, (int64_t)p->mask,
                                          p->gate_up_bias != NULL, p->down_bias != NULL) : 0;
  st = dtl__agree(ctx->comm, fn, fp, st);
  if (st != DTL_OK) {
    dtl_tp_mlp_destroy(m);
    return st;
  }
  *out = m;
  return DTL_OK;
}

dtl_status dtl_tp_mlp_layouts(const dtl_tp_mlp *m, int64_t tokens, dtl_layout **in, dtl_layout **out) {
  DTL_CHECK_ARG(m != NULL, "dtl_tp_mlp_layouts", "block=NULL");
  return dtl__tp_layouts(m->ctx, "dtl_tp_mlp_layouts", tokens, m->hidden, dtl__tp_mlp_p(m), m->hidden, dtl__tp_mlp_p(m),
                         in, out);
}

void dtl__tp_activate_host(dtl_tp_activation act, float *h, int64_t tokens, int64_t f, int64_t width) {
  for (int64_t t = 0; t < tokens; t++) {
    float *row = h + t * width;
    for (int64_t j = 0; j < f; j++)
      row[j] = act == DTL_TP_ACT_SILU_GATED ? dtl__silu_gated(row[j], row[f + j]) : dtl__gelu(row[j]);
  }
}

static dtl_status dtl__tp_activate(dtl_tp_context *ctx, dtl_tp_activation act, void *h, int64_t tokens, int64_t f,
                                   int64_t width) {
  if (dtl__tp_on_device(ctx)) {
#if DTL_HAVE_NCCL
    return dtl__tp_activate_cuda(act, h, tokens, f, width, ctx->dtype, ctx->gemm.stream);
#endif
  }
  dtl__tp_activate_host(act, h, tokens, f, width);
  return DTL_OK;
}

dtl_status dtl_tp_mlp_forward(dtl_tp_mlp *m, const dtl_layout *x_layout, const void *x, void *y) {
  static const char fn[] = "dtl_tp_mlp_forward";
  DTL_CHECK_ARG(m != NULL, fn, "block=NULL");
  dtl_tp_context *ctx = m->ctx;
  size_t e = ctx->elem;
  int64_t T = 0, width = m->gate_up.rows;
  void *h = NULL, *partial = NULL;
  dtl_status st = dtl__tp_input_check(ctx, fn, x_layout, m->hidden, dtl__tp_mlp_p(m), x, &T);
  if (st == DTL_OK && !y && dtl_layout_local_count(x_layout))
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "y=NULL with %zu elements", dtl_layout_local_count(x_layout));
  if (st == DTL_OK) st = dtl__tp_scratch(ctx, DTL__TP_WS_MID, (size_t)(T * width) * e, &h);
  if (st == DTL_OK) st = dtl__tp_scratch(ctx, DTL__TP_WS_PARTIAL, (size_t)(T * m->hidden) * e, &partial);
  if (st == DTL_OK) st = dtl__tp_proj_reserve(ctx, &m->gate_up, T);
  if (st == DTL_OK) st = dtl__tp_proj_reserve(ctx, &m->down, T);
  DTL_TRY(dtl__agree_checked(ctx->comm, fn, DTL__TP_FP(ctx, fn, m->act, m->hidden, m->ffn, T, m->sp), st));

  const void *xin;
  DTL_TRY(dtl__tp_input(ctx, m->hidden, dtl__tp_mlp_p(m), x, T, &xin));
  DTL_TRY(dtl__tp_proj_apply(ctx, &m->gate_up, true, T, xin, m->hidden, h, width));
  DTL_TRY(dtl__tp_activate(ctx, m->act, h, T, m->f_local, width));
  DTL_TRY(dtl__tp_proj_apply(ctx, &m->down, false, T, h, width, partial, m->hidden));
  return dtl__tp_reduce(ctx, T, m->hidden, m->sp, partial, m->down.bias, y);
}

void dtl_tp_mlp_destroy(dtl_tp_mlp *m) {
  if (!m) return;
  dtl__tp_proj_fini(m->ctx, &m->gate_up);
  dtl__tp_proj_fini(m->ctx, &m->down);
  dtl__free(m);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized projections: the checks of each quantized sub-weight against the layer (mesh, shape, the box this
 * rank computes with, packing units, part buffers), the copy of that box (quant/shard.h), and the GEMM that
 * dequantizes one bounded tile at a time into the context's scratch (compute/gemm_tiled.h), so that no rank ever
 * holds a dense weight: on the host the f32 tile kernel of src/quant and OpenBLAS, on a device the CUDA tile kernel
 * and cuBLAS, or an FP8 GEMM on cuBLASLt where DTL_TP_FP8_GEMM asks for it and the device has one. */
#include <string.h>
#include "compute/gemm_tiled.h"
#include "layout/qlayout_internal.h"
#include "tp/qproj.h"

static const char *const dtl__tp_qpart_names[DTL_QUANT_NUM_PARTS] = {"codes", "scales", "zeros", "g_idx"};

int64_t dtl__tp_qact_ld(int64_t cols) { return (cols + 15) / 16 * 16; }
size_t dtl__tp_qact_bytes(int64_t T, int64_t cols) { return ((size_t)(T * dtl__tp_qact_ld(cols)) + 15) / 16 * 16 + 16; }

dtl_status dtl__tp_check_quant(const char *fn, bool quant, uint64_t flags, const char *a, const void *pa, const char *b,
                               const void *pb) {
  DTL_CHECK_ARG(quant || !(flags & DTL_TP_FP8_GEMM), fn,
                "params.flags has DTL_TP_FP8_GEMM without DTL_TP_QUANT_WEIGHTS in params.mask (it applies to quantized "
                "weights only)");
  if (!quant) return DTL_OK;
  DTL_CHECK_ARG(pa == NULL && pb == NULL, fn,
                "%s is not NULL with DTL_TP_QUANT_WEIGHTS (the quantized q* weights are read instead; pass NULL)",
                pa ? a : b);
  return DTL_OK;
}

int64_t dtl__tp_qweight_rows(const dtl_tp_qweight *w) {
  return w && w->layout && w->layout->g.ndim == 2 ? w->layout->g.shape[0] : -1;
}

/* The text of a layout for a message (formatted only when a check fails: it may allocate). */
static const char *dtl__tp_qtext(const dtl_qlayout *L, char *buf, size_t cap) {
  if (dtl_qlayout_format(L, buf, cap) != DTL_OK) snprintf(buf, cap, "(layout)");
  return buf;
}

static void dtl__tp_qsub_destroy(dtl__tp_qsub *q) {
  if (!q) return;
#if DTL_HAVE_NCCL
  dtl__tp_qsub_fp8_fini(q);
#endif
  dtl__qshard_own_destroy(q->own);
  dtl__free(q);
}

void dtl__tp_qproj_fini(dtl_tp_context *ctx, dtl__tp_proj *p) {
  (void)ctx;
  for (int i = 0; i < p->nq; i++) dtl__tp_qsub_destroy(p->q[i]);
  p->nq = 0;
}

/* The TP placement a sub-weight's layout should have, for the message of a box that does not fit. */
static const char *dtl__tp_qcut_hint(const dtl__tp_qneed *n) {
  return n->cols < n->C ? "row-parallel: S(1) on the TP mesh dim, or Replicate"
                        : "column-parallel: S(0) on the TP mesh dim, or Replicate";
}

static dtl_status dtl__tp_qsub_create(dtl_tp_context *ctx, const char *fn, const dtl__tp_qneed *n, int64_t row0,
                                      bool fp8, dtl__tp_qsub **out) {
  const char *name = n->name;
  DTL_CHECK_ARG(n->w != NULL, fn, "%s=NULL (DTL_TP_QUANT_WEIGHTS: the quantized [%lld, %lld] weight is required)", name,
                (long long)n->R, (long long)n->C);
  const dtl_qlayout *L = n->w->layout;
  DTL_CHECK_ARG(L != NULL, fn, "%s.layout=NULL", name);
  char buf[256];
  DTL_CHECK_ARG(L->logical.mesh == ctx->mesh, fn, "%s.layout %s is on another mesh than the TP context", name,
                dtl__tp_qtext(L, buf, sizeof buf));
  DTL_CHECK_ARG(L->g.ndim == 2 && L->g.shape[0] == n->R && L->g.shape[1] == n->C, fn,
                "%s.layout %s: expected a [%lld, %lld] matrix", name, dtl__tp_qtext(L, buf, sizeof buf), (long long)n->R, (long long)n->C);
  const int64_t *ls = L->local.shape, *lo = L->local.offset;
  int64_t need_shape[2] = {n->rows, n->cols}, need_off[2] = {n->row0, n->col0};
  bool inside = true;
  for (int d = 0; d < 2; d++)
    if (need_shape[d] > 0 && (need_off[d] < lo[d] || need_off[d] + need_shape[d] > lo[d] + ls[d])) inside = false;
  DTL_CHECK_ARG(inside, fn,
                "%s.layout %s gives this rank (TP coordinate %d of %d) rows [%lld, %lld) x cols [%lld, %lld), which do "
                "not hold the rows [%lld, %lld) x cols [%lld, %lld) it computes with (%s)",
                name, dtl__tp_qtext(L, buf, sizeof buf), ctx->rank, ctx->size, (long long)lo[0], (long long)(lo[0] + ls[0]), (long long)lo[1],
                (long long)(lo[1] + ls[1]), (long long)n->row0, (long long)(n->row0 + n->rows), (long long)n->col0,
                (long long)(n->col0 + n->cols), dtl__tp_qcut_hint(n));
  for (int d = 0; d < 2; d++) {
    int64_t u = L->g.unit[d], a = need_off[d], b = need_off[d] + need_shape[d];
    DTL_CHECK_ARG(need_shape[d] == 0 || u <= 1 || (a % u == 0 && (b % u == 0 || b == L->g.shape[d])), fn,
                  "%s.layout %s: the %s [%lld, %lld) this rank computes with cut a packing unit of %lld (%s)", name, dtl__tp_qtext(L, buf, sizeof buf),
                  d ? "cols" : "rows", (long long)a, (long long)b, (long long)u,
                  L->g.unit_name[d] ? L->g.unit_name[d] : "packing unit");
  }
  const void *parts[DTL_QUANT_NUM_PARTS] = {NULL};
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    const dtl_qpart_box *b = &L->local.part[p];
    if (b->ndim < 0) continue;
    parts[p] = n->w->local.part[p];
    DTL_CHECK_ARG(parts[p] != NULL || b->bytes == 0, fn, "%s.local.part[%d] (%s)=NULL with %zu bytes", name, p,
                  dtl__tp_qpart_names[p], b->bytes);
  }
  dtl__tp_qsub *q = dtl__calloc(1, sizeof *q);
  if (!q) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  q->row0 = row0;
  q->rows = n->rows;
  q->cols = n->cols;
  char what[160];
  snprintf(what, sizeof what, "%s: %s", fn, name);
  dtl_status st = dtl__qshard_own_create(what, &ctx->comm->mem, &L->g, ls, lo, parts, need_shape, need_off, &q->own);
#if DTL_HAVE_NCCL
  if (st == DTL_OK && fp8 && dtl__tp_on_device(ctx)) st = dtl__tp_qsub_fp8_init(ctx, what, q);
#else
  (void)fp8;
#endif
  if (st != DTL_OK) {
    dtl__tp_qsub_destroy(q);
    return st;
  }
  *out = q;
  return DTL_OK;
}

dtl_status dtl__tp_proj_init_quant(dtl_tp_context *ctx, const char *fn, dtl__tp_proj *p, const dtl__tp_qneed *need,
                                   int n, bool fp8, bool bias_sharded, const void *bias, const dtl__tp_rows *bias_ranges,
                                   int nbias) {
  memset(p, 0, sizeof *p);
  dtl_status st = DTL_OK;
  int64_t rows = 0;
  for (int i = 0; i < n && st == DTL_OK; i++) {
    st = dtl__tp_qsub_create(ctx, fn, &need[i], rows, fp8, &p->q[i]);
    if (st == DTL_OK) {
      p->nq = i + 1;
      rows += need[i].rows;
    }
  }
  p->rows = rows;
  p->cols = n ? need[0].cols : 0;
  if (st == DTL_OK) st = dtl__tp_proj_bias(ctx, fn, p, bias_sharded, bias, bias_ranges, nbias);
  if (st != DTL_OK) dtl__tp_proj_fini(ctx, p);
  return st;
}

dtl_status dtl__tp_proj_reserve(dtl_tp_context *ctx, const dtl__tp_proj *p, int64_t tokens) {
  dtl_memory mem = dtl__tp_on_device(ctx) ? DTL_MEMORY_DEVICE : DTL_MEMORY_HOST;
  size_t tile = 0, act = 0;
  for (int i = 0; i < p->nq; i++) {
    const dtl__tp_qsub *q = p->q[i];
    if (q->fp8) { /* and the tile too, for a shape cuBLASLt turns down at the call */
      size_t a = dtl__tp_qact_bytes(tokens, q->cols);
      if (a > act) act = a;
    }
    int64_t e = dtl__gemm_tiling_elems(dtl__gemm_tiling_for(mem, q->rows, q->cols));
    /* A device tile of a half type is staged in f32 after it (qproj.h). */
    size_t b = mem == DTL_MEMORY_DEVICE && ctx->dtype != DTL_FLOAT32
                   ? dtl__tp_qtile_stage_offset(e, ctx->elem) + (size_t)e * sizeof(float)
                   : (size_t)e * ctx->elem;
    if (b > tile) tile = b;
  }
  void *unused;
  if (tile) DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_QTILE, tile, &unused));
  if (act) DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_QACT, act, &unused));
  return DTL_OK;
}

typedef struct {
  dtl_tp_context *ctx;
  const dtl__tp_qsub *q;
} dtl__tp_qtile_arg;

static dtl_status dtl__tp_qtile(void *user, int64_t r0, int64_t nr, int64_t c0, int64_t nc, void *tile, int64_t ldt) {
  const dtl__tp_qtile_arg *a = user;
#if DTL_HAVE_NCCL
  if (dtl__tp_on_device(a->ctx)) return dtl__tp_qtile_cuda(a->ctx, a->q, r0, nr, c0, nc, tile, ldt);
#endif
  dtl__qshard_dequant_tile(&a->q->own->s, 0, r0, nr, c0, nc, tile, ldt);
  return DTL_OK;
}

dtl_status dtl__tp_qproj_apply(dtl_tp_context *ctx, const dtl__tp_proj *p, float beta, int64_t tokens, const void *x,
                               int64_t ldx, void *y, int64_t ldy) {
  dtl_memory mem = dtl__tp_on_device(ctx) ? DTL_MEMORY_DEVICE : DTL_MEMORY_HOST;
  /* Taken by dtl__tp_proj_reserve before the forward's agreement: these calls find the slots big enough. */
  void *tile = ctx->ws[DTL__TP_WS_QTILE], *act = ctx->ws[DTL__TP_WS_QACT];
  for (int i = 0; i < p->nq; i++) {
    const dtl__tp_qsub *q = p->q[i];
    void *yq = (char *)y + (size_t)q->row0 * ctx->elem;
#if DTL_HAVE_NCCL
    if (q->fp8) {
      dtl_status st = dtl__tp_qsub_fp8_apply(ctx, q, beta, tokens, x, ldx, yq, ldy, act);
      if (st != DTL_ERR_UNSUPPORTED) { /* unsupported: this call's shape or alignment; the tiles take it */
        DTL_TRY(st);
        continue;
      }
    }
#else
    (void)act;
#endif
    dtl__tp_qtile_arg arg = {ctx, q};
    DTL_TRY(dtl__gemm_tiled(&ctx->gemm, ctx->dtype, tokens, q->rows, q->cols, x, ldx, dtl__tp_qtile, &arg, tile,
                            dtl__gemm_tiling_for(mem, q->rows, q->cols), beta, yq, ldy));
  }
  return DTL_OK;
}

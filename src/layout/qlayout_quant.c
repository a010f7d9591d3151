/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_quant_dequantize and dtl_quant_quantize: a rank's shard of a quantized layout through the host kernels of
 * src/quant (dequant.h, quantize.h), with the checks of the caller's buffers that the kernels trust. */
#include <string.h>
#include "layout/qlayout_internal.h"
#include "quant/dequant.h"
#include "quant/quantize.h"

static const char *const dtl__qpart_label[DTL_QUANT_NUM_PARTS] = {"codes", "scales", "zeros", "g_idx"};

/* Every part the format has and this rank holds bytes of has a buffer; a part the format lacks has none (a g_idx
 * passed to a tensor without act order is a mistake the caller should hear of). */
static dtl_status dtl__qbuf_check(const char *fn, const char *arg, const dtl_qlayout *l, void *const *parts) {
  char f[96];
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    const dtl_qpart_box *b = &l->local.part[p];
    if (b->ndim < 0) {
      if (parts[p]) {
        dtl__qformat_text(&l->g.fmt, f, sizeof f);
        return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s->part[%d] (%s) is not NULL, but %s has no %s", arg, p,
                             dtl__qpart_label[p], f, dtl__qpart_label[p]);
      }
      continue;
    }
    DTL_CHECK_ARG(parts[p] || b->bytes == 0, fn, "%s->part[%d] (%s)=NULL (expected %zu bytes)", arg, p,
                  dtl__qpart_label[p], b->bytes);
  }
  return DTL_OK;
}

static void dtl__qlayout_shard(const dtl_qlayout *l, const void *const *parts, dtl__qshard *s) {
  dtl__qshard_init(s, &l->g, l->local.shape, l->local.offset, parts);
}

dtl_status dtl_quant_dequantize(const dtl_qlayout *l, const dtl_qbuf *local, float *out) {
  static const char fn[] = "dtl_quant_dequantize";
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  DTL_CHECK_ARG(local != NULL, fn, "local=NULL");
  size_t count = l->logical.local_count;
  DTL_CHECK_ARG(out != NULL || count == 0, fn, "out=NULL (expected %zu floats)", count);
  DTL_TRY(dtl__qbuf_check(fn, "local", l, local->part));
  if (!l->logical.mesh->member) return DTL_OK;
  dtl__qshard s;
  dtl__qlayout_shard(l, (const void *const *)local->part, &s);
  DTL_TRY(dtl__qshard_check(fn, &s));
  if (count == 0) return DTL_OK;
  int nd = l->g.ndim;
  int64_t rows = nd >= 2 ? l->local.shape[nd - 2] : 1, cols = l->local.shape[nd - 1];
  int64_t mats = nd > 2 ? dtl__qbox_count(nd - 2, l->local.shape) : 1;
  for (int64_t m = 0; m < mats; m++) dtl__qshard_dequant_tile(&s, m, 0, rows, 0, cols, out + m * rows * cols, cols);
  return DTL_OK;
}

dtl_status dtl_quant_quantize(const dtl_qlayout *l, const float *dense_local, dtl_qbuf *local) {
  static const char fn[] = "dtl_quant_quantize";
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  DTL_CHECK_ARG(local != NULL, fn, "local=NULL");
  size_t count = l->logical.local_count;
  DTL_CHECK_ARG(dense_local != NULL || count == 0, fn, "dense_local=NULL (expected %zu floats)", count);
  DTL_TRY(dtl__qbuf_check(fn, "local", l, local->part));
  if (!l->logical.mesh->member) return DTL_OK;
  dtl__qshard s;
  dtl__qlayout_shard(l, (const void *const *)local->part, &s);
  return dtl__qshard_quantize(fn, &s, dense_local, local->part);
}

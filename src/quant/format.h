/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The geometry of a quantized format on one logical shape: what each part (codes,
 * scales, zeros, g_idx) looks like, how a dim of a part follows a dim of the logical tensor, the packing unit a cut
 * must respect, and the box of every part that a box of the logical tensor needs. Layouts (src/layout/qlayout.c),
 * plans, checkpoints and the dequantize kernels all take boxes from here, so they agree by construction. Pure math
 * on common/ only. */
#ifndef DTL_QUANT_FORMAT_H
#define DTL_QUANT_FORMAT_H

#include "common/internal.h"

#ifdef __cplusplus
extern "C" { /* dequant.cu includes this file */
#endif

/* How one dim of a part follows logical dim `src` (or no logical dim: DTL__QMAP_ONE):
 * - SAME:  the same extent and box (leading dims, unpacked code dims);
 * - PACK:  `n` logical elements per part element (GPTQ/AWQ: 8 codes per int32): extent N / n, box the units the
 *          logical box touches, [floor(lo/n), ceil(hi/n)) (a layout's boxes hold whole units: its cuts are checked);
 * - BYTES: GGUF blocks of `n` elements stored as `bytes` bytes: extent N / n * bytes, box the blocks the logical box
 *          touches, [floor(lo/n) * bytes, ceil(hi/n) * bytes);
 * - BLOCK: one part element per block of `n` logical elements (scales, zeros): extent ceil(N / n), box = the blocks
 *   the logical box touches, [floor(lo / n), ceil(hi / n)) (empty where the logical box is empty);
 * - WHOLE: every part element, whatever the logical box (act-order scales: any row may use any group);
 * - ONE:   an extent-1 dim (FP8_CHANNEL's scales [R, 1]), whole whatever the logical box.
 * Only BLOCK dims overlap between ranks (the block a cut splits goes to both sides); a part without them is cut
 * like a dense tensor and has a plain layout (qlayout's views). */
typedef enum { DTL__QMAP_SAME, DTL__QMAP_PACK, DTL__QMAP_BYTES, DTL__QMAP_BLOCK, DTL__QMAP_WHOLE, DTL__QMAP_ONE } dtl__qmap_kind;

typedef struct {
  dtl__qmap_kind kind;
  int src;            /* the logical dim */
  int64_t n, bytes;   /* PACK, BYTES, BLOCK: elements per unit; BYTES: bytes per block; WHOLE: the extent */
} dtl__qmap;

typedef struct {
  int ndim; /* -1: the format has no such part */
  dtl_dtype dtype;
  int64_t shape[DTL_MAX_TENSOR_DIMS]; /* global */
  dtl__qmap map[DTL_MAX_TENSOR_DIMS];
} dtl__qpart_geom;

typedef struct {
  dtl_quant_format fmt; /* resolved: every mask bit set, defaults filled in */
  int ndim;
  int64_t shape[DTL_MAX_TENSOR_DIMS]; /* logical */
  /* The packing unit of each logical dim: a cut must fall on a multiple of it. */
  int64_t unit[DTL_MAX_TENSOR_DIMS];
  const char *unit_name[DTL_MAX_TENSOR_DIMS]; /* "int32 of 8 codes", "q4_k block", ... (NULL for unit 1) */
  dtl__qpart_geom part[DTL_QUANT_NUM_PARTS];
} dtl__qgeom;

/* Validates fmt (mask, flags, fields that apply to the kind, their values) and the logical shape for it, and fills
 * g. Failures are DTL_ERR_INVALID_ARGUMENT "fn: fmt.<field>=<value> ..." or "fn: shape[d]=<n> ...". */
dtl_status dtl__qgeom_init(const char *fn, const dtl_quant_format *fmt, int ndim, const int64_t *shape, dtl__qgeom *g);

/* The box of part `part` that the logical box (lshape, loff) needs. */
void dtl__qgeom_part_box(const dtl__qgeom *g, int part, const int64_t *lshape, const int64_t *loff, int64_t *pshape,
                         int64_t *poff);

/* The blocks of part `part` that the logical box (lshape, loff) owns: along a BLOCK dim those whose first element
 * it holds, [ceil(lo / n), ceil(hi / n)); along WHOLE and ONE dims everything when it holds the dim's first element
 * (lo == 0 < hi), else nothing; along the other dims its box, as dtl__qgeom_part_box. The owned boxes of the ranks
 * of a layout that differ on a sharded coordinate are disjoint and together cover the part (where every dim of the
 * logical tensor is non-empty), so a redistribution takes each block from its one owner (redistribute/xmap.h). */
void dtl__qgeom_owned_box(const dtl__qgeom *g, int part, const int64_t *lshape, const int64_t *loff, int64_t *pshape,
                          int64_t *poff);

/* Elements of a box (the product of its extents; 1 for 0 dims). */
static inline int64_t dtl__qbox_count(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

/* The short text of a format: "fp8-block(128x128,f8e4m3)", "gptq(g128)", "q4_k". */
void dtl__qformat_text(const dtl_quant_format *f, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif

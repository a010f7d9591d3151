/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The quantized layout object, so that plans, checkpoints and the TP layers read its
 * geometry without accessor calls: the format's geometry, the logical (dequantized) layout, a plain layout for each
 * part that is cut like a dense tensor, and this rank's boxes. */
#ifndef DTL_LAYOUT_QLAYOUT_INTERNAL_H
#define DTL_LAYOUT_QLAYOUT_INTERNAL_H

#include "layout/layout_internal.h"
#include "quant/format.h"

struct dtl_qlayout {
  dtl__qgeom g;
  dtl_layout logical; /* f32, the dense layout of the logical shape */
  /* The parts without BLOCK dims (codes, g_idx, FP8_CHANNEL/TENSOR scales, act-order scales and zeros) as plain
   * layouts of their own dtype, whose boxes are those of dtl__qgeom_part_box for every coordinate (a GGUF byte dim
   * becomes [blocks, block bytes], so that it is cut in whole blocks). has_view false: the part has BLOCK dims (its
   * shards overlap where a cut splits a block) or the format lacks it. */
  bool has_view[DTL_QUANT_NUM_PARTS];
  dtl_layout view[DTL_QUANT_NUM_PARTS];
  dtl_qbox local; /* this rank's boxes (all empty outside the mesh) */
};

/* The boxes of the rank at coord (valid, not NULL). */
void dtl__qlayout_boxes(const dtl_qlayout *l, const int *coord, dtl_qbox *out);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The host kernels of the quantized formats: a shard as the kernels see it (the
 * logical box it covers and each part's box and pointer), the check of its scales, and dequantization one tile at a
 * time, so that a layer never holds a whole dense weight. Bit for bit the same values as the dense tensor's
 * dequantization at the same global indexes, whatever the cut. */
#ifndef DTL_QUANT_DEQUANT_H
#define DTL_QUANT_DEQUANT_H

#include "quant/format.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const dtl__qgeom *g;
  int64_t lshape[DTL_MAX_TENSOR_DIMS], loff[DTL_MAX_TENSOR_DIMS]; /* the logical box */
  /* Each part's box (dtl__qgeom_part_box of the logical box) and its host buffer (row-major over that box). */
  int64_t pshape[DTL_QUANT_NUM_PARTS][DTL_MAX_TENSOR_DIMS], poff[DTL_QUANT_NUM_PARTS][DTL_MAX_TENSOR_DIMS];
  const void *part[DTL_QUANT_NUM_PARTS];
} dtl__qshard;

/* Fills s for the logical box (lshape, loff) of g with the part buffers parts[DTL_QUANT_NUM_PARTS]. */
void dtl__qshard_init(dtl__qshard *s, const dtl__qgeom *g, const int64_t *lshape, const int64_t *loff,
                      const void *const *parts);
/* Checks what the kernels trust: every scale finite (GGUF: each block's d and dmin), zero points and g_idx in range.
 * DTL_ERR_INVALID_ARGUMENT "fn: <part> index <i> (global [..]) = <value> ..." on the first bad one. */
dtl_status dtl__qshard_check(const char *fn, const dtl__qshard *s);
/* Dequantizes local rows [r0, r0 + nr) x local cols [c0, c0 + nc) of matrix `mat` (the row-major index over the
 * local box's leading dims; 0 without leading dims; a 1-D GGUF tensor is one row) into out, f32 with leading
 * dimension ldo. Trusts its input (dtl__qshard_check first). A GGUF tile's columns need not be block-aligned. */
void dtl__qshard_dequant_tile(const dtl__qshard *s, int64_t mat, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                              float *out, int64_t ldo);
#if DTL_HAVE_NCCL
/* The same tile on the device, one thread per output element, bit for bit the host tile: s's part pointers are device
 * buffers and out a device buffer (leading dimension ldo) of the caller's current device; enqueued on stream (a
 * cudaStream_t). Trusts its input like the host kernel (check the scales where they are on the host). The host
 * tile is its emulation. DTL_ERR_CUDA when the launch fails. */
dtl_status dtl__qshard_dequant_tile_cuda(const dtl__qshard *s, int64_t mat, int64_t r0, int64_t nr, int64_t c0,
                                         int64_t nc, float *out, int64_t ldo, void *stream);
#endif

#ifdef __cplusplus
}
#endif

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. A quantized shard that a layer keeps: since the caller's weights are borrowed,
 * the layer copies, at creation, the parts that the logical box it computes with needs out of the caller's local
 * shard (a sub-box of it, or all of it), into its own buffers in the memory it computes in, keeps its own copy of
 * the format's geometry, and checks the copy once (dtl__qshard_check), so that the tile kernels can trust it on
 * every forward. */
#ifndef DTL_QUANT_SHARD_H
#define DTL_QUANT_SHARD_H

#include "comm/memory.h"
#include "quant/dequant.h"

typedef struct {
  dtl__qgeom g;   /* the copy that s.g points to (so the struct is never moved: it lives on the heap) */
  dtl__qshard s;  /* the kernels' view: the logical box kept, s.part[p] = part[p] */
  dtl__mem mem;
  void *part[DTL_QUANT_NUM_PARTS];
  size_t part_bytes[DTL_QUANT_NUM_PARTS];
} dtl__qshard_own;

/* Copies the parts of the logical box (shape, off) of g out of the source shard: the logical box (src_shape,
 * src_off) with part buffers src_parts in mem (row-major over their dtl__qgeom_part_box), which must hold it
 * (the caller checks that the box lies inside the source's and that its cuts fall on packing units). Then checks
 * the copy (on a device through a host copy of it). fn names the caller and its argument
 * ("dtl_tp_linear_create: qweight"). On failure *out is untouched and nothing is kept. */
dtl_status dtl__qshard_own_create(const char *fn, const dtl__mem *mem, const dtl__qgeom *g, const int64_t *src_shape,
                                  const int64_t *src_off, const void *const *src_parts, const int64_t *shape,
                                  const int64_t *off, dtl__qshard_own **out);
void dtl__qshard_own_destroy(dtl__qshard_own *o);

/* bytes of device memory at src into host memory at dst, complete on return (the device half, shard_cuda.c). */
#if DTL_HAVE_NCCL
dtl_status dtl__qshard_own_to_host(const dtl__mem *mem, void *dst, const void *src, size_t bytes);
#endif

#endif

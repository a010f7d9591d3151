/* SPDX-License-Identifier: Apache-2.0 */
/* The quantized shard a layer keeps (shard.h): the sub-box copy of every part and the one check. */
#include <string.h>
#include "quant/shard.h"

void dtl__qshard_own_destroy(dtl__qshard_own *o) {
  if (!o) return;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    if (o->part[p]) dtl__mem_free(&o->mem, o->part[p]);
  dtl__free(o);
}

/* The check of a copy in device memory: every part brought to the host (creation only; the codes come too,
 * since a GGUF block keeps its scales among its codes). */
static dtl_status dtl__qshard_own_check(const char *fn, dtl__qshard_own *o) {
  if (o->mem.ops->memory == DTL_MEMORY_HOST) return dtl__qshard_check(fn, &o->s);
#if DTL_HAVE_NCCL
  void *host[DTL_QUANT_NUM_PARTS] = {NULL};
  dtl_status st = DTL_OK;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS && st == DTL_OK; p++) {
    if (!o->part[p]) continue;
    host[p] = dtl__malloc(o->part_bytes[p] ? o->part_bytes[p] : 1);
    if (!host[p]) st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "%zu bytes of host memory to check part %d",
                                     o->part_bytes[p], p);
    else st = dtl__qshard_own_to_host(&o->mem, host[p], o->part[p], o->part_bytes[p]);
  }
  if (st == DTL_OK) {
    dtl__qshard h = o->s;
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) h.part[p] = host[p];
    st = dtl__qshard_check(fn, &h);
  }
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) dtl__free(host[p]);
  return st;
#else
  return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "device memory, but dtl was built without CUDA");
#endif
}

dtl_status dtl__qshard_own_create(const char *fn, const dtl__mem *mem, const dtl__qgeom *g, const int64_t *src_shape,
                                  const int64_t *src_off, const void *const *src_parts, const int64_t *shape,
                                  const int64_t *off, dtl__qshard_own **out) {
  dtl__qshard_own *o = dtl__calloc(1, sizeof *o);
  if (!o) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  o->g = *g;
  o->mem = *mem;
  dtl_status st = DTL_OK;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    const dtl__qpart_geom *pg = &g->part[p];
    if (pg->ndim < 0) continue;
    int64_t sshape[DTL_MAX_TENSOR_DIMS], soff[DTL_MAX_TENSOR_DIMS], dshape[DTL_MAX_TENSOR_DIMS], doff[DTL_MAX_TENSOR_DIMS];
    dtl__qgeom_part_box(g, p, src_shape, src_off, sshape, soff);
    dtl__qgeom_part_box(g, p, shape, off, dshape, doff);
    size_t es = dtl_dtype_size(pg->dtype), bytes = (size_t)dtl__qbox_count(pg->ndim, dshape) * es;
    DTL_TRY_GOTO(dtl__mem_alloc(mem, bytes ? bytes : 1, &o->part[p]), st, fail);
    o->part_bytes[p] = bytes;
    if (!bytes) continue;
    dtl__box_copy b = {.ndim = pg->ndim, .elem_size = es};
    for (int d = 0; d < pg->ndim; d++) {
      b.extent[d] = b.dst_shape[d] = dshape[d];
      b.src_shape[d] = sshape[d];
      b.src_off[d] = doff[d] - soff[d];
    }
    DTL_TRY_GOTO(dtl__mem_copy_box(mem, src_parts[p], o->part[p], &b), st, fail);
  }
  dtl__qshard_init(&o->s, &o->g, shape, off, (const void *const *)o->part);
  if ((st = dtl__qshard_own_check(fn, o)) != DTL_OK) { /* its message names fn already */
    dtl__qshard_own_destroy(o);
    return st;
  }
  *out = o;
  return DTL_OK;
fail:
  dtl__qshard_own_destroy(o);
  return dtl__error_prefix(st, "%s", fn);
}

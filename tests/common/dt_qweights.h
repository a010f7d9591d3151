/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized weights for the layer tests, built from dtl's public API alone: dense reals quantized on a replicated
 * layout (every block whole there), their dequantization (the weight of the dense oracle and of the dense layer),
 * and this rank's shard of some other cut, sliced out of the whole parts by dtl_qlayout_local_boxes. GPTQ's act-order
 * g_idx is scrambled after quantizing (any in-range map is a valid tensor) and Q4_K, which dtl does not quantize, gets
 * random blocks with finite d and dmin. */
#ifndef DT_QWEIGHTS_H
#define DT_QWEIGHTS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "dtl.h"

typedef struct {
  dtl_qlayout *whole, *cut;
  dtl_qbuf parts; /* the whole tensor's parts */
  dtl_qbuf local; /* this rank's slices of them for cut */
  float *w;       /* dequantize(whole), row-major over the logical shape */
  size_t count;
  dtl_tp_qweight q; /* {cut, local}: what a layer takes */
} dt_qweight;

static inline uint64_t dt_qrand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

/* dst = the box (shape, off) of the row-major array src of global shape gshape (elements of es bytes). */
static inline void dt_qslice(const void *src, int nd, const int64_t *gshape, size_t es, const int64_t *shape,
                             const int64_t *off, void *dst) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  int64_t idx[DTL_MAX_TENSOR_DIMS] = {0};
  for (int64_t i = 0; i < n; i++) {
    int64_t at = 0;
    for (int d = 0; d < nd; d++) at = at * gshape[d] + off[d] + idx[d];
    memcpy((char *)dst + (size_t)i * es, (const char *)src + (size_t)at * es, es);
    for (int d = nd - 1; d >= 0 && ++idx[d] == shape[d]; d--) idx[d] = 0;
  }
}

/* DTL_OK on success; the failing call's status otherwise (the caller reports dtl_last_error()). The dense values
 * are from_dense when given, else uniform in [-1, 1] from seed. */
static inline dtl_status dt_qweight_make_with(dt_qweight *w, const dtl_mesh *mesh, const dtl_quant_format *fmt,
                                              int ndim, const int64_t *shape, const dtl_placement *cut, unsigned seed,
                                              const float *from_dense) {
  memset(w, 0, sizeof *w);
  int mnd = dtl_mesh_ndim(mesh);
  dtl_placement rep[DTL_MAX_MESH_DIMS];
  for (int d = 0; d < mnd; d++) rep[d] = dtl_replicate();
  dtl_status st = dtl_qlayout_create(mesh, fmt, ndim, shape, rep, &w->whole);
  if (st == DTL_OK) st = dtl_qlayout_create(mesh, fmt, ndim, shape, cut, &w->cut);
  if (st != DTL_OK) return st;
  dtl_qbox all, mine;
  dtl_qlayout_local_boxes(w->whole, NULL, &all);
  dtl_qlayout_local_boxes(w->cut, NULL, &mine);
  w->count = 1;
  for (int d = 0; d < ndim; d++) w->count *= (size_t)shape[d];
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    if (all.part[p].ndim >= 0) {
      w->parts.part[p] = calloc(1, all.part[p].bytes + 8);
      w->local.part[p] = calloc(1, mine.part[p].bytes + 8);
    }
  w->w = malloc(sizeof(float) * (w->count + 1));
  float *dense = malloc(sizeof(float) * (w->count + 1));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 5;
  for (size_t i = 0; i < w->count; i++)
    dense[i] = from_dense ? from_dense[i] : (float)((int64_t)(dt_qrand(&s) % 2001) - 1000) / 1000.0f;
  dtl_quant_format f;
  dtl_qlayout_quant_format(w->whole, &f);
  if (f.kind == DTL_QUANT_GGUF_Q4_K) { /* random super-blocks of 144 bytes with d, dmin = small finite f16 */
    uint8_t *b = w->parts.part[DTL_QPART_CODES];
    for (size_t i = 0; i < all.part[DTL_QPART_CODES].bytes; i++) b[i] = (uint8_t)dt_qrand(&s);
    for (size_t i = 0; i + 144 <= all.part[DTL_QPART_CODES].bytes; i += 144) {
      uint16_t d = (uint16_t)(0x2000 + dt_qrand(&s) % 0x0800), dmin = (uint16_t)(0x1c00 + dt_qrand(&s) % 0x0800);
      memcpy(b + i, &d, 2);
      memcpy(b + i + 2, &dmin, 2);
    }
  } else {
    st = dtl_quant_quantize(w->whole, dense, &w->parts);
  }
  if (st == DTL_OK && (f.flags & DTL_QFMT_ACT_ORDER)) { /* g_idx [.., C]: a scrambled, in-range group map */
    int64_t C = shape[ndim - 1], G = all.part[DTL_QPART_SCALES].global_shape[ndim - 2];
    int32_t *g = w->parts.part[DTL_QPART_GIDX];
    for (size_t i = 0; i < all.part[DTL_QPART_GIDX].bytes / 4; i++) g[i] = (int32_t)(((int64_t)i % C * 5 + 3) % G);
  }
  free(dense);
  if (st == DTL_OK) st = dtl_quant_dequantize(w->whole, &w->parts, w->w);
  for (int p = 0; st == DTL_OK && p < DTL_QUANT_NUM_PARTS; p++)
    if (mine.part[p].ndim >= 0)
      dt_qslice(w->parts.part[p], mine.part[p].ndim, mine.part[p].global_shape, dtl_dtype_size(mine.part[p].dtype),
                mine.part[p].shape, mine.part[p].offset, w->local.part[p]);
  w->q.layout = w->cut;
  w->q.local = w->local;
  return st;
}

static inline dtl_status dt_qweight_make(dt_qweight *w, const dtl_mesh *mesh, const dtl_quant_format *fmt, int ndim,
                                         const int64_t *shape, const dtl_placement *cut, unsigned seed) {
  return dt_qweight_make_with(w, mesh, fmt, ndim, shape, cut, seed, NULL);
}
static inline dtl_status dt_qweight_make_from(dt_qweight *w, const dtl_mesh *mesh, const dtl_quant_format *fmt,
                                              int ndim, const int64_t *shape, const dtl_placement *cut,
                                              const float *dense) {
  return dt_qweight_make_with(w, mesh, fmt, ndim, shape, cut, 0, dense);
}

static inline void dt_qweight_free(dt_qweight *w) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    free(w->parts.part[p]);
    free(w->local.part[p]);
  }
  free(w->w);
  dtl_qlayout_destroy(w->whole);
  dtl_qlayout_destroy(w->cut);
  memset(w, 0, sizeof *w);
}

#endif

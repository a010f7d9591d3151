/* SPDX-License-Identifier: Apache-2.0 */
/* What the quantized-format tests share: a deterministic generator, random formats and shapes within what each
 * format holds, dense quantized tensors with random codes and finite scales, a reference dequantizer written
 * element by element from the formats' definitions (quant.h, ggml's block structs), independent of the kernels, and
 * the slice of a part by a box. */
#ifndef QUANT_TEST_UTIL_H
#define QUANT_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/half.h"
#include "dtl.h"

typedef struct {
  uint64_t s;
} qt_rng;

static inline uint64_t qt_next(qt_rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline int64_t qt_below(qt_rng *r, int64_t n) { return (int64_t)(qt_next(r) % (uint64_t)n); }
static inline int64_t qt_pick(qt_rng *r, const int64_t *v, int n) { return v[qt_below(r, n)]; }

/* A dense quantized tensor: the format, the logical shape and every part's full bytes. */
typedef struct {
  dtl_quant_format fmt; /* resolved */
  int ndim;
  int64_t shape[DTL_MAX_TENSOR_DIMS];
  int pndim[DTL_QUANT_NUM_PARTS]; /* -1: no such part */
  dtl_dtype pdtype[DTL_QUANT_NUM_PARTS];
  int64_t pshape[DTL_QUANT_NUM_PARTS][DTL_MAX_TENSOR_DIMS];
  void *part[DTL_QUANT_NUM_PARTS];
  size_t bytes[DTL_QUANT_NUM_PARTS];
} qt_tensor;

static inline void qt_tensor_free(qt_tensor *t) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(t->part[p]);
  memset(t, 0, sizeof *t);
}

/* A random format of kind k (block and group sizes 32/64/128, odd FP8 blocks, the three scale dtypes) and a random
 * shape it holds: 0-1 leading dims (experts), uneven rows and cols. */
static inline void qt_random_format(qt_rng *r, dtl_quant_kind k, dtl_quant_format *f, int *ndim, int64_t *shape) {
  memset(f, 0, sizeof *f);
  f->kind = k;
  static const int64_t blocks[] = {32, 64, 128, 1, 3, 5, 7, 48, 100};
  static const int64_t groups[] = {32, 64, 128, -1, 16, 8, 24};
  static const dtl_dtype sdt[] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};
  int lead = (int)qt_below(r, 3) == 0 ? 1 : 0;
  *ndim = lead + 2;
  if (lead) shape[0] = 1 + qt_below(r, 3);
  int64_t *R = &shape[lead], *C = &shape[lead + 1];
  if (k <= DTL_QUANT_FP8_TENSOR) {
    if (qt_below(r, 2)) {
      f->mask |= DTL_QFMT_CODE_DTYPE;
      f->code_dtype = qt_below(r, 2) ? DTL_FLOAT8_E4M3 : DTL_FLOAT8_E5M2;
    }
    if (qt_below(r, 2)) {
      f->mask |= DTL_QFMT_SCALE_DTYPE;
      f->scale_dtype = sdt[qt_below(r, 3)];
    }
    if (k == DTL_QUANT_FP8_BLOCK) {
      f->mask |= DTL_QFMT_BLOCK;
      f->block_rows = qt_pick(r, blocks, 9);
      f->block_cols = qt_pick(r, blocks, 9);
    }
    *R = 1 + qt_below(r, 200);
    *C = 1 + qt_below(r, 200);
  } else if (k == DTL_QUANT_GPTQ || k == DTL_QUANT_AWQ) {
    f->mask |= DTL_QFMT_GROUP;
    f->group = qt_pick(r, groups, 7);
    if (qt_below(r, 2)) {
      f->mask |= DTL_QFMT_SCALE_DTYPE;
      f->scale_dtype = sdt[qt_below(r, 3)];
    }
    if (k == DTL_QUANT_GPTQ && qt_below(r, 3) == 0) f->flags |= DTL_QFMT_ACT_ORDER;
    *R = 8 * (1 + qt_below(r, 24));
    *C = k == DTL_QUANT_GPTQ ? 8 * (1 + qt_below(r, 40)) : 1 + qt_below(r, 300);
  } else {
    int64_t be = k == DTL_QUANT_GGUF_Q4_K ? 256 : 32;
    if (qt_below(r, 4) == 0) { /* a 1-D GGUF tensor */
      *ndim = 1;
      shape[0] = be * (1 + qt_below(r, 6));
      return;
    }
    *R = 1 + qt_below(r, k == DTL_QUANT_GGUF_Q4_K ? 12 : 40);
    *C = be * (1 + qt_below(r, k == DTL_QUANT_GGUF_Q4_K ? 3 : 8));
  }
}

/* A random finite scale: +-(1 + u) * 2^e for e in -12..3, as the scale dtype stores it (bits). */
static inline uint32_t qt_random_scale(qt_rng *r, dtl_dtype t) {
  float v = ldexpf(1.0f + (float)qt_below(r, 1 << 20) / (float)(1 << 20), (int)qt_below(r, 16) - 12);
  if (qt_below(r, 4) == 0) v = -v;
  if (t == DTL_FLOAT16) return dtl__f32_to_f16(v);
  if (t == DTL_BFLOAT16) return dtl__f32_to_bf16(v);
  return dtl__f32_to_bits(v);
}

/* Fills t with random parts for the geometry a 1-rank layout reports (box = the whole part). */
static inline int qt_tensor_random(qt_rng *r, const dtl_quant_format *fmt, int ndim, const int64_t *shape, qt_tensor *t) {
  memset(t, 0, sizeof *t);
  dtl_mesh *m;
  if (dtl_mesh_create_abstract(1, (int[]){1}, NULL, &m) != DTL_OK) return -1;
  dtl_qlayout *l;
  dtl_status st = dtl_qlayout_create(m, fmt, ndim, shape, (dtl_placement[]){dtl_replicate()}, &l);
  if (st != DTL_OK) {
    dtl_mesh_destroy(m);
    return -1;
  }
  dtl_qbox b;
  dtl_qlayout_local_boxes(l, NULL, &b);
  dtl_qlayout_quant_format(l, &t->fmt);
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    t->pndim[p] = b.part[p].ndim;
    if (b.part[p].ndim < 0) continue;
    t->pdtype[p] = b.part[p].dtype;
    memcpy(t->pshape[p], b.part[p].global_shape, sizeof t->pshape[p]);
    t->bytes[p] = b.part[p].bytes;
    t->part[p] = malloc(t->bytes[p] + 1);
    uint8_t *u = t->part[p];
    for (size_t i = 0; i < t->bytes[p]; i++) u[i] = (uint8_t)qt_next(r);
  }
  const dtl_quant_format *f = &t->fmt;
  int nl = ndim >= 2 ? ndim - 2 : 0;
  if (f->kind <= DTL_QUANT_AWQ) {
    size_t n = t->bytes[DTL_QPART_SCALES] / dtl_dtype_size(f->scale_dtype);
    for (size_t i = 0; i < n; i++) {
      uint32_t v = qt_random_scale(r, f->scale_dtype);
      if (f->scale_dtype == DTL_FLOAT32) ((uint32_t *)t->part[DTL_QPART_SCALES])[i] = v;
      else ((uint16_t *)t->part[DTL_QPART_SCALES])[i] = (uint16_t)v;
    }
  }
  if (t->pndim[DTL_QPART_GIDX] >= 0) {
    int64_t groups = t->pshape[DTL_QPART_SCALES][nl];
    size_t n = t->bytes[DTL_QPART_GIDX] / 4;
    for (size_t i = 0; i < n; i++) ((int32_t *)t->part[DTL_QPART_GIDX])[i] = (int32_t)qt_below(r, groups);
  }
  if (f->kind >= DTL_QUANT_GGUF_Q8_0) { /* every block's d (and dmin): finite f16 */
    size_t bb = f->kind == DTL_QUANT_GGUF_Q8_0 ? 34 : f->kind == DTL_QUANT_GGUF_Q4_0 ? 18 : 144;
    uint8_t *u = t->part[DTL_QPART_CODES];
    for (size_t at = 0; at < t->bytes[DTL_QPART_CODES]; at += bb)
      for (size_t h = 0; h < (f->kind == DTL_QUANT_GGUF_Q4_K ? 4u : 2u); h += 2) {
        uint16_t d = (uint16_t)qt_random_scale(r, DTL_FLOAT16);
        u[at + h] = (uint8_t)(d & 0xff);
        u[at + h + 1] = (uint8_t)(d >> 8);
      }
  }
  dtl_qlayout_destroy(l);
  dtl_mesh_destroy(m);
  return 0;
}

static inline float qt_scale(const qt_tensor *t, int64_t i) {
  const void *s = t->part[DTL_QPART_SCALES];
  if (t->fmt.scale_dtype == DTL_FLOAT16) return dtl__f16_to_f32(((const uint16_t *)s)[i]);
  if (t->fmt.scale_dtype == DTL_FLOAT32) return ((const float *)s)[i];
  return dtl__bf16_to_f32(((const uint16_t *)s)[i]);
}

/* The value of logical element (mat, r, c), from the definitions alone. */
static inline float qt_ref_value(const qt_tensor *t, int64_t mat, int64_t r, int64_t c) {
  const dtl_quant_format *f = &t->fmt;
  int nd = t->ndim;
  int64_t R = nd >= 2 ? t->shape[nd - 2] : 1, C = t->shape[nd - 1];
  if (f->kind <= DTL_QUANT_FP8_TENSOR) {
    uint8_t code = ((const uint8_t *)t->part[DTL_QPART_CODES])[(mat * R + r) * C + c];
    float x = f->code_dtype == DTL_FLOAT8_E5M2 ? dtl__f8e5m2_to_f32(code) : dtl__f8e4m3_to_f32(code);
    int64_t si;
    if (f->kind == DTL_QUANT_FP8_BLOCK) {
      int64_t br = (R + f->block_rows - 1) / f->block_rows, bc = (C + f->block_cols - 1) / f->block_cols;
      si = (mat * br + r / f->block_rows) * bc + c / f->block_cols;
    } else if (f->kind == DTL_QUANT_FP8_CHANNEL) {
      si = mat * R + r;
    } else {
      si = mat;
    }
    return x * qt_scale(t, si);
  }
  if (f->kind == DTL_QUANT_GPTQ || f->kind == DTL_QUANT_AWQ) {
    static const int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    int64_t group = f->group == -1 ? C : f->group, G = (C + group - 1) / group;
    int64_t g = (f->flags & DTL_QFMT_ACT_ORDER) ? ((const int32_t *)t->part[DTL_QPART_GIDX])[mat * C + c] : c / group;
    const uint32_t *qw = t->part[DTL_QPART_CODES], *qz = t->part[DTL_QPART_ZEROS];
    uint32_t zw = qz[(mat * G + g) * (R / 8) + r / 8];
    int q, z;
    if (f->kind == DTL_QUANT_GPTQ) {
      q = (int)((qw[(mat * (C / 8) + c / 8) * R + r] >> (4 * (c % 8))) & 15);
      z = (int)((zw >> (4 * (r % 8))) & 15) + 1;
    } else {
      q = (int)((qw[(mat * C + c) * (R / 8) + r / 8] >> (4 * awq_nibble[r % 8])) & 15);
      z = (int)((zw >> (4 * awq_nibble[r % 8])) & 15);
    }
    return (float)(q - z) * qt_scale(t, (mat * G + g) * R + r);
  }
  int64_t be = f->kind == DTL_QUANT_GGUF_Q4_K ? 256 : 32;
  int64_t bb = f->kind == DTL_QUANT_GGUF_Q8_0 ? 34 : f->kind == DTL_QUANT_GGUF_Q4_0 ? 18 : 144;
  const uint8_t *blk = (const uint8_t *)t->part[DTL_QPART_CODES] + ((mat * R + r) * (C / be) + c / be) * bb;
  int j = (int)(c % be);
  float d = dtl__f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
  if (f->kind == DTL_QUANT_GGUF_Q8_0) return (float)(int8_t)blk[2 + j] * d;
  if (f->kind == DTL_QUANT_GGUF_Q4_0) return (float)((j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4) - 8) * d;
  /* Q4_K: sub-block is = j / 32 of 8, each with a 6-bit scale and min; bytes 32 * (is / 2) .. hold sub-blocks
   * is (low nibbles) and is + 1 (high nibbles) */
  float dmin = dtl__f16_to_f32((uint16_t)(blk[2] | blk[3] << 8));
  const uint8_t *sc = blk + 4, *qs = blk + 16;
  int is = j / 32, sub = is / 2;
  int q = is % 2 ? qs[32 * sub + j % 32] >> 4 : qs[32 * sub + j % 32] & 15;
  int s6, m6;
  if (is < 4) {
    s6 = sc[is] & 63;
    m6 = sc[is + 4] & 63;
  } else {
    s6 = (sc[is + 4] & 15) | ((sc[is - 4] >> 6) << 4);
    m6 = (sc[is + 4] >> 4) | ((sc[is] >> 6) << 4);
  }
  float d1 = d * (float)s6, m1 = dmin * (float)m6;
  volatile float prod = d1 * (float)q; /* two roundings, as ggml's reference (no FMA) */
  return prod - m1;
}

/* The quantization step of logical element (mat, r, c): the magnitude of its scale (FP8: the scale; GPTQ, AWQ: the
 * group's scale; Q8_0, Q4_0: the block's d). Not for Q4_K. */
static inline float qt_ref_step(const qt_tensor *t, int64_t mat, int64_t r, int64_t c) {
  const dtl_quant_format *f = &t->fmt;
  int nd = t->ndim;
  int64_t R = nd >= 2 ? t->shape[nd - 2] : 1, C = t->shape[nd - 1];
  if (f->kind == DTL_QUANT_FP8_BLOCK) {
    int64_t br = (R + f->block_rows - 1) / f->block_rows, bc = (C + f->block_cols - 1) / f->block_cols;
    return fabsf(qt_scale(t, (mat * br + r / f->block_rows) * bc + c / f->block_cols));
  }
  if (f->kind == DTL_QUANT_FP8_CHANNEL) return fabsf(qt_scale(t, mat * R + r));
  if (f->kind == DTL_QUANT_FP8_TENSOR) return fabsf(qt_scale(t, mat));
  if (f->kind == DTL_QUANT_GPTQ || f->kind == DTL_QUANT_AWQ) {
    int64_t group = f->group == -1 ? C : f->group, G = (C + group - 1) / group;
    int64_t g = (f->flags & DTL_QFMT_ACT_ORDER) ? ((const int32_t *)t->part[DTL_QPART_GIDX])[mat * C + c] : c / group;
    return fabsf(qt_scale(t, (mat * G + g) * R + r));
  }
  int64_t bb = f->kind == DTL_QUANT_GGUF_Q8_0 ? 34 : 18;
  const uint8_t *blk = (const uint8_t *)t->part[DTL_QPART_CODES] + ((mat * R + r) * (C / 32) + c / 32) * bb;
  return fabsf(dtl__f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)));
}

/* The zero point of logical element (mat, r, c) of a GPTQ (stored + 1) or AWQ tensor. */
static inline int qt_ref_zero(const qt_tensor *t, int64_t mat, int64_t r, int64_t c) {
  static const int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  const dtl_quant_format *f = &t->fmt;
  int nd = t->ndim;
  int64_t R = t->shape[nd - 2], C = t->shape[nd - 1];
  int64_t group = f->group == -1 ? C : f->group, G = (C + group - 1) / group;
  int64_t g = (f->flags & DTL_QFMT_ACT_ORDER) ? ((const int32_t *)t->part[DTL_QPART_GIDX])[mat * C + c] : c / group;
  uint32_t zw = ((const uint32_t *)t->part[DTL_QPART_ZEROS])[(mat * G + g) * (R / 8) + r / 8];
  if (f->kind == DTL_QUANT_GPTQ) return (int)((zw >> (4 * (r % 8))) & 15) + 1;
  return (int)((zw >> (4 * awq_nibble[r % 8])) & 15);
}

/* Copies the box (shape, off) of a row-major tensor (gshape, es bytes per element) into dst. */
static inline void qt_slice(const void *src, int ndim, const int64_t *gshape, size_t es, const int64_t *shape,
                            const int64_t *off, void *dst) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  for (int64_t e = 0; e < n; e++) {
    int64_t rest = e, g = 0, idx[DTL_MAX_TENSOR_DIMS];
    for (int d = ndim - 1; d >= 0; d--) {
      idx[d] = off[d] + rest % shape[d];
      rest /= shape[d];
    }
    for (int d = 0; d < ndim; d++) g = g * gshape[d] + idx[d];
    memcpy((char *)dst + e * es, (const char *)src + g * es, es);
  }
}

#endif

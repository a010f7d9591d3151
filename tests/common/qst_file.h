/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized checkpoints for the tests, built without dtl: the dense parts of a quantized tensor (codes, scales,
 * zeros, g_idx) with the shapes each format stores (the table of <dtl/quant.h>, computed here on its own),
 * deterministic contents (finite scales, g_idx inside the groups), the Hugging Face names under a prefix, and a
 * safetensors file written byte by byte, so that any dtype string can be used (F8_E4M3 before the dtype table
 * knows it, wrong ones on purpose). qst_slice cuts the slice of a dense part that a box names, the oracle of a read.
 * Plain C on the public headers: checks go through the caller (the functions return false or NULL on failure). */
#ifndef DTL_TESTS_QST_FILE_H
#define DTL_TESTS_QST_FILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtl.h"

/* One tensor of a hand-written file. */
typedef struct {
  char name[160];
  const char *dtype; /* the safetensors dtype string */
  int ndim;
  int64_t shape[8];
  const void *data;
  size_t bytes;
} qst_tensor;

/* Writes the tensors, in the order given, as a safetensors file (header padded with spaces to 8 bytes). */
static inline bool qst_write(const char *path, const qst_tensor *t, int n) {
  size_t cap = 256 + (size_t)n * 400, at = 0;
  char *h = malloc(cap);
  if (!h) return false;
  uint64_t off = 0;
  at += (size_t)snprintf(h + at, cap - at, "{");
  for (int i = 0; i < n; i++) {
    at += (size_t)snprintf(h + at, cap - at, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t[i].name,
                           t[i].dtype);
    for (int d = 0; d < t[i].ndim; d++)
      at += (size_t)snprintf(h + at, cap - at, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
    at += (size_t)snprintf(h + at, cap - at, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                           (unsigned long long)(off + t[i].bytes));
    off += t[i].bytes;
  }
  at += (size_t)snprintf(h + at, cap - at, "}");
  while (at % 8) h[at++] = ' ';
  FILE *fp = fopen(path, "wb");
  bool ok = fp != NULL;
  unsigned char l8[8];
  for (int i = 0; i < 8; i++) l8[i] = (unsigned char)((uint64_t)at >> (8 * i));
  ok = ok && fwrite(l8, 1, 8, fp) == 8 && fwrite(h, 1, at, fp) == at;
  for (int i = 0; ok && i < n; i++) ok = !t[i].bytes || fwrite(t[i].data, 1, t[i].bytes, fp) == t[i].bytes;
  if (fp) ok = fclose(fp) == 0 && ok;
  free(h);
  return ok;
}

/* A quantized tensor's dense parts. */
typedef struct {
  dtl_quant_format fmt; /* as given */
  int ndim;             /* of the logical tensor */
  int64_t shape[8];
  qst_tensor part[DTL_QUANT_NUM_PARTS]; /* ndim -1: the format has no such part */
  unsigned char *data[DTL_QUANT_NUM_PARTS];
  size_t es[DTL_QUANT_NUM_PARTS];
} qst_qtensor;

static inline uint64_t qst_rand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

static inline const char *qst_st_dtype(dtl_dtype t) {
  switch (t) {
    case DTL_FLOAT32: return "F32";
    case DTL_FLOAT16: return "F16";
    case DTL_BFLOAT16: return "BF16";
    case DTL_INT32: return "I32";
    case DTL_FLOAT8_E4M3: return "F8_E4M3";
    case DTL_FLOAT8_E5M2: return "F8_E5M2";
    default: return "?";
  }
}

static inline void qst_set_part(qst_qtensor *q, int p, const char *prefix, const char *suffix, dtl_dtype t, int nd,
                                const int64_t *shape) {
  qst_tensor *x = &q->part[p];
  snprintf(x->name, sizeof x->name, "%s.%s", prefix, suffix);
  x->dtype = qst_st_dtype(t);
  x->ndim = nd;
  size_t n = 1;
  for (int d = 0; d < nd; d++) n *= (size_t)(x->shape[d] = shape[d]);
  q->es[p] = dtl_dtype_size(t);
  x->bytes = n * q->es[p];
}

/* The parts of format fmt on the logical shape (ndim >= 2: [L.., R, C]) under prefix, filled from seed: codes and
 * zeros any bits, scales finite in [1/64, 4) (FP8: f32 unless fmt sets scale_dtype), g_idx (act-order GPTQ) a
 * scrambled group of each input channel. Returns false for a GGUF kind or no memory. */
static inline bool qst_make(qst_qtensor *q, const dtl_quant_format *fmt, int ndim, const int64_t *shape,
                            const char *prefix, unsigned seed) {
  memset(q, 0, sizeof *q);
  q->fmt = *fmt;
  q->ndim = ndim;
  memcpy(q->shape, shape, (size_t)ndim * sizeof *shape);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) q->part[p].ndim = -1;
  int nl = ndim - 2;
  int64_t R = shape[nl], C = shape[nl + 1], s[8];
  for (int d = 0; d < nl; d++) s[d] = shape[d];
  bool fp8 = fmt->kind <= DTL_QUANT_FP8_TENSOR;
  dtl_dtype ct = fmt->mask & DTL_QFMT_CODE_DTYPE ? fmt->code_dtype : DTL_FLOAT8_E4M3;
  dtl_dtype st = fmt->mask & DTL_QFMT_SCALE_DTYPE ? fmt->scale_dtype : fp8 ? DTL_FLOAT32 : DTL_FLOAT16;
  int64_t br = fmt->mask & DTL_QFMT_BLOCK ? fmt->block_rows : 128, bc = fmt->mask & DTL_QFMT_BLOCK ? fmt->block_cols : 128;
  int64_t group = fmt->mask & DTL_QFMT_GROUP ? fmt->group : 128;
  if (group == -1) group = C;
  int64_t G = (C + group - 1) / group;
  switch (fmt->kind) {
    case DTL_QUANT_FP8_BLOCK:
    case DTL_QUANT_FP8_CHANNEL:
    case DTL_QUANT_FP8_TENSOR:
      s[nl] = R, s[nl + 1] = C;
      qst_set_part(q, DTL_QPART_CODES, prefix, "weight", ct, ndim, s);
      if (fmt->kind == DTL_QUANT_FP8_BLOCK) {
        s[nl] = (R + br - 1) / br, s[nl + 1] = (C + bc - 1) / bc;
        qst_set_part(q, DTL_QPART_SCALES, prefix, "weight_scale_inv", st, ndim, s);
      } else if (fmt->kind == DTL_QUANT_FP8_CHANNEL) {
        s[nl] = R, s[nl + 1] = 1;
        qst_set_part(q, DTL_QPART_SCALES, prefix, "weight_scale", st, ndim, s);
      } else {
        qst_set_part(q, DTL_QPART_SCALES, prefix, "weight_scale", st, nl, s);
      }
      break;
    case DTL_QUANT_GPTQ:
    case DTL_QUANT_AWQ:
      if (fmt->kind == DTL_QUANT_GPTQ) s[nl] = C / 8, s[nl + 1] = R;
      else s[nl] = C, s[nl + 1] = R / 8;
      qst_set_part(q, DTL_QPART_CODES, prefix, "qweight", DTL_INT32, ndim, s);
      s[nl] = G, s[nl + 1] = R;
      qst_set_part(q, DTL_QPART_SCALES, prefix, "scales", st, ndim, s);
      s[nl + 1] = R / 8;
      qst_set_part(q, DTL_QPART_ZEROS, prefix, "qzeros", DTL_INT32, ndim, s);
      if (fmt->flags & DTL_QFMT_ACT_ORDER) {
        s[nl] = C;
        qst_set_part(q, DTL_QPART_GIDX, prefix, "g_idx", DTL_INT32, nl + 1, s);
      }
      break;
    default: return false;
  }
  uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    if (q->part[p].ndim < 0) continue;
    size_t n = q->part[p].bytes / q->es[p];
    q->data[p] = malloc(q->part[p].bytes + 1);
    if (!q->data[p]) return false;
    q->part[p].data = q->data[p];
    for (size_t i = 0; i < n; i++) {
      unsigned char *at = q->data[p] + i * q->es[p];
      if (p == DTL_QPART_SCALES) {
        float v = (float)(qst_rand(&r) % 255 + 1) / 64.0f;
        if (st == DTL_FLOAT32) memcpy(at, &v, 4);
        else {
          uint16_t h = st == DTL_FLOAT16 ? dtl_f32_to_f16(v) : dtl_f32_to_bf16(v);
          memcpy(at, &h, 2);
        }
      } else if (p == DTL_QPART_GIDX) {
        int32_t g = (int32_t)((((int64_t)i % C) * 7 + 3) % G);
        memcpy(at, &g, 4);
      } else {
        for (size_t b = 0; b < q->es[p]; b++) at[b] = (unsigned char)qst_rand(&r);
      }
    }
  }
  return true;
}

static inline void qst_free(qst_qtensor *q) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(q->data[p]);
  memset(q->data, 0, sizeof q->data);
}

/* Appends q's parts to the list t (n entries so far); returns the new count. */
static inline int qst_add(qst_tensor *t, int n, const qst_qtensor *q) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    if (q->part[p].ndim >= 0) t[n++] = q->part[p];
  return n;
}

/* The names of q's parts for dtl_safetensors_qread (NULL for the parts the format lacks). */
static inline void qst_names(const qst_qtensor *q, const char **names) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) names[p] = q->part[p].ndim >= 0 ? q->part[p].name : NULL;
}

/* The box (offset, shape; nd dims) of a row-major tensor of shape gs and es-byte elements, packed into out. */
static inline void qst_slice(const unsigned char *src, size_t es, int nd, const int64_t *gs, const int64_t *off,
                             const int64_t *shape, unsigned char *out) {
  int64_t n = 1, idx[8] = {0};
  for (int d = 0; d < nd; d++) n *= shape[d];
  for (int64_t i = 0; i < n; i++) {
    int64_t e = 0;
    for (int d = 0; d < nd; d++) e = e * gs[d] + off[d] + idx[d];
    memcpy(out + (size_t)i * es, src + (size_t)e * es, es);
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

#endif

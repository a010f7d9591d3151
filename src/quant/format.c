/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized formats: validation of a format on a logical shape, the parts it stores, and the box of each part that
 * a logical box needs (format.h). */
#include <string.h>
#include "quant/format.h"

static const char *const dtl__qkind_names[DTL_QUANT_NUM_KINDS] = {
    [DTL_QUANT_FP8_BLOCK] = "fp8-block", [DTL_QUANT_FP8_CHANNEL] = "fp8-channel", [DTL_QUANT_FP8_TENSOR] = "fp8-tensor",
    [DTL_QUANT_GPTQ] = "gptq",           [DTL_QUANT_AWQ] = "awq",                 [DTL_QUANT_GGUF_Q8_0] = "q8_0",
    [DTL_QUANT_GGUF_Q4_0] = "q4_0",      [DTL_QUANT_GGUF_Q4_K] = "q4_k",
};

const char *dtl_quant_kind_name(dtl_quant_kind k) {
  return (unsigned)k < DTL_QUANT_NUM_KINDS ? dtl__qkind_names[k] : NULL;
}

dtl_status dtl_quant_kind_parse(const char *text, dtl_quant_kind *out) {
  DTL_CHECK_ARG(text != NULL, "dtl_quant_kind_parse", "text=NULL");
  DTL_CHECK_ARG(out != NULL, "dtl_quant_kind_parse", "out=NULL");
  for (int k = 0; k < DTL_QUANT_NUM_KINDS; k++)
    if (!strcmp(text, dtl__qkind_names[k])) {
      *out = (dtl_quant_kind)k;
      return DTL_OK;
    }
  char q[DTL__QUOTE_CAP];
  return dtl__error(DTL_ERR_INVALID_ARGUMENT,
                    "dtl_quant_kind_parse: text=\"%s\" (expected fp8-block, fp8-channel, fp8-tensor, gptq, awq, q8_0, "
                    "q4_0 or q4_k)",
                    dtl__quote(text, q, sizeof q));
}

static bool dtl__qkind_fp8(dtl_quant_kind k) { return k <= DTL_QUANT_FP8_TENSOR; }
static bool dtl__qkind_int4(dtl_quant_kind k) { return k == DTL_QUANT_GPTQ || k == DTL_QUANT_AWQ; }
static bool dtl__qkind_gguf(dtl_quant_kind k) { return k >= DTL_QUANT_GGUF_Q8_0; }

/* GGUF blocks: elements and bytes per block (ggml's QK8_0/QK4_0/QK_K and the block structs' sizes). */
static void dtl__gguf_block(dtl_quant_kind k, int64_t *elems, int64_t *bytes) {
  *elems = k == DTL_QUANT_GGUF_Q4_K ? 256 : 32;
  *bytes = k == DTL_QUANT_GGUF_Q8_0 ? 34 : k == DTL_QUANT_GGUF_Q4_0 ? 18 : 144;
}

/* The bits of the mask that apply to a kind: the fields it reads. */
static uint64_t dtl__qfmt_fields(dtl_quant_kind k) {
  if (k == DTL_QUANT_FP8_BLOCK) return DTL_QFMT_BLOCK | DTL_QFMT_CODE_DTYPE | DTL_QFMT_SCALE_DTYPE;
  if (dtl__qkind_fp8(k)) return DTL_QFMT_CODE_DTYPE | DTL_QFMT_SCALE_DTYPE;
  if (dtl__qkind_int4(k)) return DTL_QFMT_GROUP | DTL_QFMT_SCALE_DTYPE;
  return 0;
}

static dtl_status dtl__qfmt_resolve(const char *fn, const dtl_quant_format *in, dtl_quant_format *f) {
  DTL_CHECK_ARG((unsigned)in->kind < DTL_QUANT_NUM_KINDS, fn, "fmt.kind=%d (expected 0..%d)", (int)in->kind,
                DTL_QUANT_NUM_KINDS - 1);
  dtl_quant_kind k = in->kind;
  DTL_TRY(dtl__check_bits(fn, "fmt.mask", in->mask,
                          DTL__BITS(DTL_QFMT_BLOCK, DTL_QFMT_GROUP, DTL_QFMT_CODE_DTYPE, DTL_QFMT_SCALE_DTYPE)));
  DTL_TRY(dtl__check_bits(fn, "fmt.flags", in->flags, DTL__BITS(DTL_QFMT_ACT_ORDER)));
  uint64_t fields = dtl__qfmt_fields(k), stray = in->mask & ~fields;
  DTL_CHECK_ARG(!stray, fn, "fmt.mask=0x%llx sets %s, which format %s does not have", (unsigned long long)in->mask,
                stray & DTL_QFMT_BLOCK ? "DTL_QFMT_BLOCK (block_rows, block_cols)"
                : stray & DTL_QFMT_GROUP ? "DTL_QFMT_GROUP (group)"
                : stray & DTL_QFMT_CODE_DTYPE ? "DTL_QFMT_CODE_DTYPE (code_dtype)"
                                              : "DTL_QFMT_SCALE_DTYPE (scale_dtype)",
                dtl__qkind_names[k]);
  DTL_CHECK_ARG(!(in->flags & DTL_QFMT_ACT_ORDER) || k == DTL_QUANT_GPTQ, fn,
                "fmt.flags has DTL_QFMT_ACT_ORDER, which only gptq has (fmt.kind=%s)", dtl__qkind_names[k]);
  memset(f, 0, sizeof *f);
  f->kind = k;
  f->mask = fields;
  f->flags = in->flags;
  f->block_rows = f->block_cols = 128;
  f->group = 128;
  f->code_dtype = dtl__qkind_fp8(k) ? DTL_FLOAT8_E4M3 : dtl__qkind_int4(k) ? DTL_INT32 : DTL_UINT8;
  f->scale_dtype = dtl__qkind_int4(k) || dtl__qkind_gguf(k) ? DTL_FLOAT16 : DTL_FLOAT32;
  if (in->mask & DTL_QFMT_BLOCK) {
    DTL_CHECK_ARG(in->block_rows >= 1, fn, "fmt.block_rows=%lld (expected >= 1)", (long long)in->block_rows);
    DTL_CHECK_ARG(in->block_cols >= 1, fn, "fmt.block_cols=%lld (expected >= 1)", (long long)in->block_cols);
    f->block_rows = in->block_rows;
    f->block_cols = in->block_cols;
  }
  if (in->mask & DTL_QFMT_GROUP) {
    DTL_CHECK_ARG(in->group >= 1 || in->group == -1, fn,
                  "fmt.group=%lld (expected >= 1, or -1 for one group over all input channels)", (long long)in->group);
    f->group = in->group;
  }
  if (in->mask & DTL_QFMT_CODE_DTYPE) {
    DTL_CHECK_ARG(in->code_dtype == DTL_FLOAT8_E4M3 || in->code_dtype == DTL_FLOAT8_E5M2, fn,
                  "fmt.code_dtype=%s (expected f8e4m3 or f8e5m2)",
                  dtl_dtype_name(in->code_dtype) ? dtl_dtype_name(in->code_dtype) : "(not a dtype)");
    f->code_dtype = in->code_dtype;
  }
  if (in->mask & DTL_QFMT_SCALE_DTYPE) {
    dtl_dtype t = in->scale_dtype;
    DTL_CHECK_ARG(t == DTL_FLOAT32 || t == DTL_FLOAT16 || t == DTL_BFLOAT16, fn,
                  "fmt.scale_dtype=%s (expected f32, f16 or bf16)", dtl_dtype_name(t) ? dtl_dtype_name(t) : "(not a dtype)");
    f->scale_dtype = t;
  }
  return DTL_OK;
}

static void dtl__qpart_set(dtl__qpart_geom *p, dtl_dtype t, int ndim, const dtl__qmap *maps, const int64_t *shape) {
  p->ndim = ndim;
  p->dtype = t;
  for (int d = 0; d < ndim; d++) {
    p->map[d] = maps[d];
    const dtl__qmap *m = &maps[d];
    int64_t n = m->kind == DTL__QMAP_ONE ? 1 : shape[m->src];
    switch (m->kind) {
      case DTL__QMAP_SAME: p->shape[d] = n; break;
      case DTL__QMAP_PACK: p->shape[d] = n / m->n; break;
      case DTL__QMAP_BYTES: p->shape[d] = n / m->n * m->bytes; break;
      case DTL__QMAP_BLOCK: p->shape[d] = n / m->n + (n % m->n != 0); break;
      case DTL__QMAP_WHOLE: p->shape[d] = m->n; break;
      case DTL__QMAP_ONE: p->shape[d] = 1; break;
    }
  }
}

dtl_status dtl__qgeom_init(const char *fn, const dtl_quant_format *fmt, int ndim, const int64_t *shape, dtl__qgeom *g) {
  DTL_CHECK_ARG(fmt != NULL, fn, "fmt=NULL");
  dtl_quant_format f;
  DTL_TRY(dtl__qfmt_resolve(fn, fmt, &f));
  dtl_quant_kind k = f.kind;
  int min_nd = dtl__qkind_gguf(k) ? 1 : 2;
  DTL_CHECK_ARG(ndim >= min_nd && ndim <= DTL_MAX_TENSOR_DIMS, fn, "ndim=%d (expected %d..%d for %s: [..., rows, cols])",
                ndim, min_nd, DTL_MAX_TENSOR_DIMS, dtl__qkind_names[k]);
  DTL_CHECK_ARG(shape != NULL, fn, "shape=NULL");
  for (int d = 0; d < ndim; d++)
    DTL_CHECK_ARG(shape[d] >= 0, fn, "shape[%d]=%lld (expected >= 0)", d, (long long)shape[d]);
  memset(g, 0, sizeof *g);
  g->fmt = f;
  g->ndim = ndim;
  memcpy(g->shape, shape, (size_t)ndim * sizeof *shape);
  for (int d = 0; d < ndim; d++) g->unit[d] = 1;
  int cd = ndim - 1, rd = ndim - 2; /* rd is -1 for a 1-D GGUF tensor */
  int64_t cols = shape[cd], rows = rd >= 0 ? shape[rd] : 1;
  /* Leading dims (and the row dim of the formats that do not transpose) go through every part unchanged. */
  dtl__qmap m[DTL_MAX_TENSOR_DIMS];
  int nl = ndim - 2 > 0 ? ndim - 2 : 0;
  for (int d = 0; d < nl; d++) m[d] = (dtl__qmap){DTL__QMAP_SAME, d, 1, 0};
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) g->part[p].ndim = -1;
  if (dtl__qkind_fp8(k)) {
    m[nl] = (dtl__qmap){DTL__QMAP_SAME, rd, 1, 0};
    m[nl + 1] = (dtl__qmap){DTL__QMAP_SAME, cd, 1, 0};
    dtl__qpart_set(&g->part[DTL_QPART_CODES], f.code_dtype, ndim, m, shape);
    if (k == DTL_QUANT_FP8_BLOCK) {
      m[nl] = (dtl__qmap){DTL__QMAP_BLOCK, rd, f.block_rows, 0};
      m[nl + 1] = (dtl__qmap){DTL__QMAP_BLOCK, cd, f.block_cols, 0};
      dtl__qpart_set(&g->part[DTL_QPART_SCALES], f.scale_dtype, ndim, m, shape);
    } else if (k == DTL_QUANT_FP8_CHANNEL) {
      m[nl + 1] = (dtl__qmap){DTL__QMAP_ONE, cd, 1, 0};
      dtl__qpart_set(&g->part[DTL_QPART_SCALES], f.scale_dtype, ndim, m, shape);
    } else {
      dtl__qpart_set(&g->part[DTL_QPART_SCALES], f.scale_dtype, nl, m, shape);
    }
  } else if (dtl__qkind_int4(k)) {
    bool gptq = k == DTL_QUANT_GPTQ, act = (f.flags & DTL_QFMT_ACT_ORDER) != 0;
    DTL_CHECK_ARG(rows % 8 == 0, fn, "shape[%d]=%lld rows (expected a multiple of 8: %s packs 8 %s per int32)", rd,
                  (long long)rows, dtl__qkind_names[k], gptq ? "zero points" : "codes and zero points");
    if (gptq)
      DTL_CHECK_ARG(cols % 8 == 0, fn, "shape[%d]=%lld cols (expected a multiple of 8: gptq packs 8 codes per int32)",
                    cd, (long long)cols);
    g->unit[rd] = 8;
    g->unit_name[rd] = gptq ? "int32 of 8 zero points" : "int32 of 8 codes";
    if (gptq) {
      g->unit[cd] = 8;
      g->unit_name[cd] = "int32 of 8 codes";
    }
    int64_t group = f.group == -1 ? (cols > 0 ? cols : 1) : f.group;
    int64_t groups = cols / group + (cols % group != 0);
    dtl__qmap gmap = act ? (dtl__qmap){DTL__QMAP_WHOLE, cd, groups, 0} : (dtl__qmap){DTL__QMAP_BLOCK, cd, group, 0};
    if (gptq) { /* qweight [C/8, R] */
      m[nl] = (dtl__qmap){DTL__QMAP_PACK, cd, 8, 0};
      m[nl + 1] = (dtl__qmap){DTL__QMAP_SAME, rd, 1, 0};
    } else { /* qweight [C, R/8] */
      m[nl] = (dtl__qmap){DTL__QMAP_SAME, cd, 1, 0};
      m[nl + 1] = (dtl__qmap){DTL__QMAP_PACK, rd, 8, 0};
    }
    dtl__qpart_set(&g->part[DTL_QPART_CODES], DTL_INT32, ndim, m, shape);
    m[nl] = gmap;
    m[nl + 1] = (dtl__qmap){DTL__QMAP_SAME, rd, 1, 0};
    dtl__qpart_set(&g->part[DTL_QPART_SCALES], f.scale_dtype, ndim, m, shape);
    m[nl + 1] = (dtl__qmap){DTL__QMAP_PACK, rd, 8, 0};
    dtl__qpart_set(&g->part[DTL_QPART_ZEROS], DTL_INT32, ndim, m, shape);
    if (act) {
      m[nl] = (dtl__qmap){DTL__QMAP_SAME, cd, 1, 0};
      dtl__qpart_set(&g->part[DTL_QPART_GIDX], DTL_INT32, nl + 1, m, shape);
    }
  } else {
    int64_t be, bb;
    dtl__gguf_block(k, &be, &bb);
    DTL_CHECK_ARG(cols % be == 0, fn, "shape[%d]=%lld (expected a multiple of %lld: %s stores blocks of %lld elements)",
                  cd, (long long)cols, (long long)be, dtl__qkind_names[k], (long long)be);
    g->unit[cd] = be;
    g->unit_name[cd] = k == DTL_QUANT_GGUF_Q8_0 ? "q8_0 block" : k == DTL_QUANT_GGUF_Q4_0 ? "q4_0 block" : "q4_k super-block";
    int n = 0;
    for (; n < ndim - 1; n++) m[n] = (dtl__qmap){DTL__QMAP_SAME, n, 1, 0};
    m[n] = (dtl__qmap){DTL__QMAP_BYTES, cd, be, bb};
    dtl__qpart_set(&g->part[DTL_QPART_CODES], DTL_UINT8, ndim, m, shape);
  }
  (void)rows;
  /* Every part's bytes must fit in size_t, like a dense layout's. */
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    const dtl__qpart_geom *pg = &g->part[p];
    if (pg->ndim < 0) continue;
    int64_t count = 1;
    for (int d = 0; d < pg->ndim; d++)
      DTL_CHECK_ARG(dtl__mul_i64(count, pg->shape[d], &count), fn, "shape overflows int64 elements in part %d", p);
    size_t bytes;
    DTL_CHECK_ARG((uint64_t)count <= SIZE_MAX && dtl__mul_size((size_t)count, dtl_dtype_size(pg->dtype), &bytes), fn,
                  "shape overflows size_t bytes in part %d", p);
  }
  return DTL_OK;
}

static int64_t dtl__qceil(int64_t a, int64_t n) { return a / n + (a % n != 0); }

void dtl__qgeom_part_box(const dtl__qgeom *g, int part, const int64_t *lshape, const int64_t *loff, int64_t *pshape,
                         int64_t *poff) {
  const dtl__qpart_geom *pg = &g->part[part];
  for (int d = 0; d < pg->ndim; d++) {
    const dtl__qmap *m = &pg->map[d];
    int64_t lo = loff[m->src], hi = lo + lshape[m->src];
    switch (m->kind) {
      case DTL__QMAP_SAME: poff[d] = lo; pshape[d] = hi - lo; break;
      /* the units the box touches, so that a box inside a unit still reaches its codes (a layout's boxes are
       * whole units: its cuts are checked) */
      case DTL__QMAP_PACK: poff[d] = lo / m->n; pshape[d] = hi == lo ? 0 : dtl__qceil(hi, m->n) - lo / m->n; break;
      case DTL__QMAP_BYTES:
        poff[d] = lo / m->n * m->bytes;
        pshape[d] = hi == lo ? 0 : (dtl__qceil(hi, m->n) - lo / m->n) * m->bytes;
        break;
      case DTL__QMAP_BLOCK:
        poff[d] = lo / m->n;
        pshape[d] = hi == lo ? 0 : (hi / m->n + (hi % m->n != 0)) - lo / m->n;
        break;
      case DTL__QMAP_WHOLE: poff[d] = 0; pshape[d] = m->n; break;
      case DTL__QMAP_ONE: poff[d] = 0; pshape[d] = 1; break;
    }
  }
}

void dtl__qgeom_owned_box(const dtl__qgeom *g, int part, const int64_t *lshape, const int64_t *loff, int64_t *pshape,
                          int64_t *poff) {
  const dtl__qpart_geom *pg = &g->part[part];
  dtl__qgeom_part_box(g, part, lshape, loff, pshape, poff);
  for (int d = 0; d < pg->ndim; d++) {
    const dtl__qmap *m = &pg->map[d];
    int64_t lo = loff[m->src], hi = lo + lshape[m->src];
    if (m->kind == DTL__QMAP_BLOCK) {
      int64_t a = lo / m->n + (lo % m->n != 0), b = hi / m->n + (hi % m->n != 0);
      poff[d] = a;
      pshape[d] = b > a ? b - a : 0;
    } else if ((m->kind == DTL__QMAP_WHOLE || m->kind == DTL__QMAP_ONE) && !(lo == 0 && hi > 0)) {
      pshape[d] = 0;
    }
  }
}

void dtl__qformat_text(const dtl_quant_format *f, char *buf, size_t cap) {
  const char *name = dtl_quant_kind_name(f->kind);
  if (!name) name = "?";
  if (f->kind == DTL_QUANT_FP8_BLOCK)
    snprintf(buf, cap, "%s(%lldx%lld,%s)", name, (long long)f->block_rows, (long long)f->block_cols,
             dtl_dtype_name(f->code_dtype));
  else if (f->kind == DTL_QUANT_FP8_CHANNEL || f->kind == DTL_QUANT_FP8_TENSOR)
    snprintf(buf, cap, "%s(%s)", name, dtl_dtype_name(f->code_dtype));
  else if (f->kind == DTL_QUANT_GPTQ || f->kind == DTL_QUANT_AWQ)
    snprintf(buf, cap, "%s(g%lld%s)", name, (long long)f->group, f->flags & DTL_QFMT_ACT_ORDER ? ",act-order" : "");
  else
    snprintf(buf, cap, "%s", name);
}

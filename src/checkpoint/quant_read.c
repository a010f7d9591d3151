/* SPDX-License-Identifier: Apache-2.0 */
/* Reading this rank's shard of a quantized tensor from a safetensors file. Every part (codes, scales, zeros, g_idx)
 * is a tensor of its own in the file, checked against the format's geometry (dtype, shape), and the box of it that
 * the rank needs (quant/format.h) is read by the dense box reader, so a rank reads only its bytes. The scales and
 * g_idx of those boxes are read once before anything is written, through a small host buffer, and checked: the
 * kernels index and multiply by them, and a failed read writes nothing. */
#define _GNU_SOURCE
#include <math.h>
#include <string.h>
#include "checkpoint/checkpoint_internal.h"
#include "common/half.h"
#include "layout/qlayout_internal.h"

/* The host buffer of the check phase: a quarter of the file's window (1 MiB; tests shrink the window), at least
 * one element of every dtype. Small, since scales are a sliver of a shard (1/16384 of FP8 block codes' elements,
 * 1/32 of GPTQ's bytes), and freed before the read phase takes the dense reader's window. */
static size_t dtl__st_qcheck_cap(const dtl_safetensors *f, size_t need) {
  size_t cap = f->window / 4 < 16 ? 16 : f->window / 4;
  return need < cap ? need : cap;
}

static const char *const dtl__qpart_names[DTL_QUANT_NUM_PARTS] = {"codes", "scales", "zeros", "g_idx"};
const char *dtl__st_qpart_name(int part) {
  return part >= 0 && part < DTL_QUANT_NUM_PARTS ? dtl__qpart_names[part] : "?";
}

void dtl__st_qboxes(const dtl__qgeom *g, const int64_t *lshape, const int64_t *loff, dtl_qbox *out) {
  memset(out, 0, sizeof *out);
  memcpy(out->shape, lshape, (size_t)g->ndim * sizeof *lshape);
  memcpy(out->offset, loff, (size_t)g->ndim * sizeof *loff);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    const dtl__qpart_geom *pg = &g->part[p];
    dtl_qpart_box *b = &out->part[p];
    b->ndim = pg->ndim;
    if (pg->ndim < 0) continue;
    b->dtype = pg->dtype;
    memcpy(b->global_shape, pg->shape, (size_t)pg->ndim * sizeof *pg->shape);
    dtl__qgeom_part_box(g, p, lshape, loff, b->shape, b->offset);
    b->bytes = (size_t)dtl__qbox_count(pg->ndim, b->shape) * dtl_dtype_size(pg->dtype);
  }
}

/* The safetensors name of a part's dtype: FP8 codes by their format names (F8_E4M3, F8_E5M2), whatever the dtype
 * table maps them to, so that a file's FP8 tensors are recognised by the name the format gives them. */
static const char *dtl__st_qdtype_name(dtl_dtype t) {
  if (t == DTL_FLOAT8_E4M3) return "F8_E4M3";
  if (t == DTL_FLOAT8_E5M2) return "F8_E5M2";
  return dtl__st_dtype_name(t);
}

/* Shapes equal once their dims of size 1 are dropped: the same elements in the same row-major order. */
static bool dtl__st_same_squeezed(int na, const int64_t *a, int nb, const int64_t *b) {
  int i = 0, j = 0;
  for (;;) {
    while (i < na && a[i] == 1) i++;
    while (j < nb && b[j] == 1) j++;
    if (i == na || j == nb) return i == na && j == nb;
    if (a[i++] != b[j++]) return false;
  }
}

/* Why dim d of part p of g has its extent: "ceil(500 / 128)" and the like. */
static void dtl__st_qdim_reason(const dtl__qgeom *g, int p, int d, char *buf, size_t cap) {
  const dtl__qmap *m = &g->part[p].map[d];
  long long n = m->kind == DTL__QMAP_ONE ? 1 : (long long)g->shape[m->src], k = (long long)m->n;
  switch (m->kind) {
    case DTL__QMAP_SAME: snprintf(buf, cap, "%lld (the tensor's dim %d)", n, m->src); break;
    case DTL__QMAP_PACK:
      snprintf(buf, cap, "%lld / %lld = %lld (the tensor's dim %d, %lld per int32)", n, k, n / k, m->src, k);
      break;
    case DTL__QMAP_BYTES:
      snprintf(buf, cap, "%lld / %lld * %lld = %lld (bytes of the blocks of the tensor's dim %d)", n, k,
               (long long)m->bytes, n / k * m->bytes, m->src);
      break;
    case DTL__QMAP_BLOCK:
      snprintf(buf, cap, "ceil(%lld / %lld) = %lld (blocks of the tensor's dim %d)", n, k, n / k + (n % k != 0), m->src);
      break;
    case DTL__QMAP_WHOLE: snprintf(buf, cap, "%lld (the groups of the tensor's dim %d)", k, m->src); break;
    case DTL__QMAP_ONE: snprintf(buf, cap, "1"); break;
  }
}

static dtl_status dtl__st_qpart_init(const dtl_safetensors *f, const char *fn, const char *name, const dtl__qgeom *g,
                                     int p, const dtl__st_tensor **out) {
  const dtl__qpart_geom *pg = &g->part[p];
  const dtl__st_tensor *t;
  DTL_TRY(dtl__st_find(f, fn, name, &t));
  char q[DTL__QUOTE_CAP], fmt[96], lshape[160];
  dtl__quote(t->name, q, sizeof q);
  dtl__qformat_text(&g->fmt, fmt, sizeof fmt);
  dtl__st_shape_str(g->ndim, g->shape, lshape, sizeof lshape);
  const char *want = dtl__st_qdtype_name(pg->dtype);
  if (!want || strcmp(t->dtype->name, want))
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: tensor \"%s\" (%s of %s%s): dtype=%s in the file, expected %s",
                         f->path, q, dtl__qpart_names[p], fmt, lshape, t->dtype->name, want ? want : "?");
  bool same = t->ndim == pg->ndim && !memcmp(t->shape, pg->shape, (size_t)pg->ndim * sizeof *pg->shape);
  /* A scales tensor may carry or drop dims of size 1 (FP8_TENSOR's scale as [] or [1], a channel scale as [R] or
   * [R, 1]): the bytes are the same. Other parts must have the format's shape exactly. */
  if (!same && !(p == DTL_QPART_SCALES && dtl__st_same_squeezed(t->ndim, t->shape, pg->ndim, pg->shape))) {
    char a[160], b[160], why[160] = "";
    if (t->ndim == pg->ndim)
      for (int d = 0; d < pg->ndim; d++)
        if (t->shape[d] != pg->shape[d]) {
          char r[112];
          dtl__st_qdim_reason(g, p, d, r, sizeof r);
          snprintf(why, sizeof why, ": dim %d is %lld, expected %s", d, (long long)t->shape[d], r);
          break;
        }
    if (!why[0])
      snprintf(why, sizeof why, ": %d dims, expected %d%s", t->ndim, pg->ndim,
               p == DTL_QPART_SCALES ? " (dims of size 1 aside)" : "");
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: tensor \"%s\" (%s of %s%s): shape=%s in the file, expected %s%s",
                         f->path, q, dtl__qpart_names[p], fmt, lshape, dtl__st_shape_str(t->ndim, t->shape, a, sizeof a),
                         dtl__st_shape_str(pg->ndim, pg->shape, b, sizeof b), why);
  }
  DTL_TRY(dtl__st_check_size(f, fn, t));
  *out = t;
  return DTL_OK;
}

dtl_status dtl__st_qsrc_init(const dtl_safetensors *f, const char *fn, const char *const *names, const dtl__qgeom *g,
                             const dtl_qbox *box, dtl__st_qsrc *out) {
  DTL_CHECK_ARG(f != NULL, fn, "file=NULL");
  DTL_CHECK_ARG(names != NULL, fn, "names=NULL");
  dtl__st_qsrc s;
  memset(&s, 0, sizeof s);
  s.g = g;
  const char *kind = dtl_quant_kind_name(g->fmt.kind);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    char q[DTL__QUOTE_CAP];
    if (g->part[p].ndim < 0) {
      DTL_CHECK_ARG(names[p] == NULL, fn, "names[%d]=\"%s\" (expected NULL: %s has no %s)", p,
                    dtl__quote(names[p], q, sizeof q), kind, dtl__qpart_names[p]);
      continue;
    }
    DTL_CHECK_ARG(names[p] != NULL, fn, "names[%d]=NULL (%s needs the tensor of its %s)", p, kind, dtl__qpart_names[p]);
    DTL_TRY(dtl__st_qpart_init(f, fn, names[p], g, p, &s.t[p]));
    /* The boxes come from the geometry; one outside the part would read another tensor's bytes. */
    for (int d = 0; d < g->part[p].ndim; d++)
      if (box->part[p].offset[d] < 0 || box->part[p].shape[d] < 0 ||
          box->part[p].offset[d] > g->part[p].shape[d] - box->part[p].shape[d])
        return dtl__error_fn(DTL_ERR_INTERNAL, fn, "%s: the box of the %s along dim %d (%lld+%lld) leaves the part (%lld)",
                             dtl__quote(names[p], q, sizeof q), dtl__qpart_names[p], d,
                             (long long)box->part[p].offset[d], (long long)box->part[p].shape[d],
                             (long long)g->part[p].shape[d]);
    memcpy(s.off[p], box->part[p].offset, sizeof s.off[p]);
    memcpy(s.box[p], box->part[p].shape, sizeof s.box[p]);
  }
  *out = s;
  return DTL_OK;
}

/* The runs of a box in a row-major view: dims 0..k-1 are walked, dims k.. form one contiguous run of `run`
 * elements (the trailing dims the box spans whole merge, as in the dense reader). */
typedef struct {
  int nd, k;
  int64_t view[DTL_MAX_TENSOR_DIMS], off[DTL_MAX_TENSOR_DIMS], box[DTL_MAX_TENSOR_DIMS];
  uint64_t stride[DTL_MAX_TENSOR_DIMS], run;
} dtl__st_qruns;

static void dtl__st_qruns_init(dtl__st_qruns *r, int nd, const int64_t *view, const int64_t *off, const int64_t *box) {
  memset(r, 0, sizeof *r);
  /* A 0-d part (FP8_TENSOR's scalar) is a box of one element. */
  r->nd = nd ? nd : 1;
  for (int d = 0; d < r->nd; d++) {
    r->view[d] = nd ? view[d] : 1;
    r->off[d] = nd ? off[d] : 0;
    r->box[d] = nd ? box[d] : 1;
  }
  uint64_t s = 1;
  for (int d = r->nd - 1; d >= 0; d--) {
    r->stride[d] = s;
    s *= (uint64_t)r->view[d];
  }
  int k = r->nd - 1;
  uint64_t run = (uint64_t)r->box[k];
  while (k > 0 && r->box[k] == r->view[k]) run *= (uint64_t)r->box[--k];
  r->k = k;
  r->run = run;
}

/* The global index (in the part) of element i of the run that starts at walk index idx, as "[a,b]". */
static const char *dtl__st_qruns_index(const dtl__st_qruns *r, const int64_t *idx, uint64_t i, int nd, char *buf,
                                       size_t cap) {
  int64_t at[DTL_MAX_TENSOR_DIMS];
  for (int d = r->nd - 1; d >= r->k; d--) {
    at[d] = r->off[d] + (int64_t)(i % (uint64_t)r->box[d]);
    i /= (uint64_t)r->box[d];
  }
  for (int d = 0; d < r->k; d++) at[d] = r->off[d] + idx[d];
  return dtl__st_shape_str(nd, at, buf, cap);
}

/* Reads the box of part p through stage (cap bytes) and checks each element. */
static dtl_status dtl__st_qcheck_part(const dtl_safetensors *f, const char *fn, const dtl__st_qsrc *s, int p,
                                      char *stage, size_t cap) {
  const dtl__st_tensor *t = s->t[p];
  const dtl__qpart_geom *pg = &s->g->part[p];
  dtl__st_qruns r;
  dtl__st_qruns_init(&r, pg->ndim, pg->shape, s->off[p], s->box[p]);
  uint64_t nruns = 1;
  for (int d = 0; d < r.k; d++) nruns *= (uint64_t)r.box[d];
  for (int d = 0; d < r.nd; d++)
    if (r.box[d] == 0) return DTL_OK;
  size_t es = t->dtype->size, per = cap / es;
  int64_t groups = p == DTL_QPART_GIDX ? s->g->part[DTL_QPART_SCALES].shape[s->g->ndim - 2] : 0;
  int64_t idx[DTL_MAX_TENSOR_DIMS] = {0};
  for (uint64_t k = 0; k < nruns; k++) {
    uint64_t e = (uint64_t)r.off[r.k] * r.stride[r.k];
    for (int d = 0; d < r.k; d++) e += (uint64_t)(r.off[d] + idx[d]) * r.stride[d];
    for (uint64_t done = 0; done < r.run;) {
      size_t n = r.run - done < per ? (size_t)(r.run - done) : per;
      DTL_TRY(dtl__st_pread(f, fn, stage, n * es, f->data_start + t->begin + (e + done) * es));
      for (size_t i = 0; i < n; i++) {
        const char *v = stage + i * es;
        bool bad;
        double x;
        if (p == DTL_QPART_GIDX) {
          int32_t gi;
          memcpy(&gi, v, 4);
          x = gi;
          bad = gi < 0 || gi >= groups;
        } else {
          uint16_t h;
          float y;
          if (pg->dtype == DTL_FLOAT32) memcpy(&y, v, 4);
          else {
            memcpy(&h, v, 2);
            y = pg->dtype == DTL_FLOAT16 ? dtl__f16_to_f32(h) : dtl__bf16_to_f32(h);
          }
          x = y;
          bad = !isfinite(y);
        }
        if (bad) {
          char q[DTL__QUOTE_CAP], at[160];
          dtl__st_qruns_index(&r, idx, done + i, pg->ndim, at, sizeof at);
          if (p == DTL_QPART_GIDX)
            return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                                 "%s: tensor \"%s\" (g_idx): element %s = %lld (expected a group 0..%lld)", f->path,
                                 dtl__quote(t->name, q, sizeof q), at, (long long)x, (long long)groups - 1);
          return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                               "%s: tensor \"%s\" (scales): element %s = %g (expected a finite scale)", f->path,
                               dtl__quote(t->name, q, sizeof q), at, x);
        }
      }
      done += n;
    }
    for (int d = r.k - 1; d >= 0; d--) {
      if (++idx[d] < r.box[d]) break;
      idx[d] = 0;
    }
  }
  return DTL_OK;
}

dtl_status dtl__st_qsrc_check(const dtl_safetensors *f, const char *fn, const dtl__st_qsrc *s) {
  size_t need = 0;
  for (int p = DTL_QPART_SCALES; p < DTL_QUANT_NUM_PARTS; p++) {
    if (!s->t[p] || p == DTL_QPART_ZEROS) continue; /* every bit pattern of packed zero points is a zero point */
    size_t b = dtl_dtype_size(s->g->part[p].dtype);
    for (int d = 0; d < s->g->part[p].ndim; d++) b *= (size_t)s->box[p][d];
    if (b > need) need = b;
  }
  if (!need) return DTL_OK;
  size_t cap = dtl__st_qcheck_cap(f, need);
  char *stage = dtl__malloc(cap);
  if (!stage) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory (%zu bytes to check scales)", cap);
  dtl_status st = DTL_OK;
  for (int p = DTL_QPART_SCALES; p < DTL_QUANT_NUM_PARTS && st == DTL_OK; p++)
    if (s->t[p] && p != DTL_QPART_ZEROS) st = dtl__st_qcheck_part(f, fn, s, p, stage, cap);
  dtl__free(stage);
  return st;
}

void dtl__st_qsrc_need(const dtl_safetensors *f, const dtl__st_qsrc *s, bool device, dtl__st_need *need) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    if (s->t[p]) dtl__st_box_need(f, s->t[p], s->g->part[p].ndim, s->g->part[p].shape, s->box[p], device, need);
}

dtl_status dtl__st_qsrc_read(const dtl_safetensors *f, const char *fn, const dtl__st_qsrc *s, dtl_comm *dev,
                             void *const *dst, const size_t *at, const dtl__st_scratch *sc) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    if (!s->t[p]) continue;
    const dtl__qpart_geom *pg = &s->g->part[p];
    /* The view is the format's shape of the part: a scales tensor stored with other dims of size 1 holds the
     * same bytes in the same order. */
    DTL_TRY(dtl__st_read_box_in(f, fn, s->t[p], pg->ndim, pg->shape, s->off[p], s->box[p], dev,
                                dtl__at(dst[p], at ? at[p] : 0, 1), sc));
  }
  return DTL_OK;
}

/* Hugging Face names: the suffix of each part, and the one tried when the first is not in the file. */
dtl_status dtl__st_qnames_hf(const dtl_safetensors *f, const char *fn, const dtl_quant_format *fmt, const char *prefix,
                             char (*buf)[DTL__ST_QNAME_CAP], const char **names) {
  DTL_CHECK_ARG(f != NULL, fn, "file=NULL");
  DTL_CHECK_ARG(prefix != NULL, fn, "prefix=NULL");
  const char *suffix[DTL_QUANT_NUM_PARTS] = {NULL}, *other_scale = NULL;
  switch (fmt->kind) {
    case DTL_QUANT_FP8_BLOCK:
      suffix[DTL_QPART_CODES] = "weight";
      suffix[DTL_QPART_SCALES] = "weight_scale_inv"; /* DeepSeek-V3, Qwen3-FP8 */
      other_scale = "weight_scale";                  /* compressed-tensors' block format */
      break;
    case DTL_QUANT_FP8_CHANNEL:
    case DTL_QUANT_FP8_TENSOR:
      suffix[DTL_QPART_CODES] = "weight";
      suffix[DTL_QPART_SCALES] = "weight_scale";
      other_scale = "weight_scale_inv";
      break;
    case DTL_QUANT_GPTQ:
    case DTL_QUANT_AWQ:
      suffix[DTL_QPART_CODES] = "qweight";
      suffix[DTL_QPART_SCALES] = "scales";
      suffix[DTL_QPART_ZEROS] = "qzeros";
      if (fmt->flags & DTL_QFMT_ACT_ORDER) suffix[DTL_QPART_GIDX] = "g_idx";
      break;
    default:
      return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "fmt.kind=%s: GGUF tensors are stored in .gguf files, not safetensors",
                           dtl_quant_kind_name(fmt->kind) ? dtl_quant_kind_name(fmt->kind) : "?");
  }
  size_t n = strlen(prefix);
  DTL_CHECK_ARG(n + 32 < DTL__ST_QNAME_CAP, fn, "prefix is %zu bytes (at most %d)", n, DTL__ST_QNAME_CAP - 33);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    names[p] = NULL;
    if (!suffix[p]) continue;
    snprintf(buf[p], DTL__ST_QNAME_CAP, "%s%s%s", prefix, n ? "." : "", suffix[p]);
    if (p == DTL_QPART_SCALES && !dtl_safetensors_dtype_name(f, buf[p])) {
      char alt[DTL__ST_QNAME_CAP];
      snprintf(alt, sizeof alt, "%s%s%s", prefix, n ? "." : "", other_scale);
      if (dtl_safetensors_dtype_name(f, alt)) memcpy(buf[p], alt, sizeof alt);
    }
    names[p] = buf[p];
  }
  return DTL_OK;
}

static dtl_status dtl__st_qread(const dtl_safetensors *f, const char *fn, const char *const *names,
                                const dtl_qlayout *layout, dtl_qbuf *local) {
  const dtl__qgeom *g = &layout->g;
  /* GGUF blocks carry their scales inside the codes, which the scale check would not see; they are .gguf's. */
  if (g->fmt.kind >= DTL_QUANT_GGUF_Q8_0)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "layout format %s: GGUF tensors are stored in .gguf files, not safetensors",
                         dtl_quant_kind_name(g->fmt.kind));
  DTL_CHECK_ARG(local != NULL, fn, "local=NULL");
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    DTL_CHECK_ARG(g->part[p].ndim < 0 || local->part[p] != NULL || layout->local.part[p].bytes == 0, fn,
                  "local->part[%d]=NULL (the %s of this rank hold %zu bytes)", p, dtl__qpart_names[p],
                  layout->local.part[p].bytes);
  dtl__st_qsrc s;
  DTL_TRY(dtl__st_qsrc_init(f, fn, names, g, &layout->local, &s));
  DTL_TRY(dtl__st_qsrc_check(f, fn, &s));
  dtl_comm *c = layout->logical.mesh->comm; /* NULL on an abstract mesh: host memory */
  dtl_comm *dev = c && c->mem.ops->memory == DTL_MEMORY_DEVICE ? c : NULL;
  dtl__st_need need = {false, 0};
  dtl__st_qsrc_need(f, &s, dev != NULL, &need);
  dtl__st_scratch sc = {NULL, NULL, 0};
  DTL_TRY(dtl__st_scratch_get(f, fn, &need, &sc));
  dtl_status st = dtl__st_qsrc_read(f, fn, &s, dev, local->part, NULL, &sc);
  dtl__st_scratch_put(&sc);
  return st;
}

dtl_status dtl_safetensors_qread(const dtl_safetensors *f, const char *const *names, const dtl_qlayout *layout,
                                 dtl_qbuf *local) {
  static const char fn[] = "dtl_safetensors_qread";
  DTL_CHECK_ARG(layout != NULL, fn, "layout=NULL");
  DTL_CHECK_ARG(f != NULL, fn, "file=NULL");
  DTL_CHECK_ARG(names != NULL, fn, "names=NULL");
  return dtl__st_qread(f, fn, names, layout, local);
}

dtl_status dtl_safetensors_qread_hf(const dtl_safetensors *f, const char *prefix, const dtl_qlayout *layout,
                                    dtl_qbuf *local) {
  static const char fn[] = "dtl_safetensors_qread_hf";
  DTL_CHECK_ARG(layout != NULL, fn, "layout=NULL");
  char buf[DTL_QUANT_NUM_PARTS][DTL__ST_QNAME_CAP];
  const char *names[DTL_QUANT_NUM_PARTS];
  DTL_TRY(dtl__st_qnames_hf(f, fn, &layout->g.fmt, prefix, buf, names));
  return dtl__st_qread(f, fn, names, layout, local);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized TP weight shards read straight from a safetensors checkpoint: for each split of load.c (column, row,
 * QKV by heads, attention output, gate/up) and for whole experts, the quantized layout of every sub-weight on the
 * context's mesh, and this rank's box of each of its parts read by the checkpoint's quantized reader into buffers
 * the shard owns. A sub-weight may be a row range of a fused file tensor, or (kv heads over more ranks than heads)
 * one head of it: its rows are then the file's rows shifted, which is exact when the shift keeps every scale block
 * and packing unit whole. */
#include <string.h>
#include "checkpoint/checkpoint_internal.h"
#include "layout/qlayout_internal.h"
#include "tp/tp_internal.h"

#define DTL__TP_QSUBS 3

struct dtl_tp_qshard {
  dtl_comm *comm; /* the memory of the parts: the context's TP communicator's */
  int n;
  dtl_qlayout *layout[DTL__TP_QSUBS];
  dtl_tp_qweight w[DTL__TP_QSUBS];
};

int dtl_tp_qshard_count(const dtl_tp_qshard *s) { return s ? s->n : -1; }

const dtl_tp_qweight *dtl_tp_qshard_weight(const dtl_tp_qshard *s, int i) {
  return s && i >= 0 && i < s->n ? &s->w[i] : NULL;
}

void dtl_tp_qshard_destroy(dtl_tp_qshard *s) {
  if (!s) return;
  for (int i = 0; i < DTL__TP_QSUBS; i++) {
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
      if (s->w[i].local.part[p]) dtl__mem_free(&s->comm->mem, s->w[i].local.part[p]);
    dtl_qlayout_destroy(s->layout[i]);
  }
  dtl__free(s);
}

/* One read of a file tensor (its parts) into sub-weight `sub`, at byte `at[part]` of each part's buffer. */
typedef struct {
  dtl__st_qsrc q;
  int sub;
  size_t at[DTL_QUANT_NUM_PARTS];
} dtl__tp_qread;

/* A shard in the making: layouts first, then the reads (each checked), then the scales of every read checked, then
 * the buffers, then the bytes; a failure at any step frees everything and writes no output. */
typedef struct {
  const dtl_tp_context *ctx;
  const char *fn;
  const dtl_safetensors *f;
  dtl_quant_format fmt;
  dtl_tp_qshard *s;
  dtl__qgeom g[DTL__TP_QSUBS]; /* the geometries of the file tensors (a read points at one) */
  dtl__tp_qread *reads;
  int nreads;
} dtl__tp_qjob;

static dtl_status dtl__tp_qjob_begin(dtl__tp_qjob *j, const dtl_tp_context *ctx, const char *fn,
                                     const dtl_safetensors *f, const dtl_quant_format *fmt, dtl_tp_qshard **out,
                                     int max_reads) {
  memset(j, 0, sizeof *j);
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(f != NULL, fn, "file=NULL");
  DTL_CHECK_ARG(fmt != NULL, fn, "fmt=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  j->ctx = ctx;
  j->fn = fn;
  j->f = f;
  j->fmt = *fmt;
  j->s = dtl__calloc(1, sizeof *j->s);
  j->reads = dtl__calloc((size_t)max_reads, sizeof *j->reads);
  if (!j->s || !j->reads) {
    dtl__free(j->s);
    dtl__free(j->reads);
    j->s = NULL, j->reads = NULL;
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  j->s->comm = ctx->comm;
  return DTL_OK;
}

static dtl_status dtl__tp_qjob_fail(dtl__tp_qjob *j, dtl_status st) {
  dtl_tp_qshard_destroy(j->s);
  dtl__free(j->reads);
  j->s = NULL, j->reads = NULL;
  return st;
}

/* Sub-weight i: the layout of shape [ndim] cut on the TP dim along tensor dim `dim`, Replicate elsewhere. */
static dtl_status dtl__tp_qjob_layout(dtl__tp_qjob *j, int i, const char *what, int ndim, const int64_t *shape,
                                      int dim) {
  dtl_placement pl[DTL_MAX_MESH_DIMS];
  for (int md = 0; md < j->ctx->mesh->ndim; md++) pl[md] = md == j->ctx->tp_dim ? dtl_shard(dim) : dtl_replicate();
  dtl_status st = dtl_qlayout_create(j->ctx->mesh, &j->fmt, ndim, shape, pl, &j->s->layout[i]);
  if (st != DTL_OK) {
    char q[DTL__QUOTE_CAP];
    return dtl__error_prefix(st, "%s: %s", j->fn, dtl__quote(what, q, sizeof q));
  }
  j->s->w[i].layout = j->s->layout[i];
  if (i >= j->s->n) j->s->n = i + 1;
  return DTL_OK;
}

/* A read of the file tensor `prefix` (Hugging Face part names) of geometry g, the logical box (lshape, loff) of it,
 * into sub-weight `sub` at byte at[part] (NULL: 0). Every part's box must have the shape the sub-weight's layout
 * gives it divided by `pieces` (the per-expert reads of a stacked layout). */
static dtl_status dtl__tp_qjob_read(dtl__tp_qjob *j, int sub, const dtl__qgeom *g, const char *prefix,
                                    const int64_t *lshape, const int64_t *loff, const size_t *at, int64_t pieces) {
  char buf[DTL_QUANT_NUM_PARTS][DTL__ST_QNAME_CAP];
  const char *names[DTL_QUANT_NUM_PARTS];
  DTL_TRY(dtl__st_qnames_hf(j->f, j->fn, &j->fmt, prefix, buf, names));
  dtl_qbox box;
  dtl__st_qboxes(g, lshape, loff, &box);
  const dtl_qbox *want = &j->s->layout[sub]->local;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    if (want->part[p].ndim < 0) continue;
    int64_t n = dtl__qbox_count(box.part[p].ndim, box.part[p].shape) * pieces;
    if (n != dtl__qbox_count(want->part[p].ndim, want->part[p].shape))
      return dtl__error_fn(DTL_ERR_INTERNAL, j->fn, "%s of sub-weight %d: %lld elements to read, the layout holds %lld",
                           dtl__st_qpart_name(p), sub, (long long)n,
                           (long long)dtl__qbox_count(want->part[p].ndim, want->part[p].shape));
  }
  dtl__tp_qread *r = &j->reads[j->nreads];
  DTL_TRY(dtl__st_qsrc_init(j->f, j->fn, names, g, &box, &r->q));
  r->sub = sub;
  if (at) memcpy(r->at, at, sizeof r->at);
  j->nreads++;
  return DTL_OK;
}

static dtl_status dtl__tp_qjob_finish(dtl__tp_qjob *j, dtl_tp_qshard **out) {
  dtl_status st = DTL_OK;
  for (int i = 0; i < j->nreads; i++) DTL_TRY_GOTO(dtl__st_qsrc_check(j->f, j->fn, &j->reads[i].q), st, fail);
  for (int i = 0; i < j->s->n; i++)
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
      size_t bytes = j->s->layout[i]->local.part[p].bytes;
      if (bytes) DTL_TRY_GOTO(dtl__mem_alloc(&j->s->comm->mem, bytes, &j->s->w[i].local.part[p]), st, fail);
    }
  dtl_comm *dev = dtl__tp_on_device(j->ctx) ? j->ctx->comm : NULL;
  dtl__st_need need = {false, 0};
  for (int i = 0; i < j->nreads; i++) dtl__st_qsrc_need(j->f, &j->reads[i].q, dev != NULL, &need);
  dtl__st_scratch sc = {NULL, NULL, 0};
  DTL_TRY_GOTO(dtl__st_scratch_get(j->f, j->fn, &need, &sc), st, fail);
  for (int i = 0; i < j->nreads && st == DTL_OK; i++) {
    const dtl__tp_qread *r = &j->reads[i];
    st = dtl__st_qsrc_read(j->f, j->fn, &r->q, dev, j->s->w[r->sub].local.part, r->at, &sc);
  }
  dtl__st_scratch_put(&sc);
  if (st != DTL_OK) goto fail;
  dtl__free(j->reads);
  *out = j->s;
  return DTL_OK;
fail:
  return dtl__tp_qjob_fail(j, st);
}

/* The rows of the logical tensor that every part dim of g following the row dim packs or blocks together (lcm of
 * GPTQ/AWQ's 8 and FP8_BLOCK's block_rows): a sub-weight's rows must start on a multiple of it in the file. */
static int64_t dtl__tp_qrow_unit(const dtl__qgeom *g) {
  int64_t u = 1;
  int rd = g->ndim - 2;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    for (int d = 0; d < g->part[p].ndim; d++) {
      const dtl__qmap *m = &g->part[p].map[d];
      if (m->src != rd || (m->kind != DTL__QMAP_PACK && m->kind != DTL__QMAP_BLOCK)) continue;
      int64_t a = u, b = m->n;
      while (b) {
        int64_t t = a % b;
        a = b, b = t;
      }
      u = u / a * m->n;
    }
  return u;
}

/* How a sub-weight's rows are cut. CHUNK: S(0) of its own rows (torch.chunk). REPEAT: one head of head_dim rows per
 * rank, the file's head `head` (kv heads over more ranks than heads: the layout is [tp * head_dim, cols], the heads
 * repeated tp / heads times in order, as Hugging Face's repeat_kv; rank r's shard is its kv head's rows). */
typedef struct {
  const char *prefix, *what;
  int64_t file_rows, row_base; /* the file tensor [file_rows, cols] and the sub-weight's first row in it */
  int64_t rows, cols;          /* the sub-weight */
  bool repeat;
  int64_t head_dim, head;
} dtl__tp_qrows;

/* The sub-weight i of rows r, cut on rows (column-parallel, by chunk or head): its layout, after the checks that
 * need no file (so that every sub-weight's geometry is checked before any tensor is looked at). */
static dtl_status dtl__tp_qjob_rows(dtl__tp_qjob *j, int i, const dtl__tp_qrows *r) {
  const char *fn = j->fn;
  char q[DTL__QUOTE_CAP];
  int64_t fshape[2] = {r->file_rows, r->cols};
  DTL_TRY(dtl__qgeom_init(fn, &j->fmt, 2, fshape, &j->g[i]));
  int64_t unit = dtl__tp_qrow_unit(&j->g[i]);
  if (r->row_base % unit)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn,
                         "%s \"%s\": its rows start at row %lld of the fused tensor, inside a unit of %lld rows that "
                         "%s packs or scales together (a scale block spanning two sub-weights)",
                         r->what, dtl__quote(r->prefix, q, sizeof q), (long long)r->row_base, (long long)unit,
                         dtl_quant_kind_name(j->fmt.kind));
  if (r->repeat && r->head_dim % unit)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn,
                         "%s \"%s\": tp=%d over fewer kv heads needs head_dim=%lld to be a multiple of the %lld rows "
                         "that %s packs or scales together (each rank reads one head)",
                         r->what, dtl__quote(r->prefix, q, sizeof q), j->ctx->size, (long long)r->head_dim,
                         (long long)unit, dtl_quant_kind_name(j->fmt.kind));
  int64_t shape[2] = {r->repeat ? (int64_t)j->ctx->size * r->head_dim : r->rows, r->cols};
  return dtl__tp_qjob_layout(j, i, r->prefix, 2, shape, 0);
}
/* Then its read: the layout's rows, shifted to where they are in the file tensor. */
static dtl_status dtl__tp_qjob_rows_read(dtl__tp_qjob *j, int i, const dtl__tp_qrows *r) {
  const dtl_qbox *lb = &j->s->layout[i]->local;
  int64_t off[2] = {r->row_base + (r->repeat ? r->head * r->head_dim : lb->offset[0]), lb->offset[1]};
  return dtl__tp_qjob_read(j, i, &j->g[i], r->prefix, lb->shape, off, NULL, 1);
}
/* Both, for n sub-weights. */
static dtl_status dtl__tp_qjob_subs(dtl__tp_qjob *j, const dtl__tp_qrows *r, int n) {
  for (int i = 0; i < n; i++) DTL_TRY(dtl__tp_qjob_rows(j, i, &r[i]));
  for (int i = 0; i < n; i++) DTL_TRY(dtl__tp_qjob_rows_read(j, i, &r[i]));
  return DTL_OK;
}

dtl_status dtl_tp_qweight_read_column(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                      const dtl_quant_format *fmt, const char *prefix, int64_t out, int64_t in,
                                      dtl_tp_qshard **shard) {
  static const char fn[] = "dtl_tp_qweight_read_column";
  DTL_CHECK_ARG(prefix != NULL, fn, "prefix=NULL");
  dtl__tp_qjob j;
  DTL_TRY(dtl__tp_qjob_begin(&j, ctx, fn, f, fmt, shard, 1));
  dtl__tp_qrows r = {.prefix = prefix, .what = "weight", .file_rows = out, .rows = out, .cols = in};
  dtl_status st = dtl__tp_qjob_subs(&j, &r, 1);
  return st == DTL_OK ? dtl__tp_qjob_finish(&j, shard) : dtl__tp_qjob_fail(&j, st);
}

dtl_status dtl_tp_qweight_read_row(const dtl_tp_context *ctx, const dtl_safetensors *f, const dtl_quant_format *fmt,
                                   const char *prefix, int64_t out, int64_t in, dtl_tp_qshard **shard) {
  static const char fn[] = "dtl_tp_qweight_read_row";
  DTL_CHECK_ARG(prefix != NULL, fn, "prefix=NULL");
  dtl__tp_qjob j;
  DTL_TRY(dtl__tp_qjob_begin(&j, ctx, fn, f, fmt, shard, 1));
  int64_t shape[2] = {out, in};
  dtl_status st = dtl__qgeom_init(fn, &j.fmt, 2, shape, &j.g[0]);
  if (st == DTL_OK) st = dtl__tp_qjob_layout(&j, 0, prefix, 2, shape, 1);
  if (st == DTL_OK) {
    const dtl_qbox *lb = &j.s->layout[0]->local;
    st = dtl__tp_qjob_read(&j, 0, &j.g[0], prefix, lb->shape, lb->offset, NULL, 1);
  }
  return st == DTL_OK ? dtl__tp_qjob_finish(&j, shard) : dtl__tp_qjob_fail(&j, st);
}

/* Whether every TP rank's heads of a [heads * head_dim, ...] dim are torch.chunk's rows of it (kv: the kv heads'
 * ranges, else the q heads'); *repeat when they are not but each rank has one replicated kv head (tp > kv_heads). */
static dtl_status dtl__tp_qheads(const dtl_tp_context *ctx, const char *fn, const char *what, bool kv, int64_t q_heads,
                                 int64_t kv_heads, int64_t head_dim, bool *repeat) {
  int64_t heads = kv ? kv_heads : q_heads;
  *repeat = false;
  for (int r = 0; r < ctx->size; r++) {
    dtl_tp_range q, k;
    DTL_TRY(dtl__tp_heads(ctx, fn, q_heads, kv_heads, r, &q, &k));
    dtl_tp_range h = kv ? k : q, c = dtl__tp_chunk(ctx, heads * head_dim, r);
    if (c.offset == h.offset * head_dim && c.count == h.count * head_dim) continue;
    if (kv && ctx->size > kv_heads) {
      *repeat = true; /* every rank: one kv head (dtl_tp_attention_heads), read from its rows */
      return DTL_OK;
    }
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn,
                         "q_heads=%lld kv_heads=%lld head_dim=%lld over tp=%d: rank %d's %s heads %lld..%lld are rows "
                         "%lld..%lld of %s, not torch.chunk's %lld..%lld, which a quantized layout cuts; quantized "
                         "q/k/v and attention output need kv_heads %% tp == 0 or tp %% kv_heads == 0 (the dense "
                         "readers take any split)",
                         (long long)q_heads, (long long)kv_heads, (long long)head_dim, ctx->size, r, kv ? "kv" : "q",
                         (long long)h.offset, (long long)(h.offset + h.count - 1), (long long)(h.offset * head_dim),
                         (long long)((h.offset + h.count) * head_dim - 1), what, (long long)c.offset,
                         (long long)(c.offset + c.count - 1));
  }
  return DTL_OK;
}

static dtl_status dtl__tp_qhead_dims(const char *fn, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t *qn,
                                     int64_t *kn) {
  DTL_CHECK_ARG(head_dim >= 1, fn, "head_dim=%lld (expected >= 1)", (long long)head_dim);
  int64_t t;
  DTL_CHECK_ARG(q_heads >= 1 && kv_heads >= 1 && dtl__mul_i64(q_heads, head_dim, qn) &&
                    dtl__mul_i64(kv_heads, head_dim, kn) && dtl__mul_i64(*kn, 2, &t) && !__builtin_add_overflow(*qn, t, &t),
                fn, "q_heads=%lld kv_heads=%lld head_dim=%lld (expected >= 1 each, rows within int64)",
                (long long)q_heads, (long long)kv_heads, (long long)head_dim);
  return DTL_OK;
}

dtl_status dtl_tp_qweight_read_qkv(const dtl_tp_context *ctx, const dtl_safetensors *f, const dtl_quant_format *fmt,
                                   const char *q, const char *k, const char *v, int64_t q_heads, int64_t kv_heads,
                                   int64_t head_dim, int64_t in, dtl_tp_qshard **shard) {
  static const char fn[] = "dtl_tp_qweight_read_qkv";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(q != NULL, fn, "q=NULL");
  DTL_CHECK_ARG((k == NULL) == (v == NULL), fn,
                "k=%s v=%s (give both for separate q, k, v tensors, or neither for a fused q)", k ? "given" : "NULL",
                v ? "given" : "NULL");
  int64_t qn = 0, kn = 0;
  DTL_TRY(dtl__tp_qhead_dims(fn, q_heads, kv_heads, head_dim, &qn, &kn));
  bool qrep, kvrep;
  DTL_TRY(dtl__tp_qheads(ctx, fn, k ? "q" : "the fused q", false, q_heads, kv_heads, head_dim, &qrep));
  DTL_TRY(dtl__tp_qheads(ctx, fn, k ? "k and v" : "the fused k and v", true, q_heads, kv_heads, head_dim, &kvrep));
  dtl_tp_range kvr;
  DTL_TRY(dtl__tp_heads(ctx, fn, q_heads, kv_heads, ctx->rank, NULL, &kvr));
  dtl__tp_qjob j;
  DTL_TRY(dtl__tp_qjob_begin(&j, ctx, fn, f, fmt, shard, 3));
  int64_t fused = qn + 2 * kn;
  dtl__tp_qrows r[3] = {
      {.prefix = q, .what = "q", .file_rows = k ? qn : fused, .rows = qn, .cols = in},
      {.prefix = k ? k : q, .what = "k", .file_rows = k ? kn : fused, .row_base = k ? 0 : qn, .rows = kn, .cols = in},
      {.prefix = k ? v : q, .what = "v", .file_rows = k ? kn : fused, .row_base = k ? 0 : qn + kn, .rows = kn,
       .cols = in},
  };
  for (int i = 1; i < 3; i++) r[i].repeat = kvrep, r[i].head_dim = head_dim, r[i].head = kvr.offset;
  dtl_status st = dtl__tp_qjob_subs(&j, r, 3);
  return st == DTL_OK ? dtl__tp_qjob_finish(&j, shard) : dtl__tp_qjob_fail(&j, st);
}

dtl_status dtl_tp_qweight_read_attention_out(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                             const dtl_quant_format *fmt, const char *prefix, int64_t q_heads,
                                             int64_t kv_heads, int64_t head_dim, int64_t out, dtl_tp_qshard **shard) {
  static const char fn[] = "dtl_tp_qweight_read_attention_out";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(prefix != NULL, fn, "prefix=NULL");
  int64_t qn = 0, kn = 0;
  DTL_TRY(dtl__tp_qhead_dims(fn, q_heads, kv_heads, head_dim, &qn, &kn));
  bool rep;
  DTL_TRY(dtl__tp_qheads(ctx, fn, "the columns", false, q_heads, kv_heads, head_dim, &rep));
  dtl__tp_qjob j;
  DTL_TRY(dtl__tp_qjob_begin(&j, ctx, fn, f, fmt, shard, 1));
  int64_t shape[2] = {out, qn};
  dtl_status st = dtl__qgeom_init(fn, &j.fmt, 2, shape, &j.g[0]);
  if (st == DTL_OK) st = dtl__tp_qjob_layout(&j, 0, prefix, 2, shape, 1);
  if (st == DTL_OK) {
    const dtl_qbox *lb = &j.s->layout[0]->local;
    st = dtl__tp_qjob_read(&j, 0, &j.g[0], prefix, lb->shape, lb->offset, NULL, 1);
  }
  return st == DTL_OK ? dtl__tp_qjob_finish(&j, shard) : dtl__tp_qjob_fail(&j, st);
}

dtl_status dtl_tp_qweight_read_gate_up(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                       const dtl_quant_format *fmt, const char *gate, const char *up, int64_t ffn,
                                       int64_t in, dtl_tp_qshard **shard) {
  static const char fn[] = "dtl_tp_qweight_read_gate_up";
  DTL_CHECK_ARG(gate != NULL, fn, "gate=NULL");
  DTL_CHECK_ARG(ffn >= 0 && ffn <= INT64_MAX / 2, fn, "ffn=%lld (expected >= 0)", (long long)ffn);
  dtl__tp_qjob j;
  DTL_TRY(dtl__tp_qjob_begin(&j, ctx, fn, f, fmt, shard, 2));
  dtl__tp_qrows r[2] = {
      {.prefix = gate, .what = "gate", .file_rows = up ? ffn : 2 * ffn, .rows = ffn, .cols = in},
      {.prefix = up ? up : gate, .what = "up", .file_rows = up ? ffn : 2 * ffn, .row_base = up ? 0 : ffn, .rows = ffn,
       .cols = in},
  };
  dtl_status st = dtl__tp_qjob_subs(&j, r, 2);
  return st == DTL_OK ? dtl__tp_qjob_finish(&j, shard) : dtl__tp_qjob_fail(&j, st);
}

dtl_status dtl_tp_qweight_read_experts(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                       const dtl_quant_format *fmt, const char *prefix, const char *suffix,
                                       int experts, int64_t out, int64_t in, dtl_tp_qshard **shard) {
  static const char fn[] = "dtl_tp_qweight_read_experts";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(prefix != NULL, fn, "prefix=NULL");
  DTL_CHECK_ARG(experts >= 1, fn, "experts=%d (expected >= 1)", experts);
  /* The local experts are known once the layout is made; a read per expert at most. */
  dtl_tp_range er = dtl__tp_chunk(ctx, experts, ctx->rank);
  dtl__tp_qjob j;
  DTL_TRY(dtl__tp_qjob_begin(&j, ctx, fn, f, fmt, shard, suffix ? (int)(er.count > 0 ? er.count : 1) : 1));
  int64_t shape[3] = {experts, out, in}, shape2[2] = {out, in}, zero[2] = {0, 0};
  dtl_status st = dtl__tp_qjob_layout(&j, 0, prefix, 3, shape, 0);
  if (st != DTL_OK) return dtl__tp_qjob_fail(&j, st);
  const dtl_qlayout *l = j.s->layout[0];
  if (!suffix) { /* one stacked tensor per part, [experts, ...] */
    st = dtl__tp_qjob_read(&j, 0, &l->g, prefix, l->local.shape, l->local.offset, NULL, 1);
    return st == DTL_OK ? dtl__tp_qjob_finish(&j, shard) : dtl__tp_qjob_fail(&j, st);
  }
  st = dtl__qgeom_init(fn, &j.fmt, 2, shape2, &j.g[0]);
  int64_t e0 = l->local.offset[0], ne = l->local.shape[0];
  for (int64_t e = 0; e < ne && st == DTL_OK; e++) {
    char name[DTL__ST_QNAME_CAP];
    int n = snprintf(name, sizeof name, "%s%lld%s", prefix, (long long)(e0 + e), suffix);
    if (n < 0 || (size_t)n >= sizeof name) {
      st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "prefix and suffix make a %d-byte name (at most %zu)", n,
                         sizeof name - 1);
      break;
    }
    size_t at[DTL_QUANT_NUM_PARTS];
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) at[p] = l->local.part[p].bytes / (size_t)ne * (size_t)e;
    st = dtl__tp_qjob_read(&j, 0, &j.g[0], name, shape2, zero, at, ne);
  }
  return st == DTL_OK ? dtl__tp_qjob_finish(&j, shard) : dtl__tp_qjob_fail(&j, st);
}

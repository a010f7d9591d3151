/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized TP weights read straight from a safetensors file (dtl_tp_qweight_read_*): for every format (FP8 block,
 * channel and tensor scales, GPTQ with and without act-order, AWQ) and every split (column, row, QKV by heads with
 * grouped and replicated kv heads, attention output, gate/up, whole experts), each sub-weight's layout holds this
 * rank's rows or columns (torch.chunk, whole heads, whole experts) and each of its parts is, byte for byte, the slice
 * of the sub-weight's dense part by the layout's box, whether the file holds the sub-weights apart or fused (q/k/v,
 * gate/up, stacked experts). The dense oracles are built here from the file's tensors by row ranges
 * (tests/common/qst_file.h makes the parts). Splits a quantized layout cannot hold and bad files fail with a
 * message, no output and nothing left allocated. */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>
#include "common/alloc.h"
#include "qst_file.h"
#include "tp_env.h"

static t_env E;
static char dir[64], path[128];
static dtl_safetensors *F;

typedef struct {
  const char *name;
  dtl_quant_format fmt;
  int64_t lin[2]; /* the column/row weight [out, in] */
  int64_t ffn;    /* gate/up rows each */
} format;
static const format formats[] = {
    {"fp8b", {.kind = DTL_QUANT_FP8_BLOCK, .mask = DTL_QFMT_BLOCK, .block_rows = 4, .block_cols = 8}, {30, 41}, 12},
    {"fp8c", {.kind = DTL_QUANT_FP8_CHANNEL, .mask = DTL_QFMT_CODE_DTYPE, .code_dtype = DTL_FLOAT8_E5M2}, {30, 41}, 11},
    {"fp8t", {.kind = DTL_QUANT_FP8_TENSOR}, {30, 41}, 11},
    {"gptq", {.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_GROUP, .group = 16}, {64, 64}, 32},
    {"gptqa", {.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_GROUP, .flags = DTL_QFMT_ACT_ORDER, .group = 16}, {64, 64}, 32},
    {"awq", {.kind = DTL_QUANT_AWQ, .mask = DTL_QFMT_GROUP, .group = 16}, {64, 64}, 32},
};
#define NFMT (int)(sizeof formats / sizeof *formats)
/* (q_heads, kv_heads, head_dim): kv_heads % tp == 0 at tp 1, 2, 4; kv heads replicated at tp 4; at tp 2 and 4; an
 * uneven kv split (tp 2) and one dtl_tp_attention_heads refuses (tp 4). */
static const int64_t heads[][3] = {{8, 4, 8}, {8, 2, 8}, {4, 1, 8}, {6, 3, 8}};
#define NHEADS 4
#define QKV_IN 32
#define O_OUT 16
#define EXPERTS 5
static const int64_t EXPERT_SHAPE[3] = {EXPERTS, 16, 32};

/* Every tensor of the file, and the oracles made from them. */
#define MAXT 256
static struct {
  char prefix[64];
  qst_qtensor q;
} T[MAXT];
static int NT;

static const qst_qtensor *find(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const qst_qtensor *find(const char *fmt, ...) {
  char p[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p, sizeof p, fmt, ap);
  va_end(ap);
  for (int i = 0; i < NT; i++)
    if (!strcmp(T[i].prefix, p)) return &T[i].q;
  fprintf(stderr, "no tensor %s\n", p);
  abort();
}
static qst_qtensor *add(const char *prefix) {
  if (NT == MAXT) abort();
  snprintf(T[NT].prefix, sizeof T[NT].prefix, "%s", prefix);
  return &T[NT++].q;
}
static void make(const format *f, const char *prefix, int ndim, const int64_t *shape, unsigned seed) {
  if (!qst_make(add(prefix), &f->fmt, ndim, shape, prefix, seed)) abort();
}

/* The part dim that follows the logical rows of a 2-D tensor and the rows per element of it (-1: none, the part is
 * whole whatever the rows): the table of <dtl/quant.h>. */
static void row_dim(const dtl_quant_format *f, int p, int *dim, int64_t *unit) {
  *dim = -1, *unit = 1;
  bool int4 = f->kind == DTL_QUANT_GPTQ || f->kind == DTL_QUANT_AWQ;
  if (p == DTL_QPART_GIDX || (p == DTL_QPART_SCALES && f->kind == DTL_QUANT_FP8_TENSOR)) return;
  *dim = int4 ? 1 : 0;
  if (p == DTL_QPART_SCALES && f->kind == DTL_QUANT_FP8_BLOCK) *unit = f->block_rows;
  if (p == DTL_QPART_ZEROS || (p == DTL_QPART_CODES && f->kind == DTL_QUANT_AWQ)) *unit = 8;
}

/* Copies the box [soff, soff + ext) of src (shape ss) to dst (shape ds) at doff; nd dims of es bytes. */
static void copy_box(const unsigned char *src, const int64_t *ss, const int64_t *soff, unsigned char *dst,
                     const int64_t *ds, const int64_t *doff, const int64_t *ext, int nd, size_t es) {
  int64_t n = 1, idx[8] = {0};
  for (int d = 0; d < nd; d++) n *= ext[d];
  for (int64_t i = 0; i < n; i++) {
    int64_t a = 0, b = 0;
    for (int d = 0; d < nd; d++) a = a * ss[d] + soff[d] + idx[d], b = b * ds[d] + doff[d] + idx[d];
    memcpy(dst + (size_t)b * es, src + (size_t)a * es, es);
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < ext[d]) break;
      idx[d] = 0;
    }
  }
}

/* The tensor made of the row ranges [lo, hi) of src (2-D), in order, each part cut along its row dim. */
static void take_rows(const qst_qtensor *src, const int64_t (*ranges)[2], int n, const char *prefix, qst_qtensor *out) {
  memset(out, 0, sizeof *out);
  out->fmt = src->fmt;
  out->ndim = 2;
  out->shape[1] = src->shape[1];
  for (int i = 0; i < n; i++) out->shape[0] += ranges[i][1] - ranges[i][0];
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    out->part[p] = src->part[p];
    if (src->part[p].ndim < 0) continue;
    snprintf(out->part[p].name, sizeof out->part[p].name, "%s%s", prefix, strrchr(src->part[p].name, '.'));
    int dim;
    int64_t unit;
    row_dim(&src->fmt, p, &dim, &unit);
    qst_tensor *t = &out->part[p];
    out->es[p] = src->es[p];
    if (dim >= 0) {
      t->shape[dim] = 0;
      for (int i = 0; i < n; i++) t->shape[dim] += (ranges[i][1] - ranges[i][0]) / unit;
    }
    size_t count = 1;
    for (int d = 0; d < t->ndim; d++) count *= (size_t)t->shape[d];
    t->bytes = count * out->es[p];
    out->data[p] = malloc(t->bytes + 1);
    t->data = out->data[p];
    if (dim < 0) {
      memcpy(out->data[p], src->data[p], t->bytes);
      continue;
    }
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
      int64_t soff[8] = {0}, doff[8] = {0}, ext[8];
      for (int d = 0; d < t->ndim; d++) ext[d] = t->shape[d];
      soff[dim] = ranges[i][0] / unit;
      doff[dim] = at;
      ext[dim] = (ranges[i][1] - ranges[i][0]) / unit;
      copy_box(src->data[p], src->part[p].shape, soff, out->data[p], t->shape, doff, ext, t->ndim, out->es[p]);
      at += ext[dim];
    }
  }
}

/* Expert e of a stacked [E, out, in] tensor, as its own 2-D tensor named prefix. */
static void take_expert(const qst_qtensor *src, int e, const char *prefix, qst_qtensor *out) {
  memset(out, 0, sizeof *out);
  out->fmt = src->fmt;
  out->ndim = 2;
  out->shape[0] = src->shape[1], out->shape[1] = src->shape[2];
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    out->part[p] = src->part[p];
    if (src->part[p].ndim < 0) continue;
    qst_tensor *t = &out->part[p];
    snprintf(t->name, sizeof t->name, "%s%s", prefix, strrchr(src->part[p].name, '.'));
    t->ndim = src->part[p].ndim - 1;
    memmove(t->shape, src->part[p].shape + 1, sizeof(int64_t) * 7);
    out->es[p] = src->es[p];
    t->bytes = src->part[p].bytes / EXPERTS;
    out->data[p] = malloc(t->bytes + 1);
    memcpy(out->data[p], src->data[p] + (size_t)e * t->bytes, t->bytes);
    t->data = out->data[p];
  }
}

static void make_everything(void) {
  char p[64], q[64];
  unsigned seed = 1;
  for (int fi = 0; fi < NFMT; fi++) {
    const format *f = &formats[fi];
    snprintf(p, sizeof p, "%s.lin", f->name);
    make(f, p, 2, f->lin, seed++);
    for (int c = 0; c < NHEADS; c++) {
      int64_t Hq = heads[c][0], Hkv = heads[c][1], D = heads[c][2], W[2] = {(Hq + 2 * Hkv) * D, QKV_IN};
      snprintf(p, sizeof p, "%s.qkv%d", f->name, c);
      make(f, p, 2, W, seed++);
      const qst_qtensor *fused = find("%s", p);
      int64_t r[3][2] = {{0, Hq * D}, {Hq * D, (Hq + Hkv) * D}, {(Hq + Hkv) * D, (Hq + 2 * Hkv) * D}};
      const char *sub[3] = {"q", "k", "v"};
      for (int s = 0; s < 3; s++) {
        snprintf(q, sizeof q, "%s.%s%d", f->name, sub[s], c);
        take_rows(fused, &r[s], 1, q, add(q));
      }
      snprintf(p, sizeof p, "%s.o%d", f->name, c);
      make(f, p, 2, (int64_t[]){O_OUT, Hq * D}, seed++);
    }
    snprintf(p, sizeof p, "%s.gu", f->name);
    make(f, p, 2, (int64_t[]){2 * f->ffn, QKV_IN}, seed++);
    const qst_qtensor *gu = find("%s", p);
    int64_t gr[2][2] = {{0, f->ffn}, {f->ffn, 2 * f->ffn}};
    snprintf(q, sizeof q, "%s.gate", f->name);
    take_rows(gu, &gr[0], 1, q, add(q));
    snprintf(q, sizeof q, "%s.up", f->name);
    take_rows(gu, &gr[1], 1, q, add(q));
    snprintf(p, sizeof p, "%s.experts.w", f->name);
    make(f, p, 3, EXPERT_SHAPE, seed++);
    const qst_qtensor *st = find("%s", p);
    for (int e = 0; e < EXPERTS; e++) {
      snprintf(q, sizeof q, "%s.experts.%d.w1", f->name, e);
      take_expert(st, e, q, add(q));
    }
  }
  /* For the bad cases: a packed cut (24 rows over 2 or 4 ranks: 12 or 6, not a multiple of 8), an FP8 block fused
   * gate/up whose halves meet inside a block (14 rows, blocks of 4), a NaN channel scale on the last row. */
  make(&formats[3], "gptq.odd", 2, (int64_t[]){24, 64}, seed++);
  make(&formats[0], "fp8b.gu14", 2, (int64_t[]){28, QKV_IN}, seed++);
  make(&formats[1], "fp8c.nan", 2, (int64_t[]){30, 41}, seed++);
  qst_qtensor *nan = (qst_qtensor *)find("fp8c.nan");
  ((float *)nan->data[DTL_QPART_SCALES])[29] = NAN;
}

static void write_the_file(void) {
  make_everything();
  if (dt_rank == 0) {
    snprintf(dir, sizeof dir, "/tmp/dtl_tp_qload_XXXXXX");
    REQUIRE_OK(mkdtemp(dir) ? DTL_OK : DTL_ERR_INVALID_ARGUMENT);
    snprintf(path, sizeof path, "%s/q.safetensors", dir);
    static qst_tensor all[4 * MAXT];
    int n = 0;
    for (int i = 0; i < NT; i++) n = qst_add(all, n, &T[i].q);
    REQUIRE_OK(qst_write(path, all, n) ? DTL_OK : DTL_ERR_INVALID_ARGUMENT);
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
}

/* Sub-weight w holds the logical box (off, shape) of the tensor oracle, and each part is the slice of oracle's
 * dense part by the layout's box. */
static void check_sub(const dtl_tp_qweight *w, const qst_qtensor *oracle, const int64_t *off, const int64_t *shape,
                      const char *what) {
  CHECK(w != NULL && w->layout != NULL, "%s: no sub-weight", what);
  if (!w || !w->layout) return;
  dtl_qbox b;
  CHECK_OK(dtl_qlayout_local_boxes(w->layout, NULL, &b));
  for (int d = 0; d < oracle->ndim; d++)
    CHECK(b.offset[d] == off[d] && b.shape[d] == shape[d], "%s: logical dim %d holds %lld+%lld, expected %lld+%lld",
          what, d, (long long)b.offset[d], (long long)b.shape[d], (long long)off[d], (long long)shape[d]);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    const dtl_qpart_box *pb = &b.part[p];
    CHECK(pb->ndim == oracle->part[p].ndim, "%s: part %d has %d dims, expected %d", what, p, pb->ndim,
          oracle->part[p].ndim);
    if (pb->ndim < 0 || pb->ndim != oracle->part[p].ndim) continue;
    CHECK(!memcmp(pb->global_shape, oracle->part[p].shape, sizeof(int64_t) * (size_t)pb->ndim),
          "%s: part %d's global shape is not the format's", what, p);
    unsigned char *want = malloc(pb->bytes + 1);
    qst_slice(oracle->data[p], oracle->es[p], pb->ndim, pb->global_shape, pb->offset, pb->shape, want);
    CHECK(pb->bytes == 0 || !memcmp(w->local.part[p], want, pb->bytes), "%s: part %d differs from the dense slice",
          what, p);
    free(want);
  }
}

static void column_and_row_shards_are_the_slices_of_every_part(void) {
  for (int fi = 0; fi < NFMT; fi++) {
    const format *f = &formats[fi];
    const qst_qtensor *lin = find("%s.lin", f->name);
    char p[64];
    snprintf(p, sizeof p, "%s.lin", f->name);
    int64_t o0, on, i0, inn, out = f->lin[0], in = f->lin[1];
    t_chunk(out, E.tp, E.rank, &o0, &on);
    t_chunk(in, E.tp, E.rank, &i0, &inn);
    dtl_tp_qshard *s = NULL;
    CHECK_OK(dtl_tp_qweight_read_column(E.ctx, F, &f->fmt, p, out, in, &s));
    CHECK(dtl_tp_qshard_count(s) == 1, "%s column: %d sub-weights", p, dtl_tp_qshard_count(s));
    check_sub(dtl_tp_qshard_weight(s, 0), lin, (int64_t[]){o0, 0}, (int64_t[]){on, in}, "column");
    dtl_tp_qshard_destroy(s);
    s = NULL;
    CHECK_OK(dtl_tp_qweight_read_row(E.ctx, F, &f->fmt, p, out, in, &s));
    check_sub(dtl_tp_qshard_weight(s, 0), lin, (int64_t[]){0, i0}, (int64_t[]){out, inn}, "row");
    if (f->fmt.flags & DTL_QFMT_ACT_ORDER && s) {
      /* Any input channel may use any group: each rank holds every group's scales and zeros, and its channels' g_idx. */
      dtl_qbox b;
      CHECK_OK(dtl_qlayout_local_boxes(dtl_tp_qshard_weight(s, 0)->layout, NULL, &b));
      for (int q = DTL_QPART_SCALES; q <= DTL_QPART_ZEROS; q++)
        CHECK(b.part[q].offset[0] == 0 && b.part[q].shape[0] == in / 16 && b.part[q].shape[1] == lin->part[q].shape[1],
              "act-order row-parallel: part %d is not whole", q);
      CHECK(b.part[DTL_QPART_GIDX].offset[0] == i0 && b.part[DTL_QPART_GIDX].shape[0] == inn, "g_idx box");
    }
    dtl_tp_qshard_destroy(s);
  }
}

/* Whether a quantized layout can hold (q_heads, kv_heads) over tp, and whether the kv heads are replicated. */
static bool heads_fit(int64_t Hq, int64_t Hkv, bool *repeat) {
  *repeat = E.tp > Hkv;
  return Hkv % E.tp == 0 || (E.tp % Hkv == 0 && Hq % E.tp == 0);
}

static void qkv_sub_weights_hold_whole_heads_from_fused_or_separate_tensors(void) {
  for (int fi = 0; fi < NFMT; fi++) {
    const format *f = &formats[fi];
    for (int c = 0; c < NHEADS; c++) {
      int64_t Hq = heads[c][0], Hkv = heads[c][1], D = heads[c][2];
      char fused[64], q[64], k[64], v[64];
      snprintf(fused, sizeof fused, "%s.qkv%d", f->name, c), snprintf(q, sizeof q, "%s.q%d", f->name, c),
          snprintf(k, sizeof k, "%s.k%d", f->name, c), snprintf(v, sizeof v, "%s.v%d", f->name, c);
      bool repeat;
      dtl_tp_qshard *a = (dtl_tp_qshard *)(uintptr_t)0x5eed, *b = a;
      dtl_status sa = dtl_tp_qweight_read_qkv(E.ctx, F, &f->fmt, fused, NULL, NULL, Hq, Hkv, D, QKV_IN, &a);
      dtl_status sb = dtl_tp_qweight_read_qkv(E.ctx, F, &f->fmt, q, k, v, Hq, Hkv, D, QKV_IN, &b);
      if (!heads_fit(Hq, Hkv, &repeat)) {
        dtl_status want = E.tp > Hkv ? DTL_ERR_INVALID_ARGUMENT : DTL_ERR_UNSUPPORTED;
        CHECK(sa == want && sb == want, "%s at tp %d: %s / %s (expected %s): %s", fused, E.tp, dtl_status_name(sa),
              dtl_status_name(sb), dtl_status_name(want), dtl_last_error());
        if (want == DTL_ERR_UNSUPPORTED)
          CHECK(strstr(dtl_last_error(), "kv_heads % tp == 0 or tp % kv_heads == 0"), "message: %s", dtl_last_error());
        CHECK(a == (dtl_tp_qshard *)(uintptr_t)0x5eed && b == a, "%s: a failed read wrote its output", fused);
        continue;
      }
      CHECK_OK(sa);
      CHECK_OK(sb);
      dtl_tp_range qr, kr;
      CHECK_OK(dtl_tp_attention_heads(E.ctx, Hq, Hkv, &qr, &kr));
      const qst_qtensor *sub[3] = {find("%s", q), find("%s", k), find("%s", v)};
      qst_qtensor rep[2];
      const char *what[3] = {"q", "k", "v"};
      for (int s = 0; s < 3; s++) {
        const qst_qtensor *oracle = sub[s];
        int64_t off[2] = {s ? kr.offset * D : qr.offset * D, 0}, shape[2] = {(s ? kr.count : qr.count) * D, QKV_IN};
        if (s && repeat) {
          /* k, v as repeat_kv makes them: [tp * D] rows, rank r's block its kv head r * kv_heads / tp. */
          int64_t ranges[8][2];
          for (int r = 0; r < E.tp; r++) {
            int64_t h = (int64_t)r * Hkv / E.tp;
            ranges[r][0] = h * D, ranges[r][1] = (h + 1) * D;
          }
          CHECK(kr.offset == (int64_t)E.rank * Hkv / E.tp && kr.count == 1, "kv head of rank %d", E.rank);
          take_rows(sub[s], ranges, E.tp, "rep", &rep[s - 1]);
          oracle = &rep[s - 1];
          off[0] = (int64_t)E.rank * D, shape[0] = D;
        }
        char w[96];
        snprintf(w, sizeof w, "%s %s from the fused tensor", fused, what[s]);
        check_sub(dtl_tp_qshard_weight(a, s), oracle, off, shape, w);
        snprintf(w, sizeof w, "%s %s from its own tensor", fused, what[s]);
        check_sub(dtl_tp_qshard_weight(b, s), oracle, off, shape, w);
        if (s && repeat) qst_free(&rep[s - 1]);
      }
      CHECK(dtl_tp_qshard_count(a) == 3 && dtl_tp_qshard_weight(a, 3) == NULL, "three sub-weights");
      dtl_tp_qshard_destroy(a);
      dtl_tp_qshard_destroy(b);
    }
  }
}

static void attention_out_columns_are_the_rank_s_q_heads(void) {
  for (int fi = 0; fi < NFMT; fi++) {
    const format *f = &formats[fi];
    for (int c = 0; c < NHEADS; c++) {
      int64_t Hq = heads[c][0], Hkv = heads[c][1], D = heads[c][2];
      char o[64];
      snprintf(o, sizeof o, "%s.o%d", f->name, c);
      bool repeat;
      dtl_tp_qshard *s = NULL;
      dtl_status st = dtl_tp_qweight_read_attention_out(E.ctx, F, &f->fmt, o, Hq, Hkv, D, O_OUT, &s);
      if (!heads_fit(Hq, Hkv, &repeat)) {
        CHECK(st != DTL_OK && s == NULL, "%s at tp %d: %s", o, E.tp, dtl_status_name(st));
        continue;
      }
      CHECK_OK(st);
      dtl_tp_range qr;
      CHECK_OK(dtl_tp_attention_heads(E.ctx, Hq, Hkv, &qr, NULL));
      check_sub(dtl_tp_qshard_weight(s, 0), find("%s", o), (int64_t[]){0, qr.offset * D},
                (int64_t[]){O_OUT, qr.count * D}, o);
      dtl_tp_qshard_destroy(s);
    }
  }
}

static void gate_and_up_come_from_a_fused_tensor_or_from_two(void) {
  for (int fi = 0; fi < NFMT; fi++) {
    const format *f = &formats[fi];
    char gu[64], g[64], u[64];
    snprintf(gu, sizeof gu, "%s.gu", f->name), snprintf(g, sizeof g, "%s.gate", f->name),
        snprintf(u, sizeof u, "%s.up", f->name);
    int64_t f0, fn;
    t_chunk(f->ffn, E.tp, E.rank, &f0, &fn);
    dtl_tp_qshard *a = NULL, *b = NULL;
    CHECK_OK(dtl_tp_qweight_read_gate_up(E.ctx, F, &f->fmt, gu, NULL, f->ffn, QKV_IN, &a));
    CHECK_OK(dtl_tp_qweight_read_gate_up(E.ctx, F, &f->fmt, g, u, f->ffn, QKV_IN, &b));
    for (int s = 0; s < 2; s++) {
      const qst_qtensor *oracle = find("%s", s ? u : g);
      check_sub(dtl_tp_qshard_weight(a, s), oracle, (int64_t[]){f0, 0}, (int64_t[]){fn, QKV_IN}, s ? "up (fused)" : "gate (fused)");
      check_sub(dtl_tp_qshard_weight(b, s), oracle, (int64_t[]){f0, 0}, (int64_t[]){fn, QKV_IN}, s ? "up" : "gate");
    }
    dtl_tp_qshard_destroy(a);
    dtl_tp_qshard_destroy(b);
  }
}

static void whole_experts_come_from_a_stacked_tensor_or_one_per_expert(void) {
  int64_t e0, en;
  t_chunk(EXPERTS, E.tp, E.rank, &e0, &en);
  /* The experts the MoE placement gives this rank. */
  dtl_moe_placement *pl;
  REQUIRE_OK(dtl_moe_placement_create(EXPERTS, E.tp, NULL, &pl));
  CHECK(dtl_moe_placement_local_count(pl, E.rank) == en, "local experts %d", dtl_moe_placement_local_count(pl, E.rank));
  if (en) CHECK(dtl_moe_placement_local_expert(pl, E.rank, 0) == e0, "first local expert");
  dtl_moe_placement_destroy(pl);
  for (int fi = 0; fi < NFMT; fi++) {
    const format *f = &formats[fi];
    char st[64], pre[64];
    snprintf(st, sizeof st, "%s.experts.w", f->name);
    snprintf(pre, sizeof pre, "%s.experts.", f->name);
    dtl_tp_qshard *a = NULL, *b = NULL;
    CHECK_OK(dtl_tp_qweight_read_experts(E.ctx, F, &f->fmt, st, NULL, EXPERTS, 16, 32, &a));
    CHECK_OK(dtl_tp_qweight_read_experts(E.ctx, F, &f->fmt, pre, ".w1", EXPERTS, 16, 32, &b));
    int64_t off[3] = {e0, 0, 0}, shape[3] = {en, 16, 32};
    check_sub(dtl_tp_qshard_weight(a, 0), find("%s", st), off, shape, "stacked experts");
    check_sub(dtl_tp_qshard_weight(b, 0), find("%s", st), off, shape, "per-expert tensors");
    dtl_tp_qshard_destroy(a);
    dtl_tp_qshard_destroy(b);
  }
}

/* A failing call returns its status with a message naming what, leaves *out and the live allocations as they were. */
#define FAILS(call, want, text)                                                                         \
  do {                                                                                                  \
    int64_t live_ = dtl__alloc_hook_live();                                                             \
    out = (dtl_tp_qshard *)(uintptr_t)0x5eed;                                                           \
    CHECK_ERROR(call, want, text);                                                                      \
    CHECK(out == (dtl_tp_qshard *)(uintptr_t)0x5eed, "%s: wrote its output", #call);                   \
    CHECK(dtl__alloc_hook_live() == live_, "%s: left %lld buffers allocated", #call,                   \
          (long long)(dtl__alloc_hook_live() - live_));                                                 \
  } while (0)

static void bad_input_fails_with_nothing_written_or_left_allocated(void) {
  dtl_tp_qshard *out;
  const dtl_quant_format *b = &formats[0].fmt, *c = &formats[1].fmt, *g = &formats[3].fmt;
  FAILS(dtl_tp_qweight_read_column(NULL, F, b, "fp8b.lin", 30, 41, &out), DTL_ERR_INVALID_ARGUMENT, "ctx=NULL");
  FAILS(dtl_tp_qweight_read_column(E.ctx, NULL, b, "fp8b.lin", 30, 41, &out), DTL_ERR_INVALID_ARGUMENT, "file=NULL");
  FAILS(dtl_tp_qweight_read_column(E.ctx, F, NULL, "fp8b.lin", 30, 41, &out), DTL_ERR_INVALID_ARGUMENT, "fmt=NULL");
  FAILS(dtl_tp_qweight_read_row(E.ctx, F, b, NULL, 30, 41, &out), DTL_ERR_INVALID_ARGUMENT, "prefix=NULL");
  CHECK_ERROR(dtl_tp_qweight_read_row(E.ctx, F, b, "fp8b.lin", 30, 41, NULL), DTL_ERR_INVALID_ARGUMENT, "out=NULL");
  FAILS(dtl_tp_qweight_read_column(E.ctx, F, b, "nope", 30, 41, &out), DTL_ERR_INVALID_ARGUMENT,
        "tensor \"nope.weight\" is not in the file");
  /* The stated shape is not the file's; the format is not the file's (channel scales are [30, 1], not blocks). */
  FAILS(dtl_tp_qweight_read_row(E.ctx, F, b, "fp8b.lin", 30, 40, &out), DTL_ERR_INVALID_ARGUMENT,
        "dim 1 is 41, expected 40 (the tensor's dim 1)");
  FAILS(dtl_tp_qweight_read_column(E.ctx, F, c, "fp8b.lin", 30, 41, &out), DTL_ERR_INVALID_ARGUMENT,
        "tensor \"fp8b.lin.weight\" (codes of fp8-channel(f8e5m2)[30,41]): dtype=F8_E4M3 in the file, expected F8_E5M2");
  /* A fused gate/up whose halves meet inside a scale block: the sub-weights have no scales of their own. */
  FAILS(dtl_tp_qweight_read_gate_up(E.ctx, F, b, "fp8b.gu14", NULL, 14, QKV_IN, &out), DTL_ERR_UNSUPPORTED,
        "its rows start at row 14 of the fused tensor, inside a unit of 4 rows");
  FAILS(dtl_tp_qweight_read_qkv(E.ctx, F, b, "fp8b.q0", "fp8b.k0", NULL, 8, 4, 8, QKV_IN, &out),
        DTL_ERR_INVALID_ARGUMENT, "k=given v=NULL");
  FAILS(dtl_tp_qweight_read_experts(E.ctx, F, b, "fp8b.experts.w", NULL, 0, 16, 32, &out), DTL_ERR_INVALID_ARGUMENT,
        "experts=0");
  /* Each rank reads only its experts' tensors: a rank without experts (5 over 4 ranks: 2, 2, 1, 0) reads none. */
  int64_t e0, en;
  t_chunk(EXPERTS, E.tp, E.rank, &e0, &en);
  if (en)
    FAILS(dtl_tp_qweight_read_experts(E.ctx, F, b, "fp8b.experts.", ".w2", EXPERTS, 16, 32, &out),
          DTL_ERR_INVALID_ARGUMENT, ".w2.weight\" is not in the file");
  if (E.tp > 1) /* 24 rows over 2 or 4 ranks: 12 or 6, inside GPTQ's int32 of 8 zero points */
    FAILS(dtl_tp_qweight_read_column(E.ctx, F, g, "gptq.odd", 24, 64, &out), DTL_ERR_INVALID_ARGUMENT,
          "packing unit of 8 elements");
  if (E.tp == 4) { /* kv heads replicated, one per rank: head_dim 8 is not a multiple of 16-row blocks */
    dtl_quant_format b16 = *b;
    b16.block_rows = 16;
    FAILS(dtl_tp_qweight_read_qkv(E.ctx, F, &b16, "fp8b.qkv1", NULL, NULL, 8, 2, 8, QKV_IN, &out), DTL_ERR_UNSUPPORTED,
          "head_dim=8 to be a multiple of the 16 rows");
  }
  /* A NaN scale on row 29: only the rank whose rows hold it fails. */
  int64_t o0, on;
  t_chunk(30, E.tp, E.rank, &o0, &on);
  if (o0 + on == 30) FAILS(dtl_tp_qweight_read_column(E.ctx, F, c, "fp8c.nan", 30, 41, &out), DTL_ERR_INVALID_ARGUMENT,
                           "tensor \"fp8c.nan.weight_scale\" (scales): element [29,0] = nan");
  else {
    dtl_tp_qshard *s = NULL;
    CHECK_OK(dtl_tp_qweight_read_column(E.ctx, F, c, "fp8c.nan", 30, 41, &s));
    dtl_tp_qshard_destroy(s);
  }
  /* Row-parallel, every rank reads every row's scale. */
  FAILS(dtl_tp_qweight_read_row(E.ctx, F, c, "fp8c.nan", 30, 41, &out), DTL_ERR_INVALID_ARGUMENT, "= nan");
  CHECK(dtl_tp_qshard_count(NULL) == -1 && dtl_tp_qshard_weight(NULL, 0) == NULL, "NULL accessors");
  dtl_tp_qshard_destroy(NULL);
}

int main(int argc, char **argv) {
  t_setup(&argc, &argv, &E);
  write_the_file();
  REQUIRE_OK(dtl_safetensors_open(path, &F));
  RUN(column_and_row_shards_are_the_slices_of_every_part);
  RUN(qkv_sub_weights_hold_whole_heads_from_fused_or_separate_tensors);
  RUN(attention_out_columns_are_the_rank_s_q_heads);
  RUN(gate_and_up_come_from_a_fused_tensor_or_from_two);
  RUN(whole_experts_come_from_a_stacked_tensor_or_one_per_expert);
  RUN(bad_input_fails_with_nothing_written_or_left_allocated);
  dtl_safetensors_close(F);
  for (int i = 0; i < NT; i++) qst_free(&T[i].q);
  MPI_Barrier(MPI_COMM_WORLD);
  if (dt_rank == 0) {
    unlink(path);
    rmdir(dir);
  }
  t_teardown(&E);
  return dt_finish();
}

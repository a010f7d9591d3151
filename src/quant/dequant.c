/* SPDX-License-Identifier: Apache-2.0 */
/* The host kernels of the quantized formats (dequant.h): a shard's part boxes, the check of its scales and group
 * indexes, and dequantization of one tile. Every value is computed from its global block alone (its code, its
 * block's scale and zero) in a fixed sequence of f32 operations, so any cut gives the dense tensor's bits. This file
 * is compiled with -ffp-contract=off (CMakeLists.txt): Q4_K's d1 * q - m1 must round twice, as ggml's reference and
 * the gguf package do, never fuse. */
#include <math.h>
#include <string.h>
#include "common/half.h"
#include "quant/dequant.h"

/* AWQ packs codes 0..7 of a word into nibbles in the order 0, 2, 4, 6, 1, 3, 5, 7 (autoawq's AWQ_ORDER); code k
 * sits in nibble dtl__awq_nibble[k] (AWQ_REVERSE_ORDER). */
static const int dtl__awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

void dtl__qshard_init(dtl__qshard *s, const dtl__qgeom *g, const int64_t *lshape, const int64_t *loff,
                      const void *const *parts) {
  memset(s, 0, sizeof *s);
  s->g = g;
  memcpy(s->lshape, lshape, (size_t)g->ndim * sizeof *lshape);
  memcpy(s->loff, loff, (size_t)g->ndim * sizeof *loff);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    if (g->part[p].ndim < 0) continue;
    dtl__qgeom_part_box(g, p, s->lshape, s->loff, s->pshape[p], s->poff[p]);
    s->part[p] = parts ? parts[p] : NULL;
  }
}

/* --- the pieces every kernel shares -------------------------------------------------------------------------- */

/* The leading dims (experts, ...) every part carries unchanged in front of its matrix dims. */
static int dtl__qlead(const dtl__qgeom *g) { return g->ndim >= 2 ? g->ndim - 2 : 0; }

/* Elements of part p's local box from dim `from` on: the size of one matrix of the part. */
static int64_t dtl__qinner(const dtl__qshard *s, int p, int from) {
  int64_t n = 1;
  for (int d = from; d < s->g->part[p].ndim; d++) n *= s->pshape[p][d];
  return n;
}

static inline float dtl__qscale_at(const void *base, int64_t i, dtl_dtype t) {
  if (t == DTL_FLOAT16) return dtl__f16_to_f32(((const uint16_t *)base)[i]);
  if (t == DTL_BFLOAT16) return dtl__bf16_to_f32(((const uint16_t *)base)[i]);
  return ((const float *)base)[i];
}

/* The logical row count and first global row of the local box (a 1-D GGUF tensor is one row). */
static void dtl__qrows(const dtl__qshard *s, int64_t *rows, int64_t *row0) {
  int rd = s->g->ndim - 2;
  *rows = rd >= 0 ? s->lshape[rd] : 1;
  *row0 = rd >= 0 ? s->loff[rd] : 0;
}

/* --- FP8 ------------------------------------------------------------------------------------------------------- */

static void dtl__tile_fp8(const dtl__qshard *s, int64_t mat, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out,
                          int64_t ldo) {
  const dtl__qgeom *g = s->g;
  const dtl_quant_format *f = &g->fmt;
  int nl = dtl__qlead(g), cd = g->ndim - 1;
  float lut[256];
  for (int c = 0; c < 256; c++)
    lut[c] = f->code_dtype == DTL_FLOAT8_E5M2 ? dtl__f8e5m2_to_f32((uint8_t)c) : dtl__f8e4m3_to_f32((uint8_t)c);
  int64_t rows, grow0, cols = s->lshape[cd], gcol0 = s->loff[cd];
  dtl__qrows(s, &rows, &grow0);
  const uint8_t *codes = (const uint8_t *)s->part[DTL_QPART_CODES] + mat * rows * cols;
  const void *sc = s->part[DTL_QPART_SCALES];
  const int64_t *ssh = s->pshape[DTL_QPART_SCALES], *sof = s->poff[DTL_QPART_SCALES];
  int64_t sbase = mat * dtl__qinner(s, DTL_QPART_SCALES, nl);
  for (int64_t i = 0; i < nr; i++) {
    int64_t r = r0 + i, gr = grow0 + r;
    const uint8_t *crow = codes + r * cols;
    float *orow = out + i * ldo;
    /* Runs of one scale (a block's columns, or the whole row), each one short loop: the per-channel and per-tensor
     * kinds run in pieces of 128 like the block kind, which the compiler keeps in registers (a row-long loop over the
     * lookup ran 1.6x slower). */
    int64_t srow = f->kind == DTL_QUANT_FP8_BLOCK ? sbase + (gr / f->block_rows - sof[nl]) * ssh[nl + 1] : 0;
    int64_t run = f->kind == DTL_QUANT_FP8_BLOCK ? f->block_cols : 128;
    float v = f->kind == DTL_QUANT_FP8_BLOCK ? 0.0f
              : dtl__qscale_at(sc, f->kind == DTL_QUANT_FP8_CHANNEL ? sbase + gr - sof[nl] : sbase, f->scale_dtype);
    for (int64_t c = c0; c < c0 + nc;) {
      int64_t b = (gcol0 + c) / run, end = (b + 1) * run - gcol0;
      if (end > c0 + nc) end = c0 + nc;
      if (f->kind == DTL_QUANT_FP8_BLOCK) v = dtl__qscale_at(sc, srow + b - sof[nl + 1], f->scale_dtype);
      for (; c < end; c++) orow[c - c0] = lut[crow[c]] * v;
    }
  }
}

/* --- GPTQ and AWQ ---------------------------------------------------------------------------------------------- */

/* What the int4 loops share: the part bases of one matrix and their boxes. The f32 value of (code - zero) * scale is
 * exact (|code - zero| <= 16 times an f16/bf16/f32 scale), so loop order cannot change a bit. */
typedef struct {
  bool gptq, act;
  int nl;
  dtl_dtype sdt;
  int64_t group, gcol0;
  const int64_t *qsh, *qof, *ssh, *sof, *zsh, *zof;
  const uint32_t *qw, *qz;
  const void *sc;
  int64_t sbase;
  const int32_t *gidx;
  int64_t gidx0;
} dtl__int4_ctx;

/* Group gi's scale and zero of global row gr (GPTQ v1 stores zero - 1; AWQ's nibbles are interleaved). */
static inline void dtl__int4_group(const dtl__int4_ctx *k, int64_t gi, int64_t gr, float *v, int *zero) {
  int nl = k->nl;
  *v = dtl__qscale_at(k->sc, k->sbase + (gi - k->sof[nl]) * k->ssh[nl + 1] + gr - k->sof[nl + 1], k->sdt);
  int zshift = 4 * (k->gptq ? (int)(gr % 8) : dtl__awq_nibble[gr % 8]);
  *zero = (int)((k->qz[(gi - k->zof[nl]) * k->zsh[nl + 1] + gr / 8 - k->zof[nl + 1]] >> zshift) & 15u) + k->gptq;
}

/* Both int4 layouts keep a tile's words far apart in memory: GPTQ's words of one row are R words apart, AWQ's of one
 * row band C/8... R/8 words apart, strides (16 KiB and 2 KiB at 4096) that map every word into the same few sets of the
 * L1 cache. So the kernels first gather a block of words into a small contiguous buffer (each cache line read once),
 * laid out so that one output row reads it in order, then decode from it a run of one group's values at a time.
 * The runs compute float(q - zero) * scale, the same operations as a table would, in fixed-length inner loops that
 * the compiler vectorizes even at -O2 (a variable trip count is not vectorized there). */
enum { DTL__GPTQ_ROWS = 64, DTL__GPTQ_WORDS = 64, DTL__AWQ_ROWS = 128, DTL__AWQ_COLS = 256, DTL__INT4_ACT_GROUPS = 128 };

/* 32 values of 16 bytes of GPTQ nibbles (low nibble first: a word's channels in order). */
static inline void dtl__gptq_run32(const uint8_t *restrict b, int zero, float v, float *restrict o) {
#pragma GCC unroll 1 /* -O3 would unroll it whole and vectorize the loop around it instead, worse */
  for (int k = 0; k < 16; k++) {
    o[2 * k] = (float)((int)(b[k] & 15u) - zero) * v;
    o[2 * k + 1] = (float)((int)(b[k] >> 4) - zero) * v;
  }
}

/* n values of one group from nibble p of a row's bytes on. */
static void dtl__gptq_run(const uint8_t *restrict b, int64_t p, int64_t n, int zero, float v, float *restrict o) {
  if (n > 0 && (p & 1)) *o++ = (float)((int)(b[p / 2] >> 4) - zero) * v, p++, n--;
  b += p / 2;
  for (; n >= 32; n -= 32, b += 16, o += 32) dtl__gptq_run32(b, zero, v, o);
  for (; n >= 2; n -= 2, b++, o += 2) {
    o[0] = (float)((int)(b[0] & 15u) - zero) * v;
    o[1] = (float)((int)(b[0] >> 4) - zero) * v;
  }
  if (n) o[0] = (float)((int)(b[0] & 15u) - zero) * v;
}

/* Act order: the groups of a block's channels (lg: 16 x the group less *gmin, its place in a row's tables) and whether
 * their span fits the tables (a real checkpoint's does, up to 128 groups = 16384 channels at g128; otherwise each
 * value looks its group up directly). */
static bool dtl__int4_act_groups(const dtl__int4_ctx *k, int64_t gc, int64_t n, int32_t *lg, int64_t *gmin, int *ng) {
  const int32_t *gx = k->gidx + (gc - k->gidx0);
  int32_t lo = gx[0], hi = gx[0];
  for (int64_t c = 1; c < n; c++) lo = gx[c] < lo ? gx[c] : lo, hi = gx[c] > hi ? gx[c] : hi;
  if ((int64_t)hi - lo >= DTL__INT4_ACT_GROUPS) return false;
  for (int64_t c = 0; c < n; c++) lg[c] = 16 * (gx[c] - lo);
  *gmin = lo;
  *ng = hi - lo + 1;
  return true;
}

/* GPTQ, qweight [C/8, R]: a word holds 8 input channels of one row, in order. Blocks of 64 rows x 64 words (four
 * consecutive cache lines per word column, fetched ahead), gathered as each row's bytes; each row then a group's run
 * at a time (act order: the group may change at every channel, so per row the 16 values of each group of the block,
 * one table load per value). */
static void dtl__tile_gptq(const dtl__int4_ctx *k, int64_t grow0, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                           float *out, int64_t ldo) {
  int nl = k->nl;
  uint32_t nib[DTL__GPTQ_ROWS][DTL__GPTQ_WORDS]; /* read as bytes: word j's channels in bytes 4j..4j+3, low first */
  int32_t lg[DTL__GPTQ_WORDS * 8];
  float tab[DTL__INT4_ACT_GROUPS * 16];
  int64_t j_lo = (k->gcol0 + c0) / 8, j_hi = (k->gcol0 + c0 + nc - 1) / 8 + 1; /* global word columns */
  for (int64_t ib = 0; ib < nr; ib += DTL__GPTQ_ROWS) {
    int nb = nr - ib < DTL__GPTQ_ROWS ? (int)(nr - ib) : DTL__GPTQ_ROWS;
    int64_t gr0 = grow0 + r0 + ib;
    for (int64_t jb = j_lo; jb < j_hi; jb += DTL__GPTQ_WORDS) {
      int nj = j_hi - jb < DTL__GPTQ_WORDS ? (int)(j_hi - jb) : DTL__GPTQ_WORDS;
      for (int j = 0; j < nj; j++) {
        const uint32_t *w = k->qw + (jb + j - k->qof[nl]) * k->qsh[nl + 1] + gr0 - k->qof[nl + 1];
        if (j + 4 < nj) /* word columns R words apart: no hardware prefetcher follows them */
          for (int i = 0; i < nb; i += 16) __builtin_prefetch(w + 4 * k->qsh[nl + 1] + i);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        for (int i = 0; i < nb; i++) nib[i][j] = w[i];
#else
        for (int i = 0; i < nb; i++)
          for (int b = 0; b < 4; b++) ((uint8_t *)nib[i])[4 * j + b] = (uint8_t)(w[i] >> (8 * b));
#endif
      }
      int64_t c_lo = jb * 8 - k->gcol0, c_hi = (jb + nj) * 8 - k->gcol0;
      if (c_lo < c0) c_lo = c0;
      if (c_hi > c0 + nc) c_hi = c0 + nc;
      int64_t p0 = k->gcol0 + c_lo - jb * 8, gmin = 0; /* the nibble of c_lo in a row's bytes */
      int ng = 0;
      bool tabled = k->act && dtl__int4_act_groups(k, k->gcol0 + c_lo, c_hi - c_lo, lg, &gmin, &ng);
      for (int i = 0; i < nb; i++) {
        int64_t gr = gr0 + i;
        float *orow = out + (ib + i) * ldo - c0;
        const uint8_t *b = (const uint8_t *)nib[i];
        if (tabled) {
          for (int g = 0; g < ng; g++) {
            float v;
            int zero;
            dtl__int4_group(k, gmin + g, gr, &v, &zero);
            for (int q = 0; q < 16; q++) tab[16 * g + q] = (float)(q - zero) * v;
          }
          float *o = orow + c_lo; /* channel t of the block: nibble p0 + t, group table lg[t] */
          int64_t t = 0, n = c_hi - c_lo;
          if (p0 & 1) o[0] = tab[lg[0] + (b[p0 / 2] >> 4)], t = 1;
          for (const uint8_t *x = b + (p0 + t) / 2; t + 2 <= n; t += 2, x++) {
            o[t] = tab[lg[t] + (*x & 15u)];
            o[t + 1] = tab[lg[t + 1] + (*x >> 4)];
          }
          if (t < n) o[t] = tab[lg[t] + (b[(p0 + t) / 2] & 15u)];
        } else if (k->act) {
          for (int64_t c = c_lo, p = p0; c < c_hi; c++, p++) {
            float v;
            int zero;
            dtl__int4_group(k, k->gidx[k->gcol0 + c - k->gidx0], gr, &v, &zero);
            orow[c] = (float)((int)((b[p / 2] >> (4 * (p & 1))) & 15u) - zero) * v;
          }
        } else {
          for (int64_t c = c_lo; c < c_hi;) {
            int64_t gi = (k->gcol0 + c) / k->group, end = (gi + 1) * k->group - k->gcol0;
            if (end > c_hi) end = c_hi;
            float v;
            int zero;
            dtl__int4_group(k, gi, gr, &v, &zero);
            dtl__gptq_run(b, p0 + c - c_lo, end - c, zero, v, orow + c);
            c = end;
          }
        }
      }
    }
  }
}

/* 16 values of one row of AWQ words (its nibble at shift sh of 16 consecutive channels' words). */
static inline void dtl__awq_run16(const uint32_t *restrict w, int sh, int zero, float v, float *restrict o) {
  for (int c = 0; c < 16; c++) o[c] = (float)((int)((w[c] >> sh) & 15u) - zero) * v;
}

/* AWQ, qweight [C, R/8]: a word holds 8 rows of one input channel, in AWQ's order. Blocks of 128 rows (up to 17 words
 * per channel) x 256 channels, gathered transposed (a word row's channels contiguous); then each row a group's run
 * at a time. */
static void dtl__tile_awq(const dtl__int4_ctx *k, int64_t grow0, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                          float *out, int64_t ldo) {
  int nl = k->nl;
  uint32_t buf[DTL__AWQ_ROWS / 8 + 1][DTL__AWQ_COLS];
  for (int64_t ib = 0; ib < nr; ib += DTL__AWQ_ROWS) {
    int64_t i_end = ib + DTL__AWQ_ROWS < nr ? ib + DTL__AWQ_ROWS : nr, gb = grow0 + r0 + ib;
    int64_t w0 = gb / 8, nw = (grow0 + r0 + i_end - 1) / 8 - w0 + 1;
    for (int64_t cb = c0; cb < c0 + nc; cb += DTL__AWQ_COLS) {
      int64_t c_end = cb + DTL__AWQ_COLS < c0 + nc ? cb + DTL__AWQ_COLS : c0 + nc;
      for (int64_t c = cb; c < c_end; c++) {
        const uint32_t *w = k->qw + (k->gcol0 + c - k->qof[nl]) * k->qsh[nl + 1] + w0 - k->qof[nl + 1];
        if (c + 8 < c_end) { /* channels R/8 words apart: no hardware prefetcher follows them */
          const uint32_t *ahead = w + 8 * k->qsh[nl + 1];
          __builtin_prefetch(ahead);
          __builtin_prefetch(ahead + nw - 1);
        }
        for (int64_t x = 0; x < nw; x++) buf[x][c - cb] = w[x];
      }
      for (int64_t i = ib; i < i_end; i++) {
        int64_t gr = grow0 + r0 + i;
        int sh = 4 * dtl__awq_nibble[gr % 8];
        const uint32_t *wrow = buf[gr / 8 - w0]; /* channel c at wrow[c - cb] */
        float *orow = out + i * ldo;
        for (int64_t c = cb; c < c_end;) {
          int64_t gi = (k->gcol0 + c) / k->group, end = (gi + 1) * k->group - k->gcol0;
          if (end > c_end) end = c_end;
          float v;
          int zero;
          dtl__int4_group(k, gi, gr, &v, &zero);
          for (; c + 16 <= end; c += 16) dtl__awq_run16(wrow + (c - cb), sh, zero, v, orow + (c - c0));
          for (; c < end; c++) orow[c - c0] = (float)((int)((wrow[c - cb] >> sh) & 15u) - zero) * v;
        }
      }
    }
  }
}


static void dtl__tile_int4(const dtl__qshard *s, int64_t mat, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out,
                           int64_t ldo) {
  const dtl__qgeom *g = s->g;
  const dtl_quant_format *f = &g->fmt;
  int nl = dtl__qlead(g), cd = g->ndim - 1;
  dtl__int4_ctx k = {
      .gptq = f->kind == DTL_QUANT_GPTQ,
      .act = (f->flags & DTL_QFMT_ACT_ORDER) != 0,
      .nl = nl,
      .sdt = f->scale_dtype,
      .group = f->group == -1 ? g->shape[cd] : f->group,
      .gcol0 = s->loff[cd],
      .qsh = s->pshape[DTL_QPART_CODES],
      .qof = s->poff[DTL_QPART_CODES],
      .ssh = s->pshape[DTL_QPART_SCALES],
      .sof = s->poff[DTL_QPART_SCALES],
      .zsh = s->pshape[DTL_QPART_ZEROS],
      .zof = s->poff[DTL_QPART_ZEROS],
      .qw = (const uint32_t *)s->part[DTL_QPART_CODES] + mat * dtl__qinner(s, DTL_QPART_CODES, nl),
      .qz = (const uint32_t *)s->part[DTL_QPART_ZEROS] + mat * dtl__qinner(s, DTL_QPART_ZEROS, nl),
      .sc = s->part[DTL_QPART_SCALES],
      .sbase = mat * dtl__qinner(s, DTL_QPART_SCALES, nl),
  };
  if (k.act) {
    k.gidx = (const int32_t *)s->part[DTL_QPART_GIDX] + mat * s->pshape[DTL_QPART_GIDX][nl];
    k.gidx0 = s->poff[DTL_QPART_GIDX][nl];
  }
  if (k.gptq) dtl__tile_gptq(&k, s->loff[nl], r0, nr, c0, nc, out, ldo);
  else dtl__tile_awq(&k, s->loff[nl], r0, nr, c0, nc, out, ldo);
}

/* --- GGUF ------------------------------------------------------------------------------------------------------ */

static inline float dtl__le_f16(const uint8_t *b) { return dtl__f16_to_f32((uint16_t)(b[0] | b[1] << 8)); }

/* ggml's dequantize_row_q8_0 / q4_0 / q4_K for one block (34 / 18 / 144 bytes into 32 / 32 / 256 floats). */
static void dtl__gguf_q8_0(const uint8_t *b, float *y) {
  float d = dtl__le_f16(b);
  for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

static void dtl__gguf_q4_0(const uint8_t *b, float *y) {
  float d = dtl__le_f16(b);
  for (int j = 0; j < 16; j++) {
    y[j] = (float)((b[2 + j] & 0x0f) - 8) * d;
    y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
  }
}

/* ggml's get_scale_min_k4: 8 six-bit scales and mins in 12 bytes. */
static void dtl__gguf_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

static void dtl__gguf_q4_k(const uint8_t *b, float *y) {
  float d = dtl__le_f16(b), dmin = dtl__le_f16(b + 2);
  const uint8_t *scales = b + 4, *q = b + 16;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
    uint8_t sc, m;
    dtl__gguf_scale_min_k4(is, scales, &sc, &m);
    float d1 = d * (float)sc, m1 = dmin * (float)m;
    dtl__gguf_scale_min_k4(is + 1, scales, &sc, &m);
    float d2 = d * (float)sc, m2 = dmin * (float)m;
    for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
  }
}

static void dtl__gguf_block_of(dtl_quant_kind k, int64_t *elems, int64_t *bytes) {
  *elems = k == DTL_QUANT_GGUF_Q4_K ? 256 : 32;
  *bytes = k == DTL_QUANT_GGUF_Q8_0 ? 34 : k == DTL_QUANT_GGUF_Q4_0 ? 18 : 144;
}

static void dtl__tile_gguf(const dtl__qshard *s, int64_t mat, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out,
                           int64_t ldo) {
  const dtl__qgeom *g = s->g;
  dtl_quant_kind k = g->fmt.kind;
  int cd = g->ndim - 1;
  int64_t be, bb, rows, grow0, gcol0 = s->loff[cd];
  dtl__gguf_block_of(k, &be, &bb);
  dtl__qrows(s, &rows, &grow0);
  int64_t rowbytes = s->pshape[DTL_QPART_CODES][cd], b0 = s->poff[DTL_QPART_CODES][cd] / bb;
  const uint8_t *codes = (const uint8_t *)s->part[DTL_QPART_CODES] + mat * rows * rowbytes;
  float y[256];
  for (int64_t i = 0; i < nr; i++) {
    const uint8_t *row = codes + (r0 + i) * rowbytes;
    float *orow = out + i * ldo;
    for (int64_t c = c0; c < c0 + nc;) {
      int64_t gb = (gcol0 + c) / be, lo = gb * be - gcol0, end = lo + be;
      const uint8_t *blk = row + (gb - b0) * bb;
      if (k == DTL_QUANT_GGUF_Q8_0) dtl__gguf_q8_0(blk, y);
      else if (k == DTL_QUANT_GGUF_Q4_0) dtl__gguf_q4_0(blk, y);
      else dtl__gguf_q4_k(blk, y);
      if (end > c0 + nc) end = c0 + nc;
      memcpy(orow + (c - c0), y + (c - lo), (size_t)(end - c) * sizeof *y);
      c = end;
    }
  }
}

void dtl__qshard_dequant_tile(const dtl__qshard *s, int64_t mat, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                              float *out, int64_t ldo) {
  if (nr <= 0 || nc <= 0) return;
  dtl_quant_kind k = s->g->fmt.kind;
  if (k <= DTL_QUANT_FP8_TENSOR) dtl__tile_fp8(s, mat, r0, nr, c0, nc, out, ldo);
  else if (k == DTL_QUANT_GPTQ || k == DTL_QUANT_AWQ) dtl__tile_int4(s, mat, r0, nr, c0, nc, out, ldo);
  else dtl__tile_gguf(s, mat, r0, nr, c0, nc, out, ldo);
}

/* --- the check ------------------------------------------------------------------------------------------------- */

/* "[a, b, c]" of the row-major index i in a box of the given shape, plus off (the global index when off is the
 * part's offset). */
static void dtl__qindex_text(int ndim, const int64_t *shape, const int64_t *off, int64_t i, char *buf, size_t cap) {
  int64_t idx[DTL_MAX_TENSOR_DIMS];
  for (int d = ndim - 1; d >= 0; d--) {
    idx[d] = (shape[d] ? i % shape[d] : 0) + (off ? off[d] : 0);
    if (shape[d]) i /= shape[d];
  }
  size_t at = 0;
  at += (size_t)snprintf(buf + at, cap - at, "[");
  for (int d = 0; d < ndim && at < cap; d++)
    at += (size_t)snprintf(buf + at, cap - at, "%s%lld", d ? ", " : "", (long long)idx[d]);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

static const char *const dtl__qpart_names[DTL_QUANT_NUM_PARTS] = {"codes", "scales", "zeros", "g_idx"};

static dtl_status dtl__qbad_entry(const char *fn, const dtl__qshard *s, int p, int64_t i, const char *what,
                                  const char *expected) {
  char loc[160], glob[160];
  int nd = s->g->part[p].ndim;
  dtl__qindex_text(nd, s->pshape[p], NULL, i, loc, sizeof loc);
  dtl__qindex_text(nd, s->pshape[p], s->poff[p], i, glob, sizeof glob);
  return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s[%lld] (local %s, global %s) = %s (expected %s)",
                       dtl__qpart_names[p], (long long)i, loc, glob, what, expected);
}

dtl_status dtl__qshard_check(const char *fn, const dtl__qshard *s) {
  const dtl__qgeom *g = s->g;
  const dtl_quant_format *f = &g->fmt;
  char v[48];
  if (f->kind >= DTL_QUANT_GGUF_Q8_0) {
    /* each block's f16 d (and Q4_K's dmin) */
    int64_t be, bb;
    dtl__gguf_block_of(f->kind, &be, &bb);
    int64_t n = dtl__qbox_count(g->part[DTL_QPART_CODES].ndim, s->pshape[DTL_QPART_CODES]);
    const uint8_t *b = s->part[DTL_QPART_CODES];
    for (int64_t at = 0; at < n; at += bb)
      for (int64_t h = 0; h < (f->kind == DTL_QUANT_GGUF_Q4_K ? 4 : 2); h += 2) {
        uint16_t bits = (uint16_t)(b[at + h] | b[at + h + 1] << 8);
        if ((bits & 0x7c00u) != 0x7c00u) continue;
        snprintf(v, sizeof v, "%g", (double)dtl__f16_to_f32(bits));
        char what[96];
        snprintf(what, sizeof what, "a block whose %s is %s", h ? "dmin" : "d", v);
        return dtl__qbad_entry(fn, s, DTL_QPART_CODES, at + h, what, "a finite f16 in every block");
      }
    return DTL_OK;
  }
  int64_t n = dtl__qbox_count(g->part[DTL_QPART_SCALES].ndim, s->pshape[DTL_QPART_SCALES]);
  for (int64_t i = 0; i < n; i++) {
    float x = dtl__qscale_at(s->part[DTL_QPART_SCALES], i, f->scale_dtype);
    if (isfinite(x)) continue;
    snprintf(v, sizeof v, "%g", (double)x);
    return dtl__qbad_entry(fn, s, DTL_QPART_SCALES, i, v, "a finite scale");
  }
  if (g->part[DTL_QPART_GIDX].ndim >= 0) {
    int nl = dtl__qlead(g);
    int64_t groups = g->part[DTL_QPART_SCALES].shape[nl];
    int64_t m = dtl__qbox_count(g->part[DTL_QPART_GIDX].ndim, s->pshape[DTL_QPART_GIDX]);
    const int32_t *gi = s->part[DTL_QPART_GIDX];
    for (int64_t i = 0; i < m; i++) {
      if (gi[i] >= 0 && gi[i] < groups) continue;
      char e[64];
      snprintf(v, sizeof v, "%d", (int)gi[i]);
      snprintf(e, sizeof e, "a group in 0..%lld", (long long)groups - 1);
      return dtl__qbad_entry(fn, s, DTL_QPART_GIDX, i, v, e);
    }
  }
  return DTL_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The host quantizers (quantize.h), each the reference of its format's own tooling:
 * - FP8: scale = max(amax, 1e-10) / 448 (e4m3) or 57344 (e5m2), code = RNE(clamp(x / scale)), as vLLM's
 *   per_token_group_quant_fp8 (DeepSeek-V3's act_quant is the same without the eps, so a zero block gives NaN);
 * - GPTQ: GPTQ's Quantizer (the range widened to hold 0, an all-zero group as [-1, 1]), scale = (max - min) / 15,
 *   zero = RNE(-min / scale), code = clamp(RNE(x / scale) + zero, 0, 15); v1 stores zero - 1 and reads a stored
 *   15 as 16, so a group whose zero rounds to 0 gets zero 1 and scale max / 14 instead;
 * - AWQ: autoawq's pseudo_quantize_tensor, scale = max(max - min, 1e-5) / 15, zero = clamp(-RNE(min / scale), 0, 15),
 *   code = clamp(RNE(x / scale) + zero, 0, 15);
 * - GGUF Q8_0, Q4_0: ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref (the gguf package's quants agree).
 * Codes are computed with the scale as stored (rounded to its dtype), which is what dequantization multiplies by. */
#include <float.h>
#include <math.h>
#include <string.h>
#include "common/half.h"
#include "quant/quantize.h"

/* max and min of values checked finite (no NaN to order), inlined where libm's fmaxf/fminf are calls. */
static inline float dtl__qmax(float a, float b) { return a > b ? a : b; }
static inline float dtl__qmin(float a, float b) { return a < b ? a : b; }

static const int dtl__awq_nibble_q[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* AWQ_REVERSE_ORDER, as in dequant.c */

/* s as its dtype stores it: false when the dtype cannot hold it (overflow). A positive s that would round to 0 takes
 * the dtype's smallest positive value, so that the codes stay finite. */
static bool dtl__qscale_fit(float s, dtl_dtype t, uint32_t *bits, float *back) {
  if (!isfinite(s)) return false;
  if (t == DTL_FLOAT16) {
    uint16_t h = dtl__f32_to_f16(s);
    if ((h & 0x7c00u) == 0x7c00u) return false;
    if (h == 0) h = 1;
    *bits = h;
    *back = dtl__f16_to_f32(h);
  } else if (t == DTL_BFLOAT16) {
    uint16_t h = dtl__f32_to_bf16(s);
    if ((h & 0x7f80u) == 0x7f80u) return false;
    if (h == 0) h = 1;
    *bits = h;
    *back = dtl__bf16_to_f32(h);
  } else {
    if (s == 0.0f) s = FLT_TRUE_MIN;
    *bits = dtl__f32_to_bits(s);
    *back = s;
  }
  return true;
}

static void dtl__qscale_put(void *base, int64_t i, dtl_dtype t, uint32_t bits) {
  if (t == DTL_FLOAT32) ((uint32_t *)base)[i] = bits;
  else ((uint16_t *)base)[i] = (uint16_t)bits;
}

static dtl_status dtl__qscale_too_big(const char *fn, const dtl_quant_format *f, float s, const char *what) {
  return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "the scale of %s would be %g, which %s cannot hold (expected values "
                       "within the range the format's scales can represent)",
                       what, (double)s, dtl_dtype_name(f->scale_dtype));
}

/* Every block of `n` elements along dim d that the local box touches is whole in it (n = the dim's size: the dim
 * must be whole). */
static dtl_status dtl__qwhole(const char *fn, const dtl__qshard *s, int d, int64_t n, const char *block) {
  int64_t lo = s->loff[d], hi = lo + s->lshape[d], N = s->g->shape[d];
  if (lo == hi || n <= 0) return DTL_OK;
  bool ok_lo = lo % n == 0, ok_hi = hi % n == 0 || hi == N;
  if (ok_lo && ok_hi) return DTL_OK;
  int64_t b = ok_lo ? (hi - 1) / n : lo / n, b_hi = (b + 1) * n < N ? (b + 1) * n : N;
  return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                       "tensor dim %d: the local box [%lld, %lld) cuts %s %lld ([%lld, %lld) of %lld elements) (expected "
                       "every block the box touches whole in it: quantize where the dim is cut on multiples of %lld, or "
                       "replicated, then redistribute)",
                       d, (long long)lo, (long long)hi, block, (long long)b, (long long)(b * n), (long long)b_hi,
                       (long long)n, (long long)n);
}

static int dtl__qlead_q(const dtl__qgeom *g) { return g->ndim >= 2 ? g->ndim - 2 : 0; }

static int64_t dtl__qinner_q(const dtl__qshard *s, int p, int from) {
  int64_t n = 1;
  for (int d = from; d < s->g->part[p].ndim; d++) n *= s->pshape[p][d];
  return n;
}

/* --- FP8 ------------------------------------------------------------------------------------------------------- */

static dtl_status dtl__quant_fp8(const char *fn, const dtl__qshard *s, const float *dense, void *const *parts, bool write) {
  const dtl__qgeom *g = s->g;
  const dtl_quant_format *f = &g->fmt;
  int nl = dtl__qlead_q(g), rd = g->ndim - 2, cd = g->ndim - 1;
  bool e5 = f->code_dtype == DTL_FLOAT8_E5M2;
  float fmax = e5 ? DTL__F8E5M2_MAX : DTL__F8E4M3_MAX;
  int64_t rows = s->lshape[rd], cols = s->lshape[cd], grow0 = s->loff[rd], gcol0 = s->loff[cd];
  int64_t mats = dtl__qbox_count(nl, s->lshape);
  const int64_t *ssh = s->pshape[DTL_QPART_SCALES], *sof = s->poff[DTL_QPART_SCALES];
  int64_t nsc = dtl__qinner_q(s, DTL_QPART_SCALES, nl);
  uint8_t *codes = parts[DTL_QPART_CODES];
  for (int64_t m = 0; m < mats; m++) {
    const float *x = dense + m * rows * cols;
    for (int64_t j = 0; j < nsc; j++) {
      int64_t r_lo = 0, r_hi = rows, c_lo = 0, c_hi = cols;
      if (f->kind == DTL_QUANT_FP8_BLOCK) {
        int64_t bi = sof[nl] + j / ssh[nl + 1], bj = sof[nl + 1] + j % ssh[nl + 1];
        r_lo = bi * f->block_rows - grow0;
        r_hi = r_lo + f->block_rows < rows ? r_lo + f->block_rows : rows;
        c_lo = bj * f->block_cols - gcol0;
        c_hi = c_lo + f->block_cols < cols ? c_lo + f->block_cols : cols;
      } else if (f->kind == DTL_QUANT_FP8_CHANNEL) {
        r_lo = sof[nl] + j - grow0;
        r_hi = r_lo + 1;
      }
      float amax = 0.0f;
      for (int64_t r = r_lo; r < r_hi; r++)
        for (int64_t c = c_lo; c < c_hi; c++) amax = dtl__qmax(amax, fabsf(x[r * cols + c]));
      float sc = dtl__qmax(amax, DTL__QUANT_FP8_EPS) / fmax, back;
      uint32_t bits;
      if (!dtl__qscale_fit(sc, f->scale_dtype, &bits, &back)) {
        char what[96];
        snprintf(what, sizeof what, "the block at rows %lld.., cols %lld.. (amax %g)", (long long)(grow0 + r_lo),
                 (long long)(gcol0 + c_lo), (double)amax);
        return dtl__qscale_too_big(fn, f, sc, what);
      }
      if (!write) continue;
      dtl__qscale_put(parts[DTL_QPART_SCALES], m * nsc + j, f->scale_dtype, bits);
      for (int64_t r = r_lo; r < r_hi; r++)
        for (int64_t c = c_lo; c < c_hi; c++) {
          float q = dtl__qmin(dtl__qmax(x[r * cols + c] / back, -fmax), fmax);
          codes[(m * rows + r) * cols + c] = e5 ? dtl__f32_to_f8e5m2(q) : dtl__f32_to_f8e4m3(q);
        }
    }
  }
  return DTL_OK;
}

/* --- GPTQ and AWQ ---------------------------------------------------------------------------------------------- */

static dtl_status dtl__quant_int4(const char *fn, const dtl__qshard *s, const float *dense, void *const *parts,
                                  bool write) {
  const dtl__qgeom *g = s->g;
  const dtl_quant_format *f = &g->fmt;
  bool gptq = f->kind == DTL_QUANT_GPTQ, act = (f->flags & DTL_QFMT_ACT_ORDER) != 0;
  int nl = dtl__qlead_q(g), cd = g->ndim - 1;
  int64_t rows = s->lshape[nl], cols = s->lshape[cd], grow0 = s->loff[nl], gcol0 = s->loff[cd];
  int64_t mats = dtl__qbox_count(nl, s->lshape), C = g->shape[cd];
  int64_t group = f->group == -1 ? (C > 0 ? C : 1) : f->group;
  const int64_t *qsh = s->pshape[DTL_QPART_CODES], *qof = s->poff[DTL_QPART_CODES];
  const int64_t *ssh = s->pshape[DTL_QPART_SCALES], *sof = s->poff[DTL_QPART_SCALES];
  const int64_t *zsh = s->pshape[DTL_QPART_ZEROS], *zof = s->poff[DTL_QPART_ZEROS];
  int64_t nq = dtl__qinner_q(s, DTL_QPART_CODES, nl), ns = dtl__qinner_q(s, DTL_QPART_SCALES, nl);
  int64_t nz = dtl__qinner_q(s, DTL_QPART_ZEROS, nl);
  uint32_t *qw = parts[DTL_QPART_CODES], *qz = parts[DTL_QPART_ZEROS];
  if (write) {
    if (mats > 0 && nq > 0) memset(qw, 0, (size_t)(mats * nq) * 4);
    if (mats > 0 && nz > 0) memset(qz, 0, (size_t)(mats * nz) * 4);
  }
  for (int64_t m = 0; m < mats; m++) {
    const float *x = dense + m * rows * cols;
    for (int64_t r = 0; r < rows; r++) {
      int64_t gr = grow0 + r;
      int zshift = 4 * (gptq ? (int)(gr % 8) : dtl__awq_nibble_q[gr % 8]);
      for (int64_t gi = sof[nl]; gi < sof[nl] + ssh[nl]; gi++) {
        int64_t c_lo = gi * group - gcol0, c_hi = c_lo + group;
        if (c_lo < 0) c_lo = 0; /* act order: the local box holds every column; clip to it anyway */
        if (c_hi > cols) c_hi = cols;
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t c = c_lo; c < c_hi; c++) {
          lo = dtl__qmin(lo, x[r * cols + c]);
          hi = dtl__qmax(hi, x[r * cols + c]);
        }
        if (c_lo >= c_hi) lo = hi = 0.0f;
        float sc, zero;
        if (gptq) {
          lo = dtl__qmin(lo, 0.0f);
          hi = dtl__qmax(hi, 0.0f);
          if (lo == 0.0f && hi == 0.0f) {
            lo = -1.0f;
            hi = 1.0f;
          }
          sc = (hi - lo) / 15.0f;
          zero = nearbyintf(-lo / sc);
          if (zero < 1.0f) { /* v1 cannot store zero 0 (a stored 15 reads as 16) */
            zero = 1.0f;
            sc = hi / 14.0f;
          }
        } else {
          sc = dtl__qmax(hi - lo, 1e-5f) / 15.0f;
          zero = dtl__qmin(dtl__qmax(-nearbyintf(lo / sc), 0.0f), 15.0f);
        }
        float back;
        uint32_t bits;
        if (!dtl__qscale_fit(sc, f->scale_dtype, &bits, &back)) {
          char what[96];
          snprintf(what, sizeof what, "row %lld, group %lld (min %g, max %g)", (long long)gr, (long long)gi, (double)lo,
                   (double)hi);
          return dtl__qscale_too_big(fn, f, sc, what);
        }
        if (!write) continue;
        dtl__qscale_put(parts[DTL_QPART_SCALES], m * ns + (gi - sof[nl]) * ssh[nl + 1] + gr - sof[nl + 1],
                        f->scale_dtype, bits);
        uint32_t zstore = (uint32_t)zero - (gptq ? 1u : 0u);
        qz[m * nz + (gi - zof[nl]) * zsh[nl + 1] + gr / 8 - zof[nl + 1]] |= zstore << zshift;
        for (int64_t c = c_lo; c < c_hi; c++) {
          int64_t gc = gcol0 + c;
          uint32_t q = (uint32_t)dtl__qmin(dtl__qmax(nearbyintf(x[r * cols + c] / back) + zero, 0.0f), 15.0f);
          if (gptq) qw[m * nq + (gc / 8 - qof[nl]) * qsh[nl + 1] + gr - qof[nl + 1]] |= q << (4 * (gc % 8));
          else qw[m * nq + (gc - qof[nl]) * qsh[nl + 1] + gr / 8 - qof[nl + 1]] |= q << zshift;
        }
      }
    }
    if (write && act) { /* the identity order: input channel c in group c / group */
      int32_t *gidx = (int32_t *)parts[DTL_QPART_GIDX] + m * s->pshape[DTL_QPART_GIDX][nl];
      for (int64_t c = 0; c < s->pshape[DTL_QPART_GIDX][nl]; c++)
        gidx[c] = (int32_t)((s->poff[DTL_QPART_GIDX][nl] + c) / group);
    }
  }
  return DTL_OK;
}

/* --- GGUF ------------------------------------------------------------------------------------------------------ */

static dtl_status dtl__quant_gguf(const char *fn, const dtl__qshard *s, const float *dense, void *const *parts,
                                  bool write) {
  const dtl__qgeom *g = s->g;
  bool q8 = g->fmt.kind == DTL_QUANT_GGUF_Q8_0;
  int cd = g->ndim - 1;
  int64_t cols = s->lshape[cd], nrows = cols ? dtl__qbox_count(g->ndim, s->lshape) / cols : 0;
  int64_t bb = q8 ? 34 : 18, nb = cols / 32;
  uint8_t *out = parts[DTL_QPART_CODES];
  for (int64_t r = 0; r < nrows; r++)
    for (int64_t b = 0; b < nb; b++) {
      const float *x = dense + r * cols + b * 32;
      uint8_t *y = out + (r * nb + b) * bb;
      float d, id;
      if (q8) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = dtl__qmax(amax, fabsf(x[j]));
        d = amax / 127.0f;
      } else {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
          if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
          }
        d = max / -8.0f;
      }
      id = d != 0.0f ? 1.0f / d : 0.0f;
      uint16_t dh = dtl__f32_to_f16(d);
      if ((dh & 0x7c00u) == 0x7c00u) {
        char what[96];
        snprintf(what, sizeof what, "block %lld of local row %lld", (long long)b, (long long)r);
        return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                             "the scale d of %s would be %g, which f16 cannot hold (expected |values| below %g)", what,
                             (double)d, q8 ? 65504.0 * 127.0 : 65504.0 * 8.0);
      }
      if (!write) continue;
      y[0] = (uint8_t)(dh & 0xff);
      y[1] = (uint8_t)(dh >> 8);
      if (q8) {
        for (int j = 0; j < 32; j++) y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
      } else {
        for (int j = 0; j < 16; j++) {
          int x0 = (int)(int8_t)(x[j] * id + 8.5f), x1 = (int)(int8_t)(x[16 + j] * id + 8.5f);
          if (x0 > 15) x0 = 15;
          if (x1 > 15) x1 = 15;
          y[2 + j] = (uint8_t)(x0 | x1 << 4);
        }
      }
    }
  return DTL_OK;
}

dtl_status dtl__qshard_quantize(const char *fn, const dtl__qshard *s, const float *dense, void *const *parts) {
  const dtl__qgeom *g = s->g;
  const dtl_quant_format *f = &g->fmt;
  int nl = dtl__qlead_q(g), rd = g->ndim - 2, cd = g->ndim - 1;
  if (f->kind == DTL_QUANT_GGUF_Q4_K)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn,
                         "fmt.kind=q4_k: quantizing to Q4_K is not implemented (ggml's make_qkx2_quants search is not "
                         "ported; dequantize, shard and move Q4_K tensors made by llama.cpp's tools)");
  int64_t C = g->shape[cd];
  switch (f->kind) {
    case DTL_QUANT_FP8_BLOCK:
      DTL_TRY(dtl__qwhole(fn, s, rd, f->block_rows, "FP8 block row"));
      DTL_TRY(dtl__qwhole(fn, s, cd, f->block_cols, "FP8 block column"));
      break;
    case DTL_QUANT_FP8_CHANNEL: DTL_TRY(dtl__qwhole(fn, s, cd, C, "the channel (one scale per whole row)")); break;
    case DTL_QUANT_FP8_TENSOR:
      DTL_TRY(dtl__qwhole(fn, s, rd, g->shape[rd], "the matrix (one scale per tensor)"));
      DTL_TRY(dtl__qwhole(fn, s, cd, C, "the matrix (one scale per tensor)"));
      break;
    case DTL_QUANT_GPTQ:
    case DTL_QUANT_AWQ:
      if (f->flags & DTL_QFMT_ACT_ORDER) DTL_TRY(dtl__qwhole(fn, s, cd, C, "the act-order groups (any column, any group)"));
      else DTL_TRY(dtl__qwhole(fn, s, cd, f->group == -1 ? C : f->group, "group"));
      break;
    default: DTL_TRY(dtl__qwhole(fn, s, cd, 32, "GGUF block")); break;
  }
  (void)nl;
  int64_t n = dtl__qbox_count(g->ndim, s->lshape);
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(dense[i]))
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "dense_local[%lld] = %g (expected finite values)", (long long)i,
                           (double)dense[i]);
  dtl_status (*q)(const char *, const dtl__qshard *, const float *, void *const *, bool) =
      f->kind <= DTL_QUANT_FP8_TENSOR ? dtl__quant_fp8 : f->kind <= DTL_QUANT_AWQ ? dtl__quant_int4 : dtl__quant_gguf;
  DTL_TRY(q(fn, s, dense, parts, false));
  return q(fn, s, dense, parts, true);
}

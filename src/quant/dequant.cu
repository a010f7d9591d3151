/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of dequantization (dequant.h): one thread per output element of a tile, each computing its value
 * from its global block alone with the host kernel's operations in the same order (explicitly rounded multiplies
 * and subtractions, never fused), so the device tile has the host tile's bits. dequant.c is its host emulation. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include "comm/device_memory.h"
#include "quant/dequant.h"

namespace {

/* What a kernel needs of a shard, by value (the geometry lives in host memory). */
struct qtile {
  int kind, gptq_act, code_e5m2, scale_dtype;
  int nl;                          /* leading dims */
  int64_t rows_l, cols_l;          /* the logical box's matrix extents */
  int64_t row0, col0;              /* its first global row and column */
  int64_t block_rows, block_cols;  /* FP8_BLOCK */
  int64_t group;                   /* GPTQ, AWQ (resolved: -1 is C) */
  int64_t be, bb;                  /* GGUF elements and bytes per block */
  /* per part: elements of one matrix, and the last two dims' local extent and global offset */
  int64_t inner[DTL_QUANT_NUM_PARTS], ext[DTL_QUANT_NUM_PARTS][2], off[DTL_QUANT_NUM_PARTS][2];
  const void *part[DTL_QUANT_NUM_PARTS];
  int64_t mat, r0, c0, nr, nc, ldo;
};

__device__ inline float f16_bits(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ inline float bf16_bits(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ inline float scale_at(const qtile &t, int64_t i) {
  const void *s = t.part[DTL_QPART_SCALES];
  if (t.scale_dtype == DTL_FLOAT16) return f16_bits(((const uint16_t *)s)[i]);
  if (t.scale_dtype == DTL_BFLOAT16) return bf16_bits(((const uint16_t *)s)[i]);
  return ((const float *)s)[i];
}

/* The FP8 decodings of src/common/half.h. */
__device__ inline float f8e4m3(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, exp = (c >> 3) & 0xfu, man = c & 7u;
  if ((c & 0x7fu) == 0x7fu) return __uint_as_float(sign | 0x7fc00000u);
  if (exp == 0) return __uint_as_float(__float_as_uint((float)man * (1.0f / 512.0f)) | sign);
  return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
}
__device__ inline float f8e5m2(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, exp = (c >> 2) & 0x1fu, man = c & 3u;
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 21) | (man ? 0x400000u : 0u));
  if (exp == 0) return __uint_as_float(__float_as_uint((float)man * (1.0f / 65536.0f)) | sign);
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 21));
}

__constant__ int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

__device__ float value_at(const qtile &t, int64_t r, int64_t c) {
  int64_t gr = t.row0 + r, gc = t.col0 + c;
  if (t.kind <= DTL_QUANT_FP8_TENSOR) {
    uint8_t code = ((const uint8_t *)t.part[DTL_QPART_CODES])[(t.mat * t.rows_l + r) * t.cols_l + c];
    float x = t.code_e5m2 ? f8e5m2(code) : f8e4m3(code);
    const int64_t *e = t.ext[DTL_QPART_SCALES], *o = t.off[DTL_QPART_SCALES];
    int64_t si = t.mat * t.inner[DTL_QPART_SCALES];
    if (t.kind == DTL_QUANT_FP8_BLOCK) si += (gr / t.block_rows - o[0]) * e[1] + gc / t.block_cols - o[1];
    else if (t.kind == DTL_QUANT_FP8_CHANNEL) si += gr - o[0];
    return __fmul_rn(x, scale_at(t, si));
  }
  if (t.kind == DTL_QUANT_GPTQ || t.kind == DTL_QUANT_AWQ) {
    bool gptq = t.kind == DTL_QUANT_GPTQ;
    const int64_t *qe = t.ext[DTL_QPART_CODES], *qo = t.off[DTL_QPART_CODES];
    const int64_t *se = t.ext[DTL_QPART_SCALES], *so = t.off[DTL_QPART_SCALES];
    const int64_t *ze = t.ext[DTL_QPART_ZEROS], *zo = t.off[DTL_QPART_ZEROS];
    int64_t gi = gc / t.group;
    if (t.gptq_act)
      gi = ((const int32_t *)t.part[DTL_QPART_GIDX])[t.mat * t.inner[DTL_QPART_GIDX] + gc - t.off[DTL_QPART_GIDX][1]];
    int zshift = 4 * (gptq ? (int)(gr % 8) : awq_nibble[gr % 8]);
    const uint32_t *qz = (const uint32_t *)t.part[DTL_QPART_ZEROS] + t.mat * t.inner[DTL_QPART_ZEROS];
    int zero = (int)((qz[(gi - zo[0]) * ze[1] + gr / 8 - zo[1]] >> zshift) & 15u) + (gptq ? 1 : 0);
    float s = scale_at(t, t.mat * t.inner[DTL_QPART_SCALES] + (gi - so[0]) * se[1] + gr - so[1]);
    const uint32_t *qw = (const uint32_t *)t.part[DTL_QPART_CODES] + t.mat * t.inner[DTL_QPART_CODES];
    uint32_t word;
    int shift;
    if (gptq) {
      word = qw[(gc / 8 - qo[0]) * qe[1] + gr - qo[1]];
      shift = 4 * (int)(gc % 8);
    } else {
      word = qw[(gc - qo[0]) * qe[1] + gr / 8 - qo[1]];
      shift = zshift;
    }
    return __fmul_rn((float)((int)((word >> shift) & 15u) - zero), s);
  }
  int64_t rowbytes = t.ext[DTL_QPART_CODES][1], b0 = t.off[DTL_QPART_CODES][1] / t.bb;
  const uint8_t *blk = (const uint8_t *)t.part[DTL_QPART_CODES] + (t.mat * t.rows_l + r) * rowbytes +
                       (gc / t.be - b0) * t.bb;
  int j = (int)(gc % t.be);
  float d = f16_bits((uint16_t)(blk[0] | blk[1] << 8));
  if (t.kind == DTL_QUANT_GGUF_Q8_0) return __fmul_rn((float)(int8_t)blk[2 + j], d);
  if (t.kind == DTL_QUANT_GGUF_Q4_0)
    return __fmul_rn((float)((j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4) - 8), d);
  /* Q4_K: ggml's dequantize_row_q4_K, sub-block is = j / 32 with get_scale_min_k4's 6-bit scale and min */
  float dmin = f16_bits((uint16_t)(blk[2] | blk[3] << 8));
  const uint8_t *sc = blk + 4, *qs = blk + 16;
  int is = j / 32, q = is % 2 ? qs[32 * (is / 2) + j % 32] >> 4 : qs[32 * (is / 2) + j % 32] & 15, s6, m6;
  if (is < 4) {
    s6 = sc[is] & 63;
    m6 = sc[is + 4] & 63;
  } else {
    s6 = (sc[is + 4] & 15) | ((sc[is - 4] >> 6) << 4);
    m6 = (sc[is + 4] >> 4) | ((sc[is] >> 6) << 4);
  }
  float d1 = __fmul_rn(d, (float)s6), m1 = __fmul_rn(dmin, (float)m6);
  return __fsub_rn(__fmul_rn(d1, (float)q), m1);
}

__global__ void dequant_tile(qtile t, float *out) {
  int64_t n = t.nr * t.nc;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / t.nc, c = i % t.nc;
    out[r * t.ldo + c] = value_at(t, t.r0 + r, t.c0 + c);
  }
}

}  // namespace

extern "C" dtl_status dtl__qshard_dequant_tile_cuda(const dtl__qshard *s, int64_t mat, int64_t r0, int64_t nr,
                                                      int64_t c0, int64_t nc, float *out, int64_t ldo, void *stream) {
  static const char fn[] = "dtl__qshard_dequant_tile_cuda";
  if (nr <= 0 || nc <= 0) return DTL_OK;
  const dtl__qgeom *g = s->g;
  const dtl_quant_format *f = &g->fmt;
  qtile t = {};
  t.kind = (int)f->kind;
  t.gptq_act = f->kind == DTL_QUANT_GPTQ && (f->flags & DTL_QFMT_ACT_ORDER) != 0;
  t.code_e5m2 = f->code_dtype == DTL_FLOAT8_E5M2;
  t.scale_dtype = (int)f->scale_dtype;
  int nd = g->ndim, rd = nd - 2, cd = nd - 1;
  t.nl = nd >= 2 ? nd - 2 : 0;
  t.rows_l = rd >= 0 ? s->lshape[rd] : 1;
  t.row0 = rd >= 0 ? s->loff[rd] : 0;
  t.cols_l = s->lshape[cd];
  t.col0 = s->loff[cd];
  t.block_rows = f->block_rows;
  t.block_cols = f->block_cols;
  t.group = f->group == -1 ? (g->shape[cd] > 0 ? g->shape[cd] : 1) : f->group;
  t.be = f->kind == DTL_QUANT_GGUF_Q4_K ? 256 : 32;
  t.bb = f->kind == DTL_QUANT_GGUF_Q8_0 ? 34 : f->kind == DTL_QUANT_GGUF_Q4_0 ? 18 : 144;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    int pn = g->part[p].ndim;
    if (pn < 0) continue;
    t.part[p] = s->part[p];
    t.inner[p] = 1;
    for (int d = t.nl; d < pn; d++) t.inner[p] *= s->pshape[p][d];
    /* the part's dims after the leading ones: one (g_idx, FP8_CHANNEL's [R, 1] keeps two) or two */
    for (int k = 0; k < 2; k++) {
      int d = pn - 2 + k;
      t.ext[p][k] = d >= t.nl ? s->pshape[p][d] : 1;
      t.off[p][k] = d >= t.nl ? s->poff[p][d] : 0;
    }
  }
  t.mat = mat;
  t.r0 = r0;
  t.c0 = c0;
  t.nr = nr;
  t.nc = nc;
  t.ldo = ldo;
  int64_t n = nr * nc, blocks = (n + 255) / 256;
  dequant_tile<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, (cudaStream_t)stream>>>(t, out);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? DTL_OK : dtl__cuda_error(fn, e);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. FP8 activations for communication, in DeepEP's layout: each row (token) of an
 * [rows, cols] f32/f16/bf16 tensor becomes cols e4m3 codes plus one f32 scale per 128 columns (the last block of a
 * row may be shorter). The rule is DeepEP's (csrc/kernels/internode_ll.cu), per block of a row:
 *   amax  = max(max |x|, 1e-4f)            so an all-zero block has scale 1e-4 / 448 and zero codes
 *   code  = e4m3(x * (448.0f / amax))      round to nearest even, saturating at +-448 (dtl__f32_to_f8e4m3)
 *   scale = amax * (1.0f / 448.0f)         the value is code * scale
 * every operation an f32 operation rounded to nearest even. The host half (act_fp8.c) refuses NaN and infinity;
 * the device half (act_fp8.cu) does not check (that would wait for the stream). */
#ifndef DTL_QUANT_ACT_FP8_H
#define DTL_QUANT_ACT_FP8_H

#include "comm/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DTL__ACT_FP8_BLOCK 128
#define DTL__ACT_FP8_MAX 448.0f
#define DTL__ACT_FP8_MARGIN 1e-4f

/* Scale blocks of a row of cols columns. */
static inline int64_t dtl__act_fp8_blocks(int64_t cols) { return (cols + DTL__ACT_FP8_BLOCK - 1) / DTL__ACT_FP8_BLOCK; }
/* A packed row, the unit that travels: cols codes, zero to three bytes to a multiple of 4, then the blocks f32
 * scales, so that the scales of every row of a packed array are aligned. */
static inline size_t dtl__act_fp8_codes_bytes(int64_t cols) { return ((size_t)cols + 3) & ~(size_t)3; }
static inline size_t dtl__act_fp8_row_bytes(int64_t cols) {
  return dtl__act_fp8_codes_bytes(cols) + sizeof(float) * (size_t)dtl__act_fp8_blocks(cols);
}

/* Quantized rows in memory: row r's codes at codes + r * ldc (bytes), its scales at scales + r * lds (floats). */
typedef struct {
  int64_t rows, cols;
  uint8_t *codes;
  int64_t ldc;
  float *scales;
  int64_t lds;
} dtl__act_fp8_rows;

/* The rows of a packed array at base (4-byte aligned): rows x dtl__act_fp8_row_bytes(cols) bytes. */
static inline dtl__act_fp8_rows dtl__act_fp8_packed(void *base, int64_t rows, int64_t cols) {
  dtl__act_fp8_rows q;
  q.rows = rows;
  q.cols = cols;
  q.codes = (uint8_t *)base;
  q.ldc = (int64_t)dtl__act_fp8_row_bytes(cols);
  q.scales = base ? (float *)((char *)base + dtl__act_fp8_codes_bytes(cols)) : NULL;
  q.lds = q.ldc / (int64_t)sizeof(float);
  return q;
}

/* Whether t can be quantized from and dequantized to: f32, f16 or bf16. */
static inline bool dtl__act_fp8_dtype_ok(dtl_dtype t) {
  return t == DTL_FLOAT32 || t == DTL_FLOAT16 || t == DTL_BFLOAT16;
}

/* Checks the shape of q (rows >= 0, cols >= 1, ldc >= cols, lds >= blocks, codes and scales non-NULL unless
 * rows = 0), the dense side's leading dim ld >= cols (named ld_name) and the dtype; DTL_ERR_INVALID_ARGUMENT naming
 * fn and the value. */
dtl_status dtl__act_fp8_check(const char *fn, const dtl__act_fp8_rows *q, dtl_dtype t, const char *ld_name, int64_t ld);

/* Host. x [q->rows, q->cols] of dtype t, row r at x + r * ldx elements -> q. A NaN or infinite element is
 * DTL_ERR_INVALID_ARGUMENT "fn: x row R column C is nan|inf|-inf (...)" with R = row0 + r, the first such in row
 * order (row0 numbers the rows as the caller's tensor does); rows before it are written then, the others not. */
dtl_status dtl__act_fp8_quantize(const char *fn, const void *x, dtl_dtype t, int64_t ldx, int64_t row0,
                                 const dtl__act_fp8_rows *q);
/* Host. q -> y [q->rows, q->cols] of dtype t (row r at y + r * ldy elements): y = code * scale in f32, rounded to
 * nearest even once when t is a half type. */
dtl_status dtl__act_fp8_dequantize(const dtl__act_fp8_rows *q, dtl_dtype t, void *y, int64_t ldy);

#if DTL_HAVE_NCCL
/* Device (act_fp8.cu): the same on buffers of mem (CUDA device memory), enqueued on its stream and device, with the
 * hardware conversions (cuda_fp8.h, saturating). A NaN element gives a NaN code; an infinity makes its block's
 * scale infinite, so that the whole block dequantizes to NaN. The caller checks shapes (dtl__act_fp8_check) first. */
dtl_status dtl__act_fp8_quantize_cuda(const dtl__mem *mem, const void *x, dtl_dtype t, int64_t ldx,
                                      const dtl__act_fp8_rows *q);
dtl_status dtl__act_fp8_dequantize_cuda(const dtl__mem *mem, const dtl__act_fp8_rows *q, dtl_dtype t, void *y,
                                        int64_t ldy);
/* The device kernels' code run on the host over host memory, block by block and thread by thread (the warp's
 * maximum a sequential loop). For tests; not a fast path. */
dtl_status dtl__act_fp8_quantize_emulate(const void *x, dtl_dtype t, int64_t ldx, const dtl__act_fp8_rows *q);
dtl_status dtl__act_fp8_dequantize_emulate(const dtl__act_fp8_rows *q, dtl_dtype t, void *y, int64_t ldy);
#endif

#ifdef __cplusplus
}
#endif
#endif

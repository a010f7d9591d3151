/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The GEMM against a weight that exists only one tile at a time (a quantized
 * weight dequantized on the fly): C = A * B^T + beta * C as dtl__gemm, with B [n, k] produced tile by tile
 * into one bounded buffer by a callback, each tile used by every row of A before the next one overwrites it. */
#ifndef DTL_COMPUTE_GEMM_TILED_H
#define DTL_COMPUTE_GEMM_TILED_H

#include "compute/gemm.h"

/* Writes rows [r0, r0 + nr) x cols [c0, c0 + nc) of B into tile (leading dim ldt, the dtype and memory of the
 * GEMM; on a device enqueued on the engine's stream). */
typedef dtl_status (*dtl__gemm_tile_fn)(void *user, int64_t r0, int64_t nr, int64_t c0, int64_t nc, void *tile,
                                        int64_t ldt);

/* The tile shape: rows of B by a panel of cols. */
typedef struct {
  int64_t rows, cols;
} dtl__gemm_tiling;

/* Host tiles hold at most DTL__GEMM_TILE_HOST elements (128 rows x a 512-column panel, 256 KiB of f32: it stays
 * in the L2 cache while every row of A passes over it), device tiles at most DTL__GEMM_TILE_DEVICE (whole rows,
 * so that each tile is one large cuBLAS call: 16 MiB of f32). */
#define DTL__GEMM_TILE_HOST_ROWS 128
#define DTL__GEMM_TILE_HOST_COLS 512
#define DTL__GEMM_TILE_HOST ((int64_t)DTL__GEMM_TILE_HOST_ROWS * DTL__GEMM_TILE_HOST_COLS)
#define DTL__GEMM_TILE_DEVICE ((int64_t)4 << 20)

/* The tiles for B [n, k] in memory: never more than the bound above, never more than n x k. */
dtl__gemm_tiling dtl__gemm_tiling_for(dtl_memory memory, int64_t n, int64_t k);
/* Elements of a tile (rows * cols; 0 when n or k is 0). */
static inline int64_t dtl__gemm_tiling_elems(dtl__gemm_tiling t) { return t.rows * t.cols; }

/* C[m, n] = A[m, k] * B[n, k]^T + beta * C (leading dims lda >= k, ldc >= n; dtype t as dtl__gemm), B given by
 * fill tile by tile into tile (at least dtl__gemm_tiling_elems(tiling) elements of t in the engine's memory).
 * Tiles go row block by row block, each over the k panels in order, so a C block gets beta once and then
 * accumulates (beta = 1) panel by panel. A failure of fill is returned as it is. */
dtl_status dtl__gemm_tiled(const dtl__gemm_engine *e, dtl_dtype t, int64_t m, int64_t n, int64_t k, const void *a,
                           int64_t lda, dtl__gemm_tile_fn fill, void *user, void *tile, dtl__gemm_tiling tiling,
                           float beta, void *c, int64_t ldc);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* The tile-by-tile GEMM: the tile shape for each memory and the loop over tiles around dtl__gemm, the same on
 * the host and on a device (where the callback and the GEMM are enqueued on one stream, so a tile is not
 * overwritten before the GEMM that reads it has run). */
#include "compute/gemm_tiled.h"

static int64_t dtl__min64(int64_t a, int64_t b) { return a < b ? a : b; }

dtl__gemm_tiling dtl__gemm_tiling_for(dtl_memory memory, int64_t n, int64_t k) {
  if (n <= 0 || k <= 0) return (dtl__gemm_tiling){0, 0};
  if (memory == DTL_MEMORY_DEVICE) {
    int64_t cols = dtl__min64(k, DTL__GEMM_TILE_DEVICE);
    return (dtl__gemm_tiling){dtl__min64(n, DTL__GEMM_TILE_DEVICE / cols), cols};
  }
  return (dtl__gemm_tiling){dtl__min64(n, DTL__GEMM_TILE_HOST_ROWS), dtl__min64(k, DTL__GEMM_TILE_HOST_COLS)};
}

dtl_status dtl__gemm_tiled(const dtl__gemm_engine *e, dtl_dtype t, int64_t m, int64_t n, int64_t k, const void *a,
                           int64_t lda, dtl__gemm_tile_fn fill, void *user, void *tile, dtl__gemm_tiling tiling,
                           float beta, void *c, int64_t ldc) {
  static const char fn[] = "dtl__gemm_tiled";
  if (m == 0 || n == 0) return DTL_OK;
  if (k == 0) return dtl__gemm(e, t, m, n, 0, 1.0f, a, lda, NULL, 1, beta, c, ldc);
  DTL_CHECK_ARG(fill != NULL && tile != NULL, fn, "%s=NULL", fill ? "tile" : "fill");
  DTL_CHECK_ARG(tiling.rows >= 1 && tiling.cols >= 1, fn, "tiling %lld x %lld (expected >= 1 x 1)",
                (long long)tiling.rows, (long long)tiling.cols);
  size_t es = dtl_dtype_size(t);
  for (int64_t r0 = 0; r0 < n; r0 += tiling.rows) {
    int64_t nr = dtl__min64(tiling.rows, n - r0);
    for (int64_t c0 = 0; c0 < k; c0 += tiling.cols) {
      int64_t nc = dtl__min64(tiling.cols, k - c0);
      DTL_TRY(fill(user, r0, nr, c0, nc, tile, nc));
      DTL_TRY(dtl__gemm(e, t, m, nr, nc, 1.0f, (const char *)a + (size_t)c0 * es, lda, tile, nc, c0 == 0 ? beta : 1.0f,
                        (char *)c + (size_t)r0 * es, ldc));
    }
  }
  return DTL_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The bias epilogue: seed or add a bias vector on every row; the host half here, the device half in bias.cu. */
#include <string.h>
#include "common/half.h"
#include "compute/bias.h"

dtl_status dtl__bias_rows_host(void *y, const void *bias, int64_t rows, int64_t cols, int64_t ldy, bool add,
                                  dtl_dtype t) {
  if (t == DTL_FLOAT32) {
    float *out = y;
    const float *b = bias;
    for (int64_t r = 0; r < rows; r++) {
      if (!add) {
        memcpy(out + r * ldy, b, (size_t)cols * sizeof(float));
        continue;
      }
      for (int64_t c = 0; c < cols; c++) out[r * ldy + c] += b[c];
    }
    return DTL_OK;
  }
  if (t != DTL_FLOAT16 && t != DTL_BFLOAT16)
    return dtl__error(DTL_ERR_UNSUPPORTED, "dtl__bias_rows: dtype=%s (expected f32, f16 or bf16)",
                      dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
  bool bf = t == DTL_BFLOAT16;
  uint16_t *out = y;
  const uint16_t *b = bias;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      uint16_t *p = out + r * ldy + c;
      if (!add) {
        *p = b[c];
      } else {
        float s = (bf ? dtl__bf16_to_f32(*p) : dtl__f16_to_f32(*p)) + (bf ? dtl__bf16_to_f32(b[c]) : dtl__f16_to_f32(b[c]));
        *p = bf ? dtl__f32_to_bf16(s) : dtl__f32_to_f16(s);
      }
    }
  return DTL_OK;
}

dtl_status dtl__bias_rows(const dtl__gemm_engine *g, void *y, const void *bias, int64_t rows, int64_t cols, int64_t ldy,
                          bool add, dtl_dtype t) {
  if (rows <= 0 || cols <= 0) return DTL_OK;
  if (g->memory == DTL_MEMORY_DEVICE) {
#if DTL_HAVE_NCCL
    return dtl__bias_rows_cuda(y, bias, rows, cols, ldy, add, t, g->stream);
#else
    return dtl__error(DTL_ERR_INTERNAL, "dtl__bias_rows: a device engine in a build without CUDA");
#endif
  }
  return dtl__bias_rows_host(y, bias, rows, cols, ldy, add, t);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of the bias epilogue: one grid-stride kernel per call, f32/f16/bf16 (half types add in f32). */
#include "compute/bias.h"
#include "compute/device.cuh"

namespace {

using namespace dtl_dev;

template <typename T>
__global__ void bias_rows(T *y, const T *b, int64_t rows, int64_t cols, int64_t ldy, bool add) {
  int64_t n = rows * cols;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / cols, c = i % cols;
    T *p = y + r * ldy + c;
    if (add) store(p, load(p) + load(b + c));
    else *p = b[c];
  }
}

}  // namespace

extern "C" dtl_status dtl__bias_rows_cuda(void *y, const void *bias, int64_t rows, int64_t cols, int64_t ldy,
                                             bool add, dtl_dtype t, void *stream) {
  static const char fn[] = "dtl__bias_rows_cuda";
  if (rows <= 0 || cols <= 0) return DTL_OK;
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    bias_rows<T><<<elementwise_blocks(rows * cols), kThreads, 0, (cudaStream_t)stream>>>((T *)y, (const T *)bias, rows,
                                                                                          cols, ldy, add);
    return launched(fn);
  });
}

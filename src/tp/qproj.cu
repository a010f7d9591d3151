/* SPDX-License-Identifier: Apache-2.0 */
/* The device cast of a quantized projection's f32 tile into a half context's dtype (rounded once, to nearest even). */
#include "compute/device.cuh"
#include "dtl/types.h"

namespace {

using namespace dtl_dev;

template <typename T>
__global__ void cast_f32(const float *src, int64_t rows, int64_t cols, int64_t lds, T *dst, int64_t ldd) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += (int64_t)gridDim.x * blockDim.x)
    store(dst + (i / cols) * ldd + i % cols, src[(i / cols) * lds + i % cols]);
}

}  // namespace

extern "C" dtl_status dtl__tp_cast_f32_cuda(const float *src, int64_t rows, int64_t cols, int64_t lds, void *dst,
                                            int64_t ldd, dtl_dtype t, void *stream) {
  static const char fn[] = "dtl__tp_cast_f32_cuda";
  if (rows <= 0 || cols <= 0) return DTL_OK;
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    cast_f32<T><<<elementwise_blocks(rows * cols), kThreads, 0, (cudaStream_t)stream>>>(src, rows, cols, lds, (T *)dst,
                                                                                         ldd);
    return launched(fn);
  });
}

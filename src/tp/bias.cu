/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of the bias epilogue: one grid-stride kernel per call, f32/f16/bf16 (half types add in f32). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "comm/device_memory.h"
#include "tp/bias.h"

namespace {

__device__ inline float to_f32(float v) { return v; }
__device__ inline float to_f32(__half v) { return __half2float(v); }
__device__ inline float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ inline T from_f32(float v);
template <> __device__ inline float from_f32<float>(float v) { return v; }
template <> __device__ inline __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void bias_rows(T *y, const T *b, int64_t rows, int64_t cols, int64_t ldy, bool add) {
  int64_t n = rows * cols;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / cols, c = i % cols;
    T *p = y + r * ldy + c;
    *p = add ? from_f32<T>(to_f32(*p) + to_f32(b[c])) : b[c];
  }
}

template <typename T>
void launch(void *y, const void *b, int64_t rows, int64_t cols, int64_t ldy, bool add, cudaStream_t s) {
  const int threads = 256;
  int64_t blocks = (rows * cols + threads - 1) / threads;
  if (blocks > 65535) blocks = 65535;
  bias_rows<T><<<(unsigned)blocks, threads, 0, s>>>((T *)y, (const T *)b, rows, cols, ldy, add);
}

}  // namespace

extern "C" dtl_status dtl__tp_bias_rows_cuda(void *y, const void *bias, int64_t rows, int64_t cols, int64_t ldy,
                                             bool add, dtl_dtype t, void *stream) {
  if (rows <= 0 || cols <= 0) return DTL_OK;
  cudaStream_t s = (cudaStream_t)stream;
  switch (t) {
    case DTL_FLOAT32: launch<float>(y, bias, rows, cols, ldy, add, s); break;
    case DTL_FLOAT16: launch<__half>(y, bias, rows, cols, ldy, add, s); break;
    case DTL_BFLOAT16: launch<__nv_bfloat16>(y, bias, rows, cols, ldy, add, s); break;
    default:
      return dtl__error(DTL_ERR_UNSUPPORTED, "dtl__tp_bias_rows_cuda: dtype=%s (expected f32, f16 or bf16)",
                        dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
  }
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? DTL_OK : dtl__cuda_error("dtl__tp_bias_rows_cuda", e);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The FP8 GEMM's device kernels: the absolute maximum of the activations (a grid of block reductions, one atomic per
 * block on the f32 bits, which order like the values for non-negative floats) and their e4m3 codes under the scale
 * derived from it, f32/f16/bf16 input; the kernels' code run on the host (emulate); and the host result of the GEMM. */
#include "compute/device.cuh"
#include "compute/gemm_fp8.h"

namespace {

using namespace dtl_dev;

template <typename T>
__host__ __device__ inline float amax_step(const T *x, int64_t i, int64_t cols, int64_t ldx) {
  return fabsf(load(x + (i / cols) * ldx + i % cols));
}

template <typename T>
__global__ void act_amax(const T *x, int64_t rows, int64_t cols, int64_t ldx, float *amax) {
  float m = 0.0f;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += (int64_t)gridDim.x * blockDim.x)
    m = fmaxf(m, amax_step(x, i, cols, ldx));
  m = block_reduce(m, max_op());
  if (threadIdx.x == 0) atomicMax((unsigned int *)amax, __float_as_uint(m));
}

template <typename T>
__host__ __device__ inline void act_code_step(const T *x, int64_t i, int64_t cols, int64_t ldx, uint8_t *q,
                                              int64_t ldq, float scale) {
  int64_t r = i / cols, c = i % cols;
  q[r * ldq + c] = dtl__fp8_act_code(load(x + r * ldx + c), scale);
}

template <typename T>
__global__ void act_codes(const T *x, int64_t rows, int64_t cols, int64_t ldx, uint8_t *q, int64_t ldq,
                          float *amax_scale) {
  float s = dtl__fp8_act_scale(amax_scale[0]);
  int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (first == 0) amax_scale[1] = s;
  for (int64_t i = first; i < rows * cols; i += (int64_t)gridDim.x * blockDim.x) act_code_step(x, i, cols, ldx, q, ldq, s);
}

}  // namespace

extern "C" dtl_status dtl__fp8_quantize_cuda(const void *x, dtl_dtype t, int64_t rows, int64_t cols, int64_t ldx,
                                             uint8_t *q, int64_t ldq, float *amax_scale, void *stream) {
  static const char fn[] = "dtl__fp8_quantize_cuda";
  cudaStream_t st = (cudaStream_t)stream;
  cudaError_t e = cudaMemsetAsync(amax_scale, 0, 2 * sizeof(float), st);
  if (e != cudaSuccess) return dtl__cuda_error(fn, e);
  int64_t n = rows * cols;
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    if (n > 0) {
      act_amax<T><<<elementwise_blocks(n), kRowThreads, 0, st>>>((const T *)x, rows, cols, ldx, amax_scale);
      DTL_TRY(launched(fn));
    }
    act_codes<T><<<n > 0 ? elementwise_blocks(n) : 1, kThreads, 0, st>>>((const T *)x, rows, cols, ldx, q, ldq,
                                                                         amax_scale);
    return launched(fn);
  });
}

extern "C" dtl_status dtl__fp8_quantize_emulate(const void *x, dtl_dtype t, int64_t rows, int64_t cols, int64_t ldx,
                                                uint8_t *q, int64_t ldq, float *amax_scale) {
  return with_type(t, "dtl__fp8_quantize_emulate", [&](auto z) {
    using T = decltype(z);
    float m = 0.0f;
    for (int64_t i = 0; i < rows * cols; i++) m = fmaxf(m, amax_step((const T *)x, i, cols, ldx));
    amax_scale[0] = m;
    amax_scale[1] = dtl__fp8_act_scale(m);
    for (int64_t i = 0; i < rows * cols; i++) act_code_step((const T *)x, i, cols, ldx, q, ldq, amax_scale[1]);
    return DTL_OK;
  });
}

extern "C" void dtl__gemm_fp8_emulate(int64_t m, int64_t n, int64_t k, const uint8_t *a, int64_t lda, float sa,
                                      const uint8_t *b, int64_t ldb, float sb, float beta, float *c, int64_t ldc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t l = 0; l < n; l++) {
      double s = 0;
      for (int64_t j = 0; j < k; j++) s += (double)dtl__f8e4m3_to_f32(a[i * lda + j]) * dtl__f8e4m3_to_f32(b[l * ldb + j]);
      float v = (float)(s * sa * sb);
      c[i * ldc + l] = beta == 0.0f ? v : v + beta * c[i * ldc + l];
    }
}

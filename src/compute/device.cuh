/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. What the CUDA kernels of every area share: f32 loads and stores of
 * the three storage types (host-callable too, for the emulations), launch shapes, the block-wide tree
 * reduction with its host twin, and the switch from a dtl dtype to a kernel's storage type. */
#ifndef DTL_COMPUTE_DEVICE_CUH
#define DTL_COMPUTE_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "comm/device_memory.h"
#include "compute/math.h"

namespace dtl_dev {

constexpr int kThreads = 256;         /* elementwise kernels (grid-stride loops) */
constexpr int kRowThreads = 128;      /* row kernels: one block per row; a power of two for the tree */
constexpr int64_t kMaxBlocks = 65535; /* of an elementwise grid; the grid-stride loop covers the rest */

__host__ __device__ inline float load(const float *p) { return *p; }
__host__ __device__ inline float load(const __half *p) { return __half2float(*p); }
__host__ __device__ inline float load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
/* Half types round to nearest even (overflow to infinity), as the host's dtl__f32_to_f16/bf16. */
__host__ __device__ inline void store(float *p, float v) { *p = v; }
__host__ __device__ inline void store(__half *p, float v) { *p = __float2half_rn(v); }
__host__ __device__ inline void store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* Blocks for n elements of a grid-stride kernel (n > 0). */
inline unsigned elementwise_blocks(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

struct max_op {
  __host__ __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct sum_op {
  __host__ __device__ float operator()(float a, float b) const { return a + b; }
};

/* The tree both reductions below walk: red[i] = op(red[i], red[i + s]) for s = n/2, n/4, ..., 1. */
template <typename Op>
inline float tree_reduce_host(float *red, int n, Op op) {
  for (int s = n / 2; s > 0; s >>= 1)
    for (int i = 0; i < s; i++) red[i] = op(red[i], red[i + s]);
  return red[0];
}

/* op over v of every thread of a kRowThreads block, returned to all threads, in the order of
 * tree_reduce_host. The barriers on entry and exit also make every global write the block made before the
 * call visible to all its threads after it. */
template <typename Op>
__device__ inline float block_reduce(float v, Op op) {
  __shared__ float red[kRowThreads];
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = kRowThreads / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) red[threadIdx.x] = op(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  float r = red[0];
  __syncthreads();
  return r;
}

/* Calls f(T()) with T the storage type of t (float, __half or __nv_bfloat16). */
template <typename F>
dtl_status with_type(dtl_dtype t, const char *fn, F f) {
  switch (t) {
    case DTL_FLOAT32: return f(float());
    case DTL_FLOAT16: return f(__half());
    case DTL_BFLOAT16: return f(__nv_bfloat16());
    default:
      return dtl__error(DTL_ERR_UNSUPPORTED, "%s: dtype=%s (expected f32, f16 or bf16)", fn,
                        dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
  }
}

/* The status of the launch just made. */
inline dtl_status launched(const char *fn) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? DTL_OK : dtl__cuda_error(fn, e);
}

}  // namespace dtl_dev

#endif

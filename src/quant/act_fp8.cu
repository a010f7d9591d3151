/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of the FP8 activation kernels (act_fp8.h), CUDA builds only: one warp per 128-column block of a
 * row for quantization (four columns a lane, the block's maximum by shuffles), a grid-stride loop for
 * dequantization, with the hardware conversions of cuda_fp8.h; and both kernels' code run on the host for tests. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include "comm/device_memory.h"
extern "C" {
#include "quant/act_fp8.h"
}

namespace {

constexpr int kLanes = 32;
constexpr int kPerLane = DTL__ACT_FP8_BLOCK / kLanes;
constexpr int kWarps = 8; /* per CUDA block */
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__host__ __device__ inline float load(const float *p) { return *p; }
__host__ __device__ inline float load(const __half *p) { return __half2float(*p); }
__host__ __device__ inline float load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__host__ __device__ inline void store(float *p, float v) { *p = v; }
__host__ __device__ inline void store(__half *p, float v) { *p = __float2half_rn(v); }
__host__ __device__ inline void store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* One lane's part of block b of row r: columns c0 + lane * kPerLane + 0..kPerLane-1 that exist. */
template <typename T>
__host__ __device__ inline float lane_amax(const T *x, int64_t ldx, const dtl__act_fp8_rows &q, int64_t r, int64_t b,
                                           int lane) {
  float m = 0.0f;
  for (int i = 0; i < kPerLane; i++) {
    int64_t c = b * DTL__ACT_FP8_BLOCK + lane * kPerLane + i;
    if (c < q.cols) m = fmaxf(m, fabsf(load(x + r * ldx + c)));
  }
  return m;
}

/* The block's scale from its maximum (every lane alike), and the lane's codes. */
__host__ __device__ inline float block_scale(float amax, float *s) {
  float a = fmaxf(amax, DTL__ACT_FP8_MARGIN);
  *s = DTL__ACT_FP8_MAX / a;
  return a * (1.0f / DTL__ACT_FP8_MAX);
}

template <typename T>
__host__ __device__ inline void lane_codes(const T *x, int64_t ldx, const dtl__act_fp8_rows &q, int64_t r, int64_t b,
                                           int lane, float s) {
  for (int i = 0; i < kPerLane; i++) {
    int64_t c = b * DTL__ACT_FP8_BLOCK + lane * kPerLane + i;
    if (c < q.cols)
      q.codes[r * q.ldc + c] = (uint8_t)__nv_cvt_float_to_fp8(load(x + r * ldx + c) * s, __NV_SATFINITE, __NV_E4M3);
  }
}

template <typename T>
__global__ void quantize_kernel(const T *x, int64_t ldx, dtl__act_fp8_rows q, int64_t nb) {
  const int lane = (int)(threadIdx.x % kLanes);
  const int64_t units = q.rows * nb;
  for (int64_t u = (int64_t)blockIdx.x * kWarps + threadIdx.x / kLanes; u < units; u += (int64_t)gridDim.x * kWarps) {
    int64_t r = u / nb, b = u % nb;
    float m = lane_amax(x, ldx, q, r, b, lane);
    for (int off = kLanes / 2; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float s, scale = block_scale(m, &s);
    lane_codes(x, ldx, q, r, b, lane, s);
    if (lane == 0) q.scales[r * q.lds + b] = scale;
  }
}

__host__ __device__ inline float code_value(uint8_t c) {
  __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
  return __half2float(__half(h));
}

template <typename T>
__host__ __device__ inline void dequantize_one(const dtl__act_fp8_rows &q, T *y, int64_t ldy, int64_t i) {
  int64_t r = i / q.cols, c = i % q.cols;
  store(y + r * ldy + c, code_value(q.codes[r * q.ldc + c]) * q.scales[r * q.lds + c / DTL__ACT_FP8_BLOCK]);
}

template <typename T>
__global__ void dequantize_kernel(dtl__act_fp8_rows q, T *y, int64_t ldy) {
  const int64_t n = q.rows * q.cols;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dequantize_one(q, y, ldy, i);
}

/* Calls f(T()) with T the storage type of t (the caller checked t). */
template <typename F>
dtl_status with_type(dtl_dtype t, F f) {
  switch (t) {
    case DTL_FLOAT32: return f(float());
    case DTL_FLOAT16: return f(__half());
    default: return f(__nv_bfloat16());
  }
}

unsigned blocks_for(int64_t n, int64_t per_block) {
  int64_t b = (n + per_block - 1) / per_block;
  return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

dtl_status launched(const char *fn) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? DTL_OK : dtl__cuda_error(fn, e);
}

}  // namespace

extern "C" dtl_status dtl__act_fp8_quantize_cuda(const dtl__mem *mem, const void *x, dtl_dtype t, int64_t ldx,
                                                 const dtl__act_fp8_rows *q) {
  static const char fn[] = "dtl__act_fp8_quantize_cuda";
  const int64_t nb = dtl__act_fp8_blocks(q->cols), units = q->rows * nb;
  if (units == 0) return DTL_OK;
  int prev;
  DTL_TRY(dtl__cuda_device_enter(mem->device, fn, &prev));
  dtl_status st = with_type(t, [&](auto z) {
    using T = decltype(z);
    quantize_kernel<T><<<blocks_for(units, kWarps), kThreads, 0, (cudaStream_t)mem->stream>>>((const T *)x, ldx, *q,
                                                                                             nb);
    return launched(fn);
  });
  return dtl__cuda_device_leave(prev, st);
}

extern "C" dtl_status dtl__act_fp8_dequantize_cuda(const dtl__mem *mem, const dtl__act_fp8_rows *q, dtl_dtype t,
                                                   void *y, int64_t ldy) {
  static const char fn[] = "dtl__act_fp8_dequantize_cuda";
  const int64_t n = q->rows * q->cols;
  if (n == 0) return DTL_OK;
  int prev;
  DTL_TRY(dtl__cuda_device_enter(mem->device, fn, &prev));
  dtl_status st = with_type(t, [&](auto z) {
    using T = decltype(z);
    dequantize_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, (cudaStream_t)mem->stream>>>(*q, (T *)y, ldy);
    return launched(fn);
  });
  return dtl__cuda_device_leave(prev, st);
}

extern "C" dtl_status dtl__act_fp8_quantize_emulate(const void *x, dtl_dtype t, int64_t ldx,
                                                    const dtl__act_fp8_rows *q) {
  DTL_TRY(dtl__act_fp8_check("dtl__act_fp8_quantize_emulate", q, t, "ldx", ldx));
  const int64_t nb = dtl__act_fp8_blocks(q->cols);
  return with_type(t, [&](auto z) {
    using T = decltype(z);
    for (int64_t r = 0; r < q->rows; r++)
      for (int64_t b = 0; b < nb; b++) {
        float m = 0.0f; /* the shuffle tree's maximum, lane by lane (fmaxf is order-free) */
        for (int lane = 0; lane < kLanes; lane++) m = fmaxf(m, lane_amax((const T *)x, ldx, *q, r, b, lane));
        float s, scale = block_scale(m, &s);
        for (int lane = 0; lane < kLanes; lane++) lane_codes((const T *)x, ldx, *q, r, b, lane, s);
        q->scales[r * q->lds + b] = scale;
      }
    return DTL_OK;
  });
}

extern "C" dtl_status dtl__act_fp8_dequantize_emulate(const dtl__act_fp8_rows *q, dtl_dtype t, void *y, int64_t ldy) {
  DTL_TRY(dtl__act_fp8_check("dtl__act_fp8_dequantize_emulate", q, t, "ldy", ldy));
  return with_type(t, [&](auto z) {
    using T = decltype(z);
    for (int64_t i = 0; i < q->rows * q->cols; i++) dequantize_one(*q, (T *)y, ldy, i);
    return DTL_OK;
  });
}

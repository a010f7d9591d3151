/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of combine (CUDA builds only): the weighted sum of each token's expert rows on the
 * communicator's stream, with the same slot order and the same rounding as the host loop (products and sums
 * rounded separately, no FMA), so host and device results agree bit for bit. The layout's combine map
 * (slot_row, weights) was uploaded when it was created. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
extern "C" {
#include "moe/moe_internal.h"
}

namespace {

__device__ inline float to_acc(float v) { return v; }
__device__ inline double to_acc(double v) { return v; }
__device__ inline float to_acc(__half v) { return __half2float(v); }
__device__ inline float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float add(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add(double a, double b) { return __dadd_rn(a, b); }
template <typename T, typename A> __device__ inline T from_acc(A v) { return (T)v; }
template <> __device__ inline __half from_acc<__half, float>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 from_acc<__nv_bfloat16, float>(float v) { return __float2bfloat16_rn(v); }

/* One block per token (grid-stride), threads across the hidden dim; slot_row and weights as on the host. */
template <typename T, typename A>
__global__ void combine_kernel(const int64_t *slot_row, const float *weights, int64_t tokens, int k, int64_t hidden,
                               int64_t send_rows, const T *staging, const T *expert_out, T *y) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x)
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      A acc = 0;
      bool used = false;
      for (int s = 0; s < k; s++) {
        int64_t r = slot_row[t * k + s];
        if (r < 0) continue;
        const T *in = r < send_rows ? staging + r * hidden : expert_out + (r - send_rows) * hidden;
        A v = mul((A)weights[t * k + s], to_acc(in[h]));
        acc = used ? add(acc, v) : v;
        used = true;
      }
      y[t * hidden + h] = from_acc<T, A>(acc);
    }
}

template <typename T, typename A>
cudaError_t launch(const dtl_moe_layout *L, const int64_t *slot_row, const float *weights, const void *expert_out,
                   void *y, cudaStream_t stream) {
  if (L->tokens == 0) return cudaSuccess;
  unsigned blocks = (unsigned)(L->tokens < 65535 ? L->tokens : 65535);
  unsigned threads = L->hidden >= 256 ? 256 : (unsigned)((L->hidden + 31) / 32 * 32);
  combine_kernel<T, A><<<blocks, threads, 0, stream>>>(slot_row, weights, L->tokens, L->k, L->hidden, L->send_rows,
                                                       (const T *)L->send_buf, (const T *)expert_out, (T *)y);
  return cudaGetLastError();
}

dtl_status cuda_fail(const char *what, cudaError_t e) {
  return dtl__error(DTL_ERR_CUDA, "dtl_moe_layout_combine: %s: CUDA error %d (%s): %s", what, (int)e,
                    cudaGetErrorName(e), cudaGetErrorString(e));
}

}  // namespace

/* Runs on the stream's device (made current for the call and restored after). */
extern "C" dtl_status dtl__moe_combine_device(dtl_moe_layout *L, const void *expert_out, void *y) {
  cudaStream_t stream = (cudaStream_t)L->comm->mem.stream;
  int dev = -1, cur = -1;
  cudaError_t e = cudaStreamGetDevice(stream, &dev);
  if (e == cudaSuccess) e = cudaGetDevice(&cur);
  if (e == cudaSuccess && cur != dev) e = cudaSetDevice(dev);
  if (e != cudaSuccess) return cuda_fail("selecting the communicator's device", e);
  dtl_status st = DTL_OK;
  if (L->tokens > 0) {
    const int64_t *rows = L->dev_slot_row;
    const float *w = L->dev_weights;
    switch (L->dtype) {
      case DTL_FLOAT32: e = launch<float, float>(L, rows, w, expert_out, y, stream); break;
      case DTL_FLOAT64: e = launch<double, double>(L, rows, w, expert_out, y, stream); break;
      case DTL_FLOAT16: e = launch<__half, float>(L, rows, w, expert_out, y, stream); break;
      default: e = launch<__nv_bfloat16, float>(L, rows, w, expert_out, y, stream); break;
    }
    if (e != cudaSuccess) st = cuda_fail("launching the weighted sum", e);
  }
  if (cur >= 0 && cur != dev) cudaSetDevice(cur);
  return st;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of the MLP activation (stages.h): one grid-stride kernel over this rank's ffn columns,
 * SiLU-gated or GELU in f32 (tp_math.h) on f32/f16/bf16 storage. */
#include "compute/device.cuh"
#include "tp/stages.h"

namespace {

using namespace dtl_dev;

/* Element i of the tokens x f activated columns: token i / f, column i % f of h [tokens, width]. */
template <typename T>
__host__ __device__ inline void activate_at(int64_t i, dtl_tp_activation act, T *h, int64_t f, int64_t width) {
  T *row = h + (i / f) * width;
  int64_t j = i % f;
  float g = load(row + j);
  store(row + j, act == DTL_TP_ACT_SILU_GATED ? dtl__silu_gated(g, load(row + f + j)) : dtl__gelu(g));
}

template <typename T>
__global__ void activate_kernel(dtl_tp_activation act, T *h, int64_t n, int64_t f, int64_t width) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    activate_at(i, act, h, f, width);
}

}  // namespace

extern "C" dtl_status dtl__tp_activate_cuda(dtl_tp_activation act, void *h, int64_t tokens, int64_t f, int64_t width,
                                            dtl_dtype t, void *stream) {
  static const char fn[] = "dtl__tp_activate_cuda";
  int64_t n = tokens * f;
  if (n <= 0) return DTL_OK;
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    activate_kernel<T><<<elementwise_blocks(n), kThreads, 0, (cudaStream_t)stream>>>(act, (T *)h, n, f, width);
    return launched(fn);
  });
}

extern "C" dtl_status dtl__tp_activate_emulate(dtl_tp_activation act, void *h, int64_t tokens, int64_t f,
                                               int64_t width, dtl_dtype t) {
  int64_t n = tokens * f;
  if (n <= 0) return DTL_OK;
  return with_type(t, "dtl__tp_activate_emulate", [&](auto z) {
    using T = decltype(z);
    for (int64_t i = 0; i < n; i++) activate_at(i, act, (T *)h, f, width);
    return DTL_OK;
  });
}

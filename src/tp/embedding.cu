/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of the embedding lookup (stages.h): one grid-stride kernel copies each token's row of
 * this rank's table shard, or zeros for ids another rank owns. A bit copy, so it serves f32, f16 and bf16
 * alike (zero bits are +0 in each). The ids were validated on the host and copied to the device. */
#include "compute/device.cuh"
#include "tp/tp_math.h"
#include "tp/stages.h"

namespace {

using namespace dtl_dev;

template <typename U>
__host__ __device__ inline void embed_at(int64_t i, const int64_t *ids, const U *table, int64_t off, int64_t count,
                                         int64_t hidden, U *out) {
  int64_t row = dtl__tp_embed_row(ids[i / hidden], off, count);
  out[i] = row >= 0 ? table[row * hidden + i % hidden] : (U)0;
}

template <typename U>
__global__ void embed_kernel(const int64_t *ids, int64_t n, const U *table, int64_t off, int64_t count,
                             int64_t hidden, U *out) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    embed_at(i, ids, table, off, count, hidden, out);
}

/* Calls f(U()) with U the unsigned integer as wide as an element of t. */
template <typename F>
dtl_status with_bits(dtl_dtype t, const char *fn, F f) {
  return with_type(t, fn, [&](auto z) { return sizeof z == 4 ? f(uint32_t()) : f(uint16_t()); });
}

}  // namespace

extern "C" dtl_status dtl__tp_embed_cuda(const int64_t *ids, int64_t tokens, const void *table, int64_t off,
                                         int64_t count, int64_t hidden, dtl_dtype t, void *out, void *stream) {
  static const char fn[] = "dtl__tp_embed_cuda";
  int64_t n = tokens * hidden;
  if (n <= 0) return DTL_OK;
  return with_bits(t, fn, [&](auto z) {
    using U = decltype(z);
    embed_kernel<U><<<elementwise_blocks(n), kThreads, 0, (cudaStream_t)stream>>>(ids, n, (const U *)table, off,
                                                                                  count, hidden, (U *)out);
    return launched(fn);
  });
}

extern "C" dtl_status dtl__tp_embed_emulate(const int64_t *ids, int64_t tokens, const void *table, int64_t off,
                                            int64_t count, int64_t hidden, dtl_dtype t, void *out) {
  int64_t n = tokens * hidden;
  return with_bits(t, "dtl__tp_embed_emulate", [&](auto z) {
    using U = decltype(z);
    for (int64_t i = 0; i < n; i++) embed_at(i, ids, (const U *)table, off, count, hidden, (U *)out);
    return DTL_OK;
  });
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of rotary position embedding (rope.h): one grid-stride kernel over (row, pair), each
 * thread computing its angle's sine and cosine once and turning that pair in every head of the row, on
 * f32/f16/bf16 storage with f32 arithmetic. */
#include "attn/rope.h"
#include "compute/device.cuh"

namespace {

using namespace dtl_dev;

/* Element idx of rows x D/2: pair idx % (D/2) of row idx / (D/2), in every head. */
template <typename T>
__host__ __device__ inline void rope_at(const dtl__rope_shape &s, T *x, int64_t idx) {
  const int64_t half = s.head_dim / 2, r = idx / half, i = idx % half;
  float ang = dtl__rope_angle(dtl__rope_pos(&s, r), i, s.head_dim, s.theta), c = cosf(ang), sn = sinf(ang);
  T *row = x + r * s.ld + i;
  for (int64_t h = 0; h < s.heads; h++) {
    T *a = row + h * s.head_dim;
    float ra, rb;
    dtl__rope_turn(load(a), load(a + half), c, sn, &ra, &rb);
    store(a, ra);
    store(a + half, rb);
  }
}

template <typename T>
__global__ void rope_kernel(dtl__rope_shape s, T *x, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    rope_at(s, x, i);
}

}  // namespace

extern "C" dtl_status dtl__rope_cuda(const dtl__rope_shape *s, void *x, dtl_dtype t, void *stream) {
  static const char fn[] = "dtl__rope_cuda";
  DTL_TRY(dtl__rope_check(fn, s));
  int64_t n = s->rows * (s->head_dim / 2);
  if (n == 0 || s->heads == 0) return DTL_OK;
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    rope_kernel<T><<<elementwise_blocks(n), kThreads, 0, (cudaStream_t)stream>>>(*s, (T *)x, n);
    return launched(fn);
  });
}

extern "C" dtl_status dtl__rope_emulate(const dtl__rope_shape *s, void *x, dtl_dtype t) {
  static const char fn[] = "dtl__rope_emulate";
  DTL_TRY(dtl__rope_check(fn, s));
  int64_t n = s->rows * (s->head_dim / 2);
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    for (int64_t i = 0; i < n; i++) rope_at(*s, (T *)x, i);
    return DTL_OK;
  });
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of the attention-state operations (state.h): merge (one thread block per state, so the
 * in-place lse is written after every thread of the block has read it), lse combine and rescale
 * (grid-stride over values), on f32/f16/bf16 storage with f32 arithmetic, and their host emulations. */
#include "attn/state.h"
#include "compute/device.cuh"

namespace {

using namespace dtl_dev;

template <typename T>
struct merge_args {
  int64_t H, D, lda, ldb;
  T *o_a;
  float *lse_a;
  const T *o_b;
  const float *lse_b;
};

/* Thread tid of nt of the block of state st (token st / H, head st % H): its values of the merged o.
 * Returns the merged lse, which the caller stores once every thread has read the old one. */
template <typename T>
__host__ __device__ inline float merge_state(const merge_args<T> &a, int64_t st, int tid, int nt) {
  int64_t i = st / a.H, h = st % a.H;
  float wa, wb, l = dtl__attn_merge_weights(a.lse_a[st], a.lse_b[st], &wa, &wb);
  if (wb == 0.0f) return l; /* b empty: a keeps its bits */
  T *o = a.o_a + i * a.lda + h * a.D;
  const T *b = a.o_b + i * a.ldb + h * a.D;
  for (int64_t d = tid; d < a.D; d += nt) {
    if (wa == 0.0f) o[d] = b[d];
    else store(o + d, wa * load(o + d) + wb * load(b + d));
  }
  return l;
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) merge_kernel(merge_args<T> a, int64_t st0) {
  int64_t st = st0 + blockIdx.x;
  float l = merge_state(a, st, threadIdx.x, kRowThreads);
  __syncthreads(); /* every thread has read lse_a[st] */
  if (threadIdx.x == 0) a.lse_a[st] = l;
}

__global__ void combine_kernel(int64_t n, int p, const float *lse, int64_t stride, float *L) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    L[i] = dtl__attn_lse_combine(lse + i, p, stride);
}

template <typename S, typename T>
struct rescale_args {
  int64_t H, D, lds, ldd;
  const S *src;
  const float *lse, *L;
  T *dst;
};

/* Value e of the rescale (token e / (H D), head e / D % H, dim e % D). */
template <typename S, typename T>
__host__ __device__ inline void rescale_value(const rescale_args<S, T> &a, int64_t e) {
  int64_t st = e / a.D, d = e % a.D, i = st / a.H, h = st % a.H;
  float w = dtl__attn_rescale_weight(a.lse[st], a.L[st]);
  /* an empty state contributes exact zeros, whatever its o holds */
  store(a.dst + i * a.ldd + h * a.D + d, w == 0.0f ? 0.0f : w * load(a.src + i * a.lds + h * a.D + d));
}

template <typename S, typename T>
__global__ void rescale_kernel(rescale_args<S, T> a, int64_t n) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
    rescale_value(a, e);
}

/* Launches at most this many merge blocks at once (the grid's x limit is 2^31 - 1). */
constexpr int64_t kMaxStateBlocks = (int64_t)1 << 30;

template <typename T, typename L>
dtl_status merge_by_launch(int64_t rows, int64_t H, int64_t D, void *o_a, int64_t lda, float *lse_a, const void *o_b,
                           int64_t ldb, const float *lse_b, L launch) {
  merge_args<T> a = {H, D, lda, ldb, (T *)o_a, lse_a, (const T *)o_b, lse_b};
  int64_t n = rows * H;
  for (int64_t st0 = 0; st0 < n; st0 += kMaxStateBlocks)
    DTL_TRY(launch(a, st0, n - st0 < kMaxStateBlocks ? n - st0 : kMaxStateBlocks));
  return DTL_OK;
}

/* Calls f(S(), T()) with T the storage type of t and S that of the rescale's source. */
template <typename F>
dtl_status with_rescale_types(dtl_dtype t, bool src_f32, const char *fn, F f) {
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    return src_f32 ? f(float(), z) : f(z, z);
  });
}

}  // namespace

extern "C" dtl_status dtl__attn_merge_cuda(int64_t rows, int64_t H, int64_t D, void *o_a, int64_t lda, float *lse_a,
                                           const void *o_b, int64_t ldb, const float *lse_b, dtl_dtype t,
                                           void *stream) {
  static const char fn[] = "dtl__attn_merge_cuda";
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    return merge_by_launch<T>(rows, H, D, o_a, lda, lse_a, o_b, ldb, lse_b,
                              [&](const merge_args<T> &a, int64_t st0, int64_t n) {
                                merge_kernel<T><<<(unsigned)n, kRowThreads, 0, (cudaStream_t)stream>>>(a, st0);
                                return launched(fn);
                              });
  });
}

extern "C" dtl_status dtl__attn_merge_emulate(int64_t rows, int64_t H, int64_t D, void *o_a, int64_t lda, float *lse_a,
                                              const void *o_b, int64_t ldb, const float *lse_b, dtl_dtype t) {
  return with_type(t, "dtl__attn_merge_emulate", [&](auto z) {
    using T = decltype(z);
    return merge_by_launch<T>(rows, H, D, o_a, lda, lse_a, o_b, ldb, lse_b,
                              [&](const merge_args<T> &a, int64_t st0, int64_t n) {
                                for (int64_t st = st0; st < st0 + n; st++) {
                                  float l = 0.0f;
                                  for (int tid = 0; tid < kRowThreads; tid++) l = merge_state(a, st, tid, kRowThreads);
                                  a.lse_a[st] = l;
                                }
                                return DTL_OK;
                              });
  });
}

extern "C" dtl_status dtl__attn_combine_cuda(int64_t n, int p, const float *lse, int64_t stride, float *L,
                                             void *stream) {
  if (n <= 0) return DTL_OK;
  combine_kernel<<<elementwise_blocks(n), kThreads, 0, (cudaStream_t)stream>>>(n, p, lse, stride, L);
  return launched("dtl__attn_combine_cuda");
}

extern "C" dtl_status dtl__attn_combine_emulate(int64_t n, int p, const float *lse, int64_t stride, float *L) {
  for (int64_t i = 0; i < n; i++) L[i] = dtl__attn_lse_combine(lse + i, p, stride);
  return DTL_OK;
}

extern "C" dtl_status dtl__attn_rescale_cuda(int64_t rows, int64_t H, int64_t D, const void *src, int64_t lds,
                                             bool src_f32, const float *lse, const float *L, void *dst, int64_t ldd,
                                             dtl_dtype t, void *stream) {
  static const char fn[] = "dtl__attn_rescale_cuda";
  return with_rescale_types(t, src_f32, fn, [&](auto zs, auto zt) {
    using S = decltype(zs);
    using T = decltype(zt);
    int64_t n = rows * H * D;
    if (n <= 0) return DTL_OK;
    rescale_args<S, T> a = {H, D, lds, ldd, (const S *)src, lse, L, (T *)dst};
    rescale_kernel<S, T><<<elementwise_blocks(n), kThreads, 0, (cudaStream_t)stream>>>(a, n);
    return launched(fn);
  });
}

extern "C" dtl_status dtl__attn_rescale_emulate(int64_t rows, int64_t H, int64_t D, const void *src, int64_t lds,
                                                bool src_f32, const float *lse, const float *L, void *dst, int64_t ldd,
                                                dtl_dtype t) {
  return with_rescale_types(t, src_f32, "dtl__attn_rescale_emulate", [&](auto zs, auto zt) {
    using S = decltype(zs);
    using T = decltype(zt);
    rescale_args<S, T> a = {H, D, lds, ldd, (const S *)src, lse, L, (T *)dst};
    for (int64_t e = 0; e < rows * H * D; e++) rescale_value(a, e);
    return DTL_OK;
  });
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of the per-rank top-k candidates (stages.h): one thread block per token picks its k best
 * logits by k rounds of a block-wide arg-best, each round taking the best candidate strictly after the
 * previous pick in the total order of dtl__tp_better (so ties, NaN and -0/+0 rank exactly as on the host,
 * and the logits are never modified). k rounds over the rank's vocab: meant for the small k of sampling. */
#include "compute/device.cuh"
#include "tp/tp_math.h"
#include "tp/stages.h"

namespace {

using namespace dtl_dev;

/* Thread tid of nt: the best of the columns j = tid, tid + nt, ... of row that come strictly after the
 * previous pick (pv, pi) (every column when first); (0, -1) when there is none. */
template <typename T>
__host__ __device__ inline void topk_scan(const T *row, int64_t n, int64_t off, bool first, float pv, int64_t pi,
                                          int tid, int nt, float *bv, int64_t *bi) {
  float best_v = 0.0f;
  int64_t best_i = -1;
  for (int64_t j = tid; j < n; j += nt) {
    float v = load(row + j);
    int64_t idx = off + j;
    if ((first || dtl__tp_better(pv, pi, v, idx)) && dtl__tp_better(v, idx, best_v, best_i)) {
      best_v = v;
      best_i = idx;
    }
  }
  *bv = best_v;
  *bi = best_i;
}

/* One step of the pair tree: slot a takes slot b when b is better. */
__host__ __device__ inline void keep_better(float *v, int64_t *i, int a, int b) {
  if (dtl__tp_better(v[b], i[b], v[a], i[a])) {
    v[a] = v[b];
    i[a] = i[b];
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) topk_kernel(const T *logits, int64_t n, int64_t off, int k,
                                                           int64_t *cand) {
  __shared__ float sv[kRowThreads];
  __shared__ int64_t si[kRowThreads];
  const int tid = threadIdx.x;
  const T *row = logits + (int64_t)blockIdx.x * n;
  int64_t *out = cand + (int64_t)blockIdx.x * k * 2;
  float pv = 0.0f;
  int64_t pi = -1;
  for (int j = 0; j < k; j++) {
    topk_scan(row, n, off, j == 0, pv, pi, tid, kRowThreads, &sv[tid], &si[tid]);
    __syncthreads();
    for (int s = kRowThreads / 2; s > 0; s >>= 1) {
      if (tid < s) keep_better(sv, si, tid, tid + s);
      __syncthreads();
    }
    pv = sv[0];
    pi = si[0];
    if (tid == 0) dtl__tp_cand_set(out + 2 * j, pv, pi);
    __syncthreads(); /* everyone has read slot 0 before the next round overwrites it */
  }
}

}  // namespace

extern "C" dtl_status dtl__tp_topk_local_cuda(const void *logits, int64_t tokens, int64_t n, int64_t off, int k,
                                              int64_t *cand, dtl_dtype t, void *stream) {
  static const char fn[] = "dtl__tp_topk_local_cuda";
  if (tokens <= 0 || k <= 0) return DTL_OK;
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    topk_kernel<T><<<(unsigned)tokens, kRowThreads, 0, (cudaStream_t)stream>>>((const T *)logits, n, off, k, cand);
    return launched(fn);
  });
}

extern "C" dtl_status dtl__tp_topk_local_emulate(const void *logits, int64_t tokens, int64_t n, int64_t off, int k,
                                                 int64_t *cand, dtl_dtype t) {
  return with_type(t, "dtl__tp_topk_local_emulate", [&](auto z) {
    using T = decltype(z);
    float sv[kRowThreads];
    int64_t si[kRowThreads];
    for (int64_t b = 0; b < tokens; b++) {
      const T *row = (const T *)logits + b * n;
      float pv = 0.0f;
      int64_t pi = -1;
      for (int j = 0; j < k; j++) {
        for (int tid = 0; tid < kRowThreads; tid++)
          topk_scan(row, n, off, j == 0, pv, pi, tid, kRowThreads, &sv[tid], &si[tid]);
        for (int s = kRowThreads / 2; s > 0; s >>= 1)
          for (int tid = 0; tid < s; tid++) keep_better(sv, si, tid, tid + s);
        pv = sv[0];
        pi = si[0];
        dtl__tp_cand_set(cand + (b * k + j) * 2, pv, pi);
      }
    }
    return DTL_OK;
  });
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of the attention core (stages.h): one thread block per score row (token i, local q head
 * h) computes the causal scores against keys 0..i, a two-pass softmax in f32 (max, then exp and sum), and
 * the weighted sum of the values, on f32/f16/bf16 storage. Scores live in global scratch, one row of
 * `tokens` floats per block, so any sequence length fits; long sequences take several launches. */
#include "compute/device.cuh"
#include "tp/tp_math.h"
#include "tp/stages.h"

namespace {

using namespace dtl_dev;

template <typename T>
struct attn_args {
  dtl__tp_attn_shape s;
  const T *qkv;
  T *attn;
  float *scores; /* [rows of this launch, tokens] */
  int64_t row0;  /* the score row of block 0 */
};

/* Score row r: query token r / qn, local q head r % qn. */
__host__ __device__ inline int64_t row_token(const dtl__tp_attn_shape &s, int64_t r) { return r / s.qn; }
__host__ __device__ inline int64_t row_head(const dtl__tp_attn_shape &s, int64_t r) { return r % s.qn; }
template <typename T>
__host__ __device__ inline float *row_scores(const attn_args<T> &a, int64_t r) {
  return a.scores + (r - a.row0) * a.s.tokens;
}

/* Pass 1, thread tid of nt: scale * q_i . k_j for the keys j = tid, tid + nt, ... <= i; returns their max. */
template <typename T>
__host__ __device__ inline float attn_scores(const attn_args<T> &a, int64_t r, int tid, int nt) {
  const dtl__tp_attn_shape &s = a.s;
  int64_t i = row_token(s, r), h = row_head(s, r), D = s.head_dim;
  int64_t kh = dtl__tp_kv_head(s.q_off, h, s.group, s.kv_off);
  const T *q = a.qkv + i * s.width + h * D;
  float *row = row_scores(a, r), mx = -INFINITY;
  for (int64_t j = tid; j <= i; j += nt) {
    const T *k = a.qkv + j * s.width + (s.qn + kh) * D;
    float dot = 0.0f;
    for (int64_t d = 0; d < D; d++) dot += load(q + d) * load(k + d);
    row[j] = s.scale * dot;
    mx = fmaxf(mx, row[j]);
  }
  return mx;
}

/* Pass 2: the same keys' exp(score - max) in place; returns their sum. */
template <typename T>
__host__ __device__ inline float attn_exp(const attn_args<T> &a, int64_t r, int tid, int nt, float mx) {
  int64_t i = row_token(a.s, r);
  float *row = row_scores(a, r), sum = 0.0f;
  for (int64_t j = tid; j <= i; j += nt) sum += (row[j] = expf(row[j] - mx));
  return sum;
}

/* Output, thread tid of nt: dims d = tid, tid + nt, ... of sum_j (e_j / sum) v_j (all keys j <= i). */
template <typename T>
__host__ __device__ inline void attn_out(const attn_args<T> &a, int64_t r, int tid, int nt, float inv) {
  const dtl__tp_attn_shape &s = a.s;
  int64_t i = row_token(s, r), h = row_head(s, r), D = s.head_dim;
  int64_t kh = dtl__tp_kv_head(s.q_off, h, s.group, s.kv_off);
  const float *row = row_scores(a, r);
  const T *v0 = a.qkv + (s.qn + s.kn + kh) * D;
  T *out = a.attn + i * s.qn * D + h * D;
  for (int64_t d = tid; d < D; d += nt) {
    float acc = 0.0f;
    for (int64_t j = 0; j <= i; j++) acc += row[j] * inv * load(v0 + j * s.width + d);
    store(out + d, acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) attend_kernel(attn_args<T> a) {
  int64_t r = a.row0 + blockIdx.x;
  float mx = block_reduce(attn_scores(a, r, threadIdx.x, kRowThreads), max_op());
  float sum = block_reduce(attn_exp(a, r, threadIdx.x, kRowThreads, mx), sum_op());
  attn_out(a, r, threadIdx.x, kRowThreads, 1.0f / sum);
}

/* Calls launch(a) for each run of at most `rows` score rows. */
template <typename T, typename L>
dtl_status by_launch(const dtl__tp_attn_shape *s, const void *qkv, float *scores, int64_t rows, void *attn, L launch) {
  int64_t total = s->tokens * s->qn;
  for (int64_t row0 = 0; row0 < total; row0 += rows) {
    attn_args<T> a = {*s, (const T *)qkv, (T *)attn, scores, row0};
    DTL_TRY(launch(a, total - row0 < rows ? total - row0 : rows));
  }
  return DTL_OK;
}

}  // namespace

extern "C" dtl_status dtl__tp_attend_cuda(const dtl__tp_attn_shape *s, const void *qkv, float *scores, int64_t rows,
                                          void *attn, dtl_dtype t, void *stream) {
  static const char fn[] = "dtl__tp_attend_cuda";
  if (rows < 1) return dtl__error(DTL_ERR_INTERNAL, "%s: rows=%lld (expected >= 1)", fn, (long long)rows);
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    return by_launch<T>(s, qkv, scores, rows, attn, [&](const attn_args<T> &a, int64_t n) {
      attend_kernel<T><<<(unsigned)n, kRowThreads, 0, (cudaStream_t)stream>>>(a);
      return launched(fn);
    });
  });
}

extern "C" dtl_status dtl__tp_attend_emulate(const dtl__tp_attn_shape *s, const void *qkv, float *scores, int64_t rows,
                                             void *attn, dtl_dtype t) {
  static const char fn[] = "dtl__tp_attend_emulate";
  if (rows < 1) return dtl__error(DTL_ERR_INTERNAL, "%s: rows=%lld (expected >= 1)", fn, (long long)rows);
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    return by_launch<T>(s, qkv, scores, rows, attn, [&](const attn_args<T> &a, int64_t n) {
      float red[kRowThreads];
      for (int64_t r = a.row0; r < a.row0 + n; r++) {
        for (int tid = 0; tid < kRowThreads; tid++) red[tid] = attn_scores(a, r, tid, kRowThreads);
        float mx = tree_reduce_host(red, kRowThreads, max_op());
        for (int tid = 0; tid < kRowThreads; tid++) red[tid] = attn_exp(a, r, tid, kRowThreads, mx);
        float sum = tree_reduce_host(red, kRowThreads, sum_op());
        for (int tid = 0; tid < kRowThreads; tid++) attn_out(a, r, tid, kRowThreads, 1.0f / sum);
      }
      return DTL_OK;
    });
  });
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of the attention core (attn.h): one thread block per score row (query i, local q head h)
 * computes the scores against the keys the row sees, a two-pass softmax in f32 (max, then exp and sum), the
 * weighted sum of the values and the row's log-sum-exp, on f32/f16/bf16 storage. Scores live in global
 * scratch, one row of tk floats per block, so any sequence length fits; long sequences take several
 * launches. */
#include "attn/attn.h"
#include "compute/device.cuh"

namespace {

using namespace dtl_dev;

/* T: storage of q, k, v; O: of out (T, or f32 with s.out_f32). */
template <typename T, typename O>
struct attn_args {
  dtl__attn_shape s;
  const T *q, *k, *v;
  O *out;
  float *lse;
  float *scores; /* [rows of this launch, tk] */
  int64_t row0;  /* the score row of block 0 */
};

/* Score row r: query r / qn, local q head r % qn. */
template <typename T, typename O>
__host__ __device__ inline float *row_scores(const attn_args<T, O> &a, int64_t r) {
  return a.scores + (r - a.row0) * a.s.tk;
}

/* Pass 1, thread tid of nt: scale * q_i . k_j for the keys j = tid, tid + nt, ... the row may see (-inf for
 * a key it does not see); returns their max. */
template <typename T, typename O>
__host__ __device__ inline float attn_scores(const attn_args<T, O> &a, int64_t r, int tid, int nt) {
  const dtl__attn_shape &s = a.s;
  int64_t i = r / s.qn, h = r % s.qn, D = s.head_dim, qp = dtl__attn_qpos(&s, i);
  int64_t kh = dtl__attn_kv_head(s.q_off, h, s.group, s.kv_off), end = dtl__attn_key_end(&s, qp);
  const T *q = a.q + i * s.ldq + h * D;
  float *row = row_scores(a, r), mx = -INFINITY;
  for (int64_t j = tid; j < end; j += nt) {
    float sc = -INFINITY;
    if (dtl__attn_sees(&s, qp, j)) {
      const T *k = a.k + j * s.ldk + kh * D;
      float dot = 0.0f;
      for (int64_t d = 0; d < D; d++) dot += load(q + d) * load(k + d);
      sc = s.scale * dot;
    }
    row[j] = sc;
    mx = fmaxf(mx, sc);
  }
  return mx;
}

/* Pass 2: the same keys' exp(score - max) in place (0 for all when the row saw nothing); returns their sum. */
template <typename T, typename O>
__host__ __device__ inline float attn_exp(const attn_args<T, O> &a, int64_t r, int tid, int nt, float mx) {
  const dtl__attn_shape &s = a.s;
  int64_t end = dtl__attn_key_end(&s, dtl__attn_qpos(&s, r / s.qn));
  float *row = row_scores(a, r), sum = 0.0f;
  for (int64_t j = tid; j < end; j += nt) sum += (row[j] = mx == -INFINITY ? 0.0f : expf(row[j] - mx));
  return sum;
}

/* Output, thread tid of nt: dims d = tid, tid + nt, ... of sum_j (e_j / sum) v_j over the row's keys; thread
 * 0 also stores the row's log-sum-exp. */
template <typename T, typename O>
__host__ __device__ inline void attn_out(const attn_args<T, O> &a, int64_t r, int tid, int nt, float mx, float sum) {
  const dtl__attn_shape &s = a.s;
  int64_t i = r / s.qn, h = r % s.qn, D = s.head_dim, end = dtl__attn_key_end(&s, dtl__attn_qpos(&s, i));
  int64_t kh = dtl__attn_kv_head(s.q_off, h, s.group, s.kv_off);
  const float *row = row_scores(a, r);
  const T *v0 = a.v + kh * D;
  float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  O *out = a.out + i * s.ldo + h * D;
  for (int64_t d = tid; d < D; d += nt) {
    float acc = 0.0f;
    for (int64_t j = 0; j < end; j++) acc += row[j] * inv * load(v0 + j * s.ldv + d);
    store(out + d, acc);
  }
  if (tid == 0 && a.lse) a.lse[i * s.qn + h] = dtl__attn_lse(mx, sum);
}

template <typename T, typename O>
__global__ void __launch_bounds__(kRowThreads) attend_kernel(attn_args<T, O> a) {
  int64_t r = a.row0 + blockIdx.x;
  float mx = block_reduce(attn_scores(a, r, threadIdx.x, kRowThreads), max_op());
  float sum = block_reduce(attn_exp(a, r, threadIdx.x, kRowThreads, mx), sum_op());
  attn_out(a, r, threadIdx.x, kRowThreads, mx, sum);
}

/* Checks s and the scratch, then calls launch(a, n) for each run of at most the scratch's rows. */
template <typename T, typename O, typename L>
dtl_status by_launch(const char *fn, const dtl__attn_shape *s, const void *q, const void *k, const void *v, void *out,
                     float *lse, void *scratch, size_t scratch_bytes, L launch) {
  DTL_TRY(dtl__attn_check(fn, s));
  int64_t total = s->tq * s->qn;
  if (total == 0) return DTL_OK;
  int64_t rows = dtl__attn_tile_rows(s, DTL_MEMORY_DEVICE, scratch_bytes);
  if (rows < 1)
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "scratch_bytes=%zu (expected >= %zu: one score row)", scratch_bytes,
                         (size_t)s->tk * sizeof(float));
  for (int64_t row0 = 0; row0 < total; row0 += rows) {
    attn_args<T, O> a = {*s, (const T *)q, (const T *)k, (const T *)v, (O *)out, lse, (float *)scratch, row0};
    DTL_TRY(launch(a, total - row0 < rows ? total - row0 : rows));
  }
  return DTL_OK;
}

/* Calls f(T(), O()) with T the storage type of t and O that of out: T, or float with s->out_f32. */
template <typename F>
dtl_status with_types(const dtl__attn_shape *s, dtl_dtype t, const char *fn, F f) {
  return with_type(t, fn, [&](auto z) {
    using T = decltype(z);
    return s->out_f32 ? f(z, float()) : f(z, T());
  });
}

}  // namespace

extern "C" dtl_status dtl__attn_cuda(const dtl__attn_shape *s, const void *q, const void *k, const void *v, void *out,
                                     float *lse, void *scratch, size_t scratch_bytes, dtl_dtype t, void *stream) {
  static const char fn[] = "dtl__attn_cuda";
  return with_types(s, t, fn, [&](auto z, auto o) {
    using T = decltype(z);
    using O = decltype(o);
    return by_launch<T, O>(fn, s, q, k, v, out, lse, scratch, scratch_bytes, [&](const attn_args<T, O> &a, int64_t n) {
      attend_kernel<T, O><<<(unsigned)n, kRowThreads, 0, (cudaStream_t)stream>>>(a);
      return launched(fn);
    });
  });
}

extern "C" dtl_status dtl__attn_emulate(const dtl__attn_shape *s, const void *q, const void *k, const void *v,
                                        void *out, float *lse, void *scratch, size_t scratch_bytes, dtl_dtype t) {
  static const char fn[] = "dtl__attn_emulate";
  return with_types(s, t, fn, [&](auto z, auto o) {
    using T = decltype(z);
    using O = decltype(o);
    return by_launch<T, O>(fn, s, q, k, v, out, lse, scratch, scratch_bytes, [&](const attn_args<T, O> &a, int64_t n) {
      float red[kRowThreads];
      for (int64_t r = a.row0; r < a.row0 + n; r++) {
        for (int tid = 0; tid < kRowThreads; tid++) red[tid] = attn_scores(a, r, tid, kRowThreads);
        float mx = tree_reduce_host(red, kRowThreads, max_op());
        for (int tid = 0; tid < kRowThreads; tid++) red[tid] = attn_exp(a, r, tid, kRowThreads, mx);
        float sum = tree_reduce_host(red, kRowThreads, sum_op());
        for (int tid = 0; tid < kRowThreads; tid++) attn_out(a, r, tid, kRowThreads, mx, sum);
      }
      return DTL_OK;
    });
  });
}

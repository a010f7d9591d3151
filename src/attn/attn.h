/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The attention core that every attention layer calls: for each query row and
 * local q head, softmax(scale q k^T) v over the keys its position lets it see, plus the log-sum-exp of those
 * scores, so that results over disjoint key blocks can be merged exactly (ring context parallelism) and new
 * queries can attend to a KV cache (decode). The host half (attn.c) is two GEMMs per head and query tile
 * through compute/gemm.h; the device half (attn.cu) runs one thread block per score row on f32/f16/bf16
 * storage with f32 arithmetic, and its code also runs on the host (dtl__attn_emulate) for tests. Neither
 * allocates: the caller passes scratch of dtl__attn_scratch_bytes. */
#ifndef DTL_ATTN_ATTN_H
#define DTL_ATTN_ATTN_H

#include "compute/gemm.h"
#include "compute/math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One attention call. Matrices are row-major with leading dims in elements:
 *   q   [tq, ldq]: row i holds the qn local q heads of head_dim D each, from column 0;
 *   k,v [tk, ldk], [tk, ldv]: row j holds the kn local kv heads, from column 0;
 *   out [tq, ldo]: row i gets the qn heads' results, from column 0;
 *   lse [tq, qn] (f32, contiguous; may be NULL): log(sum_j exp(s_ij)) over the keys row i saw.
 * GQA: local q head h reads local kv head dtl__attn_kv_head(q_off, h, group, kv_off).
 * Positions are global token indices: query row i is at q_pos ? q_pos[i] : q_pos0 + i, key row j at
 * k_pos ? k_pos[j] : k_pos0 + j (arrays in the call's memory: host, or device for dtl__attn_cuda). With
 * causal, query i sees key j iff pos(j) <= pos(i); without, it sees every key. A row that sees no key
 * (or whose every score is -inf) gets out = 0 and lse = -inf, never NaN. */
typedef struct {
  int64_t tq, tk;
  int64_t qn, kn, head_dim;
  int64_t q_off, kv_off, group;
  int64_t ldq, ldk, ldv, ldo;
  const int64_t *q_pos, *k_pos;
  int64_t q_pos0, k_pos0;
  bool causal;
  float scale;
  /* Device half: out is f32 whatever t (a partial result that a merge accumulates in f32, src/attn/state.h);
   * the host half is f32 throughout. */
  bool out_f32;
  /* Host half: when set, called between tiles (a ring lets its nonblocking transfer progress meanwhile). */
  void (*progress)(void *arg);
  void *progress_arg;
} dtl__attn_shape;

/* The local kv head of local q head h: global q head q_off + h belongs to kv head (q_off + h) / group,
 * which is local kv head that minus kv_off (the caller keeps it among the kn it passes). */
static DTL_HD inline int64_t dtl__attn_kv_head(int64_t q_off, int64_t h, int64_t group, int64_t kv_off) {
  return (q_off + h) / group - kv_off;
}
static DTL_HD inline int64_t dtl__attn_qpos(const dtl__attn_shape *s, int64_t i) {
  return s->q_pos ? s->q_pos[i] : s->q_pos0 + i;
}
static DTL_HD inline int64_t dtl__attn_kpos(const dtl__attn_shape *s, int64_t j) {
  return s->k_pos ? s->k_pos[j] : s->k_pos0 + j;
}
/* Whether a query at position qp sees key j. */
static DTL_HD inline bool dtl__attn_sees(const dtl__attn_shape *s, int64_t qp, int64_t j) {
  return !s->causal || dtl__attn_kpos(s, j) <= qp;
}
/* The keys a query at position qp may see lie in [0, end): with contiguous key positions and causal, the
 * keys at or before qp; otherwise all of them (then dtl__attn_sees decides key by key). */
static DTL_HD inline int64_t dtl__attn_key_end(const dtl__attn_shape *s, int64_t qp) {
  if (!s->causal || s->k_pos) return s->tk;
  int64_t n = qp - s->k_pos0 + 1;
  return n < 0 ? 0 : n > s->tk ? s->tk : n;
}
/* The log-sum-exp of a row from its max score mx and sum of exp(score - mx): -inf for a row that saw
 * nothing (no key, or every score -inf); NaN when a NaN score made the sum NaN (it must not pass for an
 * empty row, which a merge would drop). */
static DTL_HD inline float dtl__attn_lse(float mx, float sum) { return mx == -INFINITY ? -INFINITY : mx + logf(sum); }

/* Which heads a rank of a group of n computes, never cutting a head: the rule of tensor parallelism
 * (documented on dtl_tp_attention_heads in <dtl/tp.h>) that all-to-all context parallelism splits heads by
 * too. With n <= kv_heads the kv heads are split by torch.chunk and each rank takes their q heads; with
 * n > kv_heads every kv head is replicated on n / kv_heads ranks (vLLM's rule). Other combinations are
 * DTL_ERR_INVALID_ARGUMENT naming fn and the numbers, the group size as group_name=n ("tp=3"). q and kv
 * may be NULL. */
typedef struct {
  int64_t offset, count;
} dtl__attn_range;
dtl_status dtl__attn_heads(const char *fn, const char *group_name, int64_t q_heads, int64_t kv_heads, int n, int r,
                           dtl__attn_range *q, dtl__attn_range *kv);

/* DTL_ERR_INTERNAL naming fn and the field when s is inconsistent (negative sizes, leading dims narrower
 * than the heads, a q head whose kv head is not among the kn given). The entry points below call it. */
dtl_status dtl__attn_check(const char *fn, const dtl__attn_shape *s);

/* Scratch bytes for the default tiling of s in memory where (host: the values transposed plus a tile of
 * query rows' scores; device: the scores of a launch's rows); about 64 MiB of scores at most, however
 * long the sequences. The entry points take any scratch_bytes from the minimum (one score row) up, and
 * tile by what they are given. */
size_t dtl__attn_scratch_bytes(const dtl__attn_shape *s, dtl_memory where);
/* The rows one pass covers with scratch_bytes of scratch (host: query rows of a tile; device: score rows
 * (query i, head h) = row i * qn + h of a launch): the default tiling's, or fewer when the scratch is
 * smaller; 0 when it is below the minimum. At least 1 whenever there is a row to compute and enough
 * scratch. */
int64_t dtl__attn_tile_rows(const dtl__attn_shape *s, dtl_memory where, size_t scratch_bytes);

/* The host half: f32 host buffers, GEMMs on engine g (a host engine). */
dtl_status dtl__attn_host(const dtl__gemm_engine *g, const dtl__attn_shape *s, const float *q, const float *k,
                          const float *v, float *out, float *lse, void *scratch, size_t scratch_bytes);

#if DTL_HAVE_NCCL
/* The device half: q, k, v, out of dtype t (f32/f16/bf16; out f32 with s->out_f32) and lse (f32), positions
 * and scratch in device memory of the current device; f32 scores, softmax and accumulation, one rounding to
 * t on store. Enqueued
 * on stream (a cudaStream_t); returns at once. */
dtl_status dtl__attn_cuda(const dtl__attn_shape *s, const void *q, const void *k, const void *v, void *out,
                          float *lse, void *scratch, size_t scratch_bytes, dtl_dtype t, void *stream);
/* The device half's code run on the host over host memory, block by block and thread by thread with the
 * launch's block size and reduction tree. For tests; not a fast path. */
dtl_status dtl__attn_emulate(const dtl__attn_shape *s, const void *q, const void *k, const void *v, void *out,
                             float *lse, void *scratch, size_t scratch_bytes, dtl_dtype t);
#endif

#ifdef __cplusplus
}
#endif
#endif

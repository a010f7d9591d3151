/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The compute stages of the TP blocks that sit between their GEMMs and
 * collectives: the MLP activation, the per-rank top-k candidates and the embedding lookup (attention is the
 * attention core's, src/attn). Each has a host half (C loops in f32, next to its layer) and a device half (CUDA
 * kernels, *.cu: f32/f16/bf16 storage, f32 arithmetic, enqueued on a stream), and the device half's code can
 * be run on the host (*_emulate) so that tests check its index arithmetic without a GPU. None allocates:
 * scratch comes from the caller. */
#ifndef DTL_TP_STAGES_H
#define DTL_TP_STAGES_H

#include "common/internal.h"
#include "dtl/tp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- MLP activation: in place on the first f columns of each row of h [tokens, width] -------------------- */
/* SILU_GATED: h[t, j] = silu(h[t, j]) * h[t, f + j] (gate columns, then up columns); GELU: h[t, j] = gelu(h[t, j]). */
void dtl__tp_activate_host(dtl_tp_activation act, float *h, int64_t tokens, int64_t f, int64_t width);

/* --- top-k candidates ----------------------------------------------------------------------------------- */
/* For each of tokens rows of logits [tokens, n] (global vocab index off + j for column j): the k best
 * candidates (dtl__tp_better) in order, as k pairs (tp_math.h) in cand [tokens, k, 2]; empty slots when
 * n < k are (0.0f, -1). */
void dtl__tp_topk_local_host(const float *logits, int64_t tokens, int64_t n, int64_t off, int k, int64_t *cand);
/* Merges p ranks' candidate blocks (cand [p][tokens, k, 2], as all-gathered) into values [tokens, k]
 * (may be NULL) and indices [tokens, k]; list is scratch for 2k int64. */
void dtl__tp_topk_merge(const int64_t *cand, int p, int64_t tokens, int k, int64_t *list, float *values,
                        int64_t *indices);

/* --- embedding lookup ----------------------------------------------------------------------------------- */
/* out [tokens, hidden] (elements of elem bytes): row t = table row dtl__tp_embed_row(ids[t], off, count) of
 * this rank's shard table [count, hidden], or zeros when another rank owns the id. ids are already valid. */
void dtl__tp_embed_host(const int64_t *ids, int64_t tokens, const void *table, int64_t off, int64_t count,
                        int64_t hidden, size_t elem, void *out);

#if DTL_HAVE_NCCL
/* The device halves: the same results with buffers in device memory of the current device, dtype t
 * (f32/f16/bf16) for activations, logits and tables, and f32 arithmetic (half types are read into f32 and
 * rounded to nearest even once, on store). Enqueued on stream (a cudaStream_t); they return at once. */
dtl_status dtl__tp_activate_cuda(dtl_tp_activation act, void *h, int64_t tokens, int64_t f, int64_t width,
                                 dtl_dtype t, void *stream);
dtl_status dtl__tp_topk_local_cuda(const void *logits, int64_t tokens, int64_t n, int64_t off, int k,
                                   int64_t *cand, dtl_dtype t, void *stream);
dtl_status dtl__tp_embed_cuda(const int64_t *ids, int64_t tokens, const void *table, int64_t off, int64_t count,
                              int64_t hidden, dtl_dtype t, void *out, void *stream);

/* The device halves' code run on the host over host memory, block by block and thread by thread with the
 * launch's own block size (the block reductions become sequential loops). For tests; not a fast path. */
dtl_status dtl__tp_activate_emulate(dtl_tp_activation act, void *h, int64_t tokens, int64_t f, int64_t width,
                                    dtl_dtype t);
dtl_status dtl__tp_topk_local_emulate(const void *logits, int64_t tokens, int64_t n, int64_t off, int k,
                                      int64_t *cand, dtl_dtype t);
dtl_status dtl__tp_embed_emulate(const int64_t *ids, int64_t tokens, const void *table, int64_t off, int64_t count,
                                 int64_t hidden, dtl_dtype t, void *out);
#endif

#ifdef __cplusplus
}
#endif
#endif

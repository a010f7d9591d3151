/* SPDX-License-Identifier: Apache-2.0 */
/* Distributed top-k (and argmax) over vocab-sharded logits: each rank keeps its k best (value, global index)
 * pairs per token, one all-gather exchanges only those, and every rank merges the same candidates the same
 * way. The order is total (NaN first, then larger values, then lower indices), so the result equals a dense
 * top-k over the gathered row with ties broken by lowest index. */
#include <math.h>
#include <string.h>
#include "tp/tp_internal.h"

/* A candidate: index -1 marks an empty slot (a rank with fewer than k logits), worse than any real one. */
static bool dtl__tp_better(float va, int64_t ia, float vb, int64_t ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

/* Inserts (v, i) into the sorted list (vals, idx) of k slots if it beats the last one. */
static void dtl__tp_offer(float *vals, int64_t *idx, int k, float v, int64_t i) {
  if (!dtl__tp_better(v, i, vals[k - 1], idx[k - 1])) return;
  int j = k - 1;
  while (j > 0 && dtl__tp_better(v, i, vals[j - 1], idx[j - 1])) {
    vals[j] = vals[j - 1];
    idx[j] = idx[j - 1];
    j--;
  }
  vals[j] = v;
  idx[j] = i;
}

static void dtl__tp_clear(float *vals, int64_t *idx, int k) {
  for (int j = 0; j < k; j++) {
    vals[j] = 0.0f;
    idx[j] = -1;
  }
}

dtl_status dtl_tp_logits_topk(dtl_tp_context *ctx, const dtl_layout *logits_layout, const void *logits_local, int k,
                              float *values, int64_t *indices) {
  static const char fn[] = "dtl_tp_logits_topk";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(logits_layout != NULL, fn, "logits_layout=NULL");
  DTL_TRY(dtl__tp_check_compute(ctx, fn, false));
  int64_t T, V = logits_layout->ndim == 2 ? logits_layout->shape[1] : -1;
  DTL_TRY(dtl__tp_check_layout(ctx, fn, "logits_layout", logits_layout, V, dtl_shard(1), &T));
  DTL_CHECK_ARG(k >= 1 && k <= V, fn, "k=%d (expected 1..vocab=%lld)", k, (long long)V);
  DTL_CHECK_ARG(logits_local != NULL || dtl_layout_local_count(logits_layout) == 0, fn, "logits_local=NULL");
  DTL_CHECK_ARG(indices != NULL || T == 0, fn, "indices=NULL");
  size_t pairs;
  DTL_TRY(dtl__tp_count(fn, "candidates", T * 2, k, &pairs));
  void *send_v, *recv_v, *best_v;
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_INPUT, pairs * sizeof(int64_t), &send_v));
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_MID, pairs * (size_t)ctx->size * sizeof(int64_t), &recv_v));
  DTL_TRY(dtl__tp_scratch(ctx, DTL__TP_WS_AUX, (size_t)k * (sizeof(float) + sizeof(int64_t)), &best_v));
  int64_t *send = send_v, *recv = recv_v, *bi = best_v;
  float *bv = (float *)(bi + k);
  dtl_tp_range mine = dtl__tp_chunk(ctx, V, ctx->rank);
  const float *lg = logits_local;
  /* This rank's candidates: (value bits, global index) pairs, best first. */
  for (int64_t t = 0; t < T; t++) {
    dtl__tp_clear(bv, bi, k);
    for (int64_t j = 0; j < mine.count; j++) dtl__tp_offer(bv, bi, k, lg[t * mine.count + j], mine.offset + j);
    for (int j = 0; j < k; j++) {
      uint32_t bits;
      memcpy(&bits, &bv[j], sizeof bits);
      send[(t * k + j) * 2] = (int64_t)bits;
      send[(t * k + j) * 2 + 1] = bi[j];
    }
  }
  DTL_TRY(dtl_all_gather(ctx->comm, send, recv, pairs, DTL_INT64));
  for (int64_t t = 0; t < T; t++) {
    dtl__tp_clear(bv, bi, k);
    for (int r = 0; r < ctx->size; r++)
      for (int j = 0; j < k; j++) {
        const int64_t *c = recv + ((size_t)r * pairs) + (size_t)(t * k + j) * 2;
        uint32_t bits = (uint32_t)c[0];
        float v;
        memcpy(&v, &bits, sizeof v);
        dtl__tp_offer(bv, bi, k, v, c[1]);
      }
    for (int j = 0; j < k; j++) {
      if (values) values[t * k + j] = bv[j];
      indices[t * k + j] = bi[j];
    }
  }
  return DTL_OK;
}

dtl_status dtl_tp_logits_argmax(dtl_tp_context *ctx, const dtl_layout *logits_layout, const void *logits_local,
                                int64_t *indices) {
  dtl_status st = dtl_tp_logits_topk(ctx, logits_layout, logits_local, 1, NULL, indices);
  return st == DTL_OK ? st : dtl__error_prefix(st, "dtl_tp_logits_argmax");
}

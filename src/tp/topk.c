/* SPDX-License-Identifier: Apache-2.0 */
/* Distributed top-k (and argmax) over vocab-sharded logits: each rank keeps its k best (value, global index)
 * pairs per token, one all-gather exchanges only those, and every rank merges the same candidates the same
 * way. The order is total (NaN first, then larger values, then lower indices), so the result equals a dense
 * top-k over the gathered row with ties broken by lowest index. The per-rank selection runs here on the host
 * and in topk.cu on a device; the merge of the (few) gathered candidates always runs here. */
#include "comm/agree.h"
#include "tp/stages.h"
#include "tp/tp_internal.h"
#include "tp/tp_math.h"

/* Inserts (v, i) into the sorted candidate list of k slots if it beats the last one. */
static void dtl__tp_offer(int64_t *list, int k, float v, int64_t i) {
  int64_t *last = list + 2 * (k - 1);
  if (!dtl__tp_better(v, i, dtl__tp_cand_value(last), last[1])) return;
  int j = k - 1;
  for (; j > 0 && dtl__tp_better(v, i, dtl__tp_cand_value(list + 2 * (j - 1)), list[2 * (j - 1) + 1]); j--) {
    list[2 * j] = list[2 * (j - 1)];
    list[2 * j + 1] = list[2 * (j - 1) + 1];
  }
  dtl__tp_cand_set(list + 2 * j, v, i);
}

static void dtl__tp_clear(int64_t *list, int k) {
  for (int j = 0; j < k; j++) dtl__tp_cand_set(list + 2 * j, 0.0f, -1);
}

void dtl__tp_topk_local_host(const float *logits, int64_t tokens, int64_t n, int64_t off, int k, int64_t *cand) {
  for (int64_t t = 0; t < tokens; t++) {
    int64_t *list = cand + t * k * 2;
    dtl__tp_clear(list, k);
    for (int64_t j = 0; j < n; j++) dtl__tp_offer(list, k, logits[t * n + j], off + j);
  }
}

void dtl__tp_topk_merge(const int64_t *cand, int p, int64_t tokens, int k, int64_t *list, float *values,
                        int64_t *indices) {
  size_t block = (size_t)(tokens * k * 2);
  for (int64_t t = 0; t < tokens; t++) {
    dtl__tp_clear(list, k);
    for (int r = 0; r < p; r++)
      for (int j = 0; j < k; j++) {
        const int64_t *c = cand + (size_t)r * block + (size_t)(t * k + j) * 2;
        dtl__tp_offer(list, k, dtl__tp_cand_value(c), c[1]);
      }
    for (int j = 0; j < k; j++) {
      if (values) values[t * k + j] = dtl__tp_cand_value(list + 2 * j);
      indices[t * k + j] = list[2 * j + 1];
    }
  }
}

/* The checks of a top-k call; *T and *V get the token and vocab counts, *pairs and *all the int64 of this
 * rank's candidates and of everyone's. */
static dtl_status dtl__tp_topk_args(dtl_tp_context *ctx, const char *fn, const dtl_layout *logits_layout,
                                    const void *logits_local, int k, const int64_t *indices, int64_t *T, int64_t *V,
                                    size_t *pairs, size_t *all) {
  DTL_CHECK_ARG(logits_layout != NULL, fn, "logits_layout=NULL");
  DTL_TRY(dtl__tp_check_compute(ctx, fn));
  *V = logits_layout->ndim == 2 ? logits_layout->shape[1] : -1;
  DTL_TRY(dtl__tp_check_layout(ctx, fn, "logits_layout", logits_layout, *V, dtl_shard(1), T));
  DTL_CHECK_ARG(k >= 1 && k <= *V, fn, "k=%d (expected 1..vocab=%lld)", k, (long long)*V);
  DTL_CHECK_ARG(logits_local != NULL || dtl_layout_local_count(logits_layout) == 0, fn, "logits_local=NULL");
  DTL_CHECK_ARG(indices != NULL || *T == 0, fn, "indices=NULL");
  DTL_TRY(dtl__tp_count(fn, "candidates", *T * 2, k, pairs));
  return dtl__tp_count(fn, "gathered candidates", (int64_t)*pairs, ctx->size, all);
}

dtl_status dtl_tp_logits_topk(dtl_tp_context *ctx, const dtl_layout *logits_layout, const void *logits_local, int k,
                              float *values, int64_t *indices) {
  static const char fn[] = "dtl_tp_logits_topk";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  int64_t T = 0, V = 0;
  size_t pairs = 0, all = 0;
  dtl_status st = dtl__tp_topk_args(ctx, fn, logits_layout, logits_local, k, indices, &T, &V, &pairs, &all);
  /* Candidates as (value bits, global index) int64 pairs: this rank's in send, everyone's in recv (ctx
   * memory); the merge runs on the host, over recv or its host copy. */
  void *send = NULL, *recv = NULL, *host = NULL;
  bool dev = dtl__tp_on_device(ctx);
  if (st == DTL_OK) st = dtl__tp_scratch(ctx, DTL__TP_WS_INPUT, pairs * sizeof(int64_t), &send);
  if (st == DTL_OK) st = dtl__tp_scratch(ctx, DTL__TP_WS_MID, all * sizeof(int64_t), &recv);
  if (st == DTL_OK) st = dtl__tp_host_scratch(ctx, ((dev ? all : 0) + 2 * (size_t)k) * sizeof(int64_t), &host);
  DTL_TRY(dtl__agree_checked(ctx->comm, fn, DTL__TP_FP(ctx, fn, T, V, k), st));
  int64_t *list = host, *merged = dev ? list + 2 * k : recv;
  dtl_tp_range mine = dtl__tp_chunk(ctx, V, ctx->rank);
  if (dev) {
#if DTL_HAVE_NCCL
    DTL_TRY(dtl__tp_topk_local_cuda(logits_local, T, mine.count, mine.offset, k, send, ctx->dtype, ctx->gemm.stream));
#endif
  } else {
    dtl__tp_topk_local_host(logits_local, T, mine.count, mine.offset, k, send);
  }
  DTL_TRY(dtl__all_gather_agreed(ctx->comm, send, recv, pairs, DTL_INT64));
  if (dev) {
    DTL_TRY(dtl__mem_copy(&ctx->comm->mem, merged, recv, all * sizeof(int64_t)));
    DTL_TRY(ctx->comm->ops->synchronize(ctx->comm));
  }
  dtl__tp_topk_merge(merged, ctx->size, T, k, list, values, indices);
  return DTL_OK;
}

dtl_status dtl_tp_logits_argmax(dtl_tp_context *ctx, const dtl_layout *logits_layout, const void *logits_local,
                                int64_t *indices) {
  dtl_status st = dtl_tp_logits_topk(ctx, logits_layout, logits_local, 1, NULL, indices);
  return st == DTL_OK ? st : dtl__error_prefix(st, "dtl_tp_logits_argmax");
}

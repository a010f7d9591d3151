/* SPDX-License-Identifier: Apache-2.0 */
/* The MoE router: gate scores -> softmax -> each token's top-k experts and weights. Pure host code; the
 * whole input is validated before anything is written. */
#include <math.h>
#include <stdlib.h>
#include "moe/moe_internal.h"

static const char fn[] = "dtl_moe_router_topk";

static dtl_status dtl__router_check(const float *scores, int64_t tokens, int experts, bool logits) {
  for (int64_t t = 0; t < tokens; t++) {
    const float *row = scores + t * experts;
    bool any = false;
    for (int e = 0; e < experts; e++) {
      float v = row[e];
      if (logits) {
        if (isnan(v) || v == INFINITY)
          return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "logit[%lld][%d]=%g (expected finite or -inf)",
                               (long long)t, e, (double)v);
        any |= v != -INFINITY;
      } else if (!isfinite(v) || v < 0) {
        return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "probability[%lld][%d]=%g (expected finite and >= 0)",
                             (long long)t, e, (double)v);
      }
    }
    if (logits && !any)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "every logit of token %lld is -inf", (long long)t);
  }
  return DTL_OK;
}

/* Inserts (p, e) into the descending list of at most k picks; equal values keep the earlier (lower) id first
 * because experts arrive in increasing id order and only a strictly larger value moves ahead. */
static void dtl__topk_insert(float *val, int32_t *id, int *n, int k, float p, int32_t e) {
  if (*n == k && !(p > val[k - 1])) return;
  int i = *n < k ? (*n)++ : k - 1;
  while (i > 0 && p > val[i - 1]) {
    val[i] = val[i - 1];
    id[i] = id[i - 1];
    i--;
  }
  val[i] = p;
  id[i] = e;
}

dtl_status dtl_moe_router_topk(const float *scores, int64_t tokens, int experts, int k,
                               const dtl_moe_router_params *params, int32_t *ids, float *weights) {
  dtl_moe_scores kind = DTL_MOE_SCORES_LOGITS;
  bool renorm = false;
  if (params) {
    DTL_TRY(dtl__check_bits(fn, "params.mask", params->mask,
                            DTL__BITS(DTL_MOE_ROUTER_SCORES, DTL_MOE_ROUTER_RENORMALIZE)));
    DTL_TRY(dtl__check_bits(fn, "params.flags", params->flags, DTL__NO_BITS));
    if (params->mask & DTL_MOE_ROUTER_SCORES) kind = params->scores;
    if (params->mask & DTL_MOE_ROUTER_RENORMALIZE) renorm = params->renormalize != 0;
  }
  DTL_CHECK_ARG(kind == DTL_MOE_SCORES_LOGITS || kind == DTL_MOE_SCORES_PROBABILITIES, fn,
                "params.scores=%d (expected DTL_MOE_SCORES_LOGITS or DTL_MOE_SCORES_PROBABILITIES)", (int)kind);
  DTL_CHECK_ARG(experts >= 1, fn, "experts=%d (expected >= 1)", experts);
  DTL_CHECK_ARG(k >= 1 && k <= experts, fn, "k=%d (expected 1..experts=%d)", k, experts);
  DTL_CHECK_ARG(tokens >= 0, fn, "tokens=%lld (expected >= 0)", (long long)tokens);
  size_t cells;
  DTL_CHECK_ARG(dtl__mul_size((size_t)tokens, (size_t)experts, &cells) && cells <= (size_t)INT64_MAX / sizeof(float),
                fn, "tokens=%lld x experts=%d overflows", (long long)tokens, experts);
  if (tokens == 0) return DTL_OK;
  DTL_CHECK_ARG(scores != NULL, fn, "scores=NULL with %lld tokens", (long long)tokens);
  DTL_CHECK_ARG(ids != NULL, fn, "ids=NULL with %lld tokens", (long long)tokens);
  DTL_CHECK_ARG(weights != NULL, fn, "weights=NULL with %lld tokens", (long long)tokens);
  bool logits = kind == DTL_MOE_SCORES_LOGITS;
  DTL_TRY(dtl__router_check(scores, tokens, experts, logits));

  float *val = dtl__malloc(sizeof(float) * (size_t)k);
  int32_t *id = dtl__malloc(sizeof(int32_t) * (size_t)k);
  if (!val || !id) {
    dtl__free(val);
    dtl__free(id);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  for (int64_t t = 0; t < tokens; t++) {
    const float *row = scores + t * experts;
    /* Softmax is monotonic, so the top-k of the logits are the top-k of the probabilities; only the k picks
     * and the normaliser need exponentials. */
    int n = 0;
    for (int e = 0; e < experts; e++) dtl__topk_insert(val, id, &n, k, row[e], e);
    double scale = 1.0;
    float shift = 0.0f;
    if (logits) {
      shift = val[0]; /* the row maximum, finite since not every logit is -inf */
      double sum = 0.0;
      for (int e = 0; e < experts; e++) sum += exp((double)row[e] - (double)shift);
      scale = 1.0 / sum;
    }
    double kept = 0.0;
    for (int j = 0; j < k; j++) {
      double p = logits ? exp((double)val[j] - (double)shift) * scale : (double)val[j];
      weights[t * k + j] = (float)p;
      ids[t * k + j] = (float)p > 0.0f ? id[j] : -1;
      if ((float)p <= 0.0f) weights[t * k + j] = 0.0f;
      kept += weights[t * k + j];
    }
    if (renorm && kept > 0.0)
      for (int j = 0; j < k; j++) weights[t * k + j] = (float)((double)weights[t * k + j] / kept);
  }
  dtl__free(val);
  dtl__free(id);
  return DTL_OK;
}

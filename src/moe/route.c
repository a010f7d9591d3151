/* SPDX-License-Identifier: Apache-2.0 */
/* The local step of a dispatch layout: validation of a rank's routing, capacity, the drop policies and the
 * stable expert-major permutation with its inverse. Pure host code with no communication. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "moe/moe_internal.h"

int64_t dtl__moe_capacity(int64_t tokens, int k, int experts, double factor) {
  double c = ceil((double)tokens * (double)k / (double)experts * factor);
  return c >= 4.0e18 ? (int64_t)4e18 : (int64_t)c; /* beyond any pair count: no drops */
}

dtl_status dtl__moe_check_routing(const char *fn, const int32_t *ids, const float *weights, int64_t tokens, int k,
                                  int experts) {
  for (int64_t t = 0; t < tokens; t++)
    for (int s = 0; s < k; s++) {
      int32_t e = ids[t * k + s];
      if (e < -1 || e >= experts)
        return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "ids[%lld][%d]=%d (expected -1 or 0..%d)", (long long)t, s,
                             (int)e, experts - 1);
      float w = weights[t * k + s];
      if (e >= 0 && !(isfinite(w) && w >= 0))
        return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "weights[%lld][%d]=%g (expected finite and >= 0)",
                             (long long)t, s, (double)w);
    }
  return DTL_OK;
}

void dtl__moe_route_free(dtl__moe_route *r) {
  dtl__free(r->kept);
  dtl__free(r->dropped);
  dtl__free(r->start);
  dtl__free(r->perm);
  dtl__free(r->inv);
  memset(r, 0, sizeof *r);
}

typedef struct {
  float w;
  int64_t pair;
} dtl__weighted_pair;

/* Highest weight first; equal weights by position. */
static int dtl__by_weight(const void *a, const void *b) {
  const dtl__weighted_pair *x = a, *y = b;
  if (x->w != y->w) return x->w > y->w ? -1 : 1;
  return (x->pair > y->pair) - (x->pair < y->pair);
}

dtl_status dtl__moe_route_build(const int32_t *ids, const float *weights, int64_t tokens, int k, int experts,
                                int64_t capacity, dtl_moe_drop_policy policy, dtl__moe_route *out) {
  dtl__moe_route r = {0};
  r.pairs = tokens * k;
  size_t np = (size_t)r.pairs, ne = (size_t)experts;
  r.kept = dtl__calloc(ne, sizeof(int64_t));
  r.dropped = dtl__calloc(ne, sizeof(int64_t));
  r.start = dtl__calloc(ne + 1, sizeof(int64_t));
  r.inv = dtl__malloc(sizeof(int64_t) * (np ? np : 1));
  int64_t *all = dtl__malloc(sizeof(int64_t) * (np ? np : 1)); /* unmasked pairs grouped by expert */
  int64_t *fill = dtl__calloc(ne + 1, sizeof(int64_t));
  dtl__weighted_pair *sorted = NULL;
  if (!r.kept || !r.dropped || !r.start || !r.inv || !all || !fill) goto oom;

  /* Counting sort by expert; walking pairs in order keeps (token, slot) order inside each expert. */
  for (size_t i = 0; i < np; i++)
    if (ids[i] >= 0) fill[ids[i] + 1]++;
  for (size_t e = 0; e < ne; e++) fill[e + 1] += fill[e];
  int64_t *group = dtl__malloc(sizeof(int64_t) * (ne + 1));
  if (!group) goto oom;
  memcpy(group, fill, sizeof(int64_t) * (ne + 1));
  for (size_t i = 0; i < np; i++)
    if (ids[i] >= 0) all[fill[ids[i]]++] = (int64_t)i;

  /* Mark survivors in r.inv (1 kept, 0 dropped, -1 masked), then renumber in expert-major order. */
  for (size_t i = 0; i < np; i++) r.inv[i] = ids[i] >= 0 ? 1 : -1;
  for (size_t e = 0; e < ne; e++) {
    int64_t lo = group[e], n = group[e + 1] - lo;
    if (capacity < 0 || n <= capacity) continue;
    if (policy == DTL_MOE_DROP_POSITION) {
      for (int64_t i = capacity; i < n; i++) r.inv[all[lo + i]] = 0;
    } else {
      if (!sorted) sorted = dtl__malloc(sizeof *sorted * (np ? np : 1));
      if (!sorted) {
        dtl__free(group);
        goto oom;
      }
      for (int64_t i = 0; i < n; i++) sorted[i] = (dtl__weighted_pair){weights[all[lo + i]], all[lo + i]};
      qsort(sorted, (size_t)n, sizeof *sorted, dtl__by_weight);
      for (int64_t i = capacity; i < n; i++) r.inv[sorted[i].pair] = 0;
    }
  }
  int64_t kept_all = 0;
  for (size_t e = 0; e < ne; e++)
    for (int64_t i = group[e]; i < group[e + 1]; i++) {
      if (r.inv[all[i]] == 1) {
        all[kept_all++] = all[i]; /* compaction never overtakes the read position */
        r.kept[e]++;
      } else {
        r.dropped[e]++;
      }
    }
  dtl__free(group);
  for (size_t e = 0; e < ne; e++) r.start[e + 1] = r.start[e] + r.kept[e];
  for (size_t i = 0; i < np; i++) r.inv[i] = -1;
  for (int64_t i = 0; i < kept_all; i++) r.inv[all[i]] = i;
  r.kept_all = kept_all;
  r.perm = all;
  dtl__free(fill);
  dtl__free(sorted);
  *out = r;
  return DTL_OK;
oom:
  dtl__free(all);
  dtl__free(fill);
  dtl__free(sorted);
  dtl__moe_route_free(&r);
  return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_moe_layout_create: out of host memory for %lld routing pairs",
                    (long long)np);
}

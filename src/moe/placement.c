/* SPDX-License-Identifier: Apache-2.0 */
/* Expert placement: which rank of the expert-parallel group owns each expert, by torch.chunk's rule (the
 * same dtl__chunk that shards tensors) or by an explicit table, and each expert's local index there. */
#include <stdlib.h>
#include "layout/layout_internal.h"
#include "moe/moe_internal.h"

void dtl_moe_placement_destroy(dtl_moe_placement *p) {
  if (!p) return;
  dtl__free(p->owner);
  dtl__free(p->local);
  dtl__free(p->first);
  dtl__free(p->by_rank);
  dtl__free(p);
}

dtl_status dtl_moe_placement_create(int experts, int ranks, const int *owner, dtl_moe_placement **out) {
  static const char fn[] = "dtl_moe_placement_create";
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_CHECK_ARG(experts >= 1, fn, "experts=%d (expected >= 1)", experts);
  DTL_CHECK_ARG(ranks >= 1, fn, "ranks=%d (expected >= 1)", ranks);
  if (owner)
    for (int e = 0; e < experts; e++)
      DTL_CHECK_ARG(owner[e] >= 0 && owner[e] < ranks, fn, "owner[%d]=%d (expected a rank in 0..%d)", e, owner[e],
                    ranks - 1);
  dtl_moe_placement *p = dtl__calloc(1, sizeof *p);
  if (p) {
    p->owner = dtl__malloc(sizeof(int) * (size_t)experts);
    p->local = dtl__malloc(sizeof(int) * (size_t)experts);
    p->first = dtl__calloc((size_t)ranks + 1, sizeof(int));
    p->by_rank = dtl__malloc(sizeof(int) * (size_t)experts);
  }
  if (!p || !p->owner || !p->local || !p->first || !p->by_rank) {
    dtl_moe_placement_destroy(p);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  p->experts = experts;
  p->ranks = ranks;
  for (int r = 0; r < ranks && !owner; r++) {
    int64_t off, n;
    dtl__chunk(experts, ranks, r, &off, &n);
    for (int64_t e = off; e < off + n; e++) p->owner[e] = r;
  }
  for (int e = 0; e < experts; e++) {
    if (owner) p->owner[e] = owner[e];
    p->first[p->owner[e] + 1]++;
  }
  for (int r = 0; r < ranks; r++) {
    int n = p->first[r + 1];
    if (n > p->max_local) p->max_local = n;
    p->first[r + 1] += p->first[r];
  }
  int *fill = dtl__calloc((size_t)ranks, sizeof(int));
  if (!fill) {
    dtl_moe_placement_destroy(p);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  for (int e = 0; e < experts; e++) {
    int r = p->owner[e];
    p->local[e] = fill[r]++;
    p->by_rank[p->first[r] + p->local[e]] = e;
  }
  dtl__free(fill);
  *out = p;
  return DTL_OK;
}

int dtl_moe_placement_experts(const dtl_moe_placement *p) { return p ? p->experts : -1; }
int dtl_moe_placement_ranks(const dtl_moe_placement *p) { return p ? p->ranks : -1; }

int dtl_moe_placement_owner(const dtl_moe_placement *p, int expert) {
  return p && expert >= 0 && expert < p->experts ? p->owner[expert] : -1;
}

int dtl_moe_placement_local_count(const dtl_moe_placement *p, int rank) {
  return p && rank >= 0 && rank < p->ranks ? p->first[rank + 1] - p->first[rank] : -1;
}

int dtl_moe_placement_local_expert(const dtl_moe_placement *p, int rank, int local) {
  int n = dtl_moe_placement_local_count(p, rank);
  return local >= 0 && local < n ? p->by_rank[p->first[rank] + local] : -1;
}

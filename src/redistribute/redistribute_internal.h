/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. It exposes the plan cache that dtl_redistribute keeps on each mesh, so that
 * tests can check that repeated calls reuse one plan. */
#ifndef DTL_REDISTRIBUTE_INTERNAL_H
#define DTL_REDISTRIBUTE_INTERNAL_H

#include "redistribute/plan_internal.h"

/* The mesh's cached plan for (src, dst), creating and caching it on a miss. The plan belongs to the cache
 * (freed with the mesh). src and dst must be valid layouts on the same mesh. */
dtl_status dtl__plan_cached(const dtl_layout *src, const dtl_layout *dst, const dtl_plan **out);

/* Lookups of the mesh's plan cache that found a plan, and those that had to create one. */
void dtl__plan_cache_stats(const dtl_mesh *m, uint64_t *hits, uint64_t *misses);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. It exposes the plan cache that dtl_redistribute keeps on each mesh, so that
 * tests can check that repeated calls reuse one plan, and the executor's chunk size, so that tests reach the
 * chunked pack/unpack paths with small tensors. */
#ifndef DTL_REDISTRIBUTE_INTERNAL_H
#define DTL_REDISTRIBUTE_INTERNAL_H

#include "redistribute/plan_internal.h"

/* The mesh's cached plan for (src, dst), creating and caching it on a miss. The plan belongs to the cache
 * (freed with the mesh); dtl_redistribute runs it in the cache's one workspace, so it never allocates its own.
 * src and dst must be valid layouts on the same mesh. */
dtl_status dtl__plan_cached(const dtl_layout *src, const dtl_layout *dst, const dtl_plan **out);

/* The agreement of one execution of p, the hook of dtl_plan_execute: with DTL_CHECK on the mesh's
 * communicator every rank agrees on the plan (layouts, mesh, steps, cost model) and on each rank's local
 * verdict (its argument checks and allocations), else it returns local. */
dtl_status dtl__plan_agree(const char *fn, const dtl_plan *p, dtl_status local);

/* The same for plans run together (a quantized tensor's parts, all between the same meshes): one agreement whose
 * fingerprint covers every plan, so that a bad buffer of any of them on one rank fails every rank. */
dtl_status dtl__plans_agree(const char *fn, const dtl_plan *const *plans, int n, dtl_status local);
/* The agreement of a call that could not plan (a plan agrees in its execution): over the mesh, or over the ranks of
 * both meshes of src and dst, which form no communicator (their parent ranks, gathered here); the peers that did plan
 * meet it in their execution's agreement. */
dtl_status dtl__pair_agree(const char *fn, const dtl_layout *src, const dtl_layout *dst, dtl_status local);

/* Lookups of the mesh's plan cache that found a plan, and those that had to create one. */
void dtl__plan_cache_stats(const dtl_mesh *m, uint64_t *hits, uint64_t *misses);

/* Test hook: the bytes of one chunk of a host pack/unpack pass (0: the default, 1 MiB) and how many chunks
 * an average shard must hold before an all-to-all is chunked (0: the default, 32). Read when a plan is
 * compiled (created): plans made before a change keep their chunking. Not thread-safe. */
void dtl__executor_set_chunking(size_t chunk_bytes, size_t a2a_min_chunks);

#endif

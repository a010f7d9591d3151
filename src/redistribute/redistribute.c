/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_redistribute and the whole-tensor helpers built on it: the per-mesh plan cache (keyed by the (src,
 * dst) layout pair, so that a repeated call costs a hash lookup), the DTL_CHECK=1 cross-rank consistency
 * check, dtl_distribute (dense on root -> any layout) and dtl_full_tensor (any layout -> dense everywhere). */
#include <stdlib.h>
#include <string.h>
#include "redistribute/redistribute_internal.h"

/* --- plan cache ----------------------------------------------------------------------------------------- */

typedef struct dtl__plan_entry {
  uint64_t key;
  dtl_plan *plan;
  struct dtl__plan_entry *next;
} dtl__plan_entry;

/* Chained hash table on the mesh (not thread-safe, like every call on one mesh). It grows with its load;
 * past DTL__PLAN_CACHE_MAX plans it starts afresh, so that a program cycling through ever new layouts
 * keeps bounded memory. */
typedef struct {
  dtl__plan_entry **buckets;
  size_t nbuckets, count;
  uint64_t hits, misses;
} dtl__plan_cache;

#define DTL__PLAN_CACHE_MAX 1024

static void dtl__plan_cache_clear(dtl__plan_cache *pc) {
  for (size_t b = 0; b < pc->nbuckets; b++) {
    for (dtl__plan_entry *e = pc->buckets[b], *next; e; e = next) {
      next = e->next;
      dtl_plan_destroy(e->plan);
      dtl__free(e);
    }
    pc->buckets[b] = NULL;
  }
  pc->count = 0;
}

static void dtl__plan_cache_free(void *cache) {
  dtl__plan_cache *pc = cache;
  dtl__plan_cache_clear(pc);
  dtl__free(pc->buckets);
  dtl__free(pc);
}

static uint64_t dtl__pair_key(const dtl_layout *src, const dtl_layout *dst) {
  uint64_t k = dtl__layout_hash(src) * 0x9e3779b97f4a7c15ull ^ dtl__layout_hash(dst);
  return k ^ (k >> 29);
}

/* The mesh's plan cache, made on first use: it is the mesh's memo, filled through a const mesh (see
 * dtl__mesh_memo). */
static dtl_status dtl__plan_cache_of(const dtl_mesh *m, dtl__plan_cache **out) {
  dtl__mesh_memo *memo = m->memo;
  if (!memo->cache) {
    dtl__plan_cache *pc = dtl__calloc(1, sizeof *pc);
    if (pc) pc->buckets = dtl__calloc(16, sizeof *pc->buckets);
    if (!pc || !pc->buckets) {
      dtl__free(pc);
      return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_redistribute: out of host memory for the plan cache");
    }
    pc->nbuckets = 16;
    memo->cache = pc;
    memo->cache_free = dtl__plan_cache_free;
  }
  *out = memo->cache;
  return DTL_OK;
}

/* Doubles the bucket array; on failure the table just stays as it is. */
static void dtl__plan_cache_grow(dtl__plan_cache *pc) {
  size_t nb = pc->nbuckets * 2;
  dtl__plan_entry **nbk = dtl__calloc(nb, sizeof *nbk);
  if (!nbk) return;
  for (size_t b = 0; b < pc->nbuckets; b++) {
    for (dtl__plan_entry *e = pc->buckets[b], *next; e; e = next) {
      next = e->next;
      e->next = nbk[e->key & (nb - 1)];
      nbk[e->key & (nb - 1)] = e;
    }
  }
  dtl__free(pc->buckets);
  pc->buckets = nbk;
  pc->nbuckets = nb;
}

dtl_status dtl__plan_cached(const dtl_layout *src, const dtl_layout *dst, const dtl_plan **out) {
  dtl__plan_cache *pc = NULL;
  DTL_TRY(dtl__plan_cache_of(src->mesh, &pc));
  uint64_t key = dtl__pair_key(src, dst);
  for (dtl__plan_entry *e = pc->buckets[key & (pc->nbuckets - 1)]; e; e = e->next) {
    if (e->key == key && dtl__layout_equal(&e->plan->src, src) && dtl__layout_equal(&e->plan->dst, dst)) {
      pc->hits++;
      *out = e->plan;
      return DTL_OK;
    }
  }
  pc->misses++;
  dtl_plan *plan;
  DTL_TRY(dtl_plan_create(src, dst, &plan));
  dtl__plan_entry *e = dtl__malloc(sizeof *e);
  if (!e) {
    dtl_plan_destroy(plan);
    return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_redistribute: out of host memory for the plan cache");
  }
  if (pc->count >= DTL__PLAN_CACHE_MAX) dtl__plan_cache_clear(pc);
  if (pc->count >= pc->nbuckets) dtl__plan_cache_grow(pc);
  e->key = key;
  e->plan = plan;
  e->next = pc->buckets[key & (pc->nbuckets - 1)];
  pc->buckets[key & (pc->nbuckets - 1)] = e;
  pc->count++;
  *out = plan;
  return DTL_OK;
}

void dtl__plan_cache_stats(const dtl_mesh *m, uint64_t *hits, uint64_t *misses) {
  const dtl__plan_cache *pc = m ? m->memo->cache : NULL;
  if (hits) *hits = pc ? pc->hits : 0;
  if (misses) *misses = pc ? pc->misses : 0;
}

/* --- DTL_CHECK ------------------------------------------------------------------------------------------ */

/* Read on every call (a getenv), so that a program may switch it on at run time. */
static bool dtl__check_enabled(void) {
  const char *v = getenv("DTL_CHECK");
  return v && v[0] && !(v[0] == '0' && v[1] == '\0');
}

static int dtl__cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The reference fingerprint: the most common one; among equally common ones, that of the lowest rank (so
 * that with two ranks, rank 0's call is the reference). */
static uint64_t dtl__majority(const uint64_t *fp, int n, uint64_t *sorted) {
  memcpy(sorted, fp, sizeof *fp * (size_t)n);
  qsort(sorted, (size_t)n, sizeof *sorted, dtl__cmp_u64);
  int best_run = 0;
  for (int i = 0, j; i < n; i = j) {
    for (j = i; j < n && sorted[j] == sorted[i]; j++) {}
    if (j - i > best_run) best_run = j - i;
  }
  for (int r = 0; r < n; r++) { /* the lowest rank whose fingerprint is that common */
    int count = 0;
    for (int q = 0; q < n && count < best_run; q++) count += fp[q] == fp[r];
    if (count == best_run) return fp[r];
  }
  return fp[0];
}

/* All ranks of the mesh exchange (fingerprint, local status). Any disagreement, or any rank whose own
 * arguments failed (local != DTL_OK), makes every rank return: that rank its own error, the others
 * DTL_ERR_MISMATCH naming the ranks that differ, instead of entering mismatched collectives. The exchange
 * goes through the transport (its memory ops move the two words into and out of transport memory). */
static dtl_status dtl__check_consistent(const char *fn, const dtl_mesh *m, uint64_t fp, dtl_status local) {
  dtl_comm *c = m->comm;
  int n = c->size;
  size_t bytes = sizeof(uint64_t) * 2 * (size_t)n;
  uint64_t *all = dtl__malloc(bytes * 2 + sizeof(uint64_t) * (size_t)n);
  if (!all) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory for DTL_CHECK");
  uint64_t mine[2] = {fp, (uint64_t)local};
  dtl_status st;
  if (c->mem.ops->memory == DTL_MEMORY_HOST) {
    st = c->ops->all_gather(c, mine, all, 2, DTL_INT64);
  } else {
    void *dev = NULL;
    st = dtl__mem_alloc(&c->mem, bytes + sizeof mine, &dev);
    if (st == DTL_OK) st = dtl__mem_copy(&c->mem, (char *)dev + bytes, mine, sizeof mine);
    if (st == DTL_OK) st = c->ops->all_gather(c, (char *)dev + bytes, dev, 2, DTL_INT64);
    if (st == DTL_OK) st = dtl__mem_copy(&c->mem, all, dev, bytes);
    if (st == DTL_OK) st = c->ops->synchronize(c);
    if (dev) dtl__mem_free(&c->mem, dev);
  }
  if (st != DTL_OK) {
    dtl__free(all);
    return dtl__error_prefix(st, "%s: DTL_CHECK exchange", fn);
  }
  uint64_t *fps = all + 2 * n, *sorted = fps + n;
  bool failed = false;
  for (int r = 0; r < n; r++) {
    fps[r] = all[2 * r];
    if (all[2 * r + 1] != DTL_OK) failed = true;
  }
  uint64_t ref = dtl__majority(fps, n, sorted);
  char list[256];
  size_t o = 0;
  int bad = 0;
  for (int r = 0; r < n; r++) {
    if (fps[r] == ref && all[2 * r + 1] == DTL_OK) continue;
    if (o < sizeof list - 16) o += (size_t)snprintf(list + o, sizeof list - o, bad ? ",%d" : "%d", r);
    else if (o < sizeof list - 4) o += (size_t)snprintf(list + o, sizeof list - o, ",...");
    bad++;
  }
  dtl__free(all);
  if (bad == 0) return DTL_OK;
  if (local != DTL_OK) return local; /* this rank's own message stays */
  const char *verb = failed ? (bad > 1 ? "rejected their arguments or disagree" : "rejected its arguments or disagrees")
                             : (bad > 1 ? "disagree" : "disagrees");
  return dtl__error_fn(DTL_ERR_MISMATCH, fn, "DTL_CHECK: rank%s %s %s with the other ranks' call (layouts, dtype, "
                       "shape, mesh); this rank is %d of %d", bad > 1 ? "s" : "", list, verb, c->rank, n);
}

/* --- entry points --------------------------------------------------------------------------------------- */

static void dtl__shape_text(const dtl_layout *l, char *buf, size_t cap) {
  size_t o = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < l->ndim && o < cap; d++) o += (size_t)snprintf(buf + o, cap - o, d ? ",%lld" : "%lld", (long long)l->shape[d]);
  if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Checks that need no communication (the caller has checked that both layouts exist). */
static dtl_status dtl__redistribute_args(const char *fn, const dtl_layout *src, const void *src_local, const dtl_layout *dst,
                                         const void *dst_local) {
  if (src->mesh != dst->mesh)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "src and dst layouts are on different meshes (%p and %p); "
                         "redistribution stays on one mesh", (const void *)src->mesh, (const void *)dst->mesh);
  if (src->dtype != dst->dtype)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "src dtype=%s but dst dtype=%s (expected equal)",
                         dtl_dtype_name(src->dtype), dtl_dtype_name(dst->dtype));
  bool same = src->ndim == dst->ndim;
  for (int d = 0; same && d < src->ndim; d++) same = src->shape[d] == dst->shape[d];
  if (!same) {
    char a[128], b[128];
    dtl__shape_text(src, a, sizeof a);
    dtl__shape_text(dst, b, sizeof b);
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "src global shape=%s but dst global shape=%s (expected equal)", a, b);
  }
  DTL_CHECK_ARG(src_local != NULL || src->local_count == 0, fn, "src_local=NULL with %zu local elements", src->local_count);
  DTL_CHECK_ARG(dst_local != NULL || dst->local_count == 0, fn, "dst_local=NULL with %zu local elements", dst->local_count);
  return DTL_OK;
}

static dtl_status dtl__require_comm(const char *fn, const dtl_layout *l) {
  if (!l->mesh->comm)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "the layout's mesh is abstract (dtl_mesh_create_abstract): it "
                         "has no communicators, so nothing can be moved on it");
  return DTL_OK;
}

dtl_status dtl_redistribute(const dtl_layout *src, const void *src_local, const dtl_layout *dst, void *dst_local) {
  static const char fn[] = "dtl_redistribute";
  DTL_CHECK_ARG(src != NULL, fn, "src=NULL");
  DTL_CHECK_ARG(dst != NULL, fn, "dst=NULL");
  DTL_TRY(dtl__require_comm(fn, src));
  dtl_status local = dtl__redistribute_args(fn, src, src_local, dst, dst_local);
  if (dtl__check_enabled()) DTL_TRY(dtl__check_consistent(fn, src->mesh, dtl__pair_key(src, dst), local));
  if (local != DTL_OK) return local;
  const dtl_plan *plan;
  DTL_TRY(dtl__plan_cached(src, dst, &plan));
  return dtl_plan_execute(plan, src_local, dst_local);
}

dtl_status dtl_full_tensor(const dtl_layout *l, const void *local, void *dense) {
  DTL_CHECK_ARG(l != NULL, "dtl_full_tensor", "layout=NULL");
  /* All-Replicate: every rank's local shard is the whole tensor. */
  dtl_layout full = *l;
  for (int md = 0; md < l->mesh->ndim; md++) full.placements[md] = dtl_replicate();
  for (int d = 0; d < l->ndim; d++) {
    full.local_shape[d] = l->shape[d];
    full.local_offset[d] = 0;
  }
  full.local_count = l->global_count;
  dtl_status st = dtl_redistribute(l, local, &full, dense);
  return st == DTL_OK ? st : dtl__error_prefix(st, "dtl_full_tensor");
}

/* Root packs every other rank's box (ranks that will hold an identity get nothing) and one all-to-all-v
 * moves them, so each rank receives exactly its shard; root's own shard is a local box copy. Root
 * allocates the packed boxes of the other ranks (more than the tensor when the layout replicates). */
dtl_status dtl_distribute(const dtl_layout *l, const void *dense_on_root, int root, void *local) {
  static const char fn[] = "dtl_distribute";
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  DTL_TRY(dtl__require_comm(fn, l));
  const dtl_mesh *m = l->mesh;
  dtl_comm *c = m->comm;
  int n = c->size, me = c->rank;
  dtl_status local_st = DTL_OK;
  if (root < 0 || root >= n)
    local_st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "root=%d (expected 0..%d)", root, n - 1);
  else if (!local && l->local_count)
    local_st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "local=NULL with %zu local elements", l->local_count);
  else if (me == root && !dense_on_root && l->global_count)
    local_st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "dense_on_root=NULL on root %d with %zu elements", root,
                             l->global_count);
  if (dtl__check_enabled()) {
    uint64_t fp = dtl__layout_hash(l) * 0x9e3779b97f4a7c15ull ^ (0xd15ull << 32 | (uint32_t)root);
    DTL_TRY(dtl__check_consistent(fn, m, fp, local_st));
  }
  if (local_st != DTL_OK) return local_st;

  size_t es = dtl_dtype_size(l->dtype);
  size_t *send = dtl__calloc((size_t)n * 2, sizeof *send), *recv = send + n;
  if (!send) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  int coord[DTL_MAX_MESH_DIMS];
  int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
  size_t total = 0, packed = 0;
  for (int r = 0; r < n; r++) {
    dtl_mesh_coord_of(m, r, coord);
    if (r == root || dtl__layout_holds_identity(l, coord, NULL)) continue;
    dtl__local_box(m, l->ndim, l->shape, l->placements, coord, bs, bo);
    size_t cnt = 1;
    for (int d = 0; d < l->ndim; d++) cnt *= (size_t)bs[d];
    if (me == root) send[r] = cnt;
    if (r == me) recv[root] = cnt;
    total += cnt;
  }
  if (me == root) packed = total;
  void *pack = NULL;
  dtl_status st = DTL_OK;
  if (packed) DTL_TRY_GOTO(dtl__mem_alloc(&c->mem, packed * es, &pack), st, done);
  size_t off = 0;
  for (int r = 0; me == root && r < n; r++) {
    if (!send[r]) continue;
    dtl_mesh_coord_of(m, r, coord);
    dtl__local_box(m, l->ndim, l->shape, l->placements, coord, bs, bo);
    dtl__box_copy b = {.ndim = l->ndim, .elem_size = es};
    for (int d = 0; d < l->ndim; d++) {
      b.extent[d] = b.dst_shape[d] = bs[d];
      b.src_shape[d] = l->shape[d];
      b.src_off[d] = bo[d];
    }
    DTL_TRY_GOTO(dtl__mem_copy_box(&c->mem, dense_on_root, (char *)pack + off * es, &b), st, done);
    off += send[r];
  }
  if (total) DTL_TRY_GOTO(c->ops->all_to_allv(c, pack, send, local, recv, l->dtype), st, done);
  dtl_reduce_op op = DTL_SUM;
  if (dtl__layout_holds_identity(l, m->coord, &op)) {
    DTL_TRY_GOTO(dtl__mem_fill_identity(&c->mem, local, l->local_count, l->dtype, op), st, done);
  } else if (me == root && l->local_count) {
    dtl__box_copy b = {.ndim = l->ndim, .elem_size = es};
    for (int d = 0; d < l->ndim; d++) {
      b.extent[d] = b.dst_shape[d] = l->local_shape[d];
      b.src_shape[d] = l->shape[d];
      b.src_off[d] = l->local_offset[d];
    }
    DTL_TRY_GOTO(dtl__mem_copy_box(&c->mem, dense_on_root, local, &b), st, done);
  }
done:
  if (pack) dtl__mem_free(&c->mem, pack);
  dtl__free(send);
  return st;
}

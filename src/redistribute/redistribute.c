/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_redistribute and the whole-tensor helpers built on it: the per-mesh plan cache (keyed by the (src,
 * dst) layout pair, so that a repeated call costs a hash lookup, with one workspace for all its plans), the
 * plan's DTL_CHECK agreement (the fingerprint of an execution), dtl_distribute (dense on root -> any layout)
 * and dtl_full_tensor (any layout -> dense everywhere). */
#include <stdlib.h>
#include <string.h>
#include "comm/agree.h"
#include "redistribute/executor_internal.h"

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
  /* The one workspace that dtl_redistribute runs every cached plan in (calls on one mesh never overlap), grown
   * to the largest need seen: the cache holds one scratch buffer, not one per plan. */
  void *ws;
  size_t ws_bytes;
  dtl__mem ws_mem;
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
  if (pc->ws) dtl__mem_free(&pc->ws_mem, pc->ws);
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
  DTL_TRY(dtl__plan_create("dtl_redistribute", src, dst, NULL, SIZE_MAX, &plan)); /* runs in the cache's workspace */
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

/* The cache's workspace, at least bytes long (grown, never shrunk). */
static dtl_status dtl__plan_cache_workspace(const dtl_mesh *m, size_t bytes, void **out) {
  dtl__plan_cache *pc = NULL;
  DTL_TRY(dtl__plan_cache_of(m, &pc));
  if (bytes > pc->ws_bytes) {
    void *q = NULL;
    dtl_status st = dtl__mem_alloc(dtl__mesh_mem(m), bytes, &q);
    if (st != DTL_OK) return dtl__error_prefix(st, "dtl_redistribute: a workspace of %zu bytes", bytes);
    if (pc->ws) dtl__mem_free(&pc->ws_mem, pc->ws);
    pc->ws = q;
    pc->ws_bytes = bytes;
    pc->ws_mem = *dtl__mesh_mem(m);
  }
  *out = pc->ws;
  return DTL_OK;
}

void dtl__plan_cache_stats(const dtl_mesh *m, uint64_t *hits, uint64_t *misses) {
  const dtl__plan_cache *pc = m ? m->memo->cache : NULL;
  if (hits) *hits = pc ? pc->hits : 0;
  if (misses) *misses = pc ? pc->misses : 0;
}

/* --- agreement ----------------------------------------------------------------------------------------- */

/* What every rank must execute alike: both layouts, the mesh they are on (its id tells two meshes of one
 * shape apart), the steps and the resolved cost model (ranks whose DTL_PLAN_TUNE or explicit cost differ may
 * plan different steps for the same layouts), and for a quantized part the geometry its boxes come from. */
static uint64_t dtl__plan_fingerprint(const dtl_plan *p) {
  uint64_t h = dtl__fp_mix(dtl__pair_key(&p->src, &p->dst), p->src.mesh->id);
  h = dtl__fp_mix(h, p->dst.mesh->id);
  h = dtl__fp_double(h, p->cost.alpha_s);
  h = dtl__fp_double(h, p->cost.beta_s_per_byte);
  h = dtl__fp_double(h, p->cost.local_beta_s_per_byte);
  h = dtl__fp_mix(h, (uint64_t)p->nsteps);
  h = dtl__fp_mix(h, (uint64_t)p->xrounds);
  if (p->qgeom) { /* a quantized part: how its dims follow the logical ones decides every box */
    const dtl__qgeom *g = p->qgeom;
    const dtl__qpart_geom *pg = &g->part[p->qpart];
    h = dtl__fp_mix(h, (uint64_t)p->qpart);
    h = dtl__fp_i64s(h, g->shape, g->ndim);
    for (int d = 0; d < pg->ndim; d++) {
      h = dtl__fp_mix(h, (uint64_t)pg->map[d].kind << 32 | (uint32_t)pg->map[d].src);
      h = dtl__fp_i64s(h, &pg->map[d].n, 1);
    }
  }
  for (int k = 0; k < p->nsteps && k < DTL__MAX_PLAN_STEPS; k++) {
    const dtl__plan_step *s = &p->steps[k];
    dtl_placement to = s->after[s->mesh_dim >= 0 && s->mesh_dim < DTL_MAX_MESH_DIMS ? s->mesh_dim : 0];
    h = dtl__fp_mix(h, (uint64_t)s->kind << 32 | (uint32_t)s->mesh_dim);
    h = dtl__fp_mix(h, (uint64_t)to.kind << 40 | (uint64_t)(uint32_t)to.dim << 8 | (uint64_t)to.op);
  }
  return h;
}

dtl_status dtl__plan_agree(const char *fn, const dtl_plan *p, dtl_status local) {
  return dtl__plans_agree(fn, &p, 1, local);
}

/* One fingerprint for the plans together, each plan's mixed in turn (one plan: its own). */
static uint64_t dtl__plans_fingerprint(const dtl_plan *const *plans, int n) {
  uint64_t h = dtl__plan_fingerprint(plans[0]);
  for (int i = 1; i < n; i++) h = dtl__fp_mix(h, dtl__plan_fingerprint(plans[i]));
  return h;
}

dtl_status dtl__plans_agree(const char *fn, const dtl_plan *const *plans, int n, dtl_status local) {
  const dtl_plan *p = plans[0];
  const dtl_mesh *sm = p->src.mesh, *dm = p->dst.mesh;
  if (sm == dm) return dtl__agree_checked(sm->comm, fn, local == DTL_OK ? dtl__plans_fingerprint(plans, n) : 0, local);
  dtl_comm *c = sm->parent;
  if (!c->check) return local;
  const struct dtl__plan_exec *x = p->exec;
  return dtl__agree_among(c, x->ngroup, x->group, fn, local == DTL_OK ? dtl__plans_fingerprint(plans, n) : 0, local);
}

/* --- entry points --------------------------------------------------------------------------------------- */

dtl_status dtl__pair_agree(const char *fn, const dtl_layout *src, const dtl_layout *dst, dtl_status local) {
  const dtl_mesh *sm = src->mesh, *dm = dst->mesh;
  if (sm->parent != dm->parent) return local; /* no communicator joins them: nothing to agree over */
  if (sm == dm) return sm->comm ? dtl__agree_checked(sm->comm, fn, 0, local) : local;
  dtl_comm *c = sm->parent;
  if (!c->check) return local;
  int *group = c->agree_ranks, n = 0; /* acquired with the communicator: taking part never allocates */
  for (int r = 0; r < c->size; r++) {
    bool in = false;
    for (int i = 0; i < sm->size && !in; i++) in = dtl__mesh_parent_rank(sm, i) == r;
    for (int i = 0; i < dm->size && !in; i++) in = dtl__mesh_parent_rank(dm, i) == r;
    if (in) group[n++] = r;
  }
  return dtl__agree_among(c, n, group, fn, 0, local);
}

static dtl_status dtl__require_comm(const char *fn, const dtl_layout *l) {
  if (!l->mesh->parent)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "the layout's mesh is abstract (dtl_mesh_create_abstract): it "
                         "has no communicators, so nothing can be moved on it");
  return DTL_OK;
}

dtl_status dtl_redistribute(const dtl_layout *src, const void *src_local, const dtl_layout *dst, void *dst_local) {
  static const char fn[] = "dtl_redistribute";
  DTL_CHECK_ARG(src != NULL, fn, "src=NULL");
  DTL_CHECK_ARG(dst != NULL, fn, "dst=NULL");
  DTL_TRY(dtl__require_comm(fn, src));
  DTL_TRY(dtl__require_comm(fn, dst));
  if (!src->mesh->member && !dst->mesh->member) { /* in neither mesh: no part to play, and no peer waits */
    DTL_CHECK_ARG(src_local == NULL && dst_local == NULL, fn, "src_local=%p, dst_local=%p but this rank is in neither "
                  "mesh (pass NULL for both)", src_local, dst_local);
    return dtl__plan_check_pair(fn, src, dst);
  }
  dtl_status local = dtl__plan_check_pair(fn, src, dst);
  const dtl_plan *plan = NULL;
  void *ws = NULL;
  size_t need = 0;
  if (local == DTL_OK) local = dtl__plan_cached(src, dst, &plan);
  if (local == DTL_OK) local = dtl__plan_cache_workspace(src->mesh, need = dtl_plan_workspace_bytes(plan), &ws);
  /* A rank that cannot execute takes part in the agreement its peers run inside the execution. */
  if (local != DTL_OK) return dtl__pair_agree(fn, src, dst, local);
  return dtl__plan_run(fn, plan, src_local, dst_local, false, ws, need);
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

/* Root sends every other rank its box point to point (ranks that will hold an identity get nothing and fill): a
 * box that is one contiguous run of the dense tensor (blocks of rows) straight from it, the others packed one at a
 * time into a buffer of the largest such box. So root holds at most one shard beyond the dense tensor, and none
 * when every box is a run; each other rank receives exactly its shard. Root's own shard is a local box copy. */
static bool dtl__dense_run(const dtl_layout *l, const int64_t *bs, const int64_t *bo, size_t *at) {
  int64_t zero[DTL_MAX_TENSOR_DIMS] = {0};
  return dtl__run_offset(l->ndim, l->shape, zero, bs, bo, at);
}

dtl_status dtl_distribute(const dtl_layout *l, const void *dense_on_root, int root, void *local) {
  static const char fn[] = "dtl_distribute";
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  DTL_TRY(dtl__require_comm(fn, l));
  const dtl_mesh *m = l->mesh;
  if (!m->member) { /* not in the mesh: no part, and no peer waits for this rank */
    DTL_CHECK_ARG(local == NULL, fn, "local=%p but this rank is not in the layout's mesh (pass NULL)", local);
    return DTL_OK;
  }
  dtl_comm *c = m->comm;
  int n = c->size, me = c->rank;
  dtl_status st = DTL_OK;
  if (root < 0 || root >= n)
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "root=%d (expected 0..%d)", root, n - 1);
  else if (!local && l->local_count)
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "local=NULL with %zu local elements", l->local_count);
  else if (me == root && !dense_on_root && l->global_count)
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "dense_on_root=NULL on root %d with %zu elements", root,
                       l->global_count);
  else if (!c->ops->exchange)
    st = dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "the %s transport has no point-to-point exchange", c->ops->name);
  size_t es = dtl_dtype_size(l->dtype), pack_count = 0;
  int coord[DTL_MAX_MESH_DIMS];
  int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
  /* Root: the largest box that is no run sizes its one pack buffer; the runs go out in one exchange, in place. */
  int *peers = NULL;
  const void **bufs = NULL;
  size_t *counts = NULL, at = 0;
  int nruns = 0;
  void *pack = NULL;
  if (st == DTL_OK && me == root) {
    bufs = dtl__malloc((sizeof *bufs + sizeof *counts + sizeof *peers) * (size_t)n);
    if (!bufs) st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
    counts = bufs ? (size_t *)(bufs + n) : NULL;
    peers = bufs ? (int *)(counts + n) : NULL;
    for (int r = 0; st == DTL_OK && r < n; r++) {
      dtl_mesh_coord_of(m, r, coord);
      if (r == root || dtl__layout_holds_identity(l, coord, NULL)) continue;
      dtl__local_box(m, l->ndim, l->shape, l->placements, coord, bs, bo);
      size_t cnt = dtl__box_count(l->ndim, bs);
      if (!cnt) continue;
      if (dtl__dense_run(l, bs, bo, &at)) {
        peers[nruns] = r;
        bufs[nruns] = dtl__at((void *)(uintptr_t)dense_on_root, at, es);
        counts[nruns++] = cnt;
      } else if (cnt > pack_count) {
        pack_count = cnt;
      }
    }
    if (st == DTL_OK && pack_count) st = dtl__mem_alloc(&c->mem, pack_count * es, &pack);
  }
  /* Root alone reads the dense tensor and packs it, so root alone can fail: every call agrees (not only
   * under DTL_CHECK) before the exchange, on the verdicts and on the layout and root. */
  uint64_t fp = dtl__fp_mix(dtl__fp_mix(dtl__layout_hash(l), m->id), (uint64_t)(uint32_t)root);
  st = dtl__agree(c, fn, fp, st);
  if (st != DTL_OK) goto done;
  dtl_reduce_op op = DTL_SUM;
  bool identity = dtl__layout_holds_identity(l, m->coord, &op);
  if (me == root) {
    if (nruns) DTL_TRY_GOTO(c->ops->exchange(c, nruns, peers, bufs, counts, 0, NULL, NULL, NULL, l->dtype, NULL), st, done);
    for (int r = 0; r < n; r++) {
      dtl_mesh_coord_of(m, r, coord);
      if (r == root || dtl__layout_holds_identity(l, coord, NULL)) continue;
      dtl__local_box(m, l->ndim, l->shape, l->placements, coord, bs, bo);
      size_t cnt = dtl__box_count(l->ndim, bs);
      if (!cnt || dtl__dense_run(l, bs, bo, &at)) continue;
      dtl__box_copy b = dtl__ex_box(l->ndim, es, bs, l->shape, bo, bs, NULL);
      DTL_TRY_GOTO(dtl__mem_copy_box(&c->mem, dense_on_root, pack, &b), st, done);
      const void *pb = pack;
      DTL_TRY_GOTO(c->ops->exchange(c, 1, &r, &pb, &cnt, 0, NULL, NULL, NULL, l->dtype, NULL), st, done);
    }
    if (!identity && l->local_count) {
      dtl__box_copy b = dtl__ex_box(l->ndim, es, l->local_shape, l->shape, l->local_offset, l->local_shape, NULL);
      DTL_TRY_GOTO(dtl__mem_copy_box(&c->mem, dense_on_root, local, &b), st, done);
    }
  } else if (!identity && l->local_count) {
    void *rb = local;
    size_t cnt = l->local_count;
    DTL_TRY_GOTO(c->ops->exchange(c, 0, NULL, NULL, NULL, 1, &root, &rb, &cnt, l->dtype, NULL), st, done);
  }
  if (identity && l->local_count) DTL_TRY_GOTO(dtl__mem_fill_identity(&c->mem, local, l->local_count, l->dtype, op), st, done);
done:
  if (pack) dtl__mem_free(&c->mem, pack);
  dtl__free(bufs);
  return st;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The planner: the rules that say which single-mesh-dim steps are legal, and an A* search (Dijkstra with
 * a consistent lower bound) over placement vectors for the cheapest legal sequence of steps from a source
 * to a target layout. Plan creation is pure (no communication) and deterministic: every rank derives the
 * same steps from the same layouts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "redistribute/cost.h"

/* --- the rules --------------------------------------------------------------------------------------- */

/* Pending reductions of different mesh dims are applied innermost mesh dim first: the tensor is
 * R_0(R_1(...R_{n-1}(locals))). Two reductions may be swapped when their ops commute: equal ops, or sum and
 * avg (both linear over groups of equal size). */
static bool dtl__ops_commute(dtl_reduce_op a, dtl_reduce_op b) {
  bool lin_a = a == DTL_SUM || a == DTL_AVG, lin_b = b == DTL_SUM || b == DTL_AVG;
  return a == b || (lin_a && lin_b);
}

/* R -> P(made) fills the non-zero coordinates with the identity of made (sum: 0, prod: 1; max/min/avg keep
 * the value). A pending reduction `pending` of an inner mesh dim then reduces those identities among
 * themselves first, which must give the identity back: only a pending sum turns prod's 1s into p. */
static bool dtl__fill_survives(dtl_reduce_op made, dtl_reduce_op pending) {
  return !(made == DTL_PROD && pending == DTL_SUM);
}

/* Whether mesh dim m may go from pl[m] to q in state pl (q differs from pl[m]), and which step that is.
 * Nested sharding splits a tensor dim left to right, so a step may only undo or add the innermost split:
 * leaving S(i) needs no mesh dim after m sharding i, entering S(j) needs none after m sharding j. A
 * reduction on m needs every pending Partial after m to commute with it (those are reduced first). */
static bool dtl__step_legal(const dtl_mesh *mesh, const dtl_placement *pl, int m, dtl_placement q,
                            dtl__step_kind *kind) {
  dtl_placement a = pl[m];
  for (int k = m + 1; k < mesh->ndim; k++) {
    if (mesh->shape[k] == 1) continue; /* a split in 1 and a reduction over 1 rank change nothing */
    dtl_placement o = pl[k];
    if (o.kind == DTL_SHARD && a.kind == DTL_SHARD && o.dim == a.dim) return false;
    if (o.kind == DTL_SHARD && q.kind == DTL_SHARD && o.dim == q.dim) return false;
    if (o.kind == DTL_PARTIAL && a.kind == DTL_PARTIAL && !dtl__ops_commute(a.op, o.op)) return false;
    if (o.kind == DTL_PARTIAL && q.kind == DTL_PARTIAL && !dtl__fill_survives(q.op, o.op)) return false;
  }
  switch (a.kind) {
    case DTL_REPLICATE:
      *kind = q.kind == DTL_SHARD ? DTL__STEP_LOCAL_SLICE : DTL__STEP_LOCAL_PARTIAL;
      return true;
    case DTL_SHARD:
      if (q.kind == DTL_PARTIAL) return false;
      *kind = q.kind == DTL_REPLICATE ? DTL__STEP_ALL_GATHER : DTL__STEP_ALL_TO_ALL;
      return true;
    case DTL_PARTIAL:
      if (q.kind == DTL_PARTIAL) return false;
      *kind = q.kind == DTL_REPLICATE ? DTL__STEP_ALL_REDUCE : DTL__STEP_REDUCE_SCATTER;
      return true;
  }
  return false;
}

/* --- the state space --------------------------------------------------------------------------------- */

/* A state is one code per mesh dim, mixed radix K: 0 = R, 1 + d = S(d), K - 1 = P(op[m]). Every tensor dim
 * may serve as an intermediate shard dim. A mesh dim offers Partial only with the op of its source or
 * target (changing ops is refused before the search); elsewhere Partial never pays: entering it is a
 * local step from R and leaving it a collective, where R -> S is local. Mesh dims of size 1 stay R: their
 * placement never changes which data a rank holds. (The optimality test searches without these limits.) */
typedef struct {
  const dtl_layout *geom;
  const dtl_cost_model *cost;
  int M, nd, K, nstates;
  bool has_p[DTL_MAX_MESH_DIMS];
  dtl_reduce_op op[DTL_MAX_MESH_DIMS];
  dtl_placement of[DTL_MAX_MESH_DIMS][DTL_MAX_TENSOR_DIMS + 2]; /* the placement of each code */
  bool used[DTL_MAX_TENSOR_DIMS]; /* sharded by the source or the target */
} dtl__space;

/* Tensor dims that neither end shards and that have the same size are interchangeable: a route through
 * one is a route through the other at the same price. So a mesh dim may start sharding such a dim only
 * if it is the lowest of its kind that no other mesh dim shards at the moment (joining a dim another mesh
 * dim already splits stays open). Any route can be relabeled into this form, by giving each period of
 * use the lowest free label when it starts, without changing its price or its length; the search then
 * skips the mirror images. */
static bool dtl__held_by_other(const dtl__space *s, const dtl_placement *pl, int m, int k) {
  for (int o = 0; o < s->M; o++)
    if (o != m && pl[o].kind == DTL_SHARD && pl[o].dim == k) return true;
  return false;
}

static bool dtl__first_free_of_kind(const dtl__space *s, const dtl_placement *pl, int m, int k) {
  if (s->used[k] || dtl__held_by_other(s, pl, m, k)) return true;
  for (int k2 = 0; k2 < k; k2++)
    if (!s->used[k2] && s->geom->shape[k2] == s->geom->shape[k] && !dtl__held_by_other(s, pl, m, k2)) return false;
  return true;
}

static int dtl__code(const dtl__space *s, dtl_placement p) {
  return p.kind == DTL_REPLICATE ? 0 : p.kind == DTL_SHARD ? 1 + p.dim : s->K - 1;
}

static dtl_placement dtl__placement_of(const dtl__space *s, int m, int code) { return s->of[m][code]; }

static int dtl__encode(const dtl__space *s, const dtl_placement *pl) {
  int idx = 0;
  for (int m = 0; m < s->M; m++) idx = idx * s->K + (s->geom->mesh->shape[m] == 1 ? 0 : dtl__code(s, pl[m]));
  return idx;
}

static void dtl__decode(const dtl__space *s, int idx, dtl_placement *pl) {
  for (int m = s->M - 1; m >= 0; m--) {
    pl[m] = dtl__placement_of(s, m, idx % s->K);
    idx /= s->K;
  }
}

/* --- A* ---------------------------------------------------------------------------------------------- */

/* A lower bound on the cost still to pay from pl: every mesh dim whose placement is S or P and differs
 * from the target must leave it, and only a collective on that dim can (S and P have no local exit),
 * which costs at least (p-1 rounds + the call) x alpha. Steps on different mesh dims are different steps,
 * so the bounds add up; a step changes one term by at most its own cost, so the bound is consistent and
 * the first time the target is taken from the queue its route is the cheapest. */
static int64_t dtl__remaining_bound(const dtl__space *s, const dtl_placement *pl, const dtl_placement *dst) {
  int64_t bound = 0;
  for (int m = 0; m < s->M; m++) {
    int p = s->geom->mesh->shape[m];
    if (p == 1 || pl[m].kind == DTL_REPLICATE || dtl__code(s, pl[m]) == dtl__code(s, dst[m])) continue;
    /* One picosecond under the floor, so that the step prices (rounded to the nearest picosecond from a
     * slightly different floating-point expression) can never fall below it. */
    double ps = floor((double)p * s->cost->alpha_s * 1e12) - 1;
    if (ps > 0) bound += ps >= (double)(INT64_MAX / 64) ? INT64_MAX / 64 : (int64_t)ps;
  }
  return bound;
}

/* Ordered by (cost so far + bound, steps, state index): among equal estimates fewer steps first, then the
 * lower state index, so every rank pops states in the same order and keeps the same parents. Among routes
 * of equal cost the one with fewer steps wins. */
typedef struct {
  int64_t cost;
  int steps, state;
} dtl__hnode;

typedef struct {
  dtl__hnode *a;
  int n, cap;
} dtl__heap;

static bool dtl__hless(dtl__hnode x, dtl__hnode y) {
  if (x.cost != y.cost) return x.cost < y.cost;
  if (x.steps != y.steps) return x.steps < y.steps;
  return x.state < y.state;
}

static bool dtl__hpush(dtl__heap *h, dtl__hnode v) {
  if (h->n == h->cap) {
    int cap = h->cap ? 2 * h->cap : 64;
    dtl__hnode *a = dtl__realloc(h->a, (size_t)cap * sizeof *a);
    if (!a) return false;
    h->a = a;
    h->cap = cap;
  }
  int i = h->n++;
  while (i > 0 && dtl__hless(v, h->a[(i - 1) / 2])) {
    h->a[i] = h->a[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->a[i] = v;
  return true;
}

static dtl__hnode dtl__hpop(dtl__heap *h) {
  dtl__hnode top = h->a[0], last = h->a[--h->n];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && dtl__hless(h->a[c + 1], h->a[c])) c++;
    if (!dtl__hless(h->a[c], last)) break;
    h->a[i] = h->a[c];
    i = c;
  }
  if (h->n > 0) h->a[i] = last;
  return top;
}

static int64_t dtl__sat_add(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }

/* Fills path[0..*len) with the states of the cheapest route from `from` to `to` (both included). */
static dtl_status dtl__search(const char *fn, const dtl__space *s, int from, int to, int *path, int *len) {
  dtl_placement target[DTL_MAX_MESH_DIMS];
  dtl__decode(s, to, target);
  int n = s->nstates;
  int64_t *dist = dtl__malloc((size_t)n * sizeof *dist);
  int *steps = dtl__malloc((size_t)n * sizeof *steps), *parent = dtl__malloc((size_t)n * sizeof *parent);
  unsigned char *done = dtl__calloc((size_t)n, 1);
  dtl__heap h = {0};
  dtl_status st = DTL_OK;
  if (!dist || !steps || !parent || !done) {
    st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory (search over %d placement states)", n);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    dist[i] = INT64_MAX;
    steps[i] = 0;
    parent[i] = -1;
  }
  dist[from] = 0;
  if (!dtl__hpush(&h, (dtl__hnode){0, 0, from})) goto oom;
  while (h.n > 0) {
    dtl__hnode u = dtl__hpop(&h);
    if (done[u.state]) continue;
    done[u.state] = 1;
    if (u.state == to) break;
    int64_t g = dist[u.state];
    dtl_placement pl[DTL_MAX_MESH_DIMS], nx[DTL_MAX_MESH_DIMS];
    dtl__decode(s, u.state, pl);
    for (int m = 0; m < s->M; m++) {
      int p = s->geom->mesh->shape[m];
      if (p == 1) continue;
      int cur = dtl__code(s, pl[m]);
      for (int code = 0; code < s->K; code++) {
        if (code == cur || (code == s->K - 1 && !s->has_p[m])) continue;
        dtl_placement q = dtl__placement_of(s, m, code);
        if (q.kind == DTL_SHARD && !dtl__first_free_of_kind(s, pl, m, q.dim)) continue;
        dtl__step_kind kind;
        if (!dtl__step_legal(s->geom->mesh, pl, m, q, &kind)) continue;
        memcpy(nx, pl, sizeof nx);
        nx[m] = q;
        int v = dtl__encode(s, nx);
        if (done[v]) continue;
        dtl__step_volume vol;
        dtl__step_volume_max(s->geom, kind, m, pl, nx, &vol);
        int64_t c = dtl__sat_add(g, dtl__step_cost_ps(s->cost, kind, p, &vol));
        if (c < dist[v] || (c == dist[v] && u.steps + 1 < steps[v])) {
          dist[v] = c;
          steps[v] = u.steps + 1;
          parent[v] = u.state;
          int64_t f = dtl__sat_add(c, dtl__remaining_bound(s, nx, target));
          if (!dtl__hpush(&h, (dtl__hnode){f, u.steps + 1, v})) goto oom;
        }
      }
    }
  }
  if (!done[to]) {
    st = dtl__error_fn(DTL_ERR_INTERNAL, fn, "no legal route between the layouts (a planner bug: please report it)");
    goto out;
  }
  if (steps[to] > DTL__MAX_PLAN_STEPS) {
    st = dtl__error_fn(DTL_ERR_INTERNAL, fn, "the cheapest route has %d steps (at most %d supported)", steps[to],
                       DTL__MAX_PLAN_STEPS);
    goto out;
  }
  *len = steps[to] + 1;
  for (int v = to, i = steps[to]; i >= 0; v = parent[v], i--) path[i] = v;
  goto out;
oom:
  st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory (search over %d placement states)", n);
out:
  dtl__free(dist);
  dtl__free(steps);
  dtl__free(parent);
  dtl__free(done);
  dtl__free(h.a);
  return st;
}

/* --- dtl_plan_create ------------------------------------------------------------------------------- */

static void dtl__shape_text(const dtl_layout *l, char *buf, size_t cap) {
  size_t o = 0;
  o += (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < l->ndim && o < cap; d++) o += (size_t)snprintf(buf + o, cap - o, d ? ",%lld" : "%lld", (long long)l->shape[d]);
  if (o < cap) snprintf(buf + o, cap - o, "]");
}

static void dtl__placement_text(dtl_placement p, char *buf, size_t cap) {
  if (dtl_placements_format(&p, 1, buf, cap) != DTL_OK) snprintf(buf, cap, "?");
}

/* Shard -> Partial and Partial(a) -> Partial(b) have no step of their own. Both could be reached through
 * R (an all-gather or an all-reduce, then a local relabeling), but that spends a collective only to throw
 * most of its result away again (sum/prod keep it on one coordinate), so dtl refuses instead of inserting
 * it silently and says what to ask for. Mesh dims of size 1 are exempt: there every placement is the same
 * data. */
static dtl_status dtl__check_supported(const char *fn, const dtl_layout *src, const dtl_layout *dst) {
  for (int m = 0; m < src->mesh->ndim; m++) {
    if (src->mesh->shape[m] == 1) continue;
    dtl_placement a = src->placements[m], b = dst->placements[m];
    char ta[16], tb[16];
    dtl__placement_text(a, ta, sizeof ta);
    dtl__placement_text(b, tb, sizeof tb);
    if (a.kind == DTL_SHARD && b.kind == DTL_PARTIAL)
      return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn,
                           "mesh dim %d: %s -> %s is unsupported: a Partial is only made from replicated data, so this "
                           "would all-gather the shard and then discard it on all but one coordinate; ask for R on "
                           "mesh dim %d (or redistribute to R first, then to %s)",
                           m, ta, tb, m, tb);
    if (a.kind == DTL_PARTIAL && b.kind == DTL_PARTIAL && a.op != b.op)
      return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn,
                           "mesh dim %d: %s -> %s is unsupported: the pending %s must be applied (an all-reduce) "
                           "before the values can stand for a pending %s; ask for R on mesh dim %d (or redistribute "
                           "to R first, then to %s)",
                           m, ta, tb, dtl_reduce_op_name(a.op), dtl_reduce_op_name(b.op), m, tb);
  }
  return DTL_OK;
}

static dtl_status dtl__check_pair(const char *fn, const dtl_layout *src, const dtl_layout *dst) {
  DTL_CHECK_ARG(src != NULL, fn, "src=NULL");
  DTL_CHECK_ARG(dst != NULL, fn, "dst=NULL");
  if (src->mesh != dst->mesh) {
    char a[64] = "", b[64] = "";
    for (int m = 0, o = 0; m < src->mesh->ndim; m++) o += snprintf(a + o, sizeof a - (size_t)o, m ? "x%d" : "%d", src->mesh->shape[m]);
    for (int m = 0, o = 0; m < dst->mesh->ndim; m++) o += snprintf(b + o, sizeof b - (size_t)o, m ? "x%d" : "%d", dst->mesh->shape[m]);
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                         "src and dst are on different meshes (src mesh %s at %p, dst mesh %s at %p; expected the same "
                         "mesh object)",
                         a, (const void *)src->mesh, b, (const void *)dst->mesh);
  }
  DTL_CHECK_ARG(src->dtype == dst->dtype, fn, "src dtype=%s but dst dtype=%s (expected equal)", dtl_dtype_name(src->dtype),
                dtl_dtype_name(dst->dtype));
  bool same = src->ndim == dst->ndim;
  for (int d = 0; same && d < src->ndim; d++) same = src->shape[d] == dst->shape[d];
  if (!same) {
    char a[192], b[192];
    dtl__shape_text(src, a, sizeof a);
    dtl__shape_text(dst, b, sizeof b);
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "src global shape %s but dst global shape %s (expected equal)", a, b);
  }
  return DTL_OK;
}

static dtl_status dtl__plan_create(const char *fn, const dtl_layout *src, const dtl_layout *dst,
                                   const dtl_cost_model *over, dtl_plan **out) {
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_TRY(dtl__check_pair(fn, src, dst));
  dtl_cost_model cost;
  DTL_TRY(dtl__cost_resolve(fn, src->mesh, over, &cost));
  DTL_TRY(dtl__check_supported(fn, src, dst));

  const dtl_mesh *mesh = src->mesh;
  dtl__space s = {.geom = src, .cost = &cost, .M = mesh->ndim, .nd = src->ndim, .K = src->ndim + 2, .nstates = 1};
  for (int m = 0; m < s.M; m++) {
    dtl_placement a = src->placements[m], b = dst->placements[m];
    s.has_p[m] = a.kind == DTL_PARTIAL || b.kind == DTL_PARTIAL;
    s.op[m] = a.kind == DTL_PARTIAL ? a.op : b.op;
    s.nstates *= s.K;
    s.of[m][0] = dtl_replicate();
    for (int d = 0; d < s.nd; d++) s.of[m][1 + d] = dtl_shard(d);
    s.of[m][s.K - 1] = dtl_partial(s.op[m]);
    if (mesh->shape[m] > 1 && a.kind == DTL_SHARD) s.used[a.dim] = true;
    if (mesh->shape[m] > 1 && b.kind == DTL_SHARD) s.used[b.dim] = true;
  }
  int path[DTL__MAX_PLAN_STEPS + 1], len = 0;
  DTL_TRY(dtl__search(fn, &s, dtl__encode(&s, src->placements), dtl__encode(&s, dst->placements), path, &len));

  dtl_plan *p = dtl__calloc(1, sizeof *p);
  if (!p) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  p->src = *src;
  p->dst = *dst;
  p->cost = cost;
  int64_t total_ps = 0;
  for (int k = 0; k + 1 < len; k++) {
    dtl__plan_step *st = &p->steps[p->nsteps++];
    dtl__decode(&s, path[k], st->before);
    dtl__decode(&s, path[k + 1], st->after);
    for (int m = 0; m < s.M; m++)
      if (st->before[m].kind != st->after[m].kind || st->before[m].dim != st->after[m].dim) st->mesh_dim = m;
    int m = st->mesh_dim;
    dtl__step_legal(mesh, st->before, m, st->after[m], &st->kind);
    dtl__step_volume vmax, vme;
    dtl__step_volume_max(src, st->kind, m, st->before, st->after, &vmax);
    int64_t ps = dtl__step_cost_ps(&cost, st->kind, mesh->shape[m], &vmax);
    total_ps = dtl__sat_add(total_ps, ps);
    st->cost_s = (double)ps * 1e-12;
    /* The search kept size-1 mesh dims at R; the step vectors carry the target's placement there, so the
     * last step ends exactly at dst. Boxes do not change: a split in 1 is the whole dim. */
    for (int q = 0; q < s.M; q++)
      if (mesh->shape[q] == 1) st->before[q] = st->after[q] = dst->placements[q];
    dtl__step_volume_at(src, st->kind, m, st->before, st->after, mesh->coord, &vme);
    st->send_bytes = vme.send;
    st->recv_bytes = vme.recv;
  }
  p->total_cost_s = (double)total_ps * 1e-12;
  dtl_status st = dtl__plan_compile(fn, p);
  if (st != DTL_OK) {
    dtl_plan_destroy(p);
    return st;
  }
  DTL_LOG(DTL_LOG_DEBUG, "plan", "%s: %d steps, est %.3g s", fn, p->nsteps, p->total_cost_s);
  *out = p;
  return DTL_OK;
}

dtl_status dtl_plan_create(const dtl_layout *src, const dtl_layout *dst, dtl_plan **out) {
  return dtl__plan_create("dtl_plan_create", src, dst, NULL, out);
}

dtl_status dtl_plan_create_with_cost(const dtl_layout *src, const dtl_layout *dst, const dtl_cost_model *cost,
                                     dtl_plan **out) {
  static const char fn[] = "dtl_plan_create_with_cost";
  DTL_CHECK_ARG(cost != NULL, fn, "cost=NULL (use dtl_plan_create for the defaults)");
  return dtl__plan_create(fn, src, dst, cost, out);
}

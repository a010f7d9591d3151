/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the planner tests: layouts from placement text on abstract meshes, an independent statement
 * of which single-mesh-dim transitions are legal (written from the tensor dims' side: each tensor dim has
 * an ordered list of the mesh dims splitting it, and only its last entry may be removed or appended) and of where
 * an exchange may finish a route (from a state without Partials whose other mesh dims are the source's), and an
 * exhaustive search over transition sequences that prices each step with the shared cost function. */
#ifndef TEST_PLANNER_COMMON_H
#define TEST_PLANNER_COMMON_H

#include "sanitized.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <math.h>
#include "redistribute/cost.h"

/* The message holds each of the strings given (NULL-terminated). */
static inline void tp_expect_message(const char *const *need) {
  const char *msg = dtl_last_error();
  for (; *need; need++)
    if (!strstr(msg, *need)) fail_msg("message \"%s\" lacks \"%s\"", msg, *need);
}
#define TP_EXPECT_MESSAGE(...) tp_expect_message((const char *const[]){__VA_ARGS__, NULL})

static inline dtl_mesh *tp_mesh(int ndim, const int *shape, const int *coord) {
  dtl_mesh *m = NULL;
  if (dtl_mesh_create_abstract(ndim, shape, coord, &m) != DTL_OK) fail_msg("mesh: %s", dtl_last_error());
  return m;
}

static inline dtl_layout *tp_layout(const dtl_mesh *m, dtl_dtype t, int nd, const int64_t *shape, const char *text) {
  dtl_placement p[DTL_MAX_MESH_DIMS];
  int n = 0;
  if (dtl_placements_parse(text, p, DTL_MAX_MESH_DIMS, &n) != DTL_OK) fail_msg("parse %s: %s", text, dtl_last_error());
  if (n != dtl_mesh_ndim(m)) fail_msg("%s has %d entries for a %d-d mesh", text, n, dtl_mesh_ndim(m));
  dtl_layout *l = NULL;
  if (dtl_layout_create(m, t, nd, shape, p, &l) != DTL_OK) fail_msg("layout %s: %s", text, dtl_last_error());
  return l;
}

static inline void tp_format(const dtl_placement *p, int n, char *buf, size_t cap) {
  if (dtl_placements_format(p, n, buf, cap) != DTL_OK) snprintf(buf, cap, "?");
}

static inline bool tp_same(dtl_placement a, dtl_placement b) {
  if (a.kind != b.kind) return false;
  if (a.kind == DTL_SHARD) return a.dim == b.dim;
  if (a.kind == DTL_PARTIAL) return a.op == b.op;
  return true;
}

/* --- the rules, restated --------------------------------------------------------------------------- */

/* The mesh dims (size > 1, increasing) whose placement in pl is S(d): the order of d's splits. */
static inline int tp_splits(const dtl_mesh *m, const dtl_placement *pl, int d, int *out) {
  int n = 0;
  for (int md = 0; md < m->ndim; md++)
    if (m->shape[md] > 1 && pl[md].kind == DTL_SHARD && pl[md].dim == d) out[n++] = md;
  return n;
}

/* Reductions happen innermost mesh dim first; one may overtake a pending one only if the two give the
 * same result in either order: same op, or the two linear ones (sum, avg). */
static inline bool tp_reorderable(dtl_reduce_op a, dtl_reduce_op b) {
  if (a == b) return true;
  return (a == DTL_SUM && b == DTL_AVG) || (a == DTL_AVG && b == DTL_SUM);
}

/* Step kind of one mesh dim going from a to b, or false when no single step does it. */
static inline bool tp_kind(dtl_placement a, dtl_placement b, dtl__step_kind *k) {
  static const int table[3][3] = {
      /* to:        R                      S                         P */
      /* R */ {-1, DTL__STEP_LOCAL_SLICE, DTL__STEP_LOCAL_PARTIAL},
      /* S */ {DTL__STEP_ALL_GATHER, DTL__STEP_ALL_TO_ALL, DTL__STEP_LOCAL_EMBED},
      /* P */ {DTL__STEP_ALL_REDUCE, DTL__STEP_REDUCE_SCATTER, -1},
  };
  if (tp_same(a, b)) return false;
  if (a.kind == DTL_SHARD && b.kind == DTL_PARTIAL && b.op == DTL_AVG) return false; /* avg has no identity to embed in */
  int v = table[a.kind][b.kind];
  if (v < 0) return false;
  *k = (dtl__step_kind)v;
  return true;
}

/* Whether mesh dim md may go from pl[md] to b in one step, and its kind. */
static inline bool tp_legal(const dtl_mesh *m, const dtl_placement *pl, int md, dtl_placement b, dtl__step_kind *k) {
  if (m->shape[md] == 1 || !tp_kind(pl[md], b, k)) return false;
  int s[DTL_MAX_MESH_DIMS], n;
  if (pl[md].kind == DTL_SHARD) { /* removes md from its tensor dim's list: must be the last entry */
    n = tp_splits(m, pl, pl[md].dim, s);
    if (n == 0 || s[n - 1] != md) return false;
  }
  if (b.kind == DTL_SHARD) { /* appends md to the target dim's list: must come after every entry */
    n = tp_splits(m, pl, b.dim, s);
    if (n > 0 && s[n - 1] > md) return false;
  }
  for (int o = md + 1; o < m->ndim; o++) {
    if (m->shape[o] == 1 || pl[o].kind != DTL_PARTIAL) continue;
    if (pl[md].kind == DTL_PARTIAL && !tp_reorderable(pl[md].op, pl[o].op)) return false;
    /* R -> P(prod) leaves 1s on the non-zero coordinates; a pending inner sum would add them up. */
    if (b.kind == DTL_PARTIAL && b.op == DTL_PROD && pl[o].op == DTL_SUM) return false;
    /* S -> P(op) surrounds the shard with op's identity on every coordinate: an inner pending reduction must give
     * that identity back (0 always; 1 unless summed; -inf/+inf only under max or min). */
    if (pl[md].kind == DTL_SHARD && b.kind == DTL_PARTIAL) {
      dtl_reduce_op o2 = pl[o].op;
      bool keeps = b.op == DTL_SUM || (b.op == DTL_PROD && o2 != DTL_SUM) ||
                   ((b.op == DTL_MAX || b.op == DTL_MIN) && (o2 == DTL_MAX || o2 == DTL_MIN));
      if (!keeps) return false;
    }
  }
  return true;
}

/* The price of one step, through the cost function the planner uses. */
static inline int64_t tp_step_ps(const dtl_layout *geom, const dtl_cost_model *c, dtl__step_kind k, int md,
                                 const dtl_placement *before, const dtl_placement *after) {
  dtl__step_volume v;
  dtl__step_volume_max(geom, k, md, before, after, &v);
  return dtl__step_cost_ps(c, k, geom->mesh->shape[md], &v, geom->mesh->dim_inter[md]);
}

/* The bytes one step sends over all ranks, through the function the planner breaks ties with. */
static inline uint64_t tp_step_bytes(const dtl_layout *geom, dtl__step_kind k, int md, const dtl_placement *before,
                                     const dtl_placement *after) {
  return dtl__step_volume_total(geom, k, md, before, after);
}

/* An exchange may start from pl: no Partial on a mesh dim of size > 1, and every such dim that src does not hold
 * Partial keeps src's placement. */
static inline bool tp_exchange_from(const dtl_layout *src, const dtl_placement *pl) {
  const dtl_mesh *m = src->mesh;
  for (int md = 0; md < m->ndim; md++) {
    if (m->shape[md] == 1) continue;
    if (pl[md].kind == DTL_PARTIAL) return false;
    if (src->placements[md].kind != DTL_PARTIAL && !tp_same(pl[md], src->placements[md])) return false;
  }
  return true;
}

/* The price of an exchange from pl to dst in `rounds`, through the cost function the planner uses; *bytes (may be
 * NULL) gets what every target rank receives, summed rank by rank. */
static inline int64_t tp_exchange_ps_bytes(const dtl_layout *src, const dtl_layout *dst, const dtl_cost_model *c,
                                           const dtl_placement *pl, int rounds, uint64_t *bytes) {
  dtl__xmap x;
  if (dtl__xmap_init(&x, "test", src, src->mesh, dst->mesh, dst->placements, NULL, 0) != DTL_OK) fail_msg("%s", dtl_last_error());
  dtl__xmap_source(&x, pl);
  dtl__xvolume v;
  dtl__xmap_volume_max(&x, &v);
  if (bytes) {
    *bytes = 0;
    for (int q = 0; q < dst->mesh->size; q++) {
      dtl__xvolume at;
      dtl__xmap_volume_at(&x, src->mesh == dst->mesh ? q : dtl__xmap_d2s(&x, q), q, &at);
      *bytes += at.recv;
    }
  }
  dtl__xmap_free(&x);
  return dtl__exchange_cost_ps(c, &v, rounds);
}
static inline int64_t tp_exchange_ps(const dtl_layout *src, const dtl_layout *dst, const dtl_cost_model *c,
                                     const dtl_placement *pl, int rounds) {
  return tp_exchange_ps_bytes(src, dst, c, pl, rounds, NULL);
}

/* The bytes plan p sends over all ranks, step by step (what the planner breaks ties between equal costs on). */
static inline uint64_t tp_plan_bytes(const dtl_plan *p) {
  uint64_t total = 0;
  const dtl_placement *cur = p->src.placements;
  for (int s = 0; s < p->nsteps; s++) {
    const dtl__plan_step *st = &p->steps[s];
    if (st->kind == DTL__STEP_EXCHANGE) {
      uint64_t x = 0;
      tp_exchange_ps_bytes(&p->src, &p->dst, &p->cost, cur, p->xrounds, &x);
      return total + x;
    }
    total += tp_step_bytes(&p->src, st->kind, st->mesh_dim, st->before, st->after);
    cur = st->after;
  }
  return total;
}

/* Checks that every step of p is legal under the restated rules, has the kind they say, chains from src to
 * dst (mesh dims of size 1 excepted), and returns the plan's price summed step by step. */
static inline int64_t tp_check_plan(const dtl_plan *p, const dtl_cost_model *c) {
  const dtl_mesh *m = p->src.mesh;
  dtl_placement cur[DTL_MAX_MESH_DIMS];
  memcpy(cur, p->src.placements, sizeof cur);
  int64_t total = 0;
  for (int s = 0; s < p->nsteps; s++) {
    const dtl__plan_step *st = &p->steps[s];
    if (st->kind == DTL__STEP_EXCHANGE) {
      if (s != p->nsteps - 1) fail_msg("step %d: an exchange that is not the last step", s + 1);
      for (int md = 0; md < m->ndim; md++)
        if (m->shape[md] > 1 && !tp_same(st->before[md], cur[md])) fail_msg("step %d: before[%d] does not continue", s + 1, md);
      if (!tp_exchange_from(&p->src, cur)) fail_msg("step %d: an exchange from a state it may not start from", s + 1);
      for (int md = 0; md < p->dst.mesh->ndim; md++)
        if (!tp_same(st->after[md], p->dst.placements[md])) fail_msg("step %d: an exchange that misses the target", s + 1);
      return total + tp_exchange_ps(&p->src, &p->dst, c, cur, p->xrounds);
    }
    for (int md = 0; md < m->ndim; md++) {
      if (m->shape[md] == 1) continue;
      if (!tp_same(st->before[md], cur[md])) fail_msg("step %d: before[%d] does not continue the previous step", s + 1, md);
      if (md != st->mesh_dim && !tp_same(st->after[md], cur[md])) fail_msg("step %d changes mesh dim %d too", s + 1, md);
    }
    dtl__step_kind k = st->kind; /* tp_legal sets it when the step is legal */
    if (!tp_legal(m, cur, st->mesh_dim, st->after[st->mesh_dim], &k)) {
      char a[64], b[64];
      tp_format(cur, m->ndim, a, sizeof a);
      tp_format(st->after, m->ndim, b, sizeof b);
      fail_msg("step %d: %s -> %s on mesh dim %d is not legal", s + 1, a, b, st->mesh_dim);
    }
    assert_int_equal(k, st->kind);
    total += tp_step_ps(&p->src, c, k, st->mesh_dim, cur, st->after);
    cur[st->mesh_dim] = st->after[st->mesh_dim];
  }
  for (int md = 0; md < m->ndim; md++)
    if (m->shape[md] > 1 && !tp_same(cur[md], p->dst.placements[md])) fail_msg("the plan ends off target on mesh dim %d", md);
  return total;
}

/* --- exhaustive search ---------------------------------------------------------------------------- */

/* Every sequence of at most depth legal transitions over the placements in alpha, depth first, with two
 * exact prunings: a prefix already as dear as the best complete sequence, and a prefix reaching a
 * placement vector that an earlier prefix reached no dearer with at least as many steps left. */
typedef struct {
  const dtl_layout *geom, *dst;
  const dtl_cost_model *cost;
  const dtl_placement *alpha;
  int nalpha, depth;
  const dtl_placement *target;
  int64_t best;
  uint64_t best_bytes;
  int best_len;
  int64_t *seen_cost; /* per placement vector */
  uint64_t *seen_bytes;
  int *seen_left;
  long visited;
} tp_brute;

/* Whether (cost, bytes, len) beats the best so far: cheaper, then fewer bytes over all ranks, then fewer steps. */
static inline bool tp_brute_better(const tp_brute *b, int64_t cost, uint64_t bytes, int len) {
  if (cost != b->best) return cost < b->best;
  if (bytes != b->best_bytes) return bytes < b->best_bytes;
  return len < b->best_len;
}

static inline int tp_brute_index(const tp_brute *b, const dtl_placement *pl) {
  int idx = 0;
  for (int md = 0; md < b->geom->mesh->ndim; md++) {
    int a = 0;
    while (a < b->nalpha && !tp_same(b->alpha[a], pl[md])) a++;
    idx = idx * b->nalpha + a;
  }
  return idx;
}

static inline void tp_brute_dfs(tp_brute *b, dtl_placement *pl, int len, int64_t cost, uint64_t bytes) {
  const dtl_mesh *m = b->geom->mesh;
  b->visited++;
  bool at = true;
  for (int md = 0; md < m->ndim; md++) at &= m->shape[md] == 1 || tp_same(pl[md], b->target[md]);
  if (at && tp_brute_better(b, cost, bytes, len)) {
    b->best = cost;
    b->best_bytes = bytes;
    b->best_len = len;
  }
  if (len == b->depth) return;
  if (tp_exchange_from(b->geom, pl)) { /* one exchange finishes the route */
    uint64_t xb = 0;
    int64_t c = cost + tp_exchange_ps_bytes(b->geom, b->dst, b->cost, pl, 1, &xb);
    if (tp_brute_better(b, c, bytes + xb, len + 1)) {
      b->best = c;
      b->best_bytes = bytes + xb;
      b->best_len = len + 1;
    }
  }
  for (int md = 0; md < m->ndim; md++)
    for (int a = 0; a < b->nalpha; a++) {
      dtl__step_kind k;
      if (!tp_legal(m, pl, md, b->alpha[a], &k)) continue;
      dtl_placement nx[DTL_MAX_MESH_DIMS];
      memcpy(nx, pl, sizeof nx);
      nx[md] = b->alpha[a];
      int64_t c = cost + tp_step_ps(b->geom, b->cost, k, md, pl, nx);
      uint64_t y = bytes + tp_step_bytes(b->geom, k, md, pl, nx);
      if (c > b->best || (c == b->best && y > b->best_bytes)) continue;
      int idx = tp_brute_index(b, nx), left = b->depth - len - 1;
      bool no_better = b->seen_cost[idx] < c || (b->seen_cost[idx] == c && b->seen_bytes[idx] <= y);
      if (no_better && b->seen_left[idx] >= left) continue;
      b->seen_cost[idx] = c;
      b->seen_bytes[idx] = y;
      b->seen_left[idx] = left;
      tp_brute_dfs(b, nx, len + 1, c, y);
    }
}

/* The cheapest price of any legal sequence of at most depth steps from src to dst over alpha (INT64_MAX if
 * none); among the cheapest, the fewest bytes over all ranks (*bytes, may be NULL), then the fewest steps (*len). */
static inline int64_t tp_brute_force_bytes(const dtl_layout *src, const dtl_layout *dst, const dtl_cost_model *c,
                                           const dtl_placement *alpha, int nalpha, int depth, int *len, uint64_t *bytes,
                                           long *visited) {
  tp_brute b = {src, dst, c, alpha, nalpha, depth, dst->placements, INT64_MAX, UINT64_MAX, 0, NULL, NULL, NULL, 0};
  int n = 1;
  for (int md = 0; md < src->mesh->ndim; md++) n *= nalpha + 1;
  b.seen_cost = malloc((size_t)n * sizeof *b.seen_cost);
  b.seen_bytes = malloc((size_t)n * sizeof *b.seen_bytes);
  b.seen_left = malloc((size_t)n * sizeof *b.seen_left);
  assert_non_null(b.seen_cost);
  assert_non_null(b.seen_bytes);
  assert_non_null(b.seen_left);
  for (int i = 0; i < n; i++) {
    b.seen_cost[i] = INT64_MAX;
    b.seen_bytes[i] = UINT64_MAX;
    b.seen_left[i] = -1;
  }
  dtl_placement pl[DTL_MAX_MESH_DIMS];
  memcpy(pl, src->placements, sizeof pl);
  b.seen_cost[tp_brute_index(&b, pl)] = 0;
  b.seen_bytes[tp_brute_index(&b, pl)] = 0;
  b.seen_left[tp_brute_index(&b, pl)] = depth;
  tp_brute_dfs(&b, pl, 0, 0, 0);
  free(b.seen_cost);
  free(b.seen_bytes);
  free(b.seen_left);
  if (len) *len = b.best_len;
  if (bytes) *bytes = b.best_bytes;
  if (visited) *visited += b.visited;
  return b.best;
}
static inline int64_t tp_brute_force(const dtl_layout *src, const dtl_layout *dst, const dtl_cost_model *c,
                                     const dtl_placement *alpha, int nalpha, int depth, int *len, long *visited) {
  return tp_brute_force_bytes(src, dst, c, alpha, nalpha, depth, len, NULL, visited);
}

#endif

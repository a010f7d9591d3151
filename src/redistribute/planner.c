/* SPDX-License-Identifier: Apache-2.0 */
/* The planner: the rules that say which single-mesh-dim steps are legal, and an A* search (Dijkstra with
 * a consistent lower bound) over placement vectors for the cheapest legal sequence of steps from a source
 * to a target layout, where an exchange step (xmap.h) may also finish the route in one step from a state without
 * Partials. Plan creation is pure (no communication) and deterministic: every rank derives the same steps from the
 * same layouts. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "redistribute/cost.h"
#include "redistribute/xmap.h"

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

/* S -> P(made) writes made's identity on every rank around its shard, so an inner pending reduction meets p copies
 * of it: 0 survives every op, 1 every op but sum, -inf and +inf only max and min. Avg has no identity (the zeros
 * would count towards its mean), so S -> P(avg) has no step. */
static bool dtl__embed_survives(dtl_reduce_op made, dtl_reduce_op pending) {
  switch (made) {
    case DTL_SUM: return true;
    case DTL_PROD: return pending != DTL_SUM;
    case DTL_MAX:
    case DTL_MIN: return pending == DTL_MAX || pending == DTL_MIN;
    default: return false;
  }
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
    if (o.kind == DTL_PARTIAL && q.kind == DTL_PARTIAL && a.kind == DTL_SHARD && !dtl__embed_survives(q.op, o.op))
      return false;
  }
  switch (a.kind) {
    case DTL_REPLICATE:
      *kind = q.kind == DTL_SHARD ? DTL__STEP_LOCAL_SLICE : DTL__STEP_LOCAL_PARTIAL;
      return true;
    case DTL_SHARD:
      if (q.kind == DTL_PARTIAL && q.op == DTL_AVG) return false;
      *kind = q.kind == DTL_REPLICATE ? DTL__STEP_ALL_GATHER
              : q.kind == DTL_PARTIAL ? DTL__STEP_LOCAL_EMBED
                                      : DTL__STEP_ALL_TO_ALL;
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
 * may serve as an intermediate shard dim. A mesh dim offers Partial with the op of its source or target
 * (changing ops is refused before the search), else sum: a shard enters it locally (the embed), which frees an
 * inner split that blocks a collective on an outer mesh dim, and a reduce-scatter leaves it. Mesh dims of size 1
 * stay R: their placement never changes which data a rank holds. (The optimality test searches without these
 * limits.) */
typedef struct {
  const dtl_layout *geom;
  const dtl_cost_model *cost;
  int M, nd, K, nstates;
  bool has_p[DTL_MAX_MESH_DIMS];
  dtl_reduce_op op[DTL_MAX_MESH_DIMS];
  dtl_placement of[DTL_MAX_MESH_DIMS][DTL_MAX_TENSOR_DIMS + 2]; /* the placement of each code */
  bool used[DTL_MAX_TENSOR_DIMS]; /* sharded by the source or the target */
  /* The exchange: an edge from every state without Partials whose other mesh dims hold the source's placements
   * (so it follows reductions only) to goal, the target state, or for a target on another mesh the extra node
   * nstates, which no other edge reaches. cross and reduce_only keep only the steps that reduce a Partial (the
   * rest lead nowhere an exchange could start from). xmin bounds every exchange's price from below. */
  dtl__xmap *xm;
  const dtl_placement *src_pl;
  bool cross, reduce_only;
  bool scatter_first; /* a Partial may be all-reduced only where no reduce-scatter is legal (its result is smaller) */
  bool reduce_whole;  /* Partials are all-reduced only: the reduced shard is the source's box, whatever the split */
  int goal, rounds;
  int64_t xmin;
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
 * from the target must leave it, and only a collective on that dim can (S and P have no local exit but S -> P,
 * which is free of this term where the target is that P; elsewhere leaving the P is a collective again),
 * which costs at least (p-1 rounds + the call) x the alpha of that dim's link class. Steps on different mesh dims are different steps,
 * so the bounds add up; a step changes one term by at most its own cost (both are capped at
 * DTL__STEP_COST_CAP_PS), so the bound is consistent and the first label of the target taken from the
 * queue is a cheapest route. */
/* One collective over mesh dim m (p ranks, m's link class), one picosecond under its floor (see below). */
static int64_t dtl__call_floor_ps(const dtl__space *s, int m) {
  const dtl_mesh *mesh = s->geom->mesh;
  double ps = floor((double)mesh->shape[m] * dtl__cost_alpha(s->cost, mesh->dim_inter[m]) * 1e12) - 1;
  return ps <= 0 ? 0 : ps >= (double)DTL__STEP_COST_CAP_PS ? DTL__STEP_COST_CAP_PS : (int64_t)ps;
}

/* With the exchange, the bound is the smaller of the per-dim one and the exchange's own: every Partial left must
 * be reduced first (one collective each), then one exchange, priced at least xmin. Both are consistent, and so is
 * their minimum. */
static int64_t dtl__perdim_bound(const dtl__space *s, const dtl_placement *pl, const dtl_placement *dst);
static int64_t dtl__remaining_bound(const dtl__space *s, const dtl_placement *pl, const dtl_placement *dst) {
  int64_t per_dim = s->cross ? 0 : dtl__perdim_bound(s, pl, dst);
  if (!s->xm) return per_dim;
  int64_t via = s->xmin;
  for (int m = 0; m < s->M; m++)
    if (s->geom->mesh->shape[m] > 1 && pl[m].kind == DTL_PARTIAL) via += dtl__call_floor_ps(s, m);
  return s->cross || via < per_dim ? via : per_dim;
}

static int64_t dtl__perdim_bound(const dtl__space *s, const dtl_placement *pl, const dtl_placement *dst) {
  int64_t bound = 0;
  for (int m = 0; m < s->M; m++) {
    int p = s->geom->mesh->shape[m];
    if (p == 1 || pl[m].kind == DTL_REPLICATE || dtl__code(s, pl[m]) == dtl__code(s, dst[m])) continue;
    if (pl[m].kind == DTL_SHARD && dst[m].kind == DTL_PARTIAL && dst[m].op != DTL_AVG) continue; /* a local embed */
    /* One picosecond under the floor, so that the step prices (rounded to the nearest picosecond from a
     * slightly different floating-point expression) can never fall below it. */
    bound += dtl__call_floor_ps(s, m);
  }
  return bound;
}

/* The search runs over labels (state, steps so far, cost so far) and takes them from a queue ordered by
 * (cost so far + bound, steps, state, label): among equal estimates fewer steps first, then the lower state
 * index, so every rank pops labels in the same order and keeps the same parents. Among routes of equal
 * cost the one with fewer steps wins.
 *
 * A plan holds at most DTL__MAX_PLAN_STEPS steps, and the cheapest route to a state may be too long to
 * continue from while a dearer, shorter one still reaches the target (near-zero alpha and beta make long
 * chains of collectives nearly free). So the search runs in one of two modes:
 * - one label per state (plain A*: the cheapest, then the shortest), which finds the cheapest route of any
 *   length. It gives up as soon as it would queue a label longer than the limit, since it may then have
 *   dropped a shorter label the limited search needs; otherwise its answer is within the limit and
 *   cheapest among all routes, so among the limited ones too.
 * - labels per (state, steps) (the limited search, run when the first gives up): a label is dropped only
 *   when another of its state is at least as cheap and at most as long, and no label is longer than the
 *   limit, so the first label of the target taken from the queue is a cheapest route within the limit.
 * The exchange is one more edge, from a state it may start from to the goal (the target state, or on another
 * mesh a node of its own), and the labels it makes carry `via`. Every cost the search adds is at most
 * DTL__MAX_PLAN_STEPS + 1 capped step prices plus a bound of at most DTL_MAX_MESH_DIMS + 1 capped terms: no
 * overflow. */
typedef struct {
  int64_t cost;
  uint64_t bytes;           /* sent over all ranks so far: the tie-break between equal costs */
  int steps, state, parent; /* parent: the label this one extends, -1 for the start */
  bool via;                 /* reached by the exchange */
} dtl__label;

typedef struct {
  int64_t f; /* cost so far + bound */
  uint64_t bytes;
  int steps, state, label;
} dtl__hnode;

typedef struct {
  dtl__hnode *a;
  int n, cap;
} dtl__heap;

static bool dtl__hless(dtl__hnode x, dtl__hnode y) {
  if (x.f != y.f) return x.f < y.f;
  if (x.bytes != y.bytes) return x.bytes < y.bytes;
  if (x.steps != y.steps) return x.steps < y.steps;
  if (x.state != y.state) return x.state < y.state;
  return x.label < y.label;
}

/* Grows *a (an array of *cap items of elem bytes) to hold n + 1. */
static bool dtl__grow(void **a, int *cap, int n, size_t elem) {
  if (n < *cap) return true;
  int c = *cap ? 2 * *cap : 64;
  void *g = dtl__realloc(*a, (size_t)c * elem);
  if (!g) return false;
  *a = g;
  *cap = c;
  return true;
}

static bool dtl__hpush(dtl__heap *h, dtl__hnode v) {
  if (!dtl__grow((void **)&h->a, &h->cap, h->n, sizeof *h->a)) return false;
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

/* Whether an exchange may start from pl: no Partial left, and every mesh dim that was not a Partial in the source
 * still holds its source placement (an exchange moves data from wherever it is, so only reductions precede it). */
static bool dtl__exchange_from(const dtl__space *s, const dtl_placement *pl) {
  for (int m = 0; m < s->M; m++) {
    if (s->geom->mesh->shape[m] == 1) continue;
    if (pl[m].kind == DTL_PARTIAL) return false;
    if (s->src_pl[m].kind != DTL_PARTIAL && dtl__code(s, pl[m]) != dtl__code(s, s->src_pl[m])) return false;
  }
  return true;
}

/* The exchange's cost from pl, and (total may be NULL) the bytes it moves over all ranks. */
static int64_t dtl__exchange_price(const dtl__space *s, const dtl_placement *pl, uint64_t *total) {
  dtl__xvolume v;
  dtl__xmap_source(s->xm, pl);
  dtl__xmap_volume_max(s->xm, &v);
  if (total) *total = v.total;
  return dtl__exchange_cost_ps(s->cost, &v, s->rounds);
}

/* The tensor dim that mesh dim m of pl reduce-scatters onto in the bounded family (-1: none is legal): the one whose
 * pieces are largest before the split (the largest chunk any rank holds), so that the split is the most even and the
 * reduced shard the smallest; the lowest dim among equals. */
static int dtl__scatter_dim(const dtl__space *s, const dtl_placement *pl, int m) {
  const dtl_layout *g = s->geom;
  int best = -1;
  int64_t best_ext = -1;
  for (int d = 0; d < s->nd; d++) {
    dtl__step_kind kind;
    if (!dtl__step_legal(g->mesh, pl, m, dtl_shard(d), &kind)) continue;
    int64_t ext = g->shape[d], off, size;
    for (int k = 0; k < g->mesh->ndim; k++)
      if (k != m && pl[k].kind == DTL_SHARD && pl[k].dim == d) {
        dtl__chunk(ext, g->mesh->shape[k], 0, &off, &size);
        ext = size;
      }
    if (ext > best_ext) {
      best = d;
      best_ext = ext;
    }
  }
  return best;
}

/* A route's price: its cost, then (between equal costs) the bytes it sends over all ranks, so that of two routes
 * whose slowest ranks take equally long the one that moves less in all wins (e.g. slicing a replicated dim before
 * a reduce-scatter, so that ranks without data send nothing). */
typedef struct {
  int64_t ps;
  uint64_t bytes;
} dtl__price;

static int dtl__price_cmp(dtl__price x, dtl__price y) {
  if (x.ps != y.ps) return x.ps < y.ps ? -1 : 1;
  return x.bytes < y.bytes ? -1 : x.bytes > y.bytes;
}

static uint64_t dtl__sat_addu(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* Per state, what makes a new label redundant: the fewest steps of a label already expanded (every later
 * label of the state is at least as dear), and two labels already queued, the cheapest (with its steps)
 * and the shortest (with its price). The limited search checks against both queued labels, which misses
 * some dominated labels (costing time, never a route); the one-label search against the cheapest. */
enum { DTL__NO_STEPS = 1 << 30 };
typedef struct {
  int expanded_steps; /* DTL__NO_STEPS: none expanded yet */
  dtl__price cheap, shortest;
  int cheap_steps, short_steps; /* DTL__NO_STEPS: none queued yet */
} dtl__seen;

typedef struct {
  const dtl__space *s;
  bool limited;
  dtl__seen *seen; /* nseen: the states, and the goal on another mesh */
  int nseen;
  dtl__label *a;
  int n, cap;
  dtl__heap h;
} dtl__search_state;

/* Queues the label (price, steps, state, parent, via) unless a label of its state makes it redundant: 0, or -1
 * when out of memory, or 1 when the one-label search would queue a label longer than the limit. */
static int dtl__offer(dtl__search_state *S, dtl__price c, int64_t bound, int steps, int state, int parent, bool via) {
  dtl__seen *v = &S->seen[state];
  int vs_cheap = v->cheap_steps == DTL__NO_STEPS ? 1 : dtl__price_cmp(v->cheap, c);
  bool redundant = S->limited ? v->expanded_steps <= steps || (vs_cheap <= 0 && v->cheap_steps <= steps) ||
                                    (v->short_steps != DTL__NO_STEPS && dtl__price_cmp(v->shortest, c) <= 0 &&
                                     v->short_steps <= steps)
                              : v->expanded_steps != DTL__NO_STEPS || vs_cheap < 0 ||
                                    (vs_cheap == 0 && v->cheap_steps <= steps);
  if (redundant) return 0;
  if (steps > DTL__MAX_PLAN_STEPS) return 1; /* never in the limited search: it does not expand such labels */
  if (vs_cheap > 0 || (vs_cheap == 0 && steps < v->cheap_steps)) v->cheap = c, v->cheap_steps = steps;
  if (steps < v->short_steps || (steps == v->short_steps && dtl__price_cmp(c, v->shortest) < 0))
    v->shortest = c, v->short_steps = steps;
  if (!dtl__grow((void **)&S->a, &S->cap, S->n, sizeof *S->a)) return -1;
  S->a[S->n] = (dtl__label){c.ps, c.bytes, steps, state, parent, via};
  return dtl__hpush(&S->h, (dtl__hnode){c.ps + bound, c.bytes, steps, state, S->n++}) ? 0 : -1;
}

/* One search from `from` to `to` (see above): the target's label, or -1 out of memory, or -2 when the
 * one-label search gives up, or -3 when no route exists. */
static int dtl__search_run(dtl__search_state *S, int from, int to) {
  const dtl__space *s = S->s;
  dtl_placement target[DTL_MAX_MESH_DIMS], pl[DTL_MAX_MESH_DIMS], nx[DTL_MAX_MESH_DIMS];
  if (to < s->nstates) dtl__decode(s, to, target);
  else dtl__decode(s, from, target); /* the goal on another mesh: only the exchange bound applies */
  for (int i = 0; i < S->nseen; i++) S->seen[i] = (dtl__seen){DTL__NO_STEPS, {0, 0}, {0, 0}, DTL__NO_STEPS, DTL__NO_STEPS};
  S->n = S->h.n = 0;
  dtl__decode(s, from, pl);
  if (dtl__offer(S, (dtl__price){0, 0}, dtl__remaining_bound(s, pl, target), 0, from, -1, false) < 0) return -1;
  while (S->h.n > 0) {
    dtl__hnode u = dtl__hpop(&S->h);
    int *expanded = &S->seen[u.state].expanded_steps;
    if (S->limited ? *expanded <= u.steps : *expanded != DTL__NO_STEPS) continue;
    *expanded = u.steps;
    if (u.state == to) return u.label;
    dtl__price g = {S->a[u.label].cost, S->a[u.label].bytes};
    dtl__decode(s, u.state, pl);
    for (int m = 0; m < s->M; m++) {
      int p = s->geom->mesh->shape[m];
      if (p == 1 || ((s->cross || s->reduce_only) && pl[m].kind != DTL_PARTIAL)) continue;
      int cur = dtl__code(s, pl[m]);
      for (int code = 0; code < s->K; code++) {
        if (code == cur || (code == s->K - 1 && !s->has_p[m])) continue;
        dtl_placement q = dtl__placement_of(s, m, code);
        if (q.kind == DTL_SHARD && !dtl__first_free_of_kind(s, pl, m, q.dim)) continue;
        dtl__step_kind kind;
        if (!dtl__step_legal(s->geom->mesh, pl, m, q, &kind)) continue;
        if (S->limited && u.steps == DTL__MAX_PLAN_STEPS) continue;
        if (s->reduce_whole && kind == DTL__STEP_REDUCE_SCATTER) continue;
        if (s->scatter_first && kind == DTL__STEP_ALL_REDUCE && dtl__scatter_dim(s, pl, m) >= 0) continue;
        if (s->scatter_first && kind == DTL__STEP_REDUCE_SCATTER && q.dim != dtl__scatter_dim(s, pl, m)) continue;
        memcpy(nx, pl, sizeof nx);
        nx[m] = q;
        int v = dtl__encode(s, nx), ve = S->seen[v].expanded_steps;
        if (S->limited ? ve <= u.steps + 1 : ve != DTL__NO_STEPS) continue; /* before pricing the step */
        dtl__step_volume vol;
        dtl__step_volume_max(s->geom, kind, m, pl, nx, &vol);
        dtl__price c = {g.ps + dtl__step_cost_ps(s->cost, kind, p, &vol, s->geom->mesh->dim_inter[m]),
                        dtl__sat_addu(g.bytes, dtl__step_volume_total(s->geom, kind, m, pl, nx))};
        int r = dtl__offer(S, c, dtl__remaining_bound(s, nx, target), u.steps + 1, v, u.label, false);
        if (r) return r < 0 ? -1 : -2;
      }
    }
    /* The exchange, after the per-dim steps so that a tie keeps the collective (one step either way). */
    int ve = S->seen[to].expanded_steps;
    if (s->xm && !(S->limited ? ve <= u.steps + 1 || u.steps == DTL__MAX_PLAN_STEPS : ve != DTL__NO_STEPS) &&
        dtl__exchange_from(s, pl)) {
      uint64_t total = 0;
      dtl__price c = {g.ps + dtl__exchange_price(s, pl, &total), dtl__sat_addu(g.bytes, total)};
      int r = dtl__offer(S, c, 0, u.steps + 1, to, u.label, true);
      if (r) return r < 0 ? -1 : -2;
    }
  }
  return -3;
}

/* Fills path[0..*len) with the states of the cheapest route of at most DTL__MAX_PLAN_STEPS steps from
 * `from` to `to` (both included); *via_exchange says whether its last step is the exchange. */
static dtl_status dtl__search(const char *fn, const dtl__space *s, int from, int to, int *path, int *len,
                              bool *via_exchange) {
  int n = s->nstates + (to >= s->nstates);
  dtl__search_state S = {.s = s, .nseen = n, .seen = dtl__malloc((size_t)n * sizeof *S.seen)};
  int found = S.seen ? dtl__search_run(&S, from, to) : -1;
  if (found == -2) {
    S.limited = true;
    found = dtl__search_run(&S, from, to);
  }
  dtl_status st = DTL_OK;
  if (found == -1) {
    st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory (search over %d placement states)", n);
  } else if (found < 0) {
    /* Unreachable: undoing every split and reduction innermost mesh dim first, then making the target's
     * outermost first, is a legal route of at most 2 x DTL_MAX_MESH_DIMS steps between any two layouts that
     * dtl__check_supported accepts. */
    st = dtl__error_fn(DTL_ERR_INTERNAL, fn, "no legal route between the layouts (a planner bug: please report it)");
  } else {
    *len = S.a[found].steps + 1;
    *via_exchange = S.a[found].via;
    for (int k = found, i = *len - 1; i >= 0; k = S.a[k].parent, i--) path[i] = S.a[k].state;
  }
  dtl__free(S.seen);
  dtl__free(S.a);
  dtl__free(S.h.a);
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

/* Shard -> Partial(avg) and Partial(a) -> Partial(b) have no step of their own (Shard -> Partial of another op is
 * a local step: the shard in its op's identity). Both could be reached through R (an all-gather or an all-reduce,
 * then a local relabeling), but that spends a collective only to throw most of its result away again, so dtl
 * refuses instead of inserting it silently and says what to ask for. Mesh dims of size 1 are exempt: there every
 * placement is the same data. */
static dtl_status dtl__check_supported(const char *fn, const dtl_layout *src, const dtl_layout *dst) {
  for (int m = 0; m < src->mesh->ndim; m++) {
    if (src->mesh->shape[m] == 1) continue;
    dtl_placement a = src->placements[m], b = dst->placements[m];
    char ta[16], tb[16];
    dtl__placement_text(a, ta, sizeof ta);
    dtl__placement_text(b, tb, sizeof tb);
    if (a.kind == DTL_SHARD && b.kind == DTL_PARTIAL && b.op == DTL_AVG)
      return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn,
                           "mesh dim %d: %s -> %s is unsupported: a shard becomes a Partial by filling the rest of the "
                           "group's extent with the op's identity, and avg has none (the fill would count towards the "
                           "mean); ask for P(sum) or R on mesh dim %d (or redistribute to R first, then to %s)",
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

static void dtl__mesh_text(const dtl_mesh *m, char *buf, size_t cap) {
  for (int d = 0, o = 0; d < m->ndim && (size_t)o < cap; d++) o += snprintf(buf + o, cap - (size_t)o, d ? "x%d" : "%d", m->shape[d]);
}

dtl_status dtl__plan_check_pair(const char *fn, const dtl_layout *src, const dtl_layout *dst) {
  DTL_CHECK_ARG(src != NULL, fn, "src=NULL");
  DTL_CHECK_ARG(dst != NULL, fn, "dst=NULL");
  if (src->mesh != dst->mesh && (!src->mesh->parent || src->mesh->parent != dst->mesh->parent)) {
    char a[64] = "", b[64] = "";
    dtl__mesh_text(src->mesh, a, sizeof a);
    dtl__mesh_text(dst->mesh, b, sizeof b);
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                         "src and dst are on meshes without a common parent (src mesh %s at %p over communicator %p, "
                         "dst mesh %s at %p over communicator %p; expected one mesh, or two meshes made from ranks of "
                         "the same communicator)",
                         a, (const void *)src->mesh, (const void *)src->mesh->parent, b, (const void *)dst->mesh,
                         (const void *)dst->mesh->parent);
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

/* Rounds of `rows` indices that cover ext, at most INT_MAX (the bounded family never asks for more). */
static int dtl__rounds_of(int64_t ext, int64_t rows) {
  int64_t r = ext / rows + (ext % rows != 0);
  return r >= INT_MAX ? INT_MAX : (int)r;
}

/* The plan of route path[0..len) (its last step the exchange when via), with the exchange in rounds of xrows. */
static dtl_status dtl__plan_build(const char *fn, const dtl__space *s, const dtl_layout *src, const dtl_layout *dst,
                                  const int *path, int len, bool via, int64_t xrows, bool fine, size_t limit,
                                  size_t chunk, dtl_plan **out) {
  const dtl_mesh *mesh = src->mesh;
  dtl_plan *p = dtl__calloc(1, sizeof *p);
  if (!p) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  p->src = *src;
  p->dst = *dst;
  p->cost = *s->cost;
  p->limit = limit;
  p->chunk_bytes = chunk;
  p->xdim = -1;
  for (int d = 0; d < src->ndim && p->xdim < 0; d++)
    if (src->shape[d] > 1) p->xdim = d;
  p->xrows = p->xdim < 0 ? 1 : xrows < src->shape[p->xdim] ? xrows : src->shape[p->xdim];
  p->xrounds = p->xdim < 0 ? 1 : dtl__rounds_of(src->shape[p->xdim], p->xrows);
  if (fine) { /* the caller checked that the count of fine rounds fits an int */
    p->xfine = true;
    p->xrows = 1;
    p->xrounds = s->rounds;
  }
  int64_t total_ps = 0;
  /* The search kept size-1 mesh dims at R; the step vectors carry the target's placement there (on another mesh:
   * the source's), so the last step ends exactly at dst. Boxes do not change: a split in 1 is the whole dim. */
  const dtl_placement *rest = s->cross ? src->placements : dst->placements;
  for (int k = 0; k + 1 < len; k++) {
    dtl__plan_step *st = &p->steps[p->nsteps++];
    dtl__decode(s, path[k], st->before);
    int64_t ps;
    if (via && k + 2 == len) {
      st->kind = DTL__STEP_EXCHANGE;
      st->mesh_dim = -1;
      memcpy(st->after, dst->placements, sizeof st->after);
      for (int q = 0; q < s->M; q++)
        if (mesh->shape[q] == 1) st->before[q] = rest[q];
      dtl__xmap_source(s->xm, st->before);
      ps = dtl__exchange_step_price(s->xm, s->cost, p->xrounds, st);
    } else {
      dtl__decode(s, path[k + 1], st->after);
      for (int m = 0; m < s->M; m++)
        if (st->before[m].kind != st->after[m].kind || st->before[m].dim != st->after[m].dim) st->mesh_dim = m;
      int m = st->mesh_dim;
      dtl__step_legal(mesh, st->before, m, st->after[m], &st->kind);
      dtl__step_volume vmax, vme;
      dtl__step_volume_max(src, st->kind, m, st->before, st->after, &vmax);
      ps = dtl__step_cost_ps(s->cost, st->kind, mesh->shape[m], &vmax, mesh->dim_inter[m]);
      for (int q = 0; q < s->M; q++)
        if (mesh->shape[q] == 1) st->before[q] = st->after[q] = rest[q];
      dtl__step_volume_at(src, st->kind, m, st->before, st->after, mesh->coord, &vme);
      st->send_bytes = mesh->member ? vme.send : 0;
      st->recv_bytes = mesh->member ? vme.recv : 0;
      st->inter = mesh->dim_inter[m];
      st->remote_bytes = mesh->member ? dtl__step_remote_bytes(mesh, st->kind, m, mesh->coord, vme.send) : 0;
    }
    total_ps = dtl__sat_add(total_ps, ps);
    st->cost_s = (double)ps * 1e-12;
  }
  p->total_cost_s = (double)total_ps * 1e-12;
  dtl_status st = dtl__plan_compile(fn, p);
  if (st != DTL_OK) {
    dtl_plan_destroy(p);
    return st;
  }
  *out = p;
  return DTL_OK;
}

/* The cheapest route of s from src to its goal, as a plan with the exchange (if any) in rounds of xrows. */
static dtl_status dtl__plan_route(const char *fn, const dtl__space *s, const dtl_layout *src, const dtl_layout *dst,
                                  int64_t xrows, bool fine, size_t limit, size_t chunk, dtl_plan **out) {
  int path[DTL__MAX_PLAN_STEPS + 1], len = 0;
  bool via = false;
  DTL_TRY(dtl__search(fn, s, dtl__encode(s, src->placements), s->goal, path, &len, &via));
  return dtl__plan_build(fn, s, src, dst, path, len, via, xrows, fine, limit, chunk, out);
}

/* The bounded family: reductions and one exchange (s set up for it), with pack passes in chunks of `chunk` bytes,
 * the exchange in the fewest rounds that fit: rows per round halved until a plan fits, then the largest row count
 * in between that fits. *out gets the plan that fits, or the one that came closest (the last tried). */
static dtl_status dtl__plan_bounded(const char *fn, dtl__space *s, const dtl_layout *src, const dtl_layout *dst,
                                    size_t limit, size_t chunk, dtl_plan **out, bool *fits, size_t *worst) {
  int xdim = -1;
  for (int d = 0; d < src->ndim && xdim < 0; d++)
    if (src->shape[d] > 1) xdim = d;
  int64_t ext = xdim < 0 ? 1 : src->shape[xdim], ok_rows = 0, bad_rows = ext < INT64_MAX ? ext + 1 : INT64_MAX;
  dtl_plan *q = NULL;
  dtl_status st = DTL_OK;
  for (int64_t rows = ext; st == DTL_OK; rows = (rows + 1) / 2) {
    dtl_plan_destroy(q);
    q = NULL;
    s->rounds = dtl__rounds_of(ext, rows);
    st = dtl__plan_route(fn, s, src, dst, rows, false, limit, chunk, &q);
    if (st == DTL_OK) st = dtl__plan_fits(fn, q, limit, fits, worst);
    if (st != DTL_OK || *fits || rows <= 1 || dtl__rounds_of(ext, (rows + 1) / 2) == INT_MAX ||
        q->steps[q->nsteps - 1].kind != DTL__STEP_EXCHANGE) {
      if (st == DTL_OK && *fits) ok_rows = rows;
      break;
    }
    bad_rows = rows;
  }
  while (st == DTL_OK && ok_rows && bad_rows - ok_rows > 1) {
    int64_t rows = ok_rows + (bad_rows - ok_rows) / 2;
    dtl_plan *r = NULL;
    bool rfits = false;
    size_t rworst = 0;
    s->rounds = dtl__rounds_of(ext, rows);
    st = dtl__plan_route(fn, s, src, dst, rows, false, limit, chunk, &r);
    if (st == DTL_OK) st = dtl__plan_fits(fn, r, limit, &rfits, &rworst);
    if (st == DTL_OK && rfits) {
      dtl_plan_destroy(q);
      q = r;
      *worst = rworst;
      ok_rows = rows;
    } else {
      dtl_plan_destroy(r);
      bad_rows = rows;
    }
  }
  if (st != DTL_OK) {
    dtl_plan_destroy(q);
    return st;
  }
  *out = q;
  return DTL_OK;
}

/* Keeps candidate q (whether it fits, its largest scratch) in place of *p when take, else drops it. */
static void dtl__keep(dtl_plan **p, bool *fits, size_t *worst, bool take, dtl_plan *q, bool qfits, size_t qworst) {
  if (!take) {
    dtl_plan_destroy(q);
    return;
  }
  dtl_plan_destroy(*p);
  *p = q;
  *fits = qfits;
  *worst = qworst;
}

/* Plans src -> dst within a scratch budget: limit bytes on every rank, or (limit == SIZE_MAX) the larger of each
 * rank's local source and target bytes. First the cheapest route of all; if some rank's scratch exceeds its budget,
 * the cheapest route of reductions and one exchange, in the fewest rounds that fit every rank. A limit that no
 * route meets fails naming the smallest that would; the default budget returns the route that comes closest. */
dtl_status dtl__plan_create(const char *fn, const dtl_layout *src, const dtl_layout *dst, const dtl_cost_model *over,
                            size_t limit, dtl_plan **out) {
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_TRY(dtl__plan_check_pair(fn, src, dst));
  dtl_cost_model cost;
  DTL_TRY(dtl__cost_resolve(fn, src->mesh, over, &cost));
  bool cross = src->mesh != dst->mesh;
  if (!cross) DTL_TRY(dtl__check_supported(fn, src, dst));

  const dtl_mesh *mesh = src->mesh;
  dtl__space s = {.geom = src, .cost = &cost, .M = mesh->ndim, .nd = src->ndim, .K = src->ndim + 2, .nstates = 1};
  for (int m = 0; m < s.M; m++) {
    dtl_placement a = src->placements[m], b = cross ? dtl_replicate() : dst->placements[m];
    /* Partial with the op of the source or the target there, else sum: from a shard it is a local embed, which can
     * undo an inner split that a collective could not reach yet (the reduce-scatter out of it redistributes). The
     * 8-bit floats have no sum (types.h), and a max over the embed's identity could drop a NaN, so for them only
     * the source's or target's own Partial is a state. */
    s.has_p[m] = !dtl__dtype_is_fp8(src->dtype) || a.kind == DTL_PARTIAL || b.kind == DTL_PARTIAL;
    s.op[m] = a.kind == DTL_PARTIAL ? a.op : b.kind == DTL_PARTIAL ? b.op : DTL_SUM;
    s.nstates *= s.K;
    s.of[m][0] = dtl_replicate();
    for (int d = 0; d < s.nd; d++) s.of[m][1 + d] = dtl_shard(d);
    s.of[m][s.K - 1] = dtl_partial(s.op[m]);
    if (mesh->shape[m] > 1 && a.kind == DTL_SHARD) s.used[a.dim] = true;
    if (mesh->shape[m] > 1 && b.kind == DTL_SHARD) s.used[b.dim] = true;
  }
  /* Pricing an exchange visits every (target rank, source class) pair, about 60 ns each. On one mesh of more than
   * 1024 ranks (over 60 ms per pricing) such plans take the per-dim routes only (between two meshes the exchange is
   * the only route, whatever it costs to price). */
  dtl__xmap xm;
  DTL_TRY(dtl__xmap_init(&xm, fn, src, mesh, dst->mesh, dst->placements, NULL, 0));
  s.xm = cross || (uint64_t)mesh->size * (uint64_t)dst->mesh->size <= DTL__XMAP_MAX_PAIRS ? &xm : NULL;
  s.src_pl = src->placements;
  s.cross = cross;
  s.rounds = 1;
  s.goal = cross ? s.nstates : dtl__encode(&s, dst->placements);
  bool pfree = true;
  for (int m = 0; m < s.M; m++) pfree &= mesh->shape[m] == 1 || src->placements[m].kind != DTL_PARTIAL;
  s.xmin = pfree && s.xm ? dtl__exchange_price(&s, src->placements, NULL) : 0;

  /* The cheapest route; if it does not fit, the bounded family, first with the executor's own pack chunking, then
   * reduce-scatters before all-reduces and pack passes one row at a time; the first that fits, else the closest. */
  dtl_plan *p = NULL, *q = NULL;
  bool fits = false;
  size_t worst = 0;
  int path[DTL__MAX_PLAN_STEPS + 1], len = 0;
  bool via = false;
  dtl_status st = dtl__search(fn, &s, dtl__encode(&s, src->placements), s.goal, path, &len, &via);
  if (st == DTL_OK) st = dtl__plan_build(fn, &s, src, dst, path, len, via, INT64_MAX, false, limit, 0, &p);
  /* A plan of at most one step fits the default bound by construction (an exchange's modes, a collective's one
   * pack or receive region, a local copy: compile.c), except a chunked all-to-all on very uneven shards; other plans,
   * and every plan under a limit, are checked on every rank. */
  if (st == DTL_OK && limit == SIZE_MAX && p->nsteps <= 1 && (p->nsteps == 0 || p->steps[0].kind != DTL__STEP_ALL_TO_ALL))
    fits = true;
  else if (st == DTL_OK)
    st = dtl__plan_fits(fn, p, limit, &fits, &worst);
  /* The cheapest route, for explain when the bound turns it down. */
  double cost0 = st == DTL_OK ? p->total_cost_s : 0;
  int calls0 = st == DTL_OK ? dtl_plan_num_collectives(p) : 0;
  size_t worst0 = worst;
  /* The same route with its pack and unpack passes in smaller chunks (halved down to one row), when that is what
   * holds it back (its intermediate shards themselves fit). */
  for (size_t chunk = (size_t)1 << 20; st == DTL_OK && !fits && chunk >= 1; chunk /= 2) {
    bool qfits = false;
    size_t qworst = 0;
    st = dtl__plan_build(fn, &s, src, dst, path, len, via, INT64_MAX, false, limit, chunk, &q);
    if (st == DTL_OK) st = dtl__plan_fits(fn, q, limit, &qfits, &qworst);
    dtl__keep(&p, &fits, &worst, st == DTL_OK && qfits, q, qfits, qworst);
    q = NULL;
  }
  /* Tiers: the cheapest reductions; reduce-scatters onto the largest pieces, pack passes one row at a time; only
   * all-reduces, whose output is the source's box (a reduce-scatter onto a dim of small extent can leave one rank
   * more than its source holds, with its pack region beside it). */
  for (int tier = 0; tier < 3 && st == DTL_OK && !fits && s.xm; tier++) {
    bool qfits = false;
    size_t qworst = 0;
    s.reduce_only = true;
    s.scatter_first = tier == 1;
    s.reduce_whole = tier == 2;
    st = dtl__plan_bounded(fn, &s, src, dst, limit, tier >= 1 ? 1 : 0, &q, &qfits, &qworst);
    dtl__keep(&p, &fits, &worst, st == DTL_OK && (qfits || qworst < worst), q, qfits, qworst);
    q = NULL;
  }
  /* The last resort: all-reduces, then the exchange one row at a time (one index of every dim but the last), where
   * every piece is a run, so nothing is packed: the reduced shard (the source's box) and the target are all it needs,
   * which fits the default bound by construction. Priced like any plan: alpha per round. */
  uint64_t fine_rounds = 1;
  for (int d = 0; d + 1 < src->ndim && fine_rounds <= INT_MAX; d++) /* both factors <= INT_MAX: no overflow */
    fine_rounds = src->shape[d] > INT_MAX ? (uint64_t)INT_MAX + 1 : fine_rounds * (uint64_t)src->shape[d];
  if (st == DTL_OK && !fits && s.xm && src->ndim >= 3 && fine_rounds > 1 && fine_rounds <= INT_MAX) {
    bool qfits = false;
    size_t qworst = 0;
    s.reduce_only = s.reduce_whole = true;
    s.scatter_first = false;
    s.rounds = (int)fine_rounds;
    st = dtl__plan_route(fn, &s, src, dst, 1, true, limit, 1, &q);
    if (st == DTL_OK && q->steps[q->nsteps - 1].kind != DTL__STEP_EXCHANGE) {
      dtl_plan_destroy(q); /* no exchange: the rounds change nothing */
      q = NULL;
    } else if (st == DTL_OK) {
      st = dtl__plan_fits(fn, q, limit, &qfits, &qworst);
    }
    dtl__keep(&p, &fits, &worst, st == DTL_OK && q && (qfits || qworst < worst), q, qfits, qworst);
    q = NULL;
  }
  if (st == DTL_OK && !fits && limit != SIZE_MAX)
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "max_scratch_bytes=%zu is below what any plan needs on some rank "
                       "(the smallest limit that works for this pair is %zu bytes)", limit, worst);
  dtl_plan_destroy(q);
  dtl__xmap_free(&xm);
  if (st != DTL_OK) {
    dtl_plan_destroy(p);
    return st;
  }
  if (limit == SIZE_MAX && p->total_cost_s > cost0) {
    p->unbounded_cost_s = cost0;
    p->unbounded_collectives = calls0;
    p->unbounded_scratch = worst0;
  }
  DTL_LOG(DTL_LOG_DEBUG, "plan", "%s: %d steps, est %.3g s", fn, p->nsteps, p->total_cost_s);
  *out = p;
  return DTL_OK;
}

/* A quantized part's plan (plan_internal.h): the part's layouts, whose boxes the geometry gives (xmap.h), and the one
 * exchange. Its placements are the logical ones moved onto the part dims that follow the logical dims, so that explain
 * and the DTL_CHECK fingerprint read the part as a tensor of its own. */
static dtl_status dtl__qpart_layout(const char *fn, const dtl__qgeom *g, int part, const dtl_layout *logical,
                                    dtl_layout *out) {
  const dtl__qpart_geom *pg = &g->part[part];
  const dtl_mesh *m = logical->mesh;
  dtl_placement pl[DTL_MAX_MESH_DIMS];
  for (int md = 0; md < m->ndim; md++) {
    dtl_placement q = logical->placements[md];
    pl[md] = q;
    if (q.kind != DTL_SHARD) continue;
    int follow = -1;
    for (int d = 0; d < pg->ndim && follow < 0; d++)
      if (pg->map[d].src == q.dim && pg->map[d].kind != DTL__QMAP_WHOLE && pg->map[d].kind != DTL__QMAP_ONE) follow = d;
    if (follow < 0)
      return dtl__error_fn(DTL_ERR_INTERNAL, fn, "part %d has no dim that follows logical dim %d (placements[%d])", part,
                           q.dim, md);
    pl[md] = dtl_shard(follow);
  }
  DTL_TRY(dtl__layout_init(out, fn, m, pg->dtype, pg->ndim, pg->shape, pl));
  if (m->member) {
    dtl__xbox(g, part, false, m, pg->ndim, pg->shape, out->placements, m->coord, out->local_shape, out->local_offset);
    out->local_count = (size_t)dtl__qbox_count(pg->ndim, out->local_shape);
  }
  return DTL_OK;
}

dtl_status dtl__plan_create_qpart(const char *fn, const dtl__qgeom *g, int part, const dtl_layout *src,
                                  const dtl_layout *dst, const dtl_cost_model *over, dtl_plan **out) {
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_TRY(dtl__plan_check_pair(fn, src, dst));
  dtl_cost_model cost;
  DTL_TRY(dtl__cost_resolve(fn, src->mesh, over, &cost));
  dtl_plan *p = dtl__calloc(1, sizeof *p);
  if (!p) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  dtl_status st = dtl__qpart_layout(fn, g, part, src, &p->src);
  if (st == DTL_OK) st = dtl__qpart_layout(fn, g, part, dst, &p->dst);
  dtl__xmap xm;
  if (st == DTL_OK)
    st = dtl__xmap_init(&xm, fn, &p->src, p->src.mesh, p->dst.mesh, p->dst.placements, g, part);
  if (st != DTL_OK) {
    dtl__free(p);
    return st;
  }
  p->qgeom = g;
  p->qpart = part;
  p->cost = cost;
  p->limit = SIZE_MAX;
  p->xdim = -1;
  for (int d = 0; d < p->src.ndim && p->xdim < 0; d++)
    if (p->src.shape[d] > 1) p->xdim = d;
  p->xrows = p->xdim < 0 ? 1 : p->src.shape[p->xdim];
  p->xrounds = 1;
  p->nsteps = 1;
  dtl__plan_step *s = &p->steps[0];
  s->kind = DTL__STEP_EXCHANGE;
  s->mesh_dim = -1;
  memcpy(s->before, p->src.placements, sizeof s->before);
  memcpy(s->after, p->dst.placements, sizeof s->after);
  dtl__xmap_source(&xm, s->before);
  p->total_cost_s = (double)dtl__exchange_step_price(&xm, &cost, 1, s) * 1e-12;
  dtl__xmap_free(&xm);
  st = dtl__plan_compile(fn, p);
  if (st != DTL_OK) {
    dtl_plan_destroy(p);
    return st;
  }
  *out = p;
  return DTL_OK;
}

/* The public constructors: the plan, with its own workspace acquired (plan_internal.h). */
static dtl_status dtl__plan_create_public(const char *fn, const dtl_layout *src, const dtl_layout *dst,
                                          const dtl_cost_model *over, size_t limit, dtl_plan **out) {
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  dtl_plan *p = NULL;
  DTL_TRY(dtl__plan_create(fn, src, dst, over, limit, &p));
  dtl_status st = dtl__plan_acquire_workspace(fn, p);
  if (st != DTL_OK) {
    dtl_plan_destroy(p);
    return st;
  }
  *out = p;
  return DTL_OK;
}

dtl_status dtl_plan_create(const dtl_layout *src, const dtl_layout *dst, dtl_plan **out) {
  return dtl__plan_create_public("dtl_plan_create", src, dst, NULL, SIZE_MAX, out);
}

dtl_status dtl_plan_create_with_limit(const dtl_layout *src, const dtl_layout *dst, size_t max_scratch_bytes,
                                      dtl_plan **out) {
  DTL_CHECK_ARG(max_scratch_bytes != SIZE_MAX, "dtl_plan_create_with_limit",
                "max_scratch_bytes=SIZE_MAX (use dtl_plan_create for the default bound)");
  return dtl__plan_create_public("dtl_plan_create_with_limit", src, dst, NULL, max_scratch_bytes, out);
}

dtl_status dtl_plan_create_with_cost(const dtl_layout *src, const dtl_layout *dst, const dtl_cost_model *cost,
                                     dtl_plan **out) {
  static const char fn[] = "dtl_plan_create_with_cost";
  DTL_CHECK_ARG(cost != NULL, fn, "cost=NULL (use dtl_plan_create for the defaults)");
  return dtl__plan_create_public(fn, src, dst, cost, SIZE_MAX, out);
}

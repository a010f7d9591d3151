/* SPDX-License-Identifier: Apache-2.0 */
/* Calibration of the planner's cost model: measuring (alpha, beta, local_beta) per link class on a mesh's ranks
 * (dtl_cost_model_calibrate), writing them with the transport's algorithm table as a profile
 * (dtl_cost_model_save). Reading a profile back is cost.c's, where a plan resolves its model: this file uses the
 * cost model and is not used by it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm/agree.h"
#include "comm/profile.h"
#include "redistribute/cost.h"

/* --- measurement ------------------------------------------------------------------------------------------ */

/* Whether ranks a and b of c share a node (the communicator's node table): the link class of their messages. */
static bool dtl__calib_same_node(const dtl_comm *c, int a, int b) { return dtl__comm_node_of(c, a) == dtl__comm_node_of(c, b); }

/* The first rank on the node of rank r: names r's node. */
static int dtl__calib_node_leader(const dtl_comm *c, int r) {
  for (int q = 0; q < r; q++)
    if (dtl__calib_same_node(c, q, r)) return q;
  return r;
}

#define DTL__CALIB_SIZES 4
/* Global bytes of the tensor at each size: from latency-bound to beyond the caches, where the bandwidth of large
 * redistributions is set. */
static const size_t dtl__calib_bytes[DTL__CALIB_SIZES] = {4 * 1024, 64 * 1024, 1024 * 1024, 4 * 1024 * 1024};
/* The redistributions measured on a 1-D mesh, one per path of the executor: an all-gather of the outer and of the
 * inner dim (that one unpacks), an all-reduce, a reduce-scatter, an all-to-all (that one packs). */
#define DTL__CALIB_CASES 5
static const char *const dtl__calib_from[DTL__CALIB_CASES] = {"S0", "S1", "P", "P", "S0"};
static const char *const dtl__calib_to[DTL__CALIB_CASES] = {"R", "R", "R", "S0", "S1"};

/* The side of the square f32 tensor of about bytes, a multiple of p. */
static int64_t dtl__calib_side(size_t bytes, int p) {
  int64_t n = (int64_t)llround(sqrt((double)bytes / 4.0) / p) * p;
  return n < p ? p : n;
}

typedef struct {
  const dtl_plan *plan;
  void *a, *b;
  size_t bytes;
} dtl__calib_arg;

static dtl_status dtl__calib_plan_fn(dtl_comm *g, void *arg) {
  dtl__calib_arg *k = arg;
  (void)g;
  return dtl_plan_execute(k->plan, k->a, k->b);
}

static dtl_status dtl__calib_copy_fn(dtl_comm *g, void *arg) {
  dtl__calib_arg *k = arg;
  return dtl__mem_copy(&g->mem, k->b, k->a, k->bytes);
}

/* What the model charges a plan, by parameter: calls (ring rounds + 1 per collective), network bytes and locally
 * touched bytes, from the planner's own volumes (cost.c), so that t = calls alpha + net beta + local local_beta.
 * false for a plan with an exchange, whose price depends on its peers (not measured here). */
static bool dtl__calib_terms(const dtl_plan *p, double *calls, double *net, double *local) {
  *calls = *net = *local = 0;
  for (int i = 0; i < p->nsteps; i++) {
    const dtl__plan_step *st = &p->steps[i];
    if (st->kind == DTL__STEP_EXCHANGE) return false;
    dtl__step_volume v;
    dtl__step_volume_max(&p->src, st->kind, st->mesh_dim, st->before, st->after, &v);
    if (st->kind == DTL__STEP_LOCAL_SLICE || st->kind == DTL__STEP_LOCAL_PARTIAL || st->kind == DTL__STEP_LOCAL_EMBED) {
      *local += (double)v.charged;
    } else {
      *calls += dtl__step_rounds(st->kind, p->src.mesh->shape[st->mesh_dim]) + 1;
      *net += (double)v.charged;
    }
  }
  return true;
}

/* alpha and beta of the link class of g's ranks: the model's prices of the redistributions above at four sizes
 * (plans on a 1-D mesh over g, as dtl_plan_create makes them) fitted to their measured times by least squares in
 * relative error (the accuracy the planner's choices depend on). Where no plan communicates (one rank) there is
 * no link: alpha is a call's overhead and beta the copy's. a and b hold the largest tensor. */
static dtl_status dtl__calib_link(dtl_comm *g, void *a, void *b, double local_beta, double *alpha, double *beta) {
  int p = g->size;
  dtl_mesh *m = NULL;
  DTL_TRY(dtl_mesh_create(g, 1, &p, &m));
  double saa = 0, sab = 0, sbb = 0, sa = 0, sb = 0, amin = INFINITY, tmin = INFINITY;
  dtl_status st = DTL_OK;
  for (int s = 0; s < DTL__CALIB_SIZES && st == DTL_OK; s++)
    for (int c = 0; c < DTL__CALIB_CASES && st == DTL_OK; c++) {
      int64_t n = dtl__calib_side(dtl__calib_bytes[s], p), shape[2] = {n, n};
      dtl_placement pf, pt;
      int one;
      dtl_layout *src = NULL, *dst = NULL;
      dtl_plan *plan = NULL;
      st = dtl_placements_parse(dtl__calib_from[c], &pf, 1, &one);
      if (st == DTL_OK) st = dtl_placements_parse(dtl__calib_to[c], &pt, 1, &one);
      if (st == DTL_OK) st = dtl_layout_create(m, DTL_FLOAT32, 2, shape, &pf, &src);
      if (st == DTL_OK) st = dtl_layout_create(m, DTL_FLOAT32, 2, shape, &pt, &dst);
      if (st == DTL_OK) st = dtl_plan_create(src, dst, &plan);
      /* Planning is local (DTL_PLAN_TUNE may differ, memory may run out): the ranks agree before they time it. */
      int64_t v = st == DTL_OK ? 0 : 1 + (int64_t)st;
      dtl_status ag = dtl__comm_max_i64(g, &v, 1);
      if (st == DTL_OK && ag != DTL_OK) st = ag;
      else if (st == DTL_OK && v)
        st = dtl__error_fn((dtl_status)(v - 1), "dtl_cost_model_calibrate", "another rank failed to plan %s->%s "
                           "(%s; its dtl_last_error says why)", dtl__calib_from[c], dtl__calib_to[c],
                           dtl_status_name((dtl_status)(v - 1)));
      double calls, net, local, t = 0;
      if (st == DTL_OK && dtl__calib_terms(plan, &calls, &net, &local)) {
        dtl__calib_arg k = {plan, a, b, 0};
        st = dtl__calib_time(g, dtl__calib_plan_fn, &k, &t);
        t = t > 1e-9 ? t : 1e-9;
        if (st == DTL_OK && calls > 0) {
          double rest = t - local * local_beta; /* the local steps' share, at the measured copy speed */
          rest = rest > 0.1 * t ? rest : 0.1 * t;
          double ra = calls / t, rb = net / t, rt = rest / t;
          saa += ra * ra, sab += ra * rb, sbb += rb * rb, sa += ra * rt, sb += rb * rt;
          if (s == 0 && rest / calls < amin) amin = rest / calls;
        }
        if (st == DTL_OK && t < tmin) tmin = t;
      }
      dtl_plan_destroy(plan);
      dtl_layout_destroy(src);
      dtl_layout_destroy(dst);
    }
  dtl_mesh_destroy(m);
  DTL_TRY(st);
  double det = saa * sbb - sab * sab, al = 0, be = 0;
  if (det > 0) {
    al = (sa * sbb - sb * sab) / det;
    be = (saa * sb - sab * sa) / det;
  }
  /* A fit that makes one term negative (noise on a loaded machine) keeps alpha from the smallest calls and fits
   * beta alone; with no link at all, alpha is the smallest call. */
  if (!(al > 0) || !(be > 0)) {
    al = isfinite(amin) ? amin : isfinite(tmin) ? tmin : 1e-6;
    be = sbb > 0 ? (sb - al * sab) / sbb : 0;
  }
  if (!(be > 0) || !isfinite(be)) be = local_beta;
  *alpha = al;
  *beta = be;
  return DTL_OK;
}

/* Positive doubles order like their bits, so the maximum over the ranks goes through the integer all-reduce. */
static dtl_status dtl__calib_max(dtl_comm *c, double *v, int n) {
  int64_t b[8];
  for (int i = 0; i < n; i++) memcpy(&b[i], &v[i], sizeof b[i]);
  DTL_TRY(dtl__comm_max_i64(c, b, n));
  for (int i = 0; i < n; i++) memcpy(&v[i], &b[i], sizeof v[i]);
  return DTL_OK;
}

static dtl_status dtl__calib_run(dtl_comm *c, void *a, void *b, dtl_cost_model *m) {
  double lb, v[4];
  dtl__calib_arg cp = {NULL, a, b, dtl__calib_bytes[DTL__CALIB_SIZES - 1]};
  DTL_TRY(dtl__calib_time(c, dtl__calib_copy_fn, &cp, &lb));
  lb /= (double)cp.bytes;
  if (!(lb > 0)) lb = 1e-12;
  /* The classes: every rank with the ranks of its node (intra), the first rank of each node with the others
   * (inter). One node: c itself is the intra group and the inter class takes its figures. */
  bool one_node = true;
  for (int r = 1; r < c->size; r++) one_node &= dtl__calib_same_node(c, 0, r);
  if (one_node) {
    DTL_TRY(dtl__calib_link(c, a, b, lb, &v[0], &v[1]));
    v[2] = v[0], v[3] = v[1];
  } else {
    dtl_comm *node = NULL, *leaders = NULL;
    int lead = dtl__calib_node_leader(c, c->rank);
    v[0] = v[1] = v[2] = v[3] = 0; /* each class's figure comes from its ranks, the maximum below spreads it */
    dtl_status st = dtl_comm_split(c, lead, c->rank, &node);
    if (st == DTL_OK) st = dtl__calib_link(node, a, b, lb, &v[0], &v[1]);
    if (st == DTL_OK) st = dtl_comm_split(c, lead == c->rank ? 0 : 1, c->rank, &leaders);
    if (st == DTL_OK && lead == c->rank) st = dtl__calib_link(leaders, a, b, lb, &v[2], &v[3]);
    dtl_comm_destroy(node);
    dtl_comm_destroy(leaders);
    DTL_TRY(st);
  }
  DTL_TRY(dtl__calib_max(c, v, 4));
  m->mask = DTL__COST_ALL;
  m->flags = 0;
  m->alpha_s = v[0], m->beta_s_per_byte = v[1], m->local_beta_s_per_byte = lb;
  m->inter_alpha_s = v[2], m->inter_beta_s_per_byte = v[3];
  return DTL_OK;
}

/* Every rank reaches here and learns every rank's verdict, so a bad argument on one rank fails all. */
dtl_status dtl_cost_model_calibrate(const dtl_mesh *mesh, dtl_cost_model *out) {
  static const char fn[] = "dtl_cost_model_calibrate";
  DTL_CHECK_ARG(mesh != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(mesh->parent != NULL, fn, "mesh is abstract (no communicator: calibrate on a mesh of dtl_mesh_create)");
  DTL_CHECK_ARG(mesh->member && mesh->comm, fn, "this rank is not in the mesh (only the mesh's ranks calibrate)");
  dtl_comm *c = mesh->comm;
  int64_t side = dtl__calib_side(dtl__calib_bytes[DTL__CALIB_SIZES - 1], c->size);
  size_t bytes = (size_t)(side * side) * 4;
  void *a = NULL, *b = NULL;
  dtl_status st = out ? DTL_OK : dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "out=NULL");
  if (st == DTL_OK) st = dtl__mem_alloc(&c->mem, bytes, &a);
  if (st == DTL_OK) st = dtl__mem_alloc(&c->mem, bytes, &b);
  if (st == DTL_OK) st = dtl__mem_set(&c->mem, a, 0, bytes);
  int64_t v[1] = {st == DTL_OK ? 0 : 1 + (int64_t)st};
  dtl_status ag = dtl__comm_max_i64(c, v, 1);
  dtl_cost_model m;
  if (st == DTL_OK && ag != DTL_OK) st = ag;
  else if (st == DTL_OK && v[0])
    st = dtl__error_fn((dtl_status)(v[0] - 1), fn, "another rank failed (%s; its dtl_last_error says why)",
                       dtl_status_name((dtl_status)(v[0] - 1)));
  if (st == DTL_OK) st = dtl__calib_run(c, a, b, &m);
  /* Every rank computed the fit from the same maxima; rank 0's bits go to all so that every plan is the same. */
  if (st == DTL_OK) {
    double w[5] = {m.alpha_s, m.beta_s_per_byte, m.local_beta_s_per_byte, m.inter_alpha_s, m.inter_beta_s_per_byte};
    if (c->rank != 0) memset(w, 0, sizeof w);
    st = dtl__calib_max(c, w, 5);
    m.alpha_s = w[0], m.beta_s_per_byte = w[1], m.local_beta_s_per_byte = w[2];
    m.inter_alpha_s = w[3], m.inter_beta_s_per_byte = w[4];
  }
  if (a) dtl__mem_free(&c->mem, a);
  if (b) dtl__mem_free(&c->mem, b);
  if (st == DTL_OK) *out = m;
  return st;
}

dtl_status dtl_cost_model_save(const char *path, const dtl_mesh *mesh, const dtl_cost_model *model) {
  static const char fn[] = "dtl_cost_model_save";
  DTL_CHECK_ARG(path != NULL && path[0], fn, "path=%s (expected a file name)", path ? "\"\"" : "NULL");
  DTL_CHECK_ARG(mesh != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(model != NULL, fn, "model=NULL");
  DTL_CHECK_ARG(mesh->parent != NULL, fn, "mesh is abstract (a profile names the engine and ranks of a communicator)");
  /* The model as a plan on this mesh would resolve it with model as the override: every field present. */
  dtl_cost_model full;
  DTL_TRY(dtl__cost_resolve(fn, mesh, model, &full));
  char cost[320];
  if (dtl__cost_render(&full, cost, sizeof cost) >= sizeof cost)
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "the cost line does not fit %zu bytes", sizeof cost);
  const dtl_comm *c = mesh->parent;
  char comment[96];
  snprintf(comment, sizeof comment, "recorded by dtl_cost_model_save on %d ranks of %s", c->size,
           dtl_comm_backend_name(c));
  return dtl__profile_write(path, fn, dtl_comm_backend_name(c), c->size, cost, dtl__mpi_table(c), comment);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Plans as values: the EXPLAIN text, the accessors and destruction. Explain reads only the plan, so the
 * same plan always prints the same text. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "redistribute/plan_internal.h"

/* Header, model line, one line per step and the total: far below this for DTL__MAX_PLAN_STEPS steps. */
#define DTL__EXPLAIN_MAX 8192

static void dtl__say(char *b, size_t *o, const char *fmt, ...) DTL__PRINTF(3, 4);
static void dtl__say(char *b, size_t *o, const char *fmt, ...) {
  if (*o >= DTL__EXPLAIN_MAX) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b + *o, DTL__EXPLAIN_MAX - *o, fmt, ap);
  va_end(ap);
  if (n > 0) *o += (size_t)n;
}

const char *dtl__plan_step_name(dtl__step_kind k) {
  switch (k) {
    case DTL__STEP_ALL_GATHER: return "all-gather";
    case DTL__STEP_ALL_REDUCE: return "all-reduce";
    case DTL__STEP_REDUCE_SCATTER: return "reduce-scatter";
    case DTL__STEP_ALL_TO_ALL: return "all-to-all";
    case DTL__STEP_LOCAL_SLICE: return "local slice";
    case DTL__STEP_LOCAL_PARTIAL: return "local partial";
    case DTL__STEP_EXCHANGE: return "exchange";
    case DTL__STEP_LOCAL_EMBED: return "local embed";
  }
  return "?";
}

static bool dtl__step_communicates(const dtl__plan_step *s) {
  dtl__step_kind k = s->kind;
  return k == DTL__STEP_ALL_GATHER || k == DTL__STEP_ALL_REDUCE || k == DTL__STEP_REDUCE_SCATTER ||
         k == DTL__STEP_ALL_TO_ALL || (k == DTL__STEP_EXCHANGE && s->peers > 0);
}

void dtl__plan_bytes_text(uint64_t b, char *buf, size_t cap) {
  static const char *unit[] = {"KiB", "MiB", "GiB", "TiB"};
  if (b < 1024) {
    snprintf(buf, cap, "%llu B", (unsigned long long)b);
    return;
  }
  double v = (double)b / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) v /= 1024, u++;
  snprintf(buf, cap, "%.1f %s", v, unit[u]);
}

void dtl__plan_time_text(double s, char *buf, size_t cap) {
  if (s == 0) snprintf(buf, cap, "0 s");
  else if (s < 1e-6) snprintf(buf, cap, "%.1f ns", s * 1e9);
  else if (s < 1e-3) snprintf(buf, cap, "%.1f us", s * 1e6);
  else if (s < 1) snprintf(buf, cap, "%.1f ms", s * 1e3);
  else snprintf(buf, cap, "%.2f s", s);
}

static void dtl__say_placements(char *b, size_t *o, const dtl_placement *p, int n) {
  char t[DTL_MAX_MESH_DIMS * 16];
  if (dtl_placements_format(p, n, t, sizeof t) != DTL_OK) snprintf(t, sizeof t, "?");
  dtl__say(b, o, "%s", t);
}

/* Renders p into b (DTL__EXPLAIN_MAX bytes); returns the length. */
static void dtl__say_mesh(char *b, size_t *o, const dtl_mesh *m) {
  for (int d = 0; d < m->ndim; d++) dtl__say(b, o, d ? "x%d" : "%d", m->shape[d]);
}

static void dtl__say_coord(char *b, size_t *o, const dtl_mesh *m) {
  if (!m->member) {
    dtl__say(b, o, "outside");
    return;
  }
  dtl__say(b, o, "[");
  for (int d = 0; d < m->ndim; d++) dtl__say(b, o, d ? ",%d" : "%d", m->coord[d]);
  dtl__say(b, o, "]");
}

/* Whether the plan's ranks span several nodes: a mesh dim crosses nodes, or the two meshes' first ranks sit on
 * different nodes (each mesh's ranks share one node when none of its dims crosses). */
static bool dtl__plan_spans_nodes(const dtl_plan *p) {
  const dtl_mesh *a = p->src.mesh, *z = p->dst.mesh;
  bool any = dtl__mesh_node(a, 0) != dtl__mesh_node(z, 0);
  for (int d = 0; d < a->ndim; d++) any |= a->dim_inter[d];
  for (int d = 0; d < z->ndim; d++) any |= z->dim_inter[d];
  return any;
}

/* A step's link class and the bytes it sends across nodes, when the plan spans nodes ("" otherwise). */
static void dtl__link_text(const dtl__plan_step *st, bool nodes, char *buf, size_t cap) {
  char x[24];
  buf[0] = '\0';
  if (!nodes) return;
  dtl__plan_bytes_text(st->remote_bytes, x, sizeof x);
  snprintf(buf, cap, "link %-5s  xnode %-10s  ", st->inter ? "inter" : "intra", x);
}

/* Renders p into b (DTL__EXPLAIN_MAX bytes); returns the length. */
static size_t dtl__explain_render(const dtl_plan *p, char *b) {
  size_t o = 0;
  const dtl_mesh *mesh = p->src.mesh, *dmesh = p->dst.mesh;
  int M = mesh->ndim;
  bool cross = mesh != dmesh, nodes = dtl__plan_spans_nodes(p);
  dtl__say(b, &o, "plan ");
  dtl__say_placements(b, &o, p->src.placements, M);
  dtl__say(b, &o, " -> ");
  dtl__say_placements(b, &o, p->dst.placements, dmesh->ndim);
  dtl__say(b, &o, "  mesh ");
  dtl__say_mesh(b, &o, mesh);
  if (cross) {
    dtl__say(b, &o, " -> mesh ");
    dtl__say_mesh(b, &o, dmesh);
  }
  dtl__say(b, &o, "  shape [");
  for (int d = 0; d < p->src.ndim; d++) dtl__say(b, &o, d ? ",%lld" : "%lld", (long long)p->src.shape[d]);
  dtl__say(b, &o, "] %s  (coordinate ", dtl_dtype_name(p->src.dtype));
  dtl__say_coord(b, &o, mesh);
  if (cross) {
    dtl__say(b, &o, " -> ");
    dtl__say_coord(b, &o, dmesh);
  }
  dtl__say(b, &o, ")\n");
  dtl__say(b, &o, "cost model  alpha %g s  beta %g s/B  local_beta %g s/B", p->cost.alpha_s, p->cost.beta_s_per_byte,
           p->cost.local_beta_s_per_byte);
  if (nodes) dtl__say(b, &o, "  inter_alpha %g s  inter_beta %g s/B", p->cost.inter_alpha_s, p->cost.inter_beta_s_per_byte);
  dtl__say(b, &o, "\n");
  for (int k = 0; k < p->nsteps; k++) {
    const dtl__plan_step *st = &p->steps[k];
    int m = st->mesh_dim;
    char tr[40], dims[32], snd[24], rcv[24], est[24], link[48];
    char from[16], to[16];
    dtl__link_text(st, nodes, link, sizeof link);
    dtl__plan_bytes_text(st->send_bytes, snd, sizeof snd);
    dtl__plan_bytes_text(st->recv_bytes, rcv, sizeof rcv);
    dtl__plan_time_text(st->cost_s, est, sizeof est);
    if (st->kind == DTL__STEP_EXCHANGE) {
      char a[DTL_MAX_MESH_DIMS * 16], z[DTL_MAX_MESH_DIMS * 16], rounds[32] = "";
      if (dtl_placements_format(st->before, M, a, sizeof a) != DTL_OK) snprintf(a, sizeof a, "?");
      if (dtl_placements_format(st->after, dmesh->ndim, z, sizeof z) != DTL_OK) snprintf(z, sizeof z, "?");
      if (p->xrounds > 1) snprintf(rounds, sizeof rounds, "  in %d rounds", p->xrounds);
      if (st->peers == 0) snprintf(rounds, sizeof rounds, "  (local copies only)");
      dtl__say(b, &o, "step %-2d %-11s %-15s %s->%s  send %-10s  recv %-10s  %sest %s%s\n", k + 1,
               cross ? "two meshes" : "mesh dims *", dtl__plan_step_name(st->kind), a, z, snd, rcv, link, est, rounds);
      continue;
    }
    if (dtl_placements_format(&st->before[m], 1, from, sizeof from) != DTL_OK) snprintf(from, sizeof from, "?");
    if (dtl_placements_format(&st->after[m], 1, to, sizeof to) != DTL_OK) snprintf(to, sizeof to, "?");
    snprintf(tr, sizeof tr, "%s->%s", from, to);
    dtl_placement a = st->before[m], z = st->after[m];
    if (a.kind == DTL_SHARD && z.kind == DTL_SHARD) snprintf(dims, sizeof dims, "tensor dims %d->%d", a.dim, z.dim);
    else if (a.kind == DTL_SHARD) snprintf(dims, sizeof dims, "tensor dim %d", a.dim);
    else if (z.kind == DTL_SHARD) snprintf(dims, sizeof dims, "tensor dim %d", z.dim);
    else snprintf(dims, sizeof dims, "whole shard");
    dtl__say(b, &o, "step %-2d mesh dim %d  %-15s %-11s %-17s send %-10s  recv %-10s  %sest %s\n", k + 1, m,
             dtl__plan_step_name(st->kind), tr, dims, snd, rcv, link, est);
  }
  if (p->nsteps == 0) dtl__say(b, &o, "(no steps: every rank already holds its target shard)\n");
  int nc = dtl_plan_num_collectives(p);
  char est[24], scratch[24];
  dtl__plan_time_text(p->total_cost_s, est, sizeof est);
  dtl__plan_bytes_text(p->scratch_bytes, scratch, sizeof scratch);
  dtl__say(b, &o, "total  %d step%s, %d collective%s, est %s, scratch %s\n", p->nsteps, p->nsteps == 1 ? "" : "s", nc,
           nc == 1 ? "" : "s", est, scratch);
  if (p->unbounded_scratch) { /* the scratch bound turned the cheapest route down: what it cost, how to lift it */
    char ub[24], more[24], need[24];
    dtl__plan_time_text(p->unbounded_cost_s, ub, sizeof ub);
    dtl__plan_time_text(p->total_cost_s - p->unbounded_cost_s, more, sizeof more);
    dtl__plan_bytes_text(p->unbounded_scratch, need, sizeof need);
    int extra = nc - p->unbounded_collectives;
    char calls[32] = "";
    if (extra > 0) snprintf(calls, sizeof calls, "%d collective%s and ", extra, extra == 1 ? "" : "s");
    dtl__say(b, &o, "scratch bound  the cheapest route (%d collective%s, est %s) needs %s of scratch on some rank, more "
             "than the larger of its local source and target: this plan costs %s%s more; "
             "dtl_plan_create_with_limit(src, dst, %zu) returns that route\n",
             p->unbounded_collectives, p->unbounded_collectives == 1 ? "" : "s", ub, need, calls, more,
             p->unbounded_scratch);
  }
  return o < DTL__EXPLAIN_MAX ? o : DTL__EXPLAIN_MAX - 1;
}

size_t dtl_plan_explain_needed(const dtl_plan *p) {
  if (!p) return 0;
  char *b = dtl__malloc(DTL__EXPLAIN_MAX);
  if (!b) return 0;
  size_t n = dtl__explain_render(p, b) + 1;
  dtl__free(b);
  return n;
}

dtl_status dtl_plan_explain(const dtl_plan *p, char *buf, size_t cap) {
  static const char fn[] = "dtl_plan_explain";
  DTL_CHECK_ARG(p != NULL, fn, "plan=NULL");
  DTL_CHECK_ARG(buf != NULL, fn, "buf=NULL");
  char *b = dtl__malloc(DTL__EXPLAIN_MAX);
  if (!b) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  size_t n = dtl__explain_render(p, b);
  dtl_status st = DTL_OK;
  if (n + 1 > cap) st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "cap=%zu is too small (%zu bytes needed)", cap, n + 1);
  else memcpy(buf, b, n + 1);
  dtl__free(b);
  return st;
}

int dtl_plan_num_steps(const dtl_plan *p) { return p ? p->nsteps : -1; }

int dtl_plan_num_collectives(const dtl_plan *p) {
  if (!p) return -1;
  int n = 0;
  for (int k = 0; k < p->nsteps; k++) n += dtl__step_communicates(&p->steps[k]);
  return n;
}

double dtl_plan_cost(const dtl_plan *p) { return p ? p->total_cost_s : -1.0; }

size_t dtl_plan_scratch_bytes(const dtl_plan *p) { return p ? p->scratch_bytes : 0; }

dtl_status dtl_plan_bytes(const dtl_plan *p, uint64_t *sent, uint64_t *received) {
  static const char fn[] = "dtl_plan_bytes";
  DTL_CHECK_ARG(p != NULL, fn, "plan=NULL");
  DTL_CHECK_ARG(sent != NULL, fn, "sent=NULL");
  DTL_CHECK_ARG(received != NULL, fn, "received=NULL");
  uint64_t s = 0, r = 0;
  for (int k = 0; k < p->nsteps; k++) {
    s += p->steps[k].send_bytes;
    r += p->steps[k].recv_bytes;
  }
  *sent = s;
  *received = r;
  return DTL_OK;
}

void dtl_plan_destroy(dtl_plan *p) {
  dtl__plan_release(p);
  dtl__free(p);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The driver: dtl_plan_execute and its workspace form. It checks the call's buffers, picks the compiled
 * placement for them (distinct, or the same pointer for a purely local plan), and walks the compiled steps,
 * each on the communicator of its mesh dim. Everything else was derived when the plan was created
 * (compile.c), so a call reads no environment and allocates nothing: scratch comes from the caller's
 * workspace or from the plan's own, which its first execution allocates in the mesh communicator's memory
 * (lazily, so that plans that are only explained, cached or run with a caller's workspace never hold any). */
#include <stdlib.h>
#include <string.h>
#include "redistribute/executor_internal.h"

void dtl__plan_release(dtl_plan *p) {
  if (!p || !p->exec) return;
  if (p->exec->own) dtl__mem_free(&p->exec->own_mem, p->exec->own);
  dtl__free(p->exec->req);
  dtl__free(p->exec);
  p->exec = NULL;
}

size_t dtl_plan_workspace_bytes(const dtl_plan *p) { return p && p->exec ? p->exec->ws_bytes : 0; }

/* The plan's own workspace, at least bytes long: grown only when a call needs more than any before it (the
 * first call, and at most once more for a purely local plan first run on distinct buffers, then in place). */
static dtl_status dtl__own_workspace(const char *fn, struct dtl__plan_exec *x, const dtl__mem *mem, size_t bytes,
                                     void **ws) {
  if (bytes > x->own_bytes) {
    void *q = NULL;
    dtl_status st = dtl__mem_alloc(mem, bytes, &q);
    if (st != DTL_OK) return dtl__error_prefix(st, "%s: the plan's workspace of %zu bytes", fn, bytes);
    if (x->own) dtl__mem_free(&x->own_mem, x->own);
    x->own = q;
    x->own_bytes = bytes;
    x->own_mem = *mem;
  }
  *ws = x->own;
  return DTL_OK;
}

/* The checks of one call that depend on this rank's buffers, and its workspace (the plan's own, grown when
 * own, or the caller's ws of ws_bytes): *L gets the placement for the buffers, *ws the scratch. */
static dtl_status dtl__run_args(const char *fn, const dtl_plan *p, const void *src_local, void *dst_local, bool own,
                                void **ws, size_t ws_bytes, const dtl__ex_layout **L) {
  struct dtl__plan_exec *x = p->exec;
  size_t es = dtl_dtype_size(p->src.dtype), a0 = p->src.local_count, d0 = p->dst.local_count;
  DTL_CHECK_ARG(src_local == NULL || p->src.mesh->member, fn, "src_local=%p but this rank is not in the source mesh "
                "(a rank passes NULL for the side it does not hold)", src_local);
  DTL_CHECK_ARG(dst_local == NULL || p->dst.mesh->member, fn, "dst_local=%p but this rank is not in the target mesh "
                "(a rank passes NULL for the side it does not hold)", (void *)dst_local);
  DTL_CHECK_ARG(src_local != NULL || a0 == 0, fn, "src_local=NULL with %zu local elements", a0);
  DTL_CHECK_ARG(dst_local != NULL || d0 == 0, fn, "dst_local=NULL with %zu local elements", d0);
  /* The same pointer counts as aliased even where this rank's shards are empty, so that every rank of a
   * caller that passes one buffer decides alike. */
  bool aliased = src_local != NULL && src_local == dst_local;
  if (!aliased && src_local && dst_local && a0 && d0) {
    const char *s0 = src_local, *d = dst_local;
    aliased = s0 < d + d0 * es && d < s0 + a0 * es;
  }
  if (aliased && (src_local != dst_local || x->comm_steps > 0))
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "src_local=%p and dst_local=%p overlap, which only a purely "
                         "local plan allows when they are the same pointer (this plan has %d collective steps)",
                         src_local, dst_local, x->comm_steps);
  *L = &x->place[aliased];
  size_t need = (*L)->scr * es;
  if (own) return dtl__own_workspace(fn, x, dtl__mesh_mem(p->src.mesh), need, ws);
  if (ws_bytes < need)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "ws_bytes=%zu is too small: this call needs %zu bytes "
                         "(dtl_plan_workspace_bytes gives %zu, enough for every call of the plan)", ws_bytes, need,
                         x->ws_bytes);
  DTL_CHECK_ARG(*ws != NULL || need == 0, fn, "ws=NULL but this call needs %zu bytes of workspace", need);
  return DTL_OK;
}

/* The communicator plan p's agreement and exchange run on: the mesh's, or between two meshes their parent; NULL on
 * a rank outside every mesh of the plan. */
static dtl_comm *dtl__plan_comm(const dtl_plan *p) {
  const dtl_mesh *sm = p->src.mesh, *dm = p->dst.mesh;
  if (sm != dm) return sm->member || dm->member ? sm->parent : NULL;
  return sm->comm;
}

/* Where step k keeps its temporary (NULL: none): after the data region of its place. */
static void *dtl__step_tmp(const dtl__ex_layout *L, int k, const dtl__ex_step *e, void *const *base, size_t es) {
  int in = L->in[k], out = L->out[k], tmp = L->tmp[k];
  if (tmp == AT_NONE) return NULL;
  size_t data = 0;
  if (in == tmp) data = e->a;
  if (out == tmp && e->b > data) data = e->b;
  return dtl__at(base[tmp], data, es);
}

/* Runs steps [0, n) of p in placement L over the buffers in base; pc is the plan's communicator (the exchange's). */
static dtl_status dtl__run_steps(const char *fn, const dtl_plan *p, const dtl__ex_layout *L, const dtl__ex_ctx *ctx,
                                 void *const *base, dtl_comm *pc, int n) {
  const struct dtl__plan_exec *x = p->exec;
  size_t es = ctx->es;
  for (int k = 0; k < n; k++) {
    const dtl__ex_step *e = &x->ex[k];
    if (e->op == EX_NONE) continue;
    int in = L->in[k], out = L->out[k];
    void *tp = dtl__step_tmp(L, k, e, base, es);
    dtl_comm *c = e->op == EX_EXCHANGE ? pc : p->src.mesh->dim_comm[e->m];
    dtl_status st;
    if (L->staged[k]) {
      char *staging = dtl__at(tp, e->t, es);
      st = dtl__ex_run_step(ctx, e, c, base[in], staging, e->t ? tp : NULL);
      if (st == DTL_OK && e->b) st = dtl__mem_copy(&c->mem, base[out], staging, e->b * es);
    } else {
      st = dtl__ex_run_step(ctx, e, c, base[in], base[out], tp);
    }
    if (st != DTL_OK) {
      if (e->op == EX_EXCHANGE) return dtl__error_prefix(st, "%s: step %d (exchange)", fn, k);
      return dtl__error_prefix(st, "%s: step %d (%s on mesh dim %d)", fn, k, dtl__plan_step_name(p->steps[k].kind),
                               p->steps[k].mesh_dim);
    }
  }
  return DTL_OK;
}

/* dtl__plan_run, with the DTL_CHECK agreement or (a nonblocking start, which never waits for its peers) without. */
static dtl_status dtl__plan_exec_steps(const char *fn, const dtl_plan *p, const void *src_local, void *dst_local,
                                       bool own, void *ws, size_t ws_bytes, bool agree) {
  DTL_CHECK_ARG(p != NULL, fn, "plan=NULL");
  const dtl_mesh *mesh = p->src.mesh;
  DTL_CHECK_ARG(mesh != NULL && p->dst.mesh != NULL, fn, "the plan has no meshes");
  DTL_CHECK_ARG(mesh->parent != NULL, fn, "the plan's mesh is abstract (dtl_mesh_create_abstract): it has no "
                "communicators, so its plans can be explained but not executed");
  struct dtl__plan_exec *x = p->exec;
  if (!x) return dtl__error_fn(DTL_ERR_INTERNAL, fn, "the plan was never compiled (plans come from dtl_plan_create)");
  dtl_comm *pc = dtl__plan_comm(p);
  if (!pc) { /* in neither mesh: no part to play, and no peer waits for this rank */
    DTL_CHECK_ARG(src_local == NULL && dst_local == NULL, fn, "src_local=%p, dst_local=%p but this rank is in neither "
                  "mesh of the plan (pass NULL for both)", src_local, dst_local);
    return DTL_OK;
  }
  if (pc->aborted) return dtl__error_fn(DTL_ERR_COMM, fn, "the mesh's communicator was aborted");
  const dtl__ex_layout *L = NULL;
  dtl_status st = dtl__run_args(fn, p, src_local, dst_local, own, &ws, ws_bytes, &L);
  /* Every check and allocation is behind us: with DTL_CHECK the ranks agree here, before the first step. */
  if (agree) st = dtl__plan_agree(fn, p, st);
  if (st != DTL_OK) return st;
  size_t es = dtl_dtype_size(p->src.dtype), d0 = p->dst.local_count, *counts = x->counts;
  int g = x->gmax;
  dtl__ex_ctx ctx = {p->src.ndim, es, p->src.dtype, counts, counts + g, counts + 2 * g, counts + 3 * g, counts + 4 * g};
  void *base[AT_NPLACES] = {(void *)(uintptr_t)src_local, dst_local, ws};
  DTL_TRY(dtl__run_steps(fn, p, L, &ctx, base, pc, p->nsteps));
  if (L->final_at != AT_DST && d0) DTL_TRY(dtl__mem_copy(dtl__mesh_mem(p->dst.mesh), dst_local, base[L->final_at], d0 * es));
  return DTL_OK;
}

dtl_status dtl__plan_run(const char *fn, const dtl_plan *p, const void *src_local, void *dst_local, bool own,
                         void *ws, size_t ws_bytes) {
  return dtl__plan_exec_steps(fn, p, src_local, dst_local, own, ws, ws_bytes, true);
}

dtl_status dtl_plan_execute(const dtl_plan *p, const void *src_local, void *dst_local) {
  return dtl__plan_run("dtl_plan_execute", p, src_local, dst_local, true, NULL, 0);
}

dtl_status dtl_plan_execute_with_workspace(const dtl_plan *p, const void *src_local, void *dst_local, void *ws,
                                           size_t ws_bytes) {
  return dtl__plan_run("dtl_plan_execute_with_workspace", p, src_local, dst_local, false, ws, ws_bytes);
}

/* --- nonblocking execution ------------------------------------------------------------------------------------ */

/* A plan's one nonblocking execution: the local steps before its communicating step k ran at the start, which also
 * started k; an exchange then runs round by round (each round started by the previous one's completion, in dtl_test
 * or dtl_wait); after k completes, the local steps after it and the final copy run. */
struct dtl__plan_request {
  struct dtl_request base;
  const dtl_plan *plan;
  const dtl__ex_layout *L;
  dtl__ex_ctx ctx;
  void *buf[AT_NPLACES]; /* src, dst, workspace */
  int k;                 /* the communicating step (nsteps: none) */
  void *in, *out, *tmp;  /* its buffers (out: the staging region when it is staged) */
  int round;             /* an exchange's round in flight (xrounds: all done) */
  dtl_request *inner;    /* the transport's request in flight (NULL: none) */
  bool busy, done;
  dtl_status st;
};

/* The transport's nonblocking form of collective step e (in, out), started into *req; false when there is none (req
 * NULL: only says whether there is). */
static bool dtl__collective_async(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, const void *in, void *out,
                                  dtl_request **req, dtl_status *st) {
  const dtl__comm_ops *o = c->ops;
  switch (e->op) {
    case EX_ALL_REDUCE:
      if (!o->all_reduce_async) return false;
      if (req) *st = e->a ? o->all_reduce_async(c, in, out, e->a, x->t, e->rop, req) : DTL_OK;
      return true;
    case EX_GATHER: {
      if (e->unpack || !o->all_gather_async || !o->all_gatherv_async) return false;
      if (!req) return true;
      const size_t *n = e->peers[0].count;
      bool even = true;
      for (int k = 1; k < c->size; k++) even &= n[k] == n[0];
      *st = e->total == 0 ? DTL_OK : even ? o->all_gather_async(c, in, out, e->a, x->t, req)
                                          : o->all_gatherv_async(c, in, e->a, out, n, x->t, req);
      return true;
    }
    case EX_REDUCE_SCATTER: {
      if (e->pack || !o->reduce_scatter_async) return false;
      const size_t *n = e->peers[1].count;
      for (int k = 1; k < e->g; k++)
        if (n[k] != n[0]) return false; /* uneven: no nonblocking reduce-scatter-v */
      if (req) *st = e->a ? o->reduce_scatter_async(c, in, out, n[0], x->t, e->rop, req) : DTL_OK;
      return true;
    }
    case EX_ALL_TO_ALL: {
      if (e->pack || e->unpack || e->crows || e->scattered || !o->all_to_all_async || !o->all_to_allv_async) return false;
      if (!req) return true;
      int64_t is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS], ps[DTL_MAX_TENSOR_DIMS], po[DTL_MAX_TENSOR_DIMS];
      for (int k = 0; k < c->size; k++) { /* what goes to and comes from each peer: its box within the other side */
        dtl__ex_peer_box(e, x->nd, 1, k, ps, po);
        x->cnt_a[k] = dtl__ex_intersect(x->nd, e->in_shape, e->in_off, ps, po, is, io) ? dtl__box_count(x->nd, is) : 0;
        dtl__ex_peer_box(e, x->nd, 0, k, ps, po);
        x->cnt_b[k] = dtl__ex_intersect(x->nd, ps, po, e->out_shape, e->out_off, is, io) ? dtl__box_count(x->nd, is) : 0;
      }
      *st = e->total == 0 ? DTL_OK : e->even ? o->all_to_all_async(c, in, out, x->cnt_a[0], x->t, req)
                                             : o->all_to_allv_async(c, in, x->cnt_a, out, x->cnt_b, x->t, req);
      return true;
    }
    default: return false;
  }
}

/* The steps after the communicating one: its staging copy, the local steps, the final copy into dst. */
static dtl_status dtl__req_tail(struct dtl__plan_request *r) {
  const dtl_plan *p = r->plan;
  const struct dtl__plan_exec *x = p->exec;
  size_t es = r->ctx.es, d0 = p->dst.local_count;
  int k = r->k;
  if (k < p->nsteps) {
    const dtl__ex_step *e = &x->ex[k];
    if (e->op == EX_EXCHANGE) DTL_TRY(dtl__xchg_end(&r->ctx, e, r->base.comm, r->in, r->out));
    if (r->L->staged[k] && e->b) DTL_TRY(dtl__mem_copy(&r->base.comm->mem, r->buf[r->L->out[k]], r->out, e->b * es));
    for (int j = k + 1; j < p->nsteps; j++) { /* local: no communicator is used but for its memory */
      const dtl__ex_step *f = &x->ex[j];
      if (f->op == EX_NONE) continue;
      void *tp = dtl__step_tmp(r->L, j, f, r->buf, es);
      void *out = r->L->staged[j] ? dtl__at(tp, f->t, es) : r->buf[r->L->out[j]];
      DTL_TRY(dtl__ex_run_step(&r->ctx, f, r->base.comm, r->buf[r->L->in[j]], out, tp));
      if (r->L->staged[j] && f->b) DTL_TRY(dtl__mem_copy(&r->base.comm->mem, r->buf[r->L->out[j]], out, f->b * es));
    }
  }
  if (r->L->final_at != AT_DST && d0)
    DTL_TRY(dtl__mem_copy(dtl__mesh_mem(p->dst.mesh), r->buf[AT_DST], r->buf[r->L->final_at], d0 * es));
  return DTL_OK;
}

static dtl_status dtl__inner_wait(dtl_request *in) { return in->wait ? in->wait(in) : in->comm->ops->wait(in); }

/* Moves the execution on: when wait, until it is complete; else as far as it can without blocking. */
static dtl_status dtl__req_advance(struct dtl__plan_request *r, bool wait) {
  const dtl_plan *p = r->plan;
  const dtl__ex_step *e = r->k < p->nsteps ? &p->exec->ex[r->k] : NULL;
  bool exchange = e && e->op == EX_EXCHANGE;
  int rounds = exchange ? e->x->xrounds : 0;
  while (!r->done && r->st == DTL_OK) {
    if (r->inner) {
      if (!wait) {
        bool ok = false;
        dtl_request *in = r->inner;
        r->st = in->test ? in->test(in, &ok) : in->comm->ops->test(in, &ok);
        if (r->st != DTL_OK || !ok) return r->st;
      }
      dtl_request *in = r->inner;
      r->inner = NULL;
      r->st = dtl__inner_wait(in);
      if (r->st != DTL_OK || !exchange) continue;
      r->st = dtl__xchg_round_done(&r->ctx, e, r->base.comm, r->round, r->out, r->tmp);
      r->round++;
      continue;
    }
    if (r->round < rounds) {
      r->st = dtl__xchg_round(&r->ctx, e, r->base.comm, r->round, r->in, r->out, r->tmp, &r->inner);
      if (r->st == DTL_OK && !r->inner) r->round++; /* this rank moved nothing in the round: already placed */
      continue;
    }
    r->st = dtl__req_tail(r);
    r->done = true;
  }
  return r->st;
}

static dtl_status dtl__req_test(dtl_request *req, bool *done) {
  struct dtl__plan_request *r = (struct dtl__plan_request *)req;
  dtl_status st = dtl__req_advance(r, false);
  *done = r->done || st != DTL_OK;
  return st;
}

static dtl_status dtl__req_wait(dtl_request *req) {
  struct dtl__plan_request *r = (struct dtl__plan_request *)req;
  dtl_status st = dtl__req_advance(r, true);
  if (r->inner) { /* a failure left a transfer in flight: complete it before its buffers go back to the caller */
    dtl_request *in = r->inner;
    r->inner = NULL;
    (void)dtl__inner_wait(in);
  }
  r->busy = false;
  return st == DTL_OK ? DTL_OK : dtl__error_prefix(st, "dtl_wait (dtl_plan_execute_async)");
}

/* The one communicating step of p (p->nsteps: none), or -1 with *why set when p cannot run nonblocking on MPI. The
 * rule reads the plan's steps only, so that every rank of both meshes decides alike (a rank outside the mesh of a
 * step has nothing to run there): at most one step may communicate, and it must be an exchange, an all-reduce, or an
 * all-gather of a tensor dim with no dim of extent > 1 before it (its blocks land in place on every rank). */
static int dtl__async_step(const dtl_plan *p, char *why, size_t cap) {
  const dtl_mesh *m = p->src.mesh;
  int found = p->nsteps;
  for (int k = 0; k < p->nsteps; k++) {
    const dtl__plan_step *st = &p->steps[k];
    bool comm = st->kind == DTL__STEP_EXCHANGE ||
                (st->kind != DTL__STEP_LOCAL_SLICE && st->kind != DTL__STEP_LOCAL_PARTIAL && m->shape[st->mesh_dim] > 1);
    if (!comm) continue;
    if (found < p->nsteps) {
      snprintf(why, cap, "plan steps %d and %d both communicate; a nonblocking execution runs one communicating step "
               "(an exchange, an all-reduce or an all-gather of the outermost dim)", found + 1, k + 1);
      return -1;
    }
    found = k;
    bool ok = st->kind == DTL__STEP_EXCHANGE || st->kind == DTL__STEP_ALL_REDUCE;
    if (st->kind == DTL__STEP_ALL_GATHER) {
      ok = true;
      for (int d = 0; d < st->before[st->mesh_dim].dim; d++) ok &= p->src.shape[d] <= 1;
    }
    if (!ok) {
      snprintf(why, cap, "plan step %d (%s on mesh dim %d) has no nonblocking form (only an exchange, an all-reduce or "
               "an all-gather of the outermost dim does); run it with dtl_plan_execute", k + 1,
               dtl__plan_step_name(st->kind), st->mesh_dim);
      return -1;
    }
  }
  return found;
}

dtl_status dtl_plan_execute_async(const dtl_plan *p, const void *src_local, void *dst_local, dtl_request **req) {
  static const char fn[] = "dtl_plan_execute_async";
  DTL_CHECK_ARG(p != NULL, fn, "plan=NULL");
  DTL_CHECK_ARG(req != NULL, fn, "req=NULL");
  DTL_CHECK_ARG(p->src.mesh->parent != NULL, fn, "the plan's mesh is abstract (dtl_mesh_create_abstract): it has no "
                "communicators, so its plans can be explained but not executed");
  struct dtl__plan_exec *x = p->exec;
  if (!x) return dtl__error_fn(DTL_ERR_INTERNAL, fn, "the plan was never compiled (plans come from dtl_plan_create)");
  if (x->req && x->req->busy)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "the plan already has an execution in flight (dtl_wait its "
                         "request first: a plan runs one execution at a time)");
  dtl_comm *pc = dtl__plan_comm(p);
  size_t es = dtl_dtype_size(p->src.dtype), *counts = x->counts;
  int g = x->gmax;
  dtl__ex_ctx ctx = {p->src.ndim, es, p->src.dtype, counts, counts + g, counts + 2 * g, counts + 3 * g, counts + 4 * g};
  bool device = dtl__mesh_mem(p->src.mesh)->ops->memory == DTL_MEMORY_DEVICE;
  char why[320];
  int k = pc && !device ? dtl__async_step(p, why, sizeof why) : p->nsteps;
  if (k < 0) return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "%s", why);
  if (!x->req && !(x->req = dtl__calloc(1, sizeof *x->req)))
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory for the plan's request");
  struct dtl__plan_request *r = x->req;
  memset(r, 0, sizeof *r);
  r->plan = p;
  r->base.wait = dtl__req_wait;
  r->base.test = dtl__req_test;
  r->base.comm = pc ? pc : p->src.mesh->parent;
  r->ctx = ctx;
  r->k = p->nsteps;
  r->done = true; /* until there is something left to run */
  if (!pc) { /* in neither mesh */
    DTL_CHECK_ARG(src_local == NULL && dst_local == NULL, fn, "src_local=%p, dst_local=%p but this rank is in neither "
                  "mesh of the plan (pass NULL for both)", src_local, dst_local);
  } else if (device) { /* NCCL: the whole plan is enqueued on the stream, which is what asynchronous means there */
    DTL_TRY(dtl__plan_exec_steps(fn, p, src_local, dst_local, true, NULL, 0, false));
  } else {
    const dtl__ex_layout *L = NULL;
    void *ws = NULL;
    DTL_TRY(dtl__run_args(fn, p, src_local, dst_local, true, &ws, 0, &L));
    r->L = L;
    r->buf[AT_SRC] = (void *)(uintptr_t)src_local;
    r->buf[AT_DST] = dst_local;
    r->buf[AT_SCR] = ws;
    r->k = k;
    r->done = false;
    /* The local steps before the communicating one now; then start it. */
    dtl_status st = dtl__run_steps(fn, p, L, &r->ctx, r->buf, pc, k);
    if (st == DTL_OK && k < p->nsteps) {
      const dtl__ex_step *e = &x->ex[k];
      dtl_comm *c = e->op == EX_EXCHANGE ? pc : p->src.mesh->dim_comm[e->m];
      r->base.comm = c;
      r->in = r->buf[L->in[k]];
      r->tmp = dtl__step_tmp(L, k, e, r->buf, es);
      r->out = L->staged[k] ? dtl__at(r->tmp, e->t, es) : r->buf[L->out[k]];
      if (e->op == EX_EXCHANGE) {
        st = dtl__xchg_begin(&r->ctx, e, c, r->in, r->out);
      } else if (e->op != EX_NONE && !dtl__collective_async(&r->ctx, e, c, r->in, r->out, &r->inner, &st)) {
        st = dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "step %d (%s): the %s transport has no nonblocking form of it", k + 1,
                           dtl__plan_step_name(p->steps[k].kind), c->ops->name);
      }
    }
    if (st == DTL_OK) st = dtl__req_advance(r, false);
    if (st != DTL_OK) {
      dtl__req_wait(&r->base);
      return dtl__error_prefix(st, "%s", fn);
    }
  }
  r->busy = true;
  *req = &r->base;
  return DTL_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The driver: dtl_plan_execute, its workspace form and dtl_plan_execute_async. It checks the call's buffers, picks
 * the compiled placement for them (distinct, or the same pointer for a purely local plan), and walks the compiled
 * steps and their parts, each on the communicator of its mesh dim: one machine, run to the end with blocking
 * transfers or kept in the plan's request and moved on by dtl_test and dtl_wait. Everything else was derived when
 * the plan was created (compile.c), so a call reads no environment and allocates nothing: scratch comes from the
 * caller's workspace or from the plan's own, acquired in the mesh communicator's memory when dtl_plan_create made
 * the plan (so that no execution, the first included, can fail alone for memory: comm.h). */
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

static dtl_status dtl__own_workspace(const char *fn, struct dtl__plan_exec *x, const dtl__mem *mem, size_t bytes,
                                     void **ws);

dtl_status dtl__plan_acquire_workspace(const char *fn, dtl_plan *p) {
  const dtl_mesh *sm = p->src.mesh, *dm = p->dst.mesh;
  if (!p->exec || !sm->parent || !(sm->member || dm->member) || p->exec->ws_bytes == 0) return DTL_OK;
  void *ws = NULL;
  return dtl__own_workspace(fn, p->exec, dtl__mesh_mem(sm), p->exec->ws_bytes, &ws);
}

/* The plan's own workspace, at least bytes long. Acquired at creation for the larger placement
 * (dtl__plan_acquire_workspace), so an execution only grows it for a plan that was made without one (none of the
 * public constructors). */
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

/* --- the walk over the steps ----------------------------------------------------------------------------------
 * One execution, blocking or not, is this machine: it walks the steps and each step's parts (executor_internal.h),
 * running local work when it reaches it and each part's transfer either blocking or started nonblocking, to be
 * completed by dtl_test or dtl_wait. dtl_plan_execute runs it to completion on the stack; dtl_plan_execute_async
 * keeps it in the plan's request. Both use the same placement and scratch. */
typedef struct {
  const char *fn;
  const dtl_plan *p;
  const dtl__ex_layout *L;
  dtl__ex_ctx ctx;
  void *buf[AT_NPLACES]; /* src, dst, workspace */
  dtl_comm *pc;          /* the plan's communicator (the exchange's) */
  int k, n;              /* the step (-1: none begun yet; nsteps: all done) and its number of parts */
  dtl__ex_part part;     /* the part of step k */
  dtl_comm *c;           /* step k's communicator and buffers (out: its staging region when it is staged) */
  void *in, *out, *tmp;
  dtl_request *inner; /* the transfer of the part in flight (NULL: none) */
  bool done;
  dtl_status st;
} dtl__ex_run;

enum { DTL__RUN_BLOCKING, DTL__RUN_TEST, DTL__RUN_WAIT };

static void dtl__run_init(dtl__ex_run *r, const char *fn, const dtl_plan *p, const dtl__ex_layout *L, dtl_comm *pc,
                          const void *src_local, void *dst_local, void *ws) {
  size_t *counts = p->exec->counts;
  int g = p->exec->gmax;
  /* Field by field, not a memset of the whole: this is on the path of every blocking call (bench/
   * dtl_redistribute_perf's cached-plan overhead), and what dtl__run_next sets per step needs no zeroing. */
  r->fn = fn;
  r->p = p;
  r->L = L;
  r->ctx = (dtl__ex_ctx){p->src.ndim, dtl_dtype_size(p->src.dtype), p->src.dtype, counts, counts + g, counts + 2 * g,
                         counts + 3 * g, counts + 4 * g};
  r->buf[AT_SRC] = (void *)(uintptr_t)src_local;
  r->buf[AT_DST] = dst_local;
  r->buf[AT_SCR] = ws;
  r->pc = pc;
  r->k = -1;
  r->n = 0;
  r->inner = NULL;
  r->done = false;
  r->st = DTL_OK;
}

static dtl_status dtl__inner_wait(dtl_request *in) { return in->wait ? in->wait(in) : in->comm->ops->wait(in); }

/* A failure of step k: no transfer stays in flight (its buffers go back to the caller), and the message names the
 * step. */
static dtl_status dtl__run_failed(dtl__ex_run *r, dtl_status st) {
  if (r->inner) {
    dtl_request *in = r->inner;
    r->inner = NULL;
    (void)dtl__inner_wait(in);
  }
  r->done = true;
  const dtl_plan *p = r->p;
  if (r->k < 0 || r->k >= p->nsteps) return r->st = dtl__error_prefix(st, "%s", r->fn);
  if (p->exec->ex[r->k].op == EX_EXCHANGE) return r->st = dtl__error_prefix(st, "%s: step %d (exchange)", r->fn, r->k);
  return r->st = dtl__error_prefix(st, "%s: step %d (%s on mesh dim %d)", r->fn, r->k,
                                   dtl__plan_step_name(p->steps[r->k].kind), p->steps[r->k].mesh_dim);
}

/* Ends step k (its staging copy) and begins the next one, or after the last one moves the result into dst. */
static dtl_status dtl__run_next(dtl__ex_run *r) {
  const dtl_plan *p = r->p;
  const struct dtl__plan_exec *x = p->exec;
  const dtl__ex_layout *L = r->L;
  size_t es = r->ctx.es;
  if (r->k >= 0) {
    const dtl__ex_step *e = &x->ex[r->k];
    if (e->op != EX_NONE && L->staged[r->k] && e->b)
      DTL_TRY(dtl__mem_copy(&r->c->mem, r->buf[L->out[r->k]], r->out, e->b * es));
  }
  int k = ++r->k;
  if (k == p->nsteps) {
    size_t d0 = p->dst.local_count;
    if (L->final_at != AT_DST && d0)
      DTL_TRY(dtl__mem_copy(dtl__mesh_mem(p->dst.mesh), r->buf[AT_DST], r->buf[L->final_at], d0 * es));
    r->done = true;
    return DTL_OK;
  }
  const dtl__ex_step *e = &x->ex[k];
  r->part = (dtl__ex_part){0};
  r->n = 0;
  if (e->op == EX_NONE) return DTL_OK;
  r->c = e->op == EX_EXCHANGE ? r->pc : p->src.mesh->dim_comm[e->m];
  void *tp = dtl__step_tmp(L, k, e, r->buf, es);
  r->in = r->buf[L->in[k]];
  r->out = L->staged[k] ? dtl__at(tp, e->t, es) : r->buf[L->out[k]];
  r->tmp = L->staged[k] && !e->t ? NULL : tp;
  r->n = dtl__ex_parts(e, r->c, r->in, r->out);
  return DTL_OK;
}

/* Moves the execution on: blocking, to its end with every transfer blocking; wait, to its end, completing each
 * transfer started nonblocking; test, as far as it goes without blocking. */
static dtl_status dtl__run_advance(dtl__ex_run *r, int mode) {
  const dtl_plan *p = r->p;
  dtl_request **req = mode == DTL__RUN_BLOCKING ? NULL : &r->inner;
  while (!r->done) {
    const dtl__ex_step *e = r->k >= 0 ? &p->exec->ex[r->k] : NULL;
    dtl_status st;
    if (r->inner) {
      dtl_request *in = r->inner;
      if (mode == DTL__RUN_TEST) {
        bool ok = false;
        st = in->test ? in->test(in, &ok) : in->comm->ops->test(in, &ok);
        if (st != DTL_OK) return dtl__run_failed(r, st);
        if (!ok) return DTL_OK;
      }
      r->inner = NULL;
      st = dtl__inner_wait(in);
      if (st == DTL_OK) st = dtl__ex_part_done(&r->ctx, e, r->c, &r->part, r->in, r->out, r->tmp);
      r->part.j++;
    } else if (e && r->part.j < r->n) {
      st = dtl__ex_part_start(&r->ctx, e, r->c, &r->part, r->in, r->out, r->tmp, req);
      if (!r->inner) r->part.j++;
    } else {
      st = dtl__run_next(r);
    }
    if (st != DTL_OK) return dtl__run_failed(r, st);
  }
  return r->st;
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
  dtl__ex_run r;
  dtl__run_init(&r, fn, p, L, pc, src_local, dst_local, ws);
  return dtl__run_advance(&r, DTL__RUN_BLOCKING);
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

/* A plan's one nonblocking execution: the machine above, started by dtl_plan_execute_async and moved on by dtl_test
 * and dtl_wait. */
struct dtl__plan_request {
  struct dtl_request base;
  dtl__ex_run run;
  bool busy;
};

static dtl_status dtl__req_test(dtl_request *req, bool *done) {
  struct dtl__plan_request *r = (struct dtl__plan_request *)req;
  dtl_status st = dtl__run_advance(&r->run, DTL__RUN_TEST);
  *done = r->run.done;
  return st;
}

static dtl_status dtl__req_wait(dtl_request *req) {
  struct dtl__plan_request *r = (struct dtl__plan_request *)req;
  dtl_status st = dtl__run_advance(&r->run, DTL__RUN_WAIT);
  r->busy = false;
  return st == DTL_OK ? DTL_OK : dtl__error_prefix(st, "dtl_wait (dtl_plan_execute_async)");
}

dtl_status dtl__plan_acquire_request(const char *fn, dtl_plan *p) {
  if (p->exec && !p->exec->req && !(p->exec->req = dtl__calloc(1, sizeof *p->exec->req)))
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory for the plan's request");
  return DTL_OK;
}

dtl_status dtl__plan_check_call(const char *fn, const dtl_plan *p, const void *src_local, const void *dst_local) {
  if (!p->exec) return dtl__error_fn(DTL_ERR_INTERNAL, fn, "the plan was never compiled");
  if (!dtl__plan_comm(p)) {
    DTL_CHECK_ARG(src_local == NULL && dst_local == NULL, fn, "src_local=%p, dst_local=%p but this rank is in neither "
                  "mesh of the plan (pass NULL for both)", src_local, dst_local);
    return DTL_OK;
  }
  const dtl__ex_layout *L = NULL;
  void *ws = NULL;
  return dtl__run_args(fn, p, src_local, (void *)(uintptr_t)dst_local, true, &ws, 0, &L);
}

dtl_status dtl_plan_execute_async(const dtl_plan *p, const void *src_local, void *dst_local, dtl_request **req) {
  return dtl__plan_start("dtl_plan_execute_async", p, src_local, dst_local, req);
}

dtl_status dtl__plan_start(const char *fn, const dtl_plan *p, const void *src_local, void *dst_local,
                           dtl_request **req) {
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
  bool device = dtl__mesh_mem(p->src.mesh)->ops->memory == DTL_MEMORY_DEVICE;
  if (pc && pc->aborted) return dtl__error_fn(DTL_ERR_COMM, fn, "the mesh's communicator was aborted");
  if (!x->req && !(x->req = dtl__calloc(1, sizeof *x->req)))
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory for the plan's request");
  struct dtl__plan_request *r = x->req;
  memset(r, 0, sizeof *r);
  r->base.wait = dtl__req_wait;
  r->base.test = dtl__req_test;
  r->base.comm = pc ? pc : p->src.mesh->parent;
  r->run.done = true; /* until there is something left to run */
  if (!pc) { /* in neither mesh */
    DTL_CHECK_ARG(src_local == NULL && dst_local == NULL, fn, "src_local=%p, dst_local=%p but this rank is in neither "
                  "mesh of the plan (pass NULL for both)", src_local, dst_local);
  } else if (device) { /* NCCL: the whole plan is enqueued on the stream, which is what asynchronous means there */
    DTL_TRY(dtl__plan_exec_steps(fn, p, src_local, dst_local, true, NULL, 0, false));
  } else {
    const dtl__ex_layout *L = NULL;
    void *ws = NULL;
    DTL_TRY(dtl__run_args(fn, p, src_local, dst_local, true, &ws, 0, &L));
    dtl__run_init(&r->run, fn, p, L, pc, src_local, dst_local, ws);
    /* The local steps up to the first transfer now, which starts; dtl_test and dtl_wait do the rest. */
    DTL_TRY(dtl__run_advance(&r->run, DTL__RUN_TEST));
  }
  r->busy = true;
  *req = &r->base;
  return DTL_OK;
}

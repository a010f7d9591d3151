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

dtl_status dtl__plan_run(const char *fn, const dtl_plan *p, const void *src_local, void *dst_local, bool own,
                         void *ws, size_t ws_bytes) {
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
  DTL_TRY(dtl__plan_agree(fn, p, st));
  size_t es = dtl_dtype_size(p->src.dtype), d0 = p->dst.local_count;

  size_t *counts = x->counts;
  int g = x->gmax;
  dtl__ex_ctx ctx = {p->src.ndim, es, p->src.dtype, counts, counts + g, counts + 2 * g, counts + 3 * g, counts + 4 * g};
  void *base[AT_NPLACES] = {(void *)(uintptr_t)src_local, dst_local, ws};
  for (int k = 0; k < p->nsteps; k++) {
    const dtl__ex_step *e = &x->ex[k];
    if (e->op == EX_NONE) continue;
    int in = L->in[k], out = L->out[k], tmp = L->tmp[k];
    void *tp = NULL;
    if (tmp != AT_NONE) {
      size_t data = 0;
      if (in == tmp) data = e->a;
      if (out == tmp && e->b > data) data = e->b;
      tp = dtl__at(base[tmp], data, es);
    }
    dtl_comm *c = e->op == EX_EXCHANGE ? pc : mesh->dim_comm[e->m];
    dtl_status st;
    if (L->staged[k]) {
      char *staging = dtl__at(tp, e->t, es);
      st = dtl__ex_run_step(&ctx, e, c, base[in], staging, e->t ? tp : NULL);
      if (st == DTL_OK && e->b) st = dtl__mem_copy(&c->mem, base[out], staging, e->b * es);
    } else {
      st = dtl__ex_run_step(&ctx, e, c, base[in], base[out], tp);
    }
    if (st != DTL_OK) {
      if (e->op == EX_EXCHANGE) return dtl__error_prefix(st, "%s: step %d (exchange)", fn, k);
      return dtl__error_prefix(st, "%s: step %d (%s on mesh dim %d)", fn, k, dtl__plan_step_name(p->steps[k].kind),
                               p->steps[k].mesh_dim);
    }
  }
  if (L->final_at != AT_DST && d0) DTL_TRY(dtl__mem_copy(dtl__mesh_mem(p->dst.mesh), dst_local, base[L->final_at], d0 * es));
  return DTL_OK;
}

dtl_status dtl_plan_execute(const dtl_plan *p, const void *src_local, void *dst_local) {
  return dtl__plan_run("dtl_plan_execute", p, src_local, dst_local, true, NULL, 0);
}

dtl_status dtl_plan_execute_with_workspace(const dtl_plan *p, const void *src_local, void *dst_local, void *ws,
                                           size_t ws_bytes) {
  return dtl__plan_run("dtl_plan_execute_with_workspace", p, src_local, dst_local, false, ws, ws_bytes);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. It is the contract between the planner (planner.c: pure search over
 * placements) and the executor (compile.c derives what running it takes, once; executor.c runs each step on
 * the mesh dim's communicator). A plan is a value: the source and target layouts plus a list of steps, each
 * of which changes the placement of exactly one mesh dim, and its compiled form for this rank. */
#ifndef DTL_PLAN_INTERNAL_H
#define DTL_PLAN_INTERNAL_H

#include "layout/layout_internal.h"
#include "quant/format.h"

typedef enum {
  DTL__STEP_ALL_GATHER,     /* S(i) -> R          */
  DTL__STEP_ALL_REDUCE,     /* P(op) -> R         */
  DTL__STEP_REDUCE_SCATTER, /* P(op) -> S(i)      */
  DTL__STEP_ALL_TO_ALL,     /* S(i) -> S(j)       */
  DTL__STEP_LOCAL_SLICE,    /* R -> S(i), no communication */
  DTL__STEP_LOCAL_PARTIAL,  /* R -> P(op), no communication: coordinate 0 keeps the value, the others get the
                               identity of op (sum: 0, prod: 1); max/min/avg keep the value everywhere */
  DTL__STEP_EXCHANGE,       /* any layout without pending Partials -> the target layout (on any mesh dims, and on
                               another mesh of the same parent): every rank sends exactly the boxes others need
                               (xmap.h) point to point; a Partial target's identity coordinates fill instead */
  DTL__STEP_LOCAL_EMBED,    /* S(i) -> P(op), no communication: each rank's shard sits at its place in the group's
                               extent of dim i, the rest the identity of op (sum: 0, prod: 1, max: -inf, min: +inf),
                               so that reducing the group gives the unsplit values (DTensor's Shard -> Partial) */
} dtl__step_kind;

/* The longest plan changes each mesh dim a bounded number of times; an exchange is always the last step. */
#define DTL__MAX_PLAN_STEPS (4 * DTL_MAX_MESH_DIMS)

typedef struct {
  dtl__step_kind kind;
  int mesh_dim; /* -1 for an exchange, which may change every mesh dim (and the mesh) */
  /* The full placement vectors before and after the step (they differ on mesh_dim only). Mesh dims of
   * size 1 never get a step; in every vector they carry dst's placement (a split in 1 changes no box). */
  dtl_placement before[DTL_MAX_MESH_DIMS], after[DTL_MAX_MESH_DIMS];
  /* Bytes this rank's coordinate sends and receives (explain), and the step's cost under the plan's model
   * (from the maximum over all ranks, so equal on every rank). */
  uint64_t send_bytes, recv_bytes;
  double cost_s;
  /* The link class the step was priced in (its mesh dim, or any message of an exchange, crosses nodes), and the
   * bytes of send_bytes that go to ranks on other nodes. */
  bool inter;
  uint64_t remote_bytes;
  /* An exchange: the most peers any rank sends to or receives from; 0 when it only copies locally on every rank
   * (it then counts as no collective). */
  int peers;
} dtl__plan_step;

struct dtl_plan {
  /* Copies: a plan outlives the layouts it was made from, not their meshes. The meshes differ for a plan between
   * two meshes of one parent (its steps before the exchange run on src's mesh). */
  dtl_layout src, dst;
  dtl_cost_model cost; /* resolved: every field set */
  /* An exchange step moves its pieces in this many rounds of at most xrows indices of tensor dim xdim each (the
   * outermost dim of the global shape with extent > 1), so that its pack and receive regions shrink to fit a
   * scratch limit; 1 round (xrows = the dim's extent) moves everything at once. */
  int xrounds, xdim;
  int64_t xrows;
  /* Rounds of single rows instead (the bound's last resort): a round is one index of every tensor dim but the last
   * (row-major), so that every piece of a round is a run of its box and nothing is packed (xrows 1, xrounds the
   * product of those extents). */
  bool xfine;
  /* The scratch budget the plan was made for: bytes on every rank, or SIZE_MAX for each rank's larger local end;
   * and, to meet it, the bytes of one chunk of the pack or unpack pass of a gather or reduce-scatter, on any memory
   * (0: the executor's own chunking, host memory only). */
  size_t limit, chunk_bytes;
  int nsteps;
  dtl__plan_step steps[DTL__MAX_PLAN_STEPS];
  double total_cost_s;
  size_t scratch_bytes;
  /* Set when dtl_plan_create's scratch bound made the plan dearer than the cheapest route (explain says so): that
   * route's cost, collectives, and largest scratch on any rank, the limit dtl_plan_create_with_limit would need to
   * return it. unbounded_scratch 0: the bound changed nothing. */
  double unbounded_cost_s;
  int unbounded_collectives;
  size_t unbounded_scratch;
  /* A plan of one part of a quantized tensor whose dims include BLOCK dims (format.h: its shards overlap where a cut
   * splits a block), made by dtl__plan_create_qpart: src and dst are the part's layouts (its dtype and global shape,
   * the logical placements moved onto the part dims that follow the logical dims, this rank's held box), every box
   * comes from the geometry qgeom (not owned: the quantized plan's) of part qpart (xmap.h, dtl__xbox), and the one
   * step is an exchange. NULL for every other plan. */
  const dtl__qgeom *qgeom;
  int qpart;
  /* Compiled by dtl__plan_compile (executor_internal.h); NULL before. Reached through a pointer, so that the
   * driver can fill its count arrays and grow its workspace through a const plan. */
  struct dtl__plan_exec *exec;
};

/* "all-gather", "all-reduce", "reduce-scatter", "all-to-all", "local slice", "local partial", "exchange", "local embed"
 * (plan.c): the names explain prints, for every message that names a step. */
const char *dtl__plan_step_name(dtl__step_kind k);

/* dtl_plan_create and its variants: the cost model over (NULL: defaults), the scratch budget limit (bytes on every
 * rank; SIZE_MAX: each rank's larger local end). Tests pass a limit no plan reaches to get the cheapest route. */
dtl_status dtl__plan_create(const char *fn, const dtl_layout *src, const dtl_layout *dst, const dtl_cost_model *over,
                            size_t limit, dtl_plan **out);
/* The plan of part `part` (which has BLOCK dims) of a quantized tensor of geometry g (kept by the caller, which must
 * outlive the plan) from logical layout src to logical layout dst (one mesh or two of one parent, no Partial): one
 * exchange step, each target rank taking every block its held box needs from the source class that owns it,
 * priced under the model over (NULL: defaults) like the planner's exchanges, and compiled (its workspace is the
 * caller's to acquire, dtl__plan_acquire_workspace). */
dtl_status dtl__plan_create_qpart(const char *fn, const dtl__qgeom *g, int part, const dtl_layout *src,
                                  const dtl_layout *dst, const dtl_cost_model *over, dtl_plan **out);
/* The planner's checks of a (src, dst) pair: both given, dtype and global shape equal, one mesh or two meshes of
 * one parent. */
dtl_status dtl__plan_check_pair(const char *fn, const dtl_layout *src, const dtl_layout *dst);

/* Implemented by the executor, called by the planner as the last step of dtl_plan_create (and by tests on
 * hand-built plans, whose exec must be NULL): checks that the steps chain legally (DTL_ERR_INTERNAL or
 * DTL_ERR_UNSUPPORTED naming fn and the step otherwise: such a plan is never returned), derives everything an
 * execution needs on this rank, and sets p->scratch_bytes. */
dtl_status dtl__plan_compile(const char *fn, struct dtl_plan *p);
/* Whether every rank of the plan (both meshes) would run it within its scratch budget: limit bytes, or (SIZE_MAX)
 * the larger of that rank's local source and target bytes; *worst gets the largest scratch of any rank, in bytes.
 * Pure: computed for every rank from the global shapes, so every rank gets the same answer. */
dtl_status dtl__plan_fits(const char *fn, const dtl_plan *p, size_t limit, bool *fits, size_t *worst);
/* dtl_plan_execute (own: the plan's workspace) and dtl_plan_execute_with_workspace (ws, ws_bytes: the caller's),
 * with fn naming the entry point in messages. */
dtl_status dtl__plan_run(const char *fn, const struct dtl_plan *p, const void *src_local, void *dst_local, bool own,
                         void *ws, size_t ws_bytes);
/* Acquires the plan's own workspace (dtl_plan_workspace_bytes, in the mesh communicator's memory) on a rank of an
 * executable plan: the public constructors call it, so that dtl_plan_execute never allocates and a first execution
 * cannot fail alone (comm.h); the plans of dtl_redistribute's cache run in the cache's workspace instead. */
dtl_status dtl__plan_acquire_workspace(const char *fn, struct dtl_plan *p);
/* The checks of dtl_plan_execute on this rank's buffers for p (compiled, with its own workspace), messages naming fn:
 * what a caller that runs several plans together checks for each before they agree and start. */
dtl_status dtl__plan_check_call(const char *fn, const struct dtl_plan *p, const void *src_local, const void *dst_local);
/* dtl_plan_execute_async without its argument checks' own function name: fn names the caller. */
dtl_status dtl__plan_start(const char *fn, const struct dtl_plan *p, const void *src_local, void *dst_local,
                           dtl_request **req);
/* Acquires the request of dtl_plan_execute_async beforehand, so that a caller's first nonblocking execution
 * allocates nothing. */
dtl_status dtl__plan_acquire_request(const char *fn, struct dtl_plan *p);
/* Explain's figures: bytes ("12 B", "1.5 MiB") and seconds ("3.2 us"), as every plan text prints them. */
void dtl__plan_bytes_text(uint64_t b, char *buf, size_t cap);
void dtl__plan_time_text(double s, char *buf, size_t cap);
/* Frees what compilation and execution attached to p (its compiled form and workspace), not p itself. */
void dtl__plan_release(struct dtl_plan *p);

#endif

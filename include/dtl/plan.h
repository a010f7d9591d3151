/* SPDX-License-Identifier: Apache-2.0 */
/* Redistribution: a plan turns a source layout into a target layout, on the same mesh or on another mesh of the
 * same parent communicator, with the cheapest sequence of collectives and exchanges under an alpha-beta cost model
 * whose scratch fits a budget. Creating a plan is pure (no communication) and deterministic, so every rank derives
 * the same plan; executing it is collective over the ranks of its mesh (or of both meshes). */
#ifndef DTL_PLAN_H
#define DTL_PLAN_H

#include "dtl/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dtl_plan dtl_plan;

/* Cost model: a collective on p ranks costs (ring rounds + 1) * alpha_s (the 1 is the call itself) plus
 * bytes per rank * beta_s_per_byte; purely local steps cost bytes touched * local_beta_s_per_byte (a slice that
 * keeps a rank's whole box touches none). Ring
 * rounds and bytes: all-gather p-1, the bytes received; all-reduce 2(p-1), 2(p-1)/p of the shard;
 * reduce-scatter p-1, the shard less the block kept; all-to-all p-1, the larger of the bytes sent and
 * received. Bytes are the maximum over all ranks of the mesh, from the global shape (uneven shards
 * included), so every rank prices every step the same. Fields are read only when their bit is set in
 * mask; a zeroed struct means the defaults of the mesh's engine (also overridable with DTL_PLAN_TUNE). flags:
 * none defined yet (0). A bit outside those defined is DTL_ERR_INVALID_ARGUMENT. */
#define DTL_COST_ALPHA DTL_BIT(0)
#define DTL_COST_BETA DTL_BIT(1)
#define DTL_COST_LOCAL_BETA DTL_BIT(2)
#define DTL_COST_INTER_ALPHA DTL_BIT(3)
#define DTL_COST_INTER_BETA DTL_BIT(4)
typedef struct {
  uint64_t mask;
  uint64_t flags;
  double alpha_s;         /* links within a node (the intra-node link class) */
  double beta_s_per_byte;
  double local_beta_s_per_byte;
  double inter_alpha_s;   /* links between nodes: a step whose groups span nodes pays these */
  double inter_beta_s_per_byte;
} dtl_cost_model;

/* The built-in model of an engine, every mask bit set (flags 0): DTL_MEMORY_HOST is MPI (alpha 2 us, beta
 * 1/(5 GB/s), local beta 1/(10 GB/s)), DTL_MEMORY_DEVICE is NCCL (alpha 10 us, beta 1/(100 GB/s), local beta
 * 1/(1 TB/s)).
 * A plan starts from the model of its mesh's engine (abstract meshes: MPI), then applies the cost line of the
 * profile the environment variable DTL_PROFILE names (README, Calibration: a malformed profile, or one of another
 * engine, makes plan creation fail), then the environment variable DTL_PLAN_TUNE="alpha=2e-6,beta=2e-10,local_beta=1e-10" (any subset; malformed text makes plan
 * creation fail with DTL_ERR_INVALID_ARGUMENT), then the fields given to dtl_plan_create_with_cost. */
DTL_API dtl_status dtl_cost_model_default(dtl_memory memory, dtl_cost_model *out);

/* Calibration (README, Calibration). Measures the model on the ranks of mesh, collective over them (every rank of
 * the mesh calls it; an abstract mesh, or a rank outside the mesh, is DTL_ERR_INVALID_ARGUMENT; a bad argument on
 * one rank fails every rank): local_beta from a 4 MiB copy in the communicator's memory; alpha and beta as the
 * least-squares fit, in relative error, of the planner's own prices of the plans S0->R, S1->R, P->R, P->S0 and
 * S0->S1 of an f32 matrix of 4 KiB to 4 MiB on a 1-D mesh over the mesh's ranks to their measured times (each the
 * second fastest of 5 runs of the slowest rank); with no link (one rank) alpha is a call's overhead and beta the copy's.
 * The inter-node fields take the figures of the links between the nodes' first ranks when the ranks span several
 * nodes, else the intra-node ones. About half a second on 4 ranks of one node. Every rank gets the same model,
 * bit for bit (every mask bit set), so every rank derives the same plans; a failure leaves *out untouched. */
DTL_API dtl_status dtl_cost_model_calibrate(const dtl_mesh *mesh, dtl_cost_model *out);
/* Writes a profile for DTL_PROFILE to path (this rank alone: call it on one rank): the engine and size of the
 * communicator of mesh (abstract: DTL_ERR_INVALID_ARGUMENT), model (fields whose mask bit is clear: as a plan on
 * mesh would resolve them) and, on MPI, the communicator's algorithm table. A file that cannot be written is
 * DTL_ERR_INVALID_ARGUMENT naming it. */
DTL_API dtl_status dtl_cost_model_save(const char *path, const dtl_mesh *mesh, const dtl_cost_model *model);

/* Finds the cheapest sequence of steps. Each per-dim step changes one mesh dim: S(i)->R all-gather, P->R
 * all-reduce, P->S(i) reduce-scatter, S(i)->S(j) all-to-all, R->S(i) local slice, R->P local, S(i)->P(op) local
 * embed (each rank's shard at its place in the group's extent of i, the rest op's identity: reducing the group
 * gives the unsplit values, as DTensor's Shard -> Partial; sum, prod, max, min). The exchange step
 * goes from a layout without pending Partials straight to the target in one step on any number of mesh dims: each
 * rank intersects its box with every target box and sends exactly those pieces point to point (a rank whose data
 * does not change owner moves nothing; a replicated source spreads its sends over its replicas; a Partial target's
 * identity coordinates just fill). It is priced at alpha per peer contacted plus alpha for the call, and beta per
 * byte of the larger of what a rank sends and receives (the maximum over the ranks); a tie (also in total bytes, below)
 * keeps the per-dim step.
 * src and dst must have one dtype and global shape, and share the mesh object or be on two meshes of one parent
 * (dtl_mesh_create_from_ranks: disjoint, overlapping, or the same ranks in another shape). Between two meshes the
 * plan reduces the source's pending Partials on the source mesh first (the cheapest of all-reduce and
 * reduce-scatter), then exchanges; a Partial target is filled (its op's identity off coordinate 0). Rules of the
 * per-dim steps:
 * - nested sharding splits a tensor dim left to right, so a step may only undo or add the innermost split
 *   of a tensor dim (e.g. [S0,S1] -> [S1,S0] on 2x2 would go through an all-gather; the exchange swaps two pieces);
 * - pending Partials are reduced innermost mesh dim first; a reduction may run before an inner pending
 *   one only when their ops commute (equal ops, or sum with avg);
 * - mesh dims of size 1 never communicate: their placement is a relabeling, any pair allowed;
 * - on one mesh, a mesh dim whose source is S and target P(avg) (avg has no identity to embed in), or source P(a)
 *   and target P(b != a), is DTL_ERR_UNSUPPORTED with the reason (reaching it would mean a collective whose result
 *   the relabeling mostly discards: ask for R there, or redistribute through R in two calls).
 * Memory: a plan's scratch (dtl_plan_scratch_bytes) is at most the larger of this rank's local source and target
 * bytes, on every rank: when the cheapest route would need more on some rank (a route through an intermediate
 * larger than both ends), the plan is the same route with smaller pack chunks, or else the cheapest route of
 * reductions and one exchange, its exchange split into as few rounds as fit (a piece that is a run of its box
 * within a round moves in place). Checked for every rank from the global shapes (on large meshes through
 * representative coordinates), so every rank derives the same plan. It holds by construction: the last resort
 * all-reduces the pending Partials (the reduced shard is the source's box) and exchanges one row at a time (one
 * index of every tensor dim but the last), where every piece is a run and nothing is packed; that plan can be far
 * dearer, and explain then says what the bound cost and which dtl_plan_create_with_limit limit lifts it. One
 * exception: on one mesh of more than 1024 ranks the planner prices no exchange, and a route of per-dim steps
 * through an intermediate larger than both ends can exceed the bound.
 * Pure and deterministic: no communication, and every rank derives the same steps (ties in cost go to fewer bytes
 * sent over all ranks together, since the model prices only the busiest rank; then to fewer steps, then to a fixed
 * order). The per-rank byte figures of explain are those of this rank's coordinate. */
DTL_API dtl_status dtl_plan_create(const dtl_layout *src, const dtl_layout *dst, dtl_plan **out);
DTL_API dtl_status dtl_plan_create_with_cost(const dtl_layout *src, const dtl_layout *dst, const dtl_cost_model *cost,
                                             dtl_plan **out);
/* The cheapest plan whose scratch is at most max_scratch_bytes on every rank (every rank passes the same limit): the
 * cheapest route if it fits, else reductions and one exchange in as few rounds as fit (each round moves a slab of
 * the outermost dim of extent > 1, so its pack and receive regions shrink with it). A limit that no plan meets is
 * DTL_ERR_INVALID_ARGUMENT naming the smallest limit that works for the pair (a limit above the default bound may
 * return a cheaper plan than dtl_plan_create). */
DTL_API dtl_status dtl_plan_create_with_limit(const dtl_layout *src, const dtl_layout *dst, size_t max_scratch_bytes,
                                              dtl_plan **out);
/* Collective over the mesh (a plan between two meshes: over the ranks of both, which alone take part; a rank of
 * the parent in neither mesh may call it and returns at once). src_local is this rank's shard of src (never
 * written); dst_local receives this rank's shard of dst; a rank passes NULL for a side whose mesh it is not in
 * (a buffer there is DTL_ERR_INVALID_ARGUMENT). src_local == dst_local is rejected unless the plan is purely local.
 * Everything the execution derives (boxes, peer lists, chunking, where each intermediate lives) was computed by
 * dtl_plan_create, so a call reads no environment and allocates nothing, the first one included: the plan's own
 * workspace (dtl_plan_workspace_bytes bytes in the mesh communicator's memory, kept until dtl_plan_destroy) is
 * acquired by dtl_plan_create on every rank of either mesh, so that no execution can fail on one rank for memory
 * (a rank without it learns so from dtl_plan_create, before any collective). A plan runs one call at a time, like
 * every call on one mesh. Every check comes before the first step; with DTL_CHECK on the mesh's communicator the ranks then
 * agree on the plan (layouts, mesh, steps, resolved cost model) and on each other's verdict, so a bad buffer,
 * another plan or another cost model (DTL_PLAN_TUNE) on one rank fails every rank (between two meshes: every
 * rank of both, through point-to-point messages on the parent). Planning is local: a rank
 * whose dtl_plan_create failed must not leave its peers executing (dtl_redistribute plans inside the
 * agreement, so there a planning failure on one rank fails every rank under DTL_CHECK). */
DTL_API dtl_status dtl_plan_execute(const dtl_plan *p, const void *src_local, void *dst_local);
/* The same with scratch from the caller, so that an engine can place it (and replay the plan, e.g. inside a
 * CUDA graph, with no allocation at all): ws holds ws_bytes bytes in the mesh communicator's memory, aligned
 * for the plan's dtype, which the call may overwrite. ws_bytes below what the call needs is
 * DTL_ERR_INVALID_ARGUMENT naming the bytes needed; ws may be NULL when that is 0. This form leaves the plan's own
 * workspace (acquired by dtl_plan_create) unused. */
DTL_API dtl_status dtl_plan_execute_with_workspace(const dtl_plan *p, const void *src_local, void *dst_local, void *ws,
                                                   size_t ws_bytes);
/* Starts an execution of p and returns at once, so that the transfer overlaps what the caller does next (a
 * pipeline stage sends micro-batch k while it computes k+1). Checks its arguments like dtl_plan_execute, runs the
 * local steps up to the first transfer and starts it, and stores in *req a request that dtl_test advances (each
 * transfer of each step, among them each chunk of a chunked pack or unpack pass and each round of an exchange,
 * starts when the one before it completes, and the local work between them runs then) and dtl_wait completes;
 * the buffers belong to the execution until dtl_wait returns. Every plan runs this way, with the result of
 * dtl_plan_execute in the same workspace (the plan's own), and a failure midway leaves no transfer in flight.
 * The request is the plan's own (no allocation per call beyond the plan's first): a plan has one execution in
 * flight at a time, and every request goes to dtl_wait exactly once. Like every nonblocking start it never
 * agrees, even under DTL_CHECK (comm.h). NCCL: enqueued on the communicator's stream (already asynchronous), and
 * the request completes at once. A rank in neither mesh gets a request that completes at once. */
DTL_API dtl_status dtl_plan_execute_async(const dtl_plan *p, const void *src_local, void *dst_local, dtl_request **req);
/* Workspace bytes that suffice for every call of dtl_plan_execute_with_workspace on this rank: the scratch
 * figure below, or more for a purely local plan run in place (src_local == dst_local). 0 for NULL. */
DTL_API size_t dtl_plan_workspace_bytes(const dtl_plan *p);
/* EXPLAIN-style text: one line per step (mesh dim, collective, tensor dims, bytes sent/received per rank,
 * estimated time; an exchange names both placement vectors and its rounds) and the total; when dtl_plan_create's
 * scratch bound made the plan dearer than the cheapest route, one more line ("scratch bound") with that route's
 * collectives and time, the scratch it needs on its busiest rank, and the dtl_plan_create_with_limit limit that
 * returns it. A too-small buffer is DTL_ERR_INVALID_ARGUMENT naming the size needed,
 * which dtl_plan_explain_needed returns (including the NUL). */
DTL_API dtl_status dtl_plan_explain(const dtl_plan *p, char *buf, size_t cap);
DTL_API size_t dtl_plan_explain_needed(const dtl_plan *p);
DTL_API int dtl_plan_num_steps(const dtl_plan *p);
/* Steps that communicate (local slices and no-ops excluded). */
DTL_API int dtl_plan_num_collectives(const dtl_plan *p);
/* Estimated seconds under the plan's cost model. */
DTL_API double dtl_plan_cost(const dtl_plan *p);
/* Scratch memory one execution with distinct source and destination buffers uses on this rank, in bytes,
 * exactly (one buffer, which the plan's first such dtl_plan_execute allocates; 0 = none): at most the larger of
 * this rank's local source and target bytes for dtl_plan_create's plans (see there), at most the limit for
 * dtl_plan_create_with_limit's. */
DTL_API size_t dtl_plan_scratch_bytes(const dtl_plan *p);
/* This rank's bytes on the wire over all steps of the plan: sent to and received from other ranks (a collective's
 * under its ring algorithm, as explain prints them; an exchange's exactly: it receives the bytes of its target box
 * that its own source box does not already hold, nothing where it holds a Partial target's identity). */
DTL_API dtl_status dtl_plan_bytes(const dtl_plan *p, uint64_t *sent, uint64_t *received);
DTL_API void dtl_plan_destroy(dtl_plan *p);

/* Plans (cached per mesh by the (src, dst) pair, so repeated calls cost about a hash lookup; the cache is a
 * memo of the const mesh, see <dtl/mesh.h>; between two meshes, of src's mesh) and executes, with the rules of
 * dtl_plan_execute. */
DTL_API dtl_status dtl_redistribute(const dtl_layout *src, const void *src_local, const dtl_layout *dst, void *dst_local);
/* The dense tensor on root (read there only) -> this rank's local shard of l, for any layout; a Partial
 * placement gets the value on coordinate 0 and the identity of its op elsewhere (max/min/avg: the value).
 * Root alone reads and packs, so the call always agrees (with or without DTL_CHECK) on the layout, the root
 * and every rank's verdict before it communicates: a NULL dense tensor or no memory on root fails every rank. */
DTL_API dtl_status dtl_distribute(const dtl_layout *l, const void *dense_on_root, int root, void *local);
/* Any layout -> the dense tensor on every rank (pending Partial reductions applied). */
DTL_API dtl_status dtl_full_tensor(const dtl_layout *l, const void *local, void *dense);

#ifdef __cplusplus
}
#endif
#endif

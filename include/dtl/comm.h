/* SPDX-License-Identifier: Apache-2.0 */
/* Communicators and the collectives of the field. A dtl_comm wraps one engine communicator (MPI on host
 * memory, NCCL on CUDA device memory, see <dtl/mpi.h> and <dtl/nccl.h>); every call below takes buffers
 * in that engine's memory. Counts are in elements of the given dtype. All ranks of the communicator must
 * make the same collective calls in the same order with compatible arguments.
 *
 * Errors on one rank. Every collective entry point of dtl (the calls below, plan execution and the
 * redistribution helpers, the TP layers and halves, MoE layouts, dispatch and combine) checks all its
 * arguments and acquires all the memory it needs before its first collective, so a rank can only fail before
 * it communicates. Collective creation calls (dtl_comm_split, dtl_mesh_create, dtl_tp_context_create and
 * the TP layer constructors, dtl_moe_layout_create) and dtl_distribute then always agree across the ranks
 * on success: one small all-reduce, after which either every rank has its object or every rank returns an
 * error (the failing rank its own message, the others its status with "fn: rank r failed (...)", or
 * DTL_ERR_MISMATCH naming the ranks whose arguments differ). Per-call entry points agree only when the
 * communicator was made with the environment variable DTL_CHECK=1 (read once, when dtl_comm_from_mpi /
 * dtl_comm_from_nccl makes the communicator; a split inherits its parent's setting; every rank must run with
 * the same setting, which dtl_mesh_create verifies): each then also compares a fingerprint of the call
 * (name, counts, dtype, op, root, in-place form; layouts, mesh, plan steps and cost model; layer and token
 * count), so a rank that passes a bad argument or makes another call makes every rank return an error
 * instead of hanging. The cost is one all-reduce of three integers per call (on NCCL it also waits for the
 * stream). Without DTL_CHECK, a rank that fails a per-call check returns alone and its peers wait in the
 * collective, and ranks that pass different counts, shapes, roots or plans get undefined results: DTL_OK
 * with wrong data is possible. That is the caller's contract violation, as in MPI; DTL_CHECK turns it into an
 * error. An agreement never fails on one rank: what it needs (its host and device staging, the peer list of an
 * agreement over two meshes) is acquired when its communicator is made, a rank that failed locally still takes
 * part and sends its failure verdict, and a plan's workspace is acquired when the plan is made (which always
 * agrees), so that no first execution allocates. What no agreement can cover: a NULL or aborted communicator (or handle: mesh, layout, context,
 * layer), which leaves no way to reach the peers; ranks that do not make the call at all; the nonblocking
 * starts (*_async), which must return without waiting for the peers, and the point-to-point calls, which
 * involve two ranks only: neither ever agrees; and failures inside
 * the engine once a collective has started (DTL_ERR_COMM, or a hang if one rank's engine dies). Deadlines
 * (dtl_comm_set_timeout below) turn what is left of the hangs (a rank that never makes the call, or makes it
 * late, or fails alone without DTL_CHECK) into DTL_ERR_TIMEOUT on its peers.
 *
 * Threads. A communicator is used by one thread at a time, and so is everything built on it: the
 * communicators split from it, the meshes over it (with their dim communicators and plan cache), the
 * layouts and plans on those meshes while a call uses them, TP contexts and their layers, MoE layouts, and
 * requests. Different communicators, with what is built on each, may be used from different threads at the
 * same time (an NCCL one with its device current on the calling thread). An abstract mesh counts as a
 * communicator of its own. Calls that take no dtl object (dtype and placement helpers, dtl_moe_router_topk,
 * dtl_moe_placement_create) may run on any thread. Process-wide: the message of dtl_last_error() is kept per
 * thread, and the logging configuration (DTL_LOG, DTL_LOG_SUBSYS, DTL_LOG_FILE) is read once per process at
 * the first log call of any thread. dtl keeps no other global state. */
#ifndef DTL_COMM_H
#define DTL_COMM_H

#include "dtl/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dtl_comm dtl_comm;

/* Which memory a communicator's buffers live in. */
typedef enum { DTL_MEMORY_HOST = 0, DTL_MEMORY_DEVICE = 1 } dtl_memory;

DTL_API int dtl_comm_rank(const dtl_comm *c); /* -1 for NULL */
DTL_API int dtl_comm_size(const dtl_comm *c); /* -1 for NULL */
DTL_API dtl_memory dtl_comm_memory(const dtl_comm *c);
/* "mpi" or "nccl". */
DTL_API const char *dtl_comm_backend_name(const dtl_comm *c);
/* Releases dtl's resources. The engine communicator passed to the constructor stays the caller's. */
DTL_API void dtl_comm_destroy(dtl_comm *c);

/* Splits like MPI_Comm_split: ranks with equal color form one new communicator, ordered by key then
 * by old rank. Collective over c, agreed: one rank's bad argument (out=NULL, color < 0) or failure to make
 * its communicator fails every rank, and none keeps a new communicator. The new one has c's DTL_CHECK. */
DTL_API dtl_status dtl_comm_split(dtl_comm *c, int color, int key, dtl_comm **out);
/* Polls the engine for asynchronous errors (NCCL); DTL_ERR_COMM with the engine's message if one occurred. */
DTL_API dtl_status dtl_comm_check(dtl_comm *c);
/* Ends the communication of the job, for a rank that cannot go on (after DTL_ERR_TIMEOUT, say): on MPI it calls
 * MPI_Abort on c's communicator, which ends every process of the job (MPI's rule: it does not return when it
 * works). On NCCL it calls ncclCommAbort on a communicator dtl made (dtl_comm_split); a borrowed ncclComm_t (the
 * one passed to dtl_comm_from_nccl) stays its owner's: dtl stops using it and leaves its abort to the owner, who
 * must call ncclCommAbort on it to release ranks blocked in it. Further calls on c return DTL_ERR_COMM. */
DTL_API dtl_status dtl_comm_abort(dtl_comm *c);

/* Deadlines. With a timeout of t > 0 seconds, every blocking call on c, and on what is built on it (its splits,
 * meshes, plans, TP contexts and layers, MoE layouts, CP contexts, and dtl_wait of its requests), waits for at
 * most about t seconds in each of its waits for the peers, polling the engine with back-off (for 10 ms it polls
 * with sched_yield between polls, since MPI moves a transfer's bytes inside them; then it sleeps in steps that grow
 * with the time waited, at most 1 ms, so a waiting rank leaves a shared core to the ranks it waits for), and then returns DTL_ERR_TIMEOUT naming the operation, the communicator
 * (its size and mesh dim), the time waited and, where it can tell (point-to-point exchanges, the agreement
 * over part of a communicator), the ranks that had not arrived. A timeout fails the communicator and every
 * communicator split from the same dtl_comm_from_mpi / dtl_comm_from_nccl: every later call on any of them
 * returns DTL_ERR_COMM at once, naming the timeout. The engine may still hold the timed-out call's buffers:
 * the rank's next step is dtl_comm_abort (or ending the process), not reuse of those buffers.
 * The timeout is one for a constructor's communicators and the same on every rank (MPI never matches a blocking
 * collective with a nonblocking one, so ranks must wait alike): it is read from DTL_TIMEOUT (seconds, a decimal
 * number; 0 or unset: none) when dtl_comm_from_mpi or dtl_comm_from_nccl makes the communicator (a value that
 * differs between the ranks fails the creation with DTL_ERR_MISMATCH), and dtl_comm_set_timeout changes it for
 * every communicator of the constructor at once: collective over c, which must be the constructor's own
 * communicator, agreed (ranks passing different values all get DTL_ERR_MISMATCH), called while no call is in
 * flight on any of those communicators. 0, the default, costs nothing: the engine's blocking calls run as before. With a deadline the MPI transport runs MPI's nonblocking
 * forms of its calls (MPI_Iallreduce for MPI_Allreduce, ...) and dtl's own algorithms with timed waits; the
 * results are bitwise the same. DTL_ERR_INVALID_ARGUMENT for seconds < 0, NaN or above 1e9. */
DTL_API dtl_status dtl_comm_set_timeout(dtl_comm *c, double seconds);
/* c's timeout in seconds (0: none; -1 for NULL). */
DTL_API double dtl_comm_timeout(const dtl_comm *c);
/* Blocks until every rank has arrived. */
DTL_API dtl_status dtl_barrier(dtl_comm *c);

/* Buffers. A buffer of zero elements may be NULL. The send and recv buffers of one call must not overlap,
 * except in the in-place form documented on each call; the in-place forms of the all-rank collectives
 * (all_gather(v), all_reduce, reduce_scatter(v), all_to_all(v)) must be used by every rank of the call or by
 * none (an MPI rule, checked under DTL_CHECK). A failed argument check writes no buffer and returns before
 * any communication; a check that only some ranks fail (a root-only buffer, say) fails every rank under
 * DTL_CHECK and otherwise leaves the other ranks waiting in the engine. Limits of one engine are checked
 * when the call reaches it, after any agreement: MPI takes at most INT_MAX elements per count and
 * displacement, so the MPI transport moves larger counts and displacements in pieces (every collective and
 * point-to-point call; the decision comes from what every rank of the call knows alike), except
 * dtl_all_to_allv(_async) with DTL_ALGO=all_to_allv:mpi, whose counts differ by rank: it fails alone the rank
 * whose own packed send or receive extent exceeds INT_MAX, even under DTL_CHECK; NCCL rejects an in-place all-to-all
 * (every rank of a checked call alike, since the in-place form is part of the fingerprint) and reports a
 * bad device pointer or stream only as an asynchronous error (DTL_ERR_COMM from a later call). */

/* --- Root-based collectives. root is a rank of c. ------------------------------------------------ */
/* buf on root is the source, on the others the destination. */
DTL_API dtl_status dtl_broadcast(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int root);
/* send (size*recv_count elements, read on root only, may be NULL elsewhere) -> recv_count elements on each
 * rank, block r to rank r. In place on root: recv == send + root*recv_count (root's block stays). */
DTL_API dtl_status dtl_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, int root);
/* send_count elements from each rank -> size*send_count elements on root in rank order (recv is written on
 * root only, may be NULL elsewhere). In place on root: send == recv + root*send_count. */
DTL_API dtl_status dtl_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t, int root);
/* Element-wise reduction of count elements into recv on root (recv may be NULL elsewhere).
 * In place on root: send == recv. */
DTL_API dtl_status dtl_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op, int root);

/* --- All-rank collectives. -------------------------------------------------------------------------- */
/* send_count from each rank -> size*send_count in rank order on every rank.
 * In place: send == recv + rank*send_count. */
DTL_API dtl_status dtl_all_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t);
/* Uneven all-gather: rank r contributes recv_counts[r] elements (send_count must equal recv_counts[rank]);
 * recv holds the contributions packed in rank order. Zero counts are allowed.
 * In place: send == recv + (recv_counts[0] + ... + recv_counts[rank-1]). */
DTL_API dtl_status dtl_all_gatherv(dtl_comm *c, const void *send, size_t send_count, void *recv,
                                   const size_t *recv_counts, dtl_dtype t);
/* In place: send == recv. */
DTL_API dtl_status dtl_all_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op);
/* send holds size*recv_count elements; rank r receives block r of the reduction.
 * In place: recv == send + rank*recv_count (NCCL's convention); the rest of send is then clobbered. */
DTL_API dtl_status dtl_reduce_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, dtl_reduce_op op);
/* Uneven reduce-scatter: send holds sum(recv_counts) elements packed in rank order; rank r receives
 * the reduction of block r (recv_counts[r] elements, zero allowed).
 * In place: recv == send + (recv_counts[0] + ... + recv_counts[rank-1]); the rest of send is then clobbered. */
DTL_API dtl_status dtl_reduce_scatterv(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts,
                                       dtl_dtype t, dtl_reduce_op op);
/* Block j (count_per_peer elements) of send goes to rank j; block i of recv came from rank i.
 * In place: send == recv (MPI transport only; the NCCL transport rejects it). */
DTL_API dtl_status dtl_all_to_all(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t);
/* Variable all-to-all: send_counts[j] elements go to rank j, recv_counts[i] arrive from rank i, both
 * packed in rank order. Counts must agree pairwise across ranks; zero counts are allowed.
 * In place: send == recv with send_counts[i] == recv_counts[i] for every i (MPI transport only). */
DTL_API dtl_status dtl_all_to_allv(dtl_comm *c, const void *send, const size_t *send_counts,
                                   void *recv, const size_t *recv_counts, dtl_dtype t);

/* --- Nonblocking all-rank collectives. ----------------------------------------------------------------
 * Each *_async call checks its arguments like the blocking form, starts the operation and stores a request
 * in *req. A start never waits for the peers, so it does not agree even under DTL_CHECK: a rank whose start
 * fails returns alone, and its peers' requests do not complete. The buffers (and count arrays) belong to
 * the operation until dtl_wait returns: do not touch them before. Every request must be passed to dtl_wait
 * exactly once. A transport without nonblocking
 * collectives (NCCL: its calls are already asynchronous on the communicator's stream) returns
 * DTL_ERR_UNSUPPORTED. Blocking and nonblocking collectives on one communicator are started in the same
 * order on every rank, like all collectives. */
typedef struct dtl_request dtl_request;

DTL_API dtl_status dtl_all_gather_async(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t,
                                        dtl_request **req);
DTL_API dtl_status dtl_all_gatherv_async(dtl_comm *c, const void *send, size_t send_count, void *recv,
                                         const size_t *recv_counts, dtl_dtype t, dtl_request **req);
DTL_API dtl_status dtl_all_reduce_async(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t,
                                        dtl_reduce_op op, dtl_request **req);
DTL_API dtl_status dtl_reduce_scatter_async(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                                            dtl_reduce_op op, dtl_request **req);
DTL_API dtl_status dtl_all_to_all_async(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t,
                                        dtl_request **req);
DTL_API dtl_status dtl_all_to_allv_async(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                         const size_t *recv_counts, dtl_dtype t, dtl_request **req);
/* Blocks until the operation is complete (results in place, DTL_AVG divided), frees req (a plan's request from
 * dtl_plan_execute_async goes back to its plan) and returns the operation's status. */
DTL_API dtl_status dtl_wait(dtl_request *req);
/* *done = 1 when the transfer is complete (a following dtl_wait returns at once; results are final only after
 * dtl_wait), else 0. Does not free req. */
DTL_API dtl_status dtl_test(dtl_request *req, int *done);

/* --- Point to point. peer is a rank of c other than the own rank (a blocking message to oneself can
 * deadlock: DTL_ERR_UNSUPPORTED; copy locally instead). Messages between two ranks arrive in the order
 * sent. --------------------------------------------------------------------------------------------------- */
/* count elements to peer. */
DTL_API dtl_status dtl_send(dtl_comm *c, const void *buf, size_t count, dtl_dtype t, int peer);
/* count elements from peer; DTL_ERR_MISMATCH when peer sent fewer, DTL_ERR_COMM when it sent more. */
DTL_API dtl_status dtl_recv(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int peer);
/* Sends send_count elements to dest and receives recv_count elements from source in one call, as
 * MPI_Sendrecv: both transfers progress together, so every rank of a ring may shift its block to the next
 * rank at once without ordering the calls. dest and source are ranks of c; dest may be this rank only when
 * source is too (a message to oneself is received by the same call, a local copy that cannot deadlock). send
 * and recv must not overlap. The message travels like dtl_send's, so the peer may use dtl_send/dtl_recv
 * instead. DTL_ERR_MISMATCH when source sent fewer than recv_count elements, DTL_ERR_COMM when it sent more
 * (to oneself: checked before anything is copied). On NCCL a pair's counts must agree: it cannot detect a
 * mismatch. */
DTL_API dtl_status dtl_sendrecv(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv,
                                size_t recv_count, int source, dtl_dtype t);
/* The nonblocking form, for overlapping the transfer with compute (ring algorithms): checks its arguments
 * like dtl_sendrecv, starts both transfers and stores a request that dtl_wait completes (with the count
 * check) and dtl_test polls; send and recv belong to the operation until then. NCCL: DTL_ERR_UNSUPPORTED,
 * since dtl_sendrecv itself only enqueues on the communicator's stream. */
DTL_API dtl_status dtl_sendrecv_async(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv,
                                      size_t recv_count, int source, dtl_dtype t, dtl_request **req);

#ifdef __cplusplus
}
#endif
#endif

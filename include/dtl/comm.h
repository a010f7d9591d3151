/* SPDX-License-Identifier: Apache-2.0 */
/* Communicators and the collectives of the field. A dtl_comm wraps one engine communicator (MPI on host
 * memory, NCCL on CUDA device memory, see <dtl/mpi.h> and <dtl/nccl.h>); every call below takes buffers
 * in that engine's memory. Counts are in elements of the given dtype. All ranks of the communicator must
 * make the same collective calls in the same order with compatible arguments. */
#ifndef DTL_COMM_H
#define DTL_COMM_H

#include "dtl/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dtl_comm dtl_comm;

/* Which memory a communicator's buffers live in. */
typedef enum { DTL_MEMORY_HOST, DTL_MEMORY_DEVICE } dtl_memory;

DTL_API int dtl_comm_rank(const dtl_comm *c); /* -1 for NULL */
DTL_API int dtl_comm_size(const dtl_comm *c); /* -1 for NULL */
DTL_API dtl_memory dtl_comm_memory(const dtl_comm *c);
/* "mpi" or "nccl". */
DTL_API const char *dtl_comm_backend_name(const dtl_comm *c);
/* Releases dtl's resources. The engine communicator passed to the constructor stays the caller's. */
DTL_API void dtl_comm_destroy(dtl_comm *c);

/* Splits like MPI_Comm_split: ranks with equal color form one new communicator, ordered by key then
 * by old rank. Collective over c. color must be >= 0. */
DTL_API dtl_status dtl_comm_split(dtl_comm *c, int color, int key, dtl_comm **out);
/* Polls the engine for asynchronous errors (NCCL); DTL_ERR_COMM with the engine's message if one occurred. */
DTL_API dtl_status dtl_comm_check(dtl_comm *c);
/* Aborts outstanding work on the communicator (ncclCommAbort / MPI_Abort is NOT called for MPI:
 * on MPI this marks the communicator unusable). Further calls return DTL_ERR_COMM. */
DTL_API dtl_status dtl_comm_abort(dtl_comm *c);
/* Blocks until every rank has arrived. */
DTL_API dtl_status dtl_barrier(dtl_comm *c);

/* --- Root-based collectives. root is a rank of c. ------------------------------------------------ */
/* In place: buf on root is the source, on the others the destination. */
DTL_API dtl_status dtl_broadcast(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int root);
/* send (size*recv_count elements, read on root only) -> recv_count elements on each rank, in rank order.
 * On root, recv may equal send + rank*recv_count (in place). */
DTL_API dtl_status dtl_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, int root);
/* send_count elements from each rank -> size*send_count elements on root in rank order (recv read on root only). */
DTL_API dtl_status dtl_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t, int root);
/* Element-wise reduction of count elements; the result lands in recv on root only. send == recv is in place. */
DTL_API dtl_status dtl_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op, int root);

/* --- All-rank collectives. -------------------------------------------------------------------------- */
/* send_count from each rank -> size*send_count in rank order on every rank. send == recv + rank*send_count is in place. */
DTL_API dtl_status dtl_all_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t);
/* Uneven all-gather: rank r contributes recv_counts[r] elements (send_count must equal recv_counts[rank]);
 * recv holds the contributions packed in rank order. Zero counts are allowed. */
DTL_API dtl_status dtl_all_gatherv(dtl_comm *c, const void *send, size_t send_count, void *recv,
                                   const size_t *recv_counts, dtl_dtype t);
/* send == recv is in place. */
DTL_API dtl_status dtl_all_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op);
/* send holds size*recv_count elements; rank r receives block r of the reduction. */
DTL_API dtl_status dtl_reduce_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, dtl_reduce_op op);
/* Uneven reduce-scatter: send holds sum(recv_counts) elements packed in rank order; rank r receives
 * the reduction of block r (recv_counts[r] elements, zero allowed). */
DTL_API dtl_status dtl_reduce_scatterv(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts,
                                       dtl_dtype t, dtl_reduce_op op);
/* Block j (count_per_peer elements) of send goes to rank j; block i of recv came from rank i. */
DTL_API dtl_status dtl_all_to_all(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t);
/* Variable all-to-all: send_counts[j] elements go to rank j, recv_counts[i] arrive from rank i, both
 * packed in rank order. Counts must agree pairwise across ranks; zero counts are allowed. */
DTL_API dtl_status dtl_all_to_allv(dtl_comm *c, const void *send, const size_t *send_counts,
                                   void *recv, const size_t *recv_counts, dtl_dtype t);

/* --- Point to point. peer may equal the own rank only for a matching send/recv pair on one thread
 * of a backend that buffers (not recommended). ------------------------------------------------------- */
DTL_API dtl_status dtl_send(dtl_comm *c, const void *buf, size_t count, dtl_dtype t, int peer);
DTL_API dtl_status dtl_recv(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int peer);

#ifdef __cplusplus
}
#endif
#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* The NCCL backend: collectives on CUDA device memory, enqueued on one stream per communicator.
 *
 * Memory. Every buffer passed to a collective of an NCCL communicator is CUDA device memory (or managed
 * memory) of the communicator's device. Host pointers are not detected up front: they fail asynchronously,
 * and the failure surfaces as DTL_ERR_CUDA from dtl_comm_check, dtl_barrier or the next call that waits.
 *
 * Streams. A call makes the communicator's device current (restoring the caller's on return), enqueues its
 * work on the communicator's stream and returns without waiting: the results are ready once the stream
 * has been synchronized (cudaStreamSynchronize(dtl_comm_nccl_stream(c))) or after dtl_barrier, which
 * waits for everything enqueued before it. Buffers must stay allocated until then. Work the caller enqueues
 * on the same stream is ordered with dtl's for free; work on other streams needs the caller's events.
 * Communicators made by dtl_comm_split (and so every mesh sub-communicator) share their parent's stream,
 * so that the steps of one redistribution stay in order. The stream must outlive the dtl_comm and its
 * children. Scratch memory comes from the device's default stream-ordered pool (cudaMallocAsync).
 *
 * Engine mapping. broadcast, reduce, all_gather, all_reduce and reduce_scatter are the NCCL collectives.
 * scatter, gather, all_to_all and all_to_allv are one NCCL group of ncclSend/ncclRecv (zero counts
 * skipped; the own block is a device copy, none when in place). Uneven all-gather (dtl_all_gatherv) is
 * grouped send/recv too, not padding: each rank sends its block to every peer, so no scratch memory and
 * no bytes beyond the real blocks; equal counts take ncclAllGather. Uneven reduce-scatter is one group of
 * ncclReduce calls, one rooted at each block's owner; equal counts take ncclReduceScatter.
 * DTL_AVG is ncclAvg for floating types (NCCL pre-multiplies by 1/size, so rounding may differ from the
 * MPI backend in the last bit); for integer types it is an exact ncclSum followed by a division kernel
 * that truncates toward zero, as on MPI. The 8-bit floats move as ncclFloat8e4m3 / ncclFloat8e5m2 where both the
 * headers dtl was built with and the library are NCCL 2.24 or later (else as ncclUint8); their max and min (the only
 * reductions they have, <dtl/types.h>) are NCCL's FP8 reductions, which also need a device of compute capability
 * 9.0 or more: elsewhere they are DTL_ERR_UNSUPPORTED on that communicator, naming the NCCL version or the device,
 * and so is a Partial(max/min) layout of those dtypes on its meshes. dtl_send/dtl_recv to the own rank return DTL_ERR_UNSUPPORTED
 * (NCCL does not buffer; it would never complete). dtl_sendrecv is one group of ncclSend + ncclRecv, a
 * device copy when both peers are the own rank; dtl_sendrecv_async is DTL_ERR_UNSUPPORTED. In-place all-to-all is DTL_ERR_INVALID_ARGUMENT.
 * Counts that disagree between ranks cannot be detected by NCCL and are undefined behaviour (a hang).
 *
 * Errors. Every collective first polls ncclCommGetAsyncError; an asynchronous error (a failed peer, a
 * network error) is returned as DTL_ERR_COMM with ncclGetLastError's text, as are synchronous NCCL errors.
 * CUDA failures are DTL_ERR_CUDA with the runtime's message. dtl_barrier waits by polling both the stream
 * and NCCL's error state (yielding the CPU between polls), so a failure there returns instead of hanging.
 * On a non-blocking ncclComm_t (ncclConfig_t.blocking = 0) each call waits until NCCL has finished
 * enqueuing (ncclInProgress settles).
 * With a deadline (comm.h, dtl_comm_set_timeout) every wait for the stream also ends with DTL_ERR_TIMEOUT once
 * the deadline passes, and the communicator has failed then.
 * After an error, dtl_comm_abort stops dtl's use of the communicator. On a communicator dtl made (a split) it
 * calls ncclCommAbort, which frees it. The caller's own ncclComm_t (the one passed to dtl_comm_from_nccl) stays
 * the caller's: dtl does not abort or free it, and the caller calls ncclCommAbort on it to release work blocked in
 * it (dtl_comm_destroy is still needed and does not touch it). Aborting a communicator does not abort the
 * communicators split from it; abort each (dtl_mesh_destroy destroys them). */
#ifndef DTL_NCCL_H
#define DTL_NCCL_H

#include <cuda_runtime.h>
#include <nccl.h>
#include "dtl/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Wraps comm; all work is enqueued on stream (0 = the legacy default stream), which must belong to the
 * comm's device. The ncclComm_t stays the caller's: neither dtl_comm_destroy nor dtl_comm_abort destroys it. Communicators split from the result are dtl's and are destroyed by
 * dtl_comm_destroy. NCCL has no host channel to learn nodes on: the communicator counts as one node, unless
 * DTL_RANKS_PER_NODE=n puts n consecutive ranks of comm on each node (splits count as one node). */
DTL_API dtl_status dtl_comm_from_nccl(ncclComm_t comm, cudaStream_t stream, dtl_comm **out);
/* The stream of an NCCL communicator; NULL for NULL or a communicator of another backend. */
DTL_API cudaStream_t dtl_comm_nccl_stream(const dtl_comm *c);
/* The NCCL communicator underneath (the caller's, or one dtl made by splitting); NULL for NULL, another
 * backend, or after dtl_comm_abort. */
DTL_API ncclComm_t dtl_comm_nccl_handle(const dtl_comm *c);
/* How many CUDA devices this process can see (0 when there are none or cudaGetDeviceCount fails).
 * Only in a build with CUDA, like this header. */
DTL_API int dtl_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif

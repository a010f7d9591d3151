/* SPDX-License-Identifier: Apache-2.0 */
/* The NCCL backend: collectives on CUDA device memory, enqueued on one stream per communicator. */
#ifndef DTL_NCCL_H
#define DTL_NCCL_H

#include <cuda_runtime.h>
#include <nccl.h>
#include "dtl/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Wraps comm; all work is enqueued on stream. The calls return once the work is enqueued and errors
 * that NCCL reports synchronously are checked; asynchronous errors surface from dtl_comm_check and from
 * every later call. The ncclComm_t stays the caller's (dtl_comm_destroy does not destroy it). */
DTL_API dtl_status dtl_comm_from_nccl(ncclComm_t comm, cudaStream_t stream, dtl_comm **out);
DTL_API cudaStream_t dtl_comm_nccl_stream(const dtl_comm *c);
/* Whether this process can see a CUDA device (0 when none, or when dtl was built without CUDA). */
DTL_API int dtl_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif

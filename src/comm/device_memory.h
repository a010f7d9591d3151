/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. C-callable launchers of the CUDA kernels behind the NCCL transport's memory
 * ops (src/comm/device_memory.cu), for any layer that works on device memory. Each launcher enqueues on
 * stream and returns; the caller must have made the stream's device current. Failures return DTL_ERR_CUDA
 * with the CUDA runtime's message, prefixed by fn. */
#ifndef DTL_DEVICE_MEMORY_H
#define DTL_DEVICE_MEMORY_H

#include <cuda_runtime.h>
#include "comm/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes device current for a call (*prev gets the device to restore, -1 when none) and restores it,
 * returning st, so every CUDA call of dtl runs on its memory's device whatever the caller's current one. */
dtl_status dtl__cuda_device_enter(int device, const char *fn, int *prev);
dtl_status dtl__cuda_device_leave(int prev, dtl_status st);

/* Records "fn: CUDA error <code> (<name>): <description>" and returns DTL_ERR_CUDA. */
dtl_status dtl__cuda_error(const char *fn, cudaError_t e);

/* dtl__host_copy_box on device memory, as one kernel launch: the same semantics, including an empty
 * extent copying nothing and ndim == 0 copying one element. src and dst must not overlap. */
dtl_status dtl__cuda_copy_box(const void *src, void *dst, const dtl__box_copy *box, cudaStream_t stream);

/* Runs the copy_box kernel's index arithmetic (dim merging, vector width, per-row offsets) on the host
 * over host memory. It exists so that tests can check that arithmetic against dtl__host_copy_box on a
 * machine without a GPU; it is not a fast path. */
dtl_status dtl__cuda_copy_box_emulate(const void *src, void *dst, const dtl__box_copy *box);

/* dtl__host_fill_identity on device memory. */
dtl_status dtl__cuda_fill_identity(void *dst, size_t count, dtl_dtype t, dtl_reduce_op op, cudaStream_t stream);

/* buf[i] /= divisor for count elements in place: the second half of DTL_AVG where the engine has no
 * average of its own. Integers truncate toward zero (C division); f16/bf16 divide in f32 and round to
 * nearest even. divisor must be >= 1. */
dtl_status dtl__cuda_divide(void *buf, size_t count, dtl_dtype t, int divisor, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

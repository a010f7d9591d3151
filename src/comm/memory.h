/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The memory interface: the operations on the buffers of one kind of memory
 * (allocation, copies, N-d box copies, fills), kept apart from the transports that move bytes between ranks,
 * as UCC keeps its memory components (mc/) apart from its transports (tl/). Host memory is filled in
 * host_memory.c, CUDA device memory in memory_cuda.c; a communicator carries the memory of its engine. */
#ifndef DTL_COMM_MEMORY_H
#define DTL_COMM_MEMORY_H

#include "common/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An N-d sub-box copy between two row-major arrays: dst[dst_off + i] = src[src_off + i] for every index i
 * inside extent. Both arrays have ndim dims. Used for pack/unpack, local slicing and layout conversion. */
typedef struct {
  int ndim;
  size_t elem_size;
  int64_t extent[DTL_MAX_TENSOR_DIMS];
  int64_t src_shape[DTL_MAX_TENSOR_DIMS], src_off[DTL_MAX_TENSOR_DIMS];
  int64_t dst_shape[DTL_MAX_TENSOR_DIMS], dst_off[DTL_MAX_TENSOR_DIMS];
} dtl__box_copy;

typedef struct dtl__mem dtl__mem;

typedef struct dtl__mem_ops {
  const char *name; /* "host", "cuda" */
  dtl_memory memory;
  /* A buffer of bytes (0 allowed: a unique pointer). Device memory comes from the stream-ordered pool. */
  dtl_status (*alloc)(const dtl__mem *m, size_t bytes, void **out);
  void (*free)(const dtl__mem *m, void *p);
  /* memmove semantics. */
  dtl_status (*copy)(const dtl__mem *m, void *dst, const void *src, size_t bytes);
  dtl_status (*set)(const dtl__mem *m, void *dst, int byte, size_t bytes);
  /* count elements of the identity of op (0 for sum/avg, 1 for prod, -inf/+inf or the extreme integer for
   * max/min). */
  dtl_status (*fill_identity)(const dtl__mem *m, void *dst, size_t count, dtl_dtype t, dtl_reduce_op op);
  dtl_status (*copy_box)(const dtl__mem *m, const void *src, void *dst, const dtl__box_copy *box);
} dtl__mem_ops;

/* One kind of memory and where its work is ordered: host memory has no device and no stream; device
 * memory names its CUDA device and the stream (a cudaStream_t) its copies and kernels are enqueued on. */
struct dtl__mem {
  const dtl__mem_ops *ops;
  int device;   /* -1 for host memory */
  void *stream; /* NULL for host memory */
};

extern const dtl__mem_ops dtl__host_mem_ops;
static inline dtl__mem dtl__mem_host(void) {
  dtl__mem m = {&dtl__host_mem_ops, -1, NULL};
  return m;
}
#if DTL_HAVE_NCCL
extern const dtl__mem_ops dtl__cuda_mem_ops;
#endif

static inline dtl_status dtl__mem_alloc(const dtl__mem *m, size_t bytes, void **out) { return m->ops->alloc(m, bytes, out); }
static inline void dtl__mem_free(const dtl__mem *m, void *p) { m->ops->free(m, p); }
static inline dtl_status dtl__mem_copy(const dtl__mem *m, void *dst, const void *src, size_t bytes) {
  return m->ops->copy(m, dst, src, bytes);
}
static inline dtl_status dtl__mem_set(const dtl__mem *m, void *dst, int byte, size_t bytes) {
  return m->ops->set(m, dst, byte, bytes);
}
static inline dtl_status dtl__mem_fill_identity(const dtl__mem *m, void *dst, size_t count, dtl_dtype t,
                                                dtl_reduce_op op) {
  return m->ops->fill_identity(m, dst, count, t, op);
}
static inline dtl_status dtl__mem_copy_box(const dtl__mem *m, const void *src, void *dst, const dtl__box_copy *box) {
  return m->ops->copy_box(m, src, dst, box);
}

/* Host implementations, also callable directly on host arrays. */
dtl_status dtl__host_copy_box(const void *src, void *dst, const dtl__box_copy *box);
dtl_status dtl__host_fill_identity(void *dst, size_t count, dtl_dtype t, dtl_reduce_op op);

#ifdef __cplusplus
}
#endif
#endif

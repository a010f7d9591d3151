/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. It defines the one interface every transport fills (src/comm/mpi.c,
 * src/comm/nccl.c) and the memory operations the layers above use on that transport's memory. The public
 * entry points in comm.c validate arguments once, then call the vtable, which may assume valid input. */
#ifndef DTL_COMM_BACKEND_H
#define DTL_COMM_BACKEND_H

#include "common/internal.h"

#ifdef __cplusplus
extern "C" { /* device_memory.cu includes this file */
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

typedef struct dtl__comm_ops {
  const char *name; /* "mpi", "nccl" */
  dtl_memory memory;

  /* Collectives. Counts are elements; displacement-free forms are packed in rank order. */
  dtl_status (*broadcast)(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int root);
  dtl_status (*scatter)(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, int root);
  dtl_status (*gather)(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t, int root);
  dtl_status (*reduce)(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op, int root);
  dtl_status (*all_gather)(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t);
  dtl_status (*all_gatherv)(dtl_comm *c, const void *send, size_t send_count, void *recv, const size_t *recv_counts,
                            dtl_dtype t);
  dtl_status (*all_reduce)(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op);
  dtl_status (*reduce_scatter)(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                               dtl_reduce_op op);
  dtl_status (*reduce_scatterv)(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts, dtl_dtype t,
                                dtl_reduce_op op);
  dtl_status (*all_to_all)(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t);
  dtl_status (*all_to_allv)(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                            const size_t *recv_counts, dtl_dtype t);
  dtl_status (*send)(dtl_comm *c, const void *buf, size_t count, dtl_dtype t, int peer);
  dtl_status (*recv)(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int peer);
  dtl_status (*barrier)(dtl_comm *c);

  /* Nonblocking forms (NULL where the transport has none): start the operation and store a request made by
   * the transport in *req. wait completes and frees it (whatever the outcome); test only polls. */
  dtl_status (*all_gather_async)(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t,
                                 dtl_request **req);
  dtl_status (*all_gatherv_async)(dtl_comm *c, const void *send, size_t send_count, void *recv,
                                  const size_t *recv_counts, dtl_dtype t, dtl_request **req);
  dtl_status (*all_reduce_async)(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t,
                                 dtl_reduce_op op, dtl_request **req);
  dtl_status (*reduce_scatter_async)(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                                     dtl_reduce_op op, dtl_request **req);
  dtl_status (*all_to_all_async)(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t,
                                 dtl_request **req);
  dtl_status (*all_to_allv_async)(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                  const size_t *recv_counts, dtl_dtype t, dtl_request **req);
  dtl_status (*wait)(dtl_request *req);
  dtl_status (*test)(dtl_request *req, bool *done);

  /* Lifetime and errors. */
  dtl_status (*split)(dtl_comm *c, int color, int key, dtl_comm **out);
  dtl_status (*check)(dtl_comm *c);
  dtl_status (*abort)(dtl_comm *c);
  void (*destroy)(dtl_comm *c);

  /* Memory of this transport (host: malloc/memcpy; device: cudaMalloc/kernels on the comm's stream). */
  dtl_status (*mem_alloc)(dtl_comm *c, size_t bytes, void **out);
  void (*mem_free)(dtl_comm *c, void *p);
  dtl_status (*mem_copy)(dtl_comm *c, void *dst, const void *src, size_t bytes);
  dtl_status (*mem_set)(dtl_comm *c, void *dst, int byte, size_t bytes);
  /* Fills count elements with the identity of op (0 for sum/avg, 1 for prod, -inf/+inf or the extreme
   * integer for max/min). */
  dtl_status (*mem_fill_identity)(dtl_comm *c, void *dst, size_t count, dtl_dtype t, dtl_reduce_op op);
  dtl_status (*copy_box)(dtl_comm *c, const void *src, void *dst, const dtl__box_copy *box);
  /* Waits until all work enqueued on the communicator is done (no-op on MPI). */
  dtl_status (*synchronize)(dtl_comm *c);
} dtl__comm_ops;

struct dtl_comm {
  const dtl__comm_ops *ops;
  int rank, size;
  bool aborted;
  void *impl; /* the backend's state */
};

/* The common head of every transport's request (the transport's own struct starts with it). */
struct dtl_request {
  dtl_comm *comm;
};

/* Address arithmetic on user pointers without forming NULL + offset (in-place and overlap tests). */
static inline bool dtl__ptr_at(const void *p, const void *base, size_t offset_bytes) {
  return (uintptr_t)p == (uintptr_t)base + offset_bytes;
}
static inline bool dtl__overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
  return a_bytes && b_bytes && (uintptr_t)a < (uintptr_t)b + b_bytes && (uintptr_t)b < (uintptr_t)a + a_bytes;
}

/* Host implementations shared by every transport whose memory the CPU can address. */
dtl_status dtl__host_copy_box(const void *src, void *dst, const dtl__box_copy *box);
dtl_status dtl__host_fill_identity(void *dst, size_t count, dtl_dtype t, dtl_reduce_op op);

/* Allocates a dtl_comm around impl (the backend fills the rest). */
dtl_status dtl__comm_new(const dtl__comm_ops *ops, int rank, int size, void *impl, dtl_comm **out);

#ifdef __cplusplus
}
#endif

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. It defines the one interface every transport fills (src/comm/mpi.c,
 * src/comm/nccl.c). Memory operations are not the transport's: a communicator carries the memory interface
 * (memory.h) of its engine's buffers. The public entry points in comm.c validate arguments once, then call
 * the vtable, which may assume valid input. */
#ifndef DTL_COMM_BACKEND_H
#define DTL_COMM_BACKEND_H

#include "comm/memory.h"

#ifdef __cplusplus
extern "C" { /* device_memory.cu includes this file */
#endif

typedef struct dtl__comm_ops {
  const char *name; /* "mpi", "nccl" */

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
  /* dest and source both this rank or both another; a self message has equal counts (comm.c checks). */
  dtl_status (*sendrecv)(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv, size_t recv_count,
                         int source, dtl_dtype t);
  dtl_status (*barrier)(dtl_comm *c);
  /* Optional (NULL where the transport has none): an all-to-all whose blocks sit at explicit element
   * displacements. send_counts[k] elements from send + send_displs[k] go to peer k; recv_counts[k] elements
   * from peer k land at recv + recv_displs[k]. Send blocks may overlap one another (one block sent to every
   * peer); receive blocks may not, nor overlap any send block. The executor uses it to send from and receive
   * into shards in place and to leave its own block out of the exchange (it copies that block itself). */
  dtl_status (*all_to_allv_displs)(dtl_comm *c, const void *send, const size_t *send_counts, const size_t *send_displs,
                                   void *recv, const size_t *recv_counts, const size_t *recv_displs, dtl_dtype t);
  /* Optional: a sparse exchange of point-to-point messages with the listed peers, none of them this rank: nsend
   * messages (send_peers[i], send_bufs[i], send_counts[i] > 0 elements) and nrecv (recv_peers, recv_bufs,
   * recv_counts), posted together and complete together. Only the ranks that move something take part (no
   * collective: a rank with nothing to move makes no call), so it runs over any subset of the communicator.
   * Messages between two ranks match in the order posted, and never with those of send/recv/sendrecv (the MPI
   * transport tags them apart). req NULL: returns once complete; otherwise a request for wait/test is stored
   * (a transport without nonblocking point-to-point returns DTL_ERR_UNSUPPORTED for that form). */
  dtl_status (*exchange)(dtl_comm *c, int nsend, const int *send_peers, const void *const *send_bufs,
                         const size_t *send_counts, int nrecv, const int *recv_peers, void *const *recv_bufs,
                         const size_t *recv_counts, dtl_dtype t, dtl_request **req);

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
  dtl_status (*sendrecv_async)(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv,
                               size_t recv_count, int source, dtl_dtype t, dtl_request **req);
  /* The nonblocking forms of reduce_scatterv and all_to_allv_displs (same arguments and rules), for the plans that
   * run nonblocking (dtl_plan_execute_async). */
  dtl_status (*reduce_scatterv_async)(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts,
                                      dtl_dtype t, dtl_reduce_op op, dtl_request **req);
  dtl_status (*all_to_allv_displs_async)(dtl_comm *c, const void *send, const size_t *send_counts,
                                         const size_t *send_displs, void *recv, const size_t *recv_counts,
                                         const size_t *recv_displs, dtl_dtype t, dtl_request **req);
  dtl_status (*wait)(dtl_request *req);
  dtl_status (*test)(dtl_request *req, bool *done);

  /* Lifetime and errors. */
  dtl_status (*split)(dtl_comm *c, int color, int key, dtl_comm **out);
  dtl_status (*check)(dtl_comm *c);
  dtl_status (*abort)(dtl_comm *c);
  void (*destroy)(dtl_comm *c);

  /* Waits until all work enqueued on the communicator is done (no-op on MPI). */
  dtl_status (*synchronize)(dtl_comm *c);
} dtl__comm_ops;

struct dtl_comm {
  const dtl__comm_ops *ops;
  dtl__mem mem; /* the memory of this engine's buffers */
  int rank, size;
  bool aborted;
  /* DTL_CHECK, read once when the communicator is made (a split inherits its parent's): every collective
   * entry point agrees on its call before communicating (agree.h). */
  bool check;
  /* What the agreement needs, acquired when the communicator is made so that taking part in one never
   * allocates (comm.h, CONTRIBUTING.md): host arrays for 3 x size verdicts and fingerprints and for size ranks,
   * and on device communicators the staging of every agreement exchange in device memory (agree.c). */
  int64_t *agree_host;
  int *agree_ranks;
  void *agree_buf; /* NULL on host communicators */
  /* Deadlines (deadline.h): the state every communicator split from one constructor shares (its timeout, and
   * whether one timed out), whether this is the constructor's own, and the mesh dim this one serves (-1: none;
   * named in timeout messages). */
  struct dtl__comm_fate *fate;
  bool fate_root;
  int mesh_dim;
  /* The node (host) of each rank: dense ids 0..nnodes-1 in order of first appearance (size entries, owned; all 0
   * until the transport learns better). Learned when the communicator is made (transports: mpi.c, nccl.c). */
  int *node;
  int nnodes;
  /* Why this communicator cannot reduce the 8-bit floats with max and min (NULL: it can), set by the transport when
   * it makes the communicator (nccl.c: an NCCL or a device without FP8 reductions); the text lives in impl. */
  const char *fp8_reduce_refusal;
  void *impl; /* the backend's state */
};

/* The common head of every request: a transport's own struct starts with it (wait and test NULL: the transport's
 * vtable completes it), and so does a request made above the transports (a plan's nonblocking execution), which
 * sets wait and test to its own. */
struct dtl_request {
  dtl_comm *comm;
  dtl_status (*wait)(dtl_request *req);
  dtl_status (*test)(dtl_request *req, bool *done);
};

/* Address arithmetic on user pointers without forming NULL + offset (in-place and overlap tests). */
static inline bool dtl__ptr_at(const void *p, const void *base, size_t offset_bytes) {
  return (uintptr_t)p == (uintptr_t)base + offset_bytes;
}
static inline bool dtl__overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
  return a_bytes && b_bytes && (uintptr_t)a < (uintptr_t)b + b_bytes && (uintptr_t)b < (uintptr_t)a + a_bytes;
}

/* Why c cannot reduce t with op (NULL: it can): the 8-bit floats' rule (dtl__reduce_rounds, its text in buf) or c's
 * refusal of their max and min. c may be NULL (an abstract mesh: the dtype's rule alone). */
const char *dtl__comm_reduce_refusal(const dtl_comm *c, dtl_dtype t, dtl_reduce_op op, char *buf, size_t cap);

/* Allocates a dtl_comm around impl whose buffers live in mem (the backend fills the rest); reads DTL_CHECK. Its
 * node table starts as one node. */
dtl_status dtl__comm_new(const dtl__comm_ops *ops, dtl__mem mem, int rank, int size, void *impl, dtl_comm **out);
/* Frees c and what it holds (its transport's state through ops->destroy, unless ops is NULL). */
void dtl__comm_free(dtl_comm *c);

/* The node of rank (0..size-1) of c, and how many nodes c's ranks span (the calibration and the meshes use these). */
int dtl__comm_node_of(const dtl_comm *c, int rank);
int dtl__comm_nnodes(const dtl_comm *c);
/* DTL_RANKS_PER_NODE: *n gets its value, 0 when unset or empty; anything but a whole number 1..INT_MAX is
 * DTL_ERR_INVALID_ARGUMENT naming the value (fn prefixes the message). */
dtl_status dtl__ranks_per_node_from_env(const char *fn, int *n);
/* Sets c's node table from keys[0..size) (ranks with equal keys share a node, keys >= 0), numbering the nodes in
 * order of first appearance. scratch: 2 x size ints. Local: no communication, no allocation. */
void dtl__comm_set_node_keys(dtl_comm *c, const int *keys, int *scratch);

#ifdef __cplusplus
}
#endif

#endif

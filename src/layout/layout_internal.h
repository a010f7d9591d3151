/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. It defines the mesh and layout objects so that the redistribution layer
 * above can read them without accessor calls on its hot path, and the box math it shares with them. */
#ifndef DTL_LAYOUT_INTERNAL_H
#define DTL_LAYOUT_INTERNAL_H

#include "comm/backend.h"
#include "common/chunk.h"

/* What the layer above memoizes per mesh (redistribute keeps its plan cache here), freed with the mesh. It
 * lives on the mesh rather than in a global so that dtl keeps no hidden process state. It is no part of the
 * mesh's value: a call on a const mesh may fill it (a logically-const memo, used by one thread at a time like
 * everything built on the mesh's communicator, see <dtl/comm.h>), which is why the mesh reaches it through a
 * pointer. */
typedef struct {
  void *cache;
  void (*cache_free)(void *cache);
} dtl__mesh_memo;

struct dtl_mesh {
  /* The communicator over the mesh's ranks: dtl_mesh_create's (not owned), or made by dtl_mesh_create_from_ranks
   * (owned); NULL for an abstract mesh and on a rank outside the mesh. */
  dtl_comm *comm;
  /* The communicator whose ranks the mesh's ranks are (dtl_mesh_create: comm itself; from ranks: the parent; not
   * owned; NULL for an abstract mesh), and the parent rank of each mesh rank in row-major order (size entries,
   * owned; NULL when mesh rank r is parent rank r). Plans between two meshes of one parent run on it. */
  dtl_comm *parent;
  int *ranks;
  bool member;    /* this rank is in the mesh (abstract meshes: the rank at coord) */
  bool owns_comm; /* comm was made for the mesh */
  /* Equal on every rank of one dtl_mesh_create and different across creations (0 for an abstract mesh), so
   * that a DTL_CHECK fingerprint tells two meshes of one shape apart. */
  uint64_t id;
  int ndim, size;
  int shape[DTL_MAX_MESH_DIMS];
  int coord[DTL_MAX_MESH_DIMS];          /* all zeros outside the mesh */
  dtl_comm *dim_comm[DTL_MAX_MESH_DIMS]; /* owned; NULL outside the mesh */
  dtl__mesh_memo *memo;                  /* never NULL; allocated with the mesh */
  /* The nodes: an abstract mesh's ranks per node (0: one node), and per mesh dim whether some group along it holds
   * ranks of two nodes (its steps then pay the inter-node link class), the same on every rank of the parent. */
  int ranks_per_node;
  bool dim_inter[DTL_MAX_MESH_DIMS];
};

struct dtl_layout {
  const dtl_mesh *mesh;
  dtl_dtype dtype;
  int ndim;
  int64_t shape[DTL_MAX_TENSOR_DIMS];
  dtl_placement placements[DTL_MAX_MESH_DIMS]; /* normalised: shard dims in 0..ndim-1 */
  /* This rank's box, computed once at creation. */
  int64_t local_shape[DTL_MAX_TENSOR_DIMS], local_offset[DTL_MAX_TENSOR_DIMS];
  size_t local_count, global_count;
};

/* This rank's mesh rank (row-major position of its coordinate), -1 outside the mesh. */
static inline int dtl__mesh_index(const dtl_mesh *m) {
  if (!m->member) return -1;
  int r = 0;
  for (int d = 0; d < m->ndim; d++) r = r * m->shape[d] + m->coord[d];
  return r;
}
/* The parent rank of mesh rank r. */
static inline int dtl__mesh_parent_rank(const dtl_mesh *m, int r) { return m->ranks ? m->ranks[r] : r; }
/* The distance in mesh ranks between neighbours along mesh dim d (row-major: the product of the later dims). */
static inline int dtl__mesh_stride(const dtl_mesh *m, int d) {
  int stride = 1;
  for (int e = d + 1; e < m->ndim; e++) stride *= m->shape[e];
  return stride;
}
/* The node of mesh rank r: its parent rank's, or on an abstract mesh r / ranks_per_node. */
static inline int dtl__mesh_node(const dtl_mesh *m, int r) {
  if (!m->parent) return m->ranks_per_node ? r / m->ranks_per_node : 0;
  return dtl__comm_node_of(m->parent, dtl__mesh_parent_rank(m, r));
}
/* The memory of the mesh's buffers: its communicator's, the parent's outside the mesh, host on abstract meshes. */
static inline const dtl__mem *dtl__mesh_mem(const dtl_mesh *m) {
  static const dtl__mem host = {&dtl__host_mem_ops, -1, NULL};
  return m->comm ? &m->comm->mem : m->parent ? &m->parent->mem : &host;
}

/* The local box of the rank at coord for placements p over shape (no validation): the one rule that every
 * layer (layout queries, planner byte counts, executor pack boxes) shares. */
void dtl__local_box(const dtl_mesh *m, int ndim, const int64_t *shape, const dtl_placement *p, const int *coord,
                    int64_t *box_shape, int64_t *box_offset);
/* Validates (mesh, dtype, shape, placements) as dtl_layout_create does, messages prefixed by fn, and fills l. */
dtl_status dtl__layout_init(dtl_layout *l, const char *fn, const dtl_mesh *m, dtl_dtype t, int ndim, const int64_t *shape,
                            const dtl_placement *placements);
/* Hash and equality of (mesh, dtype, shape, placements), for plan caches and DTL_CHECK fingerprints. */
uint64_t dtl__layout_hash(const dtl_layout *l);
bool dtl__layout_equal(const dtl_layout *a, const dtl_layout *b);
/* Whether the rank at coord holds the identity instead of the value when a dense tensor is placed on l
 * (dtl_distribute, dtl_safetensors_read): some Partial(sum|prod) mesh dim has a coordinate other than 0 (the
 * lowest such dim's op names the identity, written to op when op is not NULL); max, min and avg keep the
 * value everywhere. */
bool dtl__layout_holds_identity(const dtl_layout *l, const int *coord, dtl_reduce_op *op);
/* The same for placements pl over mesh m. */
bool dtl__placements_hold_identity(const dtl_mesh *m, const dtl_placement *pl, const int *coord, dtl_reduce_op *op);

#endif

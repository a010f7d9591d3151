/* SPDX-License-Identifier: Apache-2.0 */
/* Device meshes: an N-d grid of the ranks of a communicator (all of them, or a list of them), row-major, with
 * one sub-communicator per mesh dim (the ranks that differ only in that coordinate).
 *
 * const. A const dtl_mesh * (as layouts, plans and TP contexts hold it) promises that the mesh's shape, its
 * coordinates and its communicators stay the same, not that no communication happens: the communicators a
 * mesh refers to are separate objects, returned mutable by dtl_mesh_comm and dtl_mesh_dim_comm, and calls on
 * const layouts (dtl_redistribute, dtl_plan_execute) run collectives on them. dtl_redistribute also fills
 * the mesh's plan cache, a memo that is no part of the mesh's value. Both follow the thread rule of
 * <dtl/comm.h>: one thread at a time per communicator and everything built on it. */
#ifndef DTL_MESH_H
#define DTL_MESH_H

#include "dtl/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dtl_mesh dtl_mesh;

/* Collective over c. 1 <= ndim <= DTL_MAX_MESH_DIMS, every shape[i] >= 1, product == dtl_comm_size(c).
 * The mesh keeps a reference to c: destroy the mesh before c. */
DTL_API dtl_status dtl_mesh_create(dtl_comm *c, int ndim, const int *shape, dtl_mesh **out);
/* A mesh over some ranks of parent, e.g. one pipeline stage, or the prefill or the decode ranks of an engine.
 * Collective over parent: every parent rank calls it with the same arguments, and it agrees like
 * dtl_mesh_create (every rank gets a handle or every rank an error; DTL_ERR_MISMATCH when the arguments differ).
 * ranks[0..nranks) are distinct ranks of parent in mesh order (ranks[i] is mesh rank i, row-major), and
 * prod(shape) == nranks. Every parent rank gets a handle; on a rank outside the list it is a non-member handle
 * (dtl_mesh_is_member 0): layouts on it have empty local shards, plans can be made on it and between it and
 * another mesh of the same parent (dtl_plan_create), but it has no communicators (dtl_mesh_comm and
 * dtl_mesh_dim_comm return NULL, and dtl_mesh_coord gives -1s). The members' mesh communicator is a split of
 * parent that the mesh owns; the mesh keeps a reference to parent: destroy the mesh before parent. */
DTL_API dtl_status dtl_mesh_create_from_ranks(dtl_comm *parent, int nranks, const int *ranks, int ndim,
                                              const int *shape, dtl_mesh **out);
/* 1 when this rank is in the mesh (always for dtl_mesh_create and abstract meshes), else 0 (also for NULL). */
DTL_API int dtl_mesh_is_member(const dtl_mesh *m);
/* The communicator whose ranks the mesh's ranks are: dtl_mesh_create's comm, or the parent of
 * dtl_mesh_create_from_ranks (NULL on an abstract mesh). Two meshes with one parent can exchange tensors. */
DTL_API dtl_comm *dtl_mesh_parent(const dtl_mesh *m);
/* The parent rank of mesh rank `rank`. */
DTL_API dtl_status dtl_mesh_parent_rank(const dtl_mesh *m, int rank, int *parent_rank);
/* A mesh with no communicator, for planning, explaining and visualizing without an MPI launch (the `dtl`
 * tool uses it). coord is the coordinate plans are explained for (NULL = all zeros). Executing a plan on
 * it, or asking for its communicators, fails with DTL_ERR_INVALID_ARGUMENT / returns NULL. */
DTL_API dtl_status dtl_mesh_create_abstract(int ndim, const int *shape, const int *coord, dtl_mesh **out);
/* 1 for a mesh made by dtl_mesh_create_abstract, 0 for one with communicators. */
DTL_API int dtl_mesh_is_abstract(const dtl_mesh *m);
DTL_API int dtl_mesh_ndim(const dtl_mesh *m);                 /* -1 for NULL */
DTL_API int dtl_mesh_dim_size(const dtl_mesh *m, int mesh_dim); /* -1 when out of range */
DTL_API int dtl_mesh_size(const dtl_mesh *m);                 /* product of the shape */
/* This rank's coordinate, ndim entries (-1s on a rank outside the mesh). */
DTL_API void dtl_mesh_coord(const dtl_mesh *m, int *coord);
/* The communicator over the mesh's ranks (the one given to dtl_mesh_create, or the mesh's own for
 * dtl_mesh_create_from_ranks; NULL on an abstract mesh and outside the mesh). */
DTL_API dtl_comm *dtl_mesh_comm(const dtl_mesh *m);
/* The communicator along mesh_dim; its rank equals this rank's coordinate on mesh_dim. NULL out of range. */
DTL_API dtl_comm *dtl_mesh_dim_comm(const dtl_mesh *m, int mesh_dim);
/* Row-major conversions between a coordinate and a mesh rank (a rank of the mesh communicator). */
DTL_API dtl_status dtl_mesh_rank_of(const dtl_mesh *m, const int *coord, int *rank);
DTL_API dtl_status dtl_mesh_coord_of(const dtl_mesh *m, int rank, int *coord);
/* Nodes. A communicator learns the node (host) of each of its ranks when it is made: dtl_comm_from_mpi groups the
 * ranks that share memory (MPI_Comm_split_type MPI_COMM_TYPE_SHARED), or, with DTL_RANKS_PER_NODE=n in the
 * environment, n consecutive ranks of MPI_COMM_WORLD per node (to simulate nodes on one machine); dtl_comm_split
 * keeps them. NCCL communicators count as one node unless DTL_RANKS_PER_NODE is set (n consecutive ranks of the
 * NCCL communicator). A mesh dim crosses nodes when some group along it (the ranks differing only in that
 * coordinate) holds ranks of two nodes; the planner then prices its steps with the inter-node link class of the
 * cost model (inter_alpha_s, inter_beta_s_per_byte). *out gets 1 when mesh_dim crosses nodes, else 0. */
DTL_API dtl_status dtl_mesh_dim_crosses_nodes(const dtl_mesh *m, int mesh_dim, int *out);
/* *node gets the node of mesh rank `rank` (dense ids from 0, in order of first appearance on the parent). */
DTL_API dtl_status dtl_mesh_node_of(const dtl_mesh *m, int rank, int *node);
/* Gives an abstract mesh nodes of ranks_per_node consecutive mesh ranks (abstract meshes start on one node), for
 * planning as on that machine without MPI (`dtl plan --ranks-per-node`). Call it before making layouts on the
 * mesh. DTL_ERR_INVALID_ARGUMENT on a mesh with communicators (its nodes come from them) or ranks_per_node < 1. */
DTL_API dtl_status dtl_mesh_set_ranks_per_node(dtl_mesh *m, int ranks_per_node);
/* Frees the communicators the mesh made and its plan cache. */
DTL_API void dtl_mesh_destroy(dtl_mesh *m);

#ifdef __cplusplus
}
#endif
#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the executor and redistribute tests: meshes over parts of MPI_COMM_WORLD, a transport wrapper
 * that counts allocations, a dense integer-valued oracle tensor, local shards built from it for any layout
 * (Partial ones hold parts that reduce to the dense values), a whole-state checker, and random layouts. */
#ifndef DTL_TEST_REDISTRIBUTE_UTIL_H
#define DTL_TEST_REDISTRIBUTE_UTIL_H

#include <mpi.h>
#include <stdio.h>
#include "redistribute/plan_internal.h"

/* The meshes the property tests run: each at the world size equal to its rank count, except 1-D p=7, which
 * runs at 8 (one rank idle). */
typedef struct {
  int ndim, shape[3], np;
} tu_mesh_spec;
extern const tu_mesh_spec tu_meshes[];
extern const int tu_nmeshes;

/* Bytes of this rank's shard of the plan's tensor under placements pl. */
size_t tu_shard_bytes(const dtl_plan *p, const dtl_placement *pl);

/* A mesh over the first prod(shape) ranks of MPI_COMM_WORLD; ranks outside get mesh == NULL. The
 * communicator is wrapped by the counting transport below. */
typedef struct {
  MPI_Comm mpi;  /* the sub-communicator (MPI_COMM_NULL outside) */
  dtl_comm *comm;
  dtl_mesh *mesh;
  int ndim, shape[DTL_MAX_MESH_DIMS];
} tu_mesh;
int tu_mesh_open(int ndim, const int *shape, tu_mesh *out); /* collective over MPI_COMM_WORLD; 0 on success */
void tu_mesh_close(tu_mesh *m);
/* Opens tu_meshes[i] when it runs at this world size (false otherwise; a failure to open is a set-up failure
 * that stops every rank). The ranks outside the mesh get m->mesh == NULL; close it on every rank. */
bool tu_mesh_open_spec(int i, tu_mesh *m);
const char *tu_mesh_text(const tu_mesh *m);
/* "rule on mesh 2x4": the name a case run on m reports (one buffer, valid until the next call). */
const char *tu_case_name(const char *rule, const tu_mesh *m);

/* Two meshes over ranks of MPI_COMM_WORLD with one parent (tu_parent(): the world through the counting transport),
 * each with a checking communicator over its members in mesh order (tu_check_state works on either). Kinds:
 * disjoint halves (the second in reverse order), overlapping two-thirds, every rank reshaped (1-D, then reversed in
 * up to 3 dims), and every rank then every other rank. False when the world size does not allow the kind. */
enum { TU_DISJOINT, TU_OVERLAPPING, TU_RESHAPED, TU_SUBSET, TU_NPAIRS };
typedef struct {
  int kind;
  tu_mesh a, b;
} tu_pair;
bool tu_pair_open(int kind, int world, tu_pair *out); /* collective over MPI_COMM_WORLD */
void tu_pair_close(tu_pair *pr);
const char *tu_pair_text(const tu_pair *pr);
dtl_comm *tu_parent(void);
void tu_parent_close(void);
/* A mesh of shape (ndim dims) over the n ranks list[] of MPI_COMM_WORLD, in that order, on tu_parent() (collective
 * over MPI_COMM_WORLD; 0 on success). */
int tu_sub_open(int n, const int *list, int ndim, const int *shape, tu_mesh *m);

/* The wrapped transports' nonblocking starts (every *_async entry and every exchange with a request), counted over
 * every communicator; the tu_fail_at-th (counted from the start of the process) fails with DTL_ERR_COMM and starts
 * nothing (0: none fails). */
extern long tu_starts, tu_fail_at;

/* Allocation counts of the wrapped transports (every mem_alloc of every communicator of every tu_mesh). */
typedef struct {
  int calls;
  size_t bytes_max, bytes_total;
} tu_alloc_stats;
extern tu_alloc_stats tu_allocs;
/* Meshes opened while this is set get the wrapped transport without its optional vtable entries (the
 * executor then takes the paths a transport without them, such as NCCL, takes). */
extern bool tu_plain_transport;
/* Pass `pass` of a test that sweeps executor chunk sizes chunks[0..nchunks) on the MPI transport and then
 * again without its optional entries (the path NCCL takes): sets both, prints the pass on rank 0, and
 * returns the chunk size in force (0 = the executor's default). */
size_t tu_begin_pass(int pass, const size_t *chunks, int nchunks, int world_rank);

/* Deterministic 64-bit mixing and a small PRNG. */
uint64_t tu_hash(uint64_t a, uint64_t b);
typedef struct {
  uint64_t s;
} tu_rng;
uint64_t tu_next(tu_rng *r);
int tu_uniform(tu_rng *r, int n); /* 0..n-1 */

/* Typed access to integer-valued elements (every dtype). */
double tu_get(const void *buf, dtl_dtype t, size_t i);
void tu_set(void *buf, dtl_dtype t, size_t i, double v);

/* The dense tensor for seed: integers in [-20, 20] ([0, 40] for u8; the 8-bit floats hold them rounded, 17 as 16). */
void tu_dense(uint64_t seed, dtl_dtype t, size_t count, void *out);
/* This rank's shard of l for the dense tensor D (seeded noise: Partial(sum|avg) parts that sum to D,
 * max/min parts bounded by D with one equal to it, prod parts of +-1 with one holding the rest). Every
 * Partial dim of l must share one op. */
void tu_make_local(const dtl_layout *l, const void *dense, uint64_t seed, void *local);
/* Collective over the mesh: gathers every rank's shard of l and checks that for every element, the
 * reduction over the Partial coordinates (for each coordinate of the other mesh dims) equals D. Returns the
 * number of wrong elements (the same on every rank); prints the first few on rank 0 when label is set. */
long tu_check_state(const tu_mesh *m, const dtl_layout *l, const void *local, const void *dense, const char *label);

/* Random placements for m with tensor rank nd: R, S(d) or P; all Partial dims share one op (avg only for
 * float dtypes; max or min for the 8-bit floats, which hold no other). */
void tu_random_placements(tu_rng *r, int mesh_ndim, int nd, dtl_dtype t, dtl_placement *out);
/* "S(0),R" */
const char *tu_placements_text(const dtl_placement *p, int n, char *buf, size_t cap);

/* A legal route from src to dst (every step changes one mesh dim, a shard change touches only the innermost
 * split of its tensor dim), shortest in steps, random among equals: a hand-built plan, independent of the
 * planner, compiled as dtl_plan_create compiles its plans (free what that attaches with dtl__plan_release).
 * Returns 0 on success. */
int tu_route_plan(const dtl_layout *src, const dtl_layout *dst, uint64_t seed, dtl_plan *out);

/* Sums the bytes of a buffer (to show that a source was not written). */
uint64_t tu_checksum(const void *buf, size_t bytes);

#endif

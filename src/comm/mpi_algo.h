/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to the MPI transport (mpi.c, mpi_algo.c, mpi_algo_table.c). It names the collectives
 * whose algorithm the transport chooses and dtl's own algorithms for them, the table that chooses (defaults,
 * DTL_ALGO_TABLE, DTL_ALGO; the format is written down in mpi_algo_table.c and the README), and the pieces the
 * algorithms are made of: point-to-point exchanges cut into pieces of at most `limit` elements, and the
 * rank-order fold that makes every algorithm's reduction bitwise the same. */
#ifndef DTL_COMM_MPI_ALGO_H
#define DTL_COMM_MPI_ALGO_H

#include <mpi.h>
#include "comm/backend.h"

/* --- the table ------------------------------------------------------------------------------------------- */
typedef enum {
  DTL__COLL_ALL_REDUCE,
  DTL__COLL_REDUCE_SCATTER, /* and reduce_scatterv */
  DTL__COLL_ALL_GATHER,     /* and all_gatherv */
  DTL__COLL_ALL_TO_ALL,
  DTL__COLL_ALL_TO_ALLV, /* and the executor's all_to_allv_displs; chosen by ranks only (counts differ by rank) */
  DTL__COLL_REDUCE,
  DTL__NCOLLS, /* the collectives of the table; the two below run dtl's direct algorithm for large calls only */
  DTL__COLL_GATHER = DTL__NCOLLS,
  DTL__COLL_SCATTER
} dtl__coll;

typedef enum {
  DTL__ALGO_MPI,         /* the MPI call */
  DTL__ALGO_DIRECT,      /* every block straight to its destination, all transfers at once */
  DTL__ALGO_RING,        /* all-gather in p-1 ring steps */
  DTL__ALGO_A2A_FOLD,    /* reduce-scatter: the blocks all-to-all, then a rank-order fold */
  DTL__ALGO_RS_AG,       /* all-reduce: a2a_fold reduce-scatter, then a direct all-gather */
  DTL__ALGO_AG_FOLD,     /* all-reduce: every vector to every rank, then a rank-order fold */
  DTL__ALGO_RS_GATHER,   /* reduce: a2a_fold reduce-scatter, then the blocks to root */
  DTL__ALGO_GATHER_FOLD, /* reduce: every vector to root, then a rank-order fold */
  DTL__ALGO_CHAIN,       /* reduce: a pipeline 0 -> 1 -> ... -> p-1 (-> root), each rank adding its own */
  DTL__NALGOS
} dtl__algo;

/* Which calls a row covers: reductions whose result depends on the order of the ranks' contributions
 * (floating SUM, PROD, AVG over 3 or more ranks: "exact", where only dtl's rank-order algorithms may run), or
 * the others ("any": integers, MAX, MIN, two ranks, and the collectives that do not reduce). */
typedef enum { DTL__CLASS_ANY = 1, DTL__CLASS_EXACT = 2, DTL__CLASS_BOTH = 3 } dtl__class;

typedef struct {
  uint8_t coll, cls, algo;
  int pmin, pmax;     /* ranks covered, pmax INT_MAX for "N-*" */
  uint64_t min_bytes; /* from this call size up (the larger buffer of one rank, in bytes) */
} dtl__algo_row;

#define DTL__ALGO_MAX_ROWS 64

typedef struct {
  int nrows;
  dtl__algo_row rows[DTL__ALGO_MAX_ROWS];
  int8_t forced[DTL__NCOLLS]; /* DTL_ALGO: an algorithm, or -1 (the table decides) */
  uint64_t fp;                /* fingerprint of rows and forced choices: every rank must have the same */
} dtl__algo_table;

const char *dtl__coll_name(dtl__coll k);
const char *dtl__algo_name(dtl__algo a);

/* Whether a is one of coll's algorithms. */
bool dtl__algo_allowed(dtl__coll coll, dtl__algo a);
/* The table of an MPI communicator, which dtl_mpi_algorithm_calibrate replaces; NULL for another transport. */
dtl__algo_table *dtl__mpi_table_of(dtl_comm *c);

/* The built-in table. */
void dtl__algo_table_default(dtl__algo_table *t);
/* Replaces t's rows by the rows of text (the DTL_ALGO_TABLE format); source names the text in messages. */
dtl_status dtl__algo_table_parse(dtl__algo_table *t, const char *text, const char *fn, const char *source);
/* Applies DTL_ALGO text ("coll:algo,..."), naming the entry that is malformed. */
dtl_status dtl__algo_force_parse(dtl__algo_table *t, const char *text, const char *fn);
/* The table of a communicator made now: the defaults, or the rows of the profile DTL_PROFILE names, or the file
 * DTL_ALGO_TABLE names (which wins over the profile's), then DTL_ALGO; the profile's fingerprint joins the table's.
 * prof (may be NULL) receives the profile, its engine "" when DTL_PROFILE is unset. */
struct dtl__profile;
dtl_status dtl__algo_table_from_env(dtl__algo_table *t, const char *fn, struct dtl__profile *prof);
/* t in the DTL_ALGO_TABLE format, with comments listing the algorithms; returns the length it needs
 * (snprintf-like). */
size_t dtl__algo_table_render(const dtl__algo_table *t, char *buf, size_t cap);

/* A call's class: exact for floating SUM/PROD/AVG over 3 or more ranks. */
dtl__class dtl__algo_class(bool reduces, dtl_dtype t, dtl_reduce_op op, int p);
/* The algorithm a call runs: DTL_ALGO's choice, else the table's row for (coll, cls, p, bytes). Then a
 * nonblocking start (async) that cannot post all its transfers at once (rs_ag, ring, rs_gather, chain) runs the
 * collective's one-shot algorithm, and a call with a count or displacement beyond the transport's limit
 * (large) runs a dtl algorithm instead of `mpi` (all_to_allv excepted: only this rank knows it is large).
 * Every input is the same on every rank, so every rank picks the same algorithm. */
dtl__algo dtl__algo_pick(const dtl__algo_table *t, dtl__coll coll, dtl__class cls, int p, size_t bytes, bool async,
                         bool large);

/* --- the algorithms ---------------------------------------------------------------------------------------- */
/* One transfer: count elements of buf to (send) or from peer. */
typedef struct {
  char *buf;
  size_t count;
  int peer;
  bool send;
} dtl__xfer;

/* What an algorithm needs of the communicator. A blocking call posts one round of pieces at a time into the
 * communicator's request array (2 x size) and uses its scratch buffer; a nonblocking start posts all its
 * pieces at once (reqs grows into reqs_heap, which the request frees) and leaves its completion to
 * dtl__algo_finish. x and offs are the communicator's (2 x size each), used only while a call posts. */
typedef struct {
  dtl_comm *c; /* whose deadline a blocking call's waits keep (dtl__mpi_waitall) */
  MPI_Comm comm;
  int rank, size, tag;
  size_t limit; /* the most elements one MPI call moves (INT_MAX; tests lower it) */
  MPI_Datatype dt;
  size_t es;
  dtl_dtype t;
  dtl_reduce_op op;
  bool nonblocking;
  dtl__xfer *x;
  int nx;
  size_t *offs;
  MPI_Request *reqs;
  int nreqs, reqs_cap;
  MPI_Request *reqs_heap;
  MPI_Request *window; /* blocking: 2 x size more, for the receives a chain's root keeps open */
  void *scratch;       /* at least dtl__algo_scratch_bytes */
} dtl__algo_ctx;

/* The transport's message for a failed MPI call (mpi.c). */
dtl_status dtl__mpi_error(const char *fn, int rc);
/* Completes n requests (sts may be MPI_STATUSES_IGNORE): MPI_Waitall, or under c's deadline MPI_Testall polled
 * with back-off until DTL_ERR_TIMEOUT (mpi.c). Every blocking wait of the MPI transport is this one. */
dtl_status dtl__mpi_waitall(dtl_comm *c, const char *fn, int n, MPI_Request *reqs, MPI_Status *sts);

/* What completes a call once its transfers are done, in this order: the rank-order fold of size blocks into
 * fold_out (block q is fold_own for q == rank, else fold_others + slot(q) x fold_stride bytes, slot skipping
 * rank), a move of bytes (an in-place call's result into place), DTL_AVG's division. A blocking dtl algorithm
 * does its own; the MPI calls and the nonblocking starts record theirs here for the end of the call or the
 * wait. */
typedef struct {
  dtl_dtype t;
  dtl_reduce_op op;
  int rank, size;
  void *fold_out;
  const void *fold_own;
  const char *fold_others;
  size_t fold_stride, fold_n;
  void *move_dst;
  const void *move_src;
  size_t move_bytes;
  void *avg_buf;
  size_t avg_n;
} dtl__algo_after;

/* A call's arguments, all forms in one (counts NULL: count elements per rank, or count in all). */
typedef struct {
  const char *fn;
  dtl__coll coll;
  dtl__algo algo;
  const void *send;
  void *recv;
  size_t count;
  const size_t *counts; /* reduce_scatterv, all_gatherv: per-rank counts; all_to_allv: send counts */
  const size_t *rcounts, *sdispls, *rdispls; /* all_to_allv (displs NULL: packed) */
  int root;                                   /* reduce, gather, scatter */
  bool in_place; /* all_to_all(v): send == recv describe one exchange (counts equal pairwise) */
} dtl__algo_call;

/* Scratch bytes the call needs: a formula of arguments every rank passes alike, so that the communicator's
 * grow-only buffer has the same size on every rank (its growth is agreed; mpi.c). A nonblocking start gets
 * a buffer of its own. */
size_t dtl__algo_scratch_bytes(const dtl__algo_ctx *x, const dtl__algo_call *a);
/* Runs (blocking) or starts (nonblocking, filling after) the call's dtl algorithm. */
dtl_status dtl__algo_run(dtl__algo_ctx *x, const dtl__algo_call *a, dtl__algo_after *after);
void dtl__algo_finish(const dtl__algo_after *after);

/* The rank-order fold: out[i] = ((src(0)[i] op src(1)[i]) op src(2)[i]) ... op src(p-1)[i], each step rounded
 * to the dtype (f16/bf16: computed in f32, rounded back), DTL_AVG as DTL_SUM. out may be own. */
void dtl__fold(void *out, const void *own, int rank, const void *others, size_t stride, int p, size_t n, dtl_dtype t,
               dtl_reduce_op op);
/* DTL_AVG's division of n elements by p (integers truncate toward zero). */
void dtl__divide(void *buf, size_t n, dtl_dtype t, int p);

/* Test hook: the largest count or displacement one MPI call gets on c (INT_MAX; 1..INT_MAX), so that the
 * paths of large calls run on small buffers. Every rank of c must set the same; a split inherits it. */
dtl_status dtl__mpi_set_limit(dtl_comm *c, size_t limit);

/* Pieces of at most limit elements, as MPI ints (limit <= INT_MAX). */
static inline size_t dtl__pieces(size_t count, size_t limit) { return count ? (count - 1) / limit + 1 : 0; }

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The compiled form of a plan and what the executor's three parts share:
 * compile.c derives it once, when the plan is created (this rank's boxes, every peer's box on the dims a step
 * splits, chunking, where each intermediate shard lives); the runners (runners.c, all_to_all.c, exchange.c) carry
 * out one step from it, part by part; the driver (executor.c) checks a call's buffers and walks the steps. Once compiled, running a
 * plan allocates nothing and reads no environment. */
#ifndef DTL_EXECUTOR_INTERNAL_H
#define DTL_EXECUTOR_INTERNAL_H

#include <string.h>
#include "redistribute/redistribute_internal.h"

/* What one step does on this rank. Local steps that leave this rank's values as they are, and every step on
 * a mesh dim of size 1, become EX_NONE: the data stays where it is (no copy). */
typedef enum {
  EX_NONE,
  EX_FILL,
  EX_SLICE,
  EX_ALL_REDUCE,
  EX_GATHER,
  EX_REDUCE_SCATTER,
  EX_ALL_TO_ALL,
  EX_EXCHANGE,
  EX_EMBED /* fills the output box with the identity of rop, then copies the input box to its place in it */
} dtl__ex_op;

/* Places a shard can live in. SRC is read-only; DST and SCR hold a data region at offset 0 and, during a
 * step, a temporary region right after it. */
enum { AT_SRC, AT_DST, AT_SCR, AT_NPLACES, AT_NONE = -1 };

/* Every peer's box along the step's mesh dim, before (side 0) or after (side 1) the step. A peer's box
 * differs from this rank's only on the tensor dim that the mesh dim shards on that side (dim; -1 when it
 * shards none: then every peer's box is this rank's). */
typedef struct {
  int dim;
  const int64_t *ext, *off; /* [g]: each peer's extent and offset on dim */
  const size_t *count;      /* [g]: each peer's element count */
} dtl__ex_peers;

/* One message of an exchange, with peer (a rank of the exchange's communicator): the global box it carries, and
 * whether that box is one contiguous run of this rank's box on its side (at element offset at), so that it moves in
 * place. */
typedef struct {
  int peer;
  bool run;
  int same; /* a send that carries the same box as the earlier send `same` (replicated targets): sent from its
               buffer, packed once; -1 otherwise */
  size_t count, at;
  int64_t shape[DTL_MAX_TENSOR_DIMS], off[DTL_MAX_TENSOR_DIMS];
} dtl__xmsg;

/* Where an exchange keeps the pieces that are no runs. APART: sends packed in a send region at the start of the
 * temporary, receives in a region after it. SEND_IN_OUT (one round): sends packed at the start of the output,
 * which is free until the exchange completes, and every receive in the temporary. RECV_IN_OUT (one round): every
 * receive lands packed in the output, then moves to the temporary (free again once the sends are done) to be
 * placed. The last two trade a copy for a smaller temporary, for scratch budgets. */
enum { DTL__X_APART, DTL__X_SEND_IN_OUT, DTL__X_RECV_IN_OUT };

/* What an exchange step does on this rank (compile.c derives it, exchange.c runs it). */
typedef struct {
  dtl__xmsg *send, *recv;
  int nsend, nrecv;
  bool self; /* copies its own piece (self_shape at self_off, global) from its input box into its output box */
  int64_t self_shape[DTL_MAX_TENSOR_DIMS], self_off[DTL_MAX_TENSOR_DIMS];
  bool fill; /* holds the identity of a Partial target (fill_op) instead of data, so it receives nothing */
  dtl_reduce_op fill_op;
  size_t spack, rpack, rall; /* elements: of distinct sends that are packed, of receives that are unpacked, of all
                                receives */
  /* In rounds (xrounds > 1) a piece that is no run of its box may still be one within each round (its rows of the
   * round dim one at a time): the elements of distinct sends and of receives that some round packs. */
  size_t spack_r, rpack_r;
  int mode;
  size_t tsend;              /* elements of the send region (APART) */
  bool cross;                /* runs on the parent of two meshes, else on the mesh communicator */
  int xdim, xrounds;         /* rounds of xrows indices of tensor dim xdim (the plan's) */
  int64_t xrows;
  bool xfine;                             /* the plan's: round r is one index of every dim but the last */
  int64_t xshape[DTL_MAX_TENSOR_DIMS];    /* the global shape, whose leading dims fine rounds count over */
  /* The transport's lists of one round, sized for every message. */
  int *peers_s, *peers_r, *spos; /* spos: each send's place in the round's list (-1: not in this round) */
  const void **bufs_s;
  void **bufs_r;
  size_t *cnt_s, *cnt_r;
} dtl__xstep;

typedef struct {
  dtl__ex_op op;
  dtl__xstep *x;     /* EX_EXCHANGE */
  int m, g;          /* mesh dim and its size */
  dtl_reduce_op rop; /* all-reduce and reduce-scatter: the reduction; fill: the op whose identity it writes */
  size_t a, b;       /* elements of this rank's box before / after the step */
  size_t t;          /* elements of the step's temporary region (0: none) */
  bool pack;         /* the send side is not in peer order: pack into the temporary first */
  bool unpack;       /* the receive side is not in final order: receive into the temporary, then place the blocks */
  /* A pack or unpack pass runs in chunks of crows indices of tensor dim cdim (the outermost dim of the box
   * with extent > 1, which the step does not split), one collective per chunk, so that its temporary is a
   * cache-sized chunk rather than a whole shard. crows == 0: one pass over everything. */
  int cdim;
  int64_t crows;
  /* Chunked all-to-all: which rows of cdim a chunk takes (0: the same absolute rows on every rank; 1: rows
   * counted within each sender's input box; 2: within each receiver's output box), the first row of the
   * group's box on cdim, and the elements of the send region (the receive region follows it). */
  int cmode;
  int64_t cbase;
  size_t tsend;
  int64_t in_shape[DTL_MAX_TENSOR_DIMS], in_off[DTL_MAX_TENSOR_DIMS];
  int64_t out_shape[DTL_MAX_TENSOR_DIMS], out_off[DTL_MAX_TENSOR_DIMS];
  dtl__ex_peers peers[2];
  /* Facts of the whole group, alike on every member: the elements of all input boxes together (0: nothing
   * moves anywhere in the group); for an all-to-all whether every block has one size (even), whether some
   * member packs or unpacks (scattered), and, chunked, the most rows of the chunk dim any peer's chunk
   * domain has (rows). */
  size_t total;
  bool even, scattered;
  int64_t rows;
} dtl__ex_step;

/* Where each step reads, writes and keeps its temporary; scr is the scratch size in elements. */
typedef struct {
  int in[DTL__MAX_PLAN_STEPS], out[DTL__MAX_PLAN_STEPS], tmp[DTL__MAX_PLAN_STEPS];
  bool staged[DTL__MAX_PLAN_STEPS]; /* the step writes into its temporary, then that is copied to out */
  int final_at; /* where the data is after the last step (a final copy moves it to DST when it is not there) */
  size_t scr;
} dtl__ex_layout;

/* A plan's compiled form (one host allocation: this struct with its steps, then the count arrays, then the
 * peer tables). */
struct dtl__plan_exec {
  /* [0]: distinct source and destination buffers; [1]: src_local == dst_local, which only a plan without
   * collectives allows (comm_steps == 0; otherwise [1] is unused). */
  dtl__ex_layout place[2];
  int comm_steps;  /* steps that communicate on this mesh (a mesh dim of size 1 never does) */
  /* A plan between two meshes: the parent ranks of both, ascending, which its DTL_CHECK agreement runs among. */
  int *group;
  int ngroup;
  size_t ws_bytes; /* the larger scratch of the two placements, in bytes */
  int gmax;        /* the largest group of a communicating step */
  /* 5 x gmax per-peer counts and displacements that the runners fill chunk by chunk. A plan runs one call at a
   * time (like every call on one mesh), so one set serves every call. */
  size_t *counts;
  /* The one nonblocking execution a plan can have in flight (dtl_plan_execute_async): the walk over the steps
   * (executor.c), kept in this request. */
  struct dtl__plan_request *req;
  /* The plan's own workspace in the mesh communicator's memory (allocated by its first execution that needs
   * scratch, grown at most once more; never by dtl_plan_execute_with_workspace) and the memory it came from
   * (a copy: the mesh may be half torn down when its cached plans are destroyed). */
  void *own;
  size_t own_bytes;
  dtl__mem own_mem;
  dtl__ex_step ex[]; /* one per plan step */
};

/* What a runner needs beside its step. */
typedef struct {
  int nd;
  size_t es;
  dtl_dtype t;
  size_t *cnt_a, *cnt_b, *cnt_c; /* per-peer counts, sized for the largest group */
  size_t *dsp_a, *dsp_b;         /* per-peer displacements (send, receive) of all_to_allv_displs */
} dtl__ex_ctx;

/* A step runs as a sequence of parts, the same blocking and nonblocking, so that dtl_plan_execute and
 * dtl_plan_execute_async are one walk over the steps (executor.c): each part is local work (a pack pass, a copy)
 * and at most one transfer, on the mesh dim's communicator c (an exchange: the meshes' communicator or their
 * parent), then local work once that transfer is complete (an unpack pass). A chunked pack or unpack pass is one
 * part per chunk. Parts read the compiled step and the per-peer counts of ctx, which stay as a part's start left
 * them until it is done (a plan runs one part at a time). */
typedef struct {
  int j;         /* the part */
  bool sin, rin; /* an all-to-all at displacements: whether the part's send and receive sides move in place */
} dtl__ex_part;

/* How many parts step e has on this rank for its buffers in and out (alike on every member of its group where
 * it communicates: a rank's own block can add a last, local part). */
int dtl__ex_parts(const dtl__ex_step *e, dtl_comm *c, const void *in, const void *out);
/* Part s->j of step e: reads in, writes out, may use tmp (e->t elements). req NULL: runs it to completion. Else
 * starts it: *req gets the transfer in flight, which the caller completes (wait or test) and then calls
 * dtl__ex_part_done; NULL when the part is complete already. */
dtl_status dtl__ex_part_start(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, dtl__ex_part *s, const void *in,
                        void *out, void *tmp, dtl_request **req);
dtl_status dtl__ex_part_done(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, dtl__ex_part *s,
                             const void *in, void *out, void *tmp);
/* The parts of an all-to-all (all_to_all.c) and of an exchange (exchange.c); an exchange part finishes itself when
 * nothing is left in flight. */
int dtl__a2a_parts(const dtl__ex_step *e, dtl_comm *c, const void *in, const void *out);
dtl_status dtl__a2a_part_start(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, dtl__ex_part *s, const void *in,
                         void *out, void *tmp, dtl_request **req);
dtl_status dtl__a2a_part_done(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, dtl__ex_part *s,
                              const void *in, void *out, void *tmp);
int dtl__xchg_parts(const dtl__ex_step *e);
dtl_status dtl__xchg_part_start(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, int j, const void *in, void *out,
                          void *tmp, dtl_request **req);
dtl_status dtl__xchg_part_done(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, int j, void *out, void *tmp);

/* --- what the runners share (runners.c) ------------------------------------------------------------------ */

static inline size_t dtl__box_count(int nd, const int64_t *shape) {
  size_t n = 1;
  for (int d = 0; d < nd; d++) n *= (size_t)shape[d];
  return n;
}

/* The box of the peer at position k along the step's mesh dim, before (w = 0) or after (w = 1) the step. */
static inline void dtl__ex_peer_box(const dtl__ex_step *e, int nd, int w, int k, int64_t *shape, int64_t *off) {
  memcpy(shape, w ? e->out_shape : e->in_shape, sizeof(int64_t) * (size_t)nd);
  memcpy(off, w ? e->out_off : e->in_off, sizeof(int64_t) * (size_t)nd);
  const dtl__ex_peers *q = &e->peers[w];
  if (q->dim >= 0) {
    shape[q->dim] = q->ext[k];
    off[q->dim] = q->off[k];
  }
}

dtl__box_copy dtl__ex_box(int nd, size_t es, const int64_t *ext, const int64_t *src_shape, const int64_t *src_off,
                          const int64_t *dst_shape, const int64_t *dst_off);
/* Intersection of two boxes; false when empty. */
bool dtl__ex_intersect(int nd, const int64_t *as, const int64_t *ao, const int64_t *bs, const int64_t *bo, int64_t *s,
                       int64_t *o);
/* The all-to-all of one step: even (every block between every pair of the group has one size) takes the
 * engine's regular collective, else all_to_allv. An empty side sharing the other side's pointer goes as NULL.
 * req: as for dtl__ex_part (NULL: blocking). */
dtl_status dtl__ex_exchange(dtl_comm *c, bool even, const void *send, const size_t *sc, void *recv, const size_t *rc,
                            dtl_dtype t, dtl_request **req);
/* all_to_allv_displs, with the same NULL rule. */
dtl_status dtl__ex_exchange_displs(dtl_comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                                   const size_t *rc, const size_t *rd, dtl_dtype t, dtl_request **req);
/* Chunks of crows rows in rows (crows 0: one). */
int64_t dtl__ex_nchunks(int64_t rows, int64_t crows);
/* The rank whose own block a scattered step on a displacement transport copies itself, or -1 (see runners.c). */
int dtl__ex_own_block(dtl_comm *c, bool scattered, const void *in, const void *out);
/* Drops block self (-1: none) from counts and sets the displacements of the others back to back in peer order. */
void dtl__ex_packed_displs(int g, size_t *counts, size_t *displs, int self);
/* Element offset of piece (ps, po) in the row-major box (bs, bo) when the piece is one contiguous run of it; false
 * when not. */
bool dtl__run_offset(int nd, const int64_t *bs, const int64_t *bo, const int64_t *ps, const int64_t *po, size_t *offset);
/* Copies the part of the step's input box that its output box keeps from the input to the output. */
dtl_status dtl__ex_copy_own(const dtl__ex_ctx *x, const dtl__ex_step *e, dtl_comm *c, const void *in, void *out);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The exchange map: for a source layout without pending Partials on one mesh and a
 * target layout on the same mesh or on another mesh of the same parent, which rank sends which box to which rank.
 * The source ranks with equal boxes form a class (they differ only on the source's replicated mesh dims); each
 * class sends from the box it owns, which is its box, except for a quantized part with BLOCK dims (format.h: the
 * scale blocks a cut splits are held on both sides), where it is the blocks whose first element its logical box
 * holds, so that the owned boxes of the classes are disjoint and cover the tensor: a target rank assembles its box
 * from pieces (owned box of a class and its box), none received twice, each addressed within the sender's whole
 * box. Each target rank takes each class's part of its box from one member of the class, the holder:
 * - itself, when it is that class's member (so data that stays with its rank never moves);
 * - else the member whose replicated coordinates are the target rank's own coordinates there, when the target
 *   rank is in the source mesh (on one mesh: always), so that the replicas share the sends;
 * - else (a target rank outside the source mesh) the member numbered by the target's mesh rank modulo the class
 *   size, for the same reason.
 * The planner prices an exchange from it (cost.c) and the compiled plan takes this rank's messages from it
 * (compile.c), so both count the same bytes. */
#ifndef DTL_REDISTRIBUTE_XMAP_H
#define DTL_REDISTRIBUTE_XMAP_H

#include "redistribute/plan_internal.h"

/* The box of the rank at coord of mesh m under placements pl over (nd, shape): dtl__local_box, or for a quantized
 * part (qg, qpart; qg NULL: a plain tensor) whose placements shard the part's dims, the part's box of the logical
 * box there (dtl__qgeom_part_box: what the rank holds) or, owned, the blocks it alone sends (dtl__qgeom_owned_box). */
void dtl__xbox(const dtl__qgeom *qg, int qpart, bool owned, const dtl_mesh *m, int nd, const int64_t *shape,
               const dtl_placement *pl, const int *coord, int64_t *bs, int64_t *bo);

typedef struct {
  const dtl_mesh *sm, *dm; /* source and target meshes (may be the same object) */
  int nd;
  size_t es;
  const int64_t *shape;
  const dtl__qgeom *qg; /* a quantized part with BLOCK dims (part qpart), whose boxes come from its geometry */
  int qpart;
  dtl_placement xs[DTL_MAX_MESH_DIMS]; /* source placements (no Partial on a mesh dim of size > 1) */
  dtl_placement yd[DTL_MAX_MESH_DIMS]; /* target placements */
  bool free_dim[DTL_MAX_MESH_DIMS];    /* source mesh dims of size > 1 that replicate: a class spans them */
  int nfree;                           /* the size of a class */
  /* NULL on one mesh (ranks are then the same numbers): the source mesh rank of each target mesh rank and the
   * target mesh rank of each source mesh rank (-1 outside the other mesh). */
  int *d2s, *s2d;
  /* The boxes of every class representative and every target rank (cbox starts the one owned block that holds
   * every array here). */
  int64_t *cbox, *tbox;
  int *crep; /* the source mesh rank of each class representative */
  int nclass;
  uint64_t *acc_send; /* the pricing's per-source-rank tallies */
  int *acc_peers;
  int *tmark; /* per target mesh rank, for the users of the map (compile.c: which message a box went out in) */
} dtl__xmap;

/* Sets up the map between meshes sm and dm (same parent) for target placements yd over geom's shape and dtype (qg,
 * qpart: the part of a quantized tensor geom is, as dtl__xbox; qg NULL for a plain one); the source placements come
 * later (dtl__xmap_source). Allocates; dtl__xmap_free releases. */
dtl_status dtl__xmap_init(dtl__xmap *x, const char *fn, const dtl_layout *geom, const dtl_mesh *sm, const dtl_mesh *dm,
                          const dtl_placement *yd, const dtl__qgeom *qg, int qpart);
/* Sets the source placements xs (mesh dims of size 1 are read as R). */
void dtl__xmap_source(dtl__xmap *x, const dtl_placement *xs);
void dtl__xmap_free(dtl__xmap *x);

/* The box source mesh rank r owns (what it sends from) / the box of target mesh rank q. */
void dtl__xmap_src_box(const dtl__xmap *x, int r, int64_t *shape, int64_t *off);
void dtl__xmap_dst_box(const dtl__xmap *x, int q, int64_t *shape, int64_t *off);
/* The target mesh rank with q's box whose coordinates on the target's unsharded mesh dims are 0: target ranks with
 * equal boxes (replicas) share it. */
int dtl__xmap_box_rep(const dtl__xmap *x, int q);
/* Whether target mesh rank q holds the identity of a Partial target instead of data (it then receives nothing). */
bool dtl__xmap_fills(const dtl__xmap *x, int q, dtl_reduce_op *op);
/* The source mesh rank that sends target mesh rank q its part from the class of source mesh rank c. */
int dtl__xmap_holder(const dtl__xmap *x, int q, int c);
/* The source / target mesh rank of a rank of the other mesh (-1 outside). */
static inline int dtl__xmap_d2s(const dtl__xmap *x, int q) { return x->d2s ? x->d2s[q] : q; }
static inline int dtl__xmap_s2d(const dtl__xmap *x, int r) { return x->s2d ? x->s2d[r] : r; }

/* What one rank moves in an exchange: elements sent to and received from other ranks, the peers of each, and the
 * elements it copies from its own source box into its own target box. */
typedef struct {
  uint64_t send, recv, self;
  int send_peers, recv_peers;
  /* _at: the bytes of send that go to ranks on other nodes. _max: 0; inter is whether any message of the exchange
   * goes between two nodes (it then pays the inter-node link class). */
  uint64_t send_remote;
  bool inter;
  /* _max: the bytes that every rank together receives (the exchange's total on the wire); _at: 0. */
  uint64_t total;
} dtl__xvolume;

/* The volume of the rank that is source mesh rank r and target mesh rank q (either -1 outside that mesh). */
void dtl__xmap_volume_at(const dtl__xmap *x, int r, int q, dtl__xvolume *out);
/* The largest of each figure over all ranks, computed alike on every rank from the global shapes: work in the
 * number of target ranks times source classes, which the planner keeps at most DTL__XMAP_MAX_PAIRS on one mesh. */
#define DTL__XMAP_MAX_PAIRS ((uint64_t)1 << 20)
void dtl__xmap_volume_max(const dtl__xmap *x, dtl__xvolume *out);

#endif

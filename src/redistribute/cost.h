/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The planner's cost model: resolving the alpha-beta parameters (engine
 * defaults, then DTL_PLAN_TUNE, then explicit fields) and pricing one step. The search, explain and the
 * tests' independent brute-force search all price steps through these functions, so "optimal" means the
 * same thing everywhere. */
#ifndef DTL_REDISTRIBUTE_COST_H
#define DTL_REDISTRIBUTE_COST_H

#include "redistribute/xmap.h"

#define DTL__COST_ALL (DTL_COST_ALPHA | DTL_COST_BETA | DTL_COST_LOCAL_BETA | DTL_COST_INTER_ALPHA | DTL_COST_INTER_BETA)

/* The model a plan over m uses: the defaults of m's engine (abstract meshes: MPI), then the fields of the
 * DTL_PROFILE file's cost line, then those named in the DTL_PLAN_TUNE environment variable, then the fields of
 * over (may be NULL) whose mask bit is set.
 * Explicit arguments win over the environment because they are the program's own decision. */
dtl_status dtl__cost_resolve(const char *fn, const dtl_mesh *m, const dtl_cost_model *over, dtl_cost_model *out);
/* Applies DTL_PLAN_TUNE text ("alpha=2e-6,beta=2e-10,local_beta=1e-10", any subset, any order, no blanks)
 * to *inout; malformed text is DTL_ERR_INVALID_ARGUMENT naming the bad entry, and *inout is untouched. */
dtl_status dtl__cost_parse_tune(const char *fn, const char *text, dtl_cost_model *inout);
/* The same for text from source (messages say source="text": ...), e.g. a profile's cost line. */
dtl_status dtl__cost_parse_text(const char *fn, const char *source, const char *text, dtl_cost_model *inout);
/* Every field of m in that format, exactly (%.17g), like snprintf (returns the length it needs). */
size_t dtl__cost_render(const dtl_cost_model *m, char *buf, size_t cap);
/* Applies the cost line of the profile DTL_PROFILE names (cost.c, under dtl__cost_resolve): unset, nothing; a profile
 * of another engine than m's (abstract meshes: mpi) is DTL_ERR_MISMATCH, a malformed one
 * DTL_ERR_INVALID_ARGUMENT naming its path, line and text. */
dtl_status dtl__cost_from_profile(const char *fn, const dtl_mesh *m, dtl_cost_model *inout);

/* What one step moves on one rank, in bytes. */
typedef struct {
  uint64_t send, recv; /* leaving / arriving at the rank under the ring (or pairwise) algorithm; 0 for local steps */
  uint64_t charged;    /* what the model charges: network bytes, or bytes touched by a local step */
} dtl__step_volume;

/* geom supplies mesh, dtype and global shape (its placements are ignored); before and after differ on
 * mesh dim m only, by a transition of the given kind. _at: the rank at coord. _max: the largest figure
 * over all ranks of the mesh (each field maximised separately), computed from the global shapes, so every
 * rank gets the same number: the step takes as long as its slowest group. */
void dtl__step_volume_at(const dtl_layout *geom, dtl__step_kind kind, int m, const dtl_placement *before,
                         const dtl_placement *after, const int *coord, dtl__step_volume *out);
void dtl__step_volume_max(const dtl_layout *geom, dtl__step_kind kind, int m, const dtl_placement *before,
                          const dtl_placement *after, dtl__step_volume *out);
/* The bytes a step sends over all ranks of the mesh together (its groups' ring or pairwise totals, from the global
 * shapes; 0 for local steps), saturating at UINT64_MAX: the planner's tie-break between routes of equal cost. */
uint64_t dtl__step_volume_total(const dtl_layout *geom, dtl__step_kind kind, int m, const dtl_placement *before,
                                const dtl_placement *after);
/* Of the `send` bytes the rank at coord sends in a step on mesh dim m, those that go to ranks on other nodes: all of
 * them when its ring successor on m is on another node (all-gather, all-reduce, reduce-scatter), the share of its
 * peers on other nodes for an all-to-all (its pieces taken as even), none for local steps. */
uint64_t dtl__step_remote_bytes(const dtl_mesh *mesh, dtl__step_kind kind, int m, const int *coord, uint64_t send);
/* The distinct extents (at most DTL__EXTENT_SET_MAX) that a tensor dim of size n takes after the splits in ks[0..nk)
 * (mesh dim sizes, left to right). torch.chunk gives at most three sizes per split (full, remainder, empty), so
 * the set stays small. */
#define DTL__EXTENT_SET_MAX 32 /* 3^3 + 1: at most three splits besides a step's own */
int dtl__extent_set(int64_t n, const int *ks, int nk, int64_t *out);
/* Rounds of the ring algorithm on p ranks (0 for local steps). */
int dtl__step_rounds(dtl__step_kind kind, int p);
/* The most one step (or one mesh dim's term of the search's lower bound) is priced at: 2.9e5 s. A plan
 * has at most DTL__MAX_PLAN_STEPS steps and DTL_MAX_MESH_DIMS bound terms, so no sum the search forms can
 * overflow int64, whatever the cost model (alpha = 1e300 prices every collective at the cap). */
#define DTL__STEP_COST_CAP_PS (INT64_MAX / 32)
_Static_assert(DTL__MAX_PLAN_STEPS + DTL_MAX_MESH_DIMS <= 32, "search sums must fit int64");
/* (rounds + 1) x alpha + charged x beta, the 1 being the call itself (local steps: charged x local_beta),
 * in whole picoseconds so that the search compares exact integers and breaks ties the same way on every
 * rank; at most DTL__STEP_COST_CAP_PS. inter: the step's mesh dim crosses nodes, so it pays the inter-node
 * link class (inter_alpha, inter_beta); else the intra-node one (alpha, beta). */
int64_t dtl__step_cost_ps(const dtl_cost_model *c, dtl__step_kind kind, int p, const dtl__step_volume *max,
                          bool inter);
/* An exchange from the maximum over the ranks of its volume (dtl__xmap_volume_max), in rounds: point to point,
 * each rank pays alpha per peer it sends to or receives from (the larger count) plus alpha once for the call, in
 * every round, and beta per byte of the larger of what it sends and receives, in the inter-node class when any of
 * its messages crosses nodes (max->inter: the slowest message sets the pace of a round). When no rank moves
 * anything to another, only the local copies are charged (local_beta), like a local step. Same rounding. */
int64_t dtl__exchange_cost_ps(const dtl_cost_model *c, const dtl__xvolume *max, int rounds);
/* Fills exchange step st from map x (its source placements set): the cost of the maximum over the ranks in `rounds`
 * rounds (returned, and in st->cost_s), the most peers, the link class, and this rank's bytes sent, received and sent
 * to other nodes. The planner's exchanges and the quantized parts' share it, so they price alike. */
int64_t dtl__exchange_step_price(dtl__xmap *x, const dtl_cost_model *c, int rounds, dtl__plan_step *st);
/* The alpha a step of the given class pays per round (the search's lower bound). */
double dtl__cost_alpha(const dtl_cost_model *c, bool inter);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The one agreement of dtl: before a collective call communicates, every rank
 * brings its verdict on its own arguments and resources and a fingerprint of the call, and all ranks leave
 * with the same decision, so that no rank is the only one to return (and leave the others waiting) and no
 * rank runs a different call than its peers. Collective creation calls use it always, the per-call entry
 * points when the communicator has DTL_CHECK on (comm.h states the rule). */
#ifndef DTL_COMM_AGREE_H
#define DTL_COMM_AGREE_H

#include "comm/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Values that dtl__agree_max reduces beside the verdict, at most. */
#define DTL__AGREE_MAX_EXTRA 4

/* Collective over c (non-NULL, not aborted). local is this rank's verdict (DTL_OK, or the status it would
 * return with its message already recorded); fp is a fingerprint of what every rank must pass alike (0 when
 * only success matters). The fast path is one all-reduce of a few integers, whatever the number of ranks;
 * only when some rank failed or the fingerprints differ does a second exchange name the ranks. Returns the
 * same verdict class on every rank:
 * - DTL_OK when every rank succeeded with the same fingerprint;
 * - on a rank that failed, its own local status, with its own message untouched;
 * - on the others, the status of the lowest failing rank, with "fn: rank r failed (STATUS; its
 *   dtl_last_error says why), so no rank went on", or, when none failed but fingerprints differ, DTL_ERR_MISMATCH
 *   naming the ranks whose fingerprint differs from the most common one (the lowest rank's among equals).
 * One rank alone (size 1) returns local without communicating. */
dtl_status dtl__agree(dtl_comm *c, const char *fn, uint64_t fp, dtl_status local);
/* The same, and in the same all-reduce vals[0..n) (n <= DTL__AGREE_MAX_EXTRA) become their maximum over
 * the ranks (on DTL_OK only; otherwise they are left as they were). */
dtl_status dtl__agree_max(dtl_comm *c, const char *fn, uint64_t fp, dtl_status local, int64_t *vals, int n);
/* dtl__agree among the ranks ranks[0..n) of c only (ascending; this rank among them), which form no communicator of
 * their own (the two meshes of a plan between meshes): point to point through the transport's exchange, every rank
 * sends its verdict and fingerprint to the lowest, which answers each with the outcome. The same verdicts as
 * dtl__agree (the lowest rank's fingerprint is the reference); ranks not listed take no part. */
dtl_status dtl__agree_among(dtl_comm *c, int n, const int *ranks, const char *fn, uint64_t fp, dtl_status local);
/* dtl__agree when the communicator has DTL_CHECK on, else just local (fp is not evaluated then): the hook of
 * every per-call entry point, placed after its checks and allocations and before its first collective. */
#define dtl__agree_checked(c, fn, fp, local) ((c)->check ? dtl__agree((c), (fn), (fp), (local)) : (local))

/* The collectives for layers that have agreed on their whole call already (a TP forward, a MoE dispatch):
 * the argument checks of the public entry point, then the engine, without a second agreement. */
dtl_status dtl__all_gather_agreed(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t);
dtl_status dtl__all_gatherv_agreed(dtl_comm *c, const void *send, size_t send_count, void *recv,
                                   const size_t *recv_counts, dtl_dtype t);
dtl_status dtl__all_reduce_agreed(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t,
                                  dtl_reduce_op op);
dtl_status dtl__reduce_scatterv_agreed(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts,
                                       dtl_dtype t, dtl_reduce_op op);
dtl_status dtl__all_to_all_agreed(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t);
dtl_status dtl__all_to_allv_agreed(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                   const size_t *recv_counts, dtl_dtype t);

/* In-place maximum of v[0..n) over the ranks of c, on host and device communicators alike (a device one
 * stages the values through a buffer it keeps for this). */
dtl_status dtl__comm_max_i64(dtl_comm *c, int64_t *v, int n);
/* Acquires a device communicator's agreement staging (dtl__comm_new calls it): taking part in an agreement
 * never allocates, so a rank that failed locally can always send its verdict. */
dtl_status dtl__agree_reserve(dtl_comm *c);
/* The int64 count of c->agree_host: 3 x size verdicts, then the host staging of a timed agreement. */
size_t dtl__agree_host_len(const dtl_comm *c);

/* A value drawn independently on each rank (clock, salt and rank mixed) in 1..2^62-1; the maximum over the
 * ranks of one call names that call (a mesh, a MoE layout) on every rank alike. */
int64_t dtl__agree_nonce(const void *salt, int rank);

/* Fingerprints: mixes v into h (splitmix64 finaliser), and a double by its bits. */
static inline uint64_t dtl__fp_mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}
uint64_t dtl__fp_double(uint64_t h, double v);
/* Mixes n size_t values (NULL mixes a marker: the argument check reports it). */
uint64_t dtl__fp_sizes(uint64_t h, const size_t *v, int n);
/* Mixes n int64 values, each one alone (so that no two arguments can trade places, as in a product). */
uint64_t dtl__fp_i64s(uint64_t h, const int64_t *v, int n);
/* Mixes a string (a function name, say). */
uint64_t dtl__fp_str(uint64_t h, const char *s);

#ifdef __cplusplus
}
#endif
#endif

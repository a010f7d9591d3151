/* SPDX-License-Identifier: Apache-2.0 */
/* Allocation-failure sweeps on the one harness (dtl_test.h) through the test hook of src/common/alloc.h:
 * for N = 1, 2, ... the Nth allocation of a call fails (on every rank, or on one), until N passes every
 * allocation the call makes. Each failing run must return DTL_ERR_OUT_OF_MEMORY with a message (on the
 * other ranks of a collective call, the agreed error), free every buffer it allocated (the hook's live
 * count is back where it was), leave the outputs untouched, and a call right after it must succeed. */
#ifndef DTL_TESTS_DT_OOM_H
#define DTL_TESTS_DT_OOM_H

#include <stdbool.h>
#include <stdint.h>
#include "common/alloc.h"
#include "dtl_test.h"

typedef struct {
  const char *what;
  /* Makes the call, its outputs into the case's own state. */
  dtl_status (*call)(void *ctx);
  /* The outputs are as before the call (NULL: nothing to compare). */
  bool (*untouched)(void *ctx);
  /* Releases what a successful call made and poisons the outputs again. */
  void (*undo)(void *ctx);
  void *ctx;
  /* Collective: the ranks agree, so a failure on one rank fails every rank. Local: only the rank whose
   * allocation failed fails. */
  bool collective;
  /* The call may leave what it allocated before failing in a cache of its objects (a plan cached by
   * dtl_redistribute before its workspace failed): then "nothing leaked" means that undo, which destroys
   * and remakes the objects, brings the live count back to where it was before the call. */
  bool caches;
  /* The ranks agree after computing (dtl_moe_experts_run): a rank that fails only because a peer did has
   * already written its outputs, so "untouched" holds on the rank whose allocation failed. */
  bool agrees_after;
} dt_oom_case;

/* dt_oom_sweep's tally, for the report. */
typedef struct {
  long calls, failures;
} dt_oom_tally;

/* Sweeps c with the failure on every rank (inject < 0) or on rank inject only. Returns the number of
 * allocations the call makes on the injected rank(s) (the largest over the ranks). */
static inline uint64_t dt_oom_sweep(const dt_oom_case *c, int inject, dt_oom_tally *tally) {
  const bool me = inject < 0 || inject == dt_rank;
  for (uint64_t n = 1;; n++) {
    int64_t live = dtl__alloc_hook_live();
    dtl__alloc_hook_reset(me ? n : 0, false);
    dtl_status st = c->call(c->ctx);
    int hit = me && dtl__alloc_hook_count() >= n, any = 0; /* this rank's allocation n was the failed one */
    dtl__alloc_hook_reset(0, false);
    MPI_Allreduce(&hit, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (tally) tally->calls++;
    if (!any) { /* n is past the last allocation everywhere: an ordinary call */
      CHECK(st == DTL_OK, "%s with no failed allocation: %s: %s", c->what, dtl_status_name(st), dtl_last_error());
      if (st == DTL_OK) c->undo(c->ctx);
      return n - 1;
    }
    if (hit) {
      CHECK(st == DTL_ERR_OUT_OF_MEMORY && dtl_last_error()[0],
            "%s, allocation %llu failed: %s (expected DTL_ERR_OUT_OF_MEMORY with a message): %s", c->what,
            (unsigned long long)n, dtl_status_name(st), dtl_last_error());
    } else if (c->collective) {
      CHECK(st != DTL_OK, "%s, allocation %llu failed on another rank: this rank returned DTL_OK", c->what,
            (unsigned long long)n);
    }
    if (st != DTL_OK) {
      if (tally) tally->failures++;
      CHECK(!c->untouched || (c->agrees_after && !hit) || c->untouched(c->ctx),
            "%s, allocation %llu failed: an output was written", c->what, (unsigned long long)n);
      if (c->caches) c->undo(c->ctx);
      CHECK(dtl__alloc_hook_live() == live, "%s, allocation %llu failed: %lld buffers leaked", c->what,
            (unsigned long long)n, (long long)(dtl__alloc_hook_live() - live));
    } else {
      c->undo(c->ctx);
    }
    /* The next call, with memory, succeeds. */
    st = c->call(c->ctx);
    CHECK(st == DTL_OK, "%s after allocation %llu failed: %s: %s", c->what, (unsigned long long)n, dtl_status_name(st),
          dtl_last_error());
    if (st == DTL_OK) c->undo(c->ctx);
    if (n > 100000) {
      CHECK(false, "%s: more than 100000 allocations", c->what);
      return n;
    }
  }
}

/* The sweep with the failure on every rank, then (when one_rank_too, at more than one rank) on rank 0
 * alone and on the last rank alone; rank 0 prints how many allocations the call makes. */
static inline void dt_oom_sweeps(const dt_oom_case *c, bool one_rank_too, dt_oom_tally *tally) {
  uint64_t n = dt_oom_sweep(c, -1, tally);
  if (one_rank_too && dt_size > 1) {
    dt_oom_sweep(c, 0, tally);
    dt_oom_sweep(c, dt_size - 1, tally);
  }
  if (dt_rank == 0) printf("  %-60s %4llu allocations swept\n", c->what, (unsigned long long)n);
}
static inline void dt_oom_every_way(const dt_oom_case *c, dt_oom_tally *tally) { dt_oom_sweeps(c, true, tally); }

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* What the "one rank fails" tests expect of an agreed call (src/comm/agree.h), on top of dtl_test.h: one rank
 * (dt_bad, the last one) passes a bad argument, lacks memory or makes another call, and every rank returns
 * an error within the watchdog. */
#ifndef DTL_TESTS_DTL_TEST_RANKS_H
#define DTL_TESTS_DTL_TEST_RANKS_H

#include "dtl_test.h"

static int dt_bad; /* set to dt_size - 1 by dt_ranks_init */

static inline void dt_ranks_init(void) { dt_bad = dt_size - 1; }

/* The bad rank gets want with its own message (containing own_text); every other rank gets want naming the
 * bad rank. */
static inline void dt_expect_every_rank_fails(const char *call, dtl_status st, dtl_status want, const char *own_text) {
  char named[64];
  snprintf(named, sizeof named, "rank %d failed (", dt_bad);
  const char *text = dt_rank == dt_bad ? own_text : named;
  CHECK(st == want && strstr(dtl_last_error(), text), "%s: %s '%s' (expected %s '%s')", call, dtl_status_name(st),
        dtl_last_error(), dtl_status_name(want), text);
}

/* Every rank gets DTL_ERR_MISMATCH naming the bad rank (alone, it has nobody to differ from: DTL_OK). */
static inline void dt_expect_mismatch(const char *call, dtl_status st) {
  if (dt_size == 1) {
    CHECK(st == DTL_OK, "%s: %s %s", call, dtl_status_name(st), dtl_last_error());
    return;
  }
  char want[48];
  snprintf(want, sizeof want, "rank %d made another call", dt_bad);
  CHECK(st == DTL_ERR_MISMATCH && strstr(dtl_last_error(), want), "%s: %s '%s'", call, dtl_status_name(st),
        dtl_last_error());
}

/* A communicator made with DTL_CHECK set to on (it is read when the communicator is made). */
static inline dtl_comm *dt_comm_with_check(bool on) {
  dtl_comm *c = NULL;
  setenv("DTL_CHECK", on ? "1" : "0", 1);
  if (dtl_comm_from_mpi(MPI_COMM_WORLD, &c) != DTL_OK) c = NULL;
  unsetenv("DTL_CHECK");
  return c;
}

#endif

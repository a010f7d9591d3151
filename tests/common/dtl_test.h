/* SPDX-License-Identifier: Apache-2.0 */
/* The one harness of the MPI-launched tests. A case is a function named after the rule it checks; CHECK
 * records a failure on this rank (printing the first few with rank, case, file and line); RUN runs a case
 * under the watchdog and has rank 0 report it once every rank is done; dt_finish() agrees across ranks on the
 * outcome, so every rank exits with the same code. The watchdog turns a hang (a rank left waiting in a
 * collective) into a failure naming the case, or the set-up or tear-down around it, within DTL_TEST_WATCHDOG
 * seconds (default 120) per case, instead of ctest's timeout: it writes one line and ends the process, and
 * the launcher then ends the others. It is armed from dt_init() to dt_finish(), so no part of a test runs
 * without it.
 *
 *   int main(int argc, char **argv) {
 *     dt_init(&argc, &argv);
 *     REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));        (set-up that must work, or abort)
 *     RUN(all_gather_places_blocks_in_rank_order);
 *     RUN_NAMED(name, reduce_matches_the_oracle(DTL_FLOAT16));     (a case with arguments, named by the caller)
 *     dtl_comm_destroy(world);
 *     return dt_finish();
 *   }
 *
 * Every rank must run the same cases in the same order (RUN ends with a collective over MPI_COMM_WORLD); a
 * case that does not apply at some world size returns at once on every rank.
 */
#ifndef DTL_TESTS_DTL_TEST_H
#define DTL_TESTS_DTL_TEST_H

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dtl.h"
#include "dtl/mpi.h"

static int dt_rank, dt_size;
static long dt_failures;
static char dt_case[160] = "set-up";
static unsigned dt_watchdog_s = 120;
static char dt_watchdog_line[256];

#define DT_PRINT_LIMIT 12

#define CHECK(cond, ...)                                                                              \
  do {                                                                                                \
    if (!(cond) && dt_failures++ < DT_PRINT_LIMIT) {                                                  \
      fprintf(stderr, "[rank %d] %s: %s:%d: CHECK(%s) failed: ", dt_rank, dt_case, __FILE__, __LINE__, \
              #cond);                                                                                 \
      fprintf(stderr, __VA_ARGS__);                                                                   \
      fputc('\n', stderr);                                                                            \
    }                                                                                                 \
  } while (0)

/* A dtl call returned DTL_OK (its message is printed otherwise). */
#define CHECK_OK(expr)                                                                    \
  do {                                                                                    \
    dtl_status s_ = (expr);                                                               \
    CHECK(s_ == DTL_OK, "%s -> %s: %s", #expr, dtl_status_name(s_), dtl_last_error()); \
  } while (0)

/* A set-up call that must return DTL_OK for the test to mean anything: otherwise every rank stops (exit 2)
 * with the call and its message. */
#define REQUIRE_OK(expr)                                                                                  \
  do {                                                                                                    \
    dtl_status s_ = (expr);                                                                               \
    if (s_ != DTL_OK) {                                                                                   \
      fprintf(stderr, "[rank %d] %s: %s:%d: %s -> %s: %s\n", dt_rank, dt_case, __FILE__, __LINE__, #expr, \
              dtl_status_name(s_), dtl_last_error());                                                     \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                                       \
    }                                                                                                     \
  } while (0)

/* A dtl call returned want. */
#define CHECK_STATUS(expr, want)                                                                       \
  do {                                                                                                 \
    dtl_status s_ = (expr);                                                                            \
    CHECK(s_ == (want), "%s -> %s (expected %s): %s", #expr, dtl_status_name(s_), dtl_status_name(want), \
          dtl_last_error());                                                                           \
  } while (0)

/* A dtl call returned want and its message contains text (the argument's name and value, say). */
#define CHECK_ERROR(expr, want, text)                                                                  \
  do {                                                                                                 \
    dtl_status s_ = (expr);                                                                            \
    CHECK(s_ == (want), "%s -> %s (expected %s): %s", #expr, dtl_status_name(s_), dtl_status_name(want), \
          dtl_last_error());                                                                           \
    CHECK(strstr(dtl_last_error(), (text)) != NULL, "%s: message '%s' lacks '%s'", #expr, dtl_last_error(), \
          (text));                                                                                     \
  } while (0)

static void dt_watchdog_fire(int sig) {
  (void)sig;
  /* Only async-signal-safe calls here: the line was formatted when the watchdog was armed. */
  ssize_t n = write(STDERR_FILENO, dt_watchdog_line, strlen(dt_watchdog_line));
  (void)n;
  _exit(3);
}

/* (Re)arms the watchdog for what (a case name) with the given seconds (0: the default). */
static inline void dt_watchdog_arm(const char *what, unsigned seconds) {
  unsigned s = seconds ? seconds : dt_watchdog_s;
  snprintf(dt_watchdog_line, sizeof dt_watchdog_line,
           "[rank %d] watchdog: %s did not finish within %u s (a rank waits in a collective: a hang)\n", dt_rank, what,
           s);
  alarm(s);
}
static inline void dt_watchdog_disarm(void) { alarm(0); }

/* What runs between cases and after the last one (tear-down, dt_finish) stays under the watchdog too. */
static inline void dt_watchdog_after_case(void) {
  char what[sizeof dt_case];
  snprintf(what, sizeof what, "after %.150s", dt_case);
  memcpy(dt_case, what, sizeof dt_case);
  dt_watchdog_arm(dt_case, 0);
}

static inline void dt_init(int *argc, char ***argv) {
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &dt_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &dt_size);
  const char *w = getenv("DTL_TEST_WATCHDOG");
  if (w && atoi(w) > 0) dt_watchdog_s = (unsigned)atoi(w);
  signal(SIGALRM, dt_watchdog_fire);
  dt_watchdog_arm("set-up (before the first case)", 0);
}

/* Runs one case under the watchdog; rank 0 names it and how many ranks failed it. RUN_NAMED runs any
 * statement (a case called with arguments) as the case called name (copied: a buffer of the caller is fine). */
#define RUN_NAMED(name, call)                                                                 \
  do {                                                                                        \
    long before_ = dt_failures, mine_, bad_ranks_ = 0;                                        \
    snprintf(dt_case, sizeof dt_case, "%s", (name));                                          \
    dt_watchdog_arm(dt_case, 0);                                                              \
    call;                                                                                     \
    mine_ = dt_failures > before_;                                                            \
    MPI_Allreduce(&mine_, &bad_ranks_, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);                 \
    if (dt_rank == 0) printf("%-72s %s\n", dt_case, bad_ranks_ ? "FAILED" : "ok");            \
    dt_watchdog_after_case();                                                                 \
  } while (0)
#define RUN(case_fn) RUN_NAMED(#case_fn, case_fn())

/* The exit code every rank agrees on (0 when no rank failed a check); finalizes MPI. */
static inline int dt_finish(void) {
  long total = 0;
  MPI_Allreduce(&dt_failures, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (dt_rank == 0) printf("%s: %ld failed check(s) over %d rank(s)\n", total ? "FAIL" : "PASS", total, dt_size);
  MPI_Finalize();
  dt_watchdog_disarm();
  return total ? 1 : 0;
}

/* Exit code 77 (ctest's skip) on every rank, with a reason, when a test cannot run at this world size. */
static inline int dt_skip(const char *reason) {
  if (dt_rank == 0) printf("SKIP: %s\n", reason);
  MPI_Finalize();
  dt_watchdog_disarm();
  return 77;
}

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* Check macros of the MoE MPI tests: a failed check prints the rank, place and message and is counted; the
 * program's exit status is whether any rank failed any check. */
#ifndef DTL_MOE_CHECK_H
#define DTL_MOE_CHECK_H

#include <mpi.h>
#include <stdio.h>
#include "dtl.h"

static int g_rank, g_size, g_fail;
static const char *g_case = "";

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      g_fail++;                                                                                    \
      fprintf(stderr, "[rank %d] %s: %s:%d: CHECK(%s) failed: ", g_rank, g_case, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
    }                                                                                              \
  } while (0)
#define CHECK_OK(expr)                                                                             \
  do {                                                                                             \
    dtl_status s_ = (expr);                                                                        \
    CHECK(s_ == DTL_OK, "%s -> %s: %s", #expr, dtl_status_name(s_), dtl_last_error());             \
  } while (0)
#define CHECK_STATUS(expr, want)                                                                   \
  do {                                                                                             \
    dtl_status s_ = (expr);                                                                        \
    CHECK(s_ == (want), "%s -> %s (expected %s): %s", #expr, dtl_status_name(s_), dtl_status_name(want), \
          dtl_last_error());                                                                       \
  } while (0)

/* Every rank's failure count summed: 0 on all ranks or non-zero on all. */
static inline int check_finish(void) {
  int total = 0;
  MPI_Allreduce(&g_fail, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) printf("%s: %d failed check(s) over %d rank(s)\n", total ? "FAIL" : "PASS", total, g_size);
  return total ? 1 : 0;
}

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* A minimal harness for the MPI tests of tests/comm: each case is a function named after the rule it checks;
 * CHECK records a failure on this rank (printing the first few), and mpi_check_finish() agrees across the
 * ranks on the outcome, so every rank exits with the same code. */
#ifndef DTL_TESTS_MPI_CHECK_H
#define DTL_TESTS_MPI_CHECK_H

#include <mpi.h>
#include <stdio.h>

static long mpi_check_failures;
static const char *mpi_check_case = "";

#define CHECK(cond, ...)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      if (mpi_check_failures++ < 12) {                                                     \
        int rank_;                                                                         \
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);                                             \
        fprintf(stderr, "[rank %d] %s: %s:%d: ", rank_, mpi_check_case, __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fputc('\n', stderr);                                                               \
      }                                                                                    \
    }                                                                                      \
  } while (0)

/* CHECK that a dtl call returned DTL_OK, printing its message otherwise. */
#define CHECK_OK(call)                                                                     \
  do {                                                                                     \
    dtl_status st_ = (call);                                                               \
    CHECK(st_ == DTL_OK, "%s -> %s: %s", #call, dtl_status_name(st_), dtl_last_error()); \
  } while (0)

/* Runs one case; rank 0 names it and how many ranks failed it. */
#define RUN(case_fn)                                                                            \
  do {                                                                                          \
    long before_ = mpi_check_failures, mine_, bad_ranks_ = 0;                                   \
    mpi_check_case = #case_fn;                                                                  \
    case_fn();                                                                                  \
    mine_ = mpi_check_failures > before_;                                                       \
    MPI_Allreduce(&mine_, &bad_ranks_, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);                   \
    int rank_;                                                                                  \
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);                                                      \
    if (rank_ == 0) printf("%-64s %s\n", #case_fn, bad_ranks_ ? "FAILED" : "ok");              \
  } while (0)

/* Returns the exit code all ranks agree on: 0 when no rank failed a check. */
static int mpi_check_finish(void) {
  long total = 0;
  MPI_Allreduce(&mpi_check_failures, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) printf("%ld failed checks\n", total);
  return total ? 1 : 0;
}

#endif

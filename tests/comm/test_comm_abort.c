/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_comm_abort on MPI ends the job through MPI_Abort (comm.h): the last rank, stuck after a timeout, aborts; the
 * others wait in a barrier that never completes. expect_abort.sh passes when the job ends with a non-zero status
 * after a rank said it aborts, never when a rank prints that dtl_comm_abort returned or left the barrier. */
#include <mpi.h>
#include <stdio.h>
#include "dtl.h"
#include "dtl/mpi.h"

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dtl_comm *c = NULL;
  if (dtl_comm_from_mpi(MPI_COMM_WORLD, &c) != DTL_OK) {
    fprintf(stderr, "dtl_comm_from_mpi: %s\n", dtl_last_error());
    return 1;
  }
  dtl_comm_set_timeout(c, 0.2);
  if (rank == size - 1 && size > 1) {
    dtl_status st = dtl_barrier(c); /* the others never come */
    printf("rank %d: barrier -> %s; aborting\n", rank, dtl_status_name(st));
    fflush(stdout);
    dtl_comm_abort(c);
    printf("dtl_comm_abort returned\n");
  } else if (size == 1) {
    printf("rank 0: aborting\n");
    fflush(stdout);
    dtl_comm_abort(c);
    printf("dtl_comm_abort returned\n");
  } else {
    MPI_Barrier(MPI_COMM_WORLD); /* never completes: the last rank aborts the job */
    printf("rank %d left a barrier the last rank never entered\n", rank);
  }
  fflush(stdout);
  dtl_comm_destroy(c);
  MPI_Finalize();
  return 0;
}

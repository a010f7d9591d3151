/* SPDX-License-Identifier: Apache-2.0 */
/* A program outside the dtl tree: it must build from the installed headers and library alone. */
#include <dtl.h>
#include <dtl/mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  dtl_comm *c = NULL;
  int rc = 1;
  if (dtl_comm_from_mpi(MPI_COMM_WORLD, &c) == DTL_OK) {
    int x = dtl_comm_rank(c) + 1, sum = 0, p = dtl_comm_size(c);
    if (dtl_all_reduce(c, &x, &sum, 1, DTL_INT32, DTL_SUM) == DTL_OK && sum == p * (p + 1) / 2) rc = 0;
    if (dtl_comm_rank(c) == 0) printf("consumer: dtl %s, all_reduce sum=%d (%s)\n", dtl_version_string(), sum, rc ? "wrong" : "ok");
    dtl_comm_destroy(c);
  }
  MPI_Finalize();
  return rc;
}

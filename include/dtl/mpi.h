/* SPDX-License-Identifier: Apache-2.0 */
/* The OpenMPI backend: collectives on host memory over an MPI communicator. */
#ifndef DTL_MPI_H
#define DTL_MPI_H

#include <mpi.h>
#include "dtl/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Wraps comm (duplicated with MPI_Comm_dup, so dtl's traffic never mixes with the caller's, and set to
 * MPI_ERRORS_RETURN). Collective over comm, and agreed: when one rank fails (out of memory), every rank
 * returns an error and none keeps a communicator. MPI must be initialized. */
DTL_API dtl_status dtl_comm_from_mpi(MPI_Comm comm, dtl_comm **out);
/* The duplicated communicator dtl uses (for timing raw MPI beside dtl). */
DTL_API MPI_Comm dtl_comm_mpi_handle(const dtl_comm *c);

#ifdef __cplusplus
}
#endif
#endif

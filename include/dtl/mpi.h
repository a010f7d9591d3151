/* SPDX-License-Identifier: Apache-2.0 */
/* The MPI backend (OpenMPI, MPICH): collectives on host memory over an MPI communicator, and the choice of
 * their algorithms. */
#ifndef DTL_MPI_H
#define DTL_MPI_H

#include <mpi.h>
#include "dtl/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Wraps comm (duplicated with MPI_Comm_dup, so dtl's traffic never mixes with the caller's, and set to
 * MPI_ERRORS_RETURN). Collective over comm, and agreed: when one rank fails (out of memory), every rank
 * returns an error and none keeps a communicator. MPI must be initialized. It also learns the node of each rank
 * (<dtl/mesh.h>, "Nodes"): the ranks that share memory (MPI_Comm_split_type MPI_COMM_TYPE_SHARED and one
 * all-gather), or with DTL_RANKS_PER_NODE=n, n consecutive ranks of MPI_COMM_WORLD per node. Every rank must run
 * with the same DTL_RANKS_PER_NODE (else DTL_ERR_MISMATCH on every rank); a value that is not a whole number >= 1
 * is DTL_ERR_INVALID_ARGUMENT naming it. */
DTL_API dtl_status dtl_comm_from_mpi(MPI_Comm comm, dtl_comm **out);
/* The duplicated communicator dtl uses (for timing raw MPI beside dtl). */
DTL_API MPI_Comm dtl_comm_mpi_handle(const dtl_comm *c);

/* Algorithms. All-reduce, reduce-scatter(v), all-gather(v), all-to-all(v) and reduce run either the MPI call
 * or one of dtl's own algorithms, chosen per call from a table by collective, number of ranks and call size
 * (README, "Collective algorithms"). The table is read when the communicator is made (a split keeps its
 * parent's): the built-in one, or the rows of the profile DTL_PROFILE names (README, Calibration), or the file
 * named by DTL_ALGO_TABLE (which wins over the profile's rows); DTL_ALGO=coll:algo,... forces one algorithm per
 * collective. Every rank must run with the same; dtl_comm_from_mpi fails on every rank when a rank cannot read
 * them or reads another, and with DTL_ERR_MISMATCH when the profile was recorded on another number of ranks.
 *
 * Reproducible reductions: for floating SUM, PROD and AVG, every dtl algorithm folds the ranks' contributions
 * in rank order, ((x0 + x1) + x2) + ... (f16/bf16: each step in f32, rounded back), so a result is bitwise the
 * same whichever algorithm runs and from run to run. MPI does not promise an order over 3 or more ranks, so
 * the table never chooses the MPI call for those (only DTL_ALGO forcing it does, giving the promise up); with 2
 * ranks, for integers, and for MAX and MIN, the order does not change the result (for floating MAX and MIN up to
 * the sign of a zero and which NaN). The 8-bit floats move as bytes (MPI_UINT8_T) and reduce (max and min only,
 * <dtl/types.h>) with dtl's own MPI_Ops, which keep the winning input's code. */
/* "collective:algorithm" of the last call on c that had a choice (e.g. "reduce_scatter:a2a_fold"), "" before
 * the first or for a communicator of another transport. The text stays valid until the next call of this. */
DTL_API const char *dtl_comm_mpi_last_algorithm(const dtl_comm *c);
/* The table a communicator made now would use (the built-in one, or DTL_ALGO_TABLE's, with DTL_ALGO's forced
 * choices), in the DTL_ALGO_TABLE format: like snprintf, at most cap bytes into buf (NUL-terminated when cap >
 * 0) and the whole length in *len (may be NULL). DTL_ERR_INVALID_ARGUMENT when DTL_ALGO or DTL_ALGO_TABLE is
 * malformed, naming the entry. */
DTL_API dtl_status dtl_mpi_algorithm_table(char *buf, size_t cap, size_t *len);
/* Measures the algorithms of all-reduce, reduce-scatter, all-gather and all-to-all on c (collective over c; about
 * a second on 4 ranks): each algorithm at calls of 4 KiB, 64 KiB and 1 MiB (class any with int32 sums, class exact
 * with f32 sums where c has 3 or more ranks), the second fastest of 5 runs of the slowest rank, and replaces those
 * collectives' rows of c's table by the fastest per size (rows from 0, 16K and 256K), the same on every rank;
 * the other rows and DTL_ALGO's forced choices stay. Communicators split from c afterwards inherit the table, and
 * dtl_cost_model_save writes it into a profile. A communicator of another transport is DTL_ERR_INVALID_ARGUMENT. */
DTL_API dtl_status dtl_mpi_algorithm_calibrate(dtl_comm *c);

#ifdef __cplusplus
}
#endif
#endif

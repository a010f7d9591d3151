# SPDX-License-Identifier: Apache-2.0
# The executor and dtl_redistribute: MPI tests against the dense oracle (world sizes 1-8; each picks the
# meshes whose rank count matches).
dtl_mpi_test(test_executor_steps SOURCES test_executor_steps.c test_redistribute_util.c NP 1 2 3 4 5 6 8)
dtl_mpi_test(test_redistribute_oracle SOURCES test_redistribute_oracle.c test_redistribute_util.c NP 1 2 3 4 5 6 8)
dtl_mpi_test(test_redistribute_errors SOURCES test_redistribute_errors.c test_redistribute_util.c NP 1 2 3 4)
# Between two meshes of one parent (disjoint, overlapping, reshaped, subset) and the exchange on one mesh: the
# oracle, the scratch bound and limits, bytes on the wire, the nonblocking form, bad input.
dtl_mpi_test(test_redistribute_meshes SOURCES test_redistribute_meshes.c test_redistribute_util.c NP 1 2 3 4 5 6 8)
# Compiled plans: repeated executions allocate nothing; the caller's-workspace form and its rules.
dtl_mpi_test(test_executor_allocs SOURCES test_executor_allocs.c NP 1 2 3 4)
# The scratch bound between two meshes: the issue's cases and random pairs over random meshes, every rank (planning).
dtl_mpi_test(test_plan_scratch_meshes SOURCES test_plan_scratch_meshes.c NP 3 8)

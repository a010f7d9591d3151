# SPDX-License-Identifier: Apache-2.0
# The planner (pure: abstract meshes, no MPI launch) and the `dtl` command-line tool.
dtl_unit_test(test_planner_optimal SOURCES test_planner_optimal.c)
dtl_unit_test(test_planner_dtensor SOURCES test_planner_dtensor.c)
dtl_unit_test(test_planner_errors SOURCES test_planner_errors.c)
dtl_unit_test(test_planner_explain SOURCES test_planner_explain.c)

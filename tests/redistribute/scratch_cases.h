/* SPDX-License-Identifier: Apache-2.0 */
/* The one-mesh pairs that independent checks found over the scratch bound of include/dtl/plan.h (issue 17), each
 * over it on some rank before: checked on every coordinate by test_planner_scratch.c and executed against the dense
 * oracle by test_redistribute_oracle.c. */
#ifndef DTL_TESTS_SCRATCH_CASES_H
#define DTL_TESTS_SCRATCH_CASES_H

#include <stdint.h>
#include "dtl.h"

typedef struct {
  int mesh_ndim, mesh[3]; /* the mesh shape */
  dtl_dtype t;
  int nd;
  int64_t shape[3]; /* the tensor's */
  const char *from, *to;
} scratch_case;

static const scratch_case scratch_listed_cases[] = {
    {3, {2, 2, 2}, DTL_FLOAT32, 2, {8, 16}, "P(sum),S(1),S(0)", "S(1),S(1),S(0)"},
    {3, {2, 2, 2}, DTL_INT32, 3, {4, 6, 8}, "S(-2),P(max),S(2)", "R,S(-3),S(-3)"},
    {3, {2, 2, 2}, DTL_INT32, 3, {9, 9, 8}, "S(2),S(-2),P(max)", "S(0),S(0),S(0)"},
    {2, {2, 2}, DTL_INT32, 2, {4, 1}, "P(sum),S(-2)", "S(0),S(1)"},
};
#define SCRATCH_LISTED_CASES ((int)(sizeof scratch_listed_cases / sizeof *scratch_listed_cases))

#endif

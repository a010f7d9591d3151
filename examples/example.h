/* SPDX-License-Identifier: Apache-2.0 */
/* What the MPI examples share: TRY, which stops the whole job when a dtl call fails, printing where, the call,
 * its status and dtl's message (an example has no better way out, and a hung peer helps nobody). */
#ifndef DTL_EXAMPLE_H
#define DTL_EXAMPLE_H

#include <stdio.h>
#include <mpi.h>
#include <dtl.h>

#define TRY(call)                                                                                              \
  do {                                                                                                         \
    dtl_status s_ = (call);                                                                                    \
    if (s_ != DTL_OK) {                                                                                        \
      fprintf(stderr, "%s:%d %s: %s (%s)\n", __FILE__, __LINE__, #call, dtl_status_name(s_), dtl_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                            \
    }                                                                                                          \
  } while (0)

#endif

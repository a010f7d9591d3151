/* SPDX-License-Identifier: Apache-2.0 */
/* Status codes returned by every dtl entry point, and the thread-local message of the last failure. */
#ifndef DTL_STATUS_H
#define DTL_STATUS_H

#include "dtl/defs.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DTL_OK = 0,
  DTL_ERR_INVALID_ARGUMENT, /* an argument is NULL, out of range or inconsistent */
  DTL_ERR_UNSUPPORTED,      /* valid request that dtl does not (or cannot) perform */
  DTL_ERR_OUT_OF_MEMORY,
  DTL_ERR_COMM,             /* the communication engine (MPI, NCCL) reported an error */
  DTL_ERR_MISMATCH,         /* ranks disagree about a call (DTL_CHECK=1, counts, layouts) */
  DTL_ERR_CUDA,             /* a CUDA runtime or cuBLAS call failed */
  DTL_ERR_INTERNAL
} dtl_status;

/* "DTL_OK", "DTL_ERR_INVALID_ARGUMENT", ...; "DTL_ERR_UNKNOWN" for values outside the enum. */
DTL_API const char *dtl_status_name(dtl_status s);

/* The message of the last failed dtl call on this thread, e.g.
 * "dtl_broadcast: root=7 (expected 0..3)". Empty string when none failed yet. */
DTL_API const char *dtl_last_error(void);

#ifdef __cplusplus
}
#endif
#endif

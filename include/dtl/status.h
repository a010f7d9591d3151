/* SPDX-License-Identifier: Apache-2.0 */
/* Status codes returned by every dtl entry point, the thread-local message of the last failure, and the rules
 * every header follows for arguments:
 * - Failures. A call that fails returns a status other than DTL_OK and leaves a message naming the function,
 *   the argument and its value ("dtl_broadcast: root=7 (expected 0..3)"); it writes none of its outputs.
 * - Outputs. An output documented as optional may be NULL: it is then neither computed nor written (with all
 *   of a call's optional outputs NULL the call only checks its arguments). Every other output must be
 *   non-NULL (DTL_ERR_INVALID_ARGUMENT naming it), except a buffer of zero elements, which may be NULL.
 *   Accessors that return no status (dtl_mesh_coord, dtl_layout_global_shape, ...) write nothing for NULL.
 * - Params structs (<dtl/tp.h>, <dtl/moe.h>, <dtl/plan.h>) start with uint64_t mask (which optional fields
 *   are read, DTL_BIT(n) bits) and uint64_t flags (behaviour bits); a zeroed struct means the defaults, and
 *   a bit the struct does not define, in either field, is DTL_ERR_INVALID_ARGUMENT naming the field and the
 *   bits. */
#ifndef DTL_STATUS_H
#define DTL_STATUS_H

#include "dtl/defs.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every status, once: XX(name, value, meaning). The enum below and dtl_status_name are generated from it;
 * a new status is appended here with the next value. */
#define DTL_STATUS_MAP(XX)                                                                        \
  XX(DTL_OK, 0, "success")                                                                        \
  XX(DTL_ERR_INVALID_ARGUMENT, 1, "an argument is NULL, out of range or inconsistent")            \
  XX(DTL_ERR_UNSUPPORTED, 2, "a valid request that dtl does not (or cannot) perform")             \
  XX(DTL_ERR_OUT_OF_MEMORY, 3, "a host or device allocation failed")                              \
  XX(DTL_ERR_COMM, 4, "the communication engine (MPI, NCCL) reported an error")                   \
  XX(DTL_ERR_MISMATCH, 5, "ranks disagree about a call (DTL_CHECK=1, counts, layouts)")           \
  XX(DTL_ERR_CUDA, 6, "a CUDA runtime or cuBLAS call failed")                                     \
  XX(DTL_ERR_INTERNAL, 7, "an inconsistency dtl found in its own state (a bug)")                 \
  XX(DTL_ERR_TIMEOUT, 8, "a blocking call waited past its communicator's deadline")

typedef enum {
#define DTL_STATUS_ENUM_(name, value, meaning) name = value,
  DTL_STATUS_MAP(DTL_STATUS_ENUM_)
#undef DTL_STATUS_ENUM_
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

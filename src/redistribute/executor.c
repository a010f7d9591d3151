/* SPDX-License-Identifier: Apache-2.0 */
/* The executor: runs a plan's steps on the mesh dims' communicators, through the transport vtable only, so
 * the same code moves host (MPI) and device (NCCL) buffers. (First version: the scratch figure only.) */
#include "redistribute/plan_internal.h"

size_t dtl__executor_scratch_bytes(const struct dtl_plan *p) {
  size_t a = p->src.local_count, b = p->dst.local_count;
  return (a > b ? a : b) * dtl_dtype_size(p->src.dtype);
}

dtl_status dtl_plan_execute(const dtl_plan *p, const void *src_local, void *dst_local) {
  (void)p;
  (void)src_local;
  (void)dst_local;
  return dtl__error(DTL_ERR_UNSUPPORTED, "dtl_plan_execute: not implemented yet");
}

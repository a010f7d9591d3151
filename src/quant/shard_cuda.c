/* SPDX-License-Identifier: Apache-2.0 */
/* The device half of the kept quantized shard: a copy to the host that is complete on return, for its check. */
#include "comm/device_memory.h"
#include "quant/shard.h"

dtl_status dtl__qshard_own_to_host(const dtl__mem *mem, void *dst, const void *src, size_t bytes) {
  static const char fn[] = "dtl__qshard_own_to_host";
  if (!bytes) return DTL_OK;
  int prev;
  DTL_TRY(dtl__cuda_device_enter(mem->device, fn, &prev));
  cudaStream_t s = (cudaStream_t)mem->stream;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  return dtl__cuda_device_leave(prev, e == cudaSuccess ? DTL_OK : dtl__cuda_error(fn, e));
}

/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA device memory (memory.h): stream-ordered allocations and copies, and the box-copy and fill kernels of
 * device_memory.cu, each enqueued on the memory's stream with its device made current for the call (the
 * caller's device is restored on return). */
#include <cuda_runtime.h>
#include "comm/device_memory.h"

dtl_status dtl__cuda_device_enter(int device, const char *fn, int *prev) {
  int cur = -1;
  *prev = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e != cudaSuccess) return dtl__cuda_error(fn, e);
  if (cur == device) return DTL_OK;
  e = cudaSetDevice(device);
  if (e != cudaSuccess) return dtl__cuda_error(fn, e);
  *prev = cur;
  return DTL_OK;
}

dtl_status dtl__cuda_device_leave(int prev, dtl_status st) {
  if (prev >= 0) cudaSetDevice(prev);
  return st;
}

static dtl_status dtl__cuda_call(const char *fn, cudaError_t e) {
  return e == cudaSuccess ? DTL_OK : dtl__cuda_error(fn, e);
}

/* Stream-ordered allocations from the device's default memory pool: a temporary buffer allocated, used and
 * freed on the stream costs no device-wide synchronization (cudaFree would). */
static dtl_status dtl__cuda_alloc(const dtl__mem *m, size_t bytes, void **out) {
  static const char fn[] = "dtl mem_alloc";
  if (!dtl__alloc_note())
    return dtl__error(DTL_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of device memory (test hook)", fn, bytes);
  int prev;
  DTL_TRY(dtl__cuda_device_enter(m->device, fn, &prev));
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, bytes ? bytes : 1, (cudaStream_t)m->stream);
  if (e == cudaErrorMemoryAllocation)
    return dtl__cuda_device_leave(
        prev, dtl__error(DTL_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of device memory", fn, bytes));
  if (e != cudaSuccess) return dtl__cuda_device_leave(prev, dtl__cuda_error(fn, e));
  *out = p;
  dtl__alloc_track(1);
  return dtl__cuda_device_leave(prev, DTL_OK);
}

static void dtl__cuda_free(const dtl__mem *m, void *p) {
  int prev;
  if (!p || dtl__cuda_device_enter(m->device, "dtl mem_free", &prev) != DTL_OK) return;
  dtl__alloc_track(-1);
  cudaFreeAsync(p, (cudaStream_t)m->stream);
  dtl__cuda_device_leave(prev, DTL_OK);
}

/* memmove semantics: overlapping ranges go through a temporary buffer (cudaMemcpy does not allow overlap). */
static dtl_status dtl__cuda_copy(const dtl__mem *m, void *dst, const void *src, size_t bytes) {
  static const char fn[] = "dtl mem_copy";
  if (bytes == 0 || dst == src) return DTL_OK;
  int prev;
  DTL_TRY(dtl__cuda_device_enter(m->device, fn, &prev));
  cudaStream_t stream = (cudaStream_t)m->stream;
  const char *d = dst, *sp = src;
  dtl_status st;
  if (d < sp + bytes && sp < d + bytes) {
    void *tmp = NULL;
    st = dtl__cuda_alloc(m, bytes, &tmp);
    if (st == DTL_OK) {
      st = dtl__cuda_call(fn, cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDefault, stream));
      if (st == DTL_OK) st = dtl__cuda_call(fn, cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDefault, stream));
      dtl__cuda_free(m, tmp);
    }
  } else {
    st = dtl__cuda_call(fn, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  }
  return dtl__cuda_device_leave(prev, st);
}

static dtl_status dtl__cuda_set(const dtl__mem *m, void *dst, int byte, size_t bytes) {
  static const char fn[] = "dtl mem_set";
  if (bytes == 0) return DTL_OK;
  int prev;
  DTL_TRY(dtl__cuda_device_enter(m->device, fn, &prev));
  return dtl__cuda_device_leave(prev, dtl__cuda_call(fn, cudaMemsetAsync(dst, byte, bytes, (cudaStream_t)m->stream)));
}

static dtl_status dtl__cuda_fill(const dtl__mem *m, void *dst, size_t count, dtl_dtype t, dtl_reduce_op op) {
  int prev;
  DTL_TRY(dtl__cuda_device_enter(m->device, "dtl fill_identity", &prev));
  return dtl__cuda_device_leave(prev, dtl__cuda_fill_identity(dst, count, t, op, (cudaStream_t)m->stream));
}

static dtl_status dtl__cuda_box(const dtl__mem *m, const void *src, void *dst, const dtl__box_copy *box) {
  int prev;
  DTL_TRY(dtl__cuda_device_enter(m->device, "dtl copy_box", &prev));
  return dtl__cuda_device_leave(prev, dtl__cuda_copy_box(src, dst, box, (cudaStream_t)m->stream));
}

const dtl__mem_ops dtl__cuda_mem_ops = {
    .name = "cuda", .memory = DTL_MEMORY_DEVICE, .alloc = dtl__cuda_alloc, .free = dtl__cuda_free,
    .copy = dtl__cuda_copy, .set = dtl__cuda_set, .fill_identity = dtl__cuda_fill, .copy_box = dtl__cuda_box,
};

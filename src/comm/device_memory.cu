/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA kernels behind the device-memory ops of the NCCL transport: the N-d box copy that is redistribution's
 * single pack/unpack pass, filling with a reduction's identity, and the division that completes an average.
 * Each has the semantics of its host twin in host_memory.c (or of the MPI transport's average). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>
#include "comm/device_memory.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535; /* grid-stride loops cover the rest */

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

unsigned grid_1d(size_t n) {
  int64_t blocks = ceil_div((int64_t)n, kThreads);
  return (unsigned)(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

/* --- box copy ------------------------------------------------------------------------------------------ */

/* A box copy reduced to rows: rows = prod(ext) rows over the outer dims, each a contiguous run of `run`
 * units of `unit` bytes in both arrays. Strides and runs count units. Dims of extent 1 are dropped and
 * neighbours that are contiguous in both arrays are merged, so a typical pack has one or two outer dims. */
struct box_plan {
  int nouter;
  int unit;
  int64_t rows, run;
  int64_t ext[DTL_MAX_TENSOR_DIMS], sstride[DTL_MAX_TENSOR_DIMS], dstride[DTL_MAX_TENSOR_DIMS];
  int64_t sbase, dbase; /* bytes */
};

__host__ __device__ inline void box_row_offsets(const box_plan &p, int64_t row, int64_t *so, int64_t *dof) {
  int64_t s = 0, d = 0;
  for (int k = p.nouter - 1; k >= 0; k--) {
    int64_t i = row % p.ext[k];
    row /= p.ext[k];
    s += i * p.sstride[k];
    d += i * p.dstride[k];
  }
  *so = s;
  *dof = d;
}

/* Returns false when the box is empty (some extent is 0): nothing to copy. */
bool box_plan_make(const void *src, const void *dst, const dtl__box_copy *box, box_plan *p) {
  const int nd = box->ndim;
  const int64_t es = (int64_t)box->elem_size;
  int64_t ss[DTL_MAX_TENSOR_DIMS], ds[DTL_MAX_TENSOR_DIMS];
  int64_t sacc = 1, dacc = 1, sbase = 0, dbase = 0;
  for (int d = nd - 1; d >= 0; d--) {
    if (box->extent[d] == 0) return false;
    ss[d] = sacc;
    ds[d] = dacc;
    sacc *= box->src_shape[d];
    dacc *= box->dst_shape[d];
    sbase += box->src_off[d] * ss[d];
    dbase += box->dst_off[d] * ds[d];
  }
  /* Outer to inner: drop extent-1 dims, merge a dim into its outer neighbour when contiguous in both. */
  int n = 0;
  int64_t ext[DTL_MAX_TENSOR_DIMS], ms[DTL_MAX_TENSOR_DIMS], md[DTL_MAX_TENSOR_DIMS];
  for (int d = 0; d < nd; d++) {
    if (box->extent[d] == 1) continue;
    if (n > 0 && ms[n - 1] == box->extent[d] * ss[d] && md[n - 1] == box->extent[d] * ds[d]) {
      ext[n - 1] *= box->extent[d];
      ms[n - 1] = ss[d];
      md[n - 1] = ds[d];
      continue;
    }
    ext[n] = box->extent[d];
    ms[n] = ss[d];
    md[n] = ds[d];
    n++;
  }
  int64_t run_elems = 1;
  if (n > 0 && ms[n - 1] == 1 && md[n - 1] == 1) run_elems = ext[--n];

  /* The widest unit (16 bytes down to 1) that divides the run, both row starts and every stride. */
  int64_t run_bytes = run_elems * es;
  uint64_t bits = (uint64_t)run_bytes | ((uintptr_t)src + (uint64_t)(sbase * es)) | ((uintptr_t)dst + (uint64_t)(dbase * es));
  for (int k = 0; k < n; k++) bits |= (uint64_t)(ms[k] * es) | (uint64_t)(md[k] * es);
  int unit = 16;
  while (unit > 1 && (bits & (uint64_t)(unit - 1))) unit /= 2;

  p->nouter = n;
  p->unit = unit;
  p->run = run_bytes / unit;
  p->rows = 1;
  for (int k = 0; k < n; k++) {
    p->ext[k] = ext[k];
    p->sstride[k] = ms[k] * es / unit;
    p->dstride[k] = md[k] * es / unit;
    p->rows *= ext[k];
  }
  p->sbase = sbase * es;
  p->dbase = dbase * es;
  return true;
}

/* threadIdx.y/blockIdx.y walk rows, threadIdx.x/blockIdx.x walk the run: consecutive threads touch
 * consecutive units of one row (coalesced), and short runs pack several rows into one block. */
template <typename U>
__global__ void copy_box_kernel(const U *__restrict__ src, U *__restrict__ dst, const box_plan p) {
  const int64_t col0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t col_step = (int64_t)gridDim.x * blockDim.x;
  const int64_t row_step = (int64_t)gridDim.y * blockDim.y;
  for (int64_t row = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; row < p.rows; row += row_step) {
    int64_t so, dof;
    box_row_offsets(p, row, &so, &dof);
    for (int64_t col = col0; col < p.run; col += col_step) dst[dof + col] = src[so + col];
  }
}

template <typename U>
cudaError_t launch_copy_box(const void *src, void *dst, const box_plan &p, cudaStream_t stream) {
  int bx = kThreads;
  if (p.run < kThreads) {
    bx = 32;
    while (bx < p.run) bx *= 2;
  }
  int by = kThreads / bx;
  int64_t gx = ceil_div(p.run, bx), gy = ceil_div(p.rows, by);
  dim3 grid((unsigned)(gx < kMaxBlocks ? gx : kMaxBlocks), (unsigned)(gy < kMaxBlocks ? gy : kMaxBlocks));
  copy_box_kernel<U><<<grid, dim3((unsigned)bx, (unsigned)by), 0, stream>>>(
      (const U *)((const char *)src + p.sbase), (U *)((char *)dst + p.dbase), p);
  return cudaGetLastError();
}

/* --- fill and divide ----------------------------------------------------------------------------------- */

template <typename T>
__global__ void fill_kernel(T *__restrict__ dst, size_t n, T value) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = value;
}

template <typename T>
cudaError_t launch_fill(void *dst, size_t n, const void *pattern, cudaStream_t stream) {
  T v;
  memcpy(&v, pattern, sizeof v);
  fill_kernel<T><<<grid_1d(n), kThreads, 0, stream>>>((T *)dst, n, v);
  return cudaGetLastError();
}

/* Element-wise x / n with the host's rounding: C division for integers (promoted to int or int64, then
 * narrowed), IEEE division for f32/f64, f16/bf16 through f32 with round-to-nearest-even. */
struct div_f16 {
  __device__ static uint16_t apply(uint16_t x, int n) {
    return __half_as_ushort(__float2half_rn(__half2float(__ushort_as_half(x)) / (float)n));
  }
};
struct div_bf16 {
  __device__ static uint16_t apply(uint16_t x, int n) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(__bfloat162float(__ushort_as_bfloat16(x)) / (float)n));
  }
};
template <typename T>
struct div_plain {
  __device__ static T apply(T x, int n) { return (T)(x / (T)n); }
};
template <>
struct div_plain<int8_t> {
  __device__ static int8_t apply(int8_t x, int n) { return (int8_t)((int)x / n); }
};
template <>
struct div_plain<uint8_t> {
  __device__ static uint8_t apply(uint8_t x, int n) { return (uint8_t)((int)x / n); }
};

template <typename T, typename Op>
__global__ void divide_kernel(T *__restrict__ buf, size_t n, int divisor) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    buf[i] = Op::apply(buf[i], divisor);
}

template <typename T, typename Op>
cudaError_t launch_divide(void *buf, size_t n, int divisor, cudaStream_t stream) {
  divide_kernel<T, Op><<<grid_1d(n), kThreads, 0, stream>>>((T *)buf, n, divisor);
  return cudaGetLastError();
}

}  // namespace

extern "C" {

dtl_status dtl__cuda_error(const char *fn, cudaError_t e) {
  return dtl__error(DTL_ERR_CUDA, "%s: CUDA error %d (%s): %s", fn, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
}

dtl_status dtl__cuda_copy_box(const void *src, void *dst, const dtl__box_copy *box, cudaStream_t stream) {
  box_plan p;
  if (!box_plan_make(src, dst, box, &p)) return DTL_OK;
  cudaError_t e;
  switch (p.unit) {
    case 16: e = launch_copy_box<uint4>(src, dst, p, stream); break;
    case 8: e = launch_copy_box<uint2>(src, dst, p, stream); break;
    case 4: e = launch_copy_box<uint32_t>(src, dst, p, stream); break;
    case 2: e = launch_copy_box<uint16_t>(src, dst, p, stream); break;
    default: e = launch_copy_box<uint8_t>(src, dst, p, stream); break;
  }
  return e == cudaSuccess ? DTL_OK : dtl__cuda_error("dtl copy_box", e);
}

dtl_status dtl__cuda_copy_box_emulate(const void *src, void *dst, const dtl__box_copy *box) {
  box_plan p;
  if (!box_plan_make(src, dst, box, &p)) return DTL_OK;
  const char *s = (const char *)src + p.sbase;
  char *d = (char *)dst + p.dbase;
  for (int64_t row = 0; row < p.rows; row++) {
    int64_t so, dof;
    box_row_offsets(p, row, &so, &dof);
    for (int64_t col = 0; col < p.run; col++) memcpy(d + (dof + col) * p.unit, s + (so + col) * p.unit, (size_t)p.unit);
  }
  return DTL_OK;
}

dtl_status dtl__cuda_fill_identity(void *dst, size_t count, dtl_dtype t, dtl_reduce_op op, cudaStream_t stream) {
  if (count == 0) return DTL_OK;
  size_t es = dtl_dtype_size(t);
  cudaError_t e;
  if (op == DTL_SUM || op == DTL_AVG) {
    e = cudaMemsetAsync(dst, 0, count * es, stream);
  } else {
    unsigned char pattern[8];
    DTL_TRY(dtl__host_fill_identity(pattern, 1, t, op)); /* one element: the host's value, bit for bit */
    switch (es) {
      case 1: e = launch_fill<uint8_t>(dst, count, pattern, stream); break;
      case 2: e = launch_fill<uint16_t>(dst, count, pattern, stream); break;
      case 4: e = launch_fill<uint32_t>(dst, count, pattern, stream); break;
      default: e = launch_fill<uint64_t>(dst, count, pattern, stream); break;
    }
  }
  return e == cudaSuccess ? DTL_OK : dtl__cuda_error("dtl fill_identity", e);
}

dtl_status dtl__cuda_divide(void *buf, size_t count, dtl_dtype t, int divisor, cudaStream_t stream) {
  if (divisor < 1) return dtl__error(DTL_ERR_INTERNAL, "dtl__cuda_divide: divisor=%d (expected >= 1)", divisor);
  if (count == 0 || divisor == 1) return DTL_OK;
  cudaError_t e;
  switch (t) {
    case DTL_FLOAT32: e = launch_divide<float, div_plain<float>>(buf, count, divisor, stream); break;
    case DTL_FLOAT64: e = launch_divide<double, div_plain<double>>(buf, count, divisor, stream); break;
    case DTL_FLOAT16: e = launch_divide<uint16_t, div_f16>(buf, count, divisor, stream); break;
    case DTL_BFLOAT16: e = launch_divide<uint16_t, div_bf16>(buf, count, divisor, stream); break;
    case DTL_INT8: e = launch_divide<int8_t, div_plain<int8_t>>(buf, count, divisor, stream); break;
    case DTL_UINT8: e = launch_divide<uint8_t, div_plain<uint8_t>>(buf, count, divisor, stream); break;
    case DTL_INT32: e = launch_divide<int32_t, div_plain<int32_t>>(buf, count, divisor, stream); break;
    case DTL_INT64: e = launch_divide<int64_t, div_plain<int64_t>>(buf, count, divisor, stream); break;
    default: return dtl__error(DTL_ERR_INTERNAL, "dtl__cuda_divide: dtype=%d", (int)t);
  }
  return e == cudaSuccess ? DTL_OK : dtl__cuda_error("dtl avg divide", e);
}

}  // extern "C"

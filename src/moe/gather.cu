/* SPDX-License-Identifier: Apache-2.0 */
/* The row gather of device dispatch and combine (CUDA builds only): every row move of a layout's pack (with
 * its padding rows) or regroup in one launch, from an index map uploaded at layout creation, instead of one
 * copy per run of rows. Rows are bytes, so one kernel serves every dtype: each moves in the widest word
 * (16, 8, 4, 2 or 1 bytes) that divides the row and the buffers' alignment. */
#include "compute/device.cuh"
extern "C" {
#include "moe/moe_internal.h"
}

namespace {

using namespace dtl_dev;

/* Word w of map row i. */
template <typename W>
__host__ __device__ inline void gather_word(const dtl__moe_rowmap &m, int64_t i, int64_t w, int64_t words,
                                            const W *src, W *lo, W *hi) {
  int64_t s = m.src[i], d = m.dst[i];
  W *out = d < m.split ? lo + d * words : hi + (d - m.split) * words;
  out[w] = s >= 0 ? src[s * words + w] : W{};
}

/* One block per map row (grid-stride), threads across the row's words. */
template <typename W>
__global__ void gather_kernel(dtl__moe_rowmap m, int64_t words, const W *src, W *lo, W *hi) {
  for (int64_t i = blockIdx.x; i < m.n; i += gridDim.x)
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) gather_word(m, i, w, words, src, lo, hi);
}

/* The widest word that divides the row and the alignment of every buffer. */
size_t word_bytes(size_t row_bytes, const void *src, const void *lo, const void *hi) {
  uintptr_t any = (uintptr_t)row_bytes | (uintptr_t)src | (uintptr_t)lo | (uintptr_t)hi;
  size_t w = 16;
  while (w > 1 && any % w) w /= 2;
  return w;
}

/* Calls f(W()) with W the word type of w bytes. */
template <typename F>
dtl_status with_word(size_t w, F f) {
  switch (w) {
    case 16: return f(uint4());
    case 8: return f(uint2());
    case 4: return f(uint32_t());
    case 2: return f(uint16_t());
    default: return f(uint8_t());
  }
}

}  // namespace

extern "C" dtl_status dtl__moe_gather_rows_cuda(const dtl__mem *mem, const dtl__moe_rowmap *map, const void *src,
                                                void *dst_lo, void *dst_hi, size_t row_bytes) {
  static const char fn[] = "dtl__moe_gather_rows_cuda";
  if (map->n == 0 || row_bytes == 0) return DTL_OK;
  size_t wb = word_bytes(row_bytes, src, dst_lo, dst_hi);
  int64_t words = (int64_t)(row_bytes / wb);
  unsigned blocks = (unsigned)(map->n < kMaxBlocks ? map->n : kMaxBlocks);
  unsigned threads = words >= kThreads ? (unsigned)kThreads : (unsigned)((words + 31) / 32 * 32);
  int prev;
  DTL_TRY(dtl__cuda_device_enter(mem->device, fn, &prev));
  dtl_status st = with_word(wb, [&](auto z) {
    using W = decltype(z);
    gather_kernel<W><<<blocks, threads, 0, (cudaStream_t)mem->stream>>>(*map, words, (const W *)src, (W *)dst_lo,
                                                                       (W *)dst_hi);
    return launched(fn);
  });
  return dtl__cuda_device_leave(prev, st);
}

extern "C" dtl_status dtl__moe_gather_rows_emulate(const dtl__moe_rowmap *map, const void *src, void *dst_lo,
                                                   void *dst_hi, size_t row_bytes) {
  if (map->n == 0 || row_bytes == 0) return DTL_OK;
  size_t wb = word_bytes(row_bytes, src, dst_lo, dst_hi);
  int64_t words = (int64_t)(row_bytes / wb);
  return with_word(wb, [&](auto z) {
    using W = decltype(z);
    for (int64_t i = 0; i < map->n; i++)
      for (int64_t w = 0; w < words; w++) gather_word(*map, i, w, words, (const W *)src, (W *)dst_lo, (W *)dst_hi);
    return DTL_OK;
  });
}

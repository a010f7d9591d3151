/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The chunk rule (torch.chunk) that splits one dim over k pieces: layouts,
 * the planner, the TP/CP head and token splits and the attention kernels all cut by it, so it lives here,
 * below every area, and has one definition. */
#ifndef DTL_COMMON_CHUNK_H
#define DTL_COMMON_CHUNK_H

#include <stdint.h>

/* torch.chunk: the [offset, offset+size) piece that chunk index i of k gets from a dim of size n: ceil(n / k)
 * per chunk, the tail takes what is left. Written without n + k - 1 and without an unchecked c * i so that
 * dims near INT64_MAX (legal for i8 tensors) cannot overflow. */
static inline void dtl__chunk(int64_t n, int k, int i, int64_t *offset, int64_t *size) {
  int64_t c = n / k + (n % k != 0);
  int64_t lo = (c == 0 || i > n / c) ? n : c * i;
  if (lo > n) lo = n;
  int64_t hi = (c > n - lo) ? n : lo + c;
  *offset = lo;
  *size = hi - lo;
}

#endif

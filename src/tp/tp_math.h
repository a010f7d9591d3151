/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The index arithmetic of the TP blocks, one copy shared by the host loops
 * (*.c) and the CUDA kernels (*.cu): the embedding's row lookup and the total order of
 * top-k candidates (the activations are compute/math.h's). */
#ifndef DTL_TP_MATH_H
#define DTL_TP_MATH_H

#include "compute/math.h"

/* The row of this rank's table shard [off, off + count) that holds vocab id, or -1 when another rank owns it. */
static DTL_HD inline int64_t dtl__tp_embed_row(int64_t id, int64_t off, int64_t count) {
  return id >= off && id - off < count ? id - off : -1;
}

/* A top-k candidate travels as two int64: the f32 bits of its value and its global index (-1 = an empty
 * slot, for a rank with fewer than k logits). */
static DTL_HD inline float dtl__tp_cand_value(const int64_t *c) {
  uint32_t bits = (uint32_t)c[0];
  float v;
  memcpy(&v, &bits, sizeof v);
  return v;
}
static DTL_HD inline void dtl__tp_cand_set(int64_t *c, float v, int64_t index) {
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  c[0] = (int64_t)bits;
  c[1] = index;
}

/* The total order of top-k: NaN before numbers (as torch.topk), larger values first, equal values by lower
 * index; an empty slot (index < 0) after everything. Distinct indices make it strict, so the best of a set
 * does not depend on the order in which it is searched. */
static DTL_HD inline bool dtl__tp_better(float va, int64_t ia, float vb, int64_t ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  bool na = va != va, nb = vb != vb;
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

#endif

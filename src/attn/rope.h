/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. Rotary position embedding (RoPE) in the GPT-NeoX "rotate half" layout, the one
 * Hugging Face's Llama, Mistral, Qwen and Mixtral use: in a head of D (even) elements at absolute position p,
 * element i < D/2 pairs with element i + D/2 and the pair turns by the angle p * theta^(-2i/D). Every
 * attention layer applies it through here (tensor-parallel blocks, context parallelism). The host half
 * (rope.c) runs on f32; the device half (rope.cu) on f32/f16/bf16 storage with f32 arithmetic, and its code
 * also runs on the host (dtl__rope_emulate) for tests. Neither allocates. */
#ifndef DTL_ATTN_ROPE_H
#define DTL_ATTN_ROPE_H

#include "common/internal.h"
#include "compute/math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One call: rows x [rows, ld] (row-major, leading dim in elements) whose first heads * head_dim columns are
 * heads of head_dim elements each (several heads share a row's position, so q and k heads laid side by side
 * turn in one call). Row i is at position pos ? pos[i] : pos0 + i (an array in the call's memory: host, or
 * device for dtl__rope_cuda). Columns past the heads are left alone. */
typedef struct {
  int64_t rows, heads, head_dim, ld;
  const int64_t *pos;
  int64_t pos0;
  float theta;
} dtl__rope_shape;

static DTL_HD inline int64_t dtl__rope_pos(const dtl__rope_shape *s, int64_t i) { return s->pos ? s->pos[i] : s->pos0 + i; }

/* The angle of pair i (0 <= i < D/2) at position p, computed as Hugging Face computes it (f32 throughout):
 * inv_freq = 1 / theta^(2i/D), then p * inv_freq. */
static DTL_HD inline float dtl__rope_angle(int64_t p, int64_t i, int64_t head_dim, float theta) {
  float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
  return (float)p * inv_freq;
}

/* The pair (a, b) = (x[i], x[i + D/2]) turned by the angle whose cosine is c and sine s:
 * (a c - b s, b c + a s), i.e. x * cos + rotate_half(x) * sin with rotate_half(x) = (-x2, x1). */
static DTL_HD inline void dtl__rope_turn(float a, float b, float c, float s, float *ra, float *rb) {
  *ra = a * c - b * s;
  *rb = b * c + a * s;
}

/* DTL_ERR_INTERNAL naming fn and the field when s is inconsistent (negative sizes, an odd or zero head_dim,
 * a leading dim narrower than the heads, theta not finite and > 0). The entry points below call it. */
dtl_status dtl__rope_check(const char *fn, const dtl__rope_shape *s);

/* The host half: x f32 in host memory, turned in place. */
dtl_status dtl__rope_host(const dtl__rope_shape *s, float *x);

#if DTL_HAVE_NCCL
/* The device half: x of dtype t (f32/f16/bf16) in device memory of the current device, turned in place with
 * f32 arithmetic and one rounding to t per element. Enqueued on stream (a cudaStream_t); returns at once. */
dtl_status dtl__rope_cuda(const dtl__rope_shape *s, void *x, dtl_dtype t, void *stream);
/* The device half's code run on the host over host memory, thread by thread. For tests; not a fast path. */
dtl_status dtl__rope_emulate(const dtl__rope_shape *s, void *x, dtl_dtype t);
#endif

#ifdef __cplusplus
}
#endif
#endif

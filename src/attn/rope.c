/* SPDX-License-Identifier: Apache-2.0 */
/* The host half of rotary position embedding (rope.h) and the shape check both halves share: per row and
 * pair, one sine and cosine, then every head of the row turned by them. */
#include "attn/rope.h"

dtl_status dtl__rope_check(const char *fn, const dtl__rope_shape *s) {
  if (s->rows < 0 || s->heads < 0)
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "rows=%lld heads=%lld (expected >= 0)", (long long)s->rows,
                         (long long)s->heads);
  if (s->head_dim < 2 || s->head_dim % 2)
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "head_dim=%lld (expected even and >= 2)", (long long)s->head_dim);
  if (s->ld < s->heads * s->head_dim)
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "ld=%lld (expected >= heads x head_dim = %lld)", (long long)s->ld,
                         (long long)(s->heads * s->head_dim));
  if (!(isfinite(s->theta) && s->theta > 0.0f))
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "theta=%g (expected finite and > 0)", (double)s->theta);
  return DTL_OK;
}

dtl_status dtl__rope_host(const dtl__rope_shape *s, float *x) {
  DTL_TRY(dtl__rope_check("dtl__rope_host", s));
  const int64_t D = s->head_dim, half = D / 2;
  for (int64_t r = 0; r < s->rows; r++) {
    float *row = x + r * s->ld;
    int64_t p = dtl__rope_pos(s, r);
    for (int64_t i = 0; i < half; i++) {
      float ang = dtl__rope_angle(p, i, D, s->theta), c = cosf(ang), sn = sinf(ang);
      for (int64_t h = 0; h < s->heads; h++) {
        float *a = row + h * D + i;
        dtl__rope_turn(a[0], a[half], c, sn, &a[0], &a[half]);
      }
    }
  }
  return DTL_OK;
}

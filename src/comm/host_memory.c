/* SPDX-License-Identifier: Apache-2.0 */
/* Host memory (memory.h): malloc through the library's allocator, memmove, N-d box copies (the single
 * pack/unpack pass of redistribution) and filling with a reduction's identity. */
#include <float.h>
#include <math.h>
#include <string.h>
#include "comm/memory.h"
#include "common/half.h"

/* Merges trailing dims that are whole in both arrays, so the innermost memcpy is as long as possible. */
dtl_status dtl__host_copy_box(const void *src, void *dst, const dtl__box_copy *box) {
  int nd = box->ndim;
  int64_t ext[DTL_MAX_TENSOR_DIMS] = {0};
  for (int d = 0; d < nd; d++) {
    if (box->extent[d] == 0) return DTL_OK;
    ext[d] = box->extent[d];
  }
  size_t es = box->elem_size;
  if (nd == 0) {
    memcpy(dst, src, es);
    return DTL_OK;
  }
  /* Row length in elements: innermost extent, extended while the inner dims are full in both arrays. */
  int inner = nd - 1;
  int64_t run = ext[inner];
  while (inner > 0 && ext[inner] == box->src_shape[inner] && ext[inner] == box->dst_shape[inner]) {
    inner--;
    run *= ext[inner];
  }
  int64_t sstride[DTL_MAX_TENSOR_DIMS], dstride[DTL_MAX_TENSOR_DIMS];
  int64_t ss = 1, ds = 1;
  for (int d = nd - 1; d >= 0; d--) {
    sstride[d] = ss;
    dstride[d] = ds;
    ss *= box->src_shape[d];
    ds *= box->dst_shape[d];
  }
  int64_t sbase = 0, dbase = 0;
  for (int d = 0; d < nd; d++) {
    sbase += box->src_off[d] * sstride[d];
    dbase += box->dst_off[d] * dstride[d];
  }
  const char *s = src;
  char *o = dst;
  size_t run_bytes = (size_t)run * es;
  int64_t idx[DTL_MAX_TENSOR_DIMS] = {0};
  /* Odometer over the outer dims [0, inner). */
  for (;;) {
    int64_t so = sbase, dof = dbase;
    for (int d = 0; d < inner; d++) {
      so += idx[d] * sstride[d];
      dof += idx[d] * dstride[d];
    }
    memcpy(o + (size_t)dof * es, s + (size_t)so * es, run_bytes);
    int d = inner - 1;
    while (d >= 0 && ++idx[d] == ext[d]) idx[d--] = 0;
    if (d < 0) break;
  }
  return DTL_OK;
}

#define DTL__FILL(type, value)                              \
  do {                                                      \
    type v_ = (value);                                      \
    for (size_t i = 0; i < count; i++) ((type *)dst)[i] = v_; \
  } while (0)

dtl_status dtl__host_fill_identity(void *dst, size_t count, dtl_dtype t, dtl_reduce_op op) {
  if (count == 0) return DTL_OK; /* dst may be NULL */
  if (op == DTL_SUM || op == DTL_AVG) {
    memset(dst, 0, count * dtl_dtype_size(t));
    return DTL_OK;
  }
  int sel = op == DTL_PROD ? 0 : op == DTL_MAX ? 1 : 2; /* identity of prod, max, min */
  switch (t) {
    case DTL_FLOAT32: DTL__FILL(float, sel == 0 ? 1.0f : sel == 1 ? -INFINITY : INFINITY); break;
    case DTL_FLOAT64: DTL__FILL(double, sel == 0 ? 1.0 : sel == 1 ? -INFINITY : INFINITY); break;
    case DTL_FLOAT16: DTL__FILL(uint16_t, sel == 0 ? 0x3c00 : sel == 1 ? 0xfc00 : 0x7c00); break;
    case DTL_BFLOAT16: DTL__FILL(uint16_t, sel == 0 ? 0x3f80 : sel == 1 ? 0xff80 : 0x7f80); break;
    case DTL_INT8: DTL__FILL(int8_t, sel == 0 ? 1 : sel == 1 ? INT8_MIN : INT8_MAX); break;
    case DTL_UINT8: DTL__FILL(uint8_t, sel == 0 ? 1 : sel == 1 ? 0 : UINT8_MAX); break;
    case DTL_INT32: DTL__FILL(int32_t, sel == 0 ? 1 : sel == 1 ? INT32_MIN : INT32_MAX); break;
    case DTL_INT64: DTL__FILL(int64_t, sel == 0 ? 1 : sel == 1 ? INT64_MIN : INT64_MAX); break;
    /* 1, and the lowest and highest values: e4m3fn has no infinities, so -448 and +448 (max(x, -448) is x for
     * every code but NaN, as max(x, -inf) is for the other floats); e5m2 has them. */
    case DTL_FLOAT8_E4M3: DTL__FILL(uint8_t, sel == 0 ? 0x38 : sel == 1 ? 0xfe : 0x7e); break;
    case DTL_FLOAT8_E5M2: DTL__FILL(uint8_t, sel == 0 ? 0x3c : sel == 1 ? 0xfc : 0x7c); break;
    default: return dtl__error(DTL_ERR_INTERNAL, "dtl__host_fill_identity: dtype=%d", (int)t);
  }
  return DTL_OK;
}

static dtl_status dtl__host_alloc(const dtl__mem *m, size_t bytes, void **out) {
  (void)m;
  void *p = dtl__malloc(bytes);
  if (!p) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl: cannot allocate %zu bytes of host memory", bytes);
  *out = p;
  return DTL_OK;
}

static void dtl__host_free(const dtl__mem *m, void *p) {
  (void)m;
  dtl__free(p);
}

static dtl_status dtl__host_copy(const dtl__mem *m, void *dst, const void *src, size_t bytes) {
  (void)m;
  if (bytes) memmove(dst, src, bytes);
  return DTL_OK;
}

static dtl_status dtl__host_set(const dtl__mem *m, void *dst, int byte, size_t bytes) {
  (void)m;
  if (bytes) memset(dst, byte, bytes);
  return DTL_OK;
}

static dtl_status dtl__host_fill(const dtl__mem *m, void *dst, size_t count, dtl_dtype t, dtl_reduce_op op) {
  (void)m;
  return dtl__host_fill_identity(dst, count, t, op);
}

static dtl_status dtl__host_box(const dtl__mem *m, const void *src, void *dst, const dtl__box_copy *box) {
  (void)m;
  return dtl__host_copy_box(src, dst, box);
}

const dtl__mem_ops dtl__host_mem_ops = {
    .name = "host", .memory = DTL_MEMORY_HOST, .alloc = dtl__host_alloc, .free = dtl__host_free,
    .copy = dtl__host_copy, .set = dtl__host_set, .fill_identity = dtl__host_fill, .copy_box = dtl__host_box,
};

/* SPDX-License-Identifier: Apache-2.0 */
/* The host-memory kernels behind the MPI transport's memory ops: the N-d box copy against a naive
 * element-by-element copy on random boxes, and the identity fill against the defining property of an
 * identity (e op x == x for every x, extremes included). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "comm/backend.h"
#include "common/half.h"
#include "dtype_data.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rnd(uint64_t n) { /* xorshift64*, uniform enough for test shapes */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (rng_state * 0x2545f4914f6cdd1dull >> 11) % n;
}

static int64_t volume(int nd, const int64_t *shape) {
  int64_t v = 1;
  for (int d = 0; d < nd; d++) v *= shape[d];
  return v;
}

/* The oracle: visit every index of the box, compute both flat offsets from scratch, copy one element. */
static void naive_copy_box(const unsigned char *src, unsigned char *dst, const dtl__box_copy *b) {
  int64_t n = volume(b->ndim, b->extent);
  for (int64_t flat = 0; flat < n; flat++) {
    int64_t rest = flat, so = 0, dof = 0, sstride = 1, dstride = 1;
    for (int d = b->ndim - 1; d >= 0; d--) {
      int64_t i = rest % b->extent[d];
      rest /= b->extent[d];
      so += (b->src_off[d] + i) * sstride;
      dof += (b->dst_off[d] + i) * dstride;
      sstride *= b->src_shape[d];
      dstride *= b->dst_shape[d];
    }
    memcpy(dst + dof * (int64_t)b->elem_size, src + so * (int64_t)b->elem_size, b->elem_size);
  }
}

/* A random box in random arrays; about a third of the dims span the whole of both arrays (so the copy's
 * merging of trailing full dims is exercised), and some extents are zero. */
static void random_box(dtl__box_copy *b) {
  static const size_t elem_sizes[] = {1, 2, 3, 4, 8};
  memset(b, 0, sizeof *b);
  b->ndim = 1 + (int)rnd(4);
  b->elem_size = elem_sizes[rnd(5)];
  for (int d = 0; d < b->ndim; d++) {
    int64_t ext = (int64_t)rnd(6);
    if (rnd(12) == 0) ext = 0;
    b->extent[d] = ext;
    if (rnd(3) == 0) {
      b->src_shape[d] = b->dst_shape[d] = ext;
    } else {
      b->src_shape[d] = ext + (int64_t)rnd(4);
      b->dst_shape[d] = ext + (int64_t)rnd(4);
      b->src_off[d] = (int64_t)rnd((uint64_t)(b->src_shape[d] - ext + 1));
      b->dst_off[d] = (int64_t)rnd((uint64_t)(b->dst_shape[d] - ext + 1));
    }
  }
}

static void box_copy_matches_naive_copy_on_random_boxes(void **state) {
  (void)state;
  for (int trial = 0; trial < 3000; trial++) {
    dtl__box_copy b;
    random_box(&b);
    size_t sbytes = (size_t)volume(b.ndim, b.src_shape) * b.elem_size;
    size_t dbytes = (size_t)volume(b.ndim, b.dst_shape) * b.elem_size;
    unsigned char *src = malloc(sbytes + 1), *got = malloc(dbytes + 1), *want = malloc(dbytes + 1);
    for (size_t i = 0; i < sbytes; i++) src[i] = (unsigned char)rnd(256);
    memset(got, 0xee, dbytes + 1);
    memset(want, 0xee, dbytes + 1);
    assert_int_equal(dtl__host_copy_box(src, got, &b), DTL_OK);
    naive_copy_box(src, want, &b);
    if (memcmp(got, want, dbytes + 1) != 0)
      fail_msg("trial %d: ndim=%d elem=%zu extent[0]=%lld differs from the naive copy", trial, b.ndim, b.elem_size,
               (long long)b.extent[0]);
    free(src);
    free(got);
    free(want);
  }
}

static void box_copy_of_empty_box_writes_nothing(void **state) {
  (void)state;
  dtl__box_copy b = {.ndim = 2, .elem_size = 4, .extent = {3, 0}, .src_shape = {3, 2}, .dst_shape = {3, 2}};
  float src[6] = {1, 2, 3, 4, 5, 6}, dst[6] = {0};
  assert_int_equal(dtl__host_copy_box(src, dst, &b), DTL_OK);
  for (int i = 0; i < 6; i++) assert_true(dst[i] == 0);
}

/* --- identity fill --------------------------------------------------------------------------------------- */

/* Values of each type to combine with the identity: zero, ones, small values and both extremes. */
static int probe_values(dtl_dtype t, double *v) {
  int n = 0;
  v[n++] = 0;
  v[n++] = 1;
  v[n++] = 7;
  switch (t) {
    case DTL_UINT8: v[n++] = 255; break;
    case DTL_INT8: v[n++] = -128, v[n++] = 127, v[n++] = -1; break;
    case DTL_INT32: v[n++] = INT32_MIN, v[n++] = INT32_MAX, v[n++] = -1; break;
    case DTL_INT64: v[n++] = (double)INT64_MIN, v[n++] = -1, v[n++] = 9007199254740992.0; break;
    /* the extremes each 8-bit float holds: e4m3fn has no infinities, so +-448 and the smallest subnormal */
    case DTL_FLOAT8_E4M3: v[n++] = -1, v[n++] = -0.5, v[n++] = 448, v[n++] = -448, v[n++] = 0x1p-9; break;
    case DTL_FLOAT8_E5M2:
      v[n++] = -1, v[n++] = INFINITY, v[n++] = -INFINITY, v[n++] = 57344, v[n++] = -57344, v[n++] = 0x1p-16;
      break;
    default: v[n++] = -1, v[n++] = -0.5, v[n++] = INFINITY, v[n++] = -INFINITY, v[n++] = 65504, v[n++] = -65504; break;
  }
  return n;
}

static void identity_fill_is_neutral_for_every_dtype_and_op(void **state) {
  (void)state;
  for (int t = 0; t < DTL_NUM_DTYPES; t++)
    for (int op = 0; op < DTL_NUM_REDUCE_OPS; op++) {
      const size_t count = 37, es = dtl_dtype_size((dtl_dtype)t);
      unsigned char buf[37 * 8 + 8];
      memset(buf, 0xcd, sizeof buf);
      assert_int_equal(dtl__host_fill_identity(buf, count, (dtl_dtype)t, (dtl_reduce_op)op), DTL_OK);
      for (size_t i = count * es; i < sizeof buf; i++) assert_int_equal(buf[i], 0xcd); /* nothing past count */
      double e = t_get((dtl_dtype)t, buf, 0), x[16];
      /* A NaN would pass every comparison below (each is false): e4m3fn has no -inf, and its NaN must not stand in. */
      if (isnan(e)) fail_msg("dtype %s op %s: the identity is a NaN", dtl_dtype_name((dtl_dtype)t),
                             dtl_reduce_op_name((dtl_reduce_op)op));
      for (size_t i = 1; i < count; i++) assert_memory_equal(buf, buf + i * es, es); /* every element the same */
      int n = probe_values((dtl_dtype)t, x);
      for (int k = 0; k < n; k++) {
        double r;
        switch (op) {
          case DTL_PROD: r = e * x[k]; break;
          case DTL_MAX: r = e > x[k] ? e : x[k]; break;
          case DTL_MIN: r = e < x[k] ? e : x[k]; break;
          default: r = e + x[k]; break; /* sum, and avg's sum */
        }
        if (!(r == x[k]))
          fail_msg("dtype %s op %s: identity %g combined with %g gives %g", dtl_dtype_name((dtl_dtype)t),
                   dtl_reduce_op_name((dtl_reduce_op)op), e, x[k], r);
      }
    }
}

static void identity_fill_of_zero_elements_accepts_null(void **state) {
  (void)state;
  assert_int_equal(dtl__host_fill_identity(NULL, 0, DTL_FLOAT16, DTL_MAX), DTL_OK);
  assert_int_equal(dtl__host_fill_identity(NULL, 0, DTL_INT8, DTL_SUM), DTL_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(box_copy_matches_naive_copy_on_random_boxes),
      cmocka_unit_test(box_copy_of_empty_box_writes_nothing),
      cmocka_unit_test(identity_fill_is_neutral_for_every_dtype_and_op),
      cmocka_unit_test(identity_fill_of_zero_elements_accepts_null),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

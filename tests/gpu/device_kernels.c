/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA kernels behind device memory against their host twins: box copies on random boxes of 0..4 dims
 * (with misaligned pointers, so every vector width is taken), identity fills for every dtype and op, and
 * the average's division. The copy_box index arithmetic is also checked on the host, so part of this test
 * runs without a GPU; the rest exits 77 when no device is visible. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "comm/device_memory.h"
#include "common/half.h"
#include "dtl/nccl.h"

static uint64_t rng_state;
static uint64_t rng(void) { /* splitmix64: deterministic across machines */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static int64_t pick(int64_t lo, int64_t hi) { return lo + (int64_t)(rng() % (uint64_t)(hi - lo + 1)); }
static void fill_random(unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)rng();
}

#define CUDA_OK(call) assert_int_equal((int)(call), (int)cudaSuccess)

/* A random box of nd dims: shapes 1..9 (inner dims up to 40 so rows are long enough to vectorize), extents
 * sometimes 0, sometimes whole in both arrays so that dims merge. */
static dtl__box_copy random_box(int nd, size_t es) {
  dtl__box_copy b;
  memset(&b, 0, sizeof b);
  b.ndim = nd;
  b.elem_size = es;
  for (int d = 0; d < nd; d++) {
    int64_t maxdim = d == nd - 1 ? 40 : 9;
    int64_t s = pick(1, maxdim);
    int64_t e = pick(0, 19) == 0 ? 0 : pick(1, s);
    int64_t ds = pick(e > 0 ? e : 1, e + 5);
    if (pick(0, 2) == 0) e = s, ds = s; /* whole dim in both */
    b.extent[d] = e;
    b.src_shape[d] = s;
    b.dst_shape[d] = ds;
    b.src_off[d] = pick(0, s - e);
    b.dst_off[d] = pick(0, ds - e);
  }
  return b;
}

static size_t box_elems(const int64_t *shape, int nd) {
  size_t n = 1;
  for (int d = 0; d < nd; d++) n *= (size_t)shape[d];
  return n;
}

static const size_t elem_sizes[] = {1, 2, 4, 8, 3, 16};

/* One trial: copies with the reference and with `impl` into identical random backgrounds, from buffers
 * shifted by a random misalignment; the whole destination must agree byte for byte (nothing written
 * outside the box either). on_device: impl runs the kernel on device copies of the buffers. */
static void check_box(const dtl__box_copy *b, bool on_device, cudaStream_t stream) {
  size_t es = b->elem_size;
  size_t sbytes = box_elems(b->src_shape, b->ndim) * es, dbytes = box_elems(b->dst_shape, b->ndim) * es;
  size_t smis = (size_t)pick(0, 15), dmis = pick(0, 1) ? 0 : (size_t)pick(0, 15);
  unsigned char *src = malloc(sbytes + 16), *want = malloc(dbytes + 16), *got = malloc(dbytes + 16);
  assert_non_null(src);
  assert_non_null(want);
  assert_non_null(got);
  fill_random(src, sbytes + 16);
  fill_random(want, dbytes + 16);
  memcpy(got, want, dbytes + 16);
  assert_int_equal(dtl__host_copy_box(src + smis, want + dmis, b), DTL_OK);
  if (!on_device) {
    assert_int_equal(dtl__cuda_copy_box_emulate(src + smis, got + dmis, b), DTL_OK);
  } else {
    unsigned char *dsrc = NULL, *ddst = NULL;
    CUDA_OK(cudaMalloc((void **)&dsrc, sbytes + 16));
    CUDA_OK(cudaMalloc((void **)&ddst, dbytes + 16));
    CUDA_OK(cudaMemcpy(dsrc, src, sbytes + 16, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(ddst, got, dbytes + 16, cudaMemcpyHostToDevice));
    assert_int_equal(dtl__cuda_copy_box(dsrc + smis, ddst + dmis, b, stream), DTL_OK);
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(got, ddst, dbytes + 16, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaFree(dsrc));
    CUDA_OK(cudaFree(ddst));
  }
  if (memcmp(got, want, dbytes + 16) != 0) {
    print_error("box ndim=%d es=%zu smis=%zu dmis=%zu:", b->ndim, es, smis, dmis);
    for (int d = 0; d < b->ndim; d++)
      print_error(" [ext %lld src %lld@%lld dst %lld@%lld]", (long long)b->extent[d], (long long)b->src_shape[d],
                  (long long)b->src_off[d], (long long)b->dst_shape[d], (long long)b->dst_off[d]);
    print_error("\n");
    fail_msg("copy_box result differs from dtl__host_copy_box");
  }
  free(src);
  free(want);
  free(got);
}

static void run_random_boxes(bool on_device, cudaStream_t stream) {
  rng_state = 20240611;
  for (int trial = 0; trial < 1500; trial++) {
    int nd = (int)pick(0, 4);
    dtl__box_copy b = random_box(nd, elem_sizes[pick(0, 5)]);
    check_box(&b, on_device, stream);
  }
}

static void copy_box_index_arithmetic_matches_host_copy_on_random_boxes(void **state) {
  (void)state;
  run_random_boxes(false, 0);
}

/* A pack of column block [2, 5) of a 6x8 f32 matrix: rows of 3 elements at stride 8. */
static dtl__box_copy column_pack(void) {
  dtl__box_copy b = {.ndim = 2, .elem_size = 4, .extent = {6, 3}, .src_shape = {6, 8}, .src_off = {0, 2},
                     .dst_shape = {6, 3}};
  return b;
}

static void copy_box_index_arithmetic_packs_a_column_block(void **state) {
  (void)state;
  dtl__box_copy b = column_pack();
  float src[48], got[18];
  for (int i = 0; i < 48; i++) src[i] = (float)i;
  memset(got, 0, sizeof got);
  assert_int_equal(dtl__cuda_copy_box_emulate(src, got, &b), DTL_OK);
  for (int r = 0; r < 6; r++)
    for (int j = 0; j < 3; j++) assert_true(got[r * 3 + j] == (float)(r * 8 + 2 + j));
}

/* --- on the device ------------------------------------------------------------------------------------- */
static cudaStream_t stream;

static int setup_stream(void **state) {
  (void)state;
  return cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess ? 0 : -1;
}
static int teardown_stream(void **state) {
  (void)state;
  return cudaStreamDestroy(stream) == cudaSuccess ? 0 : -1;
}

static void copy_box_kernel_matches_host_copy_on_random_boxes(void **state) {
  (void)state;
  run_random_boxes(true, stream);
}

static void copy_box_kernel_copies_a_large_box_beyond_one_grid(void **state) {
  (void)state;
  /* 600000 rows of one element, 8 rows per block: more blocks than one grid dimension holds (65535), so
   * the grid-stride loop over rows must run. */
  dtl__box_copy b = {.ndim = 2, .elem_size = 8, .extent = {600000, 1}, .src_shape = {600000, 3}, .src_off = {0, 1},
                     .dst_shape = {600001, 1}, .dst_off = {1, 0}};
  rng_state = 7;
  check_box(&b, true, stream);
}

static void fill_identity_kernel_matches_host_for_every_dtype_and_op(void **state) {
  (void)state;
  const size_t count = 1003;
  for (int t = 0; t < DTL_NUM_DTYPES; t++) {
    for (int op = 0; op < DTL_NUM_REDUCE_OPS; op++) {
      size_t es = dtl_dtype_size((dtl_dtype)t), bytes = (count + 2) * es;
      unsigned char *want = malloc(bytes), *got = malloc(bytes), *dev = NULL;
      assert_non_null(want);
      assert_non_null(got);
      memset(want, 0xab, bytes);
      assert_int_equal(dtl__host_fill_identity(want + es, count, (dtl_dtype)t, (dtl_reduce_op)op), DTL_OK);
      CUDA_OK(cudaMalloc((void **)&dev, bytes));
      CUDA_OK(cudaMemset(dev, 0xab, bytes));
      assert_int_equal(dtl__cuda_fill_identity(dev + es, count, (dtl_dtype)t, (dtl_reduce_op)op, stream), DTL_OK);
      CUDA_OK(cudaStreamSynchronize(stream));
      CUDA_OK(cudaMemcpy(got, dev, bytes, cudaMemcpyDeviceToHost));
      if (memcmp(got, want, bytes) != 0) fail_msg("fill identity differs: dtype %s op %s", dtl_dtype_name((dtl_dtype)t),
                                                  dtl_reduce_op_name((dtl_reduce_op)op));
      CUDA_OK(cudaFree(dev));
      free(want);
      free(got);
    }
  }
}

/* x / n as the MPI backend computes it: C division for integers, f32 division rounded to nearest even
 * for the 16-bit floats. */
static void divide_on_host(dtl_dtype t, unsigned char *p, size_t i, int n) {
  switch (t) {
    case DTL_FLOAT32: ((float *)p)[i] /= (float)n; break;
    case DTL_FLOAT64: ((double *)p)[i] /= (double)n; break;
    case DTL_FLOAT16: ((uint16_t *)p)[i] = dtl__f32_to_f16(dtl__f16_to_f32(((uint16_t *)p)[i]) / (float)n); break;
    case DTL_BFLOAT16: ((uint16_t *)p)[i] = dtl__f32_to_bf16(dtl__bf16_to_f32(((uint16_t *)p)[i]) / (float)n); break;
    case DTL_INT8: ((int8_t *)p)[i] = (int8_t)(((int8_t *)p)[i] / n); break;
    case DTL_UINT8: ((uint8_t *)p)[i] = (uint8_t)(((uint8_t *)p)[i] / n); break;
    case DTL_INT32: ((int32_t *)p)[i] /= n; break;
    case DTL_INT64: ((int64_t *)p)[i] /= n; break;
    case DTL_FLOAT8_E4M3: /* fall through: no average of the 8-bit floats (refused, types.h): no kernel either */
    case DTL_FLOAT8_E5M2: break;
  }
}

/* Random finite values: any bit pattern for integers, values in [-1000, 1000] for floats. */
static void random_value(dtl_dtype t, unsigned char *p, size_t i) {
  float f = (float)((double)(int64_t)(rng() % 2000001) / 1000.0 - 1000.0);
  switch (t) {
    case DTL_FLOAT32: ((float *)p)[i] = f; break;
    case DTL_FLOAT64: ((double *)p)[i] = (double)f * 1.0000001; break;
    case DTL_FLOAT16: ((uint16_t *)p)[i] = dtl__f32_to_f16(f); break;
    case DTL_BFLOAT16: ((uint16_t *)p)[i] = dtl__f32_to_bf16(f); break;
    default: {
      uint64_t r = rng();
      memcpy(p + i * dtl_dtype_size(t), &r, dtl_dtype_size(t));
    }
  }
}

static void divide_kernel_truncates_integers_toward_zero_and_rounds_floats_like_the_host(void **state) {
  (void)state;
  const size_t count = 4099;
  const int divisors[] = {1, 2, 3, 4, 7, 8};
  rng_state = 99;
  for (int t = 0; t < DTL_NUM_DTYPES; t++) {
    if (t == DTL_FLOAT8_E4M3 || t == DTL_FLOAT8_E5M2) { /* their averages are refused before any transport */
      unsigned char one[1] = {0x38};
      assert_int_equal(dtl__cuda_divide(one, 1, (dtl_dtype)t, 2, stream), DTL_ERR_INTERNAL);
      continue;
    }
    for (size_t k = 0; k < sizeof divisors / sizeof *divisors; k++) {
      size_t es = dtl_dtype_size((dtl_dtype)t), bytes = count * es;
      unsigned char *want = malloc(bytes), *got = malloc(bytes), *dev = NULL;
      assert_non_null(want);
      assert_non_null(got);
      for (size_t i = 0; i < count; i++) random_value((dtl_dtype)t, want, i);
      CUDA_OK(cudaMalloc((void **)&dev, bytes));
      CUDA_OK(cudaMemcpy(dev, want, bytes, cudaMemcpyHostToDevice));
      for (size_t i = 0; i < count; i++) divide_on_host((dtl_dtype)t, want, i, divisors[k]);
      assert_int_equal(dtl__cuda_divide(dev, count, (dtl_dtype)t, divisors[k], stream), DTL_OK);
      CUDA_OK(cudaStreamSynchronize(stream));
      CUDA_OK(cudaMemcpy(got, dev, bytes, cudaMemcpyDeviceToHost));
      if (memcmp(got, want, bytes) != 0)
        fail_msg("divide differs: dtype %s divisor %d", dtl_dtype_name((dtl_dtype)t), divisors[k]);
      CUDA_OK(cudaFree(dev));
      free(want);
      free(got);
    }
  }
}

static void divide_kernel_rejects_a_divisor_below_one(void **state) {
  (void)state;
  int32_t *dev = NULL;
  CUDA_OK(cudaMalloc((void **)&dev, 4));
  assert_int_equal(dtl__cuda_divide(dev, 1, DTL_INT32, 0, stream), DTL_ERR_INTERNAL);
  assert_non_null(strstr(dtl_last_error(), "divisor=0"));
  CUDA_OK(cudaFree(dev));
}

int main(void) {
  const struct CMUnitTest host[] = {
      cmocka_unit_test(copy_box_index_arithmetic_matches_host_copy_on_random_boxes),
      cmocka_unit_test(copy_box_index_arithmetic_packs_a_column_block),
  };
  int failed = cmocka_run_group_tests_name("device kernels, index arithmetic on the host", host, NULL, NULL);
  if (failed) return failed;
  if (dtl_cuda_device_count() == 0) {
    printf("SKIP: no CUDA device visible (dtl_cuda_device_count() == 0): the kernels were not run\n");
    return 77;
  }
  const struct CMUnitTest device[] = {
      cmocka_unit_test(copy_box_kernel_matches_host_copy_on_random_boxes),
      cmocka_unit_test(copy_box_kernel_copies_a_large_box_beyond_one_grid),
      cmocka_unit_test(fill_identity_kernel_matches_host_for_every_dtype_and_op),
      cmocka_unit_test(divide_kernel_truncates_integers_toward_zero_and_rounds_floats_like_the_host),
      cmocka_unit_test(divide_kernel_rejects_a_divisor_below_one),
  };
  return cmocka_run_group_tests_name("device kernels on the GPU", device, setup_stream, teardown_stream);
}

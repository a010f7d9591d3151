/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA dequantize tile on a GPU against the host tile: every format, random tensors (leading dims, uneven sizes,
 * all block and group kinds) and random tiles with a padded leading dimension, bit for bit. Exits 77 when no device
 * is visible (the device code's arithmetic is also checked on the host, in test_quant_oracle). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <cuda_runtime.h>
#include "dtl/nccl.h"
#include "quant/dequant.h"
#include "quant_test_util.h"

#define CUDA_OK(call) assert_int_equal((int)(call), (int)cudaSuccess)

static void the_device_tile_equals_the_host_tile_for_every_format(void **state) {
  qt_rng r = {0x5eed0006};
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  for (int k = 0; k < DTL_QUANT_NUM_KINDS; k++)
    for (int n = 0; n < 12; n++) {
      dtl_quant_format f;
      int nd;
      int64_t shape[DTL_MAX_TENSOR_DIMS];
      qt_random_format(&r, (dtl_quant_kind)k, &f, &nd, shape);
      qt_tensor t;
      assert_int_equal(qt_tensor_random(&r, &f, nd, shape, &t), 0);
      dtl__qgeom g;
      assert_int_equal(dtl__qgeom_init("test", &t.fmt, nd, shape, &g), DTL_OK);
      void *dev[DTL_QUANT_NUM_PARTS] = {NULL};
      for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
        if (t.pndim[p] < 0) continue;
        CUDA_OK(cudaMalloc(&dev[p], t.bytes[p] + 1));
        CUDA_OK(cudaMemcpy(dev[p], t.part[p], t.bytes[p], cudaMemcpyHostToDevice));
      }
      int64_t zero[DTL_MAX_TENSOR_DIMS] = {0};
      dtl__qshard hs, ds;
      dtl__qshard_init(&hs, &g, shape, zero, (const void *const *)t.part);
      dtl__qshard_init(&ds, &g, shape, zero, (const void *const *)dev);
      int64_t R = nd >= 2 ? shape[nd - 2] : 1, C = shape[nd - 1], mats = nd > 2 ? shape[0] : 1;
      if (R && C && mats) {
        int64_t mat = qt_below(&r, mats), r0 = qt_below(&r, R), c0 = qt_below(&r, C);
        int64_t nr = 1 + qt_below(&r, R - r0), nc = 1 + qt_below(&r, C - c0), ldo = nc + qt_below(&r, 5);
        size_t bytes = (size_t)(nr * ldo) * 4;
        float *want = calloc(1, bytes), *got = calloc(1, bytes), *dout;
        CUDA_OK(cudaMalloc((void **)&dout, bytes));
        CUDA_OK(cudaMemset(dout, 0, bytes));
        dtl__qshard_dequant_tile(&hs, mat, r0, nr, c0, nc, want, ldo);
        assert_int_equal(dtl__qshard_dequant_tile_cuda(&ds, mat, r0, nr, c0, nc, dout, ldo, stream), DTL_OK);
        CUDA_OK(cudaStreamSynchronize(stream));
        CUDA_OK(cudaMemcpy(got, dout, bytes, cudaMemcpyDeviceToHost));
        if (memcmp(want, got, bytes)) fail_msg("kind %d tensor %d: the device tile differs from the host tile", k, n);
        CUDA_OK(cudaFree(dout));
        free(want);
        free(got);
      }
      for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) CUDA_OK(cudaFree(dev[p]));
      qt_tensor_free(&t);
    }
  CUDA_OK(cudaStreamDestroy(stream));
}

int main(void) {
  if (dtl_cuda_device_count() == 0) {
    printf("SKIP: no CUDA device visible (dtl_cuda_device_count() == 0): the dequantize kernel was not run\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(the_device_tile_equals_the_host_tile_for_every_format),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

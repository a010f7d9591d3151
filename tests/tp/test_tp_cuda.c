/* SPDX-License-Identifier: Apache-2.0 */
/* The TP layers on a device context (NCCL at world size 1: one GPU cannot hold several NCCL ranks):
 * column- and row-parallel linears with bias in f32, f16 and bf16 on cuBLAS and the device bias kernel,
 * and the row-parallel reduction half, against the host dense result. Integer data with |y| <= 64 is exact
 * in every one of these types, so results compare with ==. The blocks that have no device kernels yet must
 * say so. Exits 77 (skipped) without a CUDA device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "common/half.h"
#include "dtl.h"
#include "dtl/nccl.h"

static ncclComm_t nccl;
static cudaStream_t stream;
static dtl_comm *comm;
static dtl_mesh *mesh;

static void *to_device(const float *h, size_t n, dtl_dtype t) {
  size_t es = dtl_dtype_size(t);
  unsigned char *tmp = malloc(n * es + 1);
  for (size_t i = 0; i < n; i++) {
    if (t == DTL_FLOAT32) ((float *)tmp)[i] = h[i];
    else ((uint16_t *)tmp)[i] = t == DTL_FLOAT16 ? dtl__f32_to_f16(h[i]) : dtl__f32_to_bf16(h[i]);
  }
  void *d = NULL;
  assert_int_equal(cudaMalloc(&d, n * es + 1), cudaSuccess);
  assert_int_equal(cudaMemcpy(d, tmp, n * es, cudaMemcpyHostToDevice), cudaSuccess);
  free(tmp);
  return d;
}

static void from_device(const void *d, float *h, size_t n, dtl_dtype t) {
  size_t es = dtl_dtype_size(t);
  unsigned char *tmp = malloc(n * es + 1);
  assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
  assert_int_equal(cudaMemcpy(tmp, d, n * es, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < n; i++) {
    if (t == DTL_FLOAT32) h[i] = ((float *)tmp)[i];
    else h[i] = t == DTL_FLOAT16 ? dtl__f16_to_f32(((uint16_t *)tmp)[i]) : dtl__bf16_to_f32(((uint16_t *)tmp)[i]);
  }
  free(tmp);
}

static float *ints(unsigned s, size_t n, int r) {
  float *p = malloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) p[i] = (float)((int)((s = s * 1103515245u + 12345u) >> 16) % (2 * r + 1) - r);
  return p;
}

static void linear_layers_on_the_device_equal_the_host_in_f32_f16_and_bf16(void **state) {
  (void)state;
  enum { T = 5, IN = 8, OUT = 6 };
  dtl_dtype types[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};
  float *w = ints(1, OUT * IN, 2), *b = ints(2, OUT, 2), *x = ints(3, T * IN, 2), want[T * OUT], got[T * OUT];
  for (int t = 0; t < T; t++)
    for (int o = 0; o < OUT; o++) {
      float s = b[o];
      for (int i = 0; i < IN; i++) s += x[t * IN + i] * w[o * IN + i];
      want[t * OUT + o] = s;
    }
  for (int ti = 0; ti < 3; ti++) {
    dtl_dtype t = types[ti];
    dtl_tp_options o = {.mask = DTL_TP_OPT_DTYPE, .dtype = t};
    dtl_tp_context *ctx = NULL;
    assert_int_equal(dtl_tp_context_create(mesh, 0, &o, &ctx), DTL_OK);
    void *dw = to_device(w, OUT * IN, t), *db = to_device(b, OUT, t), *dx = to_device(x, T * IN, t), *dy = NULL;
    assert_int_equal(cudaMalloc(&dy, T * OUT * 4), cudaSuccess);
    for (int kind = 0; kind < 2; kind++) {
      dtl_tp_linear_params p = {.kind = kind ? DTL_TP_ROW : DTL_TP_COLUMN, .in_features = IN, .out_features = OUT,
                                .weight = dw, .bias = db};
      dtl_tp_linear *l = NULL;
      dtl_layout *li = NULL;
      assert_int_equal(dtl_tp_linear_create(ctx, &p, &l), DTL_OK);
      assert_int_equal(dtl_tp_linear_layouts(l, T, &li, NULL), DTL_OK);
      assert_int_equal(dtl_tp_linear_forward(l, li, dx, dy), DTL_OK);
      from_device(dy, got, T * OUT, t);
      for (int i = 0; i < T * OUT; i++) assert_true(got[i] == want[i]);
      dtl_layout_destroy(li);
      dtl_tp_linear_destroy(l);
    }
    /* The communication half with its bias, on device buffers. */
    dtl_layout *lo = NULL;
    assert_int_equal(dtl_tp_activation_layout(ctx, T, OUT, dtl_replicate(), &lo), DTL_OK);
    float *part = ints(4, T * OUT, 8);
    void *dp = to_device(part, T * OUT, t);
    assert_int_equal(dtl_tp_row_parallel_reduce(ctx, lo, dp, db, dy), DTL_OK);
    from_device(dy, got, T * OUT, t);
    for (int i = 0; i < T * OUT; i++) assert_true(got[i] == part[i] + b[i % OUT]);
    /* Blocks without device kernels say so. */
    dtl_tp_mlp_params mp = {.activation = DTL_TP_ACT_GELU, .hidden = IN, .ffn = OUT, .gate_up = dw, .down = dw};
    dtl_tp_mlp *m = NULL;
    assert_int_equal(dtl_tp_mlp_create(ctx, &mp, &m), DTL_ERR_UNSUPPORTED);
    assert_non_null(strstr(dtl_last_error(), "device"));
    dtl_layout_destroy(lo);
    cudaFree(dw), cudaFree(db), cudaFree(dx), cudaFree(dy), cudaFree(dp);
    free(part);
    dtl_tp_context_destroy(ctx);
  }
  free(w), free(b), free(x);
}

int main(void) {
  if (dtl_cuda_device_count() == 0) {
    printf("skipped: no CUDA device (the TP layers on NCCL were not run)\n");
    return 77;
  }
  ncclUniqueId id;
  int one = 1;
  if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
      ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&nccl, 1, id, 0) != ncclSuccess ||
      dtl_comm_from_nccl(nccl, stream, &comm) != DTL_OK || dtl_mesh_create(comm, 1, &one, &mesh) != DTL_OK) {
    printf("could not set up NCCL at world size 1: %s\n", dtl_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(linear_layers_on_the_device_equal_the_host_in_f32_f16_and_bf16),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(comm);
  ncclCommDestroy(nccl);
  cudaStreamDestroy(stream);
  return rc;
}

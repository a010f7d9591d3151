/* SPDX-License-Identifier: Apache-2.0 */
/* make gpu-check's bandwidth table: dtl's device pack/copy and fill kernels (src/comm/device_memory.cu)
 * next to the CUDA runtime doing the same bytes: a contiguous copy_box and cudaMemcpy device-to-device, a
 * strided copy_box (the pack of an all-to-all: half of every row of a row-major matrix) at the same payload,
 * and fill_identity next to cudaMemset, at 1, 16 and 256 MiB. GB/s = payload bytes / time (each byte read
 * once and written once), the median of 20 timed runs after 3 warm-ups, timed with CUDA events on one
 * stream. Each kernel's output is checked once against the expected bytes. --probe only answers whether a
 * device is visible (exit 0, or 77 when none). Not a ctest test: timings belong to make gpu-check. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm/device_memory.h"

enum { WARMUP = 3, RUNS = 20 };

static int failures;
static cudaStream_t stream;

#define CUDA_TRY(call)                                                           \
  do {                                                                           \
    cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess) {                                                     \
      fprintf(stderr, "gpu_bandwidth: %s: %s\n", #call, cudaGetErrorString(e_)); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

typedef enum { K_MEMCPY, K_BOX_CONTIG, K_BOX_STRIDED, K_MEMSET, K_FILL } kind;

typedef struct {
  void *src, *dst;
  size_t bytes; /* payload */
  dtl__box_copy contig, strided;
} bufs;

static void run_once(kind k, const bufs *b) {
  dtl_status st = DTL_OK;
  switch (k) {
    case K_MEMCPY: CUDA_TRY(cudaMemcpyAsync(b->dst, b->src, b->bytes, cudaMemcpyDeviceToDevice, stream)); break;
    case K_BOX_CONTIG: st = dtl__cuda_copy_box(b->src, b->dst, &b->contig, stream); break;
    case K_BOX_STRIDED: st = dtl__cuda_copy_box(b->src, b->dst, &b->strided, stream); break;
    case K_MEMSET: CUDA_TRY(cudaMemsetAsync(b->dst, 0, b->bytes, stream)); break;
    case K_FILL: st = dtl__cuda_fill_identity(b->dst, b->bytes / 4, DTL_FLOAT32, DTL_PROD, stream); break;
  }
  if (st != DTL_OK) {
    fprintf(stderr, "gpu_bandwidth: %s\n", dtl_last_error());
    exit(1);
  }
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Median GB/s of kernel k over RUNS timed runs. */
static double measure(kind k, const bufs *b) {
  cudaEvent_t t0, t1;
  CUDA_TRY(cudaEventCreate(&t0));
  CUDA_TRY(cudaEventCreate(&t1));
  for (int i = 0; i < WARMUP; i++) run_once(k, b);
  float ms[RUNS];
  for (int i = 0; i < RUNS; i++) {
    CUDA_TRY(cudaEventRecord(t0, stream));
    run_once(k, b);
    CUDA_TRY(cudaEventRecord(t1, stream));
    CUDA_TRY(cudaEventSynchronize(t1));
    CUDA_TRY(cudaEventElapsedTime(&ms[i], t0, t1));
  }
  qsort(ms, RUNS, sizeof *ms, cmp_float);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return (double)b->bytes / (ms[RUNS / 2] * 1e-3) / 1e9;
}

/* The output of kernel k, copied back, against what it must be (src holds byte i = i * 7 mod 251). */
static void verify(kind k, const bufs *b, const unsigned char *src_host) {
  CUDA_TRY(cudaMemset(b->dst, 0xee, b->bytes));
  run_once(k, b);
  CUDA_TRY(cudaStreamSynchronize(stream));
  unsigned char *got = malloc(b->bytes);
  CUDA_TRY(cudaMemcpy(got, b->dst, b->bytes, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  if (k == K_BOX_STRIDED) { /* dst row r = the first half of src row r */
    size_t row = (size_t)b->strided.src_shape[1] * 4, half = row / 2;
    for (size_t r = 0; r < b->bytes / half; r++) bad += memcmp(got + r * half, src_host + r * row, half) != 0;
  } else if (k == K_FILL) {
    for (size_t i = 0; i < b->bytes / 4; i++) bad += ((float *)got)[i] != 1.0f;
  } else {
    bad = memcmp(got, src_host, b->bytes) != 0;
  }
  free(got);
  if (bad) {
    fprintf(stderr, "gpu_bandwidth: kernel %d wrote wrong bytes at %zu MiB\n", (int)k, b->bytes >> 20);
    failures++;
  }
}

int main(int argc, char **argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (argc > 1 && strcmp(argv[1], "--probe") == 0) return devices > 0 ? 0 : 77;
  if (devices == 0) {
    printf("SKIP: no CUDA device visible\n");
    return 77;
  }
  CUDA_TRY(cudaSetDevice(0));
  struct cudaDeviceProp prop;
  CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  printf("device 0: %s; GB/s = payload / time, median of %d runs\n", prop.name, RUNS);
  printf("%-9s %12s %14s %8s %14s %8s %12s %12s %8s\n", "size", "memcpy D2D", "copy_box", "/memcpy", "copy_box 2-d",
         "/memcpy", "cudaMemset", "fill", "/memset");
  static const size_t sizes[] = {(size_t)1 << 20, (size_t)16 << 20, (size_t)256 << 20};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    bufs b = {.bytes = sizes[s]};
    size_t floats = b.bytes / 4;
    /* The strided source: rows of 2048 floats, of which the first 1024 are packed: src is twice the payload. */
    const int64_t cols = 2048, rows = (int64_t)(floats / 1024);
    CUDA_TRY(cudaMalloc(&b.src, 2 * b.bytes));
    CUDA_TRY(cudaMalloc(&b.dst, b.bytes));
    unsigned char *host = malloc(2 * b.bytes);
    for (size_t i = 0; i < 2 * b.bytes; i++) host[i] = (unsigned char)(i * 7 % 251);
    CUDA_TRY(cudaMemcpy(b.src, host, 2 * b.bytes, cudaMemcpyHostToDevice));
    b.contig = (dtl__box_copy){.ndim = 1,
                               .elem_size = 4,
                               .extent = {(int64_t)floats},
                               .src_shape = {(int64_t)floats},
                               .dst_shape = {(int64_t)floats}};
    b.strided = (dtl__box_copy){.ndim = 2,
                                .elem_size = 4,
                                .extent = {rows, cols / 2},
                                .src_shape = {rows, cols},
                                .dst_shape = {rows, cols / 2}};
    for (kind k = K_MEMCPY; k <= K_FILL; k++) verify(k, &b, host);
    double mc = measure(K_MEMCPY, &b), bc = measure(K_BOX_CONTIG, &b), bs = measure(K_BOX_STRIDED, &b),
           ms = measure(K_MEMSET, &b), fl = measure(K_FILL, &b);
    printf("%4zu MiB  %12.1f %14.1f %8.2f %14.1f %8.2f %12.1f %12.1f %8.2f\n", b.bytes >> 20, mc, bc, bc / mc, bs,
           bs / mc, ms, fl, fl / ms);
    free(host);
    cudaFree(b.src);
    cudaFree(b.dst);
  }
  cudaStreamDestroy(stream);
  printf("%s\n", failures ? "FAIL: a kernel wrote wrong bytes" : "all kernel outputs checked: ok");
  return failures ? 1 : 0;
}

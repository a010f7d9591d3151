/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target of the safetensors reader: the input is a whole file (8-byte header length, JSON header,
 * data), handed to dtl_safetensors_open through a memory-backed file (memfd). Whatever the bytes, open must
 * either fail with DTL_ERR_INVALID_ARGUMENT (or run out of memory) or return a handle whose every tensor
 * reads back, whole and as a box, without touching a byte outside the file (ASan watches the buffers, and
 * the reads are positioned reads of the memfd). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "dtl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int fd = -1;
  if (fd < 0) fd = memfd_create("dtl_fuzz_safetensors", 0);
  if (fd < 0 || ftruncate(fd, 0) != 0) abort();
  for (size_t at = 0; at < size;) {
    ssize_t w = pwrite(fd, data + at, size - at, (off_t)at);
    if (w <= 0) abort();
    at += (size_t)w;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  dtl_safetensors *f = NULL;
  dtl_status st = dtl_safetensors_open(path, &f);
  if (st != DTL_OK) {
    if (st != DTL_ERR_INVALID_ARGUMENT && st != DTL_ERR_OUT_OF_MEMORY) abort();
    if (f) abort(); /* a failed open writes no handle */
    return 0;
  }
  for (size_t i = 0; i < dtl_safetensors_num_tensors(f); i++) {
    const char *name = dtl_safetensors_tensor_name(f, i);
    if (!name || !dtl_safetensors_dtype_name(f, name)) abort();
    dtl_dtype t;
    int nd;
    int64_t shape[DTL_MAX_TENSOR_DIMS], off[DTL_MAX_TENSOR_DIMS] = {0}, half[DTL_MAX_TENSOR_DIMS];
    if (dtl_safetensors_info(f, name, &t, &nd, shape) != DTL_OK) continue; /* unsupported dtype or rank */
    size_t n = dtl_dtype_size(t);
    for (int d = 0; d < nd; d++) n *= (size_t)shape[d];
    if (n > size) abort(); /* validated: a tensor's bytes lie inside the file */
    void *buf = malloc(n ? n : 1);
    if (dtl_safetensors_read_box(f, name, t, nd, off, shape, buf) != DTL_OK) abort();
    for (int d = 0; d < nd; d++) off[d] = shape[d] / 2, half[d] = shape[d] - shape[d] / 2;
    if (dtl_safetensors_read_box(f, name, t, nd, off, half, buf) != DTL_OK) abort();
    free(buf);
  }
  dtl_safetensors_close(f);
  return 0;
}

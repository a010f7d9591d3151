/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target of the safetensors reader: the input is a whole file (8-byte header length, JSON header,
 * data), handed to dtl_safetensors_open through a memory-backed file (memfd). Whatever the bytes, open must
 * either fail with DTL_ERR_INVALID_ARGUMENT (or run out of memory) or return a handle whose every tensor
 * reads back, whole and as a box, without touching a byte outside the file (ASan watches the buffers, and
 * the reads are positioned reads of the memfd). Every "<p>.weight" and "<p>.qweight" is also read as a quantized
 * tensor of each safetensors format (shape taken from the codes, two ranks, each cut): the read either succeeds or
 * fails with a status and leaves the buffers as they were. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "dtl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The quantized reads of the tensor name (codes of shape [nd]) as each format that stores such codes. */
static void read_quantized(const dtl_safetensors *f, const char *name, int nd, const int64_t *shape, size_t size) {
  size_t n = strlen(name);
  bool fp8 = n > 7 && !strcmp(name + n - 7, ".weight"), int4 = n > 8 && !strcmp(name + n - 8, ".qweight");
  if ((!fp8 && !int4) || nd < 2 || nd > 3 || n > 200) return;
  char prefix[256];
  memcpy(prefix, name, n - (fp8 ? 7 : 8));
  prefix[n - (fp8 ? 7 : 8)] = '\0';
  static const dtl_quant_format fmts[] = {
      {.kind = DTL_QUANT_FP8_BLOCK, .mask = DTL_QFMT_BLOCK, .block_rows = 2, .block_cols = 4},
      {.kind = DTL_QUANT_FP8_CHANNEL},
      {.kind = DTL_QUANT_FP8_TENSOR},
      {.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_GROUP, .group = 8},
      {.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_GROUP, .group = 8, .flags = DTL_QFMT_ACT_ORDER},
      {.kind = DTL_QUANT_AWQ, .mask = DTL_QFMT_GROUP, .group = 8},
  };
  for (size_t k = 0; k < sizeof fmts / sizeof *fmts; k++) {
    const dtl_quant_format *fmt = &fmts[k];
    if ((fmt->kind <= DTL_QUANT_FP8_TENSOR) != fp8) continue;
    /* The logical [.., R, C] from the codes: FP8 [R, C], GPTQ [C/8, R], AWQ [C, R/8]. */
    int64_t l[3];
    memcpy(l, shape, sizeof(int64_t) * (size_t)nd);
    int r = nd - 2;
    if (fmt->kind == DTL_QUANT_GPTQ) l[r] = shape[r + 1], l[r + 1] = shape[r] * 8;
    if (fmt->kind == DTL_QUANT_AWQ) l[r] = shape[r + 1] * 8, l[r + 1] = shape[r];
    if (l[r] > (1 << 20) || l[r + 1] > (1 << 20)) continue;
    for (int cut = 0; cut <= nd; cut++)
      for (int coord = 0; coord < 2; coord++) {
        dtl_mesh *m;
        int two = 2;
        if (dtl_mesh_create_abstract(1, &two, &coord, &m) != DTL_OK) abort();
        dtl_placement pl = cut < nd ? dtl_shard(cut) : dtl_replicate();
        dtl_qlayout *ql;
        if (dtl_qlayout_create(m, fmt, nd, l, &pl, &ql) == DTL_OK) {
          dtl_qbox b;
          if (dtl_qlayout_local_boxes(ql, NULL, &b) != DTL_OK) abort();
          dtl_qbuf buf = {{NULL}};
          size_t total = 0;
          for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) total += b.part[p].ndim >= 0 ? b.part[p].bytes : 0;
          if (total <= 4 * size + 4096) {
            for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
              if (b.part[p].ndim >= 0) {
                buf.part[p] = malloc(b.part[p].bytes + 1);
                memset(buf.part[p], 0x5c, b.part[p].bytes + 1);
              }
            dtl_status st = dtl_safetensors_qread_hf(f, prefix, ql, &buf);
            if (st != DTL_OK && st != DTL_ERR_INVALID_ARGUMENT && st != DTL_ERR_OUT_OF_MEMORY) abort();
            for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
              const unsigned char *c = buf.part[p];
              for (size_t i = 0; c && i <= b.part[p].bytes; i++)
                if (c[i] != 0x5c && (st != DTL_OK || i == b.part[p].bytes)) abort(); /* written by a failed read */
              free(buf.part[p]);
            }
          }
          dtl_qlayout_destroy(ql);
        }
        dtl_mesh_destroy(m);
      }
  }
}

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
    if (dtl_safetensors_info(f, name, NULL, &nd, shape) == DTL_OK) read_quantized(f, name, nd, shape, size);
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

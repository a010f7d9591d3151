/* SPDX-License-Identifier: Apache-2.0 */
/* The dtl side of the interoperability test with the Python safetensors package (interop.py computes the
 * same tensors): `check PATH` reads a file Python wrote (every tensor, a box of one, the metadata, and a BOOL
 * tensor listed as unsupported); `write PATH` writes the tensors for Python to check. Exit 0 on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtl.h"
#include "dtype_data.h"

typedef struct {
  const char *name;
  dtl_dtype t;
  int ndim;
  int64_t shape[3];
} spec;
static const spec specs[] = {
    {"f32", DTL_FLOAT32, 2, {3, 4}},   {"f64", DTL_FLOAT64, 3, {2, 3, 2}}, {"f16", DTL_FLOAT16, 1, {5}},
    {"i8", DTL_INT8, 2, {4, 3}},       {"u8", DTL_UINT8, 1, {7}},          {"i32", DTL_INT32, 2, {2, 2}},
    {"i64", DTL_INT64, 2, {3, 1}},     {"empty", DTL_FLOAT32, 2, {0, 3}},  {"scalar", DTL_FLOAT64, 0, {0}},
    {"layers.0.w", DTL_FLOAT32, 2, {6, 5}},
};
#define NSPECS (int)(sizeof specs / sizeof specs[0])

static int64_t count(const spec *s) {
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
  return n;
}
/* Element i of tensor k, as interop.py computes it. */
static double value(int k, int64_t i, dtl_dtype t) {
  return t == DTL_UINT8 ? (double)((i * 7 + k * 13) % 251) : (double)((i * 7 + k * 13) % 201 - 100);
}
static int fail(const char *what) {
  fprintf(stderr, "interop: %s: %s\n", what, dtl_last_error());
  return 1;
}

static int check(const char *path) {
  dtl_safetensors *f;
  if (dtl_safetensors_open(path, &f) != DTL_OK) return fail("open");
  int bad = 0;
  if (dtl_safetensors_num_tensors(f) != (size_t)NSPECS + 1) bad |= fail("tensor count");
  for (int k = 0; k < NSPECS; k++) {
    const spec *s = &specs[k];
    dtl_dtype t;
    int nd;
    int64_t shape[DTL_MAX_TENSOR_DIMS], zero[3] = {0, 0, 0};
    if (dtl_safetensors_info(f, s->name, &t, &nd, shape) != DTL_OK) return fail(s->name);
    if (t != s->t || nd != s->ndim || memcmp(shape, s->shape, sizeof(int64_t) * (size_t)nd)) bad |= fail(s->name);
    void *buf = malloc((size_t)count(s) * dtl_dtype_size(t) + 1);
    if (dtl_safetensors_read_box(f, s->name, t, nd, zero, shape, buf) != DTL_OK) return fail(s->name);
    for (int64_t i = 0; i < count(s); i++)
      if (t_get(t, buf, i) != value(k, i, t)) {
        fprintf(stderr, "interop: %s[%lld] = %g, expected %g\n", s->name, (long long)i, t_get(t, buf, i), value(k, i, t));
        bad = 1;
        break;
      }
    free(buf);
  }
  /* A box: rows 1..3, columns 2..4 of layers.0.w (tensor 9, [6, 5]). */
  float box[9];
  int64_t o[2] = {1, 2}, bs[2] = {3, 3};
  if (dtl_safetensors_read_box(f, "layers.0.w", DTL_FLOAT32, 2, o, bs, box) != DTL_OK) return fail("box");
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 3; c++)
      if (box[r * 3 + c] != value(9, (1 + r) * 5 + 2 + c, DTL_FLOAT32)) bad |= fail("box value");
  const char *dn = dtl_safetensors_dtype_name(f, "mask");
  dtl_dtype t;
  if (!dn || strcmp(dn, "BOOL") || dtl_safetensors_info(f, "mask", &t, NULL, NULL) != DTL_ERR_UNSUPPORTED)
    bad |= fail("mask is listed as an unsupported BOOL tensor");
  const char *w = dtl_safetensors_metadata(f, "writer");
  if (!w || strcmp(w, "python")) bad |= fail("metadata");
  dtl_safetensors_close(f);
  if (!bad) printf("dtl read %d tensors written by python: ok\n", NSPECS + 1);
  return bad;
}

static int write(const char *path) {
  dtl_safetensors_writer *w;
  if (dtl_safetensors_write_begin(path, &w) != DTL_OK) return fail("begin");
  for (int k = 0; k < NSPECS; k++) {
    const spec *s = &specs[k];
    void *buf = malloc((size_t)count(s) * dtl_dtype_size(s->t) + 1);
    for (int64_t i = 0; i < count(s); i++) t_put(s->t, buf, i, value(k, i, s->t));
    dtl_status st = dtl_safetensors_write_add(w, s->name, s->t, s->ndim, s->shape, buf);
    free(buf);
    if (st != DTL_OK) return fail(s->name);
  }
  if (dtl_safetensors_write_metadata(w, "format", "dtl") != DTL_OK ||
      dtl_safetensors_write_metadata(w, "writer", "dtl") != DTL_OK)
    return fail("metadata");
  return dtl_safetensors_write_end(w) == DTL_OK ? 0 : fail("end");
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "check")) return check(argv[2]);
  if (argc == 3 && !strcmp(argv[1], "write")) return write(argv[2]);
  fprintf(stderr, "usage: %s check|write PATH\n", argv[0]);
  return 2;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Writing a safetensors file: each tensor's data goes at once to an unlinked temporary file (the writer holds
 * no tensor), the header is built with jansson, and end writes the header, its padding and the data to the
 * destination. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "checkpoint/checkpoint_internal.h"

struct dtl_safetensors_writer {
  char *path;
  int fd;         /* the data, unlinked */
  uint64_t bytes; /* data written so far */
  json_t *header; /* {"name": {...}, "__metadata__": {...}} */
};

static dtl_status dtl__st_write_all(const char *fn, const char *what, int fd, const void *buf, size_t n, uint64_t off) {
  int e = dtl__st_io(fd, (void *)buf, n, off, true);
  if (e)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: writing %zu bytes at byte %llu failed: %s", what, n,
                         (unsigned long long)off, e > 0 ? strerror(e) : "no progress");
  return DTL_OK;
}

dtl_status dtl_safetensors_write_begin(const char *path, dtl_safetensors_writer **out) {
  static const char fn[] = "dtl_safetensors_write_begin";
  DTL_CHECK_ARG(path != NULL, fn, "path=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  size_t n = strlen(path);
  dtl_safetensors_writer *w = dtl__calloc(1, sizeof *w);
  char *tmp = dtl__malloc(n + 32);
  if (w) w->fd = -1;
  if (w) w->path = dtl__malloc(n + 1);
  if (w) w->header = json_object();
  if (!w || !tmp || !w->path || !w->header) {
    dtl__free(tmp);
    dtl_safetensors_write_cancel(w);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  memcpy(w->path, path, n + 1);
  /* Next to path so that a path in an unwritable place fails here, before any data is produced. */
  snprintf(tmp, n + 32, "%s.dtl-data-%ld", path, (long)getpid());
  w->fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  int err = errno;
  if (w->fd >= 0) unlink(tmp);
  dtl__free(tmp);
  if (w->fd < 0) {
    dtl_safetensors_write_cancel(w);
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "path=\"%s\": cannot create a file next to it: %s", path,
                         strerror(err));
  }
  *out = w;
  return DTL_OK;
}

dtl_status dtl_safetensors_write_add(dtl_safetensors_writer *w, const char *name, dtl_dtype dtype, int ndim,
                                     const int64_t *shape, const void *data) {
  static const char fn[] = "dtl_safetensors_write_add";
  DTL_CHECK_ARG(w != NULL, fn, "writer=NULL");
  DTL_CHECK_ARG(name != NULL, fn, "name=NULL");
  char q[96];
  DTL_CHECK_ARG(strcmp(name, "__metadata__") != 0, fn, "name=\"__metadata__\" (reserved for the metadata)");
  DTL_CHECK_ARG(json_object_get(w->header, name) == NULL, fn, "name=\"%s\" was added before",
                dtl__st_quote(name, q, sizeof q));
  DTL_CHECK_ARG(dtl__dtype_valid(dtype), fn, "dtype=%d (expected a dtl_dtype)", (int)dtype);
  DTL_CHECK_ARG(ndim >= 0 && ndim <= DTL_MAX_TENSOR_DIMS, fn, "ndim=%d (expected 0..%d)", ndim, DTL_MAX_TENSOR_DIMS);
  DTL_CHECK_ARG(ndim == 0 || shape != NULL, fn, "shape=NULL with ndim=%d", ndim);
  size_t count = 1, bytes;
  bool empty = false;
  for (int d = 0; d < ndim; d++) {
    DTL_CHECK_ARG(shape[d] >= 0, fn, "shape[%d]=%lld (expected >= 0)", d, (long long)shape[d]);
    empty |= shape[d] == 0;
  }
  for (int d = 0; d < ndim && !empty; d++)
    DTL_CHECK_ARG(dtl__mul_size(count, (size_t)shape[d], &count), fn, "shape overflows the element count");
  if (empty) count = 0;
  DTL_TRY(dtl__bytes(fn, "shape", count, dtype, &bytes));
  DTL_CHECK_ARG(data != NULL || bytes == 0, fn, "data=NULL with %zu bytes", bytes);

  json_t *entry = json_object(), *sh = json_array(), *offs = json_array();
  bool ok = entry && sh && offs && !json_object_set_new(entry, "dtype", json_string(dtl__st_dtype_name(dtype)));
  for (int d = 0; ok && d < ndim; d++) ok = !json_array_append_new(sh, json_integer(shape[d]));
  ok = ok && !json_array_append_new(offs, json_integer((json_int_t)w->bytes)) &&
       !json_array_append_new(offs, json_integer((json_int_t)(w->bytes + bytes)));
  ok = ok && !json_object_set(entry, "shape", sh) && !json_object_set(entry, "data_offsets", offs);
  json_decref(sh);
  json_decref(offs);
  if (!ok) {
    json_decref(entry);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  /* Data first: on a failed write the entry is not added, and the next add writes over the same bytes. */
  dtl_status st = dtl__st_write_all(fn, w->path, w->fd, data, bytes, w->bytes);
  if (st == DTL_OK && json_object_set_new(w->header, name, entry) != 0) {
    entry = NULL; /* json_object_set_new frees it on failure too */
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "name=\"%s\" is not a UTF-8 string", dtl__st_quote(name, q, sizeof q));
  } else if (st != DTL_OK) {
    json_decref(entry);
  }
  if (st == DTL_OK) w->bytes += bytes;
  return st;
}

dtl_status dtl_safetensors_write_metadata(dtl_safetensors_writer *w, const char *key, const char *value) {
  static const char fn[] = "dtl_safetensors_write_metadata";
  DTL_CHECK_ARG(w != NULL, fn, "writer=NULL");
  DTL_CHECK_ARG(key != NULL, fn, "key=NULL");
  DTL_CHECK_ARG(value != NULL, fn, "value=NULL");
  char q[96];
  json_t *meta = json_object_get(w->header, "__metadata__");
  if (!meta) {
    meta = json_object();
    if (!meta || json_object_set_new(w->header, "__metadata__", meta) != 0)
      return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  json_t *v = json_string(value);
  if (!v) return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "value=\"%s\" is not a UTF-8 string", dtl__st_quote(value, q, sizeof q));
  if (json_object_set_new(meta, key, v) != 0)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "key=\"%s\" is not a UTF-8 string", dtl__st_quote(key, q, sizeof q));
  return DTL_OK;
}

dtl_status dtl_safetensors_write_end(dtl_safetensors_writer *w) {
  static const char fn[] = "dtl_safetensors_write_end";
  DTL_CHECK_ARG(w != NULL, fn, "writer=NULL");
  dtl_status st = DTL_OK;
  char *json = json_dumps(w->header, JSON_SORT_KEYS | JSON_COMPACT);
  char *buf = dtl__malloc(DTL__ST_WINDOW);
  int fd = -1;
  if (!json || !buf) {
    st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
    goto done;
  }
  fd = open(w->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "path=\"%s\" cannot be written: %s", w->path, strerror(errno));
    goto done;
  }
  /* The data starts 8-byte aligned: the header is padded with spaces, which JSON allows after the object. */
  size_t n = strlen(json), padded = (n + 7) & ~(size_t)7;
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  DTL_TRY_GOTO(dtl__st_write_all(fn, w->path, fd, len8, 8, 0), st, done);
  DTL_TRY_GOTO(dtl__st_write_all(fn, w->path, fd, json, n, 8), st, done);
  DTL_TRY_GOTO(dtl__st_write_all(fn, w->path, fd, "        ", padded - n, 8 + n), st, done);
  for (uint64_t at = 0; at < w->bytes;) {
    size_t k = w->bytes - at < DTL__ST_WINDOW ? (size_t)(w->bytes - at) : DTL__ST_WINDOW;
    int e = dtl__st_io(w->fd, buf, k, at, false);
    if (e) {
      st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: reading back the data at byte %llu failed: %s", w->path,
                         (unsigned long long)at, e > 0 ? strerror(e) : "end of file");
      goto done;
    }
    DTL_TRY_GOTO(dtl__st_write_all(fn, w->path, fd, buf, k, 8 + padded + at), st, done);
    at += k;
  }
  if (close(fd) != 0 && st == DTL_OK)
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: close failed: %s", w->path, strerror(errno));
  fd = -1;
done:
  if (fd >= 0) close(fd);
  if (st != DTL_OK) unlink(w->path);
  free(json); /* jansson's allocation */
  dtl__free(buf);
  dtl_safetensors_write_cancel(w);
  return st;
}

void dtl_safetensors_write_cancel(dtl_safetensors_writer *w) {
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  json_decref(w->header);
  dtl__free(w->path);
  dtl__free(w);
}

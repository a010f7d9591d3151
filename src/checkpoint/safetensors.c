/* SPDX-License-Identifier: Apache-2.0 */
/* Opening a safetensors file: the header is untrusted input, parsed with jansson and validated entry by
 * entry (dtype, shape, data_offsets against the data buffer and against each other) before a handle exists,
 * so that no later read can leave the file. Also the queries on an open file. */
#define _GNU_SOURCE /* O_CLOEXEC, pread */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "checkpoint/checkpoint_internal.h"

/* The format's dtypes (safetensors' Dtype enum). Names the format defines but dtl cannot hold are kept, so
 * that a file that uses them still opens and lists them. */
static const dtl__st_dtype dtl__st_dtypes[] = {
    {"F32", 4, DTL_FLOAT32},  {"F64", 8, DTL_FLOAT64}, {"F16", 2, DTL_FLOAT16}, {"BF16", 2, DTL_BFLOAT16},
    {"I8", 1, DTL_INT8},      {"U8", 1, DTL_UINT8},    {"I32", 4, DTL_INT32},   {"I64", 8, DTL_INT64},
    {"BOOL", 1, -1},          {"I16", 2, -1},          {"U16", 2, -1},          {"U32", 4, -1},
    {"U64", 8, -1},           {"C64", 8, -1},          {"F8_E4M3", 1, DTL_FLOAT8_E4M3},
    {"F8_E5M2", 1, DTL_FLOAT8_E5M2},                    {"F8_E8M0", 1, -1},
};
#define DTL__ST_NDTYPES (sizeof dtl__st_dtypes / sizeof dtl__st_dtypes[0])
static const char dtl__st_dtype_list[] = "F32, F64, F16, BF16, I8, U8, I32, I64, BOOL, I16, U16, U32, U64, C64, "
                                         "F8_E4M3, F8_E5M2, F8_E8M0";

const dtl__st_dtype *dtl__st_dtype_find(const char *name) {
  for (size_t i = 0; i < DTL__ST_NDTYPES; i++)
    if (!strcmp(dtl__st_dtypes[i].name, name)) return &dtl__st_dtypes[i];
  return NULL;
}

const char *dtl__st_dtype_name(dtl_dtype t) {
  for (size_t i = 0; i < DTL__ST_NDTYPES; i++)
    if (dtl__st_dtypes[i].dtype == (int)t) return dtl__st_dtypes[i].name;
  return NULL;
}

const char *dtl__st_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = '\0';
  for (int d = 0; d <= ndim && at < cap; d++) {
    int n = d == ndim ? snprintf(buf + at, cap - at, "]")
                      : snprintf(buf + at, cap - at, "%s%lld", d ? "," : "[", (long long)shape[d]);
    if (n < 0) break;
    at += (size_t)n;
  }
  if (ndim == 0) snprintf(buf, cap, "[]");
  return buf;
}

/* "fn: path: message" for everything wrong with the file. */
#define DTL__ST_BAD(fn, path, fmt, ...) dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, (fn), "%s: " fmt, (path), ##__VA_ARGS__)

static const char *dtl__json_kind(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
  }
  return "a JSON value";
}

static char *dtl__st_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = dtl__malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

/* A non-negative JSON integer; false otherwise. */
static bool dtl__st_uint(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
  *out = (uint64_t)json_integer_value(v);
  return true;
}

static dtl_status dtl__st_entry(dtl_safetensors *f, const char *fn, const char *name, const json_t *v,
                                dtl__st_tensor *t) {
  const char *path = f->path;
  char q[DTL__QUOTE_CAP];
  dtl__quote(name, q, sizeof q);
  if (!json_is_object(v))
    return DTL__ST_BAD(fn, path, "tensor \"%s\": the entry is %s (expected an object with dtype, shape and data_offsets)",
                       q, dtl__json_kind(v));
  const json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
               *offs = json_object_get(v, "data_offsets");
  if (!dt) return DTL__ST_BAD(fn, path, "tensor \"%s\": dtype is missing", q);
  if (!json_is_string(dt))
    return DTL__ST_BAD(fn, path, "tensor \"%s\": dtype is %s (expected a string such as \"F32\")", q,
                       dtl__json_kind(dt));
  t->dtype = dtl__st_dtype_find(json_string_value(dt));
  if (!t->dtype) {
    char d[DTL__QUOTE_CAP];
    return DTL__ST_BAD(fn, path, "tensor \"%s\": dtype=\"%s\" is not a safetensors dtype (expected one of %s)", q,
                       dtl__quote(json_string_value(dt), d, sizeof d), dtl__st_dtype_list);
  }
  if (!shape) return DTL__ST_BAD(fn, path, "tensor \"%s\": shape is missing", q);
  if (!json_is_array(shape))
    return DTL__ST_BAD(fn, path, "tensor \"%s\": shape is %s (expected an array of integers >= 0)", q,
                       dtl__json_kind(shape));
  size_t nd = json_array_size(shape);
  if (nd > DTL__ST_MAX_DIMS)
    return DTL__ST_BAD(fn, path, "tensor \"%s\": shape has %zu dims (at most %d)", q, nd, DTL__ST_MAX_DIMS);
  uint64_t count = 1;
  bool overflow = false, empty = false;
  for (size_t d = 0; d < nd; d++) {
    uint64_t n;
    const json_t *e = json_array_get(shape, d);
    if (!dtl__st_uint(e, &n)) {
      if (json_is_integer(e))
        return DTL__ST_BAD(fn, path, "tensor \"%s\": shape[%zu]=%lld (expected >= 0)", q, d,
                           (long long)json_integer_value(e));
      return DTL__ST_BAD(fn, path, "tensor \"%s\": shape[%zu] is %s (expected an integer >= 0)", q, d,
                         dtl__json_kind(e));
    }
    overflow |= __builtin_mul_overflow(count, n, &count);
    empty |= n == 0;
  }
  uint64_t bytes = 0;
  if (empty) count = 0, overflow = false; /* [2^40, 2^40, 0] holds nothing */
  overflow |= __builtin_mul_overflow(count, (uint64_t)t->dtype->size, &bytes) || bytes > INT64_MAX;
  if (overflow)
    return DTL__ST_BAD(fn, path, "tensor \"%s\": shape has more elements than 64-bit sizes can count (dtype %s)", q,
                       t->dtype->name);
  if (!offs) return DTL__ST_BAD(fn, path, "tensor \"%s\": data_offsets is missing", q);
  if (!json_is_array(offs) || json_array_size(offs) != 2)
    return DTL__ST_BAD(fn, path, "tensor \"%s\": data_offsets is %s%s (expected [begin, end])", q, dtl__json_kind(offs),
                       json_is_array(offs) ? " whose length is not 2" : "");
  uint64_t b, e;
  if (!dtl__st_uint(json_array_get(offs, 0), &b) || !dtl__st_uint(json_array_get(offs, 1), &e))
    return DTL__ST_BAD(fn, path, "tensor \"%s\": data_offsets holds %s and %s (expected two integers >= 0)", q,
                       dtl__json_kind(json_array_get(offs, 0)), dtl__json_kind(json_array_get(offs, 1)));
  uint64_t data_bytes = f->file_bytes - f->data_start;
  if (b > e)
    return DTL__ST_BAD(fn, path, "tensor \"%s\": data_offsets=[%llu,%llu] (expected begin <= end)", q,
                       (unsigned long long)b, (unsigned long long)e);
  if (e > data_bytes)
    return DTL__ST_BAD(fn, path,
                       "tensor \"%s\": data_offsets=[%llu,%llu] end past the data buffer (%llu bytes: the file has "
                       "%llu, the data starts at byte %llu)",
                       q, (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_bytes,
                       (unsigned long long)f->file_bytes, (unsigned long long)f->data_start);
  if (e - b != bytes) {
    int64_t s[DTL__ST_MAX_DIMS];
    for (size_t d = 0; d < nd; d++) s[d] = json_integer_value(json_array_get(shape, d));
    char sh[160];
    return DTL__ST_BAD(fn, path, "tensor \"%s\": data_offsets=[%llu,%llu] hold %llu bytes, but dtype %s x shape %s needs %llu",
                       q, (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b), t->dtype->name,
                       dtl__st_shape_str((int)nd, s, sh, sizeof sh), (unsigned long long)bytes);
  }
  t->name = dtl__st_strdup(name);
  t->shape = dtl__malloc(nd * sizeof *t->shape);
  if (!t->name || !t->shape) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  for (size_t d = 0; d < nd; d++) t->shape[d] = json_integer_value(json_array_get(shape, d));
  t->ndim = (int)nd;
  t->begin = b;
  t->end = e;
  t->count = count;
  return DTL_OK;
}

static int dtl__st_by_name(const void *a, const void *b) {
  return strcmp(((const dtl__st_tensor *)a)->name, ((const dtl__st_tensor *)b)->name);
}
static int dtl__st_by_begin(const void *a, const void *b) {
  const dtl__st_tensor *x = *(const dtl__st_tensor *const *)a, *y = *(const dtl__st_tensor *const *)b;
  return (x->begin > y->begin) - (x->begin < y->begin);
}
static int dtl__st_by_key(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* No two tensors share a byte (empty tensors hold none). */
static dtl_status dtl__st_check_overlap(const dtl_safetensors *f, const char *fn) {
  if (f->count < 2) return DTL_OK;
  const dtl__st_tensor **by = dtl__malloc(f->count * sizeof *by);
  if (!by) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  for (size_t i = 0; i < f->count; i++) by[i] = &f->tensors[i];
  qsort(by, f->count, sizeof *by, dtl__st_by_begin);
  const dtl__st_tensor *prev = NULL; /* the non-empty tensor that ends last so far */
  dtl_status st = DTL_OK;
  for (size_t i = 0; i < f->count && st == DTL_OK; i++) {
    const dtl__st_tensor *t = by[i];
    if (t->begin == t->end) continue;
    if (prev && t->begin < prev->end) {
      char a[DTL__QUOTE_CAP], b[DTL__QUOTE_CAP];
      st = DTL__ST_BAD(fn, f->path, "tensor \"%s\": data_offsets=[%llu,%llu] overlap those of tensor \"%s\" [%llu,%llu]",
                       dtl__quote(t->name, a, sizeof a), (unsigned long long)t->begin, (unsigned long long)t->end,
                       dtl__quote(prev->name, b, sizeof b), (unsigned long long)prev->begin,
                       (unsigned long long)prev->end);
    }
    if (!prev || t->end > prev->end) prev = t;
  }
  dtl__free(by);
  return st;
}

static dtl_status dtl__st_metadata(dtl_safetensors *f, const char *fn, const json_t *v) {
  if (!json_is_object(v))
    return DTL__ST_BAD(fn, f->path, "__metadata__ is %s (expected an object of strings)", dtl__json_kind(v));
  size_t n = json_object_size(v), i = 0;
  f->meta = dtl__calloc(2 * n + 1, sizeof *f->meta);
  if (!f->meta) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)v, key, val) {
    char q[DTL__QUOTE_CAP];
    if (!json_is_string(val))
      return DTL__ST_BAD(fn, f->path, "__metadata__ \"%s\" is %s (expected a string)", dtl__quote(key, q, sizeof q),
                         dtl__json_kind(val));
    f->meta[2 * i] = dtl__st_strdup(key);
    f->meta[2 * i + 1] = dtl__st_strdup(json_string_value(val));
    f->nmeta = ++i;
    if (!f->meta[2 * i - 2] || !f->meta[2 * i - 1]) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  qsort(f->meta, f->nmeta, 2 * sizeof *f->meta, dtl__st_by_key);
  return DTL_OK;
}

/* The header's JSON (n bytes) into f's tensors and metadata. */
static dtl_status dtl__st_parse(dtl_safetensors *f, const char *fn, const char *json, size_t n) {
  json_error_t err;
  json_t *root = json_loadb(json, n, JSON_REJECT_DUPLICATES, &err);
  if (!root) {
    char q[DTL__QUOTE_CAP]; /* jansson's text quotes the bytes near the error */
    return DTL__ST_BAD(fn, f->path, "the header is not valid JSON: %s (line %d, column %d, byte %d of the header)",
                       dtl__quote(err.text, q, sizeof q), err.line, err.column, err.position);
  }
  dtl_status st = DTL_OK;
  if (!json_is_object(root)) {
    st = DTL__ST_BAD(fn, f->path, "the header is %s (expected a JSON object of tensors)", dtl__json_kind(root));
    goto done;
  }
  f->tensors = dtl__calloc(json_object_size(root) + 1, sizeof *f->tensors);
  if (!f->tensors) {
    st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
    goto done;
  }
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, "__metadata__")) {
      DTL_TRY_GOTO(dtl__st_metadata(f, fn, val), st, done);
      continue;
    }
    /* Counted before the entry is filled so that close frees what a failing entry allocated. */
    dtl__st_tensor *t = &f->tensors[f->count++];
    DTL_TRY_GOTO(dtl__st_entry(f, fn, key, val, t), st, done);
  }
  qsort(f->tensors, f->count, sizeof *f->tensors, dtl__st_by_name);
  for (size_t i = 1; i < f->count; i++) /* JSON_REJECT_DUPLICATES already refuses these */
    if (!strcmp(f->tensors[i - 1].name, f->tensors[i].name)) {
      char q[DTL__QUOTE_CAP];
      st = DTL__ST_BAD(fn, f->path, "tensor \"%s\": the name appears twice", dtl__quote(f->tensors[i].name, q, sizeof q));
      goto done;
    }
  st = dtl__st_check_overlap(f, fn);
done:
  json_decref(root);
  return st;
}

int dtl__st_io(int fd, void *buf, size_t n, uint64_t off, bool write) {
  char *p = buf;
  while (n) {
    ssize_t r = write ? pwrite(fd, p, n, (off_t)off) : pread(fd, p, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno;
    if (r == 0) return -1;
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

dtl_status dtl__st_pread(const dtl_safetensors *f, const char *fn, void *buf, size_t n, uint64_t off) {
  int e = dtl__st_io(f->fd, buf, n, off, false);
  if (e > 0)
    return DTL__ST_BAD(fn, f->path, "reading %zu bytes at byte %llu failed: %s", n, (unsigned long long)off,
                       strerror(e));
  if (e < 0)
    return DTL__ST_BAD(fn, f->path, "the file ends before byte %llu (it was %llu bytes when opened: truncated since?)",
                       (unsigned long long)(off + n), (unsigned long long)f->file_bytes);
  return DTL_OK;
}

dtl_status dtl_safetensors_open(const char *path, dtl_safetensors **out) {
  static const char fn[] = "dtl_safetensors_open";
  DTL_CHECK_ARG(path != NULL, fn, "path=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  dtl_safetensors *f = dtl__calloc(1, sizeof *f);
  if (!f) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  f->fd = -1;
  f->window = DTL__ST_WINDOW;
  dtl_status st = DTL_OK;
  char *header = NULL;
  char qp[DTL__QUOTE_PATH_CAP];
  f->path = dtl__st_strdup(dtl__quote(path, qp, sizeof qp));
  if (!f->path) {
    st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
    goto fail;
  }
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "path=\"%s\" cannot be opened: %s", f->path, strerror(errno));
    goto fail;
  }
  struct stat sb;
  if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = DTL__ST_BAD(fn, f->path, "not a regular file");
    goto fail;
  }
  f->file_bytes = (uint64_t)sb.st_size;
  if (f->file_bytes < 8) {
    st = DTL__ST_BAD(fn, f->path, "the file has %llu bytes, fewer than the 8 of the header length (truncated?)",
                     (unsigned long long)f->file_bytes);
    goto fail;
  }
  unsigned char len8[8];
  DTL_TRY_GOTO(dtl__st_pread(f, fn, len8, 8, 0), st, fail);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
  if (n > f->file_bytes - 8) {
    st = DTL__ST_BAD(fn, f->path, "header length=%llu runs past the end of the file (%llu bytes follow the length)",
                     (unsigned long long)n, (unsigned long long)(f->file_bytes - 8));
    goto fail;
  }
  if (n > DTL__ST_MAX_HEADER) {
    st = DTL__ST_BAD(fn, f->path, "header length=%llu exceeds the cap of %llu bytes", (unsigned long long)n,
                     DTL__ST_MAX_HEADER);
    goto fail;
  }
  f->data_start = 8 + n;
  header = dtl__malloc((size_t)n);
  if (!header) {
    st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory for a %llu-byte header", (unsigned long long)n);
    goto fail;
  }
  DTL_TRY_GOTO(dtl__st_pread(f, fn, header, (size_t)n, 8), st, fail);
  DTL_TRY_GOTO(dtl__st_parse(f, fn, header, (size_t)n), st, fail);
  dtl__free(header);
  *out = f;
  return DTL_OK;
fail:
  dtl__free(header);
  dtl_safetensors_close(f);
  return st;
}

void dtl_safetensors_close(dtl_safetensors *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  for (size_t i = 0; i < f->count; i++) {
    dtl__free(f->tensors[i].name);
    dtl__free(f->tensors[i].shape);
  }
  for (size_t i = 0; f->meta && i < 2 * f->nmeta; i++) dtl__free(f->meta[i]);
  dtl__free(f->meta);
  dtl__free(f->tensors);
  dtl__free(f->path);
  dtl__free(f);
}

size_t dtl_safetensors_num_tensors(const dtl_safetensors *f) { return f ? f->count : 0; }

const char *dtl_safetensors_tensor_name(const dtl_safetensors *f, size_t i) {
  return f && i < f->count ? f->tensors[i].name : NULL;
}

static const dtl__st_tensor *dtl__st_lookup(const dtl_safetensors *f, const char *name) {
  dtl__st_tensor key = {.name = (char *)name};
  return bsearch(&key, f->tensors, f->count, sizeof key, dtl__st_by_name);
}

dtl_status dtl__st_find(const dtl_safetensors *f, const char *fn, const char *name, const dtl__st_tensor **out) {
  DTL_CHECK_ARG(f != NULL, fn, "file=NULL");
  DTL_CHECK_ARG(name != NULL, fn, "name=NULL");
  const dtl__st_tensor *t = dtl__st_lookup(f, name);
  char q[DTL__QUOTE_CAP];
  if (!t) return DTL__ST_BAD(fn, f->path, "tensor \"%s\" is not in the file (%zu tensors)", dtl__quote(name, q, sizeof q), f->count);
  *out = t;
  return DTL_OK;
}

dtl_status dtl__st_check_dtype(const dtl_safetensors *f, const char *fn, const dtl__st_tensor *t, dtl_dtype want) {
  char q[DTL__QUOTE_CAP];
  if (t->dtype->dtype < 0)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "%s: tensor \"%s\": dtype=%s has no dtl dtype (wanted %s)", f->path,
                         dtl__quote(t->name, q, sizeof q), t->dtype->name,
                         dtl_dtype_name(want) ? dtl_dtype_name(want) : "?");
  if (t->dtype->dtype != (int)want)
    return DTL__ST_BAD(fn, f->path, "tensor \"%s\": dtype=%s in the file, %s requested (dtl converts nothing)",
                       dtl__quote(t->name, q, sizeof q), t->dtype->name,
                       dtl__st_dtype_name(want) ? dtl__st_dtype_name(want) : "an invalid dtype");
  return DTL_OK;
}

dtl_status dtl_safetensors_info(const dtl_safetensors *f, const char *name, dtl_dtype *dtype, int *ndim, int64_t *shape) {
  static const char fn[] = "dtl_safetensors_info";
  const dtl__st_tensor *t;
  DTL_TRY(dtl__st_find(f, fn, name, &t));
  char q[DTL__QUOTE_CAP];
  if (dtype && t->dtype->dtype < 0)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "%s: tensor \"%s\": dtype=%s has no dtl dtype", f->path,
                         dtl__quote(name, q, sizeof q), t->dtype->name);
  if (shape && t->ndim > DTL_MAX_TENSOR_DIMS)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "%s: tensor \"%s\": %d dims (dtl tensors have at most %d)", f->path,
                         dtl__quote(name, q, sizeof q), t->ndim, DTL_MAX_TENSOR_DIMS);
  if (dtype) *dtype = (dtl_dtype)t->dtype->dtype;
  if (ndim) *ndim = t->ndim;
  if (shape) memcpy(shape, t->shape, (size_t)t->ndim * sizeof *shape);
  return DTL_OK;
}

const char *dtl_safetensors_dtype_name(const dtl_safetensors *f, const char *name) {
  const dtl__st_tensor *t = f && name ? dtl__st_lookup(f, name) : NULL;
  return t ? t->dtype->name : NULL;
}

const char *dtl_safetensors_metadata(const dtl_safetensors *f, const char *key) {
  if (!f || !key || !f->nmeta) return NULL;
  const char *k = key;
  char **hit = bsearch(&k, f->meta, f->nmeta, 2 * sizeof *f->meta, dtl__st_by_key);
  return hit ? hit[1] : NULL;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The open safetensors file (its validated header), the dtype table the reader
 * and the writer share, and the box reader that the public reads and the TP weight loaders (src/tp) use. */
#ifndef DTL_CHECKPOINT_INTERNAL_H
#define DTL_CHECKPOINT_INTERNAL_H

#include "comm/backend.h"
#include "dtl/checkpoint.h"

/* Cap of the JSON header (the Rust safetensors crate's MAX_HEADER_SIZE) and of a tensor's dims. */
#define DTL__ST_MAX_HEADER 100000000ull
#define DTL__ST_MAX_DIMS 64
/* The window that gathers short strided runs into one read, and the host staging of device reads. */
#define DTL__ST_WINDOW ((size_t)4 << 20)

/* One dtype of the format: its name, bytes per element and dtl dtype (-1: none). */
typedef struct {
  const char *name;
  size_t size;
  int dtype;
} dtl__st_dtype;
/* The entry for a format name (NULL when the format has no such dtype) and the name of a dtl dtype. */
const dtl__st_dtype *dtl__st_dtype_find(const char *name);
const char *dtl__st_dtype_name(dtl_dtype t);

typedef struct {
  char *name;
  const dtl__st_dtype *dtype;
  int ndim;
  int64_t *shape;       /* [ndim] */
  uint64_t begin, end;  /* data_offsets, relative to the data buffer */
  uint64_t count;       /* elements */
} dtl__st_tensor;

struct dtl_safetensors {
  int fd;
  char *path;
  uint64_t file_bytes, data_start; /* data_start = 8 + header length */
  size_t count, nmeta;
  dtl__st_tensor *tensors;         /* sorted by name */
  char **meta;                     /* [2 * nmeta]: key, value, ... sorted by key */
  size_t window;                   /* DTL__ST_WINDOW; tests shrink it to cross every boundary */
};

/* The tensor called name, or DTL_ERR_INVALID_ARGUMENT naming fn, the file and name. */
dtl_status dtl__st_find(const dtl_safetensors *f, const char *fn, const char *name, const dtl__st_tensor **out);
/* t's dtype is t (DTL_ERR_UNSUPPORTED when the file's dtype has no dtl dtype, DTL_ERR_INVALID_ARGUMENT naming
 * both when they differ). */
dtl_status dtl__st_check_dtype(const dtl_safetensors *f, const char *fn, const dtl__st_tensor *t, dtl_dtype want);
/* "[4,6]" into buf (truncated to cap). */
const char *dtl__st_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);
/* The name as it can be printed in a message: at most 80 bytes, non-printable bytes as '?'. */
const char *dtl__st_quote(const char *name, char *buf, size_t cap);

/* pread (or pwrite when write) of exactly n bytes at off, through short transfers and EINTR: 0, the errno of
 * a failure, or -1 when the file ends first. */
int dtl__st_io(int fd, void *buf, size_t n, uint64_t off, bool write);
/* dtl__st_io reading f; a short file or an I/O error is DTL_ERR_INVALID_ARGUMENT naming the file and the
 * bytes. */
dtl_status dtl__st_pread(const dtl_safetensors *f, const char *fn, void *buf, size_t n, uint64_t off);

/* Reads the box [off, off + box) of t seen with the row-major shape view (ndim dims, the same element count
 * as t; 0 <= off, off + box <= view, checked by the caller) into dst, packed row-major. comm names the memory
 * of dst (NULL: host). Checks first that the file still holds t's bytes. */
dtl_status dtl__st_read_box(const dtl_safetensors *f, const char *fn, const dtl__st_tensor *t, int ndim,
                            const int64_t *view, const int64_t *off, const int64_t *box, dtl_comm *comm, void *dst);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The open safetensors file (its validated header), the dtype table the reader
 * and the writer share, and the box readers (dense, and the parts of a quantized tensor) that the public reads
 * and the TP weight loaders (src/tp) use. */
#ifndef DTL_CHECKPOINT_INTERNAL_H
#define DTL_CHECKPOINT_INTERNAL_H

#include "comm/backend.h"
#include "dtl/checkpoint.h"
#include "quant/format.h"

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
  char *path; /* as quoted for messages (dtl__quote) */
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

/* The file still holds t's bytes (it may have been truncated since it was opened): DTL_ERR_INVALID_ARGUMENT
 * naming the file, the tensor and both sizes otherwise. */
dtl_status dtl__st_check_size(const dtl_safetensors *f, const char *fn, const dtl__st_tensor *t);
/* The scratch of box reads, so that several reads can take it before the first one writes: the window (when some
 * read gathers short runs) and host staging for device destinations. */
typedef struct {
  bool window;
  size_t stage;
} dtl__st_need;
typedef struct {
  char *window, *stage;
  size_t stage_cap;
} dtl__st_scratch;
/* Adds what the read of box (in the view) of t needs to need (device: the destination is device memory). */
void dtl__st_box_need(const dtl_safetensors *f, const dtl__st_tensor *t, int ndim, const int64_t *view,
                      const int64_t *box, bool device, dtl__st_need *need);
dtl_status dtl__st_scratch_get(const dtl_safetensors *f, const char *fn, const dtl__st_need *need, dtl__st_scratch *out);
void dtl__st_scratch_put(dtl__st_scratch *s);
/* dtl__st_read_box in scratch taken for it (allocates nothing). */
dtl_status dtl__st_read_box_in(const dtl_safetensors *f, const char *fn, const dtl__st_tensor *t, int ndim,
                               const int64_t *view, const int64_t *off, const int64_t *box, dtl_comm *comm, void *dst,
                               const dtl__st_scratch *sc);
/* Reads the box [off, off + box) of t seen with the row-major shape view (ndim dims, the same element count
 * as t; 0 <= off, off + box <= view, checked by the caller) into dst, packed row-major. comm names the memory
 * of dst (NULL: host). Checks first that the file still holds t's bytes. */
dtl_status dtl__st_read_box(const dtl_safetensors *f, const char *fn, const dtl__st_tensor *t, int ndim,
                            const int64_t *view, const int64_t *off, const int64_t *box, dtl_comm *comm, void *dst);

/* Quantized tensors (quant_read.c). A read is one source per file tensor set: the format's geometry g of the tensor
 * in the file (its format on the file's logical shape) and the box of each part to read, in g's part coordinates.
 * Three phases, so that nothing is written before everything is known to be good: init checks every part (present,
 * the dtype and shape g gives, the file still whole), check reads the scales and g_idx of the boxes through a small
 * host buffer and refuses a NaN/infinite scale or a g_idx outside the groups, read reads every box. */
typedef struct {
  const dtl__qgeom *g; /* borrowed: outlives the source */
  const dtl__st_tensor *t[DTL_QUANT_NUM_PARTS]; /* NULL: g has no such part */
  int64_t off[DTL_QUANT_NUM_PARTS][DTL_MAX_TENSOR_DIMS], box[DTL_QUANT_NUM_PARTS][DTL_MAX_TENSOR_DIMS];
} dtl__st_qsrc;
/* "codes", "scales", "zeros", "g_idx". */
const char *dtl__st_qpart_name(int part);
/* The part boxes of g that the logical box (lshape, loff) needs (as a layout's rank would hold them). */
void dtl__st_qboxes(const dtl__qgeom *g, const int64_t *lshape, const int64_t *loff, dtl_qbox *out);
/* names[part] (DTL_QUANT_NUM_PARTS entries) is the file tensor of each part g has (a name for a part g lacks is
 * refused); box gives each part's box (box->part[p].shape and offset, in g's part coordinates). */
dtl_status dtl__st_qsrc_init(const dtl_safetensors *f, const char *fn, const char *const *names, const dtl__qgeom *g,
                             const dtl_qbox *box, dtl__st_qsrc *out);
dtl_status dtl__st_qsrc_check(const dtl_safetensors *f, const char *fn, const dtl__st_qsrc *s);
/* The scratch the reads of s need (dtl__st_box_need), taken before the first read so that a failure to get it
 * writes nothing. */
void dtl__st_qsrc_need(const dtl_safetensors *f, const dtl__st_qsrc *s, bool device, dtl__st_need *need);
/* Each part's box into dst[part] + at[part] bytes (at may be NULL: 0), in host memory or (dev not NULL) in the
 * device memory of dev, in scratch sc (dtl__st_qsrc_need's). */
dtl_status dtl__st_qsrc_read(const dtl_safetensors *f, const char *fn, const dtl__st_qsrc *s, dtl_comm *dev,
                             void *const *dst, const size_t *at, const dtl__st_scratch *sc);
/* The Hugging Face names of the parts of format fmt under prefix (dtl_safetensors_qread_hf) into buf, and
 * names[part] pointing into it (NULL for the parts fmt lacks). GGUF kinds are DTL_ERR_UNSUPPORTED. */
#define DTL__ST_QNAME_CAP 512
dtl_status dtl__st_qnames_hf(const dtl_safetensors *f, const char *fn, const dtl_quant_format *fmt, const char *prefix,
                             char (*buf)[DTL__ST_QNAME_CAP], const char **names);

#endif

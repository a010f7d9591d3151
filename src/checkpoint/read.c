/* SPDX-License-Identifier: Apache-2.0 */
/* Reading a box of a tensor from an open safetensors file: the box becomes runs that are contiguous in the
 * file (dims it spans whole merge into one run), each read with pread straight into the destination; short
 * runs close together are gathered by one read into a bounded window, and device destinations go through a
 * bounded host staging buffer. Peak memory: the destination plus the gathering span and the staging. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/stat.h>
#include "checkpoint/checkpoint_internal.h"
#include "layout/layout_internal.h"

/* Runs shorter than a page, separated by gaps of at most 16 KiB, are gathered into one read of the window:
 * one system call instead of many, for the gaps read in vain. Longer runs are read one by one straight into
 * the destination: from the page cache, a gathered read of 8 KiB runs measured up to twice as slow as one
 * pread per run (bench/dtl_load_perf, S(1)), as each byte of the gaps costs a copy. A gathered read spans at
 * most 1 MiB of the file (or the file's window, which tests shrink): the window is touched whole when short runs
 * fill it (FP8 codes' 2 KiB rows), so its size is a reader's peak memory beyond the shard, and one pread per MiB
 * instead of per 4 MiB measured no slower (bench/dtl_load_perf, fp8-block S(1): 0.21-0.24 s vs 0.23-0.37 s at 2
 * ranks). */
#define DTL__ST_GATHER_RUN ((uint64_t)4 << 10)
#define DTL__ST_GATHER_GAP ((uint64_t)16 << 10)
#define DTL__ST_GATHER_SPAN ((size_t)1 << 20)
static size_t dtl__st_span(const dtl_safetensors *f) {
  return f->window < DTL__ST_GATHER_SPAN ? f->window : DTL__ST_GATHER_SPAN;
}

/* Where the bytes of a read go, in destination order: straight into host memory, or through host staging
 * into the device memory of a communicator. */
typedef struct {
  const dtl_safetensors *f;
  const char *fn;
  dtl_comm *dev; /* NULL: dst is host memory */
  char *dst;
  size_t at; /* bytes of dst produced so far (written or staged) */
  char *stage;
  size_t cap, staged;
} dtl__st_sink;

static dtl_status dtl__st_flush(dtl__st_sink *s) {
  if (!s->staged) return DTL_OK;
  DTL_TRY(dtl__mem_copy(&s->dev->mem, s->dst + (s->at - s->staged), s->stage, s->staged));
  s->staged = 0;
  /* The staging buffer is refilled at once: the copy must have read it. */
  return s->dev->ops->synchronize(s->dev);
}

/* n bytes, from the file at off (src NULL) or from host memory src. */
static dtl_status dtl__st_sink_take(dtl__st_sink *s, const char *src, uint64_t off, size_t n) {
  while (n) {
    char *to = s->dev ? s->stage + s->staged : s->dst + s->at;
    size_t k = s->dev && n > s->cap - s->staged ? s->cap - s->staged : n;
    if (src) {
      memcpy(to, src, k);
      src += k;
    } else {
      DTL_TRY(dtl__st_pread(s->f, s->fn, to, k, off));
    }
    off += k;
    n -= k;
    s->at += k;
    if (s->dev && (s->staged += k) == s->cap) DTL_TRY(dtl__st_flush(s));
  }
  return DTL_OK;
}

/* The runs of a box: dims 0..k-1 are walked with idx, dims k..ndim-1 form one contiguous run. */
typedef struct {
  int k;
  const int64_t *off, *box;
  uint64_t stride[DTL__ST_MAX_DIMS]; /* elements, of the view */
  int64_t idx[DTL__ST_MAX_DIMS];
  uint64_t base; /* file byte of the tensor's first element */
  size_t es;
  int ndim;
} dtl__st_runs;

static uint64_t dtl__st_run_at(const dtl__st_runs *r, const int64_t *idx) {
  uint64_t e = 0;
  for (int d = 0; d < r->k; d++) e += (uint64_t)(r->off[d] + idx[d]) * r->stride[d];
  if (r->k < r->ndim) e += (uint64_t)r->off[r->k] * r->stride[r->k];
  return r->base + e * r->es;
}

static void dtl__st_next(const dtl__st_runs *r, int64_t *idx) {
  for (int d = r->k - 1; d >= 0; d--) {
    if (++idx[d] < r->box[d]) return;
    idx[d] = 0;
  }
}

dtl_status dtl__st_check_size(const dtl_safetensors *f, const char *fn, const dtl__st_tensor *t) {
  struct stat sb;
  if (fstat(f->fd, &sb) != 0 || (uint64_t)sb.st_size < f->data_start + t->end) {
    char q[DTL__QUOTE_CAP];
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                         "%s: tensor \"%s\": the file has %lld bytes, fewer than the %llu it had when opened "
                         "(truncated since?)",
                         f->path, dtl__quote(t->name, q, sizeof q), (long long)sb.st_size,
                         (unsigned long long)f->file_bytes);
  }
  return DTL_OK;
}

/* The runs of a box read (dims the box spans whole merge), and whether short ones are gathered in the window. */
static uint64_t dtl__st_box_runs(const dtl_safetensors *f, const dtl__st_tensor *t, int ndim, const int64_t *view,
                                 const int64_t *box, dtl__st_runs *r, uint64_t *nruns, size_t *run_bytes, bool *gather) {
  uint64_t total = 1;
  for (int d = 0; d < ndim; d++) total *= (uint64_t)box[d];
  r->box = box;
  r->es = t->dtype->size;
  r->ndim = ndim;
  uint64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    r->stride[d] = s;
    s *= (uint64_t)view[d];
  }
  /* Merge trailing dims the box spans whole: the run covers dims k.. of the box. */
  int k = ndim ? ndim - 1 : 0;
  uint64_t run = ndim ? (uint64_t)box[k] : 1;
  while (k > 0 && box[k] == view[k]) run *= (uint64_t)box[--k];
  r->k = k;
  *nruns = total ? total / run : 0;
  *run_bytes = (size_t)(run * r->es);
  *gather = *nruns > 1 && *run_bytes < DTL__ST_GATHER_RUN && *run_bytes * 2 <= dtl__st_span(f);
  return total;
}

void dtl__st_box_need(const dtl_safetensors *f, const dtl__st_tensor *t, int ndim, const int64_t *view,
                      const int64_t *box, bool device, dtl__st_need *need) {
  dtl__st_runs r;
  uint64_t nruns;
  size_t run_bytes;
  bool gather;
  uint64_t total = dtl__st_box_runs(f, t, ndim, view, box, &r, &nruns, &run_bytes, &gather);
  if (!total) return;
  need->window |= gather;
  size_t stage = total * r.es < f->window ? (size_t)(total * r.es) : f->window;
  if (device && stage > need->stage) need->stage = stage;
}

dtl_status dtl__st_scratch_get(const dtl_safetensors *f, const char *fn, const dtl__st_need *need,
                               dtl__st_scratch *out) {
  dtl__st_scratch s = {NULL, NULL, 0};
  if (need->stage) {
    s.stage = dtl__malloc(need->stage);
    if (!s.stage) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory (%zu staging bytes)", need->stage);
    s.stage_cap = need->stage;
  }
  if (need->window) {
    s.window = dtl__malloc(dtl__st_span(f));
    if (!s.window) {
      dtl__free(s.stage);
      return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory (%zu window bytes)", f->window);
    }
  }
  *out = s;
  return DTL_OK;
}

void dtl__st_scratch_put(dtl__st_scratch *s) {
  dtl__free(s->window);
  dtl__free(s->stage);
  s->window = s->stage = NULL;
}

dtl_status dtl__st_read_box_in(const dtl_safetensors *f, const char *fn, const dtl__st_tensor *t, int ndim,
                               const int64_t *view, const int64_t *off, const int64_t *box, dtl_comm *comm, void *dst,
                               const dtl__st_scratch *sc) {
  dtl__st_runs r;
  uint64_t nruns;
  size_t run_bytes;
  bool gather;
  uint64_t total = dtl__st_box_runs(f, t, ndim, view, box, &r, &nruns, &run_bytes, &gather);
  if (total == 0) return DTL_OK;
  DTL_TRY(dtl__st_check_size(f, fn, t));
  r.off = off;
  r.base = f->data_start + t->begin;
  dtl__st_sink sk = {.f = f, .fn = fn, .dev = comm, .dst = dst, .stage = sc->stage, .cap = sc->stage_cap};
  char *win = sc->window;
  if ((comm && !sk.stage) || (gather && !win))
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "a box read without the scratch it needs");
  dtl_status st = DTL_OK;
  int64_t next[DTL__ST_MAX_DIMS], group[DTL__ST_MAX_DIMS];
  memset(r.idx, 0, sizeof r.idx);
  for (uint64_t i = 0; i < nruns;) {
    uint64_t start = dtl__st_run_at(&r, r.idx), end = start + run_bytes, j = i + 1;
    memcpy(group, r.idx, sizeof group);
    memcpy(next, r.idx, sizeof next);
    dtl__st_next(&r, next);
    for (; gather && j < nruns; j++, dtl__st_next(&r, next)) {
      uint64_t o = dtl__st_run_at(&r, next);
      if (o - end > DTL__ST_GATHER_GAP || o + run_bytes - start > dtl__st_span(f)) break;
      end = o + run_bytes;
    }
    if (j == i + 1) {
      DTL_TRY_GOTO(dtl__st_sink_take(&sk, NULL, start, run_bytes), st, done);
    } else {
      DTL_TRY_GOTO(dtl__st_pread(f, fn, win, (size_t)(end - start), start), st, done);
      for (uint64_t g = i; g < j; g++, dtl__st_next(&r, group))
        DTL_TRY_GOTO(dtl__st_sink_take(&sk, win + (dtl__st_run_at(&r, group) - start), 0, run_bytes), st, done);
    }
    memcpy(r.idx, next, sizeof next);
    i = j;
  }
  if (comm) st = dtl__st_flush(&sk);
done:
  return st;
}

dtl_status dtl__st_read_box(const dtl_safetensors *f, const char *fn, const dtl__st_tensor *t, int ndim,
                            const int64_t *view, const int64_t *off, const int64_t *box, dtl_comm *comm, void *dst) {
  dtl__st_need need = {false, 0};
  dtl__st_box_need(f, t, ndim, view, box, comm != NULL, &need);
  if (!need.window && !need.stage) {
    dtl__st_scratch none = {NULL, NULL, 0};
    return dtl__st_read_box_in(f, fn, t, ndim, view, off, box, comm, dst, &none);
  }
  /* The size check comes before the scratch, as it always did: a truncated file is reported as such. */
  DTL_TRY(dtl__st_check_size(f, fn, t));
  dtl__st_scratch sc = {NULL, NULL, 0};
  DTL_TRY(dtl__st_scratch_get(f, fn, &need, &sc));
  dtl_status st = dtl__st_read_box_in(f, fn, t, ndim, view, off, box, comm, dst, &sc);
  dtl__st_scratch_put(&sc);
  return st;
}

dtl_status dtl_safetensors_read(const dtl_safetensors *f, const char *name, const dtl_layout *layout, void *local) {
  static const char fn[] = "dtl_safetensors_read";
  DTL_CHECK_ARG(layout != NULL, fn, "layout=NULL");
  const dtl__st_tensor *t;
  DTL_TRY(dtl__st_find(f, fn, name, &t));
  DTL_TRY(dtl__st_check_dtype(f, fn, t, layout->dtype));
  if (t->ndim != layout->ndim || memcmp(t->shape, layout->shape, (size_t)t->ndim * sizeof *t->shape)) {
    char q[DTL__QUOTE_CAP], a[160], b[160];
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: tensor \"%s\": shape=%s in the file, layout shape=%s",
                         f->path, dtl__quote(t->name, q, sizeof q), dtl__st_shape_str(t->ndim, t->shape, a, sizeof a),
                         dtl__st_shape_str(layout->ndim, layout->shape, b, sizeof b));
  }
  DTL_CHECK_ARG(local != NULL || layout->local_count == 0, fn, "local=NULL with %zu local elements",
                layout->local_count);
  dtl_comm *c = layout->mesh->comm; /* NULL on an abstract mesh: host memory */
  dtl_comm *dev = c && c->mem.ops->memory == DTL_MEMORY_DEVICE ? c : NULL;
  dtl_reduce_op op;
  if (dtl__layout_holds_identity(layout, layout->mesh->coord, &op)) {
    if (!layout->local_count) return DTL_OK;
    dtl__mem host = dtl__mem_host();
    DTL_TRY(dtl__mem_fill_identity(c ? &c->mem : &host, local, layout->local_count, layout->dtype, op));
    return dev ? dev->ops->synchronize(dev) : DTL_OK;
  }
  return dtl__st_read_box(f, fn, t, layout->ndim, layout->shape, layout->local_offset, layout->local_shape, dev, local);
}

dtl_status dtl_safetensors_read_box(const dtl_safetensors *f, const char *name, dtl_dtype dtype, int ndim,
                                    const int64_t *offset, const int64_t *shape, void *dst) {
  static const char fn[] = "dtl_safetensors_read_box";
  const dtl__st_tensor *t;
  DTL_TRY(dtl__st_find(f, fn, name, &t));
  DTL_TRY(dtl__st_check_dtype(f, fn, t, dtype));
  char q[DTL__QUOTE_CAP];
  DTL_CHECK_ARG(ndim == t->ndim, fn, "ndim=%d (tensor \"%s\" has %d dims)", ndim, dtl__quote(name, q, sizeof q),
                t->ndim);
  DTL_CHECK_ARG(ndim == 0 || offset != NULL, fn, "offset=NULL");
  DTL_CHECK_ARG(ndim == 0 || shape != NULL, fn, "shape=NULL");
  bool empty = false;
  for (int d = 0; d < ndim; d++) {
    DTL_CHECK_ARG(offset[d] >= 0 && shape[d] >= 0 && offset[d] <= t->shape[d] - shape[d], fn,
                  "offset[%d]=%lld shape[%d]=%lld (tensor \"%s\" has %lld along dim %d)", d, (long long)offset[d], d,
                  (long long)shape[d], dtl__quote(name, q, sizeof q), (long long)t->shape[d], d);
    empty |= shape[d] == 0;
  }
  DTL_CHECK_ARG(dst != NULL || empty, fn, "dst=NULL");
  return dtl__st_read_box(f, fn, t, ndim, t->shape, offset, shape, NULL, dst);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Layouts: validation of (mesh, dtype, shape, placements) and the chunking rule that gives each
 * coordinate its box of the global tensor. */
#include <stdlib.h>
#include <string.h>
#include "layout/layout_internal.h"

dtl_placement dtl_shard(int dim) { return (dtl_placement){DTL_SHARD, dim, DTL_SUM}; }
dtl_placement dtl_replicate(void) { return (dtl_placement){DTL_REPLICATE, 0, DTL_SUM}; }
dtl_placement dtl_partial(dtl_reduce_op op) { return (dtl_placement){DTL_PARTIAL, 0, op}; }

void dtl__local_box(const dtl_mesh *m, int ndim, const int64_t *shape, const dtl_placement *p, const int *coord,
                    int64_t *box_shape, int64_t *box_offset) {
  for (int d = 0; d < ndim; d++) {
    box_shape[d] = shape[d];
    box_offset[d] = 0;
  }
  /* Mesh dims left to right: each shard splits what the earlier ones left of that tensor dim. */
  for (int md = 0; md < m->ndim; md++) {
    if (p[md].kind != DTL_SHARD) continue;
    int d = p[md].dim;
    int64_t off, size;
    dtl__chunk(box_shape[d], m->shape[md], coord[md], &off, &size);
    box_offset[d] += off;
    box_shape[d] = size;
  }
}

/* A pending average of integers would truncate when it is resolved, so Partial(avg) needs a float dtype. */
static bool dtl__partial_ok(dtl_dtype t, dtl_reduce_op op) { return op != DTL_AVG || dtl__dtype_is_float(t); }

/* The 8-bit floats hold only the pending reductions that are exact (max, min: types.h), and those only on a mesh
 * whose transport reduces them (the communicator's, or a non-member's parent's; none on an abstract mesh). */
static dtl_status dtl__partial_check(const char *fn, const dtl_mesh *m, int md, dtl_dtype t, dtl_reduce_op op) {
  if (!dtl__partial_ok(t, op))
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "placements[%d]=P(%s) cannot hold dtype %s", md,
                         dtl_reduce_op_name(op), dtl_dtype_name(t));
  char why[256];
  const char *no = dtl__comm_reduce_refusal(m->comm ? m->comm : m->parent, t, op, why, sizeof why);
  if (no)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "placements[%d]=P(%s) cannot hold dtype %s: %s", md,
                         dtl_reduce_op_name(op), dtl_dtype_name(t), no);
  return DTL_OK;
}

dtl_status dtl__layout_init(dtl_layout *l, const char *fn, const dtl_mesh *m, dtl_dtype t, int ndim,
                                   const int64_t *shape, const dtl_placement *placements) {
  DTL_CHECK_ARG(m != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(dtl__dtype_valid(t), fn, "dtype=%d (expected 0..%d)", (int)t, DTL_NUM_DTYPES - 1);
  DTL_CHECK_ARG(ndim >= 0 && ndim <= DTL_MAX_TENSOR_DIMS, fn, "ndim=%d (expected 0..%d)", ndim, DTL_MAX_TENSOR_DIMS);
  DTL_CHECK_ARG(ndim == 0 || shape != NULL, fn, "global_shape=NULL");
  DTL_CHECK_ARG(placements != NULL, fn, "placements=NULL");
  memset(l, 0, sizeof *l);
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) {
    DTL_CHECK_ARG(shape[d] >= 0, fn, "global_shape[%d]=%lld (expected >= 0)", d, (long long)shape[d]);
    DTL_CHECK_ARG(dtl__mul_i64(count, shape[d], &count), fn,
                  "global_shape overflows int64 elements at dim %d (size %lld)", d, (long long)shape[d]);
    l->shape[d] = shape[d];
  }
  size_t bytes;
  DTL_CHECK_ARG((uint64_t)count <= SIZE_MAX && dtl__mul_size((size_t)count, dtl_dtype_size(t), &bytes), fn,
                "global_shape has %lld elements of %s, which overflows size_t bytes", (long long)count, dtl_dtype_name(t));
  for (int md = 0; md < m->ndim; md++) {
    dtl_placement p = placements[md];
    switch (p.kind) {
      case DTL_REPLICATE: p = dtl_replicate(); break;
      case DTL_SHARD: {
        DTL_CHECK_ARG(ndim > 0, fn, "placements[%d]=S(%d) but a 0-d tensor has no dim to shard", md, p.dim);
        int d = p.dim < 0 ? p.dim + ndim : p.dim;
        DTL_CHECK_ARG(d >= 0 && d < ndim, fn, "placements[%d]=S(%d) is out of range for a %d-d tensor (expected %d..%d)",
                      md, p.dim, ndim, -ndim, ndim - 1);
        p = dtl_shard(d);
        break;
      }
      case DTL_PARTIAL:
        DTL_CHECK_ARG(dtl__reduce_op_valid(p.op), fn, "placements[%d]=P(op=%d) (expected DTL_SUM..DTL_AVG)", md, (int)p.op);
        DTL_TRY(dtl__partial_check(fn, m, md, t, p.op));
        p = dtl_partial(p.op);
        break;
      default:
        return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "placements[%d].kind=%d (expected R, S or P)", md, (int)p.kind);
    }
    l->placements[md] = p;
  }
  l->mesh = m;
  l->dtype = t;
  l->ndim = ndim;
  l->global_count = (size_t)count;
  dtl__local_box(m, ndim, l->shape, l->placements, m->coord, l->local_shape, l->local_offset);
  size_t lc = 1;
  for (int d = 0; d < ndim; d++) lc *= (size_t)l->local_shape[d];
  l->local_count = lc;
  if (!m->member) { /* a rank outside the mesh holds no part of the tensor */
    memset(l->local_shape, 0, sizeof l->local_shape);
    memset(l->local_offset, 0, sizeof l->local_offset);
    l->local_count = 0;
  }
  return DTL_OK;
}

dtl_status dtl_layout_create(const dtl_mesh *m, dtl_dtype t, int ndim, const int64_t *global_shape,
                             const dtl_placement *placements, dtl_layout **out) {
  static const char fn[] = "dtl_layout_create";
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  dtl_layout tmp;
  DTL_TRY(dtl__layout_init(&tmp, fn, m, t, ndim, global_shape, placements));
  dtl_layout *l = dtl__malloc(sizeof *l);
  if (!l) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  *l = tmp;
  *out = l;
  return DTL_OK;
}

dtl_status dtl_layout_with_placements(const dtl_layout *l, const dtl_placement *placements, dtl_layout **out) {
  static const char fn[] = "dtl_layout_with_placements";
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  /* The checks of the placements are dtl_layout_create's; its messages say which call they came through. */
  dtl_status st = dtl_layout_create(l->mesh, l->dtype, l->ndim, l->shape, placements, out);
  return st == DTL_OK ? DTL_OK : dtl__error_prefix(st, "%s", fn);
}

dtl_status dtl_layout_local_box(const dtl_layout *l, const int *coord, int64_t *shape, int64_t *offset) {
  static const char fn[] = "dtl_layout_local_box";
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  int64_t s[DTL_MAX_TENSOR_DIMS], o[DTL_MAX_TENSOR_DIMS];
  if (coord) {
    for (int md = 0; md < l->mesh->ndim; md++)
      DTL_CHECK_ARG(coord[md] >= 0 && coord[md] < l->mesh->shape[md], fn, "coord[%d]=%d (expected 0..%d)", md, coord[md],
                    l->mesh->shape[md] - 1);
    dtl__local_box(l->mesh, l->ndim, l->shape, l->placements, coord, s, o);
  } else {
    memcpy(s, l->local_shape, sizeof s);
    memcpy(o, l->local_offset, sizeof o);
  }
  for (int d = 0; d < l->ndim; d++) {
    if (shape) shape[d] = s[d];
    if (offset) offset[d] = o[d];
  }
  return DTL_OK;
}

size_t dtl_layout_local_count(const dtl_layout *l) { return l ? l->local_count : 0; }
size_t dtl_layout_global_count(const dtl_layout *l) { return l ? l->global_count : 0; }
const dtl_mesh *dtl_layout_mesh(const dtl_layout *l) { return l ? l->mesh : NULL; }
dtl_dtype dtl_layout_dtype(const dtl_layout *l) { return l ? l->dtype : DTL_FLOAT32; }
int dtl_layout_ndim(const dtl_layout *l) { return l ? l->ndim : -1; }

void dtl_layout_global_shape(const dtl_layout *l, int64_t *shape) {
  if (!l || !shape) return;
  for (int d = 0; d < l->ndim; d++) shape[d] = l->shape[d];
}

void dtl_layout_placements(const dtl_layout *l, dtl_placement *out) {
  if (!l || !out) return;
  for (int md = 0; md < l->mesh->ndim; md++) out[md] = l->placements[md];
}

void dtl_layout_destroy(dtl_layout *l) { dtl__free(l); }

/* FNV-1a over the fields that define a layout. The mesh enters by its shape only (not its address), so
 * that every rank computes the same hash for a DTL_CHECK fingerprint; equality also compares identity. */
uint64_t dtl__layout_hash(const dtl_layout *l) {
  uint64_t h = 1469598103934665603ull;
#define DTL__MIX(v)                 \
  do {                              \
    h ^= (uint64_t)(v);             \
    h *= 1099511628211ull;          \
  } while (0)
  DTL__MIX(l->mesh->ndim);
  for (int md = 0; md < l->mesh->ndim; md++) {
    DTL__MIX(l->mesh->shape[md]);
    DTL__MIX(l->placements[md].kind);
    DTL__MIX(l->placements[md].kind == DTL_SHARD ? l->placements[md].dim : 0);
    DTL__MIX(l->placements[md].kind == DTL_PARTIAL ? l->placements[md].op : 0);
  }
  DTL__MIX(l->dtype);
  DTL__MIX(l->ndim);
  for (int d = 0; d < l->ndim; d++) DTL__MIX(l->shape[d]);
#undef DTL__MIX
  return h;
}

bool dtl__layout_equal(const dtl_layout *a, const dtl_layout *b) {
  if (a->mesh != b->mesh || a->dtype != b->dtype || a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  for (int md = 0; md < a->mesh->ndim; md++) {
    dtl_placement p = a->placements[md], q = b->placements[md];
    if (p.kind != q.kind || p.dim != q.dim || p.op != q.op) return false;
  }
  return true;
}

bool dtl__layout_holds_identity(const dtl_layout *l, const int *coord, dtl_reduce_op *op) {
  return dtl__placements_hold_identity(l->mesh, l->placements, coord, op);
}

bool dtl__placements_hold_identity(const dtl_mesh *m, const dtl_placement *pl, const int *coord, dtl_reduce_op *op) {
  for (int md = 0; md < m->ndim; md++) {
    dtl_placement p = pl[md];
    if (p.kind == DTL_PARTIAL && (p.op == DTL_SUM || p.op == DTL_PROD) && coord[md] != 0) {
      if (op) *op = p.op;
      return true;
    }
  }
  return false;
}

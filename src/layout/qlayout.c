/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized layouts: a format's geometry on a mesh. Validates the cut of every packed dim, derives each part's
 * boxes from the logical tensor's (the dense layout's, so the shards line up with a dense layer's activations), and
 * keeps a plain layout for each part that is cut like a dense tensor. */
#include <stdlib.h>
#include <string.h>
#include "layout/qlayout_internal.h"

void dtl__qlayout_boxes(const dtl_qlayout *l, const int *coord, dtl_qbox *out) {
  memset(out, 0, sizeof *out);
  const dtl_layout *lg = &l->logical;
  bool member = coord ? true : lg->mesh->member;
  if (coord)
    dtl__local_box(lg->mesh, lg->ndim, lg->shape, lg->placements, coord, out->shape, out->offset);
  else {
    memcpy(out->shape, lg->local_shape, sizeof out->shape);
    memcpy(out->offset, lg->local_offset, sizeof out->offset);
  }
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    const dtl__qpart_geom *pg = &l->g.part[p];
    dtl_qpart_box *b = &out->part[p];
    b->ndim = pg->ndim;
    if (pg->ndim < 0) continue;
    b->dtype = pg->dtype;
    memcpy(b->global_shape, pg->shape, (size_t)pg->ndim * sizeof *pg->shape);
    if (!member) continue; /* outside the mesh: nothing, not even a 0-d part */
    dtl__qgeom_part_box(&l->g, p, out->shape, out->offset, b->shape, b->offset);
    b->bytes = (size_t)dtl__qbox_count(pg->ndim, b->shape) * dtl_dtype_size(pg->dtype);
  }
}

/* Whether every chunk boundary of n split k ways falls on a multiple of unit. */
static bool dtl__cut_ok(int64_t n, int k, int64_t unit) {
  for (int i = 0; i < k; i++) {
    int64_t off, size;
    dtl__chunk(n, k, i, &off, &size);
    if (off % unit || (off + size) % unit) return false;
  }
  return true;
}

/* A cut inside a packing unit: the first coordinate whose box does, with the degrees that would work. */
static dtl_status dtl__qlayout_check_cuts(const char *fn, const dtl_qlayout *l) {
  const dtl_layout *lg = &l->logical;
  const dtl_mesh *m = lg->mesh;
  for (int d = 0; d < lg->ndim; d++) {
    int64_t u = l->g.unit[d];
    if (u <= 1) continue;
    int mdims[DTL_MAX_MESH_DIMS], nm = 0, ways = 1;
    for (int md = 0; md < m->ndim; md++)
      if (lg->placements[md].kind == DTL_SHARD && lg->placements[md].dim == d && m->shape[md] > 1) {
        mdims[nm++] = md;
        ways *= m->shape[md];
      }
    if (!nm) continue;
    int coord[DTL_MAX_MESH_DIMS] = {0};
    for (;;) {
      int64_t shape[DTL_MAX_TENSOR_DIMS], off[DTL_MAX_TENSOR_DIMS];
      dtl__local_box(m, lg->ndim, lg->shape, lg->placements, coord, shape, off);
      if (off[d] % u || (off[d] + shape[d]) % u) {
        char works[256];
        size_t at = 0;
        works[0] = '\0';
        for (int k = 1; k <= 256 && at + 16 < sizeof works; k++)
          if (dtl__cut_ok(lg->shape[d], k, u)) at += (size_t)snprintf(works + at, sizeof works - at, "%s%d", at ? ", " : "", k);
        int64_t cut = off[d] % u ? off[d] : off[d] + shape[d];
        return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                             "tensor dim %d (size %lld) split %d ways (mesh dim %d%s) cuts a packing unit of %lld elements "
                             "(%s) at element %lld; a single split of this dim works %s ways",
                             d, (long long)lg->shape[d], ways, mdims[0], nm > 1 ? " and others" : "", (long long)u,
                             l->g.unit_name[d] ? l->g.unit_name[d] : "packing unit", (long long)cut, works);
      }
      int i = nm - 1;
      while (i >= 0 && ++coord[mdims[i]] == m->shape[mdims[i]]) coord[mdims[i--]] = 0;
      if (i < 0) break;
    }
  }
  return DTL_OK;
}

/* The plain layout of part p, when its dims are cut like the logical tensor's (format.h: no BLOCK dim). */
static dtl_status dtl__qlayout_view(const char *fn, dtl_qlayout *l, int p) {
  const dtl__qpart_geom *pg = &l->g.part[p];
  const dtl_layout *lg = &l->logical;
  int64_t shape[DTL_MAX_TENSOR_DIMS + 1];
  int of_src[DTL_MAX_TENSOR_DIMS]; /* the view dim that follows each logical dim, -1 none */
  int nd = 0;
  for (int d = 0; d < lg->ndim; d++) of_src[d] = -1;
  for (int d = 0; d < pg->ndim; d++) {
    const dtl__qmap *m = &pg->map[d];
    if (m->kind == DTL__QMAP_BLOCK) return DTL_OK;
    if (m->kind == DTL__QMAP_BYTES) {
      of_src[m->src] = nd;
      shape[nd++] = pg->shape[d] / m->bytes;
      shape[nd++] = m->bytes;
    } else {
      if (m->kind == DTL__QMAP_SAME || m->kind == DTL__QMAP_PACK) of_src[m->src] = nd;
      shape[nd++] = pg->shape[d];
    }
  }
  DTL_CHECK_ARG(nd <= DTL_MAX_TENSOR_DIMS, fn, "ndim=%d is too many for %s (at most %d)", lg->ndim,
                dtl_quant_kind_name(l->g.fmt.kind), DTL_MAX_TENSOR_DIMS - 1);
  dtl_placement pl[DTL_MAX_MESH_DIMS];
  for (int md = 0; md < lg->mesh->ndim; md++) {
    dtl_placement q = lg->placements[md];
    pl[md] = q.kind == DTL_SHARD && of_src[q.dim] >= 0 ? dtl_shard(of_src[q.dim]) : dtl_replicate();
  }
  DTL_TRY(dtl__layout_init(&l->view[p], fn, lg->mesh, pg->dtype, nd, shape, pl));
  l->has_view[p] = true;
  return DTL_OK;
}

static dtl_status dtl__qlayout_init(dtl_qlayout *l, const char *fn, const dtl_mesh *m, const dtl_quant_format *fmt,
                                    int ndim, const int64_t *shape, const dtl_placement *placements) {
  DTL_CHECK_ARG(m != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(placements != NULL, fn, "placements=NULL");
  memset(l, 0, sizeof *l);
  DTL_TRY(dtl__qgeom_init(fn, fmt, ndim, shape, &l->g));
  for (int md = 0; md < m->ndim; md++)
    DTL_CHECK_ARG(placements[md].kind != DTL_PARTIAL, fn,
                  "placements[%d]=P(%s): a quantized tensor cannot be Partial (codes do not add; dequantize first)", md,
                  dtl_reduce_op_name(placements[md].op) ? dtl_reduce_op_name(placements[md].op) : "?");
  DTL_TRY(dtl__layout_init(&l->logical, fn, m, DTL_FLOAT32, ndim, shape, placements));
  DTL_TRY(dtl__qlayout_check_cuts(fn, l));
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    if (l->g.part[p].ndim >= 0) DTL_TRY(dtl__qlayout_view(fn, l, p));
  dtl__qlayout_boxes(l, NULL, &l->local);
  return DTL_OK;
}

dtl_status dtl_qlayout_create(const dtl_mesh *m, const dtl_quant_format *fmt, int ndim, const int64_t *shape,
                              const dtl_placement *placements, dtl_qlayout **out) {
  static const char fn[] = "dtl_qlayout_create";
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  dtl_qlayout *l = dtl__malloc(sizeof *l);
  if (!l) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  dtl_status st = dtl__qlayout_init(l, fn, m, fmt, ndim, shape, placements);
  if (st != DTL_OK) {
    dtl__free(l);
    return st;
  }
  *out = l;
  return DTL_OK;
}

dtl_status dtl_qlayout_with_placements(const dtl_qlayout *l, const dtl_placement *placements, dtl_qlayout **out) {
  static const char fn[] = "dtl_qlayout_with_placements";
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  dtl_status st = dtl_qlayout_create(l->logical.mesh, &l->g.fmt, l->g.ndim, l->g.shape, placements, out);
  return st == DTL_OK ? DTL_OK : dtl__error_prefix(st, "%s", fn);
}

dtl_status dtl_qlayout_local_boxes(const dtl_qlayout *l, const int *coord, dtl_qbox *out) {
  static const char fn[] = "dtl_qlayout_local_boxes";
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  if (!coord) {
    *out = l->local;
    return DTL_OK;
  }
  const dtl_mesh *m = l->logical.mesh;
  for (int md = 0; md < m->ndim; md++)
    DTL_CHECK_ARG(coord[md] >= 0 && coord[md] < m->shape[md], fn, "coord[%d]=%d (expected 0..%d)", md, coord[md],
                  m->shape[md] - 1);
  dtl__qlayout_boxes(l, coord, out);
  return DTL_OK;
}

const dtl_mesh *dtl_qlayout_mesh(const dtl_qlayout *l) { return l ? l->logical.mesh : NULL; }
const dtl_layout *dtl_qlayout_logical(const dtl_qlayout *l) { return l ? &l->logical : NULL; }

void dtl_qlayout_quant_format(const dtl_qlayout *l, dtl_quant_format *out) {
  if (l && out) *out = l->g.fmt;
}

dtl_status dtl_qlayout_format(const dtl_qlayout *l, char *buf, size_t cap) {
  static const char fn[] = "dtl_qlayout_format";
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  DTL_CHECK_ARG(buf != NULL || cap == 0, fn, "buf=NULL");
  char f[96], dense[512];
  dtl__qformat_text(&l->g.fmt, f, sizeof f);
  DTL_TRY(dtl_layout_format(&l->logical, dense, sizeof dense));
  const char *rest = strchr(dense, '['); /* "f32[8,6] mesh=..." less the dtype */
  int n = snprintf(NULL, 0, "%s%s", f, rest ? rest : dense);
  DTL_CHECK_ARG((size_t)n < cap, fn, "cap=%zu is too small (needs %d bytes)", cap, n + 1);
  snprintf(buf, cap, "%s%s", f, rest ? rest : dense);
  return DTL_OK;
}

void dtl_qlayout_destroy(dtl_qlayout *l) { dtl__free(l); }

/* SPDX-License-Identifier: Apache-2.0 */
/* Text renderings of a layout: the one-line description ("f32[8,6] mesh=2x4 placements=S(0),R") and the
 * block grid of dtl_layout_visualize. Both depend on the layout only, never on the calling rank, so every
 * rank (and the MPI-free `dtl show` on an abstract mesh) prints the same text. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "layout/layout_internal.h"

/* Drawing enumerates every coordinate; larger meshes would print megabytes nobody reads. */
#define DTL__VISUALIZE_MAX_RANKS 65536

/* A growing string; after an allocation failure it stops growing and remembers it. */
typedef struct {
  char *s;
  size_t len, cap;
  bool oom;
} dtl__text;

static void dtl__put(dtl__text *t, const char *fmt, ...) DTL__PRINTF(2, 3);
static void dtl__put(dtl__text *t, const char *fmt, ...) {
  if (t->oom) return;
  for (int attempt = 0; attempt < 2; attempt++) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) break;
    if (t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t want = t->len + (size_t)n + 1, cap = t->cap ? t->cap : 256;
    while (cap < want) cap *= 2;
    char *s = dtl__realloc(t->s, cap);
    if (!s) break;
    t->s = s;
    t->cap = cap;
  }
  t->oom = true;
}

static void dtl__pad(dtl__text *t, size_t n) {
  for (size_t i = 0; i < n; i++) dtl__put(t, " ");
}

/* The one-line description; the header line of the grid. */
static void dtl__put_layout(dtl__text *t, const dtl_layout *l) {
  dtl__put(t, "%s[", dtl_dtype_name(l->dtype));
  for (int d = 0; d < l->ndim; d++) dtl__put(t, d ? ",%lld" : "%lld", (long long)l->shape[d]);
  dtl__put(t, "] mesh=");
  for (int md = 0; md < l->mesh->ndim; md++) dtl__put(t, md ? "x%d" : "%d", l->mesh->shape[md]);
  char p[DTL_MAX_MESH_DIMS * 16];
  dtl_placements_format(l->placements, l->mesh->ndim, p, sizeof p); /* cannot fail: normalised placements */
  dtl__put(t, " placements=%s", p);
}

/* Copies t into buf when it fits (needed size in the message otherwise) and frees t. */
static dtl_status dtl__text_deliver(const char *fn, dtl__text *t, char *buf, size_t cap) {
  dtl_status st = DTL_OK;
  if (t->oom) st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  else if (t->len + 1 > cap) st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "cap=%zu is too small (%zu bytes needed)", cap, t->len + 1);
  else memcpy(buf, t->s, t->len + 1);
  dtl__free(t->s);
  return st;
}

dtl_status dtl_layout_format(const dtl_layout *l, char *buf, size_t cap) {
  static const char fn[] = "dtl_layout_format";
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  DTL_CHECK_ARG(buf != NULL, fn, "buf=NULL");
  dtl__text t = {0};
  dtl__put_layout(&t, l);
  return dtl__text_deliver(fn, &t, buf, cap);
}

/* --- the block grid --------------------------------------------------------------------------------- */

/* A set of coordinates that hold the same box: equal on every sharding mesh dim, anything on the others. */
typedef struct {
  int64_t off[2], ext[2];
  size_t label; /* offset of "[0,*] ranks 0,1" in the label text */
} dtl__holders;

typedef struct {
  int64_t off, ext;
} dtl__range;

static int dtl__range_cmp(const void *a, const void *b) {
  const dtl__range *x = a, *y = b;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return (x->ext > y->ext) - (x->ext < y->ext);
}

/* Sorted distinct ranges; returns their number. */
static int dtl__unique_ranges(dtl__range *r, int n) {
  qsort(r, (size_t)n, sizeof *r, dtl__range_cmp);
  int k = 0;
  for (int i = 0; i < n; i++)
    if (k == 0 || dtl__range_cmp(&r[k - 1], &r[i]) != 0) r[k++] = r[i];
  return k;
}

static int dtl__range_index(const dtl__range *r, int n, int64_t off, int64_t ext) {
  dtl__range key = {off, ext};
  const dtl__range *hit = bsearch(&key, r, (size_t)n, sizeof *r, dtl__range_cmp);
  return hit ? (int)(hit - r) : -1;
}

static bool dtl__is_shard(const dtl_layout *l, int md) { return l->placements[md].kind == DTL_SHARD; }

/* "[0,*] ranks 0,1" / "[1,0] rank 2" / "[*,*] ranks 0-7": the coordinate (with * on the mesh dims that do
 * not shard) and every rank holding it, consecutive runs of three or more written a-b. */
static void dtl__put_holders(dtl__text *t, const dtl_layout *l, int rep) {
  const dtl_mesh *m = l->mesh;
  int c[DTL_MAX_MESH_DIMS];
  dtl_mesh_coord_of(m, rep, c);
  dtl__put(t, "[");
  int copies = 1;
  for (int md = 0; md < m->ndim; md++) {
    if (dtl__is_shard(l, md)) {
      dtl__put(t, md ? ",%d" : "%d", c[md]);
    } else {
      dtl__put(t, md ? ",*" : "*");
      copies *= m->shape[md];
    }
  }
  dtl__put(t, copies == 1 ? "] rank " : "] ranks ");
  /* Walk the non-sharding dims like an odometer: the ranks come out ascending (row-major order). */
  int run_lo = -1, run_hi = -1;
  bool first = true;
  for (int k = 0; k <= copies; k++) {
    int r = -1;
    if (k < copies) {
      dtl_mesh_rank_of(m, c, &r);
      for (int md = m->ndim - 1; md >= 0; md--) {
        if (dtl__is_shard(l, md)) continue;
        if (++c[md] < m->shape[md]) break;
        c[md] = 0;
      }
    }
    if (r >= 0 && r == run_hi + 1 && run_lo >= 0) {
      run_hi = r;
      continue;
    }
    if (run_lo >= 0) {
      if (run_hi - run_lo >= 2) dtl__put(t, "%s%d-%d", first ? "" : ",", run_lo, run_hi);
      else
        for (int q = run_lo; q <= run_hi; q++) dtl__put(t, "%s%d", first && q == run_lo ? "" : ",", q);
      first = false;
    }
    run_lo = run_hi = r;
  }
}

/* "nodes: ranks 0-3 on node 0, 4-7 on node 1 (mesh dim 0 crosses nodes)" when the mesh spans nodes (nothing
 * otherwise): runs of consecutive ranks on one node, in rank order. */
static void dtl__put_nodes(dtl__text *t, const dtl_mesh *m) {
  bool any = false;
  for (int md = 0; md < m->ndim; md++) any |= m->dim_inter[md];
  if (!any) return;
  dtl__put(t, "nodes: ranks ");
  for (int lo = 0, hi; lo < m->size; lo = hi + 1) {
    int node = dtl__mesh_node(m, lo);
    for (hi = lo; hi + 1 < m->size && dtl__mesh_node(m, hi + 1) == node;) hi++;
    if (hi > lo) dtl__put(t, "%s%d-%d on node %d", lo ? ", " : "", lo, hi, node);
    else dtl__put(t, "%s%d on node %d", lo ? ", " : "", lo, node);
  }
  int k = 0;
  for (int md = 0; md < m->ndim; md++) k += m->dim_inter[md];
  dtl__put(t, " (mesh dim%s", k > 1 ? "s" : "");
  for (int md = 0, i = 0; md < m->ndim; md++)
    if (m->dim_inter[md]) dtl__put(t, i++ ? ",%d" : " %d", md);
  dtl__put(t, " cross%s nodes)\n", k > 1 ? "" : "es");
}

/* "3:6" into tmp; returns its length. */
static size_t dtl__range_text(char tmp[48], int64_t off, int64_t ext) {
  return (size_t)snprintf(tmp, 48, "%lld:%lld", (long long)off, (long long)(off + ext));
}

static const char *dtl__op_noun(dtl_reduce_op op) {
  switch (op) {
    case DTL_SUM: return "sum";
    case DTL_PROD: return "product";
    case DTL_MAX: return "maximum";
    case DTL_MIN: return "minimum";
    default: return "average";
  }
}

/* Pads the cell text s (of length n) to width w unless it ends the line. */
static void dtl__put_cell(dtl__text *t, const char *s, size_t n, size_t w, bool last) {
  dtl__put(t, "%.*s", (int)n, s);
  if (!last) dtl__pad(t, w - n);
}

static dtl_status dtl__check_drawable(const char *fn, const dtl_layout *l) {
  DTL_CHECK_ARG(l != NULL, fn, "layout=NULL");
  if (l->ndim < 1 || l->ndim > 2)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "the layout's tensor is %d-d; only 1-d and 2-d tensors are drawn",
                         l->ndim);
  if (l->mesh->size > DTL__VISUALIZE_MAX_RANKS)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "the mesh has %d ranks; at most %d are drawn", l->mesh->size,
                         DTL__VISUALIZE_MAX_RANKS);
  return DTL_OK;
}

/* Renders the whole drawing into t. */
static dtl_status dtl__draw(const char *fn, const dtl_layout *l, dtl__text *t) {
  const dtl_mesh *m = l->mesh;
  const int nd = l->ndim;
  dtl__holders *h = dtl__malloc(sizeof *h * (size_t)m->size);
  dtl__range *rows = dtl__malloc(sizeof *rows * (size_t)m->size), *cols = dtl__malloc(sizeof *cols * (size_t)m->size);
  int *grid = NULL;
  size_t *w = NULL;
  dtl__text labels = {0};
  dtl_status st = DTL_OK;
  int nh = 0, nrows = 0, ncols = 0, nempty = 0;
  char tmp[48];
  if (!h || !rows || !cols) goto oom;

  /* One holder set per representative coordinate (zeros on the non-sharding mesh dims). */
  for (int r = 0; r < m->size; r++) {
    int c[DTL_MAX_MESH_DIMS];
    dtl_mesh_coord_of(m, r, c);
    bool rep = true;
    for (int md = 0; md < m->ndim; md++) rep = rep && (dtl__is_shard(l, md) || c[md] == 0);
    if (!rep) continue;
    dtl__holders *x = &h[nh++];
    int64_t shape[DTL_MAX_TENSOR_DIMS], off[DTL_MAX_TENSOR_DIMS];
    dtl__local_box(m, nd, l->shape, l->placements, c, shape, off);
    x->off[1] = 0;
    x->ext[1] = 1; /* a 1-d tensor draws as a single column */
    for (int d = 0; d < nd; d++) {
      x->off[d] = off[d];
      x->ext[d] = shape[d];
    }
    x->label = labels.len;
    dtl__put_holders(&labels, l, r);
    dtl__put(&labels, "%c", '\0'); /* labels are read back as C strings */
    if (x->ext[0] == 0 || x->ext[1] == 0) {
      nempty++;
      continue;
    }
    rows[nrows++] = (dtl__range){x->off[0], x->ext[0]};
    cols[ncols++] = (dtl__range){x->off[1], x->ext[1]};
  }
  if (labels.oom) goto oom;
  nrows = dtl__unique_ranges(rows, nrows);
  ncols = dtl__unique_ranges(cols, ncols);

  /* The non-empty boxes form a grid: the row splits come from the mesh dims sharding tensor dim 0, the
   * column splits from those sharding dim 1, and the two sets of mesh dims are disjoint. Check it rather
   * than trust it: a hole or a doubly held cell would be a bug in the chunking rule. */
  if ((size_t)nrows * (size_t)ncols != (size_t)(nh - nempty)) {
    st = dtl__error_fn(DTL_ERR_INTERNAL, fn, "%d non-empty blocks do not form a %dx%d grid", nh - nempty, nrows, ncols);
    goto done;
  }
  grid = dtl__malloc(sizeof *grid * ((size_t)nrows * (size_t)ncols + 1));
  w = dtl__calloc((size_t)ncols + 1, sizeof *w);
  if (!grid || !w) goto oom;
  for (int i = 0; i < nrows * ncols; i++) grid[i] = -1;
  for (int i = 0; i < nh; i++) {
    if (h[i].ext[0] == 0 || h[i].ext[1] == 0) continue;
    int cell = dtl__range_index(rows, nrows, h[i].off[0], h[i].ext[0]) * ncols +
               dtl__range_index(cols, ncols, h[i].off[1], h[i].ext[1]);
    if (grid[cell] != -1) {
      st = dtl__error_fn(DTL_ERR_INTERNAL, fn, "two holder sets share block %d of the grid", cell);
      goto done;
    }
    grid[cell] = i;
  }

  dtl__put_layout(t, l);
  dtl__put(t, "\ncells: mesh coordinate (* = every index of that mesh dim) and the ranks holding the block; "
              "ranges are start:end\n");
  dtl__put_nodes(t, m);
  for (int md = 0; md < m->ndim; md++)
    if (l->placements[md].kind == DTL_PARTIAL)
      dtl__put(t, "P(%s) over mesh dim %d: the ranks along it hold partial values; a block's value is their %s\n",
               dtl_reduce_op_name(l->placements[md].op), md, dtl__op_noun(l->placements[md].op));

  if (nrows * ncols == 0) {
    dtl__put(t, "no elements: every shard is empty\n");
  } else {
    /* Widths: the row header column, then one per block column (header or widest cell). */
    const char *corner = nd == 1 ? "index" : "rows\\cols";
    size_t w0 = strlen(corner);
    for (int i = 0; i < nrows; i++) {
      size_t n = dtl__range_text(tmp, rows[i].off, rows[i].ext);
      if (n > w0) w0 = n;
    }
    for (int j = 0; j < ncols; j++) {
      w[j] = nd == 1 ? strlen("holders") : dtl__range_text(tmp, cols[j].off, cols[j].ext);
      for (int i = 0; i < nrows; i++) {
        size_t n = strlen(labels.s + h[grid[i * ncols + j]].label);
        if (n > w[j]) w[j] = n;
      }
    }
    /* Header, rule, then one line per block row. */
    dtl__put_cell(t, corner, strlen(corner), w0, false);
    for (int j = 0; j < ncols; j++) {
      size_t n = nd == 1 ? (size_t)snprintf(tmp, sizeof tmp, "holders") : dtl__range_text(tmp, cols[j].off, cols[j].ext);
      dtl__put(t, " | ");
      dtl__put_cell(t, tmp, n, w[j], j == ncols - 1);
    }
    dtl__put(t, "\n");
    for (size_t k = 0; k < w0 + 1; k++) dtl__put(t, "-");
    for (int j = 0; j < ncols; j++) {
      dtl__put(t, "+");
      for (size_t k = 0; k < w[j] + (j < ncols - 1 ? 2 : 1); k++) dtl__put(t, "-");
    }
    dtl__put(t, "\n");
    for (int i = 0; i < nrows; i++) {
      dtl__put_cell(t, tmp, dtl__range_text(tmp, rows[i].off, rows[i].ext), w0, false);
      for (int j = 0; j < ncols; j++) {
        const char *s = labels.s + h[grid[i * ncols + j]].label;
        dtl__put(t, " | ");
        dtl__put_cell(t, s, strlen(s), w[j], j == ncols - 1);
      }
      dtl__put(t, "\n");
    }
  }
  if (nempty > 0) {
    dtl__put(t, "empty shards:\n");
    for (int i = 0; i < nh; i++) {
      if (h[i].ext[0] != 0 && h[i].ext[1] != 0) continue;
      dtl__put(t, "  %s at [", labels.s + h[i].label);
      for (int d = 0; d < nd; d++) {
        size_t n = dtl__range_text(tmp, h[i].off[d], h[i].ext[d]);
        dtl__put(t, "%s%.*s", d ? ", " : "", (int)n, tmp);
      }
      dtl__put(t, "]\n");
    }
  }
  if (!t->oom) goto done;
oom:
  st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
done:
  dtl__free(h);
  dtl__free(rows);
  dtl__free(cols);
  dtl__free(grid);
  dtl__free(w);
  dtl__free(labels.s);
  return st;
}

dtl_status dtl_layout_visualize(const dtl_layout *l, char *buf, size_t cap) {
  static const char fn[] = "dtl_layout_visualize";
  DTL_TRY(dtl__check_drawable(fn, l));
  DTL_CHECK_ARG(buf != NULL, fn, "buf=NULL");
  dtl__text t = {0};
  dtl_status st = dtl__draw(fn, l, &t);
  if (st != DTL_OK) {
    dtl__free(t.s);
    return st;
  }
  return dtl__text_deliver(fn, &t, buf, cap);
}

size_t dtl_layout_visualize_needed(const dtl_layout *l) {
  static const char fn[] = "dtl_layout_visualize_needed";
  if (dtl__check_drawable(fn, l) != DTL_OK) return 0;
  dtl__text t = {0};
  size_t need = dtl__draw(fn, l, &t) == DTL_OK ? t.len + 1 : 0;
  dtl__free(t.s);
  return need;
}

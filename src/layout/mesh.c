/* SPDX-License-Identifier: Apache-2.0 */
/* Device meshes: row-major coordinates over a communicator and one sub-communicator per mesh dim. Creation
 * is collective and agreed: every rank gets a mesh or every rank gets an error. */
#include <stdlib.h>
#include <string.h>
#include "comm/agree.h"
#include "layout/layout_internal.h"

static void dtl__mesh_coord_of_rank(const dtl_mesh *m, int rank, int *coord) {
  for (int d = m->ndim - 1; d >= 0; d--) {
    coord[d] = rank % m->shape[d];
    rank /= m->shape[d];
  }
}

/* "2x3x4", for messages; ndim is at most DTL_MAX_MESH_DIMS, so 64 bytes always suffice. */
static const char *dtl__mesh_shape_text(int ndim, const int *shape, char txt[64]) {
  int o = 0;
  for (int d = 0; d < ndim; d++) o += snprintf(txt + o, 64 - (size_t)o, d ? "x%d" : "%d", shape[d]);
  return txt;
}

/* A zeroed mesh and its memo, in one allocation (freed by dtl__free on the mesh). */
static dtl_mesh *dtl__mesh_alloc(void) {
  struct dtl__mesh_block {
    dtl_mesh mesh; /* first: the block's address is the mesh's */
    dtl__mesh_memo memo;
  } *b = dtl__calloc(1, sizeof *b);
  if (!b) return NULL;
  b->mesh.memo = &b->memo;
  return &b->mesh;
}

/* Checks ndim and shape; *prod gets the product of the shape. */
static dtl_status dtl__mesh_check_shape(const char *fn, int ndim, const int *shape, int64_t *prod) {
  DTL_CHECK_ARG(ndim >= 1 && ndim <= DTL_MAX_MESH_DIMS, fn, "ndim=%d (expected 1..%d)", ndim, DTL_MAX_MESH_DIMS);
  DTL_CHECK_ARG(shape != NULL, fn, "shape=NULL");
  int64_t p = 1;
  for (int d = 0; d < ndim; d++) {
    DTL_CHECK_ARG(shape[d] >= 1, fn, "shape[%d]=%d (expected >= 1)", d, shape[d]);
    if (p <= INT32_MAX) p *= shape[d]; /* stops growing once too large, so it cannot overflow int64 */
  }
  char txt[64];
  DTL_CHECK_ARG(p <= INT32_MAX, fn, "shape=%s has more than %d ranks", dtl__mesh_shape_text(ndim, shape, txt),
                INT32_MAX);
  *prod = p;
  return DTL_OK;
}

dtl_status dtl_mesh_create_abstract(int ndim, const int *shape, const int *coord, dtl_mesh **out) {
  static const char fn[] = "dtl_mesh_create_abstract";
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  int64_t prod;
  DTL_TRY(dtl__mesh_check_shape(fn, ndim, shape, &prod));
  for (int d = 0; coord && d < ndim; d++)
    DTL_CHECK_ARG(coord[d] >= 0 && coord[d] < shape[d], fn, "coord[%d]=%d (expected 0..%d)", d, coord[d], shape[d] - 1);
  dtl_mesh *m = dtl__mesh_alloc();
  if (!m) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  m->ndim = ndim;
  m->size = (int)prod;
  m->member = true; /* the rank at coord */
  for (int d = 0; d < ndim; d++) {
    m->shape[d] = shape[d];
    m->coord[d] = coord ? coord[d] : 0;
  }
  *out = m;
  return DTL_OK;
}

int dtl_mesh_is_abstract(const dtl_mesh *m) { return m && m->parent == NULL; }

/* Whether dim d of an abstract mesh with nodes of rpn consecutive ranks crosses nodes. The group along d through base
 * (coordinate 0 on d) is base + c * stride for c < shape[d], so it crosses when base's offset in its node plus the
 * group's span (shape[d] - 1) x stride reaches the next node. The bases are hi x period + lo (lo < stride), and
 * hi x period modulo rpn repeats within rpn values of hi: closed form, whatever the mesh's size. */
static bool dtl__mesh_abstract_crosses(const dtl_mesh *m, int d, int64_t rpn) {
  int64_t stride = dtl__mesh_stride(m, d);
  int64_t span = (int64_t)(m->shape[d] - 1) * stride, period = stride * m->shape[d], nhi = m->size / period;
  if (span == 0) return false;
  if (span >= rpn) return true;
  for (int64_t hi = 0; hi < nhi && hi < rpn; hi++) {
    int64_t x = hi * period % rpn;
    int64_t top = x + stride - 1 >= rpn ? rpn - 1 : x + stride - 1; /* the largest offset in a node of any lo */
    if (top + span >= rpn) return true;
  }
  return false;
}

/* Sets dim_inter from the nodes of the mesh's ranks: along dim d, each group is the ranks that share every other
 * coordinate; it crosses nodes when one of them sits on another node than the group's first. */
static void dtl__mesh_find_nodes(dtl_mesh *m) {
  int coord[DTL_MAX_MESH_DIMS];
  for (int d = 0; d < m->ndim; d++) {
    m->dim_inter[d] = false;
    if (!m->parent) {
      m->dim_inter[d] = m->ranks_per_node > 0 && dtl__mesh_abstract_crosses(m, d, m->ranks_per_node);
      continue;
    }
    if (dtl__comm_nnodes(m->parent) == 1) continue;
    int stride = dtl__mesh_stride(m, d);
    for (int r = 0; r < m->size && !m->dim_inter[d]; r++) {
      dtl__mesh_coord_of_rank(m, r, coord);
      if (coord[d] == 0) continue;
      m->dim_inter[d] = dtl__mesh_node(m, r) != dtl__mesh_node(m, r - coord[d] * stride);
    }
  }
}

dtl_status dtl_mesh_set_ranks_per_node(dtl_mesh *m, int ranks_per_node) {
  static const char fn[] = "dtl_mesh_set_ranks_per_node";
  DTL_CHECK_ARG(m != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(m->parent == NULL, fn, "the mesh has communicators (its nodes come from them; expected an abstract "
                "mesh)");
  DTL_CHECK_ARG(ranks_per_node >= 1, fn, "ranks_per_node=%d (expected >= 1)", ranks_per_node);
  m->ranks_per_node = ranks_per_node;
  dtl__mesh_find_nodes(m);
  return DTL_OK;
}

dtl_status dtl_mesh_dim_crosses_nodes(const dtl_mesh *m, int mesh_dim, int *out) {
  static const char fn[] = "dtl_mesh_dim_crosses_nodes";
  DTL_CHECK_ARG(m != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_CHECK_ARG(mesh_dim >= 0 && mesh_dim < m->ndim, fn, "mesh_dim=%d (expected 0..%d)", mesh_dim, m->ndim - 1);
  *out = m->dim_inter[mesh_dim];
  return DTL_OK;
}

dtl_status dtl_mesh_node_of(const dtl_mesh *m, int rank, int *node) {
  static const char fn[] = "dtl_mesh_node_of";
  DTL_CHECK_ARG(m != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(node != NULL, fn, "node=NULL");
  DTL_CHECK_ARG(rank >= 0 && rank < m->size, fn, "rank=%d (expected 0..%d)", rank, m->size - 1);
  *node = dtl__mesh_node(m, rank);
  return DTL_OK;
}

/* The mesh's sub-communicators: along dim d, the ranks sharing every other coordinate form one group; its color
 * is the mesh rank with coordinate d zeroed, its key the coordinate itself, so the sub-rank equals coord[d].
 * Each split agrees over the mesh communicator, so every member leaves the loop at the same dim. */
static dtl_status dtl__mesh_split_dims(const char *fn, dtl_mesh *m) {
  for (int d = 0; d < m->ndim; d++) {
    int color = 0;
    for (int e = 0; e < m->ndim; e++) color = color * m->shape[e] + (e == d ? 0 : m->coord[e]);
    dtl_status st = dtl_comm_split(m->comm, color, m->coord[d], &m->dim_comm[d]);
    if (st != DTL_OK) return dtl__error_prefix(st, "%s: splitting mesh dim %d", fn, d);
    m->dim_comm[d]->mesh_dim = d; /* named in timeout messages */
  }
  return DTL_OK;
}

/* This rank's checks of dtl_mesh_create_from_ranks' list: *index gets its place in it (-1: not in the mesh). With
 * ranks NULL the mesh is the whole communicator in its order. */
static dtl_status dtl__mesh_check_ranks(const char *fn, const dtl_comm *parent, int nranks, const int *ranks,
                                        int *index) {
  *index = parent->rank;
  if (!ranks) return DTL_OK;
  DTL_CHECK_ARG(nranks >= 1 && nranks <= parent->size, fn, "nranks=%d (expected 1..%d, the parent's size)", nranks,
                parent->size);
  unsigned char *seen = dtl__calloc((size_t)parent->size, 1);
  if (!seen) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  *index = -1;
  dtl_status st = DTL_OK;
  for (int i = 0; i < nranks && st == DTL_OK; i++) {
    if (ranks[i] < 0 || ranks[i] >= parent->size)
      st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "ranks[%d]=%d (expected 0..%d, a rank of the parent)", i, ranks[i],
                         parent->size - 1);
    else if (seen[ranks[i]]++)
      st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "ranks[%d]=%d appears twice (expected distinct ranks)", i, ranks[i]);
    else if (ranks[i] == parent->rank)
      *index = i;
  }
  dtl__free(seen);
  return st;
}

/* dtl_mesh_create (ranks NULL: the mesh is c in its order and c is its communicator) and
 * dtl_mesh_create_from_ranks (a mesh over ranks[0..nranks) of c with a communicator of its own). A creation:
 * every rank's verdict (and the arguments, which must be the same everywhere) goes through one agreement over c
 * before the first split, so that a rank with bad arguments fails every rank; the same all-reduce draws the mesh's
 * id. */
static dtl_status dtl__mesh_build(const char *fn, dtl_comm *c, bool from_ranks, int nranks, const int *ranks, int ndim,
                                  const int *shape, dtl_mesh **out) {
  DTL_CHECK_ARG(c != NULL, fn, from_ranks ? "parent=NULL" : "comm=NULL");
  if (c->aborted) return dtl__error_fn(DTL_ERR_COMM, fn, "the communicator was aborted");
  int64_t prod = 0;
  int index = -1;
  dtl_status local = out ? DTL_OK : dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "out=NULL");
  if (local == DTL_OK) local = dtl__mesh_check_shape(fn, ndim, shape, &prod);
  if (local == DTL_OK && from_ranks && !ranks) local = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "ranks=NULL");
  if (local == DTL_OK) local = dtl__mesh_check_ranks(fn, c, nranks, ranks, &index);
  int n = from_ranks ? nranks : c->size;
  if (local == DTL_OK && prod != n) {
    char txt[64];
    local = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "shape=%s has %lld ranks but the %s has %d",
                          dtl__mesh_shape_text(ndim, shape, txt), (long long)prod, ranks ? "rank list" : "communicator", n);
  }
  dtl_mesh *m = NULL;
  if (local == DTL_OK && !(m = dtl__mesh_alloc())) local = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  if (local == DTL_OK && ranks && !(m->ranks = dtl__malloc(sizeof(int) * (size_t)n))) {
    local = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  /* DTL_CHECK too: ranks that disagree about it would pair an agreement with another rank's collective. */
  uint64_t fp = dtl__fp_mix(0x6d657368ull + c->check, (uint64_t)ndim);
  for (int d = 0; local == DTL_OK && d < ndim; d++) fp = dtl__fp_mix(fp, (uint64_t)shape[d]);
  for (int i = 0; local == DTL_OK && ranks && i < nranks; i++) fp = dtl__fp_mix(fp, (uint64_t)ranks[i]);
  int64_t id = dtl__agree_nonce(m, c->rank);
  dtl_status st = dtl__agree_max(c, fn, fp, local, &id, 1);
  if (st != DTL_OK) {
    dtl_mesh_destroy(m);
    return st;
  }
  m->parent = c;
  m->id = (uint64_t)id;
  m->size = (int)prod;
  m->ndim = ndim;
  m->member = index >= 0;
  for (int d = 0; d < ndim; d++) m->shape[d] = shape[d];
  if (ranks) memcpy(m->ranks, ranks, sizeof(int) * (size_t)n);
  if (m->member) dtl__mesh_coord_of_rank(m, index, m->coord);
  dtl__mesh_find_nodes(m);
  if (!from_ranks) {
    m->comm = c;
    st = dtl__mesh_split_dims(fn, m);
  } else {
    /* The members' communicator, in mesh order; the others' split is dropped at once (no rank keeps one alone:
     * dtl_comm_split agrees over c). Then the dims, among the members only, and one more agreement over c so that
     * the ranks outside learn whether the members succeeded. */
    dtl_comm *mc = NULL;
    st = dtl_comm_split(c, m->member ? 0 : 1, m->member ? index : c->rank, &mc);
    if (st == DTL_OK && m->member) {
      m->comm = mc;
      m->owns_comm = true;
      st = dtl__mesh_split_dims(fn, m);
    } else {
      dtl_comm_destroy(mc);
    }
    st = dtl__agree(c, fn, 0, st);
  }
  if (st != DTL_OK) {
    dtl_mesh_destroy(m);
    return st;
  }
  *out = m;
  return DTL_OK;
}

dtl_status dtl_mesh_create(dtl_comm *c, int ndim, const int *shape, dtl_mesh **out) {
  return dtl__mesh_build("dtl_mesh_create", c, false, 0, NULL, ndim, shape, out);
}

dtl_status dtl_mesh_create_from_ranks(dtl_comm *parent, int nranks, const int *ranks, int ndim, const int *shape,
                                      dtl_mesh **out) {
  return dtl__mesh_build("dtl_mesh_create_from_ranks", parent, true, nranks, ranks, ndim, shape, out);
}

int dtl_mesh_is_member(const dtl_mesh *m) { return m && m->member; }
dtl_comm *dtl_mesh_parent(const dtl_mesh *m) { return m ? m->parent : NULL; }

dtl_status dtl_mesh_parent_rank(const dtl_mesh *m, int rank, int *parent_rank) {
  static const char fn[] = "dtl_mesh_parent_rank";
  DTL_CHECK_ARG(m != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(parent_rank != NULL, fn, "parent_rank=NULL");
  DTL_CHECK_ARG(m->parent != NULL, fn, "the mesh is abstract (it has no parent communicator)");
  DTL_CHECK_ARG(rank >= 0 && rank < m->size, fn, "rank=%d (expected 0..%d)", rank, m->size - 1);
  *parent_rank = dtl__mesh_parent_rank(m, rank);
  return DTL_OK;
}

int dtl_mesh_ndim(const dtl_mesh *m) { return m ? m->ndim : -1; }
int dtl_mesh_dim_size(const dtl_mesh *m, int d) { return (m && d >= 0 && d < m->ndim) ? m->shape[d] : -1; }
int dtl_mesh_size(const dtl_mesh *m) { return m ? m->size : -1; }
dtl_comm *dtl_mesh_comm(const dtl_mesh *m) { return m ? m->comm : NULL; }
/* NULL on abstract meshes. */
dtl_comm *dtl_mesh_dim_comm(const dtl_mesh *m, int d) { return (m && d >= 0 && d < m->ndim) ? m->dim_comm[d] : NULL; }

void dtl_mesh_coord(const dtl_mesh *m, int *coord) {
  if (!m || !coord) return;
  for (int d = 0; d < m->ndim; d++) coord[d] = m->member ? m->coord[d] : -1;
}

dtl_status dtl_mesh_rank_of(const dtl_mesh *m, const int *coord, int *rank) {
  static const char fn[] = "dtl_mesh_rank_of";
  DTL_CHECK_ARG(m != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(coord != NULL, fn, "coord=NULL");
  DTL_CHECK_ARG(rank != NULL, fn, "rank=NULL");
  int r = 0;
  for (int d = 0; d < m->ndim; d++) {
    DTL_CHECK_ARG(coord[d] >= 0 && coord[d] < m->shape[d], fn, "coord[%d]=%d (expected 0..%d)", d, coord[d], m->shape[d] - 1);
    r = r * m->shape[d] + coord[d];
  }
  *rank = r;
  return DTL_OK;
}

dtl_status dtl_mesh_coord_of(const dtl_mesh *m, int rank, int *coord) {
  static const char fn[] = "dtl_mesh_coord_of";
  DTL_CHECK_ARG(m != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(coord != NULL, fn, "coord=NULL");
  DTL_CHECK_ARG(rank >= 0 && rank < m->size, fn, "rank=%d (expected 0..%d)", rank, m->size - 1);
  dtl__mesh_coord_of_rank(m, rank, coord);
  return DTL_OK;
}

void dtl_mesh_destroy(dtl_mesh *m) {
  if (!m) return;
  if (m->memo->cache && m->memo->cache_free) m->memo->cache_free(m->memo->cache);
  for (int d = 0; d < m->ndim; d++) dtl_comm_destroy(m->dim_comm[d]);
  if (m->owns_comm) dtl_comm_destroy(m->comm);
  dtl__free(m->ranks);
  dtl__free(m);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Test support for redistribution: see test_redistribute_util.h. The oracle here is independent of the
 * library's box math except dtl_layout_local_box (itself tested against a brute-force chunker). */
#include "test_redistribute_util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dtl/mpi.h"
#include "redistribute/redistribute_internal.h"

tu_alloc_stats tu_allocs;
bool tu_plain_transport;

/* --- a transport that forwards to MPI and counts allocations ------------------------------------------- */
static dtl_comm *in_(dtl_comm *c) { return (dtl_comm *)c->impl; }
long tu_starts, tu_fail_at;
/* Every nonblocking start counts; the tu_fail_at-th fails without starting anything. */
#define W_START()                                                                                    \
  do {                                                                                               \
    if (++tu_starts == tu_fail_at) return dtl__error(DTL_ERR_COMM, "injected failure of start %ld", tu_starts); \
  } while (0)
static dtl_status w_broadcast(dtl_comm *c, void *b, size_t n, dtl_dtype t, int r) { return in_(c)->ops->broadcast(in_(c), b, n, t, r); }
static dtl_status w_scatter(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t, int root) {
  return in_(c)->ops->scatter(in_(c), s, r, n, t, root);
}
static dtl_status w_gather(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t, int root) {
  return in_(c)->ops->gather(in_(c), s, r, n, t, root);
}
static dtl_status w_reduce(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t, dtl_reduce_op op, int root) {
  return in_(c)->ops->reduce(in_(c), s, r, n, t, op, root);
}
static dtl_status w_all_gather(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t) {
  return in_(c)->ops->all_gather(in_(c), s, r, n, t);
}
static dtl_status w_all_gatherv(dtl_comm *c, const void *s, size_t n, void *r, const size_t *rc, dtl_dtype t) {
  return in_(c)->ops->all_gatherv(in_(c), s, n, r, rc, t);
}
static dtl_status w_all_reduce(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t, dtl_reduce_op op) {
  return in_(c)->ops->all_reduce(in_(c), s, r, n, t, op);
}
static dtl_status w_reduce_scatter(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t, dtl_reduce_op op) {
  return in_(c)->ops->reduce_scatter(in_(c), s, r, n, t, op);
}
static dtl_status w_reduce_scatterv(dtl_comm *c, const void *s, void *r, const size_t *rc, dtl_dtype t, dtl_reduce_op op) {
  return in_(c)->ops->reduce_scatterv(in_(c), s, r, rc, t, op);
}
static dtl_status w_all_to_all(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t) {
  return in_(c)->ops->all_to_all(in_(c), s, r, n, t);
}
static dtl_status w_all_to_allv(dtl_comm *c, const void *s, const size_t *sc, void *r, const size_t *rc, dtl_dtype t) {
  return in_(c)->ops->all_to_allv(in_(c), s, sc, r, rc, t);
}
static dtl_status w_all_to_allv_displs(dtl_comm *c, const void *s, const size_t *sc, const size_t *sd, void *r,
                                       const size_t *rc, const size_t *rd, dtl_dtype t) {
  return in_(c)->ops->all_to_allv_displs(in_(c), s, sc, sd, r, rc, rd, t);
}
static dtl_status w_exchange(dtl_comm *c, int ns, const int *sp, const void *const *sb, const size_t *sc, int nr,
                             const int *rp, void *const *rb, const size_t *rc, dtl_dtype t, dtl_request **req) {
  if (req) W_START();
  return in_(c)->ops->exchange(in_(c), ns, sp, sb, sc, nr, rp, rb, rc, t, req);
}
static dtl_status w_all_gather_async(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t, dtl_request **q) {
  W_START();
  return in_(c)->ops->all_gather_async(in_(c), s, r, n, t, q);
}
static dtl_status w_all_gatherv_async(dtl_comm *c, const void *s, size_t n, void *r, const size_t *rc, dtl_dtype t,
                                      dtl_request **q) {
  W_START();
  return in_(c)->ops->all_gatherv_async(in_(c), s, n, r, rc, t, q);
}
static dtl_status w_all_reduce_async(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t, dtl_reduce_op op,
                                     dtl_request **q) {
  W_START();
  return in_(c)->ops->all_reduce_async(in_(c), s, r, n, t, op, q);
}
static dtl_status w_reduce_scatter_async(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t, dtl_reduce_op op,
                                         dtl_request **q) {
  W_START();
  return in_(c)->ops->reduce_scatter_async(in_(c), s, r, n, t, op, q);
}
static dtl_status w_all_to_all_async(dtl_comm *c, const void *s, void *r, size_t n, dtl_dtype t, dtl_request **q) {
  W_START();
  return in_(c)->ops->all_to_all_async(in_(c), s, r, n, t, q);
}
static dtl_status w_all_to_allv_async(dtl_comm *c, const void *s, const size_t *sc, void *r, const size_t *rc,
                                      dtl_dtype t, dtl_request **q) {
  W_START();
  return in_(c)->ops->all_to_allv_async(in_(c), s, sc, r, rc, t, q);
}
static dtl_status w_reduce_scatterv_async(dtl_comm *c, const void *s, void *r, const size_t *rc, dtl_dtype t,
                                          dtl_reduce_op op, dtl_request **q) {
  W_START();
  return in_(c)->ops->reduce_scatterv_async(in_(c), s, r, rc, t, op, q);
}
static dtl_status w_all_to_allv_displs_async(dtl_comm *c, const void *s, const size_t *sc, const size_t *sd, void *r,
                                             const size_t *rc, const size_t *rd, dtl_dtype t, dtl_request **q) {
  W_START();
  return in_(c)->ops->all_to_allv_displs_async(in_(c), s, sc, sd, r, rc, rd, t, q);
}
static dtl_status w_send(dtl_comm *c, const void *b, size_t n, dtl_dtype t, int p) { return in_(c)->ops->send(in_(c), b, n, t, p); }
static dtl_status w_recv(dtl_comm *c, void *b, size_t n, dtl_dtype t, int p) { return in_(c)->ops->recv(in_(c), b, n, t, p); }
static dtl_status w_barrier(dtl_comm *c) { return in_(c)->ops->barrier(in_(c)); }
static dtl_status w_check(dtl_comm *c) { return in_(c)->ops->check(in_(c)); }
static dtl_status w_abort(dtl_comm *c) { return in_(c)->ops->abort(in_(c)); }
static void w_destroy(dtl_comm *c) { dtl_comm_destroy(in_(c)); }
static dtl_status w_sync(dtl_comm *c) { return in_(c)->ops->synchronize(in_(c)); }
/* Host memory whose allocations are counted. */
static dtl__mem_ops w_mem_ops;
static dtl_status w_mem_alloc(const dtl__mem *m, size_t bytes, void **out) {
  tu_allocs.calls++;
  tu_allocs.bytes_total += bytes;
  if (bytes > tu_allocs.bytes_max) tu_allocs.bytes_max = bytes;
  return dtl__host_mem_ops.alloc(m, bytes, out);
}
static dtl_status w_wrap(const dtl__comm_ops *ops, dtl_comm *inner, dtl_comm **out);
static dtl_status w_split(dtl_comm *c, int color, int key, dtl_comm **out) {
  dtl_comm *n;
  dtl_status st = in_(c)->ops->split(in_(c), color, key, &n);
  if (st != DTL_OK) return st;
  return w_wrap(c->ops, n, out);
}
static const dtl__comm_ops w_ops = {
    .name = "counting-mpi",
    .broadcast = w_broadcast, .scatter = w_scatter, .gather = w_gather, .reduce = w_reduce,
    .all_gather = w_all_gather, .all_gatherv = w_all_gatherv, .all_reduce = w_all_reduce,
    .reduce_scatter = w_reduce_scatter, .reduce_scatterv = w_reduce_scatterv, .all_to_all = w_all_to_all,
    .all_to_allv = w_all_to_allv, .send = w_send, .recv = w_recv, .barrier = w_barrier, .split = w_split,
    .all_to_allv_displs = w_all_to_allv_displs, .exchange = w_exchange,
    .all_gather_async = w_all_gather_async, .all_gatherv_async = w_all_gatherv_async,
    .all_reduce_async = w_all_reduce_async, .reduce_scatter_async = w_reduce_scatter_async,
    .all_to_all_async = w_all_to_all_async, .all_to_allv_async = w_all_to_allv_async,
    .reduce_scatterv_async = w_reduce_scatterv_async, .all_to_allv_displs_async = w_all_to_allv_displs_async,
    .check = w_check, .abort = w_abort, .destroy = w_destroy, .synchronize = w_sync,
};
/* The same transport without its optional entries, as a transport that lacks them (NCCL) looks. */
static dtl__comm_ops w_plain_ops;
static dtl_status w_wrap(const dtl__comm_ops *ops, dtl_comm *inner, dtl_comm **out) {
  w_mem_ops = dtl__host_mem_ops;
  w_mem_ops.name = "counting-host";
  w_mem_ops.alloc = w_mem_alloc;
  return dtl__comm_new(ops, (dtl__mem){&w_mem_ops, -1, NULL}, inner->rank, inner->size, inner, out);
}

/* --- meshes --------------------------------------------------------------------------------------------- */
const tu_mesh_spec tu_meshes[] = {
    {1, {1}, 1},    {1, {2}, 2},    {1, {3}, 3},    {1, {4}, 4},    {2, {2, 2}, 4},    {1, {5}, 5},       {1, {6}, 6},
    {2, {2, 3}, 6}, {2, {3, 2}, 6}, {1, {7}, 8},    {1, {8}, 8},    {2, {4, 2}, 8},    {3, {2, 2, 2}, 8},
};
const int tu_nmeshes = (int)(sizeof tu_meshes / sizeof *tu_meshes);

size_t tu_shard_bytes(const dtl_plan *p, const dtl_placement *pl) {
  int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
  dtl__local_box(p->src.mesh, p->src.ndim, p->src.shape, pl, p->src.mesh->coord, bs, bo);
  size_t n = dtl_dtype_size(p->src.dtype);
  for (int d = 0; d < p->src.ndim; d++) n *= (size_t)bs[d];
  return n;
}

int tu_mesh_open(int ndim, const int *shape, tu_mesh *m) {
  memset(m, 0, sizeof *m);
  m->mpi = MPI_COMM_NULL;
  m->ndim = ndim;
  int prod = 1, rank, size;
  for (int d = 0; d < ndim; d++) prod *= (m->shape[d] = shape[d]);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (prod > size) return -1;
  MPI_Comm_split(MPI_COMM_WORLD, rank < prod ? 0 : MPI_UNDEFINED, rank, &m->mpi);
  if (m->mpi == MPI_COMM_NULL) return 0;
  w_plain_ops = w_ops;
  w_plain_ops.name = "counting-mpi-plain";
  w_plain_ops.all_to_allv_displs = NULL;
  w_plain_ops.all_to_allv_displs_async = NULL;
  dtl_comm *inner;
  if (dtl_comm_from_mpi(m->mpi, &inner) != DTL_OK ||
      w_wrap(tu_plain_transport ? &w_plain_ops : &w_ops, inner, &m->comm) != DTL_OK ||
      dtl_mesh_create(m->comm, ndim, shape, &m->mesh) != DTL_OK) {
    fprintf(stderr, "tu_mesh_open: %s\n", dtl_last_error());
    return -1;
  }
  return 0;
}

bool tu_mesh_open_spec(int i, tu_mesh *m) {
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (tu_meshes[i].np != size) return false;
  if (tu_mesh_open(tu_meshes[i].ndim, tu_meshes[i].shape, m) != 0) {
    fprintf(stderr, "set-up: cannot open mesh %d\n", i);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return true;
}

void tu_mesh_close(tu_mesh *m) {
  dtl_mesh_destroy(m->mesh);
  dtl_comm_destroy(m->comm);
  if (m->mpi != MPI_COMM_NULL) MPI_Comm_free(&m->mpi);
  memset(m, 0, sizeof *m);
}

/* The parent of every mesh pair: MPI_COMM_WORLD through the counting transport, made once. */
static dtl_comm *tu_parent_comm;

dtl_comm *tu_parent(void) {
  if (!tu_parent_comm) {
    dtl_comm *inner;
    if (dtl_comm_from_mpi(MPI_COMM_WORLD, &inner) != DTL_OK || w_wrap(&w_ops, inner, &tu_parent_comm) != DTL_OK) {
      fprintf(stderr, "tu_parent: %s\n", dtl_last_error());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  return tu_parent_comm;
}

void tu_parent_close(void) {
  dtl_comm_destroy(tu_parent_comm);
  tu_parent_comm = NULL;
}

/* A mesh over the world ranks list[0..n) of tu_parent(); the checking communicator holds its members in mesh order. */
int tu_sub_open(int n, const int *list, int ndim, const int *shape, tu_mesh *m) {
  memset(m, 0, sizeof *m);
  m->mpi = MPI_COMM_NULL;
  m->ndim = ndim;
  for (int d = 0; d < ndim; d++) m->shape[d] = shape[d];
  int rank, index = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int i = 0; i < n; i++)
    if (list[i] == rank) index = i;
  MPI_Comm_split(MPI_COMM_WORLD, index >= 0 ? 0 : MPI_UNDEFINED, index, &m->mpi);
  if (dtl_mesh_create_from_ranks(tu_parent(), n, list, ndim, shape, &m->mesh) != DTL_OK) {
    fprintf(stderr, "tu_sub_open: %s\n", dtl_last_error());
    return -1;
  }
  return 0;
}

/* Factors n into ndim >= 1 dims, the first as large as divides it (ndim 1: n). */
static int tu_factor(int n, int want, int *shape) {
  if (want >= 2 && n >= 4 && n % 2 == 0) {
    shape[0] = 2;
    return 1 + tu_factor(n / 2, want - 1, shape + 1);
  }
  shape[0] = n;
  return 1;
}

bool tu_pair_open(int kind, int world, tu_pair *pr) {
  memset(pr, 0, sizeof *pr);
  int la[64], lb[64], na = 0, nb = 0;
  switch (kind) {
    case TU_DISJOINT: /* the first half, the rest in reverse */
      if (world < 2) return false;
      for (int i = 0; i < world / 2; i++) la[na++] = i;
      for (int i = world - 1; i >= world / 2; i--) lb[nb++] = i;
      break;
    case TU_OVERLAPPING: /* the first two thirds, the last two thirds */
      if (world < 3) return false;
      for (int i = 0; i < (2 * world + 2) / 3; i++) la[na++] = i;
      for (int i = world / 3; i < world; i++) lb[nb++] = i;
      break;
    case TU_RESHAPED: /* every rank, then every rank in reverse in another shape */
      for (int i = 0; i < world; i++) la[na++] = i, lb[nb++] = world - 1 - i;
      break;
    case TU_SUBSET: /* every rank, then every other rank */
      if (world < 2) return false;
      for (int i = 0; i < world; i++) la[na++] = i;
      for (int i = 1; i < world; i += 2) lb[nb++] = i;
      break;
  }
  int sa[3], sb[3];
  int da = tu_factor(na, kind == TU_RESHAPED ? 1 : 3, sa), db = tu_factor(nb, kind == TU_RESHAPED ? 3 : 2, sb);
  pr->kind = kind;
  if (tu_sub_open(na, la, da, sa, &pr->a) != 0 || tu_sub_open(nb, lb, db, sb, &pr->b) != 0) {
    fprintf(stderr, "set-up: cannot open mesh pair %d\n", kind);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return true;
}

void tu_pair_close(tu_pair *pr) {
  tu_mesh_close(&pr->a);
  tu_mesh_close(&pr->b);
}

const char *tu_pair_text(const tu_pair *pr) {
  static const char *kinds[] = {"disjoint", "overlapping", "reshaped", "subset"};
  static char buf[192];
  char a[64];
  snprintf(a, sizeof a, "%s", tu_mesh_text(&pr->a));
  snprintf(buf, sizeof buf, "%s meshes %s -> %s", kinds[pr->kind], a, tu_mesh_text(&pr->b));
  return buf;
}

const char *tu_mesh_text(const tu_mesh *m) {
  static char buf[64];
  int o = 0;
  for (int d = 0; d < m->ndim; d++) o += snprintf(buf + o, sizeof buf - (size_t)o, d ? "x%d" : "%d", m->shape[d]);
  return buf;
}

const char *tu_case_name(const char *rule, const tu_mesh *m) {
  static char buf[160];
  snprintf(buf, sizeof buf, "%s on mesh %s", rule, tu_mesh_text(m));
  return buf;
}

/* --- values --------------------------------------------------------------------------------------------- */
uint64_t tu_hash(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t tu_next(tu_rng *r) { return r->s = tu_hash(r->s, 0x1234567ull); }
int tu_uniform(tu_rng *r, int n) { return (int)(tu_next(r) % (uint64_t)n); }

double tu_get(const void *buf, dtl_dtype t, size_t i) {
  switch (t) {
    case DTL_FLOAT32: return ((const float *)buf)[i];
    case DTL_FLOAT64: return ((const double *)buf)[i];
    case DTL_FLOAT16: return dtl_f16_to_f32(((const uint16_t *)buf)[i]);
    case DTL_BFLOAT16: return dtl_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DTL_INT8: return ((const int8_t *)buf)[i];
    case DTL_UINT8: return ((const uint8_t *)buf)[i];
    case DTL_INT32: return ((const int32_t *)buf)[i];
    case DTL_INT64: return (double)((const int64_t *)buf)[i];
    case DTL_FLOAT8_E4M3: return dtl_f8e4m3_to_f32(((const uint8_t *)buf)[i]);
    case DTL_FLOAT8_E5M2: return dtl_f8e5m2_to_f32(((const uint8_t *)buf)[i]);
  }
  abort();
}
void tu_set(void *buf, dtl_dtype t, size_t i, double v) {
  switch (t) {
    case DTL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DTL_FLOAT64: ((double *)buf)[i] = v; break;
    case DTL_FLOAT16: ((uint16_t *)buf)[i] = dtl_f32_to_f16((float)v); break;
    case DTL_BFLOAT16: ((uint16_t *)buf)[i] = dtl_f32_to_bf16((float)v); break;
    case DTL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DTL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DTL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DTL_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DTL_FLOAT8_E4M3: ((uint8_t *)buf)[i] = dtl_f32_to_f8e4m3((float)v); break; /* rounds (17 -> 16) */
    case DTL_FLOAT8_E5M2: ((uint8_t *)buf)[i] = dtl_f32_to_f8e5m2((float)v); break;
  }
}

void tu_dense(uint64_t seed, dtl_dtype t, size_t count, void *out) {
  int shift = t == DTL_UINT8 ? 20 : 0; /* unsigned: 0..40 */
  for (size_t i = 0; i < count; i++) tu_set(out, t, i, (double)((int)(tu_hash(seed, i) % 41) - 20 + shift));
}

/* Partial mesh dims of l, their shared op and group size. */
static int tu_partial_dims(const dtl_layout *l, int *dims, dtl_reduce_op *op) {
  int n = 0;
  for (int md = 0; md < l->mesh->ndim; md++)
    if (l->placements[md].kind == DTL_PARTIAL) {
      dims[n++] = md;
      *op = l->placements[md].op;
    }
  return n;
}

/* u(k) for k >= 1 is noise in [-3, 3]; u(0) makes the p values sum to zero. */
static double tu_zero_sum(uint64_t seed, size_t gi, int md, int k, int p) {
  if (k > 0) return (double)((int)(tu_hash(tu_hash(seed, gi), (uint64_t)(md * 64 + k)) % 7) - 3);
  double s = 0;
  for (int j = 1; j < p; j++) s -= tu_zero_sum(seed, gi, md, j, p);
  return s;
}

/* The value that the rank at coord holds for global element gi whose dense value is v. */
static double tu_part(const dtl_layout *l, const int *pd, int npd, dtl_reduce_op op, const int *coord, uint64_t seed,
                      size_t gi, double v) {
  const dtl_mesh *m = l->mesh;
  bool holder = true;
  uint64_t ch = 0;
  for (int i = 0; i < npd; i++) {
    if (coord[pd[i]]) holder = false;
    ch = ch * 17 + (uint64_t)coord[pd[i]];
  }
  switch (op) {
    case DTL_SUM:
    case DTL_AVG: { /* the product over the partial dims of zero-sum noise sums to zero along any dim, so every
                       partial sum (sum: D on the holder only) or mean (avg: D everywhere) is exact */
      double n = 1;
      for (int i = 0; i < npd; i++) n *= tu_zero_sum(seed, gi, pd[i], coord[pd[i]], m->shape[pd[i]]);
      return (op == DTL_AVG || holder ? v : 0) + n;
    }
    case DTL_MAX: return holder ? v : v - (double)(tu_hash(tu_hash(seed, gi), ch) % 4);
    case DTL_MIN: return holder ? v : v + (double)(tu_hash(tu_hash(seed, gi), ch) % 4);
    case DTL_PROD: {
      if (!holder) return (tu_hash(tu_hash(seed, gi), ch) & 1) ? -1.0 : 1.0;
      /* The holder carries v times the product of every other part (each +-1, so its own inverse). */
      int k[DTL_MAX_MESH_DIMS] = {0}, total = 1;
      for (int i = 0; i < npd; i++) total *= m->shape[pd[i]];
      double s = 1;
      for (int idx = 1; idx < total; idx++) {
        int rem = idx;
        uint64_t h = 0;
        for (int i = npd - 1; i >= 0; i--) {
          k[i] = rem % m->shape[pd[i]];
          rem /= m->shape[pd[i]];
        }
        for (int i = 0; i < npd; i++) h = h * 17 + (uint64_t)k[i];
        s *= (tu_hash(tu_hash(seed, gi), h) & 1) ? -1.0 : 1.0;
      }
      return v * s;
    }
  }
  return v;
}

/* Row-major index of a box-local index inside the global tensor. */
static size_t tu_global_index(int nd, const int64_t *shape, const int64_t *off, const int64_t *idx) {
  size_t g = 0;
  for (int d = 0; d < nd; d++) g = g * (size_t)shape[d] + (size_t)(off[d] + idx[d]);
  return g;
}

static bool tu_next_index(int nd, const int64_t *ext, int64_t *idx) {
  for (int d = nd - 1; d >= 0; d--) {
    if (++idx[d] < ext[d]) return true;
    idx[d] = 0;
  }
  return false;
}

static void tu_fill_box(const dtl_layout *l, const int *coord, const void *dense, uint64_t seed, void *local) {
  int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS], idx[DTL_MAX_TENSOR_DIMS] = {0};
  dtl_layout_local_box(l, coord, bs, bo);
  size_t count = 1;
  for (int d = 0; d < l->ndim; d++) count *= (size_t)bs[d];
  int pd[DTL_MAX_MESH_DIMS];
  dtl_reduce_op op = DTL_SUM;
  int npd = tu_partial_dims(l, pd, &op);
  for (size_t i = 0; i < count; i++) {
    size_t gi = tu_global_index(l->ndim, l->shape, bo, idx);
    double v = tu_get(dense, l->dtype, gi);
    tu_set(local, l->dtype, i, npd ? tu_part(l, pd, npd, op, coord, seed, gi, v) : v);
    tu_next_index(l->ndim, bs, idx);
  }
}

void tu_make_local(const dtl_layout *l, const void *dense, uint64_t seed, void *local) {
  tu_fill_box(l, l->mesh->coord, dense, seed, local);
}

long tu_check_state(const tu_mesh *m, const dtl_layout *l, const void *local, const void *dense, const char *label) {
  int n, me;
  MPI_Comm_size(m->mpi, &n);
  MPI_Comm_rank(m->mpi, &me);
  size_t es = dtl_dtype_size(l->dtype);
  int *counts = malloc(sizeof(int) * (size_t)n * 2), *displs = counts + n;
  int mine = (int)(l->local_count * es);
  MPI_Allgather(&mine, 1, MPI_INT, counts, 1, MPI_INT, m->mpi);
  int total = 0;
  for (int r = 0; r < n; r++) {
    displs[r] = total;
    total += counts[r];
  }
  char *all = malloc((size_t)total + 1);
  MPI_Allgatherv(local, mine, MPI_BYTE, all, counts, displs, MPI_BYTE, m->mpi);
  int pd[DTL_MAX_MESH_DIMS];
  dtl_reduce_op op = DTL_SUM;
  int npd = tu_partial_dims(l, pd, &op);
  long wrong = 0;
  for (int r = 0; r < n; r++) {
    int coord[DTL_MAX_MESH_DIMS];
    dtl_mesh_coord_of(l->mesh, r, coord);
    bool base = true;
    for (int i = 0; i < npd; i++) base = base && coord[pd[i]] == 0;
    if (!base) continue;
    int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS], idx[DTL_MAX_TENSOR_DIMS] = {0};
    dtl_layout_local_box(l, coord, bs, bo);
    size_t count = 1;
    for (int d = 0; d < l->ndim; d++) count *= (size_t)bs[d];
    if (counts[r] != (int)(count * es)) {
      wrong += (long)count + 1;
      continue;
    }
    /* The ranks that differ from r only on the Partial dims hold the parts of the same box. */
    int group[64], ng = 0, gsz = 1;
    for (int i = 0; i < npd; i++) gsz *= l->mesh->shape[pd[i]];
    for (int g = 0; g < gsz && ng < 64; g++) {
      int c2[DTL_MAX_MESH_DIMS];
      memcpy(c2, coord, sizeof c2);
      for (int i = npd - 1, rem = g; i >= 0; i--) {
        c2[pd[i]] = rem % l->mesh->shape[pd[i]];
        rem /= l->mesh->shape[pd[i]];
      }
      dtl_mesh_rank_of(l->mesh, c2, &group[ng++]);
    }
    for (size_t i = 0; i < count; i++) {
      size_t gi = tu_global_index(l->ndim, l->shape, bo, idx);
      double want = tu_get(dense, l->dtype, gi), got = 0;
      for (int g = 0; g < ng; g++) {
        double v = tu_get(all + displs[group[g]], l->dtype, i);
        if (g == 0) got = v;
        else if (op == DTL_SUM || op == DTL_AVG) got += v;
        else if (op == DTL_PROD) got *= v;
        else if (op == DTL_MAX) got = v > got ? v : got;
        else got = v < got ? v : got;
      }
      if (npd && op == DTL_AVG) got /= ng;
      if (got != want) {
        if (label && me == 0 && wrong < 3)
          fprintf(stderr, "  %s: rank %d element %zu (global %zu): got %g, want %g\n", label, r, i, gi, got, want);
        wrong++;
      }
      tu_next_index(l->ndim, bs, idx);
    }
  }
  free(all);
  free(counts);
  return wrong;
}

/* --- layouts and routes --------------------------------------------------------------------------------- */
void tu_random_placements(tu_rng *r, int mesh_ndim, int nd, dtl_dtype t, dtl_placement *out) {
  static const dtl_reduce_op ops[] = {DTL_SUM, DTL_PROD, DTL_MAX, DTL_MIN, DTL_AVG};
  int nops = (t == DTL_FLOAT32 || t == DTL_FLOAT64) ? 5 : 4;
  dtl_reduce_op op = ops[tu_uniform(r, nops)];
  if (tu_uniform(r, 2)) op = DTL_SUM; /* sums are the common case */
  if (t == DTL_FLOAT8_E4M3 || t == DTL_FLOAT8_E5M2) op = op == DTL_MIN ? DTL_MIN : DTL_MAX; /* their only Partials */
  for (int md = 0; md < mesh_ndim; md++) {
    int k = tu_uniform(r, 8);
    if (k < 2 || (k < 7 && nd == 0)) out[md] = dtl_replicate();
    else if (k < 7) out[md] = dtl_shard(tu_uniform(r, nd));
    else out[md] = dtl_partial(op);
  }
}

const char *tu_placements_text(const dtl_placement *p, int n, char *buf, size_t cap) {
  size_t o = 0;
  buf[0] = 0;
  for (int i = 0; i < n && o < cap; i++) {
    const char *sep = i ? "," : "";
    if (p[i].kind == DTL_SHARD) o += (size_t)snprintf(buf + o, cap - o, "%sS(%d)", sep, p[i].dim);
    else if (p[i].kind == DTL_REPLICATE) o += (size_t)snprintf(buf + o, cap - o, "%sR", sep);
    else o += (size_t)snprintf(buf + o, cap - o, "%sP(%s)", sep, dtl_reduce_op_name(p[i].op));
  }
  return buf;
}

/* Placement codes: 0 = R, 1 = the source's Partial, 2 = the target's Partial (1 when both ops are equal),
 * 3 + d = S(d). A source Partial may only be reduced (to R or S); a target Partial is only made from R, and
 * with another op only once no source Partial is left (mixed pending ops would make the order of the
 * reductions matter). */
static int tu_cat(int code) { return code == 0 ? 0 : code < 3 ? 1 : 2; } /* R, P, S */

static bool tu_innermost(const int *codes, int nm, int md) {
  if (codes[md] < 3) return true;
  for (int d = md + 1; d < nm; d++)
    if (codes[d] == codes[md]) return false;
  return true;
}

/* Kind of the step from code x to code y on one mesh dim, or -1 when no single step does it. */
static int tu_kind(int x, int y) {
  int a = tu_cat(x), b = tu_cat(y);
  if (x == y) return -1;
  if (a == 2 && b == 0) return DTL__STEP_ALL_GATHER;
  if (a == 1 && b == 0) return DTL__STEP_ALL_REDUCE;
  if (a == 1 && b == 2) return DTL__STEP_REDUCE_SCATTER;
  if (a == 2 && b == 2) return DTL__STEP_ALL_TO_ALL;
  if (a == 0 && b == 2) return DTL__STEP_LOCAL_SLICE;
  if (a == 0 && b == 1) return DTL__STEP_LOCAL_PARTIAL;
  return -1;
}

int tu_route_plan(const dtl_layout *src, const dtl_layout *dst, uint64_t seed, dtl_plan *out) {
  int nm = src->mesh->ndim, base = 3 + src->ndim, nstates = 1;
  for (int i = 0; i < nm; i++) nstates *= base;
  dtl_reduce_op sop = DTL_SUM, top = DTL_SUM;
  bool sp = false, dp = false;
  for (int md = 0; md < nm; md++) {
    if (src->placements[md].kind == DTL_PARTIAL) sop = src->placements[md].op, sp = true;
    if (dst->placements[md].kind == DTL_PARTIAL) top = dst->placements[md].op, dp = true;
  }
  int pdst = (sp && dp && sop == top) ? 1 : 2;
  int s0 = 0, s1 = 0;
  for (int md = 0; md < nm; md++) {
    dtl_placement a = src->placements[md], b = dst->placements[md];
    s0 = s0 * base + (a.kind == DTL_REPLICATE ? 0 : a.kind == DTL_PARTIAL ? 1 : 3 + a.dim);
    s1 = s1 * base + (b.kind == DTL_REPLICATE ? 0 : b.kind == DTL_PARTIAL ? pdst : 3 + b.dim);
  }
  int *prev = malloc(sizeof(int) * (size_t)nstates * 2), *queue = prev + nstates;
  for (int s = 0; s < nstates; s++) prev[s] = -2;
  int head = 0, tail = 0;
  queue[tail++] = s0;
  prev[s0] = -1;
  tu_rng rng = {seed};
  while (head < tail && prev[s1] == -2) {
    int s = queue[head++], codes[DTL_MAX_MESH_DIMS];
    for (int md = nm - 1, rem = s; md >= 0; md--) {
      codes[md] = rem % base;
      rem /= base;
    }
    bool src_partial_left = false;
    for (int md = 0; md < nm; md++) src_partial_left |= codes[md] == 1;
    int moves[DTL_MAX_MESH_DIMS * (3 + DTL_MAX_TENSOR_DIMS)][2], nmoves = 0;
    for (int md = 0; md < nm; md++)
      for (int y = 0; y < base; y++) {
        int x = codes[md];
        if (tu_kind(x, y) < 0 || x == 2) continue;
        if (tu_cat(y) == 1 && (y != pdst || dst->placements[md].kind != DTL_PARTIAL || (pdst == 2 && src_partial_left)))
          continue;
        int c2[DTL_MAX_MESH_DIMS];
        memcpy(c2, codes, sizeof c2);
        c2[md] = y;
        if (!tu_innermost(codes, nm, md) || !tu_innermost(c2, nm, md)) continue;
        moves[nmoves][0] = md;
        moves[nmoves++][1] = y;
      }
    for (int i = nmoves - 1; i > 0; i--) { /* random order among equals */
      int j = tu_uniform(&rng, i + 1), t0 = moves[i][0], t1 = moves[i][1];
      moves[i][0] = moves[j][0];
      moves[i][1] = moves[j][1];
      moves[j][0] = t0;
      moves[j][1] = t1;
    }
    for (int i = 0; i < nmoves; i++) {
      int md = moves[i][0], y = moves[i][1], mul = 1;
      for (int d = nm - 1; d > md; d--) mul *= base;
      int t = s + (y - codes[md]) * mul;
      if (prev[t] != -2) continue;
      prev[t] = s;
      queue[tail++] = t;
    }
  }
  if (prev[s1] == -2) {
    free(prev);
    return -1;
  }
  int path[64], np = 0;
  for (int s = s1; s != -1 && np < 64; s = prev[s]) path[np++] = s;
  free(prev);
  memset(out, 0, sizeof *out);
  out->src = *src;
  out->dst = *dst;
  out->nsteps = np - 1;
  if (out->nsteps > DTL__MAX_PLAN_STEPS) return -1;
  for (int k = 0; k < out->nsteps; k++) {
    int a = path[np - 1 - k], b = path[np - 2 - k];
    dtl__plan_step *st = &out->steps[k];
    for (int md = nm - 1, ra = a, rb = b; md >= 0; md--) {
      int c[2] = {ra % base, rb % base};
      ra /= base;
      rb /= base;
      for (int w = 0; w < 2; w++) {
        dtl_placement p = c[w] == 0 ? dtl_replicate() : c[w] == 1 ? dtl_partial(sop) : c[w] == 2 ? dtl_partial(top)
                                                                                                  : dtl_shard(c[w] - 3);
        if (w) st->after[md] = p;
        else st->before[md] = p;
      }
      if (c[0] != c[1]) {
        st->mesh_dim = md;
        st->kind = (dtl__step_kind)tu_kind(c[0], c[1]);
      }
    }
  }
  return dtl__plan_compile("tu_route_plan", out) == DTL_OK ? 0 : -1;
}

uint64_t tu_checksum(const void *buf, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)buf)[i]) * 1099511628211ull;
  return h;
}

size_t tu_begin_pass(int pass, const size_t *chunks, int nchunks, int world_rank) {
  size_t chunk = chunks[pass % nchunks];
  tu_plain_transport = pass >= nchunks;
  dtl__executor_set_chunking(chunk, chunk ? 2 : 0);
  if (world_rank == 0 && pass)
    printf("-- with %s chunks%s\n", chunk == 48 ? "48-byte" : chunk ? "256-byte" : "default",
           tu_plain_transport ? ", plain transport" : "");
  return chunk;
}

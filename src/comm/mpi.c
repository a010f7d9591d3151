/* SPDX-License-Identifier: Apache-2.0 */
/* The OpenMPI transport: fills the backend vtable with MPI calls on a duplicated communicator set to
 * MPI_ERRORS_RETURN. f16/bf16 reductions use dtl's own MPI_Ops (accumulating each pair in f32); DTL_AVG is
 * an MPI_SUM followed by a local division. MPI (before 4.0 large counts) takes int counts, so a single call
 * moving more than INT_MAX elements is DTL_ERR_UNSUPPORTED. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "comm/backend.h"
#include "common/half.h"
#include "dtl/mpi.h"

typedef struct {
  MPI_Comm comm;
  MPI_Datatype half_type[2]; /* f16, bf16: 2-byte contiguous types so the user ops can tell them apart */
  MPI_Op half_op[2][4];      /* [f16|bf16][sum, prod, max, min] */
} dtl__mpi;

static dtl__mpi *dtl__mpi_of(const dtl_comm *c) { return (dtl__mpi *)c->impl; }

static dtl_status dtl__mpi_error(const char *fn, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return dtl__error(DTL_ERR_COMM, "%s: MPI error %d: %s", fn, rc, msg);
}
#define DTL__MPI_CALL(fn, call)                   \
  do {                                            \
    int rc_ = (call);                             \
    if (rc_ != MPI_SUCCESS) return dtl__mpi_error(fn, rc_); \
  } while (0)

/* --- f16 / bf16 reduction operators ------------------------------------------------------------------- */
typedef float (*dtl__to_f32)(uint16_t);
typedef uint16_t (*dtl__from_f32)(float);

static void dtl__half_apply(const uint16_t *in, uint16_t *inout, int n, int which, dtl__to_f32 to, dtl__from_f32 from) {
  for (int i = 0; i < n; i++) {
    float a = to(in[i]), b = to(inout[i]), r;
    switch (which) {
      case 0: r = a + b; break;
      case 1: r = a * b; break;
      case 2: r = a > b ? a : b; break;
      default: r = a < b ? a : b; break;
    }
    inout[i] = from(r);
  }
}
#define DTL__HALF_OP(name, which, to, from)                                      \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {        \
    (void)dt;                                                                  \
    dtl__half_apply((const uint16_t *)in, (uint16_t *)inout, *len, which, to, from); \
  }
DTL__HALF_OP(dtl__f16_sum, 0, dtl__f16_to_f32, dtl__f32_to_f16)
DTL__HALF_OP(dtl__f16_prod, 1, dtl__f16_to_f32, dtl__f32_to_f16)
DTL__HALF_OP(dtl__f16_max, 2, dtl__f16_to_f32, dtl__f32_to_f16)
DTL__HALF_OP(dtl__f16_min, 3, dtl__f16_to_f32, dtl__f32_to_f16)
DTL__HALF_OP(dtl__bf16_sum, 0, dtl__bf16_to_f32, dtl__f32_to_bf16)
DTL__HALF_OP(dtl__bf16_prod, 1, dtl__bf16_to_f32, dtl__f32_to_bf16)
DTL__HALF_OP(dtl__bf16_max, 2, dtl__bf16_to_f32, dtl__f32_to_bf16)
DTL__HALF_OP(dtl__bf16_min, 3, dtl__bf16_to_f32, dtl__f32_to_bf16)

static MPI_Datatype dtl__mpi_type(const dtl_comm *c, dtl_dtype t) {
  switch (t) {
    case DTL_FLOAT32: return MPI_FLOAT;
    case DTL_FLOAT64: return MPI_DOUBLE;
    case DTL_FLOAT16: return dtl__mpi_of(c)->half_type[0];
    case DTL_BFLOAT16: return dtl__mpi_of(c)->half_type[1];
    case DTL_INT8: return MPI_INT8_T;
    case DTL_UINT8: return MPI_UINT8_T;
    case DTL_INT32: return MPI_INT32_T;
    default: return MPI_INT64_T;
  }
}

static MPI_Op dtl__mpi_op(const dtl_comm *c, dtl_dtype t, dtl_reduce_op op) {
  int which = op == DTL_PROD ? 1 : op == DTL_MAX ? 2 : op == DTL_MIN ? 3 : 0; /* avg reduces as sum */
  if (t == DTL_FLOAT16 || t == DTL_BFLOAT16) return dtl__mpi_of(c)->half_op[t == DTL_BFLOAT16][which];
  return which == 0 ? MPI_SUM : which == 1 ? MPI_PROD : which == 2 ? MPI_MAX : MPI_MIN;
}

/* Divides count elements in place by n: the second half of DTL_AVG. Integers truncate toward zero. */
static void dtl__divide(void *buf, size_t count, dtl_dtype t, int n) {
  for (size_t i = 0; i < count; i++) {
    switch (t) {
      case DTL_FLOAT32: ((float *)buf)[i] /= (float)n; break;
      case DTL_FLOAT64: ((double *)buf)[i] /= (double)n; break;
      case DTL_FLOAT16: ((uint16_t *)buf)[i] = dtl__f32_to_f16(dtl__f16_to_f32(((uint16_t *)buf)[i]) / (float)n); break;
      case DTL_BFLOAT16: ((uint16_t *)buf)[i] = dtl__f32_to_bf16(dtl__bf16_to_f32(((uint16_t *)buf)[i]) / (float)n); break;
      case DTL_INT8: ((int8_t *)buf)[i] = (int8_t)(((int8_t *)buf)[i] / n); break;
      case DTL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / n); break;
      case DTL_INT32: ((int32_t *)buf)[i] /= n; break;
      case DTL_INT64: ((int64_t *)buf)[i] /= n; break;
    }
  }
}

static dtl_status dtl__int_count(const char *fn, size_t count, int *out) {
  if (count > (size_t)INT_MAX)
    return dtl__error(DTL_ERR_UNSUPPORTED, "%s: count=%zu exceeds INT_MAX, the largest count one MPI call takes", fn, count);
  *out = (int)count;
  return DTL_OK;
}

/* Converts per-rank counts to int counts and displacements (packed in rank order). */
static dtl_status dtl__int_counts(const char *fn, const dtl_comm *c, const size_t *counts, int **out_counts, int **out_displs) {
  int *ic = malloc(sizeof(int) * (size_t)c->size * 2);
  if (!ic) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  int *id = ic + c->size;
  size_t off = 0;
  for (int i = 0; i < c->size; i++) {
    if (counts[i] > (size_t)INT_MAX || off > (size_t)INT_MAX) {
      free(ic);
      return dtl__error(DTL_ERR_UNSUPPORTED, "%s: counts or displacements beyond INT_MAX elements at rank %d", fn, i);
    }
    ic[i] = (int)counts[i];
    id[i] = (int)off;
    off += counts[i];
  }
  *out_counts = ic;
  *out_displs = id;
  return DTL_OK;
}

/* --- collectives -------------------------------------------------------------------------------------- */
static dtl_status mpi_broadcast(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int root) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_broadcast", count, &n));
  DTL__MPI_CALL("dtl_broadcast", MPI_Bcast(buf, n, dtl__mpi_type(c, t), root, dtl__mpi_of(c)->comm));
  return DTL_OK;
}

static dtl_status mpi_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, int root) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_scatter", recv_count, &n));
  MPI_Datatype dt = dtl__mpi_type(c, t);
  size_t es = dtl_dtype_size(t);
  void *r = recv;
  if (c->rank == root && recv == (const char *)send + (size_t)root * recv_count * es) r = MPI_IN_PLACE;
  DTL__MPI_CALL("dtl_scatter", MPI_Scatter(send, n, dt, r, n, dt, root, dtl__mpi_of(c)->comm));
  return DTL_OK;
}

static dtl_status mpi_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t, int root) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_gather", send_count, &n));
  MPI_Datatype dt = dtl__mpi_type(c, t);
  size_t es = dtl_dtype_size(t);
  const void *s = send;
  if (c->rank == root && send == (const char *)recv + (size_t)root * send_count * es) s = MPI_IN_PLACE;
  DTL__MPI_CALL("dtl_gather", MPI_Gather(s, n, dt, recv, n, dt, root, dtl__mpi_of(c)->comm));
  return DTL_OK;
}

static dtl_status mpi_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op, int root) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_reduce", count, &n));
  const void *s = (c->rank == root && send == recv) ? MPI_IN_PLACE : send;
  DTL__MPI_CALL("dtl_reduce", MPI_Reduce(s, recv, n, dtl__mpi_type(c, t), dtl__mpi_op(c, t, op), root, dtl__mpi_of(c)->comm));
  if (op == DTL_AVG && c->rank == root) dtl__divide(recv, count, t, c->size);
  return DTL_OK;
}

static dtl_status mpi_all_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_all_gather", send_count, &n));
  MPI_Datatype dt = dtl__mpi_type(c, t);
  const void *s = send == (const char *)recv + (size_t)c->rank * send_count * dtl_dtype_size(t) ? MPI_IN_PLACE : send;
  DTL__MPI_CALL("dtl_all_gather", MPI_Allgather(s, n, dt, recv, n, dt, dtl__mpi_of(c)->comm));
  return DTL_OK;
}

static dtl_status mpi_all_gatherv(dtl_comm *c, const void *send, size_t send_count, void *recv, const size_t *recv_counts,
                                  dtl_dtype t) {
  int *ic, *id;
  DTL_TRY(dtl__int_counts("dtl_all_gatherv", c, recv_counts, &ic, &id));
  MPI_Datatype dt = dtl__mpi_type(c, t);
  const void *s = send == (const char *)recv + (size_t)id[c->rank] * dtl_dtype_size(t) ? MPI_IN_PLACE : send;
  int rc = MPI_Allgatherv(s, (int)send_count, dt, recv, ic, id, dt, dtl__mpi_of(c)->comm);
  free(ic);
  if (rc != MPI_SUCCESS) return dtl__mpi_error("dtl_all_gatherv", rc);
  return DTL_OK;
}

static dtl_status mpi_all_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_all_reduce", count, &n));
  const void *s = send == recv ? MPI_IN_PLACE : send;
  DTL__MPI_CALL("dtl_all_reduce", MPI_Allreduce(s, recv, n, dtl__mpi_type(c, t), dtl__mpi_op(c, t, op), dtl__mpi_of(c)->comm));
  if (op == DTL_AVG) dtl__divide(recv, count, t, c->size);
  return DTL_OK;
}

static dtl_status mpi_reduce_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                                     dtl_reduce_op op) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_reduce_scatter", recv_count, &n));
  DTL__MPI_CALL("dtl_reduce_scatter", MPI_Reduce_scatter_block(send, recv, n, dtl__mpi_type(c, t), dtl__mpi_op(c, t, op),
                                                               dtl__mpi_of(c)->comm));
  if (op == DTL_AVG) dtl__divide(recv, recv_count, t, c->size);
  return DTL_OK;
}

static dtl_status mpi_reduce_scatterv(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts, dtl_dtype t,
                                      dtl_reduce_op op) {
  int *ic, *id;
  DTL_TRY(dtl__int_counts("dtl_reduce_scatterv", c, recv_counts, &ic, &id));
  int rc = MPI_Reduce_scatter(send, recv, ic, dtl__mpi_type(c, t), dtl__mpi_op(c, t, op), dtl__mpi_of(c)->comm);
  free(ic);
  if (rc != MPI_SUCCESS) return dtl__mpi_error("dtl_reduce_scatterv", rc);
  if (op == DTL_AVG) dtl__divide(recv, recv_counts[c->rank], t, c->size);
  return DTL_OK;
}

static dtl_status mpi_all_to_all(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_all_to_all", count_per_peer, &n));
  MPI_Datatype dt = dtl__mpi_type(c, t);
  DTL__MPI_CALL("dtl_all_to_all", MPI_Alltoall(send, n, dt, recv, n, dt, dtl__mpi_of(c)->comm));
  return DTL_OK;
}

static dtl_status mpi_all_to_allv(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                  const size_t *recv_counts, dtl_dtype t) {
  int *sc, *sd, *rc_, *rd;
  DTL_TRY(dtl__int_counts("dtl_all_to_allv", c, send_counts, &sc, &sd));
  dtl_status st = dtl__int_counts("dtl_all_to_allv", c, recv_counts, &rc_, &rd);
  if (st != DTL_OK) {
    free(sc);
    return st;
  }
  MPI_Datatype dt = dtl__mpi_type(c, t);
  int rc = MPI_Alltoallv(send, sc, sd, dt, recv, rc_, rd, dt, dtl__mpi_of(c)->comm);
  free(sc);
  free(rc_);
  if (rc != MPI_SUCCESS) return dtl__mpi_error("dtl_all_to_allv", rc);
  return DTL_OK;
}

static dtl_status mpi_send(dtl_comm *c, const void *buf, size_t count, dtl_dtype t, int peer) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_send", count, &n));
  DTL__MPI_CALL("dtl_send", MPI_Send(buf, n, dtl__mpi_type(c, t), peer, 0, dtl__mpi_of(c)->comm));
  return DTL_OK;
}

static dtl_status mpi_recv(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int peer) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_recv", count, &n));
  MPI_Status status;
  DTL__MPI_CALL("dtl_recv", MPI_Recv(buf, n, dtl__mpi_type(c, t), peer, 0, dtl__mpi_of(c)->comm, &status));
  int got = 0;
  MPI_Get_count(&status, dtl__mpi_type(c, t), &got);
  if (got != n)
    return dtl__error(DTL_ERR_MISMATCH, "dtl_recv: count=%zu but peer %d sent %d elements", count, peer, got);
  return DTL_OK;
}

static dtl_status mpi_barrier(dtl_comm *c) {
  DTL__MPI_CALL("dtl_barrier", MPI_Barrier(dtl__mpi_of(c)->comm));
  return DTL_OK;
}

/* --- lifetime ----------------------------------------------------------------------------------------- */
static void dtl__mpi_free(dtl__mpi *m) {
  for (int k = 0; k < 2; k++) {
    for (int j = 0; j < 4; j++)
      if (m->half_op[k][j] != MPI_OP_NULL) MPI_Op_free(&m->half_op[k][j]);
    if (m->half_type[k] != MPI_DATATYPE_NULL) MPI_Type_free(&m->half_type[k]);
  }
  if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  free(m);
}

static dtl_status dtl__comm_wrap_mpi(MPI_Comm dup, dtl_comm **out);

static dtl_status mpi_split(dtl_comm *c, int color, int key, dtl_comm **out) {
  MPI_Comm nc;
  DTL__MPI_CALL("dtl_comm_split", MPI_Comm_split(dtl__mpi_of(c)->comm, color, key, &nc));
  return dtl__comm_wrap_mpi(nc, out);
}

static dtl_status mpi_check(dtl_comm *c) {
  (void)c;
  return DTL_OK;
}

static dtl_status mpi_abort(dtl_comm *c) {
  (void)c; /* MPI has no communicator-local abort; later calls fail through c->aborted. */
  return DTL_OK;
}

static void mpi_destroy(dtl_comm *c) { dtl__mpi_free(dtl__mpi_of(c)); }

static dtl_status mpi_mem_alloc(dtl_comm *c, size_t bytes, void **out) {
  (void)c;
  void *p = malloc(bytes ? bytes : 1);
  if (!p) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl: cannot allocate %zu bytes of host memory", bytes);
  *out = p;
  return DTL_OK;
}
static void mpi_mem_free(dtl_comm *c, void *p) { (void)c; free(p); }
static dtl_status mpi_mem_copy(dtl_comm *c, void *dst, const void *src, size_t bytes) {
  (void)c;
  if (bytes) memmove(dst, src, bytes);
  return DTL_OK;
}
static dtl_status mpi_mem_set(dtl_comm *c, void *dst, int byte, size_t bytes) {
  (void)c;
  if (bytes) memset(dst, byte, bytes);
  return DTL_OK;
}
static dtl_status mpi_fill_identity(dtl_comm *c, void *dst, size_t count, dtl_dtype t, dtl_reduce_op op) {
  (void)c;
  return dtl__host_fill_identity(dst, count, t, op);
}
static dtl_status mpi_copy_box(dtl_comm *c, const void *src, void *dst, const dtl__box_copy *box) {
  (void)c;
  return dtl__host_copy_box(src, dst, box);
}
static dtl_status mpi_synchronize(dtl_comm *c) {
  (void)c;
  return DTL_OK;
}

static const dtl__comm_ops dtl__mpi_ops = {
    .name = "mpi", .memory = DTL_MEMORY_HOST,
    .broadcast = mpi_broadcast, .scatter = mpi_scatter, .gather = mpi_gather, .reduce = mpi_reduce,
    .all_gather = mpi_all_gather, .all_gatherv = mpi_all_gatherv, .all_reduce = mpi_all_reduce,
    .reduce_scatter = mpi_reduce_scatter, .reduce_scatterv = mpi_reduce_scatterv, .all_to_all = mpi_all_to_all,
    .all_to_allv = mpi_all_to_allv, .send = mpi_send, .recv = mpi_recv, .barrier = mpi_barrier,
    .split = mpi_split, .check = mpi_check, .abort = mpi_abort, .destroy = mpi_destroy,
    .mem_alloc = mpi_mem_alloc, .mem_free = mpi_mem_free, .mem_copy = mpi_mem_copy, .mem_set = mpi_mem_set,
    .mem_fill_identity = mpi_fill_identity, .copy_box = mpi_copy_box, .synchronize = mpi_synchronize,
};

/* Takes ownership of dup (an MPI communicator dtl alone uses). */
static dtl_status dtl__comm_wrap_mpi(MPI_Comm dup, dtl_comm **out) {
  static MPI_User_function *const fns[2][4] = {{dtl__f16_sum, dtl__f16_prod, dtl__f16_max, dtl__f16_min},
                                               {dtl__bf16_sum, dtl__bf16_prod, dtl__bf16_max, dtl__bf16_min}};
  dtl__mpi *m = calloc(1, sizeof *m);
  if (!m) {
    MPI_Comm_free(&dup);
    return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm_from_mpi: out of host memory");
  }
  m->comm = dup;
  for (int k = 0; k < 2; k++) {
    m->half_type[k] = MPI_DATATYPE_NULL;
    for (int j = 0; j < 4; j++) m->half_op[k][j] = MPI_OP_NULL;
  }
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  int rc = MPI_SUCCESS;
  for (int k = 0; k < 2 && rc == MPI_SUCCESS; k++) {
    rc = MPI_Type_contiguous(2, MPI_BYTE, &m->half_type[k]);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&m->half_type[k]);
    for (int j = 0; j < 4 && rc == MPI_SUCCESS; j++) rc = MPI_Op_create(fns[k][j], 1, &m->half_op[k][j]);
  }
  int rank = 0, size = 0;
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(dup, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(dup, &size);
  if (rc != MPI_SUCCESS) {
    dtl__mpi_free(m);
    return dtl__mpi_error("dtl_comm_from_mpi", rc);
  }
  dtl_status st = dtl__comm_new(&dtl__mpi_ops, rank, size, m, out);
  if (st != DTL_OK) dtl__mpi_free(m);
  return st;
}

dtl_status dtl_comm_from_mpi(MPI_Comm comm, dtl_comm **out) {
  DTL_CHECK_ARG(out != NULL, "dtl_comm_from_mpi", "out=NULL");
  DTL_CHECK_ARG(comm != MPI_COMM_NULL, "dtl_comm_from_mpi", "comm=MPI_COMM_NULL");
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "dtl_comm_from_mpi: MPI is not initialized (call MPI_Init first)");
  MPI_Comm dup;
  DTL__MPI_CALL("dtl_comm_from_mpi", MPI_Comm_dup(comm, &dup));
  return dtl__comm_wrap_mpi(dup, out);
}

MPI_Comm dtl_comm_mpi_handle(const dtl_comm *c) {
  return (c && c->ops == &dtl__mpi_ops) ? dtl__mpi_of(c)->comm : MPI_COMM_NULL;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The MPI transport (OpenMPI, MPICH): fills the backend vtable with MPI calls on a duplicated communicator set
 * to MPI_ERRORS_RETURN. f16/bf16 travel as 16-bit words and reduce with dtl's own MPI_Ops (each pair combined
 * in f32); DTL_AVG is an MPI_SUM followed by a local division. MPI (before 4.0 large counts) takes int counts,
 * so one call with a count or displacement beyond INT_MAX elements is DTL_ERR_UNSUPPORTED. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "comm/backend.h"
#include "common/half.h"
#include "dtl/mpi.h"

typedef struct dtl__mpi_request dtl__mpi_request;

/* A nonblocking call's request is kept for reuse once waited for, at most this many per communicator, so
 * that a steady stream of nonblocking calls allocates nothing. */
#define DTL__MPI_POOL 8

typedef struct {
  MPI_Comm comm;
  MPI_Op half_op[2][4]; /* [f16|bf16][sum, prod, max, min], applied to MPI_UINT16_T */
  /* The int counts and displacements of a blocking v-collective (4 x size: two arrays of each), sized once:
   * calls on one communicator are never concurrent, and a blocking call is done with them when it returns. */
  int *counts;
  MPI_Request *reqs; /* 2 x size: the messages of a blocking exchange */
  dtl__mpi_request *pool; /* waited-for requests, each with its own 4 x size ints, linked through next */
  int pooled;
} dtl__mpi;

static dtl__mpi *dtl__mpi_of(const dtl_comm *c) { return (dtl__mpi *)c->impl; }

static dtl_status dtl__mpi_error(const char *fn, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "unknown error");
  return dtl__error(DTL_ERR_COMM, "%s: MPI error %d: %s", fn, rc, msg);
}
#define DTL__MPI_CALL(fn, call)                             \
  do {                                                      \
    int rc_ = (call);                                       \
    if (rc_ != MPI_SUCCESS) return dtl__mpi_error(fn, rc_); \
  } while (0)

/* --- f16 / bf16 reduction operators: each pair is combined in f32 and rounded back ---------------------- */
#define DTL__HALF_OP(name, to, from, expr)                                   \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {     \
    (void)dt;                                                               \
    const uint16_t *x = in;                                                 \
    uint16_t *y = inout;                                                    \
    for (int i = 0; i < *len; i++) {                                        \
      float a = to(x[i]), b = to(y[i]);                                     \
      y[i] = from(expr);                                                    \
    }                                                                       \
  }
#define DTL__HALF_OPS(prefix, to, from)                      \
  DTL__HALF_OP(prefix##_sum, to, from, a + b)                \
  DTL__HALF_OP(prefix##_prod, to, from, a * b)               \
  DTL__HALF_OP(prefix##_max, to, from, a > b ? a : b)        \
  DTL__HALF_OP(prefix##_min, to, from, a < b ? a : b)
DTL__HALF_OPS(dtl__f16, dtl__f16_to_f32, dtl__f32_to_f16)
DTL__HALF_OPS(dtl__bf16, dtl__bf16_to_f32, dtl__f32_to_bf16)

static MPI_Datatype dtl__mpi_type(dtl_dtype t) {
  switch (t) {
    case DTL_FLOAT32: return MPI_FLOAT;
    case DTL_FLOAT64: return MPI_DOUBLE;
    case DTL_FLOAT16: /* fall through: moved as 16-bit words, reduced by dtl's own ops */
    case DTL_BFLOAT16: return MPI_UINT16_T;
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

/* --- one call, blocking or not ------------------------------------------------------------------------------
 * Every collective fills a dtl__mpi_call: the MPI call is MPI_Xxx (blocking) or MPI_Ixxx (nonblocking, its
 * request kept), and what must happen after it completes is recorded in the call so that blocking and
 * nonblocking forms share it: DTL_AVG's division, and the in-place reduce-scatter's move of the result from
 * the buffer's start (where MPI_IN_PLACE leaves it) to this rank's block. */
typedef struct {
  const char *fn;
  bool nonblocking;
  MPI_Request req;
  int *counts; /* int counts and displacements that MPI reads until completion (NULL: the communicator's) */
  void *avg_buf;
  size_t avg_count;
  dtl_dtype avg_type;
  int avg_divisor;
  void *move_dst;
  const void *move_src;
  size_t move_bytes;
} dtl__mpi_call;

static void dtl__mpi_after(dtl__mpi_call *k) {
  if (k->move_bytes) memmove(k->move_dst, k->move_src, k->move_bytes);
  if (k->avg_buf) dtl__divide(k->avg_buf, k->avg_count, k->avg_type, k->avg_divisor);
}

static void dtl__mpi_avg_after(dtl__mpi_call *k, dtl_reduce_op op, void *buf, size_t count, dtl_dtype t, int n) {
  if (op != DTL_AVG || count == 0) return;
  k->avg_buf = buf;
  k->avg_count = count;
  k->avg_type = t;
  k->avg_divisor = n;
}

/* Concludes the MPI call that returned rc: a blocking call is finished here, a nonblocking one in wait. */
static dtl_status dtl__mpi_issued(dtl__mpi_call *k, int rc) {
  if (rc != MPI_SUCCESS) return dtl__mpi_error(k->fn, rc);
  if (!k->nonblocking) dtl__mpi_after(k);
  return DTL_OK;
}

static dtl_status dtl__int_count(const char *fn, size_t count, int *out) {
  if (count > (size_t)INT_MAX)
    return dtl__error(DTL_ERR_UNSUPPORTED, "%s: count=%zu exceeds INT_MAX, the largest count one MPI call takes", fn, count);
  *out = (int)count;
  return DTL_OK;
}

/* Converts per-rank counts to int counts and displacements (displs, named displs_arg, or packed in rank order
 * when NULL), into k->counts (n counts then n displacements; with a second array, 4n ints): a nonblocking
 * call's own arrays, or the communicator's for a blocking one. */
static dtl_status dtl__int_counts(dtl__mpi_call *k, const dtl_comm *c, const char *arg, const size_t *counts,
                                  const char *displs_arg, const size_t *displs, int slot, int **out_counts,
                                  int **out_displs) {
  size_t n = (size_t)c->size;
  if (!k->counts) k->counts = dtl__mpi_of(c)->counts;
  int *ic = k->counts + (size_t)slot * 2 * n, *id = ic + n;
  size_t off = 0;
  for (int i = 0; i < c->size; i++) {
    if (displs) off = displs[i];
    if (counts[i] > (size_t)INT_MAX || off > (size_t)INT_MAX) {
      if (displs && counts[i] <= (size_t)INT_MAX)
        return dtl__error(DTL_ERR_UNSUPPORTED, "%s: %s[%d]=%zu exceeds INT_MAX, the largest displacement one MPI call "
                          "takes", k->fn, displs_arg, i, off);
      return dtl__error(DTL_ERR_UNSUPPORTED, "%s: %s[%d]=%zu at element offset %zu exceeds INT_MAX, the largest count "
                        "or displacement one MPI call takes", k->fn, arg, i, counts[i], off);
    }
    ic[i] = (int)counts[i];
    id[i] = (int)off;
    off += counts[i];
  }
  *out_counts = ic;
  *out_displs = id;
  return DTL_OK;
}

#define DTL__ISSUE(k, blocking_call, nonblocking_call) \
  dtl__mpi_issued((k), (k)->nonblocking ? (nonblocking_call) : (blocking_call))

/* --- collectives -------------------------------------------------------------------------------------- */
static dtl_status mpi_broadcast(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int root) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_broadcast", count, &n));
  DTL__MPI_CALL("dtl_broadcast", MPI_Bcast(buf, n, dtl__mpi_type(t), root, dtl__mpi_of(c)->comm));
  return DTL_OK;
}

static dtl_status mpi_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, int root) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_scatter", recv_count, &n));
  MPI_Datatype dt = dtl__mpi_type(t);
  void *r = c->rank == root && dtl__ptr_at(recv, send, (size_t)root * recv_count * dtl_dtype_size(t)) ? MPI_IN_PLACE : recv;
  DTL__MPI_CALL("dtl_scatter", MPI_Scatter(send, n, dt, r, n, dt, root, dtl__mpi_of(c)->comm));
  return DTL_OK;
}

static dtl_status mpi_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t, int root) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_gather", send_count, &n));
  MPI_Datatype dt = dtl__mpi_type(t);
  const void *s =
      c->rank == root && dtl__ptr_at(send, recv, (size_t)root * send_count * dtl_dtype_size(t)) ? MPI_IN_PLACE : send;
  DTL__MPI_CALL("dtl_gather", MPI_Gather(s, n, dt, recv, n, dt, root, dtl__mpi_of(c)->comm));
  return DTL_OK;
}

static dtl_status mpi_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op, int root) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_reduce", count, &n));
  const void *s = (c->rank == root && send == recv) ? MPI_IN_PLACE : send;
  void *copy = NULL;
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION < 40102300
  /* MPICH before 4.1.2 reads MPI_IN_PLACE as an address at a root other than 0 once the message is over
   * 2 KiB and crashes (pmodels/mpich#6540, seen with Debian's 4.0.2): reduce from a copy there instead. */
  if (s == MPI_IN_PLACE && root != 0 && count > 0) {
    size_t bytes = count * dtl_dtype_size(t);
    if (!(copy = dtl__malloc(bytes))) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_reduce: out of host memory");
    s = memcpy(copy, recv, bytes);
  }
#endif
  dtl__mpi_call k = {.fn = "dtl_reduce"};
  if (c->rank == root) dtl__mpi_avg_after(&k, op, recv, count, t, c->size);
  dtl_status st =
      dtl__mpi_issued(&k, MPI_Reduce(s, recv, n, dtl__mpi_type(t), dtl__mpi_op(c, t, op), root, dtl__mpi_of(c)->comm));
  dtl__free(copy);
  return st;
}

static dtl_status mpi_all_gather_call(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t,
                                      dtl__mpi_call *k) {
  int n = 0;
  DTL_TRY(dtl__int_count(k->fn, send_count, &n));
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  const void *s = dtl__ptr_at(send, recv, (size_t)c->rank * send_count * dtl_dtype_size(t)) ? MPI_IN_PLACE : send;
  return DTL__ISSUE(k, MPI_Allgather(s, n, dt, recv, n, dt, comm), MPI_Iallgather(s, n, dt, recv, n, dt, comm, &k->req));
}

static dtl_status mpi_all_gatherv_call(dtl_comm *c, const void *send, size_t send_count, void *recv,
                                       const size_t *recv_counts, dtl_dtype t, dtl__mpi_call *k) {
  int *ic, *id;
  DTL_TRY(dtl__int_counts(k, c, "recv_counts", recv_counts, NULL, NULL, 0, &ic, &id));
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  const void *s = dtl__ptr_at(send, recv, (size_t)id[c->rank] * dtl_dtype_size(t)) ? MPI_IN_PLACE : send;
  int n = (int)send_count; /* == recv_counts[rank], checked above */
  return DTL__ISSUE(k, MPI_Allgatherv(s, n, dt, recv, ic, id, dt, comm),
                    MPI_Iallgatherv(s, n, dt, recv, ic, id, dt, comm, &k->req));
}

static dtl_status mpi_all_reduce_call(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t,
                                      dtl_reduce_op op, dtl__mpi_call *k) {
  int n = 0;
  DTL_TRY(dtl__int_count(k->fn, count, &n));
  const void *s = send == recv ? MPI_IN_PLACE : send;
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Op mop = dtl__mpi_op(c, t, op);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  dtl__mpi_avg_after(k, op, recv, count, t, c->size);
  return DTL__ISSUE(k, MPI_Allreduce(s, recv, n, dt, mop, comm), MPI_Iallreduce(s, recv, n, dt, mop, comm, &k->req));
}

/* The buffers of a reduce-scatter whose own block starts offset bytes into send. dtl's in-place form
 * (recv == send + offset) becomes MPI_IN_PLACE, where MPI reads the input from and leaves the result at the
 * start of one buffer (send); the result then moves to recv once the call completes. */
static void dtl__mpi_reduce_scatter_buffers(dtl__mpi_call *k, const void *send, void *recv, size_t offset,
                                           size_t block_bytes, const void **s, void **r) {
  *s = send;
  *r = recv;
  if (!dtl__ptr_at(recv, send, offset)) return;
  *s = MPI_IN_PLACE;
  *r = (char *)recv - offset;
  k->move_dst = recv;
  k->move_src = *r;
  k->move_bytes = offset ? block_bytes : 0;
}

static dtl_status mpi_reduce_scatter_call(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                                          dtl_reduce_op op, dtl__mpi_call *k) {
  int n = 0;
  DTL_TRY(dtl__int_count(k->fn, recv_count, &n));
  size_t block = recv_count * dtl_dtype_size(t);
  const void *s;
  void *r;
  dtl__mpi_reduce_scatter_buffers(k, send, recv, (size_t)c->rank * block, block, &s, &r);
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Op mop = dtl__mpi_op(c, t, op);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  dtl__mpi_avg_after(k, op, recv, recv_count, t, c->size);
  return DTL__ISSUE(k, MPI_Reduce_scatter_block(s, r, n, dt, mop, comm),
                    MPI_Ireduce_scatter_block(s, r, n, dt, mop, comm, &k->req));
}

static dtl_status mpi_all_to_all_call(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t,
                                      dtl__mpi_call *k) {
  int n = 0;
  DTL_TRY(dtl__int_count(k->fn, count_per_peer, &n));
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  const void *s = send == recv && count_per_peer ? MPI_IN_PLACE : send;
  return DTL__ISSUE(k, MPI_Alltoall(s, n, dt, recv, n, dt, comm), MPI_Ialltoall(s, n, dt, recv, n, dt, comm, &k->req));
}

/* In place only when send == recv describe one and the same non-empty exchange: MPI_IN_PLACE sends what
 * recv_counts say, so a pointer that merely coincides with an empty side (layers above pass such pairs)
 * must stay an ordinary call, or this rank would send nothing while its peers wait. */
static bool dtl__a2av_in_place(const dtl_comm *c, const void *send, const size_t *send_counts, const void *recv,
                               const size_t *recv_counts) {
  if (send != recv) return false;
  size_t total = 0;
  for (int i = 0; i < c->size; i++) {
    if (send_counts[i] != recv_counts[i]) return false;
    total += send_counts[i];
  }
  return total > 0;
}

static dtl_status mpi_all_to_allv_call(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                       const size_t *recv_counts, dtl_dtype t, dtl__mpi_call *k) {
  int *sc, *sd, *rc, *rd;
  DTL_TRY(dtl__int_counts(k, c, "send_counts", send_counts, NULL, NULL, 0, &sc, &sd));
  DTL_TRY(dtl__int_counts(k, c, "recv_counts", recv_counts, NULL, NULL, 1, &rc, &rd));
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  const void *s = dtl__a2av_in_place(c, send, send_counts, recv, recv_counts) ? MPI_IN_PLACE : send;
  return DTL__ISSUE(k, MPI_Alltoallv(s, sc, sd, dt, recv, rc, rd, dt, comm),
                    MPI_Ialltoallv(s, sc, sd, dt, recv, rc, rd, dt, comm, &k->req));
}

static dtl_status mpi_all_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t) {
  dtl__mpi_call k = {.fn = "dtl_all_gather"};
  return mpi_all_gather_call(c, send, recv, send_count, t, &k);
}

static dtl_status mpi_all_gatherv(dtl_comm *c, const void *send, size_t send_count, void *recv, const size_t *recv_counts,
                                  dtl_dtype t) {
  dtl__mpi_call k = {.fn = "dtl_all_gatherv"};
  return mpi_all_gatherv_call(c, send, send_count, recv, recv_counts, t, &k);
}

static dtl_status mpi_all_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op) {
  dtl__mpi_call k = {.fn = "dtl_all_reduce"};
  return mpi_all_reduce_call(c, send, recv, count, t, op, &k);
}

static dtl_status mpi_reduce_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                                     dtl_reduce_op op) {
  dtl__mpi_call k = {.fn = "dtl_reduce_scatter"};
  return mpi_reduce_scatter_call(c, send, recv, recv_count, t, op, &k);
}

/* Only blocking: MPI_Ireduce_scatter exists, but dtl exposes no nonblocking uneven reduce-scatter. */
static dtl_status mpi_reduce_scatterv(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts, dtl_dtype t,
                                      dtl_reduce_op op) {
  dtl__mpi_call k = {.fn = "dtl_reduce_scatterv"};
  int *ic, *id;
  DTL_TRY(dtl__int_counts(&k, c, "recv_counts", recv_counts, NULL, NULL, 0, &ic, &id));
  size_t es = dtl_dtype_size(t);
  const void *s;
  void *r;
  dtl__mpi_reduce_scatter_buffers(&k, send, recv, (size_t)id[c->rank] * es, recv_counts[c->rank] * es, &s, &r);
  dtl__mpi_avg_after(&k, op, recv, recv_counts[c->rank], t, c->size);
  return dtl__mpi_issued(&k, MPI_Reduce_scatter(s, r, ic, dtl__mpi_type(t), dtl__mpi_op(c, t, op), dtl__mpi_of(c)->comm));
}

static dtl_status mpi_all_to_all(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t) {
  dtl__mpi_call k = {.fn = "dtl_all_to_all"};
  return mpi_all_to_all_call(c, send, recv, count_per_peer, t, &k);
}

static dtl_status mpi_all_to_allv(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                  const size_t *recv_counts, dtl_dtype t) {
  dtl__mpi_call k = {.fn = "dtl_all_to_allv"};
  return mpi_all_to_allv_call(c, send, send_counts, recv, recv_counts, t, &k);
}

/* Blocking only: the executor's one user runs it between local passes. Never in place (MPI_IN_PLACE would
 * read the send blocks from the receive displacements). */
static dtl_status mpi_all_to_allv_displs(dtl_comm *c, const void *send, const size_t *send_counts,
                                         const size_t *send_displs, void *recv, const size_t *recv_counts,
                                         const size_t *recv_displs, dtl_dtype t) {
  dtl__mpi_call k = {.fn = "dtl_all_to_allv_displs"};
  int *sc, *sd, *rc, *rd;
  DTL_TRY(dtl__int_counts(&k, c, "send_counts", send_counts, "send_displs", send_displs, 0, &sc, &sd));
  DTL_TRY(dtl__int_counts(&k, c, "recv_counts", recv_counts, "recv_displs", recv_displs, 1, &rc, &rd));
  MPI_Datatype dt = dtl__mpi_type(t);
  return dtl__mpi_issued(&k, MPI_Alltoallv(send, sc, sd, dt, recv, rc, rd, dt, dtl__mpi_of(c)->comm));
}

/* --- nonblocking ------------------------------------------------------------------------------------------ */
/* dtl_sendrecv_async's two transfers: they complete together, and the receive's count is checked then. */
typedef struct {
  MPI_Request reqs[2]; /* the receive, then the send */
  size_t recv_count;
  int source;
  dtl_dtype t;
  MPI_Status recv_status; /* once both completed (done) */
  bool done;
} dtl__mpi_pair;

/* A request and the count arrays its call's MPI request reads until it completes (4 x size ints after it). */
struct dtl__mpi_request {
  struct dtl_request base;
  dtl__mpi_call call;
  bool is_pair; /* a sendrecv: pair below, not call.req */
  dtl__mpi_pair pair;
  int nmsg; /* an exchange: its nmsg MPI requests in the trailing storage, not call.req */
  dtl__mpi_request *next; /* in the communicator's pool */
};

static int *dtl__mpi_request_counts(dtl__mpi_request *r) { return (int *)(r + 1); }
static MPI_Request *dtl__mpi_request_msgs(dtl__mpi_request *r) { return (MPI_Request *)(r + 1); }
/* The storage after a request: 4 x size ints (a v-collective's counts) or 2 x size MPI requests (an exchange). */
static size_t dtl__mpi_request_extra(int size) {
  size_t a = sizeof(int) * 4 * (size_t)size, b = sizeof(MPI_Request) * 2 * (size_t)size;
  return a > b ? a : b;
}

/* From the communicator's pool when it has one, else allocated. */
static dtl_status dtl__mpi_request_new(dtl_comm *c, const char *fn, dtl__mpi_request **out) {
  dtl__mpi *m = dtl__mpi_of(c);
  dtl__mpi_request *r = m->pool;
  if (r) {
    m->pool = r->next;
    m->pooled--;
  } else if (!(r = dtl__malloc(sizeof *r + dtl__mpi_request_extra(c->size)))) {
    return dtl__error(DTL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  memset(r, 0, sizeof *r);
  r->base.comm = c;
  r->call.fn = fn;
  r->call.nonblocking = true;
  r->call.req = MPI_REQUEST_NULL;
  r->call.counts = dtl__mpi_request_counts(r);
  *out = r;
  return DTL_OK;
}

/* Back into the pool (or freed when it is full). */
static void dtl__mpi_request_done(dtl__mpi_request *r) {
  dtl__mpi *m = dtl__mpi_of(r->base.comm);
  if (m->pooled >= DTL__MPI_POOL) {
    dtl__free(r);
    return;
  }
  r->next = m->pool;
  m->pool = r;
  m->pooled++;
}

/* Hands the started request out, or returns it when the start failed. */
static dtl_status dtl__mpi_started(dtl__mpi_request *r, dtl_status st, dtl_request **out) {
  if (st != DTL_OK) {
    dtl__mpi_request_done(r);
    return st;
  }
  *out = &r->base;
  return DTL_OK;
}

#define DTL__MPI_ASYNC(fn, call_expr)                  \
  do {                                                 \
    dtl__mpi_request *r_ = NULL;                       \
    DTL_TRY(dtl__mpi_request_new(c, fn, &r_));         \
    dtl__mpi_call *k = &r_->call;                      \
    return dtl__mpi_started(r_, (call_expr), req);     \
  } while (0)

static dtl_status mpi_all_gather_async(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t,
                                       dtl_request **req) {
  DTL__MPI_ASYNC("dtl_all_gather_async", mpi_all_gather_call(c, send, recv, send_count, t, k));
}

static dtl_status mpi_all_gatherv_async(dtl_comm *c, const void *send, size_t send_count, void *recv,
                                        const size_t *recv_counts, dtl_dtype t, dtl_request **req) {
  DTL__MPI_ASYNC("dtl_all_gatherv_async", mpi_all_gatherv_call(c, send, send_count, recv, recv_counts, t, k));
}

static dtl_status mpi_all_reduce_async(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t,
                                       dtl_reduce_op op, dtl_request **req) {
  DTL__MPI_ASYNC("dtl_all_reduce_async", mpi_all_reduce_call(c, send, recv, count, t, op, k));
}

static dtl_status mpi_reduce_scatter_async(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                                           dtl_reduce_op op, dtl_request **req) {
  DTL__MPI_ASYNC("dtl_reduce_scatter_async", mpi_reduce_scatter_call(c, send, recv, recv_count, t, op, k));
}

static dtl_status mpi_all_to_all_async(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t,
                                       dtl_request **req) {
  DTL__MPI_ASYNC("dtl_all_to_all_async", mpi_all_to_all_call(c, send, recv, count_per_peer, t, k));
}

static dtl_status mpi_all_to_allv_async(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                        const size_t *recv_counts, dtl_dtype t, dtl_request **req) {
  DTL__MPI_ASYNC("dtl_all_to_allv_async", mpi_all_to_allv_call(c, send, send_counts, recv, recv_counts, t, k));
}

static dtl_status dtl__mpi_pair_wait(dtl__mpi_request *r);
static dtl_status dtl__mpi_pair_test(dtl__mpi_request *r, bool *done);

static dtl_status dtl__mpi_msgs_wait(const char *fn, int n, MPI_Request *reqs);

static dtl_status mpi_wait(dtl_request *req) {
  dtl__mpi_request *r = (dtl__mpi_request *)req;
  if (r->is_pair) return dtl__mpi_pair_wait(r);
  if (r->nmsg) {
    dtl_status st = dtl__mpi_msgs_wait(r->call.fn, r->nmsg, dtl__mpi_request_msgs(r));
    dtl__mpi_request_done(r);
    return st;
  }
  int rc = MPI_Wait(&r->call.req, MPI_STATUS_IGNORE);
  dtl_status st = DTL_OK;
  if (rc == MPI_SUCCESS) dtl__mpi_after(&r->call);
  else st = dtl__mpi_error(r->call.fn, rc);
  dtl__mpi_request_done(r);
  return st;
}

static dtl_status mpi_test(dtl_request *req, bool *done) {
  dtl__mpi_request *r = (dtl__mpi_request *)req;
  if (r->is_pair) return dtl__mpi_pair_test(r, done);
  int flag = 0;
  if (r->nmsg) {
    DTL__MPI_CALL(r->call.fn, MPI_Testall(r->nmsg, dtl__mpi_request_msgs(r), &flag, MPI_STATUSES_IGNORE));
    *done = flag != 0;
    return DTL_OK;
  }
  DTL__MPI_CALL(r->call.fn, MPI_Test(&r->call.req, &flag, MPI_STATUS_IGNORE));
  *done = flag != 0;
  return DTL_OK;
}

/* --- point to point ----------------------------------------------------------------------------------------- */
static dtl_status mpi_send(dtl_comm *c, const void *buf, size_t count, dtl_dtype t, int peer) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_send", count, &n));
  DTL__MPI_CALL("dtl_send", MPI_Send(buf, n, dtl__mpi_type(t), peer, 0, dtl__mpi_of(c)->comm));
  return DTL_OK;
}

/* DTL_ERR_MISMATCH when the completed receive of status brought fewer than count elements (more is MPI's
 * truncation error, already a DTL_ERR_COMM). */
static dtl_status dtl__mpi_received(const char *fn, const char *count_arg, size_t count, const char *peer_arg, int peer,
                                    dtl_dtype t, MPI_Status *status) {
  int got = 0;
  DTL__MPI_CALL(fn, MPI_Get_count(status, dtl__mpi_type(t), &got));
  if (got < 0 || (size_t)got != count)
    return dtl__error(DTL_ERR_MISMATCH, "%s: %s=%zu but %s %d sent %d elements", fn, count_arg, count, peer_arg, peer,
                      got);
  return DTL_OK;
}

static dtl_status mpi_recv(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int peer) {
  int n = 0;
  DTL_TRY(dtl__int_count("dtl_recv", count, &n));
  MPI_Status status;
  DTL__MPI_CALL("dtl_recv", MPI_Recv(buf, n, dtl__mpi_type(t), peer, 0, dtl__mpi_of(c)->comm, &status));
  return dtl__mpi_received("dtl_recv", "count", count, "peer", peer, t, &status);
}

/* Both counts of a sendrecv as MPI ints. */
static dtl_status dtl__mpi_pair_counts(const char *fn, size_t send_count, size_t recv_count, int *ns, int *nr) {
  if (send_count > (size_t)INT_MAX || recv_count > (size_t)INT_MAX)
    return dtl__error(DTL_ERR_UNSUPPORTED, "%s: %s=%zu exceeds INT_MAX, the largest count one MPI call takes", fn,
                      send_count > (size_t)INT_MAX ? "send_count" : "recv_count",
                      send_count > (size_t)INT_MAX ? send_count : recv_count);
  *ns = (int)send_count;
  *nr = (int)recv_count;
  return DTL_OK;
}

static dtl_status mpi_sendrecv(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv,
                               size_t recv_count, int source, dtl_dtype t) {
  static const char fn[] = "dtl_sendrecv";
  int ns = 0, nr = 0;
  DTL_TRY(dtl__mpi_pair_counts(fn, send_count, recv_count, &ns, &nr));
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Status status;
  DTL__MPI_CALL(fn, MPI_Sendrecv(send, ns, dt, dest, 0, recv, nr, dt, source, 0, dtl__mpi_of(c)->comm, &status));
  return dtl__mpi_received(fn, "recv_count", recv_count, "source", source, t, &status);
}

/* The receive is posted first, so that a message to oneself finds it. */
static dtl_status mpi_sendrecv_async(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv,
                                     size_t recv_count, int source, dtl_dtype t, dtl_request **req) {
  static const char fn[] = "dtl_sendrecv_async";
  int ns = 0, nr = 0;
  DTL_TRY(dtl__mpi_pair_counts(fn, send_count, recv_count, &ns, &nr));
  dtl__mpi_request *r = NULL;
  DTL_TRY(dtl__mpi_request_new(c, fn, &r));
  r->is_pair = true;
  r->pair = (dtl__mpi_pair){.reqs = {MPI_REQUEST_NULL, MPI_REQUEST_NULL}, .recv_count = recv_count, .source = source,
                            .t = t};
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  int rc = MPI_Irecv(recv, nr, dt, source, 0, comm, &r->pair.reqs[0]);
  if (rc == MPI_SUCCESS) rc = MPI_Isend(send, ns, dt, dest, 0, comm, &r->pair.reqs[1]);
  if (rc != MPI_SUCCESS) {
    if (r->pair.reqs[0] != MPI_REQUEST_NULL) { /* withdraw the posted receive before its buffer is given back */
      MPI_Cancel(&r->pair.reqs[0]);
      MPI_Wait(&r->pair.reqs[0], MPI_STATUS_IGNORE);
    }
    dtl__mpi_request_done(r);
    return dtl__mpi_error(fn, rc);
  }
  *req = &r->base;
  return DTL_OK;
}

/* The error of a failed MPI_Waitall/MPI_Testall: the first failing request's own. */
static dtl_status dtl__mpi_pair_error(const char *fn, int rc, const MPI_Status st[2]) {
  if (rc == MPI_ERR_IN_STATUS) rc = st[0].MPI_ERROR != MPI_SUCCESS ? st[0].MPI_ERROR : st[1].MPI_ERROR;
  return dtl__mpi_error(fn, rc);
}

static dtl_status dtl__mpi_pair_test(dtl__mpi_request *r, bool *done) {
  dtl__mpi_pair *p = &r->pair;
  if (!p->done) {
    MPI_Status st[2];
    int flag = 0, rc = MPI_Testall(2, p->reqs, &flag, st);
    if (rc != MPI_SUCCESS) return dtl__mpi_pair_error(r->call.fn, rc, st);
    p->done = flag != 0;
    if (p->done) p->recv_status = st[0]; /* the handles are gone now: wait must not ask MPI again */
  }
  *done = p->done;
  return DTL_OK;
}

static dtl_status dtl__mpi_pair_wait(dtl__mpi_request *r) {
  dtl__mpi_pair *p = &r->pair;
  dtl_status st = DTL_OK;
  if (!p->done) {
    MPI_Status sts[2];
    int rc = MPI_Waitall(2, p->reqs, sts);
    if (rc != MPI_SUCCESS) st = dtl__mpi_pair_error(r->call.fn, rc, sts);
    p->recv_status = sts[0];
  }
  if (st == DTL_OK)
    st = dtl__mpi_received(r->call.fn, "recv_count", p->recv_count, "source", p->source, p->t, &p->recv_status);
  dtl__mpi_request_done(r);
  return st;
}

/* --- sparse exchange ------------------------------------------------------------------------------------------ */
/* Its own tag, so that its messages never match those of dtl_send, dtl_recv and dtl_sendrecv (tag 0). */
#define DTL__MPI_TAG_EXCHANGE 1

static dtl_status dtl__mpi_msgs_wait(const char *fn, int n, MPI_Request *reqs) {
  int rc = MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
  return rc == MPI_SUCCESS ? DTL_OK : dtl__mpi_error(fn, rc);
}

/* Posts the receives, then the sends, into reqs (nrecv + nsend of them); on a failure withdraws what was posted. */
static dtl_status dtl__mpi_post(dtl_comm *c, const char *fn, int nsend, const int *send_peers,
                                const void *const *send_bufs, const size_t *send_counts, int nrecv,
                                const int *recv_peers, void *const *recv_bufs, const size_t *recv_counts, dtl_dtype t,
                                MPI_Request *reqs) {
  int ignored;
  for (int i = 0; i < nsend; i++) DTL_TRY(dtl__int_count(fn, send_counts[i], &ignored));
  for (int i = 0; i < nrecv; i++) DTL_TRY(dtl__int_count(fn, recv_counts[i], &ignored));
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  int n = 0, rc = MPI_SUCCESS;
  for (int i = 0; i < nrecv && rc == MPI_SUCCESS; i++, n++)
    rc = MPI_Irecv(recv_bufs[i], (int)recv_counts[i], dt, recv_peers[i], DTL__MPI_TAG_EXCHANGE, comm, &reqs[n]);
  for (int i = 0; i < nsend && rc == MPI_SUCCESS; i++, n++)
    rc = MPI_Isend(send_bufs[i], (int)send_counts[i], dt, send_peers[i], DTL__MPI_TAG_EXCHANGE, comm, &reqs[n]);
  if (rc == MPI_SUCCESS) return DTL_OK;
  for (int i = 0; i < n - 1; i++) { /* the last one failed to post: withdraw the receives, let the sends go */
    if (i < nrecv) {
      MPI_Cancel(&reqs[i]);
      MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
    } else {
      MPI_Request_free(&reqs[i]);
    }
  }
  return dtl__mpi_error(fn, rc);
}

static dtl_status mpi_exchange(dtl_comm *c, int nsend, const int *send_peers, const void *const *send_bufs,
                               const size_t *send_counts, int nrecv, const int *recv_peers, void *const *recv_bufs,
                               const size_t *recv_counts, dtl_dtype t, dtl_request **req) {
  static const char fn[] = "dtl_exchange";
  if (!req) {
    MPI_Request *reqs = dtl__mpi_of(c)->reqs;
    DTL_TRY(dtl__mpi_post(c, fn, nsend, send_peers, send_bufs, send_counts, nrecv, recv_peers, recv_bufs, recv_counts,
                          t, reqs));
    return dtl__mpi_msgs_wait(fn, nsend + nrecv, reqs);
  }
  dtl__mpi_request *r = NULL;
  DTL_TRY(dtl__mpi_request_new(c, fn, &r));
  dtl_status st = dtl__mpi_post(c, fn, nsend, send_peers, send_bufs, send_counts, nrecv, recv_peers, recv_bufs,
                                recv_counts, t, dtl__mpi_request_msgs(r));
  r->nmsg = nsend + nrecv;
  return dtl__mpi_started(r, st, req);
}

static dtl_status mpi_barrier(dtl_comm *c) {
  DTL__MPI_CALL("dtl_barrier", MPI_Barrier(dtl__mpi_of(c)->comm));
  return DTL_OK;
}

/* --- lifetime ----------------------------------------------------------------------------------------- */
/* Frees m's MPI objects, unless MPI is already finalized (then they are gone with it). */
static void dtl__mpi_free(dtl__mpi *m) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    for (int k = 0; k < 2; k++)
      for (int j = 0; j < 4; j++)
        if (m->half_op[k][j] != MPI_OP_NULL) MPI_Op_free(&m->half_op[k][j]);
    if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  }
  while (m->pool) {
    dtl__mpi_request *r = m->pool;
    m->pool = r->next;
    dtl__free(r);
  }
  dtl__free(m->counts);
  dtl__free(m->reqs);
  dtl__free(m);
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

static dtl_status mpi_synchronize(dtl_comm *c) {
  (void)c;
  return DTL_OK;
}

static const dtl__comm_ops dtl__mpi_ops = {
    .name = "mpi",
    .broadcast = mpi_broadcast, .scatter = mpi_scatter, .gather = mpi_gather, .reduce = mpi_reduce,
    .all_gather = mpi_all_gather, .all_gatherv = mpi_all_gatherv, .all_reduce = mpi_all_reduce,
    .reduce_scatter = mpi_reduce_scatter, .reduce_scatterv = mpi_reduce_scatterv, .all_to_all = mpi_all_to_all,
    .all_to_allv = mpi_all_to_allv, .send = mpi_send, .recv = mpi_recv, .sendrecv = mpi_sendrecv,
    .sendrecv_async = mpi_sendrecv_async, .barrier = mpi_barrier,
    .all_to_allv_displs = mpi_all_to_allv_displs, .exchange = mpi_exchange,
    .all_gather_async = mpi_all_gather_async, .all_gatherv_async = mpi_all_gatherv_async,
    .all_reduce_async = mpi_all_reduce_async, .reduce_scatter_async = mpi_reduce_scatter_async,
    .all_to_all_async = mpi_all_to_all_async, .all_to_allv_async = mpi_all_to_allv_async,
    .wait = mpi_wait, .test = mpi_test,
    .split = mpi_split, .check = mpi_check, .abort = mpi_abort, .destroy = mpi_destroy,
    .synchronize = mpi_synchronize,
};

/* Takes ownership of dup (an MPI communicator dtl alone uses). */
static dtl_status dtl__comm_wrap_mpi(MPI_Comm dup, dtl_comm **out) {
  static MPI_User_function *const fns[2][4] = {{dtl__f16_sum, dtl__f16_prod, dtl__f16_max, dtl__f16_min},
                                               {dtl__bf16_sum, dtl__bf16_prod, dtl__bf16_max, dtl__bf16_min}};
  dtl__mpi *m = dtl__calloc(1, sizeof *m);
  if (!m) {
    MPI_Comm_free(&dup);
    return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm_from_mpi: out of host memory");
  }
  m->comm = dup;
  for (int k = 0; k < 2; k++)
    for (int j = 0; j < 4; j++) m->half_op[k][j] = MPI_OP_NULL;
  int rc = MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  for (int k = 0; k < 2 && rc == MPI_SUCCESS; k++)
    for (int j = 0; j < 4 && rc == MPI_SUCCESS; j++) rc = MPI_Op_create(fns[k][j], 1, &m->half_op[k][j]);
  int rank = 0, size = 0;
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(dup, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(dup, &size);
  if (rc != MPI_SUCCESS) {
    dtl__mpi_free(m);
    return dtl__mpi_error("dtl_comm_from_mpi", rc);
  }
  if (!(m->counts = dtl__malloc(sizeof(int) * 4 * (size_t)size)) ||
      !(m->reqs = dtl__malloc(sizeof(MPI_Request) * 2 * (size_t)size))) {
    dtl__mpi_free(m);
    return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm_from_mpi: out of host memory");
  }
  dtl_status st = dtl__comm_new(&dtl__mpi_ops, dtl__mem_host(), rank, size, m, out);
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

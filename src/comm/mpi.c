/* SPDX-License-Identifier: Apache-2.0 */
/* The MPI transport (OpenMPI, MPICH): fills the backend vtable on a duplicated communicator set to
 * MPI_ERRORS_RETURN. All-reduce, reduce-scatter(v), all-gather(v), all-to-all(v) and reduce each run either the
 * MPI call or one of dtl's own algorithms (mpi_algo.c), as the communicator's table says (mpi_algo_table.c).
 * f16/bf16 travel as 16-bit words and reduce with dtl's own MPI_Ops (each pair combined in f32); DTL_AVG is a
 * sum followed by a local division. MPI (before 4.0 large counts) takes int counts: a call with a count or
 * displacement beyond INT_MAX elements moves in pieces (chunked MPI calls, or dtl's algorithms, whose
 * transfers are cut into pieces), decided from what every rank of the call knows alike. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "comm/agree.h"
#include "comm/deadline.h"
#include "comm/mpi_algo.h"
#include "comm/profile.h"
#include "common/half.h"
#include "dtl/mpi.h"

typedef struct dtl__mpi_request dtl__mpi_request;

/* A nonblocking call's request is kept for reuse once waited for, at most this many per communicator, so
 * that a steady stream of nonblocking calls allocates nothing. */
#define DTL__MPI_POOL 8
/* All of them are made with the communicator (dtl__comm_wrap_mpi): a plan's pipelined exchange round keeps up to 7
 * in flight, a CP ring 1, so that no layer's first nonblocking transfer allocates. */
#define DTL__MPI_POOL_RESERVED DTL__MPI_POOL

/* Tags: user point-to-point 0, dtl's blocking algorithms 1, the sparse exchange 2 (its messages between two ranks
 * match in the order posted), each nonblocking collective start its own from 3 on (the starts come in the same
 * order on every rank, so every rank numbers them alike). */
#define DTL__TAG_ALGO 1
#define DTL__TAG_EXCHANGE 2
#define DTL__TAG_ASYNC 3

typedef struct {
  MPI_Comm comm;
  MPI_Op half_op[2][4]; /* [f16|bf16][sum, prod, max, min], applied to MPI_UINT16_T */
  MPI_Op f8_op[2][2];   /* [e4m3|e5m2][max, min], applied to MPI_UINT8_T (the 8-bit floats reduce with no other op) */
  /* The int counts and displacements of a blocking v-collective (4 x size: two arrays of each), sized once:
   * calls on one communicator are never concurrent, and a blocking call is done with them when it returns. */
  int *counts;
  dtl__mpi_request *pool; /* waited-for requests, each with its own 4 x size ints, linked through next */
  int pooled;
  /* dtl's algorithms: the table (read when the communicator is made), the largest count one MPI call gets,
   * the arrays a call posts from (2 x size each, sized once), and the blocking calls' grow-only scratch, whose
   * size is the same on every rank (see dtl__mpi_scratch). */
  dtl__algo_table table;
  size_t limit;
  int tag_span;      /* nonblocking tags 3 .. 3 + tag_span - 1 */
  unsigned seq;      /* nonblocking collective starts so far */
  MPI_Request *reqs; /* 4 x size: one round, then a chain root's window (and a blocking exchange's messages) */
  dtl__xfer *xfers;  /* 2 x size */
  size_t *offs;      /* 2 x size */
  void *scratch;
  size_t scratch_bytes;
  int first_failed; /* the scratch agreement's value: MPI's until a timed call completes, so not on a stack */
  dtl__coll last_coll; /* the last call with a choice of algorithm, for dtl_comm_mpi_last_algorithm */
  dtl__algo last_algo;
  bool any_call;
  char last_text[48];
} dtl__mpi;

static dtl__mpi *dtl__mpi_of(const dtl_comm *c) { return (dtl__mpi *)c->impl; }

dtl_status dtl__mpi_error(const char *fn, int rc) {
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

/* The error of a failed MPI_Waitall/MPI_Testall over n requests: the first failing request's own. */
static dtl_status dtl__mpi_all_error(const char *fn, int rc, const MPI_Status *st, int n) {
  for (int i = 0; rc == MPI_ERR_IN_STATUS && st != MPI_STATUSES_IGNORE && i < n; i++)
    if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING) rc = st[i].MPI_ERROR;
  return dtl__mpi_error(fn, rc);
}

/* --- waiting, under the communicator's deadline ----------------------------------------------------------------
 * Without a deadline a blocking call is MPI's own (MPI_Allreduce, MPI_Waitall): nothing changes and nothing is
 * paid. With one, every blocking call posts MPI's nonblocking form and completes here, by MPI_Testall polled with
 * the deadline's back-off (deadline.c), so that a peer that never arrives costs DTL_ERR_TIMEOUT, not a hang. */
#define DTL__MPI_LATE (-1) /* dtl__mpi_poll: the deadline passed first (the requests are left as they are) */

static int dtl__mpi_poll(dtl__deadline *d, int n, MPI_Request *reqs, MPI_Status *sts) {
  for (;;) {
    int flag = 0, rc = MPI_Testall(n, reqs, &flag, sts);
    if (rc != MPI_SUCCESS || flag) return rc;
    if (!dtl__deadline_backoff(d)) return DTL__MPI_LATE;
  }
}

dtl_status dtl__mpi_waitall(dtl_comm *c, const char *fn, int n, MPI_Request *reqs, MPI_Status *sts) {
  int rc;
  if (!dtl__comm_timed(c)) {
    rc = MPI_Waitall(n, reqs, sts);
  } else {
    dtl__deadline d;
    dtl__deadline_begin(&d, dtl__comm_timeout_s(c));
    if ((rc = dtl__mpi_poll(&d, n, reqs, sts)) == DTL__MPI_LATE) return dtl__comm_timeout(c, fn, &d, "");
  }
  return rc == MPI_SUCCESS ? DTL_OK : dtl__mpi_all_error(fn, rc, sts, n);
}

/* A blocking MPI call: bcall without a deadline; with one, icall (its nonblocking form, posting into &req_),
 * completed under the deadline. */
#define DTL__MPI_TIMED(c, fn, bcall, icall)                                                  \
  do {                                                                                       \
    MPI_Request req_ = MPI_REQUEST_NULL;                                                     \
    bool timed_ = dtl__comm_timed(c);                                                        \
    int rc_ = timed_ ? (icall) : (bcall);                                                    \
    if (rc_ != MPI_SUCCESS) return dtl__mpi_error(fn, rc_);                                  \
    if (timed_) DTL_TRY(dtl__mpi_waitall((c), (fn), 1, &req_, MPI_STATUSES_IGNORE));         \
  } while (0)

/* Every entry of the vtable first: a communicator that was aborted or whose fate failed returns at once. */
#define DTL__MPI_LIVE(c, fn) DTL_TRY(dtl__comm_live((c), (fn)))

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

/* --- e4m3 / e5m2 max and min: compared as values, the winner's code kept, so the result is one of the inputs ---- */
#define DTL__F8_OP(name, gt, a, b)                                          \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {     \
    (void)dt;                                                               \
    const uint8_t *x = in;                                                  \
    uint8_t *y = inout;                                                     \
    for (int i = 0; i < *len; i++)                                          \
      if (gt(a[i], b[i])) y[i] = x[i];                                      \
  }
DTL__F8_OP(dtl__f8e4m3_max, dtl__f8e4m3_gt, x, y)
DTL__F8_OP(dtl__f8e4m3_min, dtl__f8e4m3_gt, y, x)
DTL__F8_OP(dtl__f8e5m2_max, dtl__f8e5m2_gt, x, y)
DTL__F8_OP(dtl__f8e5m2_min, dtl__f8e5m2_gt, y, x)

static MPI_Datatype dtl__mpi_type(dtl_dtype t) {
  switch (t) {
    case DTL_FLOAT32: return MPI_FLOAT;
    case DTL_FLOAT64: return MPI_DOUBLE;
    case DTL_FLOAT16: /* fall through: moved as 16-bit words, reduced by dtl's own ops */
    case DTL_BFLOAT16: return MPI_UINT16_T;
    case DTL_INT8: return MPI_INT8_T;
    case DTL_UINT8: /* fall through */
    case DTL_FLOAT8_E4M3: /* fall through: the 8-bit floats move as bytes, reduced by dtl's own ops */
    case DTL_FLOAT8_E5M2: return MPI_UINT8_T;
    case DTL_INT32: return MPI_INT32_T;
    case DTL_INT64: break;
  }
  return MPI_INT64_T;
}

static MPI_Op dtl__mpi_op(const dtl_comm *c, dtl_dtype t, dtl_reduce_op op) {
  int which = op == DTL_PROD ? 1 : op == DTL_MAX ? 2 : op == DTL_MIN ? 3 : 0; /* avg reduces as sum */
  if (t == DTL_FLOAT16 || t == DTL_BFLOAT16) return dtl__mpi_of(c)->half_op[t == DTL_BFLOAT16][which];
  /* Sums, products and averages of the 8-bit floats never get here: comm.c and layout creation refuse them. */
  if (dtl__dtype_is_fp8(t)) return which >= 2 ? dtl__mpi_of(c)->f8_op[t == DTL_FLOAT8_E5M2][which - 2] : MPI_OP_NULL;
  return which == 0 ? MPI_SUM : which == 1 ? MPI_PROD : which == 2 ? MPI_MAX : MPI_MIN;
}

/* --- one call, blocking or not ------------------------------------------------------------------------------
 * Every collective fills a dtl__mpi_call: the MPI call is MPI_Xxx (blocking) or MPI_Ixxx (nonblocking, its
 * requests kept), or one of dtl's algorithms runs (blocking) or starts (nonblocking) instead. What must happen
 * after the transfers complete is recorded in the call (dtl__algo_after) so that blocking and nonblocking forms
 * share it: dtl's rank-order fold, DTL_AVG's division, and the in-place reduce-scatter's move of the result
 * from the buffer's start (where MPI_IN_PLACE leaves it) to this rank's block. */
typedef struct {
  const char *fn;
  dtl_comm *c;
  bool nonblocking;
  bool timed; /* a blocking call under a deadline: each MPI call posted into one, then completed at once */
  MPI_Request one;
  int tag;     /* a nonblocking start's own tag (dtl's algorithms) */
  int *counts; /* int counts and displacements that MPI reads until completion (NULL: the communicator's) */
  dtl__algo_after after;
  /* nonblocking: the requests that complete the call (the request's own 2 x size, or reqs_heap when more),
   * and the start's own scratch, which a pooled request keeps for the next start */
  MPI_Request *reqs;
  int nreqs, reqs_cap;
  MPI_Request *reqs_heap;
  void *scratch;
  size_t scratch_bytes;
} dtl__mpi_call;

static void dtl__mpi_avg_after(dtl__mpi_call *k, const dtl_comm *c, dtl_reduce_op op, void *buf, size_t count,
                               dtl_dtype t) {
  if (op != DTL_AVG || count == 0) return;
  k->after.avg_buf = buf;
  k->after.avg_n = count;
  k->after.t = t;
  k->after.size = c->size;
}

/* Room for n more requests of a nonblocking call. */
static dtl_status dtl__mpi_reqs(dtl__mpi_call *k, size_t n) {
  if (n <= (size_t)(k->reqs_cap - k->nreqs)) return DTL_OK;
  size_t cap = (size_t)k->nreqs + n;
  MPI_Request *r = cap <= INT_MAX / 2 ? dtl__malloc(sizeof *r * cap) : NULL;
  if (!r) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, k->fn, "out of host memory (%zu requests)", cap);
  if (k->nreqs) memcpy(r, k->reqs, sizeof *r * (size_t)k->nreqs);
  dtl__free(k->reqs_heap);
  k->reqs = k->reqs_heap = r;
  k->reqs_cap = (int)cap;
  return DTL_OK;
}

/* Where a nonblocking MPI call puts its request. */
static MPI_Request *dtl__mpi_next(dtl__mpi_call *k) { return &k->reqs[k->nreqs]; }

/* Concludes one MPI call that returned rc: a blocking call is finished here (finish: its last piece), a
 * nonblocking one in wait. */
static dtl_status dtl__mpi_posted(dtl__mpi_call *k, int rc, bool finish) {
  if (rc != MPI_SUCCESS) return dtl__mpi_error(k->fn, rc);
  if (k->nonblocking) {
    k->nreqs++;
    return DTL_OK;
  }
  if (k->timed) DTL_TRY(dtl__mpi_waitall(k->c, k->fn, 1, &k->one, MPI_STATUSES_IGNORE));
  if (finish) dtl__algo_finish(&k->after);
  return DTL_OK;
}

/* The state of a blocking call on c (timed under c's deadline). */
static void dtl__mpi_blocking(dtl__mpi_call *k, dtl_comm *c, const char *fn) {
  memset(k, 0, sizeof *k);
  k->fn = fn;
  k->c = c;
  k->timed = dtl__comm_timed(c);
  k->reqs = &k->one;
  k->reqs_cap = 1;
}
static dtl_status dtl__mpi_issued(dtl__mpi_call *k, int rc) { return dtl__mpi_posted(k, rc, true); }

#define DTL__ISSUE(k, blocking_call, nonblocking_call) \
  dtl__mpi_issued((k), (k)->nonblocking || (k)->timed ? (nonblocking_call) : (blocking_call))

/* Converts per-rank counts to int counts and displacements (displs, named displs_arg, or packed in rank order
 * when NULL), into k->counts (n counts then n displacements; with a second array, 4n ints): a nonblocking
 * call's own arrays, or the communicator's for a blocking one. Only all_to_allv gets here with counts beyond
 * the limit (the other calls take dtl's algorithms then, which move pieces). */
static dtl_status dtl__int_counts(dtl__mpi_call *k, const dtl_comm *c, const char *arg, const size_t *counts,
                                  const char *displs_arg, const size_t *displs, int slot, int **out_counts,
                                  int **out_displs) {
  size_t n = (size_t)c->size, limit = dtl__mpi_of(c)->limit;
  if (!k->counts) k->counts = dtl__mpi_of(c)->counts;
  int *ic = k->counts + (size_t)slot * 2 * n, *id = ic + n;
  size_t off = 0;
  for (int i = 0; i < c->size; i++) {
    if (displs) off = displs[i];
    if (counts[i] > limit || off > limit) {
      if (displs && counts[i] <= limit)
        return dtl__error(DTL_ERR_UNSUPPORTED, "%s: %s[%d]=%zu exceeds INT_MAX, the largest displacement one MPI call "
                          "takes (DTL_ALGO forces all_to_allv:mpi; all_to_allv:direct moves it)", k->fn, displs_arg, i,
                          off);
      return dtl__error(DTL_ERR_UNSUPPORTED, "%s: %s[%d]=%zu at element offset %zu exceeds INT_MAX, the largest count "
                        "or displacement one MPI call takes (DTL_ALGO forces all_to_allv:mpi; all_to_allv:direct moves "
                        "it)", k->fn, arg, i, counts[i], off);
    }
    ic[i] = (int)counts[i];
    id[i] = (int)off;
    off += counts[i];
  }
  *out_counts = ic;
  *out_displs = id;
  return DTL_OK;
}

/* Whether per-rank counts packed in rank order have a count or an offset beyond limit. */
static bool dtl__beyond(const size_t *counts, int p, size_t limit) {
  size_t off = 0;
  for (int i = 0; i < p; i++) {
    if (counts[i] > limit || off > limit) return true;
    off += counts[i];
  }
  return false;
}

/* --- dtl's algorithms ------------------------------------------------------------------------------------------ */
/* The algorithm of a call that has a choice (every rank passes the same inputs, so every rank picks alike). */
static dtl__algo dtl__mpi_pick(dtl_comm *c, const dtl__mpi_call *k, dtl__coll coll, bool reduces, dtl_dtype t,
                               dtl_reduce_op op, size_t bytes, bool large) {
  dtl__mpi *m = dtl__mpi_of(c);
  dtl__algo a = dtl__algo_pick(&m->table, coll, dtl__algo_class(reduces, t, op, c->size), c->size, bytes,
                               k->nonblocking, large);
  m->last_coll = coll;
  m->last_algo = a;
  m->any_call = true;
  return a;
}

/* The blocking algorithms' scratch grows to need bytes. need is a formula of arguments that every rank passes
 * alike (dtl__algo_scratch_bytes), and the size only ever changes here, so every rank has the same size and
 * comes here in the same call: the ranks then agree on the growth (one small all-reduce, only when it grows),
 * so that a rank that cannot allocate fails every rank before the call's first transfer. */
static dtl_status dtl__mpi_scratch(dtl_comm *c, const char *fn, size_t need) {
  dtl__mpi *m = dtl__mpi_of(c);
  if (need <= m->scratch_bytes) return DTL_OK;
  void *p = dtl__malloc(need);
  int *first = &m->first_failed;
  *first = p ? INT_MAX : c->rank;
  if (c->size > 1) {
    MPI_Request r = MPI_REQUEST_NULL;
    bool timed = dtl__comm_timed(c);
    int rc = timed ? MPI_Iallreduce(MPI_IN_PLACE, first, 1, MPI_INT, MPI_MIN, m->comm, &r)
                   : MPI_Allreduce(MPI_IN_PLACE, first, 1, MPI_INT, MPI_MIN, m->comm);
    dtl_status st = rc == MPI_SUCCESS ? DTL_OK : dtl__mpi_error(fn, rc);
    if (st == DTL_OK && timed) st = dtl__mpi_waitall(c, fn, 1, &r, MPI_STATUSES_IGNORE);
    if (st != DTL_OK) {
      dtl__free(p);
      return st;
    }
  }
  int first_failed = *first;
  if (first_failed != INT_MAX) {
    if (!p)
      return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory (%zu bytes of scratch for dtl's algorithm)",
                           need);
    dtl__free(p);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "rank %d failed (DTL_ERR_OUT_OF_MEMORY; its dtl_last_error says "
                         "why), so no rank went on", first_failed);
  }
  dtl__free(m->scratch);
  m->scratch = p;
  m->scratch_bytes = need;
  return DTL_OK;
}

/* Runs a (blocking) or starts it (nonblocking). */
static dtl_status dtl__mpi_algo(dtl_comm *c, dtl__mpi_call *k, dtl__algo_call a, dtl_dtype t, dtl_reduce_op op) {
  dtl__mpi *m = dtl__mpi_of(c);
  a.fn = k->fn;
  dtl__algo_ctx x = {.c = c, .comm = m->comm, .rank = c->rank, .size = c->size, .limit = m->limit, .dt = dtl__mpi_type(t),
                     .es = dtl_dtype_size(t), .t = t, .op = op, .nonblocking = k->nonblocking, .x = m->xfers,
                     .offs = m->offs};
  size_t need = dtl__algo_scratch_bytes(&x, &a);
  if (k->nonblocking) {
    if (need > k->scratch_bytes) {
      void *p = dtl__malloc(need);
      if (!p) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, k->fn, "out of host memory (%zu bytes of scratch)", need);
      dtl__free(k->scratch);
      k->scratch = p;
      k->scratch_bytes = need;
    }
    x.tag = k->tag;
    x.reqs = k->reqs;
    x.nreqs = k->nreqs;
    x.reqs_cap = k->reqs_cap;
    x.reqs_heap = k->reqs_heap;
    x.scratch = k->scratch;
  } else {
    DTL_TRY(dtl__mpi_scratch(c, k->fn, need));
    x.tag = DTL__TAG_ALGO;
    x.reqs = m->reqs;
    x.reqs_cap = 2 * c->size;
    x.window = m->reqs + 2 * c->size;
    x.scratch = m->scratch;
  }
  dtl_status st = dtl__algo_run(&x, &a, &k->after);
  if (k->nonblocking) {
    k->reqs = x.reqs;
    k->nreqs = x.nreqs;
    k->reqs_cap = x.reqs_cap;
    k->reqs_heap = x.reqs_heap;
  }
  return st;
}

/* --- collectives -------------------------------------------------------------------------------------- */
static dtl_status mpi_broadcast(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int root) {
  static const char fn[] = "dtl_broadcast";
  DTL__MPI_LIVE(c, fn);
  dtl__mpi *m = dtl__mpi_of(c);
  size_t es = dtl_dtype_size(t), at = 0;
  do { /* in pieces of at most the limit: the same on every rank */
    size_t n = count - at < m->limit ? count - at : m->limit;
    char *b = (char *)buf + at * es;
    DTL__MPI_TIMED(c, fn, MPI_Bcast(b, (int)n, dtl__mpi_type(t), root, m->comm),
                   MPI_Ibcast(b, (int)n, dtl__mpi_type(t), root, m->comm, &req_));
    at += n;
  } while (at < count);
  return DTL_OK;
}

static dtl_status mpi_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, int root) {
  DTL__MPI_LIVE(c, "dtl_scatter");
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_scatter");
  if (recv_count > dtl__mpi_of(c)->limit)
    return dtl__mpi_algo(c, &k, (dtl__algo_call){.coll = DTL__COLL_SCATTER, .algo = DTL__ALGO_DIRECT, .send = send,
                                                 .recv = recv, .count = recv_count, .root = root}, t, DTL_SUM);
  int n = (int)recv_count;
  MPI_Datatype dt = dtl__mpi_type(t);
  void *r = c->rank == root && dtl__ptr_at(recv, send, (size_t)root * recv_count * dtl_dtype_size(t)) ? MPI_IN_PLACE : recv;
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  DTL__MPI_TIMED(c, "dtl_scatter", MPI_Scatter(send, n, dt, r, n, dt, root, comm),
                 MPI_Iscatter(send, n, dt, r, n, dt, root, comm, &req_));
  return DTL_OK;
}

static dtl_status mpi_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t, int root) {
  DTL__MPI_LIVE(c, "dtl_gather");
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_gather");
  if (send_count > dtl__mpi_of(c)->limit)
    return dtl__mpi_algo(c, &k, (dtl__algo_call){.coll = DTL__COLL_GATHER, .algo = DTL__ALGO_DIRECT, .send = send,
                                                 .recv = recv, .count = send_count, .root = root}, t, DTL_SUM);
  int n = (int)send_count;
  MPI_Datatype dt = dtl__mpi_type(t);
  const void *s =
      c->rank == root && dtl__ptr_at(send, recv, (size_t)root * send_count * dtl_dtype_size(t)) ? MPI_IN_PLACE : send;
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  DTL__MPI_TIMED(c, "dtl_gather", MPI_Gather(s, n, dt, recv, n, dt, root, comm),
                 MPI_Igather(s, n, dt, recv, n, dt, root, comm, &req_));
  return DTL_OK;
}

static dtl_status mpi_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op, int root) {
  DTL__MPI_LIVE(c, "dtl_reduce");
  dtl__mpi *m = dtl__mpi_of(c);
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_reduce");
  size_t es = dtl_dtype_size(t);
  dtl__algo a = dtl__mpi_pick(c, &k, DTL__COLL_REDUCE, true, t, op, count * es, count > m->limit);
  if (a != DTL__ALGO_MPI)
    return dtl__mpi_algo(c, &k, (dtl__algo_call){.coll = DTL__COLL_REDUCE, .algo = a, .send = send, .recv = recv,
                                                 .count = count, .root = root}, t, op);
  const void *s = (c->rank == root && send == recv) ? MPI_IN_PLACE : send;
  void *copy = NULL;
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION < 40102300
  /* MPICH before 4.1.2 reads MPI_IN_PLACE as an address at a root other than 0 once the message is over
   * 2 KiB and crashes (pmodels/mpich#6540, seen with Debian's 4.0.2): reduce from a copy there instead. */
  if (s == MPI_IN_PLACE && root != 0 && count > 0) {
    if (!(copy = dtl__malloc(count * es))) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_reduce: out of host memory");
    s = memcpy(copy, recv, count * es);
  }
#endif
  if (c->rank == root) dtl__mpi_avg_after(&k, c, op, recv, count, t);
  dtl_status st = DTL_OK;
  size_t at = 0;
  do { /* elementwise, so in pieces of at most the limit */
    size_t n = count - at < m->limit ? count - at : m->limit;
    const void *sp = s == MPI_IN_PLACE ? s : (const char *)s + at * es;
    void *rp = recv ? (char *)recv + at * es : NULL;
    MPI_Datatype dt = dtl__mpi_type(t);
    MPI_Op mop = dtl__mpi_op(c, t, op);
    st = dtl__mpi_posted(&k, k.timed ? MPI_Ireduce(sp, rp, (int)n, dt, mop, root, m->comm, &k.one)
                                     : MPI_Reduce(sp, rp, (int)n, dt, mop, root, m->comm), at + n >= count);
    at += n;
  } while (st == DTL_OK && at < count);
  dtl__free(copy);
  return st;
}

static dtl_status mpi_all_gather_call(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t,
                                      dtl__mpi_call *k) {
  size_t es = dtl_dtype_size(t);
  dtl__algo a = dtl__mpi_pick(c, k, DTL__COLL_ALL_GATHER, false, t, DTL_SUM, send_count * (size_t)c->size * es,
                              send_count > dtl__mpi_of(c)->limit);
  if (a != DTL__ALGO_MPI)
    return dtl__mpi_algo(c, k, (dtl__algo_call){.coll = DTL__COLL_ALL_GATHER, .algo = a, .send = send, .recv = recv,
                                                .count = send_count}, t, DTL_SUM);
  int n = (int)send_count;
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  const void *s = dtl__ptr_at(send, recv, (size_t)c->rank * send_count * es) ? MPI_IN_PLACE : send;
  return DTL__ISSUE(k, MPI_Allgather(s, n, dt, recv, n, dt, comm), MPI_Iallgather(s, n, dt, recv, n, dt, comm, dtl__mpi_next(k)));
}

static dtl_status mpi_all_gatherv_call(dtl_comm *c, const void *send, size_t send_count, void *recv,
                                       const size_t *recv_counts, dtl_dtype t, dtl__mpi_call *k) {
  size_t total = 0, es = dtl_dtype_size(t);
  for (int i = 0; i < c->size; i++) total += recv_counts[i];
  dtl__algo a = dtl__mpi_pick(c, k, DTL__COLL_ALL_GATHER, false, t, DTL_SUM, total * es,
                              dtl__beyond(recv_counts, c->size, dtl__mpi_of(c)->limit));
  if (a != DTL__ALGO_MPI)
    return dtl__mpi_algo(c, k, (dtl__algo_call){.coll = DTL__COLL_ALL_GATHER, .algo = a, .send = send, .recv = recv,
                                                .counts = recv_counts}, t, DTL_SUM);
  int *ic = NULL, *id = NULL;
  DTL_TRY(dtl__int_counts(k, c, "recv_counts", recv_counts, NULL, NULL, 0, &ic, &id));
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  const void *s = dtl__ptr_at(send, recv, (size_t)id[c->rank] * es) ? MPI_IN_PLACE : send;
  int n = (int)send_count; /* == recv_counts[rank], checked above */
  return DTL__ISSUE(k, MPI_Allgatherv(s, n, dt, recv, ic, id, dt, comm),
                    MPI_Iallgatherv(s, n, dt, recv, ic, id, dt, comm, dtl__mpi_next(k)));
}

static dtl_status mpi_all_reduce_call(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t,
                                      dtl_reduce_op op, dtl__mpi_call *k) {
  dtl__mpi *m = dtl__mpi_of(c);
  size_t es = dtl_dtype_size(t);
  dtl__algo a = dtl__mpi_pick(c, k, DTL__COLL_ALL_REDUCE, true, t, op, count * es, count > m->limit);
  if (a != DTL__ALGO_MPI)
    return dtl__mpi_algo(c, k, (dtl__algo_call){.coll = DTL__COLL_ALL_REDUCE, .algo = a, .send = send, .recv = recv,
                                                .count = count}, t, op);
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Op mop = dtl__mpi_op(c, t, op);
  dtl__mpi_avg_after(k, c, op, recv, count, t);
  size_t pieces = dtl__pieces(count, m->limit);
  if (k->nonblocking) DTL_TRY(dtl__mpi_reqs(k, pieces ? pieces : 1));
  dtl_status st = DTL_OK;
  size_t at = 0;
  do { /* elementwise, so in pieces of at most the limit (every rank cuts alike) */
    size_t n = count - at < m->limit ? count - at : m->limit;
    const void *s = send == recv ? MPI_IN_PLACE : (const char *)send + at * es;
    void *r = (char *)recv + at * es;
    int rc = k->nonblocking || k->timed ? MPI_Iallreduce(s, r, (int)n, dt, mop, m->comm, dtl__mpi_next(k))
                                        : MPI_Allreduce(s, r, (int)n, dt, mop, m->comm);
    st = dtl__mpi_posted(k, rc, at + n >= count);
    at += n;
  } while (st == DTL_OK && at < count);
  return st;
}

/* The buffers of a reduce-scatter whose own block starts offset bytes into send. dtl's in-place form
 * (recv == send + offset) becomes MPI_IN_PLACE, where MPI reads the input from and leaves the result at the
 * start of one buffer (send); the result then moves to recv once the call completes. */
static void dtl__mpi_reduce_scatter_buffers(dtl__mpi_call *k, const void *send, void *recv, size_t offset,
                                           size_t block_bytes, const void **s, void **r) {
  static char nothing; /* where an empty block "lands" when its pointer equals send's (MPICH refuses aliases) */
  *s = send;
  *r = recv;
  if (!dtl__ptr_at(recv, send, offset)) {
    if (block_bytes == 0 && recv == send) *r = &nothing;
    return;
  }
  *s = MPI_IN_PLACE;
  *r = (char *)recv - offset;
  k->after.move_dst = recv;
  k->after.move_src = *r;
  k->after.move_bytes = offset ? block_bytes : 0;
}

static dtl_status mpi_reduce_scatter_call(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                                          dtl_reduce_op op, dtl__mpi_call *k) {
  size_t es = dtl_dtype_size(t), block = recv_count * es;
  dtl__algo a = dtl__mpi_pick(c, k, DTL__COLL_REDUCE_SCATTER, true, t, op, block * (size_t)c->size,
                              recv_count > dtl__mpi_of(c)->limit);
  if (a != DTL__ALGO_MPI)
    return dtl__mpi_algo(c, k, (dtl__algo_call){.coll = DTL__COLL_REDUCE_SCATTER, .algo = a, .send = send,
                                                .recv = recv, .count = recv_count}, t, op);
  int n = (int)recv_count;
  const void *s;
  void *r;
  dtl__mpi_reduce_scatter_buffers(k, send, recv, (size_t)c->rank * block, block, &s, &r);
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Op mop = dtl__mpi_op(c, t, op);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  dtl__mpi_avg_after(k, c, op, recv, recv_count, t);
  return DTL__ISSUE(k, MPI_Reduce_scatter_block(s, r, n, dt, mop, comm),
                    MPI_Ireduce_scatter_block(s, r, n, dt, mop, comm, dtl__mpi_next(k)));
}

static dtl_status mpi_all_to_all_call(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t,
                                      dtl__mpi_call *k) {
  dtl__algo a = dtl__mpi_pick(c, k, DTL__COLL_ALL_TO_ALL, false, t, DTL_SUM,
                              count_per_peer * (size_t)c->size * dtl_dtype_size(t), count_per_peer > dtl__mpi_of(c)->limit);
  bool in_place = send == recv && count_per_peer;
  if (a != DTL__ALGO_MPI)
    return dtl__mpi_algo(c, k, (dtl__algo_call){.coll = DTL__COLL_ALL_TO_ALL, .algo = a, .send = send, .recv = recv,
                                                .count = count_per_peer, .in_place = in_place}, t, DTL_SUM);
  const void *s = in_place ? MPI_IN_PLACE : send;
  int n = (int)count_per_peer;
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  return DTL__ISSUE(k, MPI_Alltoall(s, n, dt, recv, n, dt, comm), MPI_Ialltoall(s, n, dt, recv, n, dt, comm, dtl__mpi_next(k)));
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

/* all_to_allv and the exchange at explicit displacements (displs NULL: packed). Each rank knows only its own
 * counts, so whether a call is large cannot decide the algorithm: the table chooses by ranks alone, and its
 * default, direct, moves any count in pieces; a forced mpi fails (alone) the rank whose counts or
 * displacements exceed what one MPI call takes. */
static dtl_status mpi_all_to_allv_call(dtl_comm *c, const void *send, const size_t *send_counts,
                                       const size_t *send_displs, void *recv, const size_t *recv_counts,
                                       const size_t *recv_displs, dtl_dtype t, dtl__mpi_call *k) {
  bool in_place = !send_displs && dtl__a2av_in_place(c, send, send_counts, recv, recv_counts);
  dtl__algo a = dtl__mpi_pick(c, k, DTL__COLL_ALL_TO_ALLV, false, t, DTL_SUM, 0, false);
  if (a != DTL__ALGO_MPI)
    return dtl__mpi_algo(c, k, (dtl__algo_call){.coll = DTL__COLL_ALL_TO_ALLV, .algo = a,
                                                .send = send, .recv = recv, .counts = send_counts,
                                                .rcounts = recv_counts, .sdispls = send_displs, .rdispls = recv_displs,
                                                .in_place = in_place}, t, DTL_SUM);
  int *sc = NULL, *sd = NULL, *rc = NULL, *rd = NULL;
  DTL_TRY(dtl__int_counts(k, c, "send_counts", send_counts, "send_displs", send_displs, 0, &sc, &sd));
  DTL_TRY(dtl__int_counts(k, c, "recv_counts", recv_counts, "recv_displs", recv_displs, 1, &rc, &rd));
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  const void *s = in_place ? MPI_IN_PLACE : send;
  return DTL__ISSUE(k, MPI_Alltoallv(s, sc, sd, dt, recv, rc, rd, dt, comm),
                    MPI_Ialltoallv(s, sc, sd, dt, recv, rc, rd, dt, comm, dtl__mpi_next(k)));
}

static dtl_status mpi_all_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t) {
  DTL__MPI_LIVE(c, "dtl_all_gather");
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_all_gather");
  return mpi_all_gather_call(c, send, recv, send_count, t, &k);
}

static dtl_status mpi_all_gatherv(dtl_comm *c, const void *send, size_t send_count, void *recv, const size_t *recv_counts,
                                  dtl_dtype t) {
  DTL__MPI_LIVE(c, "dtl_all_gatherv");
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_all_gatherv");
  return mpi_all_gatherv_call(c, send, send_count, recv, recv_counts, t, &k);
}

static dtl_status mpi_all_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op) {
  DTL__MPI_LIVE(c, "dtl_all_reduce");
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_all_reduce");
  return mpi_all_reduce_call(c, send, recv, count, t, op, &k);
}

static dtl_status mpi_reduce_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                                     dtl_reduce_op op) {
  DTL__MPI_LIVE(c, "dtl_reduce_scatter");
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_reduce_scatter");
  return mpi_reduce_scatter_call(c, send, recv, recv_count, t, op, &k);
}

static dtl_status mpi_reduce_scatterv_call(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts,
                                           dtl_dtype t, dtl_reduce_op op, dtl__mpi_call *k) {
  size_t total = 0, es = dtl_dtype_size(t);
  for (int i = 0; i < c->size; i++) total += recv_counts[i];
  dtl__algo a = dtl__mpi_pick(c, k, DTL__COLL_REDUCE_SCATTER, true, t, op, total * es,
                              dtl__beyond(recv_counts, c->size, dtl__mpi_of(c)->limit));
  if (a != DTL__ALGO_MPI)
    return dtl__mpi_algo(c, k, (dtl__algo_call){.coll = DTL__COLL_REDUCE_SCATTER, .algo = a, .send = send,
                                                .recv = recv, .counts = recv_counts}, t, op);
  int *ic = NULL, *id = NULL;
  DTL_TRY(dtl__int_counts(k, c, "recv_counts", recv_counts, NULL, NULL, 0, &ic, &id));
  const void *s;
  void *r;
  dtl__mpi_reduce_scatter_buffers(k, send, recv, (size_t)id[c->rank] * es, recv_counts[c->rank] * es, &s, &r);
  dtl__mpi_avg_after(k, c, op, recv, recv_counts[c->rank], t);
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Op mop = dtl__mpi_op(c, t, op);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  return DTL__ISSUE(k, MPI_Reduce_scatter(s, r, ic, dt, mop, comm),
                    MPI_Ireduce_scatter(s, r, ic, dt, mop, comm, dtl__mpi_next(k)));
}

static dtl_status mpi_reduce_scatterv(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts, dtl_dtype t,
                                      dtl_reduce_op op) {
  DTL__MPI_LIVE(c, "dtl_reduce_scatterv");
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_reduce_scatterv");
  return mpi_reduce_scatterv_call(c, send, recv, recv_counts, t, op, &k);
}

static dtl_status mpi_all_to_all(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t) {
  DTL__MPI_LIVE(c, "dtl_all_to_all");
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_all_to_all");
  return mpi_all_to_all_call(c, send, recv, count_per_peer, t, &k);
}

static dtl_status mpi_all_to_allv(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                  const size_t *recv_counts, dtl_dtype t) {
  DTL__MPI_LIVE(c, "dtl_all_to_allv");
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_all_to_allv");
  return mpi_all_to_allv_call(c, send, send_counts, NULL, recv, recv_counts, NULL, t, &k);
}

/* The executor's: blocking between local passes, and nonblocking below for dtl_plan_execute_async. Never in place (MPI_IN_PLACE would
 * read the send blocks from the receive displacements). */
static dtl_status mpi_all_to_allv_displs(dtl_comm *c, const void *send, const size_t *send_counts,
                                         const size_t *send_displs, void *recv, const size_t *recv_counts,
                                         const size_t *recv_displs, dtl_dtype t) {
  DTL__MPI_LIVE(c, "dtl_all_to_allv_displs");
  dtl__mpi_call k;
  dtl__mpi_blocking(&k, c, "dtl_all_to_allv_displs");
  return mpi_all_to_allv_call(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, t, &k);
}

/* --- nonblocking ------------------------------------------------------------------------------------------ */
/* dtl_sendrecv_async: its transfers (in call.reqs, piece by piece) complete together, and the receive's count
 * is checked then, from the statuses kept here. */
typedef struct {
  size_t recv_count;
  int source;
  dtl_dtype t;
  MPI_Status *sts; /* one per request: sts2, or sts_heap for more than two pieces */
  MPI_Status sts2[2];
  MPI_Status *sts_heap;
  bool done;
} dtl__mpi_pair;

/* A request, followed by the count arrays its MPI call reads until it completes (4 x size ints) and its own
 * requests (2 x size). */
struct dtl__mpi_request {
  struct dtl_request base;
  dtl__mpi_call call;
  bool is_pair; /* a sendrecv: pair below, not call.reqs */
  dtl__mpi_pair pair;
  dtl__mpi_request *next; /* in the communicator's pool */
};

static size_t dtl__mpi_request_size(int p) {
  return sizeof(dtl__mpi_request) + sizeof(int) * 4 * (size_t)p + sizeof(MPI_Request) * 2 * (size_t)p;
}

/* From the communicator's pool when it has one (with the scratch it kept), else allocated. */
static dtl_status dtl__mpi_request_new(dtl_comm *c, const char *fn, dtl__mpi_request **out) {
  dtl__mpi *m = dtl__mpi_of(c);
  dtl__mpi_request *r = m->pool;
  void *scratch = NULL;
  size_t scratch_bytes = 0;
  if (r) {
    m->pool = r->next;
    m->pooled--;
    scratch = r->call.scratch;
    scratch_bytes = r->call.scratch_bytes;
  } else if (!(r = dtl__malloc(dtl__mpi_request_size(c->size)))) {
    return dtl__error(DTL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  memset(r, 0, sizeof *r);
  r->base.comm = c;
  r->call.fn = fn;
  r->call.c = c;
  r->call.nonblocking = true;
  r->call.counts = (int *)(r + 1);
  r->call.reqs = (MPI_Request *)(r->call.counts + 4 * (size_t)c->size);
  r->call.reqs_cap = 2 * c->size;
  r->call.scratch = scratch;
  r->call.scratch_bytes = scratch_bytes;
  *out = r;
  return DTL_OK;
}

/* Back into the pool (or freed when it is full). */
static void dtl__mpi_request_done(dtl__mpi_request *r) {
  dtl__mpi *m = dtl__mpi_of(r->base.comm);
  dtl__free(r->call.reqs_heap);
  r->call.reqs_heap = NULL;
  dtl__free(r->pair.sts_heap);
  r->pair.sts_heap = NULL;
  if (m->pooled >= DTL__MPI_POOL) {
    dtl__free(r->call.scratch);
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

/* A collective start: its own tag for dtl's algorithms (every rank numbers the starts alike). */
#define DTL__MPI_ASYNC(fn, call_expr)                                             \
  do {                                                                            \
    dtl__mpi_request *r_ = NULL;                                                  \
    DTL__MPI_LIVE(c, fn);                                                         \
    DTL_TRY(dtl__mpi_request_new(c, fn, &r_));                                    \
    dtl__mpi_call *k = &r_->call;                                                 \
    dtl__mpi *m_ = dtl__mpi_of(c);                                                \
    k->tag = DTL__TAG_ASYNC + (int)(m_->seq++ % (unsigned)m_->tag_span);          \
    return dtl__mpi_started(r_, (call_expr), req);                                \
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
  DTL__MPI_ASYNC("dtl_all_to_allv_async",
                 mpi_all_to_allv_call(c, send, send_counts, NULL, recv, recv_counts, NULL, t, k));
}

static dtl_status mpi_reduce_scatterv_async(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts,
                                            dtl_dtype t, dtl_reduce_op op, dtl_request **req) {
  DTL__MPI_ASYNC("dtl_reduce_scatterv_async", mpi_reduce_scatterv_call(c, send, recv, recv_counts, t, op, k));
}

static dtl_status mpi_all_to_allv_displs_async(dtl_comm *c, const void *send, const size_t *send_counts,
                                               const size_t *send_displs, void *recv, const size_t *recv_counts,
                                               const size_t *recv_displs, dtl_dtype t, dtl_request **req) {
  DTL__MPI_ASYNC("dtl_all_to_allv_displs_async",
                 mpi_all_to_allv_call(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, t, k));
}

static dtl_status dtl__mpi_pair_wait(dtl__mpi_request *r);
static dtl_status dtl__mpi_pair_test(dtl__mpi_request *r, bool *done);

/* After a timeout the request goes back to the pool all the same: its communicator has failed, so nothing
 * reuses it. */
static dtl_status mpi_wait(dtl_request *req) {
  dtl__mpi_request *r = (dtl__mpi_request *)req;
  if (r->is_pair) return dtl__mpi_pair_wait(r);
  dtl_status st = dtl__comm_live(r->base.comm, r->call.fn);
  if (st == DTL_OK) st = dtl__mpi_waitall(r->base.comm, r->call.fn, r->call.nreqs, r->call.reqs, MPI_STATUSES_IGNORE);
  if (st == DTL_OK) dtl__algo_finish(&r->call.after);
  dtl__mpi_request_done(r);
  return st;
}

static dtl_status mpi_test(dtl_request *req, bool *done) {
  dtl__mpi_request *r = (dtl__mpi_request *)req;
  if (r->is_pair) return dtl__mpi_pair_test(r, done);
  int flag = 0;
  DTL__MPI_CALL(r->call.fn, MPI_Testall(r->call.nreqs, r->call.reqs, &flag, MPI_STATUSES_IGNORE));
  *done = flag != 0;
  return DTL_OK;
}

/* --- point to point ----------------------------------------------------------------------------------------- */
/* A message moves in pieces of at most the limit, the last one always shorter (possibly empty: count 0 is one
 * empty message), and the receiver cuts alike: so counts beyond INT_MAX get through, and a receiver learns that
 * a message ended early from a short piece instead of waiting for pieces that never come. */
static size_t dtl__p2p_pieces(const dtl_comm *c, size_t count) { return count / dtl__mpi_of(c)->limit + 1; }
/* Piece j of count elements: its size, and its first element in *at. */
static int dtl__p2p_piece(const dtl_comm *c, size_t count, size_t j, size_t *at) {
  size_t limit = dtl__mpi_of(c)->limit;
  *at = j * limit;
  return (int)(count - *at < limit ? count - *at : limit);
}

/* Checks received piece j (status st) of a receive of count elements: DTL_ERR_MISMATCH when it brought fewer
 * than the piece holds (more is MPI's truncation error, already a DTL_ERR_COMM), naming what came in all. */
static dtl_status dtl__mpi_piece_in(const dtl_comm *c, const char *fn, const char *count_arg, size_t count,
                                    const char *peer_arg, int peer, dtl_dtype t, size_t j, MPI_Status *st) {
  int got = 0;
  size_t at;
  DTL__MPI_CALL(fn, MPI_Get_count(st, dtl__mpi_type(t), &got));
  int want = dtl__p2p_piece(c, count, j, &at);
  if (got != want)
    return dtl__error(DTL_ERR_MISMATCH, "%s: %s=%zu but %s %d sent %zu elements", fn, count_arg, count, peer_arg, peer,
                      at + (size_t)(got > 0 ? got : 0));
  return DTL_OK;
}

static dtl_status mpi_send(dtl_comm *c, const void *buf, size_t count, dtl_dtype t, int peer) {
  DTL__MPI_LIVE(c, "dtl_send");
  size_t es = dtl_dtype_size(t), at;
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  for (size_t j = 0, n = dtl__p2p_pieces(c, count); j < n; j++) {
    int m = dtl__p2p_piece(c, count, j, &at);
    const char *b = (const char *)buf + at * es;
    DTL__MPI_TIMED(c, "dtl_send", MPI_Send(b, m, dtl__mpi_type(t), peer, 0, comm),
                   MPI_Isend(b, m, dtl__mpi_type(t), peer, 0, comm, &req_));
  }
  return DTL_OK;
}

static dtl_status mpi_recv(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int peer) {
  DTL__MPI_LIVE(c, "dtl_recv");
  size_t es = dtl_dtype_size(t), at;
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  for (size_t j = 0, n = dtl__p2p_pieces(c, count); j < n; j++) {
    int m = dtl__p2p_piece(c, count, j, &at);
    MPI_Status st;
    char *b = (char *)buf + at * es;
    if (!dtl__comm_timed(c)) {
      DTL__MPI_CALL("dtl_recv", MPI_Recv(b, m, dtl__mpi_type(t), peer, 0, comm, &st));
    } else {
      MPI_Request r = MPI_REQUEST_NULL;
      DTL__MPI_CALL("dtl_recv", MPI_Irecv(b, m, dtl__mpi_type(t), peer, 0, comm, &r));
      DTL_TRY(dtl__mpi_waitall(c, "dtl_recv", 1, &r, &st));
    }
    DTL_TRY(dtl__mpi_piece_in(c, "dtl_recv", "count", count, "peer", peer, t, j, &st));
  }
  return DTL_OK;
}

/* Posts receive piece rj (if any) then send piece sj (if any) of a sendrecv into reqs[*n]. */
static int dtl__mpi_pair_post(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv,
                              size_t recv_count, int source, dtl_dtype t, size_t rj, size_t sj, MPI_Request *reqs,
                              int *n) {
  size_t es = dtl_dtype_size(t), at;
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  int rc = MPI_SUCCESS;
  if (rj < dtl__p2p_pieces(c, recv_count)) {
    int m = dtl__p2p_piece(c, recv_count, rj, &at);
    rc = MPI_Irecv((char *)recv + at * es, m, dt, source, 0, comm, &reqs[*n]);
    if (rc == MPI_SUCCESS) (*n)++;
  }
  if (rc == MPI_SUCCESS && sj < dtl__p2p_pieces(c, send_count)) {
    int m = dtl__p2p_piece(c, send_count, sj, &at);
    rc = MPI_Isend((const char *)send + at * es, m, dt, dest, 0, comm, &reqs[*n]);
    if (rc == MPI_SUCCESS) (*n)++;
  }
  return rc;
}

/* Withdraws posted requests before their buffers are given back (a post that MPI refused). */
static void dtl__mpi_withdraw(MPI_Request *reqs, int n) {
  for (int i = 0; i < n; i++) {
    MPI_Cancel(&reqs[i]);
    MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
  }
}

/* Round j moves piece j of both messages, so that no round waits on a piece its peer has not posted. After a
 * short receive piece (an error of the caller) the remaining send pieces still go, so the peer does not wait. */
static dtl_status mpi_sendrecv(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv,
                               size_t recv_count, int source, dtl_dtype t) {
  static const char fn[] = "dtl_sendrecv";
  DTL__MPI_LIVE(c, fn);
  size_t ns = dtl__p2p_pieces(c, send_count), nr = dtl__p2p_pieces(c, recv_count);
  if (ns == 1 && nr == 1 && !dtl__comm_timed(c)) {
    MPI_Datatype dt = dtl__mpi_type(t);
    MPI_Status status;
    DTL__MPI_CALL(fn, MPI_Sendrecv(send, (int)send_count, dt, dest, 0, recv, (int)recv_count, dt, source, 0,
                                   dtl__mpi_of(c)->comm, &status));
    return dtl__mpi_piece_in(c, fn, "recv_count", recv_count, "source", source, t, 0, &status);
  }
  dtl_status st = DTL_OK;
  for (size_t j = 0; j < (ns > nr ? ns : nr); j++) {
    MPI_Request reqs[2];
    MPI_Status sts[2];
    bool receiving = j < nr && st == DTL_OK;
    int n = 0, rc = dtl__mpi_pair_post(c, send, send_count, dest, recv, receiving ? recv_count : 0, source, t,
                                       receiving ? j : SIZE_MAX, j, reqs, &n);
    if (rc != MPI_SUCCESS) {
      dtl__mpi_withdraw(reqs, n);
      return dtl__mpi_error(fn, rc);
    }
    DTL_TRY(dtl__mpi_waitall(c, fn, n, reqs, sts));
    if (receiving) st = dtl__mpi_piece_in(c, fn, "recv_count", recv_count, "source", source, t, j, &sts[0]);
  }
  return st;
}

/* Every piece is posted at once, each round's receive before its send, so that a message to oneself finds its
 * receive; the statuses are kept for the count check in wait. */
static dtl_status mpi_sendrecv_async(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv,
                                     size_t recv_count, int source, dtl_dtype t, dtl_request **req) {
  static const char fn[] = "dtl_sendrecv_async";
  DTL__MPI_LIVE(c, fn);
  size_t ns = dtl__p2p_pieces(c, send_count), nr = dtl__p2p_pieces(c, recv_count), total = ns + nr;
  dtl__mpi_request *r = NULL;
  DTL_TRY(dtl__mpi_request_new(c, fn, &r));
  r->is_pair = true;
  r->pair = (dtl__mpi_pair){.recv_count = recv_count, .source = source, .t = t, .sts = r->pair.sts2};
  dtl__mpi_call *k = &r->call;
  dtl_status st = dtl__mpi_reqs(k, total);
  if (st == DTL_OK && total > 2 && !(r->pair.sts = r->pair.sts_heap = dtl__malloc(sizeof(MPI_Status) * total)))
    st = dtl__error(DTL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  for (size_t j = 0; st == DTL_OK && j < (ns > nr ? ns : nr); j++) {
    int rc = dtl__mpi_pair_post(c, send, send_count, dest, recv, recv_count, source, t, j, j, k->reqs, &k->nreqs);
    if (rc != MPI_SUCCESS) {
      dtl__mpi_withdraw(k->reqs, k->nreqs);
      st = dtl__mpi_error(fn, rc);
    }
  }
  if (st != DTL_OK) {
    dtl__mpi_request_done(r);
    return st;
  }
  *req = &r->base;
  return DTL_OK;
}

/* Where receive piece j sits among the requests: round by round, each round's receive then its send. */
static size_t dtl__mpi_pair_recv_at(const dtl__mpi_request *r, size_t j) {
  size_t nr = dtl__p2p_pieces(r->base.comm, r->pair.recv_count), ns = (size_t)r->call.nreqs - nr;
  return j + (j < ns ? j : ns);
}

static dtl_status dtl__mpi_pair_test(dtl__mpi_request *r, bool *done) {
  dtl__mpi_pair *p = &r->pair;
  if (!p->done) {
    int flag = 0, rc = MPI_Testall(r->call.nreqs, r->call.reqs, &flag, p->sts);
    if (rc != MPI_SUCCESS) return dtl__mpi_all_error(r->call.fn, rc, p->sts, r->call.nreqs);
    p->done = flag != 0; /* the handles are gone now, their statuses kept: wait must not ask MPI again */
  }
  *done = p->done;
  return DTL_OK;
}

/* The receive pieces complete in order; after a short one (the sender's message ended early, an error of the
 * caller) no more come, so the later receives are withdrawn instead of waited for. */
static dtl_status dtl__mpi_pair_wait(dtl__mpi_request *r) {
  dtl__mpi_pair *p = &r->pair;
  dtl_comm *c = r->base.comm;
  dtl_status st = DTL_OK;
  size_t nr = dtl__p2p_pieces(c, p->recv_count);
  for (size_t j = 0; !p->done && j < nr; j++) {
    size_t i = dtl__mpi_pair_recv_at(r, j);
    if (st != DTL_OK) {
      dtl__mpi_withdraw(&r->call.reqs[i], 1);
      continue;
    }
    st = dtl__mpi_waitall(c, r->call.fn, 1, &r->call.reqs[i], &p->sts[i]);
    if (st == DTL_OK) st = dtl__mpi_piece_in(c, r->call.fn, "recv_count", p->recv_count, "source", p->source, p->t, j, &p->sts[i]);
  }
  if (!p->done && !dtl__comm_dead(c)) { /* the sends (and the withdrawn receives, now null requests) */
    dtl_status ws = dtl__mpi_waitall(c, r->call.fn, r->call.nreqs, r->call.reqs, MPI_STATUSES_IGNORE);
    if (st == DTL_OK) st = ws;
  }
  for (size_t j = 0; p->done && st == DTL_OK && j < nr; j++)
    st = dtl__mpi_piece_in(c, r->call.fn, "recv_count", p->recv_count, "source", p->source, p->t, j,
                           &p->sts[dtl__mpi_pair_recv_at(r, j)]);
  dtl__mpi_request_done(r);
  return st;
}

/* --- sparse exchange ------------------------------------------------------------------------------------------ */
/* buf + at elements of es bytes, without arithmetic on a NULL buffer (an empty message's). */
static void *dtl__mpi_at(const void *buf, size_t at, size_t es) {
  return at ? (char *)(uintptr_t)buf + at * es : (void *)(uintptr_t)buf;
}

/* Posts the receives, then the sends, each message in pieces of at most the limit (as dtl_send cuts them), into
 * k's requests; on a failure withdraws what was posted. */
static dtl_status dtl__mpi_post(dtl_comm *c, dtl__mpi_call *k, int nsend, const int *send_peers,
                                const void *const *send_bufs, const size_t *send_counts, int nrecv,
                                const int *recv_peers, void *const *recv_bufs, const size_t *recv_counts, dtl_dtype t) {
  size_t total = 0, es = dtl_dtype_size(t), at;
  for (int i = 0; i < nsend; i++) total += dtl__p2p_pieces(c, send_counts[i]);
  for (int i = 0; i < nrecv; i++) total += dtl__p2p_pieces(c, recv_counts[i]);
  DTL_TRY(dtl__mpi_reqs(k, total));
  MPI_Datatype dt = dtl__mpi_type(t);
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  int rc = MPI_SUCCESS;
  for (int i = 0; i < nrecv && rc == MPI_SUCCESS; i++)
    for (size_t j = 0; j < dtl__p2p_pieces(c, recv_counts[i]) && rc == MPI_SUCCESS; j++) {
      int n = dtl__p2p_piece(c, recv_counts[i], j, &at);
      rc = MPI_Irecv(dtl__mpi_at(recv_bufs[i], at, es), n, dt, recv_peers[i], DTL__TAG_EXCHANGE, comm,
                     dtl__mpi_next(k));
      if (rc == MPI_SUCCESS) k->nreqs++;
    }
  for (int i = 0; i < nsend && rc == MPI_SUCCESS; i++)
    for (size_t j = 0; j < dtl__p2p_pieces(c, send_counts[i]) && rc == MPI_SUCCESS; j++) {
      int n = dtl__p2p_piece(c, send_counts[i], j, &at);
      rc = MPI_Isend(dtl__mpi_at(send_bufs[i], at, es), n, dt, send_peers[i], DTL__TAG_EXCHANGE, comm,
                     dtl__mpi_next(k));
      if (rc == MPI_SUCCESS) k->nreqs++;
    }
  if (rc == MPI_SUCCESS) return DTL_OK;
  dtl__mpi_withdraw(k->reqs, k->nreqs);
  k->nreqs = 0;
  return dtl__mpi_error(k->fn, rc);
}

/* ", no message yet from ranks 1,3" (the peers of the receives still open), for a timeout's message. */
static void dtl__mpi_missing(const dtl_comm *c, const MPI_Request *reqs, int nrecv, const int *recv_peers,
                             const size_t *recv_counts, char *buf, size_t cap) {
  size_t o = 0, at = 0;
  int listed = 0;
  buf[0] = '\0';
  for (int i = 0; i < nrecv; i++) {
    bool open = false;
    for (size_t j = 0, n = dtl__p2p_pieces(c, recv_counts[i]); j < n; j++, at++) {
      int flag = 1;
      if (reqs[at] != MPI_REQUEST_NULL) MPI_Request_get_status(reqs[at], &flag, MPI_STATUS_IGNORE);
      open |= !flag;
    }
    if (!open || o + 24 >= cap) continue;
    o += (size_t)snprintf(buf + o, cap - o, "%s%d", listed++ ? "," : ", no message yet from rank(s) ", recv_peers[i]);
  }
  if (!listed && nrecv) snprintf(buf, cap, ", every message to this rank had arrived (a peer has not received)");
}

/* Completes a blocking exchange: on a timeout, names the peers whose messages had not come. */
static dtl_status dtl__mpi_exchange_wait(dtl_comm *c, dtl__mpi_call *k, int nrecv, const int *recv_peers,
                                         const size_t *recv_counts) {
  if (!dtl__comm_timed(c)) return dtl__mpi_waitall(c, k->fn, k->nreqs, k->reqs, MPI_STATUSES_IGNORE);
  dtl__deadline d;
  dtl__deadline_begin(&d, dtl__comm_timeout_s(c));
  int rc = dtl__mpi_poll(&d, k->nreqs, k->reqs, MPI_STATUSES_IGNORE);
  if (rc == MPI_SUCCESS) return DTL_OK;
  if (rc != DTL__MPI_LATE) return dtl__mpi_error(k->fn, rc);
  char detail[200];
  dtl__mpi_missing(c, k->reqs, nrecv, recv_peers, recv_counts, detail, sizeof detail);
  return dtl__comm_timeout(c, k->fn, &d, detail);
}

static dtl_status mpi_exchange(dtl_comm *c, int nsend, const int *send_peers, const void *const *send_bufs,
                               const size_t *send_counts, int nrecv, const int *recv_peers, void *const *recv_bufs,
                               const size_t *recv_counts, dtl_dtype t, dtl_request **req) {
  static const char fn[] = "dtl_exchange";
  DTL__MPI_LIVE(c, fn);
  if (!req) { /* the communicator's requests (4 x size), or more from the heap for messages beyond the limit */
    dtl__mpi_call k = {.fn = fn, .c = c, .nonblocking = true, .reqs = dtl__mpi_of(c)->reqs, .reqs_cap = 4 * c->size};
    dtl_status st = dtl__mpi_post(c, &k, nsend, send_peers, send_bufs, send_counts, nrecv, recv_peers, recv_bufs,
                                  recv_counts, t);
    if (st == DTL_OK) st = dtl__mpi_exchange_wait(c, &k, nrecv, recv_peers, recv_counts);
    dtl__free(k.reqs_heap);
    return st;
  }
  dtl__mpi_request *r = NULL;
  DTL_TRY(dtl__mpi_request_new(c, fn, &r));
  dtl_status st = dtl__mpi_post(c, &r->call, nsend, send_peers, send_bufs, send_counts, nrecv, recv_peers, recv_bufs,
                                recv_counts, t);
  return dtl__mpi_started(r, st, req);
}

static dtl_status mpi_barrier(dtl_comm *c) {
  DTL__MPI_LIVE(c, "dtl_barrier");
  MPI_Comm comm = dtl__mpi_of(c)->comm;
  DTL__MPI_TIMED(c, "dtl_barrier", MPI_Barrier(comm), MPI_Ibarrier(comm, &req_));
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
    for (int k = 0; k < 2; k++)
      for (int j = 0; j < 2; j++)
        if (m->f8_op[k][j] != MPI_OP_NULL) MPI_Op_free(&m->f8_op[k][j]);
    if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  }
  while (m->pool) {
    dtl__mpi_request *r = m->pool;
    m->pool = r->next;
    dtl__free(r->call.scratch);
    dtl__free(r);
  }
  dtl__free(m->xfers);
  dtl__free(m->scratch);
  dtl__free(m);
}

static dtl_status dtl__comm_wrap_mpi(MPI_Comm dup, const dtl__mpi *parent, dtl_comm **out);

/* The new communicator keeps its parent's algorithm table (and limit), and its ranks keep their nodes: each new
 * rank's parent rank comes from the groups (local), so no communication is needed. */
static dtl_status mpi_split(dtl_comm *c, int color, int key, dtl_comm **out) {
  static const char fn[] = "dtl_comm_split";
  MPI_Comm nc;
  DTL__MPI_CALL(fn, MPI_Comm_split(dtl__mpi_of(c)->comm, color, key, &nc));
  dtl_comm *s = NULL;
  DTL_TRY(dtl__comm_wrap_mpi(nc, dtl__mpi_of(c), &s));
  if (c->nnodes == 1) {
    *out = s;
    return DTL_OK;
  }
  size_t n = (size_t)s->size;
  int *buf = dtl__malloc(sizeof(int) * 4 * n); /* new ranks, their parent ranks, then the keys' sorting scratch */
  dtl_status st = buf ? DTL_OK : dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  MPI_Group pg = MPI_GROUP_NULL, ng = MPI_GROUP_NULL;
  int rc = MPI_SUCCESS;
  if (st == DTL_OK) {
    for (size_t i = 0; i < n; i++) buf[i] = (int)i;
    rc = MPI_Comm_group(dtl__mpi_of(c)->comm, &pg);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_group(nc, &ng);
    if (rc == MPI_SUCCESS) rc = MPI_Group_translate_ranks(ng, s->size, buf, pg, buf + n);
    if (rc != MPI_SUCCESS) st = dtl__mpi_error(fn, rc);
  }
  if (pg != MPI_GROUP_NULL) MPI_Group_free(&pg);
  if (ng != MPI_GROUP_NULL) MPI_Group_free(&ng);
  if (st == DTL_OK) {
    for (size_t i = 0; i < n; i++) buf[n + i] = c->node[buf[n + i]];
    dtl__comm_set_node_keys(s, buf + n, buf + 2 * n);
  }
  dtl__free(buf);
  if (st != DTL_OK) {
    dtl_comm_destroy(s);
    return st;
  }
  *out = s;
  return DTL_OK;
}

/* The key of this rank's node: the rank of MPI_COMM_WORLD divided by DTL_RANKS_PER_NODE (rpn > 0), else the lowest
 * rank of comm that shares memory with it (MPI_Comm_split_type, collective over comm). */
static int dtl__mpi_node_key(MPI_Comm comm, int rpn, int *key) {
  if (rpn > 0) {
    int w = 0, rc = MPI_Comm_rank(MPI_COMM_WORLD, &w);
    *key = w / rpn;
    return rc;
  }
  MPI_Comm shm = MPI_COMM_NULL;
  MPI_Group sg = MPI_GROUP_NULL, cg = MPI_GROUP_NULL;
  int first = 0;
  int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shm);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_group(shm, &sg);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_group(comm, &cg);
  if (rc == MPI_SUCCESS) rc = MPI_Group_translate_ranks(sg, 1, &first, cg, key); /* shm rank 0: the lowest */
  if (sg != MPI_GROUP_NULL) MPI_Group_free(&sg);
  if (cg != MPI_GROUP_NULL) MPI_Group_free(&cg);
  if (shm != MPI_COMM_NULL) MPI_Comm_free(&shm);
  return rc;
}

static dtl_status mpi_check(dtl_comm *c) {
  (void)c;
  return DTL_OK;
}

/* MPI has no communicator-local abort: MPI_Abort ends the job (comm.h). It returns only where MPI fails to. */
static dtl_status mpi_abort(dtl_comm *c) {
  int rc = MPI_Abort(dtl__mpi_of(c)->comm, 1);
  return rc == MPI_SUCCESS ? DTL_OK : dtl__mpi_error("dtl_comm_abort", rc);
}

/* A communicator that timed out keeps its MPI state: MPI may still complete what the timed-out call posted (write
 * into its scratch, match a late peer's message on its communicator; freeing that communicator under a message
 * still arriving crashed OpenMPI's receive path), so it is left to the process's end or dtl_comm_abort. */
static void mpi_destroy(dtl_comm *c) {
  if (!dtl__comm_dead(c) || c->aborted) dtl__mpi_free(dtl__mpi_of(c));
}

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
    .reduce_scatterv_async = mpi_reduce_scatterv_async, .all_to_allv_displs_async = mpi_all_to_allv_displs_async,
    .wait = mpi_wait, .test = mpi_test,
    .split = mpi_split, .check = mpi_check, .abort = mpi_abort, .destroy = mpi_destroy,
    .synchronize = mpi_synchronize,
};

static dtl_status dtl__comm_wrap_mpi(MPI_Comm dup, const dtl__mpi *parent, dtl_comm **out) {
  static MPI_User_function *const fns[2][4] = {{dtl__f16_sum, dtl__f16_prod, dtl__f16_max, dtl__f16_min},
                                               {dtl__bf16_sum, dtl__bf16_prod, dtl__bf16_max, dtl__bf16_min}};
  static MPI_User_function *const f8_fns[2][2] = {{dtl__f8e4m3_max, dtl__f8e4m3_min},
                                                  {dtl__f8e5m2_max, dtl__f8e5m2_min}};
  dtl__mpi *m = dtl__calloc(1, sizeof *m);
  if (!m) {
    MPI_Comm_free(&dup);
    return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm_from_mpi: out of host memory");
  }
  m->comm = dup;
  for (int k = 0; k < 2; k++)
    for (int j = 0; j < 4; j++) m->half_op[k][j] = MPI_OP_NULL;
  for (int k = 0; k < 2; k++)
    for (int j = 0; j < 2; j++) m->f8_op[k][j] = MPI_OP_NULL;
  int rc = MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  for (int k = 0; k < 2 && rc == MPI_SUCCESS; k++)
    for (int j = 0; j < 4 && rc == MPI_SUCCESS; j++) rc = MPI_Op_create(fns[k][j], 1, &m->half_op[k][j]);
  for (int k = 0; k < 2 && rc == MPI_SUCCESS; k++)
    for (int j = 0; j < 2 && rc == MPI_SUCCESS; j++) rc = MPI_Op_create(f8_fns[k][j], 1, &m->f8_op[k][j]);
  int rank = 0, size = 0, flag = 0, *tag_ub = NULL;
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(dup, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(dup, &size);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_get_attr(dup, MPI_TAG_UB, &tag_ub, &flag);
  if (rc != MPI_SUCCESS) {
    dtl__mpi_free(m);
    return dtl__mpi_error("dtl_comm_from_mpi", rc);
  }
  m->tag_span = (flag && tag_ub ? *tag_ub : 32767) - DTL__TAG_ASYNC + 1; /* MPI promises a bound >= 32767 */
  m->limit = parent ? parent->limit : (size_t)INT_MAX;
  dtl_status st = DTL_OK;
  /* A new communicator reads the table from the environment (and a profile's, which must have been recorded on
   * this many ranks of this engine); dtl_comm_from_mpi agrees on it (with its verdict). A split keeps its parent's. */
  if (parent) m->table = parent->table;
  else {
    dtl__profile prof;
    st = dtl__algo_table_from_env(&m->table, "dtl_comm_from_mpi", &prof);
    if (st == DTL_OK && prof.engine[0]) st = dtl__profile_check(&prof, "dtl_comm_from_mpi", "mpi", size);
  }
  /* One block: xfers and offs (2 x size each), reqs (4 x size), counts (4 x size ints). */
  size_t p = (size_t)size;
  if (st == DTL_OK &&
      !(m->xfers = dtl__malloc((sizeof(dtl__xfer) + sizeof(size_t)) * 2 * p + (sizeof(MPI_Request) + sizeof(int)) * 4 * p)))
    st = dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm_from_mpi: out of host memory");
  if (st != DTL_OK) {
    dtl__mpi_free(m);
    return st;
  }
  m->offs = (size_t *)(m->xfers + 2 * p);
  m->reqs = (MPI_Request *)(m->offs + 2 * p);
  m->counts = (int *)(m->reqs + 4 * p);
  /* The requests the layers keep in flight at once (a CP ring's transfer, a plan's parts), acquired now: a first
   * nonblocking call then allocates nothing, so it cannot fail alone inside a collective layer (comm.h). */
  for (int i = 0; i < DTL__MPI_POOL_RESERVED && st == DTL_OK; i++) {
    dtl__mpi_request *r = dtl__malloc(dtl__mpi_request_size(size));
    if (!r) {
      st = dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm_from_mpi: out of host memory");
      break;
    }
    memset(r, 0, sizeof *r);
    r->next = m->pool;
    m->pool = r;
    m->pooled++;
  }
  if (st == DTL_OK) st = dtl__comm_new(&dtl__mpi_ops, dtl__mem_host(), rank, size, m, out);
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
  dtl_comm *c = NULL;
  dtl_status st = dtl__comm_wrap_mpi(dup, NULL, &c);
  int rank = 0, size = 1, rpn = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  /* The node table: DTL_RANKS_PER_NODE and the scratch of its gathering, before the agreement, so that after it
   * nothing but MPI calls can fail (an MPI failure there is MPI's own: dtl cannot recover from it). */
  if (st == DTL_OK) st = dtl__ranks_per_node_from_env("dtl_comm_from_mpi", &rpn);
  int *keys = NULL;
  if (st == DTL_OK && size > 1 && !(keys = dtl__malloc(sizeof(int) * 3 * (size_t)size)))
    st = dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm_from_mpi: out of host memory");
  /* A creation agrees, like dtl_comm_split: a rank that ran out of memory (or could not read DTL_ALGO or
   * DTL_RANKS_PER_NODE) after the (collective) duplication must not leave its peers with a communicator it lacks,
   * and every rank must have chosen the same algorithm table (an algorithm differing between ranks would hang) and
   * the same node rule (it decides the collectives below). One all-reduce (max) over comm, which every rank is
   * calling this function on, of (failed ? (1 + status, size - rank) : 0) and the fingerprint of the table and the
   * rule and its negation: the peers learn the first failing rank with the worst status, or that the choices
   * differ. */
  double timeout = c ? dtl__comm_timeout_s(c) : 0;
  uint64_t tbits = 0;
  memcpy(&tbits, &timeout, sizeof tbits);
  int64_t fp = c ? (int64_t)(dtl__fp_mix(dtl__fp_mix(dtl__mpi_of(c)->table.fp, (uint64_t)rpn), tbits) >> 1) : 0;
  /* Under a deadline the values live in the new communicator's agreement memory, which a timed-out agreement
   * leaves to MPI with the communicator (never freed then); without one (and wherever c could not be made, which
   * has none) on the stack. */
  int64_t v_stack[3], *v = timeout > 0 ? c->agree_host : v_stack;
  v[0] = st == DTL_OK ? 0 : (int64_t)(1 + (int)st) << 32 | (int64_t)(size - rank);
  v[1] = fp;
  v[2] = -fp;
  /* Nonblocking on every rank (whatever its DTL_TIMEOUT: MPI never matches a blocking collective with a
   * nonblocking one), completed under DTL_TIMEOUT where this rank could read it. */
  MPI_Request vr = MPI_REQUEST_NULL;
  dtl__deadline d;
  dtl__deadline_begin(&d, timeout);
  int rc = MPI_Iallreduce(MPI_IN_PLACE, v, 3, MPI_INT64_T, MPI_MAX, comm, &vr);
  if (rc == MPI_SUCCESS && (rc = dtl__mpi_poll(&d, 1, &vr, MPI_STATUSES_IGNORE)) == DTL__MPI_LATE) {
    dtl__free(keys); /* c is left as it is: MPI still holds v, in c's memory */
    if (st != DTL_OK) return st;
    return dtl__error(DTL_ERR_TIMEOUT, "dtl_comm_from_mpi: timed out after %.3f s (DTL_TIMEOUT=%g) waiting for the "
                      "other %d ranks of the communicator to call it; this rank is %d", dtl__deadline_waited(&d),
                      timeout, size - 1, rank);
  }

  if (v != v_stack) v = memcpy(v_stack, v, sizeof v_stack); /* c may go below */
  if (rc == MPI_SUCCESS && v[0] == 0 && v[1] == -v[2]) {
    /* Every rank got here: each names its node by a key, one all-gather shares the keys. */
    if (size > 1) {
      rc = dtl__mpi_node_key(dtl__mpi_of(c)->comm, rpn, &keys[rank]);
      st = rc == MPI_SUCCESS ? DTL_OK : dtl__mpi_error("dtl_comm_from_mpi", rc);
      MPI_Comm dc = dtl__mpi_of(c)->comm;
      if (st == DTL_OK && timeout > 0) {
        rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, keys, 1, MPI_INT, dc, &vr);
        st = rc == MPI_SUCCESS ? dtl__mpi_waitall(c, "dtl_comm_from_mpi", 1, &vr, MPI_STATUSES_IGNORE)
                               : dtl__mpi_error("dtl_comm_from_mpi", rc);
      } else if (st == DTL_OK) {
        rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, keys, 1, MPI_INT, dc);
        if (rc != MPI_SUCCESS) st = dtl__mpi_error("dtl_comm_from_mpi", rc);
      }
      if (st == DTL_OK) dtl__comm_set_node_keys(c, keys, keys + size);
      if (st != DTL_ERR_TIMEOUT) dtl__free(keys); /* after a timeout MPI may still write into it */
    }
    if (st == DTL_OK) {
      *out = c;
      return DTL_OK;
    }
    dtl_comm_destroy(c);
    return st;
  }
  dtl__free(keys);
  dtl_comm_destroy(c);
  if (st != DTL_OK) return st;
  if (rc != MPI_SUCCESS) return dtl__mpi_error("dtl_comm_from_mpi", rc);
  if (v[0] == 0)
    return dtl__error(DTL_ERR_MISMATCH, "dtl_comm_from_mpi: DTL_ALGO, DTL_ALGO_TABLE, DTL_PROFILE, DTL_RANKS_PER_NODE "
                      "or DTL_TIMEOUT differs between the ranks (every rank must choose its algorithms and nodes alike)");
  dtl_status theirs = (dtl_status)((v[0] >> 32) - 1);
  return dtl__error(theirs, "dtl_comm_from_mpi: rank %d failed (%s; its dtl_last_error says why), so no rank went on",
                    size - (int)(v[0] & 0xffffffff), dtl_status_name(theirs));
}

MPI_Comm dtl_comm_mpi_handle(const dtl_comm *c) {
  return (c && c->ops == &dtl__mpi_ops) ? dtl__mpi_of(c)->comm : MPI_COMM_NULL;
}

const char *dtl_comm_mpi_last_algorithm(const dtl_comm *c) {
  if (!c || c->ops != &dtl__mpi_ops || !dtl__mpi_of(c)->any_call) return "";
  dtl__mpi *m = dtl__mpi_of(c);
  snprintf(m->last_text, sizeof m->last_text, "%s:%s", dtl__coll_name(m->last_coll), dtl__algo_name(m->last_algo));
  return m->last_text;
}

const dtl__algo_table *dtl__mpi_table(const dtl_comm *c) {
  return c && c->ops == &dtl__mpi_ops ? &dtl__mpi_of(c)->table : NULL;
}

dtl__algo_table *dtl__mpi_table_of(dtl_comm *c) { return c && c->ops == &dtl__mpi_ops ? &dtl__mpi_of(c)->table : NULL; }

dtl_status dtl_mpi_algorithm_table(char *buf, size_t cap, size_t *len) {
  static const char fn[] = "dtl_mpi_algorithm_table";
  DTL_CHECK_ARG(buf != NULL || cap == 0, fn, "buf=NULL with cap=%zu", cap);
  dtl__algo_table t;
  DTL_TRY(dtl__algo_table_from_env(&t, fn, NULL));
  size_t n = dtl__algo_table_render(&t, buf, cap);
  if (len) *len = n;
  return DTL_OK;
}

dtl_status dtl__mpi_set_limit(dtl_comm *c, size_t limit) {
  DTL_CHECK_ARG(c && c->ops == &dtl__mpi_ops, "dtl__mpi_set_limit", "comm is not an MPI communicator");
  DTL_CHECK_ARG(limit >= 1 && limit <= (size_t)INT_MAX, "dtl__mpi_set_limit", "limit=%zu (expected 1..INT_MAX)", limit);
  dtl__mpi_of(c)->limit = limit;
  return DTL_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The NCCL transport: fills the backend vtable with NCCL calls and CUDA kernels enqueued on the
 * communicator's stream. Collectives NCCL lacks (uneven all-gather and reduce-scatter, scatter, gather,
 * all-to-all-v) are grouped point-to-point calls or grouped collectives: never padding, never scratch.
 * Integer DTL_AVG is a sum followed by a division kernel, as on MPI. The 8-bit floats move as NCCL's FP8 types where
 * the NCCL has them (else as bytes) and reduce (max, min) where NCCL and the device can. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include "comm/backend.h"
#include "comm/deadline.h"
#include "comm/device_memory.h"
#include "dtl/nccl.h"

typedef struct {
  ncclComm_t comm; /* NULL once aborted */
  cudaStream_t stream;
  int device;
  bool owns_comm;     /* made by dtl_comm_split: dtl destroys it; the constructor's comm stays the caller's */
  int32_t *barrier_word; /* one device element for the barrier's all-reduce */
  /* One grouped point-to-point exchange: per peer, what to send and where to receive (count 0 = nothing).
   * Sized to the communicator once, filled by each call. */
  const char **send_ptr;
  char **recv_ptr;
  size_t *send_count, *recv_count;
  bool fp8_types;        /* the library takes ncclFloat8e4m3 / ncclFloat8e5m2 (else the 8-bit floats move as bytes) */
  char fp8_refusal[192]; /* why max and min of the 8-bit floats are refused here ("": they are not) */
} dtl__nccl;

static dtl__nccl *dtl__nccl_of(const dtl_comm *c) { return (dtl__nccl *)c->impl; }

/* --- errors and the calling scope ---------------------------------------------------------------------- */
/* what: "" for the result of a call, "asynchronous " for the communicator's error state. */
static dtl_status dtl__nccl_fail_as(ncclComm_t comm, const char *fn, const char *what, ncclResult_t r) {
  const char *last = comm ? ncclGetLastError(comm) : NULL;
  return dtl__error(DTL_ERR_COMM, "%s: %sNCCL error %d (%s)%s%s", fn, what, (int)r, ncclGetErrorString(r),
                    last && *last ? ": " : "", last && *last ? last : "");
}
static dtl_status dtl__nccl_fail(ncclComm_t comm, const char *fn, ncclResult_t r) {
  return dtl__nccl_fail_as(comm, fn, "", r);
}

/* Maps a call's result to a status. On a non-blocking communicator (ncclConfig_t.blocking = 0) a call may
 * return ncclInProgress: then wait until the communicator's state settles, so that every dtl call has
 * finished enqueuing when it returns, whatever mode the caller chose. */
static dtl_status dtl__nccl_settle(ncclComm_t comm, const char *fn, ncclResult_t r) {
  while (r == ncclInProgress) {
    sched_yield();
    ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) r = q;
  }
  return r == ncclSuccess ? DTL_OK : dtl__nccl_fail(comm, fn, r);
}

/* Polls the asynchronous error state that an earlier call, a peer or the network may have set. */
static dtl_status dtl__nccl_poll(dtl_comm *c, const char *fn) {
  ncclComm_t comm = dtl__nccl_of(c)->comm;
  if (!comm) return dtl__error(DTL_ERR_COMM, "%s: the communicator was aborted", fn);
  ncclResult_t state = ncclSuccess, q = ncclCommGetAsyncError(comm, &state);
  if (q != ncclSuccess) return dtl__nccl_fail(comm, fn, q);
  while (state == ncclInProgress) { /* a non-blocking comm still busy with the caller's own NCCL call */
    sched_yield();
    if ((q = ncclCommGetAsyncError(comm, &state)) != ncclSuccess) return dtl__nccl_fail(comm, fn, q);
  }
  return state == ncclSuccess ? DTL_OK : dtl__nccl_fail_as(comm, fn, "asynchronous ", state);
}

/* Kernels and NCCL calls run with the stream's device current; dtl restores the caller's device on return.
 * prev_device < 0: nothing to restore. */
typedef struct {
  int prev_device;
} dtl__nccl_scope;

static dtl_status dtl__nccl_device_enter(dtl_comm *c, const char *fn, dtl__nccl_scope *s) {
  return dtl__cuda_device_enter(dtl__nccl_of(c)->device, fn, &s->prev_device);
}

static dtl_status dtl__nccl_leave(dtl__nccl_scope *s, dtl_status st) { return dtl__cuda_device_leave(s->prev_device, st); }

/* The prologue of every communicating call: poll async errors, then make the comm's device current. */
static dtl_status dtl__nccl_begin(dtl_comm *c, const char *fn, dtl__nccl_scope *s) {
  DTL_TRY(dtl__comm_live(c, fn));
  DTL_TRY(dtl__nccl_poll(c, fn));
  return dtl__nccl_device_enter(c, fn, s);
}

static dtl_status dtl__nccl_finish(dtl_comm *c, dtl__nccl_scope *s, const char *fn, ncclResult_t r) {
  return dtl__nccl_leave(s, dtl__nccl_settle(dtl__nccl_of(c)->comm, fn, r));
}

static dtl_status dtl__cuda_call(const char *fn, cudaError_t e) {
  return e == cudaSuccess ? DTL_OK : dtl__cuda_error(fn, e);
}

/* Waits for the stream while watching NCCL's error state, so that a failed peer surfaces as DTL_ERR_COMM
 * instead of a hang in cudaStreamSynchronize; under the communicator's deadline (comm.h) with its back-off, and
 * DTL_ERR_TIMEOUT when the stream has not drained by then (the kernels stay enqueued: dtl_comm_abort, which calls
 * ncclCommAbort on a communicator dtl made, releases them). */
static dtl_status dtl__nccl_wait(dtl_comm *c, const char *fn) {
  dtl__nccl *n = dtl__nccl_of(c);
  dtl__deadline d;
  dtl__deadline_begin(&d, dtl__comm_timeout_s(c));
  bool timed = dtl__comm_timed(c);
  for (;;) {
    cudaError_t e = cudaStreamQuery(n->stream);
    if (e == cudaSuccess) return DTL_OK;
    if (e != cudaErrorNotReady) return dtl__cuda_error(fn, e);
    if (n->comm) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(n->comm, &state);
      if (state != ncclSuccess && state != ncclInProgress) return dtl__nccl_fail_as(n->comm, fn, "asynchronous ", state);
    }
    if (!timed) sched_yield();
    else if (!dtl__deadline_backoff(&d)) return dtl__comm_timeout(c, fn, &d, "");
  }
}

/* --- types and ops ------------------------------------------------------------------------------------- */
/* NCCL 2.24 added the FP8 types; its reductions on them need a device of compute capability 9.0 or more. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
#define DTL__NCCL_FP8 1
#else
#define DTL__NCCL_FP8 0
#endif
#define DTL__NCCL_FP8_VERSION 22400 /* NCCL_VERSION(2, 24, 0), as ncclGetVersion reports it */

static ncclDataType_t dtl__nccl_type(const dtl__nccl *n, dtl_dtype t) {
  switch (t) {
    case DTL_FLOAT32: return ncclFloat32;
    case DTL_FLOAT64: return ncclFloat64;
    case DTL_FLOAT16: return ncclFloat16;
    case DTL_BFLOAT16: return ncclBfloat16;
    case DTL_INT8: return ncclInt8;
    case DTL_UINT8: return ncclUint8;
    case DTL_INT32: return ncclInt32;
    case DTL_INT64: return ncclInt64;
    case DTL_FLOAT8_E4M3:
#if DTL__NCCL_FP8
      if (n->fp8_types) return ncclFloat8e4m3;
#endif
      return ncclUint8; /* bytes move the same; no reduction gets here (fp8_refusal) */
    case DTL_FLOAT8_E5M2:
#if DTL__NCCL_FP8
      if (n->fp8_types) return ncclFloat8e5m2;
#endif
      return ncclUint8;
  }
  return ncclInt64;
}

/* What this build, the NCCL library and the device allow for the 8-bit floats (n->device set). */
static void dtl__nccl_fp8_caps(dtl__nccl *n) {
  int version = 0, major = 0, minor = 0;
  if (ncclGetVersion(&version) != ncclSuccess) version = 0;
  n->fp8_types = DTL__NCCL_FP8 && version >= DTL__NCCL_FP8_VERSION;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, n->device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, n->device) != cudaSuccess) {
    cudaGetLastError(); /* leave no error behind for the caller's next check */
    major = minor = 0;
  }
  n->fp8_refusal[0] = '\0';
  if (!DTL__NCCL_FP8)
    snprintf(n->fp8_refusal, sizeof n->fp8_refusal, "dtl was built against NCCL %d.%d.%d, which has no FP8 types "
             "(NCCL 2.24 added them); reduce in f32 or bf16 and convert", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  else if (!n->fp8_types)
    snprintf(n->fp8_refusal, sizeof n->fp8_refusal, "the NCCL library is version code %d, which has no FP8 types "
             "(NCCL 2.24 added them); reduce in f32 or bf16 and convert", version);
  else if (major < 9)
    snprintf(n->fp8_refusal, sizeof n->fp8_refusal, "device %d has compute capability %d.%d and NCCL reduces FP8 "
             "from 9.0 (sm_90) on; reduce in f32 or bf16 and convert", n->device, major, minor);
}

/* Integer averages reduce as sums and are divided by dtl afterwards (truncating, as on MPI); floating
 * averages are NCCL's own ncclAvg. */
static bool dtl__nccl_int_avg(dtl_dtype t, dtl_reduce_op op) { return op == DTL_AVG && !dtl__dtype_is_float(t); }

static ncclRedOp_t dtl__nccl_op(dtl_dtype t, dtl_reduce_op op) {
  switch (op) {
    case DTL_PROD: return ncclProd;
    case DTL_MAX: return ncclMax;
    case DTL_MIN: return ncclMin;
    case DTL_AVG: return dtl__nccl_int_avg(t, op) ? ncclSum : ncclAvg;
    default: return ncclSum;
  }
}

static dtl_status dtl__nccl_finish_avg(dtl_comm *c, const char *fn, void *buf, size_t count, dtl_dtype t,
                                       dtl_reduce_op op) {
  if (!dtl__nccl_int_avg(t, op)) return DTL_OK;
  dtl_status st = dtl__cuda_divide(buf, count, t, c->size, dtl__nccl_of(c)->stream);
  return st == DTL_OK ? DTL_OK : dtl__error_prefix(st, "%s", fn);
}

/* --- grouped point-to-point ---------------------------------------------------------------------------- */
static void dtl__nccl_plan_clear(dtl_comm *c) {
  dtl__nccl *n = dtl__nccl_of(c);
  memset(n->send_count, 0, (size_t)c->size * sizeof *n->send_count);
  memset(n->recv_count, 0, (size_t)c->size * sizeof *n->recv_count);
}

/* Runs the exchange planned in send_ptr, recv_ptr, send_count and recv_count: one NCCL group of ncclSend/ncclRecv for the
 * peers with a non-zero count; this rank's own block is a device copy (none when it is already in place).
 * Must be called inside a device scope. */
static dtl_status dtl__nccl_exchange(dtl_comm *c, const char *fn, dtl_dtype t) {
  dtl__nccl *n = dtl__nccl_of(c);
  const int me = c->rank;
  const size_t es = dtl_dtype_size(t);
  const ncclDataType_t dt = dtl__nccl_type(n, t);
  if (n->send_count[me] != n->recv_count[me])
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: send_counts[%d]=%zu differs from recv_counts[%d]=%zu", fn, me,
                      n->send_count[me], me, n->recv_count[me]);
  if (n->send_count[me] && n->send_ptr[me] != n->recv_ptr[me])
    DTL_TRY(dtl__cuda_call(fn, cudaMemcpyAsync(n->recv_ptr[me], n->send_ptr[me], n->send_count[me] * es,
                                               cudaMemcpyDefault, n->stream)));
  ncclResult_t r = ncclGroupStart();
  for (int j = 0; j < c->size && (r == ncclSuccess || r == ncclInProgress); j++) {
    if (j == me) continue;
    if (n->send_count[j]) r = ncclSend(n->send_ptr[j], n->send_count[j], dt, j, n->comm, n->stream);
    if (n->recv_count[j] && (r == ncclSuccess || r == ncclInProgress))
      r = ncclRecv(n->recv_ptr[j], n->recv_count[j], dt, j, n->comm, n->stream);
  }
  ncclResult_t end = ncclGroupEnd(); /* always closes the group, also after a failed call inside it */
  if (r == ncclSuccess || r == ncclInProgress) r = end;
  return dtl__nccl_settle(n->comm, fn, r);
}

static bool dtl__counts_equal(const dtl_comm *c, const size_t *counts) {
  for (int j = 1; j < c->size; j++)
    if (counts[j] != counts[0]) return false;
  return true;
}

/* --- collectives --------------------------------------------------------------------------------------- */
static dtl_status nccl_broadcast(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int root) {
  static const char fn[] = "dtl_broadcast";
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  if (count == 0) return dtl__nccl_leave(&s, DTL_OK);
  dtl__nccl *n = dtl__nccl_of(c);
  return dtl__nccl_finish(c, &s, fn, ncclBroadcast(buf, buf, count, dtl__nccl_type(n, t), root, n->comm, n->stream));
}

static dtl_status nccl_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, int root) {
  static const char fn[] = "dtl_scatter";
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  if (recv_count == 0) return dtl__nccl_leave(&s, DTL_OK);
  dtl__nccl *n = dtl__nccl_of(c);
  size_t block = recv_count * dtl_dtype_size(t);
  dtl__nccl_plan_clear(c);
  if (c->rank == root) {
    for (int j = 0; j < c->size; j++) {
      n->send_ptr[j] = (const char *)send + (size_t)j * block;
      n->send_count[j] = recv_count;
    }
  }
  n->recv_ptr[root] = recv;
  n->recv_count[root] = recv_count;
  return dtl__nccl_leave(&s, dtl__nccl_exchange(c, fn, t));
}

static dtl_status nccl_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t, int root) {
  static const char fn[] = "dtl_gather";
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  if (send_count == 0) return dtl__nccl_leave(&s, DTL_OK);
  dtl__nccl *n = dtl__nccl_of(c);
  size_t block = send_count * dtl_dtype_size(t);
  dtl__nccl_plan_clear(c);
  if (c->rank == root) {
    for (int j = 0; j < c->size; j++) {
      n->recv_ptr[j] = (char *)recv + (size_t)j * block;
      n->recv_count[j] = send_count;
    }
  }
  n->send_ptr[root] = send;
  n->send_count[root] = send_count;
  return dtl__nccl_leave(&s, dtl__nccl_exchange(c, fn, t));
}

static dtl_status nccl_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op,
                              int root) {
  static const char fn[] = "dtl_reduce";
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  if (count == 0) return dtl__nccl_leave(&s, DTL_OK);
  dtl__nccl *n = dtl__nccl_of(c);
  dtl_status st = dtl__nccl_settle(
      n->comm, fn, ncclReduce(send, recv, count, dtl__nccl_type(n, t), dtl__nccl_op(t, op), root, n->comm, n->stream));
  if (st == DTL_OK && c->rank == root) st = dtl__nccl_finish_avg(c, fn, recv, count, t, op);
  return dtl__nccl_leave(&s, st);
}

static dtl_status dtl__nccl_all_gather(dtl_comm *c, const char *fn, const void *send, void *recv, size_t send_count,
                                       dtl_dtype t) {
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  if (send_count == 0) return dtl__nccl_leave(&s, DTL_OK);
  dtl__nccl *n = dtl__nccl_of(c);
  return dtl__nccl_finish(c, &s, fn, ncclAllGather(send, recv, send_count, dtl__nccl_type(n, t), n->comm, n->stream));
}

static dtl_status nccl_all_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t) {
  return dtl__nccl_all_gather(c, "dtl_all_gather", send, recv, send_count, t);
}

static dtl_status nccl_all_gatherv(dtl_comm *c, const void *send, size_t send_count, void *recv, const size_t *recv_counts,
                                   dtl_dtype t) {
  static const char fn[] = "dtl_all_gatherv";
  if (dtl__counts_equal(c, recv_counts)) return dtl__nccl_all_gather(c, fn, send, recv, send_count, t);
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  dtl__nccl *n = dtl__nccl_of(c);
  size_t es = dtl_dtype_size(t), displ = 0;
  for (int j = 0; j < c->size; j++) {
    n->send_ptr[j] = send;
    n->send_count[j] = send_count;
    n->recv_ptr[j] = (char *)recv + displ * es;
    n->recv_count[j] = recv_counts[j];
    displ += recv_counts[j];
  }
  return dtl__nccl_leave(&s, dtl__nccl_exchange(c, fn, t));
}

static dtl_status nccl_all_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op) {
  static const char fn[] = "dtl_all_reduce";
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  if (count == 0) return dtl__nccl_leave(&s, DTL_OK);
  dtl__nccl *n = dtl__nccl_of(c);
  dtl_status st = dtl__nccl_settle(
      n->comm, fn, ncclAllReduce(send, recv, count, dtl__nccl_type(n, t), dtl__nccl_op(t, op), n->comm, n->stream));
  if (st == DTL_OK) st = dtl__nccl_finish_avg(c, fn, recv, count, t, op);
  return dtl__nccl_leave(&s, st);
}

static dtl_status dtl__nccl_reduce_scatter(dtl_comm *c, const char *fn, const void *send, void *recv, size_t recv_count,
                                           dtl_dtype t, dtl_reduce_op op) {
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  if (recv_count == 0) return dtl__nccl_leave(&s, DTL_OK);
  dtl__nccl *n = dtl__nccl_of(c);
  dtl_status st = dtl__nccl_settle(n->comm, fn,
                                   ncclReduceScatter(send, recv, recv_count, dtl__nccl_type(n, t), dtl__nccl_op(t, op),
                                                     n->comm, n->stream));
  if (st == DTL_OK) st = dtl__nccl_finish_avg(c, fn, recv, recv_count, t, op);
  return dtl__nccl_leave(&s, st);
}

static dtl_status nccl_reduce_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                                      dtl_reduce_op op) {
  return dtl__nccl_reduce_scatter(c, "dtl_reduce_scatter", send, recv, recv_count, t, op);
}

/* Uneven blocks: one ncclReduce per non-empty block, rooted at the block's owner, fused in one group. */
static dtl_status nccl_reduce_scatterv(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts, dtl_dtype t,
                                       dtl_reduce_op op) {
  static const char fn[] = "dtl_reduce_scatterv";
  if (dtl__counts_equal(c, recv_counts)) return dtl__nccl_reduce_scatter(c, fn, send, recv, recv_counts[0], t, op);
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  dtl__nccl *n = dtl__nccl_of(c);
  size_t es = dtl_dtype_size(t), displ = 0;
  ncclDataType_t dt = dtl__nccl_type(n, t);
  ncclRedOp_t nop = dtl__nccl_op(t, op);
  ncclResult_t r = ncclGroupStart();
  for (int j = 0; j < c->size && (r == ncclSuccess || r == ncclInProgress); j++) {
    if (recv_counts[j])
      r = ncclReduce((const char *)send + displ * es, j == c->rank ? recv : NULL, recv_counts[j], dt, nop, j, n->comm,
                     n->stream);
    displ += recv_counts[j];
  }
  ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) r = end;
  dtl_status st = dtl__nccl_settle(n->comm, fn, r);
  if (st == DTL_OK) st = dtl__nccl_finish_avg(c, fn, recv, recv_counts[c->rank], t, op);
  return dtl__nccl_leave(&s, st);
}

static dtl_status dtl__nccl_check_not_aliased(const dtl_comm *c, const char *fn, const void *send, const void *recv,
                                              bool moves) {
  if (send == recv && moves && c->size > 1)
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: send == recv (in-place all-to-all is not supported)", fn);
  return DTL_OK;
}

static dtl_status nccl_all_to_all(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t) {
  static const char fn[] = "dtl_all_to_all";
  DTL_TRY(dtl__nccl_check_not_aliased(c, fn, send, recv, count_per_peer > 0));
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  if (count_per_peer == 0) return dtl__nccl_leave(&s, DTL_OK);
  dtl__nccl *n = dtl__nccl_of(c);
  size_t block = count_per_peer * dtl_dtype_size(t);
  for (int j = 0; j < c->size; j++) {
    n->send_ptr[j] = (const char *)send + (size_t)j * block;
    n->recv_ptr[j] = (char *)recv + (size_t)j * block;
    n->send_count[j] = n->recv_count[j] = count_per_peer;
  }
  return dtl__nccl_leave(&s, dtl__nccl_exchange(c, fn, t));
}

static dtl_status nccl_all_to_allv(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                   const size_t *recv_counts, dtl_dtype t) {
  static const char fn[] = "dtl_all_to_allv";
  bool moves = false;
  for (int j = 0; j < c->size; j++) moves |= (j != c->rank && (send_counts[j] || recv_counts[j]));
  DTL_TRY(dtl__nccl_check_not_aliased(c, fn, send, recv, moves));
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  dtl__nccl *n = dtl__nccl_of(c);
  size_t es = dtl_dtype_size(t), sd = 0, rd = 0;
  for (int j = 0; j < c->size; j++) {
    n->send_ptr[j] = (const char *)send + sd * es;
    n->recv_ptr[j] = (char *)recv + rd * es;
    n->send_count[j] = send_counts[j];
    n->recv_count[j] = recv_counts[j];
    sd += send_counts[j];
    rd += recv_counts[j];
  }
  return dtl__nccl_leave(&s, dtl__nccl_exchange(c, fn, t));
}

/* NCCL does not buffer: a send to oneself outside a group with its receive would never complete. */
static dtl_status dtl__nccl_check_peer(const dtl_comm *c, const char *fn, int peer) {
  if (peer == c->rank)
    return dtl__error(DTL_ERR_UNSUPPORTED, "%s: peer=%d is this rank (NCCL cannot send to itself outside a group; "
                      "copy the buffer on the device instead)", fn, peer);
  return DTL_OK;
}

static dtl_status nccl_send(dtl_comm *c, const void *buf, size_t count, dtl_dtype t, int peer) {
  static const char fn[] = "dtl_send";
  DTL_TRY(dtl__nccl_check_peer(c, fn, peer));
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  if (count == 0) return dtl__nccl_leave(&s, DTL_OK);
  dtl__nccl *n = dtl__nccl_of(c);
  return dtl__nccl_finish(c, &s, fn, ncclSend(buf, count, dtl__nccl_type(n, t), peer, n->comm, n->stream));
}

static dtl_status nccl_recv(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int peer) {
  static const char fn[] = "dtl_recv";
  DTL_TRY(dtl__nccl_check_peer(c, fn, peer));
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  if (count == 0) return dtl__nccl_leave(&s, DTL_OK);
  dtl__nccl *n = dtl__nccl_of(c);
  return dtl__nccl_finish(c, &s, fn, ncclRecv(buf, count, dtl__nccl_type(n, t), peer, n->comm, n->stream));
}

/* One group of ncclSend + ncclRecv (through the planned exchange); a message to oneself (counts equal, comm.c
 * checked) is a device copy, since NCCL never sends to its own rank. */
static dtl_status nccl_sendrecv(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv,
                                size_t recv_count, int source, dtl_dtype t) {
  static const char fn[] = "dtl_sendrecv";
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  dtl__nccl *n = dtl__nccl_of(c);
  dtl__nccl_plan_clear(c);
  n->send_ptr[dest] = send;
  n->send_count[dest] = send_count;
  n->recv_ptr[source] = recv;
  n->recv_count[source] = recv_count;
  return dtl__nccl_leave(&s, dtl__nccl_exchange(c, fn, t));
}

/* One group of ncclSend/ncclRecv over the listed peers only. NCCL calls are already asynchronous on the stream,
 * so the nonblocking form (req) is not offered. */
static dtl_status nccl_exchange(dtl_comm *c, int nsend, const int *send_peers, const void *const *send_bufs,
                                const size_t *send_counts, int nrecv, const int *recv_peers, void *const *recv_bufs,
                                const size_t *recv_counts, dtl_dtype t, dtl_request **req) {
  static const char fn[] = "dtl_exchange";
  if (req) return dtl__error(DTL_ERR_UNSUPPORTED, "%s: NCCL has no nonblocking form (its calls are already "
                             "asynchronous on the communicator's stream)", fn);
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  dtl__nccl *n = dtl__nccl_of(c);
  ncclDataType_t dt = dtl__nccl_type(n, t);
  ncclResult_t r = ncclGroupStart();
  for (int i = 0; i < nrecv && (r == ncclSuccess || r == ncclInProgress); i++)
    r = ncclRecv(recv_bufs[i], recv_counts[i], dt, recv_peers[i], n->comm, n->stream);
  for (int i = 0; i < nsend && (r == ncclSuccess || r == ncclInProgress); i++)
    r = ncclSend(send_bufs[i], send_counts[i], dt, send_peers[i], n->comm, n->stream);
  ncclResult_t end = ncclGroupEnd(); /* always closes the group, also after a failed call inside it */
  if (r == ncclSuccess || r == ncclInProgress) r = end;
  return dtl__nccl_leave(&s, dtl__nccl_settle(n->comm, fn, r));
}

static dtl_status nccl_barrier(dtl_comm *c) {
  static const char fn[] = "dtl_barrier";
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  dtl__nccl *n = dtl__nccl_of(c);
  dtl_status st = dtl__nccl_settle(
      n->comm, fn, ncclAllReduce(n->barrier_word, n->barrier_word, 1, ncclInt32, ncclSum, n->comm, n->stream));
  if (st == DTL_OK) st = dtl__nccl_wait(c, fn);
  return dtl__nccl_leave(&s, st);
}

static const dtl__comm_ops dtl__nccl_ops;

/* --- lifetime ------------------------------------------------------------------------------------------ */
static void dtl__nccl_free(dtl__nccl *n) {
  if (!n) return;
  if (n->barrier_word) {
    int cur = -1;
    cudaGetDevice(&cur);
    if (cur != n->device) cudaSetDevice(n->device);
    cudaFree(n->barrier_word);
    if (cur >= 0 && cur != n->device) cudaSetDevice(cur);
  }
  dtl__free(n->send_ptr);
  dtl__free(n->recv_ptr);
  dtl__free(n->send_count);
  dtl__free(n->recv_count);
  dtl__free(n);
}

/* Takes ownership of comm when owns_comm (it is destroyed here on failure). */
static dtl_status dtl__comm_wrap_nccl(const char *fn, ncclComm_t comm, cudaStream_t stream, bool owns_comm,
                                      dtl_comm **out) {
  int rank = 0, size = 0, device = 0;
  ncclResult_t r = ncclCommUserRank(comm, &rank);
  if (r == ncclSuccess) r = ncclCommCount(comm, &size);
  if (r == ncclSuccess) r = ncclCommCuDevice(comm, &device);
  dtl__nccl *n = NULL;
  dtl_status st = r == ncclSuccess ? DTL_OK : dtl__nccl_fail(comm, fn, r);
  if (st == DTL_OK) {
    n = dtl__calloc(1, sizeof *n);
    if (n) {
      n->send_ptr = dtl__calloc((size_t)size, sizeof *n->send_ptr);
      n->recv_ptr = dtl__calloc((size_t)size, sizeof *n->recv_ptr);
      n->send_count = dtl__calloc((size_t)size, sizeof *n->send_count);
      n->recv_count = dtl__calloc((size_t)size, sizeof *n->recv_count);
    }
    if (!n || !n->send_ptr || !n->recv_ptr || !n->send_count || !n->recv_count)
      st = dtl__error(DTL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  if (st == DTL_OK) {
    n->comm = comm;
    n->stream = stream;
    n->device = device;
    n->owns_comm = owns_comm;
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur != device) e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaMalloc((void **)&n->barrier_word, sizeof *n->barrier_word);
    if (e == cudaSuccess) e = cudaMemsetAsync(n->barrier_word, 0, sizeof *n->barrier_word, stream);
    if (cur >= 0 && cur != device) cudaSetDevice(cur);
    if (e != cudaSuccess) st = dtl__cuda_error(fn, e);
  }
  if (st == DTL_OK) dtl__nccl_fp8_caps(n);
  if (st == DTL_OK) st = dtl__comm_new(&dtl__nccl_ops, (dtl__mem){&dtl__cuda_mem_ops, device, stream}, rank, size, n, out);
  if (st == DTL_OK && n->fp8_refusal[0]) (*out)->fp8_reduce_refusal = n->fp8_refusal;
  if (st != DTL_OK) {
    dtl__nccl_free(n);
    if (owns_comm) ncclCommDestroy(comm);
  }
  return st;
}

static dtl_status nccl_split(dtl_comm *c, int color, int key, dtl_comm **out) {
  static const char fn[] = "dtl_comm_split";
  dtl__nccl_scope s;
  DTL_TRY(dtl__nccl_begin(c, fn, &s));
  dtl__nccl *n = dtl__nccl_of(c);
  ncclComm_t nc = NULL;
  ncclResult_t r = ncclCommSplit(n->comm, color, key, &nc, NULL);
  dtl_status st = (r == ncclInProgress && nc) ? dtl__nccl_settle(nc, fn, r) : dtl__nccl_settle(n->comm, fn, r);
  if (st != DTL_OK) {
    if (nc) ncclCommAbort(nc);
    return dtl__nccl_leave(&s, st);
  }
  /* The child shares the parent's stream, so steps on different mesh dims stay in order without events. */
  return dtl__nccl_leave(&s, dtl__comm_wrap_nccl(fn, nc, n->stream, true, out));
}

static dtl_status nccl_check(dtl_comm *c) {
  static const char fn[] = "dtl_comm_check";
  DTL_TRY(dtl__nccl_poll(c, fn));
  cudaError_t e = cudaStreamQuery(dtl__nccl_of(c)->stream); /* a sticky CUDA error (e.g. a bad pointer) */
  if (e != cudaSuccess && e != cudaErrorNotReady) return dtl__cuda_error(fn, e);
  return DTL_OK;
}

/* A communicator dtl made (a split) is aborted with ncclCommAbort, which frees it. A borrowed one (the caller's
 * ncclComm_t of dtl_comm_from_nccl) stays its owner's: dtl only stops using it, and its owner aborts it (comm.h). */
static dtl_status nccl_abort(dtl_comm *c) {
  dtl__nccl *n = dtl__nccl_of(c);
  if (!n->comm) return DTL_OK;
  ncclComm_t comm = n->comm;
  n->comm = NULL;
  if (!n->owns_comm) return DTL_OK;
  ncclResult_t r = ncclCommAbort(comm);
  if (r != ncclSuccess) return dtl__error(DTL_ERR_COMM, "dtl_comm_abort: NCCL error %d (%s)", (int)r, ncclGetErrorString(r));
  return DTL_OK;
}

static void nccl_destroy(dtl_comm *c) {
  dtl__nccl *n = dtl__nccl_of(c);
  if (n->comm && n->owns_comm) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(n->comm, &state);
    /* Finalize flushes outstanding work; after an error it could wait forever, so abort instead. */
    if (state == ncclSuccess && dtl__nccl_settle(n->comm, "dtl_comm_destroy", ncclCommFinalize(n->comm)) == DTL_OK)
      ncclCommDestroy(n->comm);
    else
      ncclCommAbort(n->comm);
  }
  dtl__nccl_free(n);
}

static dtl_status nccl_synchronize(dtl_comm *c) {
  static const char fn[] = "dtl synchronize";
  if (dtl__nccl_of(c)->comm) DTL_TRY(dtl__nccl_poll(c, fn));
  return dtl__nccl_wait(c, fn);
}

static const dtl__comm_ops dtl__nccl_ops = {
    .name = "nccl",
    .broadcast = nccl_broadcast, .scatter = nccl_scatter, .gather = nccl_gather, .reduce = nccl_reduce,
    .all_gather = nccl_all_gather, .all_gatherv = nccl_all_gatherv, .all_reduce = nccl_all_reduce,
    .reduce_scatter = nccl_reduce_scatter, .reduce_scatterv = nccl_reduce_scatterv, .all_to_all = nccl_all_to_all,
    .all_to_allv = nccl_all_to_allv, .send = nccl_send, .recv = nccl_recv, .sendrecv = nccl_sendrecv,
    .barrier = nccl_barrier, .exchange = nccl_exchange,
    .split = nccl_split, .check = nccl_check, .abort = nccl_abort, .destroy = nccl_destroy,
    .synchronize = nccl_synchronize,
};

/* --- public -------------------------------------------------------------------------------------------- */
dtl_status dtl_comm_from_nccl(ncclComm_t comm, cudaStream_t stream, dtl_comm **out) {
  static const char fn[] = "dtl_comm_from_nccl";
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_CHECK_ARG(comm != NULL, fn, "comm=NULL");
  ncclResult_t state = ncclSuccess, q = ncclCommGetAsyncError(comm, &state);
  if (q != ncclSuccess) return dtl__nccl_fail(comm, fn, q);
  DTL_TRY(dtl__nccl_settle(comm, fn, state));
#if CUDART_VERSION >= 12080
  if (stream) { /* the legacy default stream (0) is whichever device is current, which dtl makes the comm's */
    int sdev = -1, cdev = -1;
    cudaError_t e = cudaStreamGetDevice(stream, &sdev);
    if (e != cudaSuccess) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: stream is not a valid CUDA stream (%s)", fn,
                                            cudaGetErrorString(e));
    if (ncclCommCuDevice(comm, &cdev) == ncclSuccess && cdev != sdev)
      return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: stream belongs to device %d but comm to device %d", fn, sdev, cdev);
  }
#endif
  /* NCCL gives no host channel to learn the nodes on: one node, unless DTL_RANKS_PER_NODE=n groups n consecutive
   * ranks of this communicator (its splits are taken as one node). */
  int rpn = 0;
  DTL_TRY(dtl__ranks_per_node_from_env(fn, &rpn));
  dtl_comm *c = NULL;
  DTL_TRY(dtl__comm_wrap_nccl(fn, comm, stream, false, &c));
  if (rpn > 1 && c->size > rpn) {
    c->nnodes = (c->size + rpn - 1) / rpn;
    for (int r = 0; r < c->size; r++) c->node[r] = r / rpn;
  }
  *out = c;
  return DTL_OK;
}

cudaStream_t dtl_comm_nccl_stream(const dtl_comm *c) {
  return (c && c->ops == &dtl__nccl_ops) ? dtl__nccl_of(c)->stream : NULL;
}

ncclComm_t dtl_comm_nccl_handle(const dtl_comm *c) {
  return (c && c->ops == &dtl__nccl_ops) ? dtl__nccl_of(c)->comm : NULL;
}

int dtl_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* leave no error behind for the caller's next check */
    return 0;
  }
  return n;
}

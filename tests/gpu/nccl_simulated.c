/* SPDX-License-Identifier: Apache-2.0 */
/* The NCCL transport's own logic at world sizes 1..5, on a simulated NCCL: this program defines the NCCL
 * and CUDA runtime functions that src/comm/nccl.c calls (the executable's definitions take precedence
 * over libnccl/libcudart), with p ranks in one process and host memory standing in for device memory.
 * Each rank's call only records its operations, as NCCL only enqueues; once every rank has made the call,
 * progress() matches sends with receives and runs the collectives. What it checks: how each dtl collective
 * and dtl_sendrecv is mapped to NCCL (grouped send/recv, grouped reduces, zero counts skipped, no self
 * send), the results against a dense oracle, async error polling, non-blocking (ncclInProgress) settling,
 * error mapping and abort; the 8-bit floats as NCCL's FP8 types (or as bytes before NCCL 2.24) and their max and
 * min refused where the simulated NCCL or device cannot reduce them. The kernels and the real engine are covered
 * by device_kernels.c and nccl_world1.c on a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "comm/backend.h"
#include "common/half.h"
#include "dtl/nccl.h"

#define MAXP 5
#define MAXOPS 64

/* --- the simulated engine ---------------------------------------------------------------------------- */
struct ncclComm {
  int rank, size;
  ncclResult_t state; /* what ncclCommGetAsyncError reports */
  int polls_left;     /* while state == ncclInProgress: polls until it becomes settle_to */
  bool aborted;
};

typedef enum { OP_SEND, OP_RECV, OP_BCAST, OP_REDUCE, OP_ALLGATHER, OP_ALLREDUCE, OP_REDUCESCATTER, OP_KINDS } op_kind;
typedef struct {
  op_kind kind;
  int peer; /* send/recv: the peer; rooted collectives: the root */
  const void *send;
  void *recv;
  size_t count;
  ncclDataType_t dt;
  ncclRedOp_t op;
} op_rec;

static struct ncclComm world[MAXP];
static dtl_comm *comms[MAXP];
static int nranks;
static op_rec queue[MAXP][MAXOPS];
static int nq[MAXP];
static int executed[OP_KINDS]; /* operations run by progress(), by kind */
static int group_depth;
static struct ncclComm *group_comm;
/* Knobs of a test: non-blocking behaviour, a synchronous failure, the last error's text. */
static int inprogress_polls;
static ncclResult_t settle_to;
static ncclResult_t fail_next;
static int polls;
static char last_error[128];
/* What the simulated library and device are (ncclGetVersion, cudaDeviceGetAttribute), and the datatype of the last
 * call enqueued. */
static int sim_version = 22809, sim_cc_major = 9, sim_cc_minor = 0;
static ncclDataType_t last_dt;

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
#define SIM_FP8 1
#define SIM_IS_FP8(t) ((t) == ncclFloat8e4m3 || (t) == ncclFloat8e5m2)
#else
#define SIM_FP8 0
#define SIM_IS_FP8(t) false
#endif

static size_t nccl_size(ncclDataType_t t) {
  if (SIM_IS_FP8(t)) return 1;
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}
static bool nccl_is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64 || SIM_IS_FP8(t);
}
static double load(ncclDataType_t t, const void *p, size_t i) {
#if SIM_FP8
  if (t == ncclFloat8e4m3) return dtl__f8e4m3_to_f32(((const uint8_t *)p)[i]);
  if (t == ncclFloat8e5m2) return dtl__f8e5m2_to_f32(((const uint8_t *)p)[i]);
#endif
  switch (t) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclFloat16: return dtl__f16_to_f32(((const uint16_t *)p)[i]);
    case ncclBfloat16: return dtl__bf16_to_f32(((const uint16_t *)p)[i]);
    case ncclFloat32: return ((const float *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    default: fail_msg("simulated NCCL: unexpected datatype %d", (int)t);
  }
  return 0;
}
static void store(ncclDataType_t t, void *p, size_t i, double v) {
#if SIM_FP8
  if (t == ncclFloat8e4m3) ((uint8_t *)p)[i] = dtl__f32_to_f8e4m3((float)v);
  if (t == ncclFloat8e5m2) ((uint8_t *)p)[i] = dtl__f32_to_f8e5m2((float)v);
  if (SIM_IS_FP8(t)) return;
#endif
  switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ncclFloat16: ((uint16_t *)p)[i] = dtl__f32_to_f16((float)v); break;
    case ncclBfloat16: ((uint16_t *)p)[i] = dtl__f32_to_bf16((float)v); break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    default: ((double *)p)[i] = v; break;
  }
}

static ncclResult_t issue(ncclComm_t comm, op_rec r) {
  if (fail_next != ncclSuccess) {
    ncclResult_t f = fail_next;
    fail_next = ncclSuccess;
    snprintf(last_error, sizeof last_error, "simulated synchronous failure");
    return f;
  }
  assert_false(comm->aborted);
  if ((r.kind == OP_SEND || r.kind == OP_RECV) && r.peer == comm->rank)
    fail_msg("rank %d: point-to-point to itself (the own block must be a device copy)", comm->rank);
  if (r.count == 0) fail_msg("rank %d: an NCCL call with count 0 (dtl skips empty blocks)", comm->rank);
  if (SIM_IS_FP8(r.dt) && sim_version < 22400) fail_msg("an FP8 type passed to an NCCL before 2.24");
  if (SIM_IS_FP8(r.dt) && r.kind != OP_SEND && r.kind != OP_RECV && r.kind != OP_BCAST && r.kind != OP_ALLGATHER &&
      (sim_cc_major < 9 || (r.op != ncclMax && r.op != ncclMin)))
    fail_msg("an FP8 reduction NCCL cannot run (op %d, device %d.%d)", (int)r.op, sim_cc_major, sim_cc_minor);
  last_dt = r.dt;
  assert_true(nq[comm->rank] < MAXOPS);
  queue[comm->rank][nq[comm->rank]++] = r;
  if (group_depth > 0) {
    group_comm = comm;
    return ncclSuccess;
  }
  if (inprogress_polls > 0) {
    comm->state = ncclInProgress;
    comm->polls_left = inprogress_polls;
    return ncclInProgress;
  }
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  assert_true(group_depth > 0);
  if (--group_depth == 0 && group_comm && inprogress_polls > 0) {
    group_comm->state = ncclInProgress;
    group_comm->polls_left = inprogress_polls;
    group_comm = NULL;
    return ncclInProgress;
  }
  group_comm = NULL;
  return ncclSuccess;
}
ncclResult_t ncclSend(const void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  (void)s;
  return issue(c, (op_rec){OP_SEND, peer, b, NULL, n, t, ncclSum});
}
ncclResult_t ncclRecv(void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  (void)s;
  return issue(c, (op_rec){OP_RECV, peer, NULL, b, n, t, ncclSum});
}
ncclResult_t ncclBroadcast(const void *sb, void *rb, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t s) {
  (void)s;
  return issue(c, (op_rec){OP_BCAST, root, sb, rb, n, t, ncclSum});
}
ncclResult_t ncclReduce(const void *sb, void *rb, size_t n, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t c,
                        cudaStream_t s) {
  (void)s;
  return issue(c, (op_rec){OP_REDUCE, root, sb, rb, n, t, op});
}
ncclResult_t ncclAllGather(const void *sb, void *rb, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
  (void)s;
  return issue(c, (op_rec){OP_ALLGATHER, 0, sb, rb, n, t, ncclSum});
}
ncclResult_t ncclAllReduce(const void *sb, void *rb, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s) {
  (void)s;
  return issue(c, (op_rec){OP_ALLREDUCE, 0, sb, rb, n, t, op});
}
ncclResult_t ncclReduceScatter(const void *sb, void *rb, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t s) {
  (void)s;
  return issue(c, (op_rec){OP_REDUCESCATTER, 0, sb, rb, n, t, op});
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *state) {
  polls++;
  if (c->state == ncclInProgress && --c->polls_left <= 0) {
    c->state = settle_to;
    if (settle_to != ncclSuccess) snprintf(last_error, sizeof last_error, "simulated failure while in progress");
  }
  *state = c->state;
  return ncclSuccess;
}
const char *ncclGetLastError(ncclComm_t c) {
  (void)c;
  return last_error;
}
ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
  *rank = c->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
  *count = c->size;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *device) {
  (void)c;
  *device = 0;
  return ncclSuccess;
}
ncclResult_t ncclGetVersion(int *version) {
  *version = sim_version;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
  c->aborted = true;
  return ncclSuccess;
}

/* The CUDA runtime on host memory: copies and sets happen at once, the stream is always idle. */
cudaError_t cudaGetDevice(int *d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  if (attr == cudaDevAttrComputeCapabilityMajor) *value = sim_cc_major;
  else if (attr == cudaDevAttrComputeCapabilityMinor) *value = sim_cc_minor;
  else return cudaErrorInvalidValue;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
  *p = malloc(n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  (void)s;
  return cudaMalloc(p, n);
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  return cudaFree(p);
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  (void)s;
  memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s) {
  (void)k;
  (void)s;
  memmove(d, src, n);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}

/* Reduces element i over every rank's buffer (each at its own offset). */
static double reduce_at(const op_rec *rec[], size_t off, size_t i) {
  ncclDataType_t t = rec[0]->dt;
  ncclRedOp_t op = rec[0]->op;
  if (op == ncclAvg && !nccl_is_float(t)) fail_msg("ncclAvg on an integer type (dtl must sum and divide)");
  double acc = load(t, rec[0]->send, off + i);
  for (int r = 1; r < nranks; r++) {
    double v = load(t, rec[r]->send, off + i);
    switch (op) {
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      case ncclMin: acc = v < acc ? v : acc; break;
      default: acc += v; break;
    }
  }
  return op == ncclAvg ? acc / nranks : acc;
}

/* Runs everything the ranks enqueued: point-to-point matched per (sender, receiver) in call order, the
 * collectives in call order (each rank's m-th collective must agree with every other rank's). */
static void progress(void) {
  for (int i = 0; i < nranks; i++) {
    for (int j = 0; j < nranks; j++) {
      int a = 0, b = 0;
      for (;;) {
        while (a < nq[i] && !(queue[i][a].kind == OP_SEND && queue[i][a].peer == j)) a++;
        while (b < nq[j] && !(queue[j][b].kind == OP_RECV && queue[j][b].peer == i)) b++;
        if (a == nq[i] || b == nq[j]) {
          if (a != nq[i] || b != nq[j]) fail_msg("unmatched send/recv between ranks %d and %d", i, j);
          break;
        }
        const op_rec *s = &queue[i][a++], *r = &queue[j][b++];
        if (s->count != r->count || s->dt != r->dt)
          fail_msg("rank %d sends %zu elements to rank %d, which receives %zu", i, s->count, j, r->count);
        memcpy(r->recv, s->send, s->count * nccl_size(s->dt));
        executed[OP_SEND]++;
      }
    }
  }
  int m = 0;
  for (;;) {
    const op_rec *rec[MAXP];
    int found = 0;
    for (int r = 0; r < nranks; r++) {
      int k = 0, seen = -1;
      rec[r] = NULL;
      for (; k < nq[r]; k++)
        if (queue[r][k].kind != OP_SEND && queue[r][k].kind != OP_RECV && ++seen == m) break;
      if (k < nq[r]) {
        rec[r] = &queue[r][k];
        found++;
      }
    }
    if (found == 0) break;
    if (found != nranks) fail_msg("collective %d is missing on some rank", m);
    for (int r = 1; r < nranks; r++)
      if (rec[r]->kind != rec[0]->kind || rec[r]->count != rec[0]->count || rec[r]->dt != rec[0]->dt ||
          rec[r]->op != rec[0]->op || rec[r]->peer != rec[0]->peer)
        fail_msg("collective %d differs between rank 0 and rank %d", m, r);
    size_t n = rec[0]->count, es = nccl_size(rec[0]->dt);
    ncclDataType_t t = rec[0]->dt;
    unsigned char *tmp = malloc(n * es * (size_t)nranks);
    assert_non_null(tmp);
    switch (rec[0]->kind) {
      case OP_BCAST:
        memcpy(tmp, rec[rec[0]->peer]->send, n * es);
        for (int r = 0; r < nranks; r++) memcpy(rec[r]->recv, tmp, n * es);
        break;
      case OP_REDUCE:
      case OP_ALLREDUCE:
        for (size_t i = 0; i < n; i++) store(t, tmp, i, reduce_at(rec, 0, i));
        for (int r = 0; r < nranks; r++)
          if (rec[0]->kind == OP_ALLREDUCE || r == rec[0]->peer) memcpy(rec[r]->recv, tmp, n * es);
        break;
      case OP_ALLGATHER:
        for (int r = 0; r < nranks; r++) memcpy(tmp + (size_t)r * n * es, rec[r]->send, n * es);
        for (int r = 0; r < nranks; r++) memcpy(rec[r]->recv, tmp, n * es * (size_t)nranks);
        break;
      default: /* OP_REDUCESCATTER */
        for (size_t i = 0; i < n * (size_t)nranks; i++) store(t, tmp, i, reduce_at(rec, 0, i));
        for (int r = 0; r < nranks; r++) memcpy(rec[r]->recv, tmp + (size_t)r * n * es, n * es);
        break;
    }
    free(tmp);
    executed[rec[0]->kind]++;
    m++;
  }
  memset(nq, 0, sizeof nq);
}

static int make_world(int p) {
  nranks = p;
  memset(nq, 0, sizeof nq);
  memset(executed, 0, sizeof executed);
  inprogress_polls = 0;
  settle_to = ncclSuccess;
  fail_next = ncclSuccess;
  last_error[0] = '\0';
  for (int r = 0; r < p; r++) {
    world[r] = (struct ncclComm){.rank = r, .size = p, .state = ncclSuccess};
    if (dtl_comm_from_nccl(&world[r], 0, &comms[r]) != DTL_OK) return -1;
  }
  return 0;
}
static void free_world(void) {
  for (int r = 0; r < nranks; r++) dtl_comm_destroy(comms[r]);
  assert_int_equal(group_depth, 0);
}

/* --- data and oracle ---------------------------------------------------------------------------------- */
/* Element i of rank r's contribution: -2..2, so that sums and products over 5 ranks stay exact in every
 * dtype used here (bf16 and i8 included). */
static double val(int r, size_t i) { return (double)((r + (int)(i % 1000) * 3) % 5 - 2); }

static ncclDataType_t nt(dtl_dtype t) {
#if SIM_FP8
  if (t == DTL_FLOAT8_E4M3) return ncclFloat8e4m3;
  if (t == DTL_FLOAT8_E5M2) return ncclFloat8e5m2;
#endif
  static const ncclDataType_t m[] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16, ncclInt8, ncclUint8, ncclInt32, ncclInt64};
  return t < 8 ? m[t] : ncclUint8;
}
static void *buf_of(dtl_dtype t, size_t n, int r) {
  unsigned char *p = malloc(n * dtl_dtype_size(t) + 1);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) store(nt(t), p, i, val(r, i));
  return p;
}
static void expect_elem(dtl_dtype t, const void *p, size_t i, double want, const char *what, int rank) {
  double got = load(nt(t), p, i);
  if (got != want) fail_msg("%s: rank %d element %zu is %g, expected %g (dtype %s)", what, rank, i, got, want, dtl_dtype_name(t));
}
static double oracle_reduce(dtl_reduce_op op, size_t i, dtl_dtype t) {
  double acc = val(0, i);
  for (int r = 1; r < nranks; r++) {
    double v = val(r, i);
    acc = op == DTL_PROD ? acc * v : op == DTL_MAX ? (v > acc ? v : acc) : op == DTL_MIN ? (v < acc ? v : acc) : acc + v;
  }
  if (op == DTL_AVG) acc /= nranks;
  unsigned char cell[8]; /* the value a t holds */
  store(nt(t), cell, 0, acc);
  return load(nt(t), cell, 0);
}

#define FOR_WORLDS for (int p = 1; p <= MAXP; p++)
#define OK(call) assert_string_equal(dtl_status_name(call), "DTL_OK")

/* --- collectives against the oracle ------------------------------------------------------------------- */
static void scatter_from_every_root_gives_rank_r_block_r(void **state) {
  (void)state;
  const size_t n = 6;
  FOR_WORLDS {
    for (int root = 0; root < p; root++) {
      assert_int_equal(make_world(p), 0);
      /* root's send: block j holds val(j, .) */
      int32_t *send = malloc(n * (size_t)p * 4), *recv[MAXP];
      for (int j = 0; j < p; j++)
        for (size_t i = 0; i < n; i++) send[(size_t)j * n + i] = (int32_t)val(j, i);
      for (int r = 0; r < p; r++) {
        recv[r] = r == root ? send + (size_t)root * n : calloc(n, 4); /* in place on the root */
        OK(dtl_scatter(comms[r], r == root ? send : NULL, recv[r], n, DTL_INT32, root));
      }
      progress();
      for (int r = 0; r < p; r++)
        for (size_t i = 0; i < n; i++) expect_elem(DTL_INT32, recv[r], i, val(r, i), "scatter", r);
      for (int r = 0; r < p; r++)
        if (r != root) free(recv[r]);
      free(send);
      free_world();
    }
  }
}

static void gather_to_every_root_collects_blocks_in_rank_order(void **state) {
  (void)state;
  const size_t n = 5;
  FOR_WORLDS {
    for (int root = 0; root < p; root++) {
      assert_int_equal(make_world(p), 0);
      double *recv = calloc(n * (size_t)p, 8), *send[MAXP];
      for (int r = 0; r < p; r++) {
        send[r] = r == root ? recv + (size_t)root * n : buf_of(DTL_FLOAT64, n, r);
        if (r == root)
          for (size_t i = 0; i < n; i++) send[r][i] = val(r, i); /* in place on the root */
        OK(dtl_gather(comms[r], send[r], r == root ? recv : NULL, n, DTL_FLOAT64, root));
      }
      progress();
      for (int j = 0; j < p; j++)
        for (size_t i = 0; i < n; i++) expect_elem(DTL_FLOAT64, recv, (size_t)j * n + i, val(j, i), "gather", root);
      for (int r = 0; r < p; r++)
        if (r != root) free(send[r]);
      free(recv);
      free_world();
    }
  }
}

/* counts[r] for the uneven cases: zero for some ranks, different for the others. */
static size_t uneven(int p, int r) { return (size_t)((r * 3 + p) % 4); }

static void all_gatherv_with_uneven_and_zero_counts_packs_blocks_in_rank_order(void **state) {
  (void)state;
  FOR_WORLDS {
    for (int in_place = 0; in_place < 2; in_place++) {
      assert_int_equal(make_world(p), 0);
      size_t counts[MAXP], displ[MAXP], total = 0;
      for (int r = 0; r < p; r++) {
        counts[r] = uneven(p, r);
        displ[r] = total;
        total += counts[r];
      }
      int64_t *recv[MAXP], *send[MAXP];
      for (int r = 0; r < p; r++) {
        recv[r] = calloc(total + 1, 8);
        send[r] = in_place ? recv[r] + displ[r] : buf_of(DTL_INT64, counts[r], r);
        for (size_t i = 0; i < counts[r]; i++) send[r][i] = (int64_t)val(r, i);
        OK(dtl_all_gatherv(comms[r], send[r], counts[r], recv[r], counts, DTL_INT64));
      }
      progress();
      for (int r = 0; r < p; r++)
        for (int j = 0; j < p; j++)
          for (size_t i = 0; i < counts[j]; i++) expect_elem(DTL_INT64, recv[r], displ[j] + i, val(j, i), "all_gatherv", r);
      bool equal = true;
      for (int r = 1; r < p; r++) equal &= counts[r] == counts[0];
      if (!equal) assert_int_equal(executed[OP_ALLGATHER], 0); /* uneven: grouped send/recv, no padding */
      for (int r = 0; r < p; r++) {
        if (!in_place) free(send[r]);
        free(recv[r]);
      }
      free_world();
    }
  }
}

static void all_gatherv_with_equal_counts_is_one_nccl_all_gather(void **state) {
  (void)state;
  const size_t n = 3;
  FOR_WORLDS {
    assert_int_equal(make_world(p), 0);
    size_t counts[MAXP];
    float *send[MAXP], *recv[MAXP];
    for (int r = 0; r < p; r++) counts[r] = n;
    for (int r = 0; r < p; r++) {
      send[r] = buf_of(DTL_FLOAT32, n, r);
      recv[r] = calloc(n * (size_t)p, 4);
      OK(dtl_all_gatherv(comms[r], send[r], n, recv[r], counts, DTL_FLOAT32));
    }
    progress();
    assert_int_equal(executed[OP_ALLGATHER], 1);
    assert_int_equal(executed[OP_SEND], 0);
    for (int r = 0; r < p; r++)
      for (int j = 0; j < p; j++)
        for (size_t i = 0; i < n; i++) expect_elem(DTL_FLOAT32, recv[r], (size_t)j * n + i, val(j, i), "all_gatherv", r);
    for (int r = 0; r < p; r++) free(send[r]), free(recv[r]);
    free_world();
  }
}

/* Rank r sends c(r, j) elements to rank j; element i of that block is val(r * 10 + j, i). */
static size_t a2a_count(int p, int r, int j) { return (size_t)((r + 2 * j + p) % 3); }

static void all_to_allv_with_uneven_and_zero_counts_routes_block_j_to_rank_j(void **state) {
  (void)state;
  FOR_WORLDS {
    assert_int_equal(make_world(p), 0);
    size_t sc[MAXP][MAXP], rc[MAXP][MAXP];
    int32_t *send[MAXP], *recv[MAXP];
    for (int r = 0; r < p; r++) {
      size_t st = 0, rt = 0;
      for (int j = 0; j < p; j++) {
        sc[r][j] = a2a_count(p, r, j);
        rc[r][j] = a2a_count(p, j, r);
        st += sc[r][j];
        rt += rc[r][j];
      }
      send[r] = malloc(st * 4 + 4);
      recv[r] = calloc(rt + 1, 4);
      size_t o = 0;
      for (int j = 0; j < p; j++)
        for (size_t i = 0; i < sc[r][j]; i++) send[r][o++] = (int32_t)val(r * 10 + j, i);
    }
    for (int r = 0; r < p; r++) OK(dtl_all_to_allv(comms[r], send[r], sc[r], recv[r], rc[r], DTL_INT32));
    progress();
    for (int r = 0; r < p; r++) {
      size_t o = 0;
      for (int i = 0; i < p; i++)
        for (size_t k = 0; k < rc[r][i]; k++) expect_elem(DTL_INT32, recv[r], o++, val(i * 10 + r, k), "all_to_allv", r);
    }
    for (int r = 0; r < p; r++) free(send[r]), free(recv[r]);
    free_world();
  }
}

static void all_to_all_routes_block_j_to_rank_j(void **state) {
  (void)state;
  const size_t n = 4;
  FOR_WORLDS {
    assert_int_equal(make_world(p), 0);
    uint16_t *send[MAXP], *recv[MAXP];
    for (int r = 0; r < p; r++) {
      send[r] = malloc(n * (size_t)p * 2);
      recv[r] = calloc(n * (size_t)p, 2);
      for (int j = 0; j < p; j++)
        for (size_t i = 0; i < n; i++) store(ncclBfloat16, send[r], (size_t)j * n + i, val(r * 10 + j, i));
    }
    for (int r = 0; r < p; r++) OK(dtl_all_to_all(comms[r], send[r], recv[r], n, DTL_BFLOAT16));
    progress();
    for (int r = 0; r < p; r++)
      for (int i = 0; i < p; i++)
        for (size_t k = 0; k < n; k++) expect_elem(DTL_BFLOAT16, recv[r], (size_t)i * n + k, val(i * 10 + r, k), "all_to_all", r);
    for (int r = 0; r < p; r++) free(send[r]), free(recv[r]);
    free_world();
  }
}

static const dtl_reduce_op int_ops[] = {DTL_SUM, DTL_PROD, DTL_MAX, DTL_MIN};
static const dtl_dtype reduce_types[] = {DTL_INT32, DTL_INT64, DTL_FLOAT32, DTL_FLOAT64, DTL_BFLOAT16, DTL_INT8};

/* Ops per dtype. Integer DTL_AVG divides in a CUDA kernel (checked in device_kernels.c) that cannot run
 * on host memory, so for integers avg is taken at p = 1 only, where the divisor is 1 and nothing is
 * launched: enough for the engine above to see that dtl asks NCCL for a sum, never ncclAvg. */
static int ops_for(dtl_dtype t, int p, dtl_reduce_op *ops) {
  int n = 0;
  for (int k = 0; k < 4; k++) ops[n++] = int_ops[k];
  if (t == DTL_FLOAT32 || t == DTL_FLOAT64 || t == DTL_BFLOAT16 || p == 1) ops[n++] = DTL_AVG;
  return n;
}

static void reduce_scatterv_with_uneven_blocks_reduces_each_block_at_its_owner(void **state) {
  (void)state;
  FOR_WORLDS {
    for (size_t ti = 0; ti < sizeof reduce_types / sizeof *reduce_types; ti++) {
      dtl_dtype t = reduce_types[ti];
      dtl_reduce_op ops[5];
      int nops = ops_for(t, p, ops);
      for (int k = 0; k < nops; k++) {
        assert_int_equal(make_world(p), 0);
        size_t counts[MAXP], displ[MAXP], total = 0;
        for (int r = 0; r < p; r++) {
          counts[r] = uneven(p, r) + (r == 0); /* rank 0 never empty, some others are */
          displ[r] = total;
          total += counts[r];
        }
        void *send[MAXP], *recv[MAXP];
        for (int r = 0; r < p; r++) {
          send[r] = buf_of(t, total, r);
          recv[r] = calloc(counts[r] + 1, 8);
          OK(dtl_reduce_scatterv(comms[r], send[r], counts[r] ? recv[r] : NULL, counts, t, ops[k]));
        }
        progress();
        bool equal = true;
        for (int r = 1; r < p; r++) equal &= counts[r] == counts[0];
        if (!equal) assert_int_equal(executed[OP_REDUCESCATTER], 0);
        for (int r = 0; r < p; r++)
          for (size_t i = 0; i < counts[r]; i++)
            expect_elem(t, recv[r], i, oracle_reduce(ops[k], displ[r] + i, t), "reduce_scatterv", r);
        for (int r = 0; r < p; r++) free(send[r]), free(recv[r]);
        free_world();
      }
    }
  }
}

static void reductions_match_the_dense_oracle_for_every_op(void **state) {
  (void)state;
  const size_t n = 7;
  FOR_WORLDS {
    for (size_t ti = 0; ti < sizeof reduce_types / sizeof *reduce_types; ti++) {
      dtl_dtype t = reduce_types[ti];
      dtl_reduce_op ops[5];
      int nops = ops_for(t, p, ops);
      for (int k = 0; k < nops; k++) {
        assert_int_equal(make_world(p), 0);
        int root = p - 1;
        void *send[MAXP], *ar[MAXP], *red[MAXP], *rs[MAXP];
        for (int r = 0; r < p; r++) {
          send[r] = buf_of(t, n * (size_t)p, r);
          ar[r] = calloc(n * (size_t)p, 8);
          red[r] = calloc(n, 8);
          rs[r] = calloc(n, 8);
          OK(dtl_all_reduce(comms[r], send[r], ar[r], n * (size_t)p, t, ops[k]));
          OK(dtl_reduce(comms[r], send[r], r == root ? red[r] : NULL, n, t, ops[k], root));
          OK(dtl_reduce_scatter(comms[r], send[r], rs[r], n, t, ops[k]));
        }
        progress();
        for (int r = 0; r < p; r++) {
          for (size_t i = 0; i < n * (size_t)p; i++) expect_elem(t, ar[r], i, oracle_reduce(ops[k], i, t), "all_reduce", r);
          for (size_t i = 0; i < n; i++) {
            if (r == root) expect_elem(t, red[r], i, oracle_reduce(ops[k], i, t), "reduce", r);
            expect_elem(t, rs[r], i, oracle_reduce(ops[k], (size_t)r * n + i, t), "reduce_scatter", r);
          }
        }
        for (int r = 0; r < p; r++) free(send[r]), free(ar[r]), free(red[r]), free(rs[r]);
        free_world();
      }
    }
  }
}

static void broadcast_from_every_root_copies_the_root_buffer(void **state) {
  (void)state;
  const size_t n = 9;
  FOR_WORLDS {
    for (int root = 0; root < p; root++) {
      assert_int_equal(make_world(p), 0);
      int8_t *buf[MAXP];
      for (int r = 0; r < p; r++) {
        buf[r] = buf_of(DTL_INT8, n, r + 20);
        OK(dtl_broadcast(comms[r], buf[r], n, DTL_INT8, root));
      }
      progress();
      for (int r = 0; r < p; r++)
        for (size_t i = 0; i < n; i++) expect_elem(DTL_INT8, buf[r], i, val(root + 20, i), "broadcast", r);
      for (int r = 0; r < p; r++) free(buf[r]);
      free_world();
    }
  }
}

static void send_and_recv_between_two_ranks_move_the_buffer(void **state) {
  (void)state;
  assert_int_equal(make_world(2), 0);
  float *a = buf_of(DTL_FLOAT32, 10, 7), *b = calloc(10, 4);
  OK(dtl_send(comms[0], a, 10, DTL_FLOAT32, 1));
  OK(dtl_recv(comms[1], b, 10, DTL_FLOAT32, 0));
  progress();
  for (size_t i = 0; i < 10; i++) expect_elem(DTL_FLOAT32, b, i, val(7, i), "send/recv", 1);
  free(a);
  free(b);
  free_world();
}

/* A ring shift either way with uneven counts (zeros included): per rank one group of at most one ncclSend and
 * one ncclRecv, zero counts skipped, and at p = 1 a device copy (the engine fails any message to oneself). */
static void sendrecv_ring_shift_is_grouped_send_and_recv_and_a_copy_to_oneself(void **state) {
  (void)state;
  const dtl_dtype types[] = {DTL_INT32, DTL_BFLOAT16};
  FOR_WORLDS {
    for (int ti = 0; ti < 2; ti++)
      for (int back = 0; back < 2; back++) {
        dtl_dtype t = types[ti];
        assert_int_equal(make_world(p), 0);
        size_t cnt[MAXP];
        void *send[MAXP], *recv[MAXP];
        int moved = 0;
        for (int r = 0; r < p; r++) cnt[r] = uneven(p, r) + (size_t)(back * 2);
        for (int r = 0; r < p; r++) {
          int dest = back ? (r + p - 1) % p : (r + 1) % p, source = back ? (r + 1) % p : (r + p - 1) % p;
          send[r] = buf_of(t, cnt[r], r + 30);
          recv[r] = calloc(cnt[source] + 1, 8);
          OK(dtl_sendrecv(comms[r], send[r], cnt[r], dest, recv[r], cnt[source], source, t));
          moved += p > 1 && cnt[r] > 0;
          assert_true(nq[r] <= 2);
        }
        progress();
        assert_int_equal(executed[OP_SEND], moved);
        for (int r = 0; r < p; r++) {
          int source = back ? (r + 1) % p : (r + p - 1) % p;
          for (size_t i = 0; i < cnt[source]; i++) expect_elem(t, recv[r], i, val(source + 30, i), "sendrecv", r);
        }
        for (int r = 0; r < p; r++) free(send[r]), free(recv[r]);
        free_world();
      }
  }
}

static void sendrecv_async_is_unsupported_and_a_self_count_mismatch_enqueues_nothing(void **state) {
  (void)state;
  assert_int_equal(make_world(2), 0);
  int32_t a[4] = {1, 2, 3, 4}, b[4] = {0};
  dtl_request *req = NULL;
  assert_int_equal(dtl_sendrecv_async(comms[0], a, 4, 1, b, 4, 1, DTL_INT32, &req), DTL_ERR_UNSUPPORTED);
  assert_null(req);
  assert_int_equal(dtl_sendrecv(comms[0], a, 4, 0, b, 3, 0, DTL_INT32), DTL_ERR_COMM);
  assert_non_null(strstr(dtl_last_error(), "send_count=4"));
  assert_int_equal(dtl_sendrecv(comms[1], a, 4, 1, b, 4, 0, DTL_INT32), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "both or neither"));
  assert_int_equal(nq[0] + nq[1], 0);
  assert_true(b[0] == 0 && b[3] == 0);
  free_world();
}

static void zero_counts_enqueue_nothing(void **state) {
  (void)state;
  assert_int_equal(make_world(3), 0);
  size_t zero[MAXP] = {0};
  for (int r = 0; r < 3; r++) {
    OK(dtl_all_gatherv(comms[r], NULL, 0, NULL, zero, DTL_FLOAT32));
    OK(dtl_all_to_allv(comms[r], NULL, zero, NULL, zero, DTL_FLOAT32));
    OK(dtl_reduce_scatterv(comms[r], NULL, NULL, zero, DTL_INT32, DTL_SUM));
    OK(dtl_all_reduce(comms[r], NULL, NULL, 0, DTL_INT64, DTL_AVG));
    OK(dtl_scatter(comms[r], NULL, NULL, 0, DTL_INT8, 1));
    OK(dtl_send(comms[r], NULL, 0, DTL_INT8, (r + 1) % 3));
    OK(dtl_sendrecv(comms[r], NULL, 0, (r + 1) % 3, NULL, 0, (r + 2) % 3, DTL_INT8));
    assert_int_equal(nq[r], 0);
  }
  free_world();
}

/* --- errors ------------------------------------------------------------------------------------------- */
static void an_async_error_is_reported_by_every_call_before_it_enqueues(void **state) {
  (void)state;
  assert_int_equal(make_world(2), 0);
  world[1].state = ncclRemoteError;
  snprintf(last_error, sizeof last_error, "peer 0 is gone");
  float send[4] = {1, 2, 3, 4}, recv[4] = {9, 9, 9, 9};
  assert_int_equal(dtl_all_reduce(comms[1], send, recv, 4, DTL_FLOAT32, DTL_SUM), DTL_ERR_COMM);
  assert_non_null(strstr(dtl_last_error(), "dtl_all_reduce: asynchronous NCCL error 6"));
  assert_non_null(strstr(dtl_last_error(), "peer 0 is gone"));
  assert_int_equal(dtl_all_gather(comms[1], send, recv, 2, DTL_FLOAT32), DTL_ERR_COMM);
  assert_int_equal(dtl_barrier(comms[1]), DTL_ERR_COMM);
  assert_int_equal(dtl_comm_check(comms[1]), DTL_ERR_COMM);
  assert_non_null(strstr(dtl_last_error(), "dtl_comm_check"));
  assert_int_equal(nq[1], 0);
  assert_true(recv[0] == 9 && recv[3] == 9);
  OK(dtl_comm_check(comms[0])); /* the healthy rank */

  OK(dtl_comm_abort(comms[1]));
  assert_false(world[1].aborted); /* a borrowed comm: its owner aborts it (comm.h) */
  assert_null(dtl_comm_nccl_handle(comms[1]));
  assert_int_equal(dtl_all_reduce(comms[1], send, recv, 4, DTL_FLOAT32, DTL_SUM), DTL_ERR_COMM);
  assert_non_null(strstr(dtl_last_error(), "aborted"));
  free_world();
}

static void a_non_blocking_comm_is_waited_on_until_its_state_settles(void **state) {
  (void)state;
  assert_int_equal(make_world(2), 0);
  inprogress_polls = 4;
  int32_t send[2][3] = {{1, 2, 3}, {10, 20, 30}}, sum[2][3], gv[2][3];
  size_t counts[2] = {1, 2};
  polls = 0;
  OK(dtl_all_reduce(comms[0], send[0], sum[0], 3, DTL_INT32, DTL_SUM));
  assert_int_equal(world[0].state, ncclSuccess); /* dtl returned only after the state left ncclInProgress */
  assert_true(polls >= 4);
  OK(dtl_all_reduce(comms[1], send[1], sum[1], 3, DTL_INT32, DTL_SUM));
  OK(dtl_all_gatherv(comms[0], send[0], 1, gv[0], counts, DTL_INT32)); /* a group: ncclGroupEnd in progress */
  assert_int_equal(world[0].state, ncclSuccess);
  OK(dtl_all_gatherv(comms[1], send[1], 2, gv[1], counts, DTL_INT32));
  progress();
  assert_int_equal(sum[1][2], 33);
  assert_int_equal(gv[1][0], 1);
  assert_int_equal(gv[0][2], 20);

  settle_to = ncclSystemError; /* an operation that fails while in progress */
  assert_int_equal(dtl_all_reduce(comms[0], send[0], sum[0], 3, DTL_INT32, DTL_SUM), DTL_ERR_COMM);
  assert_non_null(strstr(dtl_last_error(), "NCCL error 2"));
  assert_non_null(strstr(dtl_last_error(), "simulated failure while in progress"));
  memset(nq, 0, sizeof nq);
  world[0].state = ncclSuccess;
  free_world();
}

static void a_synchronous_nccl_failure_is_a_comm_error_and_closes_the_group(void **state) {
  (void)state;
  assert_int_equal(make_world(3), 0);
  float send[9] = {0}, recv[9];
  fail_next = ncclInvalidArgument;
  assert_int_equal(dtl_all_reduce(comms[0], send, recv, 9, DTL_FLOAT32, DTL_MAX), DTL_ERR_COMM);
  assert_non_null(strstr(dtl_last_error(), "dtl_all_reduce: NCCL error 4 (invalid argument"));
  assert_non_null(strstr(dtl_last_error(), "simulated synchronous failure"));
  fail_next = ncclInvalidUsage;
  assert_int_equal(dtl_all_to_all(comms[0], send, recv, 3, DTL_FLOAT32), DTL_ERR_COMM);
  assert_non_null(strstr(dtl_last_error(), "dtl_all_to_all: NCCL error 5"));
  assert_int_equal(group_depth, 0);
  memset(nq, 0, sizeof nq);
  free_world();
}

static void all_to_all_in_place_and_disagreeing_own_counts_are_rejected_before_enqueuing(void **state) {
  (void)state;
  assert_int_equal(make_world(2), 0);
  float buf[8] = {0};
  assert_int_equal(dtl_all_to_all(comms[0], buf, buf, 4, DTL_FLOAT32), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "send == recv"));
  size_t sc[2] = {2, 1}, rc[2] = {3, 1};
  assert_int_equal(dtl_all_to_allv(comms[0], buf, sc, buf + 4, rc, DTL_FLOAT32), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "send_counts[0]=2 differs from recv_counts[0]=3"));
  assert_int_equal(nq[0], 0);
  assert_int_equal(group_depth, 0);
  free_world();
}

/* --- the 8-bit floats ------------------------------------------------------------------------------------------ */
#if SIM_FP8
/* On NCCL 2.24+ and an sm_90 device they move as ncclFloat8e4m3 / e5m2, and max and min reduce through NCCL; sum,
 * prod and avg are refused (types.h) with the reason, before anything is enqueued. */
static void fp8_moves_as_ncclfloat8_and_reduces_max_and_min_where_nccl_and_the_device_can(void **state) {
  (void)state;
  const size_t n = 6;
  static const dtl_dtype types[] = {DTL_FLOAT8_E4M3, DTL_FLOAT8_E5M2};
  static const dtl_reduce_op ops[] = {DTL_MAX, DTL_MIN};
  FOR_WORLDS {
    for (int ti = 0; ti < 2; ti++)
      for (int k = 0; k < 2; k++) {
        dtl_dtype t = types[ti];
        assert_int_equal(make_world(p), 0);
        void *send[MAXP], *ag[MAXP], *ar[MAXP], *rs[MAXP];
        for (int r = 0; r < p; r++) {
          send[r] = buf_of(t, n * (size_t)p, r);
          ag[r] = calloc(n * (size_t)p * (size_t)p, 1);
          ar[r] = calloc(n * (size_t)p, 1);
          rs[r] = calloc(n, 1);
          OK(dtl_all_gather(comms[r], send[r], ag[r], n * (size_t)p, t));
          assert_int_equal(last_dt, nt(t));
          OK(dtl_all_reduce(comms[r], send[r], ar[r], n * (size_t)p, t, ops[k]));
          OK(dtl_reduce_scatter(comms[r], send[r], rs[r], n, t, ops[k]));
          assert_int_equal(last_dt, nt(t));
        }
        progress();
        for (int r = 0; r < p; r++) {
          for (int j = 0; j < p; j++)
            assert_memory_equal((char *)ag[r] + (size_t)j * n * (size_t)p, send[j], n * (size_t)p);
          for (size_t i = 0; i < n * (size_t)p; i++) expect_elem(t, ar[r], i, oracle_reduce(ops[k], i, t), "all_reduce", r);
          for (size_t i = 0; i < n; i++)
            expect_elem(t, rs[r], i, oracle_reduce(ops[k], (size_t)r * n + i, t), "reduce_scatter", r);
        }
        uint8_t out[8] = {0};
        assert_int_equal(dtl_all_reduce(comms[0], send[0], out, 4, t, DTL_SUM), DTL_ERR_UNSUPPORTED);
        assert_non_null(strstr(dtl_last_error(), "sum would round at every step"));
        assert_int_equal(nq[0], 0);
        for (int r = 0; r < p; r++) free(send[r]), free(ag[r]), free(ar[r]), free(rs[r]);
        free_world();
      }
  }
}

/* Before NCCL 2.24 (no FP8 types in the library) they move as bytes, and max and min are refused naming why; on a
 * device before sm_90 they move as FP8 and max and min are refused naming the device. Nothing is enqueued for a
 * refused call. */
static void fp8_moves_as_bytes_before_nccl_2_24_and_max_is_refused_where_nccl_or_the_device_cannot(void **state) {
  (void)state;
  for (int c = 0; c < 2; c++) {
    if (c == 0) sim_version = 22304;
    else sim_cc_major = 8;
    assert_int_equal(make_world(2), 0);
    uint8_t send[2][4] = {{0x38, 0xb8, 0x01, 0x7e}, {0x40, 0x30, 0x81, 0xfe}}, ag[2][8], out[4] = {0};
    for (int r = 0; r < 2; r++) {
      OK(dtl_all_gather(comms[r], send[r], ag[r], 4, DTL_FLOAT8_E4M3));
      assert_int_equal(last_dt, c == 0 ? ncclUint8 : ncclFloat8e4m3);
    }
    progress();
    for (int r = 0; r < 2; r++) {
      assert_memory_equal(ag[r], send[0], 4);
      assert_memory_equal(ag[r] + 4, send[1], 4);
    }
    assert_int_equal(dtl_all_reduce(comms[0], send[0], out, 4, DTL_FLOAT8_E4M3, DTL_MAX), DTL_ERR_UNSUPPORTED);
    assert_non_null(strstr(dtl_last_error(), "dtl_all_reduce: op=max on dtype f8e4m3 is unsupported: "));
    assert_non_null(strstr(dtl_last_error(), c == 0 ? "the NCCL library is version code 22304, which has no FP8 types"
                                                    : "device 0 has compute capability 8.0"));
    assert_int_equal(dtl_reduce_scatter(comms[0], send[0], out, 2, DTL_FLOAT8_E5M2, DTL_MIN), DTL_ERR_UNSUPPORTED);
    assert_int_equal(nq[0], 0);
    assert_int_equal(out[0], 0);
    free_world();
    sim_version = 22809;
    sim_cc_major = 9;
  }
}
#endif

int main(void) {
  /* The ranks of this simulation take turns in one thread, so none can wait for the others in an agreement:
   * these communicators run without DTL_CHECK (the suite's default), whose agreement tests/comm covers. */
  setenv("DTL_CHECK", "0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(scatter_from_every_root_gives_rank_r_block_r),
      cmocka_unit_test(gather_to_every_root_collects_blocks_in_rank_order),
      cmocka_unit_test(all_gatherv_with_uneven_and_zero_counts_packs_blocks_in_rank_order),
      cmocka_unit_test(all_gatherv_with_equal_counts_is_one_nccl_all_gather),
      cmocka_unit_test(all_to_allv_with_uneven_and_zero_counts_routes_block_j_to_rank_j),
      cmocka_unit_test(all_to_all_routes_block_j_to_rank_j),
      cmocka_unit_test(reduce_scatterv_with_uneven_blocks_reduces_each_block_at_its_owner),
      cmocka_unit_test(reductions_match_the_dense_oracle_for_every_op),
      cmocka_unit_test(broadcast_from_every_root_copies_the_root_buffer),
      cmocka_unit_test(send_and_recv_between_two_ranks_move_the_buffer),
      cmocka_unit_test(sendrecv_ring_shift_is_grouped_send_and_recv_and_a_copy_to_oneself),
      cmocka_unit_test(sendrecv_async_is_unsupported_and_a_self_count_mismatch_enqueues_nothing),
      cmocka_unit_test(zero_counts_enqueue_nothing),
      cmocka_unit_test(an_async_error_is_reported_by_every_call_before_it_enqueues),
      cmocka_unit_test(a_non_blocking_comm_is_waited_on_until_its_state_settles),
      cmocka_unit_test(a_synchronous_nccl_failure_is_a_comm_error_and_closes_the_group),
      cmocka_unit_test(all_to_all_in_place_and_disagreeing_own_counts_are_rejected_before_enqueuing),
#if SIM_FP8
      cmocka_unit_test(fp8_moves_as_ncclfloat8_and_reduces_max_and_min_where_nccl_and_the_device_can),
      cmocka_unit_test(fp8_moves_as_bytes_before_nccl_2_24_and_max_is_refused_where_nccl_or_the_device_cannot),
#endif
  };
  return cmocka_run_group_tests_name("nccl transport on a simulated NCCL", tests, NULL, NULL);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The NCCL transport at world size 1 (one GPU cannot hold several NCCL ranks): every collective through
 * dtl on device buffers, for every dtype (and op), checked against what a collective over one rank means;
 * sendrecv to oneself; split, barrier, check, abort, the transport's memory ops, and bad input. Argument
 * checks that need no device run everywhere; the rest exits 77 when no CUDA device is visible. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "comm/backend.h"
#include "common/half.h"
#include "dtype_data.h"
#include "dtl/nccl.h"

#define CUDA_OK(call) assert_int_equal((int)(call), (int)cudaSuccess)
#define NCCL_OK(call) assert_int_equal((int)(call), (int)ncclSuccess)
#define DTL_OK_(call) assert_string_equal(dtl_status_name(call), "DTL_OK")

static const char *dt_name(int t) { return dtl_dtype_name((dtl_dtype)t); }

/* --- deterministic integer-valued data, so that every dtype holds it exactly ---------------------------- */
static double value_at(dtl_dtype t, size_t i, int seed) {
  int v = (int)((i * 7u + (unsigned)seed * 13u) % 23u);
  return t == DTL_UINT8 ? v : v - 11;
}
/* A host buffer of n elements of t with value_at(.., seed). */
static void *host_data(dtl_dtype t, size_t n, int seed) {
  unsigned char *p = malloc(n * dtl_dtype_size(t) + 1);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) t_put(t, p, i, value_at(t, i, seed));
  return p;
}

/* --- device helpers ---------------------------------------------------------------------------------- */
static ncclComm_t nccl;
static cudaStream_t stream;
static dtl_comm *comm;

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}
static void *dev_from(const void *host, size_t bytes) {
  void *d = dev_alloc(bytes);
  CUDA_OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}
/* A device buffer of bytes set to 0x5a, a pattern no collective here produces by accident. */
static void *dev_poisoned(size_t bytes) {
  void *d = dev_alloc(bytes);
  CUDA_OK(cudaMemset(d, 0x5a, bytes ? bytes : 1));
  return d;
}
/* Waits through dtl (the barrier) and compares bytes of dev with want. */
static void expect_device_bytes(const void *dev, const void *want, size_t bytes, const char *what, int t) {
  DTL_OK_(dtl_barrier(comm));
  unsigned char *got = malloc(bytes ? bytes : 1);
  assert_non_null(got);
  CUDA_OK(cudaMemcpy(got, dev, bytes, cudaMemcpyDeviceToHost));
  if (memcmp(got, want, bytes) != 0) fail_msg("%s: wrong result for dtype %s", what, dt_name(t));
  free(got);
}
static void expect_poison(const void *dev, size_t bytes, const char *what) {
  unsigned char *got = malloc(bytes), *want = malloc(bytes);
  assert_non_null(got);
  assert_non_null(want);
  memset(want, 0x5a, bytes);
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(got, dev, bytes, cudaMemcpyDeviceToHost));
  if (memcmp(got, want, bytes) != 0) fail_msg("%s: a rejected call wrote its output buffer", what);
  free(got);
  free(want);
}

static int setup(void **state) {
  (void)state;
  ncclUniqueId id;
  if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return -1;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&nccl, 1, id, 0) != ncclSuccess) return -1;
  return dtl_comm_from_nccl(nccl, stream, &comm) == DTL_OK ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  dtl_comm_destroy(comm);
  ncclCommDestroy(nccl); /* still the caller's: dtl_comm_destroy must not have destroyed it */
  return cudaStreamDestroy(stream) == cudaSuccess ? 0 : -1;
}

/* --- without a device ------------------------------------------------------------------------------- */
static void from_nccl_rejects_null_comm_and_null_out(void **state) {
  (void)state;
  dtl_comm *c = (dtl_comm *)0x1;
  assert_int_equal(dtl_comm_from_nccl(NULL, 0, &c), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "comm=NULL"));
  assert_ptr_equal(c, (dtl_comm *)0x1);
  assert_int_equal(dtl_comm_from_nccl(NULL, 0, NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "out=NULL"));
}

static void nccl_accessors_answer_null_for_null(void **state) {
  (void)state;
  assert_null(dtl_comm_nccl_stream(NULL));
  assert_null(dtl_comm_nccl_handle(NULL));
  assert_true(dtl_cuda_device_count() >= 0);
}

/* --- world size 1 ------------------------------------------------------------------------------------ */
static void size_one_comm_is_rank0_of_1_on_device_memory_and_keeps_the_stream(void **state) {
  (void)state;
  assert_int_equal(dtl_comm_rank(comm), 0);
  assert_int_equal(dtl_comm_size(comm), 1);
  assert_int_equal(dtl_comm_memory(comm), DTL_MEMORY_DEVICE);
  assert_string_equal(dtl_comm_backend_name(comm), "nccl");
  assert_ptr_equal(dtl_comm_nccl_stream(comm), stream);
  assert_ptr_equal(dtl_comm_nccl_handle(comm), nccl);
  DTL_OK_(dtl_comm_check(comm));
}

static void broadcast_from_the_only_rank_keeps_the_buffer(void **state) {
  (void)state;
  const size_t n = 1000;
  for (int t = 0; t < DTL_NUM_DTYPES; t++) {
    size_t bytes = n * dtl_dtype_size((dtl_dtype)t);
    void *h = host_data((dtl_dtype)t, n, t), *d = dev_from(h, bytes);
    DTL_OK_(dtl_broadcast(comm, d, n, (dtl_dtype)t, 0));
    expect_device_bytes(d, h, bytes, "broadcast", t);
    CUDA_OK(cudaFree(d));
    free(h);
  }
}

static void scatter_and_gather_of_one_rank_copy_the_block_in_and_out_of_place(void **state) {
  (void)state;
  const size_t n = 777;
  for (int t = 0; t < DTL_NUM_DTYPES; t++) {
    size_t bytes = n * dtl_dtype_size((dtl_dtype)t);
    void *h = host_data((dtl_dtype)t, n, t + 1), *send = dev_from(h, bytes), *recv = dev_poisoned(bytes);
    DTL_OK_(dtl_scatter(comm, send, recv, n, (dtl_dtype)t, 0));
    expect_device_bytes(recv, h, bytes, "scatter", t);
    CUDA_OK(cudaMemset(recv, 0x5a, bytes));
    DTL_OK_(dtl_gather(comm, send, recv, n, (dtl_dtype)t, 0));
    expect_device_bytes(recv, h, bytes, "gather", t);
    DTL_OK_(dtl_scatter(comm, send, send, n, (dtl_dtype)t, 0)); /* in place */
    DTL_OK_(dtl_gather(comm, send, send, n, (dtl_dtype)t, 0));
    expect_device_bytes(send, h, bytes, "in-place scatter/gather", t);
    CUDA_OK(cudaFree(send));
    CUDA_OK(cudaFree(recv));
    free(h);
  }
}

/* The 8-bit floats reduce with max and min only (types.h), and those only where NCCL and the device can (nccl.c
 * writes the reason otherwise): each reducing call is refused with the reason, writing nothing. Returns whether
 * op on t is refused here (and then checks every reducing call). */
static bool fp8_refused_here(dtl_dtype t, dtl_reduce_op o, void *send, void *recv, size_t n, size_t bytes) {
  if (t != DTL_FLOAT8_E4M3 && t != DTL_FLOAT8_E5M2) return false;
  bool exact = o == DTL_MAX || o == DTL_MIN;
  if (exact && !comm->fp8_reduce_refusal) return false;
  char why[160];
  if (exact) snprintf(why, sizeof why, "%s", comm->fp8_reduce_refusal);
  else snprintf(why, sizeof why, "%s %s would round at every step", dt_name(t), dtl_reduce_op_name(o));
  size_t counts[1] = {n};
#define REFUSED(call)                                  \
  do {                                                 \
    assert_int_equal((call), DTL_ERR_UNSUPPORTED);     \
    assert_non_null(strstr(dtl_last_error(), why));    \
  } while (0)
  REFUSED(dtl_all_reduce(comm, send, recv, n, t, o));
  REFUSED(dtl_reduce(comm, send, recv, n, t, o, 0));
  REFUSED(dtl_reduce_scatter(comm, send, recv, n, t, o));
  REFUSED(dtl_reduce_scatterv(comm, send, recv, counts, t, o));
#undef REFUSED
  expect_poison(recv, bytes, "a refused 8-bit float reduction");
  return true;
}

/* Over one rank every reduction (sum, prod, max, min, avg) returns its input, for every dtype; the 8-bit floats'
 * refused ones are refused. */
static void reductions_of_one_rank_return_the_input_for_every_dtype_and_op(void **state) {
  (void)state;
  const size_t n = 513;
  for (int t = 0; t < DTL_NUM_DTYPES; t++) {
    size_t bytes = n * dtl_dtype_size((dtl_dtype)t);
    void *h = host_data((dtl_dtype)t, n, t + 2);
    for (int op = 0; op < DTL_NUM_REDUCE_OPS; op++) {
      dtl_reduce_op o = (dtl_reduce_op)op;
      void *send = dev_from(h, bytes), *recv = dev_poisoned(bytes);
      if (fp8_refused_here((dtl_dtype)t, o, send, recv, n, bytes)) {
        CUDA_OK(cudaFree(send));
        CUDA_OK(cudaFree(recv));
        continue;
      }
      DTL_OK_(dtl_all_reduce(comm, send, recv, n, (dtl_dtype)t, o));
      expect_device_bytes(recv, h, bytes, "all_reduce", t);
      CUDA_OK(cudaMemset(recv, 0x5a, bytes));
      DTL_OK_(dtl_reduce(comm, send, recv, n, (dtl_dtype)t, o, 0));
      expect_device_bytes(recv, h, bytes, "reduce", t);
      CUDA_OK(cudaMemset(recv, 0x5a, bytes));
      DTL_OK_(dtl_reduce_scatter(comm, send, recv, n, (dtl_dtype)t, o));
      expect_device_bytes(recv, h, bytes, "reduce_scatter", t);
      CUDA_OK(cudaMemset(recv, 0x5a, bytes));
      size_t counts[1] = {n};
      DTL_OK_(dtl_reduce_scatterv(comm, send, recv, counts, (dtl_dtype)t, o));
      expect_device_bytes(recv, h, bytes, "reduce_scatterv", t);
      DTL_OK_(dtl_all_reduce(comm, send, send, n, (dtl_dtype)t, o)); /* in place */
      DTL_OK_(dtl_reduce(comm, send, send, n, (dtl_dtype)t, o, 0));
      expect_device_bytes(send, h, bytes, "in-place all_reduce/reduce", t);
      CUDA_OK(cudaFree(send));
      CUDA_OK(cudaFree(recv));
    }
    free(h);
  }
}

static void all_gather_and_all_gatherv_of_one_rank_copy_the_own_block(void **state) {
  (void)state;
  const size_t n = 301;
  for (int t = 0; t < DTL_NUM_DTYPES; t++) {
    size_t bytes = n * dtl_dtype_size((dtl_dtype)t);
    void *h = host_data((dtl_dtype)t, n, t + 3), *send = dev_from(h, bytes), *recv = dev_poisoned(bytes);
    DTL_OK_(dtl_all_gather(comm, send, recv, n, (dtl_dtype)t));
    expect_device_bytes(recv, h, bytes, "all_gather", t);
    CUDA_OK(cudaMemset(recv, 0x5a, bytes));
    size_t counts[1] = {n};
    DTL_OK_(dtl_all_gatherv(comm, send, n, recv, counts, (dtl_dtype)t));
    expect_device_bytes(recv, h, bytes, "all_gatherv", t);
    DTL_OK_(dtl_all_gather(comm, send, send, n, (dtl_dtype)t)); /* in place */
    expect_device_bytes(send, h, bytes, "in-place all_gather", t);
    CUDA_OK(cudaFree(send));
    CUDA_OK(cudaFree(recv));
    free(h);
  }
}

static void zero_counts_move_nothing_and_write_nothing(void **state) {
  (void)state;
  void *recv = dev_poisoned(64), *send = dev_poisoned(64);
  size_t zero[1] = {0};
  DTL_OK_(dtl_all_gatherv(comm, send, 0, recv, zero, DTL_FLOAT32));
  DTL_OK_(dtl_all_to_allv(comm, send, zero, recv, zero, DTL_FLOAT32));
  DTL_OK_(dtl_reduce_scatterv(comm, send, recv, zero, DTL_INT32, DTL_AVG));
  DTL_OK_(dtl_all_reduce(comm, send, recv, 0, DTL_INT64, DTL_AVG));
  DTL_OK_(dtl_broadcast(comm, NULL, 0, DTL_INT8, 0));
  DTL_OK_(dtl_barrier(comm));
  expect_poison(recv, 64, "zero-count collectives");
  CUDA_OK(cudaFree(recv));
  CUDA_OK(cudaFree(send));
}

static void all_to_all_and_all_to_allv_of_one_rank_copy_the_own_block(void **state) {
  (void)state;
  const size_t n = 129;
  for (int t = 0; t < DTL_NUM_DTYPES; t++) {
    size_t bytes = n * dtl_dtype_size((dtl_dtype)t);
    void *h = host_data((dtl_dtype)t, n, t + 4), *send = dev_from(h, bytes), *recv = dev_poisoned(bytes);
    DTL_OK_(dtl_all_to_all(comm, send, recv, n, (dtl_dtype)t));
    expect_device_bytes(recv, h, bytes, "all_to_all", t);
    CUDA_OK(cudaMemset(recv, 0x5a, bytes));
    size_t counts[1] = {n};
    DTL_OK_(dtl_all_to_allv(comm, send, counts, recv, counts, (dtl_dtype)t));
    expect_device_bytes(recv, h, bytes, "all_to_allv", t);
    CUDA_OK(cudaFree(send));
    CUDA_OK(cudaFree(recv));
    free(h);
  }
}

static void all_to_allv_rejects_own_send_and_recv_counts_that_disagree(void **state) {
  (void)state;
  void *send = dev_poisoned(64), *recv = dev_poisoned(64);
  size_t sc[1] = {4}, rc[1] = {3};
  assert_int_equal(dtl_all_to_allv(comm, send, sc, recv, rc, DTL_FLOAT32), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "send_counts[0]=4"));
  assert_non_null(strstr(dtl_last_error(), "recv_counts[0]=3"));
  expect_poison(recv, 64, "all_to_allv with disagreeing counts");
  CUDA_OK(cudaFree(send));
  CUDA_OK(cudaFree(recv));
}

static void send_and_recv_to_the_own_rank_are_unsupported_and_write_nothing(void **state) {
  (void)state;
  void *buf = dev_poisoned(16);
  assert_int_equal(dtl_send(comm, buf, 4, DTL_INT32, 0), DTL_ERR_UNSUPPORTED);
  assert_non_null(strstr(dtl_last_error(), "peer=0"));
  assert_int_equal(dtl_recv(comm, buf, 4, DTL_INT32, 0), DTL_ERR_UNSUPPORTED);
  assert_non_null(strstr(dtl_last_error(), "peer=0"));
  expect_poison(buf, 16, "recv from self");
  CUDA_OK(cudaFree(buf));
}

/* A message to oneself is received by the same call: a device copy, for every dtype; the count rule is
 * checked first; the nonblocking form is the MPI transport's only. */
static void sendrecv_to_the_own_rank_copies_the_buffer_and_checks_the_counts_first(void **state) {
  (void)state;
  const size_t n = 129;
  for (int t = 0; t < DTL_NUM_DTYPES; t++) {
    size_t bytes = n * dtl_dtype_size((dtl_dtype)t);
    void *h = host_data((dtl_dtype)t, n, t + 5), *send = dev_from(h, bytes), *recv = dev_poisoned(bytes);
    DTL_OK_(dtl_sendrecv(comm, send, n, 0, recv, n, 0, (dtl_dtype)t));
    expect_device_bytes(recv, h, bytes, "sendrecv to oneself", t);
    CUDA_OK(cudaFree(send));
    CUDA_OK(cudaFree(recv));
    free(h);
  }
  void *send = dev_poisoned(64), *recv = dev_poisoned(64);
  CUDA_OK(cudaMemset(send, 1, 64));
  DTL_OK_(dtl_sendrecv(comm, send, 0, 0, recv, 0, 0, DTL_FLOAT32));
  assert_int_equal(dtl_sendrecv(comm, send, 4, 0, recv, 3, 0, DTL_INT32), DTL_ERR_COMM);
  assert_non_null(strstr(dtl_last_error(), "send_count=4"));
  assert_int_equal(dtl_sendrecv(comm, send, 3, 0, recv, 4, 0, DTL_INT32), DTL_ERR_MISMATCH);
  assert_non_null(strstr(dtl_last_error(), "recv_count=4"));
  assert_int_equal(dtl_sendrecv(comm, send, 4, 1, recv, 4, 0, DTL_INT32), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "dest=1"));
  dtl_request *req = NULL;
  assert_int_equal(dtl_sendrecv_async(comm, send, 4, 0, recv, 4, 0, DTL_INT32, &req), DTL_ERR_UNSUPPORTED);
  assert_null(req);
  expect_poison(recv, 64, "rejected or empty sendrecv");
  CUDA_OK(cudaFree(send));
  CUDA_OK(cudaFree(recv));
}

/* The barrier returns only once the work enqueued before it has finished. */
static void barrier_returns_after_the_enqueued_work_is_done(void **state) {
  (void)state;
  const size_t n = (size_t)64 << 20; /* 256 MiB of f32: long enough to be unfinished without a wait */
  void *a = dev_alloc(n * 4), *b = dev_alloc(n * 4);
  CUDA_OK(cudaMemsetAsync(a, 0, n * 4, stream));
  for (int k = 0; k < 8; k++) { /* several milliseconds of device work, enqueued in microseconds */
    DTL_OK_(dtl_all_reduce(comm, a, b, n, DTL_FLOAT32, DTL_SUM));
    DTL_OK_(dtl_all_gather(comm, b, a, n, DTL_FLOAT32));
  }
  DTL_OK_(dtl_barrier(comm));
  assert_int_equal((int)cudaStreamQuery(stream), (int)cudaSuccess);
  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaFree(b));
}

static void split_gives_a_child_on_the_parent_stream_that_communicates(void **state) {
  (void)state;
  dtl_comm *child = NULL;
  DTL_OK_(dtl_comm_split(comm, 0, 0, &child));
  assert_int_equal(dtl_comm_size(child), 1);
  assert_int_equal(dtl_comm_rank(child), 0);
  assert_ptr_equal(dtl_comm_nccl_stream(child), stream);
  assert_non_null(dtl_comm_nccl_handle(child));
  assert_ptr_not_equal(dtl_comm_nccl_handle(child), nccl);
  const size_t n = 100;
  void *h = host_data(DTL_INT64, n, 9), *d = dev_from(h, n * 8), *r = dev_poisoned(n * 8);
  DTL_OK_(dtl_all_reduce(child, d, r, n, DTL_INT64, DTL_AVG));
  expect_device_bytes(r, h, n * 8, "all_reduce on a split communicator", DTL_INT64);
  dtl_comm_destroy(child); /* destroys the ncclComm dtl made; the parent keeps working */
  DTL_OK_(dtl_all_reduce(comm, d, r, n, DTL_INT64, DTL_MAX));
  expect_device_bytes(r, h, n * 8, "all_reduce on the parent after the child is gone", DTL_INT64);
  CUDA_OK(cudaFree(d));
  CUDA_OK(cudaFree(r));
  free(h);
}

static void mesh_over_nccl_has_one_sub_communicator_per_dim(void **state) {
  (void)state;
  dtl_mesh *m = NULL;
  int shape[2] = {1, 1};
  DTL_OK_(dtl_mesh_create(comm, 2, shape, &m));
  for (int d = 0; d < 2; d++) {
    dtl_comm *sub = dtl_mesh_dim_comm(m, d);
    assert_int_equal(dtl_comm_size(sub), 1);
    assert_ptr_equal(dtl_comm_nccl_stream(sub), stream);
    DTL_OK_(dtl_barrier(sub));
  }
  dtl_mesh_destroy(m);
}

/* The memory ops the redistribution executor uses, through the communicator's memory interface. */
static void transport_memory_ops_work_on_device_memory(void **state) {
  (void)state;
  const dtl__comm_ops *ops = comm->ops;
  const dtl__mem *mem = &comm->mem;
  assert_int_equal(mem->ops->memory, DTL_MEMORY_DEVICE);
  const size_t n = 4096;
  void *h = host_data(DTL_INT32, n, 5);
  void *a = NULL, *b = NULL;
  DTL_OK_(dtl__mem_alloc(mem, n * 4, &a));
  DTL_OK_(dtl__mem_alloc(mem, n * 4, &b));
  CUDA_OK(cudaMemcpyAsync(a, h, n * 4, cudaMemcpyHostToDevice, stream));
  DTL_OK_(dtl__mem_copy(mem, b, a, n * 4));
  expect_device_bytes(b, h, n * 4, "mem_copy", DTL_INT32);

  /* Overlapping copy: memmove semantics, both directions. */
  unsigned char *want = malloc(n * 4);
  assert_non_null(want);
  memcpy(want, h, n * 4);
  memmove(want + 4, want, n * 4 - 4);
  DTL_OK_(dtl__mem_copy(mem, (char *)b + 4, b, n * 4 - 4));
  expect_device_bytes(b, want, n * 4, "overlapping mem_copy forward", DTL_INT32);
  memmove(want, want + 400, n * 4 - 400);
  DTL_OK_(dtl__mem_copy(mem, b, (char *)b + 400, n * 4 - 400));
  expect_device_bytes(b, want, n * 4, "overlapping mem_copy backward", DTL_INT32);

  DTL_OK_(dtl__mem_set(mem, b, 0x7f, n * 4));
  memset(want, 0x7f, n * 4);
  expect_device_bytes(b, want, n * 4, "mem_set", DTL_INT32);

  DTL_OK_(dtl__mem_fill_identity(mem, b, n, DTL_INT32, DTL_MIN));
  assert_int_equal(dtl__host_fill_identity(want, n, DTL_INT32, DTL_MIN), DTL_OK);
  expect_device_bytes(b, want, n * 4, "mem_fill_identity", DTL_INT32);

  /* Pack column block [3, 7) of a 64x64 i32 matrix. */
  dtl__box_copy box = {.ndim = 2, .elem_size = 4, .extent = {64, 4}, .src_shape = {64, 64}, .src_off = {0, 3},
                       .dst_shape = {64, 4}};
  assert_int_equal(dtl__host_copy_box(h, want, &box), DTL_OK);
  DTL_OK_(dtl__mem_copy_box(mem, a, b, &box));
  DTL_OK_(ops->synchronize(comm));
  assert_int_equal((int)cudaStreamQuery(stream), (int)cudaSuccess);
  expect_device_bytes(b, want, 64 * 4 * 4, "copy_box", DTL_INT32);

  dtl__mem_free(mem, a);
  dtl__mem_free(mem, b);
  DTL_OK_(ops->synchronize(comm));
  free(want);
  free(h);
}

static void abort_leaves_a_borrowed_nccl_comm_to_its_owner_and_later_calls_fail_with_a_comm_error(void **state) {
  (void)state;
  ncclUniqueId id;
  ncclComm_t other;
  dtl_comm *c = NULL;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&other, 1, id, 0));
  DTL_OK_(dtl_comm_from_nccl(other, stream, &c));
  void *buf = dev_poisoned(64);
  DTL_OK_(dtl_comm_abort(c));
  assert_null(dtl_comm_nccl_handle(c));
  assert_int_equal(dtl_all_reduce(c, buf, buf, 16, DTL_FLOAT32, DTL_SUM), DTL_ERR_COMM);
  assert_non_null(strstr(dtl_last_error(), "aborted"));
  assert_int_equal(dtl_comm_check(c), DTL_ERR_COMM);
  DTL_OK_(dtl_comm_abort(c)); /* twice is harmless */
  dtl_comm_destroy(c);
  NCCL_OK(ncclCommAbort(other)); /* the borrowed comm is its owner's to abort (comm.h) */
  expect_poison(buf, 64, "all_reduce on an aborted communicator");
  CUDA_OK(cudaFree(buf));
}

/* --- bad input (host pointers are fine: validation fails before NCCL sees them) --------------------- */
static void null_buffers_with_elements_are_rejected_naming_the_buffer(void **state) {
  (void)state;
  float host[4] = {0};
  assert_int_equal(dtl_all_reduce(comm, NULL, host, 4, DTL_FLOAT32, DTL_SUM), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "send=NULL"));
  assert_int_equal(dtl_all_gather(comm, host, NULL, 4, DTL_FLOAT32), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "recv=NULL"));
  assert_int_equal(dtl_broadcast(comm, NULL, 1, DTL_INT8, 0), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "buf=NULL"));
  size_t counts[1] = {4};
  assert_int_equal(dtl_all_to_allv(comm, host, NULL, host, counts, DTL_FLOAT32), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "send_counts=NULL"));
}

static void root_and_peer_out_of_range_are_rejected_naming_the_value(void **state) {
  (void)state;
  float host[4] = {1, 2, 3, 4};
  assert_int_equal(dtl_broadcast(comm, host, 4, DTL_FLOAT32, 1), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "root=1 (expected 0..0)"));
  assert_int_equal(dtl_reduce(comm, host, host, 4, DTL_FLOAT32, DTL_SUM, -1), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "root=-1"));
  assert_int_equal(dtl_scatter(comm, host, host, 1, DTL_FLOAT32, 5), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_gather(comm, host, host, 1, DTL_FLOAT32, 2), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_send(comm, host, 4, DTL_FLOAT32, 1), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "peer=1"));
  assert_int_equal(dtl_recv(comm, host, 4, DTL_FLOAT32, -3), DTL_ERR_INVALID_ARGUMENT);
  assert_true(host[0] == 1 && host[3] == 4);
}

static void bad_dtype_op_and_overflowing_counts_are_rejected(void **state) {
  (void)state;
  float host[4] = {0};
  assert_int_equal(dtl_all_reduce(comm, host, host, 4, (dtl_dtype)42, DTL_SUM), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "dtype=42"));
  assert_int_equal(dtl_all_reduce(comm, host, host, 4, DTL_FLOAT32, (dtl_reduce_op)9), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "op=9"));
  assert_int_equal(dtl_all_reduce(comm, host, host, SIZE_MAX / 2, DTL_FLOAT64, DTL_SUM), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "overflows"));
}

static void a_healthy_comm_checks_ok_and_null_comm_is_rejected(void **state) {
  (void)state;
  DTL_OK_(dtl_comm_check(comm));
  assert_int_equal(dtl_comm_check(NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_barrier(NULL), DTL_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest host[] = {
      cmocka_unit_test(from_nccl_rejects_null_comm_and_null_out),
      cmocka_unit_test(nccl_accessors_answer_null_for_null),
  };
  int failed = cmocka_run_group_tests_name("nccl transport, no device needed", host, NULL, NULL);
  if (failed) return failed;
  if (dtl_cuda_device_count() == 0) {
    printf("SKIP: no CUDA device visible (dtl_cuda_device_count() == 0): NCCL at world size 1 was not run\n");
    return 77;
  }
  const struct CMUnitTest device[] = {
      cmocka_unit_test(size_one_comm_is_rank0_of_1_on_device_memory_and_keeps_the_stream),
      cmocka_unit_test(broadcast_from_the_only_rank_keeps_the_buffer),
      cmocka_unit_test(scatter_and_gather_of_one_rank_copy_the_block_in_and_out_of_place),
      cmocka_unit_test(reductions_of_one_rank_return_the_input_for_every_dtype_and_op),
      cmocka_unit_test(all_gather_and_all_gatherv_of_one_rank_copy_the_own_block),
      cmocka_unit_test(zero_counts_move_nothing_and_write_nothing),
      cmocka_unit_test(all_to_all_and_all_to_allv_of_one_rank_copy_the_own_block),
      cmocka_unit_test(all_to_allv_rejects_own_send_and_recv_counts_that_disagree),
      cmocka_unit_test(send_and_recv_to_the_own_rank_are_unsupported_and_write_nothing),
      cmocka_unit_test(sendrecv_to_the_own_rank_copies_the_buffer_and_checks_the_counts_first),
      cmocka_unit_test(barrier_returns_after_the_enqueued_work_is_done),
      cmocka_unit_test(split_gives_a_child_on_the_parent_stream_that_communicates),
      cmocka_unit_test(mesh_over_nccl_has_one_sub_communicator_per_dim),
      cmocka_unit_test(transport_memory_ops_work_on_device_memory),
      cmocka_unit_test(abort_leaves_a_borrowed_nccl_comm_to_its_owner_and_later_calls_fail_with_a_comm_error),
      cmocka_unit_test(null_buffers_with_elements_are_rejected_naming_the_buffer),
      cmocka_unit_test(root_and_peer_out_of_range_are_rejected_naming_the_value),
      cmocka_unit_test(bad_dtype_op_and_overflowing_counts_are_rejected),
      cmocka_unit_test(a_healthy_comm_checks_ok_and_null_comm_is_rejected),
  };
  return cmocka_run_group_tests_name("nccl transport at world size 1", device, setup, teardown);
}

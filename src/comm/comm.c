/* SPDX-License-Identifier: Apache-2.0 */
/* The public collective entry points: each validates its arguments once, in one place, and then calls the
 * transport's vtable. A failed validation writes no output buffer. */
#include <stdlib.h>
#include "comm/backend.h"

dtl_status dtl__comm_new(const dtl__comm_ops *ops, int rank, int size, void *impl, dtl_comm **out) {
  dtl_comm *c = calloc(1, sizeof *c);
  if (!c) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm: out of host memory");
  c->ops = ops;
  c->rank = rank;
  c->size = size;
  c->impl = impl;
  *out = c;
  return DTL_OK;
}

int dtl_comm_rank(const dtl_comm *c) { return c ? c->rank : -1; }
int dtl_comm_size(const dtl_comm *c) { return c ? c->size : -1; }
dtl_memory dtl_comm_memory(const dtl_comm *c) { return c ? c->ops->memory : DTL_MEMORY_HOST; }
const char *dtl_comm_backend_name(const dtl_comm *c) { return c ? c->ops->name : "none"; }

void dtl_comm_destroy(dtl_comm *c) {
  if (!c) return;
  c->ops->destroy(c);
  free(c);
}

/* Checks shared by every call: a live communicator, a valid dtype and (optionally) op. */
static dtl_status dtl__check_comm(const char *fn, dtl_comm *c) {
  if (!c) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: comm=NULL", fn);
  if (c->aborted) return dtl__error(DTL_ERR_COMM, "%s: the communicator was aborted", fn);
  return DTL_OK;
}

static dtl_status dtl__check_common(const char *fn, dtl_comm *c, dtl_dtype t) {
  DTL_TRY(dtl__check_comm(fn, c));
  if (!dtl__dtype_valid(t)) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: dtype=%d (expected 0..%d)", fn, (int)t, DTL_NUM_DTYPES - 1);
  return DTL_OK;
}

static dtl_status dtl__check_op(const char *fn, dtl_reduce_op op) {
  if (!dtl__reduce_op_valid(op))
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: op=%d (expected DTL_SUM..DTL_AVG)", fn, (int)op);
  return DTL_OK;
}

static dtl_status dtl__check_rank(const char *fn, const char *arg, const dtl_comm *c, int r) {
  if (r < 0 || r >= c->size)
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s=%d (expected 0..%d)", fn, arg, r, c->size - 1);
  return DTL_OK;
}

/* A buffer of count elements (times multiplier) must be non-NULL unless it is empty; its byte size must fit. */
static dtl_status dtl__check_buf(const char *fn, const char *arg, const void *buf, size_t count, size_t multiplier,
                                 dtl_dtype t) {
  size_t total, bytes;
  if (!dtl__mul_size(count, multiplier, &total))
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: count %zu x %zu ranks overflows size_t (buffer %s)", fn, count,
                      multiplier, arg);
  DTL_TRY(dtl__bytes(fn, "count", total, t, &bytes));
  if (!buf && bytes > 0) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s=NULL with %zu elements", fn, arg, total);
  return DTL_OK;
}

/* Sums a per-rank count array (which must be non-NULL), checking overflow. */
static dtl_status dtl__sum_counts(const char *fn, const char *arg, const dtl_comm *c, const size_t *counts,
                                  size_t *total) {
  if (!counts) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s=NULL", fn, arg);
  size_t s = 0;
  for (int i = 0; i < c->size; i++)
    if (!dtl__add_size(s, counts[i], &s))
      return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s sum overflows size_t at %s[%d]=%zu", fn, arg, arg, i, counts[i]);
  *total = s;
  return DTL_OK;
}

dtl_status dtl_comm_split(dtl_comm *c, int color, int key, dtl_comm **out) {
  DTL_TRY(dtl__check_comm("dtl_comm_split", c));
  DTL_CHECK_ARG(out != NULL, "dtl_comm_split", "out=NULL");
  DTL_CHECK_ARG(color >= 0, "dtl_comm_split", "color=%d (expected >= 0)", color);
  return c->ops->split(c, color, key, out);
}

dtl_status dtl_comm_check(dtl_comm *c) {
  DTL_TRY(dtl__check_comm("dtl_comm_check", c));
  return c->ops->check(c);
}

dtl_status dtl_comm_abort(dtl_comm *c) {
  DTL_CHECK_ARG(c != NULL, "dtl_comm_abort", "comm=NULL");
  if (c->aborted) return DTL_OK;
  c->aborted = true;
  return c->ops->abort(c);
}

dtl_status dtl_barrier(dtl_comm *c) {
  DTL_TRY(dtl__check_comm("dtl_barrier", c));
  return c->ops->barrier(c);
}

dtl_status dtl_broadcast(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int root) {
  static const char fn[] = "dtl_broadcast";
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_rank(fn, "root", c, root));
  DTL_TRY(dtl__check_buf(fn, "buf", buf, count, 1, t));
  return c->ops->broadcast(c, buf, count, t, root);
}

dtl_status dtl_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, int root) {
  static const char fn[] = "dtl_scatter";
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_rank(fn, "root", c, root));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, recv_count, 1, t));
  if (c->rank == root) DTL_TRY(dtl__check_buf(fn, "send", send, recv_count, (size_t)c->size, t));
  return c->ops->scatter(c, send, recv, recv_count, t, root);
}

dtl_status dtl_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t, int root) {
  static const char fn[] = "dtl_gather";
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_rank(fn, "root", c, root));
  DTL_TRY(dtl__check_buf(fn, "send", send, send_count, 1, t));
  if (c->rank == root) DTL_TRY(dtl__check_buf(fn, "recv", recv, send_count, (size_t)c->size, t));
  return c->ops->gather(c, send, recv, send_count, t, root);
}

dtl_status dtl_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op, int root) {
  static const char fn[] = "dtl_reduce";
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_op(fn, op));
  DTL_TRY(dtl__check_rank(fn, "root", c, root));
  DTL_TRY(dtl__check_buf(fn, "send", send, count, 1, t));
  if (c->rank == root) DTL_TRY(dtl__check_buf(fn, "recv", recv, count, 1, t));
  return c->ops->reduce(c, send, recv, count, t, op, root);
}

dtl_status dtl_all_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t) {
  static const char fn[] = "dtl_all_gather";
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_buf(fn, "send", send, send_count, 1, t));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, send_count, (size_t)c->size, t));
  return c->ops->all_gather(c, send, recv, send_count, t);
}

dtl_status dtl_all_gatherv(dtl_comm *c, const void *send, size_t send_count, void *recv, const size_t *recv_counts,
                           dtl_dtype t) {
  static const char fn[] = "dtl_all_gatherv";
  size_t total;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__sum_counts(fn, "recv_counts", c, recv_counts, &total));
  if (recv_counts[c->rank] != send_count)
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: send_count=%zu differs from recv_counts[%d]=%zu", fn, send_count,
                      c->rank, recv_counts[c->rank]);
  DTL_TRY(dtl__check_buf(fn, "send", send, send_count, 1, t));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, total, 1, t));
  return c->ops->all_gatherv(c, send, send_count, recv, recv_counts, t);
}

dtl_status dtl_all_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op) {
  static const char fn[] = "dtl_all_reduce";
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_op(fn, op));
  DTL_TRY(dtl__check_buf(fn, "send", send, count, 1, t));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, count, 1, t));
  return c->ops->all_reduce(c, send, recv, count, t, op);
}

dtl_status dtl_reduce_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                              dtl_reduce_op op) {
  static const char fn[] = "dtl_reduce_scatter";
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_op(fn, op));
  DTL_TRY(dtl__check_buf(fn, "send", send, recv_count, (size_t)c->size, t));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, recv_count, 1, t));
  return c->ops->reduce_scatter(c, send, recv, recv_count, t, op);
}

dtl_status dtl_reduce_scatterv(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts, dtl_dtype t,
                               dtl_reduce_op op) {
  static const char fn[] = "dtl_reduce_scatterv";
  size_t total;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_op(fn, op));
  DTL_TRY(dtl__sum_counts(fn, "recv_counts", c, recv_counts, &total));
  DTL_TRY(dtl__check_buf(fn, "send", send, total, 1, t));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, recv_counts[c->rank], 1, t));
  return c->ops->reduce_scatterv(c, send, recv, recv_counts, t, op);
}

dtl_status dtl_all_to_all(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t) {
  static const char fn[] = "dtl_all_to_all";
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_buf(fn, "send", send, count_per_peer, (size_t)c->size, t));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, count_per_peer, (size_t)c->size, t));
  return c->ops->all_to_all(c, send, recv, count_per_peer, t);
}

dtl_status dtl_all_to_allv(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                           const size_t *recv_counts, dtl_dtype t) {
  static const char fn[] = "dtl_all_to_allv";
  size_t stotal, rtotal;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__sum_counts(fn, "send_counts", c, send_counts, &stotal));
  DTL_TRY(dtl__sum_counts(fn, "recv_counts", c, recv_counts, &rtotal));
  DTL_TRY(dtl__check_buf(fn, "send", send, stotal, 1, t));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, rtotal, 1, t));
  return c->ops->all_to_allv(c, send, send_counts, recv, recv_counts, t);
}

dtl_status dtl_send(dtl_comm *c, const void *buf, size_t count, dtl_dtype t, int peer) {
  static const char fn[] = "dtl_send";
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_rank(fn, "peer", c, peer));
  DTL_TRY(dtl__check_buf(fn, "buf", buf, count, 1, t));
  return c->ops->send(c, buf, count, t, peer);
}

dtl_status dtl_recv(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int peer) {
  static const char fn[] = "dtl_recv";
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_rank(fn, "peer", c, peer));
  DTL_TRY(dtl__check_buf(fn, "buf", buf, count, 1, t));
  return c->ops->recv(c, buf, count, t, peer);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The public collective entry points: each validates its arguments once, in one place, and then calls the
 * transport's vtable. A failed validation writes no output buffer. With DTL_CHECK on the communicator, every
 * collective entry point first agrees with its peers on a fingerprint of the call and on each rank's verdict
 * (agree.h); dtl_comm_split always agrees, before and after splitting. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include "comm/agree.h"
#include "comm/deadline.h"
#include "common/quote.h"

/* DTL_CHECK: set, non-empty and not "0". */
static bool dtl__check_from_env(void) {
  const char *v = getenv("DTL_CHECK");
  return v && v[0] && !(v[0] == '0' && v[1] == '\0');
}

dtl_status dtl__comm_new(const dtl__comm_ops *ops, dtl__mem mem, int rank, int size, void *impl, dtl_comm **out) {
  dtl_comm *c = dtl__calloc(1, sizeof *c);
  if (!c) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm: out of host memory");
  c->ops = ops;
  c->mem = mem;
  c->rank = rank;
  c->size = size;
  c->impl = impl;
  c->check = dtl__check_from_env();
  c->nnodes = 1;
  c->mesh_dim = -1;
  size_t p = (size_t)size;
  double timeout = 0;
  dtl_status st = dtl__timeout_from_env("dtl_comm", &timeout);
  if (st == DTL_OK && (!(c->node = dtl__calloc(p, sizeof *c->node)) ||
                       !(c->agree_host = dtl__malloc(sizeof(int64_t) * dtl__agree_host_len(c))) ||
                       !(c->agree_ranks = dtl__malloc(sizeof(int) * p))))
    st = dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm: out of host memory");
  if (st == DTL_OK) st = dtl__comm_fate_new(c, timeout);
  /* The device staging of every agreement exchange (agree.c): the explanation's chunks, dtl__agree_among's
   * verdicts and reply. */
  if (st == DTL_OK && mem.ops->memory == DTL_MEMORY_DEVICE) st = dtl__agree_reserve(c);
  if (st != DTL_OK) {
    c->ops = NULL;
    dtl__comm_free(c);
    return st;
  }
  *out = c;
  return DTL_OK;
}

void dtl__comm_free(dtl_comm *c) {
  if (c->agree_buf) dtl__mem_free(&c->mem, c->agree_buf);
  if (c->ops) c->ops->destroy(c);
  dtl__comm_fate_release(c);
  dtl__free(c->agree_ranks);
  dtl__free(c->agree_host);
  dtl__free(c->node);
  dtl__free(c);
}

int dtl__comm_node_of(const dtl_comm *c, int rank) { return c->node[rank]; }
int dtl__comm_nnodes(const dtl_comm *c) { return c->nnodes; }

dtl_status dtl__ranks_per_node_from_env(const char *fn, int *n) {
  const char *v = getenv("DTL_RANKS_PER_NODE");
  *n = 0;
  if (!v || !v[0]) return DTL_OK;
  char *end = NULL;
  errno = 0;
  long x = (v[0] >= '0' && v[0] <= '9') ? strtol(v, &end, 10) : 0;
  if (!end || *end != '\0' || errno == ERANGE || x < 1 || x > INT_MAX) {
    char q[DTL__QUOTE_CAP];
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "DTL_RANKS_PER_NODE=\"%s\" (expected a whole number of ranks "
                         "per node, 1..%d)", dtl__quote(v, q, sizeof q), INT_MAX);
  }
  *n = (int)x;
  return DTL_OK;
}

/* (key, rank) pairs sort by key, then rank: each key's first entry is its first appearance. */
static int dtl__key_rank_cmp(const void *a, const void *b) {
  const int *x = a, *y = b;
  return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

void dtl__comm_set_node_keys(dtl_comm *c, const int *keys, int *scratch) {
  int n = c->size;
  for (int i = 0; i < n; i++) {
    scratch[2 * i] = keys[i];
    scratch[2 * i + 1] = i;
  }
  qsort(scratch, (size_t)n, 2 * sizeof(int), dtl__key_rank_cmp);
  /* Each rank gets the first rank of its key (which comes no later than itself), then the firsts are numbered in
   * rank order: scratch's first half is free again and maps a first rank to its node id. */
  for (int i = 0, lead = 0; i < n; i++) {
    if (i == 0 || scratch[2 * i] != scratch[2 * (i - 1)]) lead = scratch[2 * i + 1];
    c->node[scratch[2 * i + 1]] = lead;
  }
  int next = 0;
  for (int i = 0; i < n; i++) {
    if (c->node[i] == i) scratch[i] = next++;
    c->node[i] = scratch[c->node[i]];
  }
  c->nnodes = next;
}

int dtl_comm_rank(const dtl_comm *c) { return c ? c->rank : -1; }
int dtl_comm_size(const dtl_comm *c) { return c ? c->size : -1; }
dtl_memory dtl_comm_memory(const dtl_comm *c) { return c ? c->mem.ops->memory : DTL_MEMORY_HOST; }
const char *dtl_comm_backend_name(const dtl_comm *c) { return c ? c->ops->name : "none"; }

void dtl_comm_destroy(dtl_comm *c) {
  if (c) dtl__comm_free(c);
}

/* Checks shared by every call: a live communicator, a valid dtype and (optionally) op. */
static dtl_status dtl__check_comm(const char *fn, dtl_comm *c) {
  if (!c) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: comm=NULL", fn);
  return dtl__comm_live(c, fn);
}

static dtl_status dtl__check_common(const char *fn, dtl_comm *c, dtl_dtype t) {
  DTL_TRY(dtl__check_comm(fn, c));
  if (!dtl__dtype_valid(t)) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: dtype=%d (expected 0..%d)", fn, (int)t, DTL_NUM_DTYPES - 1);
  return DTL_OK;
}

const char *dtl__comm_reduce_refusal(const dtl_comm *c, dtl_dtype t, dtl_reduce_op op, char *buf, size_t cap) {
  if (dtl__reduce_rounds(t, op, buf, cap)) return buf;
  return dtl__dtype_is_fp8(t) && c ? c->fp8_reduce_refusal : NULL;
}

/* A valid op that reduces t on c (after dtl__check_common). */
static dtl_status dtl__check_op(const char *fn, const dtl_comm *c, dtl_dtype t, dtl_reduce_op op) {
  if (!dtl__reduce_op_valid(op))
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: op=%d (expected DTL_SUM..DTL_AVG)", fn, (int)op);
  char why[256];
  const char *no = dtl__comm_reduce_refusal(c, t, op, why, sizeof why);
  if (no)
    return dtl__error(DTL_ERR_UNSUPPORTED, "%s: op=%s on dtype %s is unsupported: %s", fn, dtl_reduce_op_name(op),
                      dtl_dtype_name(t), no);
  return DTL_OK;
}

static dtl_status dtl__check_rank(const char *fn, const char *arg, const dtl_comm *c, int r) {
  if (r < 0 || r >= c->size)
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s=%d (expected 0..%d)", fn, arg, r, c->size - 1);
  return DTL_OK;
}

/* A buffer of count*multiplier elements (count is the argument named count_arg) must be non-NULL unless it
 * is empty, and its byte size must fit size_t; *bytes receives that size. */
static dtl_status dtl__check_buf(const char *fn, const char *arg, const void *buf, const char *count_arg, size_t count,
                                 size_t multiplier, dtl_dtype t, size_t *bytes) {
  size_t total;
  if (!dtl__mul_size(count, multiplier, &total) || !dtl__mul_size(total, dtl_dtype_size(t), bytes)) {
    if (multiplier == 1)
      return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s=%zu elements of %s overflow size_t bytes (buffer %s)", fn,
                        count_arg, count, dtl_dtype_name(t), arg);
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s=%zu x %zu ranks elements of %s overflow size_t bytes (buffer %s)",
                      fn, count_arg, count, multiplier, dtl_dtype_name(t), arg);
  }
  if (!buf && *bytes > 0) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s=NULL with %zu elements", fn, arg, total);
  return DTL_OK;
}

/* send and recv may overlap only in the call's documented in-place arrangement (in_place), since the
 * engines give undefined results for any other aliasing. */
static dtl_status dtl__check_alias(const char *fn, const void *send, size_t send_bytes, const void *recv,
                                   size_t recv_bytes, bool in_place, const char *in_place_rule) {
  if (!in_place && dtl__overlap(send, send_bytes, recv, recv_bytes))
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: send=%p and recv=%p overlap (in place needs %s)", fn, send, recv,
                      in_place_rule);
  return DTL_OK;
}

/* Sums a per-rank count array (which must be non-NULL), checking overflow; *before_rank receives the sum
 * of the entries before this rank's (its packed offset). */
static dtl_status dtl__sum_counts(const char *fn, const char *arg, const dtl_comm *c, const size_t *counts,
                                  size_t *total, size_t *before_rank) {
  if (!counts) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s=NULL", fn, arg);
  size_t s = 0;
  for (int i = 0; i < c->size; i++) {
    if (i == c->rank) *before_rank = s;
    if (!dtl__add_size(s, counts[i], &s))
      return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s[%d]=%zu makes the sum overflow size_t", fn, arg, i,
                        counts[i]);
  }
  *total = s;
  return DTL_OK;
}

/* Returns unless this rank may communicate: local is its verdict on its arguments. With DTL_CHECK the ranks
 * first agree on it and on fp, the call's fingerprint (evaluated only then). A NULL or aborted communicator
 * has no way to tell its peers: that rank returns alone. */
#define DTL__ENTER(c, fn, local, fp)                                  \
  do {                                                                \
    dtl_status l_ = (local);                                          \
    if (l_ != DTL_OK && (!(c) || dtl__comm_dead(c))) return l_;       \
    DTL_TRY(dtl__agree_checked((c), (fn), (fp), l_));                 \
  } while (0)

/* The fingerprint of a collective call: its name and the values every rank must pass alike. */
static uint64_t dtl__fp_call(const char *fn, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return dtl__fp_mix(dtl__fp_mix(dtl__fp_mix(dtl__fp_mix(dtl__fp_str(0, fn), a), b), c), d);
}

dtl_status dtl_comm_split(dtl_comm *c, int color, int key, dtl_comm **out) {
  static const char fn[] = "dtl_comm_split";
  DTL_TRY(dtl__check_comm(fn, c));
  dtl_status local = DTL_OK;
  if (!out) local = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "out=NULL");
  else if (color < 0) local = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "color=%d (expected >= 0)", color);
  /* A creation: every rank learns whether all may split (and whether all run with DTL_CHECK alike), and
   * afterwards whether every rank got its communicator, so that none is left holding one alone. */
  DTL_TRY(dtl__agree(c, fn, dtl__fp_mix(0x5711ull, c->check), local));
  dtl_comm *nc = NULL;
  dtl_status st = c->ops->split(c, color, key, &nc);
  if (st == DTL_OK) {
    nc->check = c->check;
    dtl__comm_fate_share(nc, c);
  }
  st = dtl__agree(c, fn, 0, st);
  if (st != DTL_OK) {
    dtl_comm_destroy(nc);
    return st;
  }
  *out = nc;
  return DTL_OK;
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
  static const char fn[] = "dtl_barrier";
  DTL__ENTER(c, fn, dtl__check_comm(fn, c), dtl__fp_call(fn, 0, 0, 0, 0));
  return c->ops->barrier(c);
}

static dtl_status dtl__args_broadcast(const char *fn, dtl_comm *c, void *buf, size_t count, dtl_dtype t, int root) {
  size_t bytes;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_rank(fn, "root", c, root));
  return dtl__check_buf(fn, "buf", buf, "count", count, 1, t, &bytes);
}

dtl_status dtl_broadcast(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int root) {
  static const char fn[] = "dtl_broadcast";
  DTL__ENTER(c, fn, dtl__args_broadcast(fn, c, buf, count, t, root), dtl__fp_call(fn, count, t, (uint64_t)root, 0));
  return c->ops->broadcast(c, buf, count, t, root);
}

static dtl_status dtl__args_scatter(const char *fn, dtl_comm *c, const void *send, void *recv, size_t recv_count,
                                    dtl_dtype t, int root) {
  size_t sbytes, rbytes;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_rank(fn, "root", c, root));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "recv_count", recv_count, 1, t, &rbytes));
  if (c->rank != root) return DTL_OK;
  DTL_TRY(dtl__check_buf(fn, "send", send, "recv_count", recv_count, (size_t)c->size, t, &sbytes));
  return dtl__check_alias(fn, send, sbytes, recv, rbytes, dtl__ptr_at(recv, send, (size_t)root * rbytes),
                          "recv == send + root*recv_count on root");
}

dtl_status dtl_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t, int root) {
  static const char fn[] = "dtl_scatter";
  DTL__ENTER(c, fn, dtl__args_scatter(fn, c, send, recv, recv_count, t, root),
             dtl__fp_call(fn, recv_count, t, (uint64_t)root, 0));
  return c->ops->scatter(c, send, recv, recv_count, t, root);
}

static dtl_status dtl__args_gather(const char *fn, dtl_comm *c, const void *send, void *recv, size_t send_count,
                                   dtl_dtype t, int root) {
  size_t sbytes, rbytes;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_rank(fn, "root", c, root));
  DTL_TRY(dtl__check_buf(fn, "send", send, "send_count", send_count, 1, t, &sbytes));
  if (c->rank != root) return DTL_OK;
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "send_count", send_count, (size_t)c->size, t, &rbytes));
  return dtl__check_alias(fn, send, sbytes, recv, rbytes, dtl__ptr_at(send, recv, (size_t)root * sbytes),
                          "send == recv + root*send_count on root");
}

dtl_status dtl_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t, int root) {
  static const char fn[] = "dtl_gather";
  DTL__ENTER(c, fn, dtl__args_gather(fn, c, send, recv, send_count, t, root),
             dtl__fp_call(fn, send_count, t, (uint64_t)root, 0));
  return c->ops->gather(c, send, recv, send_count, t, root);
}

static dtl_status dtl__args_reduce(const char *fn, dtl_comm *c, const void *send, void *recv, size_t count,
                                   dtl_dtype t, dtl_reduce_op op, int root) {
  size_t sbytes, rbytes;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_op(fn, c, t, op));
  DTL_TRY(dtl__check_rank(fn, "root", c, root));
  DTL_TRY(dtl__check_buf(fn, "send", send, "count", count, 1, t, &sbytes));
  if (c->rank != root) return DTL_OK;
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "count", count, 1, t, &rbytes));
  return dtl__check_alias(fn, send, sbytes, recv, rbytes, send == recv, "send == recv on root");
}

dtl_status dtl_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op, int root) {
  static const char fn[] = "dtl_reduce";
  DTL__ENTER(c, fn, dtl__args_reduce(fn, c, send, recv, count, t, op, root),
             dtl__fp_call(fn, count, t, op, (uint64_t)root));
  return c->ops->reduce(c, send, recv, count, t, op, root);
}

/* The argument rules of the collectives that also have a nonblocking form, shared by both entry points. */
static dtl_status dtl__args_all_gather(const char *fn, dtl_comm *c, const void *send, void *recv, size_t send_count,
                                       dtl_dtype t) {
  size_t sbytes = 0, rbytes = 0;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_buf(fn, "send", send, "send_count", send_count, 1, t, &sbytes));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "send_count", send_count, (size_t)c->size, t, &rbytes));
  return dtl__check_alias(fn, send, sbytes, recv, rbytes, dtl__ptr_at(send, recv, (size_t)c->rank * sbytes),
                          "send == recv + rank*send_count");
}

static dtl_status dtl__args_all_gatherv(const char *fn, dtl_comm *c, const void *send, size_t send_count, void *recv,
                                        const size_t *recv_counts, dtl_dtype t) {
  size_t total = 0, before = 0, sbytes = 0, rbytes = 0;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__sum_counts(fn, "recv_counts", c, recv_counts, &total, &before));
  if (recv_counts[c->rank] != send_count)
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: send_count=%zu (expected recv_counts[%d]=%zu)", fn, send_count,
                      c->rank, recv_counts[c->rank]);
  DTL_TRY(dtl__check_buf(fn, "send", send, "send_count", send_count, 1, t, &sbytes));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "sum(recv_counts)", total, 1, t, &rbytes));
  return dtl__check_alias(fn, send, sbytes, recv, rbytes, dtl__ptr_at(send, recv, before * dtl_dtype_size(t)),
                          "send == recv + the counts of the ranks before this one");
}

static dtl_status dtl__args_all_reduce(const char *fn, dtl_comm *c, const void *send, void *recv, size_t count,
                                       dtl_dtype t, dtl_reduce_op op) {
  size_t sbytes, rbytes;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_op(fn, c, t, op));
  DTL_TRY(dtl__check_buf(fn, "send", send, "count", count, 1, t, &sbytes));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "count", count, 1, t, &rbytes));
  return dtl__check_alias(fn, send, sbytes, recv, rbytes, send == recv, "send == recv");
}

static dtl_status dtl__args_reduce_scatter(const char *fn, dtl_comm *c, const void *send, void *recv,
                                           size_t recv_count, dtl_dtype t, dtl_reduce_op op) {
  size_t sbytes = 0, rbytes = 0;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_op(fn, c, t, op));
  DTL_TRY(dtl__check_buf(fn, "send", send, "recv_count", recv_count, (size_t)c->size, t, &sbytes));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "recv_count", recv_count, 1, t, &rbytes));
  return dtl__check_alias(fn, send, sbytes, recv, rbytes, dtl__ptr_at(recv, send, (size_t)c->rank * rbytes),
                          "recv == send + rank*recv_count");
}

static dtl_status dtl__args_all_to_all(const char *fn, dtl_comm *c, const void *send, void *recv,
                                       size_t count_per_peer, dtl_dtype t) {
  size_t sbytes, rbytes;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_buf(fn, "send", send, "count_per_peer", count_per_peer, (size_t)c->size, t, &sbytes));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "count_per_peer", count_per_peer, (size_t)c->size, t, &rbytes));
  return dtl__check_alias(fn, send, sbytes, recv, rbytes, send == recv, "send == recv");
}

static dtl_status dtl__args_all_to_allv(const char *fn, dtl_comm *c, const void *send, const size_t *send_counts,
                                        void *recv, const size_t *recv_counts, dtl_dtype t) {
  size_t stotal = 0, rtotal = 0, unused = 0, sbytes = 0, rbytes = 0;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__sum_counts(fn, "send_counts", c, send_counts, &stotal, &unused));
  DTL_TRY(dtl__sum_counts(fn, "recv_counts", c, recv_counts, &rtotal, &unused));
  DTL_TRY(dtl__check_buf(fn, "send", send, "sum(send_counts)", stotal, 1, t, &sbytes));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "sum(recv_counts)", rtotal, 1, t, &rbytes));
  if (send == recv && sbytes && rbytes) /* (an empty side that merely shares the pointer is no overlap) */
    for (int i = 0; i < c->size; i++)
      if (send_counts[i] != recv_counts[i])
        return dtl__error(DTL_ERR_INVALID_ARGUMENT,
                          "%s: in place (send == recv) with send_counts[%d]=%zu != recv_counts[%d]=%zu", fn, i,
                          send_counts[i], i, recv_counts[i]);
  DTL_TRY(dtl__check_alias(fn, send, sbytes, recv, rbytes, send == recv, "send == recv"));
  /* What a rank sends itself it receives from itself: checked here, before any agreement, for every engine. */
  if (send_counts[c->rank] != recv_counts[c->rank])
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: send_counts[%d]=%zu differs from recv_counts[%d]=%zu (this rank's "
                      "block to itself)", fn, c->rank, send_counts[c->rank], c->rank, recv_counts[c->rank]);
  return DTL_OK;
}

static dtl_status dtl__args_reduce_scatterv(const char *fn, dtl_comm *c, const void *send, void *recv,
                                            const size_t *recv_counts, dtl_dtype t, dtl_reduce_op op) {
  size_t total = 0, before = 0, sbytes = 0, rbytes = 0;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_op(fn, c, t, op));
  DTL_TRY(dtl__sum_counts(fn, "recv_counts", c, recv_counts, &total, &before));
  DTL_TRY(dtl__check_buf(fn, "send", send, "sum(recv_counts)", total, 1, t, &sbytes));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "recv_counts[rank]", recv_counts[c->rank], 1, t, &rbytes));
  return dtl__check_alias(fn, send, sbytes, recv, rbytes, dtl__ptr_at(recv, send, before * dtl_dtype_size(t)),
                          "recv == send + the counts of the ranks before this one");
}

/* Whether a call with `each` elements per rank uses the in-place form, a == b + rank * each (part of the
 * fingerprint: MPI needs every rank or none to). Only where every rank's own block has that same non-zero
 * size: in the v-forms a rank with an empty block may share a pointer or not, so they leave it out. */
static uint64_t dtl__in_place_at(const void *a, const void *b, const dtl_comm *c, size_t each, dtl_dtype t) {
  return each && dtl__ptr_at(a, b, (size_t)c->rank * each * dtl_dtype_size(t));
}

/* Each all-rank collective twice: the public entry point (argument checks, the DTL_CHECK agreement, the
 * engine) and the form that layers call after agreeing on their whole call (argument checks, the engine). */
dtl_status dtl_all_gather(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t) {
  static const char fn[] = "dtl_all_gather";
  DTL__ENTER(c, fn, dtl__args_all_gather(fn, c, send, recv, send_count, t),
             dtl__fp_call(fn, send_count, t, dtl__in_place_at(send, recv, c, send_count, t), 0));
  return c->ops->all_gather(c, send, recv, send_count, t);
}
dtl_status dtl__all_gather_agreed(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t) {
  DTL_TRY(dtl__args_all_gather("dtl_all_gather", c, send, recv, send_count, t));
  return c->ops->all_gather(c, send, recv, send_count, t);
}

dtl_status dtl_all_gatherv(dtl_comm *c, const void *send, size_t send_count, void *recv, const size_t *recv_counts,
                           dtl_dtype t) {
  static const char fn[] = "dtl_all_gatherv";
  DTL__ENTER(c, fn, dtl__args_all_gatherv(fn, c, send, send_count, recv, recv_counts, t),
             dtl__fp_call(fn, dtl__fp_sizes(0, recv_counts, c->size), t, 0, 0));
  return c->ops->all_gatherv(c, send, send_count, recv, recv_counts, t);
}
dtl_status dtl__all_gatherv_agreed(dtl_comm *c, const void *send, size_t send_count, void *recv,
                                   const size_t *recv_counts, dtl_dtype t) {
  DTL_TRY(dtl__args_all_gatherv("dtl_all_gatherv", c, send, send_count, recv, recv_counts, t));
  return c->ops->all_gatherv(c, send, send_count, recv, recv_counts, t);
}

dtl_status dtl_all_reduce(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t, dtl_reduce_op op) {
  static const char fn[] = "dtl_all_reduce";
  DTL__ENTER(c, fn, dtl__args_all_reduce(fn, c, send, recv, count, t, op), dtl__fp_call(fn, count, t, op, count && send == recv));
  return c->ops->all_reduce(c, send, recv, count, t, op);
}
dtl_status dtl__all_reduce_agreed(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t,
                                  dtl_reduce_op op) {
  DTL_TRY(dtl__args_all_reduce("dtl_all_reduce", c, send, recv, count, t, op));
  return c->ops->all_reduce(c, send, recv, count, t, op);
}

dtl_status dtl_reduce_scatter(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                              dtl_reduce_op op) {
  static const char fn[] = "dtl_reduce_scatter";
  DTL__ENTER(c, fn, dtl__args_reduce_scatter(fn, c, send, recv, recv_count, t, op),
             dtl__fp_call(fn, recv_count, t, op, dtl__in_place_at(recv, send, c, recv_count, t)));
  return c->ops->reduce_scatter(c, send, recv, recv_count, t, op);
}

dtl_status dtl_reduce_scatterv(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts, dtl_dtype t,
                               dtl_reduce_op op) {
  static const char fn[] = "dtl_reduce_scatterv";
  DTL__ENTER(c, fn, dtl__args_reduce_scatterv(fn, c, send, recv, recv_counts, t, op),
             dtl__fp_call(fn, dtl__fp_sizes(0, recv_counts, c->size), t, op, 0));
  return c->ops->reduce_scatterv(c, send, recv, recv_counts, t, op);
}
dtl_status dtl__reduce_scatterv_agreed(dtl_comm *c, const void *send, void *recv, const size_t *recv_counts,
                                       dtl_dtype t, dtl_reduce_op op) {
  DTL_TRY(dtl__args_reduce_scatterv("dtl_reduce_scatterv", c, send, recv, recv_counts, t, op));
  return c->ops->reduce_scatterv(c, send, recv, recv_counts, t, op);
}

dtl_status dtl_all_to_all(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t) {
  static const char fn[] = "dtl_all_to_all";
  DTL__ENTER(c, fn, dtl__args_all_to_all(fn, c, send, recv, count_per_peer, t),
             dtl__fp_call(fn, count_per_peer, t, count_per_peer && send == recv, 0));
  return c->ops->all_to_all(c, send, recv, count_per_peer, t);
}
dtl_status dtl__all_to_all_agreed(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t) {
  DTL_TRY(dtl__args_all_to_all("dtl_all_to_all", c, send, recv, count_per_peer, t));
  return c->ops->all_to_all(c, send, recv, count_per_peer, t);
}

/* The counts of an all-to-all-v differ from rank to rank (they agree pairwise), and so does whether a
 * rank's call is in place (the engine decides from its counts): only the dtype is common. */
dtl_status dtl_all_to_allv(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                           const size_t *recv_counts, dtl_dtype t) {
  static const char fn[] = "dtl_all_to_allv";
  DTL__ENTER(c, fn, dtl__args_all_to_allv(fn, c, send, send_counts, recv, recv_counts, t),
             dtl__fp_call(fn, t, 0, 0, 0));
  return c->ops->all_to_allv(c, send, send_counts, recv, recv_counts, t);
}
dtl_status dtl__all_to_allv_agreed(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                   const size_t *recv_counts, dtl_dtype t) {
  DTL_TRY(dtl__args_all_to_allv("dtl_all_to_allv", c, send, send_counts, recv, recv_counts, t));
  return c->ops->all_to_allv(c, send, send_counts, recv, recv_counts, t);
}

/* --- nonblocking forms ----------------------------------------------------------------------------------- */
/* A start returns without waiting for the peers (MPI lets a program rely on that, e.g. by starting on one rank
 * and only then telling the next rank to start), so the starts never agree, not even under DTL_CHECK. */
static dtl_status dtl__check_async(const char *fn, dtl_comm *c, const void *op_fn, dtl_request **req) {
  DTL_CHECK_ARG(req != NULL, fn, "req=NULL");
  DTL_TRY(dtl__check_comm(fn, c));
  if (!op_fn)
    return dtl__error(DTL_ERR_UNSUPPORTED, "%s: the %s transport has no nonblocking collectives", fn, c->ops->name);
  return DTL_OK;
}
#define DTL__ASYNC(name) ((c) ? (const void *)(c)->ops->name : NULL)

dtl_status dtl_all_gather_async(dtl_comm *c, const void *send, void *recv, size_t send_count, dtl_dtype t,
                                dtl_request **req) {
  static const char fn[] = "dtl_all_gather_async";
  DTL_TRY(dtl__check_async(fn, c, DTL__ASYNC(all_gather_async), req));
  DTL_TRY(dtl__args_all_gather(fn, c, send, recv, send_count, t));
  return c->ops->all_gather_async(c, send, recv, send_count, t, req);
}

dtl_status dtl_all_gatherv_async(dtl_comm *c, const void *send, size_t send_count, void *recv,
                                 const size_t *recv_counts, dtl_dtype t, dtl_request **req) {
  static const char fn[] = "dtl_all_gatherv_async";
  DTL_TRY(dtl__check_async(fn, c, DTL__ASYNC(all_gatherv_async), req));
  DTL_TRY(dtl__args_all_gatherv(fn, c, send, send_count, recv, recv_counts, t));
  return c->ops->all_gatherv_async(c, send, send_count, recv, recv_counts, t, req);
}

dtl_status dtl_all_reduce_async(dtl_comm *c, const void *send, void *recv, size_t count, dtl_dtype t,
                                dtl_reduce_op op, dtl_request **req) {
  static const char fn[] = "dtl_all_reduce_async";
  DTL_TRY(dtl__check_async(fn, c, DTL__ASYNC(all_reduce_async), req));
  DTL_TRY(dtl__args_all_reduce(fn, c, send, recv, count, t, op));
  return c->ops->all_reduce_async(c, send, recv, count, t, op, req);
}

dtl_status dtl_reduce_scatter_async(dtl_comm *c, const void *send, void *recv, size_t recv_count, dtl_dtype t,
                                    dtl_reduce_op op, dtl_request **req) {
  static const char fn[] = "dtl_reduce_scatter_async";
  DTL_TRY(dtl__check_async(fn, c, DTL__ASYNC(reduce_scatter_async), req));
  DTL_TRY(dtl__args_reduce_scatter(fn, c, send, recv, recv_count, t, op));
  return c->ops->reduce_scatter_async(c, send, recv, recv_count, t, op, req);
}

dtl_status dtl_all_to_all_async(dtl_comm *c, const void *send, void *recv, size_t count_per_peer, dtl_dtype t,
                                dtl_request **req) {
  static const char fn[] = "dtl_all_to_all_async";
  DTL_TRY(dtl__check_async(fn, c, DTL__ASYNC(all_to_all_async), req));
  DTL_TRY(dtl__args_all_to_all(fn, c, send, recv, count_per_peer, t));
  return c->ops->all_to_all_async(c, send, recv, count_per_peer, t, req);
}

dtl_status dtl_all_to_allv_async(dtl_comm *c, const void *send, const size_t *send_counts, void *recv,
                                 const size_t *recv_counts, dtl_dtype t, dtl_request **req) {
  static const char fn[] = "dtl_all_to_allv_async";
  DTL_TRY(dtl__check_async(fn, c, DTL__ASYNC(all_to_allv_async), req));
  DTL_TRY(dtl__args_all_to_allv(fn, c, send, send_counts, recv, recv_counts, t));
  return c->ops->all_to_allv_async(c, send, send_counts, recv, recv_counts, t, req);
}

dtl_status dtl_wait(dtl_request *req) {
  DTL_CHECK_ARG(req != NULL, "dtl_wait", "req=NULL");
  return req->wait ? req->wait(req) : req->comm->ops->wait(req);
}

dtl_status dtl_test(dtl_request *req, int *done) {
  DTL_CHECK_ARG(req != NULL, "dtl_test", "req=NULL");
  DTL_CHECK_ARG(done != NULL, "dtl_test", "done=NULL");
  bool d = false;
  DTL_TRY(req->test ? req->test(req, &d) : req->comm->ops->test(req, &d));
  *done = d;
  return DTL_OK;
}

/* --- point to point ---------------------------------------------------------------------------------------- */
static dtl_status dtl__args_p2p(const char *fn, dtl_comm *c, const void *buf, size_t count, dtl_dtype t, int peer) {
  size_t bytes;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_rank(fn, "peer", c, peer));
  if (peer == c->rank) /* MPI completes it only while it fits the eager buffer, NCCL never: one rule for both */
    return dtl__error(DTL_ERR_UNSUPPORTED, "%s: peer=%d is this rank (a blocking message to oneself can deadlock)",
                      fn, peer);
  return dtl__check_buf(fn, "buf", buf, "count", count, 1, t, &bytes);
}

dtl_status dtl_send(dtl_comm *c, const void *buf, size_t count, dtl_dtype t, int peer) {
  DTL_TRY(dtl__args_p2p("dtl_send", c, buf, count, t, peer));
  return c->ops->send(c, buf, count, t, peer);
}

dtl_status dtl_recv(dtl_comm *c, void *buf, size_t count, dtl_dtype t, int peer) {
  DTL_TRY(dtl__args_p2p("dtl_recv", c, buf, count, t, peer));
  return c->ops->recv(c, buf, count, t, peer);
}

/* The rules of both sendrecv forms. A message to oneself is checked here in full (counts included), so that
 * neither transport needs its own rule and a failed call writes nothing. */
static dtl_status dtl__args_sendrecv(const char *fn, dtl_comm *c, const void *send, size_t send_count, int dest,
                                     const void *recv, size_t recv_count, int source, dtl_dtype t) {
  size_t sbytes, rbytes;
  DTL_TRY(dtl__check_common(fn, c, t));
  DTL_TRY(dtl__check_rank(fn, "dest", c, dest));
  DTL_TRY(dtl__check_rank(fn, "source", c, source));
  if ((dest == c->rank) != (source == c->rank))
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: dest=%d source=%d (expected both or neither to be this rank %d: "
                      "a message to oneself is received by the same call)", fn, dest, source, c->rank);
  DTL_TRY(dtl__check_buf(fn, "send", send, "send_count", send_count, 1, t, &sbytes));
  DTL_TRY(dtl__check_buf(fn, "recv", recv, "recv_count", recv_count, 1, t, &rbytes));
  if (dtl__overlap(send, sbytes, recv, rbytes))
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: send=%p (%zu bytes) and recv=%p (%zu bytes) overlap (expected "
                      "separate buffers)", fn, send, sbytes, recv, rbytes);
  if (dest == c->rank && send_count != recv_count) /* the status that message would bring from another rank */
    return dtl__error(send_count < recv_count ? DTL_ERR_MISMATCH : DTL_ERR_COMM,
                      "%s: send_count=%zu to this rank but recv_count=%zu (a message to oneself has one count)", fn,
                      send_count, recv_count);
  return DTL_OK;
}

dtl_status dtl_sendrecv(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv, size_t recv_count,
                        int source, dtl_dtype t) {
  DTL_TRY(dtl__args_sendrecv("dtl_sendrecv", c, send, send_count, dest, recv, recv_count, source, t));
  return c->ops->sendrecv(c, send, send_count, dest, recv, recv_count, source, t);
}

dtl_status dtl_sendrecv_async(dtl_comm *c, const void *send, size_t send_count, int dest, void *recv,
                              size_t recv_count, int source, dtl_dtype t, dtl_request **req) {
  static const char fn[] = "dtl_sendrecv_async";
  DTL_TRY(dtl__check_async(fn, c, DTL__ASYNC(sendrecv_async), req));
  DTL_TRY(dtl__args_sendrecv(fn, c, send, send_count, dest, recv, recv_count, source, t));
  return c->ops->sendrecv_async(c, send, send_count, dest, recv, recv_count, source, t, req);
}

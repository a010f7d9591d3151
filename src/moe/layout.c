/* SPDX-License-Identifier: Apache-2.0 */
/* Collective creation of a dispatch layout: local validation, drops and allocations, one agreement (every
 * rank learns whether any rank failed and whether all agree on the common arguments, so bad input never
 * leaves a peer waiting), one all-to-all of the per-expert counts, the pack, regroup and combine maps that
 * dispatch and combine replay without recomputation, and a last agreement on the outcome. */
#include <stdlib.h>
#include <string.h>
#include "comm/agree.h"
#include "moe/moe_internal.h"
#include "quant/act_fp8.h"

static const char fn[] = "dtl_moe_layout_create";

/* The arguments every rank must pass alike, in the order of the agreement vector. */
enum { F_PLACEMENT, F_K, F_HIDDEN, F_DTYPE, F_CAPACITY, F_POLICY, F_PAD, F_EXCHANGE, F_VERIFY, F_FP8, F_COUNT };
static const char *const dtl__field_name[F_COUNT] = {
    "experts or the expert->rank placement", "k", "hidden", "dtype", "capacity_factor", "drop_policy",
    "pad_multiple", "exchange", "verify", "DTL_MOE_LAYOUT_FP8_DISPATCH (params.flags)"};
/* Values reduced with MAX beside the agreement: the largest remote send in bytes (the exchange choice) and
 * the layout id (the largest of every rank's nonce). */
enum { X_BYTES, X_ID, X_COUNT };

/* Non-negative and far from INT64_MIN, so that its negation is exact. */
static int64_t dtl__h62(uint64_t h) { return (int64_t)(h >> 2); }

typedef struct {
  bool has_capacity;
  double factor;
  dtl_moe_drop_policy policy;
  int64_t pad;
  dtl_moe_exchange exchange;
  bool verify;
  bool fp8;
  dtl_comm *count_comm;
} dtl__moe_opts;

/* The checks of the two communicators. The agreement runs on c when it is a host communicator (then every
 * failure here is agreed), on count_comm when c is a device one (so that creation costs no device round
 * trip): then a count_comm that cannot carry it fails this rank alone, as dtl_moe_layout_create states. */
static dtl_status dtl__resolve_comms(dtl_comm *c, const dtl_moe_layout_params *prm, dtl__moe_opts *o) {
  o->count_comm = c;
  if (prm && (prm->mask & DTL_MOE_LAYOUT_COUNT_COMM)) o->count_comm = prm->count_comm;
  dtl_comm *h = o->count_comm;
  if (!h && c->mem.ops->memory == DTL_MEMORY_DEVICE)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                         "the communicator is on device memory (%s): params.count_comm must name a host (MPI) "
                         "communicator over the same ranks for the count exchange", c->ops->name);
  DTL_CHECK_ARG(h != NULL, fn, "params.count_comm=NULL");
  if (h->mem.ops->memory != DTL_MEMORY_HOST)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "params.count_comm is a %s (device) communicator (expected a "
                         "host one)", h->ops->name);
  if (h->size != c->size || h->rank != c->rank)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                         "params.count_comm has rank %d of %d but the communicator rank %d of %d (expected the same "
                         "ranks in the same order)", h->rank, h->size, c->rank, c->size);
  if (h->aborted || c->aborted) return dtl__error_fn(DTL_ERR_COMM, fn, "the communicator was aborted");
  return DTL_OK;
}

static dtl_status dtl__resolve_opts(const dtl_moe_layout_params *prm, dtl__moe_opts *o) {
  o->has_capacity = false;
  o->factor = 0;
  o->policy = DTL_MOE_DROP_POSITION;
  o->pad = 1;
  o->exchange = DTL_MOE_EXCHANGE_AUTO;
  o->verify = true;
  o->fp8 = false;
  if (!prm) return DTL_OK;
  uint64_t m = prm->mask;
  DTL_TRY(dtl__check_bits(fn, "params.mask", m,
                          DTL__BITS(DTL_MOE_LAYOUT_CAPACITY_FACTOR, DTL_MOE_LAYOUT_DROP_POLICY,
                                    DTL_MOE_LAYOUT_PAD_MULTIPLE, DTL_MOE_LAYOUT_EXCHANGE, DTL_MOE_LAYOUT_VERIFY,
                                    DTL_MOE_LAYOUT_COUNT_COMM)));
  DTL_TRY(dtl__check_bits(fn, "params.flags", prm->flags, DTL__BITS(DTL_MOE_LAYOUT_FP8_DISPATCH)));
  o->fp8 = (prm->flags & DTL_MOE_LAYOUT_FP8_DISPATCH) != 0;
  if (m & DTL_MOE_LAYOUT_CAPACITY_FACTOR) {
    double f = prm->capacity_factor;
    DTL_CHECK_ARG(f > 0 && f <= 1e9, fn, "params.capacity_factor=%g (expected finite and > 0)", f);
    o->has_capacity = true;
    o->factor = f;
  }
  if (m & DTL_MOE_LAYOUT_DROP_POLICY) {
    o->policy = prm->drop_policy;
    DTL_CHECK_ARG(o->policy == DTL_MOE_DROP_POSITION || o->policy == DTL_MOE_DROP_PROBABILITY, fn,
                  "params.drop_policy=%d (expected DTL_MOE_DROP_POSITION or DTL_MOE_DROP_PROBABILITY)", (int)o->policy);
  }
  if (m & DTL_MOE_LAYOUT_PAD_MULTIPLE) {
    o->pad = prm->pad_multiple;
    DTL_CHECK_ARG(o->pad >= 1 && o->pad <= (1 << 30), fn, "params.pad_multiple=%lld (expected 1..2^30)",
                  (long long)o->pad);
  }
  if (m & DTL_MOE_LAYOUT_EXCHANGE) {
    o->exchange = prm->exchange;
    DTL_CHECK_ARG(o->exchange >= DTL_MOE_EXCHANGE_AUTO && o->exchange <= DTL_MOE_EXCHANGE_SINGLE, fn,
                  "params.exchange=%d (expected DTL_MOE_EXCHANGE_AUTO..DTL_MOE_EXCHANGE_SINGLE)", (int)o->exchange);
  }
  if (m & DTL_MOE_LAYOUT_VERIFY) o->verify = prm->verify != 0;
  return DTL_OK;
}

/* Everything a rank can reject on its own; run before the agreement so that all ranks hear of it. */
static dtl_status dtl__check_local(const dtl_comm *c, const dtl_moe_placement *p, int64_t tokens, int k,
                                   const int32_t *ids, const float *weights, int64_t hidden, dtl_dtype dtype,
                                   const dtl_moe_layout_params *prm, dtl__moe_opts *o) {
  DTL_TRY(dtl__resolve_opts(prm, o));
  DTL_CHECK_ARG(p != NULL, fn, "placement=NULL");
  DTL_CHECK_ARG(p->ranks == c->size, fn, "placement has %d ranks but the communicator %d", p->ranks, c->size);
  DTL_CHECK_ARG(k >= 1 && k <= p->experts, fn, "k=%d (expected 1..experts=%d)", k, p->experts);
  DTL_CHECK_ARG(tokens >= 0, fn, "tokens=%lld (expected >= 0)", (long long)tokens);
  DTL_CHECK_ARG(hidden >= 1, fn, "hidden=%lld (expected >= 1)", (long long)hidden);
  DTL_CHECK_ARG(dtl__dtype_valid(dtype), fn, "dtype=%d (expected 0..%d)", (int)dtype, DTL_NUM_DTYPES - 1);
  DTL_CHECK_ARG(!o->fp8 || dtl__act_fp8_dtype_ok(dtype), fn,
                "dtype=%s with DTL_MOE_LAYOUT_FP8_DISPATCH (FP8 dispatch quantizes f32, f16 or bf16 rows)",
                dtl_dtype_name(dtype));
  size_t pairs, row_bytes, x_bytes;
  DTL_CHECK_ARG(dtl__mul_size((size_t)tokens, (size_t)k, &pairs) && pairs <= (size_t)INT64_MAX / 16, fn,
                "tokens=%lld x k=%d overflows", (long long)tokens, k);
  DTL_CHECK_ARG(dtl__mul_size((size_t)hidden, dtl_dtype_size(dtype), &row_bytes) &&
                    dtl__mul_size(row_bytes, pairs, &x_bytes) && x_bytes <= (size_t)INT64_MAX,
                fn, "tokens=%lld x k=%d x hidden=%lld %s elements overflow", (long long)tokens, k, (long long)hidden,
                dtl_dtype_name(dtype));
  size_t fp8_bytes;
  DTL_CHECK_ARG(!o->fp8 || (dtl__mul_size(dtl__act_fp8_row_bytes(hidden), pairs, &fp8_bytes) &&
                            fp8_bytes <= (size_t)INT64_MAX),
                fn, "tokens=%lld x k=%d x hidden=%lld FP8 rows overflow", (long long)tokens, k, (long long)hidden);
  if (pairs > 0) {
    DTL_CHECK_ARG(ids != NULL, fn, "ids=NULL with %lld tokens", (long long)tokens);
    DTL_CHECK_ARG(weights != NULL, fn, "weights=NULL with %lld tokens", (long long)tokens);
  }
  return dtl__moe_check_routing(fn, ids, weights, tokens, k, p->experts);
}

void dtl_moe_layout_destroy(dtl_moe_layout *L) {
  if (!L) return;
  if (L->device_map) dtl__mem_free(&L->comm->mem, L->device_map);
  if (L->expert_ws && L->expert_ws->p) dtl__mem_free(&L->comm->mem, L->expert_ws->p);
  dtl__free(L->expert_ws);
  if (L->send_buf) dtl__mem_free(&L->comm->mem, L->send_buf);
  if (L->recv_buf) dtl__mem_free(&L->comm->mem, L->recv_buf);
  if (L->fp8_x) dtl__mem_free(&L->comm->mem, L->fp8_x);
  if (L->fp8_in) dtl__mem_free(&L->comm->mem, L->fp8_in);
  dtl__free(L->fp8_send_counts);
  dtl__free(L->fp8_recv_counts);
  dtl__free(L->local_ids);
  dtl__free(L->kept);
  dtl__free(L->dropped);
  dtl__free(L->weights);
  dtl__free(L->slot_row);
  dtl__free(L->pack);
  dtl__free(L->regroup);
  dtl__free(L->block_off);
  dtl__free(L->block_rows);
  dtl__free(L->block_padded);
  dtl__free(L->send_counts);
  dtl__free(L->recv_counts);
  dtl__free(L->send_base);
  dtl__free(L->recv_base);
  dtl__free(L->combine_in);
  dtl__free(L->combine_w);
  dtl__free(L);
}

static void dtl__agreement_fields(const dtl_moe_placement *p, int k, int64_t hidden, dtl_dtype dtype,
                                  const dtl__moe_opts *o, int64_t *f) {
  uint64_t h = dtl__fp_mix(0, (uint64_t)p->experts);
  for (int e = 0; e < p->experts; e++) h = dtl__fp_mix(h, (uint64_t)p->owner[e]);
  uint64_t fbits = 0;
  memcpy(&fbits, &o->factor, sizeof fbits);
  f[F_PLACEMENT] = dtl__h62(h);
  f[F_K] = k;
  f[F_HIDDEN] = hidden;
  f[F_DTYPE] = dtype;
  f[F_CAPACITY] = o->has_capacity ? dtl__h62(dtl__fp_mix(1, fbits)) : 0;
  f[F_POLICY] = o->policy;
  f[F_PAD] = o->pad;
  f[F_EXCHANGE] = o->exchange;
  f[F_VERIFY] = o->verify;
  f[F_FP8] = o->fp8;
}

/* After the agreement found the ranks' fingerprints different (every rank then gets here, none having
 * failed): one more all-reduce of the fields as (v, -v) names the first that differs. */
static dtl_status dtl__name_mismatch(dtl_comm *a, const int64_t *f, int rank) {
  int64_t v[2 * F_COUNT];
  for (int i = 0; i < F_COUNT; i++) {
    v[2 * i] = f[i];
    v[2 * i + 1] = -f[i];
  }
  if (dtl__comm_max_i64(a, v, 2 * F_COUNT) != DTL_OK) return DTL_ERR_MISMATCH;
  for (int i = 0; i < F_COUNT; i++)
    if (v[2 * i] != f[i] || v[2 * i + 1] != -f[i])
      return dtl__error_fn(DTL_ERR_MISMATCH, fn,
                           "ranks disagree on %s (this rank %d passes %lld; values range over %lld..%lld), so the "
                           "counts they would exchange cannot match", dtl__field_name[i], rank, (long long)f[i],
                           (long long)-v[2 * i + 1], (long long)v[2 * i]);
  return DTL_ERR_MISMATCH;
}

static void *dtl__xcalloc(size_t n, size_t size, bool *ok) {
  void *q = dtl__calloc(n ? n : 1, size);
  if (!q) *ok = false;
  return q;
}

/* Fills the maps of L from the route and the exchanged counts cin[s * max_local + j] (rows rank s sends to
 * this rank's local expert j). Host allocations only. */
static dtl_status dtl__build_maps(dtl_moe_layout *L, const dtl_moe_placement *p, const dtl__moe_route *r,
                                  const int64_t *cin, int64_t pad) {
  const int P = L->size, me = L->rank, J = L->max_local, nl = L->local_experts, k = L->k;
  bool ok = true;
  L->block_off = dtl__xcalloc((size_t)nl, sizeof(int64_t), &ok);
  L->block_rows = dtl__xcalloc((size_t)nl, sizeof(int64_t), &ok);
  L->block_padded = dtl__xcalloc((size_t)nl, sizeof(int64_t), &ok);
  int64_t *seg_base = dtl__xcalloc((size_t)L->experts, sizeof(int64_t), &ok);
  size_t calls = (size_t)(L->calls ? L->calls : 1);
  L->send_counts = dtl__xcalloc(calls * (size_t)P, sizeof(size_t), &ok);
  L->recv_counts = dtl__xcalloc(calls * (size_t)P, sizeof(size_t), &ok);
  L->send_base = dtl__xcalloc(calls, sizeof(int64_t), &ok);
  L->recv_base = dtl__xcalloc(calls, sizeof(int64_t), &ok);
  L->slot_row = dtl__xcalloc((size_t)(L->tokens * k), sizeof(int64_t), &ok);
  L->pack = dtl__xcalloc((size_t)r->kept_all, sizeof(dtl__moe_run), &ok);
  if (L->exchange == DTL_MOE_EXCHANGE_SINGLE)
    L->regroup = dtl__xcalloc((size_t)P * (size_t)(nl ? nl : 1), sizeof(dtl__moe_run), &ok);
  if (!ok) {
    dtl__free(seg_base);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  const int64_t H = L->hidden;

  /* Expert blocks: this rank's own rows first, then the other ranks' in rank order. */
  int64_t off = 0;
  for (int j = 0; j < nl; j++) {
    int64_t n = 0;
    for (int s = 0; s < P; s++) n += cin[(size_t)s * J + j];
    L->block_off[j] = off;
    L->block_rows[j] = n;
    L->block_padded[j] = (n + pad - 1) / pad * pad;
    off += L->block_padded[j];
  }
  L->expert_rows = off;

  /* Send staging: the remote segments in the order the calls take them. */
  int64_t cursor = 0;
  if (L->exchange == DTL_MOE_EXCHANGE_PER_EXPERT) {
    for (int j = 0; j < L->calls; j++) {
      L->send_base[j] = cursor;
      for (int d = 0; d < P; d++) {
        int e = dtl_moe_placement_local_expert(p, d, j);
        if (d == me || e < 0) continue;
        seg_base[e] = cursor;
        cursor += r->kept[e];
        L->send_counts[(size_t)j * P + d] = (size_t)(r->kept[e] * H);
      }
      int64_t in = j < nl ? L->block_off[j] + cin[(size_t)me * J + j] : 0;
      L->recv_base[j] = in;
      for (int s = 0; s < P && j < nl; s++)
        if (s != me) L->recv_counts[(size_t)j * P + s] = (size_t)(cin[(size_t)s * J + j] * H);
    }
  } else if (L->calls > 0) {
    for (int d = 0; d < P; d++) {
      if (d == me) continue;
      int64_t n = 0;
      for (int j = 0; j < p->first[d + 1] - p->first[d]; j++) {
        int e = p->by_rank[p->first[d] + j];
        seg_base[e] = cursor + n;
        n += r->kept[e];
      }
      cursor += n;
      L->send_counts[d] = (size_t)(n * H);
    }
    int64_t rc = 0;
    for (int s = 0; s < P; s++) {
      if (s == me) continue;
      int64_t n = 0;
      for (int j = 0; j < nl; j++) {
        int64_t c = cin[(size_t)s * J + j];
        if (c == 0) continue;
        /* Rows of s sit after this rank's own and those of the lower other ranks. */
        int64_t at = L->block_off[j] + cin[(size_t)me * J + j];
        for (int q = 0; q < s; q++)
          if (q != me) at += cin[(size_t)q * J + j];
        L->regroup[L->nregroup++] = (dtl__moe_run){rc + n, at, c};
        n += c;
      }
      rc += n;
      L->recv_counts[s] = (size_t)(n * H);
    }
    L->recv_rows = rc;
  }
  L->send_rows = cursor;

  /* Pack runs and the combine map. perm lists each expert's kept pairs in (token, slot) order. */
  for (int64_t i = 0; i < r->pairs; i++) L->slot_row[i] = -1;
  for (int e = 0; e < L->experts; e++) {
    int64_t base = p->owner[e] == me ? L->send_rows + L->block_off[p->local[e]] : seg_base[e];
    for (int64_t i = r->start[e]; i < r->start[e + 1]; i++) {
      int64_t pair = r->perm[i], tok = pair / k, dst = base + (i - r->start[e]);
      L->slot_row[pair] = dst;
      dtl__moe_run *last = L->npack ? &L->pack[L->npack - 1] : NULL;
      /* A run may span segments but never the border between the staging and the expert buffer. */
      if (last && last->src + last->n == tok && last->dst + last->n == dst && dst != L->send_rows)
        last->n++;
      else
        L->pack[L->npack++] = (dtl__moe_run){tok, dst, 1};
    }
  }
  dtl__free(seg_base);
  return DTL_OK;
}

/* Bytes a row of the staging buffers holds: a dtype row (combine), or a packed FP8 row (FP8 dispatch). */
static size_t dtl__stage_row_bytes(const dtl_moe_layout *L) {
  return L->fp8_row_bytes > L->row_bytes ? L->fp8_row_bytes : L->row_bytes;
}

/* An FP8 layout's landing region (every expert row, packed) and its exchange counts in bytes: a count of
 * rows x hidden elements becomes rows x fp8_row_bytes. */
static dtl_status dtl__fp8_maps(dtl_moe_layout *L) {
  size_t n = (size_t)(L->calls ? L->calls : 1) * (size_t)L->size;
  L->fp8_send_counts = dtl__calloc(n, sizeof(size_t));
  L->fp8_recv_counts = dtl__calloc(n, sizeof(size_t));
  if (!L->fp8_send_counts || !L->fp8_recv_counts) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  for (size_t i = 0; i < n; i++) {
    L->fp8_send_counts[i] = L->send_counts[i] / (size_t)L->hidden * L->fp8_row_bytes;
    L->fp8_recv_counts[i] = L->recv_counts[i] / (size_t)L->hidden * L->fp8_row_bytes;
  }
  size_t bytes;
  if (!dtl__mul_size((size_t)L->expert_rows, L->fp8_row_bytes, &bytes))
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%lld FP8 expert rows overflow", (long long)L->expert_rows);
  return dtl__mem_alloc(&L->comm->mem, bytes, &L->fp8_in);
}

/* Writes the rows of runs one by one into src and dst; returns how many. */
static int64_t dtl__rows_of_runs(const dtl__moe_run *runs, int64_t n, int64_t *src, int64_t *dst) {
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t q = 0; q < runs[i].n; q++, at++) {
      src[at] = runs[i].src + q;
      dst[at] = runs[i].dst + q;
    }
  return at;
}

dtl_status dtl__moe_rowmaps(const dtl_moe_layout *L, dtl__moe_rowmap *pack, dtl__moe_rowmap *regroup, int64_t **buf) {
  int64_t np = 0, nr = 0;
  for (int64_t i = 0; i < L->npack; i++) np += L->pack[i].n;
  for (int j = 0; j < L->local_experts; j++) np += L->block_padded[j] - L->block_rows[j];
  for (int64_t i = 0; i < L->nregroup; i++) nr += L->regroup[i].n;
  int64_t *b = dtl__malloc(sizeof(int64_t) * 2 * (size_t)(np + nr));
  if (!b) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory for the row maps");
  int64_t *ps = b, *pd = b + np, *rs = b + 2 * np, *rd = rs + nr;
  int64_t at = dtl__rows_of_runs(L->pack, L->npack, ps, pd);
  for (int j = 0; j < L->local_experts; j++) /* padding rows: zeros */
    for (int64_t r = L->block_rows[j]; r < L->block_padded[j]; r++, at++) {
      ps[at] = -1;
      pd[at] = L->send_rows + L->block_off[j] + r;
    }
  dtl__rows_of_runs(L->regroup, L->nregroup, rs, rd);
  *pack = (dtl__moe_rowmap){ps, pd, np, L->send_rows};
  *regroup = (dtl__moe_rowmap){rs, rd, nr, 0};
  *buf = b;
  return DTL_OK;
}

/* A device layout's maps, uploaded once: combine's slot_row, the row maps, then combine's weights. The stream
 * is synchronized before the host copy of the row maps is freed. */
static dtl_status dtl__upload_maps(dtl_moe_layout *L) {
  dtl__moe_rowmap pack, regroup;
  int64_t *rowmaps = NULL;
  DTL_TRY(dtl__moe_rowmaps(L, &pack, &regroup, &rowmaps));
  dtl_comm *c = L->comm;
  size_t pairs = (size_t)(L->tokens * L->k), nmap = 2 * (size_t)(pack.n + regroup.n);
  size_t words = pairs + nmap;
  char *d = NULL;
  dtl_status st = dtl__mem_alloc(&c->mem, sizeof(int64_t) * words + sizeof(float) * pairs, (void **)&d);
  if (st == DTL_OK) {
    L->device_map = d;
    st = dtl__mem_copy(&c->mem, d, L->slot_row, sizeof(int64_t) * pairs);
  }
  if (st == DTL_OK) st = dtl__mem_copy(&c->mem, d + sizeof(int64_t) * pairs, rowmaps, sizeof(int64_t) * nmap);
  if (st == DTL_OK) st = dtl__mem_copy(&c->mem, d + sizeof(int64_t) * words, L->weights, sizeof(float) * pairs);
  if (st == DTL_OK) st = c->ops->synchronize(c);
  dtl__free(rowmaps);
  if (st != DTL_OK) return st;
  const int64_t *m = (const int64_t *)d + pairs;
  L->dev_slot_row = (const int64_t *)d;
  L->dev_weights = (const float *)(d + sizeof(int64_t) * words);
  L->dev_pack = (dtl__moe_rowmap){m, m + pack.n, pack.n, pack.split};
  m += 2 * pack.n;
  L->dev_regroup = (dtl__moe_rowmap){m, m + regroup.n, regroup.n, 0};
  return DTL_OK;
}

dtl_status dtl_moe_layout_create(dtl_comm *c, const dtl_moe_placement *p, int64_t tokens, int k, const int32_t *ids,
                                 const float *weights, int64_t hidden, dtl_dtype dtype,
                                 const dtl_moe_layout_params *params, dtl_moe_layout **out) {
  DTL_CHECK_ARG(c != NULL, fn, "comm=NULL");
  if (c->aborted) return dtl__error_fn(DTL_ERR_COMM, fn, "the communicator was aborted");
  dtl__moe_opts o = {.pad = 1, .verify = true};
  dtl_status local = dtl__resolve_comms(c, params, &o);
  dtl_comm *agree_on = c->mem.ops->memory == DTL_MEMORY_HOST ? c : o.count_comm;
  if (agree_on != c && local != DTL_OK) return local; /* no host channel to tell the peers (moe.h) */

  /* 1. Local: validation, drops, the route and every buffer whose size is known before the count exchange
   * (all before the agreement, so that a failure here reaches every rank). */
  dtl__moe_route route = {0};
  dtl_moe_layout *L = NULL;
  int64_t *cout = NULL, *cin = NULL, remote_rows = 0;
  if (local == DTL_OK && !out) local = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "out=NULL");
  if (local == DTL_OK && !(L = dtl__calloc(1, sizeof *L)))
    local = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  if (local == DTL_OK) local = dtl__check_local(c, p, tokens, k, ids, weights, hidden, dtype, params, &o);
  if (local == DTL_OK) {
    L->comm = c;
    L->count_comm = o.count_comm;
    L->rank = c->rank;
    L->size = c->size;
    L->experts = p->experts;
    L->k = k;
    L->local_experts = p->first[c->rank + 1] - p->first[c->rank];
    L->max_local = p->max_local;
    L->tokens = tokens;
    L->hidden = hidden;
    L->dtype = dtype;
    L->row_bytes = (size_t)hidden * dtl_dtype_size(dtype);
    L->fp8 = o.fp8;
    L->fp8_row_bytes = o.fp8 ? dtl__act_fp8_row_bytes(hidden) : 0;
    L->verify = o.verify;
    L->capacity = o.has_capacity ? dtl__moe_capacity(tokens, k, p->experts, o.factor) : -1;
    local = dtl__moe_route_build(ids, weights, tokens, k, p->experts, L->capacity, o.policy, &route);
  }
  if (local == DTL_OK) {
    for (int e = 0; e < p->experts; e++)
      if (p->owner[e] != c->rank) remote_rows += route.kept[e];
    size_t pairs = (size_t)(tokens * k), PJ = (size_t)c->size * (size_t)p->max_local;
    L->kept = dtl__malloc(sizeof(int64_t) * (size_t)p->experts);
    L->dropped = dtl__malloc(sizeof(int64_t) * (size_t)p->experts);
    L->weights = dtl__malloc(sizeof(float) * (pairs ? pairs : 1));
    L->local_ids = dtl__malloc(sizeof(int) * (size_t)(L->local_experts ? L->local_experts : 1));
    L->combine_in = dtl__malloc(sizeof(void *) * (size_t)k);
    L->combine_w = dtl__malloc(sizeof(float) * (size_t)k);
    L->expert_ws = dtl__calloc(1, sizeof *L->expert_ws);
    cout = dtl__calloc(PJ, sizeof(int64_t));
    cin = dtl__calloc(PJ, sizeof(int64_t));
    if (L->kept && L->dropped && L->weights && L->local_ids && L->combine_in && L->combine_w && L->expert_ws && cout &&
        cin) {
      memcpy(L->local_ids, p->by_rank + p->first[c->rank], sizeof(int) * (size_t)L->local_experts);
      memcpy(L->kept, route.kept, sizeof(int64_t) * (size_t)p->experts);
      memcpy(L->dropped, route.dropped, sizeof(int64_t) * (size_t)p->experts);
      if (pairs) memcpy(L->weights, weights, sizeof(float) * pairs);
      local = dtl__mem_alloc(&c->mem, (size_t)remote_rows * dtl__stage_row_bytes(L), &L->send_buf);
      if (local == DTL_OK && L->fp8) local = dtl__mem_alloc(&c->mem, (size_t)tokens * L->fp8_row_bytes, &L->fp8_x);
    } else {
      local = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
    }
  }

  /* 2. Agreement, on the verdicts and on the arguments every rank must pass alike. */
  int64_t f[F_COUNT] = {0}, x[X_COUNT] = {[X_BYTES] = remote_rows * (int64_t)(L ? L->row_bytes : 0),
                                          [X_ID] = dtl__agree_nonce(L, c->rank)};
  uint64_t fp = 0;
  if (local == DTL_OK) {
    dtl__agreement_fields(p, k, hidden, dtype, &o, f);
    for (int i = 0; i < F_COUNT; i++) fp = dtl__fp_mix(fp, (uint64_t)f[i]);
  }
  dtl_status st = dtl__agree_max(agree_on, fn, fp, local, x, X_COUNT);
  if (st == DTL_ERR_MISMATCH && local == DTL_OK) st = dtl__name_mismatch(agree_on, f, c->rank);
  if (st != DTL_OK) goto fail;
  L->id = x[X_ID];

  /* 3. How the rows travel: the same decision on every rank, from agreed values. */
  const int P = c->size, J = p->max_local;
  dtl_moe_exchange ex = o.exchange;
  if (ex == DTL_MOE_EXCHANGE_AUTO) {
    int64_t avg = P > 1 ? x[X_BYTES] / ((int64_t)J * (P - 1)) : 0;
    ex = (J == 1 || avg >= DTL_MOE_SINGLE_EXCHANGE_BYTES) ? DTL_MOE_EXCHANGE_PER_EXPERT : DTL_MOE_EXCHANGE_SINGLE;
  }
  if (J == 1) ex = DTL_MOE_EXCHANGE_PER_EXPERT; /* the two are the same then, without a regroup */
  L->exchange = ex;
  L->calls = P == 1 ? 0 : ex == DTL_MOE_EXCHANGE_PER_EXPERT ? J : 1;

  /* 4. The count exchange: block d of the message holds the rows this rank sends to each of d's experts.
   * The maps and the receive staging depend on what arrives, so a last agreement (on count_comm, always a
   * host communicator) settles whether every rank got them. */
  for (int d = 0; d < P; d++)
    for (int j = 0; j < p->first[d + 1] - p->first[d]; j++) cout[(size_t)d * J + j] = route.kept[p->by_rank[p->first[d] + j]];
  st = dtl__all_to_all_agreed(o.count_comm, cout, cin, (size_t)J, DTL_INT64);
  if (st == DTL_OK) st = dtl__build_maps(L, p, &route, cin, o.pad);
  if (st == DTL_OK && L->recv_rows > 0) {
    size_t bytes;
    if (!dtl__mul_size((size_t)L->recv_rows, dtl__stage_row_bytes(L), &bytes))
      st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "receive staging of %lld rows overflows", (long long)L->recv_rows);
    else
      st = dtl__mem_alloc(&c->mem, bytes, &L->recv_buf);
  }
  if (st == DTL_OK && L->fp8) st = dtl__fp8_maps(L);
  if (st == DTL_OK && c->mem.ops->memory == DTL_MEMORY_DEVICE) st = dtl__upload_maps(L);
  st = dtl__agree(o.count_comm, fn, 0, st);
  if (st != DTL_OK) goto fail;
  dtl__free(cout);
  dtl__free(cin);
  dtl__moe_route_free(&route);
  *out = L;
  return DTL_OK;
fail:
  dtl__free(cout);
  dtl__free(cin);
  dtl__moe_route_free(&route);
  dtl_moe_layout_destroy(L);
  return st;
}

int64_t dtl_moe_layout_expert_rows(const dtl_moe_layout *L) { return L ? L->expert_rows : -1; }
int dtl_moe_layout_local_experts(const dtl_moe_layout *L) { return L ? L->local_experts : -1; }
int64_t dtl_moe_layout_capacity(const dtl_moe_layout *L) { return L ? L->capacity : -1; }
dtl_moe_exchange dtl_moe_layout_exchange(const dtl_moe_layout *L) { return L ? L->exchange : DTL_MOE_EXCHANGE_AUTO; }

dtl_status dtl_moe_layout_expert_counts(const dtl_moe_layout *L, int64_t *rows, int64_t *offset) {
  DTL_CHECK_ARG(L != NULL, "dtl_moe_layout_expert_counts", "layout=NULL");
  for (int j = 0; j < L->local_experts; j++) {
    if (rows) rows[j] = L->block_rows[j];
    if (offset) offset[j] = L->block_off[j];
  }
  return DTL_OK;
}

dtl_status dtl_moe_layout_token_counts(const dtl_moe_layout *L, int64_t *kept, int64_t *dropped) {
  DTL_CHECK_ARG(L != NULL, "dtl_moe_layout_token_counts", "layout=NULL");
  if (kept) memcpy(kept, L->kept, sizeof(int64_t) * (size_t)L->experts);
  if (dropped) memcpy(dropped, L->dropped, sizeof(int64_t) * (size_t)L->experts);
  return DTL_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* dtl's own collective algorithms on the MPI transport, made of point-to-point transfers on its communicator:
 * reduce-scatter as an all-to-all of blocks plus a rank-order fold (a2a_fold), all-reduce as that plus an
 * all-gather (rs_ag) or as an all-gather of whole vectors plus a fold (ag_fold), reduce likewise (rs_gather,
 * gather_fold) or as a pipelined chain in rank order, direct and ring all-gathers and a direct all-to-all(v). Every transfer moves in pieces of at
 * most `limit` elements, which is also how calls with counts or displacements beyond INT_MAX get through MPI.
 * Every reduction is the fold of dtl__fold, contributions in rank order, so results do not depend on the
 * algorithm. */
#include <limits.h>
#include <string.h>
#include "comm/deadline.h"
#include "comm/mpi_algo.h"
#include "common/half.h"

/* --- the rank-order fold ------------------------------------------------------------------------------------ */
/* Elements folded at a time: the accumulator (8 KiB of f64) stays in L1 while each rank's block streams
 * through, and writing it out only after every block was read lets out be one of the blocks. */
#define DTL__FOLD_CHUNK 1024

typedef union {
  float f32[DTL__FOLD_CHUNK];
  double f64[DTL__FOLD_CHUNK];
  uint16_t u16[DTL__FOLD_CHUNK];
  int8_t i8[DTL__FOLD_CHUNK];
  uint8_t u8[DTL__FOLD_CHUNK];
  int32_t i32[DTL__FOLD_CHUNK];
  int64_t i64[DTL__FOLD_CHUNK];
} dtl__fold_acc;

typedef void (*dtl__combine_fn)(void *acc, const void *x, size_t m);

/* acc[i] = acc[i] op x[i], acc holding the ranks before x's: each element one operation of the dtype, so the
 * fold's rounding is the scalar code's whatever the lanes. */
#define DTL__COMBINE(name, T, expr)                         \
  static void name(void *accv, const void *xv, size_t m) { \
    T *restrict acc = accv;                                 \
    const T *restrict x = xv;                               \
    for (size_t i = 0; i < m; i++) {                        \
      T a = acc[i], b = x[i];                               \
      acc[i] = (expr);                                      \
    }                                                       \
  }
/* Sums and products, the hot ones, 64 bytes at a time in GCC vector types (-O2 does not vectorize the loop
 * above: unknown trip count); integers as unsigned lanes, which wrap as MPI's ops do. */
#if defined(__GNUC__)
#define DTL__COMBINE_VEC(name, T, op)                                          \
  static void name(void *accv, const void *xv, size_t m) {                    \
    typedef T dtl__lanes __attribute__((vector_size(64)));                     \
    char *acc = accv;                                                          \
    const char *x = xv;                                                        \
    size_t i = 0, n = m * sizeof(T);                                           \
    for (; i + 64 <= n; i += 64) {                                             \
      dtl__lanes a, b;                                                         \
      memcpy(&a, acc + i, 64);                                                 \
      memcpy(&b, x + i, 64);                                                   \
      a = a op b;                                                              \
      memcpy(acc + i, &a, 64);                                                 \
    }                                                                          \
    for (; i < n; i += sizeof(T)) {                                            \
      T a, b;                                                                  \
      memcpy(&a, acc + i, sizeof a);                                           \
      memcpy(&b, x + i, sizeof b);                                             \
      a = (T)(a op b);                                                         \
      memcpy(acc + i, &a, sizeof a);                                           \
    }                                                                          \
  }
#else
#define DTL__COMBINE_VEC(name, T, op) DTL__COMBINE(name, T, (T)(a op b))
#endif
#define DTL__COMBINE_INT(sfx, T, U)                  \
  DTL__COMBINE_VEC(dtl__sum_##sfx, U, +)             \
  DTL__COMBINE_VEC(dtl__prod_##sfx, U, *)            \
  DTL__COMBINE(dtl__max_##sfx, T, b > a ? b : a)     \
  DTL__COMBINE(dtl__min_##sfx, T, b < a ? b : a)
#define DTL__COMBINE_FLOAT(sfx, T)                   \
  DTL__COMBINE_VEC(dtl__sum_##sfx, T, +)             \
  DTL__COMBINE_VEC(dtl__prod_##sfx, T, *)            \
  DTL__COMBINE(dtl__max_##sfx, T, b > a ? b : a)     \
  DTL__COMBINE(dtl__min_##sfx, T, b < a ? b : a)
/* f16/bf16: each pair in f32, rounded back: what the transport's MPI_Ops do (in = b, inout = a there). */
#define DTL__COMBINE_HALF(sfx, to, from)                                                            \
  DTL__COMBINE(dtl__sum_##sfx, uint16_t, from(to(b) + to(a)))                                       \
  DTL__COMBINE(dtl__prod_##sfx, uint16_t, from(to(b) * to(a)))                                      \
  DTL__COMBINE(dtl__max_##sfx, uint16_t, from(to(b) > to(a) ? to(b) : to(a)))                       \
  DTL__COMBINE(dtl__min_##sfx, uint16_t, from(to(b) < to(a) ? to(b) : to(a)))
DTL__COMBINE_FLOAT(f32, float)
DTL__COMBINE_FLOAT(f64, double)
DTL__COMBINE_HALF(f16, dtl__f16_to_f32, dtl__f32_to_f16)
DTL__COMBINE_HALF(bf16, dtl__bf16_to_f32, dtl__f32_to_bf16)
DTL__COMBINE_INT(i8, int8_t, uint8_t)
DTL__COMBINE_INT(u8, uint8_t, uint8_t)
DTL__COMBINE_INT(i32, int32_t, uint32_t)
DTL__COMBINE_INT(i64, int64_t, uint64_t)
/* e4m3/e5m2: max and min only (types.h), compared as values with the winner's code kept, as the transport's MPI_Ops
 * do, so the result is one of the inputs. */
#define DTL__COMBINE_F8(sfx, gt)                                              \
  DTL__COMBINE(dtl__max_##sfx, uint8_t, gt(b, a) ? b : a)                     \
  DTL__COMBINE(dtl__min_##sfx, uint8_t, gt(a, b) ? b : a)
DTL__COMBINE_F8(f8e4m3, dtl__f8e4m3_gt)
DTL__COMBINE_F8(f8e5m2, dtl__f8e5m2_gt)

static dtl__combine_fn dtl__combine(dtl_dtype t, dtl_reduce_op op) {
#define DTL__ROW(sfx) {dtl__sum_##sfx, dtl__prod_##sfx, dtl__max_##sfx, dtl__min_##sfx}
/* No sums or products of the 8-bit floats: comm.c and layout creation refuse them before any transport runs. */
#define DTL__ROW_F8(sfx) {NULL, NULL, dtl__max_##sfx, dtl__min_##sfx}
  static const dtl__combine_fn fns[DTL_NUM_DTYPES][4] = {
      [DTL_FLOAT32] = DTL__ROW(f32),          [DTL_FLOAT64] = DTL__ROW(f64),
      [DTL_FLOAT16] = DTL__ROW(f16),          [DTL_BFLOAT16] = DTL__ROW(bf16),
      [DTL_INT8] = DTL__ROW(i8),              [DTL_UINT8] = DTL__ROW(u8),
      [DTL_INT32] = DTL__ROW(i32),            [DTL_INT64] = DTL__ROW(i64),
      [DTL_FLOAT8_E4M3] = DTL__ROW_F8(f8e4m3), [DTL_FLOAT8_E5M2] = DTL__ROW_F8(f8e5m2)};
#undef DTL__ROW_F8
#undef DTL__ROW
  return fns[t][op == DTL_AVG ? 0 : (int)op];
}

void dtl__fold(void *out, const void *own, int rank, const void *others, size_t stride, int p, size_t n, dtl_dtype t,
               dtl_reduce_op op) {
  size_t es = dtl_dtype_size(t);
  if (p == 1) {
    if (out != own && n) memmove(out, own, n * es);
    return;
  }
  dtl__combine_fn combine = dtl__combine(t, op);
  dtl__fold_acc acc;
  for (size_t a = 0; a < n; a += DTL__FOLD_CHUNK) {
    size_t m = n - a < DTL__FOLD_CHUNK ? n - a : DTL__FOLD_CHUNK, off = a * es;
    for (int q = 0; q < p; q++) {
      const char *src = q == rank ? (const char *)own : (const char *)others + (size_t)(q < rank ? q : q - 1) * stride;
      if (q == 0) memcpy(&acc, src + off, m * es);
      else combine(&acc, src + off, m);
    }
    memcpy((char *)out + off, &acc, m * es);
  }
}

void dtl__divide(void *buf, size_t count, dtl_dtype t, int n) {
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
      case DTL_FLOAT8_E4M3: /* fall through: no average of the 8-bit floats (refused, types.h) */
      case DTL_FLOAT8_E5M2: return;
    }
  }
}

void dtl__algo_finish(const dtl__algo_after *f) {
  if (f->fold_out)
    dtl__fold(f->fold_out, f->fold_own, f->rank, f->fold_others, f->fold_stride, f->size, f->fold_n, f->t, f->op);
  if (f->move_bytes) memmove(f->move_dst, f->move_src, f->move_bytes);
  if (f->avg_buf && f->avg_n) dtl__divide(f->avg_buf, f->avg_n, f->t, f->size);
}

/* --- transfers ----------------------------------------------------------------------------------------------- */
static void dtl__add(dtl__algo_ctx *x, const void *buf, size_t count, int peer, bool send) {
  if (count) x->x[x->nx++] = (dtl__xfer){.buf = (char *)buf, .count = count, .peer = peer, .send = send};
}

/* Withdraws what a failed round had posted (MPI failing to post at all is the only way to get here). */
static void dtl__abandon(dtl__algo_ctx *x, int first) {
  for (int i = first; i < x->nreqs; i++) {
    MPI_Cancel(&x->reqs[i]);
    MPI_Request_free(&x->reqs[i]);
  }
  x->nreqs = first;
}

/* Posts piece j of every pending transfer, receives first; *any says whether some transfer had one. */
static dtl_status dtl__post_round(dtl__algo_ctx *x, const char *fn, size_t j, bool *any) {
  *any = false;
  int first = x->nreqs;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < x->nx; i++) {
      const dtl__xfer *t = &x->x[i];
      if (t->send != (pass == 1) || dtl__pieces(t->count, x->limit) <= j) continue;
      size_t at = j * x->limit, m = t->count - at < x->limit ? t->count - at : x->limit;
      char *b = t->buf + at * x->es;
      MPI_Request *r = &x->reqs[x->nreqs];
      int rc = t->send ? MPI_Isend(b, (int)m, x->dt, t->peer, x->tag, x->comm, r)
                       : MPI_Irecv(b, (int)m, x->dt, t->peer, x->tag, x->comm, r);
      if (rc != MPI_SUCCESS) {
        dtl__abandon(x, first);
        return dtl__mpi_error(fn, rc);
      }
      x->nreqs++;
      *any = true;
    }
  return DTL_OK;
}

/* Moves the pending transfers: a blocking call round by round (piece j of every transfer, then wait: no more
 * than 2 x size requests, and no round waits on a piece whose peer has not reached that round), a nonblocking
 * start all rounds at once (pieces of one pair keep their order: MPI does not let messages overtake). */
static dtl_status dtl__exchange(dtl__algo_ctx *x, const char *fn) {
  if (x->nonblocking) {
    size_t total = 0, rounds = 0;
    for (int i = 0; i < x->nx; i++) {
      size_t k = dtl__pieces(x->x[i].count, x->limit);
      total += k;
      if (k > rounds) rounds = k;
    }
    if (total > (size_t)(x->reqs_cap - x->nreqs)) {
      size_t cap = (size_t)x->nreqs + total;
      MPI_Request *r = cap <= INT_MAX / 2 ? dtl__malloc(sizeof *r * cap) : NULL;
      if (!r) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory (%zu requests)", cap);
      if (x->nreqs) memcpy(r, x->reqs, sizeof *r * (size_t)x->nreqs);
      dtl__free(x->reqs_heap);
      x->reqs = x->reqs_heap = r;
      x->reqs_cap = (int)cap;
    }
    for (size_t j = 0; j < rounds; j++) {
      bool any;
      DTL_TRY(dtl__post_round(x, fn, j, &any));
    }
    x->nx = 0;
    return DTL_OK;
  }
  for (size_t j = 0;; j++) {
    bool any;
    x->nreqs = 0;
    DTL_TRY(dtl__post_round(x, fn, j, &any));
    if (!any) break;
    DTL_TRY(dtl__mpi_waitall(x->c, fn, x->nreqs, x->reqs, MPI_STATUSES_IGNORE));
  }
  x->nreqs = 0;
  x->nx = 0;
  return DTL_OK;
}

/* --- layouts of blocks ----------------------------------------------------------------------------------------- */
/* Block q of n elements split evenly over p ranks (the first n % p blocks one longer). */
static size_t dtl__even(size_t n, int p, int q) { return n / (size_t)p + ((size_t)q < n % (size_t)p); }
static size_t dtl__even_at(size_t n, int p, int q) {
  size_t r = n % (size_t)p;
  return (size_t)q * (n / (size_t)p) + ((size_t)q < r ? (size_t)q : r);
}

/* o[q] = displs[q], or packed offsets of counts, or q x each. */
static void dtl__offsets(const size_t *counts, const size_t *displs, size_t each, int p, size_t *o) {
  size_t s = 0;
  for (int q = 0; q < p; q++) {
    o[q] = displs ? displs[q] : counts ? s : (size_t)q * each;
    if (counts) s += counts[q];
  }
}

static size_t dtl__max_count(const size_t *counts, size_t each, int p) {
  size_t m = each;
  for (int q = 0; counts && q < p; q++)
    if (counts[q] > m) m = counts[q];
  return m;
}

/* A chain's segment (elements): 64 KiB at least (or the whole vector), at most 64 segments in all, at most the
 * limit. */
static size_t dtl__chain_segment(size_t n, size_t es, size_t limit) {
  size_t seg = (n + 63) / 64, least = 65536 / es;
  if (seg < least) seg = least < n ? least : n ? n : 1;
  return seg < limit ? seg : limit;
}

size_t dtl__algo_scratch_bytes(const dtl__algo_ctx *x, const dtl__algo_call *a) {
  size_t p = (size_t)x->size, es = x->es, n = a->count;
  switch (a->algo) {
    case DTL__ALGO_A2A_FOLD: return (p - 1) * dtl__max_count(a->counts, n, x->size) * es;
    case DTL__ALGO_RS_AG: return (p - 1) * dtl__even(n, x->size, 0) * es;
    case DTL__ALGO_RS_GATHER: return p * dtl__even(n, x->size, 0) * es;
    case DTL__ALGO_CHAIN: return 2 * dtl__chain_segment(n, es, x->limit) * es;
    case DTL__ALGO_AG_FOLD:
    case DTL__ALGO_GATHER_FOLD: return (p - 1) * n * es;
    case DTL__ALGO_DIRECT: /* a nonblocking in-place all-to-all receives into a copy of the buffer */
      if (x->nonblocking && a->in_place) {
        size_t s = 0;
        for (size_t q = 0; q < p; q++) s += a->rcounts ? a->rcounts[q] : n;
        return s * es;
      }
      return 0;
    default: return 0;
  }
}

/* --- the algorithms -------------------------------------------------------------------------------------------- */
/* The reduce-scatter step of a2a_fold, rs_ag and rs_gather: block q (rc[q] elements at send + so[q]) goes to
 * rank q, and this rank's block from every rank lands in scratch slot(q); the fold of those into out is
 * recorded in f (the caller runs it, or a nonblocking wait does). */
static dtl_status dtl__rs_step(dtl__algo_ctx *x, const char *fn, const void *send, const size_t *so, const size_t *rc,
                               void *out, dtl__algo_after *f) {
  int r = x->rank, p = x->size;
  size_t mine = rc[r], stride = mine * x->es;
  for (int k = 1; k < p; k++) {
    int from = (r - k + p) % p;
    dtl__add(x, (char *)x->scratch + (size_t)(from < r ? from : from - 1) * stride, mine, from, false);
  }
  for (int k = 1; k < p; k++) {
    int to = (r + k) % p;
    dtl__add(x, dtl__at(send, so[to], x->es), rc[to], to, true);
  }
  DTL_TRY(dtl__exchange(x, fn));
  f->fold_out = out;
  f->fold_own = dtl__at(send, so[r], x->es);
  f->fold_others = x->scratch;
  f->fold_stride = stride;
  f->fold_n = mine;
  return DTL_OK;
}

/* Folds now (a blocking call's step) and leaves f with nothing more to fold. */
static void dtl__fold_now(dtl__algo_after *f) {
  dtl__algo_after g = *f;
  g.move_bytes = 0;
  g.avg_buf = NULL;
  dtl__algo_finish(&g);
  f->fold_out = NULL;
}

/* Every block (rc[q] elements at recv + ro[q]) reaches every rank from its owner; this rank's is in place. */
static dtl_status dtl__gather_step(dtl__algo_ctx *x, const char *fn, void *recv, const size_t *ro, const size_t *rc) {
  int r = x->rank, p = x->size;
  for (int k = 1; k < p; k++) {
    int from = (r - k + p) % p;
    dtl__add(x, dtl__at(recv, ro[from], x->es), rc[from], from, false);
  }
  for (int k = 1; k < p; k++) dtl__add(x, dtl__at(recv, ro[r], x->es), rc[r], (r + k) % p, true);
  return dtl__exchange(x, fn);
}

/* The in-place all-to-all of a blocking call: pairwise MPI_Sendrecv_replace, partner (k - rank) mod p in step
 * k, so that both ranks of a pair meet in the same step (this rank's own block stays). */
static dtl_status dtl__a2a_replace(dtl__algo_ctx *x, const char *fn, void *buf, const size_t *o, const size_t *c) {
  int r = x->rank, p = x->size;
  /* Under a deadline each exchange is an Isend from the block and an Irecv into a bounce buffer of the largest
   * piece, completed under the deadline: the same messages as MPI_Sendrecv_replace's, so peers without a
   * deadline match them. Without room for the bounce it keeps MPI_Sendrecv_replace (no deadline then). */
  size_t most = 0;
  for (int q = 0; q < p; q++) {
    size_t m = q == r ? 0 : c[q] < x->limit ? c[q] : x->limit;
    if (m > most) most = m;
  }
  char *bounce = dtl__comm_timed(x->c) && most ? dtl__malloc(most * x->es) : NULL;
  dtl_status st = DTL_OK;
  for (int k = 0; k < p && st == DTL_OK; k++) {
    int q = ((k - r) % p + p) % p;
    if (q == r) continue;
    for (size_t at = 0; at < c[q] && st == DTL_OK; at += x->limit) {
      size_t m = c[q] - at < x->limit ? c[q] - at : x->limit;
      char *b = dtl__at(buf, o[q] + at, x->es);
      if (!bounce) {
        int rc = MPI_Sendrecv_replace(b, (int)m, x->dt, q, x->tag, q, x->tag, x->comm, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) st = dtl__mpi_error(fn, rc);
        continue;
      }
      MPI_Request rq[2];
      int rc = MPI_Irecv(bounce, (int)m, x->dt, q, x->tag, x->comm, &rq[0]);
      if (rc == MPI_SUCCESS && (rc = MPI_Isend(b, (int)m, x->dt, q, x->tag, x->comm, &rq[1])) != MPI_SUCCESS) {
        MPI_Cancel(&rq[0]);
        MPI_Request_free(&rq[0]);
      }
      if (rc != MPI_SUCCESS) st = dtl__mpi_error(fn, rc);
      else if ((st = dtl__mpi_waitall(x->c, fn, 2, rq, MPI_STATUSES_IGNORE)) == DTL_OK) memcpy(b, bounce, m * x->es);
    }
  }
  if (st == DTL_OK || !dtl__comm_dead(x->c)) dtl__free(bounce); /* after a timeout MPI may still write into it */
  return st;
}

static dtl_status dtl__all_to_all(dtl__algo_ctx *x, const dtl__algo_call *a, dtl__algo_after *f) {
  int r = x->rank, p = x->size;
  size_t *so = x->offs, *ro = x->offs + p, es = x->es;
  const size_t *sc = a->counts, *rc = a->rcounts ? a->rcounts : a->counts;
  dtl__offsets(sc, a->sdispls, a->count, p, so);
  dtl__offsets(rc, a->rdispls, a->count, p, ro);
  const void *send = a->send;
  void *recv = a->recv;
  if (a->in_place) { /* counts equal pairwise (comm.c) */
    if (!x->nonblocking) {
      if (sc) return dtl__a2a_replace(x, a->fn, recv, ro, rc);
      for (int q = 0; q < p; q++) so[q] = a->count; /* the uniform counts, in the slot of the (equal) send offsets */
      return dtl__a2a_replace(x, a->fn, recv, ro, so);
    }
    size_t total = 0;
    for (int q = 0; q < p; q++) total += rc ? rc[q] : a->count;
    recv = x->scratch; /* received into a copy, which replaces the buffer once every send is done */
    size_t own = rc ? rc[r] : a->count;
    if (own) memcpy(dtl__at(recv, ro[r], es), dtl__at(send, so[r], es), own * es);
    f->move_dst = a->recv;
    f->move_src = recv;
    f->move_bytes = total * es;
  } else {
    size_t own = rc ? rc[r] : a->count;
    if (own) memcpy(dtl__at(recv, ro[r], es), dtl__at(send, so[r], es), own * es);
  }
  for (int k = 1; k < p; k++) {
    int from = (r - k + p) % p;
    dtl__add(x, dtl__at(recv, ro[from], es), rc ? rc[from] : a->count, from, false);
  }
  for (int k = 1; k < p; k++) {
    int to = (r + k) % p;
    dtl__add(x, dtl__at(send, so[to], es), sc ? sc[to] : a->count, to, true);
  }
  return dtl__exchange(x, a->fn);
}

/* all_gather(v): this rank's block into place, then direct (one exchange) or ring (p - 1 steps, each passing on
 * the block received in the step before). */
static dtl_status dtl__all_gather(dtl__algo_ctx *x, const dtl__algo_call *a) {
  int r = x->rank, p = x->size;
  size_t *ro = x->offs, *rc = x->offs + p;
  for (int q = 0; q < p; q++) rc[q] = a->counts ? a->counts[q] : a->count;
  dtl__offsets(rc, NULL, 0, p, ro);
  char *mine = dtl__at(a->recv, ro[r], x->es);
  if (a->send != mine && rc[r]) memcpy(mine, a->send, rc[r] * x->es);
  if (a->algo != DTL__ALGO_RING) return dtl__gather_step(x, a->fn, a->recv, ro, rc);
  for (int s = 0; s < p - 1; s++) {
    int sb = ((r - s) % p + p) % p, rb = ((r - s - 1) % p + p) % p;
    dtl__add(x, dtl__at(a->recv, ro[rb], x->es), rc[rb], (r - 1 + p) % p, false);
    dtl__add(x, dtl__at(a->recv, ro[sb], x->es), rc[sb], (r + 1) % p, true);
    DTL_TRY(dtl__exchange(x, a->fn));
  }
  return DTL_OK;
}

/* reduce_scatter(v) as a2a_fold. */
static dtl_status dtl__reduce_scatter(dtl__algo_ctx *x, const dtl__algo_call *a, dtl__algo_after *f) {
  int p = x->size;
  size_t *so = x->offs, *rc = x->offs + p;
  for (int q = 0; q < p; q++) rc[q] = a->counts ? a->counts[q] : a->count;
  dtl__offsets(rc, NULL, 0, p, so);
  DTL_TRY(dtl__rs_step(x, a->fn, a->send, so, rc, a->recv, f));
  if (x->op == DTL_AVG) {
    f->avg_buf = a->recv;
    f->avg_n = rc[x->rank];
  }
  return DTL_OK;
}

/* all_reduce and reduce: rs_ag / rs_gather (reduce-scatter of even blocks, then the blocks to every rank or to
 * root) or ag_fold / gather_fold (every vector to every rank or to root, then one fold). */
static dtl_status dtl__reduction(dtl__algo_ctx *x, const dtl__algo_call *a, dtl__algo_after *f) {
  int r = x->rank, p = x->size;
  bool rooted = a->coll == DTL__COLL_REDUCE, here = !rooted || r == a->root;
  size_t n = a->count, es = x->es;
  if (a->algo == DTL__ALGO_AG_FOLD || a->algo == DTL__ALGO_GATHER_FOLD) {
    if (here)
      for (int k = 1; k < p; k++) {
        int from = (r - k + p) % p;
        dtl__add(x, dtl__at(x->scratch, (size_t)(from < r ? from : from - 1) * n, es), n, from, false);
      }
    for (int k = 1; k < p; k++) {
      int to = (r + k) % p;
      if (!rooted || to == a->root) dtl__add(x, a->send, n, to, true);
    }
    DTL_TRY(dtl__exchange(x, a->fn));
    if (here) {
      f->fold_out = a->recv;
      f->fold_own = a->send;
      f->fold_others = x->scratch;
      f->fold_stride = n * es;
      f->fold_n = n;
      if (x->op == DTL_AVG) {
        f->avg_buf = a->recv;
        f->avg_n = n;
      }
    }
    return DTL_OK;
  }
  /* rs_ag, rs_gather: blocking only (dtl__algo_pick) */
  size_t *o = x->offs, *c = x->offs + p;
  for (int q = 0; q < p; q++) {
    c[q] = dtl__even(n, p, q);
    o[q] = dtl__even_at(n, p, q);
  }
  size_t maxb = c[0];
  /* This rank's reduced block: in recv, or (a rank other than root of a reduce) after the receive slots. */
  void *out = here ? dtl__at(a->recv, o[r], es) : dtl__at(x->scratch, (size_t)(p - 1) * maxb, es);
  DTL_TRY(dtl__rs_step(x, a->fn, a->send, o, c, out, f));
  dtl__fold_now(f);
  if (x->op == DTL_AVG) dtl__divide(out, c[r], x->t, p);
  if (!rooted) return dtl__gather_step(x, a->fn, a->recv, o, c);
  if (r != a->root) dtl__add(x, out, c[r], a->root, true);
  else
    for (int k = 1; k < p; k++) {
      int from = (r - k + p) % p;
      dtl__add(x, dtl__at(a->recv, o[from], es), c[from], from, false);
    }
  return dtl__exchange(x, a->fn);
}

/* reduce as a chain: segment g of the partial fold of ranks 0..q-1 travels from rank q-1 to q, which adds its
 * own and passes it on, so the ranks' contributions meet in rank order (the same rounding as dtl__fold) and
 * every link carries the vector once; rank p-1 holds the result, and sends it to root unless it is root. In
 * step g a rank receives segment g and sends segment g-1 (double-buffered in scratch); root keeps up to
 * 2 x size receives of the result open in window, posting segment g-1's after its own segment g-1 left (so
 * that an in-place root sends its contribution before the result overwrites it). */
static dtl_status dtl__chain(dtl__algo_ctx *x, const dtl__algo_call *a) {
  int r = x->rank, p = x->size, root = a->root, last = p - 1;
  size_t n = a->count, es = x->es, seg = dtl__chain_segment(n, es, x->limit), nseg = n ? (n - 1) / seg + 1 : 0;
  if (p == 1) {
    dtl__fold(a->recv, a->send, 0, NULL, 0, 1, n, x->t, x->op);
    return DTL_OK;
  }
  char *buf[2] = {x->scratch, (char *)x->scratch + seg * es};
  int open = 0, oldest = 0, cap = 2 * p;
  dtl_status st = DTL_OK;
  for (size_t g = 0; g <= nseg && st == DTL_OK; g++) {
    size_t at = g * seg, m = g < nseg ? (n - at < seg ? n - at : seg) : 0;
    size_t prev = g ? (g - 1) * seg : 0, pm = g ? (n - prev < seg ? n - prev : seg) : 0;
    if (r > 0 && g < nseg) dtl__add(x, buf[g % 2], m, r - 1, false);
    if (g >= 1 && (r < last || root != last))
      dtl__add(x, r == 0 ? dtl__at(a->send, prev, es) : buf[(g - 1) % 2], pm, r < last ? r + 1 : root, true);
    st = dtl__exchange(x, a->fn);
    if (st == DTL_OK && r == root && root != last && g >= 1) {
      if (open == cap) { /* the window is full: the oldest receive first */
        st = dtl__mpi_waitall(x->c, a->fn, 1, &x->window[oldest], MPI_STATUSES_IGNORE);
        oldest = (oldest + 1) % cap;
        open--;
      }
      int rc = MPI_Irecv(dtl__at(a->recv, prev, es), (int)pm, x->dt, last, x->tag, x->comm,
                         &x->window[(oldest + open) % cap]);
      if (rc != MPI_SUCCESS && st == DTL_OK) st = dtl__mpi_error(a->fn, rc);
      if (rc == MPI_SUCCESS) open++;
    }
    if (st == DTL_OK && r > 0 && g < nseg) /* partial (ranks < r) op own */
      dtl__fold(r == last && root == last ? dtl__at(a->recv, at, es) : buf[g % 2], buf[g % 2], 0,
                dtl__at(a->send, at, es), 0, 2, m, x->t, x->op);
  }
  for (; open > 0 && !dtl__comm_dead(x->c); open--, oldest = (oldest + 1) % cap) {
    dtl_status ws = dtl__mpi_waitall(x->c, a->fn, 1, &x->window[oldest], MPI_STATUSES_IGNORE);
    if (st == DTL_OK) st = ws;
  }
  if (st == DTL_OK && r == root && x->op == DTL_AVG) dtl__divide(a->recv, n, x->t, p);
  return st;
}

/* gather and scatter of large calls: blocks straight to or from root. */
static dtl_status dtl__rooted(dtl__algo_ctx *x, const dtl__algo_call *a) {
  int r = x->rank, p = x->size;
  size_t n = a->count, es = x->es;
  bool gather = a->coll == DTL__COLL_GATHER;
  if (r == a->root) {
    const void *from = gather ? a->send : dtl__at(a->send, (size_t)r * n, es);
    void *to = gather ? dtl__at(a->recv, (size_t)r * n, es) : a->recv;
    if (from != to && n) memcpy(to, from, n * es);
    for (int k = 1; k < p; k++) {
      int q = (r + k) % p;
      if (gather) dtl__add(x, dtl__at(a->recv, (size_t)q * n, es), n, q, false);
      else dtl__add(x, dtl__at(a->send, (size_t)q * n, es), n, q, true);
    }
  } else {
    dtl__add(x, gather ? a->send : a->recv, n, a->root, gather);
  }
  return dtl__exchange(x, a->fn);
}

dtl_status dtl__algo_run(dtl__algo_ctx *x, const dtl__algo_call *a, dtl__algo_after *f) {
  f->t = x->t;
  f->op = x->op;
  f->rank = x->rank;
  f->size = x->size;
  x->nx = 0;
  dtl_status st;
  switch (a->coll) {
    case DTL__COLL_ALL_TO_ALL:
    case DTL__COLL_ALL_TO_ALLV: st = dtl__all_to_all(x, a, f); break;
    case DTL__COLL_ALL_GATHER: st = dtl__all_gather(x, a); break;
    case DTL__COLL_REDUCE_SCATTER: st = dtl__reduce_scatter(x, a, f); break;
    case DTL__COLL_ALL_REDUCE:
    case DTL__COLL_REDUCE: st = a->algo == DTL__ALGO_CHAIN ? dtl__chain(x, a) : dtl__reduction(x, a, f); break;
    default: st = dtl__rooted(x, a); break;
  }
  if (st == DTL_OK && !x->nonblocking) {
    dtl__algo_finish(f);
    *f = (dtl__algo_after){0};
  }
  return st;
}

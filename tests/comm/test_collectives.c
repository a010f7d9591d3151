/* SPDX-License-Identifier: Apache-2.0 */
/* Every collective of the MPI transport, for every dtype and reduce op, against a dense oracle: each rank
 * generates every rank's input from one deterministic generator and computes the expected result on its
 * own. Inputs are small integers (|x| <= 48, products of at most a few 2s and -1s), so every sum, product and
 * partial result is exact in every dtype, i8 and bf16 included, and results are compared exactly; DTL_AVG is
 * compared with the documented rule (integer division truncating toward zero, or sum/size rounded once to
 * the dtype). Outputs start as a sentinel, so unwritten or misplaced elements show. The 8-bit floats hold each
 * input rounded (e5m2 holds 9 as 8), and the oracle rounds alike (data moves as codes; max and min of rounded values
 * are the rounded max and min); they reduce with max and min only, and every other op is checked to be refused. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "common/half.h"
#include "dtl_test.h"

static dtl_comm *comm;
static int rank, size;

static const dtl_dtype all_dtypes[] = {DTL_FLOAT32, DTL_FLOAT64, DTL_FLOAT16,     DTL_BFLOAT16,   DTL_INT8,
                                       DTL_UINT8,   DTL_INT32,   DTL_INT64, DTL_FLOAT8_E4M3, DTL_FLOAT8_E5M2};
static const dtl_reduce_op all_ops[] = {DTL_SUM, DTL_PROD, DTL_MAX, DTL_MIN, DTL_AVG};
#define NDTYPES 10
#define NOPS 5
/* Zero, one, a few, and enough to take MPI's segmented / ring algorithms. */
static const size_t counts[] = {0, 1, 7, 2500};
#define NCOUNTS 4
#define SENTINEL 0x5a

/* --- typed element access ----------------------------------------------------------------------------- */
static size_t esz(dtl_dtype t) { return dtl_dtype_size(t); }

static void put(dtl_dtype t, void *buf, size_t i, double v) {
  switch (t) {
    case DTL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DTL_FLOAT64: ((double *)buf)[i] = v; break;
    case DTL_FLOAT16: ((uint16_t *)buf)[i] = dtl__f32_to_f16((float)v); break;
    case DTL_BFLOAT16: ((uint16_t *)buf)[i] = dtl__f32_to_bf16((float)v); break;
    case DTL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DTL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DTL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DTL_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DTL_FLOAT8_E4M3: ((uint8_t *)buf)[i] = dtl__f32_to_f8e4m3((float)v); break;
    case DTL_FLOAT8_E5M2: ((uint8_t *)buf)[i] = dtl__f32_to_f8e5m2((float)v); break;
  }
}

static double get(dtl_dtype t, const void *buf, size_t i) {
  switch (t) {
    case DTL_FLOAT32: return ((const float *)buf)[i];
    case DTL_FLOAT64: return ((const double *)buf)[i];
    case DTL_FLOAT16: return dtl__f16_to_f32(((const uint16_t *)buf)[i]);
    case DTL_BFLOAT16: return dtl__bf16_to_f32(((const uint16_t *)buf)[i]);
    case DTL_INT8: return ((const int8_t *)buf)[i];
    case DTL_UINT8: return ((const uint8_t *)buf)[i];
    case DTL_INT32: return ((const int32_t *)buf)[i];
    case DTL_FLOAT8_E4M3: return dtl__f8e4m3_to_f32(((const uint8_t *)buf)[i]);
    case DTL_FLOAT8_E5M2: return dtl__f8e5m2_to_f32(((const uint8_t *)buf)[i]);
    case DTL_INT64: break;
  }
  return (double)((const int64_t *)buf)[i];
}

/* The value t holds for v: v itself, except in the 8-bit floats, which round it. */
static double held(dtl_dtype t, double v) {
  unsigned char b[8] = {0};
  put(t, b, 0, v);
  return get(t, b, 0);
}

static bool is_fp8(dtl_dtype t) { return t == DTL_FLOAT8_E4M3 || t == DTL_FLOAT8_E5M2; }

/* The 8-bit floats reduce with max and min only (types.h): a sum, product or average would round at every step. */
static bool fp8_refused(dtl_dtype t, dtl_reduce_op op) { return is_fp8(t) && op != DTL_MAX && op != DTL_MIN; }

/* A refused reduction: DTL_ERR_UNSUPPORTED from call, its message naming the call, the dtype, the op and why. */
static void check_refused(dtl_status st, const char *call, dtl_dtype t, dtl_reduce_op op) {
  char why[96];
  snprintf(why, sizeof why, "%s %s would round at every step; reduce in f32 or bf16", dtl_dtype_name(t),
           dtl_reduce_op_name(op));
  CHECK(st == DTL_ERR_UNSUPPORTED && strstr(dtl_last_error(), call) && strstr(dtl_last_error(), why),
        "%s on %s %s -> %s: %s", call, dtl_dtype_name(t), dtl_reduce_op_name(op), dtl_status_name(st), dtl_last_error());
}

static void *sentinel_buf(size_t elems, dtl_dtype t) {
  size_t bytes = elems * esz(t);
  unsigned char *p = malloc(bytes ? bytes : 1);
  memset(p, SENTINEL, bytes ? bytes : 1);
  return p;
}

static bool untouched(const void *buf, size_t bytes) {
  for (size_t i = 0; i < bytes; i++)
    if (((const unsigned char *)buf)[i] != SENTINEL) return false;
  return true;
}

/* --- the generator and the oracle ------------------------------------------------------------------------ */
/* A mixing hash, so that values carry no arithmetic pattern across ranks (a linear formula made every sum
 * over 3 ranks a multiple of 3, hiding the rounding of DTL_AVG). */
static unsigned mix(size_t a, size_t b, size_t c) {
  uint64_t x = (uint64_t)a * 0x9e3779b97f4a7c15ull ^ (uint64_t)b * 0xc2b2ae3d27d4eb4full ^ (uint64_t)c * 0x165667b19e3779f9ull;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return (unsigned)(x >> 32);
}

/* Element i that rank r contributes (salt separates calls). Movement tests use distinct-ish values in
 * [-48, 48] (or [0, 96] for u8); reductions use [-4, 4] ([0, 8] for u8), so a sum over 8 ranks stays within
 * i8, and products use 1, 2 and -1 with at most two 2s per element over 8 ranks. */
static double gen_move(dtl_dtype t, int r, size_t i, int salt) {
  int v = (int)(mix((size_t)r, i, (size_t)salt) % 97);
  return t == DTL_UINT8 ? v : v - 48;
}

static double gen_reduce(dtl_dtype t, dtl_reduce_op op, int r, size_t i, int salt) {
  if (op == DTL_PROD) {
    if (((size_t)r + i + (size_t)salt) % 5 == 0) return 2; /* at most two of any 8 consecutive ranks */
    if (t != DTL_UINT8 && mix((size_t)r, i, (size_t)salt) % 4 == 0) return -1;
    return 1;
  }
  int v = (int)(mix((size_t)r, i, (size_t)salt) % 9);
  return t == DTL_UINT8 ? v : v - 4;
}

/* The reduction of element i over all ranks, computed exactly in double, then DTL_AVG's documented rule. */
static double oracle_reduce(dtl_dtype t, dtl_reduce_op op, size_t i, int salt) {
  double acc = gen_reduce(t, op, 0, i, salt);
  for (int r = 1; r < size; r++) {
    double x = gen_reduce(t, op, r, i, salt);
    switch (op) {
      case DTL_PROD: acc *= x; break;
      case DTL_MAX: acc = x > acc ? x : acc; break;
      case DTL_MIN: acc = x < acc ? x : acc; break;
      default: acc += x; break;
    }
  }
  if (op != DTL_AVG) return acc;
  switch (t) {
    case DTL_FLOAT64: return acc / size;
    case DTL_FLOAT32: return (float)acc / (float)size;
    case DTL_FLOAT16: return dtl__f16_to_f32(dtl__f32_to_f16((float)acc / (float)size));
    case DTL_BFLOAT16: return dtl__bf16_to_f32(dtl__f32_to_bf16((float)acc / (float)size));
    default: return (double)((int64_t)acc / size); /* C division truncates toward zero */
  }
}

/* Compares n elements of got with want(i); reports the first mismatch of the call described by what. */
#define EXPECT_ELEMENTS(t, got, n, want_expr, ...)                                                   \
  do {                                                                                               \
    for (size_t i = 0; i < (n); i++) {                                                               \
      double w_ = held((t), (want_expr)), g_ = get((t), (got), i);                                   \
      if (g_ != w_) {                                                                                \
        char what_[160];                                                                             \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                                  \
        CHECK(g_ == w_, "%s: element %zu = %g (expected %g)", what_, i, g_, w_);                    \
        break;                                                                                       \
      }                                                                                              \
    }                                                                                                \
  } while (0)

/* --- root-based collectives ------------------------------------------------------------------------------ */
static void broadcast_copies_root_buffer_to_every_rank(void) {
  for (int d = 0; d < NDTYPES; d++)
    for (int k = 0; k < NCOUNTS; k++)
      for (int root = 0; root < size; root += (size > 2 ? size - 1 : 1)) {
        dtl_dtype t = all_dtypes[d];
        size_t n = counts[k];
        void *buf = sentinel_buf(n, t);
        if (rank == root)
          for (size_t i = 0; i < n; i++) put(t, buf, i, gen_move(t, root, i, 1));
        CHECK_OK(dtl_broadcast(comm, buf, n, t, root));
        EXPECT_ELEMENTS(t, buf, n, gen_move(t, root, i, 1), "broadcast %s n=%zu root=%d", dtl_dtype_name(t), n, root);
        free(buf);
      }
}

static void scatter_gives_rank_r_block_r_and_ignores_send_elsewhere(void) {
  for (int d = 0; d < NDTYPES; d++)
    for (int k = 0; k < NCOUNTS; k++)
      for (int in_place = 0; in_place < 2; in_place++) {
        dtl_dtype t = all_dtypes[d];
        size_t n = counts[k];
        int root = size - 1;
        void *send = NULL, *recv;
        if (rank == root) {
          send = sentinel_buf(n * (size_t)size, t);
          for (size_t i = 0; i < n * (size_t)size; i++) put(t, send, i, gen_move(t, (int)(i / (n ? n : 1)), i % (n ? n : 1), 2));
        }
        recv = (rank == root && in_place) ? (char *)send + (size_t)root * n * esz(t) : sentinel_buf(n, t);
        CHECK_OK(dtl_scatter(comm, send, recv, n, t, root));
        EXPECT_ELEMENTS(t, recv, n, gen_move(t, rank, i, 2), "scatter %s n=%zu in_place=%d", dtl_dtype_name(t), n, in_place);
        if (!(rank == root && in_place)) free(recv);
        free(send);
      }
}

static void gather_concatenates_in_rank_order_on_root_only(void) {
  for (int d = 0; d < NDTYPES; d++)
    for (int k = 0; k < NCOUNTS; k++)
      for (int in_place = 0; in_place < 2; in_place++) {
        dtl_dtype t = all_dtypes[d];
        size_t n = counts[k], total = n * (size_t)size;
        int root = size / 2;
        void *recv = sentinel_buf(total, t); /* non-roots pass a buffer too: it must stay untouched */
        void *send = (rank == root && in_place) ? (char *)recv + (size_t)root * n * esz(t) : sentinel_buf(n, t);
        for (size_t i = 0; i < n; i++) put(t, send, i, gen_move(t, rank, i, 3));
        CHECK_OK(dtl_gather(comm, send, recv, n, t, root));
        if (rank == root)
          EXPECT_ELEMENTS(t, recv, total, gen_move(t, (int)(i / n), i % n, 3), "gather %s n=%zu in_place=%d",
                          dtl_dtype_name(t), n, in_place);
        else
          CHECK(untouched(recv, total * esz(t)), "gather wrote recv on non-root rank (%s n=%zu)", dtl_dtype_name(t), n);
        if (!(rank == root && in_place)) free(send);
        free(recv);
      }
}

static void reduce_combines_every_rank_on_root_only(void) {
  for (int d = 0; d < NDTYPES; d++)
    for (int o = 0; o < NOPS; o++)
      for (int k = 0; k < NCOUNTS; k++)
        for (int in_place = 0; in_place < 2; in_place++) {
          dtl_dtype t = all_dtypes[d];
          dtl_reduce_op op = all_ops[o];
          size_t n = counts[k];
          int root = (o + k) % size, salt = 4 + o;
          void *send = sentinel_buf(n, t), *recv = (rank == root && in_place) ? send : sentinel_buf(n, t);
          for (size_t i = 0; i < n; i++) put(t, send, i, gen_reduce(t, op, rank, i, salt));
          dtl_status st = dtl_reduce(comm, send, recv, n, t, op, root);
          if (fp8_refused(t, op)) {
            check_refused(st, "dtl_reduce", t, op);
            CHECK(in_place || untouched(recv, n * esz(t)), "a refused reduce wrote recv");
          } else if (rank == root) {
            CHECK(st == DTL_OK, "dtl_reduce: %s", dtl_last_error());
            EXPECT_ELEMENTS(t, recv, n, oracle_reduce(t, op, i, salt), "reduce %s %s n=%zu in_place=%d",
                            dtl_dtype_name(t), dtl_reduce_op_name(op), n, in_place);
          } else {
            CHECK(st == DTL_OK, "dtl_reduce: %s", dtl_last_error());
            CHECK(untouched(recv, n * esz(t)), "reduce wrote recv on non-root (%s %s)", dtl_dtype_name(t),
                  dtl_reduce_op_name(op));
          }
          if (!(rank == root && in_place)) {
            EXPECT_ELEMENTS(t, send, n, gen_reduce(t, op, rank, i, salt), "reduce changed its input (%s %s)",
                            dtl_dtype_name(t), dtl_reduce_op_name(op));
            free(recv);
          }
          free(send);
        }
}

/* --- all-rank collectives ---------------------------------------------------------------------------------- */
static void all_gather_concatenates_in_rank_order_everywhere(void) {
  for (int d = 0; d < NDTYPES; d++)
    for (int k = 0; k < NCOUNTS; k++)
      for (int in_place = 0; in_place < 2; in_place++) {
        dtl_dtype t = all_dtypes[d];
        size_t n = counts[k], total = n * (size_t)size;
        void *recv = sentinel_buf(total, t);
        void *send = in_place ? (char *)recv + (size_t)rank * n * esz(t) : sentinel_buf(n, t);
        for (size_t i = 0; i < n; i++) put(t, send, i, gen_move(t, rank, i, 5));
        CHECK_OK(dtl_all_gather(comm, send, recv, n, t));
        EXPECT_ELEMENTS(t, recv, total, gen_move(t, (int)(i / n), i % n, 5), "all_gather %s n=%zu in_place=%d",
                        dtl_dtype_name(t), n, in_place);
        if (!in_place) free(send);
        free(recv);
      }
}

/* Uneven per-rank counts, zero for some ranks whenever size > 1 (and for every rank with pattern 2). */
static size_t uneven_count(int r, int pattern) {
  switch (pattern) {
    case 0: return (size_t)((r * 5 + 1) % 4);   /* 1, 2, 3, 0, 1, ... */
    case 1: return r == size - 1 ? 2600 : (size_t)(r % 3); /* one large block */
    default: return 0;
  }
}

static void all_gatherv_packs_uneven_blocks_including_empty_ones(void) {
  size_t rc[64], off[65];
  for (int pattern = 0; pattern < 3; pattern++) {
    off[0] = 0;
    for (int r = 0; r < size; r++) rc[r] = uneven_count(r, pattern), off[r + 1] = off[r] + rc[r];
    size_t total = off[size];
    for (int d = 0; d < NDTYPES; d++)
      for (int in_place = 0; in_place < 2; in_place++) {
        dtl_dtype t = all_dtypes[d];
        void *recv = sentinel_buf(total, t);
        void *send = in_place ? (char *)recv + off[rank] * esz(t) : sentinel_buf(rc[rank], t);
        for (size_t i = 0; i < rc[rank]; i++) put(t, send, i, gen_move(t, rank, i, 6));
        CHECK_OK(dtl_all_gatherv(comm, send, rc[rank], recv, rc, t));
        for (int r = 0; r < size; r++)
          EXPECT_ELEMENTS(t, (char *)recv + off[r] * esz(t), rc[r], gen_move(t, r, i, 6),
                          "all_gatherv %s pattern=%d in_place=%d block %d", dtl_dtype_name(t), pattern, in_place, r);
        if (!in_place) free(send);
        free(recv);
      }
  }
}

static void all_reduce_gives_every_rank_the_reduction(void) {
  for (int d = 0; d < NDTYPES; d++)
    for (int o = 0; o < NOPS; o++)
      for (int k = 0; k < NCOUNTS; k++)
        for (int in_place = 0; in_place < 2; in_place++) {
          dtl_dtype t = all_dtypes[d];
          dtl_reduce_op op = all_ops[o];
          size_t n = counts[k];
          int salt = 7 + o + k;
          void *send = sentinel_buf(n, t), *recv = in_place ? send : sentinel_buf(n, t);
          for (size_t i = 0; i < n; i++) put(t, send, i, gen_reduce(t, op, rank, i, salt));
          dtl_status st = dtl_all_reduce(comm, send, recv, n, t, op);
          if (fp8_refused(t, op)) {
            check_refused(st, "dtl_all_reduce", t, op);
            CHECK(in_place || untouched(recv, n * esz(t)), "a refused all_reduce wrote recv");
          } else {
            CHECK(st == DTL_OK, "dtl_all_reduce: %s", dtl_last_error());
            EXPECT_ELEMENTS(t, recv, n, oracle_reduce(t, op, i, salt), "all_reduce %s %s n=%zu in_place=%d",
                            dtl_dtype_name(t), dtl_reduce_op_name(op), n, in_place);
          }
          if (!in_place) {
            EXPECT_ELEMENTS(t, send, n, gen_reduce(t, op, rank, i, salt), "all_reduce changed its input");
            free(recv);
          }
          free(send);
        }
}

static void reduce_scatter_gives_rank_r_block_r_of_the_reduction(void) {
  for (int d = 0; d < NDTYPES; d++)
    for (int o = 0; o < NOPS; o++)
      for (int k = 0; k < NCOUNTS; k++)
        for (int in_place = 0; in_place < 2; in_place++) {
          dtl_dtype t = all_dtypes[d];
          dtl_reduce_op op = all_ops[o];
          size_t n = counts[k], total = n * (size_t)size;
          int salt = 11 + o;
          void *send = sentinel_buf(total, t);
          void *recv = in_place ? (char *)send + (size_t)rank * n * esz(t) : sentinel_buf(n, t);
          for (size_t i = 0; i < total; i++) put(t, send, i, gen_reduce(t, op, rank, i, salt));
          dtl_status st = dtl_reduce_scatter(comm, send, recv, n, t, op);
          if (fp8_refused(t, op)) {
            check_refused(st, "dtl_reduce_scatter", t, op);
            CHECK(in_place || untouched(recv, n * esz(t)), "a refused reduce_scatter wrote recv");
          } else {
            CHECK(st == DTL_OK, "dtl_reduce_scatter: %s", dtl_last_error());
            EXPECT_ELEMENTS(t, recv, n, oracle_reduce(t, op, (size_t)rank * n + i, salt),
                            "reduce_scatter %s %s n=%zu in_place=%d", dtl_dtype_name(t), dtl_reduce_op_name(op), n,
                            in_place);
          }
          if (!in_place) free(recv);
          free(send);
        }
}

static void reduce_scatterv_gives_rank_r_its_uneven_block_including_empty_ones(void) {
  size_t rc[64], off[65];
  for (int pattern = 0; pattern < 3; pattern++) {
    off[0] = 0;
    for (int r = 0; r < size; r++) rc[r] = uneven_count(r, pattern), off[r + 1] = off[r] + rc[r];
    size_t total = off[size];
    for (int d = 0; d < NDTYPES; d++)
      for (int o = 0; o < NOPS; o++)
        for (int in_place = 0; in_place < 2; in_place++) {
          dtl_dtype t = all_dtypes[d];
          dtl_reduce_op op = all_ops[o];
          int salt = 13 + o + pattern;
          void *send = sentinel_buf(total, t);
          void *recv = in_place ? (char *)send + off[rank] * esz(t) : sentinel_buf(rc[rank], t);
          for (size_t i = 0; i < total; i++) put(t, send, i, gen_reduce(t, op, rank, i, salt));
          dtl_status st = dtl_reduce_scatterv(comm, send, recv, rc, t, op);
          if (fp8_refused(t, op)) {
            check_refused(st, "dtl_reduce_scatterv", t, op);
            CHECK(in_place || untouched(recv, rc[rank] * esz(t)), "a refused reduce_scatterv wrote recv");
          } else {
            CHECK(st == DTL_OK, "dtl_reduce_scatterv: %s", dtl_last_error());
            EXPECT_ELEMENTS(t, recv, rc[rank], oracle_reduce(t, op, off[rank] + i, salt),
                            "reduce_scatterv %s %s pattern=%d in_place=%d", dtl_dtype_name(t), dtl_reduce_op_name(op),
                            pattern, in_place);
          }
          if (!in_place) free(recv);
          free(send);
        }
  }
}

/* Element k of the block rank src sends to rank dst. */
static double gen_a2a(dtl_dtype t, int src, int dst, size_t k) {
  int v = (int)(mix((size_t)src, (size_t)dst + 1000, k) % 97);
  return t == DTL_UINT8 ? v : v - 48;
}

static void all_to_all_delivers_block_i_of_rank_j_to_rank_i(void) {
  for (int d = 0; d < NDTYPES; d++)
    for (int k = 0; k < NCOUNTS; k++)
      for (int in_place = 0; in_place < 2; in_place++) {
        dtl_dtype t = all_dtypes[d];
        size_t n = counts[k], total = n * (size_t)size;
        void *send = sentinel_buf(total, t), *recv = in_place ? send : sentinel_buf(total, t);
        for (size_t i = 0; i < total; i++) put(t, send, i, gen_a2a(t, rank, (int)(i / n), i % n));
        CHECK_OK(dtl_all_to_all(comm, send, recv, n, t));
        EXPECT_ELEMENTS(t, recv, total, gen_a2a(t, (int)(i / n), rank, i % n), "all_to_all %s n=%zu in_place=%d",
                        dtl_dtype_name(t), n, in_place);
        if (!in_place) free(recv);
        free(send);
      }
}

/* How many elements rank src sends to rank dst: uneven with zeros (pattern 0), symmetric for the in-place
 * form (pattern 1), all zero (pattern 2). */
static size_t a2av_count(int src, int dst, int pattern) {
  switch (pattern) {
    case 0: return (size_t)((src * 3 + dst * 5 + 1) % 4) + (src == 0 && dst == size - 1 ? 3000 : 0);
    case 1: return (size_t)((src + dst) % 3);
    default: return 0;
  }
}

static void all_to_allv_delivers_uneven_blocks_including_empty_ones(void) {
  size_t sc[64], rc[64], soff[65], roff[65];
  for (int pattern = 0; pattern < 3; pattern++) {
    soff[0] = roff[0] = 0;
    for (int r = 0; r < size; r++) {
      sc[r] = a2av_count(rank, r, pattern);
      rc[r] = a2av_count(r, rank, pattern);
      soff[r + 1] = soff[r] + sc[r];
      roff[r + 1] = roff[r] + rc[r];
    }
    for (int d = 0; d < NDTYPES; d++)
      for (int in_place = 0; in_place < (pattern == 0 ? 1 : 2); in_place++) {
        dtl_dtype t = all_dtypes[d];
        void *send = sentinel_buf(soff[size], t), *recv = in_place ? send : sentinel_buf(roff[size], t);
        for (int r = 0; r < size; r++)
          for (size_t k = 0; k < sc[r]; k++) put(t, send, soff[r] + k, gen_a2a(t, rank, r, k));
        CHECK_OK(dtl_all_to_allv(comm, send, sc, recv, rc, t));
        for (int r = 0; r < size; r++)
          EXPECT_ELEMENTS(t, (char *)recv + roff[r] * esz(t), rc[r], gen_a2a(t, r, rank, i),
                          "all_to_allv %s pattern=%d in_place=%d from rank %d", dtl_dtype_name(t), pattern, in_place, r);
        if (!in_place) free(recv);
        free(send);
      }
  }
}

/* Messages of megabytes make MPI switch to its segmented and ring algorithms, which call the f16/bf16
 * operators on partial segments. (The 8-bit floats' operators work byte by byte, so a segment boundary cannot
 * split an element: the small counts above and test_algorithms.c cover them.) */
static void large_reductions_match_the_oracle_under_segmented_algorithms(void) {
  static const dtl_dtype types[] = {DTL_FLOAT16, DTL_BFLOAT16, DTL_FLOAT32, DTL_INT8};
  for (int d = 0; d < 4; d++)
    for (int o = 0; o < NOPS; o += 2) { /* sum, max, avg */
      dtl_dtype t = types[d];
      dtl_reduce_op op = all_ops[o];
      size_t n = (size_t)1 << 18;
      void *buf = sentinel_buf(n, t);
      for (size_t i = 0; i < n; i++) put(t, buf, i, gen_reduce(t, op, rank, i, 23));
      CHECK_OK(dtl_all_reduce(comm, buf, buf, n, t, op));
      EXPECT_ELEMENTS(t, buf, n, oracle_reduce(t, op, i, 23), "large all_reduce %s %s", dtl_dtype_name(t),
                      dtl_reduce_op_name(op));
      free(buf);
      size_t block = n / (size_t)size;
      void *send = sentinel_buf(block * (size_t)size, t), *recv = sentinel_buf(block, t);
      for (size_t i = 0; i < block * (size_t)size; i++) put(t, send, i, gen_reduce(t, op, rank, i, 24));
      CHECK_OK(dtl_reduce_scatter(comm, send, recv, block, t, op));
      EXPECT_ELEMENTS(t, recv, block, oracle_reduce(t, op, (size_t)rank * block + i, 24), "large reduce_scatter %s %s",
                      dtl_dtype_name(t), dtl_reduce_op_name(op));
      free(send);
      free(recv);
    }
}

/* Max and min of the 8-bit floats are exact: over every code on every rank (NaNs, infinities, both zeros, subnormals),
 * each result element is one of its inputs' codes, and without a NaN among them one of the greatest (least) value.
 * A NaN may win or lose, as for the other floats (which one depends on the order). */
static void fp8_max_and_min_give_one_of_the_inputs_for_every_code(void) {
  const size_t n = 512;
  for (int f = 0; f < 2; f++)
    for (int o = 0; o < 2; o++) {
      dtl_dtype t = f ? DTL_FLOAT8_E5M2 : DTL_FLOAT8_E4M3;
      dtl_reduce_op op = o ? DTL_MIN : DTL_MAX;
      uint8_t in[512], out[512];
      for (size_t i = 0; i < n; i++) in[i] = (uint8_t)(mix((size_t)rank, i, 31) % 256);
      for (size_t i = 0; i < n / 2; i++) in[i] = (uint8_t)(i + (size_t)rank * 37); /* every code on every rank */
      memset(out, SENTINEL, sizeof out);
      CHECK_OK(dtl_all_reduce(comm, in, out, n, t, op));
      for (size_t i = 0; i < n; i++) {
        bool nan = false, found = false;
        double best = 0;
        for (int r = 0; r < size; r++) {
          uint8_t c = r == rank ? in[i] : (uint8_t)(i < n / 2 ? i + (size_t)r * 37 : mix((size_t)r, i, 31) % 256);
          double v = get(t, &c, 0);
          nan |= isnan(v);
          if (r == 0 || (op == DTL_MAX ? v > best : v < best)) best = v; /* (meaningless with a NaN) */
        }
        for (int r = 0; r < size && !found; r++) {
          uint8_t c = (uint8_t)(i < n / 2 ? i + (size_t)r * 37 : mix((size_t)r, i, 31) % 256);
          found = c == out[i] && (nan || get(t, &c, 0) == best);
        }
        CHECK(found, "%s %s element %zu: code 0x%02x is not %s input", dtl_dtype_name(t), dtl_reduce_op_name(op), i,
              out[i], nan ? "an" : "the winning");
        if (!found) break;
      }
    }
}

/* Sums, products and averages of the 8-bit floats are refused by every reducing call, blocking or not, on every
 * rank, with the reason, and write nothing (no request either). */
static void fp8_sums_products_and_averages_are_refused_by_every_reducing_call(void) {
  static const dtl_reduce_op ops[] = {DTL_SUM, DTL_PROD, DTL_AVG};
  const size_t n = 3;
  for (int f = 0; f < 2; f++)
    for (int o = 0; o < 3; o++) {
      dtl_dtype t = f ? DTL_FLOAT8_E5M2 : DTL_FLOAT8_E4M3;
      dtl_reduce_op op = ops[o];
      uint8_t send[3 * 64], recv[3 * 64];
      size_t counts[64];
      for (int r = 0; r < size; r++) counts[r] = n;
      memset(send, 0x38, sizeof send); /* 1.0 in e4m3 */
      memset(recv, SENTINEL, sizeof recv);
      dtl_request *req = (dtl_request *)&req; /* a value no start would store */
      check_refused(dtl_all_reduce(comm, send, recv, n, t, op), "dtl_all_reduce", t, op);
      check_refused(dtl_reduce(comm, send, recv, n, t, op, 0), "dtl_reduce", t, op);
      check_refused(dtl_reduce_scatter(comm, send, recv, n, t, op), "dtl_reduce_scatter", t, op);
      check_refused(dtl_reduce_scatterv(comm, send, recv, counts, t, op), "dtl_reduce_scatterv", t, op);
      check_refused(dtl_all_reduce_async(comm, send, recv, n, t, op, &req), "dtl_all_reduce_async", t, op);
      check_refused(dtl_reduce_scatter_async(comm, send, recv, n, t, op, &req), "dtl_reduce_scatter_async", t, op);
      CHECK(req == (dtl_request *)&req, "a refused start stored a request");
      CHECK(untouched(recv, sizeof recv), "a refused reduction wrote recv");
    }
}

/* A rank whose receive side is empty may pass the send pointer as recv (and one whose send side is empty
 * the recv pointer as send): no byte overlaps, so it is an ordinary exchange, not the in-place form, and
 * the other ranks still get this rank's blocks. Rank 0 receives nothing, the last rank sends nothing. */
static size_t one_sided_count(int src, int dst) { return dst == 0 || src == size - 1 ? 0 : (size_t)((src + dst) % 3 + 1); }

static void all_to_allv_with_an_empty_side_sharing_the_other_pointer_is_not_in_place(void) {
  size_t sc[64], rc[64], soff[65], roff[65];
  soff[0] = roff[0] = 0;
  for (int r = 0; r < size; r++) {
    sc[r] = one_sided_count(rank, r);
    rc[r] = one_sided_count(r, rank);
    soff[r + 1] = soff[r] + sc[r];
    roff[r + 1] = roff[r] + rc[r];
  }
  for (int d = 0; d < NDTYPES; d++) {
    dtl_dtype t = all_dtypes[d];
    void *send = sentinel_buf(soff[size], t), *recv = sentinel_buf(roff[size], t);
    for (int r = 0; r < size; r++)
      for (size_t k = 0; k < sc[r]; k++) put(t, send, soff[r] + k, gen_a2a(t, rank, r, k));
    const void *s = soff[size] ? send : recv;
    void *out = roff[size] ? recv : send;
    CHECK_OK(dtl_all_to_allv(comm, s, sc, out, rc, t));
    for (int r = 0; r < size; r++)
      EXPECT_ELEMENTS(t, (char *)out + roff[r] * esz(t), rc[r], gen_a2a(t, r, rank, i),
                      "one-sided all_to_allv %s from rank %d", dtl_dtype_name(t), r);
    free(send);
    free(recv);
  }
}

/* --- point to point -------------------------------------------------------------------------------------------- */
/* Every rank shifts its block to the next at once: dtl_sendrecv needs no ordering of the ranks (a ring of
 * one is a local copy). */
static void send_recv_ring_passes_each_block_to_the_next_rank(void) {
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  for (int d = 0; d < NDTYPES; d++)
    for (int k = 0; k < NCOUNTS; k++) {
      dtl_dtype t = all_dtypes[d];
      size_t n = counts[k] * 10;
      void *out = sentinel_buf(n, t), *in = sentinel_buf(n, t);
      for (size_t i = 0; i < n; i++) put(t, out, i, gen_move(t, rank, i, 17));
      CHECK_OK(dtl_sendrecv(comm, out, n, next, in, n, prev, t));
      EXPECT_ELEMENTS(t, in, n, gen_move(t, prev, i, 17), "ring %s n=%zu", dtl_dtype_name(t), n);
      free(out);
      free(in);
    }
}

/* --- nonblocking ------------------------------------------------------------------------------------------------ */
/* Polls every request with dtl_test until all report done, without dtl_wait: each call returns DTL_OK and
 * done 0 or 1, and a request once done stays done. Returns the number of polling rounds. */
static long poll_until_done(dtl_request **req, int n) {
  int done[8] = {0}, left = n;
  long rounds = 0;
  while (left > 0) {
    rounds++;
    for (int j = 0; j < n; j++) {
      int d = -1;
      dtl_status st = dtl_test(req[j], &d);
      CHECK(st == DTL_OK, "dtl_test(req[%d]) -> %s: %s", j, dtl_status_name(st), dtl_last_error());
      if (st != DTL_OK) return rounds; /* the watchdog would otherwise catch an endless loop */
      CHECK(d == 0 || d == 1, "dtl_test(req[%d]) stored done=%d", j, d);
      CHECK(!done[j] || d == 1, "req[%d] reported done, then not done", j);
      if (d == 1 && !done[j]) done[j] = 1, left--;
    }
  }
  return rounds;
}

/* Six operations in flight at once; while they run, this rank does its own work (the all-reduce's expected
 * result); then dtl_test polls them to completion and dtl_wait (in reverse order) finishes them. The results
 * match the blocking oracle, including DTL_AVG's division and the in-place reduce-scatter's move, which
 * happen in dtl_wait. */
static void nonblocking_collectives_run_beside_local_work_and_complete_through_test_then_wait(void) {
  for (int d = 0; d < NDTYPES; d++) {
    dtl_dtype t = all_dtypes[d];
    size_t n = 1500, total = n * (size_t)size, es = esz(t);
    size_t gv[64], goff[65], sc[64], rc[64], soff[65], roff[65];
    goff[0] = soff[0] = roff[0] = 0;
    for (int r = 0; r < size; r++) {
      gv[r] = uneven_count(r, 0);
      goff[r + 1] = goff[r] + gv[r];
      sc[r] = a2av_count(rank, r, 0);
      rc[r] = a2av_count(r, rank, 0);
      soff[r + 1] = soff[r] + sc[r];
      roff[r + 1] = roff[r] + rc[r];
    }
    void *ar_send = sentinel_buf(n, t), *ar_recv = sentinel_buf(n, t);
    void *ag_send = sentinel_buf(n, t), *ag_recv = sentinel_buf(total, t);
    void *agv_recv = sentinel_buf(goff[size], t);
    void *rs_buf = sentinel_buf(total, t);
    void *a2a_send = sentinel_buf(total, t), *a2a_recv = sentinel_buf(total, t);
    void *a2av_send = sentinel_buf(soff[size], t), *a2av_recv = sentinel_buf(roff[size], t);
    double *ar_want = malloc(sizeof(double) * n);
    /* avg and sum, whose division and in-place move happen in dtl_wait; the 8-bit floats max and min */
    dtl_reduce_op ar_op = is_fp8(t) ? DTL_MAX : DTL_AVG, rs_op = is_fp8(t) ? DTL_MIN : DTL_SUM;
    for (size_t i = 0; i < n; i++) put(t, ar_send, i, gen_reduce(t, ar_op, rank, i, 19));
    for (size_t i = 0; i < n; i++) put(t, ag_send, i, gen_move(t, rank, i, 20));
    for (size_t i = 0; i < gv[rank]; i++) put(t, (char *)agv_recv + goff[rank] * es, i, gen_move(t, rank, i, 21));
    for (size_t i = 0; i < total; i++) put(t, rs_buf, i, gen_reduce(t, rs_op, rank, i, 22));
    for (size_t i = 0; i < total; i++) put(t, a2a_send, i, gen_a2a(t, rank, (int)(i / n), i % n));
    for (int r = 0; r < size; r++)
      for (size_t k = 0; k < sc[r]; k++) put(t, a2av_send, soff[r] + k, gen_a2a(t, rank, r, k));

    dtl_request *req[6] = {NULL};
    CHECK_OK(dtl_all_reduce_async(comm, ar_send, ar_recv, n, t, ar_op, &req[0]));
    CHECK_OK(dtl_all_gather_async(comm, ag_send, ag_recv, n, t, &req[1]));
    CHECK_OK(dtl_all_gatherv_async(comm, (char *)agv_recv + goff[rank] * es, gv[rank], agv_recv, gv, t, &req[2]));
    CHECK_OK(dtl_reduce_scatter_async(comm, rs_buf, (char *)rs_buf + (size_t)rank * n * es, n, t, rs_op, &req[3]));
    CHECK_OK(dtl_all_to_all_async(comm, a2a_send, a2a_recv, n, t, &req[4]));
    CHECK_OK(dtl_all_to_allv_async(comm, a2av_send, sc, a2av_recv, rc, t, &req[5]));
    /* Local work while the operations are in flight: it touches none of their buffers. */
    for (size_t i = 0; i < n; i++) ar_want[i] = oracle_reduce(t, ar_op, i, 19);
    bool started = true;
    for (int j = 0; j < 6; j++) started = started && req[j];
    if (started) poll_until_done(req, 6);
    for (int j = 5; j >= 0; j--)
      if (req[j]) CHECK_OK(dtl_wait(req[j]));

    const char *tn = dtl_dtype_name(t);
    EXPECT_ELEMENTS(t, ar_recv, n, ar_want[i], "all_reduce_async %s %s", tn, dtl_reduce_op_name(ar_op));
    EXPECT_ELEMENTS(t, ag_recv, total, gen_move(t, (int)(i / n), i % n, 20), "all_gather_async %s", tn);
    for (int r = 0; r < size; r++)
      EXPECT_ELEMENTS(t, (char *)agv_recv + goff[r] * es, gv[r], gen_move(t, r, i, 21), "all_gatherv_async %s", tn);
    EXPECT_ELEMENTS(t, (char *)rs_buf + (size_t)rank * n * es, n, oracle_reduce(t, rs_op, (size_t)rank * n + i, 22),
                    "reduce_scatter_async %s %s in place", tn, dtl_reduce_op_name(rs_op));
    EXPECT_ELEMENTS(t, a2a_recv, total, gen_a2a(t, (int)(i / n), rank, i % n), "all_to_all_async %s", tn);
    for (int r = 0; r < size; r++)
      EXPECT_ELEMENTS(t, (char *)a2av_recv + roff[r] * es, rc[r], gen_a2a(t, r, rank, i), "all_to_allv_async %s", tn);
    void *bufs[] = {ar_send, ar_recv, ag_send, ag_recv, agv_recv, rs_buf, a2a_send, a2a_recv, a2av_send, a2av_recv, ar_want};
    for (size_t j = 0; j < sizeof bufs / sizeof *bufs; j++) free(bufs[j]);
  }
}

/* Rank 0 starts an all-reduce while every other rank is held back (waiting for rank 0's go-ahead, sent on
 * MPI_COMM_WORLD, outside the dtl communicator): the operation cannot complete, and dtl_test must say so
 * every time. Once released, the others start it too, every rank polls to done, and the sum is right. */
static void test_reports_not_done_while_a_peer_has_not_started(void) {
  int64_t mine[3] = {rank + 1, 10 * rank, -rank}, sum[3] = {-1, -1, -1};
  dtl_request *req = NULL;
  int go = 1;
  if (rank != 0) MPI_Recv(&go, 1, MPI_INT, 0, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  CHECK_OK(dtl_all_reduce_async(comm, mine, sum, 3, DTL_INT64, DTL_SUM, &req));
  if (rank == 0 && size > 1) {
    int early_done = 0;
    for (int poll = 0; req && poll < 200; poll++) {
      int d = -1;
      CHECK_OK(dtl_test(req, &d));
      CHECK(d == 0 || d == 1, "dtl_test stored done=%d", d);
      early_done += d == 1;
    }
    CHECK(early_done == 0, "dtl_test reported done %d times before any peer had started", early_done);
    for (int r = 1; r < size; r++) MPI_Send(&go, 1, MPI_INT, r, 77, MPI_COMM_WORLD);
  }
  if (!req) return;
  poll_until_done(&req, 1);
  CHECK_OK(dtl_wait(req));
  int64_t want[3] = {0, 0, 0};
  for (int r = 0; r < size; r++) want[0] += r + 1, want[1] += 10 * r, want[2] -= r;
  for (int i = 0; i < 3; i++)
    CHECK(sum[i] == want[i], "sum[%d] = %lld (expected %lld)", i, (long long)sum[i], (long long)want[i]);
}

/* --- communicators ---------------------------------------------------------------------------------------------- */
static void split_makes_independent_communicators_by_color(void) {
  dtl_comm *sub = NULL;
  CHECK_OK(dtl_comm_split(comm, rank % 2, -rank, &sub)); /* key -rank: reversed order inside each color */
  if (!sub) return;
  int members = (size - rank % 2 + 1) / 2;
  CHECK(dtl_comm_size(sub) == members, "split size %d (expected %d)", dtl_comm_size(sub), members);
  int higher = 0; /* ranks of my color above me come first */
  for (int r = rank + 2; r < size; r += 2) higher++;
  CHECK(dtl_comm_rank(sub) == higher, "split rank %d (expected %d)", dtl_comm_rank(sub), higher);
  int64_t mine = rank, sum = -1, want = 0;
  for (int r = rank % 2; r < size; r += 2) want += r;
  CHECK_OK(dtl_all_reduce(sub, &mine, &sum, 1, DTL_INT64, DTL_SUM));
  CHECK(sum == want, "sum over color %d = %lld (expected %lld)", rank % 2, (long long)sum, (long long)want);
  CHECK(strcmp(dtl_comm_backend_name(sub), "mpi") == 0, "backend %s", dtl_comm_backend_name(sub));
  CHECK(dtl_comm_mpi_handle(sub) != MPI_COMM_NULL, "no MPI handle");
  dtl_comm_destroy(sub);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  if (dt_size > 64) return dt_skip("the test's count tables hold at most 64 ranks");
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &comm));
  rank = dtl_comm_rank(comm);
  size = dtl_comm_size(comm);
  double t0 = MPI_Wtime();
  RUN(broadcast_copies_root_buffer_to_every_rank);
  RUN(scatter_gives_rank_r_block_r_and_ignores_send_elsewhere);
  RUN(gather_concatenates_in_rank_order_on_root_only);
  RUN(reduce_combines_every_rank_on_root_only);
  RUN(all_gather_concatenates_in_rank_order_everywhere);
  RUN(all_gatherv_packs_uneven_blocks_including_empty_ones);
  RUN(all_reduce_gives_every_rank_the_reduction);
  RUN(reduce_scatter_gives_rank_r_block_r_of_the_reduction);
  RUN(reduce_scatterv_gives_rank_r_its_uneven_block_including_empty_ones);
  RUN(all_to_all_delivers_block_i_of_rank_j_to_rank_i);
  RUN(all_to_allv_delivers_uneven_blocks_including_empty_ones);
  RUN(all_to_allv_with_an_empty_side_sharing_the_other_pointer_is_not_in_place);
  RUN(large_reductions_match_the_oracle_under_segmented_algorithms);
  RUN(fp8_max_and_min_give_one_of_the_inputs_for_every_code);
  RUN(fp8_sums_products_and_averages_are_refused_by_every_reducing_call);
  RUN(send_recv_ring_passes_each_block_to_the_next_rank);
  RUN(nonblocking_collectives_run_beside_local_work_and_complete_through_test_then_wait);
  RUN(test_reports_not_done_while_a_peer_has_not_started);
  RUN(split_makes_independent_communicators_by_color);
  if (rank == 0) printf("np=%d: %.2f s\n", size, MPI_Wtime() - t0);
  dtl_comm_destroy(comm);
  return dt_finish();
}

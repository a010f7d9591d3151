/* SPDX-License-Identifier: Apache-2.0 */
/* The MPI transport's algorithms, each forced with DTL_ALGO, and its path for counts beyond INT_MAX (a limit
 * lowered to a few elements with the test hook dtl__mpi_set_limit, so that it runs on small buffers): every
 * collective, every dtype and reduce op, uneven and empty blocks, in-place and nonblocking forms, against an
 * oracle that every rank computes on its own from one generator.
 *
 * The reproducibility promise (<dtl/mpi.h>): for floating SUM, PROD and AVG the oracle is the rank-order fold,
 * ((x0 op x1) op x2) ..., each step rounded to the dtype (f16/bf16 in f32), and the inputs are not exact, so
 * the order shows in the low bits; every dtl algorithm must match it bitwise, and so must the MPI call wherever
 * the order cannot matter (integers, MAX, MIN, two ranks). The 8-bit floats reduce with MAX and MIN only (the
 * other ops are refused: test_collectives.c), on codes that are neither NaN nor zero, so that no two inputs of one
 * value differ in their bits. Data collectives move hashed bytes. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "comm/mpi_algo.h"
#include "common/alloc.h"
#include "common/half.h"
#include "dtl_test.h"

static int rank, size;

/* --- the communicators under test ---------------------------------------------------------------------------- */
typedef struct {
  const char *name, *algo; /* DTL_ALGO */
  size_t limit;            /* 0: INT_MAX */
  bool rank_order;         /* every reduction is the rank-order fold */
  dtl_comm *c;
} variant;

static variant variants[] = {
    {"mpi", "all_reduce:mpi,reduce_scatter:mpi,all_gather:mpi,all_to_all:mpi,all_to_allv:mpi,reduce:mpi", 0, false, 0},
    {"dtl A", "all_reduce:rs_ag,reduce_scatter:a2a_fold,all_gather:direct,all_to_all:direct,all_to_allv:direct,"
              "reduce:rs_gather", 0, true, 0},
    {"dtl B", "all_reduce:ag_fold,reduce_scatter:a2a_fold,all_gather:ring,all_to_all:direct,all_to_allv:direct,"
              "reduce:gather_fold", 0, true, 0},
    {"dtl C", "all_reduce:rs_ag,reduce_scatter:a2a_fold,all_gather:direct,reduce:chain", 0, true, 0},
    {"table", NULL, 0, false, 0},
    /* pieces of at most 3 elements: large calls' paths (the MPI call in pieces, or a dtl algorithm instead) */
    {"mpi, limit 3", "all_reduce:mpi,reduce_scatter:mpi,all_gather:mpi,all_to_all:mpi,all_to_allv:direct,reduce:mpi",
     3, false, 0},
    {"dtl A, limit 3", "all_reduce:rs_ag,reduce_scatter:a2a_fold,all_gather:direct,all_to_all:direct,"
                       "all_to_allv:direct,reduce:rs_gather", 3, true, 0},
    {"dtl C, limit 3", "all_reduce:rs_ag,reduce:chain", 3, true, 0},
    {"dtl B, limit 5", "all_reduce:ag_fold,reduce_scatter:a2a_fold,all_gather:ring,all_to_all:direct,"
                       "all_to_allv:direct,reduce:gather_fold", 5, true, 0},
};
#define NVARIANTS ((int)(sizeof variants / sizeof variants[0]))

static const dtl_dtype all_dtypes[] = {DTL_FLOAT32, DTL_FLOAT64, DTL_FLOAT16,     DTL_BFLOAT16,   DTL_INT8,
                                       DTL_UINT8,   DTL_INT32,   DTL_INT64, DTL_FLOAT8_E4M3, DTL_FLOAT8_E5M2};
#define NDTYPES ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))
static bool fp8(dtl_dtype t) { return t == DTL_FLOAT8_E4M3 || t == DTL_FLOAT8_E5M2; }
static const dtl_reduce_op all_ops[] = {DTL_SUM, DTL_PROD, DTL_MAX, DTL_MIN, DTL_AVG};

/* --- every MPI call within the limit ----------------------------------------------------------------------------
 * A lowered limit only shows the large-call paths if no MPI call on that communicator moves more: these
 * profiling wrappers (the program's MPI_Xxx, calling PMPI_Xxx) check every count and displacement the transport
 * passes on the watched communicator. */
static MPI_Comm watched = MPI_COMM_NULL;
static size_t watched_limit;
static void watch(MPI_Comm c, long long v, const char *fn) {
  if (watched != MPI_COMM_NULL && c == watched)
    CHECK(v >= 0 && (size_t)v <= watched_limit, "%s was passed %lld, beyond the limit %zu", fn, v, watched_limit);
}
static void watch_all(MPI_Comm c, const int *v, const int *d, const char *fn) {
  int p = 0;
  if (watched == MPI_COMM_NULL || c != watched) return;
  PMPI_Comm_size(c, &p);
  for (int i = 0; i < p; i++) watch(c, v[i], fn), watch(c, d ? d[i] : 0, fn);
}
int MPI_Send(const void *b, int n, MPI_Datatype t, int d, int g, MPI_Comm c) {
  watch(c, n, "MPI_Send");
  return PMPI_Send(b, n, t, d, g, c);
}
int MPI_Recv(void *b, int n, MPI_Datatype t, int s, int g, MPI_Comm c, MPI_Status *st) {
  watch(c, n, "MPI_Recv");
  return PMPI_Recv(b, n, t, s, g, c, st);
}
int MPI_Isend(const void *b, int n, MPI_Datatype t, int d, int g, MPI_Comm c, MPI_Request *r) {
  watch(c, n, "MPI_Isend");
  return PMPI_Isend(b, n, t, d, g, c, r);
}
int MPI_Irecv(void *b, int n, MPI_Datatype t, int s, int g, MPI_Comm c, MPI_Request *r) {
  watch(c, n, "MPI_Irecv");
  return PMPI_Irecv(b, n, t, s, g, c, r);
}
int MPI_Sendrecv(const void *sb, int sn, MPI_Datatype st, int d, int sg, void *rb, int rn, MPI_Datatype rt, int s,
                 int rg, MPI_Comm c, MPI_Status *status) {
  watch(c, sn, "MPI_Sendrecv");
  watch(c, rn, "MPI_Sendrecv");
  return PMPI_Sendrecv(sb, sn, st, d, sg, rb, rn, rt, s, rg, c, status);
}
int MPI_Sendrecv_replace(void *b, int n, MPI_Datatype t, int d, int sg, int s, int rg, MPI_Comm c, MPI_Status *st) {
  watch(c, n, "MPI_Sendrecv_replace");
  return PMPI_Sendrecv_replace(b, n, t, d, sg, s, rg, c, st);
}
int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  watch(c, n, "MPI_Bcast");
  return PMPI_Bcast(b, n, t, root, c);
}
int MPI_Reduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c) {
  watch(c, n, "MPI_Reduce");
  return PMPI_Reduce(s, r, n, t, op, root, c);
}
int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  watch(c, n, "MPI_Allreduce");
  return PMPI_Allreduce(s, r, n, t, op, c);
}
int MPI_Iallreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *q) {
  watch(c, n, "MPI_Iallreduce");
  return PMPI_Iallreduce(s, r, n, t, op, c, q);
}
int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c) {
  watch(c, sn, "MPI_Allgather");
  return PMPI_Allgather(s, sn, st, r, rn, rt, c);
}
int MPI_Iallgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c,
                   MPI_Request *q) {
  watch(c, sn, "MPI_Iallgather");
  return PMPI_Iallgather(s, sn, st, r, rn, rt, c, q);
}
int MPI_Allgatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *rd, MPI_Datatype rt,
                   MPI_Comm c) {
  watch_all(c, rn, rd, "MPI_Allgatherv");
  return PMPI_Allgatherv(s, sn, st, r, rn, rd, rt, c);
}
int MPI_Alltoall(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c) {
  watch(c, sn, "MPI_Alltoall");
  return PMPI_Alltoall(s, sn, st, r, rn, rt, c);
}
int MPI_Alltoallv(const void *s, const int *sn, const int *sd, MPI_Datatype st, void *r, const int *rn,
                  const int *rd, MPI_Datatype rt, MPI_Comm c) {
  watch_all(c, sn, sd, "MPI_Alltoallv");
  watch_all(c, rn, rd, "MPI_Alltoallv");
  return PMPI_Alltoallv(s, sn, sd, st, r, rn, rd, rt, c);
}
int MPI_Reduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  watch(c, n, "MPI_Reduce_scatter_block");
  return PMPI_Reduce_scatter_block(s, r, n, t, op, c);
}
int MPI_Reduce_scatter(const void *s, void *r, const int *n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  watch_all(c, n, NULL, "MPI_Reduce_scatter");
  return PMPI_Reduce_scatter(s, r, n, t, op, c);
}
int MPI_Scatter(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm c) {
  watch(c, rn, "MPI_Scatter");
  return PMPI_Scatter(s, sn, st, r, rn, rt, root, c);
}
int MPI_Gather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm c) {
  watch(c, sn, "MPI_Gather");
  return PMPI_Gather(s, sn, st, r, rn, rt, root, c);
}

/* --- inputs and the oracle --------------------------------------------------------------------------------------- */
static uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9e3779b97f4a7c15ull + b + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Rank q's contribution to element gi: reals with many significant bits over a few binades (products near 1),
 * small integers for the integer types (their sums and products wrap like MPI's). */
static double real_value(int q, size_t gi, dtl_reduce_op op) {
  uint64_t z = mix((uint64_t)q + 1, gi);
  if (op == DTL_PROD) return 0.75 + (double)(z % 100003) / 200006.0;
  return ((double)(z % 2000003) - 1000001.0) / 997.0 * ldexp(1.0, (int)((z >> 32) % 7) - 3);
}
static int64_t int_value(int q, size_t gi) { return (int64_t)(mix((uint64_t)q + 7, gi) % 41) - 20; }
/* A code of an 8-bit float that is neither a NaN nor a zero (e4m3: 0x01..0x7e and 0x81..0xfe; e5m2 up to 0x7c). */
static uint8_t f8_code(dtl_dtype t, int q, size_t gi) {
  unsigned top = t == DTL_FLOAT8_E4M3 ? 0x7e : 0x7c, z = (unsigned)(mix((uint64_t)q + 3, gi) % (2 * top));
  return (uint8_t)(z < top ? z + 1 : 0x80 + z - top + 1);
}

static void put_input(dtl_dtype t, dtl_reduce_op op, void *buf, size_t i, int q, size_t gi) {
  double r = real_value(q, gi, op);
  int64_t v = int_value(q, gi);
  switch (t) {
    case DTL_FLOAT32: ((float *)buf)[i] = (float)r; break;
    case DTL_FLOAT64: ((double *)buf)[i] = r; break;
    case DTL_FLOAT16: ((uint16_t *)buf)[i] = dtl__f32_to_f16((float)r); break;
    case DTL_BFLOAT16: ((uint16_t *)buf)[i] = dtl__f32_to_bf16((float)r); break;
    case DTL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DTL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(v + 20); break;
    case DTL_INT32: ((int32_t *)buf)[i] = (int32_t)(v * 100003); break;
    case DTL_INT64: ((int64_t *)buf)[i] = v * 1000000007; break;
    case DTL_FLOAT8_E4M3: /* fall through */
    case DTL_FLOAT8_E5M2: ((uint8_t *)buf)[i] = f8_code(t, q, gi); break;
  }
}

/* The documented result for element gi, into out (one element): the rank-order fold of the inputs, then
 * DTL_AVG's one division. */
#define FOLD_FLOAT(T, to, from)                                                                  \
  {                                                                                              \
    T acc, x;                                                                                    \
    put_input(t, op, &acc, 0, 0, gi);                                                            \
    for (int q = 1; q < size; q++) {                                                             \
      put_input(t, op, &x, 0, q, gi);                                                            \
      float a = to(acc), b = to(x);                                                              \
      acc = from(op == DTL_PROD ? b * a : op == DTL_MAX ? (b > a ? b : a) : op == DTL_MIN ? (b < a ? b : a) : b + a); \
    }                                                                                            \
    if (op == DTL_AVG) acc = from(to(acc) / (float)size);                                        \
    memcpy(out, &acc, sizeof acc);                                                               \
  }
#define FOLD_PLAIN(T, U)                                                                           \
  {                                                                                                \
    T acc, x;                                                                                      \
    put_input(t, op, &acc, 0, 0, gi);                                                              \
    for (int q = 1; q < size; q++) {                                                               \
      put_input(t, op, &x, 0, q, gi);                                                              \
      acc = op == DTL_PROD ? (T)((U)acc * (U)x) : op == DTL_MAX ? (x > acc ? x : acc)              \
            : op == DTL_MIN ? (x < acc ? x : acc) : (T)((U)acc + (U)x);                             \
    }                                                                                              \
    if (op == DTL_AVG) acc = (T)(acc / (T)size);                                                   \
    memcpy(out, &acc, sizeof acc);                                                                 \
  }
static float same_f(float v) { return v; }
static double same_d(double v) { return v; }
static void oracle(dtl_dtype t, dtl_reduce_op op, size_t gi, void *out) {
  switch (t) {
    case DTL_FLOAT32: FOLD_FLOAT(float, same_f, same_f) break;
    case DTL_FLOAT64: { /* in double, not f32 */
      double acc, x;
      put_input(t, op, &acc, 0, 0, gi);
      for (int q = 1; q < size; q++) {
        put_input(t, op, &x, 0, q, gi);
        acc = op == DTL_PROD ? acc * x : op == DTL_MAX ? (x > acc ? x : acc) : op == DTL_MIN ? (x < acc ? x : acc) : acc + x;
      }
      if (op == DTL_AVG) acc = same_d(acc) / size;
      memcpy(out, &acc, sizeof acc);
      break;
    }
    case DTL_FLOAT16: FOLD_FLOAT(uint16_t, dtl__f16_to_f32, dtl__f32_to_f16) break;
    case DTL_BFLOAT16: FOLD_FLOAT(uint16_t, dtl__bf16_to_f32, dtl__f32_to_bf16) break;
    case DTL_INT8: FOLD_PLAIN(int8_t, uint8_t) break;
    case DTL_UINT8: FOLD_PLAIN(uint8_t, uint8_t) break;
    case DTL_INT32: FOLD_PLAIN(int32_t, uint32_t) break;
    case DTL_INT64: FOLD_PLAIN(int64_t, uint64_t) break;
    case DTL_FLOAT8_E4M3: FOLD_FLOAT(uint8_t, dtl__f8e4m3_to_f32, dtl__f32_to_f8e4m3) break; /* max and min only */
    case DTL_FLOAT8_E5M2: FOLD_FLOAT(uint8_t, dtl__f8e5m2_to_f32, dtl__f32_to_f8e5m2) break;
  }
}

static double as_double(dtl_dtype t, const void *p) {
  uint16_t h;
  memcpy(&h, p, sizeof h);
  switch (t) {
    case DTL_FLOAT32: return *(const float *)p;
    case DTL_FLOAT64: return *(const double *)p;
    case DTL_FLOAT16: return dtl__f16_to_f32(h);
    default: return dtl__bf16_to_f32(h);
  }
}

/* Whether the order of the ranks' contributions can change the result (the "exact" class). */
static bool order_matters(dtl_dtype t, dtl_reduce_op op) {
  bool fl = t == DTL_FLOAT32 || t == DTL_FLOAT64 || t == DTL_FLOAT16 || t == DTL_BFLOAT16;
  return fl && size >= 3 && (op == DTL_SUM || op == DTL_PROD || op == DTL_AVG);
}

/* Checks n result elements (global indices gi0 + i) bitwise against the oracle, or, for the MPI call on an
 * order-dependent reduction, within the rounding that another order can make. */
static void check_reduced(const variant *v, const char *what, dtl_dtype t, dtl_reduce_op op, const void *got,
                          size_t n, size_t gi0) {
  size_t es = dtl_dtype_size(t);
  bool exact = v->rank_order || !order_matters(t, op);
  for (size_t i = 0; i < n; i++) {
    unsigned char want[8] = {0};
    oracle(t, op, gi0 + i, want);
    const unsigned char *g = (const unsigned char *)got + i * es;
    if (exact) {
      CHECK(!memcmp(g, want, es), "%s %s %s %s: element %zu differs from the rank-order fold", v->name, what,
            dtl_dtype_name(t), dtl_reduce_op_name(op), gi0 + i);
    } else { /* within the roundings of another order: one per step, each at most an ulp of the partial sums */
      double a = as_double(t, g), b = as_double(t, want), sum_abs = 0;
      for (int q = 0; q < size; q++) {
        unsigned char x[8] = {0};
        put_input(t, op, x, 0, q, gi0 + i);
        sum_abs += fabs(as_double(t, x));
      }
      double ulp = t == DTL_FLOAT64 ? 0x1p-52 : t == DTL_FLOAT32 ? 0x1p-23 : t == DTL_FLOAT16 ? 0x1p-10 : 0x1p-7;
      double bound = op == DTL_PROD ? 2 * size * ulp * fabs(b) : 2 * size * ulp * sum_abs;
      CHECK(fabs(a - b) <= bound, "%s %s %s %s: element %zu: %.9g, oracle %.9g", v->name, what, dtl_dtype_name(t),
            dtl_reduce_op_name(op), gi0 + i, a, b);
    }
    if (dt_failures > 8) return;
  }
}

/* --- reductions -------------------------------------------------------------------------------------------------- */
/* all_reduce (plain, in place, nonblocking), reduce_scatter (plain, in place, nonblocking), reduce_scatterv
 * (uneven, with empty blocks), reduce (in place on root): each against the oracle. */
static void reductions_match_the_rank_order_fold(variant *v, size_t n) {
  dtl_comm *c = v->c;
  size_t p = (size_t)size, counts[64], total = 0, before = 0;
  for (int q = 0; q < size; q++) {
    counts[q] = (size_t)(q * 7 + 3) % (n + 1) * (q % 3 != 1); /* zeros and uneven */
    if (q < rank) before += counts[q];
    total += counts[q];
  }
  for (int ti = 0; ti < NDTYPES; ti++)
    for (int oi = 0; oi < 5; oi++) {
      dtl_dtype t = all_dtypes[ti];
      dtl_reduce_op op = all_ops[oi];
      if (fp8(t) && op != DTL_MAX && op != DTL_MIN) continue;
      size_t es = dtl_dtype_size(t), big = n * p > total ? n * p : total;
      unsigned char *in = malloc(big * es + 8), *out = malloc(big * es + 8);
      /* all_reduce: n elements, global index = element */
      for (size_t i = 0; i < n; i++) put_input(t, op, in, i, rank, i);
      memset(out, 0x5a, n * es + 8);
      CHECK_OK(dtl_all_reduce(c, in, out, n, t, op));
      check_reduced(v, "all_reduce", t, op, out, n, 0);
      CHECK_OK(dtl_all_reduce(c, in, in, n, t, op));
      check_reduced(v, "all_reduce in place", t, op, in, n, 0);
      dtl_request *req = NULL;
      for (size_t i = 0; i < n; i++) put_input(t, op, in, i, rank, i);
      CHECK_OK(dtl_all_reduce_async(c, in, out, n, t, op, &req));
      if (req) CHECK_OK(dtl_wait(req));
      check_reduced(v, "all_reduce_async", t, op, out, n, 0);
      /* reduce_scatter: n per rank; this rank's block is elements rank*n .. */
      for (size_t i = 0; i < n * p; i++) put_input(t, op, in, i, rank, i);
      CHECK_OK(dtl_reduce_scatter(c, in, out, n, t, op));
      check_reduced(v, "reduce_scatter", t, op, out, n, (size_t)rank * n);
      req = NULL;
      CHECK_OK(dtl_reduce_scatter_async(c, in, out, n, t, op, &req));
      if (req) CHECK_OK(dtl_wait(req));
      check_reduced(v, "reduce_scatter_async", t, op, out, n, (size_t)rank * n);
      CHECK_OK(dtl_reduce_scatter(c, in, in + (size_t)rank * n * es, n, t, op));
      check_reduced(v, "reduce_scatter in place", t, op, in + (size_t)rank * n * es, n, (size_t)rank * n);
      /* reduce_scatterv */
      for (size_t i = 0; i < total; i++) put_input(t, op, in, i, rank, i);
      CHECK_OK(dtl_reduce_scatterv(c, in, out, counts, t, op));
      check_reduced(v, "reduce_scatterv", t, op, out, counts[rank], before);
      /* reduce to the last rank, in place there */
      int root = size - 1;
      for (size_t i = 0; i < n; i++) put_input(t, op, in, i, rank, i);
      CHECK_OK(dtl_reduce(c, in, rank == root ? in : NULL, n, t, op, root));
      if (rank == root) check_reduced(v, "reduce in place", t, op, in, n, 0);
      free(in);
      free(out);
      if (dt_failures > 8) return;
    }
}

/* --- data collectives --------------------------------------------------------------------------------------------- */
static unsigned char byte_of(int q, size_t i, size_t b) { return (unsigned char)(mix((uint64_t)q + 99, i) >> (8 * (b % 8))); }
static void fill(unsigned char *buf, size_t n, size_t es, int q, size_t gi0) {
  for (size_t i = 0; i < n; i++)
    for (size_t b = 0; b < es; b++) buf[i * es + b] = byte_of(q, gi0 + i, b);
}
static bool holds(const unsigned char *buf, size_t n, size_t es, int q, size_t gi0) {
  for (size_t i = 0; i < n; i++)
    for (size_t b = 0; b < es; b++)
      if (buf[i * es + b] != byte_of(q, gi0 + i, b)) return false;
  return true;
}

/* all_gather(v), all_to_all(v), broadcast, scatter, gather: plain, in place and nonblocking, uneven and empty
 * blocks; block contents name their sender and position. */
static void data_collectives_place_every_block(variant *v, size_t n) {
  dtl_comm *c = v->c;
  const dtl_dtype types[] = {DTL_UINT8, DTL_FLOAT16, DTL_FLOAT64};
  size_t p = (size_t)size, counts[64], total = 0, off[64];
  for (int q = 0; q < size; q++) {
    counts[q] = (size_t)(q * 5 + 2) % (n + 1) * (q % 4 != 2);
    off[q] = total;
    total += counts[q];
  }
  for (int ti = 0; ti < 3; ti++) {
    dtl_dtype t = types[ti];
    size_t es = dtl_dtype_size(t), big = (n * p > total ? n * p : total) * p + 1;
    unsigned char *s = malloc(big * es), *r = malloc(big * es);
    dtl_request *req;
    /* all_gather: block q is rank q's */
    for (int form = 0; form < 3; form++) {
      memset(r, 0x5a, n * p * es);
      fill(form == 1 ? r + (size_t)rank * n * es : s, n, es, rank, 0);
      const void *src = form == 1 ? r + (size_t)rank * n * es : s;
      if (form == 2) {
        req = NULL;
        CHECK_OK(dtl_all_gather_async(c, src, r, n, t, &req));
        if (req) CHECK_OK(dtl_wait(req));
      } else {
        CHECK_OK(dtl_all_gather(c, src, r, n, t));
      }
      for (int q = 0; q < size; q++)
        CHECK(holds(r + (size_t)q * n * es, n, es, q, 0), "%s all_gather form %d %s: block %d", v->name, form,
              dtl_dtype_name(t), q);
    }
    /* all_gatherv */
    memset(r, 0x5a, total * es);
    fill(s, counts[rank], es, rank, 0);
    CHECK_OK(dtl_all_gatherv(c, s, counts[rank], r, counts, t));
    for (int q = 0; q < size; q++)
      CHECK(holds(r + off[q] * es, counts[q], es, q, 0), "%s all_gatherv %s: block %d", v->name, dtl_dtype_name(t), q);
    /* all_to_all: block q of rank j holds (j, q*n + i) */
    for (int form = 0; form < 3; form++) {
      fill(s, n * p, es, rank, 0);
      unsigned char *dst = form == 1 ? s : r;
      if (form != 1) memset(r, 0x5a, n * p * es);
      if (form == 2) {
        req = NULL;
        CHECK_OK(dtl_all_to_all_async(c, s, r, n, t, &req));
        if (req) CHECK_OK(dtl_wait(req));
      } else {
        CHECK_OK(dtl_all_to_all(c, s, dst, n, t));
      }
      for (int q = 0; q < size; q++)
        CHECK(holds(dst + (size_t)q * n * es, n, es, q, (size_t)rank * n), "%s all_to_all form %d %s: block %d",
              v->name, form, dtl_dtype_name(t), q);
    }
    /* all_to_allv: rank j sends sc[j][q] = (j + 2q) % (n + 1) elements to q, from position 1000 q on */
    size_t sc[64], rc[64], so = 0, ro = 0;
    for (int q = 0; q < size; q++) {
      sc[q] = (size_t)(rank + 2 * q) % (n + 1);
      rc[q] = (size_t)(q + 2 * rank) % (n + 1);
    }
    for (int form = 0; form < 3; form++) {
      so = 0;
      for (int q = 0; q < size; q++) {
        fill(s + so * es, sc[q], es, rank, 1000 * (size_t)q);
        so += sc[q];
      }
      /* in place needs equal counts pairwise: use the symmetric counts (rank + q) % (n + 1) */
      if (form == 1) {
        so = 0;
        for (int q = 0; q < size; q++) {
          sc[q] = rc[q] = (size_t)(rank + q) % (n + 1);
          fill(s + so * es, sc[q], es, rank, 1000 * (size_t)q);
          so += sc[q];
        }
      }
      unsigned char *dst = form == 1 ? s : r;
      if (form != 1) memset(r, 0x5a, big * es);
      if (form == 2) {
        req = NULL;
        CHECK_OK(dtl_all_to_allv_async(c, s, sc, r, rc, t, &req));
        if (req) CHECK_OK(dtl_wait(req));
      } else {
        CHECK_OK(dtl_all_to_allv(c, s, sc, dst, rc, t));
      }
      ro = 0;
      for (int q = 0; q < size; q++) {
        CHECK(holds(dst + ro * es, rc[q], es, q, 1000 * (size_t)rank), "%s all_to_allv form %d %s: block from %d",
              v->name, form, dtl_dtype_name(t), q);
        ro += rc[q];
      }
      if (form == 1)
        for (int q = 0; q < size; q++) {
          sc[q] = (size_t)(rank + 2 * q) % (n + 1);
          rc[q] = (size_t)(q + 2 * rank) % (n + 1);
        }
    }
    /* broadcast, scatter, gather from / to the last rank (in place on root for scatter and gather) */
    int root = size - 1;
    if (rank == root) fill(r, n, es, root, 5);
    else memset(r, 0x5a, n * es);
    CHECK_OK(dtl_broadcast(c, r, n, t, root));
    CHECK(holds(r, n, es, root, 5), "%s broadcast %s", v->name, dtl_dtype_name(t));
    if (rank == root) fill(s, n * p, es, root, 0);
    void *mine = rank == root ? s + (size_t)root * n * es : r;
    CHECK_OK(dtl_scatter(c, s, mine, n, t, root));
    CHECK(holds(mine, n, es, root, (size_t)rank * n), "%s scatter %s", v->name, dtl_dtype_name(t));
    fill(rank == root ? r + (size_t)root * n * es : s, n, es, rank, 77);
    CHECK_OK(dtl_gather(c, rank == root ? r + (size_t)root * n * es : s, rank == root ? r : NULL, n, t, root));
    for (int q = 0; rank == root && q < size; q++)
      CHECK(holds(r + (size_t)q * n * es, n, es, q, 77), "%s gather %s: block %d", v->name, dtl_dtype_name(t), q);
    free(s);
    free(r);
  }
}

/* send/recv and sendrecv (blocking and not) around a ring, counts beyond the limit included. */
static void point_to_point_moves_every_element(variant *v, size_t n) {
  if (size < 2) return;
  dtl_comm *c = v->c;
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  size_t es = 2;
  unsigned char *s = malloc(n * es + 2), *r = malloc(n * es + 2);
  fill(s, n, es, rank, 3);
  memset(r, 0x5a, n * es + 2);
  CHECK_OK(dtl_sendrecv(c, s, n, next, r, n, prev, DTL_FLOAT16));
  CHECK(holds(r, n, es, prev, 3), "%s sendrecv", v->name);
  memset(r, 0x5a, n * es + 2);
  dtl_request *req = NULL;
  CHECK_OK(dtl_sendrecv_async(c, s, n, next, r, n, prev, DTL_FLOAT16, &req));
  if (req) CHECK_OK(dtl_wait(req));
  CHECK(holds(r, n, es, prev, 3), "%s sendrecv_async", v->name);
  memset(r, 0x5a, n * es + 2);
  if (rank % 2 == 0) {
    CHECK_OK(dtl_send(c, s, n, DTL_FLOAT16, next));
    if (size % 2 == 0 || rank != 0) CHECK_OK(dtl_recv(c, r, n, DTL_FLOAT16, prev));
  } else {
    CHECK_OK(dtl_recv(c, r, n, DTL_FLOAT16, prev));
    CHECK_OK(dtl_send(c, s, n, DTL_FLOAT16, next));
  }
  if (size % 2 == 1 && rank == 0) CHECK_OK(dtl_recv(c, r, n, DTL_FLOAT16, prev));
  CHECK(holds(r, n, es, prev, 3), "%s send/recv", v->name);
  /* a shorter message than the receive expects: DTL_ERR_MISMATCH naming what came, in pieces too */
  memset(r, 0x5a, n * es + 2);
  dtl_status st = dtl_sendrecv(c, s, n ? n - 1 : 0, next, r, n, prev, DTL_FLOAT16);
  if (n) {
    char want[64];
    snprintf(want, sizeof want, "sent %zu elements", n - 1);
    CHECK(st == DTL_ERR_MISMATCH && strstr(dtl_last_error(), want), "%s short sendrecv: %s %s", v->name,
          dtl_status_name(st), dtl_last_error());
  }
  free(s);
  free(r);
}

/* --- which algorithm runs --------------------------------------------------------------------------------------- */
static void expect_algo(dtl_comm *c, const char *want, const char *what) {
  CHECK(!strcmp(dtl_comm_mpi_last_algorithm(c), want), "%s ran %s (expected %s)", what, dtl_comm_mpi_last_algorithm(c),
        want);
}

/* The forced algorithm runs; a nonblocking start of a two-step algorithm runs the one-step one (or the MPI
 * call where order cannot matter); a large call that would run the MPI call runs dtl's (all_gather,
 * all_to_all, reduce_scatter) or the MPI call in pieces (all_reduce, reduce); an exact call never runs mpi
 * from the table. */
static void the_chosen_algorithm_runs_and_is_reported(void) {
  float x[128] = {0}, y[64 * 16]; /* x: 64 f64 too */
  int32_t xi[64] = {0}, yi[64 * 8];
  dtl_request *req;
  dtl_comm *a = variants[1].c, *m3 = variants[5].c, *table = variants[4].c;
  CHECK(!strcmp(dtl_comm_mpi_last_algorithm(NULL), ""), "NULL communicator");
  CHECK_OK(dtl_all_reduce(a, x, y, 8, DTL_FLOAT32, DTL_SUM));
  expect_algo(a, "all_reduce:rs_ag", "forced rs_ag");
  req = NULL;
  CHECK_OK(dtl_all_reduce_async(a, x, y, 8, DTL_FLOAT32, DTL_SUM, &req));
  if (req) CHECK_OK(dtl_wait(req));
  expect_algo(a, size >= 3 ? "all_reduce:ag_fold" : "all_reduce:mpi", "nonblocking start of forced rs_ag");
  CHECK_OK(dtl_all_gather(m3, x, y, 4, DTL_FLOAT32));
  expect_algo(m3, "all_gather:direct", "large all_gather with mpi forced");
  CHECK_OK(dtl_all_to_all(m3, y, y + 8 * size, 4, DTL_FLOAT32));
  expect_algo(m3, "all_to_all:direct", "large all_to_all with mpi forced");
  CHECK_OK(dtl_reduce_scatter(m3, y, x, 4, DTL_INT32, DTL_SUM));
  expect_algo(m3, "reduce_scatter:a2a_fold", "large reduce_scatter with mpi forced");
  CHECK_OK(dtl_all_reduce(m3, xi, yi, 8, DTL_INT32, DTL_SUM));
  expect_algo(m3, "all_reduce:mpi", "large all_reduce with mpi forced (in pieces)");
  CHECK_OK(dtl_all_gather(m3, x, y, 3, DTL_FLOAT32));
  expect_algo(m3, "all_gather:mpi", "all_gather within the limit");
  for (int k = 0; k < 3; k++) {
    size_t n = k == 0 ? 1 : k == 1 ? 64 : 16;
    CHECK_OK(dtl_all_reduce(table, x, y, n, DTL_FLOAT32, DTL_SUM));
    if (size >= 3)
      CHECK(strcmp(dtl_comm_mpi_last_algorithm(table), "all_reduce:mpi") != 0, "the table ran %s for an exact call",
            dtl_comm_mpi_last_algorithm(table));
    CHECK_OK(dtl_reduce(table, x, y, n, DTL_FLOAT64, DTL_AVG, 0));
    if (size >= 3)
      CHECK(strcmp(dtl_comm_mpi_last_algorithm(table), "reduce:mpi") != 0, "the table ran %s for an exact call",
            dtl_comm_mpi_last_algorithm(table));
  }
}

/* --- making communicators ----------------------------------------------------------------------------------------- */
static dtl_status from_env(const char *algo, const char *table, dtl_comm **out) {
  if (algo) setenv("DTL_ALGO", algo, 1);
  else unsetenv("DTL_ALGO");
  if (table) setenv("DTL_ALGO_TABLE", table, 1);
  else unsetenv("DTL_ALGO_TABLE");
  dtl_status st = dtl_comm_from_mpi(MPI_COMM_WORLD, out);
  unsetenv("DTL_ALGO");
  unsetenv("DTL_ALGO_TABLE");
  return st;
}

static void expect_refused(const char *algo, const char *table, dtl_status want, const char *text) {
  dtl_comm *c = NULL;
  dtl_status st = from_env(algo, table, &c);
  CHECK(st == want && strstr(dtl_last_error(), text), "DTL_ALGO=%s DTL_ALGO_TABLE=%s: %s '%s' (expected %s '%s')",
        algo ? algo : "-", table ? table : "-", dtl_status_name(st), dtl_last_error(), dtl_status_name(want), text);
  CHECK(c == NULL, "a refused communicator was stored");
  dtl_comm_destroy(c);
}

/* DTL_ALGO and DTL_ALGO_TABLE are read when a communicator is made: malformed text fails it on every rank,
 * naming the entry or line, and so does a rank that reads another table than the others. */
static void malformed_or_differing_algorithm_settings_fail_every_rank(void) {
  expect_refused("all_reduce:fast", NULL, DTL_ERR_INVALID_ARGUMENT, "entry 1 \"all_reduce:fast\": unknown algorithm");
  expect_refused("all_gather:ring,bcast:mpi", NULL, DTL_ERR_INVALID_ARGUMENT, "entry 2 \"bcast:mpi\": unknown collective");
  expect_refused("all_gather", NULL, DTL_ERR_INVALID_ARGUMENT, "entry 1 \"all_gather\": expected collective:algorithm");
  expect_refused("reduce:ring", NULL, DTL_ERR_INVALID_ARGUMENT, "(expected auto, mpi, rs_gather, gather_fold, chain)");
  expect_refused("all_gather:ring,all_gather:mpi", NULL, DTL_ERR_INVALID_ARGUMENT, "all_gather is given twice");
  expect_refused(NULL, "/nonexistent/dtl_algo_table", DTL_ERR_INVALID_ARGUMENT, "DTL_ALGO_TABLE=\"/nonexistent");
  char path[64];
  snprintf(path, sizeof path, "/tmp/dtl_algo_test_%d.txt", (int)getpid());
  FILE *f = fopen(path, "w");
  CHECK(f != NULL, "cannot write %s", path);
  if (!f) return;
  fprintf(f, "# a table\nall_reduce any * 0 mpi\nall_reduce exact 3-* 0 mpi\n");
  fclose(f);
  expect_refused(NULL, path, DTL_ERR_INVALID_ARGUMENT, "line 3: mpi for class exact of all_reduce");
  /* a good file: its rows decide */
  f = fopen(path, "w");
  fprintf(f, "all_gather * * 0 ring   # every all-gather in a ring\nall_reduce * 1-* 1K rs_ag\n");
  fclose(f);
  dtl_comm *c = NULL;
  CHECK_OK(from_env(NULL, path, &c));
  if (c) {
    float x[512] = {0}, y[512 * 8];
    CHECK_OK(dtl_all_gather(c, x, y, 4, DTL_FLOAT32));
    expect_algo(c, "all_gather:ring", "DTL_ALGO_TABLE row");
    CHECK_OK(dtl_all_reduce(c, x, y, 512, DTL_INT32, DTL_SUM));
    expect_algo(c, "all_reduce:rs_ag", "DTL_ALGO_TABLE row from 1K");
    CHECK_OK(dtl_all_reduce(c, x, y, 4, DTL_INT32, DTL_SUM));
    expect_algo(c, "all_reduce:mpi", "below the row's from_bytes (no row: mpi)");
    dtl_comm_destroy(c);
  }
  remove(path);
  if (size >= 2) { /* the last rank forces another algorithm */
    char algo[64];
    snprintf(algo, sizeof algo, "all_gather:%s", rank == size - 1 ? "ring" : "direct");
    expect_refused(algo, NULL, DTL_ERR_MISMATCH, "differs between the ranks");
    const char *bad = rank == size - 1 ? "all_gather:spiral" : NULL;
    char named[64];
    snprintf(named, sizeof named, "rank %d failed", size - 1);
    expect_refused(bad, NULL, DTL_ERR_INVALID_ARGUMENT, rank == size - 1 ? "unknown algorithm" : named);
  }
}

/* The blocking algorithms' scratch grows in a call: one rank failing to allocate it fails every rank before the
 * call's first transfer (nobody waits), and the communicator works afterwards. */
static void scratch_that_one_rank_cannot_allocate_fails_every_rank(void) {
  if (size < 2) return;
  dtl_comm *c = NULL;
  REQUIRE_OK(from_env("all_reduce:ag_fold", NULL, &c));
  size_t n = 4096 + (size_t)size;
  float *x = calloc(n, sizeof *x), *y = calloc(n, sizeof *y);
  CHECK_OK(dtl_all_reduce(c, x, y, 16, DTL_FLOAT32, DTL_SUM)); /* scratch for DTL_CHECK's small all-reduces */
  if (rank == size - 1) dtl__alloc_hook_reset(1, false);
  dtl_status st = dtl_all_reduce(c, x, y, n, DTL_FLOAT32, DTL_SUM);
  dtl__alloc_hook_reset(0, false);
  char named[64];
  snprintf(named, sizeof named, "rank %d failed (DTL_ERR_OUT_OF_MEMORY", size - 1);
  const char *text = rank == size - 1 ? "bytes of scratch" : named;
  CHECK(st == DTL_ERR_OUT_OF_MEMORY && strstr(dtl_last_error(), text), "%s '%s' (expected '%s')", dtl_status_name(st),
        dtl_last_error(), text);
  for (size_t i = 0; i < n; i++) x[i] = 1;
  CHECK_OK(dtl_all_reduce(c, x, y, n, DTL_FLOAT32, DTL_SUM));
  CHECK(y[n - 1] == (float)size, "after the failure: %g", y[n - 1]);
  free(x);
  free(y);
  dtl_comm_destroy(c);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  rank = dt_rank;
  size = dt_size;
  if (size > 64) return dt_skip("the test's tables hold at most 64 ranks");
  for (int i = 0; i < NVARIANTS; i++) {
    REQUIRE_OK(from_env(variants[i].algo, NULL, &variants[i].c));
    if (variants[i].limit) REQUIRE_OK(dtl__mpi_set_limit(variants[i].c, variants[i].limit));
  }
  char name[160];
  for (int i = 0; i < NVARIANTS; i++) {
    variant *v = &variants[i];
    /* past the fold's 1024-element chunks unless pieces make that slow; a few elements; nothing */
    const size_t sizes[] = {v->limit ? 23 : 1100, 5, 0};
    watched = v->limit ? dtl_comm_mpi_handle(v->c) : MPI_COMM_NULL;
    watched_limit = v->limit;
    for (int k = 0; k < 3; k++) {
      snprintf(name, sizeof name, "reductions_match_the_rank_order_fold (%s, n=%zu)", v->name, sizes[k]);
      RUN_NAMED(name, reductions_match_the_rank_order_fold(v, sizes[k]));
      snprintf(name, sizeof name, "data_collectives_place_every_block (%s, n=%zu)", v->name, sizes[k]);
      RUN_NAMED(name, data_collectives_place_every_block(v, sizes[k]));
      snprintf(name, sizeof name, "point_to_point_moves_every_element (%s, n=%zu)", v->name, sizes[k]);
      RUN_NAMED(name, point_to_point_moves_every_element(v, sizes[k]));
    }
  }
  watched = MPI_COMM_NULL;
  RUN(the_chosen_algorithm_runs_and_is_reported);
  RUN(malformed_or_differing_algorithm_settings_fail_every_rank);
  RUN(scratch_that_one_rank_cannot_allocate_fails_every_rank);
  for (int i = 0; i < NVARIANTS; i++) dtl_comm_destroy(variants[i].c);
  return dt_finish();
}

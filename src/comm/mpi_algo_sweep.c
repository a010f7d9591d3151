/* SPDX-License-Identifier: Apache-2.0 */
/* The MPI transport's algorithm sweep (dtl_mpi_algorithm_calibrate): every algorithm of the collectives with a
 * choice timed at a few call sizes on a communicator, and the fastest per size range installed as its table rows,
 * the same on every rank. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "comm/agree.h"
#include "comm/mpi_algo.h"
#include "comm/profile.h"
#include "dtl/mpi.h"

#define DTL__SWEEP_SIZES 3
/* Call sizes (the larger buffer of one rank) and the boundaries between them where a row may start. */
static const size_t dtl__sweep_bytes[DTL__SWEEP_SIZES] = {4096, 65536, 1048576};
static const uint64_t dtl__sweep_from[DTL__SWEEP_SIZES] = {0, 16384, 262144};
/* The collectives swept (all_to_allv and reduce keep their rows: their calls are shaped by the caller). */
static const dtl__coll dtl__sweep_colls[] = {DTL__COLL_ALL_REDUCE, DTL__COLL_REDUCE_SCATTER, DTL__COLL_ALL_GATHER,
                                            DTL__COLL_ALL_TO_ALL};

/* One call of coll with bytes in the larger buffer (a multiple of 4 x size). */
static dtl_status dtl__sweep_call(dtl_comm *c, dtl__coll k, dtl_dtype t, void *a, void *b, size_t bytes) {
  size_t n = bytes / 4, blk = n / (size_t)c->size;
  switch (k) {
    case DTL__COLL_ALL_REDUCE: return dtl_all_reduce(c, a, b, n, t, DTL_SUM);
    case DTL__COLL_REDUCE_SCATTER: return dtl_reduce_scatter(c, a, b, blk, t, DTL_SUM);
    case DTL__COLL_ALL_GATHER: return dtl_all_gather(c, a, b, blk, t);
    default: return dtl_all_to_all(c, a, b, blk, t);
  }
}

typedef struct {
  dtl__coll k;
  dtl_dtype t;
  void *a, *b;
  size_t bytes;
} dtl__sweep_arg;

static dtl_status dtl__sweep_fn(dtl_comm *c, void *arg) {
  dtl__sweep_arg *x = arg;
  return dtl__sweep_call(c, x->k, x->t, x->a, x->b, x->bytes);
}

/* Drops t's rows of coll for class cls (a row for both keeps the other class) and appends the measured ones. */
static dtl_status dtl__sweep_install(dtl__algo_table *t, dtl__coll k, dtl__class cls, const int *best) {
  int o = 0;
  for (int i = 0; i < t->nrows; i++) {
    dtl__algo_row r = t->rows[i];
    if (r.coll == k && (r.cls & cls)) r.cls = (uint8_t)(r.cls & ~cls);
    if (r.cls) t->rows[o++] = r;
  }
  t->nrows = o;
  for (int s = 0; s < DTL__SWEEP_SIZES; s++) {
    if (s && best[s] == best[s - 1]) continue;
    if (t->nrows == DTL__ALGO_MAX_ROWS) return DTL_ERR_INTERNAL;
    t->rows[t->nrows++] = (dtl__algo_row){.coll = (uint8_t)k, .cls = (uint8_t)cls, .algo = (uint8_t)best[s],
                                          .pmin = 1, .pmax = INT_MAX, .min_bytes = dtl__sweep_from[s]};
  }
  return DTL_OK;
}

dtl_status dtl_mpi_algorithm_calibrate(dtl_comm *c) {
  static const char fn[] = "dtl_mpi_algorithm_calibrate";
  DTL_CHECK_ARG(c != NULL, fn, "comm=NULL");
  dtl__algo_table *tab = dtl__mpi_table_of(c);
  DTL_CHECK_ARG(tab != NULL, fn, "comm is a %s communicator (expected mpi: only it has an algorithm table)",
                dtl_comm_backend_name(c));
  size_t bytes = dtl__sweep_bytes[DTL__SWEEP_SIZES - 1] * (size_t)c->size; /* all-gather's output on p ranks */
  void *a = dtl__calloc(1, bytes), *b = dtl__calloc(1, bytes);
  int64_t v = a && b ? 0 : 1;
  dtl_status st = dtl__comm_max_i64(c, &v, 1);
  if (st == DTL_OK && v)
    st = dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory (%zu bytes of buffers, on some rank)", 2 * bytes);
  dtl__algo_table n = *tab;
  int8_t forced[DTL__NCOLLS];
  memcpy(forced, tab->forced, sizeof forced);
  for (size_t i = 0; i < sizeof dtl__sweep_colls / sizeof *dtl__sweep_colls && st == DTL_OK; i++) {
    dtl__coll k = dtl__sweep_colls[i];
    bool reduces = k == DTL__COLL_ALL_REDUCE || k == DTL__COLL_REDUCE_SCATTER;
    /* class any with int32 (the order cannot matter); exact with f32 where the order matters (3 or more ranks) */
    for (int exact = 0; exact <= (reduces && c->size >= 3) && st == DTL_OK; exact++) {
      dtl__class cls = exact ? DTL__CLASS_EXACT : reduces ? DTL__CLASS_ANY : DTL__CLASS_BOTH; /* no exact calls */
      int best[DTL__SWEEP_SIZES];
      for (int s = 0; s < DTL__SWEEP_SIZES && st == DTL_OK; s++) {
        size_t call = dtl__sweep_bytes[s] / (4 * (size_t)c->size) * (4 * (size_t)c->size);
        double tbest = INFINITY;
        best[s] = -1;
        for (int alg = 0; alg < DTL__NALGOS && st == DTL_OK; alg++) {
          if (!dtl__algo_allowed(k, (dtl__algo)alg) || (exact && alg == DTL__ALGO_MPI)) continue;
          tab->forced[k] = (int8_t)alg;
          dtl__sweep_arg x = {k, exact ? DTL_FLOAT32 : DTL_INT32, a, b, call ? call : 4 * (size_t)c->size};
          double t = 0;
          st = dtl__calib_time(c, dtl__sweep_fn, &x, &t);
          if (st == DTL_OK && t < tbest) tbest = t, best[s] = alg;
        }
      }
      if (st == DTL_OK) st = dtl__sweep_install(&n, k, cls, best);
    }
  }
  memcpy(tab->forced, forced, sizeof forced);
  dtl__free(a);
  dtl__free(b);
  if (st == DTL_ERR_INTERNAL) return dtl__error_fn(st, fn, "more than %d table rows", DTL__ALGO_MAX_ROWS);
  DTL_TRY(st);
  /* Through the text form, which validates the rows and seals the fingerprint like every other table. */
  size_t len = dtl__algo_table_render(&n, NULL, 0);
  char *text = dtl__malloc(len + 1);
  if (!text) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  dtl__algo_table_render(&n, text, len + 1);
  st = dtl__algo_table_parse(&n, text, fn, "the measured table");
  dtl__free(text);
  DTL_TRY(st);
  memcpy(n.forced, forced, sizeof forced);
  *tab = n;
  return DTL_OK;
}

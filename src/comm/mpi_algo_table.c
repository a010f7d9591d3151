/* SPDX-License-Identifier: Apache-2.0 */
/* The MPI transport's algorithm table: which algorithm a collective call runs, by collective, class, number
 * of ranks and call size. The built-in rows come from dtl_coll_perf runs (README, Benchmarks); a measurement
 * can replace them with a file (DTL_ALGO_TABLE) and DTL_ALGO forces one algorithm per collective (tests, or a
 * user who gives up the rank-order promise for speed). Both are read once, when a communicator is made.
 *
 * The file format (what `dtl info` prints, and what a calibration writes): one row per line, blank-separated
 * fields, '#' starts a comment, blank lines are ignored:
 *
 *   collective  class  ranks  from_bytes  algorithm
 *
 *   collective  all_reduce, reduce_scatter (also reduce_scatterv), all_gather (also all_gatherv), all_to_all,
 *               all_to_allv (also the exchange at explicit displacements), reduce
 *   class       exact: floating SUM/PROD/AVG over 3 or more ranks, where only dtl's rank-order algorithms
 *               may run; any: every other call; *: both
 *   ranks       N, N-M, N-* or *
 *   from_bytes  the row applies from this call size up: the larger buffer of one rank in bytes (all-reduce
 *               and reduce: count x dtype size; reduce-scatter: the input; all-gather, all-to-all: the
 *               output); an integer with an optional K, M or G (x 1024^k); all_to_allv takes 0 only (its
 *               counts differ by rank, so its choice cannot depend on them)
 *   algorithm   one of the collective's algorithms (dtl__algo_table_render lists them); mpi never with
 *               class exact or *
 *
 * A call uses, among the rows of its collective whose class and ranks cover it and whose from_bytes is at most
 * its size, the one with the largest from_bytes (the later row among equals). With no such row it runs mpi
 * (class any) or the collective's rank-order algorithm (class exact). A file replaces the built-in rows. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "comm/agree.h"
#include "comm/mpi_algo.h"
#include "comm/profile.h"
#include "common/quote.h"

static const char *const coll_names[DTL__NCOLLS] = {"all_reduce", "reduce_scatter", "all_gather",
                                                    "all_to_all", "all_to_allv",    "reduce"};
static const char *const algo_names[DTL__NALGOS] = {"mpi",    "direct",  "ring",      "a2a_fold",   "rs_ag",
                                                    "ag_fold", "rs_gather", "gather_fold", "chain"};

#define A(x) (1u << DTL__ALGO_##x)
/* The algorithms of each collective, the one an exact call falls back on, and whether it reduces. */
static const struct {
  unsigned algos;
  dtl__algo exact;
  bool reduces;
} colls[DTL__NCOLLS] = {
    [DTL__COLL_ALL_REDUCE] = {A(MPI) | A(RS_AG) | A(AG_FOLD), DTL__ALGO_RS_AG, true},
    [DTL__COLL_REDUCE_SCATTER] = {A(MPI) | A(A2A_FOLD), DTL__ALGO_A2A_FOLD, true},
    [DTL__COLL_ALL_GATHER] = {A(MPI) | A(DIRECT) | A(RING), DTL__ALGO_MPI, false},
    [DTL__COLL_ALL_TO_ALL] = {A(MPI) | A(DIRECT), DTL__ALGO_MPI, false},
    [DTL__COLL_ALL_TO_ALLV] = {A(MPI) | A(DIRECT), DTL__ALGO_MPI, false},
    [DTL__COLL_REDUCE] = {A(MPI) | A(RS_GATHER) | A(GATHER_FOLD) | A(CHAIN), DTL__ALGO_CHAIN, true},
};
/* Algorithms that need transfers after a local step (so not one nonblocking start). */
static const unsigned multi_phase = A(RS_AG) | A(RING) | A(RS_GATHER) | A(CHAIN);
#undef A

bool dtl__algo_allowed(dtl__coll coll, dtl__algo a) { return coll < DTL__NCOLLS && (colls[coll].algos >> a & 1u); }

const char *dtl__coll_name(dtl__coll k) { return k < DTL__NCOLLS ? coll_names[k] : "?"; }
const char *dtl__algo_name(dtl__algo a) { return a < DTL__NALGOS ? algo_names[a] : "?"; }

/* The built-in rows, in the file format (so that the defaults and a file are read by one parser), from A/B runs
 * of dtl_coll_perf with each algorithm forced, on the README's 2-core VM (OpenMPI 4.1.4, shared memory, 2 and 4
 * ranks, 4 KiB-64 MiB; README, Benchmarks). OpenMPI's reduce-scatter reduces at one rank and scatters, so the
 * all-to-all and a fold win from 16 KiB on; rs_ag beats MPI_Allreduce from 16 KiB; below 64 KiB the one-round
 * ag_fold is the faster rank-order all-reduce; all-gather and all-to-all gain nothing measurable from dtl's
 * exchanges; all-to-all-v runs direct, which moves any count in pieces and matched MPI_Alltoallv here. A
 * rank-order reduce copies more than MPI's tree (README); gather_fold and chain measured alike, chain scales. */
static const char default_rows[] =
    "all_reduce      any    *    0     mpi\n"
    "all_reduce      any    *    16K   rs_ag\n"
    "all_reduce      exact  *    0     ag_fold\n"
    "all_reduce      exact  *    64K   rs_ag\n"
    "reduce_scatter  any    *    0     mpi\n"
    "reduce_scatter  any    *    16K   a2a_fold\n"
    "reduce_scatter  exact  *    0     a2a_fold\n"
    "all_gather      *      *    0     mpi\n"
    "all_to_all      *      *    0     mpi\n"
    "all_to_allv     *      *    0     direct\n"
    "reduce          any    *    0     mpi\n"
    "reduce          exact  *    0     gather_fold\n"
    "reduce          exact  *    1M    chain\n";

static uint64_t dtl__algo_fp(const dtl__algo_table *t) {
  uint64_t h = dtl__fp_mix(0xa190ull, (uint64_t)t->nrows);
  for (int i = 0; i < t->nrows; i++) {
    const dtl__algo_row *r = &t->rows[i];
    h = dtl__fp_mix(h, (uint64_t)r->coll | (uint64_t)r->cls << 8 | (uint64_t)r->algo << 16);
    h = dtl__fp_mix(dtl__fp_mix(dtl__fp_mix(h, (uint64_t)r->pmin), (uint64_t)r->pmax), r->min_bytes);
  }
  for (int k = 0; k < DTL__NCOLLS; k++) h = dtl__fp_mix(h, (uint64_t)(t->forced[k] + 1));
  return h;
}

void dtl__algo_table_default(dtl__algo_table *t) {
  memset(t, 0, sizeof *t);
  memset(t->forced, -1, sizeof t->forced);
  dtl_status st = dtl__algo_table_parse(t, default_rows, "dtl__algo_table_default", "built-in table");
  (void)st; /* the built-in rows parse (tests/comm/test_algo_table.c) */
}

static int dtl__lookup(const char *const *names, int n, const char *s, size_t len) {
  for (int i = 0; i < n; i++)
    if (strlen(names[i]) == len && !strncmp(names[i], s, len)) return i;
  return -1;
}

/* "mpi, direct, ring" for the message of a bad algorithm. */
static void dtl__algo_list(dtl__coll k, char *buf, size_t cap) {
  size_t o = 0;
  buf[0] = '\0';
  for (int a = 0; a < DTL__NALGOS; a++)
    if (colls[k].algos >> a & 1u) o += (size_t)snprintf(buf + o, o < cap ? cap - o : 0, "%s%s", o ? ", " : "", algo_names[a]);
}

/* One field: [*s, *s + len) after blanks; false at the end of the line. */
static bool dtl__field(const char **s, const char **f, size_t *len) {
  while (**s == ' ' || **s == '\t' || **s == '\r') (*s)++;
  if (!**s || **s == '\n' || **s == '#') return false;
  *f = *s;
  while (**s && !isspace((unsigned char)**s) && **s != '#') (*s)++;
  *len = (size_t)(*s - *f);
  return true;
}

static bool dtl__parse_u64(const char *f, size_t len, uint64_t *out) {
  uint64_t v = 0;
  size_t i = 0;
  for (; i < len && isdigit((unsigned char)f[i]); i++) {
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + (uint64_t)(f[i] - '0');
  }
  if (i == 0) return false;
  if (i < len) {
    if (i + 1 != len) return false;
    int shift = f[i] == 'K' || f[i] == 'k' ? 10 : f[i] == 'M' || f[i] == 'm' ? 20 : f[i] == 'G' || f[i] == 'g' ? 30 : -1;
    if (shift < 0 || v > (UINT64_MAX >> shift)) return false;
    v <<= shift;
  }
  *out = v;
  return true;
}

/* "N", "N-M", "N-*" or "*" (N >= 1). */
static bool dtl__parse_ranks(const char *f, size_t len, int *lo, int *hi) {
  if (len == 1 && f[0] == '*') {
    *lo = 1;
    *hi = INT_MAX;
    return true;
  }
  const char *dash = memchr(f, '-', len);
  size_t l1 = dash ? (size_t)(dash - f) : len;
  uint64_t a = 0, b = 0;
  if (!l1 || l1 > 9 || !dtl__parse_u64(f, l1, &a) || !isdigit((unsigned char)f[l1 - 1]) || a < 1) return false;
  if (!dash) b = a;
  else if (len - l1 - 1 == 1 && dash[1] == '*') b = INT_MAX;
  else if (len - l1 - 1 == 0 || len - l1 - 1 > 9 || !dtl__parse_u64(dash + 1, len - l1 - 1, &b) ||
           !isdigit((unsigned char)f[len - 1]) || b < a)
    return false;
  *lo = (int)a;
  *hi = (int)b;
  return true;
}

dtl_status dtl__algo_table_parse(dtl__algo_table *t, const char *text, const char *fn, const char *source) {
  dtl__algo_table n = *t;
  n.nrows = 0;
  int line = 0;
  for (const char *s = text; *s;) {
    line++;
    const char *f[6];
    size_t len[6];
    int nf = 0;
    while (nf < 6 && dtl__field(&s, &f[nf], &len[nf])) nf++;
    while (*s && *s != '\n') s++; /* the comment, if any */
    if (*s) s++;
    if (nf == 0) continue;
#define BAD(...) dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s line %d: " __VA_ARGS__)
    if (nf != 5)
      return BAD("%d fields (expected 5: collective class ranks from_bytes algorithm)", source, line, nf);
    int k = dtl__lookup(coll_names, DTL__NCOLLS, f[0], len[0]);
    if (k < 0)
      return BAD("collective \"%.*s\" (expected all_reduce, reduce_scatter, all_gather, all_to_all, all_to_allv or "
                 "reduce)", source, line, (int)len[0], f[0]);
    int cls = len[1] == 1 && f[1][0] == '*' ? DTL__CLASS_BOTH
              : len[1] == 3 && !strncmp(f[1], "any", 3) ? DTL__CLASS_ANY
              : len[1] == 5 && !strncmp(f[1], "exact", 5) ? DTL__CLASS_EXACT : 0;
    if (!cls) return BAD("class \"%.*s\" (expected any, exact or *)", source, line, (int)len[1], f[1]);
    if (cls == DTL__CLASS_EXACT && !colls[k].reduces)
      return BAD("class exact for %s, which does not reduce (expected any or *)", source, line, coll_names[k]);
    int lo, hi;
    if (!dtl__parse_ranks(f[2], len[2], &lo, &hi))
      return BAD("ranks \"%.*s\" (expected N, N-M, N-* or * with 1 <= N <= M)", source, line, (int)len[2], f[2]);
    uint64_t from;
    if (!dtl__parse_u64(f[3], len[3], &from))
      return BAD("from_bytes \"%.*s\" (expected an integer with an optional K, M or G)", source, line, (int)len[3], f[3]);
    if (k == DTL__COLL_ALL_TO_ALLV && from)
      return BAD("from_bytes %.*s for all_to_allv (expected 0: its counts differ by rank)", source, line, (int)len[3],
                 f[3]);
    int a = dtl__lookup(algo_names, DTL__NALGOS, f[4], len[4]);
    if (a < 0 || !(colls[k].algos >> a & 1u)) {
      char list[96];
      dtl__algo_list((dtl__coll)k, list, sizeof list);
      return BAD("algorithm \"%.*s\" for %s (expected %s)", source, line, (int)len[4], f[4], coll_names[k], list);
    }
    if (a == DTL__ALGO_MPI && colls[k].reduces && (cls & DTL__CLASS_EXACT))
      return BAD("mpi for class %.*s of %s: MPI does not promise to reduce in rank order (expected class any)", source,
                 line, (int)len[1], f[1], coll_names[k]);
    if (n.nrows == DTL__ALGO_MAX_ROWS) return BAD("more than %d rows", source, line, DTL__ALGO_MAX_ROWS);
#undef BAD
    n.rows[n.nrows++] = (dtl__algo_row){.coll = (uint8_t)k, .cls = (uint8_t)cls, .algo = (uint8_t)a, .pmin = lo,
                                        .pmax = hi, .min_bytes = from};
  }
  n.fp = dtl__algo_fp(&n);
  *t = n;
  return DTL_OK;
}

dtl_status dtl__algo_force_parse(dtl__algo_table *t, const char *text, const char *fn) {
  int8_t forced[DTL__NCOLLS];
  memset(forced, -1, sizeof forced);
  bool seen[DTL__NCOLLS] = {false};
  int entry = 0;
  for (const char *s = text; *s;) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    entry++;
    const char *colon = memchr(s, ':', len);
    size_t kl = colon ? (size_t)(colon - s) : len;
    int k = dtl__lookup(coll_names, DTL__NCOLLS, s, kl);
#define BAD(...) dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "DTL_ALGO=\"%s\": entry %d \"%.*s\": " __VA_ARGS__)
    if (!colon) return BAD("expected collective:algorithm", text, entry, (int)len, s);
    if (k < 0)
      return BAD("unknown collective \"%.*s\" (expected all_reduce, reduce_scatter, all_gather, all_to_all, "
                 "all_to_allv or reduce)", text, entry, (int)len, s, (int)kl, s);
    if (seen[k]) return BAD("%s is given twice", text, entry, (int)len, s, coll_names[k]);
    seen[k] = true;
    const char *an = colon + 1;
    size_t al = len - kl - 1;
    int a = dtl__lookup(algo_names, DTL__NALGOS, an, al);
    if (al == 4 && !strncmp(an, "auto", 4)) a = -1;
    else if (a < 0 || !(colls[k].algos >> a & 1u)) {
      char list[96];
      dtl__algo_list((dtl__coll)k, list, sizeof list);
      return BAD("unknown algorithm \"%.*s\" for %s (expected auto, %s)", text, entry, (int)len, s, (int)al, an,
                 coll_names[k], list);
    }
#undef BAD
    forced[k] = (int8_t)a;
    s += len + (e != NULL);
  }
  memcpy(t->forced, forced, sizeof forced);
  t->fp = dtl__algo_fp(t);
  return DTL_OK;
}

dtl_status dtl__algo_table_from_env(dtl__algo_table *t, const char *fn, struct dtl__profile *prof) {
  dtl__profile pr;
  memset(&pr, 0, sizeof pr);
  bool has_prof = false;
  DTL_TRY(dtl__profile_from_env(fn, &pr, &has_prof));
  if (has_prof && pr.has_table) *t = pr.table;
  else dtl__algo_table_default(t);
  const char *path = getenv("DTL_ALGO_TABLE");
  if (path && path[0]) {
    char *text = NULL, source[300], qp[DTL__QUOTE_CAP];
    DTL_TRY(dtl__read_text("DTL_ALGO_TABLE", path, fn, &text));
    snprintf(source, sizeof source, "DTL_ALGO_TABLE=\"%s\"", dtl__quote(path, qp, sizeof qp));
    dtl_status st = dtl__algo_table_parse(t, text, fn, source);
    dtl__free(text);
    DTL_TRY(st);
  }
  const char *force = getenv("DTL_ALGO");
  if (force && force[0]) DTL_TRY(dtl__algo_force_parse(t, force, fn));
  if (has_prof) t->fp = dtl__fp_mix(t->fp, pr.fp);
  if (prof) {
    if (!has_prof) pr.engine[0] = '\0';
    *prof = pr;
  }
  return DTL_OK;
}

size_t dtl__algo_table_render(const dtl__algo_table *t, char *buf, size_t cap) {
  size_t o = 0;
#define OUT(...) (o += (size_t)snprintf(o < cap ? buf + o : NULL, o < cap ? cap - o : 0, __VA_ARGS__))
  OUT("# algorithms: ");
  for (int k = 0; k < DTL__NCOLLS; k++) {
    char list[96];
    dtl__algo_list((dtl__coll)k, list, sizeof list);
    OUT("%s%s (%s)", k ? "; " : "", coll_names[k], list);
  }
  OUT("\n");
  for (int k = 0; k < DTL__NCOLLS; k++)
    if (t->forced[k] >= 0) OUT("# DTL_ALGO forces %s:%s\n", coll_names[k], algo_names[t->forced[k]]);
  OUT("# %-16s %-6s %-7s %-11s %s\n", "collective", "class", "ranks", "from_bytes", "algorithm");
  for (int i = 0; i < t->nrows; i++) {
    const dtl__algo_row *r = &t->rows[i];
    char ranks[32], bytes[32];
    if (r->pmin == 1 && r->pmax == INT_MAX) snprintf(ranks, sizeof ranks, "*");
    else if (r->pmax == INT_MAX) snprintf(ranks, sizeof ranks, "%d-*", r->pmin);
    else if (r->pmin == r->pmax) snprintf(ranks, sizeof ranks, "%d", r->pmin);
    else snprintf(ranks, sizeof ranks, "%d-%d", r->pmin, r->pmax);
    uint64_t b = r->min_bytes;
    const char *unit = "";
    for (const char *u = "KMG"; *u && b && b % 1024 == 0; u++) {
      b /= 1024;
      unit = *u == 'K' ? "K" : *u == 'M' ? "M" : "G";
    }
    snprintf(bytes, sizeof bytes, "%llu%s", (unsigned long long)b, unit);
    OUT("  %-16s %-6s %-7s %-11s %s\n", coll_names[r->coll],
        r->cls == DTL__CLASS_BOTH ? "*" : r->cls == DTL__CLASS_ANY ? "any" : "exact", ranks, bytes, algo_names[r->algo]);
  }
#undef OUT
  return o;
}

dtl__class dtl__algo_class(bool reduces, dtl_dtype t, dtl_reduce_op op, int p) {
  bool order_matters = reduces && p >= 3 && dtl__dtype_is_float(t) && (op == DTL_SUM || op == DTL_PROD || op == DTL_AVG);
  return order_matters ? DTL__CLASS_EXACT : DTL__CLASS_ANY;
}

dtl__algo dtl__algo_pick(const dtl__algo_table *t, dtl__coll coll, dtl__class cls, int p, size_t bytes, bool async,
                         bool large) {
  int a = t->forced[coll];
  if (a < 0) {
    const dtl__algo_row *best = NULL;
    for (int i = 0; i < t->nrows; i++) {
      const dtl__algo_row *r = &t->rows[i];
      if (r->coll == coll && (r->cls & cls) && r->pmin <= p && p <= r->pmax && r->min_bytes <= bytes &&
          (!best || r->min_bytes >= best->min_bytes))
        best = r;
    }
    a = best ? best->algo : cls == DTL__CLASS_EXACT ? colls[coll].exact : DTL__ALGO_MPI;
  }
  if (async && (multi_phase >> a & 1u))
    a = cls == DTL__CLASS_ANY ? DTL__ALGO_MPI : coll == DTL__COLL_ALL_REDUCE ? DTL__ALGO_AG_FOLD : DTL__ALGO_DIRECT;
  if (large && a == DTL__ALGO_MPI) {
    if (coll == DTL__COLL_REDUCE_SCATTER) a = DTL__ALGO_A2A_FOLD;
    else if (coll == DTL__COLL_ALL_GATHER || coll == DTL__COLL_ALL_TO_ALL) a = DTL__ALGO_DIRECT;
    /* all_reduce and reduce move contiguous pieces with the MPI call; all_to_allv cannot switch alone */
  }
  return (dtl__algo)a;
}

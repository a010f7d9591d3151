/* SPDX-License-Identifier: Apache-2.0 */
/* Calibration profiles (DTL_PROFILE): reading, checking and writing the text format below. One file serves every
 * rank: the ranks agree on its fingerprint when a communicator is made (mpi.c), so a rank that reads another
 * profile fails the creation everywhere.
 *
 *   # comments start with '#'; blank lines are ignored; keywords in any order after the version line
 *   dtl-profile 1                       the format's version, the first line that is not blank or a comment
 *   engine mpi                          mpi or nccl: the transport it was measured on
 *   ranks 4                             the size of the communicator it was measured on
 *   cost alpha=2e-06,beta=2e-10,...     optional: the cost model, in the DTL_PLAN_TUNE format
 *   table all_reduce any * 16K rs_ag    optional, any number (mpi only): a DTL_ALGO_TABLE row */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm/agree.h"
#include "comm/profile.h"
#include "common/quote.h"

/* The largest file dtl__read_text reads (profile.h: at most 1 MiB). */
#define DTL__TEXT_MAX ((size_t)1 << 20)

dtl_status dtl__read_text(const char *var, const char *path, const char *fn, char **out) {
  char qp[DTL__QUOTE_CAP];
  dtl__quote(path, qp, sizeof qp);
  FILE *f = fopen(path, "rb");
  if (!f) return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=\"%s\": %s", var, qp, strerror(errno));
  size_t cap = 4096, n = 0;
  char *buf = dtl__malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - 1 - n, f);
    if (n < cap - 1) break;
    /* A full buffer is not yet a long file: one that ends exactly here fits. The last buffer holds
     * DTL__TEXT_MAX bytes and the NUL, and only a byte past it makes the file too long. */
    if (n == DTL__TEXT_MAX) {
      if (fgetc(f) == EOF) break;
      dtl__free(buf);
      fclose(f);
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=\"%s\": over 1 MiB", var, qp);
    }
    size_t ncap = cap * 2 < DTL__TEXT_MAX + 1 ? cap * 2 : DTL__TEXT_MAX + 1;
    char *nb = dtl__realloc(buf, ncap);
    if (!nb) {
      dtl__free(buf);
      fclose(f);
      return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
    }
    buf = nb;
    cap = ncap;
  }
  bool err = buf && ferror(f);
  fclose(f);
  if (!buf) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  if (err) {
    dtl__free(buf);
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=\"%s\": read error", var, qp);
  }
  buf[n] = '\0';
  *out = buf;
  return DTL_OK;
}

/* The keyword of a line and the rest after blanks, comment and trailing blanks removed. */
static void dtl__profile_split(char *line, char **kw, char **rest) {
  char *hash = strchr(line, '#');
  if (hash) *hash = '\0';
  size_t n = strlen(line);
  while (n && (line[n - 1] == ' ' || line[n - 1] == '\t' || line[n - 1] == '\r')) line[--n] = '\0';
  char *s = line;
  while (*s == ' ' || *s == '\t') s++;
  *kw = s;
  while (*s && *s != ' ' && *s != '\t') s++;
  if (*s) *s++ = '\0';
  while (*s == ' ' || *s == '\t') s++;
  *rest = s;
}

static bool dtl__profile_int(const char *s, int lo, int *out) {
  char *end = NULL;
  errno = 0;
  long v = (*s >= '0' && *s <= '9') ? strtol(s, &end, 10) : -1;
  if (!end || *end || errno || v < lo || v > 1 << 30) return false;
  *out = (int)v;
  return true;
}

dtl_status dtl__profile_parse(const char *text, const char *source, const char *fn, dtl__profile *out) {
  static const char expected[] =
      "expected the line \"dtl-profile 1\" first, then engine, ranks, cost and table lines (README, Calibration)";
  dtl__profile p;
  memset(&p, 0, sizeof p);
  snprintf(p.source, sizeof p.source, "%s", source);
  /* The table rows go to the DTL_ALGO_TABLE parser as a text of the same lines (the others blank), so that its
   * messages name the file's line numbers. */
  size_t len = strlen(text);
  char *rows = dtl__malloc(len + 2), *line = dtl__malloc(len + 1); /* rows: a newline more than a last line without */
  if (!rows || !line) {
    dtl__free(rows);
    dtl__free(line);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  size_t ro = 0;
  int no = 0, version = 0;
  bool seen_engine = false, seen_ranks = false;
  dtl_status st = DTL_OK;
  char qt[DTL__QUOTE_CAP];
  for (const char *s = text; *s && st == DTL_OK;) {
    const char *e = strchr(s, '\n');
    size_t l = e ? (size_t)(e - s) : strlen(s);
    memcpy(line, s, l);
    line[l] = '\0';
    s += l + (e != NULL);
    no++;
    dtl__quote(line, qt, sizeof qt);
    char *kw, *rest;
    dtl__profile_split(line, &kw, &rest);
#define BAD(...)                                                                                                 \
  (st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s line %d \"%s\": " __VA_ARGS__), (void)0)
    if (!strcmp(kw, "table")) {
      if (version) {
        memcpy(rows + ro, rest, strlen(rest));
        ro += strlen(rest);
        p.has_table = true;
      }
    }
    rows[ro++] = '\n';
    if (!*kw) continue;
    if (!version) {
      if (strcmp(kw, "dtl-profile")) BAD("not a dtl profile (%s)", source, no, qt, expected);
      else if (strcmp(rest, "1")) BAD("version \"%s\" (expected %d)", source, no, qt, rest, DTL__PROFILE_VERSION);
      else version = 1;
    } else if (!strcmp(kw, "engine")) {
      if (seen_engine) BAD("engine is given twice", source, no, qt);
      else if (strcmp(rest, "mpi") && strcmp(rest, "nccl")) BAD("engine \"%s\" (expected mpi or nccl)", source, no, qt, rest);
      else snprintf(p.engine, sizeof p.engine, "%s", rest);
      seen_engine = true;
    } else if (!strcmp(kw, "ranks")) {
      if (seen_ranks) BAD("ranks is given twice", source, no, qt);
      else if (!dtl__profile_int(rest, 1, &p.ranks)) BAD("ranks \"%s\" (expected an integer >= 1)", source, no, qt, rest);
      seen_ranks = true;
    } else if (!strcmp(kw, "cost")) {
      if (p.cost_line) BAD("cost is given twice", source, no, qt);
      else if (!*rest || strlen(rest) >= sizeof p.cost) BAD("%s cost text (expected key=value,... as DTL_PLAN_TUNE)",
                                                            source, no, qt, *rest ? "over-long" : "empty");
      else snprintf(p.cost, sizeof p.cost, "%s", rest);
      p.cost_line = no;
    } else if (strcmp(kw, "table")) {
      BAD("unknown keyword \"%s\" (expected engine, ranks, cost or table)", source, no, qt, kw);
    }
#undef BAD
  }
  rows[ro] = '\0';
  if (st == DTL_OK && !version)
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: empty (%s)", source, expected);
  if (st == DTL_OK && (!seen_engine || !seen_ranks))
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: no %s line (expected \"engine mpi|nccl\" and \"ranks N\")",
                       source, !seen_engine ? "engine" : "ranks");
  if (st == DTL_OK && p.has_table && strcmp(p.engine, "mpi"))
    st = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: table rows for engine %s (only the mpi transport has an "
                       "algorithm table)", source, p.engine);
  if (st == DTL_OK && p.has_table) {
    dtl__algo_table_default(&p.table);
    st = dtl__algo_table_parse(&p.table, rows, fn, source);
  }
  dtl__free(rows);
  dtl__free(line);
  if (st != DTL_OK) return st;
  uint64_t h = dtl__fp_str(dtl__fp_mix(dtl__fp_str(0x9f0f11e, p.engine), (uint64_t)p.ranks), p.cost);
  p.fp = dtl__fp_mix(h, p.has_table ? p.table.fp : 0);
  *out = p;
  return DTL_OK;
}

dtl_status dtl__profile_from_env(const char *fn, dtl__profile *out, bool *present) {
  const char *path = getenv("DTL_PROFILE");
  *present = false;
  if (!path || !path[0]) return DTL_OK;
  char *text = NULL, source[sizeof out->source], qp[DTL__QUOTE_CAP];
  DTL_TRY(dtl__read_text("DTL_PROFILE", path, fn, &text));
  snprintf(source, sizeof source, "DTL_PROFILE=\"%s\"", dtl__quote(path, qp, sizeof qp));
  dtl_status st = dtl__profile_parse(text, source, fn, out);
  dtl__free(text);
  DTL_TRY(st);
  *present = true;
  return DTL_OK;
}

dtl_status dtl__profile_check(const dtl__profile *p, const char *fn, const char *engine, int size) {
  if (strcmp(p->engine, engine) || p->ranks != size)
    return dtl__error_fn(DTL_ERR_MISMATCH, fn, "%s was recorded for engine %s on %d ranks, used for engine %s on %d "
                         "ranks (calibrate again with `dtl calibrate` on this configuration, or unset DTL_PROFILE)",
                         p->source, p->engine, p->ranks, engine, size);
  return DTL_OK;
}

dtl_status dtl__profile_write(const char *path, const char *fn, const char *engine, int ranks, const char *cost_text,
                              const dtl__algo_table *table, const char *comment) {
  char *rows = NULL;
  if (table) {
    size_t n = dtl__algo_table_render(table, NULL, 0);
    if (!(rows = dtl__malloc(n + 1))) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
    dtl__algo_table_render(table, rows, n + 1);
  }
  char qp[DTL__QUOTE_CAP];
  FILE *f = fopen(path, "w");
  if (!f) {
    dtl__free(rows);
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "path=\"%s\": %s", dtl__quote(path, qp, sizeof qp),
                         strerror(errno));
  }
  fprintf(f, "# dtl calibration profile: load it with DTL_PROFILE=<this file> on every rank (README, Calibration)\n");
  if (comment) fprintf(f, "# %s\n", comment);
  fprintf(f, "dtl-profile %d\nengine %s\nranks %d\n", DTL__PROFILE_VERSION, engine, ranks);
  if (cost_text) fprintf(f, "# cost model (DTL_PLAN_TUNE keys): alpha, inter_alpha in s; beta, local_beta, inter_beta in s/B\n"
                            "cost %s\n", cost_text);
  /* The rendered table's comment lines stay comments, its rows become table lines. */
  for (char *s = rows; s && *s;) {
    char *e = strchr(s, '\n');
    if (e) *e = '\0';
    const char *t = s;
    while (*t == ' ') t++;
    fprintf(f, *t == '#' ? "%s\n" : "table %s\n", t);
    s = e ? e + 1 : s + strlen(s);
  }
  dtl__free(rows);
  bool bad = ferror(f) != 0;
  if (fclose(f) != 0) bad = true;
  if (bad)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "path=\"%s\": write error", dtl__quote(path, qp, sizeof qp));
  return DTL_OK;
}

static int64_t dtl__calib_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int dtl__cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

#define DTL__CALIB_REPS 5
dtl_status dtl__calib_time(dtl_comm *c, dtl_status (*fn)(dtl_comm *c, void *arg), void *arg, double *seconds) {
  int64_t t[DTL__CALIB_REPS];
  DTL_TRY(fn(c, arg)); /* warm-up: connections, workspace */
  for (int r = 0; r < DTL__CALIB_REPS; r++) {
    DTL_TRY(dtl_barrier(c));
    int64_t t0 = dtl__calib_now_ns();
    DTL_TRY(fn(c, arg));
    DTL_TRY(c->ops->synchronize(c));
    t[r] = dtl__calib_now_ns() - t0;
  }
  DTL_TRY(dtl__comm_max_i64(c, t, DTL__CALIB_REPS));
  qsort(t, DTL__CALIB_REPS, sizeof *t, dtl__cmp_i64);
  *seconds = (double)t[1] * 1e-9;
  return DTL_OK;
}

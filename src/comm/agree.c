/* SPDX-License-Identifier: Apache-2.0 */
/* The agreement of agree.h: one small MAX all-reduce decides whether every rank may go on (each fingerprint
 * travels as (h, -h), so max(h) == -max(-h) exactly when all are equal); only when it says no do the ranks
 * exchange their fingerprints and verdicts, in fixed-size chunks, to name who failed or differs. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm/agree.h"

uint64_t dtl__fp_double(uint64_t h, double v) {
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof bits);
  return dtl__fp_mix(h, bits);
}

uint64_t dtl__fp_sizes(uint64_t h, const size_t *v, int n) {
  if (!v) return dtl__fp_mix(h, 0x6e756c6cull); /* "null" */
  for (int i = 0; i < n; i++) h = dtl__fp_mix(h, (uint64_t)v[i]);
  return h;
}

uint64_t dtl__fp_str(uint64_t h, const char *s) {
  uint64_t w = 1469598103934665603ull;
  for (; *s; s++) w = (w ^ (unsigned char)*s) * 1099511628211ull;
  return dtl__fp_mix(h, w);
}

int64_t dtl__agree_nonce(const void *salt, int rank) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t h = dtl__fp_mix((uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec);
  h = dtl__fp_mix(h, (uint64_t)(uintptr_t)salt);
  h = dtl__fp_mix(h, (uint64_t)rank);
  return (int64_t)(h >> 2) | 1; /* positive, never 0, and far from INT64_MIN so that -h is exact */
}

dtl_status dtl__comm_max_i64(dtl_comm *c, int64_t *v, int n) {
  if (c->mem.ops->memory == DTL_MEMORY_HOST) return c->ops->all_reduce(c, v, v, (size_t)n, DTL_INT64, DTL_MAX);
  size_t bytes = sizeof(int64_t) * (size_t)n;
  if (c->agree_bytes < bytes) { /* grows once to the largest vector (the chunk of the second exchange) */
    if (c->agree_buf) dtl__mem_free(&c->mem, c->agree_buf);
    c->agree_buf = NULL;
    c->agree_bytes = 0;
    size_t want = bytes < 2 * 64 * sizeof(int64_t) ? 2 * 64 * sizeof(int64_t) : bytes;
    DTL_TRY(dtl__mem_alloc(&c->mem, want, &c->agree_buf));
    c->agree_bytes = want;
  }
  DTL_TRY(dtl__mem_copy(&c->mem, c->agree_buf, v, bytes));
  DTL_TRY(c->ops->all_reduce(c, c->agree_buf, c->agree_buf, (size_t)n, DTL_INT64, DTL_MAX));
  DTL_TRY(dtl__mem_copy(&c->mem, v, c->agree_buf, bytes));
  return c->ops->synchronize(c);
}

/* A fingerprint as a non-negative int64 (its top 63 bits). */
static int64_t dtl__fp63(uint64_t fp) { return (int64_t)(fp >> 1); }

static int dtl__cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* "1,3,4" (at most a few ranks, then ",..."), appended at list + *o. */
static void dtl__rank_list_add(char *list, size_t cap, size_t *o, int *count, int r) {
  if (*o < cap - 16) *o += (size_t)snprintf(list + *o, cap - *o, *count ? ",%d" : "%d", r);
  else if (*o < cap - 4 && list[*o - 1] != '.') *o += (size_t)snprintf(list + *o, cap - *o, ",...");
  (*count)++;
}

#define DTL__AGREE_CHUNK 64
#define DTL__AGREE_STACK_RANKS 256

/* The second exchange, run by every rank once the first said something is wrong: every rank's fingerprint
 * and verdict, DTL__AGREE_CHUNK ranks per all-reduce (no allocation is needed to take part). Returns the
 * verdict of a rank that did not fail itself. */
static dtl_status dtl__agree_explain(dtl_comm *c, const char *fn, uint64_t fp, dtl_status local) {
  const int p = c->size;
  int64_t stack_store[2 * DTL__AGREE_STACK_RANKS], *fps = stack_store;
  if (p > DTL__AGREE_STACK_RANKS) fps = dtl__malloc(sizeof(int64_t) * 3 * (size_t)p); /* NULL: names nobody */
  int64_t *sts = fps ? fps + p : NULL;
  dtl_status st = DTL_OK;
  for (int base = 0; base < p && st == DTL_OK; base += DTL__AGREE_CHUNK) {
    int n = p - base < DTL__AGREE_CHUNK ? p - base : DTL__AGREE_CHUNK;
    int64_t v[2 * DTL__AGREE_CHUNK];
    for (int i = 0; i < 2 * n; i++) v[i] = -1;
    if (c->rank >= base && c->rank < base + n) {
      v[c->rank - base] = local == DTL_OK ? dtl__fp63(fp) : 0;
      v[n + c->rank - base] = (int64_t)local;
    }
    st = dtl__comm_max_i64(c, v, 2 * n);
    for (int i = 0; fps && i < n; i++) {
      fps[base + i] = v[i];
      sts[base + i] = v[n + i];
    }
  }
  if (local != DTL_OK || st != DTL_OK || !fps) {
    if (fps != stack_store) dtl__free(fps);
    if (local != DTL_OK) return local;
    if (st != DTL_OK) return dtl__error_prefix(st, "%s: agreeing with the other ranks", fn);
    return dtl__error_fn(DTL_ERR_MISMATCH, fn, "some rank failed or disagrees about the call (out of host memory "
                         "to name it)");
  }
  /* The reference fingerprint: the most common among the ranks that succeeded, the lowest rank's among
   * equally common ones (so that with two ranks, rank 0's call is the reference). */
  int64_t *sorted = fps + 2 * p, sorted_stack[DTL__AGREE_STACK_RANKS];
  if (p <= DTL__AGREE_STACK_RANKS) sorted = sorted_stack;
  int ok = 0;
  for (int r = 0; r < p; r++)
    if (sts[r] == DTL_OK) sorted[ok++] = fps[r];
  qsort(sorted, (size_t)ok, sizeof *sorted, dtl__cmp_i64);
  int best = 0;
  for (int i = 0, j; i < ok; i = j) {
    for (j = i; j < ok && sorted[j] == sorted[i]; j++) {}
    if (j - i > best) best = j - i;
  }
  int64_t ref = -1;
  for (int r = 0; r < p && ref < 0; r++) {
    if (sts[r] != DTL_OK) continue;
    int count = 0;
    for (int q = 0; q < p && count < best; q++) count += sts[q] == DTL_OK && fps[q] == fps[r];
    if (count == best) ref = fps[r];
  }
  char failed[160] = "", differ[160] = "";
  size_t fo = 0, dO = 0;
  int nfailed = 0, ndiffer = 0;
  dtl_status first = DTL_OK;
  for (int r = 0; r < p; r++) {
    if (sts[r] != DTL_OK) {
      if (first == DTL_OK) first = (dtl_status)sts[r];
      dtl__rank_list_add(failed, sizeof failed, &fo, &nfailed, r);
    } else if (fps[r] != ref) {
      dtl__rank_list_add(differ, sizeof differ, &dO, &ndiffer, r);
    }
  }
  if (fps != stack_store) dtl__free(fps);
  if (nfailed)
    return dtl__error_fn(first, fn, "rank%s %s failed (%s; %s dtl_last_error says why), so no rank went on%s%s%s%s",
                         nfailed > 1 ? "s" : "", failed, dtl_status_name(first), nfailed > 1 ? "their" : "its",
                         ndiffer ? "; rank" : "", ndiffer > 1 ? "s " : ndiffer ? " " : "", differ,
                         ndiffer ? " also made another call than the others" : "");
  if (ndiffer == 0) /* cannot happen: the first exchange saw a difference */
    return dtl__error_fn(DTL_ERR_INTERNAL, fn, "the agreement saw a difference that the second exchange did not");
  return dtl__error_fn(DTL_ERR_MISMATCH, fn,
                       "rank%s %s made another call than the other ranks (its arguments that every rank must pass "
                       "alike differ: shape, layout, mesh, dtype, count, root, op, plan or cost model); this rank is "
                       "%d of %d and nothing was communicated", ndiffer > 1 ? "s" : "", differ, c->rank, p);
}

dtl_status dtl__agree_max(dtl_comm *c, const char *fn, uint64_t fp, dtl_status local, int64_t *vals, int n) {
  if (c->size == 1) return local;
  char saved[1024]; /* a failing rank keeps its own message, whatever the exchange records */
  if (local != DTL_OK) snprintf(saved, sizeof saved, "%s", dtl_last_error());
  int64_t h = local == DTL_OK ? dtl__fp63(fp) : 0;
  int64_t v[3 + DTL__AGREE_MAX_EXTRA] = {h, -h, local != DTL_OK};
  for (int i = 0; i < n; i++) v[3 + i] = vals[i];
  dtl_status st = dtl__comm_max_i64(c, v, 3 + n);
  if (st == DTL_OK && v[2] == 0 && v[0] == h && v[1] == -h) {
    for (int i = 0; i < n; i++) vals[i] = v[3 + i];
    return DTL_OK;
  }
  if (st == DTL_OK) st = dtl__agree_explain(c, fn, fp, local);
  else if (local == DTL_OK) st = dtl__error_prefix(st, "%s: agreeing with the other ranks", fn);
  if (local != DTL_OK) return dtl__error(local, "%s", saved);
  return st;
}

dtl_status dtl__agree(dtl_comm *c, const char *fn, uint64_t fp, dtl_status local) {
  return dtl__agree_max(c, fn, fp, local, NULL, 0);
}

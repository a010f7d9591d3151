/* SPDX-License-Identifier: Apache-2.0 */
/* The agreement of agree.h: one small MAX all-reduce decides whether every rank may go on (each fingerprint
 * travels as (h, -h), so max(h) == -max(-h) exactly when all are equal); only when it says no do the ranks
 * exchange their fingerprints and verdicts, in fixed-size chunks, to name who failed or differs. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm/agree.h"
#include "comm/deadline.h"

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

uint64_t dtl__fp_i64s(uint64_t h, const int64_t *v, int n) {
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

#define DTL__AGREE_CHUNK 64
#define DTL__AGREE_REPLY 8 /* verdict, rank, status, count, up to four ranks */

/* The largest staging any agreement exchange of c uses, in int64: the chunks of the second exchange (and the
 * first, 3 + DTL__AGREE_MAX_EXTRA), or dtl__agree_among's verdicts (2 per rank) and reply. */
static size_t dtl__agree_need(const dtl_comm *c) {
  size_t among = 2 * (size_t)c->size + DTL__AGREE_REPLY, chunk = 2 * DTL__AGREE_CHUNK;
  return among > chunk ? among : chunk;
}

size_t dtl__agree_host_len(const dtl_comm *c) { return 3 * (size_t)c->size + dtl__agree_need(c); }

/* Device communicators: acquired when the communicator is made, so that no agreement allocates. */
dtl_status dtl__agree_reserve(dtl_comm *c) {
  size_t bytes = dtl__agree_need(c) * sizeof(int64_t);
  return dtl__mem_alloc(&c->mem, bytes, &c->agree_buf);
}

/* Where an agreement's exchanges move their values: device memory on a device communicator; on a host one under a
 * deadline, the host staging after the 3 x size verdicts (the callers' values live on their stacks, which a
 * timed-out call must not leave to MPI); NULL otherwise (straight from the caller's arrays). */
static int64_t *dtl__agree_staging(const dtl_comm *c) {
  if (c->mem.ops->memory == DTL_MEMORY_DEVICE) return c->agree_buf;
  return dtl__comm_timed(c) ? c->agree_host + 3 * (size_t)c->size : NULL;
}

dtl_status dtl__comm_max_i64(dtl_comm *c, int64_t *v, int n) {
  int64_t *stage = dtl__agree_staging(c);
  if (!stage) return c->ops->all_reduce(c, v, v, (size_t)n, DTL_INT64, DTL_MAX);
  size_t bytes = sizeof(int64_t) * (size_t)n;
  if (bytes > dtl__agree_need(c) * sizeof(int64_t))
    return dtl__error(DTL_ERR_INTERNAL, "dtl agreement: %zu bytes of staging, %zu reserved", bytes,
                      dtl__agree_need(c) * sizeof(int64_t));
  DTL_TRY(dtl__mem_copy(&c->mem, stage, v, bytes));
  DTL_TRY(c->ops->all_reduce(c, stage, stage, (size_t)n, DTL_INT64, DTL_MAX));
  DTL_TRY(dtl__mem_copy(&c->mem, v, stage, bytes));
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

/* The second exchange, run by every rank once the first said something is wrong: every rank's fingerprint
 * and verdict, DTL__AGREE_CHUNK ranks per all-reduce (no allocation is needed to take part). Returns the
 * verdict of a rank that did not fail itself. */
static dtl_status dtl__agree_explain(dtl_comm *c, const char *fn, uint64_t fp, dtl_status local) {
  const int p = c->size;
  int64_t *fps = c->agree_host, *sts = fps + p; /* and the sorted fingerprints after them: 3 x size */
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
    for (int i = 0; i < n; i++) {
      fps[base + i] = v[i];
      sts[base + i] = v[n + i];
    }
  }
  if (local != DTL_OK) return local;
  if (st != DTL_OK) return dtl__error_prefix(st, "%s: agreeing with the other ranks", fn);
  /* The reference fingerprint: the most common among the ranks that succeeded, the lowest rank's among
   * equally common ones (so that with two ranks, rank 0's call is the reference). */
  int64_t *sorted = fps + 2 * p;
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

/* One round of messages of dtl__agree_among, then (device memory) the copy back of what arrived. */
static dtl_status dtl__agree_p2p(dtl_comm *c, int ns, const int *sp, const void *const *sb, const size_t *sc, int nr,
                                 const int *rp, void *const *rb, const size_t *rc) {
  DTL_TRY(c->ops->exchange(c, ns, sp, sb, sc, nr, rp, rb, rc, DTL_INT64, NULL));
  return c->ops->synchronize(c);
}

dtl_status dtl__agree_among(dtl_comm *c, int n, const int *ranks, const char *fn, uint64_t fp, dtl_status local) {
  if (n == c->size) return dtl__agree(c, fn, fp, local);
  if (n <= 1) return local;
  if (!c->ops->exchange)
    return local != DTL_OK ? local : dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "the %s transport has no point-to-point "
                                                   "exchange to agree over part of a communicator", c->ops->name);
  char saved[1024];
  if (local != DTL_OK) snprintf(saved, sizeof saved, "%s", dtl_last_error());
  /* Staged on a device communicator, and on a host one under a deadline (dtl__agree_staging). */
  int64_t *buf = dtl__agree_staging(c), *all = c->agree_host;
  bool staged = buf != NULL;
  int leader = ranks[0];
  int64_t mine[2] = {local == DTL_OK ? dtl__fp63(fp) : 0, (int64_t)local}, reply[DTL__AGREE_REPLY] = {0};
  /* Everything was acquired with the communicator: the staging (the leader's n entries of 2, then the reply) and
   * the leader's host view of every verdict. */
  dtl_status st = DTL_OK;
  size_t two = 2, rn = DTL__AGREE_REPLY;
  if (c->rank != leader) {
    if (staged) st = dtl__mem_copy(&c->mem, buf, mine, sizeof mine);
    const void *sb = staged ? (const void *)buf : (const void *)mine;
    void *rb = staged ? (void *)(buf + 2) : (void *)reply;
    if (st == DTL_OK) st = dtl__agree_p2p(c, 1, &leader, &sb, &two, 1, &leader, &rb, &rn);
    if (st == DTL_OK && staged) st = dtl__mem_copy(&c->mem, reply, buf + 2, sizeof reply);
    if (st == DTL_OK) st = c->ops->synchronize(c);
  } else {
    /* Receive every verdict, judge, answer every rank alike. Up to 64 ranks per round of messages. */
    all[0] = mine[0];
    all[1] = mine[1];
    for (int base = 1; base < n && st == DTL_OK; base += 64) {
      int k = n - base < 64 ? n - base : 64;
      void *rb[64];
      size_t rc[64];
      for (int i = 0; i < k; i++) {
        rb[i] = staged ? (void *)(buf + 2 * i) : (void *)(all + 2 * (base + i));
        rc[i] = 2;
      }
      st = dtl__agree_p2p(c, 0, NULL, NULL, NULL, k, ranks + base, rb, rc);
      if (st == DTL_OK && staged) st = dtl__mem_copy(&c->mem, all + 2 * base, buf, sizeof(int64_t) * 2 * (size_t)k);
      if (st == DTL_OK && staged) st = c->ops->synchronize(c);
    }
    if (st == DTL_OK) {
      reply[1] = -1;
      for (int i = 0; i < n; i++) {
        if (all[2 * i + 1] != DTL_OK && reply[1] < 0) {
          reply[0] = 1;
          reply[1] = ranks[i];
          reply[2] = all[2 * i + 1];
        } else if (all[2 * i + 1] == DTL_OK && all[2 * i] != all[0] && all[1] == DTL_OK) {
          if (reply[3] < 4) reply[4 + reply[3]] = ranks[i];
          reply[3]++;
        }
      }
      if (reply[0] == 0 && reply[3] > 0) reply[0] = 2;
      int64_t *src = reply;
      if (staged && (st = dtl__mem_copy(&c->mem, buf, reply, sizeof reply)) == DTL_OK) src = buf;
      for (int base = 1; base < n && st == DTL_OK; base += 64) {
        int k = n - base < 64 ? n - base : 64;
        const void *sb[64];
        size_t sc[64];
        for (int i = 0; i < k; i++) {
          sb[i] = src;
          sc[i] = DTL__AGREE_REPLY;
        }
        st = dtl__agree_p2p(c, k, ranks + base, sb, sc, 0, NULL, NULL, NULL);
      }
    }
  }
  if (local != DTL_OK) return dtl__error(local, "%s", saved);
  if (st != DTL_OK) return dtl__error_prefix(st, "%s: agreeing with the other ranks", fn);
  if (reply[0] == 1)
    return dtl__error_fn((dtl_status)reply[2], fn, "rank %d failed (%s; its dtl_last_error says why), so no rank went on",
                         (int)reply[1], dtl_status_name((dtl_status)reply[2]));
  if (reply[0] == 2) {
    char list[64] = "";
    size_t o = 0;
    for (int i = 0; i < reply[3] && i < 4; i++) o += (size_t)snprintf(list + o, sizeof list - o, i ? ",%d" : "%d", (int)reply[4 + i]);
    if (reply[3] > 4) snprintf(list + o, sizeof list - o, ",...");
    return dtl__error_fn(DTL_ERR_MISMATCH, fn, "rank%s %s made another call than rank %d (its arguments that every rank "
                         "must pass alike differ: layouts, meshes, plan or cost model); nothing was communicated",
                         reply[3] > 1 ? "s" : "", list, leader);
  }
  return DTL_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The planner's alpha-beta cost model: engine defaults, DTL_PLAN_TUNE, and the bytes and time of each step
 * kind, per rank and as the maximum over the mesh computed from the global shape. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "redistribute/cost.h"

/* Host MPI: ~2 us per message round, ~5 GB/s per link, ~10 GB/s memcpy. NCCL: ~10 us per round (kernel
 * launch and protocol), ~100 GB/s NVLink, ~1 TB/s device memory. Orders of magnitude, not calibrations:
 * they decide between plans, and DTL_PLAN_TUNE or dtl_plan_create_with_cost fit them to a machine. */
static const dtl_cost_model dtl__cost_mpi = {DTL__COST_ALL, 2e-6, 2e-10, 1e-10};
static const dtl_cost_model dtl__cost_nccl = {DTL__COST_ALL, 1e-5, 1e-11, 1e-12};

dtl_status dtl_cost_model_default(dtl_memory memory, dtl_cost_model *out) {
  static const char fn[] = "dtl_cost_model_default";
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_CHECK_ARG(memory == DTL_MEMORY_HOST || memory == DTL_MEMORY_DEVICE, fn,
                "memory=%d (expected DTL_MEMORY_HOST or DTL_MEMORY_DEVICE)", (int)memory);
  *out = memory == DTL_MEMORY_DEVICE ? dtl__cost_nccl : dtl__cost_mpi;
  return DTL_OK;
}

static bool dtl__cost_value_ok(double v) { return isfinite(v) && v >= 0; }

dtl_status dtl__cost_parse_tune(const char *fn, const char *text, dtl_cost_model *inout) {
  static const struct {
    const char *key;
    uint64_t bit;
  } keys[] = {{"alpha", DTL_COST_ALPHA}, {"beta", DTL_COST_BETA}, {"local_beta", DTL_COST_LOCAL_BETA}};
  static const char expected[] =
      "expected comma-separated key=value with keys alpha (s), beta (s/B), local_beta (s/B), each at most once, "
      "values finite and >= 0, no blanks, e.g. \"alpha=2e-6,beta=2e-10,local_beta=1e-10\"";
  dtl_cost_model m = *inout;
  uint64_t seen = 0;
  const char *p = text;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char entry[64];
    if (len == 0 || len >= sizeof entry)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "DTL_PLAN_TUNE=\"%s\": %s entry at offset %d (%s)", text,
                           len ? "over-long" : "empty", (int)(p - text), expected);
    memcpy(entry, p, len);
    entry[len] = '\0';
    char *eq = strchr(entry, '=');
    int k = -1;
    if (eq) {
      *eq = '\0';
      for (int i = 0; i < 3; i++)
        if (strcmp(entry, keys[i].key) == 0) k = i;
      *eq = '=';
    }
    if (k < 0)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "DTL_PLAN_TUNE=\"%s\": entry \"%s\" has no known key (%s)", text,
                           entry, expected);
    if (seen & keys[k].bit)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "DTL_PLAN_TUNE=\"%s\": %s is given twice (%s)", text,
                           keys[k].key, expected);
    const char *num = eq + 1;
    char *stop = NULL;
    errno = 0;
    double v = (*num && *num != ' ' && *num != '\t') ? strtod(num, &stop) : NAN;
    if (!stop || stop == num || *stop != '\0' || errno == ERANGE || !dtl__cost_value_ok(v))
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "DTL_PLAN_TUNE=\"%s\": %s=\"%s\" is not a finite number >= 0 (%s)",
                           text, keys[k].key, num, expected);
    seen |= keys[k].bit;
    if (k == 0) m.alpha_s = v;
    if (k == 1) m.beta_s_per_byte = v;
    if (k == 2) m.local_beta_s_per_byte = v;
    if (!end) break;
    p = end + 1;
    if (!*p)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "DTL_PLAN_TUNE=\"%s\": trailing comma (%s)", text, expected);
  }
  *inout = m;
  return DTL_OK;
}

dtl_status dtl__cost_resolve(const char *fn, const dtl_mesh *mesh, const dtl_cost_model *over, dtl_cost_model *out) {
  dtl_memory mem = mesh->comm ? dtl_comm_memory(mesh->comm) : DTL_MEMORY_HOST;
  dtl_cost_model m = mem == DTL_MEMORY_DEVICE ? dtl__cost_nccl : dtl__cost_mpi;
  const char *tune = getenv("DTL_PLAN_TUNE");
  if (tune) DTL_TRY(dtl__cost_parse_tune(fn, tune, &m));
  if (over) {
    DTL_CHECK_ARG((over->mask & ~(uint64_t)DTL__COST_ALL) == 0, fn,
                  "cost->mask=0x%llx has unknown bits (expected DTL_COST_ALPHA | DTL_COST_BETA | DTL_COST_LOCAL_BETA)",
                  (unsigned long long)over->mask);
    DTL_CHECK_ARG(!(over->mask & DTL_COST_ALPHA) || dtl__cost_value_ok(over->alpha_s), fn,
                  "cost->alpha_s=%g (expected finite and >= 0)", over->alpha_s);
    DTL_CHECK_ARG(!(over->mask & DTL_COST_BETA) || dtl__cost_value_ok(over->beta_s_per_byte), fn,
                  "cost->beta_s_per_byte=%g (expected finite and >= 0)", over->beta_s_per_byte);
    DTL_CHECK_ARG(!(over->mask & DTL_COST_LOCAL_BETA) || dtl__cost_value_ok(over->local_beta_s_per_byte), fn,
                  "cost->local_beta_s_per_byte=%g (expected finite and >= 0)", over->local_beta_s_per_byte);
    if (over->mask & DTL_COST_ALPHA) m.alpha_s = over->alpha_s;
    if (over->mask & DTL_COST_BETA) m.beta_s_per_byte = over->beta_s_per_byte;
    if (over->mask & DTL_COST_LOCAL_BETA) m.local_beta_s_per_byte = over->local_beta_s_per_byte;
  }
  m.mask = DTL__COST_ALL;
  *out = m;
  return DTL_OK;
}

/* --- volumes ---------------------------------------------------------------------------------------- */

static int64_t dtl__chunk_size(int64_t n, int k, int i) {
  int64_t off, size;
  dtl__chunk(n, k, i, &off, &size);
  return size;
}

/* The volume of a step for one rank, from scalars: the rank's coordinate c on the step's mesh dim of p
 * ranks, A = the group's extent of the tensor dim the step unshards (S(i) -> R or S(j)), B = the group's
 * extent of the tensor dim it shards (-> S(j)), rest = the product of the rank's other extents. The
 * rank's own pieces are chunk c of A and B, as the layout rule says for an innermost split. */
static void dtl__volume_scalar(dtl__step_kind kind, int p, int c, int64_t A, int64_t B, uint64_t rest, size_t es,
                               dtl__step_volume *v) {
  uint64_t send = 0, recv = 0, charged = 0;
  switch (kind) {
    case DTL__STEP_ALL_GATHER: { /* ring: receives every block but its own, forwards all but its successor's */
      uint64_t own = (uint64_t)dtl__chunk_size(A, p, c), succ = (uint64_t)dtl__chunk_size(A, p, (c + 1) % p);
      recv = rest * ((uint64_t)A - own);
      send = rest * ((uint64_t)A - succ);
      charged = recv;
      break;
    }
    case DTL__STEP_ALL_REDUCE: /* ring: a reduce-scatter then an all-gather, 2 (p-1)/p of the data each way */
      send = recv = charged = (uint64_t)((unsigned __int128)rest * (unsigned)(2 * (p - 1)) / (unsigned)p);
      break;
    case DTL__STEP_REDUCE_SCATTER: { /* ring: every block but the one the rank keeps passes through it */
      uint64_t own = (uint64_t)dtl__chunk_size(B, p, c);
      send = recv = charged = rest * ((uint64_t)B - own);
      break;
    }
    case DTL__STEP_ALL_TO_ALL: { /* pairwise: keeps the overlap of its old and new pieces, swaps the rest */
      uint64_t a = (uint64_t)dtl__chunk_size(A, p, c), b = (uint64_t)dtl__chunk_size(B, p, c);
      send = rest * a * ((uint64_t)B - b);
      recv = rest * b * ((uint64_t)A - a);
      charged = send > recv ? send : recv;
      break;
    }
    case DTL__STEP_LOCAL_SLICE: charged = rest * (uint64_t)dtl__chunk_size(B, p, c); break;
    case DTL__STEP_LOCAL_PARTIAL: charged = rest; break;
  }
  v->send = send * es;
  v->recv = recv * es;
  v->charged = charged * es;
}

/* The tensor dims a step unshards (i) and shards (j); -1 when none. */
static void dtl__step_dims(int m, const dtl_placement *before, const dtl_placement *after, int *i, int *j) {
  *i = before[m].kind == DTL_SHARD ? before[m].dim : -1;
  *j = after[m].kind == DTL_SHARD ? after[m].dim : -1;
}

void dtl__step_volume_at(const dtl_layout *g, dtl__step_kind kind, int m, const dtl_placement *before,
                         const dtl_placement *after, const int *coord, dtl__step_volume *out) {
  int64_t bs[DTL_MAX_TENSOR_DIMS], as[DTL_MAX_TENSOR_DIMS], off[DTL_MAX_TENSOR_DIMS];
  dtl__local_box(g->mesh, g->ndim, g->shape, before, coord, bs, off);
  dtl__local_box(g->mesh, g->ndim, g->shape, after, coord, as, off);
  int i, j;
  dtl__step_dims(m, before, after, &i, &j);
  uint64_t rest = 1;
  for (int d = 0; d < g->ndim; d++)
    if (d != i && d != j) rest *= (uint64_t)bs[d];
  /* m is the innermost split of i before and of j after, so the group extents are the unsplit ones. */
  dtl__volume_scalar(kind, g->mesh->shape[m], coord[m], i >= 0 ? as[i] : 0, j >= 0 ? bs[j] : 0, rest,
                     dtl_dtype_size(g->dtype), out);
}

/* The distinct extents that tensor dim d of size n takes after the splits of the mesh dims in ks (left to
 * right). torch.chunk gives at most three sizes per split (full, remainder, empty), so the set stays small. */
#define DTL__EXTENT_SET_MAX 96
static int dtl__extent_set(int64_t n, const int *ks, int nk, int64_t *out) {
  int cnt = 1;
  out[0] = n;
  for (int l = 0; l < nk; l++) {
    int64_t next[DTL__EXTENT_SET_MAX];
    int nn = 0;
    for (int e = 0; e < cnt; e++) {
      int k = ks[l];
      int64_t cs = dtl__chunk_size(out[e], k, 0), cand[3];
      int nc = 0;
      cand[nc++] = cs;
      if (cs > 0) {
        int64_t nfull = out[e] / cs, rem = out[e] - nfull * cs;
        if (nfull < k) cand[nc++] = rem;
        if (nfull + 1 < k) cand[nc++] = 0;
      }
      for (int q = 0; q < nc; q++) {
        bool dup = false;
        for (int r = 0; r < nn; r++) dup |= next[r] == cand[q];
        if (!dup && nn < DTL__EXTENT_SET_MAX) next[nn++] = cand[q];
      }
    }
    memcpy(out, next, (size_t)nn * sizeof *out);
    cnt = nn;
  }
  return cnt;
}

/* Extents of tensor dim d under p split by every sharding mesh dim except skip: all distinct values
 * (set != NULL) or the largest (chunk 0 at every level). */
static int dtl__extents(const dtl_layout *g, const dtl_placement *p, int d, int skip, int64_t *set, int64_t *max) {
  int ks[DTL_MAX_MESH_DIMS], nk = 0;
  for (int md = 0; md < g->mesh->ndim; md++)
    if (md != skip && p[md].kind == DTL_SHARD && p[md].dim == d) ks[nk++] = g->mesh->shape[md];
  if (max) {
    int64_t e = g->shape[d];
    for (int l = 0; l < nk; l++) e = dtl__chunk_size(e, ks[l], 0);
    *max = e;
  }
  return set ? dtl__extent_set(g->shape[d], ks, nk, set) : 0;
}

void dtl__step_volume_max(const dtl_layout *g, dtl__step_kind kind, int m, const dtl_placement *before,
                          const dtl_placement *after, dtl__step_volume *out) {
  int i, j;
  dtl__step_dims(m, before, after, &i, &j);
  /* Each mesh dim shards one tensor dim, so the extents of different tensor dims depend on disjoint
   * coordinates and the maximum of their product is the product of their maxima. Only i and j interact
   * with the coordinate on m, so those are enumerated jointly. */
  uint64_t rest = 1;
  for (int d = 0; d < g->ndim; d++) {
    int64_t e;
    if (d == i || d == j) continue;
    dtl__extents(g, before, d, -1, NULL, &e);
    rest *= (uint64_t)e;
  }
  int64_t setA[DTL__EXTENT_SET_MAX] = {0}, setB[DTL__EXTENT_SET_MAX] = {0};
  int nA = i >= 0 ? dtl__extents(g, before, i, m, setA, NULL) : 1;
  int nB = j >= 0 ? dtl__extents(g, before, j, m, setB, NULL) : 1;
  int p = g->mesh->shape[m];
  size_t es = dtl_dtype_size(g->dtype);
  /* Without a split dim the volume does not depend on the coordinate. */
  int nc = (i >= 0 || j >= 0) ? p : 1;
  dtl__step_volume best = {0, 0, 0};
  for (int a = 0; a < nA; a++)
    for (int b = 0; b < nB; b++)
      for (int c = 0; c < nc; c++) {
        dtl__step_volume v;
        dtl__volume_scalar(kind, p, c, setA[a], setB[b], rest, es, &v);
        if (v.send > best.send) best.send = v.send;
        if (v.recv > best.recv) best.recv = v.recv;
        if (v.charged > best.charged) best.charged = v.charged;
      }
  *out = best;
}

int dtl__step_rounds(dtl__step_kind kind, int p) {
  switch (kind) {
    case DTL__STEP_ALL_REDUCE: return 2 * (p - 1);
    case DTL__STEP_ALL_GATHER:
    case DTL__STEP_REDUCE_SCATTER:
    case DTL__STEP_ALL_TO_ALL: return p - 1;
    default: return 0;
  }
}

int64_t dtl__step_cost_ps(const dtl_cost_model *c, dtl__step_kind kind, int p, const dtl__step_volume *max) {
  bool local = kind == DTL__STEP_LOCAL_SLICE || kind == DTL__STEP_LOCAL_PARTIAL;
  /* A collective pays alpha per ring round plus alpha once for the call itself (entry, launch, the
   * synchronisation of its group). Without that term one all-reduce and a reduce-scatter + all-reduce +
   * all-gather over two mesh dims tie on latency, and the planner would trade a collective for a handful
   * of bytes; with it, the hierarchical form wins only once the bytes it saves outweigh one more call. */
  double s = local ? (double)max->charged * c->local_beta_s_per_byte
                   : (dtl__step_rounds(kind, p) + 1) * c->alpha_s + (double)max->charged * c->beta_s_per_byte;
  double ps = s * 1e12, cap = (double)(INT64_MAX / 4);
  return ps >= cap ? (int64_t)(INT64_MAX / 4) : (int64_t)llround(ps);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The planner's alpha-beta cost model: engine defaults, the cost line of a DTL_PROFILE, DTL_PLAN_TUNE, and the
 * bytes and time of each step kind, per rank and as the maximum over the mesh computed from the global shape. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm/profile.h"
#include "redistribute/cost.h"

/* Host MPI: ~2 us per message round, ~5 GB/s per link, ~10 GB/s memcpy; between nodes ~5 us and ~1.25 GB/s
 * (10 GbE-class). NCCL: ~10 us per round (kernel launch and protocol), ~100 GB/s NVLink, ~1 TB/s device memory;
 * between nodes ~20 us and ~25 GB/s (one 200 Gb/s NIC). Orders of magnitude, not calibrations: they decide
 * between plans, and DTL_PLAN_TUNE, DTL_PROFILE or dtl_plan_create_with_cost fit them to a machine. */
static const dtl_cost_model dtl__cost_mpi = {.mask = DTL__COST_ALL,
                                             .alpha_s = 2e-6,
                                             .beta_s_per_byte = 2e-10,
                                             .local_beta_s_per_byte = 1e-10,
                                             .inter_alpha_s = 5e-6,
                                             .inter_beta_s_per_byte = 8e-10};
static const dtl_cost_model dtl__cost_nccl = {.mask = DTL__COST_ALL,
                                              .alpha_s = 1e-5,
                                              .beta_s_per_byte = 1e-11,
                                              .local_beta_s_per_byte = 1e-12,
                                              .inter_alpha_s = 2e-5,
                                              .inter_beta_s_per_byte = 4e-11};

dtl_status dtl_cost_model_default(dtl_memory memory, dtl_cost_model *out) {
  static const char fn[] = "dtl_cost_model_default";
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_CHECK_ARG(memory == DTL_MEMORY_HOST || memory == DTL_MEMORY_DEVICE, fn,
                "memory=%d (expected DTL_MEMORY_HOST or DTL_MEMORY_DEVICE)", (int)memory);
  *out = memory == DTL_MEMORY_DEVICE ? dtl__cost_nccl : dtl__cost_mpi;
  return DTL_OK;
}

/* The fields of the model: their DTL_PLAN_TUNE key, their mask bit, their struct member. */
static const struct {
  const char *key, *member;
  uint64_t bit;
  size_t offset;
} dtl__cost_fields[] = {
    {"alpha", "alpha_s", DTL_COST_ALPHA, offsetof(dtl_cost_model, alpha_s)},
    {"beta", "beta_s_per_byte", DTL_COST_BETA, offsetof(dtl_cost_model, beta_s_per_byte)},
    {"local_beta", "local_beta_s_per_byte", DTL_COST_LOCAL_BETA, offsetof(dtl_cost_model, local_beta_s_per_byte)},
    {"inter_alpha", "inter_alpha_s", DTL_COST_INTER_ALPHA, offsetof(dtl_cost_model, inter_alpha_s)},
    {"inter_beta", "inter_beta_s_per_byte", DTL_COST_INTER_BETA, offsetof(dtl_cost_model, inter_beta_s_per_byte)},
};
enum { DTL__COST_NFIELDS = sizeof dtl__cost_fields / sizeof *dtl__cost_fields };

static double *dtl__cost_field(dtl_cost_model *m, int k) { return (double *)((char *)m + dtl__cost_fields[k].offset); }

static bool dtl__cost_value_ok(double v) { return isfinite(v) && v >= 0; }

dtl_status dtl__cost_parse_tune(const char *fn, const char *text, dtl_cost_model *inout) {
  return dtl__cost_parse_text(fn, "DTL_PLAN_TUNE", text, inout);
}

dtl_status dtl__cost_parse_text(const char *fn, const char *source, const char *text, dtl_cost_model *inout) {
  static const char expected[] =
      "expected comma-separated key=value with keys alpha (s), beta (s/B), local_beta (s/B), inter_alpha (s), "
      "inter_beta (s/B), each at most once, values finite and >= 0, no blanks, e.g. \"alpha=2e-6,beta=2e-10,"
      "local_beta=1e-10\"";
  dtl_cost_model m = *inout;
  uint64_t seen = 0;
  char qt[DTL__QUOTE_CAP], qe[DTL__QUOTE_CAP]; /* the text and the bad entry, quoted for the message */
  const char *p = text;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char entry[64];
    if (len == 0 || len >= sizeof entry)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=\"%s\": %s entry at offset %d (%s)",
                           source, dtl__quote(text, qt, sizeof qt),
                           len ? "over-long" : "empty", (int)(p - text), expected);
    memcpy(entry, p, len);
    entry[len] = '\0';
    char *eq = strchr(entry, '=');
    int k = -1;
    if (eq) {
      *eq = '\0';
      for (int i = 0; i < DTL__COST_NFIELDS; i++)
        if (strcmp(entry, dtl__cost_fields[i].key) == 0) k = i;
      *eq = '=';
    }
    if (k < 0)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=\"%s\": entry \"%s\" has no known key (%s)",
                           source, dtl__quote(text, qt, sizeof qt), dtl__quote(entry, qe, sizeof qe), expected);
    if (seen & dtl__cost_fields[k].bit)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=\"%s\": %s is given twice (%s)",
                           source, dtl__quote(text, qt, sizeof qt), dtl__cost_fields[k].key, expected);
    const char *num = eq + 1;
    char *stop = NULL;
    errno = 0;
    double v = (*num && *num != ' ' && *num != '\t') ? strtod(num, &stop) : NAN;
    if (!stop || stop == num || *stop != '\0' || errno == ERANGE || !dtl__cost_value_ok(v))
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=\"%s\": %s=\"%s\" is not a finite number >= 0 (%s)",
                           source, dtl__quote(text, qt, sizeof qt), dtl__cost_fields[k].key, dtl__quote(num, qe, sizeof qe),
                           expected);
    seen |= dtl__cost_fields[k].bit;
    *dtl__cost_field(&m, k) = v;
    if (!end) break;
    p = end + 1;
    if (!*p)
      return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=\"%s\": trailing comma (%s)",
                           source, dtl__quote(text, qt, sizeof qt), expected);
  }
  *inout = m;
  return DTL_OK;
}

dtl_status dtl__cost_from_profile(const char *fn, const dtl_mesh *mesh, dtl_cost_model *inout) {
  dtl__profile p;
  bool present = false;
  DTL_TRY(dtl__profile_from_env(fn, &p, &present));
  if (!present) return DTL_OK;
  const char *engine = mesh->comm ? dtl_comm_backend_name(mesh->comm) : "mpi";
  if (strcmp(p.engine, engine))
    return dtl__error_fn(DTL_ERR_MISMATCH, fn, "%s was recorded for engine %s, used for a plan on a mesh of engine %s "
                         "(calibrate this engine, or unset DTL_PROFILE)", p.source, p.engine, engine);
  if (!p.cost_line) return DTL_OK;
  char where[sizeof p.source + 32];
  snprintf(where, sizeof where, "%s line %d: cost", p.source, p.cost_line);
  return dtl__cost_parse_text(fn, where, p.cost, inout);
}

dtl_status dtl__cost_resolve(const char *fn, const dtl_mesh *mesh, const dtl_cost_model *over, dtl_cost_model *out) {
  dtl_memory mem = mesh->comm ? dtl_comm_memory(mesh->comm) : DTL_MEMORY_HOST;
  dtl_cost_model m = mem == DTL_MEMORY_DEVICE ? dtl__cost_nccl : dtl__cost_mpi;
  DTL_TRY(dtl__cost_from_profile(fn, mesh, &m));
  const char *tune = getenv("DTL_PLAN_TUNE");
  if (tune) DTL_TRY(dtl__cost_parse_tune(fn, tune, &m));
  if (over) {
    DTL_TRY(dtl__check_bits(fn, "cost->mask", over->mask,
                            DTL__BITS(DTL_COST_ALPHA, DTL_COST_BETA, DTL_COST_LOCAL_BETA, DTL_COST_INTER_ALPHA,
                                      DTL_COST_INTER_BETA)));
    DTL_TRY(dtl__check_bits(fn, "cost->flags", over->flags, DTL__NO_BITS));
    for (int k = 0; k < DTL__COST_NFIELDS; k++) {
      if (!(over->mask & dtl__cost_fields[k].bit)) continue;
      double v = *dtl__cost_field((dtl_cost_model *)over, k);
      DTL_CHECK_ARG(dtl__cost_value_ok(v), fn, "cost->%s=%g (expected finite and >= 0)", dtl__cost_fields[k].member, v);
      *dtl__cost_field(&m, k) = v;
    }
  }
  m.mask = DTL__COST_ALL;
  *out = m;
  return DTL_OK;
}

size_t dtl__cost_render(const dtl_cost_model *m, char *buf, size_t cap) {
  size_t o = 0;
  for (int k = 0; k < DTL__COST_NFIELDS; k++)
    o += (size_t)snprintf(o < cap ? buf + o : NULL, o < cap ? cap - o : 0, "%s%s=%.17g", k ? "," : "",
                          dtl__cost_fields[k].key, *dtl__cost_field((dtl_cost_model *)m, k));
  return o;
}

/* --- volumes ---------------------------------------------------------------------------------------- */

/* torch.chunk of n into k, in closed form: chunks 0..nfull-1 hold cs, chunk nfull holds rem (when it
 * exists), the rest are empty. cs comes from dtl__chunk, the one statement of the rule. */
typedef struct {
  int64_t cs, nfull, rem;
} dtl__split;

static dtl__split dtl__split_of(int64_t n, int k) {
  int64_t off, cs;
  dtl__chunk(n, k, 0, &off, &cs);
  dtl__split s = {cs, cs ? n / cs : k, 0};
  s.rem = n - s.nfull * cs;
  return s;
}

static int64_t dtl__split_size(const dtl__split *s, int64_t c) { return c < s->nfull ? s->cs : c == s->nfull ? s->rem : 0; }

/* The volume of a step for one rank, from scalars. A is the group's extent of the tensor dim the step
 * unshards (S(i) -> R or S(j)), a and a_next the pieces of it that the rank and its ring successor hold
 * before; B is the group's extent of the tensor dim the step shards (-> S(j)) and b the rank's piece of it
 * after; rest is the product of the rank's other extents. */
static void dtl__volume_scalar(dtl__step_kind kind, int p, uint64_t A, uint64_t a, uint64_t a_next, uint64_t B,
                               uint64_t b, uint64_t rest, size_t es, dtl__step_volume *v) {
  uint64_t send = 0, recv = 0, charged = 0;
  switch (kind) {
    case DTL__STEP_ALL_GATHER: /* ring: receives every block but its own, forwards all but its successor's */
      recv = charged = rest * (A - a);
      send = rest * (A - a_next);
      break;
    case DTL__STEP_ALL_REDUCE: /* ring: a reduce-scatter then an all-gather, 2 (p-1)/p of the data each way */
      send = recv = charged = (uint64_t)((unsigned __int128)rest * (unsigned)(2 * (p - 1)) / (unsigned)p);
      break;
    case DTL__STEP_REDUCE_SCATTER: /* ring: every block but the one the rank keeps passes through it */
      send = recv = charged = rest * (B - b);
      break;
    case DTL__STEP_ALL_TO_ALL: /* pairwise: keeps the overlap of its old and new pieces, swaps the rest */
      send = rest * a * (B - b);
      recv = rest * b * (A - a);
      charged = send > recv ? send : recv;
      break;
    case DTL__STEP_LOCAL_SLICE: charged = b == B ? 0 : rest * b; break; /* keeping the whole box copies nothing */
    case DTL__STEP_LOCAL_PARTIAL: charged = rest; break;
    case DTL__STEP_LOCAL_EMBED: charged = rest * A; break; /* writes the group's whole extent of i */
    case DTL__STEP_EXCHANGE: break; /* priced from its map (dtl__exchange_cost_ps) */
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
  int i, j, p = g->mesh->shape[m];
  dtl__step_dims(m, before, after, &i, &j);
  uint64_t rest = 1;
  for (int d = 0; d < g->ndim; d++)
    if (d != i && d != j) rest *= (uint64_t)bs[d];
  /* m is the innermost split of i before and of j after, so the group extents are the unsplit ones. */
  uint64_t A = i >= 0 ? (uint64_t)as[i] : 0, a = i >= 0 ? (uint64_t)bs[i] : 0, a_next = 0;
  uint64_t B = j >= 0 ? (uint64_t)bs[j] : 0, b = j >= 0 ? (uint64_t)as[j] : 0;
  if (i >= 0) {
    dtl__split sa = dtl__split_of((int64_t)A, p);
    a_next = (uint64_t)dtl__split_size(&sa, (coord[m] + 1) % p);
  }
  dtl__volume_scalar(kind, p, A, a, a_next, B, b, rest, dtl_dtype_size(g->dtype), out);
}

int dtl__extent_set(int64_t n, const int *ks, int nk, int64_t *out) {
  int cnt = 1;
  out[0] = n;
  for (int l = 0; l < nk; l++) {
    int64_t next[DTL__EXTENT_SET_MAX];
    int nn = 0;
    for (int e = 0; e < cnt; e++) {
      dtl__split sp = dtl__split_of(out[e], ks[l]);
      int64_t cand[3] = {sp.cs, sp.rem, 0};
      int nc = sp.nfull + 1 < ks[l] ? 3 : sp.nfull < ks[l] ? 2 : 1;
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

/* The distinct extents of tensor dim d under p, split by every sharding mesh dim except skip. */
static int dtl__extents(const dtl_layout *g, const dtl_placement *p, int d, int skip, int64_t *set) {
  int ks[DTL_MAX_MESH_DIMS] = {0}, nk = 0;
  for (int md = 0; md < g->mesh->ndim; md++)
    if (md != skip && p[md].kind == DTL_SHARD && p[md].dim == d) ks[nk++] = g->mesh->shape[md];
  return dtl__extent_set(g->shape[d], ks, nk, set);
}

void dtl__step_volume_max(const dtl_layout *g, dtl__step_kind kind, int m, const dtl_placement *before,
                          const dtl_placement *after, dtl__step_volume *out) {
  int i, j, p = g->mesh->shape[m];
  dtl__step_dims(m, before, after, &i, &j);
  /* Each mesh dim shards one tensor dim, so the extents of different tensor dims depend on disjoint
   * coordinates and the maximum of their product is the product of their maxima (chunk 0 at every split
   * is the largest). Only i and j interact with the coordinate on m, so those are enumerated jointly. */
  int64_t maxext[DTL_MAX_TENSOR_DIMS];
  for (int d = 0; d < g->ndim; d++) maxext[d] = g->shape[d];
  for (int md = 0; md < g->mesh->ndim; md++)
    if (before[md].kind == DTL_SHARD) maxext[before[md].dim] = dtl__split_of(maxext[before[md].dim], g->mesh->shape[md]).cs;
  uint64_t rest = 1;
  for (int d = 0; d < g->ndim; d++)
    if (d != i && d != j) rest *= (uint64_t)maxext[d];
  int64_t setA[DTL__EXTENT_SET_MAX], setB[DTL__EXTENT_SET_MAX];
  setA[0] = setB[0] = 0;
  int nA = i >= 0 ? dtl__extents(g, before, i, m, setA) : 1;
  int nB = j >= 0 ? dtl__extents(g, before, j, m, setB) : 1;
  size_t es = dtl_dtype_size(g->dtype);
  dtl__step_volume best = {0, 0, 0};
  for (int x = 0; x < nA; x++)
    for (int y = 0; y < nB; y++) {
      dtl__split sa = dtl__split_of(setA[x], p), sb = dtl__split_of(setB[y], p);
      /* The pieces of c, c+1 and c in A and B change only where a chunk turns from full to remainder to
       * empty (and where the successor wraps), so the coordinates starting those runs see every value. */
      int64_t cand[8] = {0, sa.nfull - 1, sa.nfull, sa.nfull + 1, sb.nfull, sb.nfull + 1, p - 1, 0};
      for (int q = 0; q < 7; q++) {
        int64_t c = cand[q];
        if (c < 0 || c >= p) continue;
        dtl__step_volume v;
        dtl__volume_scalar(kind, p, (uint64_t)setA[x], (uint64_t)dtl__split_size(&sa, c),
                           (uint64_t)dtl__split_size(&sa, (c + 1) % p), (uint64_t)setB[y],
                           (uint64_t)dtl__split_size(&sb, c), rest, es, &v);
        if (v.send > best.send) best.send = v.send;
        if (v.recv > best.recv) best.recv = v.recv;
        if (v.charged > best.charged) best.charged = v.charged;
      }
    }
  *out = best;
}

/* The distinct extents of a tensor dim of size n after the splits ks[0..nk), each with the number of coordinate
 * tuples of those splits that give it (the counts add up to the product of ks). */
static int dtl__extent_multiset(int64_t n, const int *ks, int nk, int64_t *val, uint64_t *cnt) {
  int c = 1;
  val[0] = n;
  cnt[0] = 1;
  for (int l = 0; l < nk; l++) {
    int64_t nv[DTL__EXTENT_SET_MAX];
    uint64_t nc[DTL__EXTENT_SET_MAX];
    int nn = 0;
    for (int e = 0; e < c; e++) {
      dtl__split sp = dtl__split_of(val[e], ks[l]);
      int64_t ext[3] = {sp.cs, sp.rem, 0};
      uint64_t mult[3] = {(uint64_t)sp.nfull, sp.nfull < ks[l] ? 1u : 0u, 0};
      mult[2] = (uint64_t)ks[l] - mult[0] - mult[1];
      for (int q = 0; q < 3; q++) {
        if (!mult[q]) continue;
        int r = 0;
        while (r < nn && nv[r] != ext[q]) r++;
        if (r == nn && nn < DTL__EXTENT_SET_MAX) nv[nn] = ext[q], nc[nn++] = 0;
        if (r < nn) nc[r] += cnt[e] * mult[q];
      }
    }
    memcpy(val, nv, (size_t)nn * sizeof *val);
    memcpy(cnt, nc, (size_t)nn * sizeof *cnt);
    c = nn;
  }
  return c;
}

/* The sum over a group of p of chunk(A, p, c) x chunk(B, p, c): constant between the coordinates where either
 * turns from full to remainder to empty. */
static unsigned __int128 dtl__chunk_dot(int64_t A, int64_t B, int p) {
  dtl__split sa = dtl__split_of(A, p), sb = dtl__split_of(B, p);
  int64_t cut[6] = {0, sa.nfull, sa.nfull + 1, sb.nfull, sb.nfull + 1, p};
  unsigned __int128 sum = 0;
  for (int64_t lo = 0; lo < p;) {
    int64_t hi = p;
    for (int q = 0; q < 6; q++)
      if (cut[q] > lo && cut[q] < hi) hi = cut[q];
    sum += (unsigned __int128)(uint64_t)dtl__split_size(&sa, lo) * (uint64_t)dtl__split_size(&sb, lo) * (uint64_t)(hi - lo);
    lo = hi;
  }
  return sum;
}

uint64_t dtl__step_volume_total(const dtl_layout *g, dtl__step_kind kind, int m, const dtl_placement *before,
                                const dtl_placement *after) {
  if (kind == DTL__STEP_LOCAL_SLICE || kind == DTL__STEP_LOCAL_PARTIAL || kind == DTL__STEP_LOCAL_EMBED ||
      kind == DTL__STEP_EXCHANGE)
    return 0;
  const dtl_mesh *mesh = g->mesh;
  int i, j, p = mesh->shape[m];
  dtl__step_dims(m, before, after, &i, &j);
  /* Summed over the coordinates that shard it, a tensor dim's extent is its global size (the chunks partition it),
   * and the coordinates of mesh dims that shard nothing multiply every sum; the extents of i (before the step's own
   * split) and j (as the group holds it) enter the group's formula jointly, by their multisets. */
  unsigned __int128 mult = 1;
  for (int k = 0; k < mesh->ndim; k++)
    if (k != m && before[k].kind != DTL_SHARD) mult *= (unsigned)mesh->shape[k];
  for (int d = 0; d < g->ndim; d++)
    if (d != i && d != j) mult *= (uint64_t)g->shape[d];
  int64_t va[DTL__EXTENT_SET_MAX] = {1}, vb[DTL__EXTENT_SET_MAX] = {1};
  uint64_t ca[DTL__EXTENT_SET_MAX] = {1}, cb[DTL__EXTENT_SET_MAX] = {1};
  int ks[DTL_MAX_MESH_DIMS] = {0}, nk = 0, na = 1, nb = 1;
  if (i >= 0) {
    nk = 0;
    for (int k = 0; k < mesh->ndim; k++)
      if (k != m && before[k].kind == DTL_SHARD && before[k].dim == i) ks[nk++] = mesh->shape[k];
    na = dtl__extent_multiset(g->shape[i], ks, nk, va, ca);
  }
  if (j >= 0) {
    nk = 0;
    for (int k = 0; k < mesh->ndim; k++)
      if (k != m && before[k].kind == DTL_SHARD && before[k].dim == j) ks[nk++] = mesh->shape[k];
    nb = dtl__extent_multiset(g->shape[j], ks, nk, vb, cb);
  }
  unsigned __int128 group = 0; /* elements the groups send, over every (A, B) pair */
  for (int x = 0; x < na; x++)
    for (int y = 0; y < nb; y++) {
      unsigned __int128 A = (uint64_t)va[x], B = (uint64_t)vb[y], n = 0, w = (unsigned __int128)ca[x] * cb[y];
      switch (kind) {
        case DTL__STEP_ALL_GATHER: n = (unsigned)(p - 1) * A; break; /* every block to the other p - 1 */
        case DTL__STEP_ALL_REDUCE: n = 2 * (unsigned)(p - 1) * A * B; break; /* 2 (p-1)/p of the shard, p times */
        case DTL__STEP_REDUCE_SCATTER: n = (unsigned)(p - 1) * B; break; /* every block but its own, to its owner */
        case DTL__STEP_ALL_TO_ALL: n = A * B - dtl__chunk_dot(va[x], vb[y], p); break; /* what changes owner */
        default: break;
      }
      group += n * w;
    }
  unsigned __int128 total = group * mult * dtl_dtype_size(g->dtype);
  return total > UINT64_MAX ? UINT64_MAX : (uint64_t)total;
}

uint64_t dtl__step_remote_bytes(const dtl_mesh *mesh, dtl__step_kind kind, int m, const int *coord, uint64_t send) {
  int p = mesh->shape[m];
  if (!mesh->dim_inter[m] || dtl__step_rounds(kind, p) == 0) return 0;
  int me = 0, stride = dtl__mesh_stride(mesh, m);
  for (int d = 0; d < mesh->ndim; d++) me = me * mesh->shape[d] + coord[d];
  int base = me - coord[m] * stride, node = dtl__mesh_node(mesh, me);
  if (kind != DTL__STEP_ALL_TO_ALL)
    return dtl__mesh_node(mesh, base + (coord[m] + 1) % p * stride) != node ? send : 0;
  int far = 0;
  for (int c = 0; c < p; c++) far += dtl__mesh_node(mesh, base + c * stride) != node;
  return (uint64_t)((unsigned __int128)send * (unsigned)far / (unsigned)(p - 1));
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

/* Seconds to whole picoseconds, saturating at DTL__STEP_COST_CAP_PS so that no sum the search forms overflows. */
static int64_t dtl__ps(double s) {
  double ps = s * 1e12;
  return ps >= (double)DTL__STEP_COST_CAP_PS ? DTL__STEP_COST_CAP_PS : (int64_t)llround(ps);
}

/* The link class's latency and bandwidth: inter-node or intra-node. */
static double dtl__alpha(const dtl_cost_model *c, bool inter) { return inter ? c->inter_alpha_s : c->alpha_s; }
static double dtl__beta(const dtl_cost_model *c, bool inter) {
  return inter ? c->inter_beta_s_per_byte : c->beta_s_per_byte;
}

int64_t dtl__exchange_cost_ps(const dtl_cost_model *c, const dtl__xvolume *max, int rounds) {
  int peers = max->send_peers > max->recv_peers ? max->send_peers : max->recv_peers;
  if (peers == 0) return dtl__ps((double)max->self * c->local_beta_s_per_byte);
  uint64_t bytes = max->send > max->recv ? max->send : max->recv;
  return dtl__ps((double)rounds * (peers + 1) * dtl__alpha(c, max->inter) + (double)bytes * dtl__beta(c, max->inter));
}

int64_t dtl__exchange_step_price(dtl__xmap *x, const dtl_cost_model *c, int rounds, dtl__plan_step *st) {
  dtl__xvolume vmax, vme;
  dtl__xmap_volume_max(x, &vmax);
  int64_t ps = dtl__exchange_cost_ps(c, &vmax, rounds);
  st->peers = vmax.send_peers > vmax.recv_peers ? vmax.send_peers : vmax.recv_peers;
  st->inter = vmax.inter;
  dtl__xmap_volume_at(x, dtl__mesh_index(x->sm), dtl__mesh_index(x->dm), &vme);
  st->send_bytes = vme.send;
  st->recv_bytes = vme.recv;
  st->remote_bytes = vme.send_remote;
  st->cost_s = (double)ps * 1e-12;
  return ps;
}

int64_t dtl__step_cost_ps(const dtl_cost_model *c, dtl__step_kind kind, int p, const dtl__step_volume *max,
                          bool inter) {
  bool local = kind == DTL__STEP_LOCAL_SLICE || kind == DTL__STEP_LOCAL_PARTIAL || kind == DTL__STEP_LOCAL_EMBED;
  /* A collective pays alpha per ring round plus alpha once for the call itself (entry, launch, the
   * synchronisation of its group). Without that term one all-reduce and a reduce-scatter + all-reduce +
   * all-gather over two mesh dims tie on latency, and the planner would trade a collective for a handful
   * of bytes; with it, the hierarchical form wins only once the bytes it saves outweigh one more call. */
  double s = local ? (double)max->charged * c->local_beta_s_per_byte
                   : (dtl__step_rounds(kind, p) + 1) * dtl__alpha(c, inter) + (double)max->charged * dtl__beta(c, inter);
  return dtl__ps(s);
}

double dtl__cost_alpha(const dtl_cost_model *c, bool inter) { return dtl__alpha(c, inter); }

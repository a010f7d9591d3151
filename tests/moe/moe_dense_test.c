/* SPDX-License-Identifier: Apache-2.0 */
/* Distributed MoE against the dense oracle at any world size: every rank replays every rank's tokens and
 * routing from a seed, computes the single-rank MoE (with the same capacity drops, decided independently)
 * for its own tokens, and compares; with integer data and the scaling expert the comparison is exact,
 * including the documented order of the rows each expert receives. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/half.h"
#include "dtl_test.h"
#include "moe_oracle.h"

static dtl_comm *g_comm;

/* --- scenarios ---------------------------------------------------------------------------------------- */
typedef void (*route_fn)(uint64_t seed, int rank, int64_t tokens, int k, int experts, int32_t *ids, float *w);
typedef int64_t (*tokens_fn)(int rank, int size);

typedef struct {
  int experts, k;
  int64_t hidden;
  tokens_fn tokens;
  route_fn route;
  int owner_kind; /* 0: chunk rule; 1: table, reversed round robin; 2: table, all on rank 0 */
  double capacity;  /* <= 0: dropless */
  dtl_moe_drop_policy policy;
  int64_t pad;
  dtl_moe_exchange exchange;
  dtl_dtype dtype;
  int verify;
} scenario;

static int64_t tokens_varied(int rank, int size) { return 6 + 5 * rank + (size == 3); }
static int64_t tokens_odd_ranks_empty(int rank, int size) { return rank % 2 ? 0 : 9 + rank + size; }
static int64_t tokens_none(int rank, int size) { return 0 * rank * size; }

static void route_random(uint64_t seed, int rank, int64_t tokens, int k, int experts, int32_t *ids, float *w) {
  oracle_routing(seed, rank, tokens, k, experts, ids, w);
}
/* Every pair to expert 1 (slot 0) and its neighbours (later slots). */
static void route_one_expert(uint64_t seed, int rank, int64_t tokens, int k, int experts, int32_t *ids, float *w) {
  oracle_routing(seed, rank, tokens, k, experts, ids, w);
  for (int64_t t = 0; t < tokens; t++)
    for (int s = 0; s < k; s++) ids[t * k + s] = (1 + s) % experts;
}
/* Random, with every third slot masked. */
static void route_masked(uint64_t seed, int rank, int64_t tokens, int k, int experts, int32_t *ids, float *w) {
  oracle_routing(seed, rank, tokens, k, experts, ids, w);
  for (int64_t i = 0; i < tokens * k; i++)
    if (i % 3 == 1) ids[i] = -1;
}

static void owner_table(int kind, int experts, int size, int *owner) {
  for (int e = 0; e < experts; e++) owner[e] = kind == 1 ? (size - 1 - e % size) : 0;
}

/* --- dtype conversion of the integer-valued test data -------------------------------------------------- */
static void to_dtype(const float *src, void *dst, size_t n, dtl_dtype t) {
  for (size_t i = 0; i < n; i++) switch (t) {
      case DTL_FLOAT64: ((double *)dst)[i] = src[i]; break;
      case DTL_FLOAT16: ((uint16_t *)dst)[i] = dtl__f32_to_f16(src[i]); break;
      case DTL_BFLOAT16: ((uint16_t *)dst)[i] = dtl__f32_to_bf16(src[i]); break;
      case DTL_INT32: ((int32_t *)dst)[i] = (int32_t)src[i]; break;
      default: ((float *)dst)[i] = src[i]; break;
    }
}
static void from_dtype(const void *src, float *dst, size_t n, dtl_dtype t) {
  for (size_t i = 0; i < n; i++) switch (t) {
      case DTL_FLOAT64: dst[i] = (float)((const double *)src)[i]; break;
      case DTL_FLOAT16: dst[i] = dtl__f16_to_f32(((const uint16_t *)src)[i]); break;
      case DTL_BFLOAT16: dst[i] = dtl__bf16_to_f32(((const uint16_t *)src)[i]); break;
      case DTL_INT32: dst[i] = (float)((const int32_t *)src)[i]; break;
      default: dst[i] = ((const float *)src)[i]; break;
    }
}

/* The expert callback of the exact tests: out = in * (expert + 1), in the layout's dtype. */
static dtl_status scale_expert(const dtl_moe_expert_batch *b, void *user) {
  int *calls = user;
  calls[b->local]++;
  size_t n = (size_t)(b->rows * b->hidden);
  float *tmp = malloc(sizeof(float) * (n ? n : 1));
  from_dtype(b->in, tmp, n, b->dtype);
  for (size_t i = 0; i < n; i++) tmp[i] *= (float)(b->expert + 1);
  to_dtype(tmp, b->out, n, b->dtype);
  free(tmp);
  return DTL_OK;
}

/* Everything one rank's routing gives, replayed by any rank. */
typedef struct {
  int64_t tokens;
  int32_t *ids;
  float *w, *x;
  int *keep;
} rank_data;

static rank_data make_rank(const scenario *sc, uint64_t seed, int r) {
  rank_data d;
  d.tokens = sc->tokens(r, dt_size);
  size_t pairs = (size_t)(d.tokens * sc->k) + 1, cells = (size_t)(d.tokens * sc->hidden) + 1;
  d.ids = malloc(sizeof(int32_t) * pairs);
  d.w = malloc(sizeof(float) * pairs);
  d.x = malloc(sizeof(float) * cells);
  d.keep = malloc(sizeof(int) * pairs);
  sc->route(seed, r, d.tokens, sc->k, sc->experts, d.ids, d.w);
  oracle_tokens(seed, r, d.tokens, sc->hidden, d.x);
  int64_t cap = sc->capacity > 0 ? oracle_capacity(d.tokens, sc->k, sc->experts, sc->capacity) : -1;
  oracle_keep(d.ids, d.w, d.tokens, sc->k, sc->experts, cap, sc->policy == DTL_MOE_DROP_PROBABILITY, d.keep);
  return d;
}
static void free_rank(rank_data *d) {
  free(d->ids);
  free(d->w);
  free(d->x);
  free(d->keep);
}

static dtl_moe_layout_params params_of(const scenario *sc) {
  dtl_moe_layout_params prm = {0};
  if (sc->capacity > 0) {
    prm.mask |= DTL_MOE_LAYOUT_CAPACITY_FACTOR | DTL_MOE_LAYOUT_DROP_POLICY;
    prm.capacity_factor = sc->capacity;
    prm.drop_policy = sc->policy;
  }
  prm.mask |= DTL_MOE_LAYOUT_PAD_MULTIPLE | DTL_MOE_LAYOUT_EXCHANGE | DTL_MOE_LAYOUT_VERIFY;
  prm.pad_multiple = sc->pad ? sc->pad : 1;
  prm.exchange = sc->exchange;
  prm.verify = sc->verify;
  return prm;
}

/* Runs the scaling-expert MoE of a scenario and checks, exactly: the rows each local expert receives (order
 * and padding), the counts, and the combined output; then dispatches fresh tokens through the same layout. */
static void run_exact(const scenario *sc, uint64_t seed) {
  const int E = sc->experts, k = sc->k, P = dt_size, me = dt_rank;
  const int64_t H = sc->hidden;
  int *owner = NULL;
  if (sc->owner_kind) {
    owner = malloc(sizeof(int) * (size_t)E);
    owner_table(sc->owner_kind, E, P, owner);
  }
  dtl_moe_placement *pl = NULL;
  CHECK_OK(dtl_moe_placement_create(E, P, owner, &pl));
  rank_data *all = malloc(sizeof(rank_data) * (size_t)P);
  for (int r = 0; r < P; r++) all[r] = make_rank(sc, seed, r);
  rank_data *mine = &all[me];
  const size_t es = dtl_dtype_size(sc->dtype);
  void *x = malloc(es * (size_t)(mine->tokens * H) + 1);
  to_dtype(mine->x, x, (size_t)(mine->tokens * H), sc->dtype);

  dtl_moe_layout_params prm = params_of(sc);
  dtl_moe_layout *L = NULL;
  CHECK_OK(dtl_moe_layout_create(g_comm, pl, mine->tokens, k, mine->ids, mine->w, H, sc->dtype, &prm, &L));
  if (!L) goto out;

  int max_local = 0;
  for (int r = 0; r < P; r++)
    if (dtl_moe_placement_local_count(pl, r) > max_local) max_local = dtl_moe_placement_local_count(pl, r);
  if (sc->exchange != DTL_MOE_EXCHANGE_AUTO)
    CHECK(dtl_moe_layout_exchange(L) == (max_local == 1 ? DTL_MOE_EXCHANGE_PER_EXPERT : sc->exchange),
          "exchange %d (asked for %d, max local experts %d)", (int)dtl_moe_layout_exchange(L), (int)sc->exchange,
          max_local);

  /* Counts: this rank's kept and dropped pairs per expert. */
  int64_t *kept = calloc((size_t)E, sizeof(int64_t)), *dropped = calloc((size_t)E, sizeof(int64_t));
  CHECK_OK(dtl_moe_layout_token_counts(L, kept, dropped));
  for (int e = 0; e < E; e++) {
    int64_t wk = 0, wd = 0;
    for (int64_t i = 0; i < mine->tokens * k; i++)
      if (mine->ids[i] == e) *(mine->keep[i] ? &wk : &wd) += 1;
    CHECK(kept[e] == wk && dropped[e] == wd, "expert %d: kept %lld dropped %lld (expected %lld, %lld)", e,
          (long long)kept[e], (long long)dropped[e], (long long)wk, (long long)wd);
  }
  free(kept);
  free(dropped);

  /* The expected expert buffer: per local expert, own rows, then other ranks' in rank order, token order. */
  int nl = dtl_moe_placement_local_count(pl, me);
  CHECK(dtl_moe_layout_local_experts(L) == nl, "local experts %d (expected %d)", dtl_moe_layout_local_experts(L), nl);
  int64_t rows = dtl_moe_layout_expert_rows(L);
  float *want_in = calloc((size_t)(rows * H) + 1, sizeof(float));
  int64_t *cnt = calloc((size_t)nl + 1, sizeof(int64_t)), *off = calloc((size_t)nl + 1, sizeof(int64_t));
  CHECK_OK(dtl_moe_layout_expert_counts(L, cnt, off));
  int64_t at = 0;
  for (int j = 0; j < nl; j++) {
    int e = dtl_moe_placement_local_expert(pl, me, j);
    CHECK(off[j] == at, "local expert %d block offset %lld (expected %lld)", j, (long long)off[j], (long long)at);
    int64_t n = 0;
    for (int q = 0; q < P; q++) {
      int s = q == 0 ? me : (q <= me ? q - 1 : q);
      const rank_data *d = &all[s];
      for (int64_t i = 0; i < d->tokens * k; i++)
        if (d->ids[i] == e && d->keep[i] && at + n < rows) {
          memcpy(want_in + (at + n) * H, d->x + (i / k) * H, sizeof(float) * (size_t)H);
          n++;
        }
    }
    CHECK(cnt[j] == n, "local expert %d received %lld rows (expected %lld)", j, (long long)cnt[j], (long long)n);
    int64_t pad = sc->pad ? sc->pad : 1;
    at += (n + pad - 1) / pad * pad;
  }
  CHECK(rows == at, "expert rows %lld (expected %lld)", (long long)rows, (long long)at);

  void *ein = malloc(es * (size_t)(rows * H) + 1), *eout = malloc(es * (size_t)(rows * H) + 1);
  memset(ein, 0x5a, es * (size_t)(rows * H)); /* padding must come back zeroed */
  CHECK_OK(dtl_moe_layout_dispatch(L, x, ein));
  float *got_in = malloc(sizeof(float) * (size_t)(rows * H) + 1);
  from_dtype(ein, got_in, (size_t)(rows * H), sc->dtype);
  int64_t bad = 0;
  for (int64_t i = 0; i < rows * H; i++) bad += got_in[i] != want_in[i];
  CHECK(bad == 0, "%lld of %lld expert input elements differ from the documented dispatch order", (long long)bad,
        (long long)(rows * H));

  if (sc->dtype != DTL_INT32) { /* combine needs a floating dtype */
    int *calls = calloc((size_t)nl + 1, sizeof(int));
    CHECK_OK(dtl_moe_experts_run(L, ein, eout, scale_expert, calls));
    for (int j = 0; j < nl; j++) CHECK(calls[j] == 1, "local expert %d called %d times", j, calls[j]);
    free(calls);
    void *y = malloc(es * (size_t)(mine->tokens * H) + 1);
    float *got = malloc(sizeof(float) * (size_t)(mine->tokens * H) + 1);
    float *want = malloc(sizeof(float) * (size_t)(mine->tokens * H) + 1);
    for (int round = 0; round < 2; round++) {
      if (round == 1) { /* decode-style reuse: new token values, the same routing and layout */
        for (int64_t i = 0; i < mine->tokens * H; i++) mine->x[i] = (float)(((i * 7 + me) % 13) - 6);
        to_dtype(mine->x, x, (size_t)(mine->tokens * H), sc->dtype);
        CHECK_OK(dtl_moe_layout_dispatch(L, x, ein));
        CHECK_OK(dtl_moe_experts_run(L, ein, eout, scale_expert, (int[64]){0}));
      }
      CHECK_OK(dtl_moe_layout_combine(L, eout, y));
      from_dtype(y, got, (size_t)(mine->tokens * H), sc->dtype);
      oracle_moe(mine->x, mine->tokens, H, k, mine->ids, mine->w, mine->keep, oracle_scale_expert, NULL, want);
      /* The sums are exact in f32; a narrower dtype rounds once, at the end, as the oracle does here. */
      to_dtype(want, y, (size_t)(mine->tokens * H), sc->dtype);
      from_dtype(y, want, (size_t)(mine->tokens * H), sc->dtype);
      bad = 0;
      for (int64_t i = 0; i < mine->tokens * H; i++) bad += got[i] != want[i];
      CHECK(bad == 0, "round %d: %lld of %lld combined elements differ from the dense MoE (first: got %g want %g)",
            round, (long long)bad, (long long)(mine->tokens * H), mine->tokens ? (double)got[0] : 0.0,
            mine->tokens ? (double)want[0] : 0.0);
    }
    free(y);
    free(got);
    free(want);
  }
  free(got_in);
  free(want_in);
  free(cnt);
  free(off);
  free(ein);
  free(eout);
  dtl_moe_layout_destroy(L);
out:
  for (int r = 0; r < P; r++) free_rank(&all[r]);
  free(all);
  free(x);
  free(owner);
  dtl_moe_placement_destroy(pl);
}

/* The router and the SiLU-gated MLP expert against the dense MoE in double precision. */
static void run_mlp(int experts, int k, double capacity, uint64_t seed) {
  const int64_t H = 16, F = 24, T = 5 + 4 * dt_rank;
  const int P = dt_size;
  oracle_rng r = oracle_seed(seed, 999);
  size_t wsz = (size_t)experts * (size_t)(F * H);
  float *wg = malloc(sizeof(float) * wsz), *wu = malloc(sizeof(float) * wsz), *wd = malloc(sizeof(float) * wsz);
  for (size_t i = 0; i < wsz; i++) {
    wg[i] = (float)(oracle_uniform(&r) - 0.5);
    wu[i] = (float)(oracle_uniform(&r) - 0.5);
    wd[i] = (float)(oracle_uniform(&r) - 0.5);
  }
  oracle_rng rr = oracle_seed(seed, (uint64_t)dt_rank);
  float *x = malloc(sizeof(float) * (size_t)(T * H)), *logits = malloc(sizeof(float) * (size_t)(T * experts));
  for (int64_t i = 0; i < T * H; i++) x[i] = (float)(2 * oracle_uniform(&rr) - 1);
  for (int64_t i = 0; i < T * experts; i++) logits[i] = (float)(4 * oracle_uniform(&rr) - 2);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * k));
  float *w = malloc(sizeof(float) * (size_t)(T * k));
  dtl_moe_router_params rp = {.mask = DTL_MOE_ROUTER_RENORMALIZE, .renormalize = 1};
  CHECK_OK(dtl_moe_router_topk(logits, T, experts, k, &rp, ids, w));

  dtl_moe_placement *pl = NULL;
  CHECK_OK(dtl_moe_placement_create(experts, P, NULL, &pl));
  dtl_moe_layout_params prm = {0};
  if (capacity > 0) {
    prm.mask = DTL_MOE_LAYOUT_CAPACITY_FACTOR;
    prm.capacity_factor = capacity;
  }
  dtl_moe_layout *L = NULL;
  CHECK_OK(dtl_moe_layout_create(g_comm, pl, T, k, ids, w, H, DTL_FLOAT32, &prm, &L));
  int nl = dtl_moe_placement_local_count(pl, dt_rank);
  const float **lg = malloc(sizeof(float *) * (size_t)(nl + 1)), **lu = malloc(sizeof(float *) * (size_t)(nl + 1)),
              **ld = malloc(sizeof(float *) * (size_t)(nl + 1));
  for (int j = 0; j < nl; j++) {
    size_t e = (size_t)dtl_moe_placement_local_expert(pl, dt_rank, j);
    lg[j] = wg + e * (size_t)(F * H);
    lu[j] = wu + e * (size_t)(F * H);
    ld[j] = wd + e * (size_t)(F * H);
  }
  dtl_moe_mlp mlp = {.hidden = H, .ffn = F, .local_experts = nl, .w_gate = lg, .w_up = lu, .w_down = ld};
  int64_t rows = L ? dtl_moe_layout_expert_rows(L) : 0;
  float *ein = malloc(sizeof(float) * (size_t)(rows * H) + 4), *eout = malloc(sizeof(float) * (size_t)(rows * H) + 4);
  float *y = malloc(sizeof(float) * (size_t)(T * H)), *want = malloc(sizeof(float) * (size_t)(T * H));
  if (L) {
    CHECK_OK(dtl_moe_layout_dispatch(L, x, ein));
    CHECK_OK(dtl_moe_experts_run(L, ein, eout, dtl_moe_mlp_forward, &mlp));
    CHECK_OK(dtl_moe_layout_combine(L, eout, y));
    int *keep = malloc(sizeof(int) * (size_t)(T * k));
    oracle_keep(ids, w, T, k, experts, capacity > 0 ? oracle_capacity(T, k, experts, capacity) : -1, 0, keep);
    oracle_mlp om = {H, F, wg, wu, wd};
    oracle_moe(x, T, H, k, ids, w, keep, oracle_mlp_expert, &om, want);
    double err = 0, mag = 0;
    for (int64_t i = 0; i < T * H; i++) {
      err = fmax(err, fabs((double)y[i] - want[i]));
      mag = fmax(mag, fabs((double)want[i]));
    }
    CHECK(err <= 1e-5 * fmax(1.0, mag), "max error %g against the dense MoE (max |y| %g)", err, mag);
    free(keep);
    dtl_moe_layout_destroy(L);
  }
  dtl_moe_placement_destroy(pl);
  free(wg); free(wu); free(wd); free(x); free(logits); free(ids); free(w);
  free(lg); free(lu); free(ld); free(ein); free(eout); free(y); free(want);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &g_comm));

  RUN_NAMED("mlp_experts_match_dense_moe_k1", run_mlp(8, 1, 0, 1));
  RUN_NAMED("mlp_experts_match_dense_moe_k2", run_mlp(8, 2, 0, 2));
  RUN_NAMED("mlp_experts_match_dense_moe_k4", run_mlp(8, 4, 0, 3));
  RUN_NAMED("mlp_experts_match_dense_moe_with_capacity_drops", run_mlp(6, 2, 0.75, 4));
  RUN_NAMED("mlp_experts_match_dense_moe_uneven_experts_per_rank", run_mlp(5, 2, 0, 5));

  const dtl_moe_exchange modes[] = {DTL_MOE_EXCHANGE_AUTO, DTL_MOE_EXCHANGE_PER_EXPERT, DTL_MOE_EXCHANGE_SINGLE};
  for (int m = 0; m < 3; m++)
    for (int k = 1; k <= 4; k *= 2) {
      char name[96];
      scenario sc = {.experts = 8, .k = k, .hidden = 12, .tokens = tokens_varied, .route = route_random,
                     .exchange = modes[m], .dtype = DTL_FLOAT32, .verify = 1};
      snprintf(name, sizeof name, "integer_tokens_scaling_expert_exact_k%d_exchange%d", k, m);
      RUN_NAMED(name, run_exact(&sc, 10 + (uint64_t)k));
      sc.pad = 4;
      snprintf(name, sizeof name, "padded_blocks_keep_rows_and_zero_padding_k%d_exchange%d", k, m);
      RUN_NAMED(name, run_exact(&sc, 20 + (uint64_t)k));
      sc.pad = 1;
      sc.experts = 7; /* uneven blocks: 2,2,2,1 at 4 ranks, 3,3,1 at 3 */
      snprintf(name, sizeof name, "uneven_expert_blocks_exact_k%d_exchange%d", k, m);
      RUN_NAMED(name, run_exact(&sc, 30 + (uint64_t)k));
    }

  scenario base = {.experts = 8, .k = 2, .hidden = 10, .tokens = tokens_varied, .route = route_random,
                   .dtype = DTL_FLOAT32, .verify = 1};
  scenario sc = base;
  sc.route = route_one_expert;
  sc.k = 1;
  RUN_NAMED("all_tokens_to_one_expert_k1", run_exact(&sc, 40));
  sc.k = 2;
  sc.exchange = DTL_MOE_EXCHANGE_SINGLE;
  RUN_NAMED("all_tokens_to_two_neighbouring_experts_single_exchange", run_exact(&sc, 41));

  sc = base;
  sc.tokens = tokens_odd_ranks_empty;
  RUN_NAMED("ranks_with_no_tokens_send_nothing", run_exact(&sc, 42));
  sc.owner_kind = 2;
  RUN_NAMED("ranks_owning_no_expert_receive_nothing", run_exact(&sc, 43));
  sc.experts = 2; /* chunk rule over more ranks than experts */
  sc.owner_kind = 0;
  RUN_NAMED("more_ranks_than_experts_leave_ranks_without_experts", run_exact(&sc, 44));
  sc = base;
  sc.owner_kind = 1;
  sc.exchange = DTL_MOE_EXCHANGE_PER_EXPERT;
  RUN_NAMED("explicit_expert_table_places_experts_round_robin", run_exact(&sc, 45));
  sc = base;
  sc.tokens = tokens_none;
  RUN_NAMED("zero_tokens_everywhere", run_exact(&sc, 46));
  sc = base;
  sc.route = route_masked;
  RUN_NAMED("masked_slots_are_skipped", run_exact(&sc, 47));

  const double factors[] = {0.25, 0.5, 1.0, 1.25};
  for (int f = 0; f < 4; f++)
    for (int pol = 0; pol < 2; pol++)
      for (int m = 1; m < 3; m++) {
        char name[96];
        sc = base;
        sc.capacity = factors[f];
        sc.policy = pol ? DTL_MOE_DROP_PROBABILITY : DTL_MOE_DROP_POSITION;
        sc.exchange = modes[m];
        sc.pad = pol ? 3 : 1;
        snprintf(name, sizeof name, "capacity_%g_%s_drops_match_reference_exchange%d", factors[f],
                 pol ? "probability" : "position", m);
        RUN_NAMED(name, run_exact(&sc, 50 + (uint64_t)f));
      }
  sc = base;
  sc.route = route_one_expert;
  sc.capacity = 1.0;
  RUN_NAMED("capacity_caps_a_hot_expert", run_exact(&sc, 60));

  const dtl_dtype types[] = {DTL_FLOAT64, DTL_FLOAT16, DTL_BFLOAT16, DTL_INT32};
  for (int i = 0; i < 4; i++) {
    char name[96];
    sc = base;
    sc.dtype = types[i];
    sc.exchange = modes[i % 3];
    snprintf(name, sizeof name, "dtype_%s_rows_move_exactly", dtl_dtype_name(types[i]));
    RUN_NAMED(name, run_exact(&sc, 70 + (uint64_t)i));
  }
  sc = base;
  sc.verify = 0;
  RUN_NAMED("unverified_layout_gives_the_same_result", run_exact(&sc, 80));

  dtl_comm_destroy(g_comm);
  return dt_finish();
}

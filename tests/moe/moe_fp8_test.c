/* SPDX-License-Identifier: Apache-2.0 */
/* FP8 dispatch (DTL_MOE_LAYOUT_FP8_DISPATCH) against the plain dispatch and the dense oracle, at any world size:
 * an FP8 layout's dispatch is bit for bit the plain layout's dispatch of dequantize(quantize(x)) (the rule restated
 * in tests/common/act_fp8_ref.h), its raw codes and scales are each token's quantized row in the documented
 * dispatch order (padding rows zero), combine in the layout's dtype then equals the plain combine of those rows, and
 * the end-to-end error against the unquantized MoE stays within the e4m3 bound (rank 0 prints the measured
 * errors). Bad input: a NaN or infinity on one rank fails every rank naming the token row, with nothing written;
 * dtypes FP8 cannot carry, unknown flags, ranks that disagree on the flag, the raw call on a plain layout, and bad
 * raw buffers. Repeated FP8 rounds allocate nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/alloc.h"
#include "act_fp8_ref.h"
#include "dtl_test.h"
#include "moe_oracle.h"

static dtl_comm *g_comm;

typedef int64_t (*tokens_fn)(int rank, int size);
static int64_t tokens_varied(int rank, int size) { return 5 + 3 * rank + (size == 4); }
static int64_t tokens_odd_ranks_empty(int rank, int size) { return rank % 2 ? 0 : 7 + rank + size; }

typedef struct {
  const char *name;
  int experts, k;
  int64_t hidden;
  tokens_fn tokens;
  double capacity; /* <= 0: dropless */
  dtl_moe_drop_policy policy;
  int64_t pad;
  dtl_moe_exchange exchange;
  dtl_dtype dtype;
} scenario;

/* One rank's tokens and routing, replayable by every rank. */
typedef struct {
  int64_t tokens;
  int32_t *ids;
  float *w;
  void *x; /* [tokens, hidden] of the scenario's dtype */
  int *keep;
} rank_data;

static rank_data make_rank(const scenario *sc, int r) {
  rank_data d;
  d.tokens = sc->tokens(r, dt_size);
  size_t pairs = (size_t)(d.tokens * sc->k) + 1, cells = (size_t)(d.tokens * sc->hidden) + 1;
  d.ids = malloc(sizeof(int32_t) * pairs);
  d.w = malloc(sizeof(float) * pairs);
  d.keep = malloc(sizeof(int) * pairs);
  d.x = malloc(dtl_dtype_size(sc->dtype) * cells);
  oracle_routing(31, r, d.tokens, sc->k, sc->experts, d.ids, d.w);
  for (size_t i = 0; i + 1 < cells; i++) ref_fp8_store(d.x, i, sc->dtype, ref_fp8_value(1000 + (uint64_t)r, i));
  int64_t cap = sc->capacity > 0 ? oracle_capacity(d.tokens, sc->k, sc->experts, sc->capacity) : -1;
  oracle_keep(d.ids, d.w, d.tokens, sc->k, sc->experts, cap, sc->policy == DTL_MOE_DROP_PROBABILITY, d.keep);
  return d;
}
static void free_rank(rank_data *d) {
  free(d->ids), free(d->w), free(d->keep), free(d->x);
}

static dtl_moe_layout_params params_of(const scenario *sc, bool fp8) {
  dtl_moe_layout_params prm = {.mask = DTL_MOE_LAYOUT_PAD_MULTIPLE | DTL_MOE_LAYOUT_EXCHANGE,
                               .flags = fp8 ? DTL_MOE_LAYOUT_FP8_DISPATCH : 0,
                               .pad_multiple = sc->pad,
                               .exchange = sc->exchange};
  if (sc->capacity > 0) {
    prm.mask |= DTL_MOE_LAYOUT_CAPACITY_FACTOR | DTL_MOE_LAYOUT_DROP_POLICY;
    prm.capacity_factor = sc->capacity;
    prm.drop_policy = sc->policy;
  }
  return prm;
}

/* out = in * (expert + 1) in f32, rounded to the batch's dtype; allocates nothing. */
static dtl_status scale_expert(const dtl_moe_expert_batch *b, void *user) {
  (void)user;
  for (int64_t i = 0; i < b->rows * b->hidden; i++)
    ref_fp8_store(b->out, (size_t)i, b->dtype, ref_fp8_load(b->in, (size_t)i, b->dtype) * (float)(b->expert + 1));
  return DTL_OK;
}

static double unit_roundoff(dtl_dtype t) { return t == DTL_FLOAT32 ? 0x1p-24 : t == DTL_FLOAT16 ? 0x1p-11 : 0x1p-8; }

/* The errors of the FP8 path against the unquantized MoE, over every rank and scenario (printed at the end). */
static double g_err_abs, g_err_rel_row, g_err_rel_elem;

static void fp8_dispatch_is_the_plain_dispatch_of_the_round_trip(const scenario *sc) {
  const int P = dt_size, me = dt_rank, k = sc->k;
  const int64_t H = sc->hidden, nb = ref_fp8_blocks(H);
  const dtl_dtype t = sc->dtype;
  const size_t es = dtl_dtype_size(t);
  dtl_moe_placement *pl = NULL;
  CHECK_OK(dtl_moe_placement_create(sc->experts, P, NULL, &pl));
  rank_data *all = malloc(sizeof(rank_data) * (size_t)P);
  for (int r = 0; r < P; r++) all[r] = make_rank(sc, r);
  rank_data *mine = &all[me];
  const int64_t T = mine->tokens;
  dtl_moe_layout_params plain = params_of(sc, false), fp8 = params_of(sc, true);
  dtl_moe_layout *Lp = NULL, *L8 = NULL;
  CHECK_OK(dtl_moe_layout_create(g_comm, pl, T, k, mine->ids, mine->w, H, t, &plain, &Lp));
  CHECK_OK(dtl_moe_layout_create(g_comm, pl, T, k, mine->ids, mine->w, H, t, &fp8, &L8));
  if (!Lp || !L8) goto out;
  const int64_t R = dtl_moe_layout_expert_rows(L8);
  CHECK(R == dtl_moe_layout_expert_rows(Lp), "expert rows %lld, plain layout %lld", (long long)R,
        (long long)dtl_moe_layout_expert_rows(Lp));
  CHECK(dtl_moe_layout_exchange(L8) == dtl_moe_layout_exchange(Lp), "the FP8 layout chose another exchange");

  size_t cells = (size_t)(T * H) + 1, ecells = (size_t)(R * H) + 1;
  char *xq = malloc(es * cells), *ein_ref = malloc(es * ecells), *ein8 = malloc(es * ecells);
  ref_fp8_round_trip(mine->x, t, T, H, xq, NULL);
  memset(ein8, 0x5a, es * ecells); /* padding rows must come back zero */
  CHECK_OK(dtl_moe_layout_dispatch(Lp, xq, ein_ref));
  CHECK_OK(dtl_moe_layout_dispatch(L8, mine->x, ein8));
  CHECK(memcmp(ein8, ein_ref, es * (size_t)(R * H)) == 0,
        "%s: FP8 dispatch differs from the plain dispatch of dequantize(quantize(x))", sc->name);

  /* The raw form: each expert row holds its token's codes and scales, rows in the documented order. */
  uint8_t *codes = malloc(ecells), *want_codes = calloc(ecells, 1);
  float *scales = malloc(sizeof(float) * (size_t)(R * nb + 1));
  float *want_scales = calloc((size_t)(R * nb + 1), sizeof(float));
  memset(codes, 0xa5, ecells);
  memset(scales, 0xa5, sizeof(float) * (size_t)(R * nb));
  CHECK_OK(dtl_moe_layout_dispatch_fp8(L8, mine->x, codes, scales));
  int nl = dtl_moe_layout_local_experts(L8);
  int64_t *off = calloc((size_t)nl + 1, sizeof(int64_t));
  CHECK_OK(dtl_moe_layout_expert_counts(L8, NULL, off));
  for (int j = 0; j < nl; j++) {
    int e = dtl_moe_placement_local_expert(pl, me, j);
    int64_t at = off[j];
    for (int q = 0; q < P; q++) {
      const rank_data *d = &all[q == 0 ? me : (q <= me ? q - 1 : q)];
      for (int64_t i = 0; i < d->tokens * k; i++)
        if (d->ids[i] == e && d->keep[i] && at < R) {
          ref_fp8_quantize((const char *)d->x + (size_t)((i / k) * H) * es, t, 1, H, H, want_codes + at * H,
                           want_scales + at * nb);
          at++;
        }
    }
  }
  CHECK(memcmp(codes, want_codes, (size_t)(R * H)) == 0, "%s: raw codes differ from each token's quantized row",
        sc->name);
  CHECK(memcmp(scales, want_scales, sizeof(float) * (size_t)(R * nb)) == 0,
        "%s: raw scales differ from each token's quantized row", sc->name);
  char *deq = malloc(es * ecells);
  ref_fp8_dequantize(codes, scales, R, H, t, deq);
  CHECK(memcmp(deq, ein8, es * (size_t)(R * H)) == 0, "%s: the raw rows do not dequantize to the FP8 dispatch's",
        sc->name);

  /* Combine stays in dtype: the FP8 layout's combine equals the plain one over the same expert outputs. */
  char *eout8 = malloc(es * ecells), *eout_ref = malloc(es * ecells), *eout32 = malloc(es * ecells);
  char *y8 = malloc(es * cells), *yref = malloc(es * cells), *y32 = malloc(es * cells), *ein32 = malloc(es * ecells);
  CHECK_OK(dtl_moe_experts_run(L8, ein8, eout8, scale_expert, NULL));
  CHECK_OK(dtl_moe_experts_run(Lp, ein_ref, eout_ref, scale_expert, NULL));
  CHECK_OK(dtl_moe_layout_combine(L8, eout8, y8));
  CHECK_OK(dtl_moe_layout_combine(Lp, eout_ref, yref));
  CHECK(memcmp(y8, yref, es * (size_t)(T * H)) == 0, "%s: the FP8 layout's combine differs from the plain one",
        sc->name);
  /* Unquantized, for the error report, and the oracle of the bound. */
  CHECK_OK(dtl_moe_layout_dispatch(Lp, mine->x, ein32));
  CHECK_OK(dtl_moe_experts_run(Lp, ein32, eout32, scale_expert, NULL));
  CHECK_OK(dtl_moe_layout_combine(Lp, eout32, y32));

  /* Repeated FP8 rounds allocate nothing and repeat the result. */
  dtl__alloc_hook_reset(0, false);
  for (int i = 0; i < 3; i++) {
    CHECK_OK(dtl_moe_layout_dispatch(L8, mine->x, ein8));
    CHECK_OK(dtl_moe_layout_dispatch_fp8(L8, mine->x, codes, scales));
    CHECK_OK(dtl_moe_experts_run(L8, ein8, eout8, scale_expert, NULL));
    CHECK_OK(dtl_moe_layout_combine(L8, eout8, y8));
  }
  CHECK(dtl__alloc_hook_count() == 0, "%s: %llu allocations in repeated FP8 rounds", sc->name,
        (unsigned long long)dtl__alloc_hook_count());
  CHECK(memcmp(y8, yref, es * (size_t)(T * H)) == 0, "%s: a repeated FP8 round differs", sc->name);

  /* The error against the unquantized MoE: y = c_t x_t with c_t = sum of kept w (e + 1), so each element's bound
   * is c_t times the round trip's, plus the dtype's roundings along the path. */
  float *sc_t = malloc(sizeof(float) * (size_t)(T * nb + 1));
  uint8_t *tmp = malloc(cells);
  ref_fp8_quantize(mine->x, t, T, H, H, tmp, sc_t);
  double u = unit_roundoff(t);
  for (int64_t tk = 0; tk < T; tk++) {
    double c = 0, rowmax = 0, rowerr = 0;
    for (int s = 0; s < k; s++)
      if (mine->keep[tk * k + s]) c += (double)mine->w[tk * k + s] * (mine->ids[tk * k + s] + 1);
    for (int64_t h = 0; h < H; h++) rowmax = fmax(rowmax, c * fabs(ref_fp8_load(mine->x, (size_t)(tk * H + h), t)));
    for (int64_t h = 0; h < H; h++) {
      size_t i = (size_t)(tk * H + h);
      double x = ref_fp8_load(mine->x, i, t), exact = c * x, got = ref_fp8_load(y8, i, t);
      double e = fabs(got - exact), bound = c * ref_fp8_bound(x, sc_t[tk * nb + h / 128]) * (1 + (k + 3) * u) +
                                            (k + 3) * u * c * fabs(x);
      CHECK(e <= bound, "%s: token %lld column %lld: %.9g, unquantized %.9g (error %.3g > bound %.3g)", sc->name,
            (long long)tk, (long long)h, got, exact, e, bound);
      g_err_abs = fmax(g_err_abs, e);
      rowerr = fmax(rowerr, e);
      if (fabs(x) >= ldexp(sc_t[tk * nb + h / 128], -6)) /* e4m3's normal range */
        g_err_rel_elem = fmax(g_err_rel_elem, fabs(got - ref_fp8_load(y32, i, t)) / fabs(ref_fp8_load(y32, i, t)));
    }
    if (rowmax > 0) g_err_rel_row = fmax(g_err_rel_row, rowerr / rowmax);
  }
  free(sc_t), free(tmp);
  free(xq), free(ein_ref), free(ein8), free(codes), free(want_codes), free(scales), free(want_scales), free(off);
  free(deq), free(eout8), free(eout_ref), free(eout32), free(y8), free(yref), free(y32), free(ein32);
out:
  dtl_moe_layout_destroy(Lp);
  dtl_moe_layout_destroy(L8);
  for (int r = 0; r < P; r++) free_rank(&all[r]);
  free(all);
  dtl_moe_placement_destroy(pl);
}

static void fp8_paths_match_the_plain_paths_in_every_configuration(void) {
  static const scenario cs[] = {
      {"f32 H=300 per-expert", 5, 2, 300, tokens_varied, 0, DTL_MOE_DROP_POSITION, 1, DTL_MOE_EXCHANGE_PER_EXPERT,
       DTL_FLOAT32},
      {"bf16 H=128 single capacity pad 4", 7, 3, 128, tokens_varied, 0.8, DTL_MOE_DROP_POSITION, 4,
       DTL_MOE_EXCHANGE_SINGLE, DTL_BFLOAT16},
      {"f16 H=5 auto odd ranks empty pad 2", 4, 1, 5, tokens_odd_ranks_empty, 0, DTL_MOE_DROP_POSITION, 2,
       DTL_MOE_EXCHANGE_AUTO, DTL_FLOAT16},
      {"f32 H=260 single probability drops", 6, 2, 260, tokens_varied, 1.0, DTL_MOE_DROP_PROBABILITY, 1,
       DTL_MOE_EXCHANGE_SINGLE, DTL_FLOAT32},
      {"bf16 H=129 per-expert pad 3", 3, 2, 129, tokens_varied, 0, DTL_MOE_DROP_POSITION, 3,
       DTL_MOE_EXCHANGE_PER_EXPERT, DTL_BFLOAT16},
  };
  for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) fp8_dispatch_is_the_plain_dispatch_of_the_round_trip(&cs[i]);
  double v[3] = {g_err_abs, g_err_rel_row, g_err_rel_elem}, m[3];
  MPI_Allreduce(v, m, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (dt_rank == 0)
    printf("# FP8 dispatch vs the unquantized MoE, %d ranks: max abs error %.4g, max error / row max %.4g, max "
           "relative error in e4m3's normal range %.4g\n", dt_size, m[0], m[1], m[2]);
}

/* --- bad input ------------------------------------------------------------------------------------------- */
static const scenario kSmall = {"small", 4, 2, 130, tokens_varied, 0, DTL_MOE_DROP_POSITION, 1,
                                DTL_MOE_EXCHANGE_AUTO, DTL_FLOAT32};

static dtl_moe_layout *small_layout(const rank_data *d, bool fp8, dtl_moe_placement **pl) {
  dtl_moe_layout_params prm = params_of(&kSmall, fp8);
  dtl_moe_layout *L = NULL;
  REQUIRE_OK(dtl_moe_placement_create(kSmall.experts, dt_size, NULL, pl));
  REQUIRE_OK(dtl_moe_layout_create(g_comm, *pl, d->tokens, kSmall.k, d->ids, d->w, kSmall.hidden, kSmall.dtype, &prm,
                                   &L));
  return L;
}

static void nan_or_inf_on_one_rank_fails_every_rank_naming_the_token_row_and_writes_nothing(void) {
  rank_data d = make_rank(&kSmall, dt_rank);
  dtl_moe_placement *pl;
  dtl_moe_layout *L = small_layout(&d, true, &pl);
  const int64_t R = dtl_moe_layout_expert_rows(L), H = kSmall.hidden, nb = ref_fp8_blocks(H);
  const int bad = dt_size - 1;
  float *x = d.x, *ein = malloc(sizeof(float) * (size_t)(R * H + 1));
  uint8_t *codes = malloc((size_t)(R * H + 1));
  float *scales = malloc(sizeof(float) * (size_t)(R * nb + 1));
  for (int round = 0; round < 2; round++) {
    if (dt_rank == bad) x[2 * H + 129] = round ? -INFINITY : NAN;
    memset(ein, 0x5a, sizeof(float) * (size_t)(R * H));
    memset(codes, 0x5a, (size_t)(R * H));
    memset(scales, 0x5a, sizeof(float) * (size_t)(R * nb));
    dtl_status st = round ? dtl_moe_layout_dispatch_fp8(L, x, codes, scales) : dtl_moe_layout_dispatch(L, x, ein);
    CHECK(st == DTL_ERR_INVALID_ARGUMENT, "round %d: %s (%s)", round, dtl_status_name(st), dtl_last_error());
    const char *want = round ? "x row 2 column 129 is -inf" : "x row 2 column 129 is nan";
    if (dt_rank == bad) CHECK(strstr(dtl_last_error(), want), "message '%s' lacks '%s'", dtl_last_error(), want);
    bool untouched = true;
    for (int64_t i = 0; i < R * H; i++) untouched &= ((uint32_t *)ein)[i] == 0x5a5a5a5au && codes[i] == 0x5a;
    for (int64_t i = 0; i < R * nb; i++) untouched &= ((uint32_t *)scales)[i] == 0x5a5a5a5au;
    CHECK(untouched, "round %d: a failed dispatch wrote its outputs", round);
    if (dt_rank == bad) x[2 * H + 129] = 1.0f;
  }
  CHECK_OK(dtl_moe_layout_dispatch(L, x, ein)); /* the layout is still good */
  free(ein), free(codes), free(scales);
  dtl_moe_layout_destroy(L);
  dtl_moe_placement_destroy(pl);
  free_rank(&d);
}

static void dtypes_fp8_cannot_carry_and_unknown_flags_are_refused_at_creation(void) {
  rank_data d = make_rank(&kSmall, dt_rank);
  dtl_moe_placement *pl = NULL;
  REQUIRE_OK(dtl_moe_placement_create(kSmall.experts, dt_size, NULL, &pl));
  static const struct {
    dtl_dtype t;
    const char *says;
  } bad[] = {{DTL_FLOAT64, "dtype=f64 with DTL_MOE_LAYOUT_FP8_DISPATCH"},
             {DTL_INT32, "dtype=i32 with DTL_MOE_LAYOUT_FP8_DISPATCH"},
             {DTL_FLOAT8_E4M3, "dtype=f8e4m3 with DTL_MOE_LAYOUT_FP8_DISPATCH"}};
  dtl_moe_layout_params prm = {.flags = DTL_MOE_LAYOUT_FP8_DISPATCH};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dtl_moe_layout *L = (dtl_moe_layout *)&prm; /* a sentinel: must stay */
    CHECK_ERROR(dtl_moe_layout_create(g_comm, pl, d.tokens, kSmall.k, d.ids, d.w, kSmall.hidden, bad[i].t, &prm, &L),
                DTL_ERR_INVALID_ARGUMENT, bad[i].says);
    CHECK(L == (dtl_moe_layout *)&prm, "out written by a failed creation");
  }
  dtl_moe_layout_params unknown = {.flags = DTL_MOE_LAYOUT_FP8_DISPATCH | DTL_BIT(7)};
  dtl_moe_layout *L = NULL;
  CHECK_ERROR(dtl_moe_layout_create(g_comm, pl, d.tokens, kSmall.k, d.ids, d.w, kSmall.hidden, DTL_FLOAT32, &unknown,
                                    &L),
              DTL_ERR_INVALID_ARGUMENT, "params.flags");
  CHECK(L == NULL, "out written by a failed creation");
  /* Ranks that disagree on the flag would exchange rows of other sizes. */
  if (dt_size > 1) {
    dtl_moe_layout_params mixed = {.flags = dt_rank == 0 ? DTL_MOE_LAYOUT_FP8_DISPATCH : 0};
    CHECK_ERROR(dtl_moe_layout_create(g_comm, pl, d.tokens, kSmall.k, d.ids, d.w, kSmall.hidden, DTL_FLOAT32, &mixed,
                                      &L),
                DTL_ERR_MISMATCH, "DTL_MOE_LAYOUT_FP8_DISPATCH");
    CHECK(L == NULL, "out written by a failed creation");
  }
  dtl_moe_placement_destroy(pl);
  free_rank(&d);
}

static void the_raw_call_needs_an_fp8_layout_and_two_distinct_buffers(void) {
  rank_data d = make_rank(&kSmall, dt_rank);
  dtl_moe_placement *pl, *pl8;
  dtl_moe_layout *Lp = small_layout(&d, false, &pl), *L8 = small_layout(&d, true, &pl8);
  const int64_t R = dtl_moe_layout_expert_rows(L8), H = kSmall.hidden;
  uint8_t *codes = malloc((size_t)(R * H + 1));
  float *scales = malloc(sizeof(float) * (size_t)(R * 2 + 1));
  CHECK_ERROR(dtl_moe_layout_dispatch_fp8(Lp, d.x, codes, scales), DTL_ERR_INVALID_ARGUMENT,
              "made without DTL_MOE_LAYOUT_FP8_DISPATCH");
  CHECK_ERROR(dtl_moe_layout_dispatch_fp8(NULL, d.x, codes, scales), DTL_ERR_INVALID_ARGUMENT, "layout=NULL");
  /* Every rank fails (verify), the ranks holding expert rows with the message. */
  long rows_anywhere = R, total = 0;
  MPI_Allreduce(&rows_anywhere, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (total > 0) {
    dtl_status st = dtl_moe_layout_dispatch_fp8(L8, d.x, codes, R ? (void *)codes : NULL);
    CHECK(st == DTL_ERR_INVALID_ARGUMENT, "same buffers: %s", dtl_status_name(st));
    if (R) CHECK(strstr(dtl_last_error(), "same buffer"), "message '%s'", dtl_last_error());
    st = dtl_moe_layout_dispatch_fp8(L8, d.x, codes, NULL);
    CHECK(st == DTL_ERR_INVALID_ARGUMENT, "scales=NULL: %s", dtl_status_name(st));
    if (R) CHECK(strstr(dtl_last_error(), "expert_scales=NULL"), "message '%s'", dtl_last_error());
  }
  free(codes), free(scales);
  dtl_moe_layout_destroy(Lp);
  dtl_moe_layout_destroy(L8);
  dtl_moe_placement_destroy(pl);
  dtl_moe_placement_destroy(pl8);
  free_rank(&d);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &g_comm));
  RUN(fp8_paths_match_the_plain_paths_in_every_configuration);
  RUN(nan_or_inf_on_one_rank_fails_every_rank_naming_the_token_row_and_writes_nothing);
  RUN(dtypes_fp8_cannot_carry_and_unknown_flags_are_refused_at_creation);
  RUN(the_raw_call_needs_an_fp8_layout_and_two_distinct_buffers);
  dtl_comm_destroy(g_comm);
  return dt_finish();
}

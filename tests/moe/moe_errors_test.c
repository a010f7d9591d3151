/* SPDX-License-Identifier: Apache-2.0 */
/* Bad input to the collective MoE calls, at any world size: a rank with bad arguments makes every rank fail
 * (no rank is left waiting in a collective), ranks that disagree on what must be common get
 * DTL_ERR_MISMATCH, a failed call writes no output, and the communicator keeps working afterwards. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "dtl_test.h"
#include "moe_oracle.h"

enum { E = 8, K = 2, H = 4, T = 6 };
static dtl_comm *g_comm;
static dtl_moe_placement *g_pl;
static int32_t g_ids[T * K];
static float g_w[T * K];
static float g_x[T * H];

static dtl_moe_layout *const SENTINEL = (dtl_moe_layout *)(uintptr_t)0x1;

/* Creates a layout with the common routing, except on rank `bad_rank` (-1: none) where edit changes it. */
static dtl_status create_with(int bad_rank, void (*edit)(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm),
                              dtl_moe_layout **out) {
  int32_t ids[T * K];
  float w[T * K];
  int k = K;
  dtl_moe_layout_params prm = {0};
  memcpy(ids, g_ids, sizeof ids);
  memcpy(w, g_w, sizeof w);
  if (dt_rank == bad_rank) edit(ids, w, &k, &prm);
  *out = SENTINEL;
  return dtl_moe_layout_create(g_comm, g_pl, T, k, ids, w, H, DTL_FLOAT32, &prm, out);
}

static void id_too_large(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) { ids[3] = E; }
static void id_below_masked(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) { ids[0] = -2; }
static void negative_weight(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) { w[5] = -0.5f; }
static void nan_weight(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) { w[1] = NAN; }
static void inf_weight(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) { w[2] = INFINITY; }
static void k_above_experts(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) { *k = E + 1; }
static void capacity_zero(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) {
  prm->mask = DTL_MOE_LAYOUT_CAPACITY_FACTOR;
  prm->capacity_factor = 0;
}
static void capacity_negative(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) {
  prm->mask = DTL_MOE_LAYOUT_CAPACITY_FACTOR;
  prm->capacity_factor = -1.5;
}
static void capacity_nan(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) {
  prm->mask = DTL_MOE_LAYOUT_CAPACITY_FACTOR;
  prm->capacity_factor = NAN;
}
static void pad_zero(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) {
  prm->mask = DTL_MOE_LAYOUT_PAD_MULTIPLE;
  prm->pad_multiple = 0;
}
static void unknown_mask_bit(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) { prm->mask = DTL_BIT(40); }
static void unknown_flags_bit(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) { prm->flags = DTL_BIT(3); }
/* Valid on their own, but not what the other ranks pass. */
static void other_k(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) { *k = 1; }
static void other_capacity(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) {
  prm->mask = DTL_MOE_LAYOUT_CAPACITY_FACTOR;
  prm->capacity_factor = 2.0;
}
static void other_verify(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) {
  prm->mask = DTL_MOE_LAYOUT_VERIFY;
  prm->verify = 0;
}
static void other_policy(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) {
  prm->mask = DTL_MOE_LAYOUT_DROP_POLICY;
  prm->drop_policy = DTL_MOE_DROP_PROBABILITY;
}
static void other_pad(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) {
  prm->mask = DTL_MOE_LAYOUT_PAD_MULTIPLE;
  prm->pad_multiple = 4;
}
static void other_exchange(int32_t *ids, float *w, int *k, dtl_moe_layout_params *prm) {
  prm->mask = DTL_MOE_LAYOUT_EXCHANGE;
  prm->exchange = DTL_MOE_EXCHANGE_PER_EXPERT;
}

/* Rejected on one rank (the last one), every rank fails with the same status and nothing is written. */
static void expect_all_fail(void (*edit)(int32_t *, float *, int *, dtl_moe_layout_params *), dtl_status want) {
  dtl_moe_layout *L = NULL;
  CHECK_STATUS(create_with(dt_size - 1, edit, &L), want);
  CHECK(L == SENTINEL, "the output handle was written on failure");
  if (dt_rank == dt_size - 1 && want == DTL_ERR_INVALID_ARGUMENT)
    CHECK(strstr(dtl_last_error(), "dtl_moe_layout_create") != NULL, "message %s", dtl_last_error());
  if (L != SENTINEL) dtl_moe_layout_destroy(L);
}

/* A bit that dtl_moe_layout_params does not define, in mask or in flags, is named with the field. */
static void unknown_bits_are_rejected_naming_the_field_and_the_bits(void) {
  dtl_moe_layout *L = SENTINEL;
  dtl_moe_layout_params prm = {.mask = DTL_MOE_LAYOUT_VERIFY | DTL_BIT(40), .verify = 1};
  CHECK_ERROR(dtl_moe_layout_create(g_comm, g_pl, T, K, g_ids, g_w, H, DTL_FLOAT32, &prm, &L), DTL_ERR_INVALID_ARGUMENT,
              "dtl_moe_layout_create: params.mask=0x10000000010 has unknown bits 0x10000000000");
  prm = (dtl_moe_layout_params){.flags = DTL_BIT(3)};
  CHECK_ERROR(dtl_moe_layout_create(g_comm, g_pl, T, K, g_ids, g_w, H, DTL_FLOAT32, &prm, &L), DTL_ERR_INVALID_ARGUMENT,
              "params.flags=0x8 has unknown bits 0x8 (known: DTL_MOE_LAYOUT_FP8_DISPATCH)");
  CHECK(L == SENTINEL, "the output handle was written on failure");
}

/* A valid layout still works after the failures above: the communicator is not left in a broken state. */
static void expect_round_trip(void) {
  dtl_moe_layout *L = NULL;
  CHECK_OK(create_with(-1, NULL, &L));
  if (L == SENTINEL || !L) return;
  int64_t rows = dtl_moe_layout_expert_rows(L);
  float *ein = malloc(sizeof(float) * (size_t)(rows * H) + 4), y[T * H];
  CHECK_OK(dtl_moe_layout_dispatch(L, g_x, ein));
  CHECK_OK(dtl_moe_layout_combine(L, ein, y)); /* identity experts: y = sum of weights * x */
  for (int t = 0; t < T; t++)
    for (int h = 0; h < H; h++) {
      float want = 0;
      for (int s = 0; s < K; s++) want += g_w[t * K + s] * g_x[t * H + h];
      CHECK(y[t * H + h] == want, "y[%d][%d]=%g (expected %g)", t, h, (double)y[t * H + h], (double)want);
    }
  free(ein);
  dtl_moe_layout_destroy(L);
}

static void placement_table_naming_a_missing_rank_is_rejected(void) {
  int owner[E];
  for (int e = 0; e < E; e++) owner[e] = e % dt_size;
  dtl_moe_placement *p = (dtl_moe_placement *)(uintptr_t)0x1;
  owner[E - 1] = dt_size;
  CHECK_STATUS(dtl_moe_placement_create(E, dt_size, owner, &p), DTL_ERR_INVALID_ARGUMENT);
  CHECK(strstr(dtl_last_error(), "owner[7]") != NULL, "message %s", dtl_last_error());
  owner[E - 1] = -1;
  CHECK_STATUS(dtl_moe_placement_create(E, dt_size, owner, &p), DTL_ERR_INVALID_ARGUMENT);
  CHECK(p == (dtl_moe_placement *)(uintptr_t)0x1, "the output handle was written on failure");
}

/* A placement of another size than the communicator fails on every rank. */
static void placement_over_another_group_size_is_rejected_everywhere(void) {
  dtl_moe_placement *p = NULL;
  CHECK_OK(dtl_moe_placement_create(E, dt_size + 1, NULL, &p));
  dtl_moe_layout *L = SENTINEL;
  CHECK_STATUS(dtl_moe_layout_create(g_comm, p, T, K, g_ids, g_w, H, DTL_FLOAT32, NULL, &L), DTL_ERR_INVALID_ARGUMENT);
  dtl_moe_placement_destroy(p);
}

/* Ranks whose expert->rank tables differ would send counts their peers do not expect: DTL_ERR_MISMATCH. */
static void ranks_with_different_expert_tables_get_mismatch(void) {
  int owner[E];
  for (int e = 0; e < E; e++) owner[e] = dt_rank == 0 ? (dt_size - 1 - e % dt_size) : e % dt_size;
  dtl_moe_placement *p = NULL;
  CHECK_OK(dtl_moe_placement_create(E, dt_size, owner, &p));
  dtl_moe_layout *L = SENTINEL;
  CHECK_STATUS(dtl_moe_layout_create(g_comm, p, T, K, g_ids, g_w, H, DTL_FLOAT32, NULL, &L), DTL_ERR_MISMATCH);
  CHECK(strstr(dtl_last_error(), "placement") != NULL, "message %s", dtl_last_error());
  dtl_moe_placement_destroy(p);
}

static void ranks_with_different_dtypes_get_mismatch(void) {
  dtl_moe_layout *L = SENTINEL;
  CHECK_STATUS(dtl_moe_layout_create(g_comm, g_pl, T, K, g_ids, g_w, H, dt_rank == 0 ? DTL_FLOAT64 : DTL_FLOAT32, NULL,
                                     &L),
               DTL_ERR_MISMATCH);
  CHECK(strstr(dtl_last_error(), "dtype") != NULL, "message %s", dtl_last_error());
}

static void ranks_with_different_hidden_get_mismatch(void) {
  dtl_moe_layout *L = SENTINEL;
  CHECK_STATUS(dtl_moe_layout_create(g_comm, g_pl, T, K, g_ids, g_w, dt_rank == 0 ? H + 1 : H, DTL_FLOAT32, NULL, &L),
               DTL_ERR_MISMATCH);
  CHECK(strstr(dtl_last_error(), "hidden") != NULL, "message %s", dtl_last_error());
}

/* One rank dispatches with the layout of an earlier routing (its counts differ from what its peers now
 * expect): every rank gets DTL_ERR_MISMATCH before any row moves, in dispatch and in combine. */
static void stale_layout_on_one_rank_gets_mismatch(void) {
  dtl_moe_layout *old = NULL, *cur = NULL;
  CHECK_OK(create_with(-1, NULL, &old));
  int32_t ids[T * K];
  for (int i = 0; i < T * K; i++) ids[i] = (int32_t)((i * 3 + 1) % E); /* another routing */
  CHECK_OK(dtl_moe_layout_create(g_comm, g_pl, T, K, ids, g_w, H, DTL_FLOAT32, NULL, &cur));
  if (!old || !cur || old == SENTINEL) return;
  dtl_moe_layout *mine = dt_rank == 0 ? old : cur;
  int64_t rows = dtl_moe_layout_expert_rows(mine);
  float *ein = malloc(sizeof(float) * (size_t)(rows * H) + 4), y[T * H];
  float *before = malloc(sizeof(float) * (size_t)(rows * H) + 4);
  for (int64_t i = 0; i < rows * H; i++) ein[i] = before[i] = -7;
  memcpy(y, g_x, sizeof y);
  CHECK_STATUS(dtl_moe_layout_dispatch(mine, g_x, ein), DTL_ERR_MISMATCH);
  CHECK(memcmp(ein, before, sizeof(float) * (size_t)(rows * H)) == 0, "expert_in written by a failed dispatch");
  CHECK_STATUS(dtl_moe_layout_combine(mine, ein, y), DTL_ERR_MISMATCH);
  CHECK(memcmp(y, g_x, sizeof y) == 0, "y written by a failed combine");
  free(ein);
  free(before);
  dtl_moe_layout_destroy(old);
  dtl_moe_layout_destroy(cur);
}

/* A NULL buffer on one rank fails dispatch and combine on every rank (the check travels with verify). */
static void null_buffer_on_one_rank_fails_every_rank(void) {
  dtl_moe_layout *L = NULL;
  CHECK_OK(create_with(-1, NULL, &L));
  if (!L || L == SENTINEL) return;
  int64_t rows = dtl_moe_layout_expert_rows(L);
  float *ein = malloc(sizeof(float) * (size_t)(rows * H) + 4), y[T * H];
  bool bad = dt_rank == dt_size - 1;
  dtl_status want = DTL_ERR_INVALID_ARGUMENT;
  CHECK_STATUS(dtl_moe_layout_dispatch(L, bad ? NULL : g_x, ein), want);
  CHECK_STATUS(dtl_moe_layout_combine(L, ein, bad ? NULL : y), want);
  CHECK_STATUS(dtl_moe_layout_dispatch(L, g_x, g_x), DTL_ERR_INVALID_ARGUMENT); /* aliasing, on every rank */
  free(ein);
  dtl_moe_layout_destroy(L);
}

static void combine_of_an_integer_layout_is_unsupported(void) {
  dtl_moe_layout *L = NULL;
  CHECK_OK(dtl_moe_layout_create(g_comm, g_pl, T, K, g_ids, g_w, H, DTL_INT32, NULL, &L));
  if (!L) return;
  int64_t rows = dtl_moe_layout_expert_rows(L);
  int32_t *ein = calloc((size_t)(rows * H) + 4, sizeof(int32_t)), y[T * H];
  CHECK_STATUS(dtl_moe_layout_combine(L, ein, y), DTL_ERR_UNSUPPORTED);
  free(ein);
  dtl_moe_layout_destroy(L);
}

/* An 8-bit float layout dispatches (bytes), but its combine, a weighted sum, would round at every step. */
static void combine_of_an_8_bit_float_layout_is_unsupported(void) {
  dtl_moe_layout *L = NULL;
  CHECK_OK(dtl_moe_layout_create(g_comm, g_pl, T, K, g_ids, g_w, H, DTL_FLOAT8_E4M3, NULL, &L));
  if (!L) return;
  int64_t rows = dtl_moe_layout_expert_rows(L);
  uint8_t *ein = calloc((size_t)(rows * H) + 4, 1), x[T * H], y[T * H];
  memset(x, 0x38, sizeof x);
  memset(y, 0x5a, sizeof y);
  CHECK_OK(dtl_moe_layout_dispatch(L, x, ein));
  CHECK_ERROR(dtl_moe_layout_combine(L, ein, y), DTL_ERR_UNSUPPORTED, "dtype=f8e4m3");
  CHECK(y[0] == 0x5a, "a refused combine wrote y");
  free(ein);
  dtl_moe_layout_destroy(L);
}

static void null_handles_are_rejected(void) {
  dtl_moe_layout *L = SENTINEL;
  CHECK_STATUS(dtl_moe_layout_create(NULL, g_pl, T, K, g_ids, g_w, H, DTL_FLOAT32, NULL, &L), DTL_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dtl_moe_layout_create(g_comm, g_pl, T, K, g_ids, g_w, H, DTL_FLOAT32, NULL, NULL),
               DTL_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dtl_moe_layout_create(g_comm, NULL, T, K, g_ids, g_w, H, DTL_FLOAT32, NULL, &L),
               DTL_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dtl_moe_layout_create(g_comm, g_pl, T, K, NULL, g_w, H, DTL_FLOAT32, NULL, &L), DTL_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dtl_moe_layout_dispatch(NULL, g_x, g_x), DTL_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dtl_moe_layout_combine(NULL, g_x, g_x), DTL_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dtl_moe_experts_run(NULL, g_x, g_x, NULL, NULL), DTL_ERR_INVALID_ARGUMENT);
  CHECK(L == SENTINEL, "the output handle was written on failure");
}

/* The MLP expert refuses what it cannot compute. */
static dtl_status run_mlp_on(const dtl_moe_expert_batch *b, dtl_moe_mlp *m) { return dtl_moe_mlp_forward(b, m); }
static void mlp_expert_rejects_mismatched_hidden_and_unsupported_memory(void) {
  float w[H * H] = {0}, in[H] = {1, 2, 3, 4}, out[H];
  const float *wl[1] = {w};
  dtl_moe_mlp m = {.hidden = H + 1, .ffn = H, .local_experts = 1, .w_gate = wl, .w_up = wl, .w_down = wl};
  dtl_moe_expert_batch b = {.expert = 0, .local = 0, .rows = 1, .rows_padded = 1, .hidden = H,
                            .dtype = DTL_FLOAT32, .memory = DTL_MEMORY_HOST, .in = in, .out = out};
  CHECK_STATUS(run_mlp_on(&b, &m), DTL_ERR_INVALID_ARGUMENT);
  m.hidden = H;
  b.local = 1;
  CHECK_STATUS(run_mlp_on(&b, &m), DTL_ERR_INVALID_ARGUMENT);
  b.local = 0;
  b.dtype = DTL_FLOAT64;
  CHECK_STATUS(run_mlp_on(&b, &m), DTL_ERR_UNSUPPORTED);
  b.dtype = DTL_FLOAT32;
  b.memory = DTL_MEMORY_DEVICE;
  CHECK_STATUS(run_mlp_on(&b, &m), DTL_ERR_UNSUPPORTED);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &g_comm));
  REQUIRE_OK(dtl_moe_placement_create(E, dt_size, NULL, &g_pl));
  oracle_routing(7, dt_rank, T, K, E, g_ids, g_w);
  oracle_tokens(7, dt_rank, T, H, g_x);

  RUN_NAMED("valid_layout_round_trips_before_the_failures", expect_round_trip());
  RUN_NAMED("expert_id_out_of_range_fails_every_rank", expect_all_fail(id_too_large, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("expert_id_below_minus_one_fails_every_rank", expect_all_fail(id_below_masked, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("negative_weight_fails_every_rank", expect_all_fail(negative_weight, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("nan_weight_fails_every_rank", expect_all_fail(nan_weight, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("infinite_weight_fails_every_rank", expect_all_fail(inf_weight, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("k_above_experts_fails_every_rank", expect_all_fail(k_above_experts, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("capacity_factor_zero_is_rejected", expect_all_fail(capacity_zero, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("capacity_factor_negative_is_rejected", expect_all_fail(capacity_negative, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("capacity_factor_nan_is_rejected", expect_all_fail(capacity_nan, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("pad_multiple_zero_is_rejected", expect_all_fail(pad_zero, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("unknown_params_mask_bit_is_rejected", expect_all_fail(unknown_mask_bit, DTL_ERR_INVALID_ARGUMENT));
  RUN_NAMED("unknown_params_flags_bit_is_rejected", expect_all_fail(unknown_flags_bit, DTL_ERR_INVALID_ARGUMENT));
  RUN(unknown_bits_are_rejected_naming_the_field_and_the_bits);
  if (dt_size > 1) {
    RUN_NAMED("ranks_with_different_k_get_mismatch", expect_all_fail(other_k, DTL_ERR_MISMATCH));
    RUN_NAMED("ranks_with_different_capacity_get_mismatch", expect_all_fail(other_capacity, DTL_ERR_MISMATCH));
    RUN_NAMED("ranks_with_different_verify_get_mismatch", expect_all_fail(other_verify, DTL_ERR_MISMATCH));
    RUN_NAMED("ranks_with_different_drop_policy_get_mismatch", expect_all_fail(other_policy, DTL_ERR_MISMATCH));
    RUN_NAMED("ranks_with_different_pad_multiple_get_mismatch", expect_all_fail(other_pad, DTL_ERR_MISMATCH));
    RUN_NAMED("ranks_with_different_exchange_get_mismatch", expect_all_fail(other_exchange, DTL_ERR_MISMATCH));
    RUN(ranks_with_different_dtypes_get_mismatch);
    RUN(ranks_with_different_expert_tables_get_mismatch);
    RUN(ranks_with_different_hidden_get_mismatch);
    RUN(stale_layout_on_one_rank_gets_mismatch);
  }
  RUN(placement_table_naming_a_missing_rank_is_rejected);
  RUN(placement_over_another_group_size_is_rejected_everywhere);
  RUN(null_buffer_on_one_rank_fails_every_rank);
  RUN(combine_of_an_integer_layout_is_unsupported);
  RUN(combine_of_an_8_bit_float_layout_is_unsupported);
  RUN(null_handles_are_rejected);
  RUN(mlp_expert_rejects_mismatched_hidden_and_unsupported_memory);
  RUN_NAMED("valid_layout_round_trips_after_the_failures", expect_round_trip());

  dtl_moe_placement_destroy(g_pl);
  dtl_comm_destroy(g_comm);
  return dt_finish();
}

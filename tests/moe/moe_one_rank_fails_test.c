/* SPDX-License-Identifier: Apache-2.0 */
/* One rank's bad argument or missing memory fails every MoE rank, under the watchdog: layout creation agrees
 * before its count exchange (out=NULL and a bad count_comm included) and after it (the maps and receive
 * staging it allocates then), dispatch and combine agree under verify or DTL_CHECK, and with DTL_CHECK a
 * rank whose experts failed fails every rank in dtl_moe_experts_run instead of leaving them in combine. */
#include "common/internal.h"
#include "dtl_test_ranks.h"
#include "dtl/moe.h"

enum { E = 8, K = 2, H = 4, T = 6 };
static dtl_comm *plain, *checked;
static dtl_moe_placement *pl;
static int32_t ids[T * K];
static float wts[T * K], x[T * H], y[T * H];

static dtl_status create(dtl_comm *c, const dtl_moe_layout_params *prm, dtl_moe_layout **out) {
  return dtl_moe_layout_create(c, pl, T, K, ids, wts, H, DTL_FLOAT32, prm, out);
}

/* The verified hang: out=NULL on one rank returned there while the others waited in the agreement. */
static void layout_creation_with_no_output_on_one_rank_fails_every_rank(void) {
  dtl_moe_layout *L = NULL;
  dt_expect_every_rank_fails("out", create(plain, NULL, dt_rank == dt_bad ? NULL : &L), DTL_ERR_INVALID_ARGUMENT,
                             "out=NULL");
  CHECK(L == NULL, "a failed creation returned a layout");
}

/* On a host communicator the count communicator is an argument like the others. */
static void a_bad_count_communicator_on_one_rank_fails_every_rank(void) {
  dtl_moe_layout *L = NULL;
  dtl_moe_layout_params prm = {.mask = DTL_MOE_LAYOUT_COUNT_COMM, .count_comm = dt_rank == dt_bad ? NULL : plain};
  dt_expect_every_rank_fails("count_comm", create(plain, &prm, &L), DTL_ERR_INVALID_ARGUMENT, "count_comm=NULL");
  CHECK(L == NULL, "a failed creation returned a layout");
}

/* Whatever allocation fails on one rank, before the count exchange or after it (maps, receive staging), every
 * rank fails and none keeps a layout. The allocations of one creation are counted first. */
static void a_rank_without_memory_at_any_step_of_creation_fails_every_rank(void) {
  dtl_moe_layout *L = NULL;
  dtl__alloc_hook_reset(0, false);
  CHECK_OK(create(plain, NULL, &L));
  uint64_t n = dtl__alloc_hook_count();
  dtl_moe_layout_destroy(L);
  MPI_Bcast(&n, 1, MPI_UINT64_T, dt_bad, MPI_COMM_WORLD); /* the bad rank's count */
  CHECK(n >= 3, "only %llu allocations in a creation", (unsigned long long)n);
  for (uint64_t at = 1; at <= n; at++) {
    L = NULL;
    dtl__alloc_hook_reset(dt_rank == dt_bad ? at : 0, false);
    dtl_status st = create(plain, NULL, &L);
    dtl__alloc_hook_reset(0, false);
    char what[48];
    snprintf(what, sizeof what, "allocation %llu of %llu", (unsigned long long)at, (unsigned long long)n);
    dt_expect_every_rank_fails(what, st, DTL_ERR_OUT_OF_MEMORY, "memory");
    CHECK(L == NULL, "%s: a failed creation returned a layout", what);
    if (L) dtl_moe_layout_destroy(L);
  }
}

static dtl_status fail_on_bad_rank(const dtl_moe_expert_batch *b, void *user) {
  (void)b;
  (void)user;
  return dt_rank == dt_bad ? dtl__error(DTL_ERR_INVALID_ARGUMENT, "expert refused") : DTL_OK;
}

static dtl_status identity(const dtl_moe_expert_batch *b, void *user) {
  (void)user;
  if (b->rows) memcpy(b->out, b->in, sizeof(float) * (size_t)(b->rows * b->hidden));
  return DTL_OK;
}

/* verify (the default) and DTL_CHECK each make dispatch and combine agree; DTL_CHECK also experts_run. */
static void dispatch_combine_and_experts_fail_every_rank_under_verify_or_dtl_check(void) {
  bool me = dt_rank == dt_bad;
  dtl_moe_layout_params no_verify = {.mask = DTL_MOE_LAYOUT_VERIFY, .verify = 0};
  dtl_moe_layout *verified = NULL, *under_check = NULL;
  CHECK_OK(create(plain, NULL, &verified));
  CHECK_OK(create(checked, &no_verify, &under_check));
  dtl_moe_layout *Ls[2] = {verified, under_check};
  for (int i = 0; i < 2; i++) {
    dtl_moe_layout *L = Ls[i];
    if (!L) continue;
    int64_t rows = dtl_moe_layout_expert_rows(L);
    float *ein = calloc((size_t)(rows * H) + 1, sizeof(float)), *eout = calloc((size_t)(rows * H) + 1, sizeof(float));
    dt_expect_every_rank_fails("dispatch", dtl_moe_layout_dispatch(L, me ? NULL : x, ein), DTL_ERR_INVALID_ARGUMENT,
                               "x=NULL");
    CHECK_OK(dtl_moe_layout_dispatch(L, x, ein));
    CHECK_OK(dtl_moe_experts_run(L, ein, eout, identity, NULL));
    dt_expect_every_rank_fails("combine", dtl_moe_layout_combine(L, eout, me ? NULL : y), DTL_ERR_INVALID_ARGUMENT,
                               "y=NULL");
    if (L == under_check)
      dt_expect_every_rank_fails("experts", dtl_moe_experts_run(L, ein, eout, fail_on_bad_rank, NULL),
                                 DTL_ERR_INVALID_ARGUMENT, "expert refused");
    CHECK_OK(dtl_moe_layout_combine(L, eout, y));
    free(ein);
    free(eout);
  }
  dtl_moe_layout_destroy(verified);
  dtl_moe_layout_destroy(under_check);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  dt_watchdog_s = 30;
  dt_ranks_init();
  for (int t = 0; t < T; t++) {
    for (int s = 0; s < K; s++) {
      ids[t * K + s] = (int32_t)((t * 3 + s * 5 + dt_rank) % E);
      wts[t * K + s] = 0.25f * (float)(s + 1);
    }
    for (int h = 0; h < H; h++) x[t * H + h] = (float)(t - h);
  }
  checked = dt_comm_with_check(true);
  plain = dt_comm_with_check(false);
  int ok = checked && plain;
  ok = ok && dtl_moe_placement_create(E, dt_size, NULL, &pl) == DTL_OK;
  if (!ok) return dt_skip(dtl_last_error());
  RUN(layout_creation_with_no_output_on_one_rank_fails_every_rank);
  RUN(a_bad_count_communicator_on_one_rank_fails_every_rank);
  RUN(a_rank_without_memory_at_any_step_of_creation_fails_every_rank);
  RUN(dispatch_combine_and_experts_fail_every_rank_under_verify_or_dtl_check);
  dtl_moe_placement_destroy(pl);
  dtl_comm_destroy(checked);
  dtl_comm_destroy(plain);
  return dt_finish();
}

/* SPDX-License-Identifier: Apache-2.0 */
/* A MoE layer allocates only when its layout is created: 100 repeated dispatch / experts / combine rounds
 * after a warm-up one make no allocation (the library's counter, common/alloc.h), with either exchange, with
 * padded expert blocks, with capacity drops, with and without verify, for a user expert and for the MLP
 * expert (whose activations live in the layout's grow-only expert scratch). The warm-up result is checked
 * against the dense MoE, and the last round must give it bit for bit again. */
#include "dtl_test.h"
#include "dtl/moe.h"
#include "common/alloc.h"
#include "moe_oracle.h"

#define REPEAT 100
#define E 6
#define T 13
#define K 2
#define H 5
#define F 7

static dtl_comm *world;

/* out = in * (expert + 1), as oracle_scale_expert; allocates nothing. */
static dtl_status scale_expert(const dtl_moe_expert_batch *b, void *user) {
  (void)user;
  const float *in = b->in;
  float *out = b->out;
  for (int64_t i = 0; i < b->rows * b->hidden; i++) out[i] = in[i] * (float)(b->expert + 1);
  return DTL_OK;
}

typedef struct {
  dtl_moe_exchange exchange;
  int64_t pad;
  double capacity; /* 0: dropless */
  int verify;
  int mlp;
} config;

static void run_config(const config *c) {
  char what[128];
  snprintf(what, sizeof what, "%s exchange, pad %lld, capacity %g, verify %d, %s expert",
           c->exchange == DTL_MOE_EXCHANGE_SINGLE ? "single" : "per-expert", (long long)c->pad, c->capacity, c->verify,
           c->mlp ? "MLP" : "user");
  int32_t ids[T * K];
  float w[T * K], x[T * H], y[T * H], y0[T * H], want[T * H];
  oracle_routing(11, dt_rank, T, K, E, ids, w);
  oracle_tokens(11, dt_rank, T, H, x);
  dtl_moe_placement *pl = NULL;
  CHECK_OK(dtl_moe_placement_create(E, dt_size, NULL, &pl));
  dtl_moe_layout_params prm = {.mask = DTL_MOE_LAYOUT_EXCHANGE | DTL_MOE_LAYOUT_PAD_MULTIPLE | DTL_MOE_LAYOUT_VERIFY,
                               .exchange = c->exchange, .pad_multiple = c->pad, .verify = c->verify};
  if (c->capacity > 0) {
    prm.mask |= DTL_MOE_LAYOUT_CAPACITY_FACTOR;
    prm.capacity_factor = c->capacity;
  }
  dtl_moe_layout *L = NULL;
  CHECK_OK(dtl_moe_layout_create(world, pl, T, K, ids, w, H, DTL_FLOAT32, &prm, &L));
  if (!L) {
    dtl_moe_placement_destroy(pl);
    return;
  }
  /* The MLP's weights: per global expert, small integers scaled to keep the values modest. */
  static float wg[E][F * H], wu[E][F * H], wd[E][H * F];
  oracle_rng r = oracle_seed(12, 0);
  for (int e = 0; e < E; e++)
    for (int i = 0; i < F * H; i++) {
      wg[e][i] = (float)(oracle_uniform(&r) - 0.5);
      wu[e][i] = (float)(oracle_uniform(&r) - 0.5);
      wd[e][i] = (float)(oracle_uniform(&r) - 0.5);
    }
  int nl = dtl_moe_layout_local_experts(L);
  const float *lg[E], *lu[E], *ld[E];
  for (int j = 0; j < nl; j++) {
    int e = dtl_moe_placement_local_expert(pl, dt_rank, j);
    lg[j] = wg[e];
    lu[j] = wu[e];
    ld[j] = wd[e];
  }
  dtl_moe_mlp mlp = {.hidden = H, .ffn = F, .local_experts = nl, .w_gate = lg, .w_up = lu, .w_down = ld};
  dtl_moe_expert_fn fn = c->mlp ? dtl_moe_mlp_forward : scale_expert;
  int64_t rows = dtl_moe_layout_expert_rows(L);
  float *ein = malloc(sizeof(float) * (size_t)(rows * H) + 4), *eout = malloc(sizeof(float) * (size_t)(rows * H) + 4);
  for (int i = -1; i < REPEAT; i++) {
    if (i == 0) dtl__alloc_hook_reset(0, false);
    CHECK_OK(dtl_moe_layout_dispatch(L, x, ein));
    CHECK_OK(dtl_moe_experts_run(L, ein, eout, fn, &mlp));
    CHECK_OK(dtl_moe_layout_combine(L, eout, i < 0 ? y0 : y));
  }
  uint64_t n = dtl__alloc_hook_count();
  CHECK(n == 0, "%s: %llu allocations in %d repeated dispatch/experts/combine rounds", what, (unsigned long long)n,
        REPEAT);
  CHECK(memcmp(y, y0, sizeof y) == 0, "%s: the last round differs from the first", what);
  int keep[T * K];
  int64_t cap = c->capacity > 0 ? oracle_capacity(T, K, E, c->capacity) : -1;
  oracle_keep(ids, w, T, K, E, cap, 0, keep);
  oracle_mlp om = {H, F, &wg[0][0], &wu[0][0], &wd[0][0]};
  oracle_moe(x, T, H, K, ids, w, keep, c->mlp ? oracle_mlp_expert : oracle_scale_expert, &om, want);
  double err = 0;
  for (int i = 0; i < T * H; i++) err = fmax(err, fabs((double)y0[i] - want[i]));
  CHECK(err <= (c->mlp ? 1e-5 : 0), "%s: max error %g against the dense MoE", what, err);
  free(ein);
  free(eout);
  dtl_moe_layout_destroy(L);
  dtl_moe_placement_destroy(pl);
}

static void repeated_rounds_allocate_nothing_after_the_first(void) {
  static const config cs[] = {
      {DTL_MOE_EXCHANGE_PER_EXPERT, 1, 0, 1, 0}, {DTL_MOE_EXCHANGE_SINGLE, 1, 0, 1, 0},
      {DTL_MOE_EXCHANGE_PER_EXPERT, 4, 1.0, 0, 0}, {DTL_MOE_EXCHANGE_SINGLE, 3, 1.0, 1, 0},
      {DTL_MOE_EXCHANGE_PER_EXPERT, 1, 0, 1, 1}, {DTL_MOE_EXCHANGE_SINGLE, 4, 1.25, 0, 1},
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_config(&cs[i]);
}

/* expert_scratch_grows_only_and_needs_a_layout */
static dtl_status ask_scratch(const dtl_moe_expert_batch *b, void *user) {
  void **seen = user;
  void *p = NULL, *q = NULL;
  dtl_status st = dtl_moe_expert_scratch(b, (size_t)(b->local + 1) * 64, &p);
  if (st != DTL_OK) return st;
  memset(p, 1, (size_t)(b->local + 1) * 64); /* the whole size is usable */
  st = dtl_moe_expert_scratch(b, 1, &q);
  if (st != DTL_OK || q != p) return st != DTL_OK ? st : DTL_ERR_INTERNAL; /* a smaller request reuses the buffer */
  seen[b->local] = p;
  return DTL_OK;
}

static void expert_scratch_grows_only_and_needs_a_layout(void) {
  int32_t ids[T * K];
  float w[T * K];
  oracle_routing(13, dt_rank, T, K, E, ids, w);
  dtl_moe_placement *pl = NULL;
  CHECK_OK(dtl_moe_placement_create(E, dt_size, NULL, &pl));
  dtl_moe_layout *L = NULL;
  CHECK_OK(dtl_moe_layout_create(world, pl, T, K, ids, w, H, DTL_FLOAT32, NULL, &L));
  int64_t rows = L ? dtl_moe_layout_expert_rows(L) : 0;
  float *ein = calloc((size_t)(rows * H) + 1, sizeof(float)), *eout = calloc((size_t)(rows * H) + 1, sizeof(float));
  void *seen[E] = {0};
  if (L) {
    CHECK_OK(dtl_moe_experts_run(L, ein, eout, ask_scratch, seen));
    dtl__alloc_hook_reset(0, false);
    CHECK_OK(dtl_moe_experts_run(L, ein, eout, ask_scratch, seen));
    CHECK(dtl__alloc_hook_count() == 0, "the second run allocated %llu times", (unsigned long long)dtl__alloc_hook_count());
  }
  dtl_moe_expert_batch b = {.rows = 1, .hidden = H, .dtype = DTL_FLOAT32, .memory = DTL_MEMORY_HOST};
  void *p = NULL;
  CHECK_ERROR(dtl_moe_expert_scratch(&b, 16, &p), DTL_ERR_INVALID_ARGUMENT, "batch.layout=NULL");
  CHECK_ERROR(dtl_moe_expert_scratch(NULL, 16, &p), DTL_ERR_INVALID_ARGUMENT, "batch=NULL");
  CHECK(p == NULL, "a failed call wrote its output");
  free(ein);
  free(eout);
  dtl_moe_layout_destroy(L);
  dtl_moe_placement_destroy(pl);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  CHECK_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  RUN(repeated_rounds_allocate_nothing_after_the_first);
  RUN(expert_scratch_grows_only_and_needs_a_layout);
  dtl_comm_destroy(world);
  return dt_finish();
}

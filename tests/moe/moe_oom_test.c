/* SPDX-License-Identifier: Apache-2.0 */
/* Out of memory at every allocation of every MoE entry point (tests/common/dt_oom.h): the router, the
 * placement, the layout (agreed: one rank's failure fails every rank), and the first dispatch, experts
 * (the MLP expert's scratch) and combine of a fresh layout, with both exchanges, plain and FP8 dispatch
 * (DTL_MOE_LAYOUT_FP8_DISPATCH), with the failure on every rank and on one. Each failure is
 * DTL_ERR_OUT_OF_MEMORY (or the agreed error), frees what it allocated, writes no output, and the next call
 * works. Runs at 1 and 2 ranks with DTL_CHECK=1. */
#include "dt_oom.h"
#include "dtl/moe.h"

#define POISON ((void *)0x5a5a)
#define E 4
#define T 9
#define K 2
#define H 4
#define F 3

static dtl_comm *world;
static dt_oom_tally tally;

typedef enum { K_ROUTER, K_PLACEMENT, K_LAYOUT, K_DISPATCH, K_EXPERTS, K_COMBINE } kind;

typedef struct {
  kind k;
  dtl_moe_exchange exchange;
  bool fp8;
  float logits[T * E], x[T * H], weights[T * K], w_out[T * K];
  int32_t ids[T * K], ids_out[T * K];
  dtl_moe_placement *placement, *made_placement;
  dtl_moe_layout *L, *made_layout;
  float *expert_in, *expert_out, y[T * H];
  const float *wg[E], *wu[E], *wd[E];
  float weights_mlp[3 * E * F * H];
  dtl_moe_mlp mlp;
} ctx;

static void fresh(ctx *x) {
  REQUIRE_OK(dtl_moe_placement_create(E, dt_size, NULL, &x->placement));
  dtl_moe_layout_params lp = {.mask = DTL_MOE_LAYOUT_EXCHANGE, .flags = x->fp8 ? DTL_MOE_LAYOUT_FP8_DISPATCH : 0,
                              .exchange = x->exchange};
  REQUIRE_OK(dtl_moe_layout_create(world, x->placement, T, K, x->ids, x->weights, H, DTL_FLOAT32, &lp, &x->L));
  int64_t rows = dtl_moe_layout_expert_rows(x->L);
  x->expert_in = malloc(sizeof(float) * (size_t)(rows * H) + 4);
  x->expert_out = malloc(sizeof(float) * (size_t)(rows * H) + 4);
  for (int64_t i = 0; i < rows * H; i++) x->expert_in[i] = (float)i; /* the experts' input when not dispatched */
  for (int64_t i = 0; i < rows * H; i++) x->expert_out[i] = x->k == K_COMBINE ? (float)(i % 5) : -7;
  if (x->k == K_EXPERTS) /* the experts read what a dispatch gives */
    REQUIRE_OK(dtl_moe_layout_dispatch(x->L, x->x, x->expert_in));
  if (x->k == K_DISPATCH)
    for (int64_t i = 0; i < rows * H; i++) x->expert_in[i] = -7;
  int nl = dtl_moe_placement_local_count(x->placement, dt_rank);
  for (int j = 0; j < nl; j++) {
    int e = dtl_moe_placement_local_expert(x->placement, dt_rank, j);
    x->wg[j] = x->weights_mlp + (size_t)e * F * H;
    x->wu[j] = x->weights_mlp + (size_t)(E + e) * F * H;
    x->wd[j] = x->weights_mlp + (size_t)(2 * E + e) * F * H;
  }
  x->mlp = (dtl_moe_mlp){.hidden = H, .ffn = F, .local_experts = nl, .w_gate = x->wg, .w_up = x->wu, .w_down = x->wd};
  for (int i = 0; i < T * H; i++) x->y[i] = -7;
  for (int i = 0; i < T * K; i++) x->ids_out[i] = -7, x->w_out[i] = -7;
  x->made_placement = POISON;
  x->made_layout = POISON;
}
static void release(ctx *x) {
  if (x->made_placement != POISON) dtl_moe_placement_destroy(x->made_placement);
  if (x->made_layout != POISON) dtl_moe_layout_destroy(x->made_layout);
  dtl_moe_layout_destroy(x->L);
  dtl_moe_placement_destroy(x->placement);
  free(x->expert_in);
  free(x->expert_out);
}
static void undo(void *v) {
  release(v);
  fresh(v);
}
static bool untouched(void *v) {
  ctx *x = v;
  int64_t rows = dtl_moe_layout_expert_rows(x->L);
  for (int i = 0; i < T * H; i++)
    if (x->y[i] != -7) return false;
  for (int i = 0; i < T * K; i++)
    if (x->ids_out[i] != -7 || x->w_out[i] != -7) return false;
  for (int64_t i = 0; i < rows * H; i++) {
    if (x->k == K_DISPATCH && x->expert_in[i] != -7) return false;
    if (x->k == K_EXPERTS && x->expert_out[i] != -7) return false;
  }
  return x->made_placement == POISON && x->made_layout == POISON;
}

static dtl_status call(void *v) {
  ctx *x = v;
  switch (x->k) {
    case K_ROUTER: {
      dtl_moe_router_params rp = {.mask = DTL_MOE_ROUTER_RENORMALIZE, .renormalize = 1};
      return dtl_moe_router_topk(x->logits, T, E, K, &rp, x->ids_out, x->w_out);
    }
    case K_PLACEMENT: return dtl_moe_placement_create(E, dt_size, NULL, &x->made_placement);
    case K_LAYOUT: {
      dtl_moe_layout_params lp = {.mask = DTL_MOE_LAYOUT_EXCHANGE | DTL_MOE_LAYOUT_CAPACITY_FACTOR,
                                  .flags = x->fp8 ? DTL_MOE_LAYOUT_FP8_DISPATCH : 0,
                                  .exchange = x->exchange,
                                  .capacity_factor = 1.0};
      return dtl_moe_layout_create(world, x->placement, T, K, x->ids, x->weights, H, DTL_FLOAT32, &lp, &x->made_layout);
    }
    case K_DISPATCH: return dtl_moe_layout_dispatch(x->L, x->x, x->expert_in);
    case K_EXPERTS: return dtl_moe_experts_run(x->L, x->expert_in, x->expert_out, dtl_moe_mlp_forward, &x->mlp);
    default: return dtl_moe_layout_combine(x->L, x->expert_out, x->y);
  }
}

static void every_moe_entry_point_survives_each_failed_allocation_on_any_rank(void) {
  static const struct {
    kind k;
    const char *what;
  } cases[] = {
      {K_ROUTER, "dtl_moe_router_topk"},
      {K_PLACEMENT, "dtl_moe_placement_create"},
      {K_LAYOUT, "dtl_moe_layout_create"},
      {K_DISPATCH, "dtl_moe_layout_dispatch, first"},
      {K_EXPERTS, "dtl_moe_experts_run (MLP expert), first"},
      {K_COMBINE, "dtl_moe_layout_combine, first"},
  };
  static ctx x; /* large: not on the stack */
  for (int i = 0; i < T * E; i++) x.logits[i] = (float)((i * 11 + dt_rank * 5) % 13);
  for (int i = 0; i < T * H; i++) x.x[i] = (float)((i * 3) % 7) - 3;
  for (int i = 0; i < 3 * E * F * H; i++) x.weights_mlp[i] = (float)((i * 5) % 9) / 16.0f - 0.25f;
  REQUIRE_OK(dtl_moe_router_topk(x.logits, T, E, K, NULL, x.ids, x.weights));
  for (int ex = 0; ex < 4; ex++) {
    x.exchange = ex % 2 ? DTL_MOE_EXCHANGE_SINGLE : DTL_MOE_EXCHANGE_PER_EXPERT;
    x.fp8 = ex >= 2;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
      if (ex && cases[i].k < K_LAYOUT) continue; /* no exchange involved */
      if (x.fp8 && cases[i].k == K_EXPERTS) continue; /* the experts see dtype rows either way */
      char what[96];
      snprintf(what, sizeof what, "%s%s%s", cases[i].what,
               cases[i].k < K_LAYOUT ? ""
               : ex % 2              ? " (single exchange)"
                                     : " (per-expert exchange)",
               x.fp8 ? " FP8" : "");
      x.k = cases[i].k;
      fresh(&x);
      const dt_oom_case c = {.what = what,
                             .call = call,
                             .untouched = untouched,
                             .undo = undo,
                             .ctx = &x,
                             .collective = x.k >= K_LAYOUT,
                             .caches = true,
                             .agrees_after = x.k == K_EXPERTS};
      dt_oom_every_way(&c, &tally);
      release(&x);
    }
  }
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  RUN(every_moe_entry_point_survives_each_failed_allocation_on_any_rank);
  if (dt_rank == 0)
    printf("%ld calls, %ld of them failed by an injected allocation failure\n", tally.calls, tally.failures);
  dtl_comm_destroy(world);
  return dt_finish();
}

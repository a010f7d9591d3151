/* SPDX-License-Identifier: Apache-2.0 */
/* What the ranks of a CP call must share, and what they need not: a zero-element buffer passed as NULL (a rank
 * that holds no token) never changes which collectives a rank enters, with or without DTL_CHECK; and under
 * DTL_CHECK=1 every argument that shapes a call is in its fingerprint, each one alone, so that one rank passing
 * another value of any one of them makes every rank return DTL_ERR_MISMATCH instead of garbage. */
#include <math.h>
#include <stdlib.h>
#include "cp_oracle.h"
#include "dtl_test.h"
#include "dtl_test_ranks.h"

static dtl_comm *worlds[2]; /* DTL_CHECK off, on */
static dtl_mesh *meshes[2];
static dtl_cp_context *ctxs[2];

typedef dtl_status (*prefill_fn)(dtl_cp_context *, const dtl_cp_attention_params *, const void *, const void *,
                                 const void *, void *, float *);

/* One token over the group, contiguous: rank 0 holds it, every other rank holds none and passes NULL for each
 * of its (empty) buffers, lse included, while rank 0 asks for lse. Every rank returns DTL_OK (the watchdog
 * catches a rank left in the lse exchange) and rank 0 gets attention of the token over itself. */
static void a_tokenless_rank_passing_null_buffers_enters_the_same_collectives(void) {
  const int64_t T = 1, H = dt_size, D = 8;
  cp_data d;
  cp_data_make(&d, T, H, H, D, 17, DTL_FLOAT32);
  const double scale = 1.0 / sqrt((double)D);
  double ref_o[64], ref_lse[8];
  const int64_t row = 0;
  cp_oracle(&d, 1, &row, 1, &row, true, scale, ref_o, ref_lse);
  const prefill_fn fns[2] = {dtl_cp_ulysses_attention, dtl_cp_ring_attention};
  const char *names[2] = {"ulysses", "ring"};
  for (int check = 0; check < 2; check++)
    for (int f = 0; f < 2; f++) {
      dtl_cp_attention_params p = {.flags = DTL_CP_CAUSAL, .tokens = T, .q_heads = H, .kv_heads = H, .head_dim = D,
                                   .layout = DTL_CP_CONTIGUOUS};
      float out[64], lse[8];
      memset(out, 0, sizeof out), memset(lse, 0, sizeof lse);
      bool mine = dt_rank == 0;
      dtl_status st = fns[f](ctxs[check], &p, mine ? d.Q : NULL, mine ? d.K : NULL, mine ? d.V : NULL,
                             mine ? out : NULL, mine ? lse : NULL);
      CHECK(st == DTL_OK, "%s, DTL_CHECK=%d: %s %s", names[f], check, dtl_status_name(st), dtl_last_error());
      if (!mine || st != DTL_OK) continue;
      char why[160];
      CHECK(cp_compare(ref_o, out, (size_t)(H * D), DTL_FLOAT32, 8, 0, why, sizeof why) >= 0, "%s out: %s",
            names[f], why);
      CHECK(cp_compare_lse(ref_lse, lse, (size_t)H, why, sizeof why), "%s lse: %s", names[f], why);
    }
  /* The other way round: the token holder passes lse = NULL, the tokenless ranks pass a (zero-length) lse. */
  dtl_cp_attention_params p = {.tokens = T, .q_heads = H, .kv_heads = H, .head_dim = D, .layout = DTL_CP_CONTIGUOUS};
  float out[64], none[1];
  bool mine = dt_rank == 0;
  CHECK_OK(dtl_cp_ulysses_attention(ctxs[0], &p, mine ? d.Q : NULL, mine ? d.K : NULL, mine ? d.V : NULL,
                                    mine ? out : NULL, mine ? NULL : none));
  cp_data_free(&d);
}

/* The prefill arguments, each changed alone on the last rank. */
enum { T = 8, QH = 4, KVH = 2, HD = 8 };
enum { BIG = T * 2 * QH * HD }; /* room for every edit below */
static float q[BIG], k[BIG], v[BIG], out[BIG], lse[BIG];

static dtl_cp_attention_params prefill_good(void) {
  return (dtl_cp_attention_params){.flags = DTL_CP_CAUSAL, .tokens = T, .q_heads = QH, .kv_heads = KVH,
                                   .head_dim = HD, .layout = DTL_CP_ZIGZAG};
}

/* Each edit keeps the call valid on its own (the bad rank's buffers are large enough for all of them), so only
 * the fingerprint can tell the ranks apart. */
static void edit_tokens(dtl_cp_attention_params *p) { p->tokens = T - 1; }
static void edit_q_heads(dtl_cp_attention_params *p) { p->q_heads = KVH; }
static void edit_kv_heads(dtl_cp_attention_params *p) { p->kv_heads = QH; }
static void edit_head_dim(dtl_cp_attention_params *p) { p->head_dim = HD / 2; }
static void edit_heads_times_dim_kept(dtl_cp_attention_params *p) {
  p->kv_heads = 2 * KVH, p->q_heads = 2 * QH, p->head_dim = HD / 2;
}
static void edit_layout(dtl_cp_attention_params *p) { p->layout = DTL_CP_CONTIGUOUS; }
static void edit_causal(dtl_cp_attention_params *p) { p->flags = 0; }
static void edit_scale(dtl_cp_attention_params *p) { p->mask = DTL_CP_SCALE, p->scale = 0.25f; }

static const struct {
  const char *what;
  void (*edit)(dtl_cp_attention_params *);
} prefill_edits[] = {{"tokens", edit_tokens},
                     {"q_heads", edit_q_heads},
                     {"kv_heads", edit_kv_heads},
                     {"head_dim", edit_head_dim},
                     {"kv_heads x head_dim kept, both changed", edit_heads_times_dim_kept},
                     {"layout", edit_layout},
                     {"causal", edit_causal},
                     {"scale", edit_scale}};

static void prefill_arguments_that_differ_on_one_rank_are_a_mismatch_on_every_rank(void) {
  const prefill_fn fns[2] = {dtl_cp_ring_attention, dtl_cp_ulysses_attention};
  const char *names[2] = {"dtl_cp_ring_attention", "dtl_cp_ulysses_attention"};
  for (int f = 0; f < 2; f++)
    for (size_t i = 0; i < sizeof prefill_edits / sizeof *prefill_edits; i++) {
      dtl_cp_attention_params p = prefill_good();
      if (dt_rank == dt_bad) prefill_edits[i].edit(&p);
      /* Ulysses needs heads that split over the group: q_heads 4, 2 and 8 and kv_heads 2 and 4 do for 2 ranks. */
      if (f == 1 && dt_size != 2) continue;
      char call[96];
      snprintf(call, sizeof call, "%s, %s changed on rank %d", names[f], prefill_edits[i].what, dt_bad);
      dt_expect_mismatch(call, fns[f](ctxs[1], &p, q, k, v, out, lse));
    }
}

static void decode_arguments_that_differ_on_one_rank_are_a_mismatch_on_every_rank(void) {
  const char *what[] = {"tokens", "q_heads", "kv_heads", "head_dim", "q_pos0", "causal", "scale"};
  for (int i = 0; i < 7; i++) {
    dtl_cp_decode_params p = {.flags = DTL_CP_CAUSAL, .tokens = 2, .q_heads = QH, .kv_heads = KVH, .head_dim = HD,
                              .q_pos0 = T, .kv_tokens = 3, .kv_pos0 = 3 * dt_rank};
    if (dt_rank == dt_bad) {
      if (i == 0) p.tokens = 1;
      if (i == 1) p.q_heads = KVH;
      if (i == 2) p.kv_heads = QH;
      if (i == 3) p.head_dim = HD / 2;
      if (i == 4) p.q_pos0 = T + 1;
      if (i == 5) p.flags = 0;
      if (i == 6) p.mask = DTL_CP_SCALE, p.scale = 0.25f;
    }
    char call[80];
    snprintf(call, sizeof call, "dtl_cp_decode_attention, %s changed on rank %d", what[i], dt_bad);
    dt_expect_mismatch(call, dtl_cp_decode_attention(ctxs[1], &p, q, k, v, out, lse));
  }
  /* kv_tokens and kv_pos0 differ by design (each rank holds its part of the cache): no mismatch. */
  dtl_cp_decode_params p = {.tokens = 2, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .q_pos0 = T,
                            .kv_tokens = 1 + dt_rank % 3, .kv_pos0 = 5 * dt_rank};
  CHECK_OK(dtl_cp_decode_attention(ctxs[1], &p, q, k, v, out, lse));
}

static void state_reduce_arguments_that_differ_on_one_rank_are_a_mismatch_on_every_rank(void) {
  const char *what[] = {"T", "H", "D", "placement"};
  for (int i = 0; i < 4; i++) {
    int64_t t = 2, h = 2, d = 4;
    dtl_placement pl = {.kind = DTL_REPLICATE};
    if (dt_rank == dt_bad) {
      if (i == 0) t = 1;
      if (i == 1) h = 1;
      if (i == 2) d = 2;
      if (i == 3) pl = (dtl_placement){.kind = DTL_SHARD, .dim = 0};
    }
    char call[80];
    snprintf(call, sizeof call, "dtl_cp_state_reduce, %s changed on rank %d", what[i], dt_bad);
    dt_expect_mismatch(call, dtl_cp_state_reduce(ctxs[1], t, h, d, out, lse, pl, out, lse));
  }
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  dt_ranks_init();
  for (int c = 0; c < 2; c++) {
    worlds[c] = dt_comm_with_check(c == 1);
    REQUIRE_OK(worlds[c] ? DTL_OK : DTL_ERR_COMM);
    int np = dt_size;
    REQUIRE_OK(dtl_mesh_create(worlds[c], 1, &np, &meshes[c]));
    REQUIRE_OK(dtl_cp_context_create(meshes[c], 0, NULL, &ctxs[c]));
  }
  t_rand_state = 5;
  float *r = t_rand_reals(sizeof q / sizeof *q, 1.0f, DTL_FLOAT32);
  memcpy(q, r, sizeof q), memcpy(k, r, sizeof k), memcpy(v, r, sizeof v), memcpy(lse, r, sizeof lse);
  free(r);
  RUN(a_tokenless_rank_passing_null_buffers_enters_the_same_collectives);
  RUN(prefill_arguments_that_differ_on_one_rank_are_a_mismatch_on_every_rank);
  RUN(decode_arguments_that_differ_on_one_rank_are_a_mismatch_on_every_rank);
  RUN(state_reduce_arguments_that_differ_on_one_rank_are_a_mismatch_on_every_rank);
  for (int c = 1; c >= 0; c--) {
    dtl_cp_context_destroy(ctxs[c]);
    dtl_mesh_destroy(meshes[c]);
    dtl_comm_destroy(worlds[c]);
  }
  return dt_finish();
}

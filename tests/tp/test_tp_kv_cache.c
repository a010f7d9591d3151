/* SPDX-License-Identifier: Apache-2.0 */
/* The attention block with rotary embedding and a KV cache, against the dense double-precision oracle
 * (tp_oracle.h) of the whole sequence: a prefill of T tokens then decode steps (and multi-token steps) equal
 * the reference rows of those tokens and the uncached forward over the whole sequence, at every TP size
 * the launch gives, with uneven head splits and replicated kv heads (tp > kv_heads), with and without
 * sequence parallelism (prefills of 1 token and of token counts tp does not divide: uneven and empty
 * chunks). Reset and reuse start a new sequence; an overflow of max_tokens is an error on every rank that
 * writes nothing and leaves the cache as it was; decode steps allocate nothing after the prefill; bad arguments are
 * named; and with DTL_CHECK a rank whose cache length differs from its peers' fails every rank. */
#include "common/alloc.h"
#include "dtl_test_ranks.h"
#include "tp_env.h"

static t_env E;
static const double TOL = 1e-5;
static const double THETA = 10000.0;

static unsigned seed(unsigned s) { return s * 31u + (unsigned)E.data_coord * 1000003u; }

static dtl_layout *act(dtl_tp_context *c, int64_t T, int64_t F, dtl_placement p) {
  dtl_layout *l = NULL;
  CHECK_OK(dtl_tp_activation_layout(c, T, F, p, &l));
  return l;
}

static bool heads_ok(int64_t Hq, int64_t Hkv) { return dtl_tp_attention_heads(E.ctx, Hq, Hkv, NULL, NULL) == DTL_OK; }

/* One model: weights, a sequence x [N, H] and its dense output ref [N, H]. */
typedef struct {
  int64_t H, Hq, Hkv, D, N;
  float *x, *wqkv, *wo, *bqkv, *bo;
  double *ref;
} model;

static void model_make(model *m, int64_t Hq, int64_t Hkv, int64_t D, int64_t N, bool bias, unsigned s) {
  int64_t H = 8, W = (Hq + 2 * Hkv) * D;
  *m = (model){.H = H, .Hq = Hq, .Hkv = Hkv, .D = D, .N = N};
  m->x = t_reals(seed(s), N * H, 1.0f);
  m->wqkv = t_reals(seed(s + 1), W * H, 0.5f);
  m->wo = t_reals(seed(s + 2), H * Hq * D, 0.5f);
  m->bqkv = bias ? t_reals(seed(s + 3), W, 0.5f) : NULL;
  m->bo = bias ? t_reals(seed(s + 4), H, 0.5f) : NULL;
  m->ref = malloc(sizeof(double) * (size_t)(N * H));
  t_attention_rope(N, H, Hq, Hkv, D, 1.0f / sqrtf((float)D), THETA, m->x, m->wqkv, m->bqkv, m->wo, m->bo, m->ref);
}
static void model_new_sequence(model *m, unsigned s) {
  free(m->x);
  m->x = t_reals(seed(s), m->N * m->H, 1.0f);
  t_attention_rope(m->N, m->H, m->Hq, m->Hkv, m->D, 1.0f / sqrtf((float)m->D), THETA, m->x, m->wqkv, m->bqkv, m->wo,
                   m->bo, m->ref);
}
static void model_free(model *m) { free(m->x), free(m->wqkv), free(m->wo), free(m->bqkv), free(m->bo), free(m->ref); }

static dtl_tp_attention *block(const model *m, bool sp) {
  dtl_tp_attention_params p = {.mask = DTL_TP_ROPE, .flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0, .hidden = m->H,
                               .q_heads = m->Hq, .kv_heads = m->Hkv, .head_dim = m->D, .qkv = m->wqkv, .out = m->wo,
                               .qkv_bias = m->bqkv, .out_bias = m->bo, .rope_theta = (float)THETA};
  dtl_tp_attention *a = NULL;
  CHECK_OK(dtl_tp_attention_create(E.ctx, &p, &a));
  return a;
}

/* One cached call on tokens [s0, s0 + T) of m's sequence: this rank's rows in, this rank's rows out, checked
 * against the reference rows and, when full is given (the uncached forward's [N, H]), against those. */
static void step(const model *m, dtl_tp_attention *a, dtl_tp_kv_cache *c, bool sp, int64_t s0, int64_t T,
                 const float *full, const char *what) {
  int64_t t0 = 0, tn = T;
  if (sp) t_chunk(T, E.tp, E.rank, &t0, &tn);
  dtl_layout *l = act(E.ctx, T, m->H, sp ? dtl_shard(0) : dtl_replicate());
  float *y = malloc(sizeof(float) * (size_t)(tn * m->H + 1));
  int64_t before = dtl_tp_kv_cache_length(c);
  CHECK_OK(dtl_tp_attention_forward_cached(a, c, l, m->x + (s0 + t0) * m->H, y));
  CHECK(dtl_tp_kv_cache_length(c) == before + T, "%s: length %lld after %lld + %lld tokens", what,
        (long long)dtl_tp_kv_cache_length(c), (long long)before, (long long)T);
  double mx, err = t_block_err(m->ref, m->H, s0 + t0, tn, 0, m->H, y, &mx);
  CHECK(err <= TOL * (1 + mx), "%s: tokens %lld..%lld: max error %g against the dense reference (max |ref| %g)", what,
        (long long)s0, (long long)(s0 + T - 1), err, mx);
  for (int64_t i = 0; full && i < tn * m->H; i++) {
    float u = full[(s0 + t0) * m->H + i];
    CHECK(fabsf(y[i] - u) <= TOL * (1 + fabsf(u)), "%s: y[%lld]=%g, uncached forward %g", what, (long long)i, y[i], u);
  }
  dtl_layout_destroy(l);
  free(y);
}

/* The uncached forward over all N tokens (RoPE at 0..N-1), gathered to [N, H] on every rank; checked too. */
static float *uncached(const model *m, dtl_tp_attention *a, bool sp) {
  int64_t t0 = 0, tn = m->N;
  if (sp) t_chunk(m->N, E.tp, E.rank, &t0, &tn);
  dtl_layout *l = act(E.ctx, m->N, m->H, sp ? dtl_shard(0) : dtl_replicate());
  float *y = malloc(sizeof(float) * (size_t)(tn * m->H + 1)), *full = malloc(sizeof(float) * (size_t)(m->N * m->H));
  CHECK_OK(dtl_tp_attention_forward(a, l, m->x + t0 * m->H, y));
  double mx, err = t_block_err(m->ref, m->H, t0, tn, 0, m->H, y, &mx);
  CHECK(err <= TOL * (1 + mx), "uncached forward with RoPE: max error %g (max |ref| %g)", err, mx);
  if (sp) CHECK_OK(dtl_tp_sequence_gather(E.ctx, l, y, full));
  else memcpy(full, y, sizeof(float) * (size_t)(m->N * m->H));
  dtl_layout_destroy(l);
  free(y);
  return full;
}

/* ---------------------------------------------------------------------------------------------------- */
static void prefill_then_decode_equals_the_dense_reference_and_the_uncached_forward(void) {
  /* q heads / kv heads / head_dim: GQA, uneven kv splits (5 over 2, 3 or 4 ranks), kv replicated (tp > kv). */
  int64_t cfg[][3] = {{4, 4, 4}, {8, 2, 4}, {12, 1, 2}, {6, 3, 6}, {10, 5, 2}};
  /* Call sizes: a prefill tp does not divide, decode steps, a 2-token step; a 1-token prefill. */
  int64_t sched[][6] = {{5, 1, 1, 2, 1, 0}, {1, 1, 3, 1, 0, 0}};
  for (unsigned c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    if (!heads_ok(cfg[c][0], cfg[c][1])) continue; /* the rejection is the heads test's */
    for (int sp = 0; sp < 2; sp++)
      for (unsigned k = 0; k < 2; k++) {
        model m;
        int64_t N = 0;
        for (int i = 0; sched[k][i]; i++) N += sched[k][i];
        model_make(&m, cfg[c][0], cfg[c][1], cfg[c][2], N, sp == (int)k, 70 + c);
        dtl_tp_attention *a = block(&m, sp);
        float *full = uncached(&m, a, sp);
        dtl_tp_kv_cache *cache = NULL;
        CHECK_OK(dtl_tp_kv_cache_create(a, N, &cache));
        CHECK(dtl_tp_kv_cache_length(cache) == 0, "a new cache holds %lld tokens", (long long)dtl_tp_kv_cache_length(cache));
        char what[96];
        snprintf(what, sizeof what, "q=%lld kv=%lld D=%lld sp=%d schedule %u", (long long)cfg[c][0],
                 (long long)cfg[c][1], (long long)cfg[c][2], sp, k);
        for (int64_t i = 0, s0 = 0; sched[k][i]; s0 += sched[k][i], i++) step(&m, a, cache, sp, s0, sched[k][i], full, what);
        dtl_tp_kv_cache_destroy(cache);
        dtl_tp_attention_destroy(a);
        model_free(&m);
        free(full);
      }
  }
}

static void reset_starts_a_new_sequence_in_the_same_memory(void) {
  int64_t Hq = 8, Hkv = 2, D = 4;
  if (!heads_ok(Hq, Hkv)) return;
  for (int sp = 0; sp < 2; sp++) {
    model m;
    model_make(&m, Hq, Hkv, D, 6, true, 90);
    dtl_tp_attention *a = block(&m, sp);
    dtl_tp_kv_cache *cache = NULL;
    CHECK_OK(dtl_tp_kv_cache_create(a, 8, &cache));
    step(&m, a, cache, sp, 0, 4, NULL, "first sequence");
    step(&m, a, cache, sp, 4, 1, NULL, "first sequence");
    CHECK_OK(dtl_tp_kv_cache_reset(cache));
    CHECK(dtl_tp_kv_cache_length(cache) == 0, "length %lld after reset", (long long)dtl_tp_kv_cache_length(cache));
    model_new_sequence(&m, 91); /* other tokens: nothing of the first sequence may leak in */
    step(&m, a, cache, sp, 0, 3, NULL, "after reset");
    for (int64_t s0 = 3; s0 < 6; s0++) step(&m, a, cache, sp, s0, 1, NULL, "after reset");
    dtl_tp_kv_cache_destroy(cache);
    dtl_tp_attention_destroy(a);
    model_free(&m);
  }
}

static void overflowing_max_tokens_fails_every_rank_and_writes_nothing(void) {
  int64_t Hq = 4, Hkv = 4, D = 2;
  if (!heads_ok(Hq, Hkv)) return;
  for (int sp = 0; sp < 2; sp++) {
    model m;
    model_make(&m, Hq, Hkv, D, 6, false, 100);
    dtl_tp_attention *a = block(&m, sp);
    dtl_tp_kv_cache *cache = NULL;
    CHECK_OK(dtl_tp_kv_cache_create(a, 6, &cache));
    step(&m, a, cache, sp, 0, 4, NULL, "prefill");
    float y[3 * 8];
    for (int i = 0; i < 3 * 8; i++) y[i] = 12345.0f;
    dtl_layout *l = act(E.ctx, 3, m.H, sp ? dtl_shard(0) : dtl_replicate());
    CHECK_ERROR(dtl_tp_attention_forward_cached(a, cache, l, m.x + 4 * m.H, y), DTL_ERR_INVALID_ARGUMENT,
                "tokens=3 at cache length 4 exceed max_tokens=6");
    for (int i = 0; i < 3 * 8; i++) CHECK(y[i] == 12345.0f, "y[%d] written by an overflowing call", i);
    CHECK(dtl_tp_kv_cache_length(cache) == 4, "length %lld after a failed call", (long long)dtl_tp_kv_cache_length(cache));
    /* The cache is as it was: the sequence goes on to exactly max_tokens, then the next token overflows. */
    step(&m, a, cache, sp, 4, 2, NULL, "after the overflow");
    dtl_layout *one = act(E.ctx, 1, m.H, sp ? dtl_shard(0) : dtl_replicate());
    CHECK_ERROR(dtl_tp_attention_forward_cached(a, cache, one, m.x, y), DTL_ERR_INVALID_ARGUMENT, "max_tokens=6");
    dtl_layout_destroy(l);
    dtl_layout_destroy(one);
    dtl_tp_kv_cache_destroy(cache);
    dtl_tp_attention_destroy(a);
    model_free(&m);
  }
}

/* The cache is allocated at creation and the context's scratch is taken for a full cache: after the prefill,
 * no decode step allocates, host or device (without the bound the attention scratch would grow each token). */
static void decode_steps_allocate_nothing_after_the_prefill(void) {
  int64_t Hq = 8, Hkv = 2, D = 4;
  if (!heads_ok(Hq, Hkv)) return;
  model m;
  model_make(&m, Hq, Hkv, D, 40, false, 110);
  dtl_tp_attention *a = block(&m, false);
  dtl_tp_kv_cache *cache = NULL;
  CHECK_OK(dtl_tp_kv_cache_create(a, 40, &cache));
  dtl_layout *one = act(E.ctx, 1, m.H, dtl_replicate());
  float y[8];
  step(&m, a, cache, false, 0, 3, NULL, "prefill");
  dtl__alloc_hook_reset(0, false);
  for (int64_t s0 = 3; s0 < 40; s0++) CHECK_OK(dtl_tp_attention_forward_cached(a, cache, one, m.x + s0 * m.H, y));
  uint64_t n = dtl__alloc_hook_count();
  CHECK(n == 0, "37 decode steps made %llu allocations", (unsigned long long)n);
  double mx, err = t_block_err(m.ref, m.H, 39, 1, 0, m.H, y, &mx);
  CHECK(err <= TOL * (1 + mx), "the last decode step: max error %g (max |ref| %g)", err, mx);
  dtl_layout_destroy(one);
  dtl_tp_kv_cache_destroy(cache);
  dtl_tp_attention_destroy(a);
  model_free(&m);
}

static void bad_rope_parameters_and_cache_arguments_are_named(void) {
  float w[4096] = {0};
  dtl_tp_attention *a = NULL;
  int64_t hk = E.tp; /* E.tp q and kv heads: valid at every TP size */
  dtl_tp_attention_params p = {.mask = DTL_TP_ROPE, .hidden = 4, .q_heads = hk, .kv_heads = hk, .head_dim = 3,
                               .qkv = w, .out = w, .rope_theta = 10000.0f};
  CHECK_ERROR(dtl_tp_attention_create(E.ctx, &p, &a), DTL_ERR_INVALID_ARGUMENT, "head_dim=3 with DTL_TP_ROPE");
  p.head_dim = 2;
  float thetas[] = {0.0f, -1.0f, NAN, INFINITY};
  for (int i = 0; i < 4; i++) {
    p.rope_theta = thetas[i];
    CHECK_ERROR(dtl_tp_attention_create(E.ctx, &p, &a), DTL_ERR_INVALID_ARGUMENT, "rope_theta=");
  }
  p.rope_theta = 10000.0f;
  p.mask = 0;
  p.flags = DTL_TP_ROPE; /* a mask bit in flags */
  CHECK_ERROR(dtl_tp_attention_create(E.ctx, &p, &a), DTL_ERR_INVALID_ARGUMENT, "params.flags=0x20 has unknown bits 0x20");
  dtl_tp_mlp *mlp = NULL;
  dtl_tp_mlp_params mp = {.mask = DTL_TP_ROPE, .activation = DTL_TP_ACT_GELU, .hidden = 2, .ffn = 2, .gate_up = w, .down = w};
  CHECK_ERROR(dtl_tp_mlp_create(E.ctx, &mp, &mlp), DTL_ERR_INVALID_ARGUMENT, "params.mask=0x20 has unknown bits 0x20");
  CHECK(a == NULL && mlp == NULL, "a failed creation returned a layer");

  p.flags = 0;
  dtl_tp_attention *b = NULL;
  CHECK_OK(dtl_tp_attention_create(E.ctx, &p, &a));
  CHECK_OK(dtl_tp_attention_create(E.ctx, &p, &b));
  dtl_tp_kv_cache *c = NULL, *cb = NULL;
  CHECK_ERROR(dtl_tp_kv_cache_create(NULL, 4, &c), DTL_ERR_INVALID_ARGUMENT, "block=NULL");
  CHECK_ERROR(dtl_tp_kv_cache_create(a, 0, &c), DTL_ERR_INVALID_ARGUMENT, "max_tokens=0 (expected >= 1)");
  CHECK_ERROR(dtl_tp_kv_cache_create(a, INT64_MAX, &c), DTL_ERR_INVALID_ARGUMENT, "cache keys");
  CHECK_ERROR(dtl_tp_kv_cache_create(a, 4, NULL), DTL_ERR_INVALID_ARGUMENT, "out=NULL");
  CHECK(c == NULL, "a failed creation returned a cache");
  CHECK_OK(dtl_tp_kv_cache_create(a, 4, &c));
  CHECK_OK(dtl_tp_kv_cache_create(b, 4, &cb));
  dtl_layout *l = act(E.ctx, 2, 4, dtl_replicate()), *wide = act(E.ctx, 2, 5, dtl_replicate());
  float x[8] = {0}, y[8];
  CHECK_ERROR(dtl_tp_attention_forward_cached(NULL, c, l, x, y), DTL_ERR_INVALID_ARGUMENT, "block=NULL");
  CHECK_ERROR(dtl_tp_attention_forward_cached(a, NULL, l, x, y), DTL_ERR_INVALID_ARGUMENT, "cache=NULL");
  CHECK_ERROR(dtl_tp_attention_forward_cached(a, cb, l, x, y), DTL_ERR_INVALID_ARGUMENT,
              "belongs to another attention block");
  CHECK_ERROR(dtl_tp_attention_forward_cached(a, c, l, x, NULL), DTL_ERR_INVALID_ARGUMENT, "y=NULL");
  CHECK_ERROR(dtl_tp_attention_forward_cached(a, c, wide, x, y), DTL_ERR_MISMATCH, "x_layout is");
  CHECK(dtl_tp_kv_cache_length(c) == 0, "failed calls changed the length to %lld", (long long)dtl_tp_kv_cache_length(c));
  CHECK_ERROR(dtl_tp_kv_cache_reset(NULL), DTL_ERR_INVALID_ARGUMENT, "cache=NULL");
  CHECK(dtl_tp_kv_cache_length(NULL) == -1, "length of NULL");
  dtl_tp_kv_cache_destroy(NULL);
  dtl_layout_destroy(l);
  dtl_layout_destroy(wide);
  dtl_tp_kv_cache_destroy(c);
  dtl_tp_kv_cache_destroy(cb);
  dtl_tp_attention_destroy(a);
  dtl_tp_attention_destroy(b);
}

/* Creation agrees: one rank's bad max_tokens fails every rank (without DTL_CHECK too). */
static void cache_creation_fails_every_rank_when_one_rank_fails(void) {
  float w[256] = {0};
  dtl_tp_attention_params p = {.hidden = 4, .q_heads = E.tp, .kv_heads = E.tp, .head_dim = 2, .qkv = w, .out = w};
  dtl_tp_attention *a = NULL;
  CHECK_OK(dtl_tp_attention_create(E.ctx, &p, &a));
  dtl_tp_kv_cache *c = NULL;
  bool me = E.rank == E.tp - 1;
  dtl_status st = dtl_tp_kv_cache_create(a, me ? 0 : 4, &c);
  if (E.tp == 1) CHECK(st == DTL_ERR_INVALID_ARGUMENT, "%s", dtl_status_name(st));
  else {
    char named[64];
    snprintf(named, sizeof named, "rank %d failed (", E.tp - 1);
    CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), me ? "max_tokens=0" : named), "%s '%s'",
          dtl_status_name(st), dtl_last_error());
  }
  CHECK(c == NULL, "a failed creation returned a cache");
  /* Different max_tokens on one rank: the caches would not be alike. */
  st = dtl_tp_kv_cache_create(a, me ? 5 : 4, &c);
  CHECK(E.tp == 1 ? st == DTL_OK : st == DTL_ERR_MISMATCH, "max_tokens differs on one rank: %s '%s'",
        dtl_status_name(st), dtl_last_error());
  dtl_tp_kv_cache_destroy(c);
  dtl_tp_attention_destroy(a);
}

/* With DTL_CHECK the cache length is part of the call: a rank that missed a call or reset alone fails
 * every rank instead of attending over other tokens than its peers (and an overflow on that rank alone is
 * every rank's error). */
static void with_dtl_check_a_rank_with_another_cache_length_fails_every_rank(void) {
  dt_ranks_init();
  dtl_comm *checked = dt_comm_with_check(true);
  REQUIRE_OK(checked ? DTL_OK : DTL_ERR_INTERNAL);
  dtl_mesh *mesh = NULL;
  int n = dt_size;
  REQUIRE_OK(dtl_mesh_create(checked, 1, &n, &mesh));
  dtl_tp_context *ctx = NULL;
  REQUIRE_OK(dtl_tp_context_create(mesh, 0, NULL, &ctx));
  float w[1024], x[32 * 8], y[32 * 8];
  for (int i = 0; i < 1024; i++) w[i] = (float)(i % 7) * 0.125f;
  for (int i = 0; i < 32 * 8; i++) x[i] = (float)(i % 5) * 0.25f;
  dtl_tp_attention_params p = {.mask = DTL_TP_ROPE, .hidden = 8, .q_heads = dt_size, .kv_heads = dt_size,
                               .head_dim = 2, .qkv = w, .out = w, .rope_theta = 10000.0f};
  dtl_tp_attention *a = NULL;
  REQUIRE_OK(dtl_tp_attention_create(ctx, &p, &a));
  dtl_tp_kv_cache *c = NULL;
  REQUIRE_OK(dtl_tp_kv_cache_create(a, 4, &c));
  dtl_layout *two = NULL, *three = NULL;
  REQUIRE_OK(dtl_tp_activation_layout(ctx, 2, 8, dtl_replicate(), &two));
  REQUIRE_OK(dtl_tp_activation_layout(ctx, 3, 8, dtl_replicate(), &three));
  bool me = dt_rank == dt_bad;
  CHECK_OK(dtl_tp_attention_forward_cached(a, c, two, x, y));
  if (me) CHECK_OK(dtl_tp_kv_cache_reset(c)); /* this rank alone starts over */
  dt_expect_mismatch("cache length", dtl_tp_attention_forward_cached(a, c, two, x, y));
  if (dt_size > 1) {
    CHECK(dtl_tp_kv_cache_length(c) == (me ? 0 : 2), "a failed call changed the length");
    /* 3 more tokens overflow every cache but this rank's: the others fail with their own message, this rank
     * names them. */
    for (int i = 0; i < 3 * 8; i++) y[i] = 12345.0f;
    dtl_status st = dtl_tp_attention_forward_cached(a, c, three, x, y);
    CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), me ? "failed (DTL_ERR_INVALID_ARGUMENT" : "exceed max_tokens=4"),
          "overflow on the other ranks: %s '%s'", dtl_status_name(st), dtl_last_error());
    for (int i = 0; i < 3 * 8; i++) CHECK(y[i] == 12345.0f, "y[%d] written by a failed call", i);
    CHECK(dtl_tp_kv_cache_length(c) == (me ? 0 : 2), "a failed call changed the length");
  }
  dtl_layout_destroy(two);
  dtl_layout_destroy(three);
  dtl_tp_kv_cache_destroy(c);
  dtl_tp_attention_destroy(a);
  dtl_tp_context_destroy(ctx);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(checked);
}

int main(int argc, char **argv) {
  t_setup(&argc, &argv, &E);
  RUN(prefill_then_decode_equals_the_dense_reference_and_the_uncached_forward);
  RUN(reset_starts_a_new_sequence_in_the_same_memory);
  RUN(overflowing_max_tokens_fails_every_rank_and_writes_nothing);
  RUN(decode_steps_allocate_nothing_after_the_prefill);
  RUN(bad_rope_parameters_and_cache_arguments_are_named);
  RUN(cache_creation_fails_every_rank_when_one_rank_fails);
  if (E.data == 1) RUN(with_dtl_check_a_rank_with_another_cache_length_fails_every_rank);
  t_teardown(&E);
  return dt_finish();
}

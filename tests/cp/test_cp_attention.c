/* SPDX-License-Identifier: Apache-2.0 */
/* Context parallelism against dense attention (cp_oracle.h, double precision) at every world size it runs
 * at: ring and all-to-all prefill in both token layouts, causal and not, over shapes that reach GQA, MQA,
 * uneven T (not a multiple of 2p), T < p (ranks without tokens), one token and none; split-KV decode with
 * contiguous and scattered (position-array) cache parts, ranks with an empty part; the collective merge to
 * R and S(0), in place; the local merge on a communicator's memory; scratch reused across calls. In a CUDA
 * build the same cases run again through the device kernels' code emulated on the host, with the device's
 * transfer order and f32/f16/bf16 storage. */
#include "dtl_test.h"
#include "cp_oracle.h"
#include "cp/cp_internal.h"

static dtl_comm *world;
static dtl_mesh *mesh;
static dtl_cp_context *host_ctx;

typedef struct {
  const char *what;
  int64_t T, qh, kvh, D;
  bool causal;
  dtl_cp_token_layout layout;
} prefill_case;

static const prefill_case kPrefill[] = {
    {"one head, T = 12", 12, 1, 1, 4, true, DTL_CP_ZIGZAG},
    {"GQA 4/2, uneven T = 13", 13, 4, 2, 8, true, DTL_CP_ZIGZAG},
    {"GQA 6/3, T = 40, head_dim 5", 40, 6, 3, 5, true, DTL_CP_ZIGZAG},
    {"heads that split over 1..5 ranks (12/6), T = 23", 23, 12, 6, 4, true, DTL_CP_ZIGZAG},
    {"MQA 60/1 (kv head replicated over the group), T = 11", 11, 60, 1, 2, true, DTL_CP_ZIGZAG},
    {"T = 2 (< p: ranks without tokens)", 2, 2, 1, 3, true, DTL_CP_ZIGZAG},
    {"one token", 1, 2, 2, 3, true, DTL_CP_ZIGZAG},
    {"no token", 0, 2, 2, 3, true, DTL_CP_ZIGZAG},
    {"not causal, contiguous, T = 37", 37, 4, 2, 6, false, DTL_CP_CONTIGUOUS},
    {"causal, contiguous, uneven T = 29", 29, 4, 4, 4, true, DTL_CP_CONTIGUOUS},
    {"not causal, zig-zag, T = 17", 17, 2, 1, 8, false, DTL_CP_ZIGZAG},
};
#define NPREFILL (sizeof kPrefill / sizeof kPrefill[0])

typedef enum { RING, ULYSSES } method;
static const char *method_name(method m) { return m == RING ? "ring" : "ulysses"; }

/* Whether the TP head rule splits (qh, kvh) over p ranks, from the rule's statement (not from dtl). */
static bool heads_split(int64_t qh, int64_t kvh, int p) { return p <= kvh || (p % kvh == 0 && qh % p == 0); }

/* Allocations of n bytes filled with 0x5a (NaN-free poison). */
static void *poison(size_t n) {
  void *p = malloc(n + 4);
  memset(p, 0x5a, n + 4);
  return p;
}

/* One prefill case on ctx (host memory, dtype t): this rank's rows against the dense reference. */
static void run_prefill(dtl_cp_context *ctx, dtl_dtype t, const prefill_case *c, method m, double rounds) {
  const int p = dtl_cp_context_size(ctx), r = dtl_cp_context_rank(ctx);
  if (m == ULYSSES && !heads_split(c->qh, c->kvh, p)) {
    CHECK(dtl_cp_ulysses_heads(ctx, c->qh, c->kvh, NULL, NULL) == DTL_ERR_INVALID_ARGUMENT,
          "%s: heads %lld/%lld do not split over %d ranks, yet dtl says they do", c->what, (long long)c->qh,
          (long long)c->kvh, p);
    return;
  }
  cp_data d;
  cp_data_make(&d, c->T, c->qh, c->kvh, c->D, 1000 + (uint64_t)c->T * 7 + (uint64_t)c->qh, t);
  int64_t *rows = malloc(sizeof(int64_t) * (size_t)(c->T + 1)), *all = malloc(sizeof(int64_t) * (size_t)(c->T + 1));
  int64_t n = cp_rows_of(c->layout, c->T, p, r, rows);
  for (int64_t j = 0; j < c->T; j++) all[j] = j;
  const int64_t qw = c->qh * c->D, kvw = c->kvh * c->D;
  double scale = 1.0 / sqrt((double)c->D);
  double *ref = malloc(sizeof(double) * (size_t)(n * qw + 1));
  double *ref_lse = malloc(sizeof(double) * (size_t)(n * c->qh + 1));
  cp_oracle(&d, n, rows, c->T, all, c->causal, (float)scale, ref, ref_lse);
  void *q = cp_pack_rows(d.Q, qw, rows, n, t), *k = cp_pack_rows(d.K, kvw, rows, n, t);
  void *v = cp_pack_rows(d.V, kvw, rows, n, t);
  void *out = poison((size_t)(n * qw) * dtl_dtype_size(t));
  float *lse = poison(sizeof(float) * (size_t)(n * c->qh));
  dtl_cp_attention_params prm = {.flags = c->causal ? DTL_CP_CAUSAL : 0, .tokens = c->T, .q_heads = c->qh,
                                 .kv_heads = c->kvh, .head_dim = c->D, .layout = c->layout};
  dtl_status st = m == RING ? dtl_cp_ring_attention(ctx, &prm, q, k, v, out, lse)
                            : dtl_cp_ulysses_attention(ctx, &prm, q, k, v, out, lse);
  CHECK(st == DTL_OK, "%s %s %s: %s", method_name(m), dtl_dtype_name(t), c->what, dtl_last_error());
  if (st == DTL_OK) {
    char why[200];
    CHECK(cp_compare(ref, out, (size_t)(n * qw), t, rounds, 2e-5, why, sizeof why) >= 0, "%s %s %s: out %s",
          method_name(m), dtl_dtype_name(t), c->what, why);
    CHECK(cp_compare_lse(ref_lse, lse, (size_t)(n * c->qh), why, sizeof why), "%s %s %s: %s", method_name(m),
          dtl_dtype_name(t), c->what, why);
    /* lse is an optional output: without it, out is the same. */
    void *out2 = poison((size_t)(n * qw) * dtl_dtype_size(t));
    st = m == RING ? dtl_cp_ring_attention(ctx, &prm, q, k, v, out2, NULL)
                   : dtl_cp_ulysses_attention(ctx, &prm, q, k, v, out2, NULL);
    CHECK(st == DTL_OK && !memcmp(out, out2, (size_t)(n * qw) * dtl_dtype_size(t)),
          "%s %s %s: out without lse differs (%s)", method_name(m), dtl_dtype_name(t), c->what, dtl_last_error());
    free(out2);
  }
  free(q), free(k), free(v), free(out), free(lse), free(ref), free(ref_lse), free(rows), free(all);
  cp_data_free(&d);
}

static void ring_attention_equals_dense_attention(void) {
  for (size_t i = 0; i < NPREFILL; i++) run_prefill(host_ctx, DTL_FLOAT32, &kPrefill[i], RING, 0);
}

static void ulysses_attention_equals_dense_attention_where_heads_split(void) {
  for (size_t i = 0; i < NPREFILL; i++) run_prefill(host_ctx, DTL_FLOAT32, &kPrefill[i], ULYSSES, 0);
}

/* With the zig-zag layout every rank computes the same number of chunk pairs at every step, and the causal
 * mask skips exactly the pairs in a query chunk's future: over the whole ring 4p - 1... checked here as
 * equal work per rank (pairs computed and skipped) when T divides into 2p equal chunks. */
static void zigzag_ring_gives_every_rank_the_same_work(void) {
  const int p = dt_size;
  prefill_case c = {"zig-zag balance", 8 * p, 2, 1, 4, true, DTL_CP_ZIGZAG};
  run_prefill(host_ctx, DTL_FLOAT32, &c, RING, 0);
  dtl_cp_ring_stats s;
  CHECK_OK(dtl_cp_ring_last_stats(host_ctx, &s));
  int mine[2] = {s.pairs_computed, s.pairs_skipped}, lo[2], hi[2];
  MPI_Allreduce(mine, lo, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(mine, hi, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo[0] == hi[0] && lo[1] == hi[1], "pairs computed %d..%d, skipped %d..%d across ranks", lo[0], hi[0], lo[1],
        hi[1]);
  /* 2 query chunks x 2 key chunks per step: the own block computes 3 pairs and skips 1, every other block
   * computes 2 and skips 2. */
  CHECK(s.steps == p && s.pairs_computed == 3 + 2 * (p - 1) && s.pairs_skipped == 1 + 2 * (p - 1),
        "steps %d, pairs computed %d, skipped %d at p = %d", s.steps, s.pairs_computed, s.pairs_skipped, p);
  CHECK(s.bytes_received == (int64_t)(p - 1) * 2 * 8 * 4 * (int64_t)sizeof(float),
        "bytes received %lld", (long long)s.bytes_received);
}

static void repeated_calls_reuse_the_scratch_and_give_the_same_bits(void) {
  const int p = dt_size, r = dt_rank;
  const prefill_case c = {"reuse", 30, 12, 6, 4, true, DTL_CP_ZIGZAG}; /* heads that split over 1..5 ranks */
  cp_data d;
  cp_data_make(&d, c.T, c.qh, c.kvh, c.D, 77, DTL_FLOAT32);
  int64_t rows[30];
  int64_t n = cp_rows_of(c.layout, c.T, p, r, rows);
  const int64_t qw = c.qh * c.D, kvw = c.kvh * c.D;
  void *q = cp_pack_rows(d.Q, qw, rows, n, DTL_FLOAT32), *k = cp_pack_rows(d.K, kvw, rows, n, DTL_FLOAT32);
  void *v = cp_pack_rows(d.V, kvw, rows, n, DTL_FLOAT32);
  float *o1 = poison(sizeof(float) * (size_t)(n * qw)), *o2 = poison(sizeof(float) * (size_t)(n * qw));
  dtl_cp_attention_params prm = {.flags = DTL_CP_CAUSAL, .tokens = c.T, .q_heads = c.qh, .kv_heads = c.kvh,
                                 .head_dim = c.D};
  for (method m = RING; m <= ULYSSES; m++) {
    dtl_status (*f)(dtl_cp_context *, const dtl_cp_attention_params *, const void *, const void *, const void *,
                    void *, float *) = m == RING ? dtl_cp_ring_attention : dtl_cp_ulysses_attention;
    CHECK_OK(f(host_ctx, &prm, q, k, v, o1, NULL));
    void *ws[DTL__CP_WS_COUNT];
    memcpy(ws, host_ctx->ws, sizeof ws);
    CHECK_OK(f(host_ctx, &prm, q, k, v, o2, NULL));
    CHECK(!memcmp(ws, host_ctx->ws, sizeof ws), "%s: the second call of the same shape reallocated scratch",
          method_name(m));
    CHECK(!memcmp(o1, o2, sizeof(float) * (size_t)(n * qw)), "%s: the second call gave other bits", method_name(m));
  }
  free(q), free(k), free(v), free(o1), free(o2);
  cp_data_free(&d);
}

/* --- decode ----------------------------------------------------------------------------------------- */
typedef struct {
  const char *what;
  int64_t C, tq, qh, kvh, D; /* cache of C tokens (the new ones included), tq new tokens at C - tq .. C - 1 */
  bool causal, scattered;    /* scattered: rank r caches tokens j with j % p == r (kv_pos arrays) */
} decode_case;

static const decode_case kDecode[] = {
    {"one new token, cache of 50 in contiguous parts", 50, 1, 4, 2, 8, true, false},
    {"three new tokens (causal among themselves), cache of 31", 31, 3, 6, 3, 4, true, false},
    {"one new token, cache scattered round-robin", 26, 1, 4, 1, 5, true, true},
    {"two new tokens, not causal, scattered", 19, 2, 2, 2, 6, false, true},
    {"cache of 3 (ranks with an empty part)", 3, 1, 2, 1, 4, true, false},
};
#define NDECODE (sizeof kDecode / sizeof kDecode[0])

static void run_decode(dtl_cp_context *ctx, dtl_dtype t, const decode_case *c, double rounds) {
  const int p = dtl_cp_context_size(ctx), r = dtl_cp_context_rank(ctx);
  cp_data d;
  cp_data_make(&d, c->C, c->qh, c->kvh, c->D, 500 + (uint64_t)c->C, t);
  int64_t *mine = malloc(sizeof(int64_t) * (size_t)(c->C + 1)), *all = malloc(sizeof(int64_t) * (size_t)(c->C + 1));
  int64_t *qrows = malloc(sizeof(int64_t) * (size_t)(c->tq + 1)), nk = 0;
  for (int64_t j = 0; j < c->C; j++) all[j] = j;
  for (int64_t i = 0; i < c->tq; i++) qrows[i] = c->C - c->tq + i;
  if (c->scattered) {
    for (int64_t j = r; j < c->C; j += p) mine[nk++] = j;
  } else {
    nk = cp_rows_of(DTL_CP_CONTIGUOUS, c->C, p, r, mine);
  }
  const int64_t qw = c->qh * c->D, kvw = c->kvh * c->D;
  double *ref = malloc(sizeof(double) * (size_t)(c->tq * qw + 1));
  double *ref_lse = malloc(sizeof(double) * (size_t)(c->tq * c->qh + 1));
  cp_oracle(&d, c->tq, qrows, c->C, all, c->causal, 1.0 / sqrt((double)c->D), ref, ref_lse);
  void *q = cp_pack_rows(d.Q, qw, qrows, c->tq, t), *k = cp_pack_rows(d.K, kvw, mine, nk, t);
  void *v = cp_pack_rows(d.V, kvw, mine, nk, t);
  void *out = poison((size_t)(c->tq * qw) * dtl_dtype_size(t));
  float *lse = poison(sizeof(float) * (size_t)(c->tq * c->qh));
  dtl_cp_decode_params prm = {.mask = c->scattered ? DTL_CP_KV_POSITIONS : 0, .flags = c->causal ? DTL_CP_CAUSAL : 0,
                              .tokens = c->tq, .q_heads = c->qh, .kv_heads = c->kvh, .head_dim = c->D,
                              .q_pos0 = c->C - c->tq, .kv_tokens = nk, .kv_pos0 = nk ? mine[0] : 0, .kv_pos = mine};
  dtl_status st = dtl_cp_decode_attention(ctx, &prm, q, k, v, out, lse);
  CHECK(st == DTL_OK, "decode %s %s: %s", dtl_dtype_name(t), c->what, dtl_last_error());
  if (st == DTL_OK) {
    char why[200];
    CHECK(cp_compare(ref, out, (size_t)(c->tq * qw), t, rounds, 2e-5, why, sizeof why) >= 0, "decode %s %s: out %s",
          dtl_dtype_name(t), c->what, why);
    CHECK(cp_compare_lse(ref_lse, lse, (size_t)(c->tq * c->qh), why, sizeof why), "decode %s %s: %s",
          dtl_dtype_name(t), c->what, why);
  }
  free(q), free(k), free(v), free(out), free(lse), free(ref), free(ref_lse), free(mine), free(all), free(qrows);
  cp_data_free(&d);
}

static void decode_over_a_token_split_cache_equals_dense_attention(void) {
  for (size_t i = 0; i < NDECODE; i++) run_decode(host_ctx, DTL_FLOAT32, &kDecode[i], 0);
}

/* --- the collective merge ----------------------------------------------------------------------------- */
/* Rank r's state: the dense attention of all T queries over the keys j with j % p == r (none for some ranks
 * when T < p, and none for early queries on most ranks under the causal mask). */
static void collective_merge_of_per_rank_states_equals_attention_over_all_keys(void) {
  const int p = dt_size, r = dt_rank;
  const int64_t T = 9, H = 3, D = 5, w = H * D;
  cp_data d;
  cp_data_make(&d, T, H, H, D, 4242, DTL_FLOAT32);
  int64_t qrows[9], keys[9], all[9], nk = 0;
  for (int64_t j = 0; j < T; j++) qrows[j] = all[j] = j;
  for (int64_t j = r; j < T; j += p) keys[nk++] = j;
  double ro[9 * 15], rl[9 * 3], fo[9 * 15], fl[9 * 3];
  cp_oracle(&d, T, qrows, nk, keys, true, 0.5, ro, rl);
  cp_oracle(&d, T, qrows, T, all, true, 0.5, fo, fl);
  float o[9 * 15], l[9 * 3];
  for (int i = 0; i < 9 * 15; i++) o[i] = (float)ro[i];
  for (int i = 0; i < 9 * 3; i++) l[i] = (float)rl[i];
  char why[200];
  for (int shard = 0; shard < 2; shard++) {
    dtl_placement pl = shard ? dtl_shard(0) : dtl_replicate();
    dtl_cp_range mine = {0, T};
    if (shard) {
      dtl_cp_range rg[2];
      CHECK_OK(dtl_cp_token_ranges(DTL_CP_CONTIGUOUS, T, p, r, rg));
      mine = rg[0];
    }
    float *out = poison(sizeof(float) * (size_t)(T * w)), *out_lse = poison(sizeof(float) * (size_t)(T * H));
    CHECK_OK(dtl_cp_state_reduce(host_ctx, T, H, D, o, l, pl, out, out_lse));
    CHECK(cp_compare(fo + mine.offset * w, out, (size_t)(mine.count * w), DTL_FLOAT32, 0, 1e-5, why, sizeof why) >= 0,
          "%s: %s", shard ? "S(0)" : "R", why);
    CHECK(cp_compare_lse(fl + mine.offset * H, out_lse, (size_t)(mine.count * H), why, sizeof why), "%s: %s",
          shard ? "S(0)" : "R", why);
    /* out_lse is optional, and out may be o (in place) */
    float *copy = malloc(sizeof o);
    memcpy(copy, o, sizeof o);
    CHECK_OK(dtl_cp_state_reduce(host_ctx, T, H, D, copy, l, pl, copy, NULL));
    CHECK(!memcmp(copy, out, sizeof(float) * (size_t)(mine.count * w)), "%s in place differs", shard ? "S(0)" : "R");
    free(copy), free(out), free(out_lse);
  }
  cp_data_free(&d);
}

/* The local merge on a communicator's memory: f32 equals dtl_attn_state_merge bit for bit; f16 and bf16 are
 * within one rounding of it. */
static void local_merge_on_a_communicator_matches_the_f32_merge(void) {
  const int64_t T = 4, H = 2, D = 3, n = T * H * D;
  t_rand_state = 99;
  float *oa = t_rand_reals((size_t)n, 2.0f, DTL_FLOAT32), *ob = t_rand_reals((size_t)n, 2.0f, DTL_FLOAT32);
  float la[8] = {0.5f, -INFINITY, 3.0f, -1.0f, -INFINITY, 2.0f, 40.0f, 0.0f};
  float lb[8] = {1.5f, 1.0f, -INFINITY, -1.0f, -INFINITY, -30.0f, 0.0f, 0.25f};
  float ref[24], ref_l[8];
  memcpy(ref, oa, sizeof ref), memcpy(ref_l, la, sizeof la);
  CHECK_OK(dtl_attn_state_merge(T, H, D, ref, ref_l, ob, lb));
  for (int ti = 0; ti < 3; ti++) {
    dtl_dtype t = (dtl_dtype[]){DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16}[ti];
    void *a = t_pack(oa, (size_t)n, t), *b = t_pack(ob, (size_t)n, t);
    float l[8];
    memcpy(l, la, sizeof l);
    CHECK_OK(dtl_attn_state_merge_on(world, t, T, H, D, a, l, b, lb));
    for (int i = 0; i < 8; i++) CHECK(l[i] == ref_l[i], "%s lse[%d] %g vs %g", dtl_dtype_name(t), i, l[i], ref_l[i]);
    for (int64_t i = 0; i < n; i++) {
      double tol = t == DTL_FLOAT32 ? 0 : 4 * t_half_unit(t) * (fabs(ref[i]) + 2.0);
      CHECK(fabs(t_load(a, (size_t)i, t) - ref[i]) <= tol, "%s o[%lld] %g vs %g", dtl_dtype_name(t), (long long)i,
            (double)t_load(a, (size_t)i, t), (double)ref[i]);
    }
    free(a), free(b);
  }
  free(oa), free(ob);
}

#if DTL_HAVE_NCCL
/* --- the device path, emulated ----------------------------------------------------------------------- */
/* A context whose kernels are the CUDA kernels' code run on the host, with blocking ring transfers (the NCCL
 * order), in each storage type. f16/bf16 outputs: one rounding (prefill), or the rescale's rounding plus the
 * engine's per-step rounding of the sum (decode). */
static void device_path_emulated_equals_dense_attention_in_every_dtype(void) {
  for (int ti = 0; ti < 3; ti++) {
    dtl_dtype t = (dtl_dtype[]){DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16}[ti];
    dtl_cp_context *ctx;
    dtl_cp_options opt = {.mask = DTL_CP_OPT_DTYPE, .dtype = t};
    REQUIRE_OK(dtl_cp_context_create(mesh, 0, &opt, &ctx));
    dtl__cp_context_emulate_device(ctx, true);
    const size_t pick[] = {1, 3, 4, 5, 7, 8, 9};
    for (size_t i = 0; i < sizeof pick / sizeof pick[0]; i++) {
      run_prefill(ctx, t, &kPrefill[pick[i]], RING, 2);
      run_prefill(ctx, t, &kPrefill[pick[i]], ULYSSES, 2);
    }
    for (size_t i = 0; i < NDECODE; i++) run_decode(ctx, t, &kDecode[i], 2.0 + dt_size);
    dtl_cp_context_destroy(ctx);
  }
}

/* Head dims longer than a thread block and heads the kernels stride over. */
static void device_path_emulated_handles_head_dims_longer_than_a_block(void) {
  dtl_cp_context *ctx;
  REQUIRE_OK(dtl_cp_context_create(mesh, 0, NULL, &ctx));
  dtl__cp_context_emulate_device(ctx, true);
  const prefill_case c = {"head_dim 130", 7, 2, 1, 130, true, DTL_CP_ZIGZAG};
  run_prefill(ctx, DTL_FLOAT32, &c, RING, 0);
  dtl_cp_context_destroy(ctx);
}
#endif

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  REQUIRE_OK(dtl_mesh_create(world, 1, &dt_size, &mesh));
  REQUIRE_OK(dtl_cp_context_create(mesh, 0, NULL, &host_ctx));
  RUN(ring_attention_equals_dense_attention);
  RUN(ulysses_attention_equals_dense_attention_where_heads_split);
  RUN(zigzag_ring_gives_every_rank_the_same_work);
  RUN(repeated_calls_reuse_the_scratch_and_give_the_same_bits);
  RUN(decode_over_a_token_split_cache_equals_dense_attention);
  RUN(collective_merge_of_per_rank_states_equals_attention_over_all_keys);
  RUN(local_merge_on_a_communicator_matches_the_f32_merge);
#if DTL_HAVE_NCCL
  RUN(device_path_emulated_equals_dense_attention_in_every_dtype);
  RUN(device_path_emulated_handles_head_dims_longer_than_a_block);
#endif
  dtl_cp_context_destroy(host_ctx);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  return dt_finish();
}

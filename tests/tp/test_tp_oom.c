/* SPDX-License-Identifier: Apache-2.0 */
/* Out of memory at every allocation of every tensor-parallel entry point (tests/common/dt_oom.h): the
 * context, each layer's creation and its first forward (later ones allocate nothing: test_tp_allocs), the
 * KV cache and a cached forward with RoPE, the communication halves and top-k/argmax, the FP8 sequence gathers
 * (DTL_TP_FP8_GATHER) of a sequence-parallel layer and of the half, with the failure on
 * every rank and on one (a failed cached forward must also leave the cache's length as it was). Each
 * failure is DTL_ERR_OUT_OF_MEMORY (or the agreed error), frees what it allocated, writes no output, and the
 * next call works. Runs at 1 and 2 ranks with DTL_CHECK=1. */
#include "dt_oom.h"
#include "dtl/tp.h"

#define POISON ((void *)0x5a5a)
#define T 5
#define HID 6
#define FFN 5
#define QH 4
#define KVH 2
#define HD 2
#define VOCAB 11
#define OUT_FLOATS (T * VOCAB) /* the largest output of any call here */

static dtl_comm *world;
static dtl_mesh *mesh;
static dt_oom_tally tally;

static float *reals(unsigned seed, size_t n) {
  float *p = malloc(n * sizeof *p + 4);
  for (size_t i = 0; i < n; i++) p[i] = (float)((i * 7 + seed * 13) % 17) / 8.0f - 1.0f;
  return p;
}

/* One kind of object under test, remade by undo so that every call is a first call. */
/* K_KVCACHE: the KV cache's creation; K_CACHED: a cached forward with RoPE. */
typedef enum {
  K_CONTEXT, K_COLUMN, K_ROW, K_MLP, K_ATTN, K_EMBED, K_TOPK, K_ARGMAX, K_REDUCE, K_GATHER, K_SEQ, K_KVCACHE, K_CACHED
} kind;

typedef struct {
  kind k;
  bool create; /* the creation under test (else the first forward of a layer made beforehand) */
  bool fp8;    /* the context has DTL_TP_FP8_GATHER */
  dtl_tp_context *ctx, *made_ctx;
  void *layer; /* the kind's layer: made by the creation under test, or beforehand */
  dtl_tp_attention *attn; /* the block of the KV cache under creation, made beforehand */
  dtl_tp_kv_cache *cache; /* the cache of a cached forward, made beforehand */
  dtl_layout *in, *out;
  float *w1, *w2, *b1, *b2, *x, y[OUT_FLOATS + 4], values[T * 2];
  int64_t indices[T * 2], ids[T];
} ctx;

static dtl_status make_layer(ctx *x, void **out) {
  const uint64_t sp = DTL_TP_SEQUENCE_PARALLEL;
  switch (x->k) {
    case K_COLUMN: {
      dtl_tp_linear_params p = {.flags = sp | DTL_TP_GATHER_OUTPUT,
                                .kind = DTL_TP_COLUMN,
                                .in_features = HID,
                                .out_features = FFN,
                                .weight = x->w1,
                                .bias = x->b1};
      return dtl_tp_linear_create(x->ctx, &p, (dtl_tp_linear **)out);
    }
    case K_ROW: {
      dtl_tp_linear_params p = {
          .kind = DTL_TP_ROW, .in_features = FFN, .out_features = HID, .weight = x->w1, .bias = x->b2};
      return dtl_tp_linear_create(x->ctx, &p, (dtl_tp_linear **)out);
    }
    case K_MLP: {
      dtl_tp_mlp_params p = {.flags = sp,
                             .activation = DTL_TP_ACT_SILU_GATED,
                             .hidden = HID,
                             .ffn = FFN,
                             .gate_up = x->w1,
                             .down = x->w2,
                             .gate_up_bias = x->b1,
                             .down_bias = x->b2};
      return dtl_tp_mlp_create(x->ctx, &p, (dtl_tp_mlp **)out);
    }
    case K_KVCACHE: return dtl_tp_kv_cache_create(x->attn, 4 * T, (dtl_tp_kv_cache **)out);
    case K_ATTN:
    case K_CACHED: {
      dtl_tp_attention_params p = {.mask = x->k == K_CACHED ? DTL_TP_ROPE : 0,
                                   .rope_theta = 10000.0f,
                                   .hidden = HID,
                                   .q_heads = QH,
                                   .kv_heads = KVH,
                                   .head_dim = HD,
                                   .qkv = x->w1,
                                   .out = x->w2,
                                   .qkv_bias = x->b1,
                                   .out_bias = x->b2};
      return dtl_tp_attention_create(x->ctx, &p, (dtl_tp_attention **)out);
    }
    case K_EMBED: {
      dtl_tp_embedding_params p = {.flags = sp, .vocab = VOCAB, .hidden = HID, .table = x->w1};
      return dtl_tp_embedding_create(x->ctx, &p, (dtl_tp_embedding **)out);
    }
    default: return DTL_OK;
  }
}

static void destroy_layer(kind k, void *l) {
  if (l == POISON || !l) return;
  if (k == K_COLUMN || k == K_ROW) dtl_tp_linear_destroy(l);
  if (k == K_MLP) dtl_tp_mlp_destroy(l);
  if (k == K_ATTN || k == K_CACHED) dtl_tp_attention_destroy(l);
  if (k == K_KVCACHE) dtl_tp_kv_cache_destroy(l);
  if (k == K_EMBED) dtl_tp_embedding_destroy(l);
}

/* The context, the layer (unless its creation is under test), and the input and output layouts. */
static void fresh(ctx *x) {
  dtl_tp_options o = {.flags = x->fp8 ? DTL_TP_FP8_GATHER : 0};
  REQUIRE_OK(dtl_tp_context_create(mesh, 0, &o, &x->ctx));
  x->made_ctx = POISON;
  x->layer = POISON;
  x->attn = NULL;
  x->cache = NULL;
  if (x->k == K_KVCACHE) {
    dtl_tp_attention_params p = {.hidden = HID, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .qkv = x->w1,
                                 .out = x->w2};
    REQUIRE_OK(dtl_tp_attention_create(x->ctx, &p, &x->attn));
  }
  if (!x->create) REQUIRE_OK(make_layer(x, &x->layer));
  if (x->k == K_CACHED) REQUIRE_OK(dtl_tp_kv_cache_create(x->layer, 4 * T, &x->cache));
  x->in = x->out = NULL;
  switch (x->create ? K_CONTEXT : x->k) {
    case K_COLUMN:
    case K_ROW: REQUIRE_OK(dtl_tp_linear_layouts(x->layer, T, &x->in, &x->out)); break;
    case K_MLP: REQUIRE_OK(dtl_tp_mlp_layouts(x->layer, T, &x->in, &x->out)); break;
    case K_ATTN:
    case K_CACHED: REQUIRE_OK(dtl_tp_attention_layouts(x->layer, T, &x->in, &x->out)); break;
    case K_TOPK:
    case K_ARGMAX:
    case K_GATHER: REQUIRE_OK(dtl_tp_activation_layout(x->ctx, T, VOCAB, dtl_shard(1), &x->in)); break;
    case K_REDUCE: REQUIRE_OK(dtl_tp_activation_layout(x->ctx, T, VOCAB, dtl_shard(0), &x->in)); break;
    case K_SEQ: REQUIRE_OK(dtl_tp_activation_layout(x->ctx, T, VOCAB, dtl_shard(0), &x->in)); break;
    default: break;
  }
  for (int i = 0; i < OUT_FLOATS + 4; i++) x->y[i] = -7;
  for (int i = 0; i < T * 2; i++) x->values[i] = -7, x->indices[i] = -7;
}
static void release(ctx *x) {
  dtl_tp_kv_cache_destroy(x->cache);
  destroy_layer(x->k, x->layer);
  if (x->attn) dtl_tp_attention_destroy(x->attn);
  if (x->made_ctx != POISON) dtl_tp_context_destroy(x->made_ctx);
  dtl_layout_destroy(x->in);
  dtl_layout_destroy(x->out);
  dtl_tp_context_destroy(x->ctx);
}
static void undo(void *v) {
  release(v);
  fresh(v);
}
static bool untouched(void *v) {
  ctx *x = v;
  for (int i = 0; i < OUT_FLOATS + 4; i++)
    if (x->y[i] != -7) return false;
  for (int i = 0; i < T * 2; i++)
    if (x->values[i] != -7 || x->indices[i] != -7) return false;
  if (x->cache && dtl_tp_kv_cache_length(x->cache) != 0) return false; /* a failed call appends nothing */
  return x->made_ctx == POISON && (!x->create || x->layer == POISON);
}

static dtl_status call(void *v) {
  ctx *x = v;
  if (x->k == K_CONTEXT) return dtl_tp_context_create(mesh, 0, NULL, &x->made_ctx);
  if (x->create) return make_layer(x, &x->layer);
  switch (x->k) {
    case K_COLUMN:
    case K_ROW: return dtl_tp_linear_forward(x->layer, x->in, x->x, x->y);
    case K_MLP: return dtl_tp_mlp_forward(x->layer, x->in, x->x, x->y);
    case K_ATTN: return dtl_tp_attention_forward(x->layer, x->in, x->x, x->y);
    case K_CACHED: return dtl_tp_attention_forward_cached(x->layer, x->cache, x->in, x->x, x->y);
    case K_EMBED: return dtl_tp_embedding_forward(x->layer, T, x->ids, x->y);
    case K_TOPK: return dtl_tp_logits_topk(x->ctx, x->in, x->x, 2, x->values, x->indices);
    case K_ARGMAX: return dtl_tp_logits_argmax(x->ctx, x->in, x->x, x->indices);
    case K_REDUCE: return dtl_tp_row_parallel_reduce(x->ctx, x->in, x->x, NULL, x->y);
    case K_GATHER: return dtl_tp_column_parallel_gather(x->ctx, x->in, x->x, x->y);
    default: return dtl_tp_sequence_gather(x->ctx, x->in, x->x, x->y);
  }
}

static void every_tp_entry_point_survives_each_failed_allocation_on_any_rank(void) {
  static const struct {
    kind k;
    bool create;
    const char *what; /* "(FP8)" in it: on a context with DTL_TP_FP8_GATHER */
  } cases[] = {
      {K_CONTEXT, true, "dtl_tp_context_create"},
      {K_COLUMN, true, "dtl_tp_linear_create (column, sp, gathered)"},
      {K_COLUMN, false, "dtl_tp_linear_forward (column, sp, gathered), first"},
      {K_ROW, true, "dtl_tp_linear_create (row)"},
      {K_ROW, false, "dtl_tp_linear_forward (row), first"},
      {K_MLP, true, "dtl_tp_mlp_create (SiLU-gated, sp)"},
      {K_MLP, false, "dtl_tp_mlp_forward (SiLU-gated, sp), first"},
      {K_ATTN, true, "dtl_tp_attention_create"},
      {K_ATTN, false, "dtl_tp_attention_forward, first"},
      {K_EMBED, true, "dtl_tp_embedding_create (sp)"},
      {K_EMBED, false, "dtl_tp_embedding_forward (sp), first"},
      {K_TOPK, false, "dtl_tp_logits_topk, first"},
      {K_ARGMAX, false, "dtl_tp_logits_argmax, first"},
      {K_REDUCE, false, "dtl_tp_row_parallel_reduce (to S(0)), first"},
      {K_GATHER, false, "dtl_tp_column_parallel_gather, first"},
      {K_SEQ, false, "dtl_tp_sequence_gather, first"},
      {K_SEQ, false, "dtl_tp_sequence_gather (FP8), first"},
      {K_COLUMN, false, "dtl_tp_linear_forward (column, sp, gathered) (FP8), first"},
      {K_KVCACHE, true, "dtl_tp_kv_cache_create"},
      {K_CACHED, false, "dtl_tp_attention_forward_cached (RoPE), first"},
  };
  ctx x = {0};
  const size_t big = (size_t)(QH + 2 * KVH) * HD * HID + 2 * FFN * HID + VOCAB * HID + T * VOCAB;
  x.w1 = reals(1, big), x.w2 = reals(2, big), x.b1 = reals(3, big), x.b2 = reals(4, big), x.x = reals(5, big);
  for (int t = 0; t < T; t++) x.ids[t] = (t * 4 + 1) % VOCAB;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    x.k = cases[i].k;
    x.create = cases[i].create;
    x.fp8 = strstr(cases[i].what, "(FP8)") != NULL;
    fresh(&x);
    const dt_oom_case c = {.what = cases[i].what,
                           .call = call,
                           .untouched = untouched,
                           .undo = undo,
                           .ctx = &x,
                           .collective = true,
                           .caches = true};
    dt_oom_every_way(&c, &tally);
    release(&x);
  }
  free(x.w1), free(x.w2), free(x.b1), free(x.b2), free(x.x);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  REQUIRE_OK(dtl_mesh_create(world, 1, &dt_size, &mesh));
  RUN(every_tp_entry_point_survives_each_failed_allocation_on_any_rank);
  if (dt_rank == 0)
    printf("%ld calls, %ld of them failed by an injected allocation failure\n", tally.calls, tally.failures);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  return dt_finish();
}

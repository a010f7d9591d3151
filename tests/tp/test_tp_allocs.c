/* SPDX-License-Identifier: Apache-2.0 */
/* Tensor-parallel forwards allocate only on their first call: every layer and block (column-parallel linear
 * with and without the gathered output, row-parallel linear, SiLU-gated and GELU MLP, attention, embedding,
 * the communication halves, top-k and argmax over vocab-parallel logits), with and without sequence
 * parallelism, run 100 more times without one allocation (the library's counter, common/alloc.h) and give the
 * first call's output bit for bit. Sizes split unevenly over 3 and 4 ranks, so the v-collectives run too. The
 * layers' values are checked against dense computations by test_tp_layers. */
#include "dtl_test.h"
#include "dtl/tp.h"
#include "common/alloc.h"

#define REPEAT 100
#define T 7      /* tokens */
#define HID 10   /* hidden */
#define FFN 9
#define QH 12    /* q heads */
#define KVH 4    /* kv heads */
#define HD 3     /* head dim */
#define VOCAB 23

static dtl_comm *world;
static dtl_mesh *mesh;
static dtl_tp_context *ctx;

static float *reals(unsigned seed, size_t n) {
  float *p = malloc(n * sizeof *p + 4);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = 2.0f * (float)(s >> 40) / 16777216.0f - 1.0f;
  }
  return p;
}

/* One forward: run() writes out_bytes bytes at out. */
typedef struct {
  const char *what;
  dtl_status (*run)(void *arg);
  void *arg;
  const void *out;
  size_t out_bytes;
} forward;

/* A warm-up call, then REPEAT calls without an allocation whose output equals the warm-up's. */
static void repeat_forward(const forward *f) {
  CHECK_OK(f->run(f->arg));
  unsigned char *first = malloc(f->out_bytes + 1);
  memcpy(first, f->out, f->out_bytes);
  dtl__alloc_hook_reset(0, false);
  for (int i = 0; i < REPEAT; i++) {
    dtl_status st = f->run(f->arg);
    CHECK(st == DTL_OK, "%s (call %d): %s", f->what, i, dtl_last_error());
  }
  uint64_t n = dtl__alloc_hook_count();
  CHECK(n == 0, "%s: %llu allocations in %d repeated calls", f->what, (unsigned long long)n, REPEAT);
  CHECK(memcmp(first, f->out, f->out_bytes) == 0, "%s: the last call's output differs from the first's", f->what);
  free(first);
}

/* A layer through its own layouts: x is its local input, y its local output. */
typedef struct {
  dtl_tp_linear *lin;
  dtl_tp_mlp *mlp;
  dtl_tp_attention *attn;
  dtl_layout *in, *out;
  float *x, *y;
} layer;

static dtl_status layer_run(void *arg) {
  layer *l = arg;
  if (l->lin) return dtl_tp_linear_forward(l->lin, l->in, l->x, l->y);
  if (l->mlp) return dtl_tp_mlp_forward(l->mlp, l->in, l->x, l->y);
  return dtl_tp_attention_forward(l->attn, l->in, l->x, l->y);
}

static void layer_repeat(layer *l, const char *what, unsigned seed) {
  l->x = reals(seed, dtl_layout_local_count(l->in));
  size_t ny = dtl_layout_local_count(l->out);
  l->y = malloc(ny * sizeof(float) + 4);
  forward f = {what, layer_run, l, l->y, ny * sizeof(float)};
  repeat_forward(&f);
  free(l->x);
  free(l->y);
  dtl_layout_destroy(l->in);
  dtl_layout_destroy(l->out);
}

static void linear_forwards_allocate_nothing_after_the_first(void) {
  float *w = reals(1, HID * FFN), *b = reals(2, FFN), *wr = reals(3, FFN * HID), *br = reals(4, HID);
  for (int sp = 0; sp <= 1; sp++) {
    uint64_t spm = sp ? DTL_TP_SEQUENCE_PARALLEL : 0;
    for (int gather = 0; gather <= 1; gather++) {
      layer l = {0};
      dtl_tp_linear_params p = {.flags = spm | (gather ? DTL_TP_GATHER_OUTPUT : 0), .kind = DTL_TP_COLUMN,
                                .in_features = HID, .out_features = FFN, .weight = w, .bias = b};
      CHECK_OK(dtl_tp_linear_create(ctx, &p, &l.lin));
      CHECK_OK(dtl_tp_linear_layouts(l.lin, T, &l.in, &l.out));
      layer_repeat(&l, gather ? (sp ? "column linear, gathered, sp" : "column linear, gathered")
                              : (sp ? "column linear, sp" : "column linear"), 10 + (unsigned)gather);
      dtl_tp_linear_destroy(l.lin);
    }
    layer l = {0};
    dtl_tp_linear_params p = {.flags = spm, .kind = DTL_TP_ROW, .in_features = FFN, .out_features = HID, .weight = wr,
                              .bias = br};
    CHECK_OK(dtl_tp_linear_create(ctx, &p, &l.lin));
    CHECK_OK(dtl_tp_linear_layouts(l.lin, T, &l.in, &l.out));
    layer_repeat(&l, sp ? "row linear, sp" : "row linear", 12);
    dtl_tp_linear_destroy(l.lin);
  }
  free(w), free(b), free(wr), free(br);
}

static void mlp_forwards_allocate_nothing_after_the_first(void) {
  float *gu = reals(5, 2 * FFN * HID), *gub = reals(6, 2 * FFN), *down = reals(7, HID * FFN), *db = reals(8, HID);
  for (int sp = 0; sp <= 1; sp++)
    for (int act = 0; act <= 1; act++) {
      layer l = {0};
      dtl_tp_mlp_params p = {.flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0,
                             .activation = act ? DTL_TP_ACT_GELU : DTL_TP_ACT_SILU_GATED, .hidden = HID, .ffn = FFN,
                             .gate_up = gu, .down = down, .gate_up_bias = gub, .down_bias = db};
      CHECK_OK(dtl_tp_mlp_create(ctx, &p, &l.mlp));
      CHECK_OK(dtl_tp_mlp_layouts(l.mlp, T, &l.in, &l.out));
      char what[64];
      snprintf(what, sizeof what, "%s MLP%s", act ? "GELU" : "SiLU-gated", sp ? ", sp" : "");
      layer_repeat(&l, what, 20);
      dtl_tp_mlp_destroy(l.mlp);
    }
  free(gu), free(gub), free(down), free(db);
}

static void attention_forwards_allocate_nothing_after_the_first(void) {
  float *qkv = reals(30, (QH + 2 * KVH) * HD * HID), *out = reals(31, HID * QH * HD), *qb = reals(32, (QH + 2 * KVH) * HD);
  for (int sp = 0; sp <= 1; sp++) {
    layer l = {0};
    dtl_tp_attention_params p = {.flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0, .hidden = HID, .q_heads = QH,
                                 .kv_heads = KVH, .head_dim = HD, .qkv = qkv, .out = out, .qkv_bias = qb};
    CHECK_OK(dtl_tp_attention_create(ctx, &p, &l.attn));
    CHECK_OK(dtl_tp_attention_layouts(l.attn, T, &l.in, &l.out));
    layer_repeat(&l, sp ? "attention, sp" : "attention", 33);
    dtl_tp_attention_destroy(l.attn);
  }
  free(qkv), free(out), free(qb);
}

typedef struct {
  dtl_tp_embedding *e;
  int64_t ids[T];
  float *y;
} embed_arg;
static dtl_status embed_run(void *arg) {
  embed_arg *a = arg;
  return dtl_tp_embedding_forward(a->e, T, a->ids, a->y);
}

static void embedding_forwards_allocate_nothing_after_the_first(void) {
  float *table = reals(40, VOCAB * HID);
  for (int sp = 0; sp <= 1; sp++) {
    embed_arg a = {0};
    dtl_tp_embedding_params p = {.flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0, .vocab = VOCAB, .hidden = HID,
                                 .table = table};
    CHECK_OK(dtl_tp_embedding_create(ctx, &p, &a.e));
    dtl_layout *out = NULL;
    CHECK_OK(dtl_tp_embedding_layout(a.e, T, &out));
    for (int t = 0; t < T; t++) a.ids[t] = (t * 5 + 3) % VOCAB;
    size_t ny = out ? dtl_layout_local_count(out) : 0;
    a.y = malloc(ny * sizeof(float) + 4);
    forward f = {sp ? "embedding, sp" : "embedding", embed_run, &a, a.y, ny * sizeof(float)};
    repeat_forward(&f);
    free(a.y);
    dtl_layout_destroy(out);
    dtl_tp_embedding_destroy(a.e);
  }
  free(table);
}

typedef struct {
  dtl_layout *l;
  float *x, *y, values[T * 3];
  int64_t indices[T * 3];
  int k; /* 0: argmax; -1: sequence gather; -2: row-parallel reduce; -3: column gather */
} half_arg;
static dtl_status half_run(void *arg) {
  half_arg *a = arg;
  switch (a->k) {
    case -1: return dtl_tp_sequence_gather(ctx, a->l, a->x, a->y);
    case -2: return dtl_tp_row_parallel_reduce(ctx, a->l, a->x, NULL, a->y);
    case -3: return dtl_tp_column_parallel_gather(ctx, a->l, a->x, a->y);
    case 0: return dtl_tp_logits_argmax(ctx, a->l, a->x, a->indices);
    default: return dtl_tp_logits_topk(ctx, a->l, a->x, a->k, a->values, a->indices);
  }
}

/* topk_argmax_and_communication_halves_allocate_nothing_after_the_first */
static void topk_argmax_and_communication_halves_allocate_nothing_after_the_first(void) {
  half_arg a = {0};
  CHECK_OK(dtl_tp_activation_layout(ctx, T, VOCAB, dtl_shard(1), &a.l));
  a.x = reals(50, dtl_layout_local_count(a.l));
  a.k = 3;
  forward f = {"logits top-k", half_run, &a, a.indices, sizeof a.indices};
  repeat_forward(&f);
  a.k = 0;
  f.what = "logits argmax";
  repeat_forward(&f);
  a.y = malloc(T * VOCAB * sizeof(float));
  a.k = -3;
  f = (forward){"column-parallel gather", half_run, &a, a.y, T * VOCAB * sizeof(float)};
  repeat_forward(&f);
  free(a.x);
  dtl_layout_destroy(a.l);
  for (int sp = 0; sp <= 1; sp++) { /* the reduction's output layout: R, or S(0) with sequence parallelism */
    CHECK_OK(dtl_tp_activation_layout(ctx, T, VOCAB, sp ? dtl_shard(0) : dtl_replicate(), &a.l));
    a.x = reals(51, T * VOCAB);
    a.k = -2;
    f = (forward){sp ? "row-parallel reduce, sp" : "row-parallel reduce", half_run, &a, a.y,
                  dtl_layout_local_count(a.l) * sizeof(float)};
    repeat_forward(&f);
    if (sp) {
      a.k = -1;
      f = (forward){"sequence gather", half_run, &a, a.y, T * VOCAB * sizeof(float)};
      repeat_forward(&f);
    }
    free(a.x);
    dtl_layout_destroy(a.l);
  }
  free(a.y);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  CHECK_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  CHECK_OK(dtl_mesh_create(world, 1, &dt_size, &mesh));
  CHECK_OK(dtl_tp_context_create(mesh, 0, NULL, &ctx));
  RUN(linear_forwards_allocate_nothing_after_the_first);
  RUN(mlp_forwards_allocate_nothing_after_the_first);
  RUN(attention_forwards_allocate_nothing_after_the_first);
  RUN(embedding_forwards_allocate_nothing_after_the_first);
  RUN(topk_argmax_and_communication_halves_allocate_nothing_after_the_first);
  dtl_tp_context_destroy(ctx);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  return dt_finish();
}

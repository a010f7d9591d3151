/* SPDX-License-Identifier: Apache-2.0 */
/* Greedy generation with a small decoder-only model (Mixtral-like: RMSNorm, GQA attention with RoPE and a KV
 * cache, a SiLU-gated MLP on even layers and an 8-expert top-2 MoE on odd layers) on dtl's tensor-parallel
 * layers, at TP = 1, 2 and 4 with and without sequence parallelism. Rank 0 writes the model's deterministic
 * random weights to a safetensors file once; every configuration then loads its shards from that file (each
 * rank reads only its own rows or columns) and generates NEW tokens after a PROMPT-token prefill. The example
 * prints the token ids of every configuration, the time per decoded token and the share of it spent in MPI
 * collectives, and exits non-zero unless every configuration generated exactly the single-rank tokens.
 *
 * Model: 4 layers, hidden 256, 8 q heads over 2 kv heads of 32 (replicated on tp = 4), RoPE theta 10000,
 * MLP ffn 512, MoE 8 experts of ffn 128 with renormalised top-2 routing (experts spread over the TP ranks:
 * the expert-parallel group is the TP group), vocab 1024, f32 on the host.
 *
 * MoE tokens. The MoE layer needs whole token rows, and each token must be routed by exactly one rank. With
 * sequence parallelism every rank holds its chunk(T) rows and dispatches those. Without it every TP rank
 * holds all T rows (R); each rank dispatches only its torch.chunk of them, the same rows it would hold under
 * sequence parallelism, and one all-gather of the combined rows restores R. Every token thus goes through
 * the same experts with the same weights in every configuration, so results differ between configurations
 * only by floating-point summation order (GEMM blocking, reduction trees). That noise could change a
 * discrete choice only where two candidates nearly tie (a greedy token, or an expert of the router), so the
 * example prints the smallest top-1 margin of the reference run and how far any configuration's chosen
 * logits moved from it.
 *
 * Groups: with more world ranks than TP, the world splits into groups of TP consecutive ranks, each running
 * the whole model (data-parallel replicas; ranks left over sit out). Every rank's tokens are compared with
 * the reference; the lines printed are rank 0's group (times: its slowest rank).
 *
 * Communication share: the time spent inside MPI collectives, measured through the MPI profiling interface
 * (this program defines MPI_Allreduce and the others and calls PMPI_*; libdtl's calls land here), divided by
 * the wall time of the decode loop, averaged over the ranks of the group. It includes waiting for the slowest
 * rank, and with DTL_CHECK=1 (as make demo and the tests run it) the agreement of every call.
 *
 * Usage: mpirun -n 4 ./generate [-n repeats] [-w warmup] [-f weights.safetensors]
 *   -f: where rank 0 writes the weights (default: a file in $TMPDIR or /tmp, removed at the end).
 *   -n/-w: each configuration generates w + n times (caches reset in between) and reports the fastest of
 *   the n timed runs; every run must give the same tokens. make bench runs -n 20 -w 2 at 1, 2 and 4 ranks. */
#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "example.h"

enum {
  LAYERS = 4, HID = 256, QH = 8, KVH = 2, HD = 32, FFN = 512, EXPERTS = 8, TOPK = 2, EFFN = 128, VOCAB = 1024,
  PROMPT = 16, NEW = 32
};
#define THETA 10000.0f
#define EPS 1e-5f
#define SEED 0x5eed2025ull

/* ---- time inside MPI collectives (the MPI profiling interface) ---------------------------------------- */
static double comm_seconds;
static long comm_calls;
static int comm_timing;
static double comm_enter(void) { return comm_timing ? PMPI_Wtime() : 0.0; }
static int comm_leave(double t0, int rc) {
  if (comm_timing) comm_seconds += PMPI_Wtime() - t0, comm_calls++;
  return rc;
}
int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  double t0 = comm_enter();
  return comm_leave(t0, PMPI_Allreduce(s, r, n, t, op, c));
}
int MPI_Allgather(const void *s, int ns, MPI_Datatype ts, void *r, int nr, MPI_Datatype tr, MPI_Comm c) {
  double t0 = comm_enter();
  return comm_leave(t0, PMPI_Allgather(s, ns, ts, r, nr, tr, c));
}
int MPI_Allgatherv(const void *s, int ns, MPI_Datatype ts, void *r, const int nr[], const int d[], MPI_Datatype tr,
                   MPI_Comm c) {
  double t0 = comm_enter();
  return comm_leave(t0, PMPI_Allgatherv(s, ns, ts, r, nr, d, tr, c));
}
int MPI_Reduce_scatter(const void *s, void *r, const int nr[], MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  double t0 = comm_enter();
  return comm_leave(t0, PMPI_Reduce_scatter(s, r, nr, t, op, c));
}
int MPI_Reduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  double t0 = comm_enter();
  return comm_leave(t0, PMPI_Reduce_scatter_block(s, r, n, t, op, c));
}
int MPI_Alltoall(const void *s, int ns, MPI_Datatype ts, void *r, int nr, MPI_Datatype tr, MPI_Comm c) {
  double t0 = comm_enter();
  return comm_leave(t0, PMPI_Alltoall(s, ns, ts, r, nr, tr, c));
}
int MPI_Alltoallv(const void *s, const int ns[], const int ds[], MPI_Datatype ts, void *r, const int nr[],
                  const int dr[], MPI_Datatype tr, MPI_Comm c) {
  double t0 = comm_enter();
  return comm_leave(t0, PMPI_Alltoallv(s, ns, ds, ts, r, nr, dr, tr, c));
}
int MPI_Wait(MPI_Request *q, MPI_Status *st) {
  double t0 = comm_enter();
  return comm_leave(t0, PMPI_Wait(q, st));
}
int MPI_Waitall(int n, MPI_Request q[], MPI_Status st[]) {
  double t0 = comm_enter();
  return comm_leave(t0, PMPI_Waitall(n, q, st));
}

/* ---- the weights: deterministic, written once by rank 0 ------------------------------------------------- */
/* Tensor names as in Hugging Face's Mixtral checkpoints. */
static const char *name(char *buf, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, 128, fmt, ap);
  va_end(ap);
  return buf;
}

/* n values offset + scale * U[-1, 1) from a stream seeded by the tensor's name, so any order of writing
 * gives the same tensor. */
static float *values(const char *tensor, size_t n, float scale, float offset) {
  uint64_t s = SEED;
  for (const char *c = tensor; *c; c++) s = (s ^ (uint8_t)*c) * 0x100000001b3ull;
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    p[i] = offset + scale * (2.0f * (float)((z ^ (z >> 31)) >> 40) / 16777216.0f - 1.0f);
  }
  return p;
}

static void add(dtl_safetensors_writer *w, const char *tensor, int64_t rows, int64_t cols, float scale, float offset) {
  int64_t shape[2] = {rows, cols};
  float *p = values(tensor, (size_t)(rows * (cols ? cols : 1)), scale, offset);
  TRY(dtl_safetensors_write_add(w, tensor, DTL_FLOAT32, cols ? 2 : 1, shape, p));
  free(p);
}

static void write_model(const char *path) {
  dtl_safetensors_writer *w;
  char b[128];
  const float sh = 1.0f / sqrtf(HID);
  TRY(dtl_safetensors_write_begin(path, &w));
  add(w, "model.embed_tokens.weight", VOCAB, HID, 1.0f, 0.0f);
  for (int l = 0; l < LAYERS; l++) {
    add(w, name(b, "model.layers.%d.input_layernorm.weight", l), HID, 0, 0.1f, 1.0f);
    add(w, name(b, "model.layers.%d.self_attn.q_proj.weight", l), QH * HD, HID, sh, 0.0f);
    add(w, name(b, "model.layers.%d.self_attn.k_proj.weight", l), KVH * HD, HID, sh, 0.0f);
    add(w, name(b, "model.layers.%d.self_attn.v_proj.weight", l), KVH * HD, HID, sh, 0.0f);
    add(w, name(b, "model.layers.%d.self_attn.o_proj.weight", l), HID, QH * HD, 1.0f / sqrtf(QH * HD), 0.0f);
    add(w, name(b, "model.layers.%d.post_attention_layernorm.weight", l), HID, 0, 0.1f, 1.0f);
    if (l % 2 == 0) {
      add(w, name(b, "model.layers.%d.mlp.gate_proj.weight", l), FFN, HID, sh, 0.0f);
      add(w, name(b, "model.layers.%d.mlp.up_proj.weight", l), FFN, HID, sh, 0.0f);
      add(w, name(b, "model.layers.%d.mlp.down_proj.weight", l), HID, FFN, 1.0f / sqrtf(FFN), 0.0f);
      continue;
    }
    add(w, name(b, "model.layers.%d.block_sparse_moe.gate.weight", l), EXPERTS, HID, sh, 0.0f);
    for (int e = 0; e < EXPERTS; e++) {
      add(w, name(b, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e), EFFN, HID, sh, 0.0f);
      add(w, name(b, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e), HID, EFFN, 1.0f / sqrtf(EFFN), 0.0f);
      add(w, name(b, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e), EFFN, HID, sh, 0.0f);
    }
  }
  add(w, "model.norm.weight", HID, 0, 0.1f, 1.0f);
  add(w, "lm_head.weight", VOCAB, HID, sh, 0.0f);
  TRY(dtl_safetensors_write_metadata(w, "format", "pt"));
  TRY(dtl_safetensors_write_end(w));
}

/* ---- the model on one TP group ---------------------------------------------------------------------- */
/* torch.chunk: the part of n that rank r of p holds (dtl's S(0) rule). */
static void chunk(int64_t n, int p, int r, int64_t *off, int64_t *cnt) {
  int64_t c = (n + p - 1) / p, lo = c * r < n ? c * r : n;
  *off = lo;
  *cnt = lo + c < n ? c : n - lo;
}

typedef struct {
  float *router; /* [EXPERTS, HID] */
  dtl_moe_placement *placement;
  float *gate[EXPERTS], *up[EXPERTS], *down[EXPERTS]; /* this rank's experts */
  dtl_moe_mlp mlp;
} moe_layer;

typedef struct {
  dtl_layout *act, *logits; /* [T, HID] (R or S(0)) and the LM head's [T, VOCAB] S(1) */
} shapes;

typedef struct {
  dtl_comm *comm; /* the TP group (and the expert-parallel group) */
  dtl_mesh *mesh;
  dtl_tp_context *ctx;
  int tp, rank, sp;
  dtl_tp_embedding *embed;
  dtl_tp_attention *attn[LAYERS];
  dtl_tp_kv_cache *cache[LAYERS];
  dtl_tp_mlp *mlp[LAYERS];
  moe_layer moe[LAYERS];
  float *norm1[LAYERS], *norm2[LAYERS], *norm_f;
  dtl_tp_linear *head;
  shapes prefill, decode;
  float *h, *n, *a, *moe_y, *logits, *expert_in, *expert_out;
  int64_t expert_rows;
} model;

static float *read_vector(const dtl_safetensors *f, const char *tensor, int64_t rows, int64_t cols) {
  int64_t off[2] = {0, 0}, shape[2] = {rows, cols};
  float *p = malloc(sizeof(float) * (size_t)(rows * (cols ? cols : 1)));
  TRY(dtl_safetensors_read_box(f, tensor, DTL_FLOAT32, cols ? 2 : 1, off, shape, p));
  return p;
}

static void make_shapes(model *m, int64_t T, shapes *s) {
  TRY(dtl_tp_attention_layouts(m->attn[0], T, &s->act, NULL));
  TRY(dtl_tp_linear_layouts(m->head, T, NULL, &s->logits));
}

/* Every rank of comm loads its shards from path and builds its layers (all creation calls are collective). */
static void model_load(model *m, dtl_comm *comm, int sp, const char *path) {
  memset(m, 0, sizeof *m);
  m->comm = comm;
  m->tp = dtl_comm_size(comm);
  m->rank = dtl_comm_rank(comm);
  m->sp = sp;
  TRY(dtl_mesh_create(comm, 1, &m->tp, &m->mesh));
  TRY(dtl_tp_context_create(m->mesh, 0, NULL, &m->ctx));
  dtl_safetensors *f;
  TRY(dtl_safetensors_open(path, &f));
  const uint64_t flags = DTL_TP_SHARDED_WEIGHTS | (sp ? DTL_TP_SEQUENCE_PARALLEL : 0);
  char b[128], b2[128], b3[128];
  dtl_tp_range v, q, kv, ffn;
  TRY(dtl_tp_split(m->ctx, VOCAB, &v));
  TRY(dtl_tp_split(m->ctx, FFN, &ffn));
  TRY(dtl_tp_attention_heads(m->ctx, QH, KVH, &q, &kv));

  float *table = malloc(sizeof(float) * (size_t)(v.count * HID + 1));
  TRY(dtl_tp_weight_read_column(m->ctx, f, "model.embed_tokens.weight", VOCAB, HID, table));
  dtl_tp_embedding_params ep = {.flags = flags, .vocab = VOCAB, .hidden = HID, .table = table};
  TRY(dtl_tp_embedding_create(m->ctx, &ep, &m->embed));
  free(table);

  for (int l = 0; l < LAYERS; l++) {
    m->norm1[l] = read_vector(f, name(b, "model.layers.%d.input_layernorm.weight", l), HID, 0);
    m->norm2[l] = read_vector(f, name(b, "model.layers.%d.post_attention_layernorm.weight", l), HID, 0);
    float *qkv = malloc(sizeof(float) * (size_t)((q.count + 2 * kv.count) * HD * HID + 1));
    float *out = malloc(sizeof(float) * (size_t)(HID * q.count * HD + 1));
    TRY(dtl_tp_weight_read_qkv(m->ctx, f, name(b, "model.layers.%d.self_attn.q_proj.weight", l),
                               name(b2, "model.layers.%d.self_attn.k_proj.weight", l),
                               name(b3, "model.layers.%d.self_attn.v_proj.weight", l), QH, KVH, HD, HID, qkv));
    TRY(dtl_tp_weight_read_attention_out(m->ctx, f, name(b, "model.layers.%d.self_attn.o_proj.weight", l), QH, KVH, HD,
                                         HID, out));
    dtl_tp_attention_params ap = {.mask = DTL_TP_ROPE, .flags = flags, .hidden = HID, .q_heads = QH, .kv_heads = KVH,
                                  .head_dim = HD, .qkv = qkv, .out = out, .rope_theta = THETA};
    TRY(dtl_tp_attention_create(m->ctx, &ap, &m->attn[l]));
    TRY(dtl_tp_kv_cache_create(m->attn[l], PROMPT + NEW, &m->cache[l]));
    free(qkv), free(out);
    if (l % 2 == 0) {
      float *gu = malloc(sizeof(float) * (size_t)(2 * ffn.count * HID + 1));
      float *down = malloc(sizeof(float) * (size_t)(HID * ffn.count + 1));
      TRY(dtl_tp_weight_read_gate_up(m->ctx, f, name(b, "model.layers.%d.mlp.gate_proj.weight", l),
                                     name(b2, "model.layers.%d.mlp.up_proj.weight", l), FFN, HID, gu));
      TRY(dtl_tp_weight_read_row(m->ctx, f, name(b, "model.layers.%d.mlp.down_proj.weight", l), HID, FFN, down));
      dtl_tp_mlp_params mp = {.flags = flags, .activation = DTL_TP_ACT_SILU_GATED, .hidden = HID, .ffn = FFN,
                              .gate_up = gu, .down = down};
      TRY(dtl_tp_mlp_create(m->ctx, &mp, &m->mlp[l]));
      free(gu), free(down);
      continue;
    }
    /* MoE: the router whole on every rank, this rank's experts (contiguous blocks over the TP ranks) whole. */
    moe_layer *e = &m->moe[l];
    e->router = read_vector(f, name(b, "model.layers.%d.block_sparse_moe.gate.weight", l), EXPERTS, HID);
    TRY(dtl_moe_placement_create(EXPERTS, m->tp, NULL, &e->placement));
    int nl = dtl_moe_placement_local_count(e->placement, m->rank);
    for (int j = 0; j < nl; j++) {
      int g = dtl_moe_placement_local_expert(e->placement, m->rank, j);
      e->gate[j] = read_vector(f, name(b, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, g), EFFN, HID);
      e->down[j] = read_vector(f, name(b, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, g), HID, EFFN);
      e->up[j] = read_vector(f, name(b, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, g), EFFN, HID);
    }
    e->mlp = (dtl_moe_mlp){.hidden = HID, .ffn = EFFN, .local_experts = nl, .w_gate = (const float *const *)e->gate,
                           .w_up = (const float *const *)e->up, .w_down = (const float *const *)e->down};
  }
  m->norm_f = read_vector(f, "model.norm.weight", HID, 0);
  float *head = malloc(sizeof(float) * (size_t)(v.count * HID + 1));
  TRY(dtl_tp_weight_read_column(m->ctx, f, "lm_head.weight", VOCAB, HID, head));
  dtl_tp_linear_params hp = {.flags = flags, .kind = DTL_TP_COLUMN, .in_features = HID, .out_features = VOCAB,
                             .weight = head};
  TRY(dtl_tp_linear_create(m->ctx, &hp, &m->head));
  free(head);
  dtl_safetensors_close(f);

  make_shapes(m, PROMPT, &m->prefill);
  make_shapes(m, 1, &m->decode);
  m->h = malloc(sizeof(float) * PROMPT * HID);
  m->n = malloc(sizeof(float) * PROMPT * HID);
  m->a = malloc(sizeof(float) * PROMPT * HID);
  m->moe_y = malloc(sizeof(float) * PROMPT * HID);
  m->logits = malloc(sizeof(float) * (size_t)(PROMPT * v.count + 1));
}

static void model_free(model *m) {
  for (int l = 0; l < LAYERS; l++) {
    dtl_tp_kv_cache_destroy(m->cache[l]);
    dtl_tp_attention_destroy(m->attn[l]);
    dtl_tp_mlp_destroy(m->mlp[l]);
    for (int j = 0; j < EXPERTS; j++) free(m->moe[l].gate[j]), free(m->moe[l].up[j]), free(m->moe[l].down[j]);
    free(m->moe[l].router);
    dtl_moe_placement_destroy(m->moe[l].placement);
    free(m->norm1[l]), free(m->norm2[l]);
  }
  shapes *s[2] = {&m->prefill, &m->decode};
  for (int i = 0; i < 2; i++) dtl_layout_destroy(s[i]->act), dtl_layout_destroy(s[i]->logits);
  dtl_tp_embedding_destroy(m->embed);
  dtl_tp_linear_destroy(m->head);
  free(m->norm_f), free(m->h), free(m->n), free(m->a), free(m->moe_y), free(m->logits);
  free(m->expert_in), free(m->expert_out);
  dtl_tp_context_destroy(m->ctx);
  dtl_mesh_destroy(m->mesh);
}

/* y = RMSNorm(x) * g over rows token rows: local, so it runs unchanged on sequence-parallel shards. */
static void rmsnorm(const float *x, const float *g, float *y, int64_t rows) {
  for (int64_t t = 0; t < rows; t++) {
    float ss = 0.0f;
    for (int i = 0; i < HID; i++) ss += x[t * HID + i] * x[t * HID + i];
    float inv = 1.0f / sqrtf(ss / HID + EPS);
    for (int i = 0; i < HID; i++) y[t * HID + i] = x[t * HID + i] * inv * g[i];
  }
}

static void add_rows(float *h, const float *a, int64_t rows) {
  for (int64_t i = 0; i < rows * HID; i++) h[i] += a[i];
}

/* The MoE layer on x ([T, HID] R, or this rank's chunk(T) rows with sequence parallelism) into y (the same
 * rows): this rank routes, dispatches and combines its chunk(T) tokens; without sequence parallelism an
 * all-gather of the combined chunks then gives every rank all T rows. */
static void moe_forward(model *m, moe_layer *e, int64_t T, const float *x, float *y) {
  int64_t off, cnt;
  chunk(T, m->tp, m->rank, &off, &cnt);
  const float *xc = m->sp ? x : x + off * HID;
  float *yc = m->sp ? y : m->moe_y, logits[PROMPT * EXPERTS], weights[PROMPT * TOPK];
  int32_t ids[PROMPT * TOPK];
  if (cnt > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)cnt, EXPERTS, HID, 1.0f, xc, HID, e->router, HID, 0.0f,
                logits, EXPERTS);
  dtl_moe_router_params rp = {.mask = DTL_MOE_ROUTER_RENORMALIZE, .renormalize = 1};
  TRY(dtl_moe_router_topk(logits, cnt, EXPERTS, TOPK, &rp, ids, weights));
  /* A fresh layout per call, used at once by every rank: no stale layout can reach dispatch or combine, so
   * they skip their layout check (verify = 0; DTL_CHECK=1 still checks every call). Dropless (the default). */
  dtl_moe_layout_params lp = {.mask = DTL_MOE_LAYOUT_VERIFY, .verify = 0};
  dtl_moe_layout *L;
  TRY(dtl_moe_layout_create(m->comm, e->placement, cnt, TOPK, ids, weights, HID, DTL_FLOAT32, &lp, &L));
  int64_t rows = dtl_moe_layout_expert_rows(L);
  if (rows > m->expert_rows) {
    free(m->expert_in), free(m->expert_out);
    m->expert_in = malloc(sizeof(float) * (size_t)(rows * HID));
    m->expert_out = malloc(sizeof(float) * (size_t)(rows * HID));
    m->expert_rows = rows;
  }
  TRY(dtl_moe_layout_dispatch(L, xc, m->expert_in));
  TRY(dtl_moe_experts_run(L, m->expert_in, m->expert_out, dtl_moe_mlp_forward, &e->mlp));
  TRY(dtl_moe_layout_combine(L, m->expert_out, yc));
  dtl_moe_layout_destroy(L);
  if (m->sp) return;
  size_t counts[8];
  for (int r = 0; r < m->tp; r++) {
    int64_t o, c;
    chunk(T, m->tp, r, &o, &c);
    counts[r] = (size_t)(c * HID);
  }
  TRY(dtl_all_gatherv(m->comm, yc, (size_t)(cnt * HID), y, counts, DTL_FLOAT32));
}

/* One forward over T tokens (ids, the same on every rank) continuing the cached sequence; returns the greedy
 * next token (top-1 of the last token's logits), its logit and its margin over the runner-up. */
static int64_t forward(model *m, int64_t T, const int64_t *ids, float *logit, float *margin) {
  shapes *s = T == 1 ? &m->decode : &m->prefill;
  int64_t off = 0, rows = T;
  if (m->sp) chunk(T, m->tp, m->rank, &off, &rows);
  TRY(dtl_tp_embedding_forward(m->embed, T, ids, m->h));
  for (int l = 0; l < LAYERS; l++) {
    rmsnorm(m->h, m->norm1[l], m->n, rows);
    TRY(dtl_tp_attention_forward_cached(m->attn[l], m->cache[l], s->act, m->n, m->a));
    add_rows(m->h, m->a, rows);
    rmsnorm(m->h, m->norm2[l], m->n, rows);
    if (l % 2 == 0) TRY(dtl_tp_mlp_forward(m->mlp[l], s->act, m->n, m->a));
    else moe_forward(m, &m->moe[l], T, m->n, m->a);
    add_rows(m->h, m->a, rows);
  }
  rmsnorm(m->h, m->norm_f, m->n, rows);
  TRY(dtl_tp_linear_forward(m->head, s->act, m->n, m->logits));
  float top[PROMPT * 2];
  int64_t idx[PROMPT * 2];
  TRY(dtl_tp_logits_topk(m->ctx, s->logits, m->logits, 2, top, idx));
  *logit = top[(T - 1) * 2];
  *margin = top[(T - 1) * 2] - top[(T - 1) * 2 + 1];
  return idx[(T - 1) * 2];
}

typedef struct {
  int64_t tokens[NEW];
  float logit[NEW]; /* of each chosen token */
  double prefill_s, decode_s, decode_comm_s; /* this rank's */
  long decode_calls;                         /* MPI calls of this rank's decode loop */
  float min_margin;
} run;

/* Prefill the prompt, then NEW - 1 decode steps: NEW tokens in all. */
static void generate(model *m, const int64_t *prompt, run *r) {
  for (int l = 0; l < LAYERS; l++) TRY(dtl_tp_kv_cache_reset(m->cache[l]));
  float margin;
  TRY(dtl_barrier(m->comm));
  double t0 = MPI_Wtime();
  r->tokens[0] = forward(m, PROMPT, prompt, &r->logit[0], &r->min_margin);
  r->prefill_s = MPI_Wtime() - t0;
  TRY(dtl_barrier(m->comm));
  comm_seconds = 0;
  comm_calls = 0;
  comm_timing = 1;
  t0 = MPI_Wtime();
  for (int i = 1; i < NEW; i++) {
    r->tokens[i] = forward(m, 1, &r->tokens[i - 1], &r->logit[i], &margin);
    r->min_margin = fminf(r->min_margin, margin);
  }
  r->decode_s = MPI_Wtime() - t0;
  comm_timing = 0;
  r->decode_comm_s = comm_seconds;
  r->decode_calls = comm_calls;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
#ifdef OPENBLAS_VERSION
  if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1); /* ranks share the cores */
#endif
  int repeats = 1, warmup = 0, opt;
  char path[256] = "";
  while ((opt = getopt(argc, argv, "n:w:f:")) != -1) {
    if (opt == 'n') repeats = atoi(optarg) > 0 ? atoi(optarg) : 1;
    else if (opt == 'w') warmup = atoi(optarg) >= 0 ? atoi(optarg) : 0;
    else if (opt == 'f') snprintf(path, sizeof path, "%s", optarg);
    else {
      fprintf(stderr, "usage: %s [-n repeats] [-w warmup] [-f weights.safetensors]\n", argv[0]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  dtl_comm *world;
  TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  const int rank = dtl_comm_rank(world), size = dtl_comm_size(world);
  int own_file = !path[0];
  if (own_file) { /* a name of rank 0's, so that runs side by side (the tests at np 1, 2, 4) never share it */
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/dtl_generate_%ld.safetensors", dir, (long)getpid());
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  }
  if (rank == 0) write_model(path);
  TRY(dtl_barrier(world)); /* the file is complete before anyone opens it */

  int64_t prompt[PROMPT];
  for (int i = 0; i < PROMPT; i++) prompt[i] = (int64_t)((i * 389 + 17) % VOCAB);
  if (rank == 0) {
    printf("generate: %d layers, hidden %d, heads %d/%d x %d, RoPE theta %g, MLP ffn %d on even layers, MoE %d "
           "experts top-%d ffn %d on odd layers, vocab %d; %d world ranks\nprompt:", LAYERS, HID, QH, KVH, HD,
           (double)THETA, FFN, EXPERTS, TOPK, EFFN, VOCAB, size);
    for (int i = 0; i < PROMPT; i++) printf(" %lld", (long long)prompt[i]);
    printf("\n");
  }
  const int tps[3] = {1, 2, 4};
  int64_t ref[NEW];
  int differ = 0, configs = 0;
  float ref_margin = 0.0f, ref_logit[NEW];
  double drift = 0; /* the largest |chosen logit - the reference's| of any configuration, rank and step */
  for (int c = 0; c < 6; c++) {
    int tp = tps[c / 2], sp = c % 2;
    if (tp > size) {
      if (rank == 0) printf("TP=%d SP=%-3s skipped: needs %d ranks\n", tp, sp ? "on" : "off", tp);
      continue;
    }
    /* Groups of tp consecutive ranks, each running the whole model; ranks left over sit this one out. */
    int groups = size / tp, active = rank < groups * tp;
    dtl_comm *g;
    TRY(dtl_comm_split(world, active ? rank / tp : groups, rank, &g));
    run best, r;
    memset(&best, 0, sizeof best);
    int unstable = 0;
    if (active) {
      model m;
      model_load(&m, g, sp, path);
      for (int i = 0; i < warmup + repeats; i++) {
        generate(&m, prompt, &r);
        if (i == 0) best = r;
        unstable |= memcmp(r.tokens, best.tokens, sizeof r.tokens) != 0;
        if (i >= warmup && (i == warmup || r.decode_s < best.decode_s)) best = r;
      }
      model_free(&m);
    }
    if (c == 0) { /* the single-rank run without sequence parallelism is the reference */
      memcpy(ref, best.tokens, sizeof ref);
      memcpy(ref_logit, best.logit, sizeof ref_logit);
      ref_margin = best.min_margin;
      MPI_Bcast(ref, NEW, MPI_INT64_T, 0, MPI_COMM_WORLD);
      MPI_Bcast(ref_logit, NEW, MPI_FLOAT, 0, MPI_COMM_WORLD);
      MPI_Bcast(&ref_margin, 1, MPI_FLOAT, 0, MPI_COMM_WORLD);
    }
    int bad = active && (unstable || memcmp(best.tokens, ref, sizeof ref) != 0), any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    double d = 0, dmax;
    for (int i = 0; active && !bad && i < NEW; i++) d = fmax(d, fabs((double)best.logit[i] - ref_logit[i]));
    MPI_Allreduce(&d, &dmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    drift = fmax(drift, dmax);
    /* Rank 0's group reports: its slowest rank's times, its mean communication share. */
    double mine[3] = {best.prefill_s, best.decode_s, best.decode_s > 0 ? best.decode_comm_s / best.decode_s : 0},
           slow[3], share = 0;
    TRY(dtl_all_reduce(g, mine, slow, 2, DTL_FLOAT64, DTL_MAX));
    TRY(dtl_all_reduce(g, mine + 2, &share, 1, DTL_FLOAT64, DTL_SUM));
    if (rank == 0) {
      printf("TP=%d SP=%-3s tokens:", tp, sp ? "on" : "off");
      for (int i = 0; i < NEW; i++) printf(" %lld", (long long)best.tokens[i]);
      printf("\n             prefill %d tokens %.2f ms | decode %.3f ms/token (%.0f tokens/s), communication %.0f%% "
             "(%ld MPI calls/token) | %s\n", PROMPT, 1e3 * slow[0], 1e3 * slow[1] / (NEW - 1), (NEW - 1) / slow[1],
             100 * share / tp, best.decode_calls / (NEW - 1),
             any ? "DIFFERS from TP=1 (on some rank or run)" : c ? "identical to TP=1" : "reference");
    }
    differ |= any;
    configs++;
    dtl_comm_destroy(g);
  }
  if (rank == 0) {
    printf("smallest top-1 margin of the reference run: %.4f; largest difference of a chosen logit from the "
           "reference's: %.2g", (double)ref_margin, drift);
    if (drift > 0) printf(" (%.0fx below that margin)", (double)ref_margin / drift);
    printf("\n");
    printf("%d configurations, tokens/s and communication share of the decode loop (%s, fastest of %d run%s): %s\n",
           configs, getenv("DTL_CHECK") && atoi(getenv("DTL_CHECK")) ? "DTL_CHECK=1" : "DTL_CHECK off", repeats,
           repeats > 1 ? "s" : "", differ ? "TOKENS DIFFER: FAILED" : "all tokens identical: OK");
    if (own_file) unlink(path);
  }
  dtl_comm_destroy(world);
  MPI_Finalize();
  return differ ? 1 : 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* TP weights read straight from a safetensors file: for every split (column, row, fused and separate QKV with
 * grouped and replicated kv heads, attention output, fused and separate gate/up, 1-D biases) the shard that
 * dtl_tp_weight_read_* reads equals, byte for byte, the one dtl_tp_weight_shard_* cuts from the dense array,
 * at uneven sizes; and every layer created from those shards with DTL_TP_SHARDED_WEIGHTS computes exactly
 * what the layer created from the dense weights computes. Bad names, shapes and dtypes leave the shard
 * untouched. */
#define _GNU_SOURCE
#include <stdlib.h>
#include "tp_env.h"

static t_env E;
static char dir[64], path[128];

/* Every weight is a function of its name, so that every rank can rebuild the dense tensor it compares with. */
static unsigned name_seed(const char *s) {
  unsigned h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}
static float *weight(const char *name, int64_t n) { return t_ints(name_seed(name), n, 50); }

static const int64_t dims[] = {1, 3, 5, 7, 8};
#define NDIMS 5
/* (q_heads, kv_heads, head_dim): grouped, tp > kv_heads (replicated at tp 4 and 3), uneven kv heads at tp 3. */
static const int64_t heads[][3] = {{8, 2, 3}, {8, 4, 2}, {6, 1, 2}, {4, 4, 3}, {12, 3, 2}, {6, 6, 1}};
#define NHEADS 6
static const int64_t QKV_IN = 5, GU_F = 7, GU_H = 3;

static void add(dtl_safetensors_writer *w, const char *name, int ndim, int64_t r, int64_t c, const float *d) {
  int64_t shape[2] = {r, c};
  REQUIRE_OK(dtl_safetensors_write_add(w, name, DTL_FLOAT32, ndim, shape, d));
}
/* A dense tensor of the given name, and (with part names) its row blocks as tensors of their own. */
static void add_named(dtl_safetensors_writer *w, const char *name, int ndim, int64_t r, int64_t c) {
  float *d = weight(name, r * c);
  add(w, name, ndim, r, c, d);
  free(d);
}
static void add_parts(dtl_safetensors_writer *w, const char *fused, int64_t c, int n, const char *const *names,
                      const int64_t *rows) {
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += rows[i];
  float *d = weight(fused, total * c);
  add(w, fused, c == 1 ? 1 : 2, total, c, d);
  for (int i = 0, at = 0; i < n; at += (int)rows[i], i++) add(w, names[i], c == 1 ? 1 : 2, rows[i], c, d + at * c);
  free(d);
}

static void write_the_file(void) {
  if (dt_rank == 0) {
    snprintf(dir, sizeof dir, "/tmp/dtl_tp_load_XXXXXX");
    REQUIRE_OK(mkdtemp(dir) ? DTL_OK : DTL_ERR_INVALID_ARGUMENT);
    snprintf(path, sizeof path, "%s/tp.safetensors", dir);
    dtl_safetensors_writer *w;
    REQUIRE_OK(dtl_safetensors_write_begin(path, &w));
    char n[64], q[64], k[64], v[64];
    for (int a = 0; a < NDIMS; a++) {
      snprintf(n, sizeof n, "b.%lld", (long long)dims[a]);
      add_named(w, n, 1, dims[a], 1);
      for (int b = 0; b < NDIMS; b++) {
        snprintf(n, sizeof n, "w.%lldx%lld", (long long)dims[a], (long long)dims[b]);
        add_named(w, n, 2, dims[a], dims[b]);
      }
    }
    const char *gu_parts[] = {"gate", "up"}, *gub_parts[] = {"gate.b", "up.b"};
    int64_t gu_rows[] = {GU_F, GU_F};
    add_parts(w, "gate_up", GU_H, 2, gu_parts, gu_rows);
    add_parts(w, "gate_up.b", 1, 2, gub_parts, gu_rows);
    for (int c = 0; c < NHEADS; c++) {
      int64_t Hq = heads[c][0], Hkv = heads[c][1], D = heads[c][2], rows[3] = {Hq * D, Hkv * D, Hkv * D};
      snprintf(n, sizeof n, "qkv.%d", c), snprintf(q, sizeof q, "q.%d", c), snprintf(k, sizeof k, "k.%d", c),
          snprintf(v, sizeof v, "v.%d", c);
      const char *parts[] = {q, k, v};
      add_parts(w, n, QKV_IN, 3, parts, rows);
      snprintf(n, sizeof n, "qkv.b.%d", c), snprintf(q, sizeof q, "q.b.%d", c), snprintf(k, sizeof k, "k.b.%d", c),
          snprintf(v, sizeof v, "v.b.%d", c);
      add_parts(w, n, 1, 3, parts, rows);
      snprintf(n, sizeof n, "o.%d", c);
      add_named(w, n, 2, QKV_IN, Hq * D);
    }
    double d64[6] = {1, 2, 3, 4, 5, 6};
    int64_t s64[2] = {2, 3};
    REQUIRE_OK(dtl_safetensors_write_add(w, "f64", DTL_FLOAT64, 2, s64, d64));
    REQUIRE_OK(dtl_safetensors_write_end(w));
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
}

static dtl_safetensors *F;

/* got (read from the file) equals want (cut from the dense array), n floats, and nothing past them. */
static void same(const float *got, const float *want, int64_t n, const char *what) {
  CHECK(!memcmp(got, want, sizeof(float) * (size_t)n), "%s: the file shard differs from the dense shard", what);
  uint32_t sentinel;
  memcpy(&sentinel, got + n, 4);
  CHECK(sentinel == 0xDEADBEEFu, "%s: wrote past the shard", what);
}
static float *buf(int64_t n) {
  size_t m = (size_t)(n > 0 ? n : 0) + 1; /* the elements and the sentinel */
  float *p = malloc(sizeof(float) * m);
  if (!p) abort();
  uint32_t s = 0xDEADBEEFu;
  for (size_t i = 0; i < m; i++) memcpy(p + i, &s, 4);
  return p;
}

static void column_and_row_shards_from_the_file_equal_the_dense_shards(void) {
  char n[64];
  for (int a = 0; a < NDIMS; a++)
    for (int b = 0; b < NDIMS; b++) {
      int64_t out = dims[a], in = dims[b], o0, on, i0, inn;
      t_chunk(out, E.tp, E.rank, &o0, &on);
      t_chunk(in, E.tp, E.rank, &i0, &inn);
      snprintf(n, sizeof n, "w.%lldx%lld", (long long)out, (long long)in);
      float *w = weight(n, out * in), *got = buf(on * in), *want = buf(on * in);
      CHECK_OK(dtl_tp_weight_read_column(E.ctx, F, n, out, in, got));
      CHECK_OK(dtl_tp_weight_shard_column(E.ctx, w, out, in, want));
      same(got, want, on * in, n);
      free(got), free(want);
      got = buf(out * inn), want = buf(out * inn);
      CHECK_OK(dtl_tp_weight_read_row(E.ctx, F, n, out, in, got));
      CHECK_OK(dtl_tp_weight_shard_row(E.ctx, w, out, in, want));
      same(got, want, out * inn, n);
      free(got), free(want), free(w);
    }
  /* A 1-D bias is the column shard of an [out, 1] weight. */
  for (int a = 0; a < NDIMS; a++) {
    int64_t out = dims[a], o0, on;
    t_chunk(out, E.tp, E.rank, &o0, &on);
    snprintf(n, sizeof n, "b.%lld", (long long)out);
    float *b = weight(n, out), *got = buf(on), *want = buf(on);
    CHECK_OK(dtl_tp_weight_read_column(E.ctx, F, n, out, 1, got));
    CHECK_OK(dtl_tp_weight_shard_column(E.ctx, b, out, 1, want));
    same(got, want, on, n);
    free(b), free(got), free(want);
  }
}

static void fused_and_separate_gate_up_read_the_dense_fused_shard(void) {
  int64_t f0, fn;
  t_chunk(GU_F, E.tp, E.rank, &f0, &fn);
  float *gu = weight("gate_up", 2 * GU_F * GU_H), *want = buf(2 * fn * GU_H), *fused = buf(2 * fn * GU_H),
        *sep = buf(2 * fn * GU_H);
  CHECK_OK(dtl_tp_weight_shard_gate_up(E.ctx, gu, GU_F, GU_H, want));
  CHECK_OK(dtl_tp_weight_read_gate_up(E.ctx, F, "gate_up", NULL, GU_F, GU_H, fused));
  CHECK_OK(dtl_tp_weight_read_gate_up(E.ctx, F, "gate", "up", GU_F, GU_H, sep));
  same(fused, want, 2 * fn * GU_H, "fused gate_up");
  same(sep, want, 2 * fn * GU_H, "gate + up");
  float *gub = weight("gate_up.b", 2 * GU_F), *bw = buf(2 * fn), *bf = buf(2 * fn), *bs = buf(2 * fn);
  CHECK_OK(dtl_tp_weight_shard_gate_up(E.ctx, gub, GU_F, 1, bw));
  CHECK_OK(dtl_tp_weight_read_gate_up(E.ctx, F, "gate_up.b", NULL, GU_F, 1, bf));
  CHECK_OK(dtl_tp_weight_read_gate_up(E.ctx, F, "gate.b", "up.b", GU_F, 1, bs));
  same(bf, bw, 2 * fn, "fused gate_up bias");
  same(bs, bw, 2 * fn, "gate + up biases");
  free(gu), free(want), free(fused), free(sep), free(gub), free(bw), free(bf), free(bs);
}

static void qkv_and_attention_out_shards_keep_whole_heads_like_the_dense_ones(void) {
  char n[64], q[64], k[64], v[64];
  for (int c = 0; c < NHEADS; c++) {
    int64_t Hq = heads[c][0], Hkv = heads[c][1], D = heads[c][2], W = (Hq + 2 * Hkv) * D;
    dtl_tp_range qr, kr;
    snprintf(n, sizeof n, "qkv.%d", c), snprintf(q, sizeof q, "q.%d", c), snprintf(k, sizeof k, "k.%d", c),
        snprintf(v, sizeof v, "v.%d", c);
    float *w = weight(n, W * QKV_IN), *got = buf(W * QKV_IN);
    if (dtl_tp_attention_heads(E.ctx, Hq, Hkv, &qr, &kr) != DTL_OK) {
      /* Heads that cannot be split over this tp: the read refuses them as the shard function does. */
      CHECK_ERROR(dtl_tp_weight_read_qkv(E.ctx, F, n, NULL, NULL, Hq, Hkv, D, QKV_IN, got), DTL_ERR_INVALID_ARGUMENT,
                  "kv_heads");
      free(w), free(got);
      continue;
    }
    int64_t rows = (qr.count + 2 * kr.count) * D;
    float *want = buf(rows * QKV_IN), *sep = buf(rows * QKV_IN);
    CHECK_OK(dtl_tp_weight_shard_qkv(E.ctx, w, Hq, Hkv, D, QKV_IN, want));
    CHECK_OK(dtl_tp_weight_read_qkv(E.ctx, F, n, NULL, NULL, Hq, Hkv, D, QKV_IN, got));
    CHECK_OK(dtl_tp_weight_read_qkv(E.ctx, F, q, k, v, Hq, Hkv, D, QKV_IN, sep));
    same(got, want, rows * QKV_IN, n);
    same(sep, want, rows * QKV_IN, q);
    free(w), free(got), free(want), free(sep);
    /* Biases, fused and separate. */
    snprintf(n, sizeof n, "qkv.b.%d", c), snprintf(q, sizeof q, "q.b.%d", c), snprintf(k, sizeof k, "k.b.%d", c),
        snprintf(v, sizeof v, "v.b.%d", c);
    float *b = weight(n, W), *bw = buf(rows), *bf = buf(rows), *bs = buf(rows);
    CHECK_OK(dtl_tp_weight_shard_qkv(E.ctx, b, Hq, Hkv, D, 1, bw));
    CHECK_OK(dtl_tp_weight_read_qkv(E.ctx, F, n, NULL, NULL, Hq, Hkv, D, 1, bf));
    CHECK_OK(dtl_tp_weight_read_qkv(E.ctx, F, q, k, v, Hq, Hkv, D, 1, bs));
    same(bf, bw, rows, n);
    same(bs, bw, rows, q);
    free(b), free(bw), free(bf), free(bs);
    /* The output projection: the columns of this rank's q heads. */
    snprintf(n, sizeof n, "o.%d", c);
    float *o = weight(n, QKV_IN * Hq * D), *ow = buf(QKV_IN * qr.count * D), *og = buf(QKV_IN * qr.count * D);
    CHECK_OK(dtl_tp_weight_shard_attention_out(E.ctx, o, Hq, Hkv, D, QKV_IN, ow));
    CHECK_OK(dtl_tp_weight_read_attention_out(E.ctx, F, n, Hq, Hkv, D, QKV_IN, og));
    same(og, ow, QKV_IN * qr.count * D, n);
    free(o), free(ow), free(og);
  }
}

/* A layer made from the file's shards and one made from dense weights give bitwise the same output. */
static void same_output(const float *a, const float *b, int64_t n, const char *what) {
  CHECK(!memcmp(a, b, sizeof(float) * (size_t)n), "%s: the layer from file shards computes another output", what);
}

static void layers_built_from_file_shards_compute_what_dense_layers_compute(void) {
  int64_t T = 5, t0, tn;
  t_chunk(T, E.tp, E.rank, &t0, &tn);
  /* Column-parallel linear with bias, gathered output; row-parallel linear with bias. */
  for (int kind = 0; kind < 2; kind++) {
    int64_t out = kind ? 5 : 7, in = kind ? 8 : 5, o0, on, i0, inn;
    t_chunk(out, E.tp, E.rank, &o0, &on);
    t_chunk(in, E.tp, E.rank, &i0, &inn);
    char wn[64], bn[64];
    snprintf(wn, sizeof wn, "w.%lldx%lld", (long long)out, (long long)in);
    snprintf(bn, sizeof bn, "b.%lld", (long long)out);
    float *w = weight(wn, out * in), *b = weight(bn, out), *ws = buf(out * in), *bs = buf(out);
    if (kind == 0) {
      CHECK_OK(dtl_tp_weight_read_column(E.ctx, F, wn, out, in, ws));
      CHECK_OK(dtl_tp_weight_read_column(E.ctx, F, bn, out, 1, bs));
    } else {
      CHECK_OK(dtl_tp_weight_read_row(E.ctx, F, wn, out, in, ws));
      memcpy(bs, b, sizeof(float) * (size_t)out); /* a row-parallel bias is whole */
    }
    dtl_tp_linear_params pd = {.flags = kind ? 0 : DTL_TP_GATHER_OUTPUT, .kind = kind ? DTL_TP_ROW : DTL_TP_COLUMN,
                               .in_features = in, .out_features = out, .weight = w, .bias = b};
    dtl_tp_linear_params ps = pd;
    ps.flags |= DTL_TP_SHARDED_WEIGHTS;
    ps.weight = ws;
    ps.bias = bs;
    dtl_tp_linear *ld = NULL, *ls = NULL;
    CHECK_OK(dtl_tp_linear_create(E.ctx, &pd, &ld));
    CHECK_OK(dtl_tp_linear_create(E.ctx, &ps, &ls));
    dtl_layout *li = NULL;
    CHECK_OK(dtl_tp_linear_layouts(ld, T, &li, NULL));
    float *x = t_reals(11, T * (kind ? inn : in), 1.0f), *yd = buf(T * out), *ys = buf(T * out);
    CHECK_OK(dtl_tp_linear_forward(ld, li, x, yd));
    CHECK_OK(dtl_tp_linear_forward(ls, li, x, ys));
    same_output(yd, ys, T * out, kind ? "row linear" : "column linear");
    dtl_layout_destroy(li);
    dtl_tp_linear_destroy(ld), dtl_tp_linear_destroy(ls);
    free(w), free(b), free(ws), free(bs), free(x), free(yd), free(ys);
  }
  /* SwiGLU MLP with biases: gate/up from separate tensors, down row-parallel. */
  {
    int64_t H = GU_H, Fd = GU_F, f0, fn;
    t_chunk(Fd, E.tp, E.rank, &f0, &fn);
    float *gu = weight("gate_up", 2 * Fd * H), *gub = weight("gate_up.b", 2 * Fd), *dn = weight("w.3x7", H * Fd),
          *dnb = weight("b.3", H);
    float *gus = buf(2 * fn * H), *gubs = buf(2 * fn), *dns = buf(H * fn);
    CHECK_OK(dtl_tp_weight_read_gate_up(E.ctx, F, "gate", "up", Fd, H, gus));
    CHECK_OK(dtl_tp_weight_read_gate_up(E.ctx, F, "gate_up.b", NULL, Fd, 1, gubs));
    CHECK_OK(dtl_tp_weight_read_row(E.ctx, F, "w.3x7", H, Fd, dns));
    dtl_tp_mlp_params pd = {.activation = DTL_TP_ACT_SILU_GATED, .hidden = H, .ffn = Fd, .gate_up = gu, .down = dn,
                            .gate_up_bias = gub, .down_bias = dnb};
    dtl_tp_mlp_params ps = pd;
    ps.flags = DTL_TP_SHARDED_WEIGHTS;
    ps.gate_up = gus, ps.down = dns, ps.gate_up_bias = gubs;
    dtl_tp_mlp *md = NULL, *ms = NULL;
    CHECK_OK(dtl_tp_mlp_create(E.ctx, &pd, &md));
    CHECK_OK(dtl_tp_mlp_create(E.ctx, &ps, &ms));
    dtl_layout *li = NULL;
    CHECK_OK(dtl_tp_mlp_layouts(md, T, &li, NULL));
    float *x = t_reals(12, T * H, 1.0f), *yd = buf(T * H), *ys = buf(T * H);
    CHECK_OK(dtl_tp_mlp_forward(md, li, x, yd));
    CHECK_OK(dtl_tp_mlp_forward(ms, li, x, ys));
    same_output(yd, ys, T * H, "mlp");
    dtl_layout_destroy(li);
    dtl_tp_mlp_destroy(md), dtl_tp_mlp_destroy(ms);
    free(gu), free(gub), free(dn), free(dnb), free(gus), free(gubs), free(dns), free(x), free(yd), free(ys);
  }
  /* Attention with biases: QKV from separate q, k, v tensors; every head configuration this tp can split. */
  for (int c = 0; c < NHEADS; c++) {
    int64_t Hq = heads[c][0], Hkv = heads[c][1], D = heads[c][2], W = (Hq + 2 * Hkv) * D, H = QKV_IN;
    dtl_tp_range qr, kr;
    if (dtl_tp_attention_heads(E.ctx, Hq, Hkv, &qr, &kr) != DTL_OK) continue;
    char n[64], q[64], k[64], v[64], bn[64], bq[64], bk[64], bv[64], on[64];
    snprintf(n, sizeof n, "qkv.%d", c), snprintf(q, sizeof q, "q.%d", c), snprintf(k, sizeof k, "k.%d", c),
        snprintf(v, sizeof v, "v.%d", c), snprintf(bn, sizeof bn, "qkv.b.%d", c), snprintf(bq, sizeof bq, "q.b.%d", c),
        snprintf(bk, sizeof bk, "k.b.%d", c), snprintf(bv, sizeof bv, "v.b.%d", c), snprintf(on, sizeof on, "o.%d", c);
    int64_t rows = (qr.count + 2 * kr.count) * D;
    float *wq = weight(n, W * H), *bqkv = weight(bn, W), *wo = weight(on, H * Hq * D), *bo = weight("b.5", H);
    float *wqs = buf(rows * H), *bqs = buf(rows), *wos = buf(H * qr.count * D);
    CHECK_OK(dtl_tp_weight_read_qkv(E.ctx, F, q, k, v, Hq, Hkv, D, H, wqs));
    CHECK_OK(dtl_tp_weight_read_qkv(E.ctx, F, bq, bk, bv, Hq, Hkv, D, 1, bqs));
    CHECK_OK(dtl_tp_weight_read_attention_out(E.ctx, F, on, Hq, Hkv, D, H, wos));
    dtl_tp_attention_params pd = {.hidden = H, .q_heads = Hq, .kv_heads = Hkv, .head_dim = D, .qkv = wq, .out = wo,
                                  .qkv_bias = bqkv, .out_bias = bo};
    dtl_tp_attention_params ps = pd;
    ps.flags = DTL_TP_SHARDED_WEIGHTS | DTL_TP_SEQUENCE_PARALLEL;
    pd.flags = DTL_TP_SEQUENCE_PARALLEL;
    ps.qkv = wqs, ps.qkv_bias = bqs, ps.out = wos;
    dtl_tp_attention *ad = NULL, *as = NULL;
    CHECK_OK(dtl_tp_attention_create(E.ctx, &pd, &ad));
    CHECK_OK(dtl_tp_attention_create(E.ctx, &ps, &as));
    dtl_layout *li = NULL;
    CHECK_OK(dtl_tp_attention_layouts(ad, T, &li, NULL));
    float *x = t_reals(13, tn * H, 1.0f), *yd = buf(tn * H), *ys = buf(tn * H);
    CHECK_OK(dtl_tp_attention_forward(ad, li, x, yd));
    CHECK_OK(dtl_tp_attention_forward(as, li, x, ys));
    same_output(yd, ys, tn * H, n);
    dtl_layout_destroy(li);
    dtl_tp_attention_destroy(ad), dtl_tp_attention_destroy(as);
    free(wq), free(bqkv), free(wo), free(bo), free(wqs), free(bqs), free(wos), free(x), free(yd), free(ys);
  }
  /* Vocab-parallel embedding: the table's rows are a column shard. */
  {
    int64_t V = 8, H = 7, v0, vn, ids[5] = {0, 7, 3, 3, 5};
    t_chunk(V, E.tp, E.rank, &v0, &vn);
    float *tab = weight("w.8x7", V * H), *tabs = buf(vn * H);
    CHECK_OK(dtl_tp_weight_read_column(E.ctx, F, "w.8x7", V, H, tabs));
    dtl_tp_embedding_params pd = {.vocab = V, .hidden = H, .table = tab}, ps = pd;
    ps.flags = DTL_TP_SHARDED_WEIGHTS;
    ps.table = tabs;
    dtl_tp_embedding *ed = NULL, *es = NULL;
    CHECK_OK(dtl_tp_embedding_create(E.ctx, &pd, &ed));
    CHECK_OK(dtl_tp_embedding_create(E.ctx, &ps, &es));
    float *yd = buf(T * H), *ys = buf(T * H);
    CHECK_OK(dtl_tp_embedding_forward(ed, T, ids, yd));
    CHECK_OK(dtl_tp_embedding_forward(es, T, ids, ys));
    same_output(yd, ys, T * H, "embedding");
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < H; j++) CHECK(ys[t * H + j] == tab[ids[t] * H + j], "embedding row of id %lld", (long long)ids[t]);
    dtl_tp_embedding_destroy(ed), dtl_tp_embedding_destroy(es);
    free(tab), free(tabs), free(yd), free(ys);
  }
}

static void bad_names_shapes_and_dtypes_are_named_and_leave_the_shard_untouched(void) {
  float *s = buf(64);
  CHECK_ERROR(dtl_tp_weight_read_column(E.ctx, F, "nope", 3, 5, s), DTL_ERR_INVALID_ARGUMENT,
              "dtl_tp_weight_read_column: ");
  CHECK_ERROR(dtl_tp_weight_read_column(E.ctx, F, "nope", 3, 5, s), DTL_ERR_INVALID_ARGUMENT,
              "tensor \"nope\" is not in the file");
  CHECK_ERROR(dtl_tp_weight_read_row(E.ctx, F, "w.3x5", 3, 7, s), DTL_ERR_INVALID_ARGUMENT,
              "tensor \"w.3x5\": shape=[3,5] in the file, expected [3,7]");
  CHECK_ERROR(dtl_tp_weight_read_column(E.ctx, F, "b.3", 3, 2, s), DTL_ERR_INVALID_ARGUMENT,
              "tensor \"b.3\": shape=[3] in the file, expected [3,2]");
  CHECK_ERROR(dtl_tp_weight_read_column(E.ctx, F, "f64", 2, 3, s), DTL_ERR_INVALID_ARGUMENT,
              "tensor \"f64\": dtype=F64 in the file, F32 requested");
  CHECK_ERROR(dtl_tp_weight_read_qkv(E.ctx, F, "q.0", "k.0", NULL, 8, 2, 3, QKV_IN, s), DTL_ERR_INVALID_ARGUMENT,
              "k=given v=NULL");
  /* The second of two tensors is wrong: nothing of the first is read either. */
  CHECK_ERROR(dtl_tp_weight_read_gate_up(E.ctx, F, "gate", "w.7x5", GU_F, GU_H, s), DTL_ERR_INVALID_ARGUMENT,
              "tensor \"w.7x5\": shape=[7,5] in the file, expected [7,3]");
  CHECK_ERROR(dtl_tp_weight_read_gate_up(E.ctx, F, "gate", "nope", GU_F, GU_H, s), DTL_ERR_INVALID_ARGUMENT,
              "tensor \"nope\"");
  CHECK_ERROR(dtl_tp_weight_read_column(E.ctx, F, "w.3x5", -3, 5, s), DTL_ERR_INVALID_ARGUMENT, "-3");
  CHECK_ERROR(dtl_tp_weight_read_column(E.ctx, NULL, "w.3x5", 3, 5, s), DTL_ERR_INVALID_ARGUMENT, "file=NULL");
  CHECK_ERROR(dtl_tp_weight_read_column(NULL, F, "w.3x5", 3, 5, s), DTL_ERR_INVALID_ARGUMENT, "ctx=NULL");
  int64_t o0, on;
  t_chunk(8, E.tp, E.rank, &o0, &on);
  if (on) CHECK_ERROR(dtl_tp_weight_read_column(E.ctx, F, "w.8x8", 8, 8, NULL), DTL_ERR_INVALID_ARGUMENT, "shard=NULL");
  uint32_t sentinel;
  for (int i = 0; i <= 64; i++) {
    memcpy(&sentinel, s + i, 4);
    CHECK(sentinel == 0xDEADBEEFu, "shard[%d] written by a failed read", i);
  }
  free(s);
  /* The flag is a known bit of every layer's params; the bit after it is not. */
  float w[4] = {0};
  dtl_tp_linear_params p = {.flags = DTL_BIT(5), .kind = DTL_TP_COLUMN, .in_features = 2, .out_features = 2, .weight = w};
  dtl_tp_linear *l = NULL;
  CHECK_ERROR(dtl_tp_linear_create(E.ctx, &p, &l), DTL_ERR_INVALID_ARGUMENT, "DTL_TP_SHARDED_WEIGHTS");
}

int main(int argc, char **argv) {
  t_setup(&argc, &argv, &E);
  write_the_file();
  REQUIRE_OK(dtl_safetensors_open(path, &F));
  RUN(column_and_row_shards_from_the_file_equal_the_dense_shards);
  RUN(fused_and_separate_gate_up_read_the_dense_fused_shard);
  RUN(qkv_and_attention_out_shards_keep_whole_heads_like_the_dense_ones);
  RUN(layers_built_from_file_shards_compute_what_dense_layers_compute);
  RUN(bad_names_shapes_and_dtypes_are_named_and_leave_the_shard_untouched);
  dtl_safetensors_close(F);
  MPI_Barrier(MPI_COMM_WORLD);
  if (dt_rank == 0) {
    unlink(path);
    rmdir(dir);
  }
  t_teardown(&E);
  return dt_finish();
}

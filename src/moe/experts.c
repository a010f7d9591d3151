/* SPDX-License-Identifier: Apache-2.0 */
/* Expert compute: the per-local-expert callback loop over a layout's expert blocks, the grow-only scratch
 * the layout lends its callbacks, and the ready SiLU-gated MLP expert, on dense weights or on quantized ones
 * (dequantized one tile at a time, src/compute/gemm_tiled.h), whose matrix products go through the shared GEMM
 * (src/compute/gemm.h) and whose activations (and weight tile) live in that scratch. */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include "comm/agree.h"
#include "moe/moe_internal.h"
#include "compute/gemm_tiled.h"
#include "layout/qlayout_internal.h"
#include "quant/shard.h"

static dtl_status dtl__moe_experts_loop(const dtl_moe_layout *L, const void *expert_in, void *expert_out,
                                        dtl_moe_expert_fn fn, void *user) {
  static const char name[] = "dtl_moe_experts_run";
  DTL_CHECK_ARG(fn != NULL, name, "fn=NULL");
  DTL_CHECK_ARG(L->expert_rows == 0 || (expert_in && expert_out), name, "%s=NULL with %lld expert rows",
                expert_in ? "expert_out" : "expert_in", (long long)L->expert_rows);
  DTL_CHECK_ARG(L->expert_rows == 0 || expert_in != expert_out, name, "expert_in and expert_out are the same buffer");
  for (int j = 0; j < L->local_experts; j++) {
    size_t off = (size_t)L->block_off[j] * L->row_bytes;
    dtl_moe_expert_batch b = {
        .expert = L->local_ids[j],
        .local = j,
        .rows = L->block_rows[j],
        .rows_padded = L->block_padded[j],
        .hidden = L->hidden,
        .dtype = L->dtype,
        .memory = L->comm->mem.ops->memory,
        .in = expert_in ? (const char *)expert_in + off : NULL,
        .out = expert_out ? (char *)expert_out + off : NULL,
        .layout = L,
    };
    dtl_status st = fn(&b, user);
    if (st != DTL_OK)
      return dtl__error_prefix(st, "%s: expert %d (local %d)", name, b.expert, j);
  }
  return DTL_OK;
}

dtl_status dtl_moe_expert_scratch(const dtl_moe_expert_batch *b, size_t bytes, void **out) {
  static const char name[] = "dtl_moe_expert_scratch";
  DTL_CHECK_ARG(b != NULL, name, "batch=NULL");
  DTL_CHECK_ARG(out != NULL, name, "out=NULL");
  DTL_CHECK_ARG(b->layout != NULL, name, "batch.layout=NULL (scratch belongs to the layout of dtl_moe_experts_run)");
  const dtl_moe_layout *L = b->layout;
  struct dtl__moe_scratch *ws = L->expert_ws;
  if (bytes > ws->bytes || !ws->p) {
    void *p = NULL;
    dtl_status st = dtl__mem_alloc(&L->comm->mem, bytes, &p);
    if (st != DTL_OK) return dtl__error_prefix(st, "%s: %zu bytes", name, bytes);
    if (ws->p) dtl__mem_free(&L->comm->mem, ws->p);
    ws->p = p;
    ws->bytes = bytes;
  }
  *out = ws->p;
  return DTL_OK;
}

/* Under DTL_CHECK (on count_comm) the ranks agree on the outcome afterwards, so that a rank whose experts
 * failed does not leave its peers waiting in the combine. */
dtl_status dtl_moe_experts_run(const dtl_moe_layout *L, const void *expert_in, void *expert_out, dtl_moe_expert_fn fn,
                               void *user) {
  DTL_CHECK_ARG(L != NULL, "dtl_moe_experts_run", "layout=NULL");
  dtl_status st = dtl__moe_experts_loop(L, expert_in, expert_out, fn, user);
  return L->count_comm->check ? dtl__agree(L->count_comm, "dtl_moe_experts_run", (uint64_t)L->id, st) : st;
}

/* C[m, n] = A[m, kk] B[n, kk]^T, row-major f32 on the host. */
static dtl_status dtl__moe_gemm_nt(int64_t m, int64_t n, int64_t kk, const float *A, const float *B, float *C) {
  dtl__gemm_engine host = dtl__gemm_engine_host();
  return dtl__gemm(&host, DTL_FLOAT32, m, n, kk, 1.0f, A, kk, B, kk, 0.0f, C, n);
}

/* One matrix product of the SwiGLU expert: C[m, n] = A[m, k] W^T with W the expert's gate (which = 0), up (1) or
 * down (2) weight; tile is the tile_bytes of scratch the expert asked for, after its activations. */
typedef dtl_status (*dtl__moe_mm_fn)(void *user, const dtl_moe_expert_batch *b, int which, int64_t m, int64_t n,
                                     int64_t k, const float *A, float *C, void *tile);

/* The SiLU-gated expert on one batch, its products by mm: the body both MLP experts share. */
static dtl_status dtl__moe_swiglu(const char *name, const dtl_moe_expert_batch *b, int64_t f, dtl__moe_mm_fn mm,
                                  void *user, size_t tile_bytes) {
  if (b->rows == 0) return DTL_OK;
  const int64_t m = b->rows, h = b->hidden;
  /* Under a layout the scratch is sized for the largest local block at once, so that no later expert of
   * the same run needs more: running out of memory then fails the first expert with rows, before any
   * output row is written. */
  int64_t widest = m;
  for (int j = 0; b->layout && j < b->layout->local_experts; j++)
    if (b->layout->block_rows[j] > widest) widest = b->layout->block_rows[j];
  size_t cells, scratch_cells;
  DTL_CHECK_ARG(dtl__mul_size((size_t)widest, (size_t)f, &scratch_cells) &&
                    scratch_cells <= (SIZE_MAX - tile_bytes) / sizeof(float) / 2,
                name, "rows=%lld x ffn=%lld overflows", (long long)widest, (long long)f);
  cells = (size_t)m * (size_t)f;
  void *ws = NULL, *own = NULL;
  if (b->layout) DTL_TRY(dtl_moe_expert_scratch(b, 2 * sizeof(float) * scratch_cells + tile_bytes, &ws));
  else if (!(ws = own = dtl__malloc(2 * sizeof(float) * cells + tile_bytes)))
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, name, "out of host memory for %lld x %lld activations", (long long)m,
                         (long long)f);
  float *gate = ws, *up = gate + cells;
  void *tile = (char *)ws + 2 * sizeof(float) * (b->layout ? scratch_cells : cells);
  dtl_status st = mm(user, b, 0, m, f, h, b->in, gate, tile);
  if (st == DTL_OK) st = mm(user, b, 1, m, f, h, b->in, up, tile);
  if (st == DTL_OK) {
    for (size_t i = 0; i < cells; i++) {
      float g = gate[i];
      gate[i] = g / (1.0f + expf(-g)) * up[i]; /* silu(g) * u */
    }
    st = mm(user, b, 2, m, h, f, gate, b->out, tile);
  }
  dtl__free(own);
  return st;
}

/* The batch checks both MLP experts make: host f32, the expert's hidden size. */
static dtl_status dtl__moe_mlp_batch_check(const char *name, const dtl_moe_expert_batch *b, const void *mlp,
                                           int64_t hidden) {
  DTL_CHECK_ARG(b != NULL, name, "batch=NULL");
  DTL_CHECK_ARG(mlp != NULL, name, "mlp=NULL");
  if (b->memory != DTL_MEMORY_HOST || b->dtype != DTL_FLOAT32)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, name, "%s memory, dtype %s (expected host memory and f32)",
                         b->memory == DTL_MEMORY_HOST ? "host" : "device", dtl_dtype_name(b->dtype));
  DTL_CHECK_ARG(hidden == b->hidden, name, "mlp.hidden=%lld but the layout's hidden=%lld", (long long)hidden,
                (long long)b->hidden);
  return DTL_OK;
}

static dtl_status dtl__moe_dense_mm(void *user, const dtl_moe_expert_batch *b, int which, int64_t m, int64_t n,
                                    int64_t k, const float *A, float *C, void *tile) {
  const dtl_moe_mlp *mlp = user;
  const float *const *w = which == 0 ? mlp->w_gate : which == 1 ? mlp->w_up : mlp->w_down;
  (void)tile;
  return dtl__moe_gemm_nt(m, n, k, A, w[b->local], C);
}

dtl_status dtl_moe_mlp_forward(const dtl_moe_expert_batch *b, void *user) {
  static const char name[] = "dtl_moe_mlp_forward";
  const dtl_moe_mlp *mlp = user;
  DTL_TRY(dtl__moe_mlp_batch_check(name, b, mlp, mlp ? mlp->hidden : 0));
  DTL_CHECK_ARG(mlp->ffn >= 1, name, "mlp.ffn=%lld (expected >= 1)", (long long)mlp->ffn);
  DTL_CHECK_ARG(b->local >= 0 && b->local < mlp->local_experts, name, "local expert %d (mlp.local_experts=%d)",
                b->local, mlp->local_experts);
  DTL_CHECK_ARG(mlp->w_gate && mlp->w_up && mlp->w_down, name, "mlp weight arrays must not be NULL");
  const float *wg = mlp->w_gate[b->local], *wu = mlp->w_up[b->local], *wd = mlp->w_down[b->local];
  DTL_CHECK_ARG(wg && wu && wd, name, "weights of local expert %d are NULL", b->local);
  return dtl__moe_swiglu(name, b, mlp->ffn, dtl__moe_dense_mm, (void *)mlp, 0);
}

/* --- the SiLU-gated expert on quantized weights -------------------------------------------------------- */
struct dtl_moe_qmlp {
  int64_t hidden, ffn;
  dtl__qshard_own *w[3]; /* gate, up, down: the local boxes, whole matrices of the experts they cover */
};

void dtl_moe_qmlp_destroy(dtl_moe_qmlp *m) {
  if (!m) return;
  for (int i = 0; i < 3; i++) dtl__qshard_own_destroy(m->w[i]);
  dtl__free(m);
}

static const char *const dtl__moe_qnames[3] = {"gate", "up", "down"};

/* The text of a layout for a message (formatted only when a check fails: it may allocate). */
static const char *dtl__moe_qtext(const dtl_qlayout *L, char *buf, size_t cap) {
  if (dtl_qlayout_format(L, buf, cap) != DTL_OK) snprintf(buf, cap, "(layout)");
  return buf;
}

static dtl_status dtl__moe_qmlp_take(const char *fn, int which, const dtl_qlayout *L, const dtl_qbuf *local,
                                     int64_t R, int64_t C, dtl__qshard_own **out) {
  const char *name = dtl__moe_qnames[which];
  DTL_CHECK_ARG(L != NULL, fn, "params.%s=NULL", name);
  char buf[256];
  DTL_CHECK_ARG(L->g.ndim == 3 && L->g.shape[1] == R && L->g.shape[2] == C, fn,
                "params.%s %s: expected [experts, %lld, %lld] (%s)", name, dtl__moe_qtext(L, buf, sizeof buf), (long long)R, (long long)C,
                which == 2 ? "[experts, hidden, ffn]" : "[experts, ffn, hidden]");
  const dtl_mesh *mesh = L->logical.mesh;
  if (mesh->comm && mesh->comm->mem.ops->memory != DTL_MEMORY_HOST)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "params.%s is on a mesh of device memory (the quantized MLP expert "
                         "computes on the host)", name);
  const int64_t *ls = L->local.shape, *lo = L->local.offset;
  DTL_CHECK_ARG(ls[1] == R && ls[2] == C, fn,
                "params.%s %s gives this rank rows [%lld, %lld) x cols [%lld, %lld) of each expert (expected whole "
                "[%lld, %lld] matrices: cut only the expert dim)",
                name, dtl__moe_qtext(L, buf, sizeof buf), (long long)lo[1], (long long)(lo[1] + ls[1]), (long long)lo[2], (long long)(lo[2] + ls[2]),
                (long long)R, (long long)C);
  const void *parts[DTL_QUANT_NUM_PARTS] = {NULL};
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    const dtl_qpart_box *b = &L->local.part[p];
    if (b->ndim < 0) continue;
    parts[p] = local ? local->part[p] : NULL;
    DTL_CHECK_ARG(parts[p] != NULL || b->bytes == 0, fn, "params.%s_local.part[%d]=NULL with %zu bytes", name, p,
                  b->bytes);
  }
  char what[96];
  snprintf(what, sizeof what, "%s: params.%s", fn, name);
  dtl__mem host = dtl__mem_host();
  return dtl__qshard_own_create(what, &host, &L->g, ls, lo, parts, ls, lo, out);
}

dtl_status dtl_moe_qmlp_create(const dtl_moe_qmlp_params *p, dtl_moe_qmlp **out) {
  static const char fn[] = "dtl_moe_qmlp_create";
  DTL_CHECK_ARG(p != NULL, fn, "params=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_TRY(dtl__check_bits(fn, "params.mask", p->mask, DTL__NO_BITS));
  DTL_TRY(dtl__check_bits(fn, "params.flags", p->flags, DTL__NO_BITS));
  DTL_CHECK_ARG(p->hidden >= 1 && p->ffn >= 1, fn, "hidden=%lld ffn=%lld (expected >= 1)", (long long)p->hidden,
                (long long)p->ffn);
  dtl_moe_qmlp *m = dtl__calloc(1, sizeof *m);
  if (!m) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  m->hidden = p->hidden;
  m->ffn = p->ffn;
  const dtl_qlayout *L[3] = {p->gate, p->up, p->down};
  const dtl_qbuf *B[3] = {&p->gate_local, &p->up_local, &p->down_local};
  dtl_status st = DTL_OK;
  for (int i = 0; i < 3 && st == DTL_OK; i++)
    st = dtl__moe_qmlp_take(fn, i, L[i], B[i], i == 2 ? p->hidden : p->ffn, i == 2 ? p->ffn : p->hidden, &m->w[i]);
  if (st != DTL_OK) {
    dtl_moe_qmlp_destroy(m);
    return st;
  }
  *out = m;
  return DTL_OK;
}

typedef struct {
  const dtl__qshard *s;
  int64_t mat;
} dtl__moe_qtile_arg;

static dtl_status dtl__moe_qtile(void *user, int64_t r0, int64_t nr, int64_t c0, int64_t nc, void *tile, int64_t ldt) {
  const dtl__moe_qtile_arg *a = user;
  dtl__qshard_dequant_tile(a->s, a->mat, r0, nr, c0, nc, tile, ldt);
  return DTL_OK;
}

static dtl_status dtl__moe_quant_mm(void *user, const dtl_moe_expert_batch *b, int which, int64_t m, int64_t n,
                                    int64_t k, const float *A, float *C, void *tile) {
  const dtl_moe_qmlp *q = user;
  const dtl__qshard *s = &q->w[which]->s;
  dtl__moe_qtile_arg arg = {s, b->expert - s->loff[0]};
  dtl__gemm_engine host = dtl__gemm_engine_host();
  return dtl__gemm_tiled(&host, DTL_FLOAT32, m, n, k, A, k, dtl__moe_qtile, &arg, tile,
                         dtl__gemm_tiling_for(DTL_MEMORY_HOST, n, k), 0.0f, C, n);
}

dtl_status dtl_moe_qmlp_forward(const dtl_moe_expert_batch *b, void *user) {
  static const char name[] = "dtl_moe_qmlp_forward";
  const dtl_moe_qmlp *q = user;
  DTL_TRY(dtl__moe_mlp_batch_check(name, b, q, q ? q->hidden : 0));
  size_t tile = 0;
  for (int i = 0; i < 3; i++) {
    const dtl__qshard *s = &q->w[i]->s;
    DTL_CHECK_ARG(b->expert >= s->loff[0] && b->expert < s->loff[0] + s->lshape[0], name,
                  "expert %d (local %d) is not among the experts [%lld, %lld) of this rank's %s weight", b->expert,
                  b->local, (long long)s->loff[0], (long long)(s->loff[0] + s->lshape[0]), dtl__moe_qnames[i]);
    int64_t n = i == 2 ? q->hidden : q->ffn, k = i == 2 ? q->ffn : q->hidden;
    size_t t = (size_t)dtl__gemm_tiling_elems(dtl__gemm_tiling_for(DTL_MEMORY_HOST, n, k)) * sizeof(float);
    if (t > tile) tile = t;
  }
  return dtl__moe_swiglu(name, b, q->ffn, dtl__moe_quant_mm, (void *)q, tile);
}

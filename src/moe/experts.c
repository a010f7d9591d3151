/* SPDX-License-Identifier: Apache-2.0 */
/* Expert compute: the per-local-expert callback loop over a layout's expert blocks, the grow-only scratch
 * the layout lends its callbacks, and the ready SiLU-gated MLP expert, whose matrix products go through the
 * shared GEMM (src/compute/gemm.h) and whose activations live in that scratch. */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include "comm/agree.h"
#include "moe/moe_internal.h"
#include "compute/gemm.h"

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

dtl_status dtl_moe_mlp_forward(const dtl_moe_expert_batch *b, void *user) {
  static const char name[] = "dtl_moe_mlp_forward";
  const dtl_moe_mlp *mlp = user;
  DTL_CHECK_ARG(b != NULL, name, "batch=NULL");
  DTL_CHECK_ARG(mlp != NULL, name, "mlp=NULL");
  if (b->memory != DTL_MEMORY_HOST || b->dtype != DTL_FLOAT32)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, name, "%s memory, dtype %s (expected host memory and f32)",
                         b->memory == DTL_MEMORY_HOST ? "host" : "device", dtl_dtype_name(b->dtype));
  DTL_CHECK_ARG(mlp->hidden == b->hidden, name, "mlp.hidden=%lld but the layout's hidden=%lld", (long long)mlp->hidden,
                (long long)b->hidden);
  DTL_CHECK_ARG(mlp->ffn >= 1, name, "mlp.ffn=%lld (expected >= 1)", (long long)mlp->ffn);
  DTL_CHECK_ARG(b->local >= 0 && b->local < mlp->local_experts, name, "local expert %d (mlp.local_experts=%d)",
                b->local, mlp->local_experts);
  DTL_CHECK_ARG(mlp->w_gate && mlp->w_up && mlp->w_down, name, "mlp weight arrays must not be NULL");
  const float *wg = mlp->w_gate[b->local], *wu = mlp->w_up[b->local], *wd = mlp->w_down[b->local];
  DTL_CHECK_ARG(wg && wu && wd, name, "weights of local expert %d are NULL", b->local);
  if (b->rows == 0) return DTL_OK;
  const int64_t m = b->rows, f = mlp->ffn, h = mlp->hidden;
  size_t cells;
  DTL_CHECK_ARG(dtl__mul_size((size_t)m, (size_t)f, &cells) && cells <= SIZE_MAX / sizeof(float) / 2, name,
                "rows=%lld x ffn=%lld overflows", (long long)m, (long long)f);
  void *ws = NULL, *own = NULL;
  if (b->layout) DTL_TRY(dtl_moe_expert_scratch(b, 2 * sizeof(float) * cells, &ws));
  else if (!(ws = own = dtl__malloc(2 * sizeof(float) * cells)))
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, name, "out of host memory for %lld x %lld activations", (long long)m,
                         (long long)f);
  float *gate = ws, *up = gate + cells;
  dtl_status st = dtl__moe_gemm_nt(m, f, h, b->in, wg, gate);
  if (st == DTL_OK) st = dtl__moe_gemm_nt(m, f, h, b->in, wu, up);
  if (st == DTL_OK) {
    for (size_t i = 0; i < cells; i++) {
      float g = gate[i];
      gate[i] = g / (1.0f + expf(-g)) * up[i]; /* silu(g) * u */
    }
    st = dtl__moe_gemm_nt(m, h, f, gate, wd, b->out);
  }
  dtl__free(own);
  return st;
}

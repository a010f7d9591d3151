/* SPDX-License-Identifier: Apache-2.0 */
/* The context-parallel context: the mesh dim of the CP group, its communicator, grow-only scratch, the token
 * layouts, the checks the attention forms share, and the dispatch of the attention kernels (src/attn) to the
 * host, to CUDA, or to the CUDA code emulated on the host. */
#include <math.h>
#include <string.h>
#include <time.h>
#include "cp/cp_internal.h"

double dtl__cp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

dtl_status dtl_cp_context_create(const dtl_mesh *mesh, int cp_dim, const dtl_cp_options *opt, dtl_cp_context **out) {
  static const char fn[] = "dtl_cp_context_create";
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_CHECK_ARG(mesh != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(!dtl_mesh_is_abstract(mesh), fn, "mesh is abstract (it has no communicators to run attention on)");
  DTL_CHECK_ARG(dtl_mesh_is_member(mesh), fn,
                "this rank is outside the mesh (dtl_mesh_create_from_ranks): only its members make contexts on it");
  DTL_CHECK_ARG(cp_dim >= 0 && cp_dim < mesh->ndim, fn, "cp_dim=%d (expected 0..%d)", cp_dim, mesh->ndim - 1);
  if (opt) {
    DTL_TRY(dtl__check_bits(fn, "opt.mask", opt->mask, DTL__BITS(DTL_CP_OPT_DTYPE)));
    DTL_TRY(dtl__check_bits(fn, "opt.flags", opt->flags, DTL__NO_BITS));
  }
  dtl_dtype t = (opt && (opt->mask & DTL_CP_OPT_DTYPE)) ? opt->dtype : DTL_FLOAT32;
  DTL_CHECK_ARG(t == DTL_FLOAT32 || t == DTL_FLOAT16 || t == DTL_BFLOAT16, fn, "dtype=%s (expected f32, f16 or bf16)",
                dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
  dtl_cp_context *c = dtl__calloc(1, sizeof *c);
  bool ok = c != NULL;
  for (int i = 0; ok && i < 4; i++) ok = (c->counts[i] = dtl__calloc((size_t)mesh->shape[cp_dim], sizeof(size_t)));
  if (!ok) {
    dtl_cp_context_destroy(c);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  c->mesh = mesh;
  c->cp_dim = cp_dim;
  c->size = mesh->shape[cp_dim];
  c->rank = mesh->coord[cp_dim];
  c->comm = mesh->dim_comm[cp_dim];
  c->dtype = t;
  c->elem = dtl_dtype_size(t);
  bool dev = dtl_comm_memory(c->comm) == DTL_MEMORY_DEVICE;
  c->kernels = dev ? DTL__CP_DEVICE : DTL__CP_HOST;
  c->ring_blocking = dev;
  *out = c;
  return DTL_OK;
}

int dtl_cp_context_size(const dtl_cp_context *ctx) { return ctx ? ctx->size : -1; }
int dtl_cp_context_rank(const dtl_cp_context *ctx) { return ctx ? ctx->rank : -1; }
const dtl_mesh *dtl_cp_context_mesh(const dtl_cp_context *ctx) { return ctx ? ctx->mesh : NULL; }
dtl_comm *dtl_cp_context_comm(const dtl_cp_context *ctx) { return ctx ? ctx->comm : NULL; }

void dtl_cp_context_destroy(dtl_cp_context *ctx) {
  if (!ctx) return;
  for (int s = 0; s < DTL__CP_WS_COUNT; s++)
    if (ctx->ws[s]) dtl__mem_free(&ctx->comm->mem, ctx->ws[s]);
  for (int i = 0; i < 4; i++) dtl__free(ctx->counts[i]);
  dtl__free(ctx);
}

#if DTL_HAVE_NCCL
void dtl__cp_context_emulate_device(dtl_cp_context *ctx, bool on) {
  ctx->kernels = on ? DTL__CP_EMULATED : DTL__CP_HOST;
  ctx->ring_blocking = on;
}
#endif

dtl_status dtl_cp_ring_last_stats(const dtl_cp_context *ctx, dtl_cp_ring_stats *out) {
  DTL_CHECK_ARG(ctx != NULL, "dtl_cp_ring_last_stats", "ctx=NULL");
  DTL_CHECK_ARG(out != NULL, "dtl_cp_ring_last_stats", "out=NULL");
  *out = ctx->stats;
  return DTL_OK;
}

dtl_status dtl__cp_scratch(dtl_cp_context *ctx, const char *fn, int n, const dtl__cp_ws *slots, const size_t *bytes) {
  for (int i = 0; i < n; i++) {
    dtl__cp_ws s = slots[i];
    if (ctx->ws[s] && bytes[i] <= ctx->ws_bytes[s]) continue;
    if (ctx->ws[s]) dtl__mem_free(&ctx->comm->mem, ctx->ws[s]);
    ctx->ws[s] = NULL;
    ctx->ws_bytes[s] = 0;
    size_t want = bytes[i] ? bytes[i] : 1;
    dtl_status st = dtl__mem_alloc(&ctx->comm->mem, want, &ctx->ws[s]);
    if (st != DTL_OK) return dtl__error_prefix(st, "%s: scratch of %zu bytes", fn, want);
    ctx->ws_bytes[s] = want;
  }
  return DTL_OK;
}

/* --- token layouts ------------------------------------------------------------------------------------ */
int dtl__cp_segments(dtl_cp_token_layout layout, int64_t T, int p, int r, dtl__cp_seg seg[2], int64_t *n) {
  int64_t off[2], cnt[2] = {0, 0};
  if (layout == DTL_CP_ZIGZAG) {
    dtl__chunk(T, 2 * p, r, &off[0], &cnt[0]);
    dtl__chunk(T, 2 * p, 2 * p - 1 - r, &off[1], &cnt[1]);
  } else {
    dtl__chunk(T, p, r, &off[0], &cnt[0]);
    off[1] = off[0] + cnt[0];
  }
  int k = 0;
  int64_t row = 0;
  for (int i = 0; i < 2; i++) {
    if (cnt[i] > 0) seg[k++] = (dtl__cp_seg){off[i], cnt[i], row};
    row += cnt[i];
  }
  *n = row;
  return k;
}

dtl_status dtl_cp_token_ranges(dtl_cp_token_layout layout, int64_t T, int cp, int rank, dtl_cp_range ranges[2]) {
  static const char fn[] = "dtl_cp_token_ranges";
  DTL_CHECK_ARG(layout == DTL_CP_ZIGZAG || layout == DTL_CP_CONTIGUOUS, fn,
                "layout=%d (expected DTL_CP_ZIGZAG or DTL_CP_CONTIGUOUS)", (int)layout);
  DTL_CHECK_ARG(T >= 0, fn, "T=%lld (expected >= 0)", (long long)T);
  DTL_CHECK_ARG(cp >= 1, fn, "cp=%d (expected >= 1)", cp);
  DTL_CHECK_ARG(rank >= 0 && rank < cp, fn, "rank=%d (expected 0..%d)", rank, cp - 1);
  DTL_CHECK_ARG(ranges != NULL, fn, "ranges=NULL");
  if (layout == DTL_CP_ZIGZAG) {
    dtl__chunk(T, 2 * cp, rank, &ranges[0].offset, &ranges[0].count);
    dtl__chunk(T, 2 * cp, 2 * cp - 1 - rank, &ranges[1].offset, &ranges[1].count);
  } else {
    dtl__chunk(T, cp, rank, &ranges[0].offset, &ranges[0].count);
    ranges[1] = (dtl_cp_range){ranges[0].offset + ranges[0].count, 0};
  }
  return DTL_OK;
}

/* --- shared checks ------------------------------------------------------------------------------------ */
dtl_status dtl__cp_check_heads(const char *fn, int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  DTL_CHECK_ARG(q_heads >= 1 && kv_heads >= 1, fn, "q_heads=%lld kv_heads=%lld (expected >= 1)", (long long)q_heads,
                (long long)kv_heads);
  DTL_CHECK_ARG(q_heads % kv_heads == 0, fn,
                "q_heads=%lld is not a multiple of kv_heads=%lld (grouped-query attention needs whole groups)",
                (long long)q_heads, (long long)kv_heads);
  DTL_CHECK_ARG(head_dim >= 1, fn, "head_dim=%lld (expected >= 1)", (long long)head_dim);
  return DTL_OK;
}

dtl_status dtl__cp_scale(const char *fn, uint64_t mask, float scale, int64_t head_dim, float *out) {
  if (mask & DTL_CP_SCALE) {
    DTL_CHECK_ARG(isfinite(scale), fn, "scale=%g (expected a finite number)", (double)scale);
    *out = scale;
  } else {
    *out = 1.0f / sqrtf((float)head_dim);
  }
  return DTL_OK;
}

dtl_status dtl__cp_count(const char *fn, const char *what, int64_t a, int64_t b, int64_t c, int64_t *out) {
  int64_t ab, n;
  if (a < 0 || b < 0 || c < 0 || !dtl__mul_i64(a, b, &ab) || !dtl__mul_i64(ab, c, &n) || (uint64_t)n > SIZE_MAX / 8)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: %lld x %lld x %lld elements (negative or overflowing)",
                         what, (long long)a, (long long)b, (long long)c);
  *out = n;
  return DTL_OK;
}

dtl_status dtl__cp_check_compute(const dtl_cp_context *ctx, const char *fn) {
  if (ctx->kernels != DTL__CP_HOST || ctx->dtype == DTL_FLOAT32) return DTL_OK;
  return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "context dtype %s: attention on the host computes in f32",
                       dtl_dtype_name(ctx->dtype));
}

/* --- kernels ------------------------------------------------------------------------------------------ */
static dtl_memory dtl__cp_kernel_memory(dtl__cp_kernels k) {
  return k == DTL__CP_HOST ? DTL_MEMORY_HOST : DTL_MEMORY_DEVICE;
}

size_t dtl__cp_attend_scratch(const dtl_cp_context *ctx, const dtl__attn_shape *s) {
  return dtl__attn_scratch_bytes(s, dtl__cp_kernel_memory(ctx->kernels));
}

dtl_status dtl__cp_attend(dtl_cp_context *ctx, const dtl__attn_shape *s, const void *q, const void *k, const void *v,
                          void *out, float *lse, void *scratch, size_t scratch_bytes) {
  switch (ctx->kernels) {
#if DTL_HAVE_NCCL
    case DTL__CP_DEVICE:
      return dtl__attn_cuda(s, q, k, v, out, lse, scratch, scratch_bytes, ctx->dtype, ctx->comm->mem.stream);
    case DTL__CP_EMULATED: return dtl__attn_emulate(s, q, k, v, out, lse, scratch, scratch_bytes, ctx->dtype);
#endif
    default: {
      dtl__gemm_engine g = dtl__gemm_engine_host();
      return dtl__attn_host(&g, s, q, k, v, out, lse, scratch, scratch_bytes);
    }
  }
}

dtl_status dtl__cp_merge_in(const dtl__mem *mem, dtl__cp_kernels k, dtl_dtype t, int64_t rows, int64_t H, int64_t D,
                            void *o_a, int64_t lda, float *lse_a, const void *o_b, int64_t ldb, const float *lse_b) {
  switch (k) {
#if DTL_HAVE_NCCL
    case DTL__CP_DEVICE: return dtl__attn_merge_cuda(rows, H, D, o_a, lda, lse_a, o_b, ldb, lse_b, t, mem->stream);
    case DTL__CP_EMULATED: return dtl__attn_merge_emulate(rows, H, D, o_a, lda, lse_a, o_b, ldb, lse_b, t);
#endif
    default: (void)mem; return dtl__attn_merge_host(rows, H, D, o_a, lda, lse_a, o_b, ldb, lse_b, t);
  }
}

dtl_status dtl__cp_merge(dtl_cp_context *ctx, dtl_dtype t, int64_t rows, int64_t H, int64_t D, void *o_a,
                         int64_t lda, float *lse_a, const void *o_b, int64_t ldb, const float *lse_b) {
  return dtl__cp_merge_in(&ctx->comm->mem, ctx->kernels, t, rows, H, D, o_a, lda, lse_a, o_b, ldb, lse_b);
}

dtl_status dtl__cp_combine(dtl_cp_context *ctx, int64_t n, int p, const float *lse, int64_t stride, float *L) {
  switch (ctx->kernels) {
#if DTL_HAVE_NCCL
    case DTL__CP_DEVICE: return dtl__attn_combine_cuda(n, p, lse, stride, L, ctx->comm->mem.stream);
    case DTL__CP_EMULATED: return dtl__attn_combine_emulate(n, p, lse, stride, L);
#endif
    default: return dtl__attn_combine_host(n, p, lse, stride, L);
  }
}

dtl_status dtl__cp_rescale(dtl_cp_context *ctx, int64_t rows, int64_t H, int64_t D, const void *src, int64_t lds,
                           bool src_f32, const float *lse, const float *L, void *dst, int64_t ldd) {
  switch (ctx->kernels) {
#if DTL_HAVE_NCCL
    case DTL__CP_DEVICE:
      return dtl__attn_rescale_cuda(rows, H, D, src, lds, src_f32, lse, L, dst, ldd, ctx->dtype, ctx->comm->mem.stream);
    case DTL__CP_EMULATED:
      return dtl__attn_rescale_emulate(rows, H, D, src, lds, src_f32, lse, L, dst, ldd, ctx->dtype);
#endif
    default: return dtl__attn_rescale_host(rows, H, D, src, lds, src_f32, lse, L, dst, ldd, ctx->dtype);
  }
}

/* --- what the prefill forms share --------------------------------------------------------------------- */
int64_t dtl__cp_float_bits(float f) {
  uint32_t bits = 0;
  memcpy(&bits, &f, sizeof bits);
  return (int64_t)bits;
}

void dtl__cp_prefill_fp(const dtl_cp_attention_params *p, int64_t v[DTL__CP_PREFILL_FP]) {
  if (!p) {
    memset(v, 0, sizeof(int64_t) * DTL__CP_PREFILL_FP);
    return;
  }
  const int64_t f[DTL__CP_PREFILL_FP] = {(int64_t)p->mask, (int64_t)p->flags, p->tokens, p->q_heads, p->kv_heads,
                                         p->head_dim, (int64_t)p->layout,
                                         p->mask & DTL_CP_SCALE ? dtl__cp_float_bits(p->scale) : 0};
  memcpy(v, f, sizeof f);
}

dtl_status dtl__cp_attention_args(const dtl_cp_context *ctx, const char *fn, const dtl_cp_attention_params *p,
                                  const void *q, const void *k, const void *v, const void *out, dtl__cp_args *a) {
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(p != NULL, fn, "params=NULL");
  DTL_TRY(dtl__check_bits(fn, "params.mask", p->mask, DTL__BITS(DTL_CP_SCALE)));
  DTL_TRY(dtl__check_bits(fn, "params.flags", p->flags, DTL__BITS(DTL_CP_CAUSAL)));
  DTL_CHECK_ARG(p->layout == DTL_CP_ZIGZAG || p->layout == DTL_CP_CONTIGUOUS, fn,
                "layout=%d (expected DTL_CP_ZIGZAG or DTL_CP_CONTIGUOUS)", (int)p->layout);
  DTL_CHECK_ARG(p->tokens >= 0, fn, "tokens=%lld (expected >= 0)", (long long)p->tokens);
  DTL_TRY(dtl__cp_check_heads(fn, p->q_heads, p->kv_heads, p->head_dim));
  int64_t nq, nkv;
  DTL_TRY(dtl__cp_count(fn, "q", p->tokens, p->q_heads, p->head_dim, &nq));
  DTL_TRY(dtl__cp_count(fn, "k", p->tokens, p->kv_heads, p->head_dim, &nkv)); /* <= SIZE_MAX / 8: K and V packed fit */
  DTL_TRY(dtl__cp_check_compute(ctx, fn));
  memset(a, 0, sizeof *a);
  DTL_TRY(dtl__cp_scale(fn, p->mask, p->scale, p->head_dim, &a->scale));
  a->T = p->tokens;
  a->qh = p->q_heads;
  a->kvh = p->kv_heads;
  a->D = p->head_dim;
  a->group = p->q_heads / p->kv_heads;
  a->qw = p->q_heads * p->head_dim;
  a->kvw = p->kv_heads * p->head_dim;
  a->causal = (p->flags & DTL_CP_CAUSAL) != 0;
  a->layout = p->layout;
  a->nseg = dtl__cp_segments(p->layout, p->tokens, ctx->size, ctx->rank, a->seg, &a->n);
  DTL_CHECK_ARG(a->n == 0 || q != NULL, fn, "q=NULL (this rank holds %lld tokens)", (long long)a->n);
  DTL_CHECK_ARG(a->n == 0 || k != NULL, fn, "k=NULL (this rank holds %lld tokens)", (long long)a->n);
  DTL_CHECK_ARG(a->n == 0 || v != NULL, fn, "v=NULL (this rank holds %lld tokens)", (long long)a->n);
  DTL_CHECK_ARG(a->n == 0 || out != NULL, fn, "out=NULL (this rank holds %lld tokens)", (long long)a->n);
  return DTL_OK;
}

dtl_status dtl__cp_copy2d(dtl_cp_context *ctx, size_t elem, int64_t rows, int64_t cols, const void *src, int64_t lds,
                          void *dst, int64_t ldd) {
  if (rows <= 0 || cols <= 0) return DTL_OK;
  dtl__box_copy b = {.ndim = 2, .elem_size = elem, .extent = {rows, cols}, .src_shape = {rows, lds},
                     .dst_shape = {rows, ldd}};
  return dtl__mem_copy_box(&ctx->comm->mem, src, dst, &b);
}

int64_t dtl__cp_rows(const dtl__cp_args *a, int p, int r) {
  dtl__cp_seg seg[2];
  int64_t n;
  dtl__cp_segments(a->layout, a->T, p, r, seg, &n);
  return n;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. It defines the context-parallel context and what its three attention forms
 * share: grow-only scratch acquired all at once before any communication, the token segments of a layout,
 * argument checks, the kernels of the context's memory (host loops, CUDA, or the CUDA code emulated on the
 * host for tests) and the collective merge of attention states. */
#ifndef DTL_CP_INTERNAL_H
#define DTL_CP_INTERNAL_H

#include "attn/attn.h"
#include "comm/agree.h"
#include "attn/state.h"
#include "layout/layout_internal.h"
#include "dtl/cp.h"

/* Scratch slots in the CP communicator's memory, one per role within a call. */
typedef enum {
  DTL__CP_WS_KV0,  /* ring: K/V block buffers (packed K then V rows); ulysses: the outgoing q/k/v columns */
  DTL__CP_WS_KV1,  /* ring: the other block buffer; ulysses: the incoming q/k/v columns, then outgoing o */
  DTL__CP_WS_ACC,  /* ring: the f32 accumulator of o; ulysses: q/k/v of this rank's heads in global order */
  DTL__CP_WS_PART, /* ring, decode: a partial o (f32); ulysses: o of this rank's heads */
  DTL__CP_WS_LSE,  /* f32: ring accumulator lse; decode/reduce: all ranks' lse; ulysses: lse of its heads */
  DTL__CP_WS_LSE2, /* f32: ring partial lse; decode/reduce: this rank's lse and the merged lse */
  DTL__CP_WS_LSE3, /* f32: ulysses: the lse exchange */
  DTL__CP_WS_CORE, /* the attention core's scratch */
  DTL__CP_WS_COUNT
} dtl__cp_ws;

/* Which kernels a context runs: host loops and GEMMs, CUDA kernels, or the CUDA kernels' code on the host
 * (a test hook: the device path's orchestration and f16/bf16 arithmetic on an MPI communicator). */
typedef enum { DTL__CP_HOST, DTL__CP_DEVICE, DTL__CP_EMULATED } dtl__cp_kernels;

struct dtl_cp_context {
  const dtl_mesh *mesh;
  int cp_dim, size, rank;
  dtl_comm *comm; /* the CP dim's communicator (owned by the mesh) */
  dtl_dtype dtype;
  size_t elem;
  dtl__cp_kernels kernels;
  bool ring_blocking; /* the ring's transfers by dtl_sendrecv before each step (NCCL) instead of async */
  void *ws[DTL__CP_WS_COUNT];
  size_t ws_bytes[DTL__CP_WS_COUNT];
  size_t *counts[4]; /* [size] each: element counts and displacements of the v-collectives */
  dtl_cp_ring_stats stats;
};

/* Test hook: makes ctx run the device kernels' code emulated on the host, with the device's transfer order
 * (blocking ring steps) and dtypes (f32/f16/bf16); on = false restores the host kernels. Only in CUDA builds. */
#if DTL_HAVE_NCCL
void dtl__cp_context_emulate_device(dtl_cp_context *ctx, bool on);
#endif

/* Acquires the n slots with at least bytes[i] each, all before the caller communicates (contents are not kept
 * across growth). */
dtl_status dtl__cp_scratch(dtl_cp_context *ctx, const char *fn, int n, const dtl__cp_ws *slots, const size_t *bytes);

/* A run of tokens a rank holds: global positions pos .. pos + count - 1 at its local rows row ... */
typedef struct {
  int64_t pos, count, row;
} dtl__cp_seg;
/* The (at most 2) segments of rank r in layout (empty ones left out); returns how many, *n the rank's rows. */
int dtl__cp_segments(dtl_cp_token_layout layout, int64_t T, int p, int r, dtl__cp_seg seg[2], int64_t *n);

/* A prefill call's arguments, checked (dtl__cp_attention_args): the shape, this rank's segments and rows. */
typedef struct {
  int64_t T, qh, kvh, D, group;
  int64_t qw, kvw; /* row widths of q/out and of k/v: heads x head_dim */
  bool causal;
  float scale;
  dtl_cp_token_layout layout;
  dtl__cp_seg seg[2];
  int nseg;
  int64_t n; /* this rank's tokens */
} dtl__cp_args;
/* Checks ctx, the params (bits, layout, tokens, heads, scale, sizes), the compute dtype and the buffers of
 * this rank (q, k, v, out given unless it holds no token; lse optional), and fills a. */
dtl_status dtl__cp_attention_args(const dtl_cp_context *ctx, const char *fn, const dtl_cp_attention_params *p,
                                  const void *q, const void *k, const void *v, const void *out, dtl__cp_args *a);
/* The rows rank r of p holds in a's layout. */
int64_t dtl__cp_rows(const dtl__cp_args *a, int p, int r);
/* 2-D copy of rows x cols elements (elem bytes each) between row-major arrays with row strides lds and ldd
 * (in elements), in ctx's memory; nothing for an empty box. */
dtl_status dtl__cp_copy2d(dtl_cp_context *ctx, size_t elem, int64_t rows, int64_t cols, const void *src, int64_t lds,
                          void *dst, int64_t ldd);

/* q_heads, kv_heads >= 1 with whole GQA groups, head_dim >= 1 (DTL_ERR_INVALID_ARGUMENT naming them). */
dtl_status dtl__cp_check_heads(const char *fn, int64_t q_heads, int64_t kv_heads, int64_t head_dim);
/* The scale a call uses: params' scale (checked finite) with DTL_CP_SCALE in mask, else 1/sqrt(head_dim). */
dtl_status dtl__cp_scale(const char *fn, uint64_t mask, float scale, int64_t head_dim, float *out);
/* a * b * c fits int64 and size_t bytes of the context's dtype; DTL_ERR_INVALID_ARGUMENT naming what. */
dtl_status dtl__cp_count(const char *fn, const char *what, int64_t a, int64_t b, int64_t c, int64_t *out);
/* The context can compute attention in its dtype (host: f32; device: f32/f16/bf16); DTL_ERR_UNSUPPORTED. */
dtl_status dtl__cp_check_compute(const dtl_cp_context *ctx, const char *fn);

/* The kernels of ctx's memory (src/attn): attention core, merge, lse combine, rescale. */
size_t dtl__cp_attend_scratch(const dtl_cp_context *ctx, const dtl__attn_shape *s);
dtl_status dtl__cp_attend(dtl_cp_context *ctx, const dtl__attn_shape *s, const void *q, const void *k, const void *v,
                          void *out, float *lse, void *scratch, size_t scratch_bytes);
dtl_status dtl__cp_merge(dtl_cp_context *ctx, dtl_dtype t, int64_t rows, int64_t H, int64_t D, void *o_a,
                         int64_t lda, float *lse_a, const void *o_b, int64_t ldb, const float *lse_b);
dtl_status dtl__cp_combine(dtl_cp_context *ctx, int64_t n, int p, const float *lse, int64_t stride, float *L);
dtl_status dtl__cp_rescale(dtl_cp_context *ctx, int64_t rows, int64_t H, int64_t D, const void *src, int64_t lds,
                           bool src_f32, const float *lse, const float *L, void *dst, int64_t ldd);
/* The same merge on a memory without a context (dtl_attn_state_merge_on). */
dtl_status dtl__cp_merge_in(const dtl__mem *mem, dtl__cp_kernels k, dtl_dtype t, int64_t rows, int64_t H, int64_t D,
                            void *o_a, int64_t lda, float *lse_a, const void *o_b, int64_t ldb, const float *lse_b);

/* The collective merge of dtl_cp_state_reduce (arguments checked): o [T, H * D] with row stride lds, f32 when
 * src_f32 (else the context's dtype), lse [T, H]; out in the context's dtype; shard: S(0) output, else R.
 * Acquires its scratch first. */
dtl_status dtl__cp_state_reduce(dtl_cp_context *ctx, const char *fn, int64_t T, int64_t H, int64_t D, const void *o,
                                int64_t lds, bool src_f32, const float *lse, bool shard, void *out, float *out_lse);
/* The scratch dtl__cp_state_reduce acquires (3 slots), so that a caller acquires it with its own first. */
#define DTL__CP_REDUCE_SLOTS 3
void dtl__cp_state_reduce_needs(const dtl_cp_context *ctx, int64_t T, int64_t H, int64_t D, dtl__cp_ws *slots,
                                size_t *bytes);

/* Seconds on a monotonic clock. */
double dtl__cp_now(void);

/* The agreement of a CP entry point under DTL_CHECK (agree.h), after its checks and scratch and before its
 * first transfer: one rank's bad argument or failed allocation fails every rank instead of leaving the
 * others in the ring or the merge. The fingerprint mixes the call's name and the n values v[0..n), each one
 * alone: every argument that shapes the call and must be alike on every rank. */
static inline dtl_status dtl__cp_agree(dtl_cp_context *ctx, const char *fn, int n, const int64_t *v, dtl_status local) {
  if (!ctx->comm->check) return local;
  return dtl__agree(ctx->comm, fn, dtl__fp_i64s(dtl__fp_str(0, fn), v, n), local);
}
/* The values of a prefill call (ring, Ulysses) that every rank must pass alike, for dtl__cp_agree: mask, flags,
 * tokens, heads, head_dim, layout and the scale's bits when given (all 0 for NULL params: the call fails). */
#define DTL__CP_PREFILL_FP 8
void dtl__cp_prefill_fp(const dtl_cp_attention_params *p, int64_t v[DTL__CP_PREFILL_FP]);
/* The bits of a float, for a fingerprint. */
int64_t dtl__cp_float_bits(float f);

#endif

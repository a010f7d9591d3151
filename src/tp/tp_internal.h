/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. It defines the tensor-parallel context and what its layers share: the
 * scratch slots, the input-layout check, one local projection (GEMM + optional bias) and the cores of the
 * communication halves that the public wrappers validate and the layers call directly. */
#ifndef DTL_TP_INTERNAL_H
#define DTL_TP_INTERNAL_H

#include "layout/layout_internal.h"
#include "compute/gemm.h"
#include "dtl/tp.h"

/* Grow-only scratch buffers in the TP communicator's memory, one per role, so one forward call never
 * allocates once warm and nested uses (a layer calling a communication half) never alias. */
typedef enum {
  DTL__TP_WS_INPUT,   /* the all-gathered input of a sequence-parallel layer */
  DTL__TP_WS_MID,     /* a column-parallel output (QKV, gate/up, or an S(1) before gathering) */
  DTL__TP_WS_AUX,     /* a stage's own data: attention scores (and transposed values), embedding ids */
  DTL__TP_WS_ATTN,    /* the attention output of this rank's heads */
  DTL__TP_WS_PARTIAL, /* a row-parallel Partial(sum) addend */
  DTL__TP_WS_COMM,    /* the communication halves' own staging */
  DTL__TP_WS_FP8,     /* an FP8 sequence gather's packed rows (gather_fp8.c) */
  DTL__TP_WS_QTILE,   /* a quantized projection's dequantized weight tile (qproj.c) */
  DTL__TP_WS_QACT,    /* a quantized projection's FP8 activations and their scale (DTL_TP_FP8_GEMM) */
  DTL__TP_WS_COUNT
} dtl__tp_ws;

struct dtl_tp_context {
  const dtl_mesh *mesh;
  int tp_dim, size, rank;
  dtl_comm *comm; /* the TP dim's communicator (owned by the mesh) */
  dtl_dtype dtype;
  size_t elem;
  bool fp8_gather; /* DTL_TP_FP8_GATHER */
  dtl__gemm_engine gemm;
  void *ws[DTL__TP_WS_COUNT];
  size_t ws_bytes[DTL__TP_WS_COUNT];
  size_t *counts; /* [size], per-rank element counts for the v-collectives */
  void *host_ws;  /* grow-only host staging (device contexts: ids on their way in, top-k candidates out) */
  size_t host_ws_bytes;
};

/* A buffer of at least bytes in slot (contents not kept across growth). A forward takes every slot it uses
 * before its first collective; the later calls for the same bytes then never allocate. */
dtl_status dtl__tp_scratch(dtl_tp_context *ctx, dtl__tp_ws slot, size_t bytes, void **out);
/* The same in host memory, whatever the communicator's memory. */
dtl_status dtl__tp_host_scratch(dtl_tp_context *ctx, size_t bytes, void **out);
/* Whether ctx computes on a device (an NCCL communicator; only possible in a CUDA build). */
static inline bool dtl__tp_on_device(const dtl_tp_context *ctx) { return ctx->gemm.memory == DTL_MEMORY_DEVICE; }

/* Checks that l is a [tokens, features] activation layout of ctx (same mesh and dtype, 2-D, features
 * columns, on_tp on the TP dim, Replicate elsewhere); DTL_ERR_MISMATCH naming both layouts otherwise.
 * *tokens gets the global token count. what names the argument ("x_layout"). */
dtl_status dtl__tp_check_layout(const dtl_tp_context *ctx, const char *fn, const char *what, const dtl_layout *l,
                                int64_t features, dtl_placement on_tp, int64_t *tokens);
/* Whether a layer can compute in ctx's dtype: on the host f32 only, on a device f32/f16/bf16.
 * DTL_ERR_UNSUPPORTED naming fn otherwise. */
dtl_status dtl__tp_check_compute(const dtl_tp_context *ctx, const char *fn);
/* The mask and flags of a TP params struct ("params" or "opt", named by what) hold only the bits it defines
 * (each given as DTL__BITS(...) or DTL__NO_BITS). */
dtl_status dtl__tp_check_bits(const char *fn, const char *what, uint64_t mask, uint64_t mask_known,
                              const char *mask_names, uint64_t flags, uint64_t flags_known, const char *flags_names);
/* Element count a*b with overflow check (DTL_ERR_INVALID_ARGUMENT naming fn and what). */
dtl_status dtl__tp_count(const char *fn, const char *what, int64_t a, int64_t b, size_t *out);

/* torch.chunk piece of n for TP coordinate r. */
dtl_tp_range dtl__tp_chunk(const dtl_tp_context *ctx, int64_t n, int r);
/* Head ranges for TP coordinate r (validated as dtl_tp_attention_heads documents). */
dtl_status dtl__tp_heads(const dtl_tp_context *ctx, const char *fn, int64_t q_heads, int64_t kv_heads, int r,
                         dtl_tp_range *q, dtl_tp_range *kv);

/* The fused-QKV row ranges of this rank ({q heads, k heads, v heads} x head_dim rows), checked. */
typedef struct {
  int64_t row_off, rows;
} dtl__tp_rows;
dtl_status dtl__tp_qkv_rows(const dtl_tp_context *ctx, const char *fn, int64_t q_heads, int64_t kv_heads,
                           int64_t head_dim, dtl__tp_rows *rows);

/* A local weight shard [rows, cols] with an optional bias [rows], both copied into ctx memory. A
 * column-parallel projection adds its bias in the GEMM; a row-parallel one hands it to dtl__tp_reduce,
 * which adds it once after the reduction. A quantized projection (nq > 0, w NULL) has its rows from nq
 * quantized sub-weights stacked in order (fused QKV: q, k, v; gate/up: gate, up), each kept as this rank's
 * box of it and dequantized tile by tile in the GEMM (qproj.c). */
typedef struct dtl__tp_qsub dtl__tp_qsub;
typedef struct {
  int64_t rows, cols;
  void *w, *bias;
  int nq;
  dtl__tp_qsub *q[3];
} dtl__tp_proj;
/* Builds a projection from a dense source: the listed row ranges of w [*, in] restricted to the columns
 * [col_off, col_off + cols), and the same row ranges of bias (NULL = none). sharded (DTL_TP_SHARDED_WEIGHTS):
 * w is that shard already, [sum of the ranges' rows, cols], and bias its [rows]. */
dtl_status dtl__tp_proj_init(dtl_tp_context *ctx, const char *fn, dtl__tp_proj *p, bool sharded, const void *w,
                             int64_t in, const dtl__tp_rows *ranges, int nranges, int64_t col_off, int64_t cols,
                             const void *bias);
void dtl__tp_proj_fini(dtl_tp_context *ctx, dtl__tp_proj *p);
/* The bias of a projection of rows rows: the listed row ranges of a dense bias [src_rows] (sharded: bias is
 * already its [rows]), copied into ctx memory; NULL = none. */
dtl_status dtl__tp_proj_bias(dtl_tp_context *ctx, const char *fn, dtl__tp_proj *p, bool sharded, const void *bias,
                             const dtl__tp_rows *ranges, int nranges);

/* One quantized sub-weight of a projection, as the layer asks for it: the argument's name (for messages), the
 * logical [R, C] matrix it must be, and the global box of it this rank computes with (rows [row0, row0 + rows)
 * x cols [col0, col0 + cols)). Its local box must hold that box (column-parallel: S(0) on the TP dim or
 * Replicate; row-parallel: S(1) or Replicate), whose edges must fall on the format's packing units. */
typedef struct {
  const char *name;
  const dtl_tp_qweight *w;
  int64_t R, C;
  int64_t row0, rows, col0, cols;
} dtl__tp_qneed;
/* A quantized projection of the n sub-weights (stacked on rows; every one of cols columns), checked against
 * ctx and copied (the weights are borrowed), its bias as dtl__tp_proj_bias. fp8: DTL_TP_FP8_GEMM was asked
 * for (taken where the weight and device allow it). */
dtl_status dtl__tp_proj_init_quant(dtl_tp_context *ctx, const char *fn, dtl__tp_proj *p, const dtl__tp_qneed *need,
                                   int n, bool fp8, bool bias_sharded, const void *bias, const dtl__tp_rows *bias_ranges,
                                   int nbias);
/* The logical rows of a 2-D quantized sub-weight; -1 when w, its layout or its shape is not that. */
int64_t dtl__tp_qweight_rows(const dtl_tp_qweight *w);
/* The scratch a forward of tokens tokens through p takes (none for a dense projection), before its agreement. */
dtl_status dtl__tp_proj_reserve(dtl_tp_context *ctx, const dtl__tp_proj *p, int64_t tokens);
/* The quantized half of dtl__tp_proj_apply (after the bias seed): y[T, rows] (+)= x * dequantize(W)^T. */
dtl_status dtl__tp_qproj_apply(dtl_tp_context *ctx, const dtl__tp_proj *p, float beta, int64_t tokens, const void *x,
                               int64_t ldx, void *y, int64_t ldy);
void dtl__tp_qproj_fini(dtl_tp_context *ctx, dtl__tp_proj *p);
/* The quantized-weights checks every layer's params get: DTL_TP_FP8_GEMM only with quant, and with quant the
 * dense weight pointers (names a and b; b may be NULL) NULL. */
dtl_status dtl__tp_check_quant(const char *fn, bool quant, uint64_t flags, const char *a, const void *pa, const char *b,
                               const void *pb);
/* Whether a params struct with mask has quantized weights. */
#define DTL__TP_QUANT(mask) (((mask) & DTL_TP_QUANT_WEIGHTS) != 0)
/* y[T, rows] (leading dim ldy) = x[T, cols] (leading dim ldx) * w^T (+ bias when with_bias). */
dtl_status dtl__tp_proj_apply(dtl_tp_context *ctx, const dtl__tp_proj *p, bool with_bias, int64_t tokens, const void *x,
                              int64_t ldx, void *y, int64_t ldy);

/* Packs the given row ranges of a row-major [*, ld] array, columns [col_off, col_off + cols), into dst. */
dtl_status dtl__tp_pack_rows(const dtl_tp_context *ctx, const void *src, int64_t src_rows, int64_t ld,
                             const dtl__tp_rows *ranges, int nranges, int64_t col_off, int64_t cols, void *dst);

/* Communication cores, called after the caller's checks, allocations and agreement (their collectives do
 * not agree again). tokens x features activations in ctx memory. */
dtl_status dtl__tp_reduce(dtl_tp_context *ctx, int64_t tokens, int64_t features, bool sequence_parallel,
                          const void *partial, const void *bias, void *y);
dtl_status dtl__tp_gather_columns(dtl_tp_context *ctx, int64_t tokens, int64_t features, const void *y_local, void *y);
dtl_status dtl__tp_gather_tokens(dtl_tp_context *ctx, int64_t tokens, int64_t features, const void *x_local, void *x);
/* The FP8 token gather (gather_fp8.c), in the same two halves as a layer's input: the check half takes the
 * DTL__TP_WS_FP8 scratch and quantizes this rank's rows of x_local into it (on the host a NaN or an infinity is
 * DTL_ERR_INVALID_ARGUMENT naming its global row, fn first), before the agreement; the gather half all-gathers the
 * packed rows and dequantizes all of them into x. */
dtl_status dtl__tp_fp8_gather_check(dtl_tp_context *ctx, const char *fn, int64_t tokens, int64_t features,
                                    const void *x_local);
dtl_status dtl__tp_fp8_gather(dtl_tp_context *ctx, int64_t tokens, int64_t features, void *x);
/* The staging bytes dtl__tp_gather_columns takes from DTL__TP_WS_COMM (0: none). */
size_t dtl__tp_gather_columns_bytes(const dtl_tp_context *ctx, int64_t tokens, int64_t features);

/* The input of a layer, in two halves around the agreement. The check: x_layout ([T, features] with on_tp
 * on the TP dim) and x, and with sequence parallelism (on_tp = S(0)) the scratch of the gathered input (with
 * DTL_TP_FP8_GATHER also dtl__tp_fp8_gather_check); *tokens gets T. The gather: *xin gets the whole
 * [T, features], all-gathered into that scratch under S(0). */
dtl_status dtl__tp_input_check(dtl_tp_context *ctx, const char *fn, const dtl_layout *x_layout, int64_t features,
                               dtl_placement on_tp, const void *x, int64_t *tokens);
dtl_status dtl__tp_input(dtl_tp_context *ctx, int64_t features, dtl_placement on_tp, const void *x, int64_t tokens,
                         const void **xin);

/* Every collective entry point of the TP layers (creation and forwards, on the TP group; a context on the
 * whole mesh) checks all its arguments and takes all its scratch before its first collective, then agrees:
 * creation always (dtl__agree), a forward or half under DTL_CHECK. This is the fingerprint of such a call:
 * fn, the context (mesh, TP dim, dtype) and the n values v[0..n) of the call, each mixed alone (no value packs
 * two arguments, so none can make up for another). DTL__TP_FP(ctx, fn, a, b, ...) spells the list. */
uint64_t dtl__tp_fp(const dtl_tp_context *ctx, const char *fn, int n, const int64_t *v);
#define DTL__TP_FP(ctx, fn, ...)                                                                                \
  dtl__tp_fp((ctx), (fn), (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), \
             (const int64_t[]){__VA_ARGS__})

/* The layouts a layer states: [tokens, features] with on_tp on the TP dim. */
dtl_status dtl__tp_layout(const dtl_tp_context *ctx, int64_t tokens, int64_t features, dtl_placement on_tp,
                          dtl_layout **out);
/* The layouts of a layer that are asked for (in, out: optional outputs; on failure nothing is returned). */
dtl_status dtl__tp_layouts(const dtl_tp_context *ctx, const char *fn, int64_t tokens, int64_t in_features,
                           dtl_placement in_p, int64_t out_features, dtl_placement out_p, dtl_layout **in,
                           dtl_layout **out);

#endif

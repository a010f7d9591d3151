/* SPDX-License-Identifier: Apache-2.0 */
/* The tensor-parallel context: the mesh dim that forms the TP group, its communicator and compute engine,
 * the scratch that all layers of the context share, and the activation layouts and their check. */
#include <stdlib.h>
#include <string.h>
#include "comm/agree.h"
#include "tp/tp_internal.h"

dtl_status dtl__tp_check_bits(const char *fn, const char *what, uint64_t mask, uint64_t mask_known,
                              const char *mask_names, uint64_t flags, uint64_t flags_known, const char *flags_names) {
  char field[32];
  snprintf(field, sizeof field, "%s.mask", what);
  DTL_TRY(dtl__check_bits(fn, field, mask, mask_known, mask_names));
  snprintf(field, sizeof field, "%s.flags", what);
  return dtl__check_bits(fn, field, flags, flags_known, flags_names);
}

/* This rank's context: the checks and allocations of dtl_tp_context_create, before its agreement. */
static dtl_status dtl__tp_context_build(const dtl_mesh *mesh, int tp_dim, const dtl_tp_options *opt,
                                        dtl_tp_context **out) {
  static const char fn[] = "dtl_tp_context_create";
  DTL_CHECK_ARG(tp_dim >= 0 && tp_dim < mesh->ndim, fn, "tp_dim=%d (expected 0..%d)", tp_dim, mesh->ndim - 1);
  if (opt)
    DTL_TRY(dtl__tp_check_bits(fn, "opt", opt->mask, DTL__BITS(DTL_TP_OPT_DTYPE), opt->flags,
                               DTL__BITS(DTL_TP_FP8_GATHER)));
  dtl_dtype t = (opt && (opt->mask & DTL_TP_OPT_DTYPE)) ? opt->dtype : DTL_FLOAT32;
  DTL_CHECK_ARG(t == DTL_FLOAT32 || t == DTL_FLOAT16 || t == DTL_BFLOAT16, fn, "dtype=%s (expected f32, f16 or bf16)",
                dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
  dtl_tp_context *c = dtl__calloc(1, sizeof *c);
  size_t *counts = dtl__calloc((size_t)mesh->shape[tp_dim], sizeof *counts);
  if (!c || !counts) {
    dtl__free(c);
    dtl__free(counts);
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  }
  c->mesh = mesh;
  c->tp_dim = tp_dim;
  c->size = mesh->shape[tp_dim];
  c->rank = mesh->coord[tp_dim];
  c->comm = mesh->dim_comm[tp_dim];
  c->dtype = t;
  c->elem = dtl_dtype_size(t);
  c->fp8_gather = opt && (opt->flags & DTL_TP_FP8_GATHER);
  c->counts = counts;
  dtl_status st = dtl__gemm_engine_for_mem(&c->gemm, &c->comm->mem);
  if (st != DTL_OK) {
    dtl_tp_context_destroy(c);
    return dtl__error_prefix(st, "%s", fn);
  }
  *out = c;
  return DTL_OK;
}

dtl_status dtl_tp_context_create(const dtl_mesh *mesh, int tp_dim, const dtl_tp_options *opt, dtl_tp_context **out) {
  static const char fn[] = "dtl_tp_context_create";
  DTL_CHECK_ARG(mesh != NULL, fn, "mesh=NULL");
  DTL_CHECK_ARG(!dtl_mesh_is_abstract(mesh), fn, "mesh is abstract (it has no communicators to run layers on)");
  DTL_CHECK_ARG(dtl_mesh_is_member(mesh), fn,
                "this rank is outside the mesh (dtl_mesh_create_from_ranks): only its members make contexts on it");
  /* The whole mesh agrees (not only the TP group), since tp_dim itself names the group. */
  /* out is the caller's; the build writes the context into c, so out is checked here, and a rank whose out is
   * NULL still brings its verdict to the agreement. */
  dtl_tp_context *c = NULL;
  dtl_status st = out ? dtl__tp_context_build(mesh, tp_dim, opt, &c)
                      : dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "out=NULL");
  st = dtl__agree(mesh->comm, fn, st == DTL_OK ? DTL__TP_FP(c, fn, c->fp8_gather) : 0, st);
  if (st != DTL_OK) {
    dtl_tp_context_destroy(c);
    return st;
  }
  /* Every layer communicates over the TP dim, so a TP group across nodes pays the slow link in every layer. */
  if (mesh->dim_inter[tp_dim])
    DTL_LOG(DTL_LOG_WARN, "tp", "%s: tp_dim=%d crosses nodes (some TP group holds ranks of two nodes), so every "
            "layer's collectives go between nodes; put TP on a mesh dim within a node", fn, tp_dim);
  *out = c;
  return DTL_OK;
}

int dtl_tp_context_size(const dtl_tp_context *ctx) { return ctx ? ctx->size : -1; }
int dtl_tp_context_rank(const dtl_tp_context *ctx) { return ctx ? ctx->rank : -1; }
const dtl_mesh *dtl_tp_context_mesh(const dtl_tp_context *ctx) { return ctx ? ctx->mesh : NULL; }
dtl_comm *dtl_tp_context_comm(const dtl_tp_context *ctx) { return ctx ? ctx->comm : NULL; }

void dtl_tp_context_destroy(dtl_tp_context *ctx) {
  if (!ctx) return;
  for (int s = 0; s < DTL__TP_WS_COUNT; s++)
    if (ctx->ws[s]) dtl__mem_free(&ctx->comm->mem, ctx->ws[s]);
  dtl__gemm_engine_fini(&ctx->gemm);
  dtl__free(ctx->host_ws);
  dtl__free(ctx->counts);
  dtl__free(ctx);
}

dtl_status dtl__tp_scratch(dtl_tp_context *ctx, dtl__tp_ws slot, size_t bytes, void **out) {
  if (bytes <= ctx->ws_bytes[slot] && ctx->ws[slot]) {
    *out = ctx->ws[slot];
    return DTL_OK;
  }
  if (ctx->ws[slot]) dtl__mem_free(&ctx->comm->mem, ctx->ws[slot]);
  ctx->ws[slot] = NULL;
  ctx->ws_bytes[slot] = 0;
  size_t want = bytes ? bytes : 1;
  DTL_TRY(dtl__mem_alloc(&ctx->comm->mem, want, &ctx->ws[slot]));
  ctx->ws_bytes[slot] = want;
  *out = ctx->ws[slot];
  return DTL_OK;
}

dtl_status dtl__tp_host_scratch(dtl_tp_context *ctx, size_t bytes, void **out) {
  if (bytes > ctx->host_ws_bytes || !ctx->host_ws) {
    size_t want = bytes ? bytes : 1;
    void *p = dtl__malloc(want);
    if (!p) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl__tp_host_scratch: %zu bytes of host memory", want);
    dtl__free(ctx->host_ws);
    ctx->host_ws = p;
    ctx->host_ws_bytes = want;
  }
  *out = ctx->host_ws;
  return DTL_OK;
}

dtl_status dtl__tp_count(const char *fn, const char *what, int64_t a, int64_t b, size_t *out) {
  int64_t n;
  if (a < 0 || b < 0 || !dtl__mul_i64(a, b, &n) || (uint64_t)n > SIZE_MAX / 8)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s: %lld x %lld elements (negative or overflowing)", what,
                         (long long)a, (long long)b);
  *out = (size_t)n;
  return DTL_OK;
}

dtl_status dtl__tp_check_compute(const dtl_tp_context *ctx, const char *fn) {
  if (dtl__tp_on_device(ctx)) return DTL_OK; /* the context accepts only f32, f16 and bf16 */
  if (ctx->dtype != DTL_FLOAT32)
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "context dtype %s: the host layers compute in f32",
                         dtl_dtype_name(ctx->dtype));
  return DTL_OK;
}

dtl_tp_range dtl__tp_chunk(const dtl_tp_context *ctx, int64_t n, int r) {
  dtl_tp_range out;
  dtl__chunk(n, ctx->size, r, &out.offset, &out.count);
  return out;
}

static void dtl__tp_placements(const dtl_tp_context *ctx, dtl_placement on_tp, dtl_placement *p) {
  for (int md = 0; md < ctx->mesh->ndim; md++) p[md] = md == ctx->tp_dim ? on_tp : dtl_replicate();
}

dtl_status dtl__tp_layout(const dtl_tp_context *ctx, int64_t tokens, int64_t features, dtl_placement on_tp,
                          dtl_layout **out) {
  dtl_placement p[DTL_MAX_MESH_DIMS];
  dtl__tp_placements(ctx, on_tp, p);
  int64_t shape[2] = {tokens, features};
  return dtl_layout_create(ctx->mesh, ctx->dtype, 2, shape, p, out);
}

dtl_status dtl_tp_activation_layout(const dtl_tp_context *ctx, int64_t tokens, int64_t features, dtl_placement on_tp,
                                    dtl_layout **out) {
  static const char fn[] = "dtl_tp_activation_layout";
  DTL_CHECK_ARG(ctx != NULL, fn, "ctx=NULL");
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_CHECK_ARG(on_tp.kind != DTL_PARTIAL || on_tp.op == DTL_SUM, fn, "on_tp=P(%s) (only P(sum) occurs in TP layers)",
                dtl_reduce_op_name(on_tp.op) ? dtl_reduce_op_name(on_tp.op) : "?");
  dtl_status st = dtl__tp_layout(ctx, tokens, features, on_tp, out);
  return st == DTL_OK ? st : dtl__error_prefix(st, "%s", fn);
}

dtl_status dtl__tp_layouts(const dtl_tp_context *ctx, const char *fn, int64_t tokens, int64_t in_features,
                           dtl_placement in_p, int64_t out_features, dtl_placement out_p, dtl_layout **in,
                           dtl_layout **out) {
  DTL_CHECK_ARG(tokens >= 0, fn, "tokens=%lld (expected >= 0)", (long long)tokens);
  dtl_layout *a = NULL, *b = NULL;
  dtl_status st = DTL_OK;
  if (in) DTL_TRY_GOTO(dtl__tp_layout(ctx, tokens, in_features, in_p, &a), st, fail);
  if (out) DTL_TRY_GOTO(dtl__tp_layout(ctx, tokens, out_features, out_p, &b), st, fail);
  if (in) *in = a;
  if (out) *out = b;
  return DTL_OK;
fail:
  dtl_layout_destroy(a);
  return dtl__error_prefix(st, "%s", fn);
}

/* "[7,6] S(0),R f32" */
static void dtl__tp_describe(const dtl_mesh *m, const int64_t *shape, int ndim, const dtl_placement *p, dtl_dtype t,
                             char *buf, size_t cap) {
  char pl[128] = "?";
  dtl_placements_format(p, m->ndim, pl, sizeof pl);
  int o = snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && o > 0 && (size_t)o < cap; d++)
    o += snprintf(buf + o, cap - (size_t)o, d ? ",%lld" : "%lld", (long long)shape[d]);
  if (o > 0 && (size_t)o < cap) snprintf(buf + o, cap - (size_t)o, "] %s %s", pl, dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
}

dtl_status dtl__tp_check_layout(const dtl_tp_context *ctx, const char *fn, const char *what, const dtl_layout *l,
                                int64_t features, dtl_placement on_tp, int64_t *tokens) {
  DTL_CHECK_ARG(l != NULL, fn, "%s=NULL", what);
  if (l->mesh != ctx->mesh)
    return dtl__error_fn(DTL_ERR_MISMATCH, fn, "%s is on another mesh than the TP context", what);
  dtl_placement want[DTL_MAX_MESH_DIMS];
  dtl__tp_placements(ctx, on_tp, want);
  bool ok = l->dtype == ctx->dtype && l->ndim == 2 && l->shape[1] == features;
  for (int md = 0; ok && md < ctx->mesh->ndim; md++) {
    dtl_placement a = l->placements[md], b = want[md];
    ok = a.kind == b.kind && (a.kind != DTL_SHARD || a.dim == b.dim) && (a.kind != DTL_PARTIAL || a.op == b.op);
  }
  if (!ok) {
    char got[256], exp[256];
    dtl__tp_describe(l->mesh, l->shape, l->ndim, l->placements, l->dtype, got, sizeof got);
    int64_t shape[2] = {l->ndim >= 1 ? l->shape[0] : 0, features};
    dtl__tp_describe(ctx->mesh, shape, 2, want, ctx->dtype, exp, sizeof exp);
    return dtl__error_fn(DTL_ERR_MISMATCH, fn, "%s is %s but this takes %s (TP mesh dim %d)", what, got, exp,
                         ctx->tp_dim);
  }
  *tokens = l->shape[0];
  return DTL_OK;
}

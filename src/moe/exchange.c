/* SPDX-License-Identifier: Apache-2.0 */
/* Dispatch and combine: replay a layout's maps around the transport's all-to-all-v. On the host the row moves
 * are copies of runs of rows; on a device each row move of a pack or regroup is one gather launch (gather.cu)
 * from a map uploaded at creation, and combine's weighted sum has its device twin (combine.cu). Nothing here
 * allocates: every buffer and map was sized when the layout was created. */
#include <stdlib.h>
#include <string.h>
#include "common/half.h"
#include "comm/agree.h"
#include "moe/moe_internal.h"

static char *dtl__row(const void *base, int64_t row, size_t row_bytes) {
  return base ? (char *)base + (size_t)row * row_bytes : NULL;
}

/* Runs on every rank before any row moves, with verify (the layout's default) or DTL_CHECK on count_comm:
 * each rank's verdict on its own arguments and the layout id go through one agreement on the host count_comm,
 * so a bad argument or a stale layout on one rank fails every rank instead of leaving the others in an
 * all-to-all that never completes. Without either, a rank with bad arguments returns at once. */
dtl_status dtl__moe_agree(dtl_moe_layout *L, const char *fn, dtl_status local) {
  if (!L->verify && !L->count_comm->check) return local;
  return dtl__agree(L->count_comm, fn, (uint64_t)L->id, local);
}

dtl_status dtl__moe_check_buffers(const char *fn, const dtl_moe_layout *L, const void *tokens_buf,
                                  const char *tokens_name, const void *expert_buf, const char *expert_name) {
  if (!tokens_buf && L->tokens > 0)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=NULL with %lld tokens", tokens_name, (long long)L->tokens);
  if (!expert_buf && L->expert_rows > 0)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=NULL with %lld expert rows", expert_name,
                         (long long)L->expert_rows);
  if (tokens_buf && tokens_buf == expert_buf)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s and %s are the same buffer", tokens_name, expert_name);
  return DTL_OK;
}

dtl_status dtl__moe_move(const dtl_moe_layout *L, size_t rb, const dtl__moe_run *runs, int64_t nruns,
                         const dtl__moe_rowmap *dev, bool reverse, const void *src, void *lo, void *hi, int64_t split) {
  dtl_comm *c = L->comm;
  if (c->mem.ops->memory == DTL_MEMORY_DEVICE) {
#if DTL_HAVE_NCCL
    dtl__moe_rowmap m = *dev;
    if (reverse) {
      m.src = dev->dst;
      m.dst = dev->src;
    }
    return dtl__moe_gather_rows_cuda(&c->mem, &m, src, lo, hi, rb);
#else
    (void)dev;
    return dtl__error(DTL_ERR_UNSUPPORTED, "device memory needs a CUDA build of dtl");
#endif
  }
  for (int64_t i = 0; i < nruns; i++) {
    int64_t from = reverse ? runs[i].dst : runs[i].src, to = reverse ? runs[i].src : runs[i].dst;
    char *dst = to < split ? dtl__row(lo, to, rb) : dtl__row(hi, to - split, rb);
    DTL_TRY(dtl__mem_copy(&c->mem, dst, dtl__row(src, from, rb), (size_t)runs[i].n * rb));
  }
  return DTL_OK;
}

dtl_status dtl_moe_layout_dispatch(dtl_moe_layout *L, const void *x, void *expert_in) {
  static const char fn[] = "dtl_moe_layout_dispatch";
  DTL_CHECK_ARG(L != NULL, fn, "layout=NULL");
  if (L->fp8) return dtl__moe_dispatch_fp8(L, fn, x, false, expert_in, NULL, NULL);
  DTL_TRY(dtl__moe_agree(L, fn, dtl__moe_check_buffers(fn, L, x, "x", expert_in, "expert_in")));
  dtl_comm *c = L->comm;
  const size_t rb = L->row_bytes;
  /* Padding rows are zero (the device pack map zeroes them in its one launch). */
  if (c->mem.ops->memory == DTL_MEMORY_HOST)
    for (int j = 0; j < L->local_experts; j++) {
      int64_t pad = L->block_padded[j] - L->block_rows[j];
      if (pad > 0) memset(dtl__row(expert_in, L->block_off[j] + L->block_rows[j], rb), 0, (size_t)pad * rb);
    }
  /* The pack writes straight into the final order: remote rows into the send staging, this rank's own
   * rows into their expert block (they never pass through the all-to-all). */
  DTL_TRY(dtl__moe_move(L, rb, L->pack, L->npack, &L->dev_pack, false, x, L->send_buf, expert_in, L->send_rows));
  bool staged = L->exchange == DTL_MOE_EXCHANGE_SINGLE;
  void *region = staged ? L->recv_buf : expert_in;
  for (int i = 0; i < L->calls; i++)
    DTL_TRY(dtl__all_to_allv_agreed(c, dtl__row(L->send_buf, L->send_base[i], rb), L->send_counts + (size_t)i * L->size,
                            dtl__row(region, L->recv_base[i], rb), L->recv_counts + (size_t)i * L->size, L->dtype));
  return dtl__moe_move(L, rb, L->regroup, L->nregroup, &L->dev_regroup, false, L->recv_buf, NULL, expert_in, 0);
}

/* out[h] = w[0] * in[0][h] + w[1] * in[1][h] + ... in slot order, products and sums rounded one at a time, in
 * one pass over the token's rows. The f32 kernel is the combine's hot loop: -O2 does not vectorize it
 * (unknown trip count), so it runs 8 lanes at a time in vector types, every lane with the scalar tail's
 * arithmetic (results do not depend on H or on the clone), and x86-64 also gets an AVX2 clone (no FMA, so
 * the rounding stays that of the scalar code). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define DTL__CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DTL__CLONES
#endif
DTL__CLONES
static void dtl__weighted_sum_f32(float *restrict out, const float *const *in, const float *w, int n, int64_t H) {
  int64_t h = 0;
#if defined(__GNUC__)
  typedef float v8f __attribute__((vector_size(32)));
  for (; h + 8 <= H; h += 8) {
    v8f a, x, wv;
    memcpy(&x, in[0] + h, sizeof x);
    wv = (v8f){w[0], w[0], w[0], w[0], w[0], w[0], w[0], w[0]};
    a = wv * x;
    for (int s = 1; s < n; s++) {
      memcpy(&x, in[s] + h, sizeof x);
      wv = (v8f){w[s], w[s], w[s], w[s], w[s], w[s], w[s], w[s]};
      a += wv * x;
    }
    memcpy(out + h, &a, sizeof a);
  }
#endif
  for (; h < H; h++) {
    float a = w[0] * in[0][h];
    for (int s = 1; s < n; s++) a += w[s] * in[s][h];
    out[h] = a;
  }
}

/* The same sum for the other dtypes, element by element: ACC is the accumulator type, TO/FROM convert. */
#define DTL__WEIGHTED_SUM(T, ACC, TO, FROM)                                     \
  do {                                                                          \
    const T *const *in_ = (const T *const *)in;                                 \
    T *out_ = (T *)out;                                                         \
    for (int64_t h = 0; h < H; h++) {                                           \
      ACC a = (ACC)w[0] * TO(in_[0][h]);                                        \
      for (int s = 1; s < n; s++) a += (ACC)w[s] * TO(in_[s][h]);               \
      out_[h] = FROM(a);                                                        \
    }                                                                           \
  } while (0)
#define DTL__AS_IS(v) (v)

static void dtl__combine_host(const dtl_moe_layout *L, const void *expert_out, void *y) {
  const int64_t H = L->hidden;
  const int k = L->k;
  const size_t rb = L->row_bytes;
  const void **in = L->combine_in;
  float *w = L->combine_w;
  for (int64_t t = 0; t < L->tokens; t++) {
    int n = 0;
    for (int s = 0; s < k; s++) { /* this token's kept slots, in slot order */
      int64_t r = L->slot_row[t * k + s];
      if (r < 0) continue;
      in[n] = r < L->send_rows ? dtl__row(L->send_buf, r, rb) : dtl__row(expert_out, r - L->send_rows, rb);
      w[n++] = L->weights[t * k + s];
    }
    void *out = dtl__row(y, t, rb);
    if (n == 0) {
      memset(out, 0, rb); /* +0 in every floating dtype */
      continue;
    }
    switch (L->dtype) {
      case DTL_FLOAT32: dtl__weighted_sum_f32(out, (const float *const *)in, w, n, H); break;
      case DTL_FLOAT64: DTL__WEIGHTED_SUM(double, double, DTL__AS_IS, DTL__AS_IS); break;
      case DTL_FLOAT16: DTL__WEIGHTED_SUM(uint16_t, float, dtl__f16_to_f32, dtl__f32_to_f16); break;
      default: DTL__WEIGHTED_SUM(uint16_t, float, dtl__bf16_to_f32, dtl__f32_to_bf16); break;
    }
  }
}

dtl_status dtl_moe_layout_combine(dtl_moe_layout *L, const void *expert_out, void *y) {
  static const char fn[] = "dtl_moe_layout_combine";
  DTL_CHECK_ARG(L != NULL, fn, "layout=NULL");
  dtl_status local = dtl__moe_check_buffers(fn, L, y, "y", expert_out, "expert_out");
  if (local == DTL_OK && (!dtl__dtype_is_float(L->dtype) || dtl__dtype_is_fp8(L->dtype)))
    local = dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "dtype=%s (combine's weighted sum needs f32, f64, f16 or bf16)",
                          dtl_dtype_name(L->dtype));
  DTL_TRY(dtl__moe_agree(L, fn, local));
  dtl_comm *c = L->comm;
  const size_t rb = L->row_bytes;
  bool staged = L->exchange == DTL_MOE_EXCHANGE_SINGLE;
  DTL_TRY(dtl__moe_move(L, rb, L->regroup, L->nregroup, &L->dev_regroup, true, expert_out, NULL, L->recv_buf, 0));
  const void *region = staged ? L->recv_buf : expert_out;
  for (int i = 0; i < L->calls; i++)
    DTL_TRY(dtl__all_to_allv_agreed(c, dtl__row(region, L->recv_base[i], rb), L->recv_counts + (size_t)i * L->size,
                            dtl__row(L->send_buf, L->send_base[i], rb), L->send_counts + (size_t)i * L->size,
                            L->dtype));
  if (c->mem.ops->memory == DTL_MEMORY_DEVICE) {
#if DTL_HAVE_NCCL
    return dtl__moe_combine_device(L, expert_out, y);
#else
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "device memory needs a CUDA build of dtl");
#endif
  }
  dtl__combine_host(L, expert_out, y);
  return DTL_OK;
}

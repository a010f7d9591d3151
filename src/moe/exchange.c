/* SPDX-License-Identifier: Apache-2.0 */
/* Dispatch and combine: replay a layout's maps with the transport's copies and all-to-all-v, so that the same
 * code serves host (MPI) and device (NCCL) rows; only combine's weighted sum has a device twin (combine.cu). */
#include <stdlib.h>
#include <string.h>
#include "common/half.h"
#include "moe/moe_internal.h"

static char *dtl__row(const void *base, int64_t row, size_t row_bytes) {
  return base ? (char *)base + (size_t)row * row_bytes : NULL;
}

/* Runs on every rank before any row moves. Each rank's verdict on its own arguments travels with the layout
 * id through one all-reduce, so a bad argument or a stale layout on one rank fails every rank instead of
 * leaving the others in an all-to-all that never completes. Without verify, a rank with bad arguments
 * returns at once. */
static dtl_status dtl__moe_agree(dtl_moe_layout *L, const char *fn, dtl_status local) {
  if (!L->verify || L->size == 1) return local;
  int64_t a[3] = {L->id, -L->id, local == DTL_OK ? -(int64_t)L->size : -(int64_t)L->rank}, g[3];
  DTL_TRY(dtl_all_reduce(L->count_comm, a, g, 3, DTL_INT64, DTL_MAX));
  if (local != DTL_OK) return local;
  if (g[2] != -(int64_t)L->size)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "rank %lld rejected its arguments (see its dtl_last_error)",
                         (long long)-g[2]);
  if (g[0] != L->id || g[1] != -L->id)
    return dtl__error_fn(DTL_ERR_MISMATCH, fn,
                         "ranks passed layouts from different dtl_moe_layout_create calls (this rank's id %lld, "
                         "ids range over %lld..%lld): their counts need not match", (long long)L->id,
                         (long long)-g[1], (long long)g[0]);
  return DTL_OK;
}

static dtl_status dtl__check_buffers(const char *fn, const dtl_moe_layout *L, const void *tokens_buf,
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

dtl_status dtl_moe_layout_dispatch(dtl_moe_layout *L, const void *x, void *expert_in) {
  static const char fn[] = "dtl_moe_layout_dispatch";
  DTL_CHECK_ARG(L != NULL, fn, "layout=NULL");
  DTL_TRY(dtl__moe_agree(L, fn, dtl__check_buffers(fn, L, x, "x", expert_in, "expert_in")));
  dtl_comm *c = L->comm;
  const size_t rb = L->row_bytes;
  for (int j = 0; j < L->local_experts; j++) {
    int64_t pad = L->block_padded[j] - L->block_rows[j];
    if (pad > 0)
      DTL_TRY(c->ops->mem_set(c, dtl__row(expert_in, L->block_off[j] + L->block_rows[j], rb), 0, (size_t)pad * rb));
  }
  /* The pack writes straight into the final order: remote rows into the send staging, this rank's own
   * rows into their expert block (they never pass through the all-to-all). */
  for (int64_t i = 0; i < L->npack; i++) {
    const dtl__moe_run *r = &L->pack[i];
    char *dst = r->dst < L->send_rows ? dtl__row(L->send_buf, r->dst, rb)
                                      : dtl__row(expert_in, r->dst - L->send_rows, rb);
    DTL_TRY(c->ops->mem_copy(c, dst, dtl__row(x, r->src, rb), (size_t)r->n * rb));
  }
  bool staged = L->exchange == DTL_MOE_EXCHANGE_SINGLE;
  void *region = staged ? L->recv_buf : expert_in;
  for (int i = 0; i < L->calls; i++)
    DTL_TRY(dtl_all_to_allv(c, dtl__row(L->send_buf, L->send_base[i], rb), L->send_counts + (size_t)i * L->size,
                            dtl__row(region, L->recv_base[i], rb), L->recv_counts + (size_t)i * L->size, L->dtype));
  for (int64_t i = 0; i < L->nregroup; i++) {
    const dtl__moe_run *r = &L->regroup[i];
    DTL_TRY(c->ops->mem_copy(c, dtl__row(expert_in, r->dst, rb), dtl__row(L->recv_buf, r->src, rb), (size_t)r->n * rb));
  }
  return DTL_OK;
}

/* acc[0..n) = w * in[0..n) (first slot) or acc += w * in. The f32 path of combine is bound by this loop, which
 * -O2 does not vectorize (unknown trip count), so it is written with 8-lane vector types; every lane does
 * the scalar tail's arithmetic, so results do not depend on H. */
#if defined(__GNUC__)
typedef float dtl__v8f __attribute__((vector_size(32)));
#endif
static void dtl__scale_add_f32(float *restrict acc, const float *restrict in, float w, int64_t n, bool first) {
  int64_t h = 0;
#if defined(__GNUC__)
  const dtl__v8f wv = {w, w, w, w, w, w, w, w};
  dtl__v8f a, x;
  if (first)
    for (; h + 8 <= n; h += 8) {
      memcpy(&x, in + h, sizeof x);
      a = wv * x;
      memcpy(acc + h, &a, sizeof a);
    }
  else
    for (; h + 8 <= n; h += 8) {
      memcpy(&x, in + h, sizeof x);
      memcpy(&a, acc + h, sizeof a);
      a += wv * x;
      memcpy(acc + h, &a, sizeof a);
    }
#endif
  for (; h < n; h++) acc[h] = first ? w * in[h] : acc[h] + w * in[h];
}

/* One token at a time: acc = sum over its kept slots, in slot order, of weight * expert output row, then
 * FINISH stores acc into out. f32/f64 accumulate in the output row itself (FINISH empty); f16/bf16 in an f32
 * row converted once per token. ADD(acc, in, w, first) accumulates one slot. */
#define DTL__COMBINE(T, ACC, ACC_ROW, ADD, FINISH)                                                  \
  for (int64_t t = 0; t < L->tokens; t++) {                                                          \
    T *out = (T *)y + t * H;                                                                         \
    ACC *acc = (ACC_ROW);                                                                            \
    int used = 0;                                                                                    \
    for (int s = 0; s < k; s++) {                                                                    \
      int64_t r = L->slot_row[t * k + s];                                                            \
      if (r < 0) continue;                                                                           \
      const T *in = (const T *)(r < L->send_rows ? dtl__row(L->send_buf, r, rb)                      \
                                                 : dtl__row(expert_out, r - L->send_rows, rb));       \
      ADD(acc, in, (ACC)L->weights[t * k + s], used++ == 0);                                         \
    }                                                                                                \
    if (!used)                                                                                       \
      for (int64_t h = 0; h < H; h++) acc[h] = 0;                                                    \
    FINISH;                                                                                          \
  }
#define DTL__ADD_F32(acc, in, w, first) dtl__scale_add_f32(acc, in, w, H, first)
/* The other dtypes: the same arithmetic on one element at a time, converting 16-bit floats to f32 first. */
#define DTL__ADD_CONVERT(acc, in, w, first, TO)                                                \
  do {                                                                                          \
    const bool first_ = (first);                                                                \
    for (int64_t h = 0; h < H; h++) acc[h] = first_ ? (w) * TO(in[h]) : acc[h] + (w) * TO(in[h]); \
  } while (0)
#define DTL__ADD_F64(acc, in, w, first) DTL__ADD_CONVERT(acc, in, w, first, DTL__AS_IS)
#define DTL__ADD_F16(acc, in, w, first) DTL__ADD_CONVERT(acc, in, w, first, dtl__f16_to_f32)
#define DTL__ADD_BF16(acc, in, w, first) DTL__ADD_CONVERT(acc, in, w, first, dtl__bf16_to_f32)
#define DTL__AS_IS(v) (v)
#define DTL__STORE_ROW(STORE) \
  for (int64_t h = 0; h < H; h++) out[h] = STORE(acc[h])

static dtl_status dtl__combine_host(const dtl_moe_layout *L, const void *expert_out, void *y) {
  const int64_t H = L->hidden;
  const int k = L->k;
  const size_t rb = L->row_bytes;
  switch (L->dtype) {
    case DTL_FLOAT32: DTL__COMBINE(float, float, out, DTL__ADD_F32, (void)0) return DTL_OK;
    case DTL_FLOAT64: DTL__COMBINE(double, double, out, DTL__ADD_F64, (void)0) return DTL_OK;
    default: break;
  }
  float *row = malloc(sizeof(float) * (size_t)H);
  if (!row) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_moe_layout_combine: out of host memory");
  if (L->dtype == DTL_FLOAT16)
    DTL__COMBINE(uint16_t, float, row, DTL__ADD_F16, DTL__STORE_ROW(dtl__f32_to_f16))
  else
    DTL__COMBINE(uint16_t, float, row, DTL__ADD_BF16, DTL__STORE_ROW(dtl__f32_to_bf16))
  free(row);
  return DTL_OK;
}

dtl_status dtl_moe_layout_combine(dtl_moe_layout *L, const void *expert_out, void *y) {
  static const char fn[] = "dtl_moe_layout_combine";
  DTL_CHECK_ARG(L != NULL, fn, "layout=NULL");
  dtl_status local = dtl__check_buffers(fn, L, y, "y", expert_out, "expert_out");
  if (local == DTL_OK && !dtl__dtype_is_float(L->dtype))
    local = dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "dtype=%s (combine's weighted sum needs f32, f64, f16 or bf16)",
                          dtl_dtype_name(L->dtype));
  DTL_TRY(dtl__moe_agree(L, fn, local));
  dtl_comm *c = L->comm;
  const size_t rb = L->row_bytes;
  bool staged = L->exchange == DTL_MOE_EXCHANGE_SINGLE;
  for (int64_t i = 0; i < L->nregroup; i++) {
    const dtl__moe_run *r = &L->regroup[i];
    DTL_TRY(c->ops->mem_copy(c, dtl__row(L->recv_buf, r->src, rb), dtl__row(expert_out, r->dst, rb), (size_t)r->n * rb));
  }
  const void *region = staged ? L->recv_buf : expert_out;
  for (int i = 0; i < L->calls; i++)
    DTL_TRY(dtl_all_to_allv(c, dtl__row(region, L->recv_base[i], rb), L->recv_counts + (size_t)i * L->size,
                            dtl__row(L->send_buf, L->send_base[i], rb), L->send_counts + (size_t)i * L->size,
                            L->dtype));
  if (c->ops->memory == DTL_MEMORY_DEVICE) {
#if DTL_HAVE_NCCL
    return dtl__moe_combine_device(L, expert_out, y);
#else
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "device memory needs a CUDA build of dtl");
#endif
  }
  return dtl__combine_host(L, expert_out, y);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* FP8 dispatch (moe.h): x quantized once per token into the layout's packed FP8 rows (quant/act_fp8.h), then the
 * plain dispatch's pack, all-to-all-v and regroup replayed on those rows, so that codes and scales travel in one
 * exchange, and the landing region dequantized into dtype rows or split into the codes and scales of an FP8 GEMM.
 * Nothing here allocates: every buffer was sized when the layout was created. */
#include <string.h>
#include "comm/agree.h"
#include "moe/moe_internal.h"
#include "quant/act_fp8.h"

static bool dtl__on_device(const dtl_moe_layout *L) { return L->comm->mem.ops->memory == DTL_MEMORY_DEVICE; }

/* x -> fp8_x, every token row. On the host a NaN or an infinity is this rank's verdict (naming the row). */
static dtl_status dtl__quantize_x(dtl_moe_layout *L, const char *fn, const void *x) {
  dtl__act_fp8_rows q = dtl__act_fp8_packed(L->fp8_x, L->tokens, L->hidden);
  if (dtl__on_device(L)) {
#if DTL_HAVE_NCCL
    return dtl__act_fp8_quantize_cuda(&L->comm->mem, x, L->dtype, L->hidden, &q);
#else
    return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "device memory needs a CUDA build of dtl");
#endif
  }
  return dtl__act_fp8_quantize(fn, x, L->dtype, L->hidden, 0, &q);
}

/* The landing region fp8_in -> expert_in (dtype rows), or with raw -> codes [rows, hidden] and scales
 * [rows, blocks]: two box copies out of the packed rows, on host and device alike. */
static dtl_status dtl__unpack(dtl_moe_layout *L, const char *fn, bool raw, void *expert_in, void *codes,
                              void *scales) {
  const int64_t R = L->expert_rows, H = L->hidden;
  dtl__act_fp8_rows q = dtl__act_fp8_packed(L->fp8_in, R, H);
  if (R == 0) return DTL_OK;
  if (!raw) {
    if (dtl__on_device(L)) {
#if DTL_HAVE_NCCL
      return dtl__act_fp8_dequantize_cuda(&L->comm->mem, &q, L->dtype, expert_in, H);
#else
      return dtl__error_fn(DTL_ERR_UNSUPPORTED, fn, "device memory needs a CUDA build of dtl");
#endif
    }
    return dtl__act_fp8_dequantize(&q, L->dtype, expert_in, H);
  }
  const int64_t rb = (int64_t)L->fp8_row_bytes, nb = dtl__act_fp8_blocks(H);
  dtl__box_copy b = {.ndim = 2, .elem_size = 1};
  b.extent[0] = b.src_shape[0] = b.dst_shape[0] = R;
  b.extent[1] = b.dst_shape[1] = H;
  b.src_shape[1] = rb;
  DTL_TRY(dtl__mem_copy_box(&L->comm->mem, L->fp8_in, codes, &b));
  b.elem_size = sizeof(float);
  b.extent[1] = b.dst_shape[1] = nb;
  b.src_shape[1] = rb / (int64_t)sizeof(float);
  b.src_off[1] = (int64_t)(dtl__act_fp8_codes_bytes(H) / sizeof(float));
  return dtl__mem_copy_box(&L->comm->mem, L->fp8_in, scales, &b);
}

dtl_status dtl__moe_dispatch_fp8(dtl_moe_layout *L, const char *fn, const void *x, bool raw, void *expert_in,
                                 void *codes, void *scales) {
  dtl_status local;
  if (!raw) {
    local = dtl__moe_check_buffers(fn, L, x, "x", expert_in, "expert_in");
  } else {
    local = dtl__moe_check_buffers(fn, L, x, "x", codes, "expert_codes");
    if (local == DTL_OK) local = dtl__moe_check_buffers(fn, L, x, "x", scales, "expert_scales");
    if (local == DTL_OK && codes && codes == scales)
      local = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "expert_codes and expert_scales are the same buffer");
  }
  if (local == DTL_OK && !L->fp8)
    local = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "the layout was made without DTL_MOE_LAYOUT_FP8_DISPATCH in "
                          "params.flags (it moves %s rows)", dtl_dtype_name(L->dtype));
  /* Before the agreement: a NaN in this rank's x then fails every rank, and nothing of the caller's is written. */
  if (local == DTL_OK) local = dtl__quantize_x(L, fn, x);
  DTL_TRY(dtl__moe_agree(L, fn, local));

  dtl_comm *c = L->comm;
  const size_t rb = L->fp8_row_bytes;
  /* Padding rows: zero codes and zero scales, so they dequantize to +0 (the device pack map zeroes them). */
  if (!dtl__on_device(L))
    for (int j = 0; j < L->local_experts; j++) {
      int64_t pad = L->block_padded[j] - L->block_rows[j];
      if (pad > 0) memset((char *)L->fp8_in + (size_t)(L->block_off[j] + L->block_rows[j]) * rb, 0, (size_t)pad * rb);
    }
  DTL_TRY(dtl__moe_move(L, rb, L->pack, L->npack, &L->dev_pack, false, L->fp8_x, L->send_buf, L->fp8_in,
                        L->send_rows));
  void *region = L->exchange == DTL_MOE_EXCHANGE_SINGLE ? L->recv_buf : L->fp8_in;
  for (int i = 0; i < L->calls; i++)
    DTL_TRY(dtl__all_to_allv_agreed(c, (char *)L->send_buf + (size_t)L->send_base[i] * rb,
                                    L->fp8_send_counts + (size_t)i * L->size,
                                    (char *)region + (size_t)L->recv_base[i] * rb,
                                    L->fp8_recv_counts + (size_t)i * L->size, DTL_UINT8));
  DTL_TRY(dtl__moe_move(L, rb, L->regroup, L->nregroup, &L->dev_regroup, false, L->recv_buf, NULL, L->fp8_in, 0));
  return dtl__unpack(L, fn, raw, expert_in, codes, scales);
}

dtl_status dtl_moe_layout_dispatch_fp8(dtl_moe_layout *L, const void *x, void *expert_codes, void *expert_scales) {
  static const char fn[] = "dtl_moe_layout_dispatch_fp8";
  DTL_CHECK_ARG(L != NULL, fn, "layout=NULL");
  return dtl__moe_dispatch_fp8(L, fn, x, true, NULL, expert_codes, expert_scales);
}

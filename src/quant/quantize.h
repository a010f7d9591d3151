/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. The host quantizers of the formats: a dense f32 box in, codes and scales (and zeros,
 * g_idx) of the same shard out, each block quantized from its own values only, so a shard's quantization is the
 * slice of the dense tensor's wherever every block it touches is whole in it. */
#ifndef DTL_QUANT_QUANTIZE_H
#define DTL_QUANT_QUANTIZE_H

#include "quant/dequant.h"

/* The largest finite FP8 values: the scale of a block is amax / max_finite. */
#define DTL__F8E4M3_MAX 448.0f
#define DTL__F8E5M2_MAX 57344.0f
/* A block whose amax is below this gets it instead (vLLM's eps of per_token_group_quant_fp8), so that an all-zero
 * block has a positive scale and codes 0. */
#define DTL__QUANT_FP8_EPS 1e-10f

/* Quantizes dense (f32, row-major over s's logical box) into parts (one buffer per part over s's part boxes; s's own
 * part pointers are not read). Checks first and writes nothing on failure: DTL_ERR_INVALID_ARGUMENT for a block the
 * box cuts ("fn: tensor dim d: the local box [lo, hi) cuts <block> ..."), a value of dense that is NaN or infinite,
 * or a scale its dtype cannot hold; DTL_ERR_UNSUPPORTED for Q4_K (ggml's make_qkx2_quants search is not ported). */
dtl_status dtl__qshard_quantize(const char *fn, const dtl__qshard *s, const float *dense, void *const *parts);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized tensors: a tensor stored as codes plus per-block scales (and zero points, and GPTQ's act-order group
 * index), described by a format and laid out on a mesh as one tensor. The logical tensor is the dequantized one,
 * [..., rows, cols] as a torch Linear weight is [out, in]; placements refer to its dims, and its shards are those of
 * the dense layout of the same shape (the torch.chunk rule), so a quantized layer's shard lines up with the
 * activations a dense layer's would. Each part (codes, scales, zeros, g_idx) is its own row-major tensor with its
 * own shape (below), and one call gives every part's local box:
 * - codes are cut where the logical shard is cut; a cut must fall on a packing unit (an int4 pair, an int32 of 8
 *   codes, a GGUF block), or dtl_qlayout_create refuses the layout, naming the tensor dim, the unit, the sizes and
 *   the degrees that would work;
 * - scales (and zeros) of a block that a cut splits go to both sides: each rank gets every scale block its codes
 *   touch. That is exact, since an element's scale depends only on its global block. A part dim that a cut does
 *   not divide (FP8_CHANNEL's trailing 1, FP8_TENSOR's scale over a cut matrix, act-order groups) is whole on
 *   every rank of the mesh.
 * Partial placements are refused (codes do not add). Byte layouts of every format: README, Quantized tensors. */
#ifndef DTL_QUANT_H
#define DTL_QUANT_H

#include "dtl/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Formats. R, C: the logical tensor's last two dims (rows = out, cols = in); L: its leading dims (experts, ...),
 * which every part carries unchanged in front. G = ceil(C / group), BR x BC: the FP8 block.
 *   kind                  codes                           scales                      zeros               g_idx
 *   FP8_BLOCK             f8 [L, R, C]                    f32 [L, ceil(R/BR), ceil(C/BC)] (weight_scale_inv)
 *   FP8_CHANNEL           f8 [L, R, C]                    f32 [L, R, 1]
 *   FP8_TENSOR            f8 [L, R, C]                    f32 [L] (a scalar for a matrix)
 *   GPTQ                  i32 [L, C/8, R] (qweight)       f16 [L, G, R]               i32 [L, G, R/8]     i32 [L, C]
 *   AWQ                   i32 [L, C, R/8] (qweight)       f16 [L, G, R]               i32 [L, G, R/8]
 *   GGUF_Q8_0 / Q4_0      u8 [L, R, C/32 * 34 or 18]      (in the blocks)
 *   GGUF_Q4_K             u8 [L, R, C/256 * 144]          (in the blocks)
 * Values: FP8 code * scale (FP8_BLOCK: the block's scale_inv, as DeepSeek-V3 stores it). GPTQ (4-bit, 8 codes per
 * int32, code k of a word in bits 4k..4k+3) and AWQ (AWQ's interleaved order: the nibbles of a word hold codes
 * 0, 2, 4, 6, 1, 3, 5, 7) dequantize to (code - zero) * scale, the group of input channel c being c / group (GPTQ
 * with DTL_QFMT_ACT_ORDER: g_idx[c]); GPTQ checkpoints store zero - 1 (GPTQ v1, as AutoGPTQ and vLLM's exllama kernels
 * read it: zero = stored nibble + 1, in 1..16, so a stored 15 reads as 16; gptqmodel's v2 stores the zero itself: add 1
 * to each nibble to get v1). compressed-tensors' pack-quantized is none of these (codes [R, C/8] packed along C and
 * offset by 8, scales [R, G], zeros [R/8, G]): convert it. GGUF: ggml's blocks, bit for bit (the gguf Python package's
 * quants module is the oracle). */
typedef enum {
  DTL_QUANT_FP8_BLOCK = 0,
  DTL_QUANT_FP8_CHANNEL = 1,
  DTL_QUANT_FP8_TENSOR = 2,
  DTL_QUANT_GPTQ = 3,
  DTL_QUANT_AWQ = 4,
  DTL_QUANT_GGUF_Q8_0 = 5,
  DTL_QUANT_GGUF_Q4_0 = 6,
  DTL_QUANT_GGUF_Q4_K = 7
} dtl_quant_kind;
#define DTL_QUANT_NUM_KINDS 8

/* The parts of a quantized tensor, indexes of dtl_qbuf.part and dtl_qbox.part. A format without a part gives it
 * ndim -1 and 0 bytes. */
typedef enum { DTL_QPART_CODES = 0, DTL_QPART_SCALES = 1, DTL_QPART_ZEROS = 2, DTL_QPART_GIDX = 3 } dtl_qpart;
#define DTL_QUANT_NUM_PARTS 4

/* A format. Fields are read only when their bit is in mask; a zeroed struct with kind set means the defaults:
 * FP8 blocks 128 x 128, group 128, codes DTL_FLOAT8_E4M3, scales f32 (FP8) or f16 (GPTQ, AWQ). flags:
 * DTL_QFMT_ACT_ORDER (GPTQ only): the checkpoint has g_idx, input channel c belongs to group g_idx[c]. The scales
 * and zeros of an act-order tensor are then whole on every rank (any row may use any group), only codes and g_idx
 * are cut. A bit outside those defined, a field that does not apply to the kind, or a bad value is
 * DTL_ERR_INVALID_ARGUMENT naming the field and its value. */
#define DTL_QFMT_BLOCK DTL_BIT(0)       /* block_rows, block_cols: FP8_BLOCK, >= 1 */
#define DTL_QFMT_GROUP DTL_BIT(1)       /* group: GPTQ and AWQ, >= 1, or -1: one group over all of C */
#define DTL_QFMT_CODE_DTYPE DTL_BIT(2)  /* code_dtype: FP8 kinds, DTL_FLOAT8_E4M3 or DTL_FLOAT8_E5M2 */
#define DTL_QFMT_SCALE_DTYPE DTL_BIT(3) /* scale_dtype: f32, f16 or bf16 (FP8, GPTQ, AWQ) */
#define DTL_QFMT_ACT_ORDER DTL_BIT(0)   /* flags */
typedef struct {
  uint64_t mask;
  uint64_t flags;
  dtl_quant_kind kind;
  int64_t block_rows, block_cols;
  int64_t group;
  dtl_dtype code_dtype, scale_dtype;
} dtl_quant_format;

/* "fp8-block", "fp8-channel", "fp8-tensor", "gptq", "awq", "q8_0", "q4_0", "q4_k"; NULL outside the enum. */
DTL_API const char *dtl_quant_kind_name(dtl_quant_kind k);
DTL_API dtl_status dtl_quant_kind_parse(const char *text, dtl_quant_kind *out);

typedef struct dtl_qlayout dtl_qlayout;

/* A quantized layout: mesh, format, the logical shape (ndim >= 2; GGUF kinds also 1) and one placement per mesh dim
 * (Shard or Replicate). A cut inside a packing unit, a Partial placement, or a shape the format cannot hold (C not a
 * multiple of 8 for GPTQ, of 32 or 256 for GGUF, R not a multiple of 8 for AWQ and GPTQ's zeros) is
 * DTL_ERR_INVALID_ARGUMENT with the numbers. Keeps a reference to m. */
DTL_API dtl_status dtl_qlayout_create(const dtl_mesh *m, const dtl_quant_format *fmt, int ndim, const int64_t *shape,
                                      const dtl_placement *placements, dtl_qlayout **out);
/* Same mesh, format and shape with other placements. */
DTL_API dtl_status dtl_qlayout_with_placements(const dtl_qlayout *l, const dtl_placement *placements, dtl_qlayout **out);

/* One part's piece on a rank: its dtype (GGUF codes: u8 bytes), the part's global shape, and the local box in it
 * (shape and offset, in the part's own elements), and the local bytes (row-major, contiguous). */
typedef struct {
  int ndim; /* -1: the format has no such part */
  dtl_dtype dtype;
  int64_t global_shape[DTL_MAX_TENSOR_DIMS];
  int64_t shape[DTL_MAX_TENSOR_DIMS], offset[DTL_MAX_TENSOR_DIMS];
  size_t bytes;
} dtl_qpart_box;
/* Every part's box of the rank at coord (NULL: this rank), and the logical box (the dense layout's). */
typedef struct {
  int64_t shape[DTL_MAX_TENSOR_DIMS], offset[DTL_MAX_TENSOR_DIMS];
  dtl_qpart_box part[DTL_QUANT_NUM_PARTS];
} dtl_qbox;
DTL_API dtl_status dtl_qlayout_local_boxes(const dtl_qlayout *l, const int *coord, dtl_qbox *out);

DTL_API const dtl_mesh *dtl_qlayout_mesh(const dtl_qlayout *l);
/* The resolved format: the mask bits of the fields its kind has, all set, defaults filled in. */
DTL_API void dtl_qlayout_quant_format(const dtl_qlayout *l, dtl_quant_format *out);
/* The f32 layout of the dequantized tensor (same mesh, shape and placements); owned by l. */
DTL_API const dtl_layout *dtl_qlayout_logical(const dtl_qlayout *l);
/* "gptq(g128)[4096,11008] mesh=4 placements=S(1)", as dtl_layout_format. */
DTL_API dtl_status dtl_qlayout_format(const dtl_qlayout *l, char *buf, size_t cap);
DTL_API void dtl_qlayout_destroy(dtl_qlayout *l);

/* The local buffers of a quantized tensor, one per part (NULL for a part the format lacks), in the memory of the
 * mesh's communicator. Read-only where the API takes them as input. */
typedef struct {
  void *part[DTL_QUANT_NUM_PARTS];
} dtl_qbuf;

/* Dequantizes this rank's shard (local, host memory) into out: f32, the logical local box, row-major. Bit for bit
 * the slice of the dense tensor's dequantization. A scale that is NaN or infinite where the format forbids it (every
 * format here) is DTL_ERR_INVALID_ARGUMENT naming the part, its index and value; out is then untouched. */
DTL_API dtl_status dtl_quant_dequantize(const dtl_qlayout *l, const dtl_qbuf *local, float *out);
/* Quantizes a dense f32 tensor of the logical box of this rank into local, each block from its own values, as the
 * format's tools do: FP8 scale = max(amax, 1e-10) / 448 or 57344 and code = RNE(x / scale) (vLLM's
 * per_token_group_quant_fp8); GPTQ: GPTQ's quantizer (range [min(min, 0), max(max, 0)], scale = range / 15,
 * zero = RNE(-min / scale); a zero of 0, which v1 cannot store, becomes 1 with scale = max / 14), act order with the
 * identity g_idx (c / group); AWQ: autoawq's (scale = max(max - min, 1e-5) / 15, zero clamped to 0..15); Q8_0, Q4_0:
 * ggml's reference quantizers; Q4_K: DTL_ERR_UNSUPPORTED. Codes use the scale as stored (rounded to its dtype). Every
 * block the local box touches must be whole in it (a replicated layout always is), else DTL_ERR_INVALID_ARGUMENT
 * naming the dim and the cut block; a NaN or infinite input, or a scale its dtype cannot hold, is
 * DTL_ERR_INVALID_ARGUMENT too. Nothing is written on failure. */
DTL_API dtl_status dtl_quant_quantize(const dtl_qlayout *l, const float *dense_local, dtl_qbuf *local);

/* Redistribution of a quantized tensor: one plan moves codes and scales (and zeros, g_idx) together, between two
 * layouts of one format and logical shape on one mesh or two meshes of one parent (dtl_plan_create's rules). Codes go
 * by dtl_plan_create's cheapest route; the scale blocks each target rank's codes touch come from the ranks that own
 * them in the source. Cost, bytes and explain count every part. Execution is collective like dtl_plan_execute, and
 * allocates nothing after creation. */
typedef struct dtl_qplan dtl_qplan;
DTL_API dtl_status dtl_qplan_create(const dtl_qlayout *src, const dtl_qlayout *dst, dtl_qplan **out);
DTL_API dtl_status dtl_qplan_execute(const dtl_qplan *p, const dtl_qbuf *src_local, dtl_qbuf *dst_local);
DTL_API dtl_status dtl_qplan_explain(const dtl_qplan *p, char *buf, size_t cap);
DTL_API size_t dtl_qplan_explain_needed(const dtl_qplan *p);
/* The sum of the parts' plan costs: the parts run at once but share every rank's links, so their bytes add (their
 * latencies may overlap, which makes the sum an upper bound where latency dominates). Bytes: the parts' sums. */
DTL_API double dtl_qplan_cost(const dtl_qplan *p);
DTL_API dtl_status dtl_qplan_bytes(const dtl_qplan *p, uint64_t *sent, uint64_t *received);
DTL_API void dtl_qplan_destroy(dtl_qplan *p);
/* Plans (uncached) and executes. */
DTL_API dtl_status dtl_qredistribute(const dtl_qlayout *src, const dtl_qbuf *src_local, const dtl_qlayout *dst,
                                     dtl_qbuf *dst_local);

#ifdef __cplusplus
}
#endif
#endif

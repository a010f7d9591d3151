/* SPDX-License-Identifier: Apache-2.0 */
/* Tensor-parallel (Megatron-style) layers for C inference engines: weight sharding from dense checkpoints,
 * column- and row-parallel linears, MLP and attention blocks, vocab-parallel embedding and LM head with a
 * distributed top-k, and the communication half of each layer for engines that bring their own GEMM.
 *
 * Conventions
 * - A context names a mesh and the mesh dim that is the tensor-parallel (TP) group; every collective runs
 *   on that dim's communicator, so other mesh dims (data parallel) never communicate here.
 * - Activations are 2-D row-major [tokens, features]; the tokens of one call form one causal sequence (a
 *   cached attention call continues the sequence its KV cache holds).
 *   Their layouts are dtl layouts on the context's mesh: the stated placement on the TP dim, Replicate on
 *   every other mesh dim (a data-parallel replica that feeds other tokens simply runs its own TP group).
 *   R             : every TP rank holds all of [T, F]
 *   S(0)          : rank r holds the token rows chunk(T, tp, r)     (sequence parallel)
 *   S(1)          : rank r holds the feature columns chunk(F, tp, r)
 *   Partial(sum)  : every rank holds a [T, F] addend (internal, between a row-parallel GEMM and its reduce)
 *   Uneven sizes follow torch.chunk, exactly as dtl_layout_local_box (a rank may hold an empty shard).
 * - Weights are row-major [out, in], as checkpoints store them; Y = X W^T + b.
 * - Dense weights, shards and activations live in the memory of the TP communicator: host for MPI, CUDA
 *   device memory for NCCL (make the communicator's device current on the calling thread). On the host
 *   every layer computes in f32 (OpenBLAS); an f16/bf16 host context can shard weights and run the
 *   communication halves only. On a device context every layer, block and function here runs in f32, f16
 *   or bf16: GEMMs on cuBLAS with f32 accumulation, the bias, activations, causal softmax attention,
 *   embedding lookup and top-k selection in CUDA kernels that read half types into f32, compute in f32 and
 *   round once on store (scores and softmax stay f32 throughout). Work is enqueued on the communicator's
 *   stream and the call returns before it is done (synchronize that stream, or dtl_barrier, before reading
 *   the output); the exceptions are stated below: top-k/argmax return host results and wait for them, and
 *   the embedding reads its host ids before returning. The semantics are the host's in every dtype (same
 *   head mapping, causal mask, tie order, id checks); values differ only by rounding.
 * - A context and the layers made from it share one grow-only scratch space; like everything built on a
 *   communicator they are used by one thread at a time (<dtl/comm.h>). All TP ranks must make the same calls
 *   in the same order with the same shapes.
 * - Failures return a status with a message (dtl_last_error) naming the argument; argument and layout
 *   checks, and the growth of the context's scratch, happen before any output is written or any collective
 *   starts (a sequence-parallel input gather included), so a rank can only fail before it communicates.
 * - Creation is collective and agreed, with or without DTL_CHECK: dtl_tp_context_create over the whole mesh
 *   (every rank of the mesh makes its context together; tp_dim must be the same everywhere), the layer
 *   constructors over the TP group. One rank's bad argument or missing memory fails every rank, and no rank
 *   keeps the object. Forwards, communication halves, top-k and the embedding agree when the mesh's
 *   communicator has DTL_CHECK (comm.h): on every rank's verdict and on a fingerprint of the call (layer,
 *   shapes, token count, k, the embedding's ids), so a NULL buffer or another token count on one rank fails
 *   every rank. Without DTL_CHECK a rank that fails a per-call check returns alone and the others wait. A
 *   NULL context or layer handle is reported on its rank alone (there is no communicator to tell). */
#ifndef DTL_TP_H
#define DTL_TP_H

#include "dtl/checkpoint.h"
#include "dtl/layout.h"
#include "dtl/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------- */
/* Context                                                                                              */
/* ---------------------------------------------------------------------------------------------------- */
typedef struct dtl_tp_context dtl_tp_context;

/* The params structs of this header (a zeroed struct means the defaults) carry two bit fields: mask says
 * which optional fields are read (field-presence bits), flags selects behaviour. Both use one numbering, so
 * that a bit put in the wrong field, or in a struct that does not define it, is DTL_ERR_INVALID_ARGUMENT
 * naming the field and the unknown bits, like any bit dtl does not define. */
#define DTL_TP_SEQUENCE_PARALLEL DTL_BIT(0) /* flags: token-sharded S(0) input and output (see each layer) */
#define DTL_TP_GATHER_OUTPUT DTL_BIT(1)     /* flags: column-parallel: gather the S(1) output to R */
#define DTL_TP_SCALE DTL_BIT(2)             /* mask, attention: scale is read (default 1/sqrt(head_dim)) */
#define DTL_TP_OPT_DTYPE DTL_BIT(3)         /* mask, options: dtype is read (default DTL_FLOAT32) */
/* flags, layers: every weight and bias pointer of the params holds this rank's shard, exactly as the
 * dtl_tp_weight_shard_* / dtl_tp_weight_read_* functions produce it (row-parallel biases: the whole [out]),
 * instead of the dense tensor; so a rank never holds a dense weight. */
#define DTL_TP_SHARDED_WEIGHTS DTL_BIT(4)
#define DTL_TP_ROPE DTL_BIT(5) /* mask, attention: rope_theta is read: rotary position embedding on q and k */
#define DTL_TP_FP8_GATHER DTL_BIT(6) /* flags, options: sequence-parallel gathers move FP8 (below) */
/* mask, linear/MLP/attention: the layer's weights are quantized (dtl_tp_qweight, "Layers on quantized weights"
 * below): its q* fields are read, and its dense weight pointers must be NULL (biases stay dense). */
#define DTL_TP_QUANT_WEIGHTS DTL_BIT(7)
/* flags, with DTL_TP_QUANT_WEIGHTS: FP8 x FP8 GEMMs where the device has them (see there). */
#define DTL_TP_FP8_GEMM DTL_BIT(8)

typedef struct {
  uint64_t mask;   /* DTL_TP_OPT_DTYPE */
  uint64_t flags;  /* DTL_TP_FP8_GATHER */
  dtl_dtype dtype; /* element type of weights and activations: f32 on the host; f32/f16/bf16 on a device */
} dtl_tp_options;

/* FP8 sequence-parallel gathers (DTL_TP_FP8_GATHER in opt.flags). Every token all-gather of the context, that is
 * dtl_tp_sequence_gather and the S(0) input gather of each layer and block made with DTL_TP_SEQUENCE_PARALLEL,
 * quantizes this rank's token rows to e4m3 codes plus one f32 scale per 128 features, by the rule of FP8 dispatch
 * in <dtl/moe.h> (DeepEP's: per block amax = max(max |x|, 1e-4), code = e4m3(x * (448 / amax)), scale = amax / 448),
 * all-gathers codes and scales in one all-gather-v (features + 4 ceil(features / 128) bytes a row, plus up to 3
 * bytes that align the scales: 0.52x of a bf16 row, 0.26x of an f32 one at 4096 features), and dequantizes every
 * row, its own included, into the context's dtype (code * scale in f32, rounded once). The gathered tensor is then
 * dequantize(quantize(x)) of the dense one, bit for bit and the same on every rank; the rest of a layer (GEMMs,
 * the reduce-scatter out) is unchanged. On the host a NaN or infinite element of x is DTL_ERR_INVALID_ARGUMENT
 * naming its global token row and column, found before any collective, with nothing written (every rank fails
 * under DTL_CHECK, as for any per-call argument). On a device it is not checked (that would wait for the
 * stream): a NaN element gathers as NaN, an infinity makes its whole 128-feature block NaN. */

/* mesh must have communicators (not abstract); tp_dim in 0..ndim-1; opt may be NULL. The context keeps a
 * reference to mesh: destroy the context (and its layers) before the mesh. When tp_dim crosses nodes
 * (dtl_mesh_dim_crosses_nodes) it logs a warning (DTL_LOG=warn, subsystem "tp"): every layer would communicate
 * between nodes. */
DTL_API dtl_status dtl_tp_context_create(const dtl_mesh *mesh, int tp_dim, const dtl_tp_options *opt,
                                         dtl_tp_context **out);
DTL_API int dtl_tp_context_size(const dtl_tp_context *ctx); /* TP group size; -1 for NULL */
DTL_API int dtl_tp_context_rank(const dtl_tp_context *ctx); /* this rank's TP coordinate; -1 for NULL */
DTL_API const dtl_mesh *dtl_tp_context_mesh(const dtl_tp_context *ctx);
DTL_API dtl_comm *dtl_tp_context_comm(const dtl_tp_context *ctx); /* the TP dim's communicator */
DTL_API void dtl_tp_context_destroy(dtl_tp_context *ctx);

/* The layout of a [tokens, features] activation: on_tp on the TP mesh dim (R, S(0), S(1) or P(sum)),
 * Replicate on the others, the context's dtype. */
DTL_API dtl_status dtl_tp_activation_layout(const dtl_tp_context *ctx, int64_t tokens, int64_t features,
                                            dtl_placement on_tp, dtl_layout **out);

/* ---------------------------------------------------------------------------------------------------- */
/* Splits and weight sharding                                                                           */
/* ---------------------------------------------------------------------------------------------------- */
typedef struct {
  int64_t offset, count;
} dtl_tp_range;

/* This rank's torch.chunk piece of a dim of size n (the S(i) rule of dtl layouts). */
DTL_API dtl_status dtl_tp_split(const dtl_tp_context *ctx, int64_t n, dtl_tp_range *out);

/* Attention heads of this rank, never cutting a head. g = q_heads / kv_heads q heads share one kv head
 * (grouped-query attention); q_heads % kv_heads == 0 is required.
 * - tp <= kv_heads: the kv heads are split with torch.chunk (uneven allowed: a rank may get more, fewer or
 *   no kv heads) and each rank takes the q heads of its kv heads: q = [kv.offset * g, (kv.offset+kv.count) * g).
 *   When kv_heads % tp == 0 this is the even split of Megatron-LM and vLLM.
 * - tp > kv_heads: kv heads are replicated. Requires tp % kv_heads == 0 and q_heads % tp == 0; rank r gets
 *   kv head r / (tp / kv_heads) (= r * kv_heads / tp) and q heads [r * q_heads / tp, (r+1) * q_heads / tp),
 *   the rule of vLLM's QKVParallelLinear (num_kv_head_replicas = tp / kv_heads; kv shard = rank / replicas,
 *   vllm/model_executor/layers/linear.py).
 * Other combinations are DTL_ERR_INVALID_ARGUMENT naming the numbers. q and kv are optional outputs (with
 * both NULL the call checks that the heads can be split). */
DTL_API dtl_status dtl_tp_attention_heads(const dtl_tp_context *ctx, int64_t q_heads, int64_t kv_heads,
                                          dtl_tp_range *q, dtl_tp_range *kv);

/* Shards of a dense weight w [out, in] for this rank, written to shard (row-major, packed):
 *   column: rows chunk(out)       -> [chunk(out).count, in]
 *   row:    columns chunk(in)     -> [out, chunk(in).count]
 * A 1-D bias [out] is the column shard of a [out, 1] weight. */
DTL_API dtl_status dtl_tp_weight_shard_column(const dtl_tp_context *ctx, const void *w, int64_t out, int64_t in,
                                              void *shard);
DTL_API dtl_status dtl_tp_weight_shard_row(const dtl_tp_context *ctx, const void *w, int64_t out, int64_t in,
                                           void *shard);
/* Fused QKV [(q_heads + 2 kv_heads) * head_dim, in] (all q rows, then k, then v) -> this rank's
 * [(q.count + 2 kv.count) * head_dim, in]: its q heads, then its k heads, then its v heads
 * (dtl_tp_attention_heads). in = 1 shards the fused QKV bias. */
DTL_API dtl_status dtl_tp_weight_shard_qkv(const dtl_tp_context *ctx, const void *w, int64_t q_heads, int64_t kv_heads,
                                           int64_t head_dim, int64_t in, void *shard);
/* Attention output projection [out, q_heads * head_dim] -> the columns of this rank's q heads
 * [out, q.count * head_dim]. */
DTL_API dtl_status dtl_tp_weight_shard_attention_out(const dtl_tp_context *ctx, const void *w, int64_t q_heads,
                                                     int64_t kv_heads, int64_t head_dim, int64_t out, void *shard);
/* Fused gate/up [2 * ffn, in] (gate rows, then up rows) -> [2 * chunk(ffn).count, in]: this rank's gate
 * rows, then its up rows (each part split on its own). in = 1 shards a fused bias. */
DTL_API dtl_status dtl_tp_weight_shard_gate_up(const dtl_tp_context *ctx, const void *w, int64_t ffn, int64_t in,
                                               void *shard);

/* The same shards read straight from a safetensors checkpoint (<dtl/checkpoint.h>): each rank reads only its
 * rows or columns (never the dense tensor) into shard, in the context's memory, with exactly the layout that
 * the dtl_tp_weight_shard_* function above gives for the dense array. The tensor's dtype must be the
 * context's and its shape the stated one, [out, in], or [out] for a bias when in = 1 (else
 * DTL_ERR_INVALID_ARGUMENT naming the tensor, the field and both values; shard untouched). Purely local: no
 * communication, every rank opens the file itself.
 * qkv: k = v = NULL reads the fused [(q_heads + 2 kv_heads) * head_dim, in] tensor q; with k and v given, q
 * [q_heads * head_dim, in], k and v [kv_heads * head_dim, in] are separate tensors (Hugging Face q_proj,
 * k_proj, v_proj) and the shard is the same fused one. gate_up likewise: up = NULL reads the fused
 * [2 ffn, in] tensor gate; with up given, gate and up are [ffn, in] each (gate_proj, up_proj). */
DTL_API dtl_status dtl_tp_weight_read_column(const dtl_tp_context *ctx, const dtl_safetensors *f, const char *name,
                                             int64_t out, int64_t in, void *shard);
DTL_API dtl_status dtl_tp_weight_read_row(const dtl_tp_context *ctx, const dtl_safetensors *f, const char *name,
                                          int64_t out, int64_t in, void *shard);
DTL_API dtl_status dtl_tp_weight_read_qkv(const dtl_tp_context *ctx, const dtl_safetensors *f, const char *q,
                                          const char *k, const char *v, int64_t q_heads, int64_t kv_heads,
                                          int64_t head_dim, int64_t in, void *shard);
DTL_API dtl_status dtl_tp_weight_read_attention_out(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                                    const char *name, int64_t q_heads, int64_t kv_heads,
                                                    int64_t head_dim, int64_t out, void *shard);
DTL_API dtl_status dtl_tp_weight_read_gate_up(const dtl_tp_context *ctx, const dtl_safetensors *f, const char *gate,
                                              const char *up, int64_t ffn, int64_t in, void *shard);

/* A quantized weight shard (<dtl/quant.h>): its quantized layout, on the context's mesh and cut on the TP dim as
 * the layer that takes it needs (column-parallel [out, in]: S(0); row-parallel: S(1); Replicate on the other mesh
 * dims), and this rank's part buffers in the context's memory. Borrowed: a layer copies what it keeps. Fused
 * weights (QKV, gate/up) are given as their sub-weights (q, k, v; gate, up), each with its own scales, since a
 * scale block never spans two of them. */
typedef struct {
  const dtl_qlayout *layout;
  dtl_qbuf local;
} dtl_tp_qweight;

/* Quantized weight shards read straight from a safetensors checkpoint, the quantized dtl_tp_weight_read_*: each
 * makes the quantized layout of every sub-weight of fmt on the context's mesh and reads this rank's box of each part
 * (dtl_safetensors_qread_hf's Hugging Face names under each prefix: FP8 <p>.weight + <p>.weight_scale_inv or
 * .weight_scale, GPTQ/AWQ <p>.qweight, .scales, .qzeros, .g_idx), so that a rank reads and holds only its shard.
 * *shard gets an object that owns the layouts and the part buffers (in the context's memory); its sub-weights are
 * dtl_tp_qshard_weight(shard, i), borrowed views for the layers, valid until dtl_tp_qshard_destroy (before the
 * context's mesh). The checks, messages and "nothing written" rule of dtl_safetensors_qread apply, plus those of
 * dtl_qlayout_create (a cut inside a packing unit names the dim, the unit and the degrees that work); on failure
 * *shard is untouched and nothing stays allocated. Purely local, like the dense readers.
 *   column         [out, in] S(0): rows chunk(out)                          1 sub-weight
 *   row            [out, in] S(1): columns chunk(in); act-order GPTQ: the codes and g_idx of those input channels,
 *                  every group's scales and zeros (any channel may use any group)                  1 sub-weight
 *   qkv            q [q_heads * head_dim, in], k and v [kv_heads * head_dim, in], each S(0) by heads
 *                  (dtl_tp_attention_heads), from separate tensors or (k = v = NULL) row ranges of one fused q
 *                  [(q_heads + 2 kv_heads) * head_dim, in]                                         3: q, k, v
 *   attention_out  [out, q_heads * head_dim] S(1): the columns of this rank's q heads              1
 *   gate_up        gate and up [ffn, in] each S(0), from separate tensors or (up = NULL) the halves of a fused
 *                  [2 ffn, in]                                                                     2: gate, up
 *   experts        [experts, out, in] S(0): this rank's whole experts (dtl_moe_placement_create(experts, tp, NULL)
 *                  gives the same ones), from one stacked tensor per part [experts, ...] (suffix NULL: prefix is
 *                  its prefix) or from each expert's own tensors "<prefix><e><suffix>" (e.g. prefix
 *                  "model.layers.3.mlp.experts.", suffix ".gate_proj")                              1
 * Heads are whole on every rank, and a quantized layout cuts by torch.chunk, so a head split must be chunk's rows:
 * kv_heads % tp == 0 (the split of Megatron-LM and vLLM; q heads too). With tp > kv_heads (tp % kv_heads == 0, each kv
 * head on tp / kv_heads ranks) q stays S(0), and k and v are [tp * head_dim, in] S(0): the kv heads repeated
 * tp / kv_heads times in order (Hugging Face's repeat_kv), so that rank r's shard is its one kv head, read from that
 * head's rows of the file; head_dim must then be a multiple of the rows the format scales or packs together (FP8
 * blocks: block_rows; GPTQ/AWQ: 8). Other splits are DTL_ERR_UNSUPPORTED naming the heads and rows (the dense
 * dtl_tp_weight_read_qkv takes them). A sub-weight taken from a fused tensor must start on such a unit too (else a
 * scale block would span two sub-weights: DTL_ERR_UNSUPPORTED). */
typedef struct dtl_tp_qshard dtl_tp_qshard;
DTL_API dtl_status dtl_tp_qweight_read_column(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                              const dtl_quant_format *fmt, const char *prefix, int64_t out, int64_t in,
                                              dtl_tp_qshard **shard);
DTL_API dtl_status dtl_tp_qweight_read_row(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                           const dtl_quant_format *fmt, const char *prefix, int64_t out, int64_t in,
                                           dtl_tp_qshard **shard);
DTL_API dtl_status dtl_tp_qweight_read_qkv(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                           const dtl_quant_format *fmt, const char *q, const char *k, const char *v,
                                           int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t in,
                                           dtl_tp_qshard **shard);
DTL_API dtl_status dtl_tp_qweight_read_attention_out(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                                     const dtl_quant_format *fmt, const char *prefix, int64_t q_heads,
                                                     int64_t kv_heads, int64_t head_dim, int64_t out,
                                                     dtl_tp_qshard **shard);
DTL_API dtl_status dtl_tp_qweight_read_gate_up(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                               const dtl_quant_format *fmt, const char *gate, const char *up,
                                               int64_t ffn, int64_t in, dtl_tp_qshard **shard);
DTL_API dtl_status dtl_tp_qweight_read_experts(const dtl_tp_context *ctx, const dtl_safetensors *f,
                                               const dtl_quant_format *fmt, const char *prefix, const char *suffix,
                                               int experts, int64_t out, int64_t in, dtl_tp_qshard **shard);
/* The number of sub-weights (-1 for NULL) and sub-weight i (NULL out of range), in the order listed above. */
DTL_API int dtl_tp_qshard_count(const dtl_tp_qshard *s);
DTL_API const dtl_tp_qweight *dtl_tp_qshard_weight(const dtl_tp_qshard *s, int i);
/* Frees the buffers and layouts; accepts NULL. */
DTL_API void dtl_tp_qshard_destroy(dtl_tp_qshard *s);

/* Layers on quantized weights. With DTL_TP_QUANT_WEIGHTS in mask, dtl_tp_linear/mlp/attention_create take their
 * weights as quantized sub-weights (the params' q* fields) instead of dense arrays; inputs, outputs, layouts,
 * collectives and biases (dense, sharded or not by DTL_TP_SHARDED_WEIGHTS as for a dense layer) are the dense
 * layer's. Each sub-weight must be
 * - on the context's mesh, a 2-D [out, in] matrix of its stated shape, in any format of <dtl/quant.h>;
 * - cut so that this rank's local box holds the box of it the rank computes with, with every column
 *   (column-parallel: linear, gate, up, q, k, v; the rows of its chunk(out), chunk(ffn) or heads) or every row
 *   (row-parallel: linear, down, out; the columns of its chunk(in), chunk(ffn) or q heads): S(0), resp. S(1), on
 *   the TP mesh dim (the layer's own cut: a dtl_qlayout with the dense layer's placements), or Replicate (the
 *   rank then keeps only its box, e.g. its kv heads when tp > kv_heads); Replicate on the other mesh dims. The
 *   box's edges must fall on the format's packing units (an S cut always does; a head boundary inside a
 *   Replicate AWQ/GPTQ tensor may not).
 * The layer copies that box of every part into its own memory (the weight is borrowed: free it after creation)
 * and checks it once: every scale finite, zero points and g_idx in range. Bad input (a NULL sub-weight, layout
 * or part buffer, another mesh, another shape, a box that lacks rows or columns the rank needs: a wrong cut, a
 * packing unit cut, a NaN or infinite scale, a dense weight pointer besides) is DTL_ERR_INVALID_ARGUMENT naming
 * the field and the numbers, on every rank, and nothing is created.
 * A forward then computes the dense layer on dequantize(W), up to f32 rounding and summation order: the weight is
 * dequantized one tile at a time into the context's scratch and multiplied by the whole token block before the
 * next tile overwrites it, so no dense weight is ever held. Host: tiles of at most 128 rows x 512 columns
 * (256 KiB of f32) by the f32 tile kernel, OpenBLAS GEMMs (f32 contexts). Device: tiles of at most 4 Mi
 * elements (whole weight rows) by the CUDA tile kernel (f32, then rounded once to a half context's dtype), cuBLAS
 * GEMMs; the tile (and its f32 staging) lives in the context's grow-only scratch, so a warm forward allocates
 * nothing. A device context checks the scales at creation through a host copy of the rank's box.
 * DTL_TP_FP8_GEMM: on a device of compute capability 8.9 or later (a CUDA of 11.8 or later), each FP8_TENSOR
 * sub-weight with e4m3 codes whose box on this rank has a multiple of 16 rows and of 16 columns multiplies in FP8
 * on cuBLASLt: the forward quantizes its input per call to e4m3 with one scale, amax / 448 (1 for an all-zero
 * input), and cuBLASLt computes codes(x) codes(W)^T with f32 accumulation times both scales. That result differs
 * from the dense layer on dequantize(W) by the input's e4m3 rounding (each element within 2^-4 relative, or the
 * scale times 2^-10 absolute), which is why it is asked for and not automatic. Every other sub-weight, a call
 * whose output cuBLASLt cannot take (16-byte alignment of y's columns and leading dim), and a host context run the
 * tiled path as without the flag. */

/* ---------------------------------------------------------------------------------------------------- */
/* Communication halves: exactly the collective of each layer, on caller buffers [tokens, features].   */
/* The full layers below use these. Each checks the given layout against what it can take.              */
/* ---------------------------------------------------------------------------------------------------- */
/* Row-parallel epilogue: partial is this rank's addend [T, F] (Partial(sum)); out_layout is [T, F] with R
 * (all-reduce; y gets [T, F]) or S(0) (reduce-scatter on tokens, uneven counts allowed; y gets this rank's
 * chunk(T) rows). bias [F] (may be NULL) is added once, after the reduction, so every element carries it
 * exactly once and the reduction stays a pure sum of GEMM partials (exact for integer data; y is bitwise
 * equal on all ranks). partial is not modified. */
DTL_API dtl_status dtl_tp_row_parallel_reduce(dtl_tp_context *ctx, const dtl_layout *out_layout, const void *partial,
                                              const void *bias, void *y);
/* Column-parallel gather: in_layout is [T, F] S(1); y_local holds this rank's feature columns; y gets the
 * whole [T, F] (R). One all-gather plus one local interleave. */
DTL_API dtl_status dtl_tp_column_parallel_gather(dtl_tp_context *ctx, const dtl_layout *in_layout, const void *y_local,
                                                 void *y);
/* Sequence-parallel gather: in_layout is [T, F] S(0); x_local holds this rank's token rows; x gets [T, F] (R)
 * (with DTL_TP_FP8_GATHER, dequantize(quantize(x)) of it: FP8 sequence-parallel gathers above). */
DTL_API dtl_status dtl_tp_sequence_gather(dtl_tp_context *ctx, const dtl_layout *in_layout, const void *x_local,
                                          void *x);

/* ---------------------------------------------------------------------------------------------------- */
/* Layers. Each is created from dense weights (copied and sharded at creation; the caller keeps its own),  */
/* or from this rank's shards with DTL_TP_SHARDED_WEIGHTS (copied; e.g. read by dtl_tp_weight_read_*),     */
/* and states its input and output layouts; forward checks the input layout (DTL_ERR_MISMATCH naming both */
/* when it differs) and writes this rank's local shard of the output.                                   */
/* ---------------------------------------------------------------------------------------------------- */
typedef enum { DTL_TP_COLUMN = 0, DTL_TP_ROW = 1 } dtl_tp_linear_kind;

/* Column: weight sharded on out. Input R (S(0) with SEQUENCE_PARALLEL, all-gathered first); output S(1)
 *         ([T, out]; R with GATHER_OUTPUT). With out = vocab and no bias this is the vocab-parallel LM head.
 * Row:    weight sharded on in. Input S(1) ([T, in]); output R (all-reduce), or S(0) with
 *         SEQUENCE_PARALLEL (reduce-scatter on tokens); the bias is added once after the reduction. */
typedef struct {
  uint64_t mask;  /* DTL_TP_QUANT_WEIGHTS */
  uint64_t flags; /* DTL_TP_SEQUENCE_PARALLEL, DTL_TP_GATHER_OUTPUT (column only), DTL_TP_SHARDED_WEIGHTS,
                   * DTL_TP_FP8_GEMM (with DTL_TP_QUANT_WEIGHTS) */
  dtl_tp_linear_kind kind;
  int64_t in_features, out_features;
  const void *weight; /* dense [out, in] (SHARDED_WEIGHTS: shard_column/row's shard); required unless quantized */
  const void *bias;   /* dense [out] (SHARDED_WEIGHTS: column: its column shard; row: the whole [out]); NULL = none */
  const dtl_tp_qweight *qweight; /* with DTL_TP_QUANT_WEIGHTS: [out, in], column: S(0), row: S(1) (or R) */
} dtl_tp_linear_params;
typedef struct dtl_tp_linear dtl_tp_linear;
DTL_API dtl_status dtl_tp_linear_create(dtl_tp_context *ctx, const dtl_tp_linear_params *p, dtl_tp_linear **out);
/* The layouts of input and output for a call with `tokens` tokens; in and out are optional outputs (the same
 * for dtl_tp_mlp_layouts and dtl_tp_attention_layouts). */
DTL_API dtl_status dtl_tp_linear_layouts(const dtl_tp_linear *l, int64_t tokens, dtl_layout **in, dtl_layout **out);
DTL_API dtl_status dtl_tp_linear_forward(dtl_tp_linear *l, const dtl_layout *x_layout, const void *x, void *y);
DTL_API void dtl_tp_linear_destroy(dtl_tp_linear *l);

typedef enum {
  DTL_TP_ACT_SILU_GATED = 0, /* SwiGLU: silu(gate) * up, from a fused gate/up weight */
  DTL_TP_ACT_GELU = 1        /* exact (erf) GELU of up */
} dtl_tp_activation;

/* MLP block: [T, hidden] -> column (gate/up) -> activation -> row (down) -> [T, hidden]. Input and output R,
 * one all-reduce; with SEQUENCE_PARALLEL both S(0), one all-gather in and one reduce-scatter out. */
typedef struct {
  uint64_t mask;  /* DTL_TP_QUANT_WEIGHTS */
  uint64_t flags; /* DTL_TP_SEQUENCE_PARALLEL, DTL_TP_SHARDED_WEIGHTS (gate_up: shard_gate_up's or for GELU
                   * shard_column's shard; down: shard_row's; gate_up_bias: sharded the same way; down_bias: whole),
                   * DTL_TP_FP8_GEMM */
  dtl_tp_activation activation;
  int64_t hidden, ffn;
  const void *gate_up;      /* SILU_GATED: fused [2 ffn, hidden] (gate rows, then up rows); GELU: [ffn, hidden] */
  const void *down;         /* [hidden, ffn] */
  const void *gate_up_bias; /* [2 ffn] or [ffn]; NULL = none */
  const void *down_bias;    /* [hidden]; NULL = none */
  /* With DTL_TP_QUANT_WEIGHTS (gate_up and down NULL): gate, up [ffn, hidden] (column-parallel; GELU: up only,
   * qgate NULL) and down [hidden, ffn] (row-parallel). */
  const dtl_tp_qweight *qgate, *qup, *qdown;
} dtl_tp_mlp_params;
typedef struct dtl_tp_mlp dtl_tp_mlp;
DTL_API dtl_status dtl_tp_mlp_create(dtl_tp_context *ctx, const dtl_tp_mlp_params *p, dtl_tp_mlp **out);
DTL_API dtl_status dtl_tp_mlp_layouts(const dtl_tp_mlp *m, int64_t tokens, dtl_layout **in, dtl_layout **out);
DTL_API dtl_status dtl_tp_mlp_forward(dtl_tp_mlp *m, const dtl_layout *x_layout, const void *x, void *y);
DTL_API void dtl_tp_mlp_destroy(dtl_tp_mlp *m);

/* Attention block: [T, hidden] -> fused QKV column-parallel by heads (dtl_tp_attention_heads) -> causal
 * scaled-dot-product attention of this rank's heads (query i attends to keys 0..i; q head h uses kv head
 * h / (q_heads / kv_heads)) -> output projection row-parallel over those heads -> [T, hidden]. Layouts and
 * collectives as for the MLP block.
 * Rotary position embedding (with DTL_TP_ROPE in mask): every q and k head is turned at its token's absolute
 * position p before the scores, in the GPT-NeoX "rotate half" layout that Hugging Face's Llama, Mistral,
 * Qwen and Mixtral use: element i < D/2 of a head pairs with element i + D/2 (not with i + 1, GPT-J's
 * interleaved layout), and the pair (a, b) becomes (a cos - b sin, b cos + a sin) with the angle
 * p * rope_theta^(-2i/D), computed in f32 as Hugging Face does (head_dim must be even). The whole head
 * turns (no partial rotary dims) and no frequency scaling is applied (Llama 3 / YaRN scaling: turn the
 * projections yourself). A forward without a cache puts its tokens at positions 0..T-1. */
typedef struct {
  uint64_t mask;  /* DTL_TP_SCALE, DTL_TP_ROPE, DTL_TP_QUANT_WEIGHTS */
  uint64_t flags; /* DTL_TP_SEQUENCE_PARALLEL, DTL_TP_SHARDED_WEIGHTS (qkv and qkv_bias: shard_qkv's shards;
                   * out: shard_attention_out's; out_bias: whole), DTL_TP_FP8_GEMM */
  int64_t hidden, q_heads, kv_heads, head_dim;
  const void *qkv;      /* fused [(q_heads + 2 kv_heads) * head_dim, hidden] */
  const void *out;      /* [hidden, q_heads * head_dim] */
  const void *qkv_bias; /* [(q_heads + 2 kv_heads) * head_dim]; NULL = none */
  const void *out_bias; /* [hidden]; NULL = none */
  float scale;          /* with DTL_TP_SCALE */
  float rope_theta;     /* with DTL_TP_ROPE: the base, finite and > 0 (Llama 2: 10000, Llama 3: 500000) */
  /* With DTL_TP_QUANT_WEIGHTS (qkv and out NULL): q [q_heads * head_dim, hidden], k and v [kv_heads * head_dim,
   * hidden] (column-parallel by heads: this rank's heads' rows; with tp > kv_heads also dtl_tp_qweight_read_qkv's
   * repeat_kv form [tp * head_dim, hidden], rank r's kv head in rows [r, r + 1) x head_dim) and out [hidden,
   * q_heads * head_dim] (row-parallel: its q heads' columns). dtl_tp_qweight_read_qkv's and _attention_out's
   * sub-weights go here as they are. */
  const dtl_tp_qweight *qq, *qk, *qv, *qout;
} dtl_tp_attention_params;
typedef struct dtl_tp_attention dtl_tp_attention;
DTL_API dtl_status dtl_tp_attention_create(dtl_tp_context *ctx, const dtl_tp_attention_params *p,
                                           dtl_tp_attention **out);
DTL_API dtl_status dtl_tp_attention_layouts(const dtl_tp_attention *a, int64_t tokens, dtl_layout **in,
                                            dtl_layout **out);
DTL_API dtl_status dtl_tp_attention_forward(dtl_tp_attention *a, const dtl_layout *x_layout, const void *x, void *y);
DTL_API void dtl_tp_attention_destroy(dtl_tp_attention *a);

/* A KV cache of one attention block for autoregressive decoding: this rank's kv heads (dtl_tp_attention_heads:
 * its share of them, or the one replicated kv head when tp > kv_heads), keys and values of up to max_tokens
 * tokens each ([max_tokens, kv.count * head_dim] twice), in the TP communicator's memory, allocated once at
 * creation. A cached forward sizes the context's scratch for a full cache, so once a call with as many tokens
 * (or more) has run, the next ones allocate nothing: decode steps after a prefill never do. Keys are stored
 * after RoPE. The cache's length (tokens
 * held) is the same on every TP rank as long as every rank makes the same calls.
 * Creation is collective over the TP group and agreed (one rank's bad argument or missing memory fails every
 * rank); destroy the cache before its block. Length and reset are local: every TP rank must reset alike. */
typedef struct dtl_tp_kv_cache dtl_tp_kv_cache;
DTL_API dtl_status dtl_tp_kv_cache_create(const dtl_tp_attention *a, int64_t max_tokens, dtl_tp_kv_cache **out);
DTL_API void dtl_tp_kv_cache_destroy(dtl_tp_kv_cache *c);
/* Tokens held (0 after creation and reset); -1 for NULL. */
DTL_API int64_t dtl_tp_kv_cache_length(const dtl_tp_kv_cache *c);
/* Empties the cache for a new sequence (the memory stays). */
DTL_API dtl_status dtl_tp_kv_cache_reset(dtl_tp_kv_cache *c);
/* The block over the T tokens of x (layouts as dtl_tp_attention_forward: [T, hidden] R, or S(0) with sequence
 * parallelism) as the continuation of the sequence the cache holds: with L = the cache's length, the tokens
 * are at positions L..L+T-1 (RoPE turns their q and k there), their keys and values are appended to the
 * cache at rows L..L+T-1, and each attends causally over all L + T cached tokens. A prompt is one call with
 * T tokens (prefill), each decode step one call with T = 1; any T >= 1 continues the sequence. Then the cache
 * holds L + T tokens. The result is that of dtl_tp_attention_forward over the whole sequence, restricted to
 * these T rows (up to the summation order). cache must be one of a's. L + T > max_tokens is
 * DTL_ERR_INVALID_ARGUMENT with nothing written (y, the cache and its length untouched) on every rank alike;
 * with DTL_CHECK the call's fingerprint includes L, so a rank whose cache length differs from its peers' (a
 * caller's missed reset or call) fails every rank with DTL_ERR_MISMATCH instead of a silent mix. */
DTL_API dtl_status dtl_tp_attention_forward_cached(dtl_tp_attention *a, dtl_tp_kv_cache *cache,
                                                   const dtl_layout *x_layout, const void *x, void *y);

/* Vocab-parallel embedding: the table [vocab, hidden] is sharded on vocab (rows chunk(vocab)); each rank
 * looks up the ids it owns and writes zeros for the others (a Partial(sum)), then one all-reduce gives R
 * [T, hidden] (reduce-scatter to S(0) with SEQUENCE_PARALLEL). ids are host int64 [tokens], equal on all
 * TP ranks (on a device context too: they are checked on the host, then copied to the device before the
 * call returns, so the caller may reuse them at once). An id outside 0..vocab-1 is
 * DTL_ERR_INVALID_ARGUMENT naming the id and its position, found before any communication or device work,
 * with y untouched. */
typedef struct {
  uint64_t mask;  /* no optional fields yet: 0 */
  uint64_t flags; /* DTL_TP_SEQUENCE_PARALLEL, DTL_TP_SHARDED_WEIGHTS (table: shard_column's rows) */
  int64_t vocab, hidden;
  const void *table; /* [vocab, hidden] */
} dtl_tp_embedding_params;
typedef struct dtl_tp_embedding dtl_tp_embedding;
DTL_API dtl_status dtl_tp_embedding_create(dtl_tp_context *ctx, const dtl_tp_embedding_params *p,
                                           dtl_tp_embedding **out);
/* The layout of the output (the ids are a plain replicated host array). */
DTL_API dtl_status dtl_tp_embedding_layout(const dtl_tp_embedding *e, int64_t tokens, dtl_layout **out);
DTL_API dtl_status dtl_tp_embedding_forward(dtl_tp_embedding *e, int64_t tokens, const int64_t *ids, void *y);
DTL_API void dtl_tp_embedding_destroy(dtl_tp_embedding *e);

/* Distributed top-k over vocab-sharded logits ([T, vocab] S(1) in the context's memory and dtype, e.g. a
 * column-parallel LM head's output), without gathering them: each rank selects its k best (value, global index) pairs per token and one
 * all-gather exchanges only those (T * k pairs per rank). values [T, k] (f32, host) and indices [T, k]
 * (host) get, on every rank, the k largest logits of each token in descending order; equal values are
 * ordered by lowest index (as a dense stable sort would) and NaN counts as the largest value (as torch.topk).
 * 1 <= k <= vocab. values is an optional output. On a device context the selection runs in a kernel (k
 * rounds over the rank's vocab shard: meant for small k), only the candidates are copied to the host, and the call
 * returns once values and indices are written (it waits for the communicator's stream). */
DTL_API dtl_status dtl_tp_logits_topk(dtl_tp_context *ctx, const dtl_layout *logits_layout, const void *logits_local,
                                      int k, float *values, int64_t *indices);
/* top-1: the index of the largest logit of each token (lowest index among equals), [T] on every rank. */
DTL_API dtl_status dtl_tp_logits_argmax(dtl_tp_context *ctx, const dtl_layout *logits_layout, const void *logits_local,
                                        int64_t *indices);

#ifdef __cplusplus
}
#endif
#endif

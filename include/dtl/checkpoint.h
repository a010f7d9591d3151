/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoints in the safetensors format (https://github.com/huggingface/safetensors): reading this rank's
 * shard of any tensor straight from the file, and writing files.
 *
 * Format: 8 bytes little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [4, 6], "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}
 * then the data buffer; offsets are relative to the buffer's start, data is row-major little-endian.
 *
 * Reading is local: every rank opens the file itself (a shared or replicated filesystem is assumed) and reads
 * only the bytes of its own shard with positioned reads, never the whole tensor; no call here communicates.
 * A rank's peak memory while reading is its shard plus bounded staging (at most 5 MiB: a 1 MiB window that
 * gathers short strided runs with one read, and, on a device, a 4 MiB host buffer on the way to the GPU).
 *
 * The file is untrusted input. dtl_safetensors_open validates the whole header before it returns a handle,
 * so reads never touch bytes outside the file: the header length against the file size (and a 100 MB cap),
 * the JSON itself (syntax errors with line, column and byte position; duplicate keys), and for every tensor
 * its dtype string, its shape (non-negative integers, at most 64 dims, no overflow of the element or byte
 * count), its data_offsets (two integers, begin <= end, end inside the data buffer, end - begin equal to the
 * byte size of dtype x shape) and that no two tensors' bytes overlap. Each failure is
 * DTL_ERR_INVALID_ARGUMENT naming the file, the tensor and the field, e.g.
 *   dtl_safetensors_open: m.safetensors: tensor "w": data_offsets=[0,96] hold 96 bytes, but dtype F32 x shape
 *   [4,8] needs 128
 * Extra fields of an entry are ignored; bytes of the data buffer that no tensor claims are allowed.
 *
 * Dtypes: F32, F64, F16, BF16, I8, U8, I32, I64, F8_E4M3 (e4m3fn) and F8_E5M2 map to the dtl dtypes. BOOL, I16,
 * U16, U32, U64, C64 and F8_E8M0 are valid in a file (listed, sized, validated) but have no dtl dtype: info and
 * read return DTL_ERR_UNSUPPORTED naming it, and dtl_safetensors_dtype_name spells it. Any
 * other dtype string makes the file invalid. Nothing is ever converted: a read whose dtype differs from the
 * file's is DTL_ERR_INVALID_ARGUMENT naming both.
 *
 * Threads: an open file is immutable; several threads may read from one handle at once (positioned reads,
 * per-call buffers), each with its own layouts. */
#ifndef DTL_CHECKPOINT_H
#define DTL_CHECKPOINT_H

#include "dtl/layout.h"
#include "dtl/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dtl_safetensors dtl_safetensors;

/* Opens and validates path (see above); *out keeps the file open until dtl_safetensors_close. */
DTL_API dtl_status dtl_safetensors_open(const char *path, dtl_safetensors **out);
DTL_API void dtl_safetensors_close(dtl_safetensors *f);

/* The tensors of the file in byte order of their names (strcmp), for listing: name i of 0..count-1, NULL for
 * an index out of range. Strings stay valid until the file is closed. */
DTL_API size_t dtl_safetensors_num_tensors(const dtl_safetensors *f);
DTL_API const char *dtl_safetensors_tensor_name(const dtl_safetensors *f, size_t i);
/* The tensor's dtype, number of dims and shape; dtype, ndim and shape are optional outputs (shape gets ndim
 * entries, room for DTL_MAX_TENSOR_DIMS). A name not in the file is DTL_ERR_INVALID_ARGUMENT; a dtype
 * without a dtl equivalent (when dtype is asked for) or more than DTL_MAX_TENSOR_DIMS dims (when shape is
 * asked for) is DTL_ERR_UNSUPPORTED naming it. */
DTL_API dtl_status dtl_safetensors_info(const dtl_safetensors *f, const char *name, dtl_dtype *dtype, int *ndim,
                                        int64_t *shape);
/* The dtype string of the file ("F32", "BF16", "BOOL", ...); NULL when name is not in the file. */
DTL_API const char *dtl_safetensors_dtype_name(const dtl_safetensors *f, const char *name);
/* A value of the "__metadata__" object (a string-to-string map by the format); NULL when absent. */
DTL_API const char *dtl_safetensors_metadata(const dtl_safetensors *f, const char *key);

/* This rank's local shard of tensor name, laid out by layout, into local (the memory of the layout's mesh:
 * host for MPI and abstract meshes, CUDA device memory for NCCL, staged through host memory in 4 MiB
 * pieces; the call returns once local is written). The file's dtype must be the layout's dtype and its
 * shape the layout's global shape (else DTL_ERR_INVALID_ARGUMENT naming the tensor, the field and both
 * values). Partial placements follow dtl_distribute: coordinate 0 of a Partial(sum|prod) mesh dim gets the
 * value and the others the op's identity (0 or 1), max/min/avg get the value everywhere, so that the reduced
 * tensor is the file's. Reads the box of dtl_layout_local_box only: runs that are contiguous in the file
 * (dims the box spans whole are merged) are read straight into local with pread. Arguments and the file's
 * size are checked before anything is read; an I/O error while reading (a file truncated or failing after
 * those checks) is reported and may leave local partly written. */
DTL_API dtl_status dtl_safetensors_read(const dtl_safetensors *f, const char *name, const dtl_layout *layout,
                                        void *local);
/* The box [offset, offset + shape) of tensor name (ndim = the tensor's dims, dtype = its dtype) into the host
 * array dst, packed row-major: any slice of a tensor, for loaders that cut their own pieces. */
DTL_API dtl_status dtl_safetensors_read_box(const dtl_safetensors *f, const char *name, dtl_dtype dtype, int ndim,
                                            const int64_t *offset, const int64_t *shape, void *dst);

/* Quantized tensors (<dtl/quant.h>): this rank's shard of a quantized tensor laid out by layout, into local (one
 * buffer per part, allocated by the caller with dtl_qlayout_local_boxes' bytes, in the memory of the layout's mesh
 * like dtl_safetensors_read's local; the parts the format lacks are not touched). Each part is a tensor of its
 * own in the file, names[dtl_qpart] (DTL_QUANT_NUM_PARTS entries, NULL exactly for the parts the format lacks),
 * and must have the part's dtype (FP8 codes: F8_E4M3 or F8_E5M2, the format's code_dtype; GPTQ/AWQ codes, zeros
 * and g_idx: I32; scales: the format's scale_dtype) and global shape (dtl_qpart_box.global_shape; a scales tensor
 * may add or drop dims of size 1, which hold the same bytes: FP8_TENSOR's scale as [] or [1], FP8_CHANNEL's as
 * [R, 1] or [R]). Each rank reads only the box of each part that its codes need (every scale block they touch,
 * so a block a cut splits is read by both ranks; act-order GPTQ: every group's scales and zeros, and the g_idx of
 * its input channels) with the positioned reads of dtl_safetensors_read. Before anything is written, the scales
 * and g_idx of those boxes are read once through at most 1 MiB of host memory and checked: a NaN or infinite
 * scale, or a g_idx outside 0..groups-1, is DTL_ERR_INVALID_ARGUMENT naming the tensor, the element and its value,
 * e.g.
 *   dtl_safetensors_qread: m.safetensors: tensor "w.weight_scale_inv" (scales): element [1,2] = nan (expected a
 *   finite scale)
 * So is every other failure, with local untouched: a name not in the file, a dtype or shape the format does not
 * give (naming the tensor, the part, the dim and the numbers: "dim 1 is 3, expected ceil(500 / 128) = 4 (blocks of the
 * tensor's dim 1)"), a name for a part the format lacks, the file truncated since it was opened; only an I/O error while
 * the boxes are read may leave local partly written, as for dtl_safetensors_read. Peak memory: local plus the
 * dense reader's bound. GGUF kinds are not stored in safetensors files: DTL_ERR_UNSUPPORTED.
 * Purely local, like every read here. */
DTL_API dtl_status dtl_safetensors_qread(const dtl_safetensors *f, const char *const *names, const dtl_qlayout *layout,
                                         dtl_qbuf *local);
/* The same with the part names of Hugging Face checkpoints under prefix ("model.layers.0.mlp.down_proj"):
 *   fp8-block               <prefix>.weight, <prefix>.weight_scale_inv (DeepSeek-V3, Qwen3-FP8), or
 *                           <prefix>.weight_scale when the file has no _inv (compressed-tensors' block format)
 *   fp8-channel, fp8-tensor <prefix>.weight, <prefix>.weight_scale (compressed-tensors, FBGEMM), or _scale_inv
 *   gptq                    <prefix>.qweight, .scales, .qzeros, and .g_idx with DTL_QFMT_ACT_ORDER (AutoGPTQ,
 *                           GPTQModel; the qzeros hold zero - 1, quant.h)
 *   awq                     <prefix>.qweight, .scales, .qzeros (AutoAWQ)
 * A prefix of more than 479 bytes is DTL_ERR_INVALID_ARGUMENT. */
DTL_API dtl_status dtl_safetensors_qread_hf(const dtl_safetensors *f, const char *prefix, const dtl_qlayout *layout,
                                            dtl_qbuf *local);

/* Writing: begin, add tensors and metadata, end. Each add writes its data at once to a temporary file next to
 * path (already unlinked, so nothing is left behind), so the writer holds no tensor in memory; end writes
 * path: the header (names sorted, padded with spaces so that the data starts 8-byte aligned, as the Python
 * package does), then the data in the order the tensors were added. Data is host memory. A distributed
 * tensor is written by one rank after dtl_full_tensor (the dense tensor on every rank):
 *   dtl_full_tensor(layout, local, dense);
 *   if (rank == 0) { dtl_safetensors_write_begin(path, &w); dtl_safetensors_write_add(w, "w", ...dense);
 *                    dtl_safetensors_write_end(w); }
 *   dtl_barrier(comm);   (before other ranks open path)
 * A failed add leaves the writer as it was; end and cancel free the writer whatever happens (a failed end
 * removes path). */
typedef struct dtl_safetensors_writer dtl_safetensors_writer;
DTL_API dtl_status dtl_safetensors_write_begin(const char *path, dtl_safetensors_writer **out);
/* name: a UTF-8 string, not "__metadata__", not added before; ndim 0..DTL_MAX_TENSOR_DIMS (shape may be NULL
 * when 0); dims >= 0; data: the dense row-major tensor (may be NULL when it has no elements). */
DTL_API dtl_status dtl_safetensors_write_add(dtl_safetensors_writer *w, const char *name, dtl_dtype dtype, int ndim,
                                             const int64_t *shape, const void *data);
/* One "__metadata__" entry (UTF-8 key and value; a later value for the same key replaces the earlier). */
DTL_API dtl_status dtl_safetensors_write_metadata(dtl_safetensors_writer *w, const char *key, const char *value);
DTL_API dtl_status dtl_safetensors_write_end(dtl_safetensors_writer *w);
/* Discards the writer without writing path; accepts NULL. */
DTL_API void dtl_safetensors_write_cancel(dtl_safetensors_writer *w);

#ifdef __cplusplus
}
#endif
#endif

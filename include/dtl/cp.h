/* SPDX-License-Identifier: Apache-2.0 */
/* Context parallelism (CP) for long sequences: attention whose tokens are split over the ranks of one mesh
 * dim, and the attention-state merge it is built on.
 *
 * Attention states. A partial attention result over one set of keys is o [T, H, D] (row-major, a token's H
 * heads of D values each), normalised by that set's softmax denominator, and lse [T, H] (f32, the natural log
 * of the denominator with the max included: log sum_j exp(s_ij); -inf for a row that saw no key, whose o is
 * 0). Results over disjoint key sets merge exactly: lse = log(e^lse_a + e^lse_b), o = e^(lse_a - lse) o_a +
 * e^(lse_b - lse) o_b, an empty side weighing exactly nothing.
 *
 * Three ways to run attention over a sequence split by tokens (S(0)) over the CP group:
 *   ring      dtl_cp_ring_attention: K/V blocks travel around the ring (p - 1 send/recv steps, on MPI each
 *             overlapped with the attention on the block in hand) and the partial results merge by lse.
 *             Any head count; each rank receives 2 (p-1)/p T kv_heads D elements per call.
 *   all-to-all dtl_cp_ulysses_attention (DeepSpeed-Ulysses): one all-to-all turns token shards into head
 *             shards, each rank attends its heads over the whole sequence, one all-to-all turns them back.
 *             Needs heads that split over the group (the TP head rule, dtl_cp_ulysses_heads).
 *   decode    dtl_cp_decode_attention: new query tokens (on every rank) attend a KV cache split by tokens;
 *             one all-gather of lse and one reduction of o, no KV movement.
 *
 * Token layouts (dtl_cp_token_ranges): with DTL_CP_ZIGZAG (the default) the T tokens form 2p chunks of
 * torch.chunk sizes (ceil(T / 2p) each, the tail shorter or empty) and rank r holds chunk r followed by chunk
 * 2p-1-r, so that under a causal mask every rank has the same work; with DTL_CP_CONTIGUOUS rank r holds the
 * one chunk(T, p, r) of a plain S(0) split. Positions are global token indices 0..T-1; the causal mask lets
 * token i see keys 0..i. q, k and v come already projected (and rotated: apply RoPE before the call).
 *
 * Memory, dtypes, threads: buffers live in the memory of the context's communicator (host for MPI, CUDA
 * device memory for NCCL, the device current on the calling thread). On the host attention computes in f32
 * (OpenBLAS); on a device in f32, f16 or bf16 with f32 scores, softmax, lse and accumulation (partial results
 * are merged in f32 and rounded once on store), enqueued on the communicator's stream (the call returns
 * before the work is done). A context owns grow-only scratch, so repeated calls of the same shapes acquire no
 * memory of their own after the first (the MPI transport still allocates its requests and count arrays per
 * call); like everything built on a communicator it is used by one thread at a time, and
 * every rank of the CP group makes the same calls in the same order with the same global shapes.
 * Failures return a status and a message naming the argument; arguments are checked and all memory acquired
 * before any output is written or any communication starts. */
#ifndef DTL_CP_H
#define DTL_CP_H

#include "dtl/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------- */
/* Attention states                                                                                     */
/* ---------------------------------------------------------------------------------------------------- */
/* Merges state b into state a in place, on host memory in f32: for each of the T x H rows, lse_a and o_a get
 * the merge of (o_a, lse_a) and (o_b, lse_b); b is only read. o arrays are [T, H, D], lse arrays [T, H].
 * Exact for empty rows: merging with an empty row (-inf) leaves the other side's bits, two empty rows stay
 * empty (lse -inf, no NaN from -inf - -inf). Merging is symmetric: swapping a and b gives the same bits;
 * a different grouping of three or more states differs by rounding only. lse values must be finite or -inf. */
DTL_API dtl_status dtl_attn_state_merge(int64_t T, int64_t H, int64_t D, float *o_a, float *lse_a, const float *o_b,
                                        const float *lse_b);
/* The same in the memory of communicator c with o of dtype t (f32, f16 or bf16; lse always f32; f32
 * arithmetic, one rounding to t on store). Host memory (MPI): computed before returning. Device memory
 * (NCCL): one CUDA kernel enqueued on c's stream. Nothing is communicated. */
DTL_API dtl_status dtl_attn_state_merge_on(const dtl_comm *c, dtl_dtype t, int64_t T, int64_t H, int64_t D, void *o_a,
                                           float *lse_a, const void *o_b, const float *lse_b);

/* ---------------------------------------------------------------------------------------------------- */
/* Context                                                                                              */
/* ---------------------------------------------------------------------------------------------------- */
typedef struct dtl_cp_context dtl_cp_context;

/* The bits of this header's params structs share one numbering (a bit in the wrong field or struct is
 * DTL_ERR_INVALID_ARGUMENT naming it, like any bit dtl does not define). */
#define DTL_CP_OPT_DTYPE DTL_BIT(0)    /* mask, options: dtype is read (default DTL_FLOAT32) */
#define DTL_CP_SCALE DTL_BIT(1)        /* mask, attention and decode: scale is read (default 1/sqrt(head_dim)) */
#define DTL_CP_CAUSAL DTL_BIT(2)       /* flags, attention and decode: token i sees keys at positions <= i */
#define DTL_CP_KV_POSITIONS DTL_BIT(3) /* mask, decode: kv_pos is read (default kv_pos0, kv_pos0 + 1, ...) */

typedef struct {
  uint64_t mask;   /* DTL_CP_OPT_DTYPE */
  uint64_t flags;  /* none defined yet: 0 */
  dtl_dtype dtype; /* of q, k, v, o: f32 on the host (f16/bf16 host contexts run dtl_cp_state_reduce only);
                      f32, f16 or bf16 on a device */
} dtl_cp_options;

/* mesh must have communicators; cp_dim in 0..ndim-1 names the CP group; opt may be NULL. The context keeps
 * a reference to mesh: destroy it before the mesh. Local (no communication). */
DTL_API dtl_status dtl_cp_context_create(const dtl_mesh *mesh, int cp_dim, const dtl_cp_options *opt,
                                         dtl_cp_context **out);
DTL_API int dtl_cp_context_size(const dtl_cp_context *ctx); /* CP group size p; -1 for NULL */
DTL_API int dtl_cp_context_rank(const dtl_cp_context *ctx); /* this rank's CP coordinate; -1 for NULL */
DTL_API const dtl_mesh *dtl_cp_context_mesh(const dtl_cp_context *ctx);
DTL_API dtl_comm *dtl_cp_context_comm(const dtl_cp_context *ctx); /* the CP dim's communicator */
DTL_API void dtl_cp_context_destroy(dtl_cp_context *ctx);

/* ---------------------------------------------------------------------------------------------------- */
/* Token layouts                                                                                        */
/* ---------------------------------------------------------------------------------------------------- */
typedef enum {
  DTL_CP_ZIGZAG = 0,    /* 2p torch.chunk chunks; rank r holds chunk r, then chunk 2p-1-r */
  DTL_CP_CONTIGUOUS = 1 /* rank r holds chunk(T, p, r), the S(0) split of dtl layouts */
} dtl_cp_token_layout;

typedef struct {
  int64_t offset, count;
} dtl_cp_range;

/* The global token rows that rank `rank` of a CP group of cp ranks holds, in its local order: its local row
 * 0 is global row ranges[0].offset, local rows ranges[0].count.. continue with ranges[1] (count 0 for
 * DTL_CP_CONTIGUOUS, and wherever T is too short to reach a chunk). Example, T = 10, cp = 2, zig-zag: chunks
 * of 3,3,3,1; rank 0 holds rows 0-2 and 9, rank 1 rows 3-5 and 6-8. Pure: callable on any thread. */
DTL_API dtl_status dtl_cp_token_ranges(dtl_cp_token_layout layout, int64_t T, int cp, int rank,
                                       dtl_cp_range ranges[2]);

/* ---------------------------------------------------------------------------------------------------- */
/* Prefill: attention over a sequence split by tokens                                                   */
/* ---------------------------------------------------------------------------------------------------- */
/* One sequence of `tokens` tokens (T, the global length) in `layout` over the CP group; n = this rank's token
 * count (dtl_cp_token_ranges). q [n, q_heads * head_dim], k and v [n, kv_heads * head_dim] are this rank's
 * rows in its local order; out [n, q_heads * head_dim] gets softmax(scale q k^T) v of the same rows over the
 * whole sequence (causal with DTL_CP_CAUSAL); lse [n, q_heads] (f32, an optional output) gets each row's
 * log-sum-exp. GQA: q head h uses kv head h / (q_heads / kv_heads); q_heads % kv_heads == 0. */
typedef struct {
  uint64_t mask;  /* DTL_CP_SCALE */
  uint64_t flags; /* DTL_CP_CAUSAL */
  int64_t tokens;
  int64_t q_heads, kv_heads, head_dim;
  dtl_cp_token_layout layout;
  float scale; /* with DTL_CP_SCALE */
} dtl_cp_attention_params;

/* Ring attention: at step s rank r attends its queries to the K/V block of rank r - s, having started the
 * transfer of that block to rank r + 1 (dtl_sendrecv_async on MPI, progressed between attention tiles, so it
 * overlaps the compute; on NCCL the transfer is enqueued on the communicator's stream before the step's
 * kernels), and merges the partial result into an f32 accumulator by lse. Under the causal mask, chunk pairs
 * wholly in the future are skipped and those wholly in the past computed without a mask; with the zig-zag
 * layout each rank then computes the same number of scores at every step. */
DTL_API dtl_status dtl_cp_ring_attention(dtl_cp_context *ctx, const dtl_cp_attention_params *p, const void *q,
                                         const void *k, const void *v, void *out, float *lse);

/* All-to-all (DeepSpeed-Ulysses) attention: one dtl_all_to_allv sends each rank the columns of its heads
 * (dtl_cp_ulysses_heads) for this rank's tokens, each rank attends its heads over all T tokens (in global
 * order), and one dtl_all_to_allv returns the outputs; a second, of f32, returns lse on every call (lse NULL
 * only skips writing it: a rank without tokens passes NULL for its empty buffers, and the collectives a rank
 * enters never depend on that). Heads that do not split by the rule are DTL_ERR_INVALID_ARGUMENT naming the
 * numbers. */
DTL_API dtl_status dtl_cp_ulysses_attention(dtl_cp_context *ctx, const dtl_cp_attention_params *p, const void *q,
                                            const void *k, const void *v, void *out, float *lse);
/* The heads this rank attends in dtl_cp_ulysses_attention: the TP head rule over the CP group
 * (dtl_tp_attention_heads): kv heads split by torch.chunk when p <= kv_heads (a rank may get none), each kv
 * head replicated on p / kv_heads ranks when p > kv_heads (then p % kv_heads == 0 and q_heads % p == 0 are
 * required). q and kv are optional outputs (both NULL: only checks that the heads split). */
DTL_API dtl_status dtl_cp_ulysses_heads(const dtl_cp_context *ctx, int64_t q_heads, int64_t kv_heads, dtl_cp_range *q,
                                        dtl_cp_range *kv);

/* ---------------------------------------------------------------------------------------------------- */
/* Decode: new tokens against a KV cache split by tokens                                                */
/* ---------------------------------------------------------------------------------------------------- */
/* q [tokens, q_heads * head_dim] holds the same new query tokens on every CP rank, at positions q_pos0,
 * q_pos0 + 1, ...; k_cache and v_cache [kv_tokens, kv_heads * head_dim] are this rank's part of the cache
 * (kv_tokens may differ between ranks, 0 included), at positions kv_pos0, kv_pos0 + 1, ... or kv_pos[j] (an
 * array of kv_tokens in the context's memory). Each rank attends q to its part; the partial states merge
 * with one dtl_all_gather of lse and one dtl_all_reduce of o, so out [tokens, q_heads * head_dim] and lse
 * [tokens, q_heads] (an optional output) get attention over the whole cache on every rank. With
 * DTL_CP_CAUSAL a query sees the keys at positions <= its own (several new tokens: each sees the earlier
 * ones, wherever they are cached). */
typedef struct {
  uint64_t mask;  /* DTL_CP_SCALE, DTL_CP_KV_POSITIONS */
  uint64_t flags; /* DTL_CP_CAUSAL */
  int64_t tokens;
  int64_t q_heads, kv_heads, head_dim;
  int64_t q_pos0;
  int64_t kv_tokens;
  int64_t kv_pos0;
  const int64_t *kv_pos; /* with DTL_CP_KV_POSITIONS */
  float scale;           /* with DTL_CP_SCALE */
} dtl_cp_decode_params;

DTL_API dtl_status dtl_cp_decode_attention(dtl_cp_context *ctx, const dtl_cp_decode_params *p, const void *q,
                                           const void *k_cache, const void *v_cache, void *out, float *lse);

/* The collective merge: every rank holds a state (o [T, H, D] of the context's dtype, lse [T, H]) over its own
 * keys for the same T x H rows; out gets their merge. One dtl_all_gather of lse, a local rescale of o by
 * e^(lse_rank - lse_merged), then one reduction of o: out_placement R = dtl_all_reduce (out [T, H, D] on every
 * rank) or S(0) = dtl_reduce_scatterv over tokens (out gets this rank's chunk(T, p, rank) rows). out_lse (an
 * optional output, rows as out) gets the merged lse. o and lse are read before out and out_lse are written,
 * so out may be o and out_lse may be lse. The sum runs in the dtype (f16/bf16 reductions round at the
 * engine's steps). */
DTL_API dtl_status dtl_cp_state_reduce(dtl_cp_context *ctx, int64_t T, int64_t H, int64_t D, const void *o,
                                       const float *lse, dtl_placement out_placement, void *out, float *out_lse);

/* ---------------------------------------------------------------------------------------------------- */
/* Measuring                                                                                            */
/* ---------------------------------------------------------------------------------------------------- */
/* What the last dtl_cp_ring_attention on ctx did on this rank (host wall-clock seconds; on a device, the time
 * to enqueue). comm_seconds is the time spent inside communication calls (starting, polling and completing
 * the K/V transfers): the part of the communication that compute did not hide. */
typedef struct {
  double seconds, compute_seconds, comm_seconds;
  int64_t bytes_received;
  int steps, pairs_computed, pairs_skipped;
} dtl_cp_ring_stats;
DTL_API dtl_status dtl_cp_ring_last_stats(const dtl_cp_context *ctx, dtl_cp_ring_stats *out);

#ifdef __cplusplus
}
#endif
#endif

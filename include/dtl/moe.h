/* SPDX-License-Identifier: Apache-2.0 */
/* Mixture-of-experts expert parallelism: a router (top-k over gate scores), the placement of experts over an
 * expert-parallel group, a reusable dispatch layout, and dispatch / expert compute / combine over dtl's
 * all-to-all-v. One MoE layer on each rank of the group reads:
 *
 *   dtl_moe_router_topk(logits, T, E, k, NULL, ids, weights);                    host, per token
 *   dtl_moe_layout_create(c, placement, T, k, ids, weights, H, DTL_FLOAT32, NULL, &L);    collective
 *   dtl_moe_layout_dispatch(L, x, expert_in);                                    collective
 *   dtl_moe_experts_run(L, expert_in, expert_out, dtl_moe_mlp_forward, &mlp);    local
 *   dtl_moe_layout_combine(L, expert_out, y);                                    collective
 *
 * With DTL_MOE_LAYOUT_FP8_DISPATCH the dispatch moves FP8 codes plus per-token-per-128 scales (DeepEP's format)
 * instead of dtype rows, and combine stays in dtype (FP8 dispatch, below).
 *
 * Memory. Routing (ids, weights, logits) and every count are host arrays. Token rows (x, expert_in,
 * expert_out, y) live in the communicator's memory: host for MPI, CUDA device memory for NCCL; dtl moves
 * them with the transport's own copies and collectives. The integer counts are exchanged on the host: with
 * an MPI communicator through c itself; with a device communicator through a host communicator the caller
 * passes as params.count_comm (an MPI communicator over the same processes in the same rank order, e.g.
 * the one the NCCL communicator was bootstrapped from). That keeps the layout free of device round trips.
 *
 * Dispatch order. Every rank sends the (token, slot) pairs it keeps to the owners of their experts. On the
 * receiving rank the rows of each local expert form one contiguous block (local experts in increasing
 * global id); inside a block come this rank's own tokens first, then those of the other ranks in increasing
 * rank order, each source in its original token order (for one token routed twice to an expert: slot
 * order). The inverse of that permutation is what combine applies. Only token rows travel: ids and weights
 * stay on the token's own rank, where combine applies the weights to the rows that come back. */
#ifndef DTL_MOE_H
#define DTL_MOE_H

#include "dtl/comm.h"
#include "dtl/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- Router ------------------------------------------------------------------------------------------ */
typedef enum {
  DTL_MOE_SCORES_LOGITS = 0,       /* softmax over each row first; -inf allowed (probability 0), NaN/+inf not */
  DTL_MOE_SCORES_PROBABILITIES = 1 /* used as they are: each finite and >= 0 (rows need not sum to 1) */
} dtl_moe_scores;

/* Fields are read only when their bit is set in mask; a zeroed struct (or NULL) means the defaults. flags
 * selects behaviour (none defined yet: 0). A bit outside those defined is DTL_ERR_INVALID_ARGUMENT. */
#define DTL_MOE_ROUTER_SCORES DTL_BIT(0)      /* scores; default DTL_MOE_SCORES_LOGITS */
#define DTL_MOE_ROUTER_RENORMALIZE DTL_BIT(1) /* renormalize; default 0 */
typedef struct {
  uint64_t mask;
  uint64_t flags;
  dtl_moe_scores scores;
  int renormalize; /* non-zero: the kept weights of a token are divided by their sum (when it is > 0) */
} dtl_moe_router_params;

/* scores [tokens, experts] (row-major, host) -> ids and weights [tokens, k] (host): each token's k largest
 * probabilities in decreasing order, ties broken by the lower expert id. A pick whose probability is 0 is
 * written as id -1 with weight 0 (a masked slot, skipped by dispatch and combine). Pure; no communication.
 * Bad input: experts < 1, k outside 1..experts, tokens < 0, a NaN / +inf logit, a row of all -inf logits,
 * a NaN, infinite or negative probability; nothing is written then. */
DTL_API dtl_status dtl_moe_router_topk(const float *scores, int64_t tokens, int experts, int k,
                                       const dtl_moe_router_params *params, int32_t *ids, float *weights);

/* --- Expert placement -------------------------------------------------------------------------------- */
typedef struct dtl_moe_placement dtl_moe_placement;

/* experts over ranks (the expert-parallel group's size). owner == NULL lays them out in contiguous blocks
 * by torch.chunk's rule (ceil(experts/ranks) each, trailing ranks fewer or none: 5 experts on 4 ranks own
 * 2,2,1,0); otherwise owner[e] is the rank of expert e, each in 0..ranks-1, so no expert is ever unowned
 * and a rank may own none. A rank's local experts are its experts in increasing global id (local index
 * 0, 1, ...). Pure; the placement may be destroyed once the layouts that use it are created. */
DTL_API dtl_status dtl_moe_placement_create(int experts, int ranks, const int *owner, dtl_moe_placement **out);
DTL_API void dtl_moe_placement_destroy(dtl_moe_placement *p);
DTL_API int dtl_moe_placement_experts(const dtl_moe_placement *p); /* -1 for NULL */
DTL_API int dtl_moe_placement_ranks(const dtl_moe_placement *p);   /* -1 for NULL */
/* The rank owning expert; -1 when expert is out of range. */
DTL_API int dtl_moe_placement_owner(const dtl_moe_placement *p, int expert);
/* How many experts rank owns; -1 when rank is out of range. */
DTL_API int dtl_moe_placement_local_count(const dtl_moe_placement *p, int rank);
/* The global id of rank's local expert number local; -1 when out of range. */
DTL_API int dtl_moe_placement_local_expert(const dtl_moe_placement *p, int rank, int local);

/* --- Dispatch layout --------------------------------------------------------------------------------- */
typedef struct dtl_moe_layout dtl_moe_layout;

typedef enum {
  DTL_MOE_DROP_POSITION = 0,   /* an expert keeps the first `capacity` pairs in (token, slot) order */
  DTL_MOE_DROP_PROBABILITY = 1 /* an expert keeps the `capacity` highest weights, ties by (token, slot) order */
} dtl_moe_drop_policy;

/* How the rows travel. PER_EXPERT runs one all-to-all-v per local-expert index (max local experts over the
 * group) and lands every row at its final place: no copy besides the pack. SINGLE runs one all-to-all-v and
 * regroups the received rows by expert (one more local copy each way, fewer collective calls: better for
 * small messages, e.g. decode). AUTO picks PER_EXPERT when there is one expert per rank or the average
 * message is at least DTL_MOE_SINGLE_EXCHANGE_BYTES, SINGLE otherwise (the same choice on every rank). With at
 * most one expert per rank the two coincide and a layout reports PER_EXPERT. */
typedef enum {
  DTL_MOE_EXCHANGE_AUTO = 0,
  DTL_MOE_EXCHANGE_PER_EXPERT = 1,
  DTL_MOE_EXCHANGE_SINGLE = 2
} dtl_moe_exchange;
#define DTL_MOE_SINGLE_EXCHANGE_BYTES (64 * 1024)

/* Field-presence bits of mask, as for the router; flags: DTL_MOE_LAYOUT_FP8_DISPATCH (FP8 dispatch, below). */
#define DTL_MOE_LAYOUT_CAPACITY_FACTOR DTL_BIT(0) /* capacity_factor; default: dropless */
#define DTL_MOE_LAYOUT_DROP_POLICY DTL_BIT(1)     /* drop_policy; default DTL_MOE_DROP_POSITION */
#define DTL_MOE_LAYOUT_PAD_MULTIPLE DTL_BIT(2)    /* pad_multiple; default 1 (no padding) */
#define DTL_MOE_LAYOUT_EXCHANGE DTL_BIT(3)        /* exchange; default DTL_MOE_EXCHANGE_AUTO */
#define DTL_MOE_LAYOUT_VERIFY DTL_BIT(4)          /* verify; default 1 */
#define DTL_MOE_LAYOUT_COUNT_COMM DTL_BIT(5)      /* count_comm; default: c (required when c is on device) */
#define DTL_MOE_LAYOUT_FP8_DISPATCH DTL_BIT(6)    /* flags: dispatch moves FP8 codes + scales, not dtype rows */
typedef struct {
  uint64_t mask;
  uint64_t flags;
  /* Capacity, as in GShard / Switch Transformer and Megatron-LM's get_capacity: per source rank and expert,
   * capacity = ceil(tokens * k / experts * capacity_factor) where tokens is this rank's token count (masked
   * slots included). Each rank drops locally, before any communication, the pairs beyond capacity that it
   * routes to an expert, by drop_policy. Must be finite and > 0. */
  double capacity_factor;
  dtl_moe_drop_policy drop_policy;
  /* Each local expert's block in the expert buffers is rounded up to a multiple of this (>= 1), for grouped
   * GEMMs. Padding rows of expert_in are zero after dispatch; those of expert_out are never read. */
  int64_t pad_multiple;
  dtl_moe_exchange exchange;
  /* Non-zero (or DTL_CHECK on count_comm): dispatch and combine first agree on the host communicator on
   * (a) every rank's verdict on its own arguments, so a NULL buffer on one rank fails every rank instead of
   * leaving the others in the all-to-all, and (b) the layout's id, drawn at creation and equal on all ranks
   * of one dtl_moe_layout_create: a rank passing a layout of another creation (e.g. a stale decode step
   * whose counts its peers no longer expect) gets DTL_ERR_MISMATCH on every rank before any row moves.
   * Layouts of one creation always agree on every count, so nothing else can disagree. Zero (without
   * DTL_CHECK) saves that all-reduce (a few microseconds) per call; a mix of layouts then goes undetected (the engine may fail
   * with DTL_ERR_COMM, hang or deliver rows to the wrong places). */
  int verify;
  /* A host (MPI) communicator over the same processes in the same rank order as c, for the count exchange
   * and the checks; it must outlive the layout. */
  dtl_comm *count_comm;
} dtl_moe_layout_params;

/* Collective over c (and count_comm). Builds this rank's half of a dispatch for tokens tokens of hidden
 * elements of dtype, each routed to k experts by ids [tokens, k] (host; -1 = masked slot, skipped) with
 * weights [tokens, k] (host; finite and >= 0 where the id is not -1), over placement p (whose ranks must
 * equal the size of c). It drops pairs beyond capacity, computes the stable permutation and its inverse,
 * exchanges the per-expert counts with one all-to-all of integers and allocates the send/receive staging.
 * The layout copies what it needs from ids, weights and p; keep it to dispatch again with the same routing
 * (decode steps) and to combine.
 * Errors on every rank, no hang: every argument (out and params included) and every allocation whose size
 * is known beforehand is checked before one agreement; the maps and receive staging sized by the count
 * exchange are checked by a second one after it. If any rank fails (ids outside -1..experts-1, k < 1 or
 * k > experts, a NaN, infinite or negative weight, capacity_factor <= 0, out=NULL, no memory, ...) every rank
 * returns an error: that rank its own message naming the value, the others the same status naming the
 * rank. If ranks disagree on what must be common (experts, placement table, k, hidden, dtype, capacity
 * factor, policy, padding, exchange, verify, FP8 dispatch), every rank returns DTL_ERR_MISMATCH naming the
 * argument: the counts one rank would send would then differ from what its peers expect. The agreement runs
 * on c when it is a host communicator, on count_comm when c is a device one (no device round trip). Checked on the
 * calling rank alone, since they leave no channel to the peers: c NULL or aborted, and for a device c a
 * count_comm that is missing, NULL, a device communicator, aborted or over other ranks. Not detectable:
 * ranks that do not call at all (a hang, as for any collective). */
DTL_API dtl_status dtl_moe_layout_create(dtl_comm *c, const dtl_moe_placement *p, int64_t tokens, int k,
                                         const int32_t *ids, const float *weights, int64_t hidden, dtl_dtype dtype,
                                         const dtl_moe_layout_params *params, dtl_moe_layout **out);
/* Local. Frees the staging (before the communicators are destroyed); the communicators stay the caller's. */
DTL_API void dtl_moe_layout_destroy(dtl_moe_layout *L);

/* Rows of the expert buffers (expert_in, expert_out) on this rank, padding included: each buffer holds
 * rows x hidden elements. -1 for NULL. */
DTL_API int64_t dtl_moe_layout_expert_rows(const dtl_moe_layout *L);
/* This rank's local expert count; -1 for NULL. */
DTL_API int dtl_moe_layout_local_experts(const dtl_moe_layout *L);
/* How this layout's rows travel: DTL_MOE_EXCHANGE_PER_EXPERT or DTL_MOE_EXCHANGE_SINGLE (AUTO resolved, the
 * same on every rank); DTL_MOE_EXCHANGE_AUTO for NULL. */
DTL_API dtl_moe_exchange dtl_moe_layout_exchange(const dtl_moe_layout *L);
/* The capacity per (this rank, expert); -1 when dropless or for NULL. */
DTL_API int64_t dtl_moe_layout_capacity(const dtl_moe_layout *L);
/* For each local expert j (0..local_experts-1): rows[j] received (from every rank, padding excluded) and
 * offset[j], the first row of its block in the expert buffers. rows and offset are optional outputs. */
DTL_API dtl_status dtl_moe_layout_expert_counts(const dtl_moe_layout *L, int64_t *rows, int64_t *offset);
/* For each global expert e (0..experts-1), this rank's (token, slot) pairs sent to it (kept[e]) and dropped
 * for capacity (dropped[e]). Masked slots count in neither. kept and dropped are optional outputs. */
DTL_API dtl_status dtl_moe_layout_token_counts(const dtl_moe_layout *L, int64_t *kept, int64_t *dropped);

/* Collective. x [tokens, hidden] -> expert_in [expert_rows, hidden], both in the communicator's memory, in
 * the dispatch order above (on an FP8 layout, the rows dequantized from FP8: see FP8 dispatch). x is not
 * modified. Callable any number of times with the same layout; one layout serves one dispatch or combine at a
 * time (they share its staging). On a device communicator the work is enqueued on its stream. */
DTL_API dtl_status dtl_moe_layout_dispatch(dtl_moe_layout *L, const void *x, void *expert_in);
/* FP8 dispatch, DeepEP's format (a layout made with DTL_MOE_LAYOUT_FP8_DISPATCH in params.flags, of dtype f32, f16
 * or bf16: any other dtype is DTL_ERR_INVALID_ARGUMENT at creation). Each token row travels as hidden e4m3 codes
 * (DTL_FLOAT8_E4M3) and one f32 scale per 128 columns (ceil(hidden / 128) of them, the last block of a row shorter
 * when 128 does not divide hidden), per block of a row:
 *   amax = max(max |x|, 1e-4);  code = e4m3(x * (448 / amax));  scale = amax * (1 / 448);  value = code * scale
 * every step an f32 operation rounded to nearest even, codes saturating at +-448 (an all-zero block: zero codes,
 * scale 1e-4 / 448). A row is quantized once on its own rank however many experts it goes to, and the one
 * all-to-all-v of a plain dispatch moves its codes and scales together: hidden + 4 ceil(hidden / 128) bytes a row
 * (plus up to 3 bytes that align the scales), 0.52x of a bf16 row at hidden 4096. Combine does not change: it moves
 * dtype rows. DTL_MOE_EXCHANGE_AUTO decides on the dtype rows' bytes, so an FP8 layout travels like the plain
 * layout of its routing. On such a layout dtl_moe_layout_dispatch writes dtype rows, code * scale rounded once to
 * dtype, into expert_in: bit for bit what a plain layout's dispatch of dequantize(quantize(x)) writes, so
 * dtl_moe_experts_run and combine work as before; dtl_moe_layout_dispatch_fp8 hands the codes and scales
 * themselves to an FP8 GEMM. Host
 * memory: a NaN or infinite element of x is DTL_ERR_INVALID_ARGUMENT naming its token row and column, nothing is
 * written, and with verify every rank fails (as for any bad argument). Device memory: x is not checked (that would
 * wait for the stream); a NaN element dequantizes to NaN, an infinity makes its whole 128-column block NaN. */

/* Collective, on a layout made with DTL_MOE_LAYOUT_FP8_DISPATCH (else DTL_ERR_INVALID_ARGUMENT): x [tokens, hidden]
 * of the layout's dtype -> expert_codes [expert_rows, hidden] (e4m3 codes, one byte each) and expert_scales
 * [expert_rows, ceil(hidden / 128)] (f32), both row-major in the communicator's memory, rows in the dispatch order
 * above; padding rows get zero codes and zero scales. Otherwise as dtl_moe_layout_dispatch. */
DTL_API dtl_status dtl_moe_layout_dispatch_fp8(dtl_moe_layout *L, const void *x, void *expert_codes,
                                               void *expert_scales);
/* Collective. expert_out [expert_rows, hidden] (rows in dispatch order) -> y [tokens, hidden]:
 * y[t] = sum over slots s = 0..k-1 of weights[t, s] * (the expert's output row for (t, s)), summed in slot
 * order whatever the arrival order, so the result is the same on every run; masked and dropped slots add
 * nothing (a token with none kept gets a zero row). Floating dtypes only (f32/f64 accumulate in their own
 * type, f16/bf16 in f32). y must not overlap expert_out. */
DTL_API dtl_status dtl_moe_layout_combine(dtl_moe_layout *L, const void *expert_out, void *y);

/* --- Expert compute ---------------------------------------------------------------------------------- */
/* One local expert's block: in and out hold rows x hidden elements of dtype in the communicator's memory
 * (rows_padded x hidden are addressable, for grouped GEMMs). */
typedef struct {
  int expert;          /* global id */
  int local;           /* index among this rank's experts */
  int64_t rows, rows_padded, hidden;
  dtl_dtype dtype;
  dtl_memory memory;
  const void *in;
  void *out;
  const dtl_moe_layout *layout; /* the layout being run (NULL in a batch made by hand) */
} dtl_moe_expert_batch;
/* User code for one expert. A status other than DTL_OK stops dtl_moe_experts_run, which returns it. */
typedef dtl_status (*dtl_moe_expert_fn)(const dtl_moe_expert_batch *b, void *user);
/* Scratch for an expert callback: *out gets at least bytes in the batch's memory, valid until the callback
 * returns (a later call may hand out the same buffer; contents are not kept). It belongs to the layout and
 * only grows, so repeated dtl_moe_experts_run calls allocate nothing once warm. b->layout must be set. */
DTL_API dtl_status dtl_moe_expert_scratch(const dtl_moe_expert_batch *b, size_t bytes, void **out);

/* Local. Calls fn once per local expert, in local order, also for experts that received no rows (rows 0).
 * A failing rank must still take part in the combine its peers call (or they wait). With DTL_CHECK on
 * count_comm the call is collective instead: the ranks agree on the outcome after running their experts,
 * so one rank's failure is every rank's error and no rank goes on to combine. */
DTL_API dtl_status dtl_moe_experts_run(const dtl_moe_layout *L, const void *expert_in, void *expert_out,
                                       dtl_moe_expert_fn fn, void *user);

/* The SiLU-gated MLP expert (SwiGLU, as in Mixtral / Llama): out = (silu(in W_gate^T) * (in W_up^T)) W_down^T
 * with W_gate, W_up [ffn, hidden] and W_down [hidden, ffn], row-major f32, one set per local expert
 * (arrays indexed by the local index), through the GEMM of the tensor-parallel layers. Like those layers it
 * computes on the host in DTL_FLOAT32 (DTL_ERR_UNSUPPORTED otherwise; device experts are user callbacks).
 * Use as dtl_moe_experts_run(L, in, out, dtl_moe_mlp_forward, &mlp): its activations then live in the
 * layout's expert scratch (a batch without a layout allocates them per call). */
typedef struct {
  int64_t hidden, ffn;
  int local_experts; /* entries in each array below */
  const float *const *w_gate;
  const float *const *w_up;
  const float *const *w_down;
} dtl_moe_mlp;
DTL_API dtl_status dtl_moe_mlp_forward(const dtl_moe_expert_batch *b, void *mlp);

/* The same expert on quantized weights (<dtl/quant.h>): gate and up [experts, ffn, hidden] and down [experts,
 * hidden, ffn], each a 3-D quantized tensor whose leading dim is the global expert id, in any format. Each
 * layout's local box on this rank (host memory: the parts in *_local) must hold whole matrices of the experts
 * it covers, and those must include every expert this rank runs: e.g. S(0) on a mesh of the expert-parallel
 * ranks, which matches the contiguous dtl_moe_placement (owner NULL), or Replicate for any placement.
 * dtl_moe_qmlp_create copies the three boxes (the weights are borrowed) and checks them once (every scale
 * finite, zero points and g_idx in range); it is local (no communication). A NULL layout or part buffer, another
 * shape, a box that cuts the matrices, device memory, a NaN scale: DTL_ERR_INVALID_ARGUMENT (device memory:
 * DTL_ERR_UNSUPPORTED) naming the field, and nothing is created.
 * dtl_moe_qmlp_forward is the dtl_moe_expert_fn: dtl_moe_experts_run(L, in, out, dtl_moe_qmlp_forward, qmlp)
 * gives dtl_moe_mlp_forward's result on the dequantized weights up to f32 rounding. On the host, f32; each
 * weight is dequantized one tile of at most 128 x 512 elements at a time, in the layout's expert scratch after
 * the activations. An expert outside the boxes is DTL_ERR_INVALID_ARGUMENT naming it. */
typedef struct {
  uint64_t mask;  /* no optional fields yet: 0 */
  uint64_t flags; /* none defined yet: 0 */
  int64_t hidden, ffn;
  const dtl_qlayout *gate, *up, *down;
  dtl_qbuf gate_local, up_local, down_local;
} dtl_moe_qmlp_params;
typedef struct dtl_moe_qmlp dtl_moe_qmlp;
DTL_API dtl_status dtl_moe_qmlp_create(const dtl_moe_qmlp_params *p, dtl_moe_qmlp **out);
DTL_API dtl_status dtl_moe_qmlp_forward(const dtl_moe_expert_batch *b, void *qmlp);
DTL_API void dtl_moe_qmlp_destroy(dtl_moe_qmlp *m);

#ifdef __cplusplus
}
#endif
#endif

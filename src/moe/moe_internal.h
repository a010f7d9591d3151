/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. It defines the MoE placement and dispatch layout objects shared by the
 * files of src/moe/, and the pure local step of a layout (capacity drops and the stable permutation) that
 * the unit tests check without communication. */
#ifndef DTL_MOE_INTERNAL_H
#define DTL_MOE_INTERNAL_H

#include "comm/backend.h"
#include "dtl/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dtl_moe_placement {
  int experts, ranks, max_local;
  int *owner;   /* [experts] */
  int *local;   /* [experts] index of the expert among its owner's experts */
  int *first;   /* [ranks + 1] offsets into by_rank */
  int *by_rank; /* [experts] experts grouped by owner, increasing id inside a group */
};

/* capacity = ceil(tokens * k / experts * factor), Megatron-LM's get_capacity() over this rank's pairs. */
int64_t dtl__moe_capacity(int64_t tokens, int k, int experts, double factor);

/* The local half of a dispatch: what survives capacity and in which order, from this rank's routing alone. */
typedef struct {
  int64_t pairs;    /* tokens * k */
  int64_t kept_all; /* pairs kept, over all experts */
  int64_t *kept;    /* [experts] */
  int64_t *dropped; /* [experts] */
  int64_t *start;   /* [experts + 1]: expert e's pairs are perm[start[e] .. start[e+1]) */
  int64_t *perm;    /* [kept_all] pair index t*k+s, grouped by expert, (token, slot) order inside */
  int64_t *inv;     /* [pairs] index into perm; -1 for masked or dropped pairs */
} dtl__moe_route;

/* Checks ids [tokens, k] in -1..experts-1 and, where the id is not -1, weights finite and >= 0; the
 * message names fn, the first bad entry and its value. */
dtl_status dtl__moe_check_routing(const char *fn, const int32_t *ids, const float *weights, int64_t tokens, int k,
                                  int experts);
/* Builds the route of valid routing (checked above). capacity < 0 means dropless; weights are read only by
 * DTL_MOE_DROP_PROBABILITY. On failure nothing is left allocated. */
dtl_status dtl__moe_route_build(const int32_t *ids, const float *weights, int64_t tokens, int k, int experts,
                                int64_t capacity, dtl_moe_drop_policy policy, dtl__moe_route *out);
void dtl__moe_route_free(dtl__moe_route *r);

/* n rows from row src to row dst of one copy. */
typedef struct {
  int64_t src, dst, n;
} dtl__moe_run;

/* The same moves row by row, as the device gathers them in one launch: destination row dst[i] gets source row
 * src[i] (src[i] < 0: zeros). Destination rows below split are rows of the first destination buffer, the
 * others rows (dst[i] - split) of the second. */
typedef struct {
  const int64_t *src, *dst;
  int64_t n, split;
} dtl__moe_rowmap;

struct dtl_moe_layout {
  dtl_comm *comm, *count_comm; /* not owned */
  int rank, size, experts, k, local_experts, max_local;
  int64_t tokens, hidden;
  dtl_dtype dtype;
  size_t row_bytes;
  dtl_moe_exchange exchange; /* resolved: PER_EXPERT or SINGLE */
  bool verify;
  int64_t id; /* the same on every rank of one collective creation, different across creations */
  int64_t capacity;
  int *local_ids;          /* [local_experts] global ids */
  int64_t *kept, *dropped; /* [experts] */
  float *weights;          /* [tokens * k] */
  /* Where combine reads the expert output of pair t*k+s: -1 (masked or dropped); < send_rows: that row of
   * the send staging (the row came back from another rank); else row (slot_row - send_rows) of expert_out. */
  int64_t *slot_row;
  /* x rows -> send staging rows (dst < send_rows) or expert buffer rows (dst - send_rows), the pack. */
  dtl__moe_run *pack;
  int64_t npack;
  /* SINGLE: receive staging rows -> expert buffer rows (combine runs them backwards). */
  dtl__moe_run *regroup;
  int64_t nregroup;
  int64_t *block_off, *block_rows, *block_padded; /* [local_experts] in the expert buffers */
  int64_t expert_rows;
  int64_t send_rows, recv_rows; /* rows of the staging buffers: the pairs that cross to another rank */
  int calls;                    /* all-to-all-v calls per direction */
  size_t *send_counts, *recv_counts; /* [calls * size], elements */
  /* First row of call i's data in the send staging, and in the receiving region: the receive staging
   * (SINGLE) or the expert buffer (PER_EXPERT, each call lands in one expert's block after its own rows). */
  int64_t *send_base, *recv_base;
  void *send_buf, *recv_buf; /* staging, the communicator's memory */
  /* Host combine: one token's kept slots (k each), sized at creation. */
  const void **combine_in;
  float *combine_w;
  /* Grow-only scratch in the communicator's memory that dtl_moe_expert_scratch hands to expert callbacks,
   * reached through a pointer (allocated with the layout) so that it grows through a const layout. */
  struct dtl__moe_scratch {
    void *p;
    size_t bytes;
  } *expert_ws;
  /* FP8 dispatch (DTL_MOE_LAYOUT_FP8_DISPATCH): rows travel packed (quant/act_fp8.h: codes, then scales) in
   * fp8_row_bytes, so the staging buffers hold max(row_bytes, fp8_row_bytes) a row. fp8_x: x quantized, tokens
   * packed rows (the pack's source); fp8_in: expert_rows packed rows (where the rows land, then dequantized or
   * split); fp8_*_counts: the exchange's counts in bytes. */
  bool fp8;
  size_t fp8_row_bytes;
  void *fp8_x, *fp8_in;
  size_t *fp8_send_counts, *fp8_recv_counts; /* [calls * size] */
  /* A device layout (communicator in device memory): one buffer, uploaded at creation, holding slot_row and
   * weights for the combine kernel and the row maps of the gather kernel (pack: x -> send staging | expert_in
   * with the padding rows zeroed; regroup: receive staging -> expert_in, run backwards by combine). */
  void *device_map;
  const int64_t *dev_slot_row;
  const float *dev_weights;
  dtl__moe_rowmap dev_pack, dev_regroup;
};

/* What dispatch, FP8 dispatch and combine share (exchange.c). The agreement before any row moves (verify or
 * DTL_CHECK on count_comm; else local as it is); the check of a call's token and expert buffers; and one set of row
 * moves of rows of rb bytes: the runs (host) or the device map dev (one gather launch), from src to destination
 * rows below split in lo and the others in hi, backwards when reverse (destination rows become sources). */
dtl_status dtl__moe_agree(dtl_moe_layout *L, const char *fn, dtl_status local);
dtl_status dtl__moe_check_buffers(const char *fn, const dtl_moe_layout *L, const void *tokens_buf,
                                  const char *tokens_name, const void *expert_buf, const char *expert_name);
dtl_status dtl__moe_move(const dtl_moe_layout *L, size_t rb, const dtl__moe_run *runs, int64_t nruns,
                         const dtl__moe_rowmap *dev, bool reverse, const void *src, void *lo, void *hi, int64_t split);
/* FP8 dispatch (fp8.c): into expert_in (dequantized, dtype), or with raw into codes and scales. */
dtl_status dtl__moe_dispatch_fp8(dtl_moe_layout *L, const char *fn, const void *x, bool raw, void *expert_in,
                                 void *codes, void *scales);

/* The row maps of a layout's pack (with its padding rows) and regroup, in host arrays of 2 x (pack rows) and
 * 2 x (regroup rows) int64 that *buf points to (free with dtl__free; src of each map first, then dst). The
 * device layouts upload them; tests replay them with the host emulation of the gather kernel. */
dtl_status dtl__moe_rowmaps(const dtl_moe_layout *L, dtl__moe_rowmap *pack, dtl__moe_rowmap *regroup, int64_t **buf);

#if DTL_HAVE_NCCL
/* Device half of combine (src/moe/combine.cu): the same sum as the host one. */
dtl_status dtl__moe_combine_device(dtl_moe_layout *L, const void *expert_out, void *y);
/* The gather kernel (src/moe/gather.cu): every row of map in one launch on mem's stream and device, rows of
 * row_bytes bytes of any dtype (rows are bytes; the widest aligned word moves them). dst_lo/dst_hi as in
 * dtl__moe_rowmap; src must not overlap them. The map's arrays are in device memory. */
dtl_status dtl__moe_gather_rows_cuda(const dtl__mem *mem, const dtl__moe_rowmap *map, const void *src, void *dst_lo,
                                     void *dst_hi, size_t row_bytes);
/* The kernel's code run on the host over host memory (map arrays too), thread by thread: for tests. */
dtl_status dtl__moe_gather_rows_emulate(const dtl__moe_rowmap *map, const void *src, void *dst_lo, void *dst_hi,
                                        size_t row_bytes);
#endif

#ifdef __cplusplus
}
#endif
#endif

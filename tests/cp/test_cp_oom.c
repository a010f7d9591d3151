/* SPDX-License-Identifier: Apache-2.0 */
/* Out of memory at every allocation of the context-parallel entry points (tests/common/dt_oom.h): the
 * context (local), and the first ring, Ulysses and decode attention and collective merge of a fresh context
 * (their scratch), with the failure on every rank and on one (the calls agree under DTL_CHECK). Each failure
 * is DTL_ERR_OUT_OF_MEMORY (or the agreed error), frees what it allocated, writes no output, and the next
 * call works. test_cp_errors fails allocations on every rank alike; this adds one rank alone and the live
 * count. Runs at 1 and 2 ranks with DTL_CHECK=1. */
#include "dt_oom.h"

#define POISON ((void *)0x5a5a)
enum { T = 12, QH = 4, KVH = 2, HD = 4 };

static dtl_mesh *mesh;
static dt_oom_tally tally;

typedef enum { K_CONTEXT, K_RING, K_ULYSSES, K_DECODE, K_REDUCE } kind;

typedef struct {
  kind k;
  dtl_cp_context *ctx, *made;
  float q[T * QH * HD], kv[T * KVH * HD], out[T * QH * HD], lse[T * QH];
} ctx;

static void fresh(ctx *x) {
  REQUIRE_OK(dtl_cp_context_create(mesh, 0, NULL, &x->ctx));
  x->made = POISON;
  for (int i = 0; i < T * QH * HD; i++) x->out[i] = -7;
  for (int i = 0; i < T * QH; i++) x->lse[i] = -7;
}
static void release(ctx *x) {
  if (x->made != POISON) dtl_cp_context_destroy(x->made);
  dtl_cp_context_destroy(x->ctx);
}
static void undo(void *v) {
  release(v);
  fresh(v);
}
static bool untouched(void *v) {
  ctx *x = v;
  for (int i = 0; i < T * QH * HD; i++)
    if (x->out[i] != -7) return false;
  for (int i = 0; i < T * QH; i++)
    if (x->lse[i] != -7) return false;
  return x->made == POISON;
}

static dtl_status call(void *v) {
  ctx *x = v;
  const dtl_cp_attention_params p = {
      .flags = DTL_CP_CAUSAL, .tokens = T, .q_heads = QH, .kv_heads = KVH, .head_dim = HD};
  switch (x->k) {
    case K_CONTEXT: return dtl_cp_context_create(mesh, 0, NULL, &x->made);
    case K_RING: return dtl_cp_ring_attention(x->ctx, &p, x->q, x->kv, x->kv, x->out, x->lse);
    case K_ULYSSES: return dtl_cp_ulysses_attention(x->ctx, &p, x->q, x->kv, x->kv, x->out, x->lse);
    case K_DECODE: {
      const dtl_cp_decode_params d = {.flags = DTL_CP_CAUSAL, .tokens = 2, .q_heads = QH, .kv_heads = KVH,
                                      .head_dim = HD, .q_pos0 = T, .kv_tokens = 5, .kv_pos0 = 5 * dt_rank};
      return dtl_cp_decode_attention(x->ctx, &d, x->q, x->kv, x->kv, x->out, x->lse);
    }
    default: return dtl_cp_state_reduce(x->ctx, 3, QH, HD, x->q, x->kv, dtl_replicate(), x->out, x->lse);
  }
}

static void every_cp_entry_point_survives_each_failed_allocation_on_any_rank(void) {
  static const char *const what[] = {"dtl_cp_context_create", "dtl_cp_ring_attention, first",
                                     "dtl_cp_ulysses_attention, first", "dtl_cp_decode_attention, first",
                                     "dtl_cp_state_reduce, first"};
  static ctx x;
  for (int i = 0; i < T * QH * HD; i++) x.q[i] = (float)(i % 7) * 0.1f;
  for (int i = 0; i < T * KVH * HD; i++) x.kv[i] = (float)(i % 5) * 0.1f;
  for (int k = K_CONTEXT; k <= K_REDUCE; k++) {
    x.k = (kind)k;
    fresh(&x);
    const dt_oom_case c = {.what = what[k], .call = call, .untouched = untouched, .undo = undo, .ctx = &x,
                           .collective = k != K_CONTEXT, .caches = true};
    dt_oom_every_way(&c, &tally);
    release(&x);
  }
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  dtl_comm *world;
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  REQUIRE_OK(dtl_mesh_create(world, 1, &dt_size, &mesh));
  RUN(every_cp_entry_point_survives_each_failed_allocation_on_any_rank);
  if (dt_rank == 0) printf("%ld calls, %ld of them failed by an injected allocation failure\n", tally.calls, tally.failures);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  return dt_finish();
}

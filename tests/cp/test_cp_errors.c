/* SPDX-License-Identifier: Apache-2.0 */
/* Bad input to context parallelism, on every rank alike (so no rank waits in a collective): each call fails
 * with its status and a message naming the argument and its value, before any communication, and leaves its
 * outputs untouched. Heads that do not split over the group are named with the numbers of the TP rule. */
#include <math.h>
#include "dtl_test.h"
#include "common/alloc.h"

static dtl_comm *world;
static dtl_mesh *mesh;
static dtl_cp_context *ctx;

enum { T = 12, QH = 4, KVH = 2, HD = 4 };
static float q[T * QH * HD], k[T * KVH * HD], v[T * KVH * HD], out[T * QH * HD], lse[T * QH];
static float out0[T * QH * HD], lse0[T * QH];

static void poison_outputs(void) {
  memset(out, 0x5a, sizeof out), memset(lse, 0x5a, sizeof lse);
  memcpy(out0, out, sizeof out), memcpy(lse0, lse, sizeof lse);
}
#define CHECK_UNTOUCHED(what) \
  CHECK(!memcmp(out, out0, sizeof out) && !memcmp(lse, lse0, sizeof lse), "%s wrote its outputs", what)

static dtl_cp_attention_params good(void) {
  return (dtl_cp_attention_params){.flags = DTL_CP_CAUSAL, .tokens = T, .q_heads = QH, .kv_heads = KVH, .head_dim = HD};
}

typedef dtl_status (*prefill_fn)(dtl_cp_context *, const dtl_cp_attention_params *, const void *, const void *,
                                 const void *, void *, float *);

static void context_creation_names_its_bad_arguments(void) {
  dtl_cp_context *c = NULL;
  CHECK_ERROR(dtl_cp_context_create(NULL, 0, NULL, &c), DTL_ERR_INVALID_ARGUMENT, "mesh=NULL");
  CHECK_ERROR(dtl_cp_context_create(mesh, 1, NULL, &c), DTL_ERR_INVALID_ARGUMENT, "cp_dim=1");
  CHECK_ERROR(dtl_cp_context_create(mesh, 0, NULL, NULL), DTL_ERR_INVALID_ARGUMENT, "out=NULL");
  dtl_cp_options o = {.mask = DTL_CP_OPT_DTYPE, .dtype = DTL_INT32};
  CHECK_ERROR(dtl_cp_context_create(mesh, 0, &o, &c), DTL_ERR_INVALID_ARGUMENT, "dtype=i32");
  o = (dtl_cp_options){.mask = DTL_CP_SCALE};
  CHECK_ERROR(dtl_cp_context_create(mesh, 0, &o, &c), DTL_ERR_INVALID_ARGUMENT, "opt.mask");
  o = (dtl_cp_options){.flags = DTL_BIT(40)};
  CHECK_ERROR(dtl_cp_context_create(mesh, 0, &o, &c), DTL_ERR_INVALID_ARGUMENT, "opt.flags");
  CHECK(c == NULL, "a failed creation returned a context");
  dtl_mesh *abstract = NULL;
  int shape = 2;
  REQUIRE_OK(dtl_mesh_create_abstract(1, &shape, NULL, &abstract));
  CHECK_ERROR(dtl_cp_context_create(abstract, 0, NULL, &c), DTL_ERR_INVALID_ARGUMENT, "abstract");
  dtl_mesh_destroy(abstract);
}

static void prefill_rejects_bad_params_and_buffers_leaving_outputs_untouched(void) {
  const prefill_fn fns[2] = {dtl_cp_ring_attention, dtl_cp_ulysses_attention};
  const char *names[2] = {"ring", "ulysses"};
  for (int f = 0; f < 2; f++) {
    dtl_cp_attention_params p = good();
    poison_outputs();
    CHECK_ERROR(fns[f](NULL, &p, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "ctx=NULL");
    CHECK_ERROR(fns[f](ctx, NULL, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "params=NULL");
    p.mask = DTL_CP_KV_POSITIONS; /* a decode bit */
    CHECK_ERROR(fns[f](ctx, &p, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "params.mask");
    p = good(), p.flags |= DTL_CP_SCALE; /* a mask bit in flags */
    CHECK_ERROR(fns[f](ctx, &p, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "params.flags");
    p = good(), p.layout = (dtl_cp_token_layout)5;
    CHECK_ERROR(fns[f](ctx, &p, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "layout=5");
    p = good(), p.tokens = -3;
    CHECK_ERROR(fns[f](ctx, &p, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "tokens=-3");
    p = good(), p.q_heads = 5;
    CHECK_ERROR(fns[f](ctx, &p, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT,
                "q_heads=5 is not a multiple of kv_heads=2");
    p = good(), p.kv_heads = 0;
    CHECK_ERROR(fns[f](ctx, &p, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "kv_heads=0");
    p = good(), p.head_dim = 0;
    CHECK_ERROR(fns[f](ctx, &p, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "head_dim=0");
    p = good(), p.mask = DTL_CP_SCALE, p.scale = NAN;
    CHECK_ERROR(fns[f](ctx, &p, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "scale=nan");
    p = good(), p.tokens = INT64_MAX / 4;
    CHECK_ERROR(fns[f](ctx, &p, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "overflowing");
    p = good();
    CHECK_ERROR(fns[f](ctx, &p, NULL, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "q=NULL");
    CHECK_ERROR(fns[f](ctx, &p, q, k, NULL, out, lse), DTL_ERR_INVALID_ARGUMENT, "v=NULL");
    CHECK_ERROR(fns[f](ctx, &p, q, k, v, NULL, lse), DTL_ERR_INVALID_ARGUMENT, "out=NULL");
    CHECK_UNTOUCHED(names[f]);
  }
}

/* The TP head rule over the CP group: kv heads that do not divide a larger group, or q heads that do not
 * split evenly over it, are named with the numbers. */
static void ulysses_names_heads_that_do_not_split_over_the_group(void) {
  const int p = dt_size;
  dtl_cp_attention_params a = good();
  poison_outputs();
  if (p == 1) { /* every head count splits over one rank */
    CHECK_OK(dtl_cp_ulysses_heads(ctx, 3, 1, NULL, NULL));
    return;
  }
  char want[96];
  a.q_heads = 2 * p - 1, a.kv_heads = 1; /* p > kv heads = 1, q heads not a multiple of p */
  snprintf(want, sizeof want, "q_heads=%d is not a multiple of cp=%d", 2 * p - 1, p);
  CHECK_ERROR(dtl_cp_ulysses_attention(ctx, &a, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, want);
  CHECK_ERROR(dtl_cp_ulysses_heads(ctx, 2 * p - 1, 1, NULL, NULL), DTL_ERR_INVALID_ARGUMENT, want);
  if (p == 3) {
    a.q_heads = 4, a.kv_heads = 2;
    CHECK_ERROR(dtl_cp_ulysses_attention(ctx, &a, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT,
                "kv_heads=2 does not divide cp=3");
  }
  CHECK_UNTOUCHED("ulysses");
  /* The ring takes any GQA heads at any group size. */
  a.q_heads = 3, a.kv_heads = 1, a.tokens = 4;
  CHECK_OK(dtl_cp_ring_attention(ctx, &a, q, k, v, out, lse));
  dtl_cp_range qr, kr;
  CHECK_OK(dtl_cp_ulysses_heads(ctx, 2 * p, 2 * p, &qr, &kr));
  CHECK(qr.offset == 2 * dt_rank && qr.count == 2 && kr.offset == 2 * dt_rank && kr.count == 2, "heads %lld+%lld",
        (long long)qr.offset, (long long)qr.count);
}

static void host_attention_in_half_types_is_unsupported(void) {
  dtl_cp_context *h;
  dtl_cp_options o = {.mask = DTL_CP_OPT_DTYPE, .dtype = DTL_BFLOAT16};
  REQUIRE_OK(dtl_cp_context_create(mesh, 0, &o, &h));
  dtl_cp_attention_params p = good();
  poison_outputs();
  CHECK_ERROR(dtl_cp_ring_attention(h, &p, q, k, v, out, lse), DTL_ERR_UNSUPPORTED, "computes in f32");
  CHECK_ERROR(dtl_cp_ulysses_attention(h, &p, q, k, v, out, lse), DTL_ERR_UNSUPPORTED, "computes in f32");
  dtl_cp_decode_params d = {.tokens = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .kv_tokens = 2};
  CHECK_ERROR(dtl_cp_decode_attention(h, &d, q, k, v, out, lse), DTL_ERR_UNSUPPORTED, "computes in f32");
  CHECK_UNTOUCHED("bf16 host context");
  dtl_cp_context_destroy(h);
}

static void decode_rejects_bad_params_leaving_outputs_untouched(void) {
  dtl_cp_decode_params d = {.flags = DTL_CP_CAUSAL, .tokens = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD,
                            .q_pos0 = 5, .kv_tokens = 3};
  poison_outputs();
  CHECK_ERROR(dtl_cp_decode_attention(ctx, NULL, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "params=NULL");
  dtl_cp_decode_params b = d;
  b.mask = DTL_CP_KV_POSITIONS; /* kv_pos missing */
  CHECK_ERROR(dtl_cp_decode_attention(ctx, &b, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "kv_pos=NULL");
  b = d, b.kv_tokens = -1;
  CHECK_ERROR(dtl_cp_decode_attention(ctx, &b, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "kv_tokens=-1");
  b = d, b.mask = DTL_BIT(9);
  CHECK_ERROR(dtl_cp_decode_attention(ctx, &b, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "params.mask");
  CHECK_ERROR(dtl_cp_decode_attention(ctx, &d, q, NULL, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "k_cache=NULL");
  CHECK_ERROR(dtl_cp_decode_attention(ctx, &d, NULL, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT, "q=NULL");
  b = d, b.q_heads = 3;
  CHECK_ERROR(dtl_cp_decode_attention(ctx, &b, q, k, v, out, lse), DTL_ERR_INVALID_ARGUMENT,
              "q_heads=3 is not a multiple of kv_heads=2");
  CHECK_UNTOUCHED("decode");
}

static void state_reduce_rejects_a_layout_it_cannot_produce_and_missing_states(void) {
  poison_outputs();
  CHECK_ERROR(dtl_cp_state_reduce(ctx, T, QH, HD, q, lse0, dtl_shard(1), out, lse), DTL_ERR_INVALID_ARGUMENT,
              "out_placement");
  CHECK_ERROR(dtl_cp_state_reduce(ctx, T, QH, HD, q, lse0, dtl_partial(DTL_SUM), out, lse), DTL_ERR_INVALID_ARGUMENT,
              "out_placement");
  CHECK_ERROR(dtl_cp_state_reduce(ctx, T, QH, HD, q, NULL, dtl_replicate(), out, lse), DTL_ERR_INVALID_ARGUMENT,
              "lse=NULL");
  CHECK_ERROR(dtl_cp_state_reduce(ctx, T, QH, HD, NULL, lse0, dtl_replicate(), out, lse), DTL_ERR_INVALID_ARGUMENT,
              "o=NULL");
  CHECK_ERROR(dtl_cp_state_reduce(ctx, T, -QH, HD, q, lse0, dtl_replicate(), out, lse), DTL_ERR_INVALID_ARGUMENT,
              "H=-4");
  CHECK_ERROR(dtl_cp_state_reduce(NULL, T, QH, HD, q, lse0, dtl_replicate(), out, lse), DTL_ERR_INVALID_ARGUMENT,
              "ctx=NULL");
  CHECK_UNTOUCHED("state reduce");
  float o_a[4] = {1, 2, 3, 4}, l_a[2] = {0, 0};
  CHECK_ERROR(dtl_attn_state_merge_on(world, DTL_INT8, 1, 2, 2, o_a, l_a, o_a + 2, l_a), DTL_ERR_INVALID_ARGUMENT,
              "t=i8");
}

/* Every allocation a call makes, failed in turn on every rank alike: the call returns DTL_ERR_OUT_OF_MEMORY
 * (its scratch is acquired before any communication, so every rank fails at the same point) with its outputs
 * untouched, and the context still works afterwards. */
static void allocation_failures_are_reported_before_any_output_is_written(void) {
  const prefill_fn fns[2] = {dtl_cp_ring_attention, dtl_cp_ulysses_attention};
  dtl_cp_attention_params p = good();
  p.q_heads = 2 * dt_size, p.kv_heads = dt_size; /* heads that split over the group */
  int ooms = 0;
  for (int f = 0; f < 2; f++)
    for (uint64_t n = 1; n <= 12; n++) {
      dtl_cp_context *c = NULL;
      REQUIRE_OK(dtl_cp_context_create(mesh, 0, NULL, &c));
      poison_outputs();
      dtl__alloc_hook_reset(n, true);
      dtl_status st = fns[f](c, &p, q, k, v, out, lse);
      dtl__alloc_hook_reset(0, false);
      CHECK(st == DTL_OK || st == DTL_ERR_OUT_OF_MEMORY, "allocation %llu failed: %s", (unsigned long long)n,
            dtl_status_name(st));
      if (st == DTL_ERR_OUT_OF_MEMORY) {
        ooms++;
        CHECK_UNTOUCHED("a call out of memory");
        CHECK_OK(fns[f](c, &p, q, k, v, out, lse));
      }
      dtl_cp_context_destroy(c);
    }
  CHECK(ooms >= 14, "only %d of 24 calls met a failed allocation (the scratch slots alone are 7 and 8)", ooms);
  for (uint64_t n = 1; n <= 6; n++) {
    dtl_cp_context *c = NULL;
    dtl__alloc_hook_reset(n, true);
    dtl_status st = dtl_cp_context_create(mesh, 0, NULL, &c);
    dtl__alloc_hook_reset(0, false);
    CHECK(st == DTL_OK ? c != NULL : st == DTL_ERR_OUT_OF_MEMORY && c == NULL, "context creation, allocation %llu: %s",
          (unsigned long long)n, dtl_status_name(st));
    dtl_cp_context_destroy(c);
  }
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  REQUIRE_OK(dtl_mesh_create(world, 1, &dt_size, &mesh));
  REQUIRE_OK(dtl_cp_context_create(mesh, 0, NULL, &ctx));
  for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) q[i] = (float)(i % 7) * 0.1f;
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) k[i] = v[i] = (float)(i % 5) * 0.1f;
  RUN(context_creation_names_its_bad_arguments);
  RUN(prefill_rejects_bad_params_and_buffers_leaving_outputs_untouched);
  RUN(ulysses_names_heads_that_do_not_split_over_the_group);
  RUN(host_attention_in_half_types_is_unsupported);
  RUN(decode_rejects_bad_params_leaving_outputs_untouched);
  RUN(state_reduce_rejects_a_layout_it_cannot_produce_and_missing_states);
  RUN(allocation_failures_are_reported_before_any_output_is_written);
  dtl_cp_context_destroy(ctx);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  return dt_finish();
}

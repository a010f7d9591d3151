/* SPDX-License-Identifier: Apache-2.0 */
/* The constructors' out parameter, swept over every public header: each dtl_*_create, dtl_comm_from_*,
 * dtl_comm_split, dtl_safetensors_open / write_begin and each call that hands back a new layout, given
 * out=NULL and otherwise good arguments, returns DTL_ERR_INVALID_ARGUMENT naming out on every rank, with
 * no crash, no hang (a collective one still takes part in its agreement) and no host buffer left behind. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "common/alloc.h"
#include "dtl_test.h"

static dtl_comm *g_world;
static dtl_mesh *g_mesh;
static dtl_tp_context *g_tp;
static float g_w[64];

/* call, with out=NULL, fails naming fn's out and frees what it allocated. */
#define EXPECT_OUT_NULL(fn, call)                                                                             \
  do {                                                                                                        \
    int64_t live_ = dtl__alloc_hook_live();                                                                   \
    CHECK_ERROR((call), DTL_ERR_INVALID_ARGUMENT, fn ": out=NULL");                                           \
    CHECK(dtl__alloc_hook_live() == live_, "%s with out=NULL left %lld host buffers behind", fn,             \
          (long long)(dtl__alloc_hook_live() - live_));                                                       \
  } while (0)

static void communicator_constructors_refuse_a_null_out(void) {
  EXPECT_OUT_NULL("dtl_comm_from_mpi", dtl_comm_from_mpi(MPI_COMM_WORLD, NULL));
  EXPECT_OUT_NULL("dtl_comm_split", dtl_comm_split(g_world, 0, dt_rank, NULL));
}

static void mesh_and_layout_constructors_refuse_a_null_out(void) {
  int np = dt_size, zero = 0;
  EXPECT_OUT_NULL("dtl_mesh_create", dtl_mesh_create(g_world, 1, &np, NULL));
  EXPECT_OUT_NULL("dtl_mesh_create_from_ranks", dtl_mesh_create_from_ranks(g_world, 1, &zero, 1, (int[]){1}, NULL));
  EXPECT_OUT_NULL("dtl_mesh_create_abstract", dtl_mesh_create_abstract(1, (int[]){4}, &zero, NULL));
  const int64_t shape[2] = {4, 4};
  const dtl_placement rr[1] = {{.kind = DTL_REPLICATE}};
  EXPECT_OUT_NULL("dtl_layout_create", dtl_layout_create(g_mesh, DTL_FLOAT32, 2, shape, rr, NULL));
  dtl_layout *l = NULL;
  REQUIRE_OK(dtl_layout_create(g_mesh, DTL_FLOAT32, 2, shape, rr, &l));
  EXPECT_OUT_NULL("dtl_layout_with_placements", dtl_layout_with_placements(l, rr, NULL));
  EXPECT_OUT_NULL("dtl_plan_create", dtl_plan_create(l, l, NULL));
  EXPECT_OUT_NULL("dtl_plan_create_with_cost", dtl_plan_create_with_cost(l, l, &(dtl_cost_model){0}, NULL));
  EXPECT_OUT_NULL("dtl_plan_create_with_limit", dtl_plan_create_with_limit(l, l, 0, NULL));
  dtl_layout_destroy(l);
}

static void context_and_layer_constructors_refuse_a_null_out(void) {
  EXPECT_OUT_NULL("dtl_tp_context_create", dtl_tp_context_create(g_mesh, 0, NULL, NULL));
  EXPECT_OUT_NULL("dtl_cp_context_create", dtl_cp_context_create(g_mesh, 0, NULL, NULL));
  EXPECT_OUT_NULL("dtl_tp_split", dtl_tp_split(g_tp, 5, NULL));
  EXPECT_OUT_NULL("dtl_tp_activation_layout", dtl_tp_activation_layout(g_tp, 4, 4, (dtl_placement){.kind = DTL_REPLICATE}, NULL));
  const int64_t p = dt_size; /* every size divides over the TP group */
  dtl_tp_linear_params lp = {.kind = DTL_TP_COLUMN, .in_features = 2, .out_features = 2 * p, .weight = g_w};
  EXPECT_OUT_NULL("dtl_tp_linear_create", dtl_tp_linear_create(g_tp, &lp, NULL));
  dtl_tp_mlp_params mp = {.activation = DTL_TP_ACT_GELU, .hidden = 2, .ffn = p, .gate_up = g_w, .down = g_w};
  EXPECT_OUT_NULL("dtl_tp_mlp_create", dtl_tp_mlp_create(g_tp, &mp, NULL));
  dtl_tp_attention_params ap = {.hidden = 2, .q_heads = p, .kv_heads = p, .head_dim = 1, .qkv = g_w, .out = g_w};
  EXPECT_OUT_NULL("dtl_tp_attention_create", dtl_tp_attention_create(g_tp, &ap, NULL));
  dtl_tp_attention *a = NULL;
  REQUIRE_OK(dtl_tp_attention_create(g_tp, &ap, &a));
  EXPECT_OUT_NULL("dtl_tp_kv_cache_create", dtl_tp_kv_cache_create(a, 4, NULL));
  dtl_tp_attention_destroy(a);
  dtl_tp_embedding_params ep = {.vocab = 2 * p, .hidden = 2, .table = g_w};
  EXPECT_OUT_NULL("dtl_tp_embedding_create", dtl_tp_embedding_create(g_tp, &ep, NULL));
  dtl_tp_embedding *e = NULL;
  REQUIRE_OK(dtl_tp_embedding_create(g_tp, &ep, &e));
  EXPECT_OUT_NULL("dtl_tp_embedding_layout", dtl_tp_embedding_layout(e, 3, NULL));
  dtl_tp_embedding_destroy(e);
}

static void moe_constructors_refuse_a_null_out(void) {
  int owner[2 * 8];
  const int experts = 2 * dt_size;
  for (int i = 0; i < experts; i++) owner[i] = i % dt_size;
  EXPECT_OUT_NULL("dtl_moe_placement_create", dtl_moe_placement_create(experts, dt_size, owner, NULL));
  dtl_moe_placement *pl = NULL;
  REQUIRE_OK(dtl_moe_placement_create(experts, dt_size, owner, &pl));
  int32_t ids[2] = {0, 1};
  float w[2] = {0.5f, 0.5f};
  EXPECT_OUT_NULL("dtl_moe_layout_create",
                  dtl_moe_layout_create(g_world, pl, 1, 2, ids, w, 4, DTL_FLOAT32, NULL, NULL));
  dtl_moe_placement_destroy(pl);
}

static void checkpoint_constructors_refuse_a_null_out(void) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/dtl_out_null_%d_%d.safetensors", (int)getpid(), dt_rank);
  EXPECT_OUT_NULL("dtl_safetensors_write_begin", dtl_safetensors_write_begin(path, NULL));
  EXPECT_OUT_NULL("dtl_safetensors_open", dtl_safetensors_open(path, NULL));
  /* The quantized TP readers hand back a new shard: out is checked before any tensor is looked up. */
  dtl_safetensors_writer *w = NULL;
  REQUIRE_OK(dtl_safetensors_write_begin(path, &w));
  REQUIRE_OK(dtl_safetensors_write_add(w, "x", DTL_FLOAT32, 1, (int64_t[]){4}, g_w));
  REQUIRE_OK(dtl_safetensors_write_end(w));
  dtl_safetensors *f = NULL;
  REQUIRE_OK(dtl_safetensors_open(path, &f));
  const dtl_quant_format q = {.kind = DTL_QUANT_FP8_TENSOR};
  const int64_t p = dt_size;
  EXPECT_OUT_NULL("dtl_tp_qweight_read_column", dtl_tp_qweight_read_column(g_tp, f, &q, "x", p, 4, NULL));
  EXPECT_OUT_NULL("dtl_tp_qweight_read_row", dtl_tp_qweight_read_row(g_tp, f, &q, "x", 4, p, NULL));
  EXPECT_OUT_NULL("dtl_tp_qweight_read_qkv", dtl_tp_qweight_read_qkv(g_tp, f, &q, "x", NULL, NULL, p, p, 1, 4, NULL));
  EXPECT_OUT_NULL("dtl_tp_qweight_read_attention_out",
                  dtl_tp_qweight_read_attention_out(g_tp, f, &q, "x", p, p, 1, 4, NULL));
  EXPECT_OUT_NULL("dtl_tp_qweight_read_gate_up", dtl_tp_qweight_read_gate_up(g_tp, f, &q, "x", NULL, p, 4, NULL));
  EXPECT_OUT_NULL("dtl_tp_qweight_read_experts", dtl_tp_qweight_read_experts(g_tp, f, &q, "x.", ".w", p, 4, 4, NULL));
  dtl_safetensors_close(f);
  remove(path);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  if (dt_size > 8) return dt_skip("at most 8 ranks");
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &g_world));
  int np = dt_size;
  REQUIRE_OK(dtl_mesh_create(g_world, 1, &np, &g_mesh));
  REQUIRE_OK(dtl_tp_context_create(g_mesh, 0, NULL, &g_tp));
  RUN(communicator_constructors_refuse_a_null_out);
  RUN(mesh_and_layout_constructors_refuse_a_null_out);
  RUN(context_and_layer_constructors_refuse_a_null_out);
  RUN(moe_constructors_refuse_a_null_out);
  RUN(checkpoint_constructors_refuse_a_null_out);
  dtl_tp_context_destroy(g_tp);
  dtl_mesh_destroy(g_mesh);
  dtl_comm_destroy(g_world);
  return dt_finish();
}

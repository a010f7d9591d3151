/* SPDX-License-Identifier: Apache-2.0 */
/* The SiLU-gated expert on quantized weights (dtl_moe_qmlp) against the dense expert (dtl_moe_mlp) on the
 * dequantized weights, through a whole MoE round (route, dispatch, experts, combine) at any world size: the expert
 * weights are [experts, ffn, hidden] / [experts, hidden, ffn] quantized tensors (tests/common/dt_qweights.h), cut on
 * the expert dim S(0) (matching the contiguous placement, 5 experts over 4 ranks being 2, 2, 1, 0) or replicated
 * (for a round-robin placement). Both experts multiply the same f32 values, in other orders (tiles of 512
 * columns), so the outputs agree within the 1e-5 x (1 + max |y|) of the dense MoE test. Bad input: a cut through
 * the matrices, another shape, a NULL layout or part, a NaN scale, an expert outside this rank's boxes. */
#include <math.h>
#include "dtl_test.h"
#include "dt_qweights.h"
#include "moe_oracle.h"

static dtl_comm *g_comm;
static dtl_mesh *g_mesh;
enum { E = 5, H = 64, F = 96, T = 6, K = 2 };

typedef struct {
  dt_qweight w[3]; /* gate, up, down */
} qexperts;

static int qexperts_make(qexperts *q, const dtl_quant_format *f, dtl_placement on_experts, unsigned seed) {
  int64_t sg[3] = {E, F, H}, sd[3] = {E, H, F};
  for (int i = 0; i < 3; i++) {
    dtl_status st = dt_qweight_make(&q->w[i], g_mesh, f, 3, i == 2 ? sd : sg, &on_experts, seed + (unsigned)i);
    CHECK(st == DTL_OK, "quantized experts %d: %s", i, dtl_last_error());
    if (st != DTL_OK) return 0;
  }
  return 1;
}
static void qexperts_free(qexperts *q) {
  for (int i = 0; i < 3; i++) dt_qweight_free(&q->w[i]);
}
static dtl_moe_qmlp_params qparams(const qexperts *q) {
  return (dtl_moe_qmlp_params){.hidden = H, .ffn = F, .gate = q->w[0].cut, .up = q->w[1].cut, .down = q->w[2].cut,
                               .gate_local = q->w[0].local, .up_local = q->w[1].local, .down_local = q->w[2].local};
}

/* One MoE round with the quantized experts and one with the dense experts on the dequantized weights. */
static void round_matches_dense(const dtl_quant_format *f, dtl_placement on_experts, const int *owner, unsigned seed,
                                const char *what) {
  qexperts q;
  if (!qexperts_make(&q, f, on_experts, seed)) return;
  dtl_moe_qmlp *qm = NULL;
  dtl_moe_qmlp_params qp = qparams(&q);
  CHECK_OK(dtl_moe_qmlp_create(&qp, &qm));
  dtl_moe_placement *pl = NULL;
  CHECK_OK(dtl_moe_placement_create(E, dt_size, owner, &pl));
  int32_t ids[T * K];
  float w[T * K], *x = malloc(sizeof(float) * T * H);
  oracle_routing(seed, dt_rank, T, K, E, ids, w);
  oracle_rng r = oracle_seed(seed, (uint64_t)dt_rank + 77);
  for (int i = 0; i < T * H; i++) x[i] = (float)(2 * oracle_uniform(&r) - 1);
  dtl_moe_layout *L = NULL;
  CHECK_OK(dtl_moe_layout_create(g_comm, pl, T, K, ids, w, H, DTL_FLOAT32, NULL, &L));
  int nl = dtl_moe_placement_local_count(pl, dt_rank);
  const float *lg[E], *lu[E], *ld[E];
  for (int j = 0; j < nl; j++) {
    size_t e = (size_t)dtl_moe_placement_local_expert(pl, dt_rank, j);
    lg[j] = q.w[0].w + e * (size_t)(F * H);
    lu[j] = q.w[1].w + e * (size_t)(F * H);
    ld[j] = q.w[2].w + e * (size_t)(F * H);
  }
  dtl_moe_mlp dense = {.hidden = H, .ffn = F, .local_experts = nl, .w_gate = lg, .w_up = lu, .w_down = ld};
  int64_t rows = L ? dtl_moe_layout_expert_rows(L) : 0;
  float *ein = malloc(sizeof(float) * (size_t)(rows * H) + 4), *eq = malloc(sizeof(float) * (size_t)(rows * H) + 4);
  float *ed = malloc(sizeof(float) * (size_t)(rows * H) + 4);
  float *yq = malloc(sizeof(float) * T * H), *yd = malloc(sizeof(float) * T * H);
  if (L && qm) {
    CHECK_OK(dtl_moe_layout_dispatch(L, x, ein));
    CHECK_OK(dtl_moe_experts_run(L, ein, eq, dtl_moe_qmlp_forward, qm));
    CHECK_OK(dtl_moe_layout_combine(L, eq, yq));
    CHECK_OK(dtl_moe_experts_run(L, ein, ed, dtl_moe_mlp_forward, &dense));
    CHECK_OK(dtl_moe_layout_combine(L, ed, yd));
    double err = 0, mag = 0;
    for (int i = 0; i < T * H; i++) {
      err = fmax(err, fabs((double)yq[i] - yd[i]));
      mag = fmax(mag, fabs((double)yd[i]));
    }
    CHECK(err <= 1e-5 * (1 + mag), "%s: max difference %g from the dense experts (max |y| %g)", what, err, mag);
    CHECK(mag > 0, "%s: the round computed nothing", what);
  }
  dtl_moe_layout_destroy(L);
  dtl_moe_placement_destroy(pl);
  dtl_moe_qmlp_destroy(qm);
  qexperts_free(&q);
  free(x), free(ein), free(eq), free(ed), free(yq), free(yd);
}

static void quantized_experts_cut_on_the_expert_dim_match_dense_experts(void) {
  dtl_quant_format fmts[] = {
      {.mask = DTL_QFMT_BLOCK, .kind = DTL_QUANT_FP8_BLOCK, .block_rows = 64, .block_cols = 32},
      {.mask = DTL_QFMT_GROUP, .kind = DTL_QUANT_GPTQ, .group = 32},
      {.mask = DTL_QFMT_GROUP, .kind = DTL_QUANT_AWQ, .group = 64},
      {.kind = DTL_QUANT_GGUF_Q8_0},
  };
  const char *names[] = {"fp8-block", "gptq", "awq", "q8_0"};
  for (int i = 0; i < 4; i++) round_matches_dense(&fmts[i], dtl_shard(0), NULL, 10 + (unsigned)i, names[i]);
}

static void replicated_quantized_experts_serve_any_placement(void) {
  int owner[E];
  for (int e = 0; e < E; e++) owner[e] = dt_size - 1 - e % dt_size; /* reversed round robin */
  dtl_quant_format f = {.kind = DTL_QUANT_FP8_CHANNEL};
  round_matches_dense(&f, dtl_replicate(), owner, 20, "fp8-channel, replicated");
}

static void bad_quantized_experts_are_refused(void) {
  dtl_quant_format f = {.mask = DTL_QFMT_BLOCK, .kind = DTL_QUANT_FP8_BLOCK, .block_rows = 64, .block_cols = 32};
  qexperts q;
  if (!qexperts_make(&q, &f, dtl_shard(0), 30)) return;
  dtl_moe_qmlp *m = NULL;
  dtl_moe_qmlp_params p = qparams(&q);
  p.ffn = F + 1;
  CHECK_ERROR(dtl_moe_qmlp_create(&p, &m), DTL_ERR_INVALID_ARGUMENT, "expected [experts, 97, 64]");
  p = qparams(&q);
  p.down = NULL;
  CHECK_ERROR(dtl_moe_qmlp_create(&p, &m), DTL_ERR_INVALID_ARGUMENT, "params.down=NULL");
  /* A NULL part and an infinite scale, on the ranks that hold experts (one without holds no bytes: NULL is fine
   * there, and there is no scale to spoil). */
  dtl_qbox b;
  dtl_qlayout_local_boxes(q.w[1].cut, NULL, &b);
  if (b.part[DTL_QPART_CODES].bytes) {
    p = qparams(&q);
    p.up_local.part[DTL_QPART_CODES] = NULL;
    CHECK_ERROR(dtl_moe_qmlp_create(&p, &m), DTL_ERR_INVALID_ARGUMENT, "params.up_local.part[0]=NULL");
    p = qparams(&q);
    float *s = q.w[1].local.part[DTL_QPART_SCALES], keep = s[0];
    s[0] = INFINITY;
    CHECK_ERROR(dtl_moe_qmlp_create(&p, &m), DTL_ERR_INVALID_ARGUMENT, "scales");
    s[0] = keep;
  }
  CHECK(m == NULL, "a failed creation wrote its output");
  /* A cut through the matrices (rows of every expert). */
  qexperts rows;
  if (dt_size > 1 && qexperts_make(&rows, &f, dtl_shard(1), 31)) {
    p = qparams(&rows);
    CHECK_ERROR(dtl_moe_qmlp_create(&p, &m), DTL_ERR_INVALID_ARGUMENT, "expected whole");
    qexperts_free(&rows);
  }
  /* An expert this rank runs but whose weights it does not hold. */
  p = qparams(&q);
  CHECK_OK(dtl_moe_qmlp_create(&p, &m));
  int64_t lo = 0, cnt = 0, c = (E + dt_size - 1) / dt_size;
  lo = c * dt_rank < E ? c * dt_rank : E;
  cnt = lo + c < E ? c : E - lo;
  int outside = cnt < E ? (int)((lo + cnt) % E) : -1;
  if (m && outside >= 0) {
    float in[H] = {0}, out[H];
    dtl_moe_expert_batch b = {.expert = outside, .local = 0, .rows = 1, .rows_padded = 1, .hidden = H,
                              .dtype = DTL_FLOAT32, .memory = DTL_MEMORY_HOST, .in = in, .out = out};
    CHECK_ERROR(dtl_moe_qmlp_forward(&b, m), DTL_ERR_INVALID_ARGUMENT, "is not among the experts");
  }
  dtl_moe_qmlp_destroy(m);
  qexperts_free(&q);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &g_comm));
  int np = dt_size;
  REQUIRE_OK(dtl_mesh_create(g_comm, 1, &np, &g_mesh));
  RUN(quantized_experts_cut_on_the_expert_dim_match_dense_experts);
  RUN(replicated_quantized_experts_serve_any_placement);
  RUN(bad_quantized_experts_are_refused);
  dtl_mesh_destroy(g_mesh);
  dtl_comm_destroy(g_comm);
  return dt_finish();
}

/* SPDX-License-Identifier: Apache-2.0 */
/* What the examples do, on an NCCL communicator of one rank with CUDA device buffers (one GPU holds one
 * NCCL rank): the quickstart's redistribution on a 2-d mesh, distribute and full_tensor, the collectives
 * example's worked numbers, and an MoE layer (router, layout over a host count communicator, dispatch,
 * experts, combine) whose experts give back their input, so combine must return every kept token scaled
 * by its weights. Every result is copied back and compared element by element. Runs under mpirun with one
 * rank (make gpu-check); exits 77 (skipped) without a CUDA device. */
#include <math.h>
#include "dt_nccl.h"

static dt_nccl G;
static cudaStream_t stream;
static dtl_comm *comm;

#define CUDA_CHECK(call) CHECK((call) == cudaSuccess, "%s", #call)

static void *to_device(const void *host, size_t bytes) {
  void *d = NULL;
  CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
  if (bytes) CUDA_CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}
/* Copies bytes of d to host once the stream has finished. */
static void to_host(void *host, const void *d, size_t bytes) {
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (bytes) CUDA_CHECK(cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost));
}

/* The quickstart's global tensor: a[i][j] = 100 i + j. */
static float value(int64_t i, int64_t j) { return (float)(100 * i + j); }

static void quickstart_redistributes_rows_to_columns_on_device(void) {
  dtl_mesh *mesh;
  REQUIRE_OK(dtl_mesh_create(comm, 2, (int[]){1, 1}, &mesh));
  dtl_placement from[2], to[2];
  int n;
  REQUIRE_OK(dtl_placements_parse("S(0),R", from, 2, &n));
  REQUIRE_OK(dtl_placements_parse("R,S(1)", to, 2, &n));
  const int64_t global[2] = {8, 6};
  dtl_layout *rows, *cols;
  REQUIRE_OK(dtl_layout_create(mesh, DTL_FLOAT32, 2, global, from, &rows));
  REQUIRE_OK(dtl_layout_create(mesh, DTL_FLOAT32, 2, global, to, &cols));
  float a[48], b[48];
  for (int i = 0; i < 48; i++) a[i] = value(i / 6, i % 6);
  void *da = to_device(a, sizeof a), *db = to_device(NULL, sizeof b);
  CHECK_OK(dtl_redistribute(rows, da, cols, db));
  to_host(b, db, sizeof b);
  for (int i = 0; i < 48; i++) CHECK(b[i] == value(i / 6, i % 6), "element %d is %g", i, b[i]);
  /* The same through an explicit plan, into a fresh buffer. */
  dtl_plan *plan;
  REQUIRE_OK(dtl_plan_create(rows, cols, &plan));
  CUDA_CHECK(cudaMemset(db, 0, sizeof b));
  CHECK_OK(dtl_plan_execute(plan, da, db));
  to_host(b, db, sizeof b);
  for (int i = 0; i < 48; i++) CHECK(b[i] == value(i / 6, i % 6), "plan: element %d is %g", i, b[i]);
  dtl_plan_destroy(plan);
  cudaFree(da);
  cudaFree(db);
  dtl_layout_destroy(rows);
  dtl_layout_destroy(cols);
  dtl_mesh_destroy(mesh);
}

static void distribute_and_full_tensor_round_trip_on_device(void) {
  dtl_layout *l;
  REQUIRE_OK(dtl_layout_create(G.mesh, DTL_INT32, 2, (int64_t[]){5, 7}, (dtl_placement[]){dtl_shard(1)}, &l));
  int32_t dense[35], back[35];
  for (int i = 0; i < 35; i++) dense[i] = 3 * i - 50;
  void *dd = to_device(dense, sizeof dense), *local = to_device(NULL, dtl_layout_local_count(l) * 4),
       *full = to_device(NULL, sizeof back);
  CHECK_OK(dtl_distribute(l, dd, 0, local));
  CHECK_OK(dtl_full_tensor(l, local, full));
  to_host(back, full, sizeof back);
  CHECK(memcmp(back, dense, sizeof dense) == 0, "full_tensor(distribute(x)) differs from x");
  cudaFree(dd);
  cudaFree(local);
  cudaFree(full);
  dtl_layout_destroy(l);
}

/* examples/collectives.c's first line at p = 1: local [1,2]; every collective of one rank returns it. */
static void collectives_worked_numbers_on_device(void) {
  const float local[2] = {1, 2};
  float out[2];
  void *d = to_device(local, sizeof local), *r = to_device(NULL, sizeof out);
  CHECK_OK(dtl_all_gather(comm, d, r, 2, DTL_FLOAT32));
  to_host(out, r, sizeof out);
  CHECK(out[0] == 1 && out[1] == 2, "all_gather=[%g,%g]", out[0], out[1]);
  CHECK_OK(dtl_reduce_scatter(comm, d, r, 2, DTL_FLOAT32, DTL_SUM));
  to_host(out, r, sizeof out);
  CHECK(out[0] == 1 && out[1] == 2, "reduce_scatter=[%g,%g]", out[0], out[1]);
  CHECK_OK(dtl_all_reduce(comm, d, r, 2, DTL_FLOAT32, DTL_AVG));
  to_host(out, r, sizeof out);
  CHECK(out[0] == 1 && out[1] == 2, "all_reduce(avg)=[%g,%g]", out[0], out[1]);
  CHECK_OK(dtl_broadcast(comm, r, 2, DTL_FLOAT32, 0));
  CHECK_OK(dtl_barrier(comm));
  CHECK_OK(dtl_comm_check(comm));
  cudaFree(d);
  cudaFree(r);
}

/* An expert that returns its input: a device-to-device copy on the communicator's stream. */
static dtl_status identity_expert(const dtl_moe_expert_batch *b, void *user) {
  size_t bytes = (size_t)(b->rows * b->hidden) * dtl_dtype_size(b->dtype);
  cudaError_t e =
      bytes ? cudaMemcpyAsync(b->out, b->in, bytes, cudaMemcpyDeviceToDevice, *(cudaStream_t *)user) : cudaSuccess;
  return e == cudaSuccess ? DTL_OK : DTL_ERR_CUDA;
}

static void moe_layer_on_device_returns_the_weighted_tokens(void) {
  enum { T = 64, E = 8, K = 2, H = 32 };
  float logits[T * E], x[T * H], y[T * H];
  unsigned s = 7;
  for (int i = 0; i < T * E; i++) logits[i] = (float)((s = s * 1103515245u + 12345u) >> 16 & 1023) / 256.0f;
  for (int i = 0; i < T * H; i++) x[i] = (float)((i * 37) % 101) - 50.0f;
  int32_t ids[T * K];
  float weights[T * K];
  dtl_moe_router_params rp = {.mask = DTL_MOE_ROUTER_RENORMALIZE, .renormalize = 1};
  REQUIRE_OK(dtl_moe_router_topk(logits, T, E, K, &rp, ids, weights));
  dtl_moe_placement *placement;
  REQUIRE_OK(dtl_moe_placement_create(E, 1, NULL, &placement));
  dtl_comm *host;
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &host));
  dtl_moe_layout_params lp = {.mask = DTL_MOE_LAYOUT_COUNT_COMM, .count_comm = host};
  dtl_moe_layout *L;
  REQUIRE_OK(dtl_moe_layout_create(comm, placement, T, K, ids, weights, H, DTL_FLOAT32, &lp, &L));
  int64_t rows = dtl_moe_layout_expert_rows(L);
  CHECK(rows == T * K, "dropless: %lld expert rows, expected %d", (long long)rows, T * K);
  void *dx = to_device(x, sizeof x), *din = to_device(NULL, (size_t)rows * H * 4 + 4),
       *dout = to_device(NULL, (size_t)rows * H * 4 + 4), *dy = to_device(NULL, sizeof y);
  CHECK_OK(dtl_moe_layout_dispatch(L, dx, din));
  CHECK_OK(dtl_moe_experts_run(L, din, dout, identity_expert, &stream));
  CHECK_OK(dtl_moe_layout_combine(L, dout, dy));
  to_host(y, dy, sizeof y);
  double err = 0;
  for (int t = 0; t < T; t++)
    for (int h = 0; h < H; h++) {
      double want = 0;
      for (int k = 0; k < K; k++) want += (double)weights[t * K + k] * x[t * H + h];
      err = fmax(err, fabs(want - y[t * H + h]));
    }
  CHECK(err <= 1e-4, "max |y - sum_k w_k x| = %g", err);
  cudaFree(dx);
  cudaFree(din);
  cudaFree(dout);
  cudaFree(dy);
  dtl_moe_layout_destroy(L);
  dtl_comm_destroy(host);
  dtl_moe_placement_destroy(placement);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  if (dt_size != 1) return dt_skip("one rank per GPU: run with mpirun -n 1");
  if (dtl_cuda_device_count() == 0) return dt_skip("no CUDA device visible");
  dt_nccl_setup(&G);
  stream = G.stream;
  comm = G.comm;
  RUN(quickstart_redistributes_rows_to_columns_on_device);
  RUN(distribute_and_full_tensor_round_trip_on_device);
  RUN(collectives_worked_numbers_on_device);
  RUN(moe_layer_on_device_returns_the_weighted_tokens);
  dt_nccl_teardown(&G);
  return dt_finish();
}

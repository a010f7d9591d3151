/* SPDX-License-Identifier: Apache-2.0 */
/* The hot paths on a device (NCCL at world size 1, one GPU): MoE dispatch and combine, whose row moves are one
 * gather launch each, give the host path's expert rows and outputs bit for bit for f32, f16 and bf16 rows of
 * odd byte sizes with padded blocks; and repeated MoE rounds, TP forwards and cached redistributions on
 * device memory allocate nothing after the first (device allocations report to the same counter as host
 * ones). Runs under mpirun with one rank; exits 77 (skipped) without a CUDA device. */
#include <cuda_runtime.h>
#include "dtl_test.h"
#include "common/alloc.h"
#include "common/half.h"
#include "dtl/moe.h"
#include "dtl/nccl.h"
#include "dtl/tp.h"
#include "../moe/moe_oracle.h"

#define REPEAT 100
#define CUDA_CHECK(call) CHECK((call) == cudaSuccess, "%s", #call)

static ncclComm_t nccl;
static cudaStream_t stream;
static dtl_comm *host, *dev;

static void *to_device(const void *h, size_t bytes) {
  void *d = NULL;
  CUDA_CHECK(cudaMalloc(&d, bytes + 16));
  CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}
static void to_host(void *h, const void *d, size_t bytes) {
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* The identity expert on either memory. */
static dtl_status copy_expert(const dtl_moe_expert_batch *b, void *user) {
  (void)user;
  size_t bytes = (size_t)(b->rows * b->hidden) * dtl_dtype_size(b->dtype);
  if (b->memory == DTL_MEMORY_HOST) {
    if (bytes) memcpy(b->out, b->in, bytes);
    return DTL_OK;
  }
  return cudaMemcpyAsync(b->out, b->in, bytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess ? DTL_OK : DTL_ERR_CUDA;
}

static void moe_case(dtl_dtype t, int64_t H, int64_t pad) {
  enum { E = 4, T = 9, K = 2 };
  int32_t ids[T * K];
  float w[T * K], xf[T * 8];
  oracle_routing(31, 0, T, K, E, ids, w);
  oracle_tokens(31, 0, T, H, xf);
  size_t es = dtl_dtype_size(t), rb = (size_t)H * es;
  unsigned char x[T * 8 * 4];
  for (int64_t i = 0; i < T * H; i++) {
    if (t == DTL_FLOAT32) ((float *)x)[i] = xf[i];
    else ((uint16_t *)x)[i] = t == DTL_FLOAT16 ? dtl__f32_to_f16(xf[i]) : dtl__f32_to_bf16(xf[i]);
  }
  dtl_moe_placement *pl = NULL;
  CHECK_OK(dtl_moe_placement_create(E, 1, NULL, &pl));
  dtl_moe_layout_params prm = {.mask = DTL_MOE_LAYOUT_PAD_MULTIPLE | DTL_MOE_LAYOUT_COUNT_COMM, .pad_multiple = pad,
                               .count_comm = host};
  dtl_moe_layout *Lh = NULL, *Ld = NULL;
  CHECK_OK(dtl_moe_layout_create(host, pl, T, K, ids, w, H, t, &prm, &Lh));
  CHECK_OK(dtl_moe_layout_create(dev, pl, T, K, ids, w, H, t, &prm, &Ld));
  if (Lh && Ld) {
    int64_t rows = dtl_moe_layout_expert_rows(Lh);
    size_t eb = (size_t)rows * rb;
    unsigned char *ein = calloc(eb + 1, 1), *eout = calloc(eb + 1, 1), *y = calloc(T * rb + 1, 1);
    unsigned char *got_in = malloc(eb + 1), *got_y = malloc(T * rb + 1);
    void *dx = to_device(x, T * rb), *dein = to_device(ein, eb), *deout = to_device(eout, eb), *dy = to_device(y, T * rb);
    CUDA_CHECK(cudaMemset(dein, 0x6b, eb)); /* padding rows must come out zero */
    CHECK_OK(dtl_moe_layout_dispatch(Lh, x, ein));
    CHECK_OK(dtl_moe_experts_run(Lh, ein, eout, copy_expert, NULL));
    CHECK_OK(dtl_moe_layout_combine(Lh, eout, y));
    for (int i = -1; i < REPEAT; i++) {
      if (i == 0) dtl__alloc_hook_reset(0, false);
      CHECK_OK(dtl_moe_layout_dispatch(Ld, dx, dein));
      if (i == -1) to_host(got_in, dein, eb);
      CHECK_OK(dtl_moe_experts_run(Ld, dein, deout, copy_expert, NULL));
      CHECK_OK(dtl_moe_layout_combine(Ld, deout, dy));
    }
    CHECK(dtl__alloc_hook_count() == 0, "%s x %lld: %llu allocations in %d device MoE rounds", dtl_dtype_name(t),
          (long long)H, (unsigned long long)dtl__alloc_hook_count(), REPEAT);
    to_host(got_y, dy, T * rb);
    CHECK(memcmp(got_in, ein, eb) == 0, "%s x %lld, pad %lld: device expert_in differs from the host's",
          dtl_dtype_name(t), (long long)H, (long long)pad);
    CHECK(memcmp(got_y, y, T * rb) == 0, "%s x %lld: device combine differs from the host's", dtl_dtype_name(t),
          (long long)H);
    cudaFree(dx), cudaFree(dein), cudaFree(deout), cudaFree(dy);
    free(ein), free(eout), free(y), free(got_in), free(got_y);
  }
  dtl_moe_layout_destroy(Lh);
  dtl_moe_layout_destroy(Ld);
  dtl_moe_placement_destroy(pl);
}

static void device_moe_rounds_match_the_host_and_allocate_nothing(void) {
  moe_case(DTL_FLOAT32, 5, 3);
  moe_case(DTL_FLOAT16, 3, 1);
  moe_case(DTL_BFLOAT16, 8, 4);
}

static void device_tp_forwards_and_cached_redistributions_allocate_nothing(void) {
  enum { T = 5, HID = 16, FFN = 24 };
  int one = 1;
  dtl_mesh *mesh = NULL;
  dtl_tp_context *ctx = NULL;
  CHECK_OK(dtl_mesh_create(dev, 1, &one, &mesh));
  CHECK_OK(dtl_tp_context_create(mesh, 0, NULL, &ctx));
  if (!ctx) return;
  float gu[2 * FFN * HID], down[HID * FFN], x[T * HID];
  for (int i = 0; i < 2 * FFN * HID; i++) gu[i] = (float)((i * 7) % 11 - 5) / 16;
  for (int i = 0; i < HID * FFN; i++) down[i] = (float)((i * 5) % 13 - 6) / 16;
  for (int i = 0; i < T * HID; i++) x[i] = (float)(i % 9 - 4);
  dtl_tp_mlp_params p = {.activation = DTL_TP_ACT_SILU_GATED, .hidden = HID, .ffn = FFN, .gate_up = gu, .down = down};
  dtl_tp_mlp *mlp = NULL;
  dtl_layout *in = NULL, *out = NULL;
  CHECK_OK(dtl_tp_mlp_create(ctx, &p, &mlp));
  CHECK_OK(dtl_tp_mlp_layouts(mlp, T, &in, &out));
  void *dx = to_device(x, sizeof x), *dy = to_device(x, sizeof x), *dz = to_device(x, sizeof x);
  dtl_placement s1 = dtl_shard(1);
  dtl_layout *cols = NULL;
  CHECK_OK(dtl_layout_with_placements(out, &s1, &cols));
  for (int i = -1; i < REPEAT; i++) {
    if (i == 0) dtl__alloc_hook_reset(0, false);
    CHECK_OK(dtl_tp_mlp_forward(mlp, in, dx, dy));
    CHECK_OK(dtl_redistribute(out, dy, cols, dz));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CHECK(dtl__alloc_hook_count() == 0, "%llu allocations in %d device MLP forwards and redistributions",
        (unsigned long long)dtl__alloc_hook_count(), REPEAT);
  cudaFree(dx), cudaFree(dy), cudaFree(dz);
  dtl_layout_destroy(in), dtl_layout_destroy(out), dtl_layout_destroy(cols);
  dtl_tp_mlp_destroy(mlp);
  dtl_tp_context_destroy(ctx);
  dtl_mesh_destroy(mesh);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  if (dt_size != 1) return dt_skip("runs at one rank (one GPU holds one NCCL rank)");
  if (dtl_cuda_device_count() == 0) return dt_skip("no CUDA device");
  unsetenv("DTL_CHECK");
  ncclUniqueId id;
  if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
      ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&nccl, 1, id, 0) != ncclSuccess ||
      dtl_comm_from_nccl(nccl, stream, &dev) != DTL_OK || dtl_comm_from_mpi(MPI_COMM_WORLD, &host) != DTL_OK) {
    printf("could not set up NCCL at world size 1: %s\n", dtl_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  RUN(device_moe_rounds_match_the_host_and_allocate_nothing);
  RUN(device_tp_forwards_and_cached_redistributions_allocate_nothing);
  dtl_comm_destroy(dev);
  dtl_comm_destroy(host);
  ncclCommDestroy(nccl);
  cudaStreamDestroy(stream);
  return dt_finish();
}

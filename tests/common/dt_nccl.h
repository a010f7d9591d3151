/* SPDX-License-Identifier: Apache-2.0 */
/* The set-up the GPU tests share on the one harness (dtl_test.h): one NCCL rank on GPU 0 (one GPU holds one
 * NCCL rank, so these tests run at world size 1) with its own non-blocking stream, wrapped as a dtl
 * communicator and a 1-D mesh of one rank. A failing step stops every rank, naming dtl's last error. */
#ifndef DTL_TESTS_DT_NCCL_H
#define DTL_TESTS_DT_NCCL_H

#include <cuda_runtime.h>
#include "dtl_test.h"
#include "dtl/nccl.h"

typedef struct {
  cudaStream_t stream;
  ncclComm_t nccl;
  dtl_comm *comm;
  dtl_mesh *mesh;
} dt_nccl;

static inline void dt_nccl_setup(dt_nccl *g) {
  ncclUniqueId id;
  int one = 1;
  if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) != cudaSuccess ||
      ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&g->nccl, 1, id, 0) != ncclSuccess ||
      dtl_comm_from_nccl(g->nccl, g->stream, &g->comm) != DTL_OK ||
      dtl_mesh_create(g->comm, 1, &one, &g->mesh) != DTL_OK) {
    printf("could not set up NCCL at world size 1: %s\n", dtl_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

static inline void dt_nccl_teardown(dt_nccl *g) {
  dtl_mesh_destroy(g->mesh);
  dtl_comm_destroy(g->comm);
  ncclCommDestroy(g->nccl);
  cudaStreamDestroy(g->stream);
}

#endif

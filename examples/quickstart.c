/* SPDX-License-Identifier: Apache-2.0 */
/* The README's quickstart, runnable: rows split over mesh dim 0 become columns split over mesh dim 1 on a
 * 2x2 mesh, and every rank checks its new shard against the global tensor. Run with mpirun -n 4. */
#include <dtl.h>
#include <dtl/mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* The global tensor is a[i][j] = 100 i + j, so any rank can check any element of its shard. */
static float value(int64_t i, int64_t j) { return (float)(100 * i + j); }

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  dtl_comm *world;
  dtl_mesh *mesh;
  dtl_layout *rows, *cols;
  dtl_comm_from_mpi(MPI_COMM_WORLD, &world);
  int shape[2] = {2, 2}; /* 2 x 2 = data x tensor */
  if (dtl_mesh_create(world, 2, shape, &mesh) != DTL_OK) {
    fprintf(stderr, "quickstart: %s (run with mpirun -n 4)\n", dtl_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

  dtl_placement from[2], to[2];
  int n;
  dtl_placements_parse("S(0),R", from, 2, &n); /* rows split over mesh dim 0 */
  dtl_placements_parse("R,S(1)", to, 2, &n);   /* columns split over mesh dim 1 */
  int64_t global[2] = {8, 6};
  dtl_layout_create(mesh, DTL_FLOAT32, 2, global, from, &rows);
  dtl_layout_create(mesh, DTL_FLOAT32, 2, global, to, &cols);

  int64_t s[2], o[2];
  float *a = malloc(dtl_layout_local_count(rows) * sizeof *a); /* this rank's shard, row-major */
  float *b = malloc(dtl_layout_local_count(cols) * sizeof *b);
  dtl_layout_local_box(rows, NULL, s, o);
  for (int64_t i = 0; i < s[0]; i++)
    for (int64_t j = 0; j < s[1]; j++) a[i * s[1] + j] = value(o[0] + i, o[1] + j);

  int wrong = 0;
  dtl_status st = dtl_redistribute(rows, a, cols, b);
  if (st != DTL_OK) {
    fprintf(stderr, "quickstart: %s: %s\n", dtl_status_name(st), dtl_last_error());
    wrong = 1;
  } else {
    dtl_layout_local_box(cols, NULL, s, o);
    for (int64_t i = 0; i < s[0]; i++)
      for (int64_t j = 0; j < s[1]; j++) wrong += b[i * s[1] + j] != value(o[0] + i, o[1] + j);
    printf("[rank %d] shard rows %lld:%lld cols %lld:%lld  %s\n", dtl_comm_rank(world), (long long)o[0],
           (long long)(o[0] + s[0]), (long long)o[1], (long long)(o[1] + s[1]), wrong ? "WRONG" : "ok");
  }

  free(a);
  free(b);
  dtl_layout_destroy(rows);
  dtl_layout_destroy(cols);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  MPI_Finalize();
  return wrong != 0;
}

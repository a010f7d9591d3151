/* SPDX-License-Identifier: Apache-2.0 */
/* The set-up of the TP tests on the one harness (dtl_test.h): the mesh from the command line (--data D makes
 * a D x (np/D) data x tensor mesh; --tp-first makes it (np/D) x D with the TP dim first) and a TP context on
 * it. The dense oracles are in tp_oracle.h. */
#ifndef DTL_TP_ENV_H
#define DTL_TP_ENV_H

#include "dtl_test.h"
#include "tp_oracle.h"

typedef struct {
  dtl_comm *world;
  dtl_mesh *mesh;
  dtl_tp_context *ctx;
  int tp_dim, tp, rank, data, data_coord;
} t_env;

/* dt_init, then the mesh and context (a failure stops every rank). */
static inline void t_setup(int *argc, char ***argv, t_env *env) {
  dt_init(argc, argv);
  int np = dt_size, data = 1, tp_first = 0;
  for (int i = 1; i < *argc; i++) {
    if (i + 1 < *argc && !strcmp((*argv)[i], "--data")) data = atoi((*argv)[i + 1]);
    if (!strcmp((*argv)[i], "--tp-first")) tp_first = 1;
  }
  if (data < 1 || np % data) {
    if (dt_rank == 0) fprintf(stderr, "--data %d does not divide %d ranks\n", data, np);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  memset(env, 0, sizeof *env);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &env->world));
  int shape[2] = {tp_first ? np / data : data, tp_first ? data : np / data};
  if (data > 1) REQUIRE_OK(dtl_mesh_create(env->world, 2, shape, &env->mesh));
  else REQUIRE_OK(dtl_mesh_create(env->world, 1, &np, &env->mesh));
  int tp_dim = data > 1 && !tp_first ? 1 : 0;
  REQUIRE_OK(dtl_tp_context_create(env->mesh, tp_dim, NULL, &env->ctx));
  env->tp_dim = tp_dim;
  env->tp = dtl_tp_context_size(env->ctx);
  env->rank = dtl_tp_context_rank(env->ctx);
  env->data = data;
  int coord[2] = {0, 0};
  dtl_mesh_coord(env->mesh, coord);
  env->data_coord = data > 1 ? coord[1 - tp_dim] : 0;
  if (dt_rank == 0) printf("tp=%d, data=%d, TP mesh dim %d\n", env->tp, env->data, env->tp_dim);
}

/* Frees what t_setup made; then dt_finish() or dt_skip(). */
static inline void t_teardown(t_env *env) {
  dtl_tp_context_destroy(env->ctx);
  dtl_mesh_destroy(env->mesh);
  dtl_comm_destroy(env->world);
  memset(env, 0, sizeof *env);
}

#endif

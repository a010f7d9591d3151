/* SPDX-License-Identifier: Apache-2.0 */
/* Nodes over MPI: a communicator learns each rank's node when it is made (one machine: one node, from the
 * shared-memory groups; DTL_RANKS_PER_NODE=n: n consecutive world ranks per node), a split keeps its ranks' nodes
 * numbered in its own order, and a mesh marks the dims whose groups cross nodes (also over a listed, shuffled rank
 * order). A malformed DTL_RANKS_PER_NODE fails every rank naming the value, and ranks that disagree on it fail
 * every rank as a mismatch. A TP context over a dim that crosses nodes logs a warning at DTL_LOG=warn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "comm/backend.h"
#include "dtl_test.h"

static char log_path[256];

static void one_machine_is_one_node_without_the_variable(void) {
  unsetenv("DTL_RANKS_PER_NODE");
  dtl_comm *c = NULL;
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &c));
  CHECK(dtl__comm_nnodes(c) == 1, "%d nodes on one machine", dtl__comm_nnodes(c));
  for (int r = 0; r < dt_size; r++) CHECK(dtl__comm_node_of(c, r) == 0, "rank %d on node %d", r, dtl__comm_node_of(c, r));
  dtl_comm_destroy(c);
}

static void ranks_per_node_groups_consecutive_world_ranks(void) {
  setenv("DTL_RANKS_PER_NODE", "2", 1);
  dtl_comm *c = NULL;
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &c));
  CHECK(dtl__comm_nnodes(c) == (dt_size + 1) / 2, "%d nodes at %d ranks", dtl__comm_nnodes(c), dt_size);
  for (int r = 0; r < dt_size; r++) CHECK(dtl__comm_node_of(c, r) == r / 2, "rank %d on node %d", r, dtl__comm_node_of(c, r));
  /* A split ordered backwards (key -rank) within each parity: its rank 0 is the highest world rank of the color,
   * whose node becomes the split's node 0. Colors by rank / 2 are one node each. */
  dtl_comm *s = NULL;
  REQUIRE_OK(dtl_comm_split(c, dt_rank % 2, -dt_rank, &s));
  int n = dtl_comm_size(s);
  for (int i = 0; i < n; i++) {
    int world = dt_rank % 2 + 2 * (n - 1 - i); /* the color's world ranks, highest first */
    int first = dt_rank % 2 + 2 * (n - 1);
    CHECK(dtl__comm_node_of(s, i) == first / 2 - world / 2, "split rank %d (world %d) on node %d", i, world,
          dtl__comm_node_of(s, i));
  }
  CHECK(dtl__comm_nnodes(s) == n, "the split spans %d nodes, expected %d", dtl__comm_nnodes(s), n);
  dtl_comm_destroy(s);
  REQUIRE_OK(dtl_comm_split(c, dt_rank / 2, dt_rank, &s));
  CHECK(dtl__comm_nnodes(s) == 1, "a split within a node spans %d nodes", dtl__comm_nnodes(s));
  dtl_comm_destroy(s);

  /* Meshes at 4 ranks (nodes {0,1} {2,3}): 2x2 crosses on dim 0 only; listed as 1,3,0,2 it crosses on dim 1 only
   * (mesh ranks 0,1 = world 1,3 on nodes 0,1); a 1-d mesh of 4 crosses. */
  if (dt_size == 4) {
    dtl_mesh *m = NULL;
    int x0 = -1, x1 = -1, node = -1;
    REQUIRE_OK(dtl_mesh_create(c, 2, (int[]){2, 2}, &m));
    CHECK(dtl_mesh_dim_crosses_nodes(m, 0, &x0) == DTL_OK && x0 == 1, "2x2: dim 0 crosses=%d", x0);
    CHECK(dtl_mesh_dim_crosses_nodes(m, 1, &x1) == DTL_OK && x1 == 0, "2x2: dim 1 crosses=%d", x1);
    CHECK(dtl_mesh_node_of(m, 3, &node) == DTL_OK && node == 1, "2x2: mesh rank 3 on node %d", node);
    dtl_mesh_destroy(m);
    REQUIRE_OK(dtl_mesh_create_from_ranks(c, 4, (int[]){1, 3, 0, 2}, 2, (int[]){2, 2}, &m));
    CHECK(dtl_mesh_dim_crosses_nodes(m, 0, &x0) == DTL_OK && x0 == 0, "listed 2x2: dim 0 crosses=%d", x0);
    CHECK(dtl_mesh_dim_crosses_nodes(m, 1, &x1) == DTL_OK && x1 == 1, "listed 2x2: dim 1 crosses=%d", x1);
    CHECK(dtl_mesh_node_of(m, 1, &node) == DTL_OK && node == 1, "listed 2x2: mesh rank 1 on node %d", node);
    CHECK(dtl_mesh_set_ranks_per_node(m, 1) == DTL_ERR_INVALID_ARGUMENT, "a mesh with communicators took nodes");
    dtl_mesh_destroy(m);
    REQUIRE_OK(dtl_mesh_create(c, 1, (int[]){4}, &m));
    CHECK(dtl_mesh_dim_crosses_nodes(m, 0, &x0) == DTL_OK && x0 == 1, "1-d: dim 0 crosses=%d", x0);
    dtl_mesh_destroy(m);
  }
  dtl_comm_destroy(c);
  unsetenv("DTL_RANKS_PER_NODE");
}

static void a_malformed_value_fails_every_rank_naming_it(void) {
  static const char *bad[] = {"0", "-2", "two", "2x", "4 ", "99999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv("DTL_RANKS_PER_NODE", bad[i], 1);
    dtl_comm *c = NULL;
    dtl_status st = dtl_comm_from_mpi(MPI_COMM_WORLD, &c);
    char want[64];
    snprintf(want, sizeof want, "DTL_RANKS_PER_NODE=\"%s\"", bad[i]);
    CHECK(st == DTL_ERR_INVALID_ARGUMENT, "\"%s\": %s", bad[i], dtl_status_name(st));
    CHECK(strstr(dtl_last_error(), want) != NULL, "\"%s\": message %s", bad[i], dtl_last_error());
    CHECK(c == NULL, "\"%s\": out was written", bad[i]);
    if (st == DTL_OK) dtl_comm_destroy(c);
  }
  unsetenv("DTL_RANKS_PER_NODE");
}

static void ranks_that_disagree_fail_every_rank_as_a_mismatch(void) {
  if (dt_size < 2) return;
  setenv("DTL_RANKS_PER_NODE", dt_rank == 0 ? "1" : "2", 1);
  dtl_comm *c = NULL;
  dtl_status st = dtl_comm_from_mpi(MPI_COMM_WORLD, &c);
  CHECK(st == DTL_ERR_MISMATCH, "got %s", dtl_status_name(st));
  CHECK(strstr(dtl_last_error(), "DTL_RANKS_PER_NODE") != NULL, "message %s", dtl_last_error());
  if (st == DTL_OK) dtl_comm_destroy(c);
  unsetenv("DTL_RANKS_PER_NODE");
}

/* How many lines of this rank's log mention text. */
static int log_lines_with(const char *text) {
  FILE *f = fopen(log_path, "r");
  if (!f) return 0;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, text)) n++;
  fclose(f);
  return n;
}

static void tp_across_nodes_logs_a_warning(void) {
  if (dt_size != 4) return;
  setenv("DTL_RANKS_PER_NODE", "2", 1);
  dtl_comm *c = NULL;
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &c));
  dtl_mesh *m = NULL;
  REQUIRE_OK(dtl_mesh_create(c, 2, (int[]){2, 2}, &m));
  for (int tp_dim = 1; tp_dim >= 0; tp_dim--) { /* dim 1 within a node first: no warning */
    dtl_tp_context *t = NULL;
    REQUIRE_OK(dtl_tp_context_create(m, tp_dim, NULL, &t));
    int lines = log_lines_with("dtl_tp_context_create: tp_dim=0 crosses nodes");
    CHECK(lines == (tp_dim == 0), "tp_dim=%d: %d warning lines in %s", tp_dim, lines, log_path);
    dtl_tp_context_destroy(t);
  }
  dtl_mesh_destroy(m);
  dtl_comm_destroy(c);
  unsetenv("DTL_RANKS_PER_NODE");
}

int main(int argc, char **argv) {
  /* The log is configured at the first log call of the process: before anything could log. */
  const char *tmp = getenv("TMPDIR");
  snprintf(log_path, sizeof log_path, "%s/dtl_test_mesh_nodes.%ld.log", tmp && *tmp ? tmp : "/tmp", (long)getpid());
  setenv("DTL_LOG", "warn", 1);
  setenv("DTL_LOG_FILE", log_path, 1);
  unsetenv("DTL_LOG_SUBSYS");
  dt_init(&argc, &argv);
  RUN(one_machine_is_one_node_without_the_variable);
  RUN(ranks_per_node_groups_consecutive_world_ranks);
  RUN(a_malformed_value_fails_every_rank_naming_it);
  RUN(ranks_that_disagree_fail_every_rank_as_a_mismatch);
  RUN(tp_across_nodes_logs_a_warning);
  remove(log_path);
  return dt_finish();
}

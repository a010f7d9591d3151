/* SPDX-License-Identifier: Apache-2.0 */
/* Calibration and profiles: dtl_cost_model_calibrate gives every rank the same finite positive model, a saved
 * profile loads back (DTL_PROFILE) as the same model and algorithm table, its cost line applies before
 * DTL_PLAN_TUNE, and a malformed, mismatched or differing profile is a clear error naming the file and line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "comm/backend.h"
#include "comm/profile.h"
#include "redistribute/cost.h"
#include "dtl_test.h"

static int rank, size;
static dtl_comm *world;
static dtl_mesh *mesh;
static char path[96]; /* this run's profile file (one name on every rank: the file rank 0 writes) */

static void write_file(const char *p, const char *text) {
  FILE *f = fopen(p, "w");
  CHECK(f != NULL, "cannot write %s", p);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* Every rank writes the same text to its own file and points DTL_PROFILE at it (own file: no race). */
static const char *use_profile(const char *text) {
  static char mine[128];
  snprintf(mine, sizeof mine, "%s.r%d", path, rank);
  write_file(mine, text);
  setenv("DTL_PROFILE", mine, 1);
  return mine;
}

static dtl_status comm_with_profile(dtl_comm **out) {
  dtl_status st = dtl_comm_from_mpi(MPI_COMM_WORLD, out);
  return st;
}

/* The model a plan on m resolves (engine default -> DTL_PROFILE -> DTL_PLAN_TUNE -> over). */
static dtl_status resolved(const dtl_mesh *m, const dtl_cost_model *over, dtl_cost_model *out) {
  return dtl__cost_resolve("test", m, over, out);
}

static bool same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static void calibrate_gives_every_rank_the_same_finite_positive_model(void) {
  dtl_cost_model m;
  memset(&m, 0xff, sizeof m);
  CHECK_OK(dtl_cost_model_calibrate(mesh, &m));
  double v[5] = {m.alpha_s, m.beta_s_per_byte, m.local_beta_s_per_byte, m.inter_alpha_s, m.inter_beta_s_per_byte};
  for (int k = 0; k < 5; k++) CHECK(isfinite(v[k]) && v[k] > 0, "field %d = %g (expected finite and > 0)", k, v[k]);
  CHECK(m.mask == DTL__COST_ALL && m.flags == 0, "mask %#llx flags %#llx", (unsigned long long)m.mask,
        (unsigned long long)m.flags);
  /* one node: the inter-node class takes the intra-node figures */
  CHECK(same_bits(m.inter_alpha_s, m.alpha_s) && same_bits(m.inter_beta_s_per_byte, m.beta_s_per_byte),
        "inter %g %g intra %g %g", m.inter_alpha_s, m.inter_beta_s_per_byte, m.alpha_s, m.beta_s_per_byte);
  double lo[5], hi[5];
  MPI_Allreduce(v, lo, 5, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(v, hi, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  for (int k = 0; k < 5; k++) CHECK(same_bits(lo[k], hi[k]), "field %d differs between ranks: %g..%g", k, lo[k], hi[k]);
}

/* Over simulated nodes (DTL_RANKS_PER_NODE: two nodes at 4 ranks, one rank per node at 2) each link class is
 * measured on its own ranks: the ranks of a node, then one rank of each node; every rank gets the same model. */
static void calibrate_over_nodes_measures_both_link_classes_alike_on_every_rank(void) {
  if (size < 2) return;
  char n[16];
  snprintf(n, sizeof n, "%d", size / 2 >= 2 ? size / 2 : 1);
  setenv("DTL_RANKS_PER_NODE", n, 1);
  dtl_comm *c = NULL;
  dtl_mesh *m = NULL;
  dtl_status st = dtl_comm_from_mpi(MPI_COMM_WORLD, &c);
  unsetenv("DTL_RANKS_PER_NODE");
  REQUIRE_OK(st);
  CHECK(dtl__comm_nnodes(c) == 2, "%d nodes (expected 2)", dtl__comm_nnodes(c));
  REQUIRE_OK(dtl_mesh_create(c, 1, &size, &m));
  int crosses = 0;
  CHECK_OK(dtl_mesh_dim_crosses_nodes(m, 0, &crosses));
  CHECK(crosses, "mesh dim 0 of %d ranks over 2 nodes does not cross nodes", size);
  dtl_cost_model mo;
  CHECK_OK(dtl_cost_model_calibrate(m, &mo));
  double v[5] = {mo.alpha_s, mo.beta_s_per_byte, mo.local_beta_s_per_byte, mo.inter_alpha_s, mo.inter_beta_s_per_byte};
  for (int k = 0; k < 5; k++) CHECK(isfinite(v[k]) && v[k] > 0, "field %d = %g (expected finite and > 0)", k, v[k]);
  double lo[5], hi[5];
  MPI_Allreduce(v, lo, 5, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(v, hi, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  for (int k = 0; k < 5; k++) CHECK(same_bits(lo[k], hi[k]), "field %d differs between ranks: %g..%g", k, lo[k], hi[k]);
  dtl_mesh_destroy(m);
  dtl_comm_destroy(c);
}

static void calibrate_rejects_bad_arguments_on_every_rank(void) {
  dtl_cost_model m, keep;
  memset(&m, 0x5a, sizeof m);
  keep = m;
  CHECK_ERROR(dtl_cost_model_calibrate(NULL, &m), DTL_ERR_INVALID_ARGUMENT, "mesh=NULL");
  CHECK_ERROR(dtl_cost_model_calibrate(mesh, NULL), DTL_ERR_INVALID_ARGUMENT, "out=NULL");
  dtl_mesh *abs = NULL;
  REQUIRE_OK(dtl_mesh_create_abstract(1, (int[]){2}, NULL, &abs));
  CHECK_ERROR(dtl_cost_model_calibrate(abs, &m), DTL_ERR_INVALID_ARGUMENT, "mesh is abstract");
  CHECK_ERROR(dtl_cost_model_save(path, abs, &m), DTL_ERR_INVALID_ARGUMENT, "mesh is abstract");
  dtl_mesh_destroy(abs);
  CHECK_ERROR(dtl_cost_model_save(NULL, mesh, &m), DTL_ERR_INVALID_ARGUMENT, "path=NULL");
  CHECK_ERROR(dtl_cost_model_save(path, mesh, NULL), DTL_ERR_INVALID_ARGUMENT, "model=NULL");
  dtl_cost_model good = {.mask = DTL_COST_ALPHA, .alpha_s = 1e-6};
  CHECK_ERROR(dtl_cost_model_save("/nonexistent/dir/p", mesh, &good), DTL_ERR_INVALID_ARGUMENT, "/nonexistent/dir/p");
  CHECK_ERROR(dtl_cost_model_save(path, mesh, &keep), DTL_ERR_INVALID_ARGUMENT, "cost->mask");
  CHECK(memcmp(&m, &keep, sizeof m) == 0, "a failed call wrote out");
  if (size >= 2) {
    /* one rank passes NULL: every rank fails, none hangs */
    char named[64];
    snprintf(named, sizeof named, "another rank failed");
    dtl_status st = dtl_cost_model_calibrate(mesh, rank == size - 1 ? NULL : &m);
    CHECK(memcmp(&m, &keep, sizeof m) == 0, "a failed call wrote out");
    CHECK(st == DTL_ERR_INVALID_ARGUMENT, "one rank's out=NULL: %s: %s", dtl_status_name(st), dtl_last_error());
    if (rank != size - 1) CHECK(strstr(dtl_last_error(), named) != NULL, "message '%s'", dtl_last_error());
    /* a mesh of rank 0 alone: the others are outside it */
    dtl_mesh *solo = NULL;
    REQUIRE_OK(dtl_mesh_create_from_ranks(world, 1, (int[]){0}, 1, (int[]){1}, &solo));
    if (rank == 0) CHECK_OK(dtl_cost_model_calibrate(solo, &m));
    else CHECK_ERROR(dtl_cost_model_calibrate(solo, &m), DTL_ERR_INVALID_ARGUMENT, "not in the mesh");
    dtl_mesh_destroy(solo);
    /* one rank cannot plan (its DTL_PLAN_TUNE is malformed): every rank fails, none hangs */
    if (rank == size - 1) setenv("DTL_PLAN_TUNE", "alpha=fast", 1);
    st = dtl_cost_model_calibrate(mesh, &m);
    unsetenv("DTL_PLAN_TUNE");
    CHECK(st == DTL_ERR_INVALID_ARGUMENT, "one rank's DTL_PLAN_TUNE: %s: %s", dtl_status_name(st), dtl_last_error());
    if (rank != size - 1)
      CHECK(strstr(dtl_last_error(), "another rank failed to plan") != NULL, "message '%s'", dtl_last_error());
  }
}

/* save -> DTL_PROFILE -> the same model (bit for bit) and the same algorithm table rows. */
static void a_saved_profile_loads_as_the_same_model_and_table(void) {
  /* a table unlike the built-in one, through DTL_ALGO_TABLE on the communicator that is saved */
  char tpath[128];
  snprintf(tpath, sizeof tpath, "%s.table.r%d", path, rank);
  write_file(tpath, "all_gather * * 0 ring\nall_reduce any * 4K rs_ag\nreduce exact 2-* 0 chain\n");
  setenv("DTL_ALGO_TABLE", tpath, 1);
  dtl_comm *src = NULL;
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &src));
  unsetenv("DTL_ALGO_TABLE");
  dtl_mesh *sm = NULL;
  REQUIRE_OK(dtl_mesh_create(src, 1, &size, &sm));
  dtl_cost_model m = {.mask = DTL__COST_ALL, .alpha_s = 3.25e-6, .beta_s_per_byte = 1.0 / 3e9,
                      .local_beta_s_per_byte = 7e-11, .inter_alpha_s = 9e-6, .inter_beta_s_per_byte = 1.0 / 7e8};
  if (rank == 0) CHECK_OK(dtl_cost_model_save(path, sm, &m));
  MPI_Barrier(MPI_COMM_WORLD);
  setenv("DTL_PROFILE", path, 1);
  dtl_comm *c = NULL;
  CHECK_OK(comm_with_profile(&c));
  if (c) {
    dtl_mesh *cm = NULL;
    REQUIRE_OK(dtl_mesh_create(c, 1, &size, &cm));
    dtl_cost_model r;
    CHECK_OK(resolved(cm, NULL, &r));
    CHECK(same_bits(r.alpha_s, m.alpha_s) && same_bits(r.beta_s_per_byte, m.beta_s_per_byte) &&
              same_bits(r.local_beta_s_per_byte, m.local_beta_s_per_byte) && same_bits(r.inter_alpha_s, m.inter_alpha_s) &&
              same_bits(r.inter_beta_s_per_byte, m.inter_beta_s_per_byte),
          "loaded %g %g %g %g %g", r.alpha_s, r.beta_s_per_byte, r.local_beta_s_per_byte, r.inter_alpha_s,
          r.inter_beta_s_per_byte);
    char a[4096], b[4096];
    dtl__algo_table_render(dtl__mpi_table(src), a, sizeof a);
    dtl__algo_table_render(dtl__mpi_table(c), b, sizeof b);
    CHECK(strcmp(a, b) == 0, "table saved:\n%s\nloaded:\n%s", a, b);
    CHECK(strstr(b, "all_gather") && strstr(b, "ring"), "the saved rows are not the loaded ones:\n%s", b);
    float x[4] = {0}, y[4 * 64];
    CHECK_OK(dtl_all_gather(c, x, y, 4, DTL_FLOAT32));
    CHECK(strcmp(dtl_comm_mpi_last_algorithm(c), "all_gather:ring") == 0, "ran %s (the profile's row: ring)",
          dtl_comm_mpi_last_algorithm(c));
    /* DTL_ALGO_TABLE wins over the profile's rows */
    write_file(tpath, "all_gather * * 0 direct\n");
    setenv("DTL_ALGO_TABLE", tpath, 1);
    dtl_comm *d = NULL;
    CHECK_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &d));
    unsetenv("DTL_ALGO_TABLE");
    if (d) {
      CHECK_OK(dtl_all_gather(d, x, y, 4, DTL_FLOAT32));
      CHECK(strcmp(dtl_comm_mpi_last_algorithm(d), "all_gather:direct") == 0, "ran %s (DTL_ALGO_TABLE's row: direct)",
            dtl_comm_mpi_last_algorithm(d));
    }
    dtl_comm_destroy(d);
    dtl_mesh_destroy(cm);
  }
  dtl_comm_destroy(c);
  unsetenv("DTL_PROFILE");
  dtl_mesh_destroy(sm);
  dtl_comm_destroy(src);
  remove(tpath);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) remove(path);
}

/* engine default -> profile -> DTL_PLAN_TUNE -> explicit fields */
static void the_profile_applies_after_the_engine_default_and_before_plan_tune(void) {
  char text[256];
  snprintf(text, sizeof text, "dtl-profile 1\nengine mpi\nranks %d\ncost alpha=3e-6,beta=4e-10\n", size);
  use_profile(text);
  dtl_cost_model r, def;
  REQUIRE_OK(dtl_cost_model_default(DTL_MEMORY_HOST, &def));
  CHECK_OK(resolved(mesh, NULL, &r));
  CHECK(r.alpha_s == 3e-6 && r.beta_s_per_byte == 4e-10 && r.local_beta_s_per_byte == def.local_beta_s_per_byte,
        "profile only: %g %g %g", r.alpha_s, r.beta_s_per_byte, r.local_beta_s_per_byte);
  setenv("DTL_PLAN_TUNE", "alpha=7e-6", 1);
  CHECK_OK(resolved(mesh, NULL, &r));
  CHECK(r.alpha_s == 7e-6 && r.beta_s_per_byte == 4e-10, "with DTL_PLAN_TUNE: %g %g", r.alpha_s, r.beta_s_per_byte);
  dtl_cost_model over = {.mask = DTL_COST_BETA, .beta_s_per_byte = 1e-9};
  CHECK_OK(resolved(mesh, &over, &r));
  CHECK(r.alpha_s == 7e-6 && r.beta_s_per_byte == 1e-9, "with an override: %g %g", r.alpha_s, r.beta_s_per_byte);
  unsetenv("DTL_PLAN_TUNE");
  /* a plan prices with it */
  dtl_layout *s = NULL, *t = NULL;
  dtl_plan *p = NULL;
  REQUIRE_OK(dtl_layout_create(mesh, DTL_FLOAT32, 1, (int64_t[]){4 * size}, (dtl_placement[]){dtl_shard(0)}, &s));
  REQUIRE_OK(dtl_layout_create(mesh, DTL_FLOAT32, 1, (int64_t[]){4 * size}, (dtl_placement[]){dtl_replicate()}, &t));
  CHECK_OK(dtl_plan_create(s, t, &p));
  double want = size == 1 ? 0 : size * 3e-6 + (double)(4 * (size - 1) * 4) * 4e-10;
  CHECK(p && fabs(dtl_plan_cost(p) - want) <= 1e-12 + 1e-9 * want, "plan cost %g (expected %g)", p ? dtl_plan_cost(p) : -1,
        want);
  dtl_plan_destroy(p);
  dtl_layout_destroy(s);
  dtl_layout_destroy(t);
  unsetenv("DTL_PROFILE");
}

static void expect_comm_refused(const char *text, dtl_status want, const char *msg) {
  const char *file = use_profile(text);
  dtl_comm *c = NULL;
  dtl_status st = comm_with_profile(&c);
  CHECK(st == want && strstr(dtl_last_error(), msg) && strstr(dtl_last_error(), file),
        "profile:\n%s-> %s '%s' (expected %s naming %s and '%s')", text, dtl_status_name(st), dtl_last_error(),
        dtl_status_name(want), file, msg);
  CHECK(c == NULL, "a refused communicator was stored");
  dtl_comm_destroy(c);
  unsetenv("DTL_PROFILE");
}

static void malformed_profiles_fail_naming_the_file_and_line(void) {
  char head[64];
  snprintf(head, sizeof head, "dtl-profile 1\nengine mpi\nranks %d\n", size);
  char t[512];
  expect_comm_refused("dtl-profile 2\nengine mpi\n", DTL_ERR_INVALID_ARGUMENT, "line 1 \"dtl-profile 2\": version \"2\"");
  expect_comm_refused("# only comments\n\nengine mpi\n", DTL_ERR_INVALID_ARGUMENT, "line 3 \"engine mpi\": not a dtl profile");
  expect_comm_refused("", DTL_ERR_INVALID_ARGUMENT, "empty");
  snprintf(t, sizeof t, "%s# speed\nspeed 3\n", head);
  expect_comm_refused(t, DTL_ERR_INVALID_ARGUMENT, "line 5 \"speed 3\": unknown keyword \"speed\"");
  expect_comm_refused("dtl-profile 1\nengine mpi\nranks four\n", DTL_ERR_INVALID_ARGUMENT, "line 3 \"ranks four\": ranks");
  expect_comm_refused("dtl-profile 1\nengine tcp\n", DTL_ERR_INVALID_ARGUMENT, "line 2 \"engine tcp\": engine \"tcp\"");
  expect_comm_refused("dtl-profile 1\nranks 2\n", DTL_ERR_INVALID_ARGUMENT, "no engine line");
  snprintf(t, sizeof t, "%scost alpha=1e-6\ncost beta=1e-9\n", head);
  expect_comm_refused(t, DTL_ERR_INVALID_ARGUMENT, "line 5 \"cost beta=1e-9\": cost is given twice");
  snprintf(t, sizeof t, "%stable all_gather * * 0 ring\ntable all_gather * * 0 spiral\n", head);
  expect_comm_refused(t, DTL_ERR_INVALID_ARGUMENT, "line 5: algorithm \"spiral\"");
  /* a missing file */
  setenv("DTL_PROFILE", "/nonexistent/dtl.profile", 1);
  dtl_comm *c = NULL;
  CHECK_ERROR(comm_with_profile(&c), DTL_ERR_INVALID_ARGUMENT, "DTL_PROFILE=\"/nonexistent/dtl.profile\"");
  dtl_comm_destroy(c);
  /* a bad number in the cost line: the plan that would use it fails, naming the line and entry */
  snprintf(t, sizeof t, "%scost alpha=1e-6,beta=fast\n", head);
  const char *file = use_profile(t);
  dtl_cost_model r;
  CHECK_ERROR(resolved(mesh, NULL, &r), DTL_ERR_INVALID_ARGUMENT, "line 4: cost=\"alpha=1e-6,beta=fast\": beta=\"fast\"");
  CHECK(strstr(dtl_last_error(), file) != NULL, "message '%s' lacks %s", dtl_last_error(), file);
  snprintf(t, sizeof t, "%scost alpha=1e-6,speed=2\n", head);
  use_profile(t);
  CHECK_ERROR(resolved(mesh, NULL, &r), DTL_ERR_INVALID_ARGUMENT, "entry \"speed=2\" has no known key");
  unsetenv("DTL_PROFILE");
}

/* A profile of `bytes` bytes: the header, then comment lines padding it out. */
static char *padded_profile(size_t bytes) {
  char head[64];
  int h = snprintf(head, sizeof head, "dtl-profile 1\nengine mpi\nranks %d\n", size);
  char *t = malloc(bytes + 1);
  if (!t) return NULL;
  memcpy(t, head, (size_t)h);
  for (size_t i = (size_t)h; i < bytes; i += 64) {
    size_t len = bytes - i < 64 ? bytes - i : 64;
    memset(t + i, 'x', len);
    t[i] = '#';
    t[i + len - 1] = '\n';
  }
  t[bytes] = '\0';
  return t;
}

static void a_profile_of_up_to_1_mib_loads_and_one_byte_more_is_refused(void) {
  const size_t mib = (size_t)1 << 20;
  const size_t sizes[] = {mib - 1, mib};
  for (int i = 0; i < 2; i++) {
    char *t = padded_profile(sizes[i]);
    CHECK(t != NULL, "no memory for a %zu-byte profile", sizes[i]);
    if (!t) return;
    use_profile(t);
    free(t);
    dtl_comm *c = NULL;
    dtl_status st = comm_with_profile(&c);
    CHECK(st == DTL_OK, "a profile of %zu bytes: %s '%s' (expected DTL_OK)", sizes[i], dtl_status_name(st),
          dtl_last_error());
    dtl_comm_destroy(c);
    unsetenv("DTL_PROFILE");
  }
  char *t = padded_profile(mib + 1);
  CHECK(t != NULL, "no memory for a profile");
  if (!t) return;
  expect_comm_refused(t, DTL_ERR_INVALID_ARGUMENT, "over 1 MiB");
  free(t);
}

static void a_profile_of_another_rank_count_or_engine_is_a_mismatch(void) {
  char t[256];
  snprintf(t, sizeof t, "dtl-profile 1\nengine mpi\nranks %d\ncost alpha=1e-6\n", size + 1);
  char msg[96];
  snprintf(msg, sizeof msg, "recorded for engine mpi on %d ranks, used for engine mpi on %d ranks", size + 1, size);
  expect_comm_refused(t, DTL_ERR_MISMATCH, msg);
  snprintf(t, sizeof t, "dtl-profile 1\nengine nccl\nranks %d\ncost alpha=1e-6\n", size);
  expect_comm_refused(t, DTL_ERR_MISMATCH, "recorded for engine nccl");
  /* a plan on an abstract mesh (MPI's model) with an NCCL profile */
  use_profile(t);
  dtl_mesh *abs = NULL;
  REQUIRE_OK(dtl_mesh_create_abstract(1, (int[]){2}, NULL, &abs));
  dtl_cost_model r;
  CHECK_ERROR(resolved(abs, NULL, &r), DTL_ERR_MISMATCH, "used for a plan on a mesh of engine mpi");
  dtl_mesh_destroy(abs);
  unsetenv("DTL_PROFILE");
}

static void different_profiles_on_different_ranks_fail_every_rank(void) {
  if (size < 2) return;
  char t[256];
  snprintf(t, sizeof t, "dtl-profile 1\nengine mpi\nranks %d\ncost alpha=%s\n", size, rank == size - 1 ? "2e-6" : "1e-6");
  use_profile(t);
  dtl_comm *c = NULL;
  CHECK_ERROR(comm_with_profile(&c), DTL_ERR_MISMATCH, "DTL_PROFILE, DTL_RANKS_PER_NODE or DTL_TIMEOUT differs between the ranks");
  CHECK(c == NULL, "a refused communicator was stored");
  unsetenv("DTL_PROFILE");
}

/* The sweep replaces the swept collectives' rows by measured ones, the same on every rank, keeps DTL_ALGO's forced
 * choices, and the calls then run what the new rows say. */
static void the_algorithm_sweep_installs_one_valid_table_on_every_rank(void) {
  CHECK_ERROR(dtl_mpi_algorithm_calibrate(NULL), DTL_ERR_INVALID_ARGUMENT, "comm=NULL");
  setenv("DTL_ALGO", "reduce:chain", 1);
  dtl_comm *c = NULL;
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &c));
  unsetenv("DTL_ALGO");
  CHECK_OK(dtl_mpi_algorithm_calibrate(c));
  const dtl__algo_table *t = dtl__mpi_table(c);
  int64_t fp[2] = {(int64_t)(t->fp >> 1), -(int64_t)(t->fp >> 1)};
  MPI_Allreduce(MPI_IN_PLACE, fp, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  CHECK(fp[0] == -fp[1], "the ranks installed different tables");
  CHECK(t->forced[DTL__COLL_REDUCE] == DTL__ALGO_CHAIN, "DTL_ALGO's forced choice was lost");
  for (int k = 0; k < DTL__NCOLLS; k++)
    if (k != DTL__COLL_REDUCE) CHECK(t->forced[k] == -1, "collective %d left forced to %d", k, t->forced[k]);
  int ag_rows = 0;
  for (int i = 0; i < t->nrows; i++) ag_rows += t->rows[i].coll == DTL__COLL_ALL_GATHER;
  CHECK(ag_rows >= 1 && ag_rows <= 3, "%d all_gather rows (expected 1 to 3 measured ones)", ag_rows);
  /* the row for a 1 MiB all-gather is what runs */
  size_t n = (1048576 / 4) / (size_t)size * (size_t)size;
  int32_t *x = calloc(n, sizeof *x), *y = calloc(n, sizeof *y);
  CHECK_OK(dtl_all_gather(c, x, y, n / (size_t)size, DTL_INT32));
  dtl__algo want = dtl__algo_pick(t, DTL__COLL_ALL_GATHER, DTL__CLASS_ANY, size, n * 4, false, false);
  char name[64];
  snprintf(name, sizeof name, "all_gather:%s", dtl__algo_name(want));
  CHECK(strcmp(dtl_comm_mpi_last_algorithm(c), name) == 0, "ran %s, the table says %s", dtl_comm_mpi_last_algorithm(c),
        name);
  free(x);
  free(y);
  dtl_comm_destroy(c);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  unsetenv("DTL_PROFILE");
  unsetenv("DTL_PLAN_TUNE");
  unsetenv("DTL_ALGO_TABLE");
  unsetenv("DTL_ALGO");
  int pid = (int)getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  snprintf(path, sizeof path, "/tmp/dtl_calibrate_test_%d_np%d.profile", pid, size);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  REQUIRE_OK(dtl_mesh_create(world, 1, &size, &mesh));
  RUN(calibrate_gives_every_rank_the_same_finite_positive_model);
  RUN(calibrate_over_nodes_measures_both_link_classes_alike_on_every_rank);
  RUN(calibrate_rejects_bad_arguments_on_every_rank);
  RUN(a_saved_profile_loads_as_the_same_model_and_table);
  RUN(the_profile_applies_after_the_engine_default_and_before_plan_tune);
  RUN(malformed_profiles_fail_naming_the_file_and_line);
  RUN(a_profile_of_up_to_1_mib_loads_and_one_byte_more_is_refused);
  RUN(a_profile_of_another_rank_count_or_engine_is_a_mismatch);
  RUN(different_profiles_on_different_ranks_fail_every_rank);
  RUN(the_algorithm_sweep_installs_one_valid_table_on_every_rank);
  char mine[128];
  snprintf(mine, sizeof mine, "%s.r%d", path, rank);
  remove(mine);
  dtl_mesh_destroy(mesh);
  dtl_comm_destroy(world);
  return dt_finish();
}

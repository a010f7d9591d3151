/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_safetensors_read on every rank of a mesh: rank 0 writes one file holding a tensor of every dtype and
 * shape (uneven, zero-size), and every rank reads its shard of many layouts straight from it. The shard must
 * be byte for byte what dtl_distribute gives from the dense tensor (the same Partial rule), and
 * dtl_full_tensor of the shards must give back the dense tensor; again with a window of a few bytes, so that
 * gathered runs cross window boundaries. Bad arguments leave the shard untouched. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/stat.h>
#include "checkpoint/checkpoint_internal.h"
#include "dtl_test.h"
#include "dtype_data.h"

static dtl_comm *world;
static char dir[64], path[128];

static const dtl_dtype dtypes[] = {DTL_FLOAT32, DTL_FLOAT64, DTL_FLOAT16,     DTL_BFLOAT16,   DTL_INT8,
                                   DTL_UINT8,   DTL_INT32,   DTL_INT64, DTL_FLOAT8_E4M3, DTL_FLOAT8_E5M2};
#define NDT 10
static const int64_t shapes[][3] = {{7, 5, 3}, {0, 4, 3}, {2, 9, 1}, {5, 1, 6}};
#define NSH 4

/* Integer values (exact in every dtype but the 8-bit floats, which hold them rounded and only P(max)/P(min)). */
static void *dense(dtl_dtype t, size_t n, unsigned seed) {
  void *p = malloc(n * dtl_dtype_size(t) + 8);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int v = (int)((s >> 33) % 201) - 100;
    t_put(t, p, i, t == DTL_UINT8 ? v + 100 : v);
  }
  return p;
}
static size_t count3(const int64_t *s) { return (size_t)(s[0] * s[1] * s[2]); }
static void tensor_name(char *buf, int di, int si) { snprintf(buf, 32, "model.%s.%d", dtl_dtype_name(dtypes[di]), si); }

/* Rank 0 writes the file; every rank knows its path. */
static void write_the_file(void) {
  if (dt_rank == 0) {
    snprintf(dir, sizeof dir, "/tmp/dtl_ckpt_mpi_XXXXXX");
    REQUIRE_OK(mkdtemp(dir) ? DTL_OK : DTL_ERR_INVALID_ARGUMENT);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    dtl_safetensors_writer *w;
    REQUIRE_OK(dtl_safetensors_write_begin(path, &w));
    for (int di = 0; di < NDT; di++)
      for (int si = 0; si < NSH; si++) {
        char name[32];
        tensor_name(name, di, si);
        void *d = dense(dtypes[di], count3(shapes[si]), (unsigned)(di * 10 + si));
        REQUIRE_OK(dtl_safetensors_write_add(w, name, dtypes[di], 3, shapes[si], d));
        free(d);
      }
    REQUIRE_OK(dtl_safetensors_write_end(w));
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
}

/* Reads every tensor into layouts of the placements on mesh, and checks the shard against dtl_distribute and
 * the reassembled tensor against the dense one. */
static void check_layouts(dtl_mesh *mesh, const char *const *placements, int np, size_t window) {
  dtl_safetensors *f;
  REQUIRE_OK(dtl_safetensors_open(path, &f));
  f->window = window;
  int mdims = dtl_mesh_ndim(mesh);
  for (int di = 0; di < NDT; di++)
    for (int si = 0; si < NSH; si++)
      for (int pi = 0; pi < np; pi++) {
        dtl_dtype t = dtypes[di];
        dtl_placement pl[DTL_MAX_MESH_DIMS];
        int n;
        REQUIRE_OK(dtl_placements_parse(placements[pi], pl, mdims, &n));
        dtl_layout *l;
        bool rounds = false; /* a Partial the 8-bit floats cannot hold (types.h) */
        for (int md = 0; md < mdims; md++)
          rounds |= (t == DTL_FLOAT8_E4M3 || t == DTL_FLOAT8_E5M2) && pl[md].kind == DTL_PARTIAL && pl[md].op != DTL_MAX &&
                    pl[md].op != DTL_MIN;
        if (rounds) {
          CHECK_ERROR(dtl_layout_create(mesh, t, 3, shapes[si], pl, &l), DTL_ERR_UNSUPPORTED, "would round at every step");
          continue;
        }
        REQUIRE_OK(dtl_layout_create(mesh, t, 3, shapes[si], pl, &l));
        char name[32];
        tensor_name(name, di, si);
        size_t es = dtl_dtype_size(t), local = dtl_layout_local_count(l), total = count3(shapes[si]);
        void *d = dense(t, total, (unsigned)(di * 10 + si));
        unsigned char *got = malloc(local * es + 1), *want = malloc(local * es + 1), *full = malloc(total * es + 1);
        memset(got, 0xEE, local * es + 1);
        CHECK_OK(dtl_safetensors_read(f, name, l, got));
        CHECK_OK(dtl_distribute(l, d, 0, want));
        CHECK(!memcmp(got, want, local * es), "%s as %s: the shard differs from dtl_distribute's", name, placements[pi]);
        CHECK(got[local * es] == 0xEE, "%s as %s: wrote past the shard", name, placements[pi]);
        CHECK_OK(dtl_full_tensor(l, got, full));
        CHECK(!memcmp(full, d, total * es), "%s as %s: the reassembled tensor differs", name, placements[pi]);
        free(d);
        free(got);
        free(want);
        free(full);
        dtl_layout_destroy(l);
      }
  dtl_safetensors_close(f);
}

static const char *const on_1d[] = {"S(0)", "S(1)", "S(2)", "R", "P", "P(max)", "P(prod)"};
static const char *const on_2d[] = {"S(0),S(1)", "S(1),S(0)", "S(0),S(0)", "R,S(2)", "P,S(1)", "S(2),P(min)", "P,P"};

static void every_dtype_and_layout_reads_the_shard_dtl_distribute_gives(void) {
  dtl_mesh *m;
  int np = dt_size;
  REQUIRE_OK(dtl_mesh_create(world, 1, &np, &m));
  check_layouts(m, on_1d, 7, DTL__ST_WINDOW);
  dtl_mesh_destroy(m);
  if (dt_size == 4) {
    int s[2] = {2, 2};
    REQUIRE_OK(dtl_mesh_create(world, 2, s, &m));
    check_layouts(m, on_2d, 7, DTL__ST_WINDOW);
    dtl_mesh_destroy(m);
  }
}

static void a_window_of_a_few_bytes_reads_the_same_shards(void) {
  dtl_mesh *m;
  int np = dt_size;
  REQUIRE_OK(dtl_mesh_create(world, 1, &np, &m));
  check_layouts(m, on_1d, 4, 40);
  dtl_mesh_destroy(m);
}

/* An abstract mesh has no communicator: the read goes to host memory, for the coordinate it was given. */
static void abstract_meshes_read_the_box_of_their_coordinate(void) {
  int shape[2] = {3, 2}, coord[2] = {2, 1};
  dtl_mesh *m;
  REQUIRE_OK(dtl_mesh_create_abstract(2, shape, coord, &m));
  dtl_placement pl[2];
  int n;
  REQUIRE_OK(dtl_placements_parse("S(0),S(2)", pl, 2, &n));
  dtl_layout *l;
  REQUIRE_OK(dtl_layout_create(m, DTL_INT32, 3, shapes[0], pl, &l));
  dtl_safetensors *f;
  REQUIRE_OK(dtl_safetensors_open(path, &f));
  char name[32];
  tensor_name(name, 6, 0);
  int32_t *d = dense(DTL_INT32, count3(shapes[0]), 60), got[64];
  CHECK_OK(dtl_safetensors_read(f, name, l, got));
  /* torch.chunk: dim 0 (7) over 3 -> rows 6..6 for coordinate 2; dim 2 (3) over 2 -> column 2 for coordinate 1. */
  CHECK(dtl_layout_local_count(l) == 5, "local count %zu", dtl_layout_local_count(l));
  for (int j = 0; j < 5; j++) CHECK(got[j] == d[(6 * 5 + j) * 3 + 2], "element %d", j);
  free(d);
  dtl_safetensors_close(f);
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

static void mismatched_reads_name_the_tensor_and_field_and_write_nothing(void) {
  dtl_mesh *m;
  int np = dt_size;
  REQUIRE_OK(dtl_mesh_create(world, 1, &np, &m));
  dtl_placement pl = dtl_replicate();
  int64_t other[3] = {7, 5, 4};
  dtl_layout *l, *wrong_shape, *wrong_dtype, *two_d;
  REQUIRE_OK(dtl_layout_create(m, DTL_FLOAT32, 3, shapes[0], &pl, &l));
  REQUIRE_OK(dtl_layout_create(m, DTL_FLOAT32, 3, other, &pl, &wrong_shape));
  REQUIRE_OK(dtl_layout_create(m, DTL_INT32, 3, shapes[0], &pl, &wrong_dtype));
  REQUIRE_OK(dtl_layout_create(m, DTL_FLOAT32, 2, shapes[0], &pl, &two_d));
  dtl_safetensors *f;
  REQUIRE_OK(dtl_safetensors_open(path, &f));
  float buf[128];
  memset(buf, 0, sizeof buf);
  CHECK_ERROR(dtl_safetensors_read(f, "model.f32.0", wrong_shape, buf), DTL_ERR_INVALID_ARGUMENT,
              "tensor \"model.f32.0\": shape=[7,5,3] in the file, layout shape=[7,5,4]");
  CHECK_ERROR(dtl_safetensors_read(f, "model.f32.0", two_d, buf), DTL_ERR_INVALID_ARGUMENT, "layout shape=[7,5]");
  CHECK_ERROR(dtl_safetensors_read(f, "model.f32.0", wrong_dtype, buf), DTL_ERR_INVALID_ARGUMENT,
              "tensor \"model.f32.0\": dtype=F32 in the file, I32 requested");
  CHECK_ERROR(dtl_safetensors_read(f, "model.f32.9", l, buf), DTL_ERR_INVALID_ARGUMENT,
              "tensor \"model.f32.9\" is not in the file");
  CHECK_ERROR(dtl_safetensors_read(f, "model.f32.0", l, NULL), DTL_ERR_INVALID_ARGUMENT, "local=NULL with 105 local elements");
  CHECK_ERROR(dtl_safetensors_read(f, "model.f32.0", NULL, buf), DTL_ERR_INVALID_ARGUMENT, "layout=NULL");
  CHECK_ERROR(dtl_safetensors_read(NULL, "model.f32.0", l, buf), DTL_ERR_INVALID_ARGUMENT, "file=NULL");
  for (int i = 0; i < 128; i++) CHECK(buf[i] == 0.0f, "buf[%d] written", i);
  dtl_safetensors_close(f);
  dtl_layout_destroy(l);
  dtl_layout_destroy(wrong_shape);
  dtl_layout_destroy(wrong_dtype);
  dtl_layout_destroy(two_d);
  dtl_mesh_destroy(m);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  write_the_file();
  RUN(every_dtype_and_layout_reads_the_shard_dtl_distribute_gives);
  RUN(a_window_of_a_few_bytes_reads_the_same_shards);
  RUN(abstract_meshes_read_the_box_of_their_coordinate);
  RUN(mismatched_reads_name_the_tensor_and_field_and_write_nothing);
  MPI_Barrier(MPI_COMM_WORLD);
  if (dt_rank == 0) {
    unlink(path);
    rmdir(dir);
  }
  dtl_comm_destroy(world);
  return dt_finish();
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The layout math against an independent oracle: every coordinate's box of every layout in an exhaustive
 * range (1-3 tensor dims, sizes 0..9, meshes of 1-3 dims, nested and negative shard dims) is compared with
 * a brute-force chunker that deals out element indices one by one, and the boxes of all coordinates must
 * cover every element exactly once per replica. Plus the torch.chunk worked examples. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "layout/layout_internal.h"
#include "sanitized.h"

/* --- the oracle ---------------------------------------------------------------------------------------- */

/* The indices of one tensor dim (size n) that coordinate coord keeps: start from the list 0..n-1 and, for
 * each mesh dim that shards this tensor dim (left to right), deal the list out as torch.chunk does (piece
 * size = the least s with s * k >= len; element j goes to piece j / s) and keep piece coord[md]. An empty
 * piece starts where its predecessors end. The kept list must be contiguous; it is returned as off/size. */
static void oracle_dim(int64_t n, const int *mesh_shape, int mesh_ndim, const int *shards_dim, const int *coord,
                       int64_t *off, int64_t *size) {
  int64_t list[16];
  assert_true(n <= 16);
  int64_t len = n, start = 0;
  for (int64_t j = 0; j < n; j++) list[j] = j;
  for (int md = 0; md < mesh_ndim; md++) {
    if (!shards_dim[md]) continue;
    int64_t k = mesh_shape[md], s = 0;
    while (s * k < len) s++;
    int64_t kept = 0, before = 0;
    for (int64_t j = 0; j < len; j++) {
      int64_t piece = j / s;
      if (piece == coord[md]) list[kept++] = list[j];
      else if (piece < coord[md]) before++;
    }
    start += before;
    len = kept;
    for (int64_t j = 0; j < len; j++) assert_int_equal(list[j], start + j);
  }
  *off = start;
  *size = len;
}

/* --- enumeration ---------------------------------------------------------------------------------------- */

typedef struct {
  long layouts, coords;
} tally;

static bool next_coord(int ndim, const int *shape, int *c) {
  for (int d = ndim - 1; d >= 0; d--) {
    if (++c[d] < shape[d]) return true;
    c[d] = 0;
  }
  return false;
}

/* Checks one layout: every coordinate's box against the oracle, and exact coverage. */
static void check_layout(const int *mshape, int mndim, const dtl_placement *pl, int tndim, const int64_t *tshape,
                         tally *t) {
  static unsigned long seen; /* under ASan one layout in three (sanitized.h) */
  if (!DTL_TEST_SAMPLED(seen, 3)) return;
  /* The mesh's own coordinate is the last one, so that dtl_layout_local_box(NULL) is checked too. */
  int own[DTL_MAX_MESH_DIMS] = {0};
  for (int md = 0; md < mndim; md++) own[md] = mshape[md] - 1;
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(mndim, mshape, own, &m), DTL_OK);
  dtl_layout *l;
  dtl_status st = dtl_layout_create(m, DTL_FLOAT32, tndim, tshape, pl, &l);
  if (st != DTL_OK) fail_msg("dtl_layout_create: %s", dtl_last_error());

  /* The normalised placements: shard dims non-negative, the rest unchanged. */
  dtl_placement norm[DTL_MAX_MESH_DIMS];
  dtl_layout_placements(l, norm);
  int shard_of[DTL_MAX_MESH_DIMS];
  int64_t replicas = 1;
  for (int md = 0; md < mndim; md++) {
    assert_int_equal(norm[md].kind, pl[md].kind);
    shard_of[md] = -1;
    if (pl[md].kind == DTL_SHARD) {
      shard_of[md] = pl[md].dim < 0 ? pl[md].dim + tndim : pl[md].dim;
      assert_int_equal(norm[md].dim, shard_of[md]);
    } else {
      replicas *= mshape[md];
    }
  }

  int64_t numel = 1;
  for (int d = 0; d < tndim; d++) numel *= tshape[d];
  assert_int_equal(dtl_layout_global_count(l), (size_t)numel);
  int cover[1000] = {0};
  assert_true(numel <= 1000);

  int c[DTL_MAX_MESH_DIMS] = {0};
  do {
    int64_t want_off[3], want_size[3], got_off[3] = {-7, -7, -7}, got_size[3] = {-7, -7, -7};
    for (int d = 0; d < tndim; d++) {
      int shards_d[DTL_MAX_MESH_DIMS];
      for (int md = 0; md < mndim; md++) shards_d[md] = shard_of[md] == d;
      oracle_dim(tshape[d], mshape, mndim, shards_d, c, &want_off[d], &want_size[d]);
    }
    assert_int_equal(dtl_layout_local_box(l, c, got_size, got_off), DTL_OK);
    for (int d = 0; d < tndim; d++) {
      if (got_off[d] != want_off[d] || got_size[d] != want_size[d])
        fail_msg("box of tensor dim %d at coord (%d,%d,%d): dtl [%lld +%lld], oracle [%lld +%lld]", d, c[0],
                 mndim > 1 ? c[1] : -1, mndim > 2 ? c[2] : -1, (long long)got_off[d], (long long)got_size[d],
                 (long long)want_off[d], (long long)want_size[d]);
    }
    /* Count each element of the box (row-major index over the global shape). */
    int64_t idx[3] = {0, 0, 0}, vol = 1;
    for (int d = 0; d < tndim; d++) vol *= want_size[d];
    for (int64_t e = 0; e < vol; e++) {
      int64_t rem = e, flat = 0;
      for (int d = tndim - 1; d >= 0; d--) {
        idx[d] = want_off[d] + rem % want_size[d];
        rem /= want_size[d];
      }
      for (int d = 0; d < tndim; d++) flat = flat * tshape[d] + idx[d];
      cover[flat]++;
    }
    bool is_own = true;
    for (int md = 0; md < mndim; md++) is_own = is_own && c[md] == own[md];
    if (is_own) {
      int64_t s[3], o[3];
      assert_int_equal(dtl_layout_local_box(l, NULL, s, o), DTL_OK);
      for (int d = 0; d < tndim; d++) {
        assert_int_equal(s[d], want_size[d]);
        assert_int_equal(o[d], want_off[d]);
      }
      assert_int_equal(dtl_layout_local_count(l), (size_t)vol);
    }
    t->coords++;
  } while (next_coord(mndim, mshape, c));
  for (int64_t e = 0; e < numel; e++)
    if (cover[e] != replicas) fail_msg("element %lld is held %d times (expected %lld)", (long long)e, cover[e], (long long)replicas);
  t->layouts++;
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

/* Every placement vector over kinds {R, P, S(0..tndim-1)} for one mesh; a shard is written with its
 * negative dim on alternate (vector, mesh dim) positions, so negative dims run through the whole range. */
static void check_all_placements(const int *mshape, int mndim, int tndim, const int64_t *tshape, tally *t) {
  const int nkinds = 2 + tndim;
  int total = 1;
  for (int md = 0; md < mndim; md++) total *= nkinds;
  for (int v = 0; v < total; v++) {
    dtl_placement pl[DTL_MAX_MESH_DIMS];
    int rest = v;
    for (int md = 0; md < mndim; md++) {
      int k = rest % nkinds;
      rest /= nkinds;
      if (k == 0) pl[md] = dtl_replicate();
      else if (k == 1) pl[md] = dtl_partial(DTL_SUM);
      else pl[md] = dtl_shard((v + md) % 2 ? k - 2 - tndim : k - 2);
    }
    check_layout(mshape, mndim, pl, tndim, tshape, t);
  }
}

/* Every mesh with mndim dims of sizes 1..max_mesh. */
static void check_all_meshes(int mndim, int max_mesh, int tndim, const int64_t *tshape, tally *t) {
  int ms[DTL_MAX_MESH_DIMS];
  for (int md = 0; md < mndim; md++) ms[md] = 1;
  do {
    check_all_placements(ms, mndim, tndim, tshape, t);
    int md = mndim - 1;
    while (md >= 0 && ++ms[md] > max_mesh) ms[md--] = 1;
    if (md < 0) break;
  } while (1);
}

/* Every tensor shape with tndim dims of sizes 0..max_size, on every mesh of 1..max_mesh_ndim dims. */
static void check_range(int tndim, int max_size, int max_mesh_ndim, int max_mesh, tally *t) {
  int64_t ts[3] = {0, 0, 0};
  do {
    for (int mndim = 1; mndim <= max_mesh_ndim; mndim++) check_all_meshes(mndim, max_mesh, tndim, ts, t);
    int d = tndim - 1;
    while (d >= 0 && ++ts[d] > max_size) ts[d--] = 0;
    if (d < 0) break;
  } while (1);
}

static void boxes_of_1d_tensors_match_oracle_on_meshes_up_to_4x4x4(void **state) {
  tally t = {0};
  check_range(1, 9, 3, 4, &t);
  print_message("%ld layouts, %ld coordinates\n", t.layouts, t.coords);
}

static void boxes_of_2d_tensors_match_oracle_on_meshes_up_to_4x4x4(void **state) {
  tally t = {0};
  check_range(2, 9, 3, 4, &t);
  print_message("%ld layouts, %ld coordinates\n", t.layouts, t.coords);
}

static void boxes_of_3d_tensors_match_oracle_on_meshes_up_to_4x4_and_sampled_3d(void **state) {
  tally t = {0};
  check_range(3, 9, 2, 4, &t); /* 1-d and 2-d meshes up to 4x4 */
  /* 3-d meshes (a triple split of one tensor dim needs three mesh dims): a sample of shapes, with every
   * size 0..9 on dim 0 and a spread on the others. */
  static const int m3[][3] = {{2, 2, 2}, {1, 2, 3}, {3, 2, 1}, {4, 3, 2}, {2, 4, 3}};
  int64_t ts[3];
  for (int i = 0; i < 5; i++)
    for (ts[0] = 0; ts[0] <= 9; ts[0] += 1)
      for (ts[1] = 0; ts[1] <= 9; ts[1] += 3)
        for (ts[2] = 0; ts[2] <= 9; ts[2] += 4) check_all_placements(m3[i], 3, 3, ts, &t);
  print_message("%ld layouts, %ld coordinates\n", t.layouts, t.coords);
}

/* --- torch.chunk worked examples ------------------------------------------------------------------------ */

static void expect_chunks(int64_t n, int k, const int64_t *sizes) {
  int64_t off = 0;
  for (int i = 0; i < k; i++) {
    int64_t o, s;
    dtl__chunk(n, k, i, &o, &s);
    if (o != off || s != sizes[i])
      fail_msg("chunk %d of n=%lld k=%d: [%lld +%lld], expected [%lld +%lld]", i, (long long)n, k, (long long)o,
               (long long)s, (long long)off, (long long)sizes[i]);
    off += s;
  }
  assert_int_equal(off, n);
}

static void chunk_follows_torch_chunk_worked_examples(void **state) {
  expect_chunks(5, 4, (const int64_t[]){2, 2, 1, 0});
  expect_chunks(10, 4, (const int64_t[]){3, 3, 3, 1});
  expect_chunks(2, 4, (const int64_t[]){1, 1, 0, 0});
  expect_chunks(8, 4, (const int64_t[]){2, 2, 2, 2});
  expect_chunks(4, 3, (const int64_t[]){2, 2, 0}); /* ceil(4/3)=2: the last chunk is empty, not 1,1,2 */
  expect_chunks(7, 1, (const int64_t[]){7});
  expect_chunks(0, 3, (const int64_t[]){0, 0, 0});
  expect_chunks(1, 1, (const int64_t[]){1});
}

static void empty_tail_chunk_starts_at_the_end_of_the_dim(void **state) {
  int64_t o, s;
  dtl__chunk(2, 4, 3, &o, &s);
  assert_int_equal(o, 2);
  assert_int_equal(s, 0);
  dtl__chunk(0, 2, 1, &o, &s);
  assert_int_equal(o, 0);
  assert_int_equal(s, 0);
}

/* Dims near INT64_MAX are legal for 1-byte dtypes; the chunk arithmetic must not overflow. */
static void chunk_of_a_dim_near_int64_max_does_not_overflow(void **state) {
  const int64_t n = INT64_MAX, c = INT64_MAX / 3 + 1; /* INT64_MAX is not divisible by 3 */
  expect_chunks(n, 3, (const int64_t[]){c, c, n - 2 * c});
  expect_chunks(n, 1, (const int64_t[]){n});
  expect_chunks(n - 1, 2, (const int64_t[]){(n - 1) / 2, (n - 1) / 2});
  int ms[1] = {4};
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(1, ms, (int[]){3}, &m), DTL_OK);
  dtl_layout *l;
  dtl_placement p = dtl_shard(0);
  assert_int_equal(dtl_layout_create(m, DTL_INT8, 1, &n, &p, &l), DTL_OK);
  int64_t total = 0;
  for (int i = 0; i < 4; i++) {
    int64_t s, o;
    assert_int_equal(dtl_layout_local_box(l, &i, &s, &o), DTL_OK);
    assert_int_equal(o, total);
    total += s;
  }
  assert_int_equal(total, n);
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

/* Nested splits go left to right: [S0,S0] on 2x2 over n=5 first splits 3|2, then 2|1 and 1|1. */
static void nested_shards_split_left_to_right(void **state) {
  int ms[2] = {2, 2};
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(2, ms, NULL, &m), DTL_OK);
  dtl_layout *l;
  const int64_t n = 5;
  assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 1, &n, (dtl_placement[]){dtl_shard(0), dtl_shard(-1)}, &l), DTL_OK);
  const int64_t off[4] = {0, 2, 3, 4}, size[4] = {2, 1, 1, 1};
  for (int r = 0; r < 4; r++) {
    int c[2] = {r / 2, r % 2};
    int64_t s, o;
    assert_int_equal(dtl_layout_local_box(l, c, &s, &o), DTL_OK);
    assert_int_equal(o, off[r]);
    assert_int_equal(s, size[r]);
  }
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

static void with_placements_keeps_mesh_dtype_and_shape(void **state) {
  int ms[2] = {2, 3};
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(2, ms, (int[]){1, 2}, &m), DTL_OK);
  const int64_t shape[2] = {7, 5};
  dtl_layout *a, *b, *c;
  assert_int_equal(dtl_layout_create(m, DTL_INT32, 2, shape, (dtl_placement[]){dtl_shard(0), dtl_replicate()}, &a), DTL_OK);
  assert_int_equal(dtl_layout_with_placements(a, (dtl_placement[]){dtl_replicate(), dtl_shard(-1)}, &b), DTL_OK);
  assert_int_equal(dtl_layout_create(m, DTL_INT32, 2, shape, (dtl_placement[]){dtl_replicate(), dtl_shard(1)}, &c), DTL_OK);
  assert_ptr_equal(dtl_layout_mesh(b), m);
  assert_int_equal(dtl_layout_dtype(b), DTL_INT32);
  assert_int_equal(dtl_layout_ndim(b), 2);
  int64_t gs[2];
  dtl_layout_global_shape(b, gs);
  assert_int_equal(gs[0], 7);
  assert_int_equal(gs[1], 5);
  /* Equal layouts (negative dim normalised) hash equal; a different placement does not compare equal. */
  assert_true(dtl__layout_equal(b, c));
  assert_true(dtl__layout_hash(b) == dtl__layout_hash(c));
  assert_false(dtl__layout_equal(a, b));
  assert_true(dtl__layout_hash(a) != dtl__layout_hash(b));
  /* The local box of coord (1,2): rows all 7, cols chunk 2 of 3 of 5 = [4,5). */
  int64_t s[2], o[2];
  assert_int_equal(dtl_layout_local_box(b, NULL, s, o), DTL_OK);
  assert_int_equal(s[0], 7);
  assert_int_equal(o[1], 4);
  assert_int_equal(s[1], 1);
  assert_int_equal(dtl_layout_local_count(b), 7);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  dtl_layout_destroy(c);
  dtl_mesh_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(chunk_follows_torch_chunk_worked_examples),
      cmocka_unit_test(empty_tail_chunk_starts_at_the_end_of_the_dim),
      cmocka_unit_test(chunk_of_a_dim_near_int64_max_does_not_overflow),
      cmocka_unit_test(nested_shards_split_left_to_right),
      cmocka_unit_test(with_placements_keeps_mesh_dtype_and_shape),
      cmocka_unit_test(boxes_of_1d_tensors_match_oracle_on_meshes_up_to_4x4x4),
      cmocka_unit_test(boxes_of_2d_tensors_match_oracle_on_meshes_up_to_4x4x4),
      cmocka_unit_test(boxes_of_3d_tensors_match_oracle_on_meshes_up_to_4x4_and_sampled_3d),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

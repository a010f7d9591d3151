/* SPDX-License-Identifier: Apache-2.0 */
/* Bad input to meshes and layouts: each case gets its status, a message that names the argument and the
 * bad value, and leaves the caller's outputs as they were. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "layout/layout_internal.h"

#define UNTOUCHED_MESH ((dtl_mesh *)0x5a5a)
#define UNTOUCHED_LAYOUT ((dtl_layout *)0x5a5a)

/* The message holds each of the strings given (NULL-terminated). */
static void expect_message(const char *const *need) {
  const char *msg = dtl_last_error();
  for (; *need; need++)
    if (!strstr(msg, *need)) fail_msg("message \"%s\" lacks \"%s\"", msg, *need);
}
#define EXPECT_MESSAGE(...) expect_message((const char *const[]){__VA_ARGS__, NULL})

/* --- meshes --------------------------------------------------------------------------------------------- */

static void mesh_ndim_outside_1_to_4_is_rejected(void **state) {
  const int shape[6] = {1, 1, 1, 1, 1, 1};
  const int bad[] = {0, 5, -1, 6};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dtl_mesh *m = UNTOUCHED_MESH;
    assert_int_equal(dtl_mesh_create_abstract(bad[i], shape, NULL, &m), DTL_ERR_INVALID_ARGUMENT);
    assert_ptr_equal(m, UNTOUCHED_MESH);
    char want[48];
    snprintf(want, sizeof want, "ndim=%d (expected 1..4)", bad[i]);
    EXPECT_MESSAGE("dtl_mesh_create_abstract", want);
  }
  for (int nd = 1; nd <= 4; nd++) {
    dtl_mesh *m;
    assert_int_equal(dtl_mesh_create_abstract(nd, shape, NULL, &m), DTL_OK);
    assert_int_equal(dtl_mesh_ndim(m), nd);
    dtl_mesh_destroy(m);
  }
}

static void mesh_shape_entries_below_one_are_rejected(void **state) {
  dtl_mesh *m = UNTOUCHED_MESH;
  assert_int_equal(dtl_mesh_create_abstract(3, (int[]){2, 0, 2}, NULL, &m), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("shape[1]=0 (expected >= 1)");
  assert_int_equal(dtl_mesh_create_abstract(2, (int[]){-4, 2}, NULL, &m), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("shape[0]=-4 (expected >= 1)");
  assert_int_equal(dtl_mesh_create_abstract(2, NULL, NULL, &m), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("shape=NULL");
  assert_ptr_equal(m, UNTOUCHED_MESH);
}

static void mesh_with_more_ranks_than_an_int_is_rejected_naming_the_shape(void **state) {
  dtl_mesh *m = UNTOUCHED_MESH;
  assert_int_equal(dtl_mesh_create_abstract(3, (int[]){65536, 65536, 2}, NULL, &m), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("shape=65536x65536x2", "more than 2147483647 ranks");
  assert_ptr_equal(m, UNTOUCHED_MESH);
}

static void mesh_coord_outside_the_shape_is_rejected(void **state) {
  dtl_mesh *m = UNTOUCHED_MESH;
  assert_int_equal(dtl_mesh_create_abstract(2, (int[]){2, 3}, (int[]){1, 3}, &m), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("coord[1]=3 (expected 0..2)");
  assert_int_equal(dtl_mesh_create_abstract(2, (int[]){2, 3}, (int[]){-1, 0}, &m), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("coord[0]=-1 (expected 0..1)");
  assert_int_equal(dtl_mesh_create_abstract(2, (int[]){2, 3}, NULL, NULL), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("out=NULL");
  assert_ptr_equal(m, UNTOUCHED_MESH);
}

static void mesh_create_over_no_communicator_is_rejected(void **state) {
  dtl_mesh *m = UNTOUCHED_MESH;
  assert_int_equal(dtl_mesh_create(NULL, 1, (int[]){1}, &m), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_mesh_create", "comm=NULL");
  assert_ptr_equal(m, UNTOUCHED_MESH);
}

static void abstract_mesh_answers_queries_but_has_no_communicators(void **state) {
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(3, (int[]){2, 3, 4}, (int[]){1, 2, 3}, &m), DTL_OK);
  assert_int_equal(dtl_mesh_is_abstract(m), 1);
  assert_int_equal(dtl_mesh_size(m), 24);
  assert_int_equal(dtl_mesh_dim_size(m, 2), 4);
  assert_int_equal(dtl_mesh_dim_size(m, 3), -1);
  assert_int_equal(dtl_mesh_dim_size(m, -1), -1);
  int c[3];
  dtl_mesh_coord(m, c);
  assert_int_equal(c[0], 1);
  assert_int_equal(c[2], 3);
  assert_null(dtl_mesh_comm(m));
  for (int d = -1; d <= 3; d++) assert_null(dtl_mesh_dim_comm(m, d));
  /* Row-major: rank = (c0 * 3 + c1) * 4 + c2, for every rank. */
  for (int r = 0; r < 24; r++) {
    int rc[3], back = -1;
    assert_int_equal(dtl_mesh_coord_of(m, r, rc), DTL_OK);
    assert_int_equal((rc[0] * 3 + rc[1]) * 4 + rc[2], r);
    assert_int_equal(dtl_mesh_rank_of(m, rc, &back), DTL_OK);
    assert_int_equal(back, r);
  }
  int rank = -5;
  assert_int_equal(dtl_mesh_rank_of(m, (int[]){0, 3, 0}, &rank), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_mesh_rank_of", "coord[1]=3 (expected 0..2)");
  assert_int_equal(rank, -5);
  int cc[3] = {-5, -5, -5};
  assert_int_equal(dtl_mesh_coord_of(m, 24, cc), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_mesh_coord_of", "rank=24 (expected 0..23)");
  assert_int_equal(dtl_mesh_coord_of(m, -1, cc), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("rank=-1");
  assert_int_equal(cc[0], -5);
  assert_int_equal(dtl_mesh_rank_of(m, NULL, &rank), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("coord=NULL");
  assert_int_equal(dtl_mesh_rank_of(m, c, NULL), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("rank=NULL");
  assert_int_equal(dtl_mesh_coord_of(m, 0, NULL), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("coord=NULL");
  dtl_mesh_destroy(m);
}

static void null_mesh_queries_return_sentinels_without_crashing(void **state) {
  assert_int_equal(dtl_mesh_ndim(NULL), -1);
  assert_int_equal(dtl_mesh_dim_size(NULL, 0), -1);
  assert_int_equal(dtl_mesh_size(NULL), -1);
  assert_int_equal(dtl_mesh_is_abstract(NULL), 0);
  assert_null(dtl_mesh_comm(NULL));
  assert_null(dtl_mesh_dim_comm(NULL, 0));
  int c[2] = {7, 7};
  dtl_mesh_coord(NULL, c);
  assert_int_equal(c[0], 7);
  int r = 7;
  assert_int_equal(dtl_mesh_rank_of(NULL, c, &r), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("mesh=NULL");
  assert_int_equal(dtl_mesh_coord_of(NULL, 0, c), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("mesh=NULL");
  dtl_mesh_destroy(NULL);
}

/* --- layouts -------------------------------------------------------------------------------------------- */

static dtl_mesh *mesh_2x2(void) {
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(2, (int[]){2, 2}, (int[]){1, 1}, &m), DTL_OK);
  return m;
}

static void expect_layout_error(dtl_status want, const dtl_mesh *m, dtl_dtype t, int ndim, const int64_t *shape,
                                const dtl_placement *p, const char *const *need) {
  dtl_layout *l = UNTOUCHED_LAYOUT;
  dtl_status st = dtl_layout_create(m, t, ndim, shape, p, &l);
  if (st != want) fail_msg("dtl_layout_create: %s (expected %s): %s", dtl_status_name(st), dtl_status_name(want), dtl_last_error());
  assert_ptr_equal(l, UNTOUCHED_LAYOUT);
  expect_message((const char *const[]){"dtl_layout_create", NULL});
  expect_message(need);
}
#define LAYOUT_ERROR(want, m, t, ndim, shape, p, ...) \
  expect_layout_error((want), (m), (t), (ndim), (shape), (p), (const char *const[]){__VA_ARGS__, NULL})

static const dtl_placement RR[2] = {{DTL_REPLICATE, 0, DTL_SUM}, {DTL_REPLICATE, 0, DTL_SUM}};

static void layout_null_arguments_are_rejected(void **state) {
  dtl_mesh *m = mesh_2x2();
  const int64_t shape[2] = {4, 4};
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, NULL, DTL_FLOAT32, 2, shape, RR, "mesh=NULL");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 2, NULL, RR, "global_shape=NULL");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 2, shape, NULL, "placements=NULL");
  assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 2, shape, RR, NULL), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("out=NULL");
  dtl_layout *l = UNTOUCHED_LAYOUT;
  assert_int_equal(dtl_layout_with_placements(NULL, RR, &l), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_layout_with_placements", "layout=NULL");
  assert_ptr_equal(l, UNTOUCHED_LAYOUT);
  dtl_mesh_destroy(m);
}

static void layout_tensor_ndim_outside_0_to_8_is_rejected(void **state) {
  dtl_mesh *m = mesh_2x2();
  const int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, -1, shape, RR, "ndim=-1 (expected 0..8)");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 9, shape, RR, "ndim=9 (expected 0..8)");
  /* 0-d (a scalar) is legal when nothing shards it; sharding it names the placement. */
  dtl_layout *l;
  assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 0, NULL, RR, &l), DTL_OK);
  assert_int_equal(dtl_layout_global_count(l), 1);
  assert_int_equal(dtl_layout_local_count(l), 1);
  dtl_layout_destroy(l);
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 0, NULL, ((dtl_placement[]){dtl_replicate(), dtl_shard(0)}),
               "placements[1]=S(0)", "0-d tensor");
  dtl_mesh_destroy(m);
}

static void negative_global_dims_are_rejected_and_zero_is_legal(void **state) {
  dtl_mesh *m = mesh_2x2();
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 3, ((int64_t[]){4, -2, 3}), RR, "global_shape[1]=-2 (expected >= 0)");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 1, ((int64_t[]){INT64_MIN}), RR, "global_shape[0]=-9223372036854775808");
  dtl_layout *l;
  assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 2, (int64_t[]){0, 5}, (dtl_placement[]){dtl_shard(0), dtl_shard(1)}, &l),
                   DTL_OK);
  assert_int_equal(dtl_layout_global_count(l), 0);
  assert_int_equal(dtl_layout_local_count(l), 0);
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

static void element_counts_that_overflow_int64_are_rejected(void **state) {
  dtl_mesh *m = mesh_2x2();
  const int64_t big = (int64_t)1 << 32;
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_INT8, 2, ((int64_t[]){big, big}), RR, "overflows int64", "dim 1",
               "size 4294967296");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_INT8, 3, ((int64_t[]){3, INT64_MAX / 2, 1}), RR, "overflows int64",
               "dim 1");
  /* A zero dim after huge ones makes the count 0, which fits; the check is on the running product. */
  dtl_layout *l;
  assert_int_equal(dtl_layout_create(m, DTL_INT8, 2, (int64_t[]){INT64_MAX, 0}, RR, &l), DTL_OK);
  assert_int_equal(dtl_layout_global_count(l), 0);
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

static void byte_sizes_that_overflow_size_t_are_rejected(void **state) {
  dtl_mesh *m = mesh_2x2();
  const int64_t n = (int64_t)1 << 62; /* fits int64; 2^62 f64 elements are 2^65 bytes */
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT64, 1, &n, RR, "4611686018427387904 elements of f64",
               "overflows size_t bytes");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_INT32, 1, &n, RR, "elements of i32", "overflows size_t bytes");
  dtl_layout *l;
  assert_int_equal(dtl_layout_create(m, DTL_INT8, 1, &n, RR, &l), DTL_OK); /* 2^62 bytes fit */
  assert_int_equal(dtl_layout_global_count(l), (size_t)n);
  dtl_layout_destroy(l);
  assert_int_equal(dtl_layout_create(m, DTL_FLOAT64, 1, (int64_t[]){(int64_t)1 << 60}, RR, &l), DTL_OK);
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

static void shard_dims_out_of_range_are_rejected_naming_the_range(void **state) {
  dtl_mesh *m = mesh_2x2();
  const int64_t shape[2] = {4, 4};
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 2, shape, ((dtl_placement[]){dtl_shard(2), dtl_replicate()}),
               "placements[0]=S(2) is out of range for a 2-d tensor (expected -2..1)");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 2, shape, ((dtl_placement[]){dtl_replicate(), dtl_shard(-3)}),
               "placements[1]=S(-3)", "expected -2..1");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 2, shape,
               ((dtl_placement[]){dtl_replicate(), dtl_shard(-2147483647 - 1)}), "placements[1]=S(-2147483648)");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 2, shape, ((dtl_placement[]){dtl_shard(2147483647), dtl_replicate()}),
               "placements[0]=S(2147483647)");
  /* Every in-range dim, positive and negative, is accepted. */
  for (int d = -2; d <= 1; d++) {
    dtl_layout *l;
    assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 2, shape, (dtl_placement[]){dtl_shard(d), dtl_replicate()}, &l), DTL_OK);
    dtl_layout_destroy(l);
  }
  dtl_mesh_destroy(m);
}

static void partial_avg_of_an_integer_dtype_is_unsupported(void **state) {
  dtl_mesh *m = mesh_2x2();
  const int64_t shape[1] = {4};
  const dtl_placement pa[2] = {dtl_replicate(), dtl_partial(DTL_AVG)};
  for (int t = 0; t < DTL_NUM_DTYPES; t++) {
    bool is_int = t == DTL_INT8 || t == DTL_UINT8 || t == DTL_INT32 || t == DTL_INT64;
    if (is_int) {
      char want[64];
      snprintf(want, sizeof want, "placements[1]=P(avg) cannot hold dtype %s", dtl_dtype_name((dtl_dtype)t));
      LAYOUT_ERROR(DTL_ERR_UNSUPPORTED, m, (dtl_dtype)t, 1, shape, pa, want);
    } else if (t != DTL_FLOAT8_E4M3 && t != DTL_FLOAT8_E5M2) { /* (their rule: the next case) */
      dtl_layout *l;
      assert_int_equal(dtl_layout_create(m, (dtl_dtype)t, 1, shape, pa, &l), DTL_OK);
      dtl_layout_destroy(l);
    }
    /* Every other op suits every dtype but the 8-bit floats (the next case). */
    for (int op = 0; op < DTL_NUM_REDUCE_OPS; op++) {
      if (op == DTL_AVG || ((t == DTL_FLOAT8_E4M3 || t == DTL_FLOAT8_E5M2) && op != DTL_MAX && op != DTL_MIN)) continue;
      dtl_layout *l;
      assert_int_equal(dtl_layout_create(m, (dtl_dtype)t, 1, shape, (dtl_placement[]){dtl_partial((dtl_reduce_op)op), dtl_replicate()}, &l),
                       DTL_OK);
      dtl_layout_destroy(l);
    }
  }
  dtl_mesh_destroy(m);
}

/* The 8-bit floats hold only the pending reductions that are exact, max and min (types.h): P(sum), P(prod) and
 * P(avg) would round at every step, and say so. */
static void partial_of_an_8_bit_float_other_than_max_or_min_is_unsupported(void **state) {
  dtl_mesh *m = mesh_2x2();
  const int64_t shape[1] = {4};
  static const dtl_dtype fp8[] = {DTL_FLOAT8_E4M3, DTL_FLOAT8_E5M2};
  static const dtl_reduce_op refused[] = {DTL_SUM, DTL_PROD, DTL_AVG};
  for (int f = 0; f < 2; f++) {
    for (int k = 0; k < 3; k++) {
      const char *tn = dtl_dtype_name(fp8[f]), *on = dtl_reduce_op_name(refused[k]);
      char at[64], why[128];
      snprintf(at, sizeof at, "placements[0]=P(%s) cannot hold dtype %s", on, tn);
      snprintf(why, sizeof why, "%s %s would round at every step; reduce in f32 or bf16 and convert", tn, on);
      LAYOUT_ERROR(DTL_ERR_UNSUPPORTED, m, fp8[f], 1, shape, ((dtl_placement[]){dtl_partial(refused[k]), dtl_replicate()}),
                   at, why);
    }
    for (int op = DTL_MAX; op <= DTL_MIN; op++) {
      dtl_layout *l;
      assert_int_equal(dtl_layout_create(m, fp8[f], 1, shape, (dtl_placement[]){dtl_replicate(), dtl_partial((dtl_reduce_op)op)}, &l),
                       DTL_OK);
      dtl_layout_destroy(l);
    }
    /* dtl_layout_with_placements takes the same rule, through dtl_layout_create */
    dtl_layout *l, *out = UNTOUCHED_LAYOUT;
    assert_int_equal(dtl_layout_create(m, fp8[f], 1, shape, RR, &l), DTL_OK);
    assert_int_equal(dtl_layout_with_placements(l, (dtl_placement[]){dtl_replicate(), dtl_partial(DTL_SUM)}, &out),
                     DTL_ERR_UNSUPPORTED);
    assert_ptr_equal(out, UNTOUCHED_LAYOUT);
    expect_message((const char *const[]){"dtl_layout_with_placements", "would round at every step", NULL});
    dtl_layout_destroy(l);
  }
  dtl_mesh_destroy(m);
}

static void invalid_enum_values_are_rejected(void **state) {
  dtl_mesh *m = mesh_2x2();
  const int64_t shape[1] = {4};
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, (dtl_dtype)DTL_NUM_DTYPES, 1, shape, RR, "dtype=10 (expected 0..9)");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, (dtl_dtype)-1, 1, shape, RR, "dtype=-1");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 1, shape,
               ((dtl_placement[]){dtl_replicate(), {(dtl_placement_kind)3, 0, DTL_SUM}}), "placements[1].kind=3");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 1, shape,
               ((dtl_placement[]){{(dtl_placement_kind)-1, 0, DTL_SUM}, dtl_replicate()}), "placements[0].kind=-1");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 1, shape,
               ((dtl_placement[]){dtl_replicate(), {DTL_PARTIAL, 0, (dtl_reduce_op)5}}), "placements[1]=P(op=5)");
  LAYOUT_ERROR(DTL_ERR_INVALID_ARGUMENT, m, DTL_FLOAT32, 1, shape,
               ((dtl_placement[]){{DTL_PARTIAL, 0, (dtl_reduce_op)-2}, dtl_replicate()}), "placements[0]=P(op=-2)");
  /* The op of a non-Partial placement and the dim of a non-Shard one are ignored (and normalised away). */
  dtl_layout *l;
  assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 1, shape,
                                     (dtl_placement[]){{DTL_REPLICATE, 99, (dtl_reduce_op)42}, {DTL_SHARD, 0, (dtl_reduce_op)42}}, &l),
                   DTL_OK);
  dtl_placement norm[2];
  dtl_layout_placements(l, norm);
  assert_int_equal(norm[0].dim, 0);
  assert_int_equal(norm[0].op, DTL_SUM);
  assert_int_equal(norm[1].op, DTL_SUM);
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

static void local_box_rejects_bad_arguments_and_writes_nothing(void **state) {
  dtl_mesh *m = mesh_2x2();
  dtl_layout *l;
  assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 2, (int64_t[]){4, 6}, (dtl_placement[]){dtl_shard(0), dtl_shard(1)}, &l),
                   DTL_OK);
  int64_t s[2] = {-7, -7}, o[2] = {-7, -7};
  assert_int_equal(dtl_layout_local_box(NULL, NULL, s, o), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_layout_local_box", "layout=NULL");
  /* Both outputs are optional: with neither, the call only checks its arguments. */
  assert_int_equal(dtl_layout_local_box(l, NULL, NULL, NULL), DTL_OK);
  assert_int_equal(dtl_layout_local_box(l, (int[]){1, 1}, NULL, NULL), DTL_OK);
  assert_int_equal(dtl_layout_local_box(l, (int[]){2, 0}, NULL, NULL), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("coord[0]=2 (expected 0..1)");
  assert_int_equal(dtl_layout_local_box(l, (int[]){0, 2}, s, o), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("coord[1]=2 (expected 0..1)");
  assert_int_equal(dtl_layout_local_box(l, (int[]){-1, 0}, s, o), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("coord[0]=-1 (expected 0..1)");
  for (int i = 0; i < 2; i++) {
    assert_int_equal(s[i], -7);
    assert_int_equal(o[i], -7);
  }
  /* Either output alone may be asked for. */
  assert_int_equal(dtl_layout_local_box(l, NULL, s, NULL), DTL_OK);
  assert_int_equal(o[0], -7);
  assert_int_equal(dtl_layout_local_box(l, (int[]){1, 0}, NULL, o), DTL_OK);
  assert_int_equal(o[0], 2);
  assert_int_equal(o[1], 0);
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

static void null_layout_queries_return_sentinels_without_crashing(void **state) {
  assert_int_equal(dtl_layout_local_count(NULL), 0);
  assert_int_equal(dtl_layout_global_count(NULL), 0);
  assert_null(dtl_layout_mesh(NULL));
  assert_int_equal(dtl_layout_ndim(NULL), -1);
  int64_t s[2] = {7, 7};
  dtl_layout_global_shape(NULL, s);
  assert_int_equal(s[0], 7);
  dtl_placement p[2] = {dtl_shard(5), dtl_shard(5)};
  dtl_layout_placements(NULL, p);
  assert_int_equal(p[0].dim, 5);
  dtl_layout_destroy(NULL);
  char buf[8] = "same";
  assert_int_equal(dtl_layout_format(NULL, buf, sizeof buf), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_layout_format", "layout=NULL");
  assert_string_equal(buf, "same");
}

static void layout_format_names_dtype_shape_mesh_and_placements(void **state) {
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(2, (int[]){2, 4}, NULL, &m), DTL_OK);
  dtl_layout *l;
  assert_int_equal(dtl_layout_create(m, DTL_BFLOAT16, 2, (int64_t[]){8, 6}, (dtl_placement[]){dtl_shard(-2), dtl_partial(DTL_MAX)}, &l),
                   DTL_OK);
  const char *want = "bf16[8,6] mesh=2x4 placements=S(0),P(max)";
  char buf[64];
  assert_int_equal(dtl_layout_format(l, buf, sizeof buf), DTL_OK);
  assert_string_equal(buf, want);
  memset(buf, '#', sizeof buf);
  assert_int_equal(dtl_layout_format(l, buf, strlen(want)), DTL_ERR_INVALID_ARGUMENT);
  char need[48];
  snprintf(need, sizeof need, "(%zu bytes needed)", strlen(want) + 1);
  EXPECT_MESSAGE("dtl_layout_format", need);
  assert_int_equal(buf[0], '#');
  assert_int_equal(dtl_layout_format(l, NULL, 64), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("buf=NULL");
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mesh_ndim_outside_1_to_4_is_rejected),
      cmocka_unit_test(mesh_shape_entries_below_one_are_rejected),
      cmocka_unit_test(mesh_with_more_ranks_than_an_int_is_rejected_naming_the_shape),
      cmocka_unit_test(mesh_coord_outside_the_shape_is_rejected),
      cmocka_unit_test(mesh_create_over_no_communicator_is_rejected),
      cmocka_unit_test(abstract_mesh_answers_queries_but_has_no_communicators),
      cmocka_unit_test(null_mesh_queries_return_sentinels_without_crashing),
      cmocka_unit_test(layout_null_arguments_are_rejected),
      cmocka_unit_test(layout_tensor_ndim_outside_0_to_8_is_rejected),
      cmocka_unit_test(negative_global_dims_are_rejected_and_zero_is_legal),
      cmocka_unit_test(element_counts_that_overflow_int64_are_rejected),
      cmocka_unit_test(byte_sizes_that_overflow_size_t_are_rejected),
      cmocka_unit_test(shard_dims_out_of_range_are_rejected_naming_the_range),
      cmocka_unit_test(partial_avg_of_an_integer_dtype_is_unsupported),
      cmocka_unit_test(partial_of_an_8_bit_float_other_than_max_or_min_is_unsupported),
      cmocka_unit_test(invalid_enum_values_are_rejected),
      cmocka_unit_test(local_box_rejects_bad_arguments_and_writes_nothing),
      cmocka_unit_test(null_layout_queries_return_sentinels_without_crashing),
      cmocka_unit_test(layout_format_names_dtype_shape_mesh_and_placements),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

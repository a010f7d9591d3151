/* SPDX-License-Identifier: Apache-2.0 */
/* The MPI transport's algorithm table (src/comm/mpi_algo_table.c): the built-in rows parse and choose a
 * rank-order algorithm for every exact call; a call takes the row with the largest from_bytes that covers it
 * (the later one among equals); DTL_ALGO overrides the table, nonblocking starts and large calls adjust the
 * choice as documented; the rendered table parses back to the same; every malformed field is named. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "comm/mpi_algo.h"

static const dtl__class ANY = DTL__CLASS_ANY, EXACT = DTL__CLASS_EXACT;

static dtl__algo pick(const dtl__algo_table *t, dtl__coll k, dtl__class cls, int p, size_t bytes) {
  return dtl__algo_pick(t, k, cls, p, bytes, false, false);
}

static void builtin_table_never_runs_mpi_for_an_exact_call(void **state) {
  (void)state;
  dtl__algo_table t;
  dtl__algo_table_default(&t);
  assert_true(t.nrows > 0);
  const dtl__coll reducing[] = {DTL__COLL_ALL_REDUCE, DTL__COLL_REDUCE_SCATTER, DTL__COLL_REDUCE};
  for (int k = 0; k < 3; k++)
    for (int p = 3; p <= 64; p *= 2)
      for (size_t b = 0; b <= ((size_t)1 << 32); b = b ? b * 4 : 1) {
        assert_int_not_equal(pick(&t, reducing[k], EXACT, p, b), DTL__ALGO_MPI);
        assert_int_not_equal(dtl__algo_pick(&t, reducing[k], EXACT, p, b, true, false), DTL__ALGO_MPI);
      }
}

static void class_is_exact_only_for_floating_sum_prod_avg_over_three_or_more_ranks(void **state) {
  (void)state;
  assert_int_equal(dtl__algo_class(true, DTL_FLOAT32, DTL_SUM, 3), EXACT);
  assert_int_equal(dtl__algo_class(true, DTL_BFLOAT16, DTL_AVG, 8), EXACT);
  assert_int_equal(dtl__algo_class(true, DTL_FLOAT64, DTL_PROD, 5), EXACT);
  assert_int_equal(dtl__algo_class(true, DTL_FLOAT32, DTL_SUM, 2), ANY); /* a + b == b + a */
  assert_int_equal(dtl__algo_class(true, DTL_FLOAT32, DTL_MAX, 8), ANY);
  assert_int_equal(dtl__algo_class(true, DTL_INT32, DTL_SUM, 8), ANY);
  assert_int_equal(dtl__algo_class(false, DTL_FLOAT32, DTL_SUM, 8), ANY);
}

static void largest_from_bytes_wins_and_the_later_row_among_equals(void **state) {
  (void)state;
  dtl__algo_table t;
  dtl__algo_table_default(&t);
  assert_int_equal(dtl__algo_table_parse(&t,
                                         "all_reduce any * 0 mpi\n"
                                         "all_reduce any 4 1M rs_ag   # four ranks from 1 MiB\n"
                                         "all_reduce any 2-3 64K ag_fold\n"
                                         "all_reduce any 2-3 64K rs_ag\n"
                                         "all_gather * 5-* 0 ring\n",
                                         "test", "text"),
                   DTL_OK);
  assert_int_equal(t.nrows, 5);
  assert_int_equal(pick(&t, DTL__COLL_ALL_REDUCE, ANY, 4, (1u << 20) - 1), DTL__ALGO_MPI);
  assert_int_equal(pick(&t, DTL__COLL_ALL_REDUCE, ANY, 4, 1u << 20), DTL__ALGO_RS_AG);
  assert_int_equal(pick(&t, DTL__COLL_ALL_REDUCE, ANY, 5, 1u << 30), DTL__ALGO_MPI);
  assert_int_equal(pick(&t, DTL__COLL_ALL_REDUCE, ANY, 3, 65536), DTL__ALGO_RS_AG); /* the later of two equal rows */
  assert_int_equal(pick(&t, DTL__COLL_ALL_GATHER, ANY, 4, 100), DTL__ALGO_MPI);     /* no row: mpi */
  assert_int_equal(pick(&t, DTL__COLL_ALL_GATHER, ANY, 5, 100), DTL__ALGO_RING);
  /* no exact row: the collective's rank-order algorithm */
  assert_int_equal(pick(&t, DTL__COLL_ALL_REDUCE, EXACT, 4, 100), DTL__ALGO_RS_AG);
  assert_int_equal(pick(&t, DTL__COLL_REDUCE_SCATTER, EXACT, 4, 100), DTL__ALGO_A2A_FOLD);
  assert_int_equal(pick(&t, DTL__COLL_REDUCE, EXACT, 4, 100), DTL__ALGO_CHAIN);
}

static void forced_algorithms_override_and_starts_and_large_calls_adjust(void **state) {
  (void)state;
  dtl__algo_table t;
  dtl__algo_table_default(&t);
  assert_int_equal(dtl__algo_force_parse(&t, "all_reduce:mpi,all_gather:ring,reduce_scatter:auto", "test"), DTL_OK);
  assert_int_equal(pick(&t, DTL__COLL_ALL_REDUCE, EXACT, 8, 1 << 20), DTL__ALGO_MPI); /* forced: the promise given up */
  assert_int_equal(pick(&t, DTL__COLL_ALL_GATHER, ANY, 8, 1), DTL__ALGO_RING);
  assert_int_equal(dtl__algo_pick(&t, DTL__COLL_ALL_GATHER, ANY, 8, 1, true, false), DTL__ALGO_MPI); /* ring: 2+ steps */
  assert_int_equal(dtl__algo_pick(&t, DTL__COLL_ALL_REDUCE, ANY, 8, 1, false, true), DTL__ALGO_MPI); /* in pieces */
  dtl__algo_table u;
  dtl__algo_table_default(&u);
  assert_int_equal(dtl__algo_force_parse(&u, "all_reduce:rs_ag,reduce:rs_gather,all_to_all:mpi,all_to_allv:mpi", "t"),
                   DTL_OK);
  assert_int_equal(dtl__algo_pick(&u, DTL__COLL_ALL_REDUCE, EXACT, 4, 1, true, false), DTL__ALGO_AG_FOLD);
  assert_int_equal(dtl__algo_pick(&u, DTL__COLL_ALL_REDUCE, ANY, 4, 1, true, false), DTL__ALGO_MPI);
  assert_int_equal(dtl__algo_pick(&u, DTL__COLL_ALL_TO_ALL, ANY, 4, 1, false, true), DTL__ALGO_DIRECT);
  assert_int_equal(dtl__algo_pick(&u, DTL__COLL_ALL_TO_ALLV, ANY, 4, 0, false, true), DTL__ALGO_MPI);
  assert_int_not_equal(t.fp, u.fp);
}

static void rendered_table_parses_back_to_the_same(void **state) {
  (void)state;
  dtl__algo_table t, u;
  dtl__algo_table_default(&t);
  assert_int_equal(dtl__algo_table_parse(&t, "reduce exact 3-7 3G rs_gather\nall_to_all any 2 1536 direct\n", "t", "x"),
                   DTL_OK);
  size_t n = dtl__algo_table_render(&t, NULL, 0);
  char *buf = malloc(n + 1);
  assert_int_equal(dtl__algo_table_render(&t, buf, n + 1), n);
  assert_int_equal(strlen(buf), n);
  assert_non_null(strstr(buf, "3G"));
  assert_non_null(strstr(buf, "3-7"));
  dtl__algo_table_default(&u);
  assert_int_equal(dtl__algo_table_parse(&u, buf, "t", "rendered"), DTL_OK);
  assert_int_equal(u.fp, t.fp);
  char small[8];
  assert_int_equal(dtl__algo_table_render(&t, small, sizeof small), n); /* truncated, NUL-terminated */
  assert_int_equal(strlen(small), sizeof small - 1);
  free(buf);
}

static void expect_bad(const char *text, const char *needle) {
  dtl__algo_table t;
  dtl__algo_table_default(&t);
  uint64_t fp = t.fp;
  assert_int_equal(dtl__algo_table_parse(&t, text, "test", "text"), DTL_ERR_INVALID_ARGUMENT);
  if (!strstr(dtl_last_error(), needle)) fail_msg("message '%s' lacks '%s'", dtl_last_error(), needle);
  assert_int_equal(t.fp, fp); /* a failed parse leaves the table */
}

static void every_malformed_field_is_named_with_its_line(void **state) {
  (void)state;
  expect_bad("all_reduce any * 0\n", "line 1: 4 fields");
  expect_bad("\n# c\nall_reduce any * 0 mpi extra\n", "line 3: 6 fields");
  expect_bad("bcast any * 0 mpi", "collective \"bcast\"");
  expect_bad("all_reduce some * 0 mpi", "class \"some\"");
  expect_bad("all_gather exact * 0 mpi", "class exact for all_gather, which does not reduce");
  expect_bad("all_reduce any 0 0 mpi", "ranks \"0\"");
  expect_bad("all_reduce any 4-2 0 mpi", "ranks \"4-2\"");
  expect_bad("all_reduce any 2- 0 mpi", "ranks \"2-\"");
  expect_bad("all_reduce any * 12Q mpi", "from_bytes \"12Q\"");
  expect_bad("all_reduce any * 99999999999999999999 mpi", "from_bytes");
  expect_bad("all_to_allv any * 1K direct", "from_bytes 1K for all_to_allv");
  expect_bad("all_gather any * 0 a2a_fold", "algorithm \"a2a_fold\" for all_gather (expected mpi, direct, ring)");
  expect_bad("reduce_scatter * * 0 mpi", "mpi for class * of reduce_scatter");
}

static void expect_bad_force(const char *text, const char *needle) {
  dtl__algo_table t;
  dtl__algo_table_default(&t);
  assert_int_equal(dtl__algo_force_parse(&t, text, "test"), DTL_ERR_INVALID_ARGUMENT);
  if (!strstr(dtl_last_error(), needle)) fail_msg("message '%s' lacks '%s'", dtl_last_error(), needle);
  for (int k = 0; k < DTL__NCOLLS; k++) assert_int_equal(t.forced[k], -1);
}

static void every_malformed_dtl_algo_entry_is_named(void **state) {
  (void)state;
  expect_bad_force("all_reduce", "entry 1 \"all_reduce\": expected collective:algorithm");
  expect_bad_force("all_reduce:mpi,,", "entry 2 \"\": expected collective:algorithm");
  expect_bad_force("all_gather:ring,alltoall:mpi", "entry 2 \"alltoall:mpi\": unknown collective \"alltoall\"");
  expect_bad_force("all_to_all:ring", "unknown algorithm \"ring\" for all_to_all (expected auto, mpi, direct)");
  expect_bad_force("reduce:mpi,reduce:auto", "reduce is given twice");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(builtin_table_never_runs_mpi_for_an_exact_call),
      cmocka_unit_test(class_is_exact_only_for_floating_sum_prod_avg_over_three_or_more_ranks),
      cmocka_unit_test(largest_from_bytes_wins_and_the_later_row_among_equals),
      cmocka_unit_test(forced_algorithms_override_and_starts_and_large_calls_adjust),
      cmocka_unit_test(rendered_table_parses_back_to_the_same),
      cmocka_unit_test(every_malformed_field_is_named_with_its_line),
      cmocka_unit_test(every_malformed_dtl_algo_entry_is_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

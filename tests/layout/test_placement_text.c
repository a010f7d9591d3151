/* SPDX-License-Identifier: Apache-2.0 */
/* The text form of placement lists: every spelling parses to the same placements, format and parse are
 * inverse over every list of up to four entries, and each malformed text fails with a message that
 * names the text and the entry, leaving out and count untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "layout/layout_internal.h"

#define SENTINEL_COUNT 12345

static bool same_placement(dtl_placement a, dtl_placement b) {
  if (a.kind != b.kind) return false;
  if (a.kind == DTL_SHARD) return a.dim == b.dim;
  if (a.kind == DTL_PARTIAL) return a.op == b.op;
  return true;
}

static void expect_parse(const char *text, int n, const dtl_placement *want) {
  dtl_placement out[DTL_MAX_MESH_DIMS + 2];
  int count = -1;
  dtl_status st = dtl_placements_parse(text, out, DTL_MAX_MESH_DIMS + 2, &count);
  if (st != DTL_OK) fail_msg("parse \"%s\": %s", text, dtl_last_error());
  assert_int_equal(count, n);
  for (int i = 0; i < n; i++)
    if (!same_placement(out[i], want[i])) fail_msg("parse \"%s\": entry %d differs", text, i + 1);
}

/* Fails with DTL_ERR_INVALID_ARGUMENT, writes nothing, and the message holds every string in need. */
static void expect_reject(const char *text, int max, const char *const *need) {
  dtl_placement out[8];
  memset(out, 0xab, sizeof out);
  dtl_placement before[8];
  memcpy(before, out, sizeof out);
  int count = SENTINEL_COUNT;
  dtl_status st = dtl_placements_parse(text, out, max, &count);
  if (st != DTL_ERR_INVALID_ARGUMENT) fail_msg("parse \"%s\": %s, expected DTL_ERR_INVALID_ARGUMENT", text, dtl_status_name(st));
  assert_int_equal(count, SENTINEL_COUNT);
  assert_memory_equal(out, before, sizeof out);
  const char *msg = dtl_last_error();
  assert_non_null(strstr(msg, "dtl_placements_parse"));
  for (; *need; need++)
    if (!strstr(msg, *need)) fail_msg("parse \"%s\": message \"%s\" lacks \"%s\"", text, msg, *need);
}

#define REJECT(text, max, ...) expect_reject((text), (max), (const char *const[]){__VA_ARGS__, NULL})

static void every_spelling_of_an_entry_parses(void **state) {
  expect_parse("S(0)", 1, (dtl_placement[]){dtl_shard(0)});
  expect_parse("S0", 1, (dtl_placement[]){dtl_shard(0)});
  expect_parse("S(-1)", 1, (dtl_placement[]){dtl_shard(-1)});
  expect_parse("S-1", 1, (dtl_placement[]){dtl_shard(-1)});
  expect_parse("S12", 1, (dtl_placement[]){dtl_shard(12)});
  expect_parse("R", 1, (dtl_placement[]){dtl_replicate()});
  expect_parse("P", 1, (dtl_placement[]){dtl_partial(DTL_SUM)});
  expect_parse("P(sum)", 1, (dtl_placement[]){dtl_partial(DTL_SUM)});
  expect_parse("P(avg)", 1, (dtl_placement[]){dtl_partial(DTL_AVG)});
  expect_parse("P(max)", 1, (dtl_placement[]){dtl_partial(DTL_MAX)});
  expect_parse("P(min)", 1, (dtl_placement[]){dtl_partial(DTL_MIN)});
  expect_parse("P(prod)", 1, (dtl_placement[]){dtl_partial(DTL_PROD)});
  expect_parse("S(2147483647)", 1, (dtl_placement[]){dtl_shard(2147483647)});
  expect_parse("S(-2147483648)", 1, (dtl_placement[]){dtl_shard(-2147483647 - 1)});
}

static void lists_are_comma_separated_with_blanks_around_entries(void **state) {
  const dtl_placement want[] = {dtl_shard(0), dtl_replicate(), dtl_partial(DTL_MAX), dtl_shard(-2)};
  expect_parse("S(0),R,P(max),S(-2)", 4, want);
  expect_parse("S0,R,P(max),S-2", 4, want);
  expect_parse("  S0 ,\tR,P(max) ,  S(-2)\n", 4, want);
  expect_parse("S0, S1", 2, (dtl_placement[]){dtl_shard(0), dtl_shard(1)});
  expect_parse("R,P", 2, (dtl_placement[]){dtl_replicate(), dtl_partial(DTL_SUM)});
}

/* format -> parse is the identity on every list of 1..4 entries over R, S(-3..3) and P(every op). */
static void format_then_parse_round_trips_every_list_up_to_four_entries(void **state) {
  dtl_placement alphabet[13];
  int na = 0;
  alphabet[na++] = dtl_replicate();
  for (int d = -3; d <= 3; d++) alphabet[na++] = dtl_shard(d);
  for (int op = 0; op < DTL_NUM_REDUCE_OPS; op++) alphabet[na++] = dtl_partial((dtl_reduce_op)op);
  long checked = 0;
  for (int n = 1; n <= 4; n++) {
    int total = 1;
    for (int i = 0; i < n; i++) total *= na;
    for (int v = 0; v < total; v++) {
      dtl_placement p[4], q[4];
      for (int i = 0, rest = v; i < n; i++, rest /= na) p[i] = alphabet[rest % na];
      char buf[128];
      assert_int_equal(dtl_placements_format(p, n, buf, sizeof buf), DTL_OK);
      int count = 0;
      if (dtl_placements_parse(buf, q, 4, &count) != DTL_OK) fail_msg("\"%s\": %s", buf, dtl_last_error());
      assert_int_equal(count, n);
      for (int i = 0; i < n; i++)
        if (!same_placement(p[i], q[i])) fail_msg("\"%s\": entry %d changed in the round trip", buf, i + 1);
      checked++;
    }
  }
  assert_int_equal(checked, 13 + 13 * 13 + 13 * 13 * 13 + 13 * 13 * 13 * 13);
}

static void format_writes_canonical_forms(void **state) {
  char buf[64];
  assert_int_equal(dtl_placements_format((dtl_placement[]){dtl_shard(0), dtl_replicate(), dtl_partial(DTL_SUM)}, 3, buf,
                                         sizeof buf),
                   DTL_OK);
  assert_string_equal(buf, "S(0),R,P(sum)");
  assert_int_equal(dtl_placements_format((dtl_placement[]){dtl_shard(-1), dtl_partial(DTL_AVG)}, 2, buf, sizeof buf), DTL_OK);
  assert_string_equal(buf, "S(-1),P(avg)");
  assert_int_equal(dtl_placements_format(NULL, 0, buf, sizeof buf), DTL_OK);
  assert_string_equal(buf, "");
}

static void format_into_a_small_buffer_names_the_size_needed_and_writes_nothing(void **state) {
  const dtl_placement p[] = {dtl_shard(0), dtl_replicate(), dtl_partial(DTL_SUM)};
  const size_t need = strlen("S(0),R,P(sum)") + 1;
  char buf[32];
  for (size_t cap = 0; cap < need; cap++) {
    memset(buf, '#', sizeof buf);
    assert_int_equal(dtl_placements_format(p, 3, buf, cap), DTL_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < sizeof buf; i++) assert_int_equal(buf[i], '#');
    char want[64];
    snprintf(want, sizeof want, "%zu bytes needed", need);
    assert_non_null(strstr(dtl_last_error(), want));
    snprintf(want, sizeof want, "cap=%zu", cap);
    assert_non_null(strstr(dtl_last_error(), want));
  }
  memset(buf, '#', sizeof buf);
  assert_int_equal(dtl_placements_format(p, 3, buf, need), DTL_OK);
  assert_string_equal(buf, "S(0),R,P(sum)");
  assert_int_equal(buf[need], '#');
}

static void format_rejects_bad_arguments(void **state) {
  char buf[32] = "untouched";
  assert_int_equal(dtl_placements_format(NULL, 1, buf, sizeof buf), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "placements=NULL"));
  assert_int_equal(dtl_placements_format((dtl_placement[]){dtl_replicate()}, -1, buf, sizeof buf), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "count=-1"));
  assert_int_equal(dtl_placements_format((dtl_placement[]){dtl_replicate()}, 1, NULL, 8), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "buf=NULL"));
  dtl_placement bad_kind = {(dtl_placement_kind)7, 0, DTL_SUM};
  assert_int_equal(dtl_placements_format((dtl_placement[]){dtl_replicate(), bad_kind}, 2, buf, sizeof buf),
                   DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "placements[1].kind=7"));
  dtl_placement bad_op = {DTL_PARTIAL, 0, (dtl_reduce_op)5};
  assert_int_equal(dtl_placements_format(&bad_op, 1, buf, sizeof buf), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "placements[0].op=5"));
  assert_string_equal(buf, "untouched");
}

static void malformed_entries_are_rejected_naming_text_and_entry(void **state) {
  REJECT("S(", 4, "text=\"S(\"", "entry 1 \"S(\"", "offset 0");
  REJECT("X", 4, "text=\"X\"", "entry 1 \"X\"");
  REJECT("S()", 4, "entry 1 \"S()\"");
  REJECT("S", 4, "entry 1 \"S\"");
  REJECT("P(foo)", 4, "entry 1 \"P(foo)\"", "P(sum), P(prod), P(max), P(min) or P(avg)");
  REJECT("P()", 4, "entry 1 \"P()\"");
  REJECT("P(sum", 4, "entry 1 \"P(sum\"");
  REJECT("P(SUM)", 4, "entry 1 \"P(SUM)\"");
  REJECT("Psum", 4, "entry 1 \"Psum\"");
  REJECT("S(0", 4, "entry 1 \"S(0\"");
  REJECT("S0)", 4, "entry 1 \"S0)\"");
  REJECT("S(a)", 4, "entry 1 \"S(a)\"");
  REJECT("S(1.5)", 4, "entry 1 \"S(1.5)\"");
  REJECT("S(--1)", 4, "entry 1 \"S(--1)\"");
  REJECT("S(+1)", 4, "entry 1 \"S(+1)\"");
  REJECT("S(- 1)", 4, "entry 1 \"S(- 1)\"");
  REJECT("S (0)", 4, "entry 1 \"S (0)\"");
  REJECT("S(0)x", 4, "entry 1 \"S(0)x\"");
  REJECT("RR", 4, "entry 1 \"RR\"");
  REJECT("r", 4, "entry 1 \"r\"");
  REJECT("s0", 4, "entry 1 \"s0\"");
  REJECT("R()", 4, "entry 1 \"R()\"");
  REJECT("R S0", 4, "entry 1 \"R S0\"");
  REJECT("S(2147483648)", 4, "entry 1 \"S(2147483648)\"", "does not fit an int");
  REJECT("S(-2147483649)", 4, "does not fit an int");
  REJECT("S99999999999999999999999", 4, "does not fit an int");
  REJECT("R,S(0),Q", 4, "entry 3 \"Q\"", "offset 7");
}

static void empty_entries_and_stray_commas_are_rejected(void **state) {
  REJECT("", 4, "text=\"\"", "entry 1", "is empty");
  REJECT("   ", 4, "entry 1", "is empty");
  REJECT(",", 4, "entry 1", "is empty");
  REJECT("R,", 4, "text=\"R,\"", "entry 2", "is empty");
  REJECT(",R", 4, "entry 1", "is empty");
  REJECT("R,,S0", 4, "entry 2", "is empty");
  REJECT("R, ,S0", 4, "entry 2", "is empty");
  REJECT("S0,R,", 4, "entry 3", "is empty");
}

static void more_entries_than_max_are_rejected_and_nothing_is_written(void **state) {
  REJECT("R,R,R", 2, "text=\"R,R,R\"", "has 3 entries", "max=2");
  REJECT("S0,S1,S2,S3,S4", 4, "has 5 entries", "max=4");
  /* A malformed entry beyond max is reported as malformed (the whole text is read first). */
  REJECT("R,R,X", 2, "entry 3 \"X\"");
  /* Exactly max entries is fine. */
  expect_parse("R,R,R,R", 4, (dtl_placement[]){dtl_replicate(), dtl_replicate(), dtl_replicate(), dtl_replicate()});
}

static void long_texts_are_quoted_shortened_in_messages(void **state) {
  char text[400];
  int o = 0;
  for (int i = 0; i < 60; i++) o += snprintf(text + o, sizeof text - (size_t)o, "R,");
  snprintf(text + o, sizeof text - (size_t)o, "Z");
  REJECT(text, 100, "entry 61 \"Z\"", "...");
  assert_true(strlen(dtl_last_error()) < 400);
}

static void parse_rejects_null_arguments_and_bad_max(void **state) {
  dtl_placement out[4];
  int count = SENTINEL_COUNT;
  assert_int_equal(dtl_placements_parse(NULL, out, 4, &count), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "text=NULL"));
  assert_int_equal(dtl_placements_parse("R", NULL, 4, &count), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "out=NULL"));
  assert_int_equal(dtl_placements_parse("R", out, 4, NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "count=NULL"));
  assert_int_equal(dtl_placements_parse("R", out, 0, &count), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "max=0"));
  assert_int_equal(dtl_placements_parse("R", out, -3, &count), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "max=-3"));
  assert_int_equal(count, SENTINEL_COUNT);
}

/* S(-9) is well-formed text; a layout on a 1..3-d tensor rejects it with the entry and the valid range. */
static void shard_dim_minus_nine_parses_but_no_small_tensor_layout_takes_it(void **state) {
  dtl_placement p[2];
  int count;
  assert_int_equal(dtl_placements_parse("R,S(-9)", p, 2, &count), DTL_OK);
  int ms[2] = {2, 2};
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(2, ms, NULL, &m), DTL_OK);
  const int64_t shape[3] = {4, 4, 4};
  for (int nd = 1; nd <= 3; nd++) {
    dtl_layout *l = (dtl_layout *)0x1;
    assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, nd, shape, p, &l), DTL_ERR_INVALID_ARGUMENT);
    assert_ptr_equal(l, (dtl_layout *)0x1);
    char want[96];
    snprintf(want, sizeof want, "placements[1]=S(-9) is out of range for a %d-d tensor (expected %d..%d)", nd, -nd, nd - 1);
    if (!strstr(dtl_last_error(), want)) fail_msg("message \"%s\" lacks \"%s\"", dtl_last_error(), want);
  }
  dtl_mesh_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_spelling_of_an_entry_parses),
      cmocka_unit_test(lists_are_comma_separated_with_blanks_around_entries),
      cmocka_unit_test(format_then_parse_round_trips_every_list_up_to_four_entries),
      cmocka_unit_test(format_writes_canonical_forms),
      cmocka_unit_test(format_into_a_small_buffer_names_the_size_needed_and_writes_nothing),
      cmocka_unit_test(format_rejects_bad_arguments),
      cmocka_unit_test(malformed_entries_are_rejected_naming_text_and_entry),
      cmocka_unit_test(empty_entries_and_stray_commas_are_rejected),
      cmocka_unit_test(more_entries_than_max_are_rejected_and_nothing_is_written),
      cmocka_unit_test(long_texts_are_quoted_shortened_in_messages),
      cmocka_unit_test(parse_rejects_null_arguments_and_bad_max),
      cmocka_unit_test(shard_dim_minus_nine_parses_but_no_small_tensor_layout_takes_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

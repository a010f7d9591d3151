/* SPDX-License-Identifier: Apache-2.0 */
/* Caller text echoed in messages (src/common/quote.c): the quoting rule itself (which bytes pass, how the
 * rest is escaped, truncation), and every message that echoes caller text, from the library and from the
 * `dtl` tool, fed hostile input: terminal escape sequences, newlines, C1 controls, bidirectional overrides
 * and malformed UTF-8. No message may carry any of them raw. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "common/internal.h"
#include "dtl_tool.h"
#include "text_safe.h"

#define EXPECT_SAFE(text, allow_newline)                                                                        \
  do {                                                                                                          \
    size_t at_;                                                                                                 \
    if (!dt_text_safe((text), (allow_newline), &at_))                                                           \
      fail_msg("unsafe byte 0x%02x at %zu, after \"%.*s\"", (unsigned char)(text)[at_], at_, (int)at_, (text)); \
  } while (0)

/* The last error after a call that must fail: it names the call and carries no raw hostile byte. */
#define EXPECT_FAILS_SAFELY(call, fn)                \
  do {                                               \
    assert_int_not_equal((call), DTL_OK);            \
    assert_non_null(strstr(dtl_last_error(), (fn))); \
    EXPECT_SAFE(dtl_last_error(), false);            \
  } while (0)

/* Hostile texts: a colour escape, a title-setting OSC, newline + fake message, C1 CSI raw and in UTF-8, a
 * right-to-left override, malformed UTF-8 (lone continuation, overlong, surrogate, truncated). */
static const char *const hostile[] = {
    "\x1b[31mred",
    "\x1b]0;owned\x07",
    "S0\nERROR: fake",
    "\x9b"
    "31m",
    "\xc2\x9b"
    "31m",
    "a\xe2\x80\xae"
    "b",
    "\x80",
    "\xc0\xaf",
    "\xed\xa0\x80",
    "\xe2\x82",
    "\x7f\x01\x02\x03\t",
    "S(\x1b[2J)",
    "P(\x1b)",
    "R,\x1b[0m,S1",
};
#define NHOSTILE (sizeof hostile / sizeof *hostile)

/* --- the rule ------------------------------------------------------------------------------------------- */

static void printable_text_and_utf8_pass_unchanged(void **state) {
  char out[DTL__QUOTE_CAP];
  assert_string_equal(dtl__quote("S(0),R,P(sum)", out, sizeof out), "S(0),R,P(sum)");
  assert_string_equal(dtl__quote("gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80", out, sizeof out),
                      "gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80");
  assert_string_equal(dtl__quote("", out, sizeof out), "");
  assert_string_equal(dtl__quote(NULL, out, sizeof out), "(null)");
}

static void control_and_malformed_bytes_are_escaped(void **state) {
  char out[DTL__QUOTE_CAP];
  assert_string_equal(dtl__quote("\x1b[31mred", out, sizeof out), "\\x1b[31mred");
  assert_string_equal(dtl__quote("a\nb\tc\x7f", out, sizeof out), "a\\x0ab\\x09c\\x7f");
  assert_string_equal(dtl__quote("say \"hi\" \\o/ \\x1b", out, sizeof out), "say \"hi\" \\\\o/ \\\\x1b");
  assert_string_equal(dtl__quote("\xc2\x9b"
                                 "1m",
                                 out, sizeof out),
                      "\\xc2\\x9b1m"); /* C1 CSI */
  assert_string_equal(dtl__quote("a\xe2\x80\xae"
                                 "b",
                                 out, sizeof out),
                      "a\\xe2\\x80\\xaeb"); /* RLO */
  assert_string_equal(dtl__quote("\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80", out, sizeof out),
                      "\\xc0\\xaf\\xed\\xa0\\x80\\xf4\\x90\\x80\\x80");       /* overlong, surrogate, > U+10FFFF */
  assert_string_equal(dtl__quote("\xe2\x82", out, sizeof out), "\\xe2\\x82"); /* cut short */
  assert_string_equal(dtl__quote_n("ab\x1b"
                                   "cd",
                                   3, out, sizeof out),
                      "ab\\x1b");
  for (size_t i = 0; i < NHOSTILE; i++) EXPECT_SAFE(dtl__quote(hostile[i], out, sizeof out), false);
}

static void long_text_is_cut_with_an_ellipsis_never_inside_an_escape(void **state) {
  char big[400];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  char out[16];
  assert_string_equal(dtl__quote(big, out, sizeof out), "xxxxxxxxxxxx...");
  assert_string_equal(dtl__quote("xxxxxxxxxxxxxxx", out, sizeof out), "xxxxxxxxxxxxxxx"); /* fits exactly */
  assert_string_equal(dtl__quote("xxxxxxxxxx\x1b\x1b", out, sizeof out), "xxxxxxxxxx...");
  assert_string_equal(dtl__quote("xxxxxxxxx\xe2\x82\xac"
                                 "yyyy",
                                 out, sizeof out),
                      "xxxxxxxxx\xe2\x82\xac...");
  for (size_t cap = 1; cap < 12; cap++) { /* every small buffer stays terminated and in bounds */
    char small[12];
    memset(small, '#', sizeof small);
    dtl__quote("\x1b\x1b\x1b\x1b", small, cap);
    assert_true(strlen(small) < cap);
    assert_int_equal(small[cap], '#');
  }
}

static void messages_cut_to_their_buffer_end_on_a_whole_character(void **state) {
  char s[8];
  strcpy(s, "ab\xe2\x82"); /* the euro sign cut after two of its three bytes */
  dtl__utf8_trim(s);
  assert_string_equal(s, "ab");
  strcpy(s, "ab\xe2\x82\xac");
  dtl__utf8_trim(s);
  assert_string_equal(s, "ab\xe2\x82\xac");
  strcpy(s, "ab\xf0");
  dtl__utf8_trim(s);
  assert_string_equal(s, "ab");
  /* A path of 600 euro signs (1800 bytes) fills the 1 KiB message; its cut must not split a character. */
  for (int shift = 0; shift < 3; shift++) {
    char path[2000] = "/nonexistent/";
    size_t n = strlen(path);
    for (int k = 0; k < shift; k++) path[n++] = 'x';
    for (int k = 0; k < 600; k++, n += 3) memcpy(path + n, "\xe2\x82\xac", 3);
    path[n] = '\0';
    dtl_safetensors *f = NULL;
    EXPECT_FAILS_SAFELY(dtl_safetensors_open(path, &f), "dtl_safetensors_open");
  }
}

/* --- library messages ----------------------------------------------------------------------------------- */

static void parsers_echo_hostile_text_quoted(void **state) {
  for (size_t i = 0; i < NHOSTILE; i++) {
    dtl_placement p[4];
    int n;
    dtl_dtype t;
    EXPECT_FAILS_SAFELY(dtl_placements_parse(hostile[i], p, 4, &n), "dtl_placements_parse");
    EXPECT_FAILS_SAFELY(dtl_dtype_parse(hostile[i], &t), "dtl_dtype_parse");
  }
  dtl_placement p[1];
  int n;
  EXPECT_FAILS_SAFELY(dtl_placements_parse("R,\x1b[31mR", p, 1, &n), "dtl_placements_parse"); /* too many */
  EXPECT_FAILS_SAFELY(dtl_placements_parse("R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,R,"
                                           "R,R,R,R,R,R,R,R,R,R,R,R,R,R\x1b[31m",
                                           p, 1, &n),
                      "dtl_placements_parse");
}

static void plan_tune_is_echoed_quoted(void **state) {
  static const char *const tunes[] = {"alpha=\x1b[2J",
                                      "\x1b]0;x\x07=1",
                                      "alpha=1,alpha=\n2",
                                      "alpha=1,",
                                      ",\x9b",
                                      ("alpha=1e-6,beta=\xe2\x80\xae"
                                       "2")};
  dtl_mesh *m;
  dtl_layout *l;
  assert_int_equal(dtl_mesh_create_abstract(1, (int[]){2}, NULL, &m), DTL_OK);
  assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 1, (int64_t[]){4}, (dtl_placement[]){dtl_shard(0)}, &l), DTL_OK);
  for (size_t i = 0; i < sizeof tunes / sizeof *tunes; i++) {
    setenv("DTL_PLAN_TUNE", tunes[i], 1);
    dtl_plan *p = NULL;
    EXPECT_FAILS_SAFELY(dtl_plan_create(l, l, &p), "DTL_PLAN_TUNE");
  }
  unsetenv("DTL_PLAN_TUNE");
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

/* A safetensors file whose JSON header is text (the 8-byte length is prepended), in a temporary folder. */
static void write_file(const char *path, const char *json) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  uint64_t n = strlen(json);
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));
  assert_int_equal(fwrite(len8, 1, 8, f), 8);
  assert_int_equal(fwrite(json, 1, n, f), n);
  fclose(f);
}

static void checkpoint_names_paths_and_json_are_echoed_quoted(void **state) {
  char dir[] = "/tmp/dtl_quote_XXXXXX", path[256];
  assert_non_null(mkdtemp(dir));
  dtl_safetensors *f = NULL;
  for (size_t i = 0; i < NHOSTILE; i++) {
    snprintf(path, sizeof path, "%s/missing-%s", dir, hostile[i]);
    EXPECT_FAILS_SAFELY(dtl_safetensors_open(path, &f), "dtl_safetensors_open");
    snprintf(path, sizeof path, "%s/no-such-dir/%s", dir, hostile[i]);
    dtl_safetensors_writer *w = NULL;
    EXPECT_FAILS_SAFELY(dtl_safetensors_write_begin(path, &w), "dtl_safetensors_write_begin");
  }
  /* Names decoded from JSON escapes hold raw control bytes; the path itself holds an escape sequence. */
  snprintf(path, sizeof path, "%s/m\x1b[31m.safetensors", dir);
  const char *bad_entries[] = {
      "{\"w\\u001b[31m\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}",
      "{\"w\":{\"dtype\":\"F\\u001b[2J\",\"shape\":[1],\"data_offsets\":[0,4]}}",
      "{\"__metadata__\":{\"k\\u009b1m\":1}}",
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}\x1b[31m}",
      ("{\"a\\n\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"b\\u202e\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}"),
  };
  for (size_t i = 0; i < sizeof bad_entries / sizeof *bad_entries; i++) {
    write_file(path, bad_entries[i]);
    EXPECT_FAILS_SAFELY(dtl_safetensors_open(path, &f), "dtl_safetensors_open");
  }
  write_file(path, "{\"w\\u001b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}");
  assert_int_equal(dtl_safetensors_open(path, &f), DTL_OK);
  dtl_dtype t;
  int nd;
  int64_t shape[8];
  for (size_t i = 0; i < NHOSTILE; i++)
    EXPECT_FAILS_SAFELY(dtl_safetensors_info(f, hostile[i], &t, &nd, shape), "dtl_safetensors_info");
  float x;
  EXPECT_FAILS_SAFELY(dtl_safetensors_read_box(f, "w\x1b", DTL_FLOAT64, 1, (int64_t[]){0}, (int64_t[]){0}, &x),
                      "dtl_safetensors_read_box"); /* the file's own name, echoed with its escape */
  dtl_safetensors_close(f);
  dtl_safetensors_writer *w = NULL;
  snprintf(path, sizeof path, "%s/out.safetensors", dir);
  assert_int_equal(dtl_safetensors_write_begin(path, &w), DTL_OK);
  EXPECT_FAILS_SAFELY(dtl_safetensors_write_add(w, "\xff\x1b[31m", DTL_FLOAT32, 1, (int64_t[]){1}, &x),
                      "dtl_safetensors_write_add");
  EXPECT_FAILS_SAFELY(dtl_safetensors_write_metadata(w, "k", "\xc0\x1b"), "dtl_safetensors_write_metadata");
  EXPECT_FAILS_SAFELY(dtl_safetensors_write_metadata(w, "\xfe\n", "v"), "dtl_safetensors_write_metadata");
  dtl_safetensors_write_cancel(w);
  unlink(path);
  snprintf(path, sizeof path, "%s/m\x1b[31m.safetensors", dir);
  unlink(path);
  rmdir(dir);
}

/* --- the dtl tool --------------------------------------------------------------------------------------- */

/* Runs the tool on argv (NULL-terminated, without the program name); its stderr must be safe, and stdout
 * too (multi-line). */
static int run_tool(const char *const *args) {
  char *argv[32] = {"dtl"};
  int argc = 1;
  for (; args[argc - 1]; argc++) argv[argc] = (char *)args[argc - 1];
  char *o = NULL, *e = NULL;
  size_t on = 0, en = 0;
  FILE *out = open_memstream(&o, &on), *err = open_memstream(&e, &en);
  int rc = dtl_tool_main(argc, argv, out, err);
  fclose(out);
  fclose(err);
  EXPECT_SAFE(o, true);
  EXPECT_SAFE(e, true);
  free(o);
  free(e);
  return rc;
}

static void tool_messages_echo_hostile_arguments_quoted(void **state) {
  for (size_t i = 0; i < NHOSTILE; i++) {
    const char *h = hostile[i];
    assert_int_equal(run_tool((const char *[]){h, NULL}), 2);
    assert_int_equal(run_tool((const char *[]){"plan", "--dtype", h, "--mesh", "2", "--shape", "8", "--from", "S0",
                                               "--to", "R", NULL}),
                     2);
    assert_int_equal(run_tool((const char *[]){"plan", "--mesh", h, "--shape", "8", "--from", "S0", "--to", "R", NULL}),
                     2);
    assert_int_equal(run_tool((const char *[]){"plan", "--mesh", "2", "--shape", h, "--from", "S0", "--to", "R", NULL}),
                     2);
    assert_int_equal(run_tool((const char *[]){"plan", "--mesh", "2", "--shape", "8", "--from", h, "--to", "R", NULL}),
                     2);
    assert_int_equal(run_tool((const char *[]){"plan", "--mesh", "2x2", "--shape", "8", "--from", "S0,R", "--to", "R,R",
                                               "--coord", h, NULL}),
                     2);
    assert_int_equal(run_tool((const char *[]){"plan", "--mesh", "2", "--shape", "8", "--from", "S0", "--to", "R",
                                               "--alpha", h, NULL}),
                     2);
    assert_int_equal(run_tool((const char *[]){"plan", h, NULL}), 2);
    assert_int_equal(run_tool((const char *[]){"show", "--mesh", "2", "--shape", "8", "S0", h, NULL}), 2);
    assert_int_equal(run_tool((const char *[]){"show", "--mesh", "2", "--shape", "8", h, NULL}), 2);
    assert_int_equal(run_tool((const char *[]){"info", h, NULL}), 2);
    setenv("DTL_LOG_SUBSYS", h, 1); /* info prints every variable's value */
    setenv("DTL_PLAN_TUNE", h, 1);
    assert_int_equal(run_tool((const char *[]){"info", NULL}), 0);
    unsetenv("DTL_LOG_SUBSYS");
    unsetenv("DTL_PLAN_TUNE");
  }
}

int main(void) {
  unsetenv("DTL_PLAN_TUNE");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(printable_text_and_utf8_pass_unchanged),
      cmocka_unit_test(control_and_malformed_bytes_are_escaped),
      cmocka_unit_test(long_text_is_cut_with_an_ellipsis_never_inside_an_escape),
      cmocka_unit_test(messages_cut_to_their_buffer_end_on_a_whole_character),
      cmocka_unit_test(parsers_echo_hostile_text_quoted),
      cmocka_unit_test(plan_tune_is_echoed_quoted),
      cmocka_unit_test(checkpoint_names_paths_and_json_are_echoed_quoted),
      cmocka_unit_test(tool_messages_echo_hostile_arguments_quoted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The safetensors file on one process: every malformed header (built by hand, byte by byte) is refused by
 * dtl_safetensors_open with DTL_ERR_INVALID_ARGUMENT naming the file, the tensor and the field, leaving the
 * output untouched; the writer's output is the documented format (checked on the raw bytes) and reads back
 * exactly, as whole tensors and as any box, for every dtype; bad arguments of every call; allocation
 * failures at every point. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "checkpoint/checkpoint_internal.h"

static char dir[64];
static char path_buf[400];

static const char *tmp_path(const char *name) {
  snprintf(path_buf, sizeof path_buf, "%s/%.300s", dir, name);
  return path_buf;
}

/* A file of: the 8-byte little-endian length len, the header bytes, then data. */
static const char *raw_file(const char *name, uint64_t len, const char *header, size_t header_bytes, const void *data,
                            size_t data_bytes) {
  const char *p = tmp_path(name);
  FILE *fp = fopen(p, "wb");
  assert_non_null(fp);
  unsigned char l8[8];
  for (int i = 0; i < 8; i++) l8[i] = (unsigned char)(len >> (8 * i));
  assert_int_equal(fwrite(l8, 1, 8, fp), 8);
  if (header_bytes) assert_int_equal(fwrite(header, 1, header_bytes, fp), header_bytes);
  if (data_bytes) assert_int_equal(fwrite(data, 1, data_bytes, fp), data_bytes);
  fclose(fp);
  return p;
}
/* The usual case: a JSON header of its own length and data_bytes bytes of data (0, 1, 2, ...). */
static const char *json_file(const char *json, size_t data_bytes) {
  unsigned char data[256];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)i;
  assert_true(data_bytes <= sizeof data);
  return raw_file("bad.safetensors", strlen(json), json, strlen(json), data, data_bytes);
}

/* open fails with status and a message holding every one of the texts; *out is untouched. */
static void open_fails_v(const char *path, dtl_status want, const char *const *texts) {
  dtl_safetensors *sentinel = (dtl_safetensors *)(uintptr_t)0x5eed, *f = sentinel;
  dtl_status st = dtl_safetensors_open(path, &f);
  if (st != want) fail_msg("open(%s) -> %s (expected %s): %s", path, dtl_status_name(st), dtl_status_name(want), dtl_last_error());
  assert_ptr_equal(f, sentinel);
  for (; *texts; texts++)
    if (!strstr(dtl_last_error(), *texts)) fail_msg("message '%s' lacks '%s'", dtl_last_error(), *texts);
}
#define OPEN_FAILS(path, ...) open_fails_v((path), DTL_ERR_INVALID_ARGUMENT, (const char *const[]){__VA_ARGS__, NULL})
/* A header of one tensor "w" whose entry is the given JSON, over 64 bytes of data. */
#define ENTRY_FAILS(entry, ...) OPEN_FAILS(json_file("{\"w\": " entry "}", 64), "bad.safetensors", __VA_ARGS__)

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/dtl_ckpt_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') unlink(tmp_path(e->d_name));
  if (d) closedir(d);
  rmdir(dir);
  return 0;
}

/* --- malformed files --------------------------------------------------------------------------------------- */
static void files_shorter_than_the_length_field_are_refused(void **state) {
  (void)state;
  const char *p = tmp_path("short.safetensors");
  FILE *fp = fopen(p, "wb");
  fwrite("\x10\0\0", 1, 3, fp);
  fclose(fp);
  OPEN_FAILS(p, "short.safetensors", "3 bytes, fewer than the 8");
  fp = fopen(p, "wb");
  fclose(fp);
  OPEN_FAILS(p, "0 bytes");
}

static void header_lengths_past_the_end_or_over_the_cap_are_refused(void **state) {
  (void)state;
  const char *json = "{}";
  OPEN_FAILS(raw_file("len.safetensors", 1000, json, 2, NULL, 0), "header length=1000 runs past the end", "(2 bytes");
  OPEN_FAILS(raw_file("len.safetensors", UINT64_MAX, json, 2, NULL, 0), "header length=18446744073709551615");
  OPEN_FAILS(raw_file("len.safetensors", 3, json, 2, NULL, 0), "runs past the end");
  /* A sparse file larger than the cap: the length fits in the file but exceeds 100 MB. */
  const char *p = raw_file("huge.safetensors", DTL__ST_MAX_HEADER + 1, json, 2, NULL, 0);
  assert_int_equal(truncate(p, (off_t)(DTL__ST_MAX_HEADER + 64)), 0);
  OPEN_FAILS(p, "header length=100000001 exceeds the cap of 100000000 bytes");
  unlink(p);
}

static void headers_that_are_not_a_json_object_are_refused_with_the_position(void **state) {
  (void)state;
  OPEN_FAILS(json_file("hello", 0), "not valid JSON", "line 1", "byte");
  OPEN_FAILS(json_file("{\"w\": {\"dtype\": \"F32\"", 0), "not valid JSON");
  OPEN_FAILS(json_file("[1, 2]", 0), "the header is an array (expected a JSON object of tensors)");
  OPEN_FAILS(json_file("{} trailing", 0), "not valid JSON");
  OPEN_FAILS(raw_file("nul.safetensors", 4, "{\0}}", 4, NULL, 0), "not valid JSON");
  OPEN_FAILS(json_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [99999999999999999999], \"data_offsets\": [0, 4]}}", 4),
             "not valid JSON", "too big");
  OPEN_FAILS(raw_file("empty.safetensors", 0, "", 0, NULL, 0), "not valid JSON");
}

static void duplicate_tensor_names_are_refused(void **state) {
  (void)state;
  OPEN_FAILS(json_file("{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]},"
                       " \"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [2, 4]}}", 4),
             "not valid JSON", "duplicate object key", "\"a\"");
}

static void every_field_of_an_entry_is_checked_and_named(void **state) {
  (void)state;
  ENTRY_FAILS("5", "tensor \"w\": the entry is an integer (expected an object");
  ENTRY_FAILS("{\"shape\": [1], \"data_offsets\": [0, 4]}", "tensor \"w\": dtype is missing");
  ENTRY_FAILS("{\"dtype\": 3, \"shape\": [1], \"data_offsets\": [0, 4]}", "tensor \"w\": dtype is an integer");
  ENTRY_FAILS("{\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}", "tensor \"w\": dtype=\"F33\" is not a safetensors dtype");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"data_offsets\": [0, 4]}", "tensor \"w\": shape is missing");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": 4, \"data_offsets\": [0, 4]}", "tensor \"w\": shape is an integer");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}", "tensor \"w\": shape[0]=-1 (expected >= 0)");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [1, 1.5], \"data_offsets\": [0, 4]}", "tensor \"w\": shape[1] is a real number");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [1, \"2\"], \"data_offsets\": [0, 4]}", "tensor \"w\": shape[1] is a string");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [1]}", "tensor \"w\": data_offsets is missing");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}", "tensor \"w\": data_offsets is an array whose length is not 2");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": {}}", "tensor \"w\": data_offsets is an object");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}", "tensor \"w\": data_offsets holds an integer and an integer (expected two integers >= 0)");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, null]}", "tensor \"w\": data_offsets holds an integer and null");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}", "tensor \"w\": data_offsets=[8,4] (expected begin <= end)");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [64, 68]}", "tensor \"w\": data_offsets=[64,68] end past the data buffer (64 bytes");
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [4, 8], \"data_offsets\": [0, 64]}",
              "tensor \"w\": data_offsets=[0,64] hold 64 bytes, but dtype F32 x shape [4,8] needs 128");
  ENTRY_FAILS("{\"dtype\": \"BF16\", \"shape\": [], \"data_offsets\": [0, 4]}", "hold 4 bytes, but dtype BF16 x shape [] needs 2");
}

static void huge_dims_and_too_many_dims_are_refused_without_overflow(void **state) {
  (void)state;
  ENTRY_FAILS("{\"dtype\": \"F32\", \"shape\": [9223372036854775807], \"data_offsets\": [0, 4]}",
              "tensor \"w\": shape has more elements than 64-bit sizes can count");
  ENTRY_FAILS("{\"dtype\": \"U8\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}",
              "more elements than 64-bit sizes can count");
  ENTRY_FAILS("{\"dtype\": \"U8\", \"shape\": [4611686018427387904, 2], \"data_offsets\": [0, 4]}", "more elements");
  ENTRY_FAILS("{\"dtype\": \"U8\", \"shape\": [1152921504606846976], \"data_offsets\": [0, 4]}",
              "hold 4 bytes, but dtype U8 x shape [1152921504606846976] needs 1152921504606846976");
  char json[512] = "{\"w\": {\"dtype\": \"U8\", \"data_offsets\": [0, 1], \"shape\": [1";
  for (int d = 1; d < 65; d++) strcat(json, ",1");
  strcat(json, "]}}");
  OPEN_FAILS(json_file(json, 1), "tensor \"w\": shape has 65 dims (at most 64)");
}

static void overlapping_data_is_refused_naming_both_tensors(void **state) {
  (void)state;
  OPEN_FAILS(json_file("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                       " \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}", 32),
             "tensor \"b\": data_offsets=[8,24] overlap those of tensor \"a\" [0,16]");
  /* Containment, out of order in the header. */
  OPEN_FAILS(json_file("{\"x\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]},"
                       " \"y\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [8, 10]},"
                       " \"big\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [0, 16]}}", 16),
             "overlap those of tensor \"big\" [0,16]");
}

static void metadata_must_map_strings_to_strings(void **state) {
  (void)state;
  OPEN_FAILS(json_file("{\"__metadata__\": [1]}", 0), "__metadata__ is an array (expected an object of strings)");
  OPEN_FAILS(json_file("{\"__metadata__\": {\"k\": 1}}", 0), "__metadata__ \"k\" is an integer (expected a string)");
}

static void names_with_control_bytes_are_printed_safely(void **state) {
  (void)state;
  OPEN_FAILS(json_file("{\"a\\nb\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 2]}}", 4),
             "tensor \"a\\x0ab\": data_offsets=[0,2] hold 2 bytes");
}

static void paths_that_cannot_be_read_are_refused(void **state) {
  (void)state;
  OPEN_FAILS(tmp_path("missing.safetensors"), "cannot be opened", "missing.safetensors");
  OPEN_FAILS(dir, "not a regular file");
  dtl_safetensors *f = NULL;
  assert_int_equal(dtl_safetensors_open(NULL, &f), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "path=NULL"));
  assert_int_equal(dtl_safetensors_open(tmp_path("x"), NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "out=NULL"));
}

/* A valid file of the format's own: unsupported dtypes are listed, extra fields and unclaimed bytes allowed. */
static void valid_hand_written_files_open_and_list_every_tensor(void **state) {
  (void)state;
  unsigned char data[32];
  for (int i = 0; i < 32; i++) data[i] = (unsigned char)(i * 3);
  const char *json = "{\"__metadata__\": {\"format\": \"pt\", \"a\": \"b\"},"
                     " \"mask\": {\"dtype\": \"BOOL\", \"shape\": [2, 2], \"data_offsets\": [20, 24]},"
                     " \"b\": {\"dtype\": \"U8\", \"shape\": [2, 3], \"data_offsets\": [0, 6], \"extra\": 1},"
                     " \"a\": {\"dtype\": \"I16\", \"shape\": [3], \"data_offsets\": [8, 14]},"
                     " \"f8\": {\"dtype\": \"F8_E4M3\", \"shape\": [2], \"data_offsets\": [24, 26]},"
                     " \"f8s\": {\"dtype\": \"F8_E5M2\", \"shape\": [1, 2], \"data_offsets\": [26, 28]},"
                     " \"scale\": {\"dtype\": \"F8_E8M0\", \"shape\": [1], \"data_offsets\": [28, 29]},"
                     " \"z\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [6, 6]}}   ";
  const char *p = raw_file("ok.safetensors", strlen(json), json, strlen(json), data, sizeof data);
  dtl_safetensors *f;
  assert_int_equal(dtl_safetensors_open(p, &f), DTL_OK);
  assert_int_equal(dtl_safetensors_num_tensors(f), 7);
  const char *names[] = {"a", "b", "f8", "f8s", "mask", "scale", "z"};
  for (size_t i = 0; i < 7; i++) assert_string_equal(dtl_safetensors_tensor_name(f, i), names[i]);
  assert_null(dtl_safetensors_tensor_name(f, 7));
  assert_string_equal(dtl_safetensors_metadata(f, "format"), "pt");
  assert_string_equal(dtl_safetensors_metadata(f, "a"), "b");
  assert_null(dtl_safetensors_metadata(f, "missing"));
  assert_string_equal(dtl_safetensors_dtype_name(f, "mask"), "BOOL");
  assert_string_equal(dtl_safetensors_dtype_name(f, "a"), "I16");
  assert_null(dtl_safetensors_dtype_name(f, "nope"));

  dtl_dtype t = (dtl_dtype)99;
  int nd = -1;
  int64_t shape[DTL_MAX_TENSOR_DIMS] = {-7, -7};
  assert_int_equal(dtl_safetensors_info(f, "b", &t, &nd, shape), DTL_OK);
  assert_int_equal(t, DTL_UINT8);
  assert_int_equal(nd, 2);
  assert_int_equal(shape[0], 2);
  assert_int_equal(shape[1], 3);
  /* An unsupported dtype: the shape is there, the dtype is DTL_ERR_UNSUPPORTED naming it, nothing written. */
  t = (dtl_dtype)99;
  nd = -1;
  assert_int_equal(dtl_safetensors_info(f, "mask", &t, &nd, NULL), DTL_ERR_UNSUPPORTED);
  assert_non_null(strstr(dtl_last_error(), "tensor \"mask\": dtype=BOOL has no dtl dtype"));
  assert_int_equal(t, 99);
  assert_int_equal(nd, -1);
  assert_int_equal(dtl_safetensors_info(f, "mask", NULL, &nd, shape), DTL_OK);
  assert_int_equal(nd, 2);
  unsigned char out[8] = {0};
  int64_t o[2] = {0, 0}, s[2] = {2, 2};
  assert_int_equal(dtl_safetensors_read_box(f, "mask", DTL_UINT8, 2, o, s, out), DTL_ERR_UNSUPPORTED);
  assert_int_equal(out[0], 0);
  /* Missing names: nothing written. */
  assert_int_equal(dtl_safetensors_info(f, "nope", &t, &nd, shape), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "tensor \"nope\" is not in the file"));
  assert_int_equal(nd, 2);
  /* The U8 tensor reads back its bytes. */
  int64_t s3[2] = {2, 3};
  assert_int_equal(dtl_safetensors_read_box(f, "b", DTL_UINT8, 2, o, s3, out), DTL_OK);
  for (int i = 0; i < 6; i++) assert_int_equal(out[i], data[i]);
  /* F8_E4M3 and F8_E5M2 are dtl's 8-bit floats, read as their bytes; F8_E8M0 (a scale format) has no dtl dtype. */
  assert_int_equal(dtl_safetensors_info(f, "f8", &t, &nd, shape), DTL_OK);
  assert_int_equal(t, DTL_FLOAT8_E4M3);
  assert_int_equal(dtl_safetensors_info(f, "f8s", &t, &nd, shape), DTL_OK);
  assert_int_equal(t, DTL_FLOAT8_E5M2);
  assert_string_equal(dtl_safetensors_dtype_name(f, "f8s"), "F8_E5M2");
  int64_t s12[2] = {1, 2};
  memset(out, 0, sizeof out);
  assert_int_equal(dtl_safetensors_read_box(f, "f8s", DTL_FLOAT8_E5M2, 2, o, s12, out), DTL_OK);
  assert_int_equal(out[0], data[26]);
  assert_int_equal(out[1], data[27]);
  int64_t s2[1] = {2};
  assert_int_equal(dtl_safetensors_read_box(f, "f8", DTL_FLOAT8_E5M2, 1, o, s2, out), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "tensor \"f8\": dtype=F8_E4M3 in the file, F8_E5M2 requested"));
  assert_int_equal(dtl_safetensors_info(f, "scale", &t, NULL, NULL), DTL_ERR_UNSUPPORTED);
  assert_non_null(strstr(dtl_last_error(), "tensor \"scale\": dtype=F8_E8M0 has no dtl dtype"));
  /* An empty tensor reads nothing, and may have a NULL destination. */
  int64_t z[2] = {0, 5};
  assert_int_equal(dtl_safetensors_read_box(f, "z", DTL_FLOAT32, 2, o, z, NULL), DTL_OK);
  dtl_safetensors_close(f);
  dtl_safetensors_close(NULL);
}

static void a_file_truncated_after_open_fails_the_read_cleanly(void **state) {
  (void)state;
  unsigned char data[64] = {1};
  const char *json = "{\"w\": {\"dtype\": \"U8\", \"shape\": [64], \"data_offsets\": [0, 64]}}";
  const char *p = raw_file("trunc.safetensors", strlen(json), json, strlen(json), data, sizeof data);
  dtl_safetensors *f;
  assert_int_equal(dtl_safetensors_open(p, &f), DTL_OK);
  assert_int_equal(truncate(p, 8 + (off_t)strlen(json) + 10), 0);
  unsigned char out[64];
  memset(out, 0xAB, sizeof out);
  int64_t o = 0, s = 64;
  assert_int_equal(dtl_safetensors_read_box(f, "w", DTL_UINT8, 1, &o, &s, out), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "tensor \"w\": the file has"));
  assert_non_null(strstr(dtl_last_error(), "truncated since?"));
  for (int i = 0; i < 64; i++) assert_int_equal(out[i], 0xAB);
  dtl_safetensors_close(f);
}

/* --- writing and reading back ------------------------------------------------------------------------------ */
static void fill(void *p, size_t bytes, unsigned seed) {
  unsigned char *b = p;
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b[i] = (unsigned char)(s >> 56);
  }
}

typedef struct {
  const char *name;
  dtl_dtype t;
  int ndim;
  int64_t shape[4];
} spec;
static const spec specs[] = {
    {"f32", DTL_FLOAT32, 2, {5, 7}},     {"f64", DTL_FLOAT64, 3, {3, 4, 5}}, {"f16", DTL_FLOAT16, 1, {9}},
    {"bf16", DTL_BFLOAT16, 2, {4, 6}},   {"i8", DTL_INT8, 3, {2, 3, 7}},     {"u8", DTL_UINT8, 4, {2, 3, 2, 5}},
    {"i32", DTL_INT32, 2, {6, 1}},       {"i64", DTL_INT64, 2, {3, 3}},      {"scalar", DTL_FLOAT32, 0, {0}},
    {"empty", DTL_FLOAT32, 3, {4, 0, 3}}, {"a.b/c d", DTL_UINT8, 1, {1}},
    /* the 8-bit floats: every byte a code (NaNs too), stored and read as it is */
    {"f8e4m3", DTL_FLOAT8_E4M3, 2, {16, 16}}, {"f8e5m2", DTL_FLOAT8_E5M2, 3, {2, 3, 5}},
};
#define NSPECS (sizeof specs / sizeof specs[0])

static size_t spec_bytes(const spec *s) {
  size_t n = dtl_dtype_size(s->t);
  for (int d = 0; d < s->ndim; d++) n *= (size_t)s->shape[d];
  return n;
}

static const char *write_specs(const char *name, void **datas) {
  const char *p = tmp_path(name);
  dtl_safetensors_writer *w;
  assert_int_equal(dtl_safetensors_write_begin(p, &w), DTL_OK);
  for (size_t i = 0; i < NSPECS; i++) {
    datas[i] = malloc(spec_bytes(&specs[i]) + 1);
    fill(datas[i], spec_bytes(&specs[i]), (unsigned)i + 1);
    assert_int_equal(dtl_safetensors_write_add(w, specs[i].name, specs[i].t, specs[i].ndim, specs[i].shape, datas[i]), DTL_OK);
  }
  assert_int_equal(dtl_safetensors_write_metadata(w, "format", "pt"), DTL_OK);
  assert_int_equal(dtl_safetensors_write_metadata(w, "format", "dtl"), DTL_OK); /* the later value wins */
  assert_int_equal(dtl_safetensors_write_metadata(w, "layers", "2"), DTL_OK);
  assert_int_equal(dtl_safetensors_write_end(w), DTL_OK);
  return p;
}

static void written_files_follow_the_format_byte_for_byte(void **state) {
  (void)state;
  void *datas[NSPECS];
  const char *p = write_specs("fmt.safetensors", datas);
  FILE *fp = fopen(p, "rb");
  unsigned char l8[8];
  assert_int_equal(fread(l8, 1, 8, fp), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | l8[i];
  assert_int_equal(n % 8, 0); /* the data starts 8-byte aligned */
  char *hdr = calloc(1, n + 1);
  assert_int_equal(fread(hdr, 1, n, fp), n);
  assert_int_equal(hdr[0], '{');
  /* Keys sorted (in entries too), padding spaces after the object, offsets in the order of the adds. */
  assert_non_null(strstr(hdr, "\"f32\":{\"data_offsets\":[0,140],\"dtype\":\"F32\",\"shape\":[5,7]}"));
  assert_non_null(strstr(hdr, "\"f64\":{\"data_offsets\":[140,620],\"dtype\":\"F64\",\"shape\":[3,4,5]}"));
  assert_non_null(strstr(hdr, "\"dtype\":\"F32\",\"shape\":[]}"));
  assert_non_null(strstr(hdr, "\"f8e4m3\":{\"data_offsets\":[889,1145],\"dtype\":\"F8_E4M3\",\"shape\":[16,16]}"));
  assert_non_null(strstr(hdr, "\"dtype\":\"F8_E5M2\",\"shape\":[2,3,5]}"));
  assert_non_null(strstr(hdr, "\"__metadata__\":{\"format\":\"dtl\",\"layers\":\"2\"}"));
  assert_true(strstr(hdr, "\"bf16\"") < strstr(hdr, "\"f16\""));
  size_t end = strlen(hdr);
  while (end > 0 && hdr[end - 1] == ' ') end--;
  assert_int_equal(hdr[end - 1], '}');
  assert_true(n - end < 8);
  /* The first tensor's data starts right after the header. */
  unsigned char first[140];
  assert_int_equal(fread(first, 1, 140, fp), 140);
  assert_memory_equal(first, datas[0], 140);
  fclose(fp);
  free(hdr);
  for (size_t i = 0; i < NSPECS; i++) free(datas[i]);
}

/* The box [o, o + s) of a row-major array of shape sh, packed, computed independently of dtl. */
static void ref_box(const unsigned char *src, size_t es, int nd, const int64_t *sh, const int64_t *o, const int64_t *s,
                    unsigned char *dst) {
  int64_t n = 1, idx[8] = {0};
  for (int d = 0; d < nd; d++) n *= s[d];
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, lin = 0;
    for (int d = nd - 1; d >= 0; d--) {
      idx[d] = rem % s[d];
      rem /= s[d];
    }
    for (int d = 0; d < nd; d++) lin = lin * sh[d] + o[d] + idx[d];
    memcpy(dst + (size_t)i * es, src + (size_t)lin * es, es);
  }
}

/* Every box of every tensor (all offsets and extents for small dims), with the default window and with
 * windows small enough that gathered runs cross window boundaries. */
static void every_box_of_every_dtype_reads_back_exactly(void **state) {
  (void)state;
  void *datas[NSPECS];
  const char *p = write_specs("boxes.safetensors", datas);
  dtl_safetensors *f;
  assert_int_equal(dtl_safetensors_open(p, &f), DTL_OK);
  assert_int_equal(dtl_safetensors_num_tensors(f), NSPECS);
  assert_string_equal(dtl_safetensors_metadata(f, "format"), "dtl");
  size_t windows[] = {DTL__ST_WINDOW, 64, 24};
  for (size_t wi = 0; wi < 3; wi++) {
    f->window = windows[wi];
    for (size_t i = 0; i < NSPECS; i++) {
      const spec *sp = &specs[i];
      dtl_dtype t;
      int nd;
      int64_t shape[DTL_MAX_TENSOR_DIMS];
      assert_int_equal(dtl_safetensors_info(f, sp->name, &t, &nd, shape), DTL_OK);
      assert_int_equal(t, sp->t);
      assert_int_equal(nd, sp->ndim);
      size_t es = dtl_dtype_size(t);
      /* Boxes: for each dim an (offset, extent) among a few choices, all combinations. */
      int64_t o[4] = {0}, s[4] = {0};
      int combos = 1;
      for (int d = 0; d < nd; d++) combos *= 4;
      for (int c = 0; c < combos; c++) {
        int cc = c;
        for (int d = 0; d < nd; d++, cc /= 4) {
          int64_t n = sp->shape[d];
          switch (cc % 4) {
            case 0: o[d] = 0, s[d] = n; break;
            case 1: o[d] = n / 3, s[d] = n - n / 3; break;
            case 2: o[d] = n / 2, s[d] = (n + 1) / 4; break;
            default: o[d] = n, s[d] = 0; break;
          }
        }
        size_t cnt = 1;
        for (int d = 0; d < nd; d++) cnt *= (size_t)s[d];
        unsigned char *got = malloc(cnt * es + 1), *want = malloc(cnt * es + 1);
        ref_box(datas[i], es, nd, sp->shape, o, s, want);
        assert_int_equal(dtl_safetensors_read_box(f, sp->name, t, nd, o, s, got), DTL_OK);
        if (cnt) assert_memory_equal(got, want, cnt * es);
        free(got);
        free(want);
      }
    }
  }
  dtl_safetensors_close(f);
  for (size_t i = 0; i < NSPECS; i++) free(datas[i]);
}

static void read_box_checks_dtype_dims_and_range_and_writes_nothing_on_failure(void **state) {
  (void)state;
  void *datas[NSPECS];
  const char *p = write_specs("args.safetensors", datas);
  dtl_safetensors *f;
  assert_int_equal(dtl_safetensors_open(p, &f), DTL_OK);
  float out[64];
  memset(out, 0, sizeof out);
  int64_t o[2] = {0, 0}, s[2] = {5, 7};
  assert_int_equal(dtl_safetensors_read_box(f, "f32", DTL_INT32, 2, o, s, out), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "tensor \"f32\": dtype=F32 in the file, I32 requested (dtl converts nothing)"));
  assert_int_equal(dtl_safetensors_read_box(f, "f32", DTL_FLOAT32, 3, o, s, out), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "ndim=3 (tensor \"f32\" has 2 dims)"));
  int64_t o2[2] = {1, 0};
  assert_int_equal(dtl_safetensors_read_box(f, "f32", DTL_FLOAT32, 2, o2, s, out), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "offset[0]=1 shape[0]=5 (tensor \"f32\" has 5 along dim 0)"));
  int64_t neg[2] = {-1, 0};
  assert_int_equal(dtl_safetensors_read_box(f, "f32", DTL_FLOAT32, 2, neg, s, out), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_safetensors_read_box(f, "f32", DTL_FLOAT32, 2, o, s, NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "dst=NULL"));
  assert_int_equal(dtl_safetensors_read_box(f, "f32", DTL_FLOAT32, 2, NULL, s, out), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_safetensors_read_box(f, NULL, DTL_FLOAT32, 2, o, s, out), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "name=NULL"));
  assert_int_equal(dtl_safetensors_read_box(NULL, "f32", DTL_FLOAT32, 2, o, s, out), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "file=NULL"));
  for (int i = 0; i < 64; i++) assert_true(out[i] == 0.0f);
  /* The scalar: a 0-d box. */
  float v = 0;
  assert_int_equal(dtl_safetensors_read_box(f, "scalar", DTL_FLOAT32, 0, NULL, NULL, &v), DTL_OK);
  assert_memory_equal(&v, datas[8], 4);
  dtl_safetensors_close(f);
  for (size_t i = 0; i < NSPECS; i++) free(datas[i]);
}

static void writer_arguments_are_checked_and_a_failed_add_changes_nothing(void **state) {
  (void)state;
  const char *p = tmp_path("w.safetensors");
  dtl_safetensors_writer *w = (dtl_safetensors_writer *)(uintptr_t)0x5eed;
  assert_int_equal(dtl_safetensors_write_begin("/nonexistent-dir/x.safetensors", &w), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "path=\"/nonexistent-dir/x.safetensors\": cannot create a file next to it"));
  assert_ptr_equal(w, (void *)(uintptr_t)0x5eed);
  assert_int_equal(dtl_safetensors_write_begin(p, &w), DTL_OK);
  int64_t shape[2] = {2, 2};
  float d[4] = {1, 2, 3, 4};
  assert_int_equal(dtl_safetensors_write_add(w, "a", DTL_FLOAT32, 2, shape, d), DTL_OK);
  assert_int_equal(dtl_safetensors_write_add(w, "a", DTL_FLOAT32, 2, shape, d), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "name=\"a\" was added before"));
  assert_int_equal(dtl_safetensors_write_add(w, "__metadata__", DTL_FLOAT32, 2, shape, d), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_safetensors_write_add(w, "b", (dtl_dtype)DTL_NUM_DTYPES, 2, shape, d), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "dtype=10"));
  assert_int_equal(dtl_safetensors_write_add(w, "b", DTL_FLOAT32, 9, shape, d), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "ndim=9 (expected 0..8)"));
  int64_t neg[2] = {2, -1};
  assert_int_equal(dtl_safetensors_write_add(w, "b", DTL_FLOAT32, 2, neg, d), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "shape[1]=-1"));
  assert_int_equal(dtl_safetensors_write_add(w, "b", DTL_FLOAT32, 2, shape, NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "data=NULL with 16 bytes"));
  int64_t big[2] = {INT64_MAX, 4};
  assert_int_equal(dtl_safetensors_write_add(w, "b", DTL_FLOAT32, 2, big, d), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_safetensors_write_add(w, "\xff\xfe", DTL_FLOAT32, 2, shape, d), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "is not a UTF-8 string"));
  assert_int_equal(dtl_safetensors_write_metadata(w, "k", "\xff"), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_safetensors_write_metadata(w, NULL, "v"), DTL_ERR_INVALID_ARGUMENT);
  int64_t zero[2] = {0, 3};
  assert_int_equal(dtl_safetensors_write_add(w, "e", DTL_FLOAT32, 2, zero, NULL), DTL_OK);
  float d2[4] = {5, 6, 7, 8};
  assert_int_equal(dtl_safetensors_write_add(w, "b", DTL_FLOAT32, 2, shape, d2), DTL_OK);
  assert_int_equal(dtl_safetensors_write_end(w), DTL_OK);
  /* Only what was added, at the right places: the failed adds left nothing behind. */
  dtl_safetensors *f;
  assert_int_equal(dtl_safetensors_open(p, &f), DTL_OK);
  assert_int_equal(dtl_safetensors_num_tensors(f), 3);
  float got[4];
  int64_t o[2] = {0, 0};
  assert_int_equal(dtl_safetensors_read_box(f, "b", DTL_FLOAT32, 2, o, shape, got), DTL_OK);
  assert_memory_equal(got, d2, sizeof d2);
  assert_int_equal(dtl_safetensors_read_box(f, "a", DTL_FLOAT32, 2, o, shape, got), DTL_OK);
  assert_memory_equal(got, d, sizeof d);
  assert_null(dtl_safetensors_metadata(f, "k"));
  dtl_safetensors_close(f);
  /* A cancelled writer writes nothing; neither leaves a temporary file. */
  assert_int_equal(dtl_safetensors_write_begin(tmp_path("cancelled.safetensors"), &w), DTL_OK);
  assert_int_equal(dtl_safetensors_write_add(w, "a", DTL_FLOAT32, 2, shape, d), DTL_OK);
  dtl_safetensors_write_cancel(w);
  dtl_safetensors_write_cancel(NULL);
  assert_int_equal(access(tmp_path("cancelled.safetensors"), F_OK), -1);
  DIR *dd = opendir(dir);
  struct dirent *e;
  while ((e = readdir(dd)))
    if (strstr(e->d_name, "dtl-data")) fail_msg("temporary file %s left behind", e->d_name);
  closedir(dd);
}

/* Every allocation of open, read and write can fail: the call returns DTL_ERR_OUT_OF_MEMORY and nothing. */
static void allocation_failures_are_reported_at_every_point(void **state) {
  (void)state;
  void *datas[NSPECS];
  const char *p = write_specs("oom.safetensors", datas);
  char path[400];
  snprintf(path, sizeof path, "%s", p);
  int seen = 0;
  for (uint64_t n = 1; n < 200; n++) {
    dtl_safetensors *f = NULL;
    dtl__alloc_hook_reset(n, false);
    dtl_status st = dtl_safetensors_open(path, &f);
    dtl__alloc_hook_reset(0, false);
    if (st == DTL_OK) {
      dtl_safetensors_close(f);
      seen = 1;
      break;
    }
    assert_int_equal(st, DTL_ERR_OUT_OF_MEMORY);
    assert_null(f);
  }
  assert_true(seen);
  dtl_safetensors *f;
  assert_int_equal(dtl_safetensors_open(path, &f), DTL_OK);
  f->window = 64;
  int64_t o[2] = {1, 1}, s[2] = {3, 5};
  float got[15];
  dtl__alloc_hook_reset(1, false);
  assert_int_equal(dtl_safetensors_read_box(f, "f32", DTL_FLOAT32, 2, o, s, got), DTL_ERR_OUT_OF_MEMORY);
  dtl__alloc_hook_reset(0, false);
  dtl_safetensors_close(f);
  for (uint64_t n = 1; n < 10; n++) {
    dtl_safetensors_writer *w = NULL;
    dtl__alloc_hook_reset(n, false);
    dtl_status st = dtl_safetensors_write_begin(tmp_path("oomw.safetensors"), &w);
    if (st == DTL_OK) st = dtl_safetensors_write_add(w, "x", DTL_FLOAT32, 2, s, got);
    if (w) st = st == DTL_OK ? dtl_safetensors_write_end(w) : (dtl_safetensors_write_cancel(w), st);
    dtl__alloc_hook_reset(0, false);
    assert_true(st == DTL_OK || st == DTL_ERR_OUT_OF_MEMORY);
    if (st == DTL_OK) break;
  }
  for (size_t i = 0; i < NSPECS; i++) free(datas[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(files_shorter_than_the_length_field_are_refused),
      cmocka_unit_test(header_lengths_past_the_end_or_over_the_cap_are_refused),
      cmocka_unit_test(headers_that_are_not_a_json_object_are_refused_with_the_position),
      cmocka_unit_test(duplicate_tensor_names_are_refused),
      cmocka_unit_test(every_field_of_an_entry_is_checked_and_named),
      cmocka_unit_test(huge_dims_and_too_many_dims_are_refused_without_overflow),
      cmocka_unit_test(overlapping_data_is_refused_naming_both_tensors),
      cmocka_unit_test(metadata_must_map_strings_to_strings),
      cmocka_unit_test(names_with_control_bytes_are_printed_safely),
      cmocka_unit_test(paths_that_cannot_be_read_are_refused),
      cmocka_unit_test(valid_hand_written_files_open_and_list_every_tensor),
      cmocka_unit_test(a_file_truncated_after_open_fails_the_read_cleanly),
      cmocka_unit_test(written_files_follow_the_format_byte_for_byte),
      cmocka_unit_test(every_box_of_every_dtype_reads_back_exactly),
      cmocka_unit_test(read_box_checks_dtype_dims_and_range_and_writes_nothing_on_failure),
      cmocka_unit_test(writer_arguments_are_checked_and_a_failed_add_changes_nothing),
      cmocka_unit_test(allocation_failures_are_reported_at_every_point),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

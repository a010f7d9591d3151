/* SPDX-License-Identifier: Apache-2.0 */
/* Bad input to quantized layouts, dequantization and quantization: each case gets DTL_ERR_INVALID_ARGUMENT (or
 * UNSUPPORTED), a message that names the field, dim, index and value, and leaves every output as it was. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "common/chunk.h"
#include "common/half.h"
#include "dtl.h"

#define UNTOUCHED ((dtl_qlayout *)0x5a5a)

static void expect_message(const char *const *need) {
  const char *msg = dtl_last_error();
  for (; *need; need++)
    if (!strstr(msg, *need)) fail_msg("message \"%s\" lacks \"%s\"", msg, *need);
}
#define EXPECT_MESSAGE(...) expect_message((const char *const[]){__VA_ARGS__, NULL})

/* dtl_qlayout_create on one rank must fail with st, naming each string given, and leave out alone. */
static void expect_refused(const dtl_quant_format *f, int ndim, const int64_t *shape, dtl_status st,
                           const char *const *need) {
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(1, (int[]){1}, NULL, &m), DTL_OK);
  dtl_qlayout *l = UNTOUCHED;
  dtl_status got = dtl_qlayout_create(m, f, ndim, shape, (dtl_placement[]){dtl_replicate()}, &l);
  if (got != st) fail_msg("status %s (expected %s): %s", dtl_status_name(got), dtl_status_name(st), dtl_last_error());
  assert_ptr_equal(l, UNTOUCHED);
  expect_message(need);
  assert_non_null(strstr(dtl_last_error(), "dtl_qlayout_create"));
  dtl_mesh_destroy(m);
}
#define EXPECT_REFUSED(f, nd, shape, ...) \
  expect_refused((f), (nd), (shape), DTL_ERR_INVALID_ARGUMENT, (const char *const[]){__VA_ARGS__, NULL})

static const int64_t mat[2] = {64, 256};

static void every_field_of_the_format_is_checked_and_named_with_its_value(void **state) {
  dtl_quant_format f = {.kind = (dtl_quant_kind)8};
  EXPECT_REFUSED(&f, 2, mat, "fmt.kind=8 (expected 0..7)");
  f.kind = (dtl_quant_kind)-1;
  EXPECT_REFUSED(&f, 2, mat, "fmt.kind=-1");
  f = (dtl_quant_format){.kind = DTL_QUANT_FP8_BLOCK, .mask = DTL_BIT(9)};
  EXPECT_REFUSED(&f, 2, mat, "fmt.mask=0x200 has unknown bits 0x200");
  f = (dtl_quant_format){.kind = DTL_QUANT_GPTQ, .flags = DTL_BIT(4)};
  EXPECT_REFUSED(&f, 2, mat, "fmt.flags=0x10 has unknown bits 0x10");
  /* a field the kind does not have */
  f = (dtl_quant_format){.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_BLOCK, .block_rows = 128, .block_cols = 128};
  EXPECT_REFUSED(&f, 2, mat, "fmt.mask=0x1", "DTL_QFMT_BLOCK", "gptq does not have");
  f = (dtl_quant_format){.kind = DTL_QUANT_FP8_CHANNEL, .mask = DTL_QFMT_GROUP, .group = 128};
  EXPECT_REFUSED(&f, 2, mat, "DTL_QFMT_GROUP", "fp8-channel");
  f = (dtl_quant_format){.kind = DTL_QUANT_AWQ, .mask = DTL_QFMT_CODE_DTYPE, .code_dtype = DTL_FLOAT8_E4M3};
  EXPECT_REFUSED(&f, 2, mat, "DTL_QFMT_CODE_DTYPE", "awq");
  f = (dtl_quant_format){.kind = DTL_QUANT_GGUF_Q8_0, .mask = DTL_QFMT_SCALE_DTYPE, .scale_dtype = DTL_FLOAT16};
  EXPECT_REFUSED(&f, 2, mat, "DTL_QFMT_SCALE_DTYPE", "q8_0");
  f = (dtl_quant_format){.kind = DTL_QUANT_AWQ, .flags = DTL_QFMT_ACT_ORDER};
  EXPECT_REFUSED(&f, 2, mat, "DTL_QFMT_ACT_ORDER", "fmt.kind=awq");
  /* values */
  f = (dtl_quant_format){.kind = DTL_QUANT_FP8_BLOCK, .mask = DTL_QFMT_BLOCK, .block_rows = 0, .block_cols = 128};
  EXPECT_REFUSED(&f, 2, mat, "fmt.block_rows=0 (expected >= 1)");
  f.block_rows = 128;
  f.block_cols = -3;
  EXPECT_REFUSED(&f, 2, mat, "fmt.block_cols=-3 (expected >= 1)");
  f = (dtl_quant_format){.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_GROUP, .group = 0};
  EXPECT_REFUSED(&f, 2, mat, "fmt.group=0");
  f.group = -2;
  EXPECT_REFUSED(&f, 2, mat, "fmt.group=-2");
  f = (dtl_quant_format){.kind = DTL_QUANT_FP8_TENSOR, .mask = DTL_QFMT_CODE_DTYPE, .code_dtype = DTL_FLOAT16};
  EXPECT_REFUSED(&f, 2, mat, "fmt.code_dtype=f16 (expected f8e4m3 or f8e5m2)");
  f.code_dtype = (dtl_dtype)77;
  EXPECT_REFUSED(&f, 2, mat, "fmt.code_dtype=(not a dtype)");
  f = (dtl_quant_format){.kind = DTL_QUANT_AWQ, .mask = DTL_QFMT_SCALE_DTYPE, .scale_dtype = DTL_INT8};
  EXPECT_REFUSED(&f, 2, mat, "fmt.scale_dtype=i8 (expected f32, f16 or bf16)");
  EXPECT_REFUSED(NULL, 2, mat, "fmt=NULL");
}

static void shapes_a_format_cannot_hold_are_refused_with_the_numbers(void **state) {
  dtl_quant_format fp8 = {.kind = DTL_QUANT_FP8_BLOCK}, gptq = {.kind = DTL_QUANT_GPTQ}, awq = {.kind = DTL_QUANT_AWQ};
  dtl_quant_format q8 = {.kind = DTL_QUANT_GGUF_Q8_0}, q4k = {.kind = DTL_QUANT_GGUF_Q4_K};
  const int64_t v64[] = {64}, neg[] = {64, -1}, c100[] = {64, 100}, r12[] = {12, 64}, r20[] = {2, 20, 64};
  const int64_t c48[] = {4, 48}, n384[] = {384};
  EXPECT_REFUSED(&fp8, 1, v64, "ndim=1 (expected 2..");
  EXPECT_REFUSED(&q8, 0, mat, "ndim=0 (expected 1..");
  EXPECT_REFUSED(&fp8, 2, neg, "shape[1]=-1 (expected >= 0)");
  EXPECT_REFUSED(&fp8, 2, NULL, "shape=NULL");
  EXPECT_REFUSED(&gptq, 2, c100, "shape[1]=100 cols (expected a multiple of 8");
  EXPECT_REFUSED(&gptq, 2, r12, "shape[0]=12 rows (expected a multiple of 8");
  EXPECT_REFUSED(&awq, 3, r20, "shape[1]=20 rows (expected a multiple of 8");
  EXPECT_REFUSED(&q8, 2, c48, "shape[1]=48 (expected a multiple of 32");
  EXPECT_REFUSED(&q4k, 1, n384, "shape[0]=384 (expected a multiple of 256");
}

/* The degrees k for which every chunk boundary of n falls on a multiple of u (an independent chunker). */
static void works_text(int64_t n, int64_t u, char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = '\0';
  for (int k = 1; k <= 256 && at + 16 < cap; k++) {
    int64_t cs = (n + k - 1) / k;
    bool ok = true;
    for (int i = 0; i < k; i++) {
      int64_t lo = (int64_t)i * cs < n ? (int64_t)i * cs : n, hi = lo + cs < n ? lo + cs : n;
      if (lo % u || hi % u) ok = false;
    }
    if (ok) at += (size_t)snprintf(buf + at, cap - at, "%s%d", at ? ", " : "", k);
  }
}

static void a_cut_inside_a_packing_unit_names_dim_unit_sizes_and_the_degrees_that_work(void **state) {
  const struct {
    dtl_quant_kind kind;
    int64_t shape[2];
    int sdim, ways;
    int64_t unit;
    const char *unit_name;
  } cases[] = {
      {DTL_QUANT_GPTQ, {64, 72}, 1, 4, 8, "int32 of 8 codes"},
      {DTL_QUANT_GPTQ, {72, 64}, 0, 4, 8, "int32 of 8 zero points"},
      {DTL_QUANT_AWQ, {40, 64}, 0, 3, 8, "int32 of 8 codes"},
      {DTL_QUANT_GGUF_Q4_0, {4, 96}, 1, 2, 32, "q4_0 block"},
      {DTL_QUANT_GGUF_Q4_K, {2, 768}, 1, 2, 256, "q4_k super-block"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    dtl_quant_format f = {.kind = cases[i].kind};
    dtl_mesh *m;
    assert_int_equal(dtl_mesh_create_abstract(1, (int[]){cases[i].ways}, (int[]){0}, &m), DTL_OK);
    dtl_qlayout *l = UNTOUCHED;
    assert_int_equal(dtl_qlayout_create(m, &f, 2, cases[i].shape, (dtl_placement[]){dtl_shard(cases[i].sdim)}, &l),
                     DTL_ERR_INVALID_ARGUMENT);
    assert_ptr_equal(l, UNTOUCHED);
    int64_t n = cases[i].shape[cases[i].sdim], cut = -1;
    for (int c = 0; c < cases[i].ways && cut < 0; c++) {
      int64_t off, size;
      dtl__chunk(n, cases[i].ways, c, &off, &size);
      if (off % cases[i].unit) cut = off;
      else if ((off + size) % cases[i].unit) cut = off + size;
    }
    char dim[64], unit[96], at[48], works[256], want_works[300];
    snprintf(dim, sizeof dim, "tensor dim %d (size %lld) split %d ways", cases[i].sdim, (long long)n, cases[i].ways);
    snprintf(unit, sizeof unit, "packing unit of %lld elements (%s)", (long long)cases[i].unit, cases[i].unit_name);
    snprintf(at, sizeof at, "at element %lld", (long long)cut);
    works_text(n, cases[i].unit, works, sizeof works);
    snprintf(want_works, sizeof want_works, "works %s ways", works);
    EXPECT_MESSAGE("dtl_qlayout_create", dim, "mesh dim 0", unit, at, want_works);
    dtl_mesh_destroy(m);
  }
  /* Partial is refused: codes do not add */
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(1, (int[]){2}, (int[]){0}, &m), DTL_OK);
  dtl_qlayout *l = UNTOUCHED;
  dtl_quant_format f = {.kind = DTL_QUANT_FP8_BLOCK};
  assert_int_equal(dtl_qlayout_create(m, &f, 2, mat, (dtl_placement[]){dtl_partial(DTL_SUM)}, &l),
                   DTL_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(l, UNTOUCHED);
  EXPECT_MESSAGE("placements[0]=P(sum)", "cannot be Partial");
  dtl_mesh_destroy(m);
}

/* --- dequantize ------------------------------------------------------------------------------------------------ */

typedef struct {
  dtl_mesh *m;
  dtl_qlayout *l;
  dtl_qbox b;
  dtl_qbuf q;
  float *out;
  size_t n;
} shard;

/* The shard at coordinate c of `ways` along sdim (ways 1: replicated), parts zeroed except scales set to 1 (the
 * scale dtype's 1.0), out filled with a sentinel. */
static void shard_make(shard *s, const dtl_quant_format *f, int ndim, const int64_t *shape, int ways, int sdim, int c) {
  memset(s, 0, sizeof *s);
  assert_int_equal(dtl_mesh_create_abstract(1, (int[]){ways}, (int[]){c}, &s->m), DTL_OK);
  dtl_status st = dtl_qlayout_create(s->m, f, ndim, shape, (dtl_placement[]){ways > 1 ? dtl_shard(sdim) : dtl_replicate()},
                                     &s->l);
  if (st != DTL_OK) fail_msg("%s", dtl_last_error());
  assert_int_equal(dtl_qlayout_local_boxes(s->l, NULL, &s->b), DTL_OK);
  dtl_quant_format rf;
  dtl_qlayout_quant_format(s->l, &rf);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    if (s->b.part[p].ndim < 0) continue;
    s->q.part[p] = calloc(1, s->b.part[p].bytes + 1);
  }
  if (rf.kind <= DTL_QUANT_AWQ) {
    size_t es = dtl_dtype_size(rf.scale_dtype), k = s->b.part[DTL_QPART_SCALES].bytes / es;
    for (size_t i = 0; i < k; i++) {
      if (es == 4) ((float *)s->q.part[DTL_QPART_SCALES])[i] = 1.0f;
      else ((uint16_t *)s->q.part[DTL_QPART_SCALES])[i] = rf.scale_dtype == DTL_FLOAT16 ? 0x3c00 : 0x3f80;
    }
  }
  s->n = 1;
  for (int d = 0; d < ndim; d++) s->n *= (size_t)s->b.shape[d];
  s->out = malloc(s->n * 4 + 4);
  memset(s->out, 0x5a, s->n * 4 + 4);
}

static void shard_free(shard *s) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(s->q.part[p]);
  free(s->out);
  dtl_qlayout_destroy(s->l);
  dtl_mesh_destroy(s->m);
}

static void assert_out_untouched(const shard *s) {
  for (size_t i = 0; i < s->n * 4; i++) assert_int_equal(((uint8_t *)s->out)[i], 0x5a);
}

static void a_nan_or_infinite_scale_names_part_local_and_global_index_and_value_and_writes_nothing(void **state) {
  /* FP8 blocks of 128 over 512 columns split 4 ways: rank 2 holds columns [256, 384), scale column block 2 */
  dtl_quant_format f = {.kind = DTL_QUANT_FP8_BLOCK};
  shard s;
  shard_make(&s, &f, 2, (int64_t[]){256, 512}, 4, 1, 2);
  assert_int_equal(s.b.part[DTL_QPART_SCALES].offset[1], 2);
  assert_int_equal(s.b.part[DTL_QPART_SCALES].shape[1], 1);
  ((float *)s.q.part[DTL_QPART_SCALES])[1] = NAN; /* local [1, 0] of a [2, 1] box */
  assert_int_equal(dtl_quant_dequantize(s.l, &s.q, s.out), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_quant_dequantize", "scales[", "local [1, 0]", "global [1, 2]", "nan", "finite");
  assert_out_untouched(&s);
  ((float *)s.q.part[DTL_QPART_SCALES])[1] = 1.0f;
  ((float *)s.q.part[DTL_QPART_SCALES])[0] = -INFINITY;
  assert_int_equal(dtl_quant_dequantize(s.l, &s.q, s.out), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("scales[0] (local [0, 0], global [0, 2]) = -inf");
  assert_out_untouched(&s);
  shard_free(&s);

  /* GPTQ f16 scales [G, R] with rows split 2 ways: rank 1's local [1, 3] is global [1, 35] */
  f = (dtl_quant_format){.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_GROUP, .group = 32};
  shard_make(&s, &f, 2, (int64_t[]){64, 64}, 2, 0, 1);
  ((uint16_t *)s.q.part[DTL_QPART_SCALES])[1 * 32 + 3] = 0x7c00; /* +inf */
  assert_int_equal(dtl_quant_dequantize(s.l, &s.q, s.out), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("scales[35] (local [1, 3], global [1, 35]) = inf");
  assert_out_untouched(&s);
  shard_free(&s);

  /* GGUF: a block whose d (or Q4_K's dmin) is not finite */
  f = (dtl_quant_format){.kind = DTL_QUANT_GGUF_Q4_K};
  shard_make(&s, &f, 2, (int64_t[]){2, 512}, 2, 1, 1);
  ((uint8_t *)s.q.part[DTL_QPART_CODES])[144 + 2] = 0x00; /* local row 1's block: dmin = NaN (0x7e00) */
  ((uint8_t *)s.q.part[DTL_QPART_CODES])[144 + 3] = 0x7e;
  assert_int_equal(dtl_quant_dequantize(s.l, &s.q, s.out), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("codes[146] (local [1, 2], global [1, 146])", "dmin is nan");
  assert_out_untouched(&s);
  shard_free(&s);

  /* act-order g_idx outside 0..G-1 */
  f = (dtl_quant_format){.kind = DTL_QUANT_GPTQ, .flags = DTL_QFMT_ACT_ORDER, .mask = DTL_QFMT_GROUP, .group = 16};
  shard_make(&s, &f, 2, (int64_t[]){8, 64}, 2, 1, 1);
  ((int32_t *)s.q.part[DTL_QPART_GIDX])[5] = 4;
  assert_int_equal(dtl_quant_dequantize(s.l, &s.q, s.out), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("g_idx[5] (local [5], global [37]) = 4 (expected a group in 0..3)");
  assert_out_untouched(&s);
  ((int32_t *)s.q.part[DTL_QPART_GIDX])[5] = -1;
  assert_int_equal(dtl_quant_dequantize(s.l, &s.q, s.out), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("= -1 (expected a group in 0..3)");
  ((int32_t *)s.q.part[DTL_QPART_GIDX])[5] = 3;
  assert_int_equal(dtl_quant_dequantize(s.l, &s.q, s.out), DTL_OK);
  shard_free(&s);
}

static void missing_or_stray_buffers_are_named(void **state) {
  dtl_quant_format f = {.kind = DTL_QUANT_GPTQ};
  shard s;
  shard_make(&s, &f, 2, (int64_t[]){64, 256}, 1, 0, 0);
  assert_int_equal(dtl_quant_dequantize(NULL, &s.q, s.out), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_quant_dequantize: layout=NULL");
  assert_int_equal(dtl_quant_dequantize(s.l, NULL, s.out), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("local=NULL");
  assert_int_equal(dtl_quant_dequantize(s.l, &s.q, NULL), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("out=NULL (expected 16384 floats)");
  void *zeros = s.q.part[DTL_QPART_ZEROS];
  s.q.part[DTL_QPART_ZEROS] = NULL;
  assert_int_equal(dtl_quant_dequantize(s.l, &s.q, s.out), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("local->part[2] (zeros)=NULL (expected 64 bytes)");
  s.q.part[DTL_QPART_ZEROS] = zeros;
  s.q.part[DTL_QPART_GIDX] = zeros;
  assert_int_equal(dtl_quant_dequantize(s.l, &s.q, s.out), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("local->part[3] (g_idx) is not NULL, but gptq(g128) has no g_idx");
  assert_int_equal(dtl_quant_quantize(s.l, (float *)s.out, &s.q), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_quant_quantize: local->part[3] (g_idx) is not NULL");
  s.q.part[DTL_QPART_GIDX] = NULL;
  assert_out_untouched(&s);
  assert_int_equal(dtl_quant_quantize(s.l, NULL, &s.q), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dense_local=NULL");
  shard_free(&s);
}

/* --- quantize -------------------------------------------------------------------------------------------------- */

static void quantize_refuses_a_box_that_cuts_a_block_naming_the_dim_and_the_block(void **state) {
  /* TP 8 on 512 columns with 128-blocks: rank 1 holds [64, 128), half of block 0 */
  dtl_quant_format f = {.kind = DTL_QUANT_FP8_BLOCK};
  shard s;
  shard_make(&s, &f, 2, (int64_t[]){128, 512}, 8, 1, 1);
  float *x = calloc(s.n, 4);
  uint8_t before[4];
  memcpy(before, s.q.part[DTL_QPART_SCALES], 4);
  memset(s.q.part[DTL_QPART_CODES], 0x77, s.b.part[DTL_QPART_CODES].bytes);
  assert_int_equal(dtl_quant_quantize(s.l, x, &s.q), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_quant_quantize", "tensor dim 1", "[64, 128)", "FP8 block column 0 ([0, 128)");
  assert_memory_equal(s.q.part[DTL_QPART_SCALES], before, 4);
  for (size_t i = 0; i < s.b.part[DTL_QPART_CODES].bytes; i++) assert_int_equal(((uint8_t *)s.q.part[0])[i], 0x77);
  free(x);
  shard_free(&s);

  /* GPTQ groups of 128 over 512 columns split 8 ways; FP8_CHANNEL over split columns; act order over split columns */
  const dtl_quant_format fs[] = {{.kind = DTL_QUANT_GPTQ},
                                 {.kind = DTL_QUANT_FP8_CHANNEL},
                                 {.kind = DTL_QUANT_GPTQ, .flags = DTL_QFMT_ACT_ORDER}};
  const char *names[] = {"group 0 ([0, 128)", "the channel (one scale per whole row) 0 ([0, 512)",
                         "the act-order groups"};
  for (int i = 0; i < 3; i++) {
    shard_make(&s, &fs[i], 2, (int64_t[]){64, 512}, 8, 1, 1);
    x = calloc(s.n, 4);
    assert_int_equal(dtl_quant_quantize(s.l, x, &s.q), DTL_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("tensor dim 1", "[64, 128)", names[i]);
    free(x);
    shard_free(&s);
  }
}

static void quantize_refuses_non_finite_input_and_unrepresentable_scales_and_q4_k(void **state) {
  dtl_quant_format f = {.kind = DTL_QUANT_GGUF_Q8_0};
  shard s;
  shard_make(&s, &f, 2, (int64_t[]){2, 64}, 1, 0, 0);
  float *x = calloc(s.n, 4);
  x[70] = NAN;
  memset(s.q.part[0], 0x33, s.b.part[0].bytes);
  assert_int_equal(dtl_quant_quantize(s.l, x, &s.q), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("dtl_quant_quantize: dense_local[70] = nan (expected finite values)");
  x[70] = 1e30f; /* d = 1e30 / 127: beyond f16 */
  assert_int_equal(dtl_quant_quantize(s.l, x, &s.q), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("the scale d of block 0 of local row 1", "which f16 cannot hold");
  for (size_t i = 0; i < s.b.part[0].bytes; i++) assert_int_equal(((uint8_t *)s.q.part[0])[i], 0x33);
  free(x);
  shard_free(&s);

  f = (dtl_quant_format){.kind = DTL_QUANT_AWQ, .mask = DTL_QFMT_GROUP, .group = 32};
  shard_make(&s, &f, 2, (int64_t[]){8, 64}, 1, 0, 0);
  x = calloc(s.n, 4);
  x[3] = 1e7f;
  x[4] = -1e7f; /* (max - min) / 15 > 65504 */
  assert_int_equal(dtl_quant_quantize(s.l, x, &s.q), DTL_ERR_INVALID_ARGUMENT);
  EXPECT_MESSAGE("the scale of row 0, group 0", "which f16 cannot hold");
  free(x);
  shard_free(&s);

  f = (dtl_quant_format){.kind = DTL_QUANT_GGUF_Q4_K};
  shard_make(&s, &f, 2, (int64_t[]){1, 256}, 1, 0, 0);
  x = calloc(s.n, 4);
  assert_int_equal(dtl_quant_quantize(s.l, x, &s.q), DTL_ERR_UNSUPPORTED);
  EXPECT_MESSAGE("dtl_quant_quantize: fmt.kind=q4_k");
  free(x);
  shard_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_field_of_the_format_is_checked_and_named_with_its_value),
      cmocka_unit_test(shapes_a_format_cannot_hold_are_refused_with_the_numbers),
      cmocka_unit_test(a_cut_inside_a_packing_unit_names_dim_unit_sizes_and_the_degrees_that_work),
      cmocka_unit_test(a_nan_or_infinite_scale_names_part_local_and_global_index_and_value_and_writes_nothing),
      cmocka_unit_test(missing_or_stray_buffers_are_named),
      cmocka_unit_test(quantize_refuses_a_box_that_cuts_a_block_naming_the_dim_and_the_block),
      cmocka_unit_test(quantize_refuses_non_finite_input_and_unrepresentable_scales_and_q4_k),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

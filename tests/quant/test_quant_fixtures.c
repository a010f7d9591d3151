/* SPDX-License-Identifier: Apache-2.0 */
/* dtl against the formats' own tools: the .qfx files of tests/quant/fixtures, which
 * tools/fixtures/make_quant_fixtures.py wrote from the gguf package's quants, ml_dtypes with DeepSeek-V3's block
 * dequantization, vLLM's FP8 group quantizer and numpy transcriptions of AutoGPTQ's and autoawq's unpacking. Each
 * dequantization fixture must come out bit for bit, on one rank and on every shard of 2 and 4 ranks that the format
 * allows; each quantization fixture must give the tool's bytes exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "dtl.h"
#include "quant_test_util.h"

#ifndef QFX_DIR
#error "QFX_DIR (the fixtures folder) is set by tests/quant/CMakeLists.txt"
#endif

enum { SEC_PART = 0, SEC_DEQUANT = 10, SEC_DENSE = 20, SEC_QPART = 30 };

typedef struct {
  dtl_quant_format fmt;
  int ndim;
  int64_t shape[DTL_MAX_TENSOR_DIMS];
  const uint8_t *sec[40];
  uint64_t sec_bytes[40];
  uint8_t *file;
} fixture;

static uint64_t rd(const uint8_t **p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)(*p)[i] << (8 * i);
  *p += n;
  return v;
}

static void load(const char *name, fixture *fx) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.qfx", QFX_DIR, name);
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s (made by tools/fixtures/make_quant_fixtures.py)", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  memset(fx, 0, sizeof *fx);
  fx->file = malloc((size_t)n);
  assert_int_equal(fread(fx->file, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  const uint8_t *p = fx->file, *end = fx->file + n;
  assert_memory_equal(p, "DTLQFX01", 8);
  p += 8;
  fx->fmt.kind = (dtl_quant_kind)rd(&p, 4);
  fx->fmt.flags = rd(&p, 4);
  fx->fmt.mask = rd(&p, 8);
  fx->fmt.block_rows = (int64_t)rd(&p, 8);
  fx->fmt.block_cols = (int64_t)rd(&p, 8);
  fx->fmt.group = (int64_t)rd(&p, 8);
  fx->fmt.code_dtype = (dtl_dtype)(int32_t)rd(&p, 4);
  fx->fmt.scale_dtype = (dtl_dtype)(int32_t)rd(&p, 4);
  fx->ndim = (int)rd(&p, 4);
  assert_in_range(fx->ndim, 1, DTL_MAX_TENSOR_DIMS);
  for (int d = 0; d < fx->ndim; d++) fx->shape[d] = (int64_t)rd(&p, 8);
  uint32_t nsec = (uint32_t)rd(&p, 4);
  for (uint32_t i = 0; i < nsec; i++) {
    uint32_t tag = (uint32_t)rd(&p, 4);
    uint64_t bytes = rd(&p, 8);
    assert_true(tag < 40 && p + bytes <= end);
    fx->sec[tag] = p;
    fx->sec_bytes[tag] = bytes;
    p += bytes;
  }
  assert_ptr_equal(p, end);
}

/* The fixture's tensor dequantized on every coordinate of a mesh of `ranks` with the placement pl (1 rank: the whole
 * tensor) must equal the tool's values; returns the shards checked (0 when the layout is refused). */
static int check_dequant(const char *name, const fixture *fx, int ranks, dtl_placement pl) {
  qt_tensor t = {0};
  t.ndim = fx->ndim;
  memcpy(t.shape, fx->shape, sizeof t.shape);
  int shards = 0;
  for (int c = 0; c < ranks; c++) {
    dtl_mesh *m;
    assert_int_equal(dtl_mesh_create_abstract(1, (int[]){ranks}, (int[]){c}, &m), DTL_OK);
    dtl_qlayout *l;
    dtl_status st = dtl_qlayout_create(m, &fx->fmt, fx->ndim, fx->shape, (dtl_placement[]){pl}, &l);
    if (st != DTL_OK) {
      assert_int_equal(st, DTL_ERR_INVALID_ARGUMENT);
      assert_true(ranks > 1);
      dtl_mesh_destroy(m);
      return 0;
    }
    dtl_qbox b;
    assert_int_equal(dtl_qlayout_local_boxes(l, NULL, &b), DTL_OK);
    dtl_qbuf q = {{NULL}};
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
      if (b.part[p].ndim < 0) {
        assert_null(fx->sec[SEC_PART + p]);
        continue;
      }
      size_t total = dtl_dtype_size(b.part[p].dtype);
      for (int d = 0; d < b.part[p].ndim; d++) total *= (size_t)b.part[p].global_shape[d];
      if (fx->sec_bytes[SEC_PART + p] != total)
        fail_msg("%s: part %d has %llu bytes, the layout says %zu", name, p,
                 (unsigned long long)fx->sec_bytes[SEC_PART + p], total);
      q.part[p] = malloc(b.part[p].bytes + 1);
      qt_slice(fx->sec[SEC_PART + p], b.part[p].ndim, b.part[p].global_shape, dtl_dtype_size(b.part[p].dtype),
               b.part[p].shape, b.part[p].offset, q.part[p]);
    }
    size_t n = 1;
    for (int d = 0; d < fx->ndim; d++) n *= (size_t)b.shape[d];
    float *out = malloc(n * 4 + 4), *want = malloc(n * 4 + 4);
    st = dtl_quant_dequantize(l, &q, out);
    if (st != DTL_OK) fail_msg("%s: %s", name, dtl_last_error());
    qt_slice(fx->sec[SEC_DEQUANT], fx->ndim, fx->shape, 4, b.shape, b.offset, want);
    for (size_t i = 0; i < n; i++)
      if (memcmp(&out[i], &want[i], 4))
        fail_msg("%s on %d ranks, coordinate %d: local element %zu = %a, the tool gives %a", name, ranks, c, i,
                 (double)out[i], (double)want[i]);
    shards++;
    free(out);
    free(want);
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(q.part[p]);
    dtl_qlayout_destroy(l);
    dtl_mesh_destroy(m);
  }
  return shards;
}

static void run_dequant(const char *name) {
  fixture fx;
  load(name, &fx);
  assert_non_null(fx.sec[SEC_DEQUANT]);
  assert_int_equal(check_dequant(name, &fx, 1, dtl_replicate()), 1);
  int shards = 0;
  for (int ranks = 2; ranks <= 4; ranks += 2)
    for (int d = 0; d < fx.ndim; d++) shards += check_dequant(name, &fx, ranks, dtl_shard(d));
  assert_true(shards > 0);
  free(fx.file);
}

static void fp8_block_dequantization_equals_deepseek_v3s_weight_dequant(void **state) {
  run_dequant("fp8_block_e4m3_f32");
  run_dequant("fp8_block_e5m2_bf16");
}

static void fp8_channel_and_tensor_scales_equal_ml_dtypes_times_the_scale(void **state) {
  run_dequant("fp8_channel_f16");
  run_dequant("fp8_tensor_e5m2");
}

static void gptq_dequantization_equals_autogptqs_with_and_without_act_order(void **state) {
  run_dequant("gptq_g32_f16");
  run_dequant("gptq_g16_act_order");
}

static void awq_dequantization_equals_autoawqs_dequantize_gemm(void **state) {
  run_dequant("awq_g32_f16");
  run_dequant("awq_g16_r24_f32");
}

static void gguf_dequantization_equals_the_gguf_packages_quants(void **state) {
  run_dequant("q8_0");
  run_dequant("q4_0");
  run_dequant("q4_k");
  run_dequant("q4_k_1d");
}

/* The quantizer on one rank must write the tool's bytes, part by part; on 2 ranks split where the blocks are whole,
 * each rank's parts are the slices of those bytes. */
static void run_quantize(const char *name) {
  fixture fx;
  load(name, &fx);
  assert_non_null(fx.sec[SEC_DENSE]);
  for (int ranks = 1; ranks <= 2; ranks++)
    for (int c = 0; c < ranks; c++) {
      dtl_mesh *m;
      assert_int_equal(dtl_mesh_create_abstract(1, (int[]){ranks}, (int[]){c}, &m), DTL_OK);
      dtl_qlayout *l;
      /* rows split: every block (FP8 rows of 16, GGUF rows) is whole where 2 ranks cut an even number of rows */
      assert_int_equal(dtl_qlayout_create(m, &fx.fmt, fx.ndim, fx.shape,
                                          (dtl_placement[]){ranks == 1 ? dtl_replicate() : dtl_shard(0)}, &l),
                       DTL_OK);
      dtl_qbox b;
      assert_int_equal(dtl_qlayout_local_boxes(l, NULL, &b), DTL_OK);
      size_t n = 1;
      for (int d = 0; d < fx.ndim; d++) n *= (size_t)b.shape[d];
      float *x = malloc(n * 4 + 4);
      qt_slice(fx.sec[SEC_DENSE], fx.ndim, fx.shape, 4, b.shape, b.offset, x);
      dtl_qbuf q = {{NULL}};
      for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
        if (b.part[p].ndim >= 0) q.part[p] = calloc(1, b.part[p].bytes + 1);
      dtl_status st = dtl_quant_quantize(l, x, &q);
      if (st != DTL_OK) fail_msg("%s: %s", name, dtl_last_error());
      for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
        if (b.part[p].ndim < 0) continue;
        assert_non_null(fx.sec[SEC_QPART + p]);
        uint8_t *want = malloc(b.part[p].bytes + 1);
        qt_slice(fx.sec[SEC_QPART + p], b.part[p].ndim, b.part[p].global_shape, dtl_dtype_size(b.part[p].dtype),
                 b.part[p].shape, b.part[p].offset, want);
        for (size_t i = 0; i < b.part[p].bytes; i++)
          if (((uint8_t *)q.part[p])[i] != want[i])
            fail_msg("%s on %d ranks, coordinate %d: part %d byte %zu = 0x%02x, the tool wrote 0x%02x", name, ranks, c,
                     p, i, ((uint8_t *)q.part[p])[i], want[i]);
        free(want);
      }
      free(x);
      for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(q.part[p]);
      dtl_qlayout_destroy(l);
      dtl_mesh_destroy(m);
    }
  free(fx.file);
}

static void fp8_quantization_equals_vllms_per_token_group_quant_fp8(void **state) { run_quantize("fp8_block_quantize"); }

static void q8_0_and_q4_0_quantization_equal_ggmls_reference_quantizers(void **state) {
  run_quantize("q8_0_quantize");
  run_quantize("q4_0_quantize");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fp8_block_dequantization_equals_deepseek_v3s_weight_dequant),
      cmocka_unit_test(fp8_channel_and_tensor_scales_equal_ml_dtypes_times_the_scale),
      cmocka_unit_test(gptq_dequantization_equals_autogptqs_with_and_without_act_order),
      cmocka_unit_test(awq_dequantization_equals_autoawqs_dequantize_gemm),
      cmocka_unit_test(gguf_dequantization_equals_the_gguf_packages_quants),
      cmocka_unit_test(fp8_quantization_equals_vllms_per_token_group_quant_fp8),
      cmocka_unit_test(q8_0_and_q4_0_quantization_equal_ggmls_reference_quantizers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

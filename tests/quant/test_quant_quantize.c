/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_quant_quantize: dequantize(quantize(x)) is within one quantization step of x for every format it supports
 * (FP8: the code's rounding; AWQ: plus what its zero clamped to 0..15 clips), and on meshes of 2 and 4 ranks each shard whose blocks are whole quantizes to the slice
 * of the dense tensor's quantization, bit for bit; a shard that cuts a block is refused, exactly when the format's
 * blocks say so. */
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
#include "quant/format.h"
#include "quant_test_util.h"

enum { TENSORS_PER_KIND = 8 };

/* Random values: each row its own magnitude, some rows all positive (GPTQ's zero then rounds to 0), some blocks of
 * 32 all zero, a few exact ties. */
static float *random_dense(qt_rng *r, int ndim, const int64_t *shape) {
  int64_t C = shape[ndim - 1], n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  float *x = malloc((size_t)n * 4 + 4);
  for (int64_t row = 0; C && row < n / C; row++) {
    float mag = ldexpf(1.0f, (int)qt_below(r, 16) - 8);
    bool positive = qt_below(r, 5) == 0;
    for (int64_t c = 0; c < C; c++) {
      float u = (float)qt_below(r, 1 << 20) / (float)(1 << 19) - 1.0f;
      x[row * C + c] = mag * (positive ? fabsf(u) : u);
    }
    if (qt_below(r, 6) == 0)
      for (int64_t c = 0; c < C && c < 32; c++) x[row * C + c] = 0.0f;
    if (qt_below(r, 6) == 0 && C > 1) x[row * C + 1] = mag * 0.5f;
  }
  return x;
}

/* A 1-rank tensor of t's format and shape with parts allocated (contents undefined). */
static void alloc_like(const dtl_quant_format *f, int ndim, const int64_t *shape, qt_tensor *t, dtl_qlayout **l,
                       dtl_mesh **m) {
  memset(t, 0, sizeof *t);
  assert_int_equal(dtl_mesh_create_abstract(1, (int[]){1}, NULL, m), DTL_OK);
  assert_int_equal(dtl_qlayout_create(*m, f, ndim, shape, (dtl_placement[]){dtl_replicate()}, l), DTL_OK);
  dtl_qbox b;
  dtl_qlayout_local_boxes(*l, NULL, &b);
  dtl_qlayout_quant_format(*l, &t->fmt);
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    t->pndim[p] = b.part[p].ndim;
    if (b.part[p].ndim < 0) continue;
    t->pdtype[p] = b.part[p].dtype;
    memcpy(t->pshape[p], b.part[p].global_shape, sizeof t->pshape[p]);
    t->bytes[p] = b.part[p].bytes;
    t->part[p] = malloc(t->bytes[p] + 1);
  }
}

static void next_case(qt_rng *r, dtl_quant_kind k, dtl_quant_format *f, int *nd, int64_t *shape) {
  qt_random_format(r, k, f, nd, shape);
}

static void dequantize_of_quantize_is_within_one_step_for_every_format_but_q4_k(void **state) {
  qt_rng r = {0x5eed0010};
  for (int k = 0; k < DTL_QUANT_NUM_KINDS; k++) {
    if (k == DTL_QUANT_GGUF_Q4_K) continue;
    for (int n = 0; n < TENSORS_PER_KIND; n++) {
      dtl_quant_format f;
      int nd;
      int64_t shape[DTL_MAX_TENSOR_DIMS];
      next_case(&r, (dtl_quant_kind)k, &f, &nd, shape);
      float *x = random_dense(&r, nd, shape);
      qt_tensor t;
      dtl_qlayout *l;
      dtl_mesh *m;
      alloc_like(&f, nd, shape, &t, &l, &m);
      dtl_qbuf q = {{t.part[0], t.part[1], t.part[2], t.part[3]}};
      dtl_status st = dtl_quant_quantize(l, x, &q);
      if (st != DTL_OK) fail_msg("kind %d: %s", k, dtl_last_error());
      size_t cnt = dtl_layout_local_count(dtl_qlayout_logical(l));
      float *y = malloc(cnt * 4 + 4);
      assert_int_equal(dtl_quant_dequantize(l, &q, y), DTL_OK);
      int64_t R = nd >= 2 ? shape[nd - 2] : 1, C = shape[nd - 1], mats = R && C ? (int64_t)cnt / (R * C) : 0;
      bool e5 = t.fmt.code_dtype == DTL_FLOAT8_E5M2;
      float slack = t.fmt.scale_dtype == DTL_BFLOAT16 ? 1.1f : 1.01f;
      for (int64_t mi = 0; mi < mats; mi++)
        for (int64_t i = 0; i < R; i++)
          for (int64_t c = 0; c < C; c++) {
            int64_t e = (mi * R + i) * C + c;
            float step = qt_ref_step(&t, mi, i, c), err = fabsf(y[e] - x[e]), bound;
            if (k <= DTL_QUANT_FP8_TENSOR) /* half an ulp of the code: relative 2^-4 (e4m3) or 2^-3, or subnormal */
              bound = fmaxf(fabsf(x[e]) * (e5 ? 0x1p-3f : 0x1p-4f), step * (e5 ? 0x1p-17f : 0x1p-10f)) * 1.0001f;
            else
              bound = step * slack;
            if (k == DTL_QUANT_AWQ) { /* autoawq clamps the zero to 0..15: a group away from 0 clips to the codes' range */
              int z = qt_ref_zero(&t, mi, i, c);
              float lo = (float)(0 - z) * step, hi = (float)(15 - z) * step;
              bound += fmaxf(0.0f, fmaxf(lo - x[e], x[e] - hi));
            }
            if (!(err <= bound)) {
              char s[96];
              dtl__qformat_text(&t.fmt, s, sizeof s);
              fail_msg("%s [%lld x %lld]: element [%lld, %lld, %lld] = %g quantizes to %g (step %g, error %g > %g)", s,
                       (long long)R, (long long)C, (long long)mi, (long long)i, (long long)c, (double)x[e],
                       (double)y[e], (double)step, (double)err, (double)bound);
            }
          }
      free(x);
      free(y);
      qt_tensor_free(&t);
      dtl_qlayout_destroy(l);
      dtl_mesh_destroy(m);
    }
  }
}

static void an_all_zero_fp8_block_gets_a_positive_scale_and_zero_codes(void **state) {
  const dtl_dtype sdt[] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};
  for (int i = 0; i < 3; i++) {
    dtl_quant_format f = {.kind = DTL_QUANT_FP8_BLOCK, .mask = DTL_QFMT_SCALE_DTYPE, .scale_dtype = sdt[i]};
    int64_t shape[2] = {4, 8};
    qt_tensor t;
    dtl_qlayout *l;
    dtl_mesh *m;
    alloc_like(&f, 2, shape, &t, &l, &m);
    float x[32] = {0}, y[32];
    memset(y, 0x5a, sizeof y);
    dtl_qbuf q = {{t.part[0], t.part[1], NULL, NULL}};
    assert_int_equal(dtl_quant_quantize(l, x, &q), DTL_OK);
    float s = qt_scale(&t, 0);
    assert_true(s > 0.0f && isfinite(s));
    if (sdt[i] == DTL_FLOAT32) assert_true(s == 1e-10f / 448.0f); /* vLLM's eps over 448 */
    for (int j = 0; j < 32; j++) assert_int_equal(((uint8_t *)t.part[0])[j], 0);
    assert_int_equal(dtl_quant_dequantize(l, &q, y), DTL_OK);
    for (int j = 0; j < 32; j++) assert_true(y[j] == 0.0f);
    qt_tensor_free(&t);
    dtl_qlayout_destroy(l);
    dtl_mesh_destroy(m);
  }
}

static void act_order_quantization_writes_the_identity_g_idx(void **state) {
  dtl_quant_format f = {.kind = DTL_QUANT_GPTQ, .flags = DTL_QFMT_ACT_ORDER, .mask = DTL_QFMT_GROUP, .group = 16};
  int64_t shape[2] = {8, 64};
  qt_rng r = {7};
  float *x = random_dense(&r, 2, shape);
  qt_tensor t;
  dtl_qlayout *l;
  dtl_mesh *m;
  alloc_like(&f, 2, shape, &t, &l, &m);
  dtl_qbuf q = {{t.part[0], t.part[1], t.part[2], t.part[3]}};
  assert_int_equal(dtl_quant_quantize(l, x, &q), DTL_OK);
  for (int c = 0; c < 64; c++) assert_int_equal(((int32_t *)t.part[DTL_QPART_GIDX])[c], c / 16);
  free(x);
  qt_tensor_free(&t);
  dtl_qlayout_destroy(l);
  dtl_mesh_destroy(m);
}

/* Whether the box [lo, lo + n) of a dim of size N holds every block of `b` elements it touches. */
static bool whole(int64_t lo, int64_t n, int64_t N, int64_t b) {
  return n == 0 || (lo % b == 0 && ((lo + n) % b == 0 || lo + n == N));
}

/* The blocks quantization needs whole along each dim, from the formats' definitions: FP8 blocks, a channel's row, a
 * tensor's matrix, an int4 group (act order: every column), a GGUF block. */
static bool box_whole(const qt_tensor *t, const int64_t *bs, const int64_t *bo) {
  const dtl_quant_format *f = &t->fmt;
  int rd = t->ndim - 2, cd = t->ndim - 1;
  int64_t C = t->shape[cd];
  switch (f->kind) {
    case DTL_QUANT_FP8_BLOCK:
      return whole(bo[rd], bs[rd], t->shape[rd], f->block_rows) && whole(bo[cd], bs[cd], C, f->block_cols);
    case DTL_QUANT_FP8_CHANNEL: return whole(bo[cd], bs[cd], C, C);
    case DTL_QUANT_FP8_TENSOR: return whole(bo[rd], bs[rd], t->shape[rd], t->shape[rd]) && whole(bo[cd], bs[cd], C, C);
    case DTL_QUANT_GPTQ:
    case DTL_QUANT_AWQ:
      return whole(bo[cd], bs[cd], C, (f->flags & DTL_QFMT_ACT_ORDER) || f->group == -1 ? C : f->group);
    default: return true;
  }
}

static void each_shard_with_whole_blocks_quantizes_to_the_slice_of_the_dense_quantization(void **state) {
  qt_rng r = {0x5eed0011};
  static const int meshes[][3] = {{1, 2}, {1, 4}, {1, 3}, {2, 2, 2}};
  long equal = 0, refused = 0;
  for (int k = 0; k < DTL_QUANT_NUM_KINDS; k++) {
    if (k == DTL_QUANT_GGUF_Q4_K) continue;
    for (int n = 0; n < TENSORS_PER_KIND; n++) {
      dtl_quant_format f;
      int nd;
      int64_t shape[DTL_MAX_TENSOR_DIMS];
      next_case(&r, (dtl_quant_kind)k, &f, &nd, shape);
      if (k == DTL_QUANT_FP8_BLOCK && qt_below(&r, 2)) { /* often blocks that 2 and 4 ranks can keep whole */
        f.block_rows = f.block_cols = 8;
        shape[nd - 2] = 8 * (1 + qt_below(&r, 8));
        shape[nd - 1] = 32 * (1 + qt_below(&r, 4));
      }
      if ((k == DTL_QUANT_GPTQ || k == DTL_QUANT_AWQ) && f.group != -1 && qt_below(&r, 2))
        shape[nd - 1] = f.group * 4; /* groups whole on 2 and 4 ranks */
      float *x = random_dense(&r, nd, shape);
      qt_tensor t;
      dtl_qlayout *l1;
      dtl_mesh *m1;
      alloc_like(&f, nd, shape, &t, &l1, &m1);
      dtl_qbuf dq = {{t.part[0], t.part[1], t.part[2], t.part[3]}};
      if (dtl_quant_quantize(l1, x, &dq) != DTL_OK) fail_msg("dense: %s", dtl_last_error());
      for (int mi = 0; mi < 4; mi++)
        for (int pi = 0; pi < 3; pi++) {
          int mnd = meshes[mi][0];
          const int *msh = &meshes[mi][1];
          dtl_placement pl[2];
          for (int md = 0; md < mnd; md++) {
            int64_t v = qt_below(&r, 4);
            pl[md] = v == 0 ? dtl_replicate() : dtl_shard(v == 1 ? 0 : nd - (int)(v - 1));
          }
          int coord[2] = {0, 0};
          do {
            dtl_mesh *m;
            assert_int_equal(dtl_mesh_create_abstract(mnd, msh, coord, &m), DTL_OK);
            dtl_qlayout *l;
            if (dtl_qlayout_create(m, &f, nd, shape, pl, &l) != DTL_OK) { /* a cut packing unit: not this test's */
              dtl_mesh_destroy(m);
              break;
            }
            dtl_qbox b;
            dtl_qlayout_local_boxes(l, NULL, &b);
            float *xs = malloc(dtl_layout_local_count(dtl_qlayout_logical(l)) * 4 + 4);
            qt_slice(x, nd, shape, 4, b.shape, b.offset, xs);
            dtl_qbuf q = {{NULL}};
            for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
              if (b.part[p].ndim >= 0) q.part[p] = malloc(b.part[p].bytes + 1);
            dtl_status st = dtl_quant_quantize(l, xs, &q);
            if (!box_whole(&t, b.shape, b.offset)) {
              assert_int_equal(st, DTL_ERR_INVALID_ARGUMENT);
              assert_non_null(strstr(dtl_last_error(), "cuts"));
              refused++;
            } else {
              if (st != DTL_OK) fail_msg("a shard with whole blocks: %s", dtl_last_error());
              for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
                if (b.part[p].ndim < 0) continue;
                uint8_t *want = malloc(b.part[p].bytes + 1);
                qt_slice(t.part[p], b.part[p].ndim, t.pshape[p], dtl_dtype_size(t.pdtype[p]), b.part[p].shape,
                         b.part[p].offset, want);
                if (memcmp(want, q.part[p], b.part[p].bytes)) {
                  char s[256];
                  dtl_qlayout_format(l, s, sizeof s);
                  fail_msg("%s at [%d, %d]: part %d differs from the dense quantization's slice", s, coord[0], coord[1],
                           p);
                }
                free(want);
              }
              equal++;
            }
            free(xs);
            for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(q.part[p]);
            dtl_qlayout_destroy(l);
            dtl_mesh_destroy(m);
          } while (++coord[mnd - 1] < msh[mnd - 1] || (mnd == 2 && (coord[1] = 0, ++coord[0] < msh[0])));
        }
      free(x);
      qt_tensor_free(&t);
      dtl_qlayout_destroy(l1);
      dtl_mesh_destroy(m1);
    }
  }
  print_message("%ld shards quantized to the dense slice, %ld refused for a cut block\n", equal, refused);
  assert_true(equal > 0 && refused > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(dequantize_of_quantize_is_within_one_step_for_every_format_but_q4_k),
      cmocka_unit_test(an_all_zero_fp8_block_gets_a_positive_scale_and_zero_codes),
      cmocka_unit_test(act_order_quantization_writes_the_identity_g_idx),
      cmocka_unit_test(each_shard_with_whole_blocks_quantizes_to_the_slice_of_the_dense_quantization),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

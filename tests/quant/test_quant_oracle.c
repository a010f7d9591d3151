/* SPDX-License-Identifier: Apache-2.0 */
/* The dense oracle of every quantized format: a dense tensor of random codes and finite scales, dequantized on one
 * rank, must equal the element-by-element reference of the format's definition; and on every coordinate of 1-D and
 * 2-D meshes of 1..8 ranks with random Shard/Replicate placements, each part sliced by the box
 * dtl_qlayout_local_boxes gives, dequantized, must equal the slice of the dense result bit for bit (so must any tile
 * of it). A layout dtl_qlayout_create refuses must cut a packing unit at some coordinate, and one it accepts must
 * not; the plain view of a part that has one gives that part's box at every coordinate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "layout/qlayout_internal.h"
#include "quant/dequant.h"
#include "quant_test_util.h"

enum { TENSORS_PER_KIND = 6, PLACEMENTS_PER_MESH = 3 };

static const int meshes[][3] = {{1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}, {1, 6}, {1, 7}, {1, 8},
                                {2, 2, 2}, {2, 2, 3}, {2, 3, 2}, {2, 2, 4}, {2, 4, 2}, {2, 1, 4}, {2, 3, 1}};
#define NMESHES ((int)(sizeof meshes / sizeof *meshes))

/* Dequantizes t on a 1-rank replicated layout (malloc'd result). */
static float *dense_dequantize(const qt_tensor *t) {
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(1, (int[]){1}, NULL, &m), DTL_OK);
  dtl_qlayout *l;
  assert_int_equal(dtl_qlayout_create(m, &t->fmt, t->ndim, t->shape, (dtl_placement[]){dtl_replicate()}, &l), DTL_OK);
  size_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
  float *out = malloc(n * sizeof *out + 4);
  dtl_qbuf b = {{t->part[0], t->part[1], t->part[2], t->part[3]}};
  dtl_status st = dtl_quant_dequantize(l, &b, out);
  if (st != DTL_OK) fail_msg("dense dequantize: %s", dtl_last_error());
  dtl_qlayout_destroy(l);
  dtl_mesh_destroy(m);
  return out;
}

static void tensor_text(const qt_tensor *t, char *buf, size_t cap) {
  char f[96];
  dtl__qformat_text(&t->fmt, f, sizeof f);
  size_t at = (size_t)snprintf(buf, cap, "%s scale %s [", f, dtl_dtype_name(t->fmt.scale_dtype));
  for (int d = 0; d < t->ndim; d++) at += (size_t)snprintf(buf + at, cap - at, "%s%lld", d ? "," : "", (long long)t->shape[d]);
  snprintf(buf + at, cap - at, "]");
}

static void next_tensor(qt_rng *r, dtl_quant_kind k, qt_tensor *t) {
  dtl_quant_format f;
  int nd;
  int64_t shape[DTL_MAX_TENSOR_DIMS];
  qt_random_format(r, k, &f, &nd, shape);
  if (qt_tensor_random(r, &f, nd, shape, t) != 0) fail_msg("kind %d: dtl_qlayout_create refused the 1-rank layout: %s", k, dtl_last_error());
}

static void dense_dequantization_equals_the_formats_definition_for_every_format(void **state) {
  qt_rng r = {0x5eed0001};
  for (int k = 0; k < DTL_QUANT_NUM_KINDS; k++)
    for (int n = 0; n < 2 * TENSORS_PER_KIND; n++) {
      qt_tensor t;
      next_tensor(&r, (dtl_quant_kind)k, &t);
      float *dense = dense_dequantize(&t);
      int nd = t.ndim;
      int64_t R = nd >= 2 ? t.shape[nd - 2] : 1, C = t.shape[nd - 1], mats = 1;
      for (int d = 0; d < nd - 2; d++) mats *= t.shape[d];
      for (int64_t m = 0; m < mats; m++)
        for (int64_t i = 0; i < R; i++)
          for (int64_t c = 0; c < C; c++) {
            float want = qt_ref_value(&t, m, i, c), got = dense[(m * R + i) * C + c];
            if (memcmp(&want, &got, 4)) {
              char s[160];
              tensor_text(&t, s, sizeof s);
              fail_msg("%s: element [%lld, %lld, %lld] = %a, the definition gives %a", s, (long long)m, (long long)i,
                       (long long)c, (double)got, (double)want);
            }
          }
      free(dense);
      qt_tensor_free(&t);
    }
}

/* The packing unit of each logical dim, from the formats' definitions (quant.h): GPTQ packs 8 input channels per
 * code word and 8 rows per zero word, AWQ 8 rows per code and zero word, GGUF whole blocks along the columns. */
static int64_t unit_of(const qt_tensor *t, int d) {
  int nd = t->ndim;
  dtl_quant_kind k = t->fmt.kind;
  if (k == DTL_QUANT_GPTQ) return d >= nd - 2 ? 8 : 1;
  if (k == DTL_QUANT_AWQ) return d == nd - 2 ? 8 : 1;
  if (k >= DTL_QUANT_GGUF_Q8_0) return d == nd - 1 ? (k == DTL_QUANT_GGUF_Q4_K ? 256 : 32) : 1;
  return 1;
}

static bool next_coord(int ndim, const int *shape, int *c) {
  for (int d = ndim - 1; d >= 0; d--) {
    if (++c[d] < shape[d]) return true;
    c[d] = 0;
  }
  return false;
}

typedef struct {
  long accepted, refused, shards, tiles;
} tally;

/* One tensor on one mesh with one set of placements, at every coordinate. */
static void check_layout(qt_rng *r, const qt_tensor *t, const float *dense, int mnd, const int *mshape,
                         const dtl_placement *pl, tally *ty) {
  char ts[160];
  tensor_text(t, ts, sizeof ts);
  /* Whether the dense layout's boxes cut a packing unit anywhere: the refusal rule, independently. */
  dtl_mesh *m0;
  assert_int_equal(dtl_mesh_create_abstract(mnd, mshape, NULL, &m0), DTL_OK);
  dtl_layout *dl;
  assert_int_equal(dtl_layout_create(m0, DTL_FLOAT32, t->ndim, t->shape, pl, &dl), DTL_OK);
  bool cuts = false;
  int coord[DTL_MAX_MESH_DIMS] = {0};
  do {
    int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
    assert_int_equal(dtl_layout_local_box(dl, coord, bs, bo), DTL_OK);
    for (int d = 0; d < t->ndim; d++) {
      int64_t u = unit_of(t, d);
      if (bo[d] % u || (bo[d] + bs[d]) % u) cuts = true;
    }
  } while (next_coord(mnd, mshape, coord));
  dtl_layout_destroy(dl);
  dtl_mesh_destroy(m0);

  memset(coord, 0, sizeof coord);
  do {
    dtl_mesh *m;
    assert_int_equal(dtl_mesh_create_abstract(mnd, mshape, coord, &m), DTL_OK);
    dtl_qlayout *l = NULL;
    dtl_status st = dtl_qlayout_create(m, &t->fmt, t->ndim, t->shape, pl, &l);
    if (cuts) {
      if (st != DTL_ERR_INVALID_ARGUMENT) fail_msg("%s: a layout that cuts a packing unit was not refused (status %d)", ts, st);
      assert_non_null(strstr(dtl_last_error(), "packing unit"));
      ty->refused++;
      dtl_mesh_destroy(m);
      return;
    }
    if (st != DTL_OK) fail_msg("%s: refused a layout that cuts no packing unit: %s", ts, dtl_last_error());
    if (coord[0] == 0 && (mnd < 2 || coord[1] == 0)) ty->accepted++;
    dtl_qbox b, own;
    assert_int_equal(dtl_qlayout_local_boxes(l, coord, &b), DTL_OK);
    assert_int_equal(dtl_qlayout_local_boxes(l, NULL, &own), DTL_OK);
    assert_memory_equal(&b, &own, sizeof b);
    /* the logical box is the dense layout's */
    int64_t ls[DTL_MAX_TENSOR_DIMS], lo[DTL_MAX_TENSOR_DIMS];
    assert_int_equal(dtl_layout_local_box(dtl_qlayout_logical(l), coord, ls, lo), DTL_OK);
    assert_memory_equal(ls, b.shape, (size_t)t->ndim * sizeof *ls);
    assert_memory_equal(lo, b.offset, (size_t)t->ndim * sizeof *lo);
    /* views: a part cut like a dense tensor has a plain layout whose box is the part's (GGUF bytes as [blocks, bytes]) */
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
      if (!l->has_view[p]) continue;
      const dtl_layout *v = &l->view[p];
      int64_t vs[DTL_MAX_TENSOR_DIMS], vo[DTL_MAX_TENSOR_DIMS];
      assert_int_equal(dtl_layout_local_box(v, coord, vs, vo), DTL_OK);
      int vd = 0;
      for (int d = 0; d < b.part[p].ndim; d++, vd++) {
        if (l->g.part[p].map[d].kind == DTL__QMAP_BYTES) {
          int64_t bb = l->g.part[p].map[d].bytes;
          assert_int_equal(vs[vd] * bb, b.part[p].shape[d]);
          assert_int_equal(vo[vd] * bb, b.part[p].offset[d]);
          vd++;
          assert_int_equal(vs[vd], bb);
          assert_int_equal(vo[vd], 0);
        } else {
          if (vs[vd] != b.part[p].shape[d] || vo[vd] != b.part[p].offset[d])
            fail_msg("%s part %d dim %d: view box %lld@%lld, part box %lld@%lld", ts, p, d, (long long)vs[vd],
                     (long long)vo[vd], (long long)b.part[p].shape[d], (long long)b.part[p].offset[d]);
        }
      }
      assert_int_equal(vd, dtl_layout_ndim(v));
      assert_int_equal(dtl_layout_local_count(v) * dtl_dtype_size(b.part[p].dtype), b.part[p].bytes);
    }
    /* the shard: every part sliced by its box */
    dtl_qbuf q = {{NULL}};
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
      if (b.part[p].ndim < 0) continue;
      assert_int_equal(b.part[p].dtype, t->pdtype[p]);
      assert_memory_equal(b.part[p].global_shape, t->pshape[p], (size_t)b.part[p].ndim * sizeof(int64_t));
      q.part[p] = malloc(b.part[p].bytes + 1);
      qt_slice(t->part[p], b.part[p].ndim, t->pshape[p], dtl_dtype_size(t->pdtype[p]), b.part[p].shape, b.part[p].offset,
               q.part[p]);
    }
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)b.shape[d];
    float *out = malloc(n * sizeof *out + 4), *want = malloc(n * sizeof *want + 4);
    st = dtl_quant_dequantize(l, &q, out);
    if (st != DTL_OK) fail_msg("%s: shard dequantize: %s", ts, dtl_last_error());
    qt_slice(dense, t->ndim, t->shape, sizeof(float), b.shape, b.offset, want);
    for (size_t i = 0; n && memcmp(out, want, n * 4) && i < n; i++) /* one compare; element by element to report */
      if (memcmp(&out[i], &want[i], 4)) {
        char lay[256];
        dtl_qlayout_format(l, lay, sizeof lay);
        fail_msg("%s at coord [%d, %d]: local element %zu = %a, the dense slice has %a", lay, coord[0],
                 mnd > 1 ? coord[1] : 0, i, (double)out[i], (double)want[i]);
      }
    ty->shards++;
    /* a random tile of the shard, through the kernel interface the layers use */
    int nd = t->ndim;
    int64_t R = nd >= 2 ? b.shape[nd - 2] : 1, C = b.shape[nd - 1], mats = n && R && C ? (int64_t)n / (R * C) : 0;
    if (mats > 0) {
      dtl__qshard s;
      dtl__qshard_init(&s, &l->g, b.shape, b.offset, (const void *const *)q.part);
      int64_t mat = qt_below(r, mats), r0 = qt_below(r, R), c0 = qt_below(r, C);
      int64_t nr = 1 + qt_below(r, R - r0), nc = 1 + qt_below(r, C - c0), ldo = nc + qt_below(r, 3);
      float *tile = malloc((size_t)(nr * ldo) * sizeof *tile);
      dtl__qshard_dequant_tile(&s, mat, r0, nr, c0, nc, tile, ldo);
      for (int64_t i = 0; i < nr; i++)
        if (memcmp(&tile[i * ldo], &out[(mat * R + r0 + i) * C + c0], (size_t)nc * 4))
          for (int64_t c = 0; c < nc; c++) {
            float x = tile[i * ldo + c], y = out[(mat * R + r0 + i) * C + c0 + c];
            if (memcmp(&x, &y, 4))
              fail_msg("%s: tile [%lld+%lld, %lld+%lld] of matrix %lld differs at [%lld, %lld]", ts, (long long)r0,
                       (long long)nr, (long long)c0, (long long)nc, (long long)mat, (long long)i, (long long)c);
          }
      free(tile);
      ty->tiles++;
    }
    free(out);
    free(want);
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(q.part[p]);
    dtl_qlayout_destroy(l);
    dtl_mesh_destroy(m);
  } while (next_coord(mnd, mshape, coord));
}

static dtl_placement random_placement(qt_rng *r, int ndim) {
  int64_t v = qt_below(r, ndim + 3);
  if (v == 0) return dtl_replicate();
  if (v >= ndim + 1) return dtl_shard(ndim - 1 - (int)(v - ndim - 1)); /* the matrix dims twice as often */
  return dtl_shard((int)(v - 1));
}

static void every_shard_dequantizes_to_the_slice_of_the_dense_result_on_meshes_of_1_to_8(void **state) {
  qt_rng r = {0x5eed0002};
  for (int k = 0; k < DTL_QUANT_NUM_KINDS; k++) {
    tally ty = {0};
    for (int n = 0; n < TENSORS_PER_KIND; n++) {
      qt_tensor t;
      next_tensor(&r, (dtl_quant_kind)k, &t);
      float *dense = dense_dequantize(&t);
      for (int mi = 0; mi < NMESHES; mi++)
        for (int pi = 0; pi < PLACEMENTS_PER_MESH; pi++) {
          dtl_placement pl[2];
          for (int md = 0; md < meshes[mi][0]; md++) pl[md] = random_placement(&r, t.ndim);
          check_layout(&r, &t, dense, meshes[mi][0], &meshes[mi][1], pl, &ty);
        }
      free(dense);
      qt_tensor_free(&t);
    }
    print_message("%-12s %4ld layouts accepted, %4ld refused, %5ld shards and %5ld tiles equal the dense slice\n",
                  dtl_quant_kind_name((dtl_quant_kind)k), ty.accepted, ty.refused, ty.shards, ty.tiles);
    assert_true(ty.shards > 0);
    if (k == DTL_QUANT_GPTQ || k == DTL_QUANT_AWQ || k >= DTL_QUANT_GGUF_Q8_0) assert_true(ty.refused > 0);
  }
}

/* The kernels on any logical box, aligned to the packing or not: the part boxes dtl__qgeom_part_box gives (the units
 * and blocks the box touches) hold every code and scale its elements need. */
static void any_logical_box_dequantizes_from_the_part_boxes_it_touches(void **state) {
  qt_rng r = {0x5eed0003};
  for (int k = 0; k < DTL_QUANT_NUM_KINDS; k++)
    for (int n = 0; n < 3 * TENSORS_PER_KIND; n++) {
      qt_tensor t;
      next_tensor(&r, (dtl_quant_kind)k, &t);
      float *dense = dense_dequantize(&t);
      dtl__qgeom g;
      assert_int_equal(dtl__qgeom_init("test", &t.fmt, t.ndim, t.shape, &g), DTL_OK);
      int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS];
      for (int d = 0; d < t.ndim; d++) {
        bo[d] = t.shape[d] ? qt_below(&r, t.shape[d]) : 0;
        bs[d] = t.shape[d] ? 1 + qt_below(&r, t.shape[d] - bo[d]) : 0;
      }
      const void *parts[DTL_QUANT_NUM_PARTS] = {NULL};
      void *own[DTL_QUANT_NUM_PARTS] = {NULL};
      for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
        if (g.part[p].ndim < 0) continue;
        int64_t ps[DTL_MAX_TENSOR_DIMS], po[DTL_MAX_TENSOR_DIMS];
        dtl__qgeom_part_box(&g, p, bs, bo, ps, po);
        size_t es = dtl_dtype_size(g.part[p].dtype);
        own[p] = malloc((size_t)dtl__qbox_count(g.part[p].ndim, ps) * es + 1);
        qt_slice(t.part[p], g.part[p].ndim, g.part[p].shape, es, ps, po, own[p]);
        parts[p] = own[p];
      }
      dtl__qshard s;
      dtl__qshard_init(&s, &g, bs, bo, parts);
      assert_int_equal(dtl__qshard_check("test", &s), DTL_OK);
      int nd = t.ndim;
      int64_t R = nd >= 2 ? bs[nd - 2] : 1, C = bs[nd - 1], mats = nd > 2 ? bs[0] : 1;
      size_t cnt = (size_t)(mats * R * C);
      float *out = malloc(cnt * 4 + 4), *want = malloc(cnt * 4 + 4);
      for (int64_t m = 0; m < mats; m++) dtl__qshard_dequant_tile(&s, m, 0, R, 0, C, out + m * R * C, C);
      qt_slice(dense, nd, t.shape, 4, bs, bo, want);
      if (memcmp(out, want, cnt * 4)) {
        char ts[160];
        tensor_text(&t, ts, sizeof ts);
        fail_msg("%s: the box at [%lld, %lld] of [%lld, %lld] differs from the dense slice", ts, (long long)bo[nd - 1],
                 (long long)(nd >= 2 ? bo[nd - 2] : 0), (long long)bs[nd - 1], (long long)(nd >= 2 ? bs[nd - 2] : 1));
      }
      free(out);
      free(want);
      for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(own[p]);
      free(dense);
      qt_tensor_free(&t);
    }
}

/* int4 tensors larger than the kernels' gather blocks (GPTQ: 16 rows x 512 channels, AWQ: 128 rows x 256 channels),
 * at unaligned tiles: every element still equals the definition. */
static void int4_tensors_larger_than_a_gather_block_equal_the_definition_at_any_tile(void **state) {
  qt_rng r = {0x5eed0004};
  const struct {
    dtl_quant_kind kind;
    int64_t group, R, C;
    uint64_t flags;
  } cases[] = {{DTL_QUANT_GPTQ, 128, 40, 1160, 0},
               {DTL_QUANT_GPTQ, 32, 24, 1048, DTL_QFMT_ACT_ORDER},
               {DTL_QUANT_AWQ, 128, 272, 600, 0},
               {DTL_QUANT_AWQ, -1, 136, 260, 0},
               /* odd groups start runs mid-byte; act order over 350 groups spans more than a row's group tables */
               {DTL_QUANT_GPTQ, 5, 40, 1160, 0},
               {DTL_QUANT_GPTQ, 3, 24, 1048, DTL_QFMT_ACT_ORDER},
               {DTL_QUANT_AWQ, 5, 136, 260, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    dtl_quant_format f = {.kind = cases[i].kind, .mask = DTL_QFMT_GROUP, .group = cases[i].group, .flags = cases[i].flags};
    int64_t shape[2] = {cases[i].R, cases[i].C};
    qt_tensor t;
    assert_int_equal(qt_tensor_random(&r, &f, 2, shape, &t), 0);
    dtl__qgeom g;
    assert_int_equal(dtl__qgeom_init("test", &t.fmt, 2, shape, &g), DTL_OK);
    dtl__qshard s;
    dtl__qshard_init(&s, &g, shape, (int64_t[]){0, 0}, (const void *const *)t.part);
    for (int n = 0; n < 6; n++) {
      int64_t r0 = n ? qt_below(&r, shape[0]) : 0, c0 = n ? qt_below(&r, shape[1]) : 0;
      int64_t nr = n ? 1 + qt_below(&r, shape[0] - r0) : shape[0], nc = n ? 1 + qt_below(&r, shape[1] - c0) : shape[1];
      float *tile = malloc((size_t)(nr * nc) * sizeof *tile);
      dtl__qshard_dequant_tile(&s, 0, r0, nr, c0, nc, tile, nc);
      for (int64_t a = 0; a < nr; a++)
        for (int64_t b = 0; b < nc; b++) {
          float want = qt_ref_value(&t, 0, r0 + a, c0 + b);
          if (memcmp(&want, &tile[a * nc + b], 4))
            fail_msg("case %zu: element [%lld, %lld] = %a, the definition gives %a", i, (long long)(r0 + a),
                     (long long)(c0 + b), (double)tile[a * nc + b], (double)want);
        }
      free(tile);
    }
    qt_tensor_free(&t);
  }
}

/* The worked cases of the issue: FP8 128-blocks over TP 8 on 512 columns (64 each, the boundary block on both
 * sides) and DeepSeek-R1's 18432 over TP 32 (576 each, 4.5 blocks). */
static void fp8_blocks_split_by_a_cut_go_to_both_sides(void **state) {
  const struct {
    int64_t rows, cols;
    int tp, sdim;
  } cases[] = {{256, 512, 8, 1}, {64, 18432, 32, 1}, {18432, 64, 32, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    dtl_quant_format f = {.kind = DTL_QUANT_FP8_BLOCK};
    for (int c = 0; c < cases[i].tp; c++) {
      dtl_mesh *m;
      assert_int_equal(dtl_mesh_create_abstract(1, (int[]){cases[i].tp}, (int[]){c}, &m), DTL_OK);
      dtl_qlayout *l;
      assert_int_equal(dtl_qlayout_create(m, &f, 2, (int64_t[]){cases[i].rows, cases[i].cols},
                                          (dtl_placement[]){dtl_shard(cases[i].sdim)}, &l),
                       DTL_OK);
      dtl_qbox b;
      assert_int_equal(dtl_qlayout_local_boxes(l, NULL, &b), DTL_OK);
      int d = cases[i].sdim;
      int64_t lo = b.offset[d], hi = lo + b.shape[d];
      assert_int_equal(b.part[DTL_QPART_SCALES].offset[d], lo / 128);
      assert_int_equal(b.part[DTL_QPART_SCALES].shape[d], (hi + 127) / 128 - lo / 128);
      assert_int_equal(b.part[DTL_QPART_SCALES].shape[1 - d], ((d ? cases[i].rows : cases[i].cols) + 127) / 128);
      dtl_qlayout_destroy(l);
      dtl_mesh_destroy(m);
    }
  }
}

#if DTL_HAVE_NCCL
/* The CUDA tile's element code, run on the host, equals the host tile bit for bit: every format, random tensors,
 * shards and tiles (the GPU run of the same kernel is tests/quant/gpu_quant_dequant.c). */
static void the_device_tiles_code_equals_the_host_tile_for_every_format(void **state) {
  qt_rng r = {0x5eed0005};
  for (int k = 0; k < DTL_QUANT_NUM_KINDS; k++)
    for (int n = 0; n < 2 * TENSORS_PER_KIND; n++) {
      qt_tensor t;
      next_tensor(&r, (dtl_quant_kind)k, &t);
      dtl__qgeom g;
      assert_int_equal(dtl__qgeom_init("test", &t.fmt, t.ndim, t.shape, &g), DTL_OK);
      dtl__qshard s;
      int64_t zero[DTL_MAX_TENSOR_DIMS] = {0};
      dtl__qshard_init(&s, &g, t.shape, zero, (const void *const *)t.part);
      int nd = t.ndim;
      int64_t R = nd >= 2 ? t.shape[nd - 2] : 1, C = t.shape[nd - 1], mats = nd > 2 ? t.shape[0] : 1;
      if (!R || !C || !mats) {
        qt_tensor_free(&t);
        continue;
      }
      int64_t mat = qt_below(&r, mats), r0 = qt_below(&r, R), c0 = qt_below(&r, C);
      int64_t nr = 1 + qt_below(&r, R - r0), nc = 1 + qt_below(&r, C - c0);
      float *a = malloc((size_t)(nr * nc) * 4), *b = malloc((size_t)(nr * nc) * 4);
      dtl__qshard_dequant_tile(&s, mat, r0, nr, c0, nc, a, nc);
      dtl__qshard_dequant_tile_emulate(&s, mat, r0, nr, c0, nc, b, nc);
      if (memcmp(a, b, (size_t)(nr * nc) * 4)) {
        char ts[160];
        tensor_text(&t, ts, sizeof ts);
        fail_msg("%s: the device code differs from the host tile", ts);
      }
      free(a);
      free(b);
      qt_tensor_free(&t);
    }
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(dense_dequantization_equals_the_formats_definition_for_every_format),
      cmocka_unit_test(every_shard_dequantizes_to_the_slice_of_the_dense_result_on_meshes_of_1_to_8),
      cmocka_unit_test(any_logical_box_dequantizes_from_the_part_boxes_it_touches),
      cmocka_unit_test(int4_tensors_larger_than_a_gather_block_equal_the_definition_at_any_tile),
      cmocka_unit_test(fp8_blocks_split_by_a_cut_go_to_both_sides),
#if DTL_HAVE_NCCL
      cmocka_unit_test(the_device_tiles_code_equals_the_host_tile_for_every_format),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized tensors read from safetensors files (dtl_safetensors_qread and _hf) on one process: for every format
 * (FP8 block, channel and tensor scales, GPTQ with and without act-order, AWQ; matrices and stacked experts), every
 * coordinate of 1-D meshes of 1..4 ranks and a 2 x 2 mesh, and every placement the format can be cut by, each
 * part's local bytes are the slice of the dense part that the layout's box names, byte for byte, and nothing past
 * them is written; again with a window of a few bytes. Act-order row parallelism cuts the codes and g_idx and keeps
 * every group's scales and zeros. Bad files and arguments (dtypes, shapes, NaN and infinite scales, g_idx out of
 * range, truncated files, lying headers, names) are refused naming the tensor and the numbers, with nothing
 * written. The files are written by hand (tests/common/qst_file.h), the parts' shapes computed there. */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>
#include <cmocka.h>
#include "checkpoint/checkpoint_internal.h"
#include "qst_file.h"

static char dir[64], path[256], bad_path[256];

#define FILL 0xA5 /* the caller's buffers before a read: a failed read must leave every byte of it */

typedef struct {
  const char *prefix;
  dtl_quant_format fmt;
  int ndim;
  int64_t shape[3];
} spec;

#define F8B(br, bc) {.kind = DTL_QUANT_FP8_BLOCK, .mask = DTL_QFMT_BLOCK, .block_rows = (br), .block_cols = (bc)}
static const spec specs[] = {
    {"fp8b", {.kind = DTL_QUANT_FP8_BLOCK}, 2, {300, 500}},
    {"fp8b_small",
     {.kind = DTL_QUANT_FP8_BLOCK,
      .mask = DTL_QFMT_BLOCK | DTL_QFMT_CODE_DTYPE | DTL_QFMT_SCALE_DTYPE,
      .block_rows = 4,
      .block_cols = 8,
      .code_dtype = DTL_FLOAT8_E5M2,
      .scale_dtype = DTL_BFLOAT16},
     2,
     {22, 41}},
    {"fp8c", {.kind = DTL_QUANT_FP8_CHANNEL}, 2, {30, 21}},
    {"fp8t", {.kind = DTL_QUANT_FP8_TENSOR}, 2, {30, 21}},
    {"gptq", {.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_GROUP, .group = 32}, 2, {64, 96}},
    {"gptq_act", {.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_GROUP, .flags = DTL_QFMT_ACT_ORDER, .group = 32}, 2, {64, 96}},
    {"gptq_g1", {.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_GROUP, .group = -1}, 2, {32, 64}},
    {"awq", {.kind = DTL_QUANT_AWQ, .mask = DTL_QFMT_GROUP, .group = 16}, 2, {64, 48}},
    {"experts_fp8b", F8B(4, 8), 3, {5, 22, 40}},
    {"experts_fp8t", {.kind = DTL_QUANT_FP8_TENSOR}, 3, {5, 6, 4}},
    {"experts_gptq_act", {.kind = DTL_QUANT_GPTQ, .mask = DTL_QFMT_GROUP, .flags = DTL_QFMT_ACT_ORDER, .group = 16}, 3,
     {3, 32, 64}},
};
#define NSPECS (sizeof specs / sizeof *specs)
static qst_qtensor dense[NSPECS];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/dtl_qckpt_XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(path, sizeof path, "%s/q.safetensors", dir);
  snprintf(bad_path, sizeof bad_path, "%s/bad.safetensors", dir);
  qst_tensor t[64];
  int n = 0;
  for (size_t i = 0; i < NSPECS; i++) {
    if (!qst_make(&dense[i], &specs[i].fmt, specs[i].ndim, specs[i].shape, specs[i].prefix, (unsigned)i + 1)) return -1;
    n = qst_add(t, n, &dense[i]);
  }
  return qst_write(path, t, n) ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  for (size_t i = 0; i < NSPECS; i++) qst_free(&dense[i]);
  unlink(path);
  unlink(bad_path);
  rmdir(dir);
  return 0;
}

/* Buffers for each part of l's local boxes, filled with FILL, one byte more than the box (a sentinel). */
typedef struct {
  dtl_qbox box;
  dtl_qbuf buf;
} local;
static void local_alloc(local *x, const dtl_qlayout *l) {
  assert_int_equal(dtl_qlayout_local_boxes(l, NULL, &x->box), DTL_OK);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    x->buf.part[p] = NULL;
    if (x->box.part[p].ndim < 0) continue;
    x->buf.part[p] = malloc(x->box.part[p].bytes + 1);
    memset(x->buf.part[p], FILL, x->box.part[p].bytes + 1);
  }
}
static void local_free(local *x) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(x->buf.part[p]);
}
static bool local_untouched(const local *x) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    for (size_t i = 0; x->buf.part[p] && i <= x->box.part[p].bytes; i++)
      if (((unsigned char *)x->buf.part[p])[i] != FILL) return false;
  return true;
}

/* Every part of x is the slice of q's dense part by its box, and the byte after it is untouched. */
static void check_local(const local *x, const qst_qtensor *q, const char *what) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    const dtl_qpart_box *b = &x->box.part[p];
    if (q->part[p].ndim < 0) {
      if (b->ndim >= 0) fail_msg("%s: the layout has a part %d the format's table lacks", what, p);
      continue;
    }
    if (b->ndim != q->part[p].ndim || memcmp(b->global_shape, q->part[p].shape, (size_t)b->ndim * 8))
      fail_msg("%s: part %d's global shape differs from the format's table", what, p);
    unsigned char *want = malloc(b->bytes + 1);
    qst_slice(q->data[p], q->es[p], b->ndim, b->global_shape, b->offset, b->shape, want);
    if (memcmp(x->buf.part[p], want, b->bytes)) fail_msg("%s: part %d differs from the dense part's slice", what, p);
    if (((unsigned char *)x->buf.part[p])[b->bytes] != FILL) fail_msg("%s: part %d written past its box", what, p);
    free(want);
  }
}

static const char *const placements_2d[] = {"S(0)", "S(1)", "R"};
static const char *const placements_3d[] = {"S(0)", "S(1)", "S(2)", "R"};
static const char *const placements_22[] = {"S(0),S(1)", "S(1),S(0)", "R,S(1)", "S(0),R"};

/* Reads spec i at every coordinate of a mesh of the given shape for each placement; returns the reads made (the
 * layouts that cut a packing unit are refused by dtl_qlayout_create, and skipped). */
static int read_everywhere(dtl_safetensors *f, size_t i, int mdims, const int *mshape, const char *const *pls, int npl,
                           bool hf) {
  const spec *s = &specs[i];
  int reads = 0, size = 1;
  for (int d = 0; d < mdims; d++) size *= mshape[d];
  for (int pi = 0; pi < npl; pi++)
    for (int r = 0; r < size; r++) {
      int coord[2] = {mdims == 2 ? r / mshape[1] : r, mdims == 2 ? r % mshape[1] : 0};
      dtl_mesh *m;
      assert_int_equal(dtl_mesh_create_abstract(mdims, mshape, coord, &m), DTL_OK);
      dtl_placement pl[2];
      int n;
      assert_int_equal(dtl_placements_parse(pls[pi], pl, mdims, &n), DTL_OK);
      dtl_qlayout *l;
      dtl_status st = dtl_qlayout_create(m, &s->fmt, s->ndim, s->shape, pl, &l);
      if (st != DTL_OK) {
        if (st != DTL_ERR_INVALID_ARGUMENT || !strstr(dtl_last_error(), "packing unit"))
          fail_msg("%s %s: %s", s->prefix, pls[pi], dtl_last_error());
        dtl_mesh_destroy(m);
        continue;
      }
      local x;
      local_alloc(&x, l);
      const char *names[DTL_QUANT_NUM_PARTS];
      qst_names(&dense[i], names);
      st = hf ? dtl_safetensors_qread_hf(f, s->prefix, l, &x.buf) : dtl_safetensors_qread(f, names, l, &x.buf);
      if (st != DTL_OK) fail_msg("%s %s coord %d: %s", s->prefix, pls[pi], r, dtl_last_error());
      char what[128];
      snprintf(what, sizeof what, "%s as %s on %d ranks, coordinate %d", s->prefix, pls[pi], size, r);
      check_local(&x, &dense[i], what);
      local_free(&x);
      dtl_qlayout_destroy(l);
      dtl_mesh_destroy(m);
      reads++;
    }
  return reads;
}

static void read_all(size_t window) {
  dtl_safetensors *f;
  assert_int_equal(dtl_safetensors_open(path, &f), DTL_OK);
  f->window = window;
  for (size_t i = 0; i < NSPECS; i++) {
    bool three = specs[i].ndim == 3;
    int reads = 0;
    for (int tp = 1; tp <= 4; tp++)
      reads += read_everywhere(f, i, 1, &tp, three ? placements_3d : placements_2d, three ? 4 : 3, tp % 2 == 0);
    int sq[2] = {2, 2};
    if (!three) reads += read_everywhere(f, i, 2, sq, placements_22, 4, false);
    /* Every format is read at each degree for some cut (the refused cuts are the packed formats' odd degrees). */
    if (reads < (three ? 20 : 25)) fail_msg("%s: only %d reads", specs[i].prefix, reads);
  }
  dtl_safetensors_close(f);
}

static void every_part_of_every_format_reads_the_slice_its_box_names(void **state) {
  (void)state;
  read_all(DTL__ST_WINDOW);
}

static void a_window_of_a_few_bytes_reads_and_checks_the_same_bytes(void **state) {
  (void)state;
  read_all(40);
}

/* A layout of spec i on an abstract 1-D mesh of tp ranks at coordinate r. */
static dtl_qlayout *layout_at(size_t i, int tp, int r, const char *placement, dtl_mesh **m) {
  assert_int_equal(dtl_mesh_create_abstract(1, &tp, &r, m), DTL_OK);
  dtl_placement pl[3];
  int n;
  assert_int_equal(dtl_placements_parse(placement, pl, 1, &n), DTL_OK);
  dtl_qlayout *l;
  assert_int_equal(dtl_qlayout_create(*m, &specs[i].fmt, specs[i].ndim, specs[i].shape, pl, &l), DTL_OK);
  return l;
}
static size_t spec_index(const char *prefix) {
  for (size_t i = 0; i < NSPECS; i++)
    if (!strcmp(specs[i].prefix, prefix)) return i;
  fail_msg("no spec %s", prefix);
  return 0;
}

#define BOX_IS(b, o0, s0, o1, s1)                                                                                 \
  do {                                                                                                            \
    assert_int_equal((b).offset[0], (o0));                                                                        \
    assert_int_equal((b).shape[0], (s0));                                                                         \
    assert_int_equal((b).offset[1], (o1));                                                                        \
    assert_int_equal((b).shape[1], (s1));                                                                         \
  } while (0)

/* GPTQ [64 out, 96 in], group 32 (3 groups), row-parallel over 4 ranks: input channels 24r..24r+23. With act-order
 * any channel may use any group, so each rank reads every group's scales and zeros whole, and only the codes (3 int32
 * rows of 8 channels) and the g_idx of its channels; without, the groups its channels fall in (rank 1: 24..47 ->
 * groups 0 and 1). */
static void act_order_row_parallel_cuts_codes_and_g_idx_and_keeps_every_groups_scales(void **state) {
  (void)state;
  dtl_safetensors *f;
  assert_int_equal(dtl_safetensors_open(path, &f), DTL_OK);
  size_t act = spec_index("gptq_act"), plain = spec_index("gptq");
  for (int r = 0; r < 4; r++) {
    dtl_mesh *m;
    dtl_qlayout *l = layout_at(act, 4, r, "S(1)", &m);
    local x;
    local_alloc(&x, l);
    BOX_IS(x.box.part[DTL_QPART_CODES], 3 * r, 3, 0, 64);
    BOX_IS(x.box.part[DTL_QPART_SCALES], 0, 3, 0, 64);
    BOX_IS(x.box.part[DTL_QPART_ZEROS], 0, 3, 0, 8);
    assert_int_equal(x.box.part[DTL_QPART_GIDX].ndim, 1);
    assert_int_equal(x.box.part[DTL_QPART_GIDX].offset[0], 24 * r);
    assert_int_equal(x.box.part[DTL_QPART_GIDX].shape[0], 24);
    assert_int_equal(dtl_safetensors_qread_hf(f, "gptq_act", l, &x.buf), DTL_OK);
    check_local(&x, &dense[act], "act-order, row-parallel");
    local_free(&x);
    dtl_qlayout_destroy(l);
    dtl_mesh_destroy(m);
    l = layout_at(plain, 4, r, "S(1)", &m);
    local_alloc(&x, l);
    int64_t g0 = 24 * r / 32, g1 = (24 * r + 23) / 32;
    BOX_IS(x.box.part[DTL_QPART_SCALES], g0, g1 - g0 + 1, 0, 64);
    assert_int_equal(x.box.part[DTL_QPART_GIDX].ndim, -1);
    assert_int_equal(dtl_safetensors_qread_hf(f, "gptq", l, &x.buf), DTL_OK);
    check_local(&x, &dense[plain], "group-wise, row-parallel");
    local_free(&x);
    dtl_qlayout_destroy(l);
    dtl_mesh_destroy(m);
  }
  dtl_safetensors_close(f);
}

/* --- bad files ------------------------------------------------------------------------------------------------- */

/* Writes bad_path with spec i's parts, part p replaced by (dtype, ndim, shape, data) when dtype is not NULL. */
static dtl_safetensors *bad_file(size_t i, int p, const char *dtype, int nd, const int64_t *shape, const void *data,
                                 size_t bytes) {
  qst_tensor t[4];
  int n = qst_add(t, 0, &dense[i]);
  for (int k = 0; k < n; k++)
    if (dtype && !strcmp(t[k].name, dense[i].part[p].name)) {
      t[k].dtype = dtype;
      t[k].ndim = nd;
      memcpy(t[k].shape, shape, (size_t)nd * 8);
      t[k].data = data;
      t[k].bytes = bytes;
    }
  assert_true(qst_write(bad_path, t, n));
  dtl_safetensors *f;
  if (dtl_safetensors_open(bad_path, &f) != DTL_OK) fail_msg("open: %s", dtl_last_error());
  return f;
}

/* The read of spec i at coordinate r of tp (placement pl) from f fails with want, its message holds every text,
 * and nothing is written. */
static void read_fails_v(dtl_safetensors *f, size_t i, int tp, int r, const char *pl, dtl_status want,
                         const char *const *texts) {
  dtl_mesh *m;
  dtl_qlayout *l = layout_at(i, tp, r, pl, &m);
  local x;
  local_alloc(&x, l);
  dtl_status st = dtl_safetensors_qread_hf(f, specs[i].prefix, l, &x.buf);
  if (st != want) fail_msg("%s: %s (expected %s): %s", specs[i].prefix, dtl_status_name(st), dtl_status_name(want), dtl_last_error());
  for (; *texts; texts++)
    if (!strstr(dtl_last_error(), *texts)) fail_msg("message '%s' lacks '%s'", dtl_last_error(), *texts);
  if (!local_untouched(&x)) fail_msg("%s: a failed read wrote into the caller's buffers", specs[i].prefix);
  local_free(&x);
  dtl_qlayout_destroy(l);
  dtl_mesh_destroy(m);
}
#define READ_FAILS(f, i, tp, r, pl, ...) \
  read_fails_v((f), (i), (tp), (r), (pl), DTL_ERR_INVALID_ARGUMENT, (const char *const[]){__VA_ARGS__, NULL})

static void wrong_dtypes_name_the_tensor_the_part_and_both_dtypes(void **state) {
  (void)state;
  size_t b = spec_index("fp8b"), g = spec_index("gptq_act");
  const qst_qtensor *qb = &dense[b], *qg = &dense[g];
  dtl_safetensors *f = bad_file(b, DTL_QPART_CODES, "F8_E5M2", 2, qb->part[0].shape, qb->data[0], qb->part[0].bytes);
  READ_FAILS(f, b, 2, 1, "S(0)", "\"fp8b.weight\" (codes", "dtype=F8_E5M2", "expected F8_E4M3");
  dtl_safetensors_close(f);
  f = bad_file(b, DTL_QPART_CODES, "U8", 2, qb->part[0].shape, qb->data[0], qb->part[0].bytes);
  READ_FAILS(f, b, 2, 1, "S(0)", "dtype=U8", "expected F8_E4M3");
  dtl_safetensors_close(f);
  /* f32 scale bytes are f16 pairs: the same bytes, the wrong dtype. */
  int64_t s2[2] = {qb->part[1].shape[0], qb->part[1].shape[1] * 2};
  f = bad_file(b, DTL_QPART_SCALES, "F16", 2, s2, qb->data[1], qb->part[1].bytes);
  READ_FAILS(f, b, 1, 0, "R", "\"fp8b.weight_scale_inv\" (scales", "dtype=F16", "expected F32");
  dtl_safetensors_close(f);
  f = bad_file(g, DTL_QPART_GIDX, "I64", 1, (int64_t[]){48}, qg->data[3], qg->part[3].bytes);
  READ_FAILS(f, g, 2, 0, "S(1)", "\"gptq_act.g_idx\" (g_idx", "dtype=I64", "expected I32");
  dtl_safetensors_close(f);
}

static void shapes_that_do_not_match_the_format_name_the_dim_and_the_numbers(void **state) {
  (void)state;
  size_t b = spec_index("fp8b"), g = spec_index("gptq"), t = spec_index("fp8t"), c = spec_index("fp8c");
  const qst_qtensor *qb = &dense[b], *qg = &dense[g];
  /* Codes [300, 500] stored as [500, 300]. */
  dtl_safetensors *f = bad_file(b, 0, "F8_E4M3", 2, (int64_t[]){500, 300}, qb->data[0], qb->part[0].bytes);
  READ_FAILS(f, b, 2, 0, "S(0)", "\"fp8b.weight\" (codes of fp8-block(128x128,f8e4m3)[300,500])", "shape=[500,300]",
             "expected [300,500]", "dim 0 is 500");
  dtl_safetensors_close(f);
  /* Scales of 128 x 128 blocks over [300, 500] are [3, 4]; [3, 3] (blocks of 167 columns?) is refused. */
  f = bad_file(b, 1, "F32", 2, (int64_t[]){4, 3}, qb->data[1], 4 * 12);
  READ_FAILS(f, b, 2, 1, "S(1)", "shape=[4,3]", "expected [3,4]", "dim 0 is 4, expected ceil(300 / 128) = 3 (blocks of the tensor's dim 0)");
  dtl_safetensors_close(f);
  f = bad_file(b, 1, "F32", 3, (int64_t[]){3, 2, 2}, qb->data[1], 4 * 12);
  READ_FAILS(f, b, 2, 1, "S(1)", "shape=[3,2,2]", "3 dims, expected 2 (dims of size 1 aside)");
  dtl_safetensors_close(f);
  /* GPTQ zeros [G, R/8] = [3, 8] stored as [3, 64] (unpacked). */
  unsigned char *z = calloc(3 * 64, 4);
  f = bad_file(g, DTL_QPART_ZEROS, "I32", 2, (int64_t[]){3, 64}, z, 3 * 64 * 4);
  READ_FAILS(f, g, 2, 0, "S(0)", "\"gptq.qzeros\" (zeros", "dim 1 is 64, expected 64 / 8 = 8 (the tensor's dim 0, 8 per int32)");
  dtl_safetensors_close(f);
  /* GPTQ codes [C/8, R] = [12, 64]. */
  f = bad_file(g, DTL_QPART_CODES, "I32", 2, (int64_t[]){12, 48}, qg->data[0], 12 * 48 * 4);
  READ_FAILS(f, g, 2, 0, "S(1)", "\"gptq.qweight\" (codes", "dim 1 is 48, expected 64 (the tensor's dim 0)");
  dtl_safetensors_close(f);
  free(z);
  /* A per-tensor scale is one number: [2] is not it. */
  float two[2] = {1, 1};
  f = bad_file(t, 1, "F32", 1, (int64_t[]){2}, two, 8);
  READ_FAILS(f, t, 2, 0, "S(0)", "\"fp8t.weight_scale\" (scales", "shape=[2]", "expected []");
  dtl_safetensors_close(f);
  /* Channel scales [30, 1]: [30, 2] is not. */
  float *cs = calloc(60, 4);
  for (int k = 0; k < 60; k++) cs[k] = 1;
  f = bad_file(c, 1, "F32", 2, (int64_t[]){30, 2}, cs, 240);
  READ_FAILS(f, c, 3, 2, "S(0)", "dim 1 is 2, expected 1");
  dtl_safetensors_close(f);
  free(cs);
}

static void scales_may_add_or_drop_dims_of_size_one(void **state) {
  (void)state;
  size_t t = spec_index("fp8t"), c = spec_index("fp8c");
  const int64_t one[1] = {1}, three[3] = {30, 1, 1};
  struct {
    size_t i;
    int nd;
    const int64_t *shape;
  } ok[] = {{t, 1, one}, {c, 1, (int64_t[]){30}}, {c, 3, three}};
  for (size_t k = 0; k < sizeof ok / sizeof *ok; k++) {
    const qst_qtensor *q = &dense[ok[k].i];
    dtl_safetensors *f = bad_file(ok[k].i, 1, "F32", ok[k].nd, ok[k].shape, q->data[1], q->part[1].bytes);
    for (int r = 0; r < 2; r++) {
      dtl_mesh *m;
      dtl_qlayout *l = layout_at(ok[k].i, 2, r, "S(0)", &m);
      local x;
      local_alloc(&x, l);
      if (dtl_safetensors_qread_hf(f, specs[ok[k].i].prefix, l, &x.buf) != DTL_OK) fail_msg("%s", dtl_last_error());
      check_local(&x, q, "a scales tensor with other dims of size 1");
      local_free(&x);
      dtl_qlayout_destroy(l);
      dtl_mesh_destroy(m);
    }
    dtl_safetensors_close(f);
  }
}

/* Scales of the bytes a rank reads must be finite; the blocks it does not read are not its concern. */
static void nan_and_infinite_scales_a_rank_reads_are_refused_naming_index_and_value(void **state) {
  (void)state;
  size_t b = spec_index("fp8b"), s = spec_index("fp8b_small"), g = spec_index("gptq");
  /* fp8b: scales [3, 4]; block [1, 2] covers rows 128..255, columns 256..383. */
  const qst_qtensor *qb = &dense[b];
  float *sc = malloc(qb->part[1].bytes);
  memcpy(sc, qb->data[1], qb->part[1].bytes);
  sc[1 * 4 + 2] = NAN;
  dtl_safetensors *f = bad_file(b, 1, "F32", 2, qb->part[1].shape, sc, qb->part[1].bytes);
  READ_FAILS(f, b, 1, 0, "R", "\"fp8b.weight_scale_inv\" (scales): element [1,2] = nan (expected a finite scale)");
  READ_FAILS(f, b, 2, 1, "S(1)", "element [1,2] = nan"); /* columns 250..499 */
  READ_FAILS(f, b, 4, 1, "S(0)", "element [1,2] = nan"); /* rows 75..149: blocks 0 and 1 */
  /* Columns 0..249 touch blocks 0 and 1 only; rows 225..299 block 1 (128..255) and 2. */
  const char *names[DTL_QUANT_NUM_PARTS];
  qst_names(qb, names);
  int cases[][3] = {{2, 0, 1}, {4, 0, 0}};
  for (size_t k = 0; k < 2; k++) {
    dtl_mesh *m;
    dtl_qlayout *l = layout_at(b, cases[k][0], cases[k][1], cases[k][2] ? "S(1)" : "S(0)", &m);
    local x;
    local_alloc(&x, l);
    if (dtl_safetensors_qread(f, names, l, &x.buf) != DTL_OK) fail_msg("%s", dtl_last_error());
    local_free(&x);
    dtl_qlayout_destroy(l);
    dtl_mesh_destroy(m);
  }
  sc[1 * 4 + 2] = -INFINITY;
  dtl_safetensors_close(f);
  f = bad_file(b, 1, "F32", 2, qb->part[1].shape, sc, qb->part[1].bytes);
  READ_FAILS(f, b, 4, 2, "S(0)", "element [1,2] = -inf");
  dtl_safetensors_close(f);
  free(sc);
  /* bf16 and f16 infinities and NaNs. */
  const qst_qtensor *qs = &dense[s], *qg = &dense[g];
  uint16_t *h = malloc(qs->part[1].bytes);
  memcpy(h, qs->data[1], qs->part[1].bytes);
  h[3 * 6 + 5] = dtl_f32_to_bf16(INFINITY); /* scales [6, 6] of 4 x 8 blocks over [22, 41] */
  f = bad_file(s, 1, "BF16", 2, qs->part[1].shape, h, qs->part[1].bytes);
  READ_FAILS(f, s, 3, 2, "S(1)", "\"fp8b_small.weight_scale_inv\" (scales): element [3,5] = inf");
  dtl_safetensors_close(f);
  free(h);
  h = malloc(qg->part[1].bytes);
  memcpy(h, qg->data[1], qg->part[1].bytes);
  h[2 * 64 + 63] = 0x7e00; /* f16 NaN: scales [3, 64], group 2, row 63 */
  f = bad_file(g, 1, "F16", 2, qg->part[1].shape, h, qg->part[1].bytes);
  READ_FAILS(f, g, 4, 3, "S(0)", "\"gptq.scales\" (scales): element [2,63] = nan");
  READ_FAILS(f, g, 4, 3, "S(1)", "element [2,63] = nan"); /* columns 72..95: group 2 */
  dtl_safetensors_close(f);
  free(h);
}

static void g_idx_outside_the_groups_is_refused_naming_index_and_value(void **state) {
  (void)state;
  size_t g = spec_index("gptq_act");
  const qst_qtensor *q = &dense[g];
  int32_t *gi = malloc(q->part[3].bytes);
  memcpy(gi, q->data[3], q->part[3].bytes);
  gi[50] = 3; /* 3 groups: 0..2 */
  dtl_safetensors *f = bad_file(g, 3, "I32", 1, q->part[3].shape, gi, q->part[3].bytes);
  READ_FAILS(f, g, 4, 2, "S(1)", "\"gptq_act.g_idx\" (g_idx): element [50] = 3 (expected a group 0..2)");
  READ_FAILS(f, g, 2, 0, "S(0)", "element [50] = 3"); /* column-parallel: every channel */
  dtl_safetensors_close(f);
  gi[50] = -1;
  f = bad_file(g, 3, "I32", 1, q->part[3].shape, gi, q->part[3].bytes);
  READ_FAILS(f, g, 4, 2, "S(1)", "element [50] = -1");
  dtl_safetensors_close(f);
  free(gi);
}

static void a_file_truncated_after_open_fails_with_nothing_written(void **state) {
  (void)state;
  size_t g = spec_index("gptq_act");
  dtl_safetensors *f = bad_file(g, 0, NULL, 0, NULL, NULL, 0);
  /* The last tensor of the file (g_idx) loses its last bytes; so does every read needing them, before any write. */
  FILE *fp = fopen(bad_path, "rb");
  fseek(fp, 0, SEEK_END);
  long size = ftell(fp);
  fclose(fp);
  assert_int_equal(truncate(bad_path, size - 4), 0);
  READ_FAILS(f, g, 2, 0, "S(0)", "bad.safetensors", "truncated since?");
  /* Even a rank whose g_idx bytes are all there: the file is checked whole for every part. */
  READ_FAILS(f, g, 2, 0, "S(1)", "truncated since?");
  dtl_safetensors_close(f);
}

static void a_header_whose_offsets_pass_the_end_of_the_file_is_refused_at_open(void **state) {
  (void)state;
  size_t b = spec_index("fp8b");
  dtl_safetensors *f = bad_file(b, 0, NULL, 0, NULL, NULL, 0);
  dtl_safetensors_close(f);
  FILE *fp = fopen(bad_path, "rb");
  fseek(fp, 0, SEEK_END);
  long size = ftell(fp);
  fclose(fp);
  assert_int_equal(truncate(bad_path, size - 1), 0);
  dtl_safetensors *sentinel = (dtl_safetensors *)(uintptr_t)0x5eed;
  f = sentinel;
  assert_int_equal(dtl_safetensors_open(bad_path, &f), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "end past the data buffer"));
  assert_ptr_equal(f, sentinel);
}

static void names_and_buffers_are_checked_first(void **state) {
  (void)state;
  dtl_safetensors *f;
  assert_int_equal(dtl_safetensors_open(path, &f), DTL_OK);
  size_t b = spec_index("fp8b"), g = spec_index("gptq_act");
  dtl_mesh *m;
  dtl_qlayout *l = layout_at(b, 2, 1, "S(0)", &m);
  local x;
  local_alloc(&x, l);
  const char *names[DTL_QUANT_NUM_PARTS];
  qst_names(&dense[b], names);
  assert_int_equal(dtl_safetensors_qread(NULL, names, l, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_safetensors_qread(f, NULL, l, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_safetensors_qread(f, names, NULL, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_safetensors_qread(f, names, l, NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "local=NULL"));
  void *keep = x.buf.part[1];
  x.buf.part[1] = NULL;
  assert_int_equal(dtl_safetensors_qread(f, names, l, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "local->part[1]=NULL"));
  x.buf.part[1] = keep;
  names[DTL_QPART_ZEROS] = "fp8b.weight";
  assert_int_equal(dtl_safetensors_qread(f, names, l, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "names[2]=\"fp8b.weight\" (expected NULL: fp8-block has no zeros)"));
  names[DTL_QPART_ZEROS] = NULL;
  names[DTL_QPART_SCALES] = NULL;
  assert_int_equal(dtl_safetensors_qread(f, names, l, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "names[1]=NULL"));
  names[DTL_QPART_SCALES] = "fp8b.nothing";
  assert_int_equal(dtl_safetensors_qread(f, names, l, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "tensor \"fp8b.nothing\" is not in the file"));
  assert_int_equal(dtl_safetensors_qread_hf(f, NULL, l, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_safetensors_qread_hf(f, "nothing", l, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "tensor \"nothing.weight\" is not in the file"));
  char longp[600];
  memset(longp, 'a', sizeof longp - 1);
  longp[sizeof longp - 1] = '\0';
  assert_int_equal(dtl_safetensors_qread_hf(f, longp, l, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "prefix is 599 bytes"));
  assert_true(local_untouched(&x));
  local_free(&x);
  dtl_qlayout_destroy(l);
  /* An act-order GPTQ layout needs its g_idx; a group-wise checkpoint of the same name has none. */
  dtl_qlayout *la;
  dtl_quant_format act = specs[g].fmt;
  assert_int_equal(dtl_qlayout_create(m, &act, 2, specs[g].shape, (dtl_placement[]){dtl_shard(1)}, &la), DTL_OK);
  local_alloc(&x, la);
  assert_int_equal(dtl_safetensors_qread_hf(f, "gptq", la, &x.buf), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "tensor \"gptq.g_idx\" is not in the file"));
  assert_true(local_untouched(&x));
  local_free(&x);
  dtl_qlayout_destroy(la);
  /* GGUF tensors are not stored in safetensors files. */
  dtl_quant_format q8 = {.kind = DTL_QUANT_GGUF_Q8_0};
  assert_int_equal(dtl_qlayout_create(m, &q8, 2, (int64_t[]){4, 64}, (dtl_placement[]){dtl_shard(0)}, &la), DTL_OK);
  local_alloc(&x, la);
  assert_int_equal(dtl_safetensors_qread_hf(f, "q8", la, &x.buf), DTL_ERR_UNSUPPORTED);
  assert_non_null(strstr(dtl_last_error(), "GGUF"));
  const char *q8names[DTL_QUANT_NUM_PARTS] = {"fp8b.weight", NULL, NULL, NULL};
  assert_int_equal(dtl_safetensors_qread(f, q8names, la, &x.buf), DTL_ERR_UNSUPPORTED);
  assert_non_null(strstr(dtl_last_error(), "GGUF"));
  assert_true(local_untouched(&x));
  local_free(&x);
  dtl_qlayout_destroy(la);
  dtl_mesh_destroy(m);
  dtl_safetensors_close(f);
}

/* DeepSeek-V3 and Qwen3-FP8 name the block scales weight_scale_inv, compressed-tensors weight_scale. */
static void fp8_block_scales_are_found_as_weight_scale_inv_or_weight_scale(void **state) {
  (void)state;
  size_t b = spec_index("fp8b_small");
  qst_tensor t[2];
  int n = qst_add(t, 0, &dense[b]);
  assert_int_equal(n, 2);
  snprintf(t[1].name, sizeof t[1].name, "fp8b_small.weight_scale");
  assert_true(qst_write(bad_path, t, n));
  dtl_safetensors *f;
  assert_int_equal(dtl_safetensors_open(bad_path, &f), DTL_OK);
  dtl_mesh *m;
  dtl_qlayout *l = layout_at(b, 3, 1, "S(1)", &m);
  local x;
  local_alloc(&x, l);
  if (dtl_safetensors_qread_hf(f, "fp8b_small", l, &x.buf) != DTL_OK) fail_msg("%s", dtl_last_error());
  check_local(&x, &dense[b], "weight_scale for block scales");
  local_free(&x);
  dtl_qlayout_destroy(l);
  dtl_mesh_destroy(m);
  dtl_safetensors_close(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_part_of_every_format_reads_the_slice_its_box_names),
      cmocka_unit_test(a_window_of_a_few_bytes_reads_and_checks_the_same_bytes),
      cmocka_unit_test(act_order_row_parallel_cuts_codes_and_g_idx_and_keeps_every_groups_scales),
      cmocka_unit_test(fp8_block_scales_are_found_as_weight_scale_inv_or_weight_scale),
      cmocka_unit_test(scales_may_add_or_drop_dims_of_size_one),
      cmocka_unit_test(wrong_dtypes_name_the_tensor_the_part_and_both_dtypes),
      cmocka_unit_test(shapes_that_do_not_match_the_format_name_the_dim_and_the_numbers),
      cmocka_unit_test(nan_and_infinite_scales_a_rank_reads_are_refused_naming_index_and_value),
      cmocka_unit_test(g_idx_outside_the_groups_is_refused_naming_index_and_value),
      cmocka_unit_test(a_file_truncated_after_open_fails_with_nothing_written),
      cmocka_unit_test(a_header_whose_offsets_pass_the_end_of_the_file_is_refused_at_open),
      cmocka_unit_test(names_and_buffers_are_checked_first),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized redistribution (dtl_qplan, dtl_qredistribute) against the dense oracle: every part of a quantized tensor
 * (codes as raw bytes, finite scales, zeros and g_idx as raw ints) is a deterministic function of its global index;
 * each rank's source parts are their slices at its source boxes (dtl_qlayout_local_boxes), and after the plan each
 * rank's target parts must equal the slices at its target boxes, byte for byte. Random pairs of placements (S and R on
 * 1-D and 2-D meshes, uneven sizes) over FP8 blocks of 128 and of odd sizes, GPTQ and AWQ groups of 32 and 128,
 * act-order GPTQ, GGUF Q8_0, Q4_0 and Q4_K, FP8 per channel and per tensor; the same between two meshes of one parent;
 * the bytes on the wire against the owner rule (a scale block comes from the one source rank that holds its first
 * element); no allocation in an execution; explain; bad input, and one rank's bad buffer under DTL_CHECK failing every
 * rank with no target written. */
#include "common/alloc.h"
#include "dtl_test_ranks.h"

static dtl_comm *world, *checked;
static dtl_mesh *line, *square, *line_checked; /* 1-D over every rank; 2x2 at 4 ranks; 1-D with DTL_CHECK on */

static const char *const part_name[DTL_QUANT_NUM_PARTS] = {"codes", "scales", "zeros", "g_idx"};

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Element i (global, row-major) of part p: scales finite in their dtype, every other part raw bits. */
static void element(int p, dtl_dtype t, uint64_t i, unsigned char *out) {
  uint64_t h = mix(i * DTL_QUANT_NUM_PARTS + (uint64_t)p);
  if (p == DTL_QPART_SCALES && t == DTL_FLOAT32) {
    float f = (float)(h % 20000) / 64.0f + 0.5f;
    memcpy(out, &f, 4);
  } else if (p == DTL_QPART_SCALES) { /* f16: exponent field 8..23; bf16: values near 0.01 to 2 */
    uint16_t v = t == DTL_FLOAT16 ? (uint16_t)(0x2000 + h % 0x4000) : (uint16_t)(0x3c00 + h % 0x0400);
    memcpy(out, &v, 2);
  } else {
    memcpy(out, &h, dtl_dtype_size(t));
  }
}

/* The global index of element k of box b (row-major within it). */
static uint64_t global_index(const dtl_qpart_box *b, uint64_t k) {
  int64_t idx[DTL_MAX_TENSOR_DIMS];
  for (int d = b->ndim - 1; d >= 0; d--) {
    idx[d] = (int64_t)(k % (uint64_t)b->shape[d]);
    k /= (uint64_t)b->shape[d];
  }
  uint64_t g = 0;
  for (int d = 0; d < b->ndim; d++) g = g * (uint64_t)b->global_shape[d] + (uint64_t)(idx[d] + b->offset[d]);
  return g;
}

static uint64_t box_count(const dtl_qpart_box *b) {
  uint64_t n = 1;
  for (int d = 0; d < b->ndim; d++) n *= (uint64_t)b->shape[d];
  return n;
}

/* This rank's parts of l: buffers of their local bytes (NULL for a part the format lacks or a rank outside the mesh),
 * the slices of the dense parts (fill) or a sentinel. */
static void alloc_parts(const dtl_qlayout *l, bool fill, dtl_qbuf *buf) {
  dtl_qbox b;
  CHECK_OK(dtl_qlayout_local_boxes(l, NULL, &b));
  bool member = dtl_mesh_is_member(dtl_qlayout_mesh(l));
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    buf->part[p] = NULL;
    if (b.part[p].ndim < 0 || !member) continue;
    size_t es = dtl_dtype_size(b.part[p].dtype);
    unsigned char *x = malloc(b.part[p].bytes + 1); /* + 1: a part may be empty */
    for (uint64_t k = 0; k < box_count(&b.part[p]); k++)
      if (fill) element(p, b.part[p].dtype, global_index(&b.part[p], k), x + k * es);
      else memset(x + k * es, 0xa5, es);
    buf->part[p] = x;
  }
}

static void free_parts(dtl_qbuf *buf) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(buf->part[p]);
}

/* Whether every part of buf is the slice of the dense part at this rank's boxes of l; reports the first difference. */
static bool parts_match(const char *what, const dtl_qlayout *l, const dtl_qbuf *buf) {
  dtl_qbox b;
  CHECK_OK(dtl_qlayout_local_boxes(l, NULL, &b));
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    if (!buf->part[p]) continue;
    size_t es = dtl_dtype_size(b.part[p].dtype);
    unsigned char want[8];
    for (uint64_t k = 0; k < box_count(&b.part[p]); k++) {
      uint64_t g = global_index(&b.part[p], k);
      element(p, b.part[p].dtype, g, want);
      if (memcmp(want, (unsigned char *)buf->part[p] + k * es, es)) {
        CHECK(false, "%s: %s element %llu (global %llu) differs", what, part_name[p], (unsigned long long)k,
              (unsigned long long)g);
        return false;
      }
    }
  }
  return true;
}

/* --- the cases --------------------------------------------------------------------------------------------- */

typedef struct {
  const char *name;
  dtl_quant_format f;
  int nd;
  int64_t shape[3];
} fcase;

#define FMT(k) {.kind = (k)}
static const fcase formats[] = {
    {"fp8-block 128, uneven blocks", FMT(DTL_QUANT_FP8_BLOCK), 2, {300, 260}},
    {"fp8-block 48x32", {.mask = DTL_QFMT_BLOCK, .kind = DTL_QUANT_FP8_BLOCK, .block_rows = 48, .block_cols = 32}, 2,
     {100, 97}},
    {"fp8-block 16, experts", {.mask = DTL_QFMT_BLOCK, .kind = DTL_QUANT_FP8_BLOCK, .block_rows = 16, .block_cols = 16},
     3, {3, 40, 50}},
    {"fp8-block e5m2 bf16 scales",
     {.mask = DTL_QFMT_CODE_DTYPE | DTL_QFMT_SCALE_DTYPE, .kind = DTL_QUANT_FP8_BLOCK, .code_dtype = DTL_FLOAT8_E5M2,
      .scale_dtype = DTL_BFLOAT16},
     2, {200, 140}},
    {"fp8-channel", FMT(DTL_QUANT_FP8_CHANNEL), 2, {70, 30}},
    {"fp8-tensor, experts", FMT(DTL_QUANT_FP8_TENSOR), 3, {3, 20, 30}},
    {"fp8-tensor", FMT(DTL_QUANT_FP8_TENSOR), 2, {20, 30}},
    {"gptq g32", {.mask = DTL_QFMT_GROUP, .kind = DTL_QUANT_GPTQ, .group = 32}, 2, {96, 96}},
    {"gptq g128", FMT(DTL_QUANT_GPTQ), 2, {64, 384}},
    {"gptq g32 act-order", {.mask = DTL_QFMT_GROUP, .flags = DTL_QFMT_ACT_ORDER, .kind = DTL_QUANT_GPTQ, .group = 32}, 2,
     {96, 64}},
    {"awq g32", {.mask = DTL_QFMT_GROUP, .kind = DTL_QUANT_AWQ, .group = 32}, 2, {96, 80}},
    {"awq g128, experts", FMT(DTL_QUANT_AWQ), 3, {2, 48, 256}},
    {"q8_0", FMT(DTL_QUANT_GGUF_Q8_0), 2, {10, 128}},
    {"q4_0 1-d", FMT(DTL_QUANT_GGUF_Q4_0), 1, {256}},
    {"q4_k", FMT(DTL_QUANT_GGUF_Q4_K), 2, {6, 512}},
};
enum { NFORMATS = sizeof formats / sizeof *formats };

static const fcase *format_named(const char *name) {
  for (int f = 0; f < NFORMATS; f++)
    if (!strcmp(formats[f].name, name)) return &formats[f];
  fprintf(stderr, "no format case \"%s\"\n", name);
  MPI_Abort(MPI_COMM_WORLD, 2);
  return NULL;
}

static uint64_t rng = 12345;
static unsigned next_rand(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (unsigned)(rng >> 33);
}

/* A random qlayout of format fc on m (S or R per mesh dim); NULL when 20 draws all cut a packing unit. */
static dtl_qlayout *random_layout(const fcase *fc, dtl_mesh *m) {
  int nm = dtl_mesh_ndim(m);
  for (int tries = 0; tries < 20; tries++) {
    dtl_placement pl[DTL_MAX_MESH_DIMS];
    for (int d = 0; d < nm; d++) {
      unsigned r = next_rand() % (unsigned)(fc->nd + 1);
      pl[d] = r == 0 ? dtl_replicate() : dtl_shard((int)r - 1);
    }
    dtl_qlayout *l = NULL;
    if (dtl_qlayout_create(m, &fc->f, fc->nd, fc->shape, pl, &l) == DTL_OK) return l;
  }
  return NULL;
}

/* src -> dst by a qplan (or dtl_qredistribute), checked against the oracle; the bytes on the wire must add up to the
 * same over all ranks sent and received. */
static void check_pair(const char *fname, dtl_qlayout *s, dtl_qlayout *d, bool via_redistribute) {
  char a[256], b[256], what[600];
  CHECK_OK(dtl_qlayout_format(s, a, sizeof a));
  CHECK_OK(dtl_qlayout_format(d, b, sizeof b));
  snprintf(what, sizeof what, "%s: %s -> %s", fname, a, b);
  dtl_qbuf in, out;
  alloc_parts(s, true, &in);
  alloc_parts(d, false, &out);
  if (via_redistribute) {
    CHECK_OK(dtl_qredistribute(s, &in, d, &out));
  } else {
    dtl_qplan *q = NULL;
    CHECK_OK(dtl_qplan_create(s, d, &q));
    if (q) {
      CHECK_OK(dtl_qplan_execute(q, &in, &out));
      uint64_t sent = 0, recv = 0, tot[2];
      CHECK_OK(dtl_qplan_bytes(q, &sent, &recv));
      uint64_t mine[2] = {sent, recv};
      MPI_Allreduce(mine, tot, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
      CHECK(tot[0] == tot[1], "%s: %llu bytes sent but %llu received over all ranks", what,
            (unsigned long long)tot[0], (unsigned long long)tot[1]);
      CHECK(dtl_qplan_cost(q) >= 0, "%s: cost %g", what, dtl_qplan_cost(q));
    }
    dtl_qplan_destroy(q);
  }
  parts_match(what, d, &out);
  free_parts(&in);
  free_parts(&out);
}

/* Random pairs of placements for every format on mesh m (to mesh m2: another mesh of the same parent). */
static void random_pairs_match_the_dense_parts(dtl_mesh *m, dtl_mesh *m2, int pairs) {
  for (int f = 0; f < NFORMATS; f++)
    for (int k = 0; k < pairs; k++) {
      dtl_qlayout *s = random_layout(&formats[f], m), *d = random_layout(&formats[f], m2);
      if (s && d) check_pair(formats[f].name, s, d, k % 4 == 3);
      dtl_qlayout_destroy(s);
      dtl_qlayout_destroy(d);
    }
}

static void random_pairs_on_a_line_match_the_dense_parts(void) { random_pairs_match_the_dense_parts(line, line, 4); }

static void random_pairs_on_a_square_match_the_dense_parts(void) {
  if (square) random_pairs_match_the_dense_parts(square, square, 3);
}

/* The target: the upper half of the ranks, in reverse order (disjoint from the lower half from 2 ranks on, and
 * overlapping it at 3), as a prefill mesh hands a checkpoint to a decode mesh. */
static void pairs_between_two_meshes_match_the_dense_parts(void) {
  int n = (dt_size + 1) / 2, ranks[8];
  for (int i = 0; i < n; i++) ranks[i] = dt_size - 1 - i;
  dtl_mesh *half = NULL;
  REQUIRE_OK(dtl_mesh_create_from_ranks(world, n, ranks, 1, &n, &half));
  random_pairs_match_the_dense_parts(line, half, 2);
  random_pairs_match_the_dense_parts(half, line, 2);
  dtl_mesh_destroy(half);
}

static dtl_qlayout *qlayout(dtl_mesh *m, const fcase *fc, dtl_placement p0) {
  dtl_placement pl[DTL_MAX_MESH_DIMS];
  for (int d = 0; d < dtl_mesh_ndim(m); d++) pl[d] = d == 0 ? p0 : dtl_replicate();
  dtl_qlayout *l = NULL;
  REQUIRE_OK(dtl_qlayout_create(m, &fc->f, fc->nd, fc->shape, pl, &l));
  return l;
}

/* S(0) -> R of fp8-block 128 on [300, 260]: every rank receives the codes it lacks and every scale block but those it
 * owns, the blocks whose first row lies in its rows (a block its rows split comes from its one owner, once). */
static void every_scale_block_comes_once_from_its_owner(void) {
  const fcase *fc = format_named("fp8-block 128, uneven blocks");
  dtl_qlayout *s = qlayout(line, fc, dtl_shard(0)), *r = qlayout(line, fc, dtl_replicate());
  dtl_qplan *q = NULL;
  CHECK_OK(dtl_qplan_create(s, r, &q));
  dtl_qbox bs, br;
  CHECK_OK(dtl_qlayout_local_boxes(s, NULL, &bs));
  CHECK_OK(dtl_qlayout_local_boxes(r, NULL, &br));
  int64_t lo = bs.offset[0], hi = lo + bs.shape[0], owned = 0;
  for (int64_t blk = 0; blk * 128 < fc->shape[0]; blk++) owned += blk * 128 >= lo && blk * 128 < hi;
  uint64_t codes = (uint64_t)(br.part[DTL_QPART_CODES].bytes - bs.part[DTL_QPART_CODES].bytes);
  uint64_t scales = (uint64_t)br.part[DTL_QPART_SCALES].bytes - (uint64_t)owned * 3 * 4;
  uint64_t sent = 0, recv = 0;
  CHECK_OK(dtl_qplan_bytes(q, &sent, &recv));
  CHECK(recv == codes + scales, "received %llu bytes, expected %llu of codes and %llu of scales",
        (unsigned long long)recv, (unsigned long long)codes, (unsigned long long)scales);
  CHECK(dt_size > 1 || (sent == 0 && recv == 0), "one rank moved %llu/%llu bytes", (unsigned long long)sent,
        (unsigned long long)recv);
  dtl_qplan_destroy(q);
  check_pair(fc->name, s, r, false);
  dtl_qlayout_destroy(s);
  dtl_qlayout_destroy(r);
}

/* Once created, executions allocate nothing (the first included): the parts' plans own their workspace and
 * requests. */
static void executions_allocate_nothing(void) {
  const fcase *fc = format_named("gptq g32"); /* codes, scales and zeros */
  dtl_qlayout *s = qlayout(line, fc, dtl_shard(1)), *d = qlayout(line, fc, dtl_shard(0));
  dtl_qbuf in, out;
  alloc_parts(s, true, &in);
  alloc_parts(d, false, &out);
  dtl_qplan *q = NULL;
  CHECK_OK(dtl_qplan_create(s, d, &q));
  dtl__alloc_hook_reset(0, false);
  for (int i = 0; i < 10; i++) CHECK_OK(dtl_qplan_execute(q, &in, &out));
  uint64_t n = dtl__alloc_hook_count();
  CHECK(n == 0, "10 executions allocated %llu times", (unsigned long long)n);
  parts_match(fc->name, d, &out);
  dtl_qplan_destroy(q);
  free_parts(&in);
  free_parts(&out);
  dtl_qlayout_destroy(s);
  dtl_qlayout_destroy(d);
}

/* Explain: a header naming both layouts, one section per part (its plan's text) and the total; the size it needs,
 * and a buffer too small for it refused and left untouched. On an abstract mesh, which explains but cannot run. */
static void explain_has_one_section_per_part(void) {
  int shape[1] = {4}, coord[1] = {1};
  dtl_mesh *am = NULL;
  REQUIRE_OK(dtl_mesh_create_abstract(1, shape, coord, &am));
  const fcase *fc = format_named("fp8-block 128, uneven blocks");
  dtl_qlayout *s = qlayout(am, fc, dtl_shard(0)), *d = qlayout(am, fc, dtl_shard(1));
  dtl_qplan *q = NULL;
  CHECK_OK(dtl_qplan_create(s, d, &q));
  size_t need = dtl_qplan_explain_needed(q);
  char *text = malloc(need), small[16];
  memset(small, 'x', sizeof small);
  CHECK_OK(dtl_qplan_explain(q, text, need));
  CHECK(strlen(text) + 1 == need, "explain needs %zu bytes but wrote %zu", need, strlen(text) + 1);
  CHECK(strncmp(text, "qplan fp8-block(128x128,f8e4m3)[300,260] mesh=4 placements=S(0) -> fp8-block", 76) == 0, "%s", text);
  CHECK(strstr(text, "\ncodes: plan S(0) -> S(1)  mesh 4  shape [300,260] f8e4m3") != NULL, "%s", text);
  CHECK(strstr(text, "\nscales: plan S(0) -> S(1)  mesh 4  shape [3,3] f32") != NULL, "%s", text);
  CHECK(strstr(text, "\n  step 1  mesh dims * exchange") != NULL, "%s", text);
  CHECK(strstr(text, "\ntotal  2 parts at once, send ") != NULL, "%s", text);
  CHECK_ERROR(dtl_qplan_explain(q, small, sizeof small), DTL_ERR_INVALID_ARGUMENT, "bytes needed");
  CHECK(small[0] == 'x' && small[15] == 'x', "a refused explain wrote its buffer");
  CHECK(dtl_qplan_cost(q) > 0, "cost %g", dtl_qplan_cost(q));
  dtl_qbuf none = {{NULL}};
  CHECK_ERROR(dtl_qplan_execute(q, &none, &none), DTL_ERR_INVALID_ARGUMENT, "abstract");
  CHECK_ERROR(dtl_qredistribute(s, &none, d, &none), DTL_ERR_INVALID_ARGUMENT, "abstract");
  free(text);
  dtl_qplan_destroy(q);
  dtl_qlayout_destroy(s);
  dtl_qlayout_destroy(d);
  dtl_mesh_destroy(am);
}

static void bad_arguments_are_refused_naming_them(void) {
  const fcase *g32 = format_named("gptq g32"), *fp8 = format_named("fp8-block 128, uneven blocks");
  fcase g128 = *g32, awq = *g32, other = *fp8;
  g128.f.group = 128;
  awq.f.kind = DTL_QUANT_AWQ;
  other.shape[1] = 256;
  dtl_qlayout *a = qlayout(line, g32, dtl_shard(0)), *b = qlayout(line, &g128, dtl_shard(0));
  dtl_qlayout *c = qlayout(line, &awq, dtl_shard(0)), *f = qlayout(line, fp8, dtl_shard(0));
  dtl_qlayout *g = qlayout(line, &other, dtl_shard(0));
  dtl_qplan *q = (dtl_qplan *)&rng; /* a failed call leaves it as it is */
  CHECK_ERROR(dtl_qplan_create(NULL, a, &q), DTL_ERR_INVALID_ARGUMENT, "src=NULL");
  CHECK_ERROR(dtl_qplan_create(a, NULL, &q), DTL_ERR_INVALID_ARGUMENT, "dst=NULL");
  CHECK_ERROR(dtl_qplan_create(a, a, NULL), DTL_ERR_INVALID_ARGUMENT, "out=NULL");
  CHECK_ERROR(dtl_qplan_create(a, b, &q), DTL_ERR_INVALID_ARGUMENT, "src is gptq(g32)[96,96]");
  CHECK(strstr(dtl_last_error(), "dst is gptq(g128)[96,96]") != NULL, "%s", dtl_last_error());
  CHECK_ERROR(dtl_qplan_create(a, c, &q), DTL_ERR_INVALID_ARGUMENT, "dst is awq(g32)[96,96]");
  CHECK_ERROR(dtl_qplan_create(f, g, &q), DTL_ERR_INVALID_ARGUMENT, "[300,260]");
  CHECK(strstr(dtl_last_error(), "[300,256]") != NULL, "%s", dtl_last_error());
  CHECK_ERROR(dtl_qredistribute(f, NULL, g, NULL), DTL_ERR_INVALID_ARGUMENT, "expected one format and logical shape");
  int shape[1] = {dt_size}, coord[1] = {0};
  dtl_mesh *am = NULL;
  REQUIRE_OK(dtl_mesh_create_abstract(1, shape, coord, &am));
  dtl_qlayout *h = qlayout(am, fp8, dtl_shard(0));
  CHECK_ERROR(dtl_qplan_create(f, h, &q), DTL_ERR_INVALID_ARGUMENT, "without a common parent");
  CHECK(q == (dtl_qplan *)&rng, "a failed dtl_qplan_create wrote its output");
  /* Execution: no plan; a buffer for a part the format lacks; a target part over another part's buffer. */
  dtl_qplan *p = NULL;
  CHECK_OK(dtl_qplan_create(f, f, &p));
  dtl_qbuf in, out;
  alloc_parts(f, true, &in);
  alloc_parts(f, false, &out);
  CHECK_ERROR(dtl_qplan_execute(NULL, &in, &out), DTL_ERR_INVALID_ARGUMENT, "plan=NULL");
  out.part[DTL_QPART_ZEROS] = out.part[DTL_QPART_CODES];
  CHECK_ERROR(dtl_qplan_execute(p, &in, &out), DTL_ERR_INVALID_ARGUMENT, "has no zeros");
  out.part[DTL_QPART_ZEROS] = NULL;
  void *scales = out.part[DTL_QPART_SCALES];
  out.part[DTL_QPART_SCALES] = out.part[DTL_QPART_CODES];
  CHECK_ERROR(dtl_qplan_execute(p, &in, &out), DTL_ERR_INVALID_ARGUMENT, "overlaps");
  out.part[DTL_QPART_SCALES] = in.part[DTL_QPART_CODES];
  CHECK_ERROR(dtl_qplan_execute(p, &in, &out), DTL_ERR_INVALID_ARGUMENT, "overlaps src_local->part[0] (codes");
  out.part[DTL_QPART_SCALES] = scales;
  CHECK_ERROR(dtl_qplan_execute(p, &in, NULL), DTL_ERR_INVALID_ARGUMENT, "dtl_qplan_execute: codes: dst_local=NULL");
  CHECK_OK(dtl_qplan_execute(p, &in, &out));
  parts_match("S(0) -> S(0)", f, &out);
  free_parts(&in);
  free_parts(&out);
  dtl_qplan_destroy(p);
  dtl_qlayout_destroy(h);
  dtl_mesh_destroy(am);
  dtl_qlayout_destroy(a);
  dtl_qlayout_destroy(b);
  dtl_qlayout_destroy(c);
  dtl_qlayout_destroy(f);
  dtl_qlayout_destroy(g);
}

/* Under DTL_CHECK one rank's missing target scales fail every rank before any transfer (no target written on any
 * rank), and one rank running another plan is a mismatch on every rank. */
static void a_bad_buffer_on_one_rank_fails_every_rank(void) {
  const fcase *fc = format_named("fp8-block 48x32");
  dtl_qlayout *s = qlayout(line_checked, fc, dtl_shard(0)), *d = qlayout(line_checked, fc, dtl_shard(1));
  dtl_qlayout *r = qlayout(line_checked, fc, dtl_replicate());
  dtl_qplan *q = NULL, *q2 = NULL;
  CHECK_OK(dtl_qplan_create(s, d, &q));
  CHECK_OK(dtl_qplan_create(s, r, &q2));
  dtl_qbuf in, out, out2;
  alloc_parts(s, true, &in);
  alloc_parts(d, false, &out);
  alloc_parts(r, false, &out2);
  bool me = dt_rank == dt_bad;
  void *keep = out.part[DTL_QPART_SCALES];
  if (me) out.part[DTL_QPART_SCALES] = NULL;
  dt_expect_every_rank_fails("qplan_execute", dtl_qplan_execute(q, &in, &out), DTL_ERR_INVALID_ARGUMENT,
                             "dtl_qplan_execute: scales: dst_local=NULL");
  out.part[DTL_QPART_SCALES] = keep;
  dtl_qbox b;
  CHECK_OK(dtl_qlayout_local_boxes(d, NULL, &b));
  for (int p = 0; p < 2; p++)
    for (size_t i = 0; i < b.part[p].bytes; i++)
      if (((unsigned char *)out.part[p])[i] != 0xa5) {
        CHECK(false, "a failed execution wrote %s byte %zu", part_name[p], i);
        break;
      }
  dt_expect_mismatch("another plan", me ? dtl_qplan_execute(q2, &in, &out2) : dtl_qplan_execute(q, &in, &out));
  CHECK_OK(dtl_qplan_execute(q, &in, &out)); /* and the plan still runs */
  parts_match(fc->name, d, &out);
  free_parts(&in);
  free_parts(&out);
  free_parts(&out2);
  dtl_qplan_destroy(q);
  dtl_qplan_destroy(q2);
  dtl_qlayout_destroy(s);
  dtl_qlayout_destroy(d);
  dtl_qlayout_destroy(r);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  dt_ranks_init();
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  checked = dt_comm_with_check(true);
  if (!checked) MPI_Abort(MPI_COMM_WORLD, 2);
  int n = dt_size, sq[2] = {2, 2};
  REQUIRE_OK(dtl_mesh_create(world, 1, &n, &line));
  REQUIRE_OK(dtl_mesh_create(checked, 1, &n, &line_checked));
  if (dt_size == 4) REQUIRE_OK(dtl_mesh_create(world, 2, sq, &square));
  RUN(random_pairs_on_a_line_match_the_dense_parts);
  RUN(random_pairs_on_a_square_match_the_dense_parts);
  RUN(pairs_between_two_meshes_match_the_dense_parts);
  RUN(every_scale_block_comes_once_from_its_owner);
  RUN(executions_allocate_nothing);
  RUN(explain_has_one_section_per_part);
  RUN(bad_arguments_are_refused_naming_them);
  RUN(a_bad_buffer_on_one_rank_fails_every_rank);
  dtl_mesh_destroy(square);
  dtl_mesh_destroy(line_checked);
  dtl_mesh_destroy(line);
  dtl_comm_destroy(checked);
  dtl_comm_destroy(world);
  return dt_finish();
}

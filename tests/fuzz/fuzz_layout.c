/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target of layout geometry on abstract meshes: the input picks a mesh (1-4 dims of 1-5), a
 * coordinate, a dtype, a tensor (0-4 dims of 0-12) and one placement per mesh dim. Every shard box the
 * library gives must equal the one an independent torch.chunk chunker computes (nested splits left to
 * right), the shards of the coordinates that hold distinct data (coordinate 0 on every mesh dim that does
 * not shard) must tile the tensor exactly (every element once), the local count must be the box's volume,
 * and the text outputs must need exactly the size they report. Bad layouts must be refused cleanly. */
#include "fuzz_input.h"

enum { MAX_EXTENT = 12 };

/* torch.chunk of [start, start + len) into k: piece c. */
static void chunk(int64_t *start, int64_t *len, int k, int c) {
  int64_t cs = (*len + k - 1) / k, lo = (int64_t)c * cs, hi = lo + cs;
  if (lo > *len) lo = *len;
  if (hi > *len) hi = *len;
  *start += lo;
  *len = hi - lo;
}

/* Text outputs: needed bytes exactly, a buffer one short refused with nothing written. */
static void check_text(const dtl_layout *l, dtl_status (*fmt)(const dtl_layout *, char *, size_t), size_t needed,
                       const char *fn) {
  char *buf = malloc(needed + 1);
  FZ_CHECK(buf != NULL, "malloc");
  FZ_CHECK(fmt(l, buf, needed) == DTL_OK, "%s into %zu bytes: %s", fn, needed, dtl_last_error());
  FZ_CHECK(strlen(buf) + 1 == needed, "%s: %zu bytes needed but the text has %zu", fn, needed, strlen(buf));
  size_t at;
  FZ_CHECK(dt_text_safe(buf, true, &at), "%s: unsafe byte at %zu", fn, at);
  memset(buf, 0x5a, needed + 1);
  dtl_status st = fmt(l, buf, needed - 1);
  FZ_FAILED(st, fn, DTL_ERR_INVALID_ARGUMENT);
  for (size_t i = 0; i + 1 < needed; i++) FZ_CHECK(buf[i] == 0x5a, "%s wrote into a too-small buffer", fn);
  free(buf);
}

static size_t visualize_needed(const dtl_layout *l) { return dtl_layout_visualize_needed(l); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size};
  int M = 1 + fz_below(&in, 4), mshape[4], coord[4];
  for (int m = 0; m < M; m++) mshape[m] = 1 + fz_below(&in, 5);
  for (int m = 0; m < M; m++) coord[m] = fz_below(&in, mshape[m]);
  dtl_dtype t = (dtl_dtype)fz_below(&in, DTL_NUM_DTYPES);
  int nd = fz_below(&in, 5);
  int64_t shape[4];
  for (int d = 0; d < nd; d++) shape[d] = fz_below(&in, MAX_EXTENT + 1);
  dtl_placement pl[4];
  for (int m = 0; m < M; m++) pl[m] = fz_placement(&in, nd);
  dtl_mesh *mesh = NULL;
  FZ_CHECK(dtl_mesh_create_abstract(M, mshape, coord, &mesh) == DTL_OK, "mesh: %s", dtl_last_error());
  dtl_layout *l = NULL;
  dtl_status st = dtl_layout_create(mesh, t, nd, shape, pl, &l);
  if (st != DTL_OK) {
    FZ_FAILED(st, "dtl_layout_create", DTL_ERR_INVALID_ARGUMENT,
              DTL_ERR_UNSUPPORTED); /* UNSUPPORTED: P(avg) of integers, P(sum/prod/avg) of the 8-bit floats */
    FZ_CHECK(l == NULL, "a failed create wrote the layout");
    dtl_mesh_destroy(mesh);
    return 0;
  }
  dtl_placement norm[4];
  dtl_layout_placements(l, norm);
  int64_t total = 1;
  for (int d = 0; d < nd; d++) total *= shape[d];
  FZ_CHECK(dtl_layout_global_count(l) == (size_t)total, "global count");
  unsigned char *cover = calloc((size_t)total + 1, 1);
  FZ_CHECK(cover != NULL, "calloc");
  int ncoords = 1;
  for (int m = 0; m < M; m++) ncoords *= mshape[m];
  for (int r = 0; r < ncoords; r++) {
    int c[4]; /* the row-major coordinate of r */
    for (int m = M - 1, x = r; m >= 0; m--) {
      c[m] = x % mshape[m];
      x /= mshape[m];
    }
    int64_t bs[4] = {0}, bo[4] = {0};
    FZ_CHECK(dtl_layout_local_box(l, c, bs, bo) == DTL_OK, "box: %s", dtl_last_error());
    bool distinct = true;
    for (int d = 0; d < nd; d++) {
      int64_t start = 0, len = shape[d];
      for (int m = 0; m < M; m++)
        if (norm[m].kind == DTL_SHARD && norm[m].dim == d) chunk(&start, &len, mshape[m], c[m]);
      FZ_CHECK(bs[d] == len && bo[d] == start, "coordinate %d dim %d: box %lld@%lld, chunker %lld@%lld", r, d,
               (long long)bs[d], (long long)bo[d], (long long)len, (long long)start);
    }
    for (int m = 0; m < M; m++) distinct &= norm[m].kind == DTL_SHARD || c[m] == 0;
    if (!distinct) continue;
    int64_t vol = 1;
    for (int d = 0; d < nd; d++) vol *= bs[d];
    for (int64_t e = 0; e < vol; e++) { /* the e-th element of the box, as a global row-major index */
      int64_t g = 0, rest = e;
      int64_t idx[4];
      for (int d = nd - 1; d >= 0; d--) {
        idx[d] = bo[d] + rest % bs[d];
        rest /= bs[d];
      }
      for (int d = 0; d < nd; d++) g = g * shape[d] + idx[d];
      FZ_CHECK(cover[g] == 0, "element %lld is held by two distinct shards", (long long)g);
      cover[g] = 1;
    }
  }
  for (int64_t g = 0; g < total; g++) FZ_CHECK(cover[g] == 1, "element %lld is held by no shard", (long long)g);
  free(cover);
  int64_t own[4], off[4];
  FZ_CHECK(dtl_layout_local_box(l, NULL, own, off) == DTL_OK, "own box");
  size_t vol = 1;
  for (int d = 0; d < nd; d++) vol *= (size_t)own[d];
  FZ_CHECK(dtl_layout_local_count(l) == vol, "local count %zu, box volume %zu", dtl_layout_local_count(l), vol);
  char line[512];
  FZ_CHECK(dtl_layout_format(l, line, sizeof line) == DTL_OK, "format: %s", dtl_last_error());
  check_text(l, dtl_layout_format, strlen(line) + 1, "dtl_layout_format");
  size_t need = visualize_needed(l);
  if (need)
    check_text(l, dtl_layout_visualize, need, "dtl_layout_visualize");
  else
    FZ_FAILED(dtl_layout_visualize(l, line, sizeof line), "dtl_layout_visualize", DTL_ERR_UNSUPPORTED);
  dtl_layout_destroy(l);
  dtl_mesh_destroy(mesh);
  return 0;
}

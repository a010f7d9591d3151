/* SPDX-License-Identifier: Apache-2.0 */
/* dtl_layout_visualize read back as a specification: for every 1-D and 2-D layout in a range, the drawing
 * is parsed, and each cell's block and holders are checked against dtl_layout_local_box for every
 * coordinate it names (and the ranks against row-major order); every coordinate appears exactly once;
 * row and column ranges tile the tensor; the text does not depend on the calling rank. Plus the buffer
 * contract and the unsupported ranks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "layout/layout_internal.h"

#define MAX_RANKS 64

/* --- reading the drawing back ------------------------------------------------------------------------- */

typedef struct {
  const dtl_layout *l;
  int mshape[DTL_MAX_MESH_DIMS], mndim, size;
  int seen[MAX_RANKS]; /* times each rank was named */
} reader;

static int row_major_rank(const reader *r, const int *c) {
  int rank = 0;
  for (int md = 0; md < r->mndim; md++) rank = rank * r->mshape[md] + c[md];
  return rank;
}

/* Copies the lines of text into lines[] (NUL-terminated, no '\n'); returns their number. */
static int split_lines(const char *text, char lines[][512], int max) {
  int n = 0;
  while (*text) {
    const char *e = strchr(text, '\n');
    assert_non_null(e); /* every line ends with '\n' */
    assert_true(n < max);
    size_t len = (size_t)(e - text);
    assert_true(len < 512);
    memcpy(lines[n], text, len);
    lines[n][len] = '\0';
    if (len > 0) assert_true(lines[n][len - 1] != ' '); /* no trailing blanks */
    n++;
    text = e + 1;
  }
  return n;
}

/* Splits a table line at " | " into fields (trailing blanks of each field removed). */
static int split_fields(char *line, char *fields[], int max) {
  int n = 0;
  for (char *p = line;;) {
    assert_true(n < max);
    fields[n++] = p;
    char *sep = strstr(p, " | ");
    if (!sep) break;
    *sep = '\0';
    p = sep + 3;
  }
  for (int i = 0; i < n; i++)
    for (size_t k = strlen(fields[i]); k > 0 && fields[i][k - 1] == ' '; k--) fields[i][k - 1] = '\0';
  return n;
}

static void parse_range(const char *s, int64_t *lo, int64_t *hi) {
  long long a, b;
  int used = 0;
  if (sscanf(s, "%lld:%lld%n", &a, &b, &used) != 2 || s[used] != '\0') fail_msg("bad range \"%s\"", s);
  *lo = a;
  *hi = b;
}

/* Reads "[0,*] ranks 0,1" / "[1,0] rank 2" / "[*,*] ranks 0-3,8" and checks it: the * sit exactly on the
 * mesh dims that do not shard; the ranks are the coordinates the pattern expands to, in row-major order;
 * each such coordinate's box is [lo, hi) on every tensor dim. Marks the ranks seen. */
static void check_cell(reader *r, const char *cell, const int64_t *lo, const int64_t *hi) {
  const dtl_layout *l = r->l;
  int pat[DTL_MAX_MESH_DIMS];
  const char *p = cell;
  if (*p++ != '[') fail_msg("cell \"%s\" does not start with [", cell);
  for (int md = 0; md < r->mndim; md++) {
    if (*p == '*') {
      pat[md] = -1;
      p++;
    } else {
      char *end;
      pat[md] = (int)strtol(p, &end, 10);
      if (end == p) fail_msg("cell \"%s\": bad coordinate", cell);
      p = end;
    }
    if (*p++ != (md == r->mndim - 1 ? ']' : ',')) fail_msg("cell \"%s\": bad coordinate list", cell);
    dtl_placement pl[DTL_MAX_MESH_DIMS];
    dtl_layout_placements(l, pl);
    if ((pat[md] == -1) != (pl[md].kind != DTL_SHARD)) fail_msg("cell \"%s\": * on mesh dim %d is wrong", cell, md);
  }
  /* The ranks as written. */
  int listed[MAX_RANKS], nlisted = 0;
  if (strncmp(p, " rank ", 6) == 0) p += 6;
  else if (strncmp(p, " ranks ", 7) == 0) p += 7;
  else fail_msg("cell \"%s\": no rank list", cell);
  while (*p) {
    char *end;
    long a = strtol(p, &end, 10), b = a;
    if (end == p) fail_msg("cell \"%s\": bad rank list", cell);
    p = end;
    if (*p == '-') {
      b = strtol(p + 1, &end, 10);
      if (b < a + 2) fail_msg("cell \"%s\": range %ld-%ld should be a list", cell, a, b);
      p = end;
    }
    for (long k = a; k <= b; k++) {
      assert_true(nlisted < MAX_RANKS);
      listed[nlisted++] = (int)k;
    }
    if (*p == ',') p++;
    else if (*p) fail_msg("cell \"%s\": bad rank list", cell);
  }
  /* The coordinates the pattern expands to, in row-major order. */
  int c[DTL_MAX_MESH_DIMS], n = 0;
  for (int rank = 0; rank < r->size; rank++) {
    int rest = rank;
    bool match = true;
    for (int md = r->mndim - 1; md >= 0; md--) {
      c[md] = rest % r->mshape[md];
      rest /= r->mshape[md];
      match = match && (pat[md] == -1 || pat[md] == c[md]);
    }
    if (!match) continue;
    assert_int_equal(row_major_rank(r, c), rank);
    if (n >= nlisted || listed[n] != rank) fail_msg("cell \"%s\": rank %d missing or out of order", cell, rank);
    n++;
    r->seen[rank]++;
    int64_t s[2], o[2];
    assert_int_equal(dtl_layout_local_box(l, c, s, o), DTL_OK);
    for (int d = 0; d < l->ndim; d++)
      if (o[d] != lo[d] || o[d] + s[d] != hi[d])
        fail_msg("cell \"%s\": rank %d holds %lld:%lld on dim %d, drawn %lld:%lld", cell, rank, (long long)o[d],
                 (long long)(o[d] + s[d]), d, (long long)lo[d], (long long)hi[d]);
  }
  if (n != nlisted) fail_msg("cell \"%s\": lists ranks the pattern does not hold", cell);
}

/* Checks that consecutive ranges are non-empty and tile [0, n). */
static void check_tiling(const int64_t *lo, const int64_t *hi, int k, int64_t n, const char *what) {
  int64_t at = 0;
  for (int i = 0; i < k; i++) {
    if (lo[i] != at || hi[i] <= lo[i]) fail_msg("%s range %d is %lld:%lld, expected to start at %lld", what, i, (long long)lo[i], (long long)hi[i], (long long)at);
    at = hi[i];
  }
  if (at != n) fail_msg("%s ranges end at %lld, the dim has %lld", what, (long long)at, (long long)n);
}

/* Reads a whole drawing of l and checks it. */
static void check_drawing(const dtl_layout *l, const char *text) {
  reader r = {.l = l, .mndim = dtl_mesh_ndim(l->mesh), .size = dtl_mesh_size(l->mesh)};
  for (int md = 0; md < r.mndim; md++) r.mshape[md] = dtl_mesh_dim_size(l->mesh, md);
  assert_true(r.size <= MAX_RANKS);
  static char lines[256][512];
  const int nlines = split_lines(text, lines, 256);
  int at = 0;
  /* Header: the layout line, the legend, one line per Partial mesh dim in mesh dim order. */
  char head[256];
  assert_int_equal(dtl_layout_format(l, head, sizeof head), DTL_OK);
  assert_string_equal(lines[at++], head);
  assert_true(strncmp(lines[at++], "cells: ", 7) == 0);
  dtl_placement pl[DTL_MAX_MESH_DIMS];
  dtl_layout_placements(l, pl);
  for (int md = 0; md < r.mndim; md++) {
    if (pl[md].kind != DTL_PARTIAL) continue;
    char want[64];
    snprintf(want, sizeof want, "P(%s) over mesh dim %d: ", dtl_reduce_op_name(pl[md].op), md);
    if (strncmp(lines[at], want, strlen(want)) != 0) fail_msg("line \"%s\" should start \"%s\"", lines[at], want);
    at++;
  }
  int64_t shape[2];
  dtl_layout_global_shape(l, shape);
  const int nd = l->ndim;
  if (dtl_layout_global_count(l) == 0) {
    assert_string_equal(lines[at++], "no elements: every shard is empty");
  } else {
    /* The table: header, rule, rows. Every line puts its '|' in the same columns. */
    char *f[64];
    char header[512];
    strcpy(header, lines[at]);
    const int ncols = split_fields(lines[at++], f, 64) - 1;
    assert_string_equal(f[0], nd == 1 ? "index" : "rows\\cols");
    int64_t clo[64], chi[64];
    for (int j = 0; j < ncols; j++) {
      if (nd == 1) {
        assert_string_equal(f[1 + j], "holders");
        clo[j] = 0;
        chi[j] = 1;
      } else {
        parse_range(f[1 + j], &clo[j], &chi[j]);
      }
    }
    if (nd == 2) check_tiling(clo, chi, ncols, shape[1], "column");
    else assert_int_equal(ncols, 1);
    const char *rule = lines[at++];
    assert_int_equal(strspn(rule, "-+"), strlen(rule));
    for (size_t k = 0; rule[k] && header[k]; k++) assert_true((rule[k] == '+') == (header[k] == '|'));
    int64_t rlo[64], rhi[64];
    int nrows = 0;
    while (at < nlines && strcmp(lines[at], "empty shards:") != 0) {
      for (size_t k = 0; lines[at][k] && header[k]; k++) assert_true((lines[at][k] == '|') == (header[k] == '|'));
      assert_int_equal(split_fields(lines[at++], f, 64), ncols + 1);
      parse_range(f[0], &rlo[nrows], &rhi[nrows]);
      for (int j = 0; j < ncols; j++) {
        int64_t lo[2] = {rlo[nrows], clo[j]}, hi[2] = {rhi[nrows], chi[j]};
        check_cell(&r, f[1 + j], lo, hi);
      }
      nrows++;
    }
    check_tiling(rlo, rhi, nrows, shape[0], "row");
  }
  /* Empty shards: "  <cell> at [a:b]" or "  <cell> at [a:b, c:d]", each box of no elements. */
  if (at < nlines) {
    assert_string_equal(lines[at++], "empty shards:");
    for (; at < nlines; at++) {
      char *line = lines[at];
      assert_true(strncmp(line, "  ", 2) == 0);
      char *box = strstr(line, " at [");
      assert_non_null(box);
      *box = '\0';
      box += 5;
      assert_int_equal(box[strlen(box) - 1], ']');
      box[strlen(box) - 1] = '\0';
      int64_t lo[2], hi[2], vol = 1;
      char *second = strstr(box, ", ");
      assert_true((second != NULL) == (nd == 2));
      if (second) {
        *second = '\0';
        parse_range(second + 2, &lo[1], &hi[1]);
      }
      parse_range(box, &lo[0], &hi[0]);
      for (int d = 0; d < nd; d++) vol *= hi[d] - lo[d];
      assert_int_equal(vol, 0);
      check_cell(&r, line + 2, lo, hi);
    }
  }
  assert_int_equal(at, nlines);
  for (int rank = 0; rank < r.size; rank++)
    if (r.seen[rank] != 1) fail_msg("rank %d is named %d times", rank, r.seen[rank]);
}

/* Draws l, checks the buffer contract around it, and returns the text (caller frees). */
static char *draw(const dtl_layout *l) {
  size_t need = dtl_layout_visualize_needed(l);
  assert_true(need > 0);
  char *buf = malloc(need + 8);
  assert_non_null(buf);
  memset(buf, '#', need + 8);
  assert_int_equal(dtl_layout_visualize(l, buf, need), DTL_OK);
  assert_int_equal(strlen(buf), need - 1);
  assert_int_equal(buf[need], '#');
  return buf;
}

/* Every placement vector over {R, P(op), S(0..nd-1)} on every mesh with 1..3 dims of sizes 1..max_mesh. */
static long check_range(int nd, int64_t max_size, int max_mesh3, int max_mesh) {
  long drawn = 0;
  const int nkinds = 2 + nd;
  int64_t shape[2] = {0, 0};
  for (;;) {
    for (int mndim = 1; mndim <= 3; mndim++) {
      int ms[3] = {1, 1, 1};
      const int top = mndim == 3 ? max_mesh3 : max_mesh;
      for (;;) {
        int total = 1;
        for (int md = 0; md < mndim; md++) total *= nkinds;
        for (int v = 0; v < total; v++) {
          dtl_placement pl[3];
          for (int md = 0, rest = v; md < mndim; md++, rest /= nkinds) {
            int k = rest % nkinds;
            pl[md] = k == 0 ? dtl_replicate() : k == 1 ? dtl_partial((dtl_reduce_op)((v + md) % DTL_NUM_REDUCE_OPS)) : dtl_shard(k - 2);
          }
          /* Two meshes with different own coordinates must draw the same text. */
          int last[3] = {ms[0] - 1, ms[1] - 1, ms[2] - 1};
          dtl_mesh *m0, *m1;
          assert_int_equal(dtl_mesh_create_abstract(mndim, ms, NULL, &m0), DTL_OK);
          assert_int_equal(dtl_mesh_create_abstract(mndim, ms, last, &m1), DTL_OK);
          dtl_layout *l0, *l1;
          assert_int_equal(dtl_layout_create(m0, DTL_FLOAT32, nd, shape, pl, &l0), DTL_OK);
          assert_int_equal(dtl_layout_create(m1, DTL_FLOAT32, nd, shape, pl, &l1), DTL_OK);
          char *t0 = draw(l0), *t1 = draw(l1);
          assert_string_equal(t0, t1);
          check_drawing(l0, t0);
          free(t0);
          free(t1);
          dtl_layout_destroy(l0);
          dtl_layout_destroy(l1);
          dtl_mesh_destroy(m0);
          dtl_mesh_destroy(m1);
          drawn++;
        }
        int md = mndim - 1;
        while (md >= 0 && ++ms[md] > top) ms[md--] = 1;
        if (md < 0) break;
      }
    }
    int d = nd - 1;
    while (d >= 0 && ++shape[d] > max_size) shape[d--] = 0;
    if (d < 0) break;
  }
  return drawn;
}

static void drawings_of_1d_layouts_name_every_coordinate_with_its_block(void **state) {
  print_message("%ld layouts drawn\n", check_range(1, 9, 3, 4));
}

static void drawings_of_2d_layouts_name_every_coordinate_with_its_block(void **state) {
  print_message("%ld layouts drawn\n", check_range(2, 6, 2, 3));
}

/* --- the format, by example ------------------------------------------------------------------------------ */

static char *draw_text(int mndim, const int *ms, const char *placements, int nd, const int64_t *shape, dtl_dtype t) {
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(mndim, ms, NULL, &m), DTL_OK);
  dtl_placement p[4];
  int n;
  assert_int_equal(dtl_placements_parse(placements, p, 4, &n), DTL_OK);
  assert_int_equal(n, mndim);
  dtl_layout *l;
  assert_int_equal(dtl_layout_create(m, t, nd, shape, p, &l), DTL_OK);
  char *text = draw(l);
  check_drawing(l, text);
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
  return text;
}

static void grid_of_a_2x2_sharded_matrix_reads_like_the_documented_example(void **state) {
  char *t = draw_text(2, (int[]){2, 2}, "S0,S1", 2, (int64_t[]){8, 6}, DTL_FLOAT32);
  assert_string_equal(t,
                      "f32[8,6] mesh=2x2 placements=S(0),S(1)\n"
                      "cells: mesh coordinate (* = every index of that mesh dim) and the ranks holding the block; "
                      "ranges are start:end\n"
                      "rows\\cols | 0:3          | 3:6\n"
                      "----------+--------------+-------------\n"
                      "0:4       | [0,0] rank 0 | [0,1] rank 1\n"
                      "4:8       | [1,0] rank 2 | [1,1] rank 3\n");
  free(t);
}

static void uneven_1d_shards_list_the_empty_tail_separately(void **state) {
  char *t = draw_text(1, (int[]){4}, "S0", 1, (int64_t[]){5}, DTL_INT32);
  assert_string_equal(t,
                      "i32[5] mesh=4 placements=S(0)\n"
                      "cells: mesh coordinate (* = every index of that mesh dim) and the ranks holding the block; "
                      "ranges are start:end\n"
                      "index | holders\n"
                      "------+-----------\n"
                      "0:2   | [0] rank 0\n"
                      "2:4   | [1] rank 1\n"
                      "4:5   | [2] rank 2\n"
                      "empty shards:\n"
                      "  [3] rank 3 at [5:5]\n");
  free(t);
}

static void partial_mesh_dims_are_noted_and_replicas_share_a_cell(void **state) {
  char *t = draw_text(3, (int[]){2, 2, 2}, "P(avg),S1,R", 2, (int64_t[]){3, 4}, DTL_FLOAT64);
  assert_non_null(strstr(t, "\nP(avg) over mesh dim 0: the ranks along it hold partial values; a block's value is their average\n"));
  assert_non_null(strstr(t, "| [*,0,*] ranks 0,1,4,5 |"));
  assert_non_null(strstr(t, "| [*,1,*] ranks 2,3,6,7\n"));
  free(t);
  /* Consecutive runs of three or more ranks are written a-b. */
  t = draw_text(2, (int[]){2, 4}, "S0,R", 1, (int64_t[]){2}, DTL_FLOAT32);
  assert_non_null(strstr(t, "| [0,*] ranks 0-3\n"));
  assert_non_null(strstr(t, "| [1,*] ranks 4-7\n"));
  free(t);
}

static void a_tensor_without_elements_lists_every_shard_as_empty(void **state) {
  char *t = draw_text(2, (int[]){2, 2}, "S1,R", 2, (int64_t[]){0, 4}, DTL_FLOAT32);
  assert_non_null(strstr(t, "\nno elements: every shard is empty\nempty shards:\n  [0,*] ranks 0,1 at [0:0, 0:2]\n"
                            "  [1,*] ranks 2,3 at [0:0, 2:4]\n"));
  free(t);
}

/* --- the contract ----------------------------------------------------------------------------------------- */

static void too_small_buffer_names_the_size_needed_and_writes_nothing(void **state) {
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(2, (int[]){2, 3}, NULL, &m), DTL_OK);
  dtl_layout *l;
  assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 2, (int64_t[]){5, 7}, (dtl_placement[]){dtl_shard(1), dtl_shard(0)}, &l), DTL_OK);
  const size_t need = dtl_layout_visualize_needed(l);
  char *buf = malloc(need);
  const size_t caps[] = {0, 1, need / 2, need - 1};
  for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) {
    memset(buf, '#', need);
    assert_int_equal(dtl_layout_visualize(l, buf, caps[i]), DTL_ERR_INVALID_ARGUMENT);
    char want[64];
    snprintf(want, sizeof want, "cap=%zu is too small (%zu bytes needed)", caps[i], need);
    if (!strstr(dtl_last_error(), want)) fail_msg("message \"%s\" lacks \"%s\"", dtl_last_error(), want);
    for (size_t k = 0; k < need; k++) assert_int_equal(buf[k], '#');
  }
  assert_int_equal(dtl_layout_visualize(l, NULL, need), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "buf=NULL"));
  assert_int_equal(dtl_layout_visualize(NULL, buf, need), DTL_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dtl_last_error(), "layout=NULL"));
  assert_int_equal(dtl_layout_visualize_needed(NULL), 0);
  free(buf);
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

static void tensors_of_other_ranks_and_huge_meshes_are_unsupported(void **state) {
  dtl_mesh *m;
  assert_int_equal(dtl_mesh_create_abstract(2, (int[]){2, 2}, NULL, &m), DTL_OK);
  const int64_t shape[3] = {4, 4, 4};
  const dtl_placement p[2] = {dtl_shard(0), dtl_shard(2)};
  for (int nd = 0; nd <= 3; nd += 3) {
    dtl_layout *l;
    assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, nd, shape, nd ? p : (dtl_placement[]){dtl_replicate(), dtl_replicate()}, &l),
                     DTL_OK);
    char buf[1024] = "untouched";
    assert_int_equal(dtl_layout_visualize(l, buf, sizeof buf), DTL_ERR_UNSUPPORTED);
    char want[48];
    snprintf(want, sizeof want, "tensor is %d-d", nd);
    assert_non_null(strstr(dtl_last_error(), want));
    assert_non_null(strstr(dtl_last_error(), "dtl_layout_visualize"));
    assert_string_equal(buf, "untouched");
    assert_int_equal(dtl_layout_visualize_needed(l), 0);
    dtl_layout_destroy(l);
  }
  dtl_mesh_destroy(m);
  assert_int_equal(dtl_mesh_create_abstract(3, (int[]){256, 256, 2}, NULL, &m), DTL_OK);
  dtl_layout *l;
  assert_int_equal(dtl_layout_create(m, DTL_FLOAT32, 1, shape, (dtl_placement[]){dtl_shard(0), dtl_replicate(), dtl_replicate()}, &l),
                   DTL_OK);
  char buf[16];
  assert_int_equal(dtl_layout_visualize(l, buf, sizeof buf), DTL_ERR_UNSUPPORTED);
  assert_non_null(strstr(dtl_last_error(), "131072 ranks"));
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(grid_of_a_2x2_sharded_matrix_reads_like_the_documented_example),
      cmocka_unit_test(uneven_1d_shards_list_the_empty_tail_separately),
      cmocka_unit_test(partial_mesh_dims_are_noted_and_replicas_share_a_cell),
      cmocka_unit_test(a_tensor_without_elements_lists_every_shard_as_empty),
      cmocka_unit_test(too_small_buffer_names_the_size_needed_and_writes_nothing),
      cmocka_unit_test(tensors_of_other_ranks_and_huge_meshes_are_unsupported),
      cmocka_unit_test(drawings_of_1d_layouts_name_every_coordinate_with_its_block),
      cmocka_unit_test(drawings_of_2d_layouts_name_every_coordinate_with_its_block),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

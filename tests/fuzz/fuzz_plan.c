/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target of plan creation: the input picks an abstract mesh (1-4 dims of 1-4), a tensor (1-4
 * dims, small or huge), two placement vectors, a cost model (each field absent, an extreme value or raw
 * bits, NaN and negatives included) and sometimes DTL_PLAN_TUNE text. dtl_plan_create must answer OK,
 * DTL_ERR_UNSUPPORTED or DTL_ERR_INVALID_ARGUMENT (never DTL_ERR_INTERNAL), with a safe message naming the
 * call; a plan has at most 16 steps, keeps its scratch within the larger local end at the coordinate, is
 * deterministic (planning again explains the same text), and its
 * explain text needs exactly dtl_plan_explain_needed bytes: one byte less is refused with nothing written. */
#include <float.h>
#include <math.h>
#include "fuzz_input.h"

static double fz_cost(fz_in *in) {
  static const double values[] = {0, 5e-324, 1e-300, 1e-12, 2e-10, 2e-6, 1, 1e300, DBL_MAX, -0.0, -1, NAN, INFINITY};
  unsigned b = fz_byte(in);
  if (b < 0xf0) return values[b % (sizeof values / sizeof *values)];
  return fz_double(in);
}

static char *explain(const dtl_plan *p) {
  size_t need = dtl_plan_explain_needed(p);
  FZ_CHECK(need > 1, "explain needs %zu bytes", need);
  char *buf = malloc(need);
  FZ_CHECK(buf != NULL, "malloc");
  memset(buf, 0x5a, need);
  FZ_FAILED(dtl_plan_explain(p, buf, need - 1), "dtl_plan_explain", DTL_ERR_INVALID_ARGUMENT);
  for (size_t i = 0; i < need; i++) FZ_CHECK(buf[i] == 0x5a, "explain wrote into a too-small buffer");
  FZ_CHECK(dtl_plan_explain(p, buf, need) == DTL_OK, "explain into %zu bytes: %s", need, dtl_last_error());
  FZ_CHECK(strlen(buf) + 1 == need, "explain needs %zu bytes but writes %zu", need, strlen(buf) + 1);
  size_t at;
  FZ_CHECK(dt_text_safe(buf, true, &at), "explain text: unsafe byte at %zu", at);
  return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size};
  int M = 1 + fz_below(&in, 4), mshape[4], coord[4];
  for (int m = 0; m < M; m++) mshape[m] = 1 + fz_below(&in, 4);
  for (int m = 0; m < M; m++) coord[m] = fz_below(&in, mshape[m]);
  dtl_dtype t = (dtl_dtype)fz_below(&in, DTL_NUM_DTYPES);
  int nd = 1 + fz_below(&in, 4);
  int64_t shape[4];
  for (int d = 0; d < nd; d++) {
    unsigned b = fz_byte(&in);
    shape[d] = b < 0xf0 ? (int64_t)(b % 21) : (int64_t)(fz_u64(&in) >> (b & 7) * 8 >> 1);
  }
  dtl_placement a[4], b[4];
  for (int m = 0; m < M; m++) a[m] = fz_placement(&in, nd);
  for (int m = 0; m < M; m++) b[m] = fz_placement(&in, nd);
  unsigned mode = fz_byte(&in);
  dtl_cost_model cost = {.mask = mode & 7};
  if (mode & 0x80) cost.mask = fz_u64(&in); /* unknown bits too */
  if (mode & 0x40) cost.flags = fz_u64(&in);
  cost.alpha_s = fz_cost(&in);
  cost.beta_s_per_byte = fz_cost(&in);
  cost.local_beta_s_per_byte = fz_cost(&in);
  if (mode & 0x20) { /* DTL_PLAN_TUNE: the next bytes up to a NUL, at most 64 */
    char tune[65];
    size_t k = 0;
    for (unsigned c; k < 64 && (c = fz_byte(&in)) != 0;) tune[k++] = (char)c;
    tune[k] = '\0';
    setenv("DTL_PLAN_TUNE", tune, 1);
  } else {
    unsetenv("DTL_PLAN_TUNE");
  }

  dtl_mesh *mesh = NULL;
  FZ_CHECK(dtl_mesh_create_abstract(M, mshape, coord, &mesh) == DTL_OK, "mesh: %s", dtl_last_error());
  dtl_layout *src = NULL, *dst = NULL;
  dtl_status st = dtl_layout_create(mesh, t, nd, shape, a, &src);
  if (st == DTL_OK) st = dtl_layout_create(mesh, t, nd, shape, b, &dst);
  if (st != DTL_OK) {
    FZ_FAILED(st, "dtl_layout_create", DTL_ERR_INVALID_ARGUMENT,
              DTL_ERR_UNSUPPORTED); /* UNSUPPORTED: P(avg) of integers, P(sum/prod/avg) of the 8-bit floats */
  } else {
    const dtl_cost_model *c = mode & 0x18 ? &cost : NULL;
    const char *fn = c ? "dtl_plan_create_with_cost" : "dtl_plan_create";
    dtl_plan *p = (dtl_plan *)&in, *again = NULL;
    st = c ? dtl_plan_create_with_cost(src, dst, c, &p) : dtl_plan_create(src, dst, &p);
    if (st != DTL_OK) {
      FZ_FAILED(st, fn, DTL_ERR_UNSUPPORTED, DTL_ERR_INVALID_ARGUMENT);
      FZ_CHECK(p == (dtl_plan *)&in, "a failed create wrote the plan");
    } else {
      int steps = dtl_plan_num_steps(p), colls = dtl_plan_num_collectives(p);
      FZ_CHECK(steps >= 0 && steps <= 16 && colls >= 0 && colls <= steps, "%d steps, %d collectives", steps, colls);
      FZ_CHECK(dtl_plan_cost(p) >= 0 && isfinite(dtl_plan_cost(p)), "cost %g", dtl_plan_cost(p));
      /* The scratch bound (plan.h, Memory: meshes of at most 1024 ranks, which these are), at the coordinate. */
      size_t es = dtl_dtype_size(t), ia = dtl_layout_local_count(src) * es, ib = dtl_layout_local_count(dst) * es;
      FZ_CHECK(dtl_plan_scratch_bytes(p) <= (ia > ib ? ia : ib), "scratch %zu > max(src %zu, dst %zu)",
               dtl_plan_scratch_bytes(p), ia, ib);
      char *text = explain(p);
      FZ_CHECK((c ? dtl_plan_create_with_cost(src, dst, c, &again) : dtl_plan_create(src, dst, &again)) == DTL_OK,
               "planning again failed: %s", dtl_last_error());
      char *text2 = explain(again);
      FZ_CHECK(strcmp(text, text2) == 0, "planning again gave another plan:\n%s\nthen\n%s", text, text2);
      free(text);
      free(text2);
      dtl_plan_destroy(again);
      dtl_plan_destroy(p);
    }
  }
  dtl_layout_destroy(src);
  dtl_layout_destroy(dst);
  dtl_mesh_destroy(mesh);
  return 0;
}

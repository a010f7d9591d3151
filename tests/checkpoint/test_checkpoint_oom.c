/* SPDX-License-Identifier: Apache-2.0 */
/* Out of memory at every allocation of the safetensors entry points (tests/common/dt_oom.h): opening a
 * file, reading a strided shard (its gathering window) and a box, reading TP weights, reading a quantized shard
 * (the scales' check buffer, the window) and quantized TP weights, and writing (begin, end with its copy buffer). Each failure is DTL_ERR_OUT_OF_MEMORY with a message, frees what it
 * allocated, writes no output (no handle, no destination bytes, no file left at the path), and the next call
 * works. JSON parsing and building allocate through jansson, outside the hook. Runs at 1 rank. */
#include <unistd.h>
#include "dt_oom.h"
#include "dtl/checkpoint.h"
#include "dtl/tp.h"
#include "qst_file.h"

#define POISON ((void *)0x5a5a)
#define R 40 /* rows of the tensor "w", [R, C] f32 */
#define C 24

static dt_oom_tally tally;
static char dir[64], path[128], out_path[128], qpath[128];
/* A quantized tensor: FP8 with 4 x 8 blocks, [R, C]; its fused-gate/up reading takes rows R/2 each. */
static const dtl_quant_format QF = {.kind = DTL_QUANT_FP8_BLOCK, .mask = DTL_QFMT_BLOCK, .block_rows = 4, .block_cols = 8};
#define QFILL 0x77

typedef struct {
  dtl_safetensors *f, *made;
  dtl_safetensors_writer *w, *made_w;
  dtl_mesh *mesh;
  dtl_layout *cols;
  dtl_tp_context *tp;
  float dst[R * C];
  dtl_safetensors *qf;
  dtl_qlayout *qcols;
  dtl_qbox qbox;
  dtl_qbuf qlocal;
  dtl_tp_qshard *made_q;
} ctx;

static void fresh(ctx *x) {
  REQUIRE_OK(dtl_safetensors_open(path, &x->f));
  REQUIRE_OK(dtl_safetensors_write_begin(out_path, &x->w));
  float v[6] = {1, 2, 3, 4, 5, 6};
  REQUIRE_OK(dtl_safetensors_write_add(x->w, "v", DTL_FLOAT32, 2, (int64_t[]){2, 3}, v));
  x->made = POISON;
  x->made_w = POISON;
  x->made_q = POISON;
  for (int i = 0; i < R * C; i++) x->dst[i] = -7;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    if (x->qlocal.part[p]) memset(x->qlocal.part[p], QFILL, x->qbox.part[p].bytes);
}
static void release(ctx *x) {
  dtl_safetensors_close(x->f);
  if (x->made != POISON) dtl_safetensors_close(x->made);
  if (x->made_w != POISON) dtl_safetensors_write_cancel(x->made_w);
  if (x->made_q != POISON) dtl_tp_qshard_destroy(x->made_q);
  dtl_safetensors_write_cancel(x->w); /* NULL once write_end consumed it */
  unlink(out_path);
}
static void undo(void *v) {
  release(v);
  fresh(v);
}
static bool untouched(void *v) {
  ctx *x = v;
  for (int i = 0; i < R * C; i++)
    if (x->dst[i] != -7) return false;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    for (size_t i = 0; x->qlocal.part[p] && i < x->qbox.part[p].bytes; i++)
      if (((unsigned char *)x->qlocal.part[p])[i] != QFILL) return false;
  return x->made == POISON && x->made_q == POISON && x->made_w == POISON && access(out_path, F_OK) != 0;
}

static dtl_status open_file(void *v) { return dtl_safetensors_open(path, &((ctx *)v)->made); }
static dtl_status read_shard(void *v) {
  ctx *x = v;
  return dtl_safetensors_read(x->f, "w", x->cols, x->dst);
}
static dtl_status read_box(void *v) {
  return dtl_safetensors_read_box(((ctx *)v)->f, "w", DTL_FLOAT32, 2, (int64_t[]){3, 5}, (int64_t[]){30, 7},
                                  ((ctx *)v)->dst);
}
static dtl_status read_tp_column(void *v) {
  ctx *x = v;
  return dtl_tp_weight_read_column(x->tp, x->f, "w", R, C, x->dst);
}
static dtl_status read_quant(void *v) {
  ctx *x = v;
  return dtl_safetensors_qread_hf(x->qf, "q", x->qcols, &x->qlocal);
}
static dtl_status read_tp_gate_up(void *v) {
  ctx *x = v;
  return dtl_tp_qweight_read_gate_up(x->tp, x->qf, &QF, "q", NULL, R / 2, C, &x->made_q);
}
static dtl_status write_begin(void *v) { return dtl_safetensors_write_begin(out_path, &((ctx *)v)->made_w); }
static dtl_status write_end(void *v) {
  ctx *x = v;
  dtl_status st = dtl_safetensors_write_end(x->w);
  x->w = NULL; /* consumed, whatever the outcome */
  return st;
}
/* write_begin makes nothing at the path; only its output handle is checked. */
static bool handle_untouched(void *v) { return ((ctx *)v)->made_w == POISON && untouched(v); }

static void every_checkpoint_entry_point_survives_each_failed_allocation(void) {
  static ctx x;
  /* A layout whose shard is 3 strided column runs per row: read through the gathering window. */
  REQUIRE_OK(dtl_mesh_create_abstract(1, (int[]){8}, (int[]){3}, &x.mesh));
  REQUIRE_OK(dtl_layout_create(x.mesh, DTL_FLOAT32, 2, (int64_t[]){R, C}, (dtl_placement[]){dtl_shard(1)}, &x.cols));
  dtl_comm *world;
  dtl_mesh *wm;
  REQUIRE_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  REQUIRE_OK(dtl_mesh_create(world, 1, &dt_size, &wm));
  REQUIRE_OK(dtl_tp_context_create(wm, 0, NULL, &x.tp));
  REQUIRE_OK(dtl_safetensors_open(qpath, &x.qf));
  REQUIRE_OK(dtl_qlayout_create(x.mesh, &QF, 2, (int64_t[]){R, C}, (dtl_placement[]){dtl_shard(1)}, &x.qcols));
  REQUIRE_OK(dtl_qlayout_local_boxes(x.qcols, NULL, &x.qbox));
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++)
    x.qlocal.part[p] = x.qbox.part[p].ndim >= 0 ? malloc(x.qbox.part[p].bytes) : NULL;
  fresh(&x);
  const dt_oom_case cases[] = {
      {.what = "dtl_safetensors_open", .call = open_file, .untouched = untouched, .undo = undo, .ctx = &x},
      {.what = "dtl_safetensors_read (strided shard)", .call = read_shard, .untouched = untouched, .undo = undo, .ctx = &x},
      {.what = "dtl_safetensors_read_box", .call = read_box, .untouched = untouched, .undo = undo, .ctx = &x},
      {.what = "dtl_tp_weight_read_column", .call = read_tp_column, .untouched = untouched, .undo = undo, .ctx = &x},
      {.what = "dtl_safetensors_qread_hf (strided)", .call = read_quant, .untouched = untouched, .undo = undo, .ctx = &x},
      {.what = "dtl_tp_qweight_read_gate_up", .call = read_tp_gate_up, .untouched = untouched, .undo = undo, .ctx = &x},
      {.what = "dtl_safetensors_write_begin", .call = write_begin, .untouched = handle_untouched, .undo = undo, .ctx = &x},
      {.what = "dtl_safetensors_write_end", .call = write_end, .untouched = untouched, .undo = undo, .ctx = &x,
       .caches = true}, /* the writer is consumed: undo remakes it before the next call */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) dt_oom_sweeps(&cases[i], false, &tally);
  release(&x);
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(x.qlocal.part[p]);
  dtl_qlayout_destroy(x.qcols);
  dtl_safetensors_close(x.qf);
  dtl_tp_context_destroy(x.tp);
  dtl_mesh_destroy(wm);
  dtl_comm_destroy(world);
  dtl_layout_destroy(x.cols);
  dtl_mesh_destroy(x.mesh);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  if (dt_size != 1) return dt_skip("local calls: one rank is enough");
  snprintf(dir, sizeof dir, "/tmp/dtl_ckpt_oom_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  snprintf(path, sizeof path, "%s/in.safetensors", dir);
  snprintf(out_path, sizeof out_path, "%s/out.safetensors", dir);
  snprintf(qpath, sizeof qpath, "%s/q.safetensors", dir);
  qst_qtensor q;
  qst_tensor qt[2];
  if (!qst_make(&q, &QF, 2, (int64_t[]){R, C}, "q", 5) || !qst_write(qpath, qt, qst_add(qt, 0, &q))) return 1;
  qst_free(&q);
  float *w = malloc(sizeof(float) * R * C);
  for (int i = 0; i < R * C; i++) w[i] = (float)i;
  dtl_safetensors_writer *wr;
  REQUIRE_OK(dtl_safetensors_write_begin(path, &wr));
  REQUIRE_OK(dtl_safetensors_write_add(wr, "w", DTL_FLOAT32, 2, (int64_t[]){R, C}, w));
  REQUIRE_OK(dtl_safetensors_write_metadata(wr, "format", "pt"));
  REQUIRE_OK(dtl_safetensors_write_end(wr));
  free(w);
  RUN(every_checkpoint_entry_point_survives_each_failed_allocation);
  printf("%ld calls, %ld of them failed by an injected allocation failure\n", tally.calls, tally.failures);
  unlink(path);
  unlink(qpath);
  rmdir(dir);
  return dt_finish();
}

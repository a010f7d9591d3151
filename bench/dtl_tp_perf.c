/* SPDX-License-Identifier: Apache-2.0 */
/* Forward time of the tensor-parallel MLP and attention blocks: the dense run (tp = 1, each rank on its own
 * over MPI_COMM_SELF, all ranks at once) against the TP run over all ranks, with the parallel efficiency
 * dense / (tp x time) and the share of the TP time that its collective alone takes (the same collective on
 * buffers of the same size, timed separately). #wrong counts outputs that differ from the dense run by more
 * than 1e-4 x (1 + max |dense|).
 *
 * Sizes in the nccl-tests manner: -b/-e/-f give the hidden size range (K/M/G suffixes accepted), -t the
 * token counts, -n/-w the timed and warm-up iterations. The MLP is SwiGLU with ffn = 8/3 hidden rounded to
 * 64 (as Llama); attention has hidden/128 q heads of 128 and a quarter as many kv heads. -m skips shapes
 * whose dense forward exceeds that many GFLOP (the host GEMM is single-threaded). -s adds the
 * sequence-parallel variant. OpenBLAS runs one thread per rank (openblas_set_num_threads(1) unless
 * OPENBLAS_NUM_THREADS is set) so that ranks sharing cores do not fight.
 * Run: mpirun -n 2 ./dtl_tp_perf -b 1024 -e 4096 -f 2 -t 1,16,256 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "bench_util.h"

typedef enum { MLP, ATTN } block_kind;

/* One block on one context: created from the dense weights, run through its layouts. */
typedef struct {
  block_kind kind;
  dtl_tp_mlp *mlp;
  dtl_tp_attention *attn;
  dtl_layout *in, *out;
} block;

typedef struct {
  int64_t hidden, ffn, heads, kv_heads, head_dim;
  float *gate_up, *down, *qkv, *wo;
} dense_weights;

static void block_make(dtl_tp_context *ctx, block_kind kind, const dense_weights *w, int64_t tokens, int sp, block *b) {
  memset(b, 0, sizeof *b);
  b->kind = kind;
  uint64_t flags = sp ? DTL_TP_SEQUENCE_PARALLEL : 0;
  if (kind == MLP) {
    dtl_tp_mlp_params p = {.flags = flags, .activation = DTL_TP_ACT_SILU_GATED, .hidden = w->hidden, .ffn = w->ffn,
                           .gate_up = w->gate_up, .down = w->down};
    BENCH_TRY(dtl_tp_mlp_create(ctx, &p, &b->mlp));
    BENCH_TRY(dtl_tp_mlp_layouts(b->mlp, tokens, &b->in, &b->out));
  } else {
    dtl_tp_attention_params p = {.flags = flags, .hidden = w->hidden, .q_heads = w->heads, .kv_heads = w->kv_heads,
                                 .head_dim = w->head_dim, .qkv = w->qkv, .out = w->wo};
    BENCH_TRY(dtl_tp_attention_create(ctx, &p, &b->attn));
    BENCH_TRY(dtl_tp_attention_layouts(b->attn, tokens, &b->in, &b->out));
  }
}

static void block_run(block *b, const float *x, float *y) {
  if (b->kind == MLP) BENCH_TRY(dtl_tp_mlp_forward(b->mlp, b->in, x, y));
  else BENCH_TRY(dtl_tp_attention_forward(b->attn, b->in, x, y));
}

static void block_free(block *b) {
  dtl_tp_mlp_destroy(b->mlp);
  dtl_tp_attention_destroy(b->attn);
  dtl_layout_destroy(b->in);
  dtl_layout_destroy(b->out);
}

/* Seconds per call of fn over the slowest rank of comm. */
typedef void (*step_fn)(void *arg);
static double timed(MPI_Comm comm, int warmup, int iters, step_fn fn, void *arg) {
  for (int i = 0; i < warmup; i++) fn(arg);
  MPI_Barrier(comm);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) fn(arg);
  double t = (MPI_Wtime() - t0) / iters, tmax;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, comm);
  return tmax;
}

typedef struct {
  block *b;
  const float *x;
  float *y;
} run_arg;
static void run_step(void *p) {
  run_arg *a = p;
  block_run(a->b, a->x, a->y);
}

/* The block's collectives alone: the row-parallel reduction (plus the sequence gather with sp). */
typedef struct {
  dtl_tp_context *ctx;
  dtl_layout *out, *in;
  float *partial, *y, *xfull;
  const float *x;
  int sp;
} comm_arg;
static void comm_step(void *p) {
  comm_arg *a = p;
  if (a->sp) BENCH_TRY(dtl_tp_sequence_gather(a->ctx, a->in, a->x, a->xfull));
  BENCH_TRY(dtl_tp_row_parallel_reduce(a->ctx, a->out, a->partial, NULL, a->y));
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, np;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  int64_t hb = 1024, he = 4096, hf = 2, tokens[16] = {1, 16, 256};
  int ntok = 3, iters = 5, warmup = 1, with_sp = 0;
  double max_gflop = 40;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-s")) { with_sp = 1; continue; }
    if (!v) break;
    if (!strcmp(a, "-b")) hb = (int64_t)bench_parse_size(v);
    else if (!strcmp(a, "-e")) he = (int64_t)bench_parse_size(v);
    else if (!strcmp(a, "-f")) hf = (int64_t)bench_parse_size(v);
    else if (!strcmp(a, "-n")) iters = atoi(v);
    else if (!strcmp(a, "-w")) warmup = atoi(v);
    else if (!strcmp(a, "-m")) max_gflop = atof(v);
    else if (!strcmp(a, "-t")) {
      ntok = 0;
      for (char *s = argv[i + 1], *tok; ntok < 16 && (tok = strtok(s, ",")); s = NULL) tokens[ntok++] = (int64_t)bench_parse_size(tok);
    } else {
      if (rank == 0) fprintf(stderr, "unknown option %s\n", a);
      MPI_Finalize();
      return 2;
    }
    i++;
  }
  if (hf < 2) hf = 2;
  if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);

  dtl_comm *world, *self;
  dtl_mesh *mesh, *mesh1;
  dtl_tp_context *tp, *dense;
  int one = 1;
  BENCH_TRY(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  BENCH_TRY(dtl_comm_from_mpi(MPI_COMM_SELF, &self));
  BENCH_TRY(dtl_mesh_create(world, 1, &np, &mesh));
  BENCH_TRY(dtl_mesh_create(self, 1, &one, &mesh1));
  BENCH_TRY(dtl_tp_context_create(mesh, 0, NULL, &tp));
  BENCH_TRY(dtl_tp_context_create(mesh1, 0, NULL, &dense));
  if (rank == 0) {
    printf("# dtl_tp_perf: tp=%d ranks, f32 host, OpenBLAS threads per rank: %s, iters %d, warmup %d, max %.0f GFLOP\n", np,
           getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "1", iters, warmup, max_gflop);
    printf("# dense = the same block at tp=1 on each rank at once; effic = dense / (tp x time); comm = the block's\n"
           "# collective(s) alone on same-size buffers; #wrong = outputs off the dense run by > 1e-4 x (1 + max|dense|)\n");
    printf("%-5s %6s %6s %6s %4s %3s %11s %11s %6s %10s %6s %6s\n", "block", "hidden", "ffn/hq", "tokens", "sp", "tp",
           "dense(us)", "time(us)", "effic", "comm(us)", "comm%", "#wrong");
  }
  for (int64_t H = hb; H <= he; H *= hf) {
    dense_weights w = {.hidden = H, .ffn = (H * 8 / 3 + 63) / 64 * 64, .head_dim = 128};
    w.heads = H / 128 > 0 ? H / 128 : 1;
    w.kv_heads = w.heads >= 4 ? w.heads / 4 : 1;
    w.gate_up = bench_uniform(1, (size_t)(2 * w.ffn * H), 1.0f / sqrtf((float)H));
    w.down = bench_uniform(2, (size_t)(H * w.ffn), 1.0f / sqrtf((float)w.ffn));
    w.qkv = bench_uniform(3, (size_t)((w.heads + 2 * w.kv_heads) * w.head_dim * H), 1.0f / sqrtf((float)H));
    w.wo = bench_uniform(4, (size_t)(H * w.heads * w.head_dim), 1.0f / sqrtf((float)(w.heads * w.head_dim)));
    for (int ti = 0; ti < ntok; ti++)
      for (int kind = MLP; kind <= ATTN; kind++)
        for (int sp = 0; sp <= with_sp; sp++) {
          int64_t T = tokens[ti];
          double flop = kind == MLP ? 2.0 * T * H * 3 * w.ffn
                                    : 2.0 * T * H * (w.heads + 2 * w.kv_heads) * w.head_dim +
                                          2.0 * T * T * w.heads * w.head_dim * 2 + 2.0 * T * w.heads * w.head_dim * H;
          const char *name = kind == MLP ? "mlp" : "attn";
          if (flop > max_gflop * 1e9) {
            if (rank == 0) printf("%-5s %6lld %6lld %6lld %4d   skipped: %.0f GFLOP > -m %.0f\n", name, (long long)H,
                                  (long long)(kind == MLP ? w.ffn : w.heads), (long long)T, sp, flop / 1e9, max_gflop);
            continue;
          }
          float *x = bench_uniform(5, (size_t)(T * H), 1.0f), *yd = malloc(sizeof(float) * (size_t)(T * H) + 4);
          block bd, bt;
          block_make(dense, kind, &w, T, 0, &bd);
          block_make(tp, kind, &w, T, sp, &bt);
          run_arg ad = {&bd, x, yd};
          double t_dense = timed(MPI_COMM_WORLD, warmup, iters, run_step, &ad);
          int64_t shape[2], off[2];
          BENCH_TRY(dtl_layout_local_box(bt.in, NULL, shape, off));
          float *yt = malloc(sizeof(float) * (size_t)(shape[0] * H) + 4);
          run_arg at = {&bt, x + off[0] * H, yt};
          double t_tp = timed(MPI_COMM_WORLD, warmup, iters, run_step, &at);
          /* Correctness of the timed output against the dense run. */
          double mx = 0;
          long wrong = 0;
          for (int64_t i = 0; i < T * H; i++) mx = fabs(yd[i]) > mx ? fabs(yd[i]) : mx;
          for (int64_t i = 0; i < shape[0] * H; i++)
            wrong += !(fabs((double)yt[i] - yd[off[0] * H + i]) <= 1e-4 * (1 + mx));
          long wrong_all;
          MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
          /* The collective(s) alone. */
          float *partial = bench_uniform(6, (size_t)(T * H), 1.0f), *xfull = malloc(sizeof(float) * (size_t)(T * H) + 4);
          comm_arg ca = {tp, bt.out, bt.in, partial, yt, xfull, x + off[0] * H, sp};
          double t_comm = timed(MPI_COMM_WORLD, warmup, iters, comm_step, &ca);
          if (rank == 0)
            printf("%-5s %6lld %6lld %6lld %4d %3d %11.1f %11.1f %6.2f %10.1f %5.1f%% %6ld\n", name, (long long)H,
                   (long long)(kind == MLP ? w.ffn : w.heads), (long long)T, sp, np, t_dense * 1e6, t_tp * 1e6,
                   t_dense / (np * t_tp), t_comm * 1e6, 100.0 * t_comm / t_tp, wrong_all);
          fflush(stdout);
          block_free(&bd);
          block_free(&bt);
          free(x), free(yd), free(yt), free(partial), free(xfull);
        }
    free(w.gate_up), free(w.down), free(w.qkv), free(w.wo);
  }
  dtl_tp_context_destroy(tp);
  dtl_tp_context_destroy(dense);
  dtl_mesh_destroy(mesh);
  dtl_mesh_destroy(mesh1);
  dtl_comm_destroy(world);
  dtl_comm_destroy(self);
  MPI_Finalize();
  return 0;
}

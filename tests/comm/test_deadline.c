/* SPDX-License-Identifier: Apache-2.0 */
/* Deadlines (comm.h, dtl_comm_set_timeout): a rank that skips a call, sleeps past the deadline or leaves its loop
 * early costs its peers DTL_ERR_TIMEOUT within the deadline + 1 s, naming the operation, instead of a hang; the
 * communicator has failed then, on every communicator of its constructor, and later calls return at once. The
 * layers built on a communicator (plans, TP layers, MoE dispatch, CP ring) inherit its deadline. Every case makes
 * a fresh communicator, since a timeout fails it for good. The late rank is the last one. Buffers are static: MPI
 * may still write into what a timed-out call posted (comm.h), so none is freed. */
#include <math.h>
#include <string.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>
#include "dtl.h"
#include "dtl_test.h"

#define DEADLINE 0.4 /* seconds */
#define LATE_SLEEP_US 1200000

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool late(void) { return dt_size > 1 && dt_rank == dt_size - 1; }

static dtl_comm *fresh(double timeout) {
  dtl_comm *c = NULL;
  CHECK_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &c));
  if (c) CHECK_OK(dtl_comm_set_timeout(c, timeout));
  return c;
}

/* The verdict of one timed call st on a rank that was not late, which took waited seconds. */
static void expect_timeout(const char *what, dtl_status st, double waited, const char *named) {
  CHECK(st == DTL_ERR_TIMEOUT, "%s: %s (expected DTL_ERR_TIMEOUT): %s", what, dtl_status_name(st), dtl_last_error());
  CHECK(waited >= DEADLINE * 0.9 && waited <= DEADLINE + 1.0, "%s: returned after %.3f s (deadline %g s)", what, waited,
        DEADLINE);
  /* named: the operation, or "a|b" when the layer's own name or its collective's may lead the message */
  bool found = false;
  char alts[128];
  snprintf(alts, sizeof alts, "%s", named);
  for (char *save = NULL, *w = strtok_r(alts, "|", &save); w; w = strtok_r(NULL, "|", &save))
    found |= strstr(dtl_last_error(), w) != NULL;
  CHECK(found, "%s: message \"%s\" does not name %s", what, dtl_last_error(), named);
  CHECK(strstr(dtl_last_error(), "timed out after") != NULL, "%s: message \"%s\"", what, dtl_last_error());
}

/* After a timeout, a call on c returns DTL_ERR_COMM at once, naming the timeout. */
static void expect_failed_at_once(const char *what, dtl_comm *c) {
  float v = 1;
  double t0 = now_s();
  dtl_status st = dtl_all_reduce(c, &v, &v, 1, DTL_FLOAT32, DTL_SUM);
  double took = now_s() - t0;
  CHECK(st == DTL_ERR_COMM, "%s: a later call -> %s (expected DTL_ERR_COMM)", what, dtl_status_name(st));
  CHECK(took < 0.1, "%s: a later call took %.3f s on a failed communicator", what, took);
  CHECK(strstr(dtl_last_error(), "timed out") != NULL, "%s: later message \"%s\"", what, dtl_last_error());
}

/* Whether c failed here (a timeout on this rank, or on another communicator of its constructor). What is built on a
 * failed communicator is left as it is, never destroyed: MPI may still complete the timed-out call into its
 * buffers (comm.h: the next step after a timeout is dtl_comm_abort or the process's end). */
static bool failed(dtl_comm *c) { return dtl_comm_check(c) == DTL_ERR_COMM && strstr(dtl_last_error(), "has failed"); }

/* The late rank's half of a barrier its peers started and left: the same call, so that it matches whatever they
 * posted (the agreement under DTL_CHECK, then the barrier); it may time out in what they never posted. */
static void drain_barrier(dtl_comm *c) {
  dtl_status st = dtl_barrier(c);
  CHECK(st == DTL_OK || st == DTL_ERR_TIMEOUT, "the late rank's barrier: %s", dtl_status_name(st));
}

static void timeout_arguments_are_checked_and_named(void) {
  dtl_comm *c = fresh(0);
  if (!c) return;
  CHECK(dtl_comm_timeout(c) == 0, "the default timeout is %g", dtl_comm_timeout(c));
  CHECK(dtl_comm_timeout(NULL) == -1, "NULL has timeout %g", dtl_comm_timeout(NULL));
  CHECK_ERROR(dtl_comm_set_timeout(NULL, 1), DTL_ERR_INVALID_ARGUMENT, "comm=NULL");
  CHECK_ERROR(dtl_comm_set_timeout(c, -1), DTL_ERR_INVALID_ARGUMENT, "seconds=-1");
  CHECK_ERROR(dtl_comm_set_timeout(c, NAN), DTL_ERR_INVALID_ARGUMENT, "seconds=nan");
  CHECK_ERROR(dtl_comm_set_timeout(c, 2e9), DTL_ERR_INVALID_ARGUMENT, "seconds=2e+09");
  CHECK(dtl_comm_timeout(c) == 0, "a refused timeout changed it to %g", dtl_comm_timeout(c));
  CHECK_OK(dtl_comm_set_timeout(c, 2.5));
  dtl_comm *s = NULL;
  CHECK_OK(dtl_comm_split(c, 0, dt_rank, &s));
  CHECK(s && dtl_comm_timeout(s) == 2.5, "a split has timeout %g, its parent 2.5", dtl_comm_timeout(s));
  if (s) CHECK_ERROR(dtl_comm_set_timeout(s, 1), DTL_ERR_INVALID_ARGUMENT, "comm is a split");
  CHECK_OK(dtl_comm_set_timeout(c, 0.5)); /* the constructor's setting is every communicator's */
  CHECK(s && dtl_comm_timeout(s) == 0.5, "the split kept timeout %g after its parent's became 0.5", dtl_comm_timeout(s));
  if (dt_size > 1) {
    dtl_status st = dtl_comm_set_timeout(c, late() ? 3 : 2);
    CHECK(st == DTL_ERR_MISMATCH, "timeouts that differ between the ranks -> %s", dtl_status_name(st));
    CHECK(dtl_comm_timeout(c) == 0.5, "a refused timeout changed it to %g", dtl_comm_timeout(c));
  }
  dtl_comm_destroy(s);
  dtl_comm_destroy(c);
}

static void dtl_timeout_is_read_at_creation_and_a_bad_value_fails_every_rank(void) {
  setenv("DTL_TIMEOUT", "1.5", 1);
  dtl_comm *c = NULL;
  CHECK_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &c));
  CHECK(c && dtl_comm_timeout(c) == 1.5, "DTL_TIMEOUT=1.5 gave timeout %g", dtl_comm_timeout(c));
  dtl_comm_destroy(c);
  c = NULL;
  bool bad = dt_rank == dt_size - 1;
  if (bad) setenv("DTL_TIMEOUT", "soon", 1);
  dtl_status st = dtl_comm_from_mpi(MPI_COMM_WORLD, &c);
  CHECK(st == DTL_ERR_INVALID_ARGUMENT && c == NULL, "a bad DTL_TIMEOUT on the last rank -> %s", dtl_status_name(st));
  if (bad) CHECK(strstr(dtl_last_error(), "DTL_TIMEOUT=\"soon\"") != NULL, "message \"%s\"", dtl_last_error());
  else CHECK(strstr(dtl_last_error(), "failed") != NULL, "message \"%s\"", dtl_last_error());
  dtl_comm_destroy(c);
  c = NULL;
  if (dt_size > 1) { /* a valid value that differs between the ranks: a mismatch on every rank */
    setenv("DTL_TIMEOUT", bad ? "7" : "5", 1);
    st = dtl_comm_from_mpi(MPI_COMM_WORLD, &c);
    CHECK(st == DTL_ERR_MISMATCH && c == NULL, "DTL_TIMEOUT 7 on one rank, 5 on the others -> %s", dtl_status_name(st));
    CHECK(strstr(dtl_last_error(), "DTL_TIMEOUT differs") != NULL, "message \"%s\"", dtl_last_error());
    dtl_comm_destroy(c);
  }
  unsetenv("DTL_TIMEOUT");
}

static void a_rank_that_skips_a_barrier_costs_its_peers_a_timeout_and_later_calls_fail_at_once(void) {
  if (dt_size == 1) return;
  dtl_comm *c = fresh(DEADLINE);
  if (!c) return;
  if (!late()) {
    double t0 = now_s();
    dtl_status st = dtl_barrier(c);
    expect_timeout("barrier", st, now_s() - t0, "dtl_barrier");
    char size[48];
    snprintf(size, sizeof size, "communicator of %d ranks", dt_size);
    CHECK(strstr(dtl_last_error(), size) != NULL, "message \"%s\" does not name the %s", dtl_last_error(), size);
    expect_failed_at_once("barrier", c);
  }
  /* The late rank completes the barrier its peers left behind, so that no MPI operation stays open (with the
   * nonblocking form: MPI never matches it with a blocking one). */
  MPI_Barrier(MPI_COMM_WORLD);
  if (late()) drain_barrier(c);
  MPI_Barrier(MPI_COMM_WORLD);
  dtl_comm_destroy(c);
}

/* A timed call on every rank, the late one first sleeping past the deadline; make runs before (collective set-up
 * on c), call is the timed call, named its operation's name. */
typedef dtl_status (*timed_call)(void *arg);

static void late_rank(const char *what, dtl_comm *c, timed_call call, void *arg, const char *named) {
  if (late()) usleep(LATE_SLEEP_US);
  double t0 = now_s();
  dtl_status st = call(arg);
  double waited = now_s() - t0;
  if (!late()) {
    expect_timeout(what, st, waited, named);
    expect_failed_at_once(what, c);
  } else {
    /* Its peers left: it completes what they had posted, then waits for what they never post. */
    CHECK(st == DTL_OK || st == DTL_ERR_TIMEOUT, "%s: the late rank got %s: %s", what, dtl_status_name(st),
          dtl_last_error());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

typedef struct {
  dtl_comm *c;
  float *a, *b;
  size_t n;
} coll_arg;

static dtl_status all_reduce_call(void *p) {
  coll_arg *x = p;
  return dtl_all_reduce(x->c, x->a, x->b, x->n, DTL_FLOAT32, DTL_SUM);
}

static void a_rank_that_sleeps_past_the_deadline_times_out_mpi_calls_and_dtl_algorithms(void) {
  if (dt_size == 1) return;
  /* 64 elements take MPI_Iallreduce; 1 Mi elements dtl's rs_ag (its waits timed one by one). */
  static float a[2][(size_t)1 << 20], b[2][(size_t)1 << 20];
  size_t sizes[] = {64, (size_t)1 << 20};
  for (int i = 0; i < 2; i++) {
    dtl_comm *c = fresh(DEADLINE);
    if (!c) return;
    coll_arg x = {c, a[i], b[i], sizes[i]};
    late_rank(i ? "all_reduce 4 MiB" : "all_reduce 256 B", c, all_reduce_call, &x, "dtl_all_reduce");
    dtl_comm_destroy(c);
  }
}

static void a_timeout_fails_every_communicator_of_the_constructor(void) {
  if (dt_size == 1) return;
  dtl_comm *c = fresh(DEADLINE);
  if (!c) return;
  dtl_mesh *m = NULL;
  int shape = dt_size;
  CHECK_OK(dtl_mesh_create(c, 1, &shape, &m));
  if (!m) {
    dtl_comm_destroy(c);
    return;
  }
  dtl_comm *dim = dtl_mesh_dim_comm(m, 0);
  if (!late()) {
    double t0 = now_s();
    dtl_status st = dtl_barrier(dim);
    expect_timeout("mesh dim barrier", st, now_s() - t0, "(mesh dim 0)");
    expect_failed_at_once("the mesh's parent", c); /* another communicator of the same constructor */
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (late()) drain_barrier(dim);
  MPI_Barrier(MPI_COMM_WORLD);
  if (failed(c)) return;
  dtl_mesh_destroy(m);
  dtl_comm_destroy(c);
}

static void a_rank_that_leaves_its_loop_early_costs_its_peers_a_timeout(void) {
  if (dt_size == 1) return;
  dtl_comm *c = fresh(DEADLINE);
  if (!c) return;
  float v[4] = {1, 2, 3, 4};
  dtl_status st = DTL_OK;
  int i = 0;
  double t0 = 0;
  for (; i < 5 && st == DTL_OK; i++) {
    if (late() && i == 3) break; /* the late rank leaves after three calls */
    t0 = now_s();
    st = dtl_all_reduce(c, v, v, 4, DTL_FLOAT32, DTL_MAX);
  }
  if (!late()) {
    CHECK(i == 4, "the loop stopped at call %d (expected the fourth to time out)", i);
    expect_timeout("loop", st, now_s() - t0, "dtl_all_reduce");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (late()) { /* the call it left out, as drain_barrier */
    st = dtl_all_reduce(c, v, v, 4, DTL_FLOAT32, DTL_MAX);
    CHECK(st == DTL_OK || st == DTL_ERR_TIMEOUT, "the late rank's all_reduce: %s", dtl_status_name(st));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  dtl_comm_destroy(c);
}

/* --- the layers -------------------------------------------------------------------------------------------- */
typedef struct {
  const dtl_layout *src, *dst;
  const void *in;
  void *out;
} plan_arg;

static dtl_status redistribute_call(void *p) {
  plan_arg *x = p;
  return dtl_redistribute(x->src, x->in, x->dst, x->out);
}

static void a_plan_inherits_the_deadline(void) {
  if (dt_size == 1) return;
  dtl_comm *c = fresh(DEADLINE);
  if (!c) return;
  dtl_mesh *m = NULL;
  int shape = dt_size;
  int64_t n = 64 * dt_size;
  dtl_layout *s0 = NULL, *r = NULL;
  dtl_placement ps = dtl_shard(0), pr = dtl_replicate();
  CHECK_OK(dtl_mesh_create(c, 1, &shape, &m));
  CHECK_OK(dtl_layout_create(m, DTL_FLOAT32, 1, &n, &ps, &s0));
  CHECK_OK(dtl_layout_create(m, DTL_FLOAT32, 1, &n, &pr, &r));
  static float in[64], out[64 * 64];
  if (s0 && r && dt_size <= 64) {
    plan_arg x = {s0, r, in, out};
    late_rank("plan S(0) -> R", c, redistribute_call, &x, "dtl_redistribute|dtl_all_gather");
  }
  if (failed(c)) return;
  dtl_layout_destroy(s0);
  dtl_layout_destroy(r);
  dtl_mesh_destroy(m);
  dtl_comm_destroy(c);
}

/* The agreement over two meshes that form no communicator (DTL_CHECK) runs on point-to-point messages to its
 * leader, which can tell who had not arrived: meshes over ranks 0 and 1 of three or more, rank 1 late. */
static void the_agreement_over_two_meshes_names_the_rank_that_had_not_arrived(void) {
  if (dt_size < 3) return;
  setenv("DTL_CHECK", "1", 1);
  dtl_comm *c = fresh(DEADLINE);
  unsetenv("DTL_CHECK");
  if (!c) return;
  dtl_mesh *a = NULL, *b = NULL;
  int two = 2;
  CHECK_OK(dtl_mesh_create_from_ranks(c, 2, (int[]){0, 1}, 1, &two, &a));
  CHECK_OK(dtl_mesh_create_from_ranks(c, 2, (int[]){1, 0}, 1, &two, &b));
  int64_t n = 8;
  dtl_placement ps = dtl_shard(0);
  dtl_layout *src = NULL, *dst = NULL;
  CHECK_OK(dtl_layout_create(a, DTL_FLOAT32, 1, &n, &ps, &src));
  CHECK_OK(dtl_layout_create(b, DTL_FLOAT32, 1, &n, &ps, &dst));
  static float in[8], out[8];
  bool member = dt_rank < 2;
  if (src && dst && member) {
    if (dt_rank == 1) usleep(LATE_SLEEP_US);
    double t0 = now_s();
    dtl_status st = dtl_redistribute(src, in, dst, out);
    if (dt_rank == 0) {
      expect_timeout("agreement over two meshes", st, now_s() - t0, "dtl_redistribute");
      CHECK(strstr(dtl_last_error(), "no message yet from rank(s) 1") != NULL, "message \"%s\" does not name rank 1",
            dtl_last_error());
    } else {
      CHECK(st == DTL_OK || st == DTL_ERR_TIMEOUT, "the late rank: %s", dtl_status_name(st));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (failed(c)) return;
  dtl_layout_destroy(src);
  dtl_layout_destroy(dst);
  dtl_mesh_destroy(b);
  dtl_mesh_destroy(a);
  dtl_comm_destroy(c);
}

typedef struct {
  dtl_tp_linear *l;
  const dtl_layout *xl;
  const float *x;
  float *y;
} tp_arg;

static dtl_status tp_call(void *p) {
  tp_arg *a = p;
  return dtl_tp_linear_forward(a->l, a->xl, a->x, a->y);
}

static void a_tp_forward_inherits_the_deadline(void) {
  if (dt_size == 1) return;
  dtl_comm *c = fresh(DEADLINE);
  if (!c) return;
  enum { TOK = 4, HID = 8 };
  dtl_mesh *m = NULL;
  int shape = dt_size;
  dtl_tp_context *ctx = NULL;
  dtl_tp_linear *row = NULL;
  dtl_layout *xl = NULL;
  static float w[HID * HID], x[TOK * HID], y[TOK * HID];
  CHECK_OK(dtl_mesh_create(c, 1, &shape, &m));
  if (m) CHECK_OK(dtl_tp_context_create(m, 0, NULL, &ctx));
  dtl_tp_linear_params lp = {.kind = DTL_TP_ROW, .in_features = HID, .out_features = HID, .weight = w};
  if (ctx) CHECK_OK(dtl_tp_linear_create(ctx, &lp, &row));
  if (ctx) CHECK_OK(dtl_tp_activation_layout(ctx, TOK, HID, dtl_shard(1), &xl));
  if (row && xl) {
    tp_arg a = {row, xl, x, y};
    late_rank("row-parallel forward", c, tp_call, &a, "dtl_tp_linear_forward|dtl_all_reduce");
  }
  if (failed(c)) return;
  dtl_layout_destroy(xl);
  dtl_tp_linear_destroy(row);
  dtl_tp_context_destroy(ctx);
  dtl_mesh_destroy(m);
  dtl_comm_destroy(c);
}

typedef struct {
  dtl_moe_layout *L;
  const float *x;
  float *in;
} moe_arg;

static dtl_status moe_call(void *p) {
  moe_arg *a = p;
  return dtl_moe_layout_dispatch(a->L, a->x, a->in);
}

static void a_moe_dispatch_inherits_the_deadline(void) {
  if (dt_size == 1) return;
  dtl_comm *c = fresh(DEADLINE);
  if (!c) return;
  enum { TOK = 4, TOPK = 2, HID = 4 };
  int experts = 2 * dt_size;
  dtl_moe_placement *pl = NULL;
  dtl_moe_layout *L = NULL;
  int32_t ids[TOK * TOPK];
  static float wts[TOK * TOPK], x[TOK * HID];
  for (int t = 0; t < TOK * TOPK; t++) {
    ids[t] = (int32_t)((t * 3 + dt_rank) % experts);
    wts[t] = 0.5f;
  }
  for (int t = 0; t < TOK; t++) /* distinct experts per token */
    if (ids[t * TOPK] == ids[t * TOPK + 1]) ids[t * TOPK + 1] = (ids[t * TOPK + 1] + 1) % experts;
  CHECK_OK(dtl_moe_placement_create(experts, dt_size, NULL, &pl));
  if (pl) CHECK_OK(dtl_moe_layout_create(c, pl, TOK, TOPK, ids, wts, HID, DTL_FLOAT32, NULL, &L));
  static float in[TOK * TOPK * 64 * HID];
  if (L && dt_size <= 64) {
    moe_arg a = {L, x, in};
    late_rank("MoE dispatch", c, moe_call, &a, "dtl_moe_layout_dispatch");
  }
  if (failed(c)) return;
  dtl_moe_layout_destroy(L);
  dtl_moe_placement_destroy(pl);
  dtl_comm_destroy(c);
}

typedef struct {
  dtl_cp_context *ctx;
  dtl_cp_attention_params prm;
  const float *q;
  float *out;
} cp_arg;

static dtl_status cp_call(void *p) {
  cp_arg *a = p;
  return dtl_cp_ring_attention(a->ctx, &a->prm, a->q, a->q, a->q, a->out, NULL);
}

static void a_cp_ring_inherits_the_deadline(void) {
  if (dt_size == 1) return;
  dtl_comm *c = fresh(DEADLINE);
  if (!c) return;
  dtl_mesh *m = NULL;
  int shape = dt_size;
  dtl_cp_context *ctx = NULL;
  CHECK_OK(dtl_mesh_create(c, 1, &shape, &m));
  if (m) CHECK_OK(dtl_cp_context_create(m, 0, NULL, &ctx));
  /* 4 tokens per rank, contiguous, 2 heads of 4: q = k = v. */
  static float q[4 * 8], out[4 * 8];
  for (int i = 0; i < 4 * 8; i++) q[i] = (float)(i % 5) * 0.25f;
  if (ctx) {
    cp_arg a = {ctx, {.tokens = 4 * dt_size, .q_heads = 2, .kv_heads = 2, .head_dim = 4,
                      .layout = DTL_CP_CONTIGUOUS}, q, out};
    late_rank("CP ring", c, cp_call, &a, "dtl_cp_ring_attention");
  }
  if (failed(c)) return;
  dtl_cp_context_destroy(ctx);
  dtl_mesh_destroy(m);
  dtl_comm_destroy(c);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  unsetenv("DTL_TIMEOUT");
  RUN(timeout_arguments_are_checked_and_named);
  RUN(dtl_timeout_is_read_at_creation_and_a_bad_value_fails_every_rank);
  RUN(a_rank_that_skips_a_barrier_costs_its_peers_a_timeout_and_later_calls_fail_at_once);
  RUN(a_rank_that_sleeps_past_the_deadline_times_out_mpi_calls_and_dtl_algorithms);
  RUN(a_timeout_fails_every_communicator_of_the_constructor);
  RUN(a_rank_that_leaves_its_loop_early_costs_its_peers_a_timeout);
  RUN(a_plan_inherits_the_deadline);
  RUN(the_agreement_over_two_meshes_names_the_rank_that_had_not_arrived);
  RUN(a_tp_forward_inherits_the_deadline);
  RUN(a_moe_dispatch_inherits_the_deadline);
  RUN(a_cp_ring_inherits_the_deadline);
  return dt_finish();
}

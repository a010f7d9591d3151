/* SPDX-License-Identifier: Apache-2.0 */
/* The executor on hand-built plans (independent of the planner): random legal routes between random
 * layouts on every mesh that fits the world size, checked against the dense oracle on every rank, with the
 * source intact and the scratch allocation equal to the plan's figure; then the executor's own rules
 * (illegal steps, aliasing, abstract meshes, NULL buffers). */
#include <stdlib.h>
#include <string.h>
#include "redistribute/redistribute_internal.h"
#include "dtl_test.h"
#include "test_redistribute_util.h"

static int world_rank, world_size;
static int small_chunks; /* the test setting of dtl__executor_set_chunking is on */

typedef struct {
  long pairs, multi_step, over_bound;
  size_t worst_over; /* over the bound: largest scratch / largest shard on the route, in percent */
} route_stats;

static size_t layout_bytes(const dtl_layout *l) { return l->local_count * dtl_dtype_size(l->dtype); }

/* Largest local shard (bytes) of the route's layouts on this rank: source, every intermediate, target. */
static size_t route_peak(const dtl_plan *p) {
  size_t peak = layout_bytes(&p->src) > layout_bytes(&p->dst) ? layout_bytes(&p->src) : layout_bytes(&p->dst);
  for (int k = 0; k < p->nsteps; k++)
    if (tu_shard_bytes(p, p->steps[k].after) > peak) peak = tu_shard_bytes(p, p->steps[k].after);
  return peak;
}

static void describe(const dtl_plan *p, char *buf, size_t cap) {
  char a[128], b[128];
  size_t o = (size_t)snprintf(buf, cap, "%s [", dtl_dtype_name(p->src.dtype));
  for (int d = 0; d < p->src.ndim; d++) o += (size_t)snprintf(buf + o, cap - o, d ? ",%lld" : "%lld", (long long)p->src.shape[d]);
  o += (size_t)snprintf(buf + o, cap - o, "] %s -> %s via", tu_placements_text(p->src.placements, p->src.mesh->ndim, a, sizeof a),
                        tu_placements_text(p->dst.placements, p->src.mesh->ndim, b, sizeof b));
  for (int k = 0; k < p->nsteps && o < cap; k++)
    o += (size_t)snprintf(buf + o, cap - o, " %s", tu_placements_text(p->steps[k].after, p->src.mesh->ndim, a, sizeof a));
}

/* Runs the hand-built plan from src to dst and checks everything one execution must satisfy. */
/* chunked_a2a: all-to-alls may be chunked at 2 chunks a shard (a test setting; the default is 32). */
static void run_route(const tu_mesh *m, const dtl_layout *src, const dtl_layout *dst, const void *dense, uint64_t seed,
                      int chunked_a2a, route_stats *rs) {
  dtl_plan plan;
  if (tu_route_plan(src, dst, seed, &plan) != 0) {
    CHECK(0, "no legal route");
    return;
  }
  size_t es = dtl_dtype_size(src->dtype), sb = layout_bytes(src), db = layout_bytes(dst);
  char *in = malloc(sb + 1), *out = malloc(db + 1);
  tu_make_local(src, dense, seed, in);
  memset(out, 0x5a, db);
  uint64_t before = tu_checksum(in, sb);
  tu_alloc_stats a0 = tu_allocs;
  dtl_status st = dtl_plan_execute(&plan, in, out);
  int calls = tu_allocs.calls - a0.calls;
  size_t bytes = tu_allocs.bytes_total - a0.bytes_total;
  char what[512];
  describe(&plan, what, sizeof what);
  CHECK(st == DTL_OK, "mesh %s %s: %s", tu_mesh_text(m), what, dtl_last_error());
  CHECK(tu_checksum(in, sb) == before, "mesh %s %s: the source was written", tu_mesh_text(m), what);
  CHECK(calls == (plan.scratch_bytes > 0) && bytes == plan.scratch_bytes,
        "mesh %s %s: allocated %d buffers, %zu bytes; the plan says %zu", tu_mesh_text(m), what, calls, bytes,
        plan.scratch_bytes);
  size_t ends = sb > db ? sb : db;
  /* One step: one buffer of at most the larger end. Several: at most an input-or-output region plus one
   * temporary of the largest shard on the route (the bound cannot hold when intermediates outgrow the
   * destination buffer, see nested_shard_swap_scratch_is_documented); a chunked all-to-all, whose output
   * cannot overlay its input, may need both and its chunk regions. A chunked all-to-all's two chunk regions
   * exceed the larger end only on a rank whose shards hold less than about two chunks, which the default
   * setting (32 chunks an average shard) leaves to very uneven splits, and the test setting (2) to many. */
  if (plan.nsteps <= 1)
    CHECK(plan.scratch_bytes <= (chunked_a2a ? 2 : 1) * ends, "mesh %s %s: scratch %zu > max(src %zu, dst %zu)", tu_mesh_text(m), what,
          plan.scratch_bytes, sb, db);
  else
    CHECK(plan.scratch_bytes <= 3 * route_peak(&plan), "mesh %s %s: scratch %zu > 3x the largest shard %zu",
          tu_mesh_text(m), what, plan.scratch_bytes, route_peak(&plan));
  rs->pairs++;
  if (plan.nsteps > 1) rs->multi_step++;
  if (plan.scratch_bytes > ends) {
    rs->over_bound++;
    size_t pct = plan.scratch_bytes * 100 / route_peak(&plan);
    if (pct > rs->worst_over) rs->worst_over = pct;
  }
  long wrong = tu_check_state(m, dst, out, dense, what);
  CHECK(wrong == 0, "mesh %s %s: %ld wrong elements", tu_mesh_text(m), what, wrong);
  (void)es;
  dtl__plan_release(&plan);
  free(in);
  free(out);
}

/* random_routes_match_the_dense_oracle: every ordered pair among a few random layouts per shape. big: shapes
 * with 20..45 rows, so that small chunks split every pack/unpack pass into many collectives. */
static void random_routes_match_the_dense_oracle(const tu_mesh *m, int mi, int trials, int nlayouts, int big) {
  if (!m->mesh) return; /* a rank outside the mesh */
  route_stats rs = {0};
  for (int t = 0; t < trials; t++) {
    tu_rng r = {tu_hash((uint64_t)mi + 100u * (uint64_t)big, (uint64_t)t)};
    int nd = big ? 2 + tu_uniform(&r, 2) : 1 + tu_uniform(&r, 3);
    int64_t shape[3];
    size_t count = 1;
    for (int d = 0; d < nd; d++)
      count *= (size_t)(shape[d] = big ? (d == 0 ? 20 + tu_uniform(&r, 26) : 5 + tu_uniform(&r, 9)) : tu_uniform(&r, 14));
    static const dtl_dtype types[] = {DTL_INT32, DTL_INT64, DTL_FLOAT32, DTL_FLOAT8_E5M2};
    dtl_dtype dt = types[tu_uniform(&r, 4)];
    void *dense = malloc(count * dtl_dtype_size(dt) + 1);
    tu_dense(r.s, dt, count, dense);
    dtl_layout *ls[8];
    for (int i = 0; i < nlayouts; i++) {
      dtl_placement pl[DTL_MAX_MESH_DIMS];
      tu_random_placements(&r, m->ndim, nd, dt, pl);
      if (dtl_layout_create(m->mesh, dt, nd, shape, pl, &ls[i]) != DTL_OK) {
        CHECK(0, "layout: %s", dtl_last_error());
        ls[i] = NULL;
      }
    }
    for (int i = 0; i < nlayouts; i++)
      for (int j = 0; j < nlayouts; j++)
        if (ls[i] && ls[j]) run_route(m, ls[i], ls[j], dense, tu_hash(r.s, (uint64_t)(i * 16 + j)), small_chunks, &rs);
    for (int i = 0; i < nlayouts; i++) dtl_layout_destroy(ls[i]);
    free(dense);
  }
  long over = 0, worst = 0, w = (long)rs.worst_over;
  MPI_Allreduce(&rs.over_bound, &over, 1, MPI_LONG, MPI_SUM, m->mpi);
  MPI_Allreduce(&w, &worst, 1, MPI_LONG, MPI_MAX, m->mpi);
  if (world_rank == 0)
    printf("random_routes_match_the_dense_oracle%s: mesh %s: %ld pairs (%ld multi-step); scratch above max(src, dst) "
           "on %ld rank-executions of multi-step plans (worst: %ld%% of the route's largest shard)\n",
           big ? " (big)" : "", tu_mesh_text(m), rs.pairs, rs.multi_step, over, worst);
}

static dtl_layout *make(const tu_mesh *m, dtl_dtype t, int nd, const int64_t *shape, const char *text) {
  dtl_placement p[DTL_MAX_MESH_DIMS];
  int n = 0;
  dtl_layout *l = NULL;
  /* A tiny parser for the few spellings used here: R, P, S0..S9, comma separated. */
  for (const char *c = text; *c; c++) {
    if (*c == 'R') p[n++] = dtl_replicate();
    else if (*c == 'P') p[n++] = dtl_partial(DTL_SUM);
    else if (*c == 'S') p[n++] = dtl_shard(c[1] - '0'), c++;
  }
  if (n != m->ndim || dtl_layout_create(m->mesh, t, nd, shape, p, &l) != DTL_OK) CHECK(0, "layout %s", text);
  return l;
}

/* nested_shard_swap_scratch_is_documented: [S0,S1] -> [S1,S0] on 2x2 through [S0,R] and [S1,R]: the
 * intermediate shard is twice either end and outgrows the destination buffer, so the one-buffer bound cannot
 * hold. The gather on the inner dim needs its received blocks and the unpacked [S0,R] shard at once, and the
 * all-to-all its packed send blocks and the [S1,R] shard: the figure is twice the intermediate (4x the ends). */
static void nested_shard_swap_scratch_is_documented(const tu_mesh *m) {
  if (!m->mesh) return; /* a rank outside the mesh */
  int64_t shape[2] = {8, 8};
  dtl_layout *a = make(m, DTL_INT32, 2, shape, "S0,S1"), *b = make(m, DTL_INT32, 2, shape, "S1,S0");
  dtl_plan p;
  memset(&p, 0, sizeof p);
  p.src = *a;
  p.dst = *b;
  p.nsteps = 3;
  dtl_placement s0 = dtl_shard(0), s1 = dtl_shard(1), r = dtl_replicate();
  p.steps[0] = (dtl__plan_step){.kind = DTL__STEP_ALL_GATHER, .mesh_dim = 1, .before = {s0, s1}, .after = {s0, r}};
  p.steps[1] = (dtl__plan_step){.kind = DTL__STEP_ALL_TO_ALL, .mesh_dim = 0, .before = {s0, r}, .after = {s1, r}};
  p.steps[2] = (dtl__plan_step){.kind = DTL__STEP_LOCAL_SLICE, .mesh_dim = 1, .before = {s1, r}, .after = {s1, s0}};
  CHECK(dtl__plan_compile("swap", &p) == DTL_OK, "%s", dtl_last_error());
  size_t fig = p.scratch_bytes;
  CHECK(fig == 2 * 32 * sizeof(int32_t), "scratch %zu, want twice the [S0,R] shard, %zu bytes", fig,
        2 * 32 * sizeof(int32_t));
  int32_t dense[64], in[16], out[16];
  for (int i = 0; i < 64; i++) dense[i] = i;
  tu_make_local(a, dense, 1, in);
  tu_alloc_stats s = tu_allocs;
  CHECK(dtl_plan_execute(&p, in, out) == DTL_OK, "%s", dtl_last_error());
  CHECK(tu_allocs.bytes_total - s.bytes_total == fig, "allocated %zu", tu_allocs.bytes_total - s.bytes_total);
  CHECK(tu_check_state(m, b, out, dense, "swap") == 0, "wrong values");
  /* Both ends gathered on inner dims: [S1,S1] -> [R,R] needs only one buffer of the target's size. */
  dtl_layout *c = make(m, DTL_INT32, 2, shape, "S1,S1"), *d = make(m, DTL_INT32, 2, shape, "R,R");
  dtl_plan q;
  CHECK(tu_route_plan(c, d, 3, &q) == 0 && q.nsteps == 2, "route");
  CHECK(q.scratch_bytes == 64 * sizeof(int32_t), "[S1,S1]->[R,R] scratch %zu, want %zu", q.scratch_bytes,
        64 * sizeof(int32_t));
  dtl__plan_release(&p);
  dtl__plan_release(&q);
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
  dtl_layout_destroy(c);
  dtl_layout_destroy(d);
}

/* step_that_changes_an_outer_split_is_rejected_on_every_rank: [S0,S0] -> [R,S0] by a gather on mesh dim 0
 * would gather blocks that mesh dim 1 splits further. The check depends on placements only, so compilation
 * (at plan creation) refuses it on every rank, and a plan that failed it never runs. */
static void step_that_changes_an_outer_split_is_rejected_on_every_rank(const tu_mesh *m) {
  if (!m->mesh) return; /* a rank outside the mesh */
  int64_t shape[1] = {8};
  dtl_layout *a = make(m, DTL_INT32, 1, shape, "S0,S0"), *b = make(m, DTL_INT32, 1, shape, "R,S0");
  dtl_plan p;
  memset(&p, 0, sizeof p);
  p.src = *a;
  p.dst = *b;
  p.nsteps = 1;
  p.steps[0] = (dtl__plan_step){.kind = DTL__STEP_ALL_GATHER, .mesh_dim = 0, .before = {dtl_shard(0), dtl_shard(0)},
                                .after = {dtl_replicate(), dtl_shard(0)}};
  int32_t in[8] = {0}, out[8];
  memset(out, 0x5a, sizeof out);
  dtl_status st = dtl__plan_compile("outer split", &p);
  CHECK(st == DTL_ERR_UNSUPPORTED && strstr(dtl_last_error(), "innermost"), "status %s: %s", dtl_status_name(st),
            dtl_last_error());
  CHECK(p.exec == NULL, "a plan that failed its check was compiled");
  st = dtl_plan_execute(&p, in, out);
  CHECK(st == DTL_ERR_INTERNAL && strstr(dtl_last_error(), "never compiled"), "status %s: %s", dtl_status_name(st),
            dtl_last_error());
  CHECK(((unsigned char *)out)[0] == 0x5a && ((unsigned char *)out)[sizeof out - 1] == 0x5a, "dst was written");
  /* A step whose kind does not match its placements is the planner's bug: DTL_ERR_INTERNAL. */
  p.steps[0].kind = DTL__STEP_ALL_REDUCE;
  st = dtl__plan_compile("wrong kind", &p);
  CHECK(st == DTL_ERR_INTERNAL, "status %s: %s", dtl_status_name(st), dtl_last_error());
  dtl_layout_destroy(a);
  dtl_layout_destroy(b);
}

/* aliased_buffers_only_for_local_plans: src_local == dst_local is rejected (destination untouched) when the
 * plan communicates, and works in place when it is purely local (R -> S, R -> P). */
static void aliased_buffers_only_for_local_plans(const tu_mesh *m) {
  if (!m->mesh) return; /* a rank outside the mesh */
  int64_t shape[1] = {11};
  int p0 = m->shape[0];
  int32_t dense[11], buf[11];
  for (int i = 0; i < 11; i++) dense[i] = 3 * i - 7;
  dtl_layout *r = make(m, DTL_INT32, 1, shape, m->ndim == 1 ? "R" : m->ndim == 2 ? "R,R" : "R,R,R");
  dtl_layout *s = make(m, DTL_INT32, 1, shape, m->ndim == 1 ? "S0" : m->ndim == 2 ? "S0,R" : "S0,R,R");
  dtl_layout *pp = make(m, DTL_INT32, 1, shape, m->ndim == 1 ? "P" : m->ndim == 2 ? "P,R" : "P,R,R");
  dtl_plan plan;
  /* R -> S(0) in place. */
  CHECK(tu_route_plan(r, s, 1, &plan) == 0, "route");
  memcpy(buf, dense, sizeof buf);
  dtl_status st = dtl_plan_execute(&plan, buf, buf);
  CHECK(st == DTL_OK, "in-place slice: %s", dtl_last_error());
  CHECK(tu_check_state(m, s, buf, dense, "in-place slice") == 0, "in-place slice values");
  /* R -> P(sum) in place. */
  dtl__plan_release(&plan);
  CHECK(tu_route_plan(r, pp, 1, &plan) == 0, "route");
  memcpy(buf, dense, sizeof buf);
  st = dtl_plan_execute(&plan, buf, buf);
  CHECK(st == DTL_OK, "in-place partial: %s", dtl_last_error());
  CHECK(tu_check_state(m, pp, buf, dense, "in-place partial") == 0, "in-place partial values");
  /* S(0) -> R communicates (when the mesh dim has more than one rank). */
  dtl__plan_release(&plan);
  CHECK(tu_route_plan(s, r, 1, &plan) == 0, "route");
  tu_make_local(s, dense, 1, buf);
  uint64_t sum = tu_checksum(buf, sizeof buf);
  st = dtl_plan_execute(&plan, buf, buf);
  if (p0 > 1) {
    CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "src_local") && strstr(dtl_last_error(), "dst_local"),
          "aliased gather: %s %s", dtl_status_name(st), dtl_last_error());
    CHECK(tu_checksum(buf, sizeof buf) == sum, "aliased gather wrote the buffer");
  } else {
    CHECK(st == DTL_OK, "a mesh dim of size 1 never communicates, so in place is fine: %s", dtl_last_error());
  }
  dtl__plan_release(&plan);
  dtl_layout_destroy(r);
  dtl_layout_destroy(s);
  dtl_layout_destroy(pp);
}

/* null_buffers_and_abstract_meshes_are_rejected */
static void null_buffers_and_abstract_meshes_are_rejected(const tu_mesh *m) {
  if (!m->mesh) return; /* a rank outside the mesh */
  int64_t shape[1] = {2 * (int64_t)m->shape[0]}; /* every rank holds elements, so every rank rejects NULL */
  const char *rt = m->ndim == 1 ? "R" : m->ndim == 2 ? "R,R" : "R,R,R";
  const char *st0 = m->ndim == 1 ? "S0" : m->ndim == 2 ? "S0,R" : "S0,R,R";
  dtl_layout *r = make(m, DTL_INT32, 1, shape, rt), *s = make(m, DTL_INT32, 1, shape, st0);
  dtl_plan plan;
  CHECK(tu_route_plan(s, r, 1, &plan) == 0, "route");
  int32_t in[16] = {0}, out[16];
  memset(out, 0x5a, sizeof out);
  dtl_status st = dtl_plan_execute(&plan, NULL, out);
  if (s->local_count) CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "src_local=NULL"), "%s", dtl_last_error());
  st = dtl_plan_execute(&plan, in, NULL);
  CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "dst_local=NULL"), "%s", dtl_last_error());
  CHECK(((unsigned char *)out)[0] == 0x5a, "dst written");
  st = dtl_plan_execute(NULL, in, out);
  CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "plan=NULL"), "%s", dtl_last_error());
  dtl__plan_release(&plan);
  /* The same plan on an abstract mesh of the same shape. */
  dtl_mesh *am;
  CHECK(dtl_mesh_create_abstract(m->ndim, m->shape, NULL, &am) == DTL_OK, "%s", dtl_last_error());
  dtl_layout *ar, *as;
  dtl_placement pr[DTL_MAX_MESH_DIMS], ps[DTL_MAX_MESH_DIMS];
  dtl_layout_placements(r, pr);
  dtl_layout_placements(s, ps);
  dtl_layout_create(am, DTL_INT32, 1, shape, ps, &as);
  dtl_layout_create(am, DTL_INT32, 1, shape, pr, &ar);
  CHECK(tu_route_plan(as, ar, 1, &plan) == 0, "route");
  st = dtl_plan_execute(&plan, in, out);
  CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "abstract"), "%s", dtl_last_error());
  CHECK(((unsigned char *)out)[0] == 0x5a, "dst written");
  dtl__plan_release(&plan);
  dtl_layout_destroy(ar);
  dtl_layout_destroy(as);
  dtl_mesh_destroy(am);
  dtl_layout_destroy(r);
  dtl_layout_destroy(s);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  world_rank = dt_rank;
  world_size = dt_size;
  /* Bounded work per mesh: np=8 runs 4 meshes, each rank oversubscribed 4x on a small machine. */
  int trials = argc > 1 ? atoi(argv[1]) : 8, nlayouts = argc > 2 ? atoi(argv[2]) : 6;
  /* Default chunks; 48-byte chunks, so that small tensors take the chunked gather and reduce-scatter paths
   * too; 256-byte chunks on larger tensors, whose all-to-alls are then chunked (from 2 chunks a shard) in all
   * three row modes. Each on the MPI transport, then on it without its optional entries (all_to_allv_displs). */
  static const size_t chunks[] = {0, 48, 256};
  for (int pass = 0; pass < 6; pass++) {
    int ci = pass % 3;
    small_chunks = tu_begin_pass(pass, chunks, 3, world_rank) != 0;
    for (size_t i = 0; i < (size_t)tu_nmeshes; i++) {
      tu_mesh m;
      if (!tu_mesh_open_spec((int)i, &m)) continue;
      RUN_NAMED(tu_case_name("random_routes_match_the_dense_oracle", &m),
                random_routes_match_the_dense_oracle(&m, (int)i, ci == 2 ? 2 : trials, nlayouts, ci == 2));
      RUN_NAMED(tu_case_name("null_buffers_and_abstract_meshes_are_rejected", &m),
                null_buffers_and_abstract_meshes_are_rejected(&m));
      RUN_NAMED(tu_case_name("aliased_buffers_only_for_local_plans", &m), aliased_buffers_only_for_local_plans(&m));
      if (ci == 0 && m.ndim == 2 && m.shape[0] == 2 && m.shape[1] == 2) {
        RUN_NAMED(tu_case_name("nested_shard_swap_scratch_is_documented", &m),
                  nested_shard_swap_scratch_is_documented(&m));
        RUN_NAMED(tu_case_name("step_that_changes_an_outer_split_is_rejected_on_every_rank", &m),
                  step_that_changes_an_outer_split_is_rejected_on_every_rank(&m));
      }
      tu_mesh_close(&m);
    }
  }
  return dt_finish();
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Redistribution between two meshes of one parent, and the exchange's promises on one mesh, against the dense
 * oracle: random layout pairs (1-3 tensor dims, uneven and zero-size dims, every dtype, Partial sources and
 * targets) across disjoint, overlapping, reshaped and subset mesh pairs and on every one-mesh shape of the world
 * size; each rank passes only the buffers of the meshes it is in. For every pair: exact results on every target
 * rank and the source intact; scratch within the larger local end (Partial sources too);
 * dtl_plan_bytes of an exchange equal to the minimum (the target box less what the rank's own source box holds);
 * the plan acquires its workspace when it is made and no execution allocates; the nonblocking form gives the same result; limits
 * below the default bound either hold on every rank or fail naming the smallest that works. Bad input: a rank
 * passing a buffer for a mesh it is not in, limits of 0, dtypes or shapes that differ across the meshes, a
 * second nonblocking execution in flight, a collective plan started nonblocking. */
#include <stdlib.h>
#include <string.h>
#include "dtl_test.h"
#include "redistribute/redistribute_internal.h"
#include "test_redistribute_util.h"

static int world_rank, world_size;

typedef struct {
  long pairs, partial_over, async_runs, limited, limit_refused, exchanges;
} stats;

static const dtl_dtype all_types[] = {DTL_FLOAT32, DTL_FLOAT64, DTL_FLOAT16,     DTL_BFLOAT16,   DTL_INT8,
                                      DTL_UINT8,   DTL_INT32,   DTL_INT64, DTL_FLOAT8_E4M3, DTL_FLOAT8_E5M2};
#define NTYPES ((int)(sizeof all_types / sizeof all_types[0]))

static size_t bytes_of(const dtl_layout *l) { return l->local_count * dtl_dtype_size(l->dtype); }

static bool has_partial(const dtl_layout *l) {
  for (int md = 0; md < l->mesh->ndim; md++)
    if (l->mesh->shape[md] > 1 && l->placements[md].kind == DTL_PARTIAL) return true;
  return false;
}

/* Random placements for mesh m: Partial only where the dtype's partial parts stay exact (not u8). */
static void placements(tu_rng *r, const dtl_mesh *m, int nd, dtl_dtype t, dtl_placement *out) {
  tu_random_placements(r, m->ndim, nd, t, out);
  for (int md = 0; md < m->ndim; md++)
    if (out[md].kind == DTL_PARTIAL && t == DTL_UINT8) out[md] = dtl_replicate();
}

/* The one-mesh rule: S -> P(avg) and P(a) -> P(b) on a mesh dim have no route (between meshes every pair has one). */
static bool refused(const dtl_layout *a, const dtl_layout *b) {
  if (a->mesh != b->mesh) return false;
  for (int md = 0; md < a->mesh->ndim; md++) {
    if (a->mesh->shape[md] == 1) continue;
    dtl_placement p = a->placements[md], q = b->placements[md];
    if (q.kind == DTL_PARTIAL && ((p.kind == DTL_SHARD && q.op == DTL_AVG) || (p.kind == DTL_PARTIAL && p.op != q.op)))
      return true;
  }
  return false;
}

/* The bytes this rank must receive in an exchange into dst: its target box less the part its own source box (of
 * the exchange's source placements) holds; nothing where it holds a Partial target's identity. */
static uint64_t minimum_received(const dtl_plan *p) {
  const dtl_layout *dst = &p->dst;
  if (!dst->mesh->member || dtl__layout_holds_identity(dst, dst->mesh->coord, NULL)) return 0;
  uint64_t n = dst->local_count;
  if (p->src.mesh->member) {
    int64_t bs[DTL_MAX_TENSOR_DIMS], bo[DTL_MAX_TENSOR_DIMS], is[DTL_MAX_TENSOR_DIMS], io[DTL_MAX_TENSOR_DIMS];
    const dtl__plan_step *x = &p->steps[p->nsteps - 1];
    dtl__local_box(p->src.mesh, p->src.ndim, p->src.shape, x->before, p->src.mesh->coord, bs, bo);
    uint64_t both = 1;
    for (int d = 0; d < dst->ndim; d++) {
      int64_t lo = bo[d] > dst->local_offset[d] ? bo[d] : dst->local_offset[d];
      int64_t hi = bo[d] + bs[d] < dst->local_offset[d] + dst->local_shape[d] ? bo[d] + bs[d]
                                                                                 : dst->local_offset[d] + dst->local_shape[d];
      is[d] = hi > lo ? hi - lo : 0;
      io[d] = lo;
      both *= (uint64_t)is[d];
    }
    (void)io;
    n -= both;
  }
  return n * dtl_dtype_size(dst->dtype);
}

/* How run_and_check runs a plan: dtl_plan_execute; dtl_plan_execute_async polled a few times with dtl_test, then
 * dtl_wait; or polled with dtl_test alone until done (the target is checked then, before dtl_wait). */
enum { BLOCKING, ASYNC_WAIT, ASYNC_TEST };

/* Runs p from src to dst on this rank's buffers (NULL for a mesh it is not in) and checks the target on the target
 * mesh's members. Returns the status. */
static dtl_status run_and_check(const tu_mesh *tm, const dtl_plan *p, const void *in, size_t in_bytes, void *out,
                                size_t out_bytes, const void *dense, int how, const char *what) {
  static const char *name[] = {"", " (async)", " (async, dtl_test alone)"};
  uint64_t sum_in = in ? tu_checksum(in, in_bytes) : 0;
  if (out) memset(out, 0x5a, out_bytes);
  bool member = tm->mesh && dtl_mesh_is_member(tm->mesh);
  dtl_status st;
  if (how != BLOCKING) {
    dtl_request *req = NULL;
    st = dtl_plan_execute_async(p, in, out, &req);
    int done = 0;
    for (long polls = 0; st == DTL_OK && !done && (how == ASYNC_TEST || polls < 3); polls++) st = dtl_test(req, &done);
    if (how == ASYNC_TEST && st == DTL_OK && member) {
      long wrong = tu_check_state(tm, &p->dst, out, dense, what);
      CHECK(wrong == 0, "%s%s: %ld wrong elements once dtl_test said done", what, name[how], wrong);
    }
    if (req) {
      dtl_status w = dtl_wait(req);
      if (st == DTL_OK) st = w;
    }
  } else {
    st = dtl_plan_execute(p, in, out);
  }
  CHECK(st == DTL_OK, "%s%s: %s", what, name[how], dtl_last_error());
  if (in) CHECK(tu_checksum(in, in_bytes) == sum_in, "%s: the source was written", what);
  if (member) {
    long wrong = tu_check_state(tm, &p->dst, out, dense, what);
    CHECK(wrong == 0, "%s%s: %ld wrong elements", what, name[how], wrong);
  }
  return st;
}

/* One layout pair from mesh a to mesh b (maybe the same): results, scratch, bytes, allocations, async, limits. all:
 * the ranks of both meshes. */
static void one_pair(const tu_mesh *ma, const tu_mesh *mb, MPI_Comm all, tu_rng *r, stats *s, const char *where) {
  int nd = 1 + tu_uniform(r, 3);
  int64_t shape[3];
  size_t count = 1;
  for (int d = 0; d < nd; d++) count *= (size_t)(shape[d] = tu_uniform(r, 12));
  dtl_dtype t = all_types[tu_uniform(r, NTYPES)];
  dtl_placement pa[DTL_MAX_MESH_DIMS], pb[DTL_MAX_MESH_DIMS];
  placements(r, ma->mesh, nd, t, pa);
  placements(r, mb->mesh, nd, t, pb);
  dtl_layout *src = NULL, *dst = NULL;
  CHECK(dtl_layout_create(ma->mesh, t, nd, shape, pa, &src) == DTL_OK, "%s", dtl_last_error());
  CHECK(dtl_layout_create(mb->mesh, t, nd, shape, pb, &dst) == DTL_OK, "%s", dtl_last_error());
  char what[320], x[96], y[96];
  snprintf(what, sizeof what, "%s %s [%lld,%lld,%lld](%dd) %s -> %s", where, dtl_dtype_name(t), (long long)shape[0],
           (long long)(nd > 1 ? shape[1] : 1), (long long)(nd > 2 ? shape[2] : 1), nd,
           tu_placements_text(pa, ma->mesh->ndim, x, sizeof x), tu_placements_text(pb, mb->mesh->ndim, y, sizeof y));
  if (refused(src, dst)) goto out;
  if (getenv("TU_TRACE")) fprintf(stderr, "[%d] %s\n", world_rank, what);
  s->pairs++;
  size_t es = dtl_dtype_size(t), ib = bytes_of(src), ob = bytes_of(dst);
  void *dense = malloc(count * es + 1), *in = NULL, *out = NULL;
  tu_dense(r->s, t, count, dense);
  if (dtl_mesh_is_member(ma->mesh)) {
    in = malloc(ib + 1);
    tu_make_local(src, dense, r->s, in);
  }
  if (dtl_mesh_is_member(mb->mesh)) out = malloc(ob + 1);
  dtl_plan *p = NULL;
  tu_alloc_stats made = tu_allocs;
  dtl_status st = dtl_plan_create(src, dst, &p);
  CHECK(st == DTL_OK, "%s: plan: %s", what, dtl_last_error());
  if (st != DTL_OK) goto done;
  /* The plan acquired its workspace when it was made (comm.h: no execution can fail alone for memory). */
  size_t ws = dtl_plan_workspace_bytes(p);
  bool holder = dtl_mesh_is_member(ma->mesh) || dtl_mesh_is_member(mb->mesh);
  CHECK(tu_allocs.calls - made.calls == (holder && ws > 0) && tu_allocs.bytes_total - made.bytes_total ==
        (holder ? ws : 0), "%s: dtl_plan_create allocated %d buffers, %zu bytes; its workspace is %zu", what,
        tu_allocs.calls - made.calls, tu_allocs.bytes_total - made.bytes_total, ws);
  /* Scratch within the larger end on this rank: always for sources without pending Partials. */
  size_t fig = dtl_plan_scratch_bytes(p), ends = ib > ob ? ib : ob;
  /* Within the larger end on every rank, Partial sources too (include/dtl/plan.h, Memory). */
  CHECK(fig <= ends, "%s: scratch %zu > max(src %zu, dst %zu)%s", what, fig, ib, ob,
        has_partial(src) ? " (a Partial source)" : "");
  s->partial_over += fig > ends;
  bool exchange = p->nsteps > 0 && p->steps[p->nsteps - 1].kind == DTL__STEP_EXCHANGE;
  if (exchange) {
    s->exchanges++;
    uint64_t sent = 0, received = 0;
    CHECK(dtl_plan_bytes(p, &sent, &received) == DTL_OK, "%s", dtl_last_error());
    CHECK(p->steps[p->nsteps - 1].recv_bytes == minimum_received(p), "%s: the exchange receives %llu bytes, the "
          "minimum is %llu", what, (unsigned long long)p->steps[p->nsteps - 1].recv_bytes,
          (unsigned long long)minimum_received(p));
  }
  /* No execution allocates, the first included. */
  tu_alloc_stats a0 = tu_allocs;
  run_and_check(mb, p, in, ib, out, ob, dense, BLOCKING, what);
  CHECK(tu_allocs.calls == a0.calls, "%s: the first execution allocated %d buffers, %zu bytes (the plan holds %zu)",
        what, tu_allocs.calls - a0.calls, tu_allocs.bytes_total - a0.bytes_total, ws);
  a0 = tu_allocs;
  run_and_check(mb, p, in, ib, out, ob, dense, BLOCKING, what);
  CHECK(tu_allocs.calls == a0.calls, "%s: a repeated execution allocated", what);
  /* The nonblocking form: every plan, with the same result, in the same workspace (no allocation). */
  a0 = tu_allocs;
  run_and_check(mb, p, in, ib, out, ob, dense, s->async_runs % 2 ? ASYNC_TEST : ASYNC_WAIT, what);
  CHECK(tu_allocs.calls == a0.calls, "%s: the nonblocking execution allocated %d buffers", what,
        tu_allocs.calls - a0.calls);
  s->async_runs++;
  /* Half the largest scratch of any rank: the plan fits it on every rank, or the call names the smallest limit. */
  unsigned long long worst = fig, limit;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, all);
  limit = worst / 2;
  if (worst > 0 && tu_uniform(r, 2)) {
    dtl_plan *q = NULL;
    st = dtl_plan_create_with_limit(src, dst, (size_t)limit, &q);
    if (st == DTL_ERR_INVALID_ARGUMENT) {
      const char *m = strstr(dtl_last_error(), "the smallest limit that works for this pair is ");
      CHECK(m != NULL, "%s: limit %llu: %s", what, limit, dtl_last_error());
      if (m) limit = strtoull(m + strlen("the smallest limit that works for this pair is "), NULL, 10);
      s->limit_refused++;
      st = dtl_plan_create_with_limit(src, dst, (size_t)limit, &q);
    }
    CHECK(st == DTL_OK, "%s: limit %llu: %s", what, limit, dtl_last_error());
    if (st == DTL_OK) {
      CHECK(dtl_plan_scratch_bytes(q) <= limit, "%s: scratch %zu over the limit %llu", what, dtl_plan_scratch_bytes(q),
            limit);
      run_and_check(mb, q, in, ib, out, ob, dense, BLOCKING, what);
      s->limited++;
    }
    dtl_plan_destroy(q);
  }
done:
  dtl_plan_destroy(p);
  free(dense);
  free(in);
  free(out);
out:
  dtl_layout_destroy(src);
  dtl_layout_destroy(dst);
}

static void report(const char *name, const char *where, const stats *s) {
  if (world_rank == 0)
    printf("%s: %s: %ld pairs (%ld end in an exchange), %ld async runs, %ld limited plans (%ld first refused, naming "
           "the smallest limit); Partial sources above max(src, dst) on this rank: %ld\n",
           name, where, s->pairs, s->exchanges, s->async_runs, s->limited, s->limit_refused, s->partial_over);
}

/* every_pair_between_two_meshes_matches_the_dense_oracle */
static void every_pair_between_two_meshes_matches_the_dense_oracle(const tu_pair *pr, int trials) {
  stats s = {0};
  for (int t = 0; t < trials; t++) {
    tu_rng r = {tu_hash(7000u + (uint64_t)pr->kind, (uint64_t)t)};
    one_pair(&pr->a, &pr->b, MPI_COMM_WORLD, &r, &s, tu_pair_text(pr));
    tu_rng q = {tu_hash(9000u + (uint64_t)pr->kind, (uint64_t)t)};
    one_pair(&pr->b, &pr->a, MPI_COMM_WORLD, &q, &s, tu_pair_text(pr)); /* and back */
  }
  report("every_pair_between_two_meshes_matches_the_dense_oracle", tu_pair_text(pr), &s);
}

/* exchanges_on_one_mesh_keep_their_promises */
static void exchanges_on_one_mesh_keep_their_promises(const tu_mesh *m, int mi, int trials) {
  if (!m->mesh) return;
  stats s = {0};
  for (int t = 0; t < trials; t++) {
    tu_rng r = {tu_hash(8000u + (uint64_t)mi, (uint64_t)t)};
    one_pair(m, m, m->mpi, &r, &s, tu_mesh_text(m));
  }
  report("exchanges_on_one_mesh_keep_their_promises", tu_mesh_text(m), &s);
}

/* The issue's cases: nested shards that swap or move through a larger intermediate under per-dim steps now take one
 * exchange, whose scratch is within the shards. */
static void nested_shard_changes_take_one_exchange_within_the_shards(const tu_mesh *m) {
  if (!m->mesh || m->ndim < 2) return;
  static const char *cases[][2] = {{"S0,S1", "S1,S0"}, {"S0,S0", "S1,S1"}, {"S0,S0,S0", "S1,S1,S1"}};
  for (int i = 0; i < 3; i++) {
    dtl_placement a[3], b[3];
    int n = 0;
    dtl_placements_parse(cases[i][0], a, 3, &n);
    if (n != m->ndim) continue;
    dtl_placements_parse(cases[i][1], b, 3, &n);
    int64_t shape[3] = {8, 8, 8};
    dtl_layout *la, *lb;
    CHECK_OK(dtl_layout_create(m->mesh, DTL_FLOAT32, 3, shape, a, &la));
    CHECK_OK(dtl_layout_create(m->mesh, DTL_FLOAT32, 3, shape, b, &lb));
    dtl_plan *p = NULL;
    CHECK_OK(dtl_plan_create(la, lb, &p));
    size_t ends = bytes_of(la) > bytes_of(lb) ? bytes_of(la) : bytes_of(lb);
    CHECK(p && dtl_plan_num_collectives(p) == 1 && p->steps[p->nsteps - 1].kind == DTL__STEP_EXCHANGE,
          "%s -> %s: %d collectives", cases[i][0], cases[i][1], p ? dtl_plan_num_collectives(p) : -1);
    CHECK(p && dtl_plan_scratch_bytes(p) <= ends, "%s -> %s: scratch %zu > %zu", cases[i][0], cases[i][1],
          p ? dtl_plan_scratch_bytes(p) : 0, ends);
    if (world_rank == 0 && p)
      printf("  %s -> %s on %s, f32 [8,8,8]: %d collective, scratch %zu B, shard %zu B\n", cases[i][0], cases[i][1],
             tu_mesh_text(m), dtl_plan_num_collectives(p), dtl_plan_scratch_bytes(p), ends);
    dtl_plan_destroy(p);
    dtl_layout_destroy(la);
    dtl_layout_destroy(lb);
  }
}

/* Bad input between meshes: every rank of both meshes fails alike (DTL_CHECK agrees among them), and nothing is
 * written. */
static void bad_input_between_meshes_fails_every_rank(const tu_pair *pr) {
  bool in_a = dtl_mesh_is_member(pr->a.mesh), in_b = dtl_mesh_is_member(pr->b.mesh);
  int64_t shape[2] = {9, 6};
  dtl_layout *a = NULL, *b = NULL, *bt = NULL, *bs = NULL;
  dtl_placement s0 = dtl_shard(0), s1 = dtl_shard(1);
  dtl_placement pa[DTL_MAX_MESH_DIMS], pb[DTL_MAX_MESH_DIMS];
  for (int md = 0; md < DTL_MAX_MESH_DIMS; md++) pa[md] = md ? dtl_replicate() : s0, pb[md] = md ? dtl_replicate() : s1;
  CHECK_OK(dtl_layout_create(pr->a.mesh, DTL_INT32, 2, shape, pa, &a));
  CHECK_OK(dtl_layout_create(pr->b.mesh, DTL_INT32, 2, shape, pb, &b));
  CHECK_OK(dtl_layout_create(pr->b.mesh, DTL_FLOAT32, 2, shape, pb, &bt));
  CHECK_OK(dtl_layout_create(pr->b.mesh, DTL_INT32, 2, (int64_t[]){9, 7}, pb, &bs));
  int32_t in[64], out[64];
  for (int i = 0; i < 64; i++) in[i] = i, out[i] = -1;
  /* A dtype or shape that differs across the meshes: refused before anything moves. */
  CHECK_ERROR(dtl_redistribute(a, in_a ? in : NULL, bt, in_b ? out : NULL), DTL_ERR_INVALID_ARGUMENT, "dst dtype=f32");
  CHECK_ERROR(dtl_redistribute(a, in_a ? in : NULL, bs, in_b ? out : NULL), DTL_ERR_INVALID_ARGUMENT,
              "dst global shape [9,7]");
  dtl_plan *p = NULL;
  CHECK_ERROR(dtl_plan_create_with_limit(a, bt, 1 << 20, &p), DTL_ERR_INVALID_ARGUMENT, "dtype");
  /* A rank of the target mesh alone that also passes a source buffer, which it cannot hold. */
  if (pr->kind == TU_DISJOINT) {
    dtl_status st = dtl_redistribute(a, in_a || in_b ? in : NULL, b, in_b ? out : NULL);
    if (in_b) CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "not in the source mesh"), "%s %s",
                    dtl_status_name(st), dtl_last_error());
    else CHECK(st == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "failed"), "%s %s", dtl_status_name(st),
               dtl_last_error());
  }
  for (int i = 0; i < 64; i++) CHECK(out[i] == -1 && in[i] == i, "a rejected call wrote a buffer");
  /* A limit of 0 for a pair whose plan needs scratch: columns to rows of the inner two dims of a 3-d tensor, whose
   * pieces are no runs even one index of the outer dim at a time where a rank holds several of them (in a 2-d tensor
   * they are, and the exchange then runs in rounds with no scratch at all). Either a plan in rounds needs none on
   * any rank, or the call names the smallest limit that works. */
  dtl_layout *a3 = NULL, *b3 = NULL;
  dtl_placement qa[DTL_MAX_MESH_DIMS], qb[DTL_MAX_MESH_DIMS];
  for (int md = 0; md < DTL_MAX_MESH_DIMS; md++) qa[md] = md ? dtl_replicate() : dtl_shard(1), qb[md] = md ? dtl_replicate() : dtl_shard(2);
  CHECK_OK(dtl_layout_create(pr->a.mesh, DTL_INT32, 3, (int64_t[]){2, 9, 6}, qa, &a3));
  CHECK_OK(dtl_layout_create(pr->b.mesh, DTL_INT32, 3, (int64_t[]){2, 9, 6}, qb, &b3));
  CHECK_OK(dtl_plan_create(b3, a3, &p));
  unsigned long long worst = p ? dtl_plan_scratch_bytes(p) : 0;
  dtl_plan_destroy(p);
  p = NULL;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  if (worst > 0) {
    dtl_status st0 = dtl_plan_create_with_limit(b3, a3, 0, &p);
    if (st0 == DTL_OK) CHECK(dtl_plan_scratch_bytes(p) == 0, "limit 0: scratch %zu", dtl_plan_scratch_bytes(p));
    else CHECK(st0 == DTL_ERR_INVALID_ARGUMENT && strstr(dtl_last_error(), "smallest limit"), "limit 0: %s %s",
               dtl_status_name(st0), dtl_last_error());
    dtl_plan_destroy(p);
    p = NULL;
  }
  dtl_layout_destroy(a3);
  dtl_layout_destroy(b3);
  /* The nonblocking form: one execution in flight per plan. */
  CHECK_OK(dtl_plan_create(a, b, &p));
  dtl_request *r1 = NULL, *r2 = (dtl_request *)0x5a;
  CHECK_OK(dtl_plan_execute_async(p, in_a ? in : NULL, in_b ? out : NULL, &r1));
  CHECK_ERROR(dtl_plan_execute_async(p, in_a ? in : NULL, in_b ? out : NULL, &r2), DTL_ERR_INVALID_ARGUMENT,
              "in flight");
  CHECK(r2 == (dtl_request *)0x5a, "a refused start wrote its request");
  if (r1) CHECK_OK(dtl_wait(r1));
  dtl_plan_destroy(p);
  dtl_layout *la[] = {a, b, bt, bs};
  for (int i = 0; i < 4; i++) dtl_layout_destroy(la[i]);
}

/* One plan from layouts (a on ma's mesh, b on mb's) of an f32 tensor of shape (nd dims) given as placement text
 * (NULL: set up nothing and return NULL), with this rank's source and target buffers and the dense tensor. */
typedef struct {
  dtl_layout *a, *b;
  dtl_plan *p;
  void *in, *out, *dense;
  size_t ib, ob;
  char what[192];
} plan_case;

static bool case_open(plan_case *c, const tu_mesh *ma, const tu_mesh *mb, int nd, const int64_t *shape, const char *from,
                      const char *to, size_t chunk, uint64_t seed) {
  memset(c, 0, sizeof *c);
  dtl_placement pa[DTL_MAX_MESH_DIMS], pb[DTL_MAX_MESH_DIMS];
  int na = 0, nb = 0;
  if (dtl_placements_parse(from, pa, DTL_MAX_MESH_DIMS, &na) != DTL_OK || na != ma->ndim ||
      dtl_placements_parse(to, pb, DTL_MAX_MESH_DIMS, &nb) != DTL_OK || nb != mb->ndim)
    return false;
  size_t count = 1;
  int o = snprintf(c->what, sizeof c->what, "f32[");
  for (int d = 0; d < nd; d++) {
    count *= (size_t)shape[d];
    o += snprintf(c->what + o, sizeof c->what - (size_t)o, d ? ",%lld" : "%lld", (long long)shape[d]);
  }
  char x[64];
  snprintf(x, sizeof x, "%s", tu_mesh_text(ma));
  snprintf(c->what + o, sizeof c->what - (size_t)o, "] [%s] on %s -> [%s] on %s%s", from, x, to, tu_mesh_text(mb),
           chunk ? " (48-byte chunks)" : "");
  CHECK_OK(dtl_layout_create(ma->mesh, DTL_FLOAT32, nd, shape, pa, &c->a));
  CHECK_OK(dtl_layout_create(mb->mesh, DTL_FLOAT32, nd, shape, pb, &c->b));
  c->dense = malloc(count * 4 + 1);
  tu_dense(seed, DTL_FLOAT32, count, c->dense);
  c->ib = c->a ? bytes_of(c->a) : 0;
  c->ob = c->b ? bytes_of(c->b) : 0;
  if (dtl_mesh_is_member(ma->mesh)) {
    c->in = malloc(c->ib + 1);
    tu_make_local(c->a, c->dense, seed, c->in);
  }
  if (dtl_mesh_is_member(mb->mesh)) c->out = malloc(c->ob + 1);
  dtl__executor_set_chunking(chunk, chunk ? 2 : 0);
  CHECK_OK(dtl_plan_create(c->a, c->b, &c->p));
  dtl__executor_set_chunking(0, 0);
  return c->p != NULL;
}

static void case_close(plan_case *c) {
  dtl_plan_destroy(c->p);
  dtl_layout_destroy(c->a);
  dtl_layout_destroy(c->b);
  free(c->in);
  free(c->out);
  free(c->dense);
}

/* Blocking, then nonblocking finished by dtl_wait, then nonblocking driven by dtl_test alone: the same result, and
 * the nonblocking runs allocate nothing (the blocking run's workspace serves them). */
static void run_every_way(const tu_mesh *mb, plan_case *c) {
  run_and_check(mb, c->p, c->in, c->ib, c->out, c->ob, c->dense, BLOCKING, c->what);
  tu_alloc_stats a0 = tu_allocs;
  run_and_check(mb, c->p, c->in, c->ib, c->out, c->ob, c->dense, ASYNC_WAIT, c->what);
  run_and_check(mb, c->p, c->in, c->ib, c->out, c->ob, c->dense, ASYNC_TEST, c->what);
  CHECK(tu_allocs.calls == a0.calls, "%s: the nonblocking executions allocated %d buffers", c->what,
        tu_allocs.calls - a0.calls);
}

/* Every kind of collective step runs nonblocking with the blocking result: reduce-scatters (packed, chunked,
 * uneven), all-gathers of an inner dim (unpacked, chunked), all-to-alls, all-reduces, and plans of several
 * communicating steps on 2-D meshes. */
static void every_collective_runs_nonblocking_like_blocking(const tu_mesh *m) {
  if (!m->mesh) return;
  static const struct {
    int nd;
    int64_t shape[2];
    const char *from, *to;
    size_t chunk;
  } cases[] = {
      {2, {7, 5}, "S1", "R", 0},         {2, {40, 12}, "S1", "R", 48},      {2, {6, 9}, "P", "S1", 0},
      {2, {40, 12}, "P", "S1", 48},      {1, {5}, "P", "S0", 0},            {2, {9, 7}, "S0", "S1", 0},
      {2, {41, 13}, "S1", "S0", 48},     {2, {5, 6}, "P", "R", 0},          {2, {8, 6}, "P,S1", "S0,R", 0},
      {2, {8, 8}, "S0,S1", "S1,S0", 0},  {2, {6, 10}, "P,P", "S1,S0", 0},   {2, {40, 12}, "P,S1", "S0,R", 48},
      {1, {5}, "P,P", "R,S0", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    plan_case c;
    if (case_open(&c, m, m, cases[i].nd, cases[i].shape, cases[i].from, cases[i].to, cases[i].chunk, 100 + i))
      run_every_way(m, &c);
    case_close(&c);
  }
}

/* Between meshes: from a line of all ranks to a 2 x p/2 mesh of the same ranks, among them the issue's
 * f32[5] [P(sum)] -> [R,S(0)] (at 8 ranks: the line of 8 to 2x4), which a reduce-scatter and an exchange carry. */
static void plans_between_meshes_run_nonblocking_like_blocking(void) {
  if (world_size < 2 || world_size % 2) return;
  int list[64], line[1] = {world_size}, grid[2] = {2, world_size / 2};
  for (int i = 0; i < world_size; i++) list[i] = i;
  tu_mesh a, b;
  if (tu_sub_open(world_size, list, 1, line, &a) != 0 || tu_sub_open(world_size, list, 2, grid, &b) != 0) {
    CHECK(false, "set-up: cannot open the meshes");
    return;
  }
  static const struct {
    int nd;
    int64_t shape[2];
    const char *from, *to;
  } cases[] = {
      {1, {5}, "P", "R,S0"}, {2, {6, 4}, "P", "S1,S0"}, {2, {7, 5}, "S1", "R,R"}, {2, {9, 6}, "S0", "S1,R"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    for (int back = 0; back < 2; back++) {
      plan_case c;
      if (back ? case_open(&c, &b, &a, cases[i].nd, cases[i].shape, cases[i].to, cases[i].from, 0, 200 + i)
               : case_open(&c, &a, &b, cases[i].nd, cases[i].shape, cases[i].from, cases[i].to, 0, 200 + i)) {
        if (i == 0 && !back && world_size == 8) { /* the issue's case: a reduce-scatter, then more */
          bool rs = false;
          for (int k = 0; k < c.p->nsteps; k++) rs |= c.p->steps[k].kind == DTL__STEP_REDUCE_SCATTER;
          CHECK(rs && c.p->nsteps > 1, "%s: %d steps, %s reduce-scatter", c.what, c.p->nsteps, rs ? "a" : "no");
        }
        run_every_way(back ? &a : &b, &c);
      }
      case_close(&c);
    }
  }
  tu_mesh_close(&b);
  tu_mesh_close(&a);
}

/* Fails the k-th nonblocking start (counted from now) of an execution of c and checks that the execution fails on
 * every rank naming the step, from the start itself (which runs as far as it can without blocking) or from dtl_test,
 * then from dtl_wait, and leaves nothing in flight: the plan starts again at once and both forms give the right
 * result (a transfer left running would hold the plan busy, or cross the next one's messages). */
static void fail_start(const tu_mesh *m, plan_case *c, long k, const char *step) {
  tu_fail_at = tu_starts + k;
  dtl_request *req = NULL;
  dtl_status st = dtl_plan_execute_async(c->p, c->in, c->out, &req);
  if (k == 1) CHECK(st == DTL_ERR_COMM, "%s: the failed first start gave %s", c->what, dtl_status_name(st));
  if (st != DTL_OK) {
    CHECK(req == NULL, "%s: a failed start wrote its request", c->what);
  } else {
    int done = 0;
    while (st == DTL_OK && !done) st = dtl_test(req, &done);
    CHECK(st == DTL_ERR_COMM && !done, "%s: dtl_test gave %s (done %d)", c->what, dtl_status_name(st), done);
  }
  CHECK(strstr(dtl_last_error(), "injected") && strstr(dtl_last_error(), step), "%s: message '%s' lacks '%s'", c->what,
        dtl_last_error(), step);
  if (req) CHECK_ERROR(dtl_wait(req), DTL_ERR_COMM, "injected");
  tu_fail_at = 0;
  run_and_check(m, c->p, c->in, c->ib, c->out, c->ob, c->dense, ASYNC_TEST, c->what);
  run_and_check(m, c->p, c->in, c->ib, c->out, c->ob, c->dense, BLOCKING, c->what);
}

/* A start that fails midway (the second chunk of a reduce-scatter, the second step of a plan) or at once: the error
 * comes back, and no transfer stays in flight. */
static void an_error_midway_leaves_no_transfer_in_flight(const tu_mesh *m) {
  if (!m->mesh || dtl_mesh_size(m->mesh) < 2 || m->ndim > 2) return;
  plan_case c;
  int64_t shape[2] = {40, 12};
  if (case_open(&c, m, m, 2, shape, m->ndim == 1 ? "P" : "P,S1", m->ndim == 1 ? "S1" : "S0,R", m->ndim == 1 ? 48 : 0,
                300)) {
    long s0 = tu_starts;
    run_and_check(m, c.p, c.in, c.ib, c.out, c.ob, c.dense, ASYNC_WAIT, c.what);
    long n = tu_starts - s0;
    CHECK(n >= 2, "%s: %ld nonblocking starts (the case needs several)", c.what, n);
    if (n >= 2) {
      if (m->ndim == 1) fail_start(m, &c, 2, "step 0"); /* the second chunk */
      else fail_start(m, &c, n, "step 1");                /* the second step */
      fail_start(m, &c, 1, "step 0");
    }
  }
  case_close(&c);
}

int main(int argc, char **argv) {
  setenv("DTL_CHECK", "1", 1); /* the bad-input cases rely on the agreement (read when the parent is made) */
  dt_init(&argc, &argv);
  world_rank = dt_rank;
  world_size = dt_size;
  int trials = argc > 1 ? atoi(argv[1]) : 6;
  for (int k = 0; k < TU_NPAIRS; k++) {
    tu_pair pr;
    if (!tu_pair_open(k, world_size, &pr)) continue;
    RUN_NAMED(tu_pair_text(&pr), every_pair_between_two_meshes_matches_the_dense_oracle(&pr, trials));
    RUN_NAMED(tu_pair_text(&pr), bad_input_between_meshes_fails_every_rank(&pr));
    tu_pair_close(&pr);
  }
  RUN(plans_between_meshes_run_nonblocking_like_blocking);
  for (int i = 0; i < tu_nmeshes; i++) {
    tu_mesh m;
    if (!tu_mesh_open_spec(i, &m)) continue;
    RUN_NAMED(tu_case_name("exchanges_on_one_mesh_keep_their_promises", &m),
              exchanges_on_one_mesh_keep_their_promises(&m, i, trials));
    RUN_NAMED(tu_case_name("nested_shard_changes_take_one_exchange_within_the_shards", &m),
              nested_shard_changes_take_one_exchange_within_the_shards(&m));
    RUN_NAMED(tu_case_name("every_collective_runs_nonblocking_like_blocking", &m),
              every_collective_runs_nonblocking_like_blocking(&m));
    RUN_NAMED(tu_case_name("an_error_midway_leaves_no_transfer_in_flight", &m),
              an_error_midway_leaves_no_transfer_in_flight(&m));
    tu_mesh_close(&m);
  }
  tu_parent_close();
  return dt_finish();
}

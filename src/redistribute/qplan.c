/* SPDX-License-Identifier: Apache-2.0 */
/* Quantized redistribution: a qplan moves every part of a quantized tensor (codes, scales, zeros, g_idx) between two
 * qlayouts of one format and logical shape, as one plan per part. A part cut like a dense tensor (the qlayout's views)
 * takes dtl_plan_create's cheapest route over its plain layouts; a part with BLOCK dims, whose shards overlap, takes
 * the exchange of the blocks each target rank's box needs from the source ranks that own them (plan_internal.h,
 * dtl__plan_create_qpart). An execution checks every part's buffers, agrees once (DTL_CHECK) over all of them, starts
 * every part's plan nonblocking and waits for them together, so that the parts' transfers overlap. */
#include <stdlib.h>
#include <string.h>
#include "layout/qlayout_internal.h"
#include "redistribute/redistribute_internal.h"

static const char *const dtl__qpart_name[DTL_QUANT_NUM_PARTS] = {"codes", "scales", "zeros", "g_idx"};

/* The entry points' names with each part's, for the messages of the part's plan (static: a started plan keeps it). */
static const char *const dtl__qfn[3][DTL_QUANT_NUM_PARTS] = {
    {"dtl_qplan_create: codes", "dtl_qplan_create: scales", "dtl_qplan_create: zeros", "dtl_qplan_create: g_idx"},
    {"dtl_qplan_execute: codes", "dtl_qplan_execute: scales", "dtl_qplan_execute: zeros", "dtl_qplan_execute: g_idx"},
    {"dtl_qredistribute: codes", "dtl_qredistribute: scales", "dtl_qredistribute: zeros", "dtl_qredistribute: g_idx"}};
enum { DTL__QFN_CREATE, DTL__QFN_EXECUTE, DTL__QFN_REDISTRIBUTE };

#define DTL__QTEXT_CAP 320

struct dtl_qplan {
  dtl__qgeom g; /* the format's geometry: the block parts' plans read it (plan_internal.h) */
  const dtl_mesh *sm, *dm;
  char src_text[DTL__QTEXT_CAP], dst_text[DTL__QTEXT_CAP]; /* dtl_qlayout_format of both */
  int n;                                                   /* the format's parts, in part order */
  int part[DTL_QUANT_NUM_PARTS];
  dtl_plan *plan[DTL_QUANT_NUM_PARTS];
};

void dtl_qplan_destroy(dtl_qplan *q) {
  if (!q) return;
  for (int i = 0; i < q->n; i++) dtl_plan_destroy(q->plan[i]);
  dtl__free(q);
}

/* Whether two resolved formats are one format (every field a kind reads; the others hold the same defaults). */
static bool dtl__qfmt_equal(const dtl_quant_format *a, const dtl_quant_format *b) {
  return a->kind == b->kind && a->flags == b->flags && a->mask == b->mask && a->block_rows == b->block_rows &&
         a->block_cols == b->block_cols && a->group == b->group && a->code_dtype == b->code_dtype &&
         a->scale_dtype == b->scale_dtype;
}

static void dtl__qlayout_text(const dtl_qlayout *l, char *buf, size_t cap) {
  if (dtl_qlayout_format(l, buf, cap) != DTL_OK) snprintf(buf, cap, "(a layout too long to print)");
}

/* Both layouts of one format and logical shape, on one mesh or two of one parent. */
static dtl_status dtl__qplan_check_pair(const char *fn, const dtl_qlayout *src, const dtl_qlayout *dst) {
  DTL_CHECK_ARG(src != NULL, fn, "src=NULL");
  DTL_CHECK_ARG(dst != NULL, fn, "dst=NULL");
  bool same = dtl__qfmt_equal(&src->g.fmt, &dst->g.fmt) && src->g.ndim == dst->g.ndim;
  for (int d = 0; same && d < src->g.ndim; d++) same = src->g.shape[d] == dst->g.shape[d];
  if (!same) {
    char a[DTL__QTEXT_CAP], b[DTL__QTEXT_CAP];
    dtl__qlayout_text(src, a, sizeof a);
    dtl__qlayout_text(dst, b, sizeof b);
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "src is %s but dst is %s (expected one format and logical shape)",
                         a, b);
  }
  return dtl__plan_check_pair(fn, &src->logical, &dst->logical);
}

static dtl_status dtl__qplan_create(const char *fn, int which, const dtl_qlayout *src, const dtl_qlayout *dst,
                                    dtl_qplan **out) {
  DTL_CHECK_ARG(out != NULL, fn, "out=NULL");
  DTL_TRY(dtl__qplan_check_pair(fn, src, dst));
  dtl_qplan *q = dtl__calloc(1, sizeof *q);
  if (!q) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
  q->g = src->g;
  q->sm = src->logical.mesh;
  q->dm = dst->logical.mesh;
  dtl__qlayout_text(src, q->src_text, sizeof q->src_text);
  dtl__qlayout_text(dst, q->dst_text, sizeof q->dst_text);
  dtl_status st = DTL_OK;
  for (int p = 0; p < DTL_QUANT_NUM_PARTS && st == DTL_OK; p++) {
    if (q->g.part[p].ndim < 0) continue;
    const char *pfn = dtl__qfn[which][p];
    dtl_plan *plan = NULL;
    if (src->has_view[p] != dst->has_view[p]) /* one format: its parts are cut alike */
      st = dtl__error_fn(DTL_ERR_INTERNAL, pfn, "a plain layout on one side only");
    else if (src->has_view[p])
      st = dtl__plan_create(pfn, &src->view[p], &dst->view[p], NULL, SIZE_MAX, &plan);
    else
      st = dtl__plan_create_qpart(pfn, &q->g, p, &src->logical, &dst->logical, NULL, &plan);
    if (st == DTL_OK) {
      q->part[q->n] = p;
      q->plan[q->n++] = plan;
      st = dtl__plan_acquire_workspace(pfn, plan);
      if (st == DTL_OK) st = dtl__plan_acquire_request(pfn, plan);
    }
  }
  if (st != DTL_OK) {
    dtl_qplan_destroy(q);
    return st;
  }
  *out = q;
  return DTL_OK;
}

dtl_status dtl_qplan_create(const dtl_qlayout *src, const dtl_qlayout *dst, dtl_qplan **out) {
  return dtl__qplan_create("dtl_qplan_create", DTL__QFN_CREATE, src, dst, out);
}

/* --- execution ----------------------------------------------------------------------------------------------- */

/* Whether [a, a + an) and [b, b + bn) share a byte. */
static bool dtl__bytes_overlap(const void *a, size_t an, const void *b, size_t bn) {
  const char *x = a, *y = b;
  return a && b && an && bn && x < y + bn && y < x + an;
}

/* This rank's checks of one call: every part's buffers as its plan's execution checks them, no buffer for a part the
 * format lacks, and no target buffer that overlaps another part's buffer (the parts run at once). */
static dtl_status dtl__qplan_check(const char *fn, int which, const dtl_qplan *q, const void *const *s, void *const *d,
                                   const dtl_qbuf *src_local, const dtl_qbuf *dst_local) {
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
    if (q->g.part[p].ndim >= 0) continue;
    char f[96];
    dtl__qformat_text(&q->g.fmt, f, sizeof f);
    DTL_CHECK_ARG(!src_local || !src_local->part[p], fn, "src_local->part[%d]=%p but %s has no %s (pass NULL)", p,
                  src_local->part[p], f, dtl__qpart_name[p]);
    DTL_CHECK_ARG(!dst_local || !dst_local->part[p], fn, "dst_local->part[%d]=%p but %s has no %s (pass NULL)", p,
                  dst_local->part[p], f, dtl__qpart_name[p]);
  }
  size_t sb[DTL_QUANT_NUM_PARTS], db[DTL_QUANT_NUM_PARTS];
  for (int i = 0; i < q->n; i++) {
    const dtl_plan *pl = q->plan[i];
    DTL_TRY(dtl__plan_check_call(dtl__qfn[which][q->part[i]], pl, s[i], d[i]));
    sb[i] = pl->src.local_count * dtl_dtype_size(pl->src.dtype);
    db[i] = pl->dst.local_count * dtl_dtype_size(pl->dst.dtype);
  }
  for (int i = 0; i < q->n; i++)
    for (int j = 0; j < q->n; j++) {
      if (i == j) continue;
      int a = q->part[i], b = q->part[j];
      DTL_CHECK_ARG(!dtl__bytes_overlap(d[i], db[i], s[j], sb[j]), fn, "dst_local->part[%d] (%s, %zu bytes at %p) "
                    "overlaps src_local->part[%d] (%s, %zu bytes at %p)", a, dtl__qpart_name[a], db[i], d[i], b,
                    dtl__qpart_name[b], sb[j], s[j]);
      DTL_CHECK_ARG(j < i || !dtl__bytes_overlap(d[i], db[i], d[j], db[j]), fn, "dst_local->part[%d] (%s, %zu bytes at "
                    "%p) overlaps dst_local->part[%d] (%s, %zu bytes at %p)", a, dtl__qpart_name[a], db[i], d[i], b,
                    dtl__qpart_name[b], db[j], d[j]);
    }
  return DTL_OK;
}

/* dtl_qplan_execute with fn naming the entry point. */
static dtl_status dtl__qplan_run(const char *fn, int which, const dtl_qplan *q, const dtl_qbuf *src_local,
                                 dtl_qbuf *dst_local) {
  DTL_CHECK_ARG(q != NULL, fn, "plan=NULL");
  DTL_CHECK_ARG(q->sm->parent != NULL, fn, "the plan's mesh is abstract (dtl_mesh_create_abstract): it has no "
                "communicators, so its plans can be explained but not executed");
  const void *s[DTL_QUANT_NUM_PARTS] = {NULL};
  void *d[DTL_QUANT_NUM_PARTS] = {NULL};
  for (int i = 0; i < q->n; i++) {
    s[i] = src_local ? src_local->part[q->part[i]] : NULL;
    d[i] = dst_local ? dst_local->part[q->part[i]] : NULL;
  }
  if (!q->sm->member && !q->dm->member) { /* in neither mesh: no part to play, and no peer waits for this rank */
    for (int i = 0; i < q->n; i++)
      DTL_CHECK_ARG(!s[i] && !d[i], fn, "%s: src_local=%p, dst_local=%p but this rank is in neither mesh of the plan "
                    "(pass NULL for both)", dtl__qpart_name[q->part[i]], s[i], d[i]);
    return DTL_OK;
  }
  /* Every check before the first transfer; under DTL_CHECK the ranks agree on all parts' plans and verdicts at once. */
  dtl_status st = dtl__qplan_check(fn, which, q, s, d, src_local, dst_local);
  st = dtl__plans_agree(fn, (const dtl_plan *const *)q->plan, q->n, st);
  if (st != DTL_OK) return st;
  dtl_request *req[DTL_QUANT_NUM_PARTS];
  int started = 0;
  while (started < q->n && st == DTL_OK) {
    st = dtl__plan_start(dtl__qfn[which][q->part[started]], q->plan[started], s[started], d[started], &req[started]);
    if (st == DTL_OK) started++;
  }
  for (int i = 0; i < started; i++) { /* every started part completes before its buffers go back to the caller */
    dtl_status w = dtl_wait(req[i]);
    if (st == DTL_OK) st = w;
  }
  return st;
}

dtl_status dtl_qplan_execute(const dtl_qplan *q, const dtl_qbuf *src_local, dtl_qbuf *dst_local) {
  return dtl__qplan_run("dtl_qplan_execute", DTL__QFN_EXECUTE, q, src_local, dst_local);
}

dtl_status dtl_qredistribute(const dtl_qlayout *src, const dtl_qbuf *src_local, const dtl_qlayout *dst,
                             dtl_qbuf *dst_local) {
  static const char fn[] = "dtl_qredistribute";
  DTL_CHECK_ARG(src != NULL, fn, "src=NULL");
  DTL_CHECK_ARG(dst != NULL, fn, "dst=NULL");
  DTL_CHECK_ARG(src->logical.mesh->parent != NULL && dst->logical.mesh->parent != NULL, fn, "the layout's mesh is "
                "abstract (dtl_mesh_create_abstract): it has no communicators, so nothing can be moved on it");
  dtl_qplan *q = NULL;
  dtl_status local = dtl__qplan_create(fn, DTL__QFN_REDISTRIBUTE, src, dst, &q);
  if (local != DTL_OK) {
    /* A rank that cannot plan takes part in the agreement its peers run inside the execution. */
    if (!src->logical.mesh->member && !dst->logical.mesh->member) return local;
    return dtl__pair_agree(fn, &src->logical, &dst->logical, local);
  }
  dtl_status st = dtl__qplan_run(fn, DTL__QFN_REDISTRIBUTE, q, src_local, dst_local);
  dtl_qplan_destroy(q);
  return st;
}

/* --- the plan as a value ------------------------------------------------------------------------------------- */

/* The parts share every rank's links and run at once: their bytes add on the wire, and only their latencies overlap,
 * so the sum is what the slowest rank's links carry (an upper bound where latency dominates). */
double dtl_qplan_cost(const dtl_qplan *q) {
  if (!q) return -1.0;
  double c = 0;
  for (int i = 0; i < q->n; i++) c += dtl_plan_cost(q->plan[i]);
  return c;
}

dtl_status dtl_qplan_bytes(const dtl_qplan *q, uint64_t *sent, uint64_t *received) {
  static const char fn[] = "dtl_qplan_bytes";
  DTL_CHECK_ARG(q != NULL, fn, "plan=NULL");
  DTL_CHECK_ARG(sent != NULL, fn, "sent=NULL");
  DTL_CHECK_ARG(received != NULL, fn, "received=NULL");
  uint64_t s = 0, r = 0;
  for (int i = 0; i < q->n; i++) {
    uint64_t a, b;
    DTL_TRY(dtl_plan_bytes(q->plan[i], &a, &b));
    s += a;
    r += b;
  }
  *sent = s;
  *received = r;
  return DTL_OK;
}

/* Appends text at *o of b (cap bytes; counts on past cap, so that a NULL b measures). */
static void dtl__qsay(char *b, size_t cap, size_t *o, const char *text) {
  size_t n = strlen(text);
  if (b && *o < cap) memcpy(b + *o, text, *o + n < cap ? n : cap - *o);
  *o += n;
}

/* The header, one section per part (its plan's text, continuation lines indented) and the total, into b (cap bytes,
 * NUL included when it fits); returns the length. */
static dtl_status dtl__qexplain_render(const char *fn, const dtl_qplan *q, char *b, size_t cap, size_t *len) {
  size_t o = 0;
  char line[2 * DTL__QTEXT_CAP + 64];
  snprintf(line, sizeof line, "qplan %s -> %s\n", q->src_text, q->dst_text);
  dtl__qsay(b, cap, &o, line);
  uint64_t sent = 0, recv = 0;
  size_t scratch = 0;
  char parts_sent[DTL_QUANT_NUM_PARTS * 40] = "", parts_recv[DTL_QUANT_NUM_PARTS * 40] = "";
  for (int i = 0; i < q->n; i++) {
    const dtl_plan *pl = q->plan[i];
    size_t need = dtl_plan_explain_needed(pl);
    char *t = need ? dtl__malloc(need) : NULL;
    if (!t) return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory");
    dtl_status st = dtl_plan_explain(pl, t, need);
    if (st != DTL_OK) {
      dtl__free(t);
      return st;
    }
    dtl__qsay(b, cap, &o, dtl__qpart_name[q->part[i]]);
    dtl__qsay(b, cap, &o, ": ");
    for (char *at = t, *nl; *at; at = nl + 1) {
      nl = strchr(at, '\n');
      if (at != t) dtl__qsay(b, cap, &o, "  ");
      if (!nl) {
        dtl__qsay(b, cap, &o, at);
        dtl__qsay(b, cap, &o, "\n");
        break;
      }
      *nl = '\0';
      dtl__qsay(b, cap, &o, at);
      dtl__qsay(b, cap, &o, "\n");
    }
    dtl__free(t);
    uint64_t a, r;
    DTL_TRY(dtl_plan_bytes(pl, &a, &r));
    sent += a;
    recv += r;
    scratch += dtl_plan_scratch_bytes(pl);
    char x[24], y[24];
    dtl__plan_bytes_text(a, x, sizeof x);
    dtl__plan_bytes_text(r, y, sizeof y);
    size_t ls = strlen(parts_sent), lr = strlen(parts_recv);
    snprintf(parts_sent + ls, sizeof parts_sent - ls, "%s%s %s", i ? ", " : "", dtl__qpart_name[q->part[i]], x);
    snprintf(parts_recv + lr, sizeof parts_recv - lr, "%s%s %s", i ? ", " : "", dtl__qpart_name[q->part[i]], y);
  }
  char s1[24], s2[24], est[24], scr[24];
  dtl__plan_bytes_text(sent, s1, sizeof s1);
  dtl__plan_bytes_text(recv, s2, sizeof s2);
  dtl__plan_time_text(dtl_qplan_cost(q), est, sizeof est);
  dtl__plan_bytes_text(scratch, scr, sizeof scr);
  char total[sizeof parts_sent + sizeof parts_recv + 200];
  snprintf(total, sizeof total, "total  %d part%s at once, send %s (%s), recv %s (%s), est %s (the parts' sum), "
           "scratch %s\n", q->n, q->n == 1 ? "" : "s", s1, parts_sent, s2, parts_recv, est, scr);
  dtl__qsay(b, cap, &o, total);
  if (b && cap) b[o < cap ? o : cap - 1] = '\0';
  *len = o;
  return DTL_OK;
}

size_t dtl_qplan_explain_needed(const dtl_qplan *q) {
  size_t n = 0;
  if (!q || dtl__qexplain_render("dtl_qplan_explain_needed", q, NULL, 0, &n) != DTL_OK) return 0;
  return n + 1;
}

dtl_status dtl_qplan_explain(const dtl_qplan *q, char *buf, size_t cap) {
  static const char fn[] = "dtl_qplan_explain";
  DTL_CHECK_ARG(q != NULL, fn, "plan=NULL");
  DTL_CHECK_ARG(buf != NULL, fn, "buf=NULL");
  size_t n = 0;
  DTL_TRY(dtl__qexplain_render(fn, q, NULL, 0, &n));
  DTL_CHECK_ARG(n + 1 <= cap, fn, "cap=%zu is too small (%zu bytes needed)", cap, n + 1);
  return dtl__qexplain_render(fn, q, buf, cap, &n);
}

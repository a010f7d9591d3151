/* SPDX-License-Identifier: Apache-2.0 */
/* The exchange map (xmap.h): classes of source ranks, the holder rule, and the bytes and peers of an exchange per
 * rank and as the maximum over all ranks. */
#include <stdlib.h>
#include <string.h>
#include "redistribute/xmap.h"

static void dtl__coord_of(const dtl_mesh *m, int r, int *c) {
  for (int d = m->ndim - 1; d >= 0; d--) {
    c[d] = r % m->shape[d];
    r /= m->shape[d];
  }
}

static int dtl__rank_of(const dtl_mesh *m, const int *c) {
  int r = 0;
  for (int d = 0; d < m->ndim; d++) r = r * m->shape[d] + c[d];
  return r;
}

static uint64_t dtl__box_overlap(int nd, const int64_t *as, const int64_t *ao, const int64_t *bs, const int64_t *bo) {
  uint64_t n = 1;
  for (int d = 0; d < nd; d++) {
    int64_t lo = ao[d] > bo[d] ? ao[d] : bo[d], hi = ao[d] + as[d] < bo[d] + bs[d] ? ao[d] + as[d] : bo[d] + bs[d];
    if (hi <= lo) return 0;
    n *= (uint64_t)(hi - lo);
  }
  return n;
}

void dtl__xbox(const dtl__qgeom *qg, int qpart, bool owned, const dtl_mesh *m, int nd, const int64_t *shape,
               const dtl_placement *pl, const int *coord, int64_t *bs, int64_t *bo) {
  if (!qg) {
    dtl__local_box(m, nd, shape, pl, coord, bs, bo);
    return;
  }
  /* The part's placements name its own dims; the logical box follows the logical dims they follow. */
  const dtl__qpart_geom *pg = &qg->part[qpart];
  dtl_placement lp[DTL_MAX_MESH_DIMS];
  for (int d = 0; d < m->ndim; d++) {
    lp[d] = pl[d];
    if (pl[d].kind == DTL_SHARD) {
      dtl__qmap_kind k = pg->map[pl[d].dim].kind;
      lp[d] = k == DTL__QMAP_WHOLE || k == DTL__QMAP_ONE ? dtl_replicate() : dtl_shard(pg->map[pl[d].dim].src);
    }
  }
  int64_t ls[DTL_MAX_TENSOR_DIMS], lo[DTL_MAX_TENSOR_DIMS];
  dtl__local_box(m, qg->ndim, qg->shape, lp, coord, ls, lo);
  if (owned) dtl__qgeom_owned_box(qg, qpart, ls, lo, bs, bo);
  else dtl__qgeom_part_box(qg, qpart, ls, lo, bs, bo);
}

dtl_status dtl__xmap_init(dtl__xmap *x, const char *fn, const dtl_layout *geom, const dtl_mesh *sm, const dtl_mesh *dm,
                          const dtl_placement *yd, const dtl__qgeom *qg, int qpart) {
  memset(x, 0, sizeof *x);
  x->qg = qg;
  x->qpart = qpart;
  x->sm = sm;
  x->dm = dm;
  x->nd = geom->ndim;
  x->es = dtl_dtype_size(geom->dtype);
  x->shape = geom->shape;
  memcpy(x->yd, yd, sizeof x->yd);
  /* One block: class and target boxes, class representatives, the pricing's tallies, the target marks, and
   * between two meshes the rank maps (and a parent-sized index, used only here). */
  int nd2 = 2 * (x->nd ? x->nd : 1), ns = sm->size, nt = dm->size, np = sm != dm ? sm->parent->size : 0;
  size_t words = (size_t)nd2 * (size_t)(ns + nt) + (size_t)ns; /* int64 / uint64 */
  size_t ints = (size_t)ns * 2 + (size_t)nt + (sm != dm ? (size_t)(nt + ns + np) : 0);
  int64_t *block = dtl__malloc(sizeof(int64_t) * words + sizeof(int) * ints);
  if (!block)
    return dtl__error_fn(DTL_ERR_OUT_OF_MEMORY, fn, "out of host memory (exchange map of %d and %d ranks)", ns, nt);
  x->cbox = block;
  x->tbox = x->cbox + (size_t)nd2 * (size_t)ns;
  x->acc_send = (uint64_t *)(x->tbox + (size_t)nd2 * (size_t)nt);
  x->crep = (int *)(x->acc_send + ns);
  x->acc_peers = x->crep + ns;
  x->tmark = x->acc_peers + ns;
  if (sm != dm) {
    x->d2s = x->tmark + nt;
    x->s2d = x->d2s + nt;
    int *at = x->s2d + ns;
    for (int i = 0; i < np; i++) at[i] = -1;
    for (int r = 0; r < ns; r++) at[dtl__mesh_parent_rank(sm, r)] = r;
    for (int r = 0; r < ns; r++) x->s2d[r] = -1;
    for (int q = 0; q < nt; q++) {
      x->d2s[q] = at[dtl__mesh_parent_rank(dm, q)];
      if (x->d2s[q] >= 0) x->s2d[x->d2s[q]] = q;
    }
  }
  int c[DTL_MAX_MESH_DIMS];
  for (int q = 0; q < dm->size; q++) {
    dtl__coord_of(dm, q, c);
    int64_t *b = x->tbox + (size_t)nd2 * (size_t)q;
    dtl__xbox(qg, qpart, false, dm, x->nd, x->shape, x->yd, c, b, b + x->nd);
  }
  return DTL_OK;
}

void dtl__xmap_source(dtl__xmap *x, const dtl_placement *xs) {
  const dtl_mesh *sm = x->sm;
  int nd2 = 2 * (x->nd ? x->nd : 1), c[DTL_MAX_MESH_DIMS];
  x->nfree = 1;
  for (int m = 0; m < sm->ndim; m++) {
    x->xs[m] = sm->shape[m] == 1 ? dtl_replicate() : xs[m];
    x->free_dim[m] = sm->shape[m] > 1 && x->xs[m].kind != DTL_SHARD;
    if (x->free_dim[m]) x->nfree *= sm->shape[m];
  }
  x->nclass = 0;
  for (int r = 0; r < sm->size; r++) {
    dtl__coord_of(sm, r, c);
    bool rep = true;
    for (int m = 0; m < sm->ndim; m++) rep &= !x->free_dim[m] || c[m] == 0;
    if (!rep) continue;
    int64_t *b = x->cbox + (size_t)nd2 * (size_t)x->nclass;
    dtl__xbox(x->qg, x->qpart, true, sm, x->nd, x->shape, x->xs, c, b, b + x->nd);
    x->crep[x->nclass++] = r;
  }
}

void dtl__xmap_free(dtl__xmap *x) {
  dtl__free(x->cbox); /* the one block */
  memset(x, 0, sizeof *x);
}

void dtl__xmap_src_box(const dtl__xmap *x, int r, int64_t *shape, int64_t *off) {
  int c[DTL_MAX_MESH_DIMS];
  dtl__coord_of(x->sm, r, c);
  dtl__xbox(x->qg, x->qpart, true, x->sm, x->nd, x->shape, x->xs, c, shape, off);
}

void dtl__xmap_dst_box(const dtl__xmap *x, int q, int64_t *shape, int64_t *off) {
  const int64_t *b = x->tbox + (size_t)(2 * (x->nd ? x->nd : 1)) * (size_t)q;
  memcpy(shape, b, sizeof(int64_t) * (size_t)x->nd);
  memcpy(off, b + x->nd, sizeof(int64_t) * (size_t)x->nd);
}

int dtl__xmap_box_rep(const dtl__xmap *x, int q) {
  int c[DTL_MAX_MESH_DIMS];
  dtl__coord_of(x->dm, q, c);
  for (int m = 0; m < x->dm->ndim; m++)
    if (x->yd[m].kind != DTL_SHARD) c[m] = 0;
  return dtl__rank_of(x->dm, c);
}

bool dtl__xmap_fills(const dtl__xmap *x, int q, dtl_reduce_op *op) {
  int c[DTL_MAX_MESH_DIMS];
  dtl__coord_of(x->dm, q, c);
  return dtl__placements_hold_identity(x->dm, x->yd, c, op);
}

int dtl__xmap_holder(const dtl__xmap *x, int q, int c) {
  const dtl_mesh *sm = x->sm;
  int cc[DTL_MAX_MESH_DIMS], sc[DTL_MAX_MESH_DIMS], s = dtl__xmap_d2s(x, q);
  dtl__coord_of(sm, c, cc);
  if (s >= 0) {
    dtl__coord_of(sm, s, sc);
    bool same = true;
    for (int m = 0; m < sm->ndim; m++) same &= x->free_dim[m] || sc[m] == cc[m];
    if (same) return s;
    for (int m = 0; m < sm->ndim; m++)
      if (x->free_dim[m]) cc[m] = sc[m];
  } else {
    int k = q % x->nfree;
    for (int m = sm->ndim - 1; m >= 0; m--)
      if (x->free_dim[m]) {
        cc[m] = k % sm->shape[m];
        k /= sm->shape[m];
      }
  }
  return dtl__rank_of(sm, cc);
}

void dtl__xmap_volume_at(const dtl__xmap *x, int r, int q, dtl__xvolume *out) {
  memset(out, 0, sizeof *out);
  int nd = x->nd, nd2 = 2 * (nd ? nd : 1);
  int64_t as[DTL_MAX_TENSOR_DIMS], ao[DTL_MAX_TENSOR_DIMS];
  if (r >= 0) { /* as a sender: every target rank whose part of r's box r holds for it */
    dtl__xmap_src_box(x, r, as, ao);
    for (int t = 0; t < x->dm->size; t++) {
      if (t == q || dtl__xmap_fills(x, t, NULL)) continue;
      const int64_t *b = x->tbox + (size_t)nd2 * (size_t)t;
      uint64_t n = dtl__box_overlap(nd, as, ao, b, b + nd);
      if (n && dtl__xmap_holder(x, t, r) == r) {
        out->send += n;
        out->send_peers++;
        if (dtl__mesh_node(x->sm, r) != dtl__mesh_node(x->dm, t)) out->send_remote += n;
      }
    }
  }
  if (q >= 0 && !dtl__xmap_fills(x, q, NULL)) { /* as a receiver: every class's part of q's box */
    const int64_t *b = x->tbox + (size_t)nd2 * (size_t)q;
    for (int k = 0; k < x->nclass; k++) {
      const int64_t *cb = x->cbox + (size_t)nd2 * (size_t)k;
      uint64_t n = dtl__box_overlap(nd, b, b + nd, cb, cb + nd);
      if (!n) continue;
      if (dtl__xmap_holder(x, q, x->crep[k]) == r) {
        out->self += n;
      } else {
        out->recv += n;
        out->recv_peers++;
      }
    }
  }
  out->send *= x->es;
  out->send_remote *= x->es;
  out->recv *= x->es;
  out->self *= x->es;
}

void dtl__xmap_volume_max(const dtl__xmap *x, dtl__xvolume *out) {
  memset(out, 0, sizeof *out);
  int nd = x->nd, nd2 = 2 * (nd ? nd : 1), ns = x->sm->size;
  /* Every (target rank, class) pair once: its piece goes to the holder's send tally, the target's receive tally, or
   * the target's own copy. */
  uint64_t *sent = x->acc_send;
  int *speers = x->acc_peers;
  memset(sent, 0, sizeof *sent * (size_t)ns);
  memset(speers, 0, sizeof *speers * (size_t)ns);
  for (int q = 0; q < x->dm->size; q++) {
    if (dtl__xmap_fills(x, q, NULL)) continue;
    const int64_t *b = x->tbox + (size_t)nd2 * (size_t)q;
    int s = dtl__xmap_d2s(x, q), peers = 0;
    uint64_t recv = 0, self = 0;
    for (int k = 0; k < x->nclass; k++) {
      const int64_t *cb = x->cbox + (size_t)nd2 * (size_t)k;
      uint64_t n = dtl__box_overlap(nd, b, b + nd, cb, cb + nd);
      if (!n) continue;
      int h = dtl__xmap_holder(x, q, x->crep[k]);
      if (h == s) {
        self += n;
        continue;
      }
      recv += n;
      peers++;
      sent[h] += n;
      speers[h]++;
      if (!out->inter && dtl__mesh_node(x->sm, h) != dtl__mesh_node(x->dm, q)) out->inter = true;
    }
    out->total += recv;
    if (recv > out->recv) out->recv = recv;
    if (self > out->self) out->self = self;
    if (peers > out->recv_peers) out->recv_peers = peers;
  }
  for (int r = 0; r < ns; r++) {
    if (sent[r] > out->send) out->send = sent[r];
    if (speers[r] > out->send_peers) out->send_peers = speers[r];
  }
  out->send *= x->es;
  out->recv *= x->es;
  out->self *= x->es;
  out->total *= x->es;
}

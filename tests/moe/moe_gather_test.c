/* SPDX-License-Identifier: Apache-2.0 */
/* The device dispatch's row gather, run on the host by its emulation (gather.cu: the kernel's own code,
 * thread by thread), so that its index arithmetic is checked without a GPU. First the kernel alone against
 * a byte-by-byte reference for row sizes of every word width (1 to 16 bytes and odd sizes) and misaligned
 * buffers; then, on real layouts over MPI (either exchange, padded blocks, drops, f32/f16/bf16/int8 rows of
 * odd byte sizes), the row maps a device layout uploads, replayed by the emulation, against what the host
 * dispatch and combine put in the send staging, the expert buffer and the receive staging. */
#include "dtl_test.h"
#include "moe/moe_internal.h"
#include "moe_oracle.h"

static dtl_comm *world;

/* gather_emulation_moves_rows_of_any_size_and_alignment: a map with zero rows (src -1), rows to both
 * destinations, repeated sources; buffers offset by 0..15 bytes. */
static void gather_emulation_moves_rows_of_any_size_and_alignment(void) {
  static const size_t sizes[] = {1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 48, 4100};
  enum { SRC_ROWS = 5, N = 7, SPLIT = 3, LO_ROWS = 3, HI_ROWS = 5 };
  const int64_t src[N] = {4, -1, 0, 2, 2, -1, 1}, dst[N] = {0, 2, 3, 7, 1, 4, 5};
  dtl__moe_rowmap m = {src, dst, N, SPLIT};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
    for (size_t shift = 0; shift < 16; shift += (sizes[si] > 64 ? 8 : 1)) {
      size_t rb = sizes[si];
      unsigned char *a = malloc(SRC_ROWS * rb + 32), *lo = malloc(LO_ROWS * rb + 32), *hi = malloc(HI_ROWS * rb + 32);
      unsigned char *wlo = malloc(LO_ROWS * rb + 32), *whi = malloc(HI_ROWS * rb + 32);
      unsigned char *s = a + shift, *l = lo + (shift * 3) % 16, *h = hi + (shift * 5) % 16;
      for (size_t i = 0; i < SRC_ROWS * rb; i++) s[i] = (unsigned char)(i * 7 + 1);
      memset(l, 0xee, LO_ROWS * rb);
      memset(h, 0xee, HI_ROWS * rb);
      memcpy(wlo, l, LO_ROWS * rb);
      memcpy(whi, h, HI_ROWS * rb);
      for (int i = 0; i < N; i++) {
        unsigned char *out = dst[i] < SPLIT ? wlo + dst[i] * rb : whi + (dst[i] - SPLIT) * rb;
        if (src[i] < 0) memset(out, 0, rb);
        else memcpy(out, s + src[i] * rb, rb);
      }
      CHECK_OK(dtl__moe_gather_rows_emulate(&m, s, l, h, rb));
      CHECK(memcmp(l, wlo, LO_ROWS * rb) == 0 && memcmp(h, whi, HI_ROWS * rb) == 0,
            "row of %zu bytes, source shifted %zu bytes: wrong rows", rb, shift);
      free(a), free(lo), free(hi), free(wlo), free(whi);
    }
  dtl__moe_rowmap empty = {NULL, NULL, 0, 0};
  CHECK_OK(dtl__moe_gather_rows_emulate(&empty, NULL, NULL, NULL, 16));
}

typedef struct {
  dtl_moe_exchange exchange;
  int64_t pad;
  double capacity;
  dtl_dtype t;
  int64_t hidden;
} config;

/* The layout's maps, replayed by the emulation, reproduce what the host path wrote. */
static void replay(const config *c) {
  enum { E = 5, T = 11, K = 2 };
  const int64_t Hd = c->hidden;
  char what[128];
  snprintf(what, sizeof what, "%s exchange, pad %lld, capacity %g, %s x %lld",
           c->exchange == DTL_MOE_EXCHANGE_SINGLE ? "single" : "per-expert", (long long)c->pad, c->capacity,
           dtl_dtype_name(c->t), (long long)Hd);
  int32_t ids[T * K];
  float w[T * K];
  oracle_routing(21, dt_rank, T, K, E, ids, w);
  size_t es = dtl_dtype_size(c->t), rb = (size_t)Hd * es;
  unsigned char *x = malloc(T * rb + 1);
  oracle_rng r = oracle_seed(22, (uint64_t)dt_rank);
  for (size_t i = 0; i < T * rb; i++) x[i] = (unsigned char)oracle_next(&r);
  if (c->t == DTL_FLOAT16 || c->t == DTL_BFLOAT16) /* finite values: clear each word's exponent top bit */
    for (size_t i = 1; i < T * rb; i += 2) x[i] &= 0x3f;
  dtl_moe_placement *pl = NULL;
  CHECK_OK(dtl_moe_placement_create(E, dt_size, NULL, &pl));
  dtl_moe_layout_params prm = {.mask = DTL_MOE_LAYOUT_EXCHANGE | DTL_MOE_LAYOUT_PAD_MULTIPLE, .exchange = c->exchange,
                               .pad_multiple = c->pad};
  if (c->capacity > 0) {
    prm.mask |= DTL_MOE_LAYOUT_CAPACITY_FACTOR;
    prm.capacity_factor = c->capacity;
  }
  dtl_moe_layout *L = NULL;
  CHECK_OK(dtl_moe_layout_create(world, pl, T, K, ids, w, Hd, c->t, &prm, &L));
  if (!L) {
    free(x);
    dtl_moe_placement_destroy(pl);
    return;
  }
  int64_t rows = L->expert_rows;
  unsigned char *ein = malloc((size_t)rows * rb + 1), *eout = malloc((size_t)rows * rb + 1);
  memset(ein, 0x77, (size_t)rows * rb);
  CHECK_OK(dtl_moe_layout_dispatch(L, x, ein));
  dtl__moe_rowmap pack, regroup;
  int64_t *buf = NULL;
  CHECK_OK(dtl__moe_rowmaps(L, &pack, &regroup, &buf));
  /* The pack: the send staging exactly, and the expert rows it writes (own rows and padding). */
  unsigned char *send = malloc((size_t)L->send_rows * rb + 1), *hi = malloc((size_t)rows * rb + 1);
  memset(hi, 0x77, (size_t)rows * rb);
  CHECK_OK(dtl__moe_gather_rows_emulate(&pack, x, send, hi, rb));
  CHECK(L->send_rows == 0 || memcmp(send, L->send_buf, (size_t)L->send_rows * rb) == 0,
        "%s: the pack map's send staging differs", what);
  int64_t written = 0;
  for (int64_t i = 0; i < pack.n; i++) {
    int64_t d = pack.dst[i];
    if (d < pack.split) continue;
    written++;
    CHECK(memcmp(hi + (size_t)(d - pack.split) * rb, ein + (size_t)(d - pack.split) * rb, rb) == 0,
          "%s: pack map row %lld (expert row %lld) differs", what, (long long)i, (long long)(d - pack.split));
  }
  /* The regroup: every expert row it writes, from the receive staging the host dispatch filled. */
  written += regroup.n;
  CHECK_OK(dtl__moe_gather_rows_emulate(&regroup, L->recv_buf, NULL, hi, rb));
  CHECK(memcmp(hi, ein, (size_t)rows * rb) == 0 || c->exchange != DTL_MOE_EXCHANGE_SINGLE,
        "%s: pack and regroup maps together do not rebuild expert_in", what);
  /* Every expert row is written once: by the pack, the regroup, or (per expert) straight by the exchange. */
  int64_t received = 0;
  for (int i = 0; c->exchange != DTL_MOE_EXCHANGE_SINGLE && i < L->calls; i++)
    for (int s = 0; s < L->size; s++) received += (int64_t)L->recv_counts[(size_t)i * L->size + s] / Hd;
  CHECK(written + received == rows, "%s: %lld rows written by the maps, %lld received in place, %lld expert rows", what,
        (long long)written, (long long)received, (long long)rows);
  /* Combine runs the regroup backwards: expert_out rows into the receive staging. */
  if (dtl__dtype_is_float(c->t)) {
    for (size_t i = 0; i < (size_t)rows * rb; i++) eout[i] = ein[i];
    unsigned char *y = malloc(T * rb + 1), *recv = malloc((size_t)L->recv_rows * rb + 1);
    CHECK_OK(dtl_moe_layout_combine(L, eout, y));
    dtl__moe_rowmap back = {regroup.dst, regroup.src, regroup.n, 0};
    CHECK_OK(dtl__moe_gather_rows_emulate(&back, eout, NULL, recv, rb));
    CHECK(L->recv_rows == 0 || memcmp(recv, L->recv_buf, (size_t)L->recv_rows * rb) == 0,
          "%s: the reversed regroup map differs", what);
    free(y), free(recv);
  }
  free(buf), free(send), free(hi), free(x), free(ein), free(eout);
  dtl_moe_layout_destroy(L);
  dtl_moe_placement_destroy(pl);
}

static void device_row_maps_replay_the_host_dispatch_and_combine(void) {
  static const config cs[] = {
      {DTL_MOE_EXCHANGE_PER_EXPERT, 1, 0, DTL_FLOAT32, 5},   {DTL_MOE_EXCHANGE_SINGLE, 1, 0, DTL_FLOAT32, 8},
      {DTL_MOE_EXCHANGE_PER_EXPERT, 4, 1.0, DTL_FLOAT16, 3}, {DTL_MOE_EXCHANGE_SINGLE, 3, 1.0, DTL_BFLOAT16, 7},
      {DTL_MOE_EXCHANGE_SINGLE, 2, 0, DTL_INT8, 3},          {DTL_MOE_EXCHANGE_SINGLE, 1, 1.25, DTL_FLOAT16, 4},
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) replay(&cs[i]);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  CHECK_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &world));
  RUN(gather_emulation_moves_rows_of_any_size_and_alignment);
  RUN(device_row_maps_replay_the_host_dispatch_and_combine);
  dtl_comm_destroy(world);
  return dt_finish();
}

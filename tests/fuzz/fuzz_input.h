/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the libFuzzer targets: reading structured values off the fuzzer's bytes (past the end every
 * read gives 0), the check that aborts (libFuzzer then saves the input), and the rules every failed call
 * must follow: an expected status and a message that names the call and is safe to print. */
#ifndef FUZZ_INPUT_H
#define FUZZ_INPUT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtl.h"
#include "text_safe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);           \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fprintf(stderr, "\n");                                                             \
      abort();                                                                           \
    }                                                                                    \
  } while (0)

typedef struct {
  const uint8_t *p;
  size_t n;
} fz_in;

static inline unsigned fz_byte(fz_in *in) {
  if (!in->n) return 0;
  in->n--;
  return *in->p++;
}

/* An integer in [0, k). */
static inline int fz_below(fz_in *in, int k) { return (int)(fz_byte(in) % (unsigned)k); }

static inline uint64_t fz_u64(fz_in *in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | fz_byte(in);
  return v;
}

static inline double fz_double(fz_in *in) {
  uint64_t v = fz_u64(in);
  double d;
  memcpy(&d, &v, sizeof d);
  return d;
}

/* A placement for a tensor of nd dims: usually a valid one (R, P(op), S(d) with d in -nd..nd-1), sometimes
 * an arbitrary shard dim or op, which dtl_layout_create must refuse. */
static inline dtl_placement fz_placement(fz_in *in, int nd) {
  unsigned b = fz_byte(in);
  if (b >= 0xf8) return dtl_shard((int8_t)fz_byte(in));
  if (b >= 0xf0) return dtl_partial((dtl_reduce_op)(int8_t)fz_byte(in));
  unsigned v = b % (unsigned)(2 * nd + 3);
  if (v == 0) return dtl_replicate();
  if (v == 1) return dtl_partial((dtl_reduce_op)fz_below(in, DTL_NUM_REDUCE_OPS));
  if (v == 2) return dtl_partial(DTL_SUM);
  int k = (int)v - 3;
  return dtl_shard(k < nd ? k : k - 2 * nd);
}

/* A failed call: its status is one of the allowed (a 0-terminated list) and dtl_last_error is non-empty,
 * names fn and is safe to print. */
static inline void fz_failed(dtl_status st, const char *fn, const dtl_status *allowed) {
  int ok = 0;
  for (; *allowed; allowed++) ok |= st == *allowed;
  FZ_CHECK(ok, "%s returned %s: %s", fn, dtl_status_name(st), dtl_last_error());
  const char *msg = dtl_last_error();
  size_t at;
  FZ_CHECK(strstr(msg, fn) != NULL, "%s: message \"%s\" does not name the call", fn, msg);
  FZ_CHECK(dt_text_safe(msg, false, &at), "%s: message has unsafe byte 0x%02x at %zu", fn, (unsigned char)msg[at], at);
}
#define FZ_FAILED(st, fn, ...) fz_failed((st), (fn), (const dtl_status[]){__VA_ARGS__, DTL_OK})

#endif

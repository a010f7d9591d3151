/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target of the placement text (dtl_placements_parse / _format): the input is the text (up to
 * its first NUL). Text that parses must round-trip: format -> parse gives the same placements and format
 * gives the same text again, and format needs exactly strlen + 1 bytes. Text that does not parse must fail
 * with DTL_ERR_INVALID_ARGUMENT, write nothing, and say why in a message that is safe to print. */
#include "fuzz_input.h"

static int same(dtl_placement a, dtl_placement b) {
  if (a.kind != b.kind) return 0;
  if (a.kind == DTL_SHARD) return a.dim == b.dim;
  if (a.kind == DTL_PARTIAL) return a.op == b.op;
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  enum { MAX = 8 };
  dtl_placement p[MAX + 1], q[MAX + 1];
  memset(p, 0x5a, sizeof p);
  int n = -7, m = -7;
  dtl_status st = dtl_placements_parse(text, p, MAX, &n);
  if (st != DTL_OK) {
    FZ_FAILED(st, "dtl_placements_parse", DTL_ERR_INVALID_ARGUMENT);
    FZ_CHECK(n == -7, "a failed parse wrote count=%d", n);
    const unsigned char *raw = (const unsigned char *)p;
    for (size_t i = 0; i < sizeof p; i++) FZ_CHECK(raw[i] == 0x5a, "a failed parse wrote out[]");
    free(text);
    return 0;
  }
  FZ_CHECK(n >= 1 && n <= MAX, "count=%d", n);
  char a[512], b[512];
  FZ_CHECK(dtl_placements_format(p, n, a, sizeof a) == DTL_OK, "format: %s", dtl_last_error());
  size_t len = strlen(a);
  FZ_CHECK(dtl_placements_format(p, n, b, len) == DTL_ERR_INVALID_ARGUMENT, "format into %zu bytes of %zu", len,
           len + 1);
  FZ_CHECK(dtl_placements_format(p, n, b, len + 1) == DTL_OK && strcmp(a, b) == 0, "format into exactly strlen + 1");
  FZ_CHECK(dtl_placements_parse(a, q, MAX, &m) == DTL_OK, "the formatted \"%s\" does not parse: %s", a,
           dtl_last_error());
  FZ_CHECK(m == n, "\"%s\" parses to %d placements, the input to %d", a, m, n);
  for (int i = 0; i < n; i++) FZ_CHECK(same(p[i], q[i]), "entry %d differs after the round trip through \"%s\"", i, a);
  FZ_CHECK(dtl_placements_format(q, m, b, sizeof b) == DTL_OK && strcmp(a, b) == 0, "\"%s\" formats as \"%s\"", a, b);
  /* max below the count writes nothing either. */
  if (n > 1) {
    int k = -7;
    FZ_CHECK(dtl_placements_parse(text, q, n - 1, &k) == DTL_ERR_INVALID_ARGUMENT && k == -7, "max=%d accepted", n - 1);
  }
  free(text);
  return 0;
}

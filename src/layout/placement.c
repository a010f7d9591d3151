/* SPDX-License-Identifier: Apache-2.0 */
/* The text form of placement lists ("S(0),R,P(sum)"): parsing with messages that point at the bad entry,
 * and printing. Range checks that need a tensor (shard dims) belong to dtl_layout_create, not here. */
#include <ctype.h>
#include <limits.h>
#include <string.h>
#include "layout/layout_internal.h"

static const char dtl__parse_fn[] = "dtl_placements_parse";

/* One entry: ws* (R | S d | S(d) | P | P(op)) ws*, ended by ',' or the end of the text. On success *pos
 * is past the entry (at the ',' or the NUL). index is the entry's 1-based number, for the message. */
static dtl_status dtl__parse_entry(const char *text, size_t *pos, int index, dtl_placement *out) {
  size_t i = *pos;
  while (isspace((unsigned char)text[i])) i++;
  const size_t start = i;
  size_t end = start; /* end of the entry's text, trailing blanks excluded */
  for (size_t j = start; text[j] && text[j] != ','; j++)
    if (!isspace((unsigned char)text[j])) end = j + 1;
  const int len = (int)(end - start);
  char qt[DTL__QUOTE_CAP], qe[DTL__QUOTE_CAP];
  if (len == 0)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, dtl__parse_fn,
                         "text=\"%s\": entry %d at offset %zu is empty (expected R, S(d), Sd, P or P(op))",
                         dtl__quote(text, qt, sizeof qt), index, start);
  const char *e = text + start;
  dtl_placement p;
  bool ok = false;
  const char *why = "expected R, S(d), Sd, P or P(op)";
  if (len == 1 && e[0] == 'R') {
    p = dtl_replicate();
    ok = true;
  } else if (e[0] == 'P') {
    p = dtl_partial(DTL_SUM);
    if (len == 1) {
      ok = true;
    } else if (e[1] == '(' && e[len - 1] == ')') {
      why = "expected P(sum), P(prod), P(max), P(min) or P(avg)";
      for (int op = 0; op < DTL_NUM_REDUCE_OPS && !ok; op++) {
        const char *name = dtl_reduce_op_name((dtl_reduce_op)op);
        if ((size_t)(len - 3) == strlen(name) && strncmp(e + 2, name, (size_t)(len - 3)) == 0) {
          p.op = (dtl_reduce_op)op;
          ok = true;
        }
      }
    }
  } else if (e[0] == 'S') {
    /* The digits sit between "S" and the end, or between "S(" and ")". */
    int lo = 1, hi = len;
    if (len >= 2 && e[1] == '(') {
      lo = 2;
      hi = e[len - 1] == ')' ? len - 1 : -1;
    }
    why = "expected S(d) or Sd with an integer d";
    if (hi > lo) {
      int k = lo;
      bool neg = e[k] == '-';
      if (neg) k++;
      long long v = 0;
      bool digits = k < hi;
      for (; k < hi && digits; k++) {
        if (!isdigit((unsigned char)e[k])) digits = false;
        else if ((v = v * 10 + (e[k] - '0')) > (long long)INT_MAX + 1) {
          why = "the shard dim does not fit an int";
          digits = false;
        }
      }
      if (digits) v = neg ? -v : v;
      if (digits && v >= INT_MIN && v <= INT_MAX) {
        p = dtl_shard((int)v);
        ok = true;
      } else if (digits) {
        why = "the shard dim does not fit an int";
      }
    }
  }
  if (!ok)
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, dtl__parse_fn, "text=\"%s\": entry %d \"%s\" at offset %zu (%s)",
                         dtl__quote(text, qt, sizeof qt), index, dtl__quote_n(e, (size_t)len, qe, sizeof qe), start, why);
  *out = p;
  *pos = end;
  while (isspace((unsigned char)text[*pos])) (*pos)++;
  return DTL_OK;
}

/* Walks every entry; writes them to out only when out is not NULL. *n gets the number of entries. */
static dtl_status dtl__parse_list(const char *text, dtl_placement *out, int *n) {
  size_t pos = 0;
  int k = 0;
  for (;;) {
    dtl_placement p;
    DTL_TRY(dtl__parse_entry(text, &pos, k + 1, &p));
    if (out) out[k] = p;
    k++;
    if (text[pos] == '\0') break;
    pos++; /* the ',' */
  }
  *n = k;
  return DTL_OK;
}

dtl_status dtl_placements_parse(const char *text, dtl_placement *out, int max, int *count) {
  DTL_CHECK_ARG(text != NULL, dtl__parse_fn, "text=NULL");
  DTL_CHECK_ARG(out != NULL, dtl__parse_fn, "out=NULL");
  DTL_CHECK_ARG(count != NULL, dtl__parse_fn, "count=NULL");
  DTL_CHECK_ARG(max >= 1, dtl__parse_fn, "max=%d (expected >= 1)", max);
  /* Validate and count first so that a failure, or a list longer than max, writes nothing. */
  int n;
  DTL_TRY(dtl__parse_list(text, NULL, &n));
  char qt[DTL__QUOTE_CAP];
  DTL_CHECK_ARG(n <= max, dtl__parse_fn, "text=\"%s\" has %d entries (expected at most max=%d)",
                dtl__quote(text, qt, sizeof qt), n, max);
  DTL_TRY(dtl__parse_list(text, out, &n));
  *count = n;
  return DTL_OK;
}

/* Appends one entry's text at buf + o when it fits; returns the entry's length either way. */
static size_t dtl__format_entry(dtl_placement p, char *buf, size_t o, size_t cap) {
  char tmp[32];
  int n;
  switch (p.kind) {
    case DTL_SHARD: n = snprintf(tmp, sizeof tmp, "S(%d)", p.dim); break;
    case DTL_PARTIAL: n = snprintf(tmp, sizeof tmp, "P(%s)", dtl_reduce_op_name(p.op)); break;
    default: n = snprintf(tmp, sizeof tmp, "R"); break;
  }
  if (o + (size_t)n < cap) memcpy(buf + o, tmp, (size_t)n);
  return (size_t)n;
}

dtl_status dtl_placements_format(const dtl_placement *p, int count, char *buf, size_t cap) {
  static const char fn[] = "dtl_placements_format";
  DTL_CHECK_ARG(count >= 0, fn, "count=%d (expected >= 0)", count);
  DTL_CHECK_ARG(p != NULL || count == 0, fn, "placements=NULL");
  DTL_CHECK_ARG(buf != NULL, fn, "buf=NULL");
  size_t need = 1;
  for (int i = 0; i < count; i++) {
    DTL_CHECK_ARG(p[i].kind == DTL_REPLICATE || p[i].kind == DTL_SHARD || p[i].kind == DTL_PARTIAL, fn,
                  "placements[%d].kind=%d (expected DTL_REPLICATE, DTL_SHARD or DTL_PARTIAL)", i, (int)p[i].kind);
    DTL_CHECK_ARG(p[i].kind != DTL_PARTIAL || dtl__reduce_op_valid(p[i].op), fn,
                  "placements[%d].op=%d (expected DTL_SUM..DTL_AVG)", i, (int)p[i].op);
    need += (i > 0) + dtl__format_entry(p[i], NULL, 0, 0);
  }
  DTL_CHECK_ARG(need <= cap, fn, "cap=%zu is too small (%zu bytes needed)", cap, need);
  size_t o = 0;
  for (int i = 0; i < count; i++) {
    if (i > 0) buf[o++] = ',';
    o += dtl__format_entry(p[i], buf, o, cap);
  }
  buf[o] = '\0';
  return DTL_OK;
}

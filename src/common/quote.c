/* SPDX-License-Identifier: Apache-2.0 */
/* Quoting caller-supplied text for messages (quote.h): the one place that decides which bytes are safe to
 * echo. */
#include "common/quote.h"
#include <string.h>

/* The length of the well-formed UTF-8 character of at least two bytes at s (n bytes available) if it is
 * safe to print, else 0. */
static size_t dtl__utf8_safe(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (len == 0 || len > n) return 0;
  for (size_t k = 1; k < len; k++)
    if ((s[k] & 0xc0) != 0x80) return 0;
  /* Overlong forms, UTF-16 surrogates and code points past U+10FFFF. */
  if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) || (c == 0xf0 && s[1] < 0x90) ||
      (c == 0xf4 && s[1] >= 0x90))
    return 0;
  if (c == 0xc2 && s[1] < 0xa0) return 0; /* C1 controls: CSI (U+009B) starts escape sequences too */
  if (c == 0xe2 && s[1] == 0x80 && (s[2] == 0x8e || s[2] == 0x8f || (s[2] >= 0xa8 && s[2] <= 0xae))) return 0;
  if (c == 0xe2 && s[1] == 0x81 && s[2] >= 0xa6 && s[2] <= 0xa9) return 0;
  return len;
}

/* The printed form of the character at s into unit; returns its length, *used the input bytes it takes. */
static size_t dtl__quote_unit(const unsigned char *s, size_t n, char *unit, size_t *used) {
  static const char hex[] = "0123456789abcdef";
  unsigned char c = s[0];
  *used = 1;
  if (c >= 0x20 && c < 0x7f) {
    if (c != '\\') {
      unit[0] = (char)c;
      return 1;
    }
    unit[0] = '\\';
    unit[1] = (char)c;
    return 2;
  }
  size_t len = c >= 0x80 ? dtl__utf8_safe(s, n) : 0;
  if (len) {
    memcpy(unit, s, len);
    *used = len;
    return len;
  }
  unit[0] = '\\';
  unit[1] = 'x';
  unit[2] = hex[c >> 4];
  unit[3] = hex[c & 15];
  return 4;
}

const char *dtl__quote_n(const char *in, size_t len, char *out, size_t cap) {
  if (cap == 0) return out;
  if (!in) {
    static const char null_text[] = "(null)";
    size_t k = sizeof null_text - 1 < cap - 1 ? sizeof null_text - 1 : cap - 1;
    memcpy(out, null_text, k);
    out[k] = '\0';
    return out;
  }
  const unsigned char *s = (const unsigned char *)in;
  /* Whether everything fits; if not, the units stop where "..." still fits after them. */
  size_t whole = 0;
  char unit[4];
  for (size_t i = 0, used; i < len && whole < cap; i += used) whole += dtl__quote_unit(s + i, len - i, unit, &used);
  size_t limit = whole < cap ? cap - 1 : cap > 4 ? cap - 4 : 0, o = 0, i = 0;
  while (i < len) {
    size_t used, k = dtl__quote_unit(s + i, len - i, unit, &used);
    if (o + k > limit) break;
    memcpy(out + o, unit, k);
    o += k;
    i += used;
  }
  if (i < len)
    for (int d = 0; d < 3 && o + 1 < cap; d++) out[o++] = '.';
  out[o] = '\0';
  return out;
}

const char *dtl__quote(const char *in, char *out, size_t cap) {
  return dtl__quote_n(in, in ? strlen(in) : 0, out, cap);
}

void dtl__utf8_trim(char *s) {
  size_t n = strlen(s), k = 0;
  while (k < n && k < 4 && ((unsigned char)s[n - 1 - k] & 0xc0) == 0x80) k++; /* continuation bytes */
  if (k == n || ((unsigned char)s[n - 1 - k] & 0xc0) != 0xc0) return;         /* no lead byte before them */
  unsigned char c = (unsigned char)s[n - 1 - k];
  size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
  if (k + 1 < len) s[n - 1 - k] = '\0';
}

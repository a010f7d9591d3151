/* SPDX-License-Identifier: Apache-2.0 */
/* What "safe to echo" means for the tests and fuzz targets that check messages (the rule of
 * src/common/quote.h, restated independently). */
#ifndef DT_TEXT_SAFE_H
#define DT_TEXT_SAFE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether s is safe on a terminal: no byte below 0x20, no DEL, well-formed UTF-8 without C1 controls, line
 * separators or bidirectional formatting characters (allow_newline: '\n' ends lines of multi-line text). */
static inline bool dt_text_safe(const char *s, bool allow_newline, size_t *bad_at) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; p[i];) {
    unsigned char c = p[i];
    *bad_at = i;
    if (c == '\n' && allow_newline) {
      i++;
      continue;
    }
    if (c < 0x20 || c == 0x7f) return false;
    if (c < 0x80) {
      i++;
      continue;
    }
    int n = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0) return false;
    uint32_t cp = c & (0x7f >> n);
    for (int k = 1; k < n; k++) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = cp << 6 | (p[i + k] & 0x3f);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    if (cp <= 0x9f || cp == 0x200e || cp == 0x200f || (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069))
      return false;
    i += (size_t)n;
  }
  return true;
}

#endif

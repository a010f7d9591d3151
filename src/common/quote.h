/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl (the `dtl` tool compiles quote.c too). Caller-supplied text as it may be
 * echoed in a message or on a terminal: every byte that could control a terminal or be misread is written
 * as \xNN, so a message never carries an escape sequence, a newline or invalid UTF-8. Self-contained: it
 * includes nothing of dtl's. */
#ifndef DTL_COMMON_QUOTE_H
#define DTL_COMMON_QUOTE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Buffer sizes for one quoted argument in a message (about 100 bytes of printable input) and for a path. */
#define DTL__QUOTE_CAP 104
#define DTL__QUOTE_PATH_CAP 1024

/* Writes the first len bytes of in into out (cap bytes, NUL-terminated) for printing in a message:
 * printable ASCII as is, except '\' (written \\, so that an escape is never ambiguous); well-formed UTF-8
 * characters as they are, except C1 controls (U+0080..U+009F), the line and paragraph separators and the
 * bidirectional formatting characters (U+200E/F, U+202A..U+202E, U+2066..U+2069), whose bytes are escaped;
 * every other byte (below 0x20, 0x7f, bytes of malformed UTF-8) as \xNN. Text that does not fit ends in
 * "..." (never in the middle of an escape or a character). in == NULL gives "(null)". Returns out. */
const char *dtl__quote_n(const char *in, size_t len, char *out, size_t cap);
/* dtl__quote_n up to the NUL of in. */
const char *dtl__quote(const char *in, char *out, size_t cap);
/* Cuts a UTF-8 character that snprintf's truncation left incomplete at the end of s, so a message cut to
 * its buffer stays well-formed. */
void dtl__utf8_trim(char *s);

#ifdef __cplusplus
}
#endif
#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* The status names and the thread-local message of the last failed call: the only per-process state dtl keeps. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "common/internal.h"

static _Thread_local char dtl__message[1024];

const char *dtl_status_name(dtl_status s) {
  switch (s) {
#define XX(name, value, meaning) \
  case name:                     \
    return #name;
    DTL_STATUS_MAP(XX)
#undef XX
  }
  return "DTL_ERR_UNKNOWN";
}

const char *dtl_last_error(void) { return dtl__message; }

void dtl__clear_error(void) { dtl__message[0] = '\0'; }

dtl_status dtl__error(dtl_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dtl__message, sizeof dtl__message, fmt, ap);
  va_end(ap);
  DTL_LOG(DTL_LOG_INFO, "error", "%s: %s", dtl_status_name(s), dtl__message);
  return s;
}

dtl_status dtl__error_fn(dtl_status s, const char *fn, const char *fmt, ...) {
  int n = snprintf(dtl__message, sizeof dtl__message, "%s: ", fn);
  if (n < 0 || (size_t)n >= sizeof dtl__message) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dtl__message + n, sizeof dtl__message - (size_t)n, fmt, ap);
  va_end(ap);
  DTL_LOG(DTL_LOG_INFO, "error", "%s: %s", dtl_status_name(s), dtl__message);
  return s;
}

dtl_status dtl__error_prefix(dtl_status s, const char *fmt, ...) {
  char prefix[256], old[sizeof dtl__message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, dtl__message, sizeof old);
  size_t n = strlen(prefix);
  if (n + 2 < sizeof dtl__message) {
    memcpy(dtl__message, prefix, n);
    memcpy(dtl__message + n, ": ", 2);
    size_t rest = sizeof dtl__message - n - 3;
    size_t olen = strlen(old);
    if (olen > rest) olen = rest;
    memcpy(dtl__message + n + 2, old, olen);
    dtl__message[n + 2 + olen] = '\0';
  }
  return s;
}

dtl_status dtl__check_bits(const char *fn, const char *field, uint64_t value, uint64_t known, const char *names) {
  uint64_t unknown = value & ~known;
  if (!unknown) return DTL_OK;
  return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "%s=0x%llx has unknown bits 0x%llx (%s%s)", field,
                       (unsigned long long)value, (unsigned long long)unknown, known ? "known: " : "none are defined",
                       known && names ? names : "");
}

unsigned dtl_version(void) { return DTL_VERSION_HEX; }
const char *dtl_version_string(void) { return DTL_VERSION_STRING; }

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. It provides what every layer shares: error recording with the
 * "fn: arg=value (expected ...)" message convention, the DTL_TRY macros, overflow-checked arithmetic,
 * dtype helpers and logging. */
#ifndef DTL_INTERNAL_H
#define DTL_INTERNAL_H

#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stddef.h>
#include "dtl.h"
#include "common/alloc.h"
#include "common/quote.h"

#ifdef __cplusplus
extern "C" { /* device_memory.cu includes this file */
#endif

#if defined(__GNUC__)
#define DTL__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DTL__PRINTF(a, b)
#endif

/* Records the thread-local message (printf format) and returns s, so a failure reads
 *   return dtl__error(DTL_ERR_INVALID_ARGUMENT, "dtl_broadcast: root=%d (expected 0..%d)", root, n - 1); */
dtl_status dtl__error(dtl_status s, const char *fmt, ...) DTL__PRINTF(2, 3);
/* Prefixes the current message with "fn: " context while propagating an inner failure. */
dtl_status dtl__error_prefix(dtl_status s, const char *fmt, ...) DTL__PRINTF(2, 3);
void dtl__clear_error(void);

#define DTL_TRY(expr)                   \
  do {                                  \
    dtl_status dtl__s = (expr);         \
    if (dtl__s != DTL_OK) return dtl__s; \
  } while (0)
/* Jumps to label with the status in the variable st (which the function declares). */
#define DTL_TRY_GOTO(expr, st, label) \
  do {                                \
    (st) = (expr);                    \
    if ((st) != DTL_OK) goto label;   \
  } while (0)
/* Records "fn: <message>"; fn is any string (a literal or a static const char array). */
dtl_status dtl__error_fn(dtl_status s, const char *fn, const char *fmt, ...) DTL__PRINTF(3, 4);
#define DTL_CHECK_ARG(cond, fn, ...)                                                       \
  do {                                                                                     \
    if (!(cond)) return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, (fn), __VA_ARGS__); \
  } while (0)

/* The mask or flags field of a params struct: bits outside known are DTL_ERR_INVALID_ARGUMENT, e.g.
 * "dtl_tp_mlp_create: params.flags=0x10 has unknown bits 0x10 (known: DTL_TP_SEQUENCE_PARALLEL)". known and
 * names come from DTL__BITS(DTL_A, DTL_B), which spells the bits once, or DTL__NO_BITS. */
dtl_status dtl__check_bits(const char *fn, const char *field, uint64_t value, uint64_t known, const char *names);
#define DTL__BITS(...)                                                                                       \
  dtl__bits_union((const uint64_t[]){__VA_ARGS__}, sizeof((const uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t)), \
      #__VA_ARGS__
#define DTL__NO_BITS 0, NULL
static inline uint64_t dtl__bits_union(const uint64_t *bits, size_t n) {
  uint64_t u = 0;
  for (size_t i = 0; i < n; i++) u |= bits[i];
  return u;
}

/* Overflow-checked arithmetic: false when the result does not fit. */
static inline bool dtl__mul_size(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool dtl__add_size(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }
static inline bool dtl__mul_i64(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }

/* base + elems elements of es bytes, without arithmetic on a NULL base (an empty buffer may be NULL, and NULL + 0
 * is undefined in C). The one element-offset helper of the transports and the executor; the result is as
 * writable as the caller's buffer is. */
static inline char *dtl__at(const void *base, size_t elems, size_t es) {
  return elems ? (char *)(uintptr_t)base + elems * es : (char *)(uintptr_t)base;
}

bool dtl__dtype_valid(dtl_dtype t);
bool dtl__reduce_op_valid(dtl_reduce_op op);
bool dtl__dtype_is_float(dtl_dtype t);
/* The 8-bit floats (DTL_FLOAT8_E4M3, DTL_FLOAT8_E5M2). */
bool dtl__dtype_is_fp8(dtl_dtype t);
/* The rule for reductions on the 8-bit floats (types.h): exact or refused. Max and min pick one of their inputs,
 * so they are exact; sum, prod and avg would round at every step of a fold, so dtl refuses them. Returns true
 * when op on t is refused for that reason and writes why into why (cap bytes), e.g. "f8e4m3 sum would round at
 * every step; ..."; false (why untouched) for every other pair. The op and dtype must be valid. */
bool dtl__reduce_rounds(dtl_dtype t, dtl_reduce_op op, char *why, size_t cap);
/* Bytes of count elements of t; DTL_ERR_INVALID_ARGUMENT naming fn/arg if it overflows size_t. */
dtl_status dtl__bytes(const char *fn, const char *arg, size_t count, dtl_dtype t, size_t *bytes);

/* Logging: DTL_LOG=error|warn|info|debug (default warn), DTL_LOG_FILE=path (%h host, %p pid). Lines start
 * "host:pid:rank". */
typedef enum { DTL_LOG_ERROR = 0, DTL_LOG_WARN, DTL_LOG_INFO, DTL_LOG_DEBUG } dtl__log_level;
bool dtl__log_enabled(dtl__log_level lvl);
void dtl__log(dtl__log_level lvl, const char *subsys, const char *fmt, ...) DTL__PRINTF(3, 4);
#define DTL_LOG(lvl, subsys, ...)                                           \
  do {                                                                      \
    if (dtl__log_enabled(lvl)) dtl__log((lvl), (subsys), __VA_ARGS__);      \
  } while (0)

#ifdef __cplusplus
}
#endif

#endif

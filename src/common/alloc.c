/* SPDX-License-Identifier: Apache-2.0 */
/* The library's host allocator and its test hook: a counter and a fail-at-N switch, kept in atomics so
 * that concurrent callers (one communicator per thread) count exactly and never race. */
#include <stdatomic.h>
#include <stdlib.h>
#include "common/alloc.h"

static atomic_uint_fast64_t dtl__alloc_count;
static atomic_uint_fast64_t dtl__alloc_fail_at; /* 0: never fail */
static atomic_bool dtl__alloc_fail_sticky;

bool dtl__alloc_note(void) {
  uint_fast64_t n = atomic_fetch_add_explicit(&dtl__alloc_count, 1, memory_order_relaxed) + 1;
  uint_fast64_t at = atomic_load_explicit(&dtl__alloc_fail_at, memory_order_relaxed);
  if (at == 0 || n < at) return true;
  return n != at && !atomic_load_explicit(&dtl__alloc_fail_sticky, memory_order_relaxed);
}

void *dtl__malloc(size_t bytes) { return dtl__alloc_note() ? malloc(bytes ? bytes : 1) : NULL; }

void *dtl__calloc(size_t n, size_t size) {
  if (!dtl__alloc_note()) return NULL;
  return n && size ? calloc(n, size) : calloc(1, 1);
}

void *dtl__realloc(void *p, size_t bytes) { return dtl__alloc_note() ? realloc(p, bytes ? bytes : 1) : NULL; }

void dtl__free(void *p) { free(p); }

void dtl__alloc_hook_reset(uint64_t fail_at, bool fail_sticky) {
  atomic_store(&dtl__alloc_fail_sticky, fail_sticky);
  atomic_store(&dtl__alloc_fail_at, fail_at);
  atomic_store(&dtl__alloc_count, 0);
}

uint64_t dtl__alloc_hook_count(void) { return atomic_load(&dtl__alloc_count); }

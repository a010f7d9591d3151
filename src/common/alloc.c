/* SPDX-License-Identifier: Apache-2.0 */
/* The library's host allocator and its test hook: a counter, a fail-at-N switch and the live-buffer count,
 * kept in atomics so that concurrent callers (one communicator per thread) count exactly and never race. */
#include <stdatomic.h>
#include <stdlib.h>
#include "common/alloc.h"

static atomic_uint_fast64_t dtl__alloc_count;
static atomic_uint_fast64_t dtl__alloc_fail_at; /* 0: never fail */
static atomic_bool dtl__alloc_fail_sticky;
static atomic_int_fast64_t dtl__alloc_live;

void dtl__alloc_track(int delta) { atomic_fetch_add_explicit(&dtl__alloc_live, delta, memory_order_relaxed); }

static void *dtl__alloc_tracked(void *p) {
  if (p) dtl__alloc_track(1);
  return p;
}

bool dtl__alloc_note(void) {
  uint_fast64_t n = atomic_fetch_add_explicit(&dtl__alloc_count, 1, memory_order_relaxed) + 1;
  uint_fast64_t at = atomic_load_explicit(&dtl__alloc_fail_at, memory_order_relaxed);
  if (at == 0 || n < at) return true;
  return n != at && !atomic_load_explicit(&dtl__alloc_fail_sticky, memory_order_relaxed);
}

void *dtl__malloc(size_t bytes) { return dtl__alloc_note() ? dtl__alloc_tracked(malloc(bytes ? bytes : 1)) : NULL; }

void *dtl__calloc(size_t n, size_t size) {
  if (!dtl__alloc_note()) return NULL;
  return dtl__alloc_tracked(n && size ? calloc(n, size) : calloc(1, 1));
}

void *dtl__realloc(void *p, size_t bytes) {
  if (!dtl__alloc_note()) return NULL;
  void *q = realloc(p, bytes ? bytes : 1);
  return p ? q : dtl__alloc_tracked(q); /* a grown buffer is the same live one */
}

void dtl__free(void *p) {
  if (p) dtl__alloc_track(-1);
  free(p);
}

void dtl__alloc_hook_reset(uint64_t fail_at, bool fail_sticky) {
  atomic_store(&dtl__alloc_fail_sticky, fail_sticky);
  atomic_store(&dtl__alloc_fail_at, fail_at);
  atomic_store(&dtl__alloc_count, 0);
}

uint64_t dtl__alloc_hook_count(void) { return atomic_load(&dtl__alloc_count); }

int64_t dtl__alloc_hook_live(void) { return atomic_load(&dtl__alloc_live); }

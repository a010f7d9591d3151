/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. Every host allocation of the library goes through these four calls, so that
 * one place can count allocations (the hot paths promise none after their first call) and fail the Nth one
 * (every entry point that allocates must return DTL_ERR_OUT_OF_MEMORY cleanly). Device allocations report to
 * the same counter through dtl__alloc_note. */
#ifndef DTL_COMMON_ALLOC_H
#define DTL_COMMON_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* malloc, calloc, realloc and free, with the test hook applied. A request of 0 bytes returns a unique
 * pointer (never NULL on success), so that callers need not special-case empty buffers. */
void *dtl__malloc(size_t bytes);
void *dtl__calloc(size_t n, size_t size);
void *dtl__realloc(void *p, size_t bytes);
void dtl__free(void *p);

/* Called by allocators outside this file (device memory) before they allocate: counts the allocation and
 * returns false when the test hook says this one must fail. They report each buffer they hand out (+1)
 * and take back (-1) with dtl__alloc_track, so that the live count covers their memory too. */
bool dtl__alloc_note(void);
void dtl__alloc_track(int delta);

/* Test hook (process-wide, for tests only): counts every allocation since the last reset and, when
 * fail_at > 0, makes allocation number fail_at (1-based, counted from the reset) and every later one fail
 * while fail_sticky, or only that one otherwise. dtl__alloc_hook_reset(0, false) just resets the count. */
void dtl__alloc_hook_reset(uint64_t fail_at, bool fail_sticky);
uint64_t dtl__alloc_hook_count(void);
/* Buffers allocated through these calls and not yet freed, process-wide (not reset by the hook): a call
 * that fails must leave it as it found it. */
int64_t dtl__alloc_hook_live(void);

#ifdef __cplusplus
}
#endif
#endif

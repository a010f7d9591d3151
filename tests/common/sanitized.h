/* SPDX-License-Identifier: Apache-2.0 */
/* Whether a test runs under AddressSanitizer (the suite's second pass, unoptimised): gcc spells it
 * __SANITIZE_ADDRESS__, clang __has_feature. The exhaustive sweeps of pure arithmetic check a sample there, since the
 * first pass checks every case and a sample still runs every path under the sanitizer. */
#ifndef DTL_TESTS_SANITIZED_H
#define DTL_TESTS_SANITIZED_H

#if defined(__SANITIZE_ADDRESS__)
#define DTL_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DTL_TEST_SANITIZED 1
#endif
#endif
#ifndef DTL_TEST_SANITIZED
#define DTL_TEST_SANITIZED 0
#endif

/* Under the sanitizers, true for one call in `every` (a fixed stride, so every run checks the same cases); always true
 * in the first pass. `counter` is the caller's own static counter. */
#define DTL_TEST_SAMPLED(counter, every) (!DTL_TEST_SANITIZED || (counter)++ % (every) == 0)

#endif

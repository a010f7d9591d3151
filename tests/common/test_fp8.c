/* SPDX-License-Identifier: Apache-2.0 */
/* The 8-bit float conversions of src/common/half.h (and their public wrappers) against ml_dtypes: every code of
 * e4m3fn and e5m2 decoded, and f32 inputs at every rounding boundary encoded, as fp8_fixtures.txt records them
 * (made by tools/fixtures/make_fp8_fixtures.py; its header says what the cases are). The one intended difference,
 * e4m3fn overflow saturating to +-448 as torch does where ml_dtypes gives NaN, is checked as a rule of its own;
 * NaNs match as NaNs of the same sign. Also the comparison of codes that max and min use. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "common/half.h"
#include "dtl.h"

/* --- the fixture -------------------------------------------------------------------------------------------- */
typedef struct {
  uint32_t f32;
  uint8_t e4m3, e5m2; /* ml_dtypes' codes */
} enc_case;

static uint32_t dec[256][2]; /* ml_dtypes' f32 bits of each code: [code][e4m3, e5m2] */
static enc_case *enc;
static size_t nenc;

static int load(void **state) {
  (void)state;
  FILE *f = fopen(DTL_FP8_FIXTURE, "r");
  if (!f) return -1;
  char line[256];
  int ndec = 0;
  size_t cap = 4096;
  enc = malloc(cap * sizeof *enc);
  while (enc && fgets(line, sizeof line, f)) {
    unsigned a, b, c;
    if (line[0] == 'd' && sscanf(line, "d %x %x %x", &a, &b, &c) == 3 && a < 256) {
      dec[a][0] = b, dec[a][1] = c;
      ndec++;
    } else if (line[0] == 'e' && sscanf(line, "e %x %x %x", &a, &b, &c) == 3 && nenc < cap) {
      enc[nenc++] = (enc_case){a, (uint8_t)b, (uint8_t)c};
    }
  }
  fclose(f);
  return enc && ndec == 256 && nenc > 1000 ? 0 : -1;
}
static int unload(void **state) {
  (void)state;
  free(enc);
  return 0;
}

static bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
static bool e4m3_is_nan(uint8_t c) { return (c & 0x7f) == 0x7f; }
static bool e5m2_is_nan(uint8_t c) { return (c & 0x7f) > 0x7c; }

static bool has_input(uint32_t bits) {
  for (size_t i = 0; i < nenc; i++)
    if (enc[i].f32 == bits) return true;
  return false;
}

/* --- decoding ------------------------------------------------------------------------------------------------- */
static void every_code_decodes_to_the_f32_ml_dtypes_gives(void **state) {
  (void)state;
  for (int c = 0; c < 256; c++) {
    uint32_t got[2] = {dtl__f32_to_bits(dtl__f8e4m3_to_f32((uint8_t)c)), dtl__f32_to_bits(dtl__f8e5m2_to_f32((uint8_t)c))};
    for (int k = 0; k < 2; k++) {
      uint32_t want = dec[c][k];
      if (is_nan_bits(want)) {
        if (!is_nan_bits(got[k]) || (got[k] >> 31) != (want >> 31))
          fail_msg("%s code 0x%02x decodes to 0x%08x (expected a NaN of sign %u)", k ? "e5m2" : "e4m3", c, got[k], want >> 31);
        if (!(got[k] & 0x400000u)) fail_msg("%s code 0x%02x decodes to a signalling NaN 0x%08x", k ? "e5m2" : "e4m3", c, got[k]);
      } else if (got[k] != want) {
        fail_msg("%s code 0x%02x decodes to 0x%08x (ml_dtypes: 0x%08x)", k ? "e5m2" : "e4m3", c, got[k], want);
      }
    }
    assert_int_equal(dtl__f32_to_bits(dtl_f8e4m3_to_f32((uint8_t)c)), got[0]); /* the public wrappers */
    assert_int_equal(dtl__f32_to_bits(dtl_f8e5m2_to_f32((uint8_t)c)), got[1]);
  }
}

/* Every code survives f32 and back; a NaN code comes back a NaN of its sign (e5m2: its payload bit kept, made
 * quiet, as f16 NaNs are). */
static void every_code_round_trips_through_f32(void **state) {
  (void)state;
  for (int c = 0; c < 256; c++) {
    uint8_t a = dtl__f32_to_f8e4m3(dtl__f8e4m3_to_f32((uint8_t)c)), b = dtl__f32_to_f8e5m2(dtl__f8e5m2_to_f32((uint8_t)c));
    if (a != c) fail_msg("e4m3 0x%02x -> 0x%02x", c, a);
    uint8_t want = e5m2_is_nan((uint8_t)c) ? (uint8_t)(c | 0x02) : (uint8_t)c;
    if (b != want) fail_msg("e5m2 0x%02x -> 0x%02x (expected 0x%02x)", c, b, want);
  }
}

/* --- encoding ------------------------------------------------------------------------------------------------- */
/* The fixture holds what it promises: for each format, every finite value, and every midpoint between two
 * neighbouring non-negative values with the f32 values on either side, in both signs. */
static void the_fixture_covers_every_rounding_boundary(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    int boundaries = 0;
    for (int c = 0; c < 0x7f; c++) {
      float lo = k ? dtl__f8e5m2_to_f32((uint8_t)c) : dtl__f8e4m3_to_f32((uint8_t)c);
      float hi = k ? dtl__f8e5m2_to_f32((uint8_t)(c + 1)) : dtl__f8e4m3_to_f32((uint8_t)(c + 1));
      if (isnan(lo) || isinf(lo)) continue;
      /* past the largest value: the midpoint to the next value the format lacks (480, 65536) */
      if (isnan(hi) || isinf(hi)) hi = k ? 65536.0f : 480.0f;
      float mid = (lo + hi) / 2;
      uint32_t m = dtl__f32_to_bits(mid);
      for (int neg = 0; neg < 2; neg++) {
        uint32_t s = neg ? 0x80000000u : 0;
        assert_true(has_input(dtl__f32_to_bits(lo) | s));
        assert_true(has_input(m | s) && has_input((m - 1) | s) && has_input((m + 1) | s));
      }
      boundaries++;
    }
    assert_int_equal(boundaries, k ? 124 : 127); /* one above each finite non-negative code: 0x00..0x7b, 0x00..0x7e */
  }
}

static void e5m2_encodes_every_input_as_ml_dtypes_does(void **state) {
  (void)state;
  for (size_t i = 0; i < nenc; i++) {
    float x = dtl__bits_to_f32(enc[i].f32);
    uint8_t got = dtl__f32_to_f8e5m2(x), want = enc[i].e5m2;
    assert_int_equal(dtl_f32_to_f8e5m2(x), got);
    bool ok = e5m2_is_nan(want) ? e5m2_is_nan(got) && (got & 0x80) == (want & 0x80) : got == want;
    if (!ok) fail_msg("e5m2 of f32 0x%08x (%a) is 0x%02x (ml_dtypes: 0x%02x)", enc[i].f32, x, got, want);
  }
}

static void e4m3_encodes_every_input_as_ml_dtypes_does_short_of_overflow(void **state) {
  (void)state;
  for (size_t i = 0; i < nenc; i++) {
    float x = dtl__bits_to_f32(enc[i].f32);
    uint8_t got = dtl__f32_to_f8e4m3(x), want = enc[i].e4m3;
    assert_int_equal(dtl_f32_to_f8e4m3(x), got);
    if (e4m3_is_nan(want) && !isnan(x)) continue; /* overflow: the next case */
    if (got != want) /* bit for bit, NaNs too: e4m3fn has one NaN code per sign */
      fail_msg("e4m3 of f32 0x%08x (%a) is 0x%02x (ml_dtypes: 0x%02x)", enc[i].f32, x, got, want);
  }
}

/* Where ml_dtypes gives NaN for a number (float8_e4m3fn has no infinity), dtl saturates to +-448 as torch does. The
 * inputs it does so for are exactly the numbers beyond 464, the midpoint between 448 and the 480 e4m3fn lacks (464
 * itself rounds to even, to 448), infinities included. */
static void e4m3_overflow_saturates_to_448_like_torch_where_ml_dtypes_gives_nan(void **state) {
  (void)state;
  int saturated = 0, infinite = 0;
  for (size_t i = 0; i < nenc; i++) {
    float x = dtl__bits_to_f32(enc[i].f32);
    if (isnan(x)) continue;
    bool beyond = fabsf(x) > 464.0f;
    if (e4m3_is_nan(enc[i].e4m3) != beyond)
      fail_msg("f32 %a: ml_dtypes gives 0x%02x, but the overflow rule says %s", x, enc[i].e4m3,
               beyond ? "beyond 464" : "not beyond 464");
    if (!beyond) continue;
    uint8_t want = signbit(x) ? 0xfe : 0x7e;
    if (dtl__f32_to_f8e4m3(x) != want) fail_msg("e4m3 of %a is 0x%02x (expected 0x%02x, +-448)", x, dtl__f32_to_f8e4m3(x), want);
    saturated++;
    infinite += isinf(x) != 0;
  }
  assert_true(saturated >= 8); /* just above 464, the f32 extremes and the infinities, in both signs */
  assert_int_equal(infinite, 2);
  assert_int_equal(dtl__f32_to_f8e4m3(464.0f), 0x7e);
  assert_int_equal(dtl__f32_to_f8e4m3(nextafterf(464.0f, 1000.0f)), 0x7e);
}

/* Max and min compare codes without converting them (half.h): for every pair of codes the comparison is the f32
 * comparison of their values (false with a NaN, -0 == +0). */
static void codes_compare_as_their_values_for_every_pair(void **state) {
  (void)state;
  for (int x = 0; x < 256; x++)
    for (int y = 0; y < 256; y++) {
      uint8_t a = (uint8_t)x, b = (uint8_t)y;
      if (dtl__f8e4m3_gt(a, b) != (dtl__f8e4m3_to_f32(a) > dtl__f8e4m3_to_f32(b)))
        fail_msg("e4m3 0x%02x > 0x%02x", x, y);
      if (dtl__f8e5m2_gt(a, b) != (dtl__f8e5m2_to_f32(a) > dtl__f8e5m2_to_f32(b)))
        fail_msg("e5m2 0x%02x > 0x%02x", x, y);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_code_decodes_to_the_f32_ml_dtypes_gives),
      cmocka_unit_test(every_code_round_trips_through_f32),
      cmocka_unit_test(the_fixture_covers_every_rounding_boundary),
      cmocka_unit_test(e5m2_encodes_every_input_as_ml_dtypes_does),
      cmocka_unit_test(e4m3_encodes_every_input_as_ml_dtypes_does_short_of_overflow),
      cmocka_unit_test(e4m3_overflow_saturates_to_448_like_torch_where_ml_dtypes_gives_nan),
      cmocka_unit_test(codes_compare_as_their_values_for_every_pair),
  };
  return cmocka_run_group_tests_name("8-bit float conversions against ml_dtypes", tests, load, unload);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The shared helpers of src/common: f16/bf16 conversions checked exhaustively (every 16-bit pattern through
 * f32 and back against an independent decoding, every rounding midpoint of f32 -> f16/bf16) and against the
 * compiler's _Float16 where it has one (the 8-bit floats: test_fp8.c); status names, dtype parsing, the 8-bit floats'
 * reduction rule and the thread-local last error. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "common/half.h"
#include "common/internal.h"

/* --- independent decodings ------------------------------------------------------------------------------ */
/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static double f16_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double v = exp == 0 ? ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}

/* bfloat16: 1 sign, 8 exponent (bias 127), 7 mantissa bits. */
static double bf16_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 7) & 255, man = h & 127;
  double v = exp == 0 ? ldexp(man, -133) : exp == 255 ? (man ? NAN : INFINITY) : ldexp(128 + man, exp - 134);
  return sign ? -v : v;
}

typedef float (*to_f32_fn)(uint16_t);
typedef uint16_t (*from_f32_fn)(float);

static void check_every_pattern(const char *name, to_f32_fn to, from_f32_fn from, double (*value)(uint16_t),
                                uint16_t quiet_bit, uint16_t payload_mask) {
  for (uint32_t u = 0; u <= 0xffff; u++) {
    uint16_t h = (uint16_t)u;
    float f = to(h);
    double want = value(h);
    if (isnan(want)) {
      uint16_t back = from(f);
      if (!isnan(f) || (signbit(f) != 0) != (h >> 15) || !isnan(value(back)) || (back & 0x8000) != (h & 0x8000) ||
          !(back & quiet_bit) || (back & payload_mask) != (h & payload_mask))
        fail_msg("%s NaN 0x%04x -> %a -> 0x%04x (expected a quiet NaN, same sign and payload)", name, h, f, back);
      continue;
    }
    if ((double)f != want || (signbit(f) != 0) != (h >> 15))
      fail_msg("%s 0x%04x decodes to %a (expected %a)", name, h, f, want);
    if (from(f) != h) fail_msg("%s 0x%04x -> %a -> 0x%04x: not a round trip", name, h, f, from(f));
  }
}

static void f16_every_pattern_round_trips_through_f32(void **state) {
  (void)state;
  check_every_pattern("f16", dtl__f16_to_f32, dtl__f32_to_f16, f16_value, 0x200, 0x1ff);
}

static void bf16_every_pattern_round_trips_through_f32(void **state) {
  (void)state;
  check_every_pattern("bf16", dtl__bf16_to_f32, dtl__f32_to_bf16, bf16_value, 0x40, 0x3f);
}

/* Between every two neighbouring finite values a < b (positive and negative, subnormals included) the f32
 * midpoint rounds to the one with an even mantissa, and the f32 values just inside go to the nearer one.
 * The midpoints are exact in f32 (one bit more than the 11 or 8 significant bits). */
static void check_every_midpoint(const char *name, from_f32_fn from, double (*value)(uint16_t), uint16_t max_finite) {
  for (int sign = 0; sign < 2; sign++)
    for (uint16_t lo = 0; lo < max_finite; lo++) {
      uint16_t a = (uint16_t)(lo | (sign << 15)), b = (uint16_t)((lo + 1) | (sign << 15));
      float mid = (float)((value(a) + value(b)) / 2);
      assert_true((double)mid == (value(a) + value(b)) / 2);
      uint16_t even = (lo & 1) ? b : a;
      uint16_t got = from(mid), below = from(nextafterf(mid, 0.0f)), above = from(nextafterf(mid, sign ? -INFINITY : INFINITY));
      if (got != even) fail_msg("%s: midpoint %a of 0x%04x/0x%04x -> 0x%04x (expected even 0x%04x)", name, mid, a, b, got, even);
      if (below != a) fail_msg("%s: just inside %a -> 0x%04x (expected 0x%04x)", name, mid, below, a);
      if (above != b) fail_msg("%s: just outside %a -> 0x%04x (expected 0x%04x)", name, mid, above, b);
    }
}

static void f32_to_f16_rounds_to_nearest_even_at_every_midpoint(void **state) {
  (void)state;
  check_every_midpoint("f16", dtl__f32_to_f16, f16_value, 0x7bff);
}

static void f32_to_bf16_rounds_to_nearest_even_at_every_midpoint(void **state) {
  (void)state;
  check_every_midpoint("bf16", dtl__f32_to_bf16, bf16_value, 0x7f7f);
}

static void f32_to_f16_chosen_cases(void **state) {
  (void)state;
  assert_int_equal(dtl__f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(dtl__f32_to_f16(-2.0f), 0xc000);
  assert_int_equal(dtl__f32_to_f16(0.1f), 0x2e66);               /* 0.0999755859375 */
  assert_int_equal(dtl__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      /* tie: stays on even 1.0 */
  assert_int_equal(dtl__f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  /* tie: up to even 1+2^-9 */
  assert_int_equal(dtl__f32_to_f16(65504.0f), 0x7bff);             /* largest finite */
  assert_int_equal(dtl__f32_to_f16(65519.996f), 0x7bff);           /* below the overflow midpoint */
  assert_int_equal(dtl__f32_to_f16(65520.0f), 0x7c00);             /* the midpoint rounds to even: infinity */
  assert_int_equal(dtl__f32_to_f16(1e10f), 0x7c00);
  assert_int_equal(dtl__f32_to_f16(-1e10f), 0xfc00);
  assert_int_equal(dtl__f32_to_f16(0x1p-24f), 0x0001);             /* smallest subnormal */
  assert_int_equal(dtl__f32_to_f16(0x1p-25f), 0x0000);             /* half of it: tie to even zero */
  assert_int_equal(dtl__f32_to_f16(0x1.000002p-25f), 0x0001);      /* just above half */
  assert_int_equal(dtl__f32_to_f16(-0x1p-26f), 0x8000);            /* underflow keeps the sign */
  assert_int_equal(dtl__f32_to_f16(0x1.ff8p-15f), 0x03ff);         /* the largest subnormal */
  assert_int_equal(dtl__f32_to_f16(0x1.ffcp-15f), 0x0400);         /* its tie with the smallest normal rounds up */
  assert_int_equal(dtl__f32_to_f16(FLT_TRUE_MIN), 0x0000);         /* f32 subnormals are f16 zeros */
  assert_int_equal(dtl__f32_to_f16(INFINITY), 0x7c00);
  assert_int_equal(dtl__f32_to_f16(-0.0f), 0x8000);
  assert_int_equal(dtl__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);      /* tie to even */
  assert_int_equal(dtl__f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  assert_int_equal(dtl__f32_to_bf16(FLT_MAX), 0x7f80);             /* above the largest bf16: infinity */
  assert_int_equal(dtl__f32_to_bf16(3.0e38f), 0x7f62);
}

/* The compiler's own conversion (F16C or libgcc's soft-float) as a second oracle, over a sample of every
 * 1021st f32 bit pattern (about four million values of every exponent). */
static void f32_to_f16_agrees_with_the_compiler_on_a_sample(void **state) {
  (void)state;
#ifdef __FLT16_MAX__
  for (uint64_t u = 0; u <= 0xffffffffull; u += 1021) {
    float f = dtl__bits_to_f32((uint32_t)u);
    if (isnan(f)) continue;
    _Float16 h = (_Float16)f;
    uint16_t want;
    memcpy(&want, &h, 2);
    if (dtl__f32_to_f16(f) != want) fail_msg("%a -> 0x%04x (compiler 0x%04x)", f, dtl__f32_to_f16(f), want);
  }
#else
  skip();
#endif
}

/* The public conversions (<dtl/types.h>) are the same functions. */
static void public_conversions_match_the_internal_ones(void **state) {
  (void)state;
  for (uint32_t u = 0; u <= 0xffff; u++) {
    uint16_t h = (uint16_t)u;
    float f = dtl__bits_to_f32(u * 65537u); /* spreads the pattern over all 32 bits */
    assert_int_equal(dtl__f32_to_bits(dtl_f16_to_f32(h)), dtl__f32_to_bits(dtl__f16_to_f32(h)));
    assert_int_equal(dtl__f32_to_bits(dtl_bf16_to_f32(h)), dtl__f32_to_bits(dtl__bf16_to_f32(h)));
    assert_int_equal(dtl_f32_to_f16(f), dtl__f32_to_f16(f));
    assert_int_equal(dtl_f32_to_bf16(f), dtl__f32_to_bf16(f));
  }
}

/* --- statuses, dtypes, the last error ------------------------------------------------------------------------ */
static void last_error_is_empty_before_any_failure(void **state) {
  (void)state;
  assert_string_equal(dtl_last_error(), "");
}

static void status_names_spell_the_enum(void **state) {
  (void)state;
  static const char *const names[] = {"DTL_OK", "DTL_ERR_INVALID_ARGUMENT", "DTL_ERR_UNSUPPORTED",
                                      "DTL_ERR_OUT_OF_MEMORY", "DTL_ERR_COMM", "DTL_ERR_MISMATCH",
                                      "DTL_ERR_CUDA", "DTL_ERR_INTERNAL"};
  for (int s = 0; s < 8; s++) assert_string_equal(dtl_status_name((dtl_status)s), names[s]);
  assert_int_equal(DTL_OK, 0);
  assert_string_equal(dtl_status_name(DTL_ERR_TIMEOUT), "DTL_ERR_TIMEOUT");
  assert_string_equal(dtl_status_name((dtl_status)9), "DTL_ERR_UNKNOWN");
  assert_string_equal(dtl_status_name((dtl_status)-1), "DTL_ERR_UNKNOWN");
  /* The one list the enum and dtl_status_name come from: values 0, 1, 2, ... in order, each with a meaning. */
  int next = 0;
#define XX(name, value, meaning)                        \
  assert_int_equal((value), next++);                    \
  assert_int_equal((int)(name), (value));               \
  assert_string_equal(dtl_status_name((name)), #name);  \
  assert_true(strlen(meaning) > 0);
  DTL_STATUS_MAP(XX)
#undef XX
  assert_int_equal(next, 9);
}

static void dtype_parse_accepts_short_and_long_names(void **state) {
  (void)state;
  static const struct {
    const char *text;
    dtl_dtype t;
    size_t size;
  } cases[] = {{"f32", DTL_FLOAT32, 4}, {"float32", DTL_FLOAT32, 4}, {"f64", DTL_FLOAT64, 8},
               {"float64", DTL_FLOAT64, 8}, {"f16", DTL_FLOAT16, 2},    {"float16", DTL_FLOAT16, 2},
               {"bf16", DTL_BFLOAT16, 2},   {"bfloat16", DTL_BFLOAT16, 2}, {"i8", DTL_INT8, 1},
               {"int8", DTL_INT8, 1},       {"u8", DTL_UINT8, 1},       {"uint8", DTL_UINT8, 1},
               {"i32", DTL_INT32, 4},       {"int32", DTL_INT32, 4},    {"i64", DTL_INT64, 8},
               {"int64", DTL_INT64, 8},     {"f8e4m3", DTL_FLOAT8_E4M3, 1}, {"float8_e4m3fn", DTL_FLOAT8_E4M3, 1},
               {"f8e5m2", DTL_FLOAT8_E5M2, 1}, {"float8_e5m2", DTL_FLOAT8_E5M2, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    dtl_dtype t = (dtl_dtype)-1;
    assert_int_equal(dtl_dtype_parse(cases[i].text, &t), DTL_OK);
    assert_int_equal(t, cases[i].t);
    assert_int_equal(dtl_dtype_size(t), cases[i].size);
    dtl_dtype again = (dtl_dtype)-1; /* the short name parses back to the same dtype */
    assert_int_equal(dtl_dtype_parse(dtl_dtype_name(t), &again), DTL_OK);
    assert_int_equal(again, t);
  }
  assert_int_equal(dtl_dtype_size((dtl_dtype)DTL_NUM_DTYPES), 0);
  assert_null(dtl_dtype_name((dtl_dtype)DTL_NUM_DTYPES));
  assert_null(dtl_reduce_op_name((dtl_reduce_op)5));
  assert_string_equal(dtl_reduce_op_name(DTL_AVG), "avg");
}

/* The 8-bit floats reduce exactly or not at all: max and min only, the others refused with the reason. */
static void fp8_reductions_other_than_max_and_min_are_refused_with_the_reason(void **state) {
  (void)state;
  for (int t = 0; t < DTL_NUM_DTYPES; t++)
    for (int op = 0; op < DTL_NUM_REDUCE_OPS; op++) {
      char why[256] = "untouched";
      bool fp8 = t == DTL_FLOAT8_E4M3 || t == DTL_FLOAT8_E5M2, exact = op == DTL_MAX || op == DTL_MIN;
      bool refused = dtl__reduce_rounds((dtl_dtype)t, (dtl_reduce_op)op, why, sizeof why);
      assert_int_equal(refused, fp8 && !exact);
      if (!refused) {
        assert_string_equal(why, "untouched");
        continue;
      }
      char want[128];
      snprintf(want, sizeof want, "%s %s would round at every step; reduce in f32 or bf16 and convert",
               dtl_dtype_name((dtl_dtype)t), dtl_reduce_op_name((dtl_reduce_op)op));
      assert_non_null(strstr(why, want));
    }
  assert_true(dtl__dtype_is_fp8(DTL_FLOAT8_E4M3) && dtl__dtype_is_fp8(DTL_FLOAT8_E5M2));
  assert_false(dtl__dtype_is_fp8(DTL_UINT8) || dtl__dtype_is_fp8(DTL_BFLOAT16));
}

static void dtype_parse_rejects_unknown_text_and_names_it(void **state) {
  (void)state;
  static const char *const bad[] = {"f33", "", "F32", "float", "i16", "f32 ", "f8", "F8_E4M3", "float8_e4m3"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dtl_dtype t = DTL_INT64;
    assert_int_equal(dtl_dtype_parse(bad[i], &t), DTL_ERR_INVALID_ARGUMENT);
    assert_int_equal(t, DTL_INT64); /* untouched */
    char want[32];
    snprintf(want, sizeof want, "text=\"%s\"", bad[i]);
    assert_non_null(strstr(dtl_last_error(), "dtl_dtype_parse"));
    assert_non_null(strstr(dtl_last_error(), want));
  }
  /* the message lists every name */
  dtl_dtype t;
  assert_int_equal(dtl_dtype_parse("f33", &t), DTL_ERR_INVALID_ARGUMENT);
  for (int k = 0; k < DTL_NUM_DTYPES; k++) assert_non_null(strstr(dtl_last_error(), dtl_dtype_name((dtl_dtype)k)));
  assert_int_equal(dtl_dtype_parse(NULL, &t), DTL_ERR_INVALID_ARGUMENT);
  assert_string_equal(dtl_last_error(), "dtl_dtype_parse: text=NULL");
  assert_int_equal(dtl_dtype_parse("f32", NULL), DTL_ERR_INVALID_ARGUMENT);
  assert_string_equal(dtl_last_error(), "dtl_dtype_parse: out=NULL");
}

static void *fail_on_another_thread(void *arg) {
  (void)arg;
  dtl_dtype t;
  dtl_dtype_parse("other-thread", &t);
  return strstr(dtl_last_error(), "other-thread") ? (void *)1 : NULL;
}

static void last_error_is_per_thread_and_survives_success(void **state) {
  (void)state;
  dtl_dtype t;
  assert_int_equal(dtl_dtype_parse("mine", &t), DTL_ERR_INVALID_ARGUMENT);
  assert_int_equal(dtl_dtype_parse("f16", &t), DTL_OK); /* a success leaves the last failure's message */
  assert_non_null(strstr(dtl_last_error(), "text=\"mine\""));
  pthread_t th;
  void *seen = NULL;
  assert_int_equal(pthread_create(&th, NULL, fail_on_another_thread, NULL), 0);
  assert_int_equal(pthread_join(th, &seen), 0);
  assert_non_null(seen);                                         /* the other thread saw its own message */
  assert_non_null(strstr(dtl_last_error(), "text=\"mine\""));     /* and this one kept its own */
}

static void long_messages_are_truncated_not_overflowed(void **state) {
  (void)state;
  char arg[3000];
  memset(arg, 'x', sizeof arg - 1);
  arg[sizeof arg - 1] = '\0';
  assert_int_equal(dtl__error(DTL_ERR_INTERNAL, "fn: arg=%s", arg), DTL_ERR_INTERNAL);
  size_t n = strlen(dtl_last_error());
  assert_true(n > 500 && n < sizeof arg);
  assert_memory_equal(dtl_last_error(), "fn: arg=xxx", 11);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(last_error_is_empty_before_any_failure), /* first: nothing has failed yet */
      cmocka_unit_test(f16_every_pattern_round_trips_through_f32),
      cmocka_unit_test(bf16_every_pattern_round_trips_through_f32),
      cmocka_unit_test(f32_to_f16_rounds_to_nearest_even_at_every_midpoint),
      cmocka_unit_test(f32_to_bf16_rounds_to_nearest_even_at_every_midpoint),
      cmocka_unit_test(f32_to_f16_chosen_cases),
      cmocka_unit_test(f32_to_f16_agrees_with_the_compiler_on_a_sample),
      cmocka_unit_test(public_conversions_match_the_internal_ones),
      cmocka_unit_test(status_names_spell_the_enum),
      cmocka_unit_test(dtype_parse_accepts_short_and_long_names),
      cmocka_unit_test(dtype_parse_rejects_unknown_text_and_names_it),
      cmocka_unit_test(fp8_reductions_other_than_max_and_min_are_refused_with_the_reason),
      cmocka_unit_test(last_error_is_per_thread_and_survives_success),
      cmocka_unit_test(long_messages_are_truncated_not_overflowed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* The FP8 GEMM's arithmetic on the host (compute/gemm_fp8.h): the activation quantization kernel's code, emulated,
 * against its rule (one scale amax / 448, every code e4m3 of x / scale: within 2^-4 of x relative, or half the
 * smallest subnormal times the scale absolute; the largest element exactly +-448; all zeros: scale 1, codes 0;
 * f16 and bf16 inputs read as their values; the padding of q untouched), and the GEMM's result (emulated) against
 * the dense product of x and the dequantized weight within the bound those roundings give:
 *   |y - y_fp8| <= sum_j |w_j| (2^-4 |x_j| + s_x 2^-10) + f32 rounding. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "common/half.h"
#include "compute/gemm_fp8.h"

static float uni(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void quantization_follows_its_rule_in_every_storage_type(void **state) {
  (void)state;
  enum { R = 5, C = 37, LDX = 40, LDQ = 48 };
  const dtl_dtype types[3] = {DTL_FLOAT32, DTL_FLOAT16, DTL_BFLOAT16};
  for (int ti = 0; ti < 3; ti++) {
    unsigned s = 7u + (unsigned)ti;
    float x[R * LDX];
    uint16_t h[R * LDX];
    for (int i = 0; i < R * LDX; i++) {
      x[i] = uni(&s) * (i % 7 == 0 ? 30.0f : i % 5 == 0 ? 1e-4f : 1.0f);
      if (types[ti] == DTL_FLOAT16) x[i] = dtl__f16_to_f32(h[i] = dtl__f32_to_f16(x[i]));
      if (types[ti] == DTL_BFLOAT16) x[i] = dtl__bf16_to_f32(h[i] = dtl__f32_to_bf16(x[i]));
    }
    uint8_t q[R * LDQ];
    memset(q, 0xAA, sizeof q);
    float as[2];
    const void *in = types[ti] == DTL_FLOAT32 ? (const void *)x : (const void *)h;
    assert_int_equal(dtl__fp8_quantize_emulate(in, types[ti], R, C, LDX, q, LDQ, as), DTL_OK);
    float amax = 0;
    for (int r = 0; r < R; r++)
      for (int c = 0; c < C; c++) amax = fmaxf(amax, fabsf(x[r * LDX + c]));
    assert_true(as[0] == amax);
    assert_true(as[1] == amax / 448.0f);
    int top = 0;
    for (int r = 0; r < R; r++)
      for (int c = 0; c < LDQ; c++) {
        uint8_t code = q[r * LDQ + c];
        if (c >= C) {
          assert_int_equal(code, 0xAA); /* padding untouched */
          continue;
        }
        double v = x[r * LDX + c], back = (double)dtl__f8e4m3_to_f32(code) * as[1];
        assert_true(fabs(back - v) <= ldexp(1.0, -4) * fabs(v) + as[1] * ldexp(1.0, -10));
        if (fabs(v) == amax) top += fabs(dtl__f8e4m3_to_f32(code)) == 448.0f;
      }
    assert_true(top >= 1);
  }
  float zeros[8] = {0}, as[2];
  uint8_t q[8];
  assert_int_equal(dtl__fp8_quantize_emulate(zeros, DTL_FLOAT32, 2, 4, 4, q, 4, as), DTL_OK);
  assert_true(as[0] == 0.0f && as[1] == 1.0f);
  for (int i = 0; i < 8; i++) assert_int_equal(q[i] & 0x7f, 0);
}

static void fp8_product_is_the_dense_product_within_the_activation_rounding(void **state) {
  (void)state;
  enum { M = 7, N = 16, K = 48 };
  unsigned s = 99u;
  float x[M * K], w[N * K], sw = 0.0123f;
  uint8_t wq[N * K], xq[M * K];
  for (int i = 0; i < M * K; i++) x[i] = uni(&s) * 3.0f;
  for (int i = 0; i < N * K; i++) {
    wq[i] = dtl__f32_to_f8e4m3(uni(&s) * 400.0f);
    w[i] = dtl__f8e4m3_to_f32(wq[i]) * sw; /* the dequantized FP8_TENSOR weight */
  }
  float as[2], y[M * N];
  assert_int_equal(dtl__fp8_quantize_emulate(x, DTL_FLOAT32, M, K, K, xq, K, as), DTL_OK);
  for (int i = 0; i < M * N; i++) y[i] = 1.0f;
  dtl__gemm_fp8_emulate(M, N, K, xq, K, as[1], wq, K, sw, 1.0f, y, N); /* beta = 1 adds onto C */
  for (int i = 0; i < M; i++)
    for (int l = 0; l < N; l++) {
      double ref = 1.0, bound = 0;
      for (int j = 0; j < K; j++) {
        ref += (double)x[i * K + j] * w[l * K + j];
        bound += fabs(w[l * K + j]) * (ldexp(1.0, -4) * fabs(x[i * K + j]) + as[1] * ldexp(1.0, -10));
      }
      assert_true(fabs(y[i * N + l] - ref) <= bound + 1e-6 * (1 + fabs(ref)));
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(quantization_follows_its_rule_in_every_storage_type),
      cmocka_unit_test(fp8_product_is_the_dense_product_within_the_activation_rounding),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

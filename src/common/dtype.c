/* SPDX-License-Identifier: Apache-2.0 */
/* Element types and reduction operators: sizes, names and parsing. */
#include <stdio.h>
#include <string.h>
#include "common/half.h"
#include "common/internal.h"

static const struct {
  const char *name, *alias;
  size_t size;
  bool is_float;
} dtl__dtypes[DTL_NUM_DTYPES] = {
    [DTL_FLOAT32] = {"f32", "float32", 4, true}, [DTL_FLOAT64] = {"f64", "float64", 8, true},
    [DTL_FLOAT16] = {"f16", "float16", 2, true}, [DTL_BFLOAT16] = {"bf16", "bfloat16", 2, true},
    [DTL_INT8] = {"i8", "int8", 1, false},       [DTL_UINT8] = {"u8", "uint8", 1, false},
    [DTL_INT32] = {"i32", "int32", 4, false},    [DTL_INT64] = {"i64", "int64", 8, false},
    [DTL_FLOAT8_E4M3] = {"f8e4m3", "float8_e4m3fn", 1, true}, [DTL_FLOAT8_E5M2] = {"f8e5m2", "float8_e5m2", 1, true},
};
static const char *const dtl__op_names[DTL_NUM_REDUCE_OPS] = {"sum", "prod", "max", "min", "avg"};

bool dtl__dtype_valid(dtl_dtype t) { return (unsigned)t < DTL_NUM_DTYPES; }
bool dtl__reduce_op_valid(dtl_reduce_op op) { return (unsigned)op < DTL_NUM_REDUCE_OPS; }
bool dtl__dtype_is_float(dtl_dtype t) { return dtl__dtype_valid(t) && dtl__dtypes[t].is_float; }
bool dtl__dtype_is_fp8(dtl_dtype t) { return t == DTL_FLOAT8_E4M3 || t == DTL_FLOAT8_E5M2; }

bool dtl__reduce_rounds(dtl_dtype t, dtl_reduce_op op, char *why, size_t cap) {
  if (!dtl__dtype_is_fp8(t) || op == DTL_MAX || op == DTL_MIN) return false;
  snprintf(why, cap, "%s %s would round at every step; reduce in f32 or bf16 and convert (the 8-bit floats reduce "
           "with max and min only, which are exact)", dtl__dtypes[t].name, dtl__op_names[op]);
  return true;
}
size_t dtl_dtype_size(dtl_dtype t) { return dtl__dtype_valid(t) ? dtl__dtypes[t].size : 0; }
const char *dtl_dtype_name(dtl_dtype t) { return dtl__dtype_valid(t) ? dtl__dtypes[t].name : NULL; }
const char *dtl_reduce_op_name(dtl_reduce_op op) { return dtl__reduce_op_valid(op) ? dtl__op_names[op] : NULL; }

uint16_t dtl_f32_to_f16(float x) { return dtl__f32_to_f16(x); }
float dtl_f16_to_f32(uint16_t h) { return dtl__f16_to_f32(h); }
uint16_t dtl_f32_to_bf16(float x) { return dtl__f32_to_bf16(x); }
float dtl_bf16_to_f32(uint16_t h) { return dtl__bf16_to_f32(h); }
uint8_t dtl_f32_to_f8e4m3(float x) { return dtl__f32_to_f8e4m3(x); }
float dtl_f8e4m3_to_f32(uint8_t c) { return dtl__f8e4m3_to_f32(c); }
uint8_t dtl_f32_to_f8e5m2(float x) { return dtl__f32_to_f8e5m2(x); }
float dtl_f8e5m2_to_f32(uint8_t c) { return dtl__f8e5m2_to_f32(c); }

dtl_status dtl_dtype_parse(const char *text, dtl_dtype *out) {
  DTL_CHECK_ARG(text != NULL, "dtl_dtype_parse", "text=NULL");
  DTL_CHECK_ARG(out != NULL, "dtl_dtype_parse", "out=NULL");
  for (int t = 0; t < DTL_NUM_DTYPES; t++) {
    if (strcmp(text, dtl__dtypes[t].name) == 0 || strcmp(text, dtl__dtypes[t].alias) == 0) {
      *out = (dtl_dtype)t;
      return DTL_OK;
    }
  }
  char q[DTL__QUOTE_CAP];
  return dtl__error(DTL_ERR_INVALID_ARGUMENT,
                    "dtl_dtype_parse: text=\"%s\" (expected f32, f64, f16, bf16, i8, u8, i32, i64, f8e4m3 or f8e5m2)",
                    dtl__quote(text, q, sizeof q));
}

dtl_status dtl__bytes(const char *fn, const char *arg, size_t count, dtl_dtype t, size_t *bytes) {
  if (!dtl__dtype_valid(t)) return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: dtype=%d (expected 0..%d)", fn, (int)t, DTL_NUM_DTYPES - 1);
  if (!dtl__mul_size(count, dtl__dtypes[t].size, bytes))
    return dtl__error(DTL_ERR_INVALID_ARGUMENT, "%s: %s=%zu overflows size_t bytes for dtype %s", fn, arg, count,
                      dtl__dtypes[t].name);
  return DTL_OK;
}

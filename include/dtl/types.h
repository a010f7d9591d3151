/* SPDX-License-Identifier: Apache-2.0 */
/* Element types and reduction operators understood by every backend. */
#ifndef DTL_TYPES_H
#define DTL_TYPES_H

#include "dtl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DTL_FLOAT32, DTL_FLOAT64, DTL_FLOAT16, DTL_BFLOAT16, DTL_INT8, DTL_UINT8, DTL_INT32, DTL_INT64 } dtl_dtype;
#define DTL_NUM_DTYPES 8

/* DTL_AVG is the sum divided by the number of ranks. For integer types the division truncates toward
 * zero (C semantics) after an exact integer sum; for f16/bf16 the sum is accumulated in f32. */
typedef enum { DTL_SUM, DTL_PROD, DTL_MAX, DTL_MIN, DTL_AVG } dtl_reduce_op;
#define DTL_NUM_REDUCE_OPS 5

/* Bytes per element; 0 for a value outside the enum. */
DTL_API size_t dtl_dtype_size(dtl_dtype t);
/* "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"; NULL outside the enum. */
DTL_API const char *dtl_dtype_name(dtl_dtype t);
/* Parses the names above (also "float32", "int64", ...). */
DTL_API dtl_status dtl_dtype_parse(const char *text, dtl_dtype *out);
/* "sum", "prod", "max", "min", "avg"; NULL outside the enum. */
DTL_API const char *dtl_reduce_op_name(dtl_reduce_op op);

#ifdef __cplusplus
}
#endif
#endif

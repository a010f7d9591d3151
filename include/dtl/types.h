/* SPDX-License-Identifier: Apache-2.0 */
/* Element types and reduction operators understood by every backend. */
#ifndef DTL_TYPES_H
#define DTL_TYPES_H

#include "dtl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DTL_FLOAT32 = 0,
  DTL_FLOAT64 = 1,
  DTL_FLOAT16 = 2,
  DTL_BFLOAT16 = 3,
  DTL_INT8 = 4,
  DTL_UINT8 = 5,
  DTL_INT32 = 6,
  DTL_INT64 = 7,
  /* 8-bit floats, one byte each (README, Quantized tensors). e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no
   * infinities, one NaN code per sign (0x7f, 0xff), largest finite 448. e5m2: 5 exponent bits (bias 15), 2 mantissa
   * bits, IEEE-like (infinities, NaNs), largest finite 57344. Every collective, point-to-point call, plan, exchange
   * and dtl_redistribute moves them bit for bit (MPI: as bytes; NCCL: as ncclFloat8e4m3 / ncclFloat8e5m2 where the
   * NCCL has them, else as ncclUint8). Safetensors names them F8_E4M3 and F8_E5M2.
   *
   * Reductions on them are exact or refused. DTL_MAX and DTL_MIN pick one of their inputs, so they are exact and
   * supported: compared as the values the codes stand for (-0 == +0; a comparison with a NaN is false, so, as for
   * the other floats, which NaN or number survives depends on the order), the result is always one of the input
   * codes. Their identity (a Partial(max) target's fill, the S -> P(max) embed) is the lowest value the format
   * holds: -448 for e4m3fn, which has no infinity, -inf for e5m2 (min: +448, +inf). DTL_SUM, DTL_PROD and DTL_AVG
   * would round to 3 or 2 mantissa bits at every step of a fold, so they are refused with DTL_ERR_UNSUPPORTED ("f8e4m3
   * sum would round at every step; reduce in f32 or bf16 and convert"): in every reducing collective, and at layout
   * creation for a Partial(sum/prod/avg) placement. On NCCL, max and min run as NCCL's FP8 reductions (NaNs as
   * NCCL treats them), which need NCCL 2.24 or later and a device of compute capability 9.0 or more; elsewhere they
   * are refused on that communicator with the reason (layout creation of a Partial(max/min) FP8 layout on its mesh
   * too). */
  DTL_FLOAT8_E4M3 = 8,
  DTL_FLOAT8_E5M2 = 9
} dtl_dtype;
#define DTL_NUM_DTYPES 10

/* Reduction operators. DTL_AVG is the sum over the ranks divided by the number of ranks: the sum is formed
 * in the dtype exactly as DTL_SUM forms it (an integer sum that leaves the type's range wraps around), then
 * divided once. Integer division truncates toward zero, as C does (the average of -3 and 0 is -1, of 3 and 0
 * is 1); floating division rounds to nearest even (transports may differ in the last bit: NCCL scales each
 * input by 1/size before summing). f16 and bf16 reductions compute each pairwise step in f32 and round the
 * result to the dtype. On the 8-bit floats only DTL_MAX and DTL_MIN reduce (above). */
typedef enum { DTL_SUM = 0, DTL_PROD = 1, DTL_MAX = 2, DTL_MIN = 3, DTL_AVG = 4 } dtl_reduce_op;
#define DTL_NUM_REDUCE_OPS 5

/* Bytes per element; 0 for a value outside the enum. */
DTL_API size_t dtl_dtype_size(dtl_dtype t);
/* "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "f8e4m3", "f8e5m2"; NULL outside the enum. */
DTL_API const char *dtl_dtype_name(dtl_dtype t);
/* Parses the names above (also "float32", "int64", "float8_e4m3fn", "float8_e5m2", ...); other text is
 * DTL_ERR_INVALID_ARGUMENT naming it and listing the names. */
DTL_API dtl_status dtl_dtype_parse(const char *text, dtl_dtype *out);
/* "sum", "prod", "max", "min", "avg"; NULL outside the enum. */
DTL_API const char *dtl_reduce_op_name(dtl_reduce_op op);

/* Conversions between f32 and the 16-bit float types, for filling and reading host buffers: round to
 * nearest even, overflow to infinity; every f16/bf16 value survives a round trip through f32 (a NaN stays a
 * NaN of the same sign and payload, made quiet). */
DTL_API uint16_t dtl_f32_to_f16(float x);
DTL_API float dtl_f16_to_f32(uint16_t h);
DTL_API uint16_t dtl_f32_to_bf16(float x);
DTL_API float dtl_bf16_to_f32(uint16_t h);
/* Conversions between f32 and the 8-bit floats: round to nearest even, as torch and ml_dtypes do. Beyond the
 * largest finite value they do what torch (2.x, CPU) does: e4m3fn saturates to +-448 (infinities included, since
 * the format has none), e5m2 overflows to +-infinity. A NaN stays a NaN of the same sign (e4m3fn has one NaN code
 * per sign). Every code converts to f32 exactly (e4m3fn's NaN code to a quiet f32 NaN of its sign). */
DTL_API uint8_t dtl_f32_to_f8e4m3(float x);
DTL_API float dtl_f8e4m3_to_f32(uint8_t c);
DTL_API uint8_t dtl_f32_to_f8e5m2(float x);
DTL_API float dtl_f8e5m2_to_f32(uint8_t c);

#ifdef __cplusplus
}
#endif
#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* The host half of the FP8 activation kernels (act_fp8.h): per-token-per-128 quantization to e4m3 codes plus f32
 * scales and back, one 128-column block at a time, eight lanes at a time without branches (the conversions are bit
 * for bit those of common/half.h). */
#include <math.h>
#include <string.h>
#include "common/half.h"
#include "quant/act_fp8.h"

/* x86-64 also gets an AVX2 clone of the row loops (integer max and blends in 8 lanes); no FMA is involved, so the
 * results are those of the default clone. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define DTL__CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DTL__CLONES
#endif

enum { B = DTL__ACT_FP8_BLOCK };

dtl_status dtl__act_fp8_check(const char *fn, const dtl__act_fp8_rows *q, dtl_dtype t, const char *ld_name,
                              int64_t ld) {
  DTL_CHECK_ARG(dtl__act_fp8_dtype_ok(t), fn, "dtype=%s (FP8 activations convert from and to f32, f16 or bf16)",
                dtl_dtype_name(t) ? dtl_dtype_name(t) : "?");
  DTL_CHECK_ARG(q->rows >= 0, fn, "rows=%lld (expected >= 0)", (long long)q->rows);
  DTL_CHECK_ARG(q->cols >= 1, fn, "cols=%lld (expected >= 1)", (long long)q->cols);
  DTL_CHECK_ARG(ld >= q->cols, fn, "%s=%lld (expected >= cols=%lld)", ld_name, (long long)ld, (long long)q->cols);
  DTL_CHECK_ARG(q->ldc >= q->cols, fn, "ldc=%lld (expected >= cols=%lld)", (long long)q->ldc, (long long)q->cols);
  DTL_CHECK_ARG(q->lds >= dtl__act_fp8_blocks(q->cols), fn, "lds=%lld (expected >= %lld scale blocks of %d columns)",
                (long long)q->lds, (long long)dtl__act_fp8_blocks(q->cols), B);
  DTL_CHECK_ARG(q->rows == 0 || (q->codes && q->scales), fn, "codes=%p scales=%p with %lld rows", (void *)q->codes,
                (void *)q->scales, (long long)q->rows);
  return DTL_OK;
}

/* Eight lanes at a time in GCC's vector types: -O2 does not vectorize the selects and the narrowing stores of the
 * loops below by itself. Lane for lane the arithmetic is the scalar code's (no FMA, every f32 operation rounded). */
typedef uint32_t dtl__v8u __attribute__((vector_size(32)));
typedef int32_t dtl__v8i __attribute__((vector_size(32)));
typedef float dtl__v8f __attribute__((vector_size(32)));
typedef uint16_t dtl__v8h __attribute__((vector_size(16)));
typedef uint8_t dtl__v8b __attribute__((vector_size(8)));
typedef uint8_t dtl__v32b __attribute__((vector_size(32)));
typedef uint16_t dtl__v16h __attribute__((vector_size(32)));
typedef uint8_t dtl__v16b __attribute__((vector_size(16)));
typedef uint32_t dtl__v4u __attribute__((vector_size(16)));
typedef uint64_t dtl__v2q __attribute__((vector_size(16)));

/* The low byte, and the high 16 bits, of each lane (little-endian lanes), by shuffles: a narrowing conversion goes
 * lane by lane through scalar registers. And eight bytes (the low half of a 16-byte vector) widened to lanes by two
 * in-lane byte shuffles, for the same reason. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define DTL__V8_LOW_BYTES(v) \
  __builtin_shufflevector((dtl__v32b)(v), (dtl__v32b)(v), 0, 4, 8, 12, 16, 20, 24, 28)
#define DTL__V8_HIGH_HALVES(v) \
  __builtin_shufflevector((dtl__v16h)(v), (dtl__v16h)(v), 1, 3, 5, 7, 9, 11, 13, 15)
#define DTL__V8_WIDEN_BYTES(x)                                                                                       \
  ((dtl__v8u)__builtin_shufflevector(                                                                                \
      (dtl__v4u)__builtin_shufflevector((x), (dtl__v16b){0}, 0, 16, 16, 16, 1, 16, 16, 16, 2, 16, 16, 16, 3, 16, 16, \
                                        16),                                                                         \
      (dtl__v4u)__builtin_shufflevector((x), (dtl__v16b){0}, 4, 16, 16, 16, 5, 16, 16, 16, 6, 16, 16, 16, 7, 16, 16, \
                                        16),                                                                         \
      0, 1, 2, 3, 4, 5, 6, 7))
#else
#define DTL__V8_LOW_BYTES(v) __builtin_convertvector((v) & 0xffu, dtl__v8b)
#define DTL__V8_HIGH_HALVES(v) __builtin_convertvector((v) >> 16, dtl__v8h)
#define DTL__V8_WIDEN_BYTES(x) __builtin_convertvector((dtl__v8b)((dtl__v2q)(x))[0], dtl__v8u)
#endif

/* a where mask is set (all ones), else b (a macro: an AVX vector argument would change the ABI of a function). */
#define DTL__V8_SELECT(mask, a, b) (((a) & (mask)) | ((b) & ~(mask)))

/* Inlined into the clones of the row loops below (a block's loops run in the clone's instruction set). */
#define DTL__INLINE static inline __attribute__((always_inline))

/* Eight elements at p as f32 into *f: bf16 (widened by a shift) or f32 (through a pointer: an AVX vector return
 * value would change the ABI of a function that is not inlined). */
DTL__INLINE void dtl__ld8(const void *p, int bf16, dtl__v8f *f) {
  if (bf16) {
    dtl__v8h a;
    memcpy(&a, p, sizeof a);
    *f = (dtl__v8f)(__builtin_convertvector(a, dtl__v8u) << 16);
  } else {
    memcpy(f, p, sizeof *f);
  }
}

/* The largest magnitude of a block of B elements at src as f32 bits: for non-NaN floats the order of |x| is that
 * of their bits as unsigned integers, so a NaN or an infinity shows as bits >= 0x7f800000. */
DTL__INLINE uint32_t dtl__block_amax_bits(const void *src, int bf16) {
  const size_t es = bf16 ? 2 : 4;
  dtl__v8u m = {0};
  for (int i = 0; i < B; i += 8) {
    dtl__v8f f;
    dtl__ld8((const char *)src + (size_t)i * es, bf16, &f);
    dtl__v8u u = (dtl__v8u)f & 0x7fffffffu;
    m = DTL__V8_SELECT((dtl__v8u)(u > m), u, m);
  }
  uint32_t r = 0;
  for (int j = 0; j < 8; j++) r = m[j] > r ? m[j] : r;
  return r;
}

/* e4m3 codes of the block's elements times s. Results of 2^-6 and above round by adding to the bits (the 20 dropped
 * mantissa bits, to nearest even, a carry moving into the exponent); smaller ones (e4m3's subnormals, multiples of
 * 2^-9) by one f32 addition of 2^14, whose ulp is 2^-9, so the hardware rounds them to nearest even. Codes past 448
 * saturate. Bit for bit dtl__f32_to_f8e4m3 on finite values (checked for every finite f32 once, and at every
 * rounding boundary by tests/quant/test_act_fp8.c). */
DTL__INLINE void dtl__block_codes(const void *src, int bf16, float s, uint8_t *out) {
  const size_t es = bf16 ? 2 : 4;
  for (int i = 0; i < B; i += 8) {
    dtl__v8f f;
    dtl__ld8((const char *)src + (size_t)i * es, bf16, &f);
    dtl__v8u u = (dtl__v8u)(f * s);
    dtl__v8u sign = (u >> 24) & 0x80u, mag = u & 0x7fffffffu;
    dtl__v8u qn = ((mag + 0x7ffffu + ((mag >> 20) & 1u)) >> 20) - (120u << 3);
    dtl__v8u qs = (dtl__v8u)((dtl__v8f)mag + 16384.0f) - 0x46800000u;
    dtl__v8u q = DTL__V8_SELECT((dtl__v8u)(mag < 0x3c800000u), qs, qn);
    q = DTL__V8_SELECT((dtl__v8u)(q > 0x7eu), (dtl__v8u){0} + 0x7eu, q) | sign;
    dtl__v8b b = DTL__V8_LOW_BYTES(q);
    memcpy(out + i, &b, sizeof b);
  }
}

/* f32 values of B e4m3 codes times scale: normal codes by placing their fields, subnormals as man * 2^-9, the NaN
 * codes (0x7f, 0xff) as a quiet NaN of their sign; the codes' values are bit for bit dtl__f8e4m3_to_f32. Stored as
 * f32 or, to nearest even (a NaN staying a quiet NaN) as dtl__f32_to_bf16 does, as bf16. */
DTL__INLINE void dtl__block_values(const uint8_t *c, float scale, void *out, int bf16) {
  for (int i = 0; i < B; i += 8) {
    uint64_t w;
    memcpy(&w, c + i, sizeof w);
    dtl__v16b b = (dtl__v16b)(dtl__v2q){w, 0};
    dtl__v8u k = DTL__V8_WIDEN_BYTES(b), sign = (k & 0x80u) << 24, e = (k >> 3) & 15u, m = k & 7u;
    dtl__v8u normal = sign | ((e + 120u) << 23) | (m << 20);
    dtl__v8u sub = (dtl__v8u)(__builtin_convertvector((dtl__v8i)m, dtl__v8f) * (1.0f / 512.0f)) | sign;
    dtl__v8u u = DTL__V8_SELECT((dtl__v8u)(e == 0u), sub, normal);
    u = DTL__V8_SELECT((dtl__v8u)((k & 0x7fu) == 0x7fu), sign | 0x7fc00000u, u);
    dtl__v8u f = (dtl__v8u)((dtl__v8f)u * scale);
    if (bf16) {
      dtl__v8u nan = (dtl__v8u)((f & 0x7fffffffu) > 0x7f800000u);
      dtl__v8u r = DTL__V8_SELECT(nan, f | 0x400000u, f + 0x7fffu + ((f >> 16) & 1u));
      dtl__v8h o = DTL__V8_HIGH_HALVES(r);
      memcpy((uint16_t *)out + i, &o, sizeof o);
    } else {
      memcpy((float *)out + i, &f, sizeof f);
    }
  }
}

/* Columns c0..c0+n of a row of x, as f32, into v (zeros after n): the blocks that are not read in place (the short
 * last block of a row, every block of f16). */
static void dtl__load_block(const void *row, dtl_dtype t, int64_t c0, int n, float *v) {
  for (int i = 0; i < n; i++) {
    const uint16_t h = t == DTL_FLOAT32 ? 0 : ((const uint16_t *)row)[c0 + i];
    v[i] = t == DTL_FLOAT32    ? ((const float *)row)[c0 + i]
           : t == DTL_BFLOAT16 ? dtl__bf16_to_f32(h)
                               : dtl__f16_to_f32(h);
  }
  for (int i = n; i < B; i++) v[i] = 0.0f;
}

static const char *dtl__nonfinite_name(float f) { return isnan(f) ? "nan" : f > 0 ? "inf" : "-inf"; }

/* The rows of a quantization; returns the first row holding a NaN or an infinity (its column in *bad_col), or -1,
 * having written the rows before it.
 * Full blocks of f32 and bf16 rows are read in place, the others through a block buffer. */
DTL__CLONES
static int64_t dtl__quantize_rows(const void *x, dtl_dtype t, int64_t ldx, const dtl__act_fp8_rows *q,
                                  int64_t *bad_col) {
  const size_t es = dtl_dtype_size(t);
  const int64_t nb = dtl__act_fp8_blocks(q->cols);
  float v[B];
  uint8_t tail[B];
  for (int64_t r = 0; r < q->rows; r++) {
    const char *row = (const char *)x + (size_t)(r * ldx) * es;
    uint8_t *codes = q->codes + r * q->ldc;
    for (int64_t b = 0; b < nb; b++) {
      int64_t c0 = b * B;
      int n = (int)(q->cols - c0 < B ? q->cols - c0 : B);
      bool in_place = n == B && t != DTL_FLOAT16;
      const void *src = row + (size_t)c0 * es;
      int bf16 = t == DTL_BFLOAT16;
      if (!in_place) {
        dtl__load_block(row, t, c0, n, v);
        src = v;
        bf16 = 0;
      }
      uint32_t m = bf16 ? dtl__block_amax_bits(src, 1) : dtl__block_amax_bits(src, 0);
      if (m >= 0x7f800000u) {
        dtl__load_block(row, t, c0, n, v);
        int i = 0;
        while (isfinite(v[i])) i++;
        *bad_col = c0 + i;
        return r;
      }
      float amax = dtl__bits_to_f32(m);
      if (!(amax > DTL__ACT_FP8_MARGIN)) amax = DTL__ACT_FP8_MARGIN;
      float s = DTL__ACT_FP8_MAX / amax;
      uint8_t *out = in_place ? codes + c0 : tail;
      if (bf16) dtl__block_codes(src, 1, s, out);
      else dtl__block_codes(src, 0, s, out);
      if (!in_place) memcpy(codes + c0, tail, (size_t)n);
      q->scales[r * q->lds + b] = amax * (1.0f / DTL__ACT_FP8_MAX);
    }
  }
  return -1;
}

dtl_status dtl__act_fp8_quantize(const char *fn, const void *x, dtl_dtype t, int64_t ldx, int64_t row0,
                                 const dtl__act_fp8_rows *q) {
  DTL_TRY(dtl__act_fp8_check(fn, q, t, "ldx", ldx));
  DTL_CHECK_ARG(x != NULL || q->rows == 0, fn, "x=NULL with %lld rows", (long long)q->rows);
  int64_t col = 0, r = dtl__quantize_rows(x, t, ldx, q, &col);
  if (r < 0) return DTL_OK;
  const size_t es = dtl_dtype_size(t);
  float v = 0;
  const char *p = (const char *)x + (size_t)(r * ldx + col) * es;
  if (t == DTL_FLOAT32) memcpy(&v, p, sizeof v);
  else {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    v = t == DTL_BFLOAT16 ? dtl__bf16_to_f32(h) : dtl__f16_to_f32(h);
  }
  return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn,
                       "x row %lld column %lld is %s (FP8 quantization takes finite values)", (long long)(row0 + r),
                       (long long)col, dtl__nonfinite_name(v));
}

/* The rows of a dequantization: full blocks of f32 and bf16 rows written in place, the others through buffers. */
DTL__CLONES
static void dtl__dequantize_rows(const dtl__act_fp8_rows *q, dtl_dtype t, void *y, int64_t ldy) {
  const size_t es = dtl_dtype_size(t);
  const int64_t nb = dtl__act_fp8_blocks(q->cols);
  uint8_t c[B];
  float v[B];
  for (int64_t r = 0; r < q->rows; r++) {
    char *row = (char *)y + (size_t)(r * ldy) * es;
    const uint8_t *codes = q->codes + r * q->ldc;
    for (int64_t b = 0; b < nb; b++) {
      int64_t c0 = b * B;
      int n = (int)(q->cols - c0 < B ? q->cols - c0 : B);
      float scale = q->scales[r * q->lds + b];
      if (n == B && t == DTL_BFLOAT16) {
        dtl__block_values(codes + c0, scale, row + (size_t)c0 * es, 1);
        continue;
      }
      if (n == B && t == DTL_FLOAT32) {
        dtl__block_values(codes + c0, scale, row + (size_t)c0 * es, 0);
        continue;
      }
      memcpy(c, codes + c0, (size_t)n);
      memset(c + n, 0, (size_t)(B - n));
      dtl__block_values(c, scale, v, 0);
      for (int i = 0; i < n; i++) {
        if (t == DTL_FLOAT32) ((float *)row)[c0 + i] = v[i];
        else ((uint16_t *)row)[c0 + i] = t == DTL_BFLOAT16 ? dtl__f32_to_bf16(v[i]) : dtl__f32_to_f16(v[i]);
      }
    }
  }
}

dtl_status dtl__act_fp8_dequantize(const dtl__act_fp8_rows *q, dtl_dtype t, void *y, int64_t ldy) {
  static const char fn[] = "dtl__act_fp8_dequantize";
  DTL_TRY(dtl__act_fp8_check(fn, q, t, "ldy", ldy));
  DTL_CHECK_ARG(y != NULL || q->rows == 0, fn, "y=NULL with %lld rows", (long long)q->rows);
  dtl__dequantize_rows(q, t, y, ldy);
  return DTL_OK;
}

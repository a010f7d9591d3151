/* SPDX-License-Identifier: Apache-2.0 */
/* What the TP tests of f16/bf16 compute share: the tolerance of a block run with that storage against the
 * f32 host path on the same (rounded) inputs (test data in a storage type: dtype_data.h).
 *
 * The tolerance. Both sides read identical inputs; they differ by the roundings the half-typed side makes
 * to its stored intermediates (the GEMM outputs, the activation or attention output, the row-parallel
 * partial, the output after the bias: at most 5 of them on a path, each within a relative u = half an ulp,
 * 2^-11 for f16 and 2^-8 for bf16) and by f32 reordering (1e-5 relative, the host path's own tolerance
 * against its double oracle). A rounding of an intermediate of size m moves the output by at most u m times
 * the gain of what follows, which for the test data (|x| <= 1, |w| <= 0.5, at most a dozen terms per dot)
 * stays near 1, so 5 roundings bound the error by about 5 u (1 + max |y|). The bound used is 8 u (1 + max
 * |y|) (0.4% for f16, 3% for bf16): far below the O(1) error of a wrong index. test_tp_kernels.c checks on
 * the host that the MLP and attention pipelines rounded this way stay within it for the test shapes, and
 * prints how much of it they use (about 1 u). */
#ifndef DTL_TP_HALF_H
#define DTL_TP_HALF_H

#include "dtype_data.h"

/* The tolerance of a block output of t storage against the f32 host path, given max |host output|. */
static inline double t_block_tol(dtl_dtype t, double ref_max) {
  return (1e-5 + 8.0 * t_half_unit(t)) * (1.0 + ref_max);
}

#endif

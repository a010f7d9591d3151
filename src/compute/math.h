/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. Per-element math shared by host loops (*.c) and CUDA kernels (*.cu) of every
 * area: plain C that nvcc also compiles for the device, so a host test exercises exactly what the kernels
 * run. DTL_HD marks a function for both. */
#ifndef DTL_COMPUTE_MATH_H
#define DTL_COMPUTE_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DTL_HD __host__ __device__
#else
#define DTL_HD
#endif

/* SwiGLU: silu(gate) * up. */
static DTL_HD inline float dtl__silu_gated(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

/* Exact (erf) GELU. */
static DTL_HD inline float dtl__gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

#endif

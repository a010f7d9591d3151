/* SPDX-License-Identifier: Apache-2.0 */
/* Export macro, version, limits and the bit macro shared by every public dtl header. */
#ifndef DTL_DEFS_H
#define DTL_DEFS_H

#include <stddef.h>
#include <stdint.h>

#if defined(DTL_BUILDING_LIBRARY) && defined(__GNUC__)
#define DTL_API __attribute__((visibility("default")))
#else
#define DTL_API
#endif

#include "dtl/version.h"

/* Bit n of a 64-bit mask or flags field of a params struct (<dtl/tp.h>, <dtl/moe.h>, <dtl/plan.h>). */
#define DTL_BIT(n) (UINT64_C(1) << (n))

/* Largest mesh and tensor ranks a layout can describe. */
#define DTL_MAX_MESH_DIMS 4
#define DTL_MAX_TENSOR_DIMS 8

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library actually linked, DTL_VERSION_HEX form (major << 16 | minor << 8 | patch). */
DTL_API unsigned dtl_version(void);
DTL_API const char *dtl_version_string(void);

#ifdef __cplusplus
}
#endif
#endif

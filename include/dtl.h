/* SPDX-License-Identifier: Apache-2.0 */
/* dtl: a distributed-tensor layout engine. This umbrella header pulls in the whole backend-neutral API;
 * <dtl/mpi.h> and <dtl/nccl.h> add the constructors of the MPI and NCCL communicators. */
#ifndef DTL_H
#define DTL_H

#include "dtl/defs.h"
#include "dtl/status.h"
#include "dtl/types.h"
#include "dtl/comm.h"
#include "dtl/mesh.h"
#include "dtl/layout.h"
#include "dtl/plan.h"
#include "dtl/quant.h"
#include "dtl/checkpoint.h"
#include "dtl/tp.h"
#include "dtl/moe.h"
#include "dtl/cp.h"

#endif

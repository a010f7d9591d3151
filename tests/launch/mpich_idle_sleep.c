/* SPDX-License-Identifier: Apache-2.0 */
/* Preloaded into the tests when they run on MPICH (cmake/dtl_targets.cmake). MPICH's ch4 device polls UCX
 * in a loop that never gives up the CPU, so with more ranks than cores (the suite runs up to 8 ranks on 2)
 * a rank waiting for a descheduled peer burns its whole time slice: 4 ranks took ~10 ms per collective
 * instead of microseconds, and the suite ran past its timeouts. Sleeping briefly whenever a UCX poll finds
 * nothing hands the core to the peer, which is what OpenMPI does by itself when oversubscribed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <time.h>

typedef unsigned (*dtl_ucp_progress_fn)(void *worker);

unsigned ucp_worker_progress(void *worker);
unsigned ucp_worker_progress(void *worker) {
  static dtl_ucp_progress_fn next;
  if (!next) next = (dtl_ucp_progress_fn)dlsym(RTLD_NEXT, "ucp_worker_progress");
  unsigned events = next(worker);
  if (events == 0) {
    struct timespec pause = {0, 1000};
    nanosleep(&pause, NULL);
  }
  return events;
}

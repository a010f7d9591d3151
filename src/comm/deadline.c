/* SPDX-License-Identifier: Apache-2.0 */
/* Deadlines (deadline.h): the clock and back-off of a timed wait, the shared fate of one constructor's
 * communicators, DTL_TIMEOUT and dtl_comm_set_timeout. */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm/agree.h"
#include "comm/deadline.h"
#include "common/quote.h"

static int64_t dtl__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void dtl__deadline_begin(dtl__deadline *d, double timeout_s) {
  d->timeout_s = timeout_s > 0 ? timeout_s : 0;
  d->start_ns = dtl__now_ns();
  d->end_ns = timeout_s > 0 ? d->start_ns + (int64_t)(timeout_s * 1e9) : 0;
}

/* The first 50 us poll back to back (a peer about to arrive costs no system call), then up to 10 ms with
 * sched_yield between polls: MPI moves the bytes of a transfer in progress inside the
 * polls (shared-memory single copy runs at the receiver's poll), so a rank that slept there would stretch a 16 MiB
 * collective, and yielding leaves a shared core to the peers it waits for. Past that, a wait is more likely a late
 * peer than a transfer: sleeps of 1/64 of the time waited (at most about 1.6% added), between 20 us and 1 ms, so a
 * rank waiting long wakes a thousand times a second. */
#define DTL__TIGHT_NS 50000
#define DTL__SPIN_NS 10000000
#define DTL__SLEEP_MIN_NS 20000
#define DTL__SLEEP_MAX_NS 1000000

bool dtl__deadline_backoff(dtl__deadline *d) {
  int64_t now = dtl__now_ns(), waited = now - d->start_ns;
  if (d->end_ns && now >= d->end_ns) return false;
  if (waited < DTL__TIGHT_NS) return true;
  if (waited < DTL__SPIN_NS) {
    sched_yield();
    return true;
  }
  int64_t nap = waited / 64;
  if (nap < DTL__SLEEP_MIN_NS) nap = DTL__SLEEP_MIN_NS;
  if (nap > DTL__SLEEP_MAX_NS) nap = DTL__SLEEP_MAX_NS;
  if (d->end_ns && now + nap > d->end_ns) nap = d->end_ns - now;
  struct timespec ts = {(time_t)(nap / 1000000000), (long)(nap % 1000000000)};
  nanosleep(&ts, NULL);
  return true;
}

double dtl__deadline_waited(const dtl__deadline *d) { return (double)(dtl__now_ns() - d->start_ns) / 1e9; }

dtl_status dtl__comm_fate_new(dtl_comm *c, double timeout_s) {
  struct dtl__comm_fate *f = dtl__calloc(1, sizeof *f);
  if (!f) return dtl__error(DTL_ERR_OUT_OF_MEMORY, "dtl_comm: out of host memory");
  atomic_init(&f->refs, 1);
  atomic_init(&f->failed, 0);
  f->timeout_s = timeout_s;
  c->fate = f;
  c->fate_root = true;
  return DTL_OK;
}

void dtl__comm_fate_share(dtl_comm *child, const dtl_comm *parent) {
  dtl__comm_fate_release(child);
  child->fate = parent->fate;
  child->fate_root = false;
  if (child->fate) atomic_fetch_add(&child->fate->refs, 1);
}

void dtl__comm_fate_release(dtl_comm *c) {
  struct dtl__comm_fate *f = c->fate;
  c->fate = NULL;
  if (f && atomic_fetch_sub(&f->refs, 1) == 1) dtl__free(f);
}

/* "communicator of 4 ranks (mesh dim 1)" */
static void dtl__comm_name(const dtl_comm *c, char *buf, size_t cap) {
  if (c->mesh_dim >= 0) snprintf(buf, cap, "communicator of %d ranks (mesh dim %d)", c->size, c->mesh_dim);
  else snprintf(buf, cap, "communicator of %d ranks", c->size);
}

dtl_status dtl__comm_timeout(dtl_comm *c, const char *fn, const dtl__deadline *d, const char *detail) {
  char name[64];
  dtl__comm_name(c, name, sizeof name);
  double waited = dtl__deadline_waited(d);
  struct dtl__comm_fate *f = c->fate;
  int live = 0;
  if (f && atomic_compare_exchange_strong(&f->failed, &live, 1)) {
    snprintf(f->why, sizeof f->why, "%s timed out on a %s after %.3f s (deadline %g s)", fn, name, waited,
             d->timeout_s);
    atomic_store(&f->failed, 2);
  }
  return dtl__error(DTL_ERR_TIMEOUT, "%s: timed out after %.3f s (deadline %g s) on a %s, this rank %d%s; the "
                    "communicator has failed: every later call on it returns DTL_ERR_COMM (dtl_comm_abort ends the job)",
                    fn, waited, d->timeout_s, name, c->rank, detail ? detail : "");
}

dtl_status dtl__comm_live(const dtl_comm *c, const char *fn) {
  if (c->aborted) return dtl__error(DTL_ERR_COMM, "%s: the communicator was aborted", fn);
  if (c->fate && atomic_load_explicit(&c->fate->failed, memory_order_acquire) == 2)
    return dtl__error(DTL_ERR_COMM, "%s: the communicator has failed (%s)", fn, c->fate->why);
  return DTL_OK;
}

bool dtl__comm_dead(const dtl_comm *c) {
  return c->aborted || (c->fate && atomic_load_explicit(&c->fate->failed, memory_order_acquire) == 2);
}

dtl_status dtl__timeout_from_env(const char *fn, double *seconds) {
  const char *v = getenv("DTL_TIMEOUT");
  *seconds = 0;
  if (!v || !v[0]) return DTL_OK;
  char *end = NULL;
  errno = 0;
  double x = ((v[0] >= '0' && v[0] <= '9') || v[0] == '.') ? strtod(v, &end) : -1;
  if (!end || *end != '\0' || errno == ERANGE || !(x >= 0 && x <= 1e9)) {
    char q[DTL__QUOTE_CAP];
    return dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "DTL_TIMEOUT=\"%s\" (expected seconds, 0..1e9; 0 or unset: no "
                         "deadline)", dtl__quote(v, q, sizeof q));
  }
  *seconds = x;
  return DTL_OK;
}

dtl_status dtl_comm_set_timeout(dtl_comm *c, double seconds) {
  static const char fn[] = "dtl_comm_set_timeout";
  DTL_CHECK_ARG(c != NULL, fn, "comm=NULL");
  DTL_TRY(dtl__comm_live(c, fn));
  dtl_status local = DTL_OK;
  if (!(seconds >= 0 && seconds <= 1e9))
    local = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "seconds=%g (expected 0..1e9; 0: no deadline)", seconds);
  else if (!c->fate_root)
    local = dtl__error_fn(DTL_ERR_INVALID_ARGUMENT, fn, "comm is a split (or a mesh's) communicator: the timeout is "
                          "one for every communicator of a constructor, set on the one dtl_comm_from_mpi or "
                          "dtl_comm_from_nccl returned");
  /* Collective and agreed (with or without DTL_CHECK): every rank must wait alike (deadline.h). */
  uint64_t bits = 0;
  if (local == DTL_OK) memcpy(&bits, &seconds, sizeof bits);
  DTL_TRY(dtl__agree(c, fn, dtl__fp_mix(0x7173ull, bits), local));
  c->fate->timeout_s = seconds;
  return DTL_OK;
}

double dtl_comm_timeout(const dtl_comm *c) { return c ? dtl__comm_timeout_s(c) : -1; }

/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. Deadlines (comm.h, dtl_comm_set_timeout): how a transport waits under one (a clock,
 * the back-off between polls), and what a timeout does to its communicator: it fails every communicator that
 * shares the constructor's fate, so that later calls return at once instead of waiting again. */
#ifndef DTL_COMM_DEADLINE_H
#define DTL_COMM_DEADLINE_H

#include "comm/backend.h"

#include <stdatomic.h>

/* The deadline and failure state of one constructor's communicators (dtl_comm_from_* and every split below it),
 * reference counted by them. The timeout is one for all of them, and the same on every rank (dtl_comm_from_mpi and
 * dtl_comm_set_timeout agree on it): a timed call runs MPI's nonblocking forms, which never match blocking ones,
 * so ranks must not differ. The first timeout writes why, then publishes failed. */
struct dtl__comm_fate {
  atomic_int refs;
  atomic_int failed; /* 0 live, 1 being written, 2 failed (why is complete) */
  double timeout_s;  /* 0: none */
  char why[400];
};

/* One wait: start, end (0: no deadline) and how many polls so far, in nanoseconds of CLOCK_MONOTONIC. */
typedef struct {
  int64_t start_ns, end_ns;
  double timeout_s;
} dtl__deadline;

/* c's timeout in seconds (0: none), and whether c waits under a deadline. */
static inline double dtl__comm_timeout_s(const dtl_comm *c) { return c->fate ? c->fate->timeout_s : 0; }
static inline bool dtl__comm_timed(const dtl_comm *c) { return dtl__comm_timeout_s(c) > 0; }

/* Starts a wait of at most timeout_s seconds (<= 0: none). */
void dtl__deadline_begin(dtl__deadline *d, double timeout_s);
/* Called after a poll that found the wait unfinished: backs off (10 ms of polls with sched_yield between them,
 * then sleeps that grow with the time waited, at most 1 ms). false once the deadline has passed (never without
 * one). */
bool dtl__deadline_backoff(dtl__deadline *d);
/* Seconds since the wait began. */
double dtl__deadline_waited(const dtl__deadline *d);

/* The fate every communicator made by a constructor starts (with DTL_TIMEOUT's timeout), and a split shares
 * (reference counted). */
dtl_status dtl__comm_fate_new(dtl_comm *c, double timeout_s);
void dtl__comm_fate_share(dtl_comm *child, const dtl_comm *parent);
void dtl__comm_fate_release(dtl_comm *c);

/* DTL_ERR_TIMEOUT for fn on c after d ran out: fails c's fate (the message, for later calls), and returns the
 * error naming fn, c's size and mesh dim, the time waited and detail ("" or ", ranks 1,3 had not arrived"). */
dtl_status dtl__comm_timeout(dtl_comm *c, const char *fn, const dtl__deadline *d, const char *detail);
/* DTL_ERR_COMM naming fn when c was aborted or its fate failed; DTL_OK otherwise. Cheap: one load. */
dtl_status dtl__comm_live(const dtl_comm *c, const char *fn);

/* Whether c was aborted or its fate failed (no message). */
bool dtl__comm_dead(const dtl_comm *c);

/* DTL_TIMEOUT: unset, empty or "0": 0; otherwise seconds in (0, 1e9]. */
dtl_status dtl__timeout_from_env(const char *fn, double *seconds);

#endif

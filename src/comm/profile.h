/* SPDX-License-Identifier: Apache-2.0 */
/* This file is private to dtl. A calibration profile (DTL_PROFILE): the text format that `dtl calibrate` and
 * dtl_cost_model_save write and every rank reads, checked line by line. The transport takes its algorithm table
 * rows from it when a communicator is made; the planner takes its cost line (redistribute/calibrate.c). */
#ifndef DTL_COMM_PROFILE_H
#define DTL_COMM_PROFILE_H

#include "comm/mpi_algo.h"

#define DTL__PROFILE_VERSION 1

typedef struct dtl__profile {
  char source[320];  /* DTL_PROFILE="path", for messages */
  char engine[8];    /* "mpi" or "nccl" */
  int ranks;         /* the size of the communicator it was measured on */
  char cost[320];    /* the cost line's text, in the DTL_PLAN_TUNE format ("" without one) */
  int cost_line;     /* its line number */
  bool has_table;    /* at least one table row */
  dtl__algo_table table; /* the rows (DTL_ALGO_TABLE format) when has_table */
  uint64_t fp;       /* of engine, ranks, cost text and rows: every rank must read the same */
} dtl__profile;

/* The whole of a small text file (at most 1 MiB), NUL-terminated, freed with dtl__free; var names the
 * environment variable that named path in messages ("DTL_ALGO_TABLE"). */
dtl_status dtl__read_text(const char *var, const char *path, const char *fn, char **out);
/* Parses profile text; malformed text is DTL_ERR_INVALID_ARGUMENT naming source, the line and its text. */
dtl_status dtl__profile_parse(const char *text, const char *source, const char *fn, dtl__profile *out);
/* The profile DTL_PROFILE names: *present false (and *out untouched) when the variable is unset or empty. */
dtl_status dtl__profile_from_env(const char *fn, dtl__profile *out, bool *present);
/* The profile's check against a communicator made now of size ranks on engine: DTL_ERR_MISMATCH naming both. */
dtl_status dtl__profile_check(const dtl__profile *p, const char *fn, const char *engine, int size);
/* Writes a profile to path: engine, ranks, the cost line (cost_text, DTL_PLAN_TUNE format; NULL: none) and the
 * rows of table (NULL: none), with a comment header (comment: one line of free text, or NULL). */
dtl_status dtl__profile_write(const char *path, const char *fn, const char *engine, int ranks, const char *cost_text,
                              const dtl__algo_table *table, const char *comment);
/* A calibration's measurement of fn on c (collective over c): one warm-up call, then 5 timed calls between
 * barriers (each waiting for the engine's queued work), the slowest rank's time of each, and the second fastest of
 * those in seconds, the same on every rank. The second fastest: load on a shared machine only ever adds time, and a
 * phase of it during a short sweep would otherwise be taken for the machine's speed. */
dtl_status dtl__calib_time(dtl_comm *c, dtl_status (*fn)(dtl_comm *c, void *arg), void *arg, double *seconds);

/* The algorithm table of an MPI communicator; NULL for another transport (mpi.c). */
const dtl__algo_table *dtl__mpi_table(const dtl_comm *c);

#endif

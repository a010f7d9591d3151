/* SPDX-License-Identifier: Apache-2.0 */
/* Logging controlled by DTL_LOG (level), DTL_LOG_SUBSYS (comma list of subsystems, default all) and
 * DTL_LOG_FILE (path; %h = host, %p = pid). Read once per process, at the first log call of any thread
 * (pthread_once, so threads working on different communicators may log from the start); each line is one
 * stdio call, so lines of different threads never interleave. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "common/internal.h"

static struct {
  int level;
  char subsys[256];
  FILE *file;
  char prefix[128];
} dtl__log_cfg;
static pthread_once_t dtl__log_once = PTHREAD_ONCE_INIT;

/* The world rank as the launcher published it, before MPI_Init and without MPI: OpenMPI's mpirun, then PMIx
 * (OpenMPI 5, Slurm), then PMI (MPICH's hydra, Intel MPI). MPICH's MPI_LOCALRANKID is the rank within the
 * node, not the world, so it is not used. */
static const char *dtl__launcher_rank(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return v;
  }
  return "-";
}

static void dtl__log_init(void) {
  const char *lv = getenv("DTL_LOG");
  static const char *names[] = {"error", "warn", "info", "debug"};
  int level = DTL_LOG_WARN;
  if (lv)
    for (int i = 0; i < 4; i++)
      if (strcasecmp(lv, names[i]) == 0) level = i;
  const char *ss = getenv("DTL_LOG_SUBSYS");
  snprintf(dtl__log_cfg.subsys, sizeof dtl__log_cfg.subsys, "%s", ss ? ss : "");
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  snprintf(dtl__log_cfg.prefix, sizeof dtl__log_cfg.prefix, "%s:%d:%s", host, (int)getpid(), dtl__launcher_rank());
  dtl__log_cfg.file = stderr;
  const char *path = getenv("DTL_LOG_FILE");
  if (path && *path) {
    char out[512];
    size_t o = 0;
    for (const char *p = path; *p && o + 70 < sizeof out; p++) {
      if (p[0] == '%' && p[1] == 'h') o += (size_t)snprintf(out + o, sizeof out - o, "%s", host), p++;
      else if (p[0] == '%' && p[1] == 'p') o += (size_t)snprintf(out + o, sizeof out - o, "%d", (int)getpid()), p++;
      else out[o++] = *p;
    }
    out[o] = '\0';
    FILE *f = fopen(out, "a");
    if (f) dtl__log_cfg.file = f;
  }
  dtl__log_cfg.level = level;
}

bool dtl__log_enabled(dtl__log_level lvl) {
  pthread_once(&dtl__log_once, dtl__log_init);
  return (int)lvl <= dtl__log_cfg.level;
}

void dtl__log(dtl__log_level lvl, const char *subsys, const char *fmt, ...) {
  static const char *tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  if (dtl__log_cfg.subsys[0] && !strstr(dtl__log_cfg.subsys, subsys)) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(dtl__log_cfg.file, "%s dtl %s %s: %s\n", dtl__log_cfg.prefix, tags[lvl], subsys, line);
  fflush(dtl__log_cfg.file);
}

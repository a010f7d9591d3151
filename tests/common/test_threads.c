/* SPDX-License-Identifier: Apache-2.0 */
/* dtl's process-wide state under threads: several threads make failing (and succeeding) calls at the same
 * moment, from the first call of the process on, so that the logging configuration is initialised while
 * others log, the allocation counter is bumped from every thread and each thread's last error is its own.
 * Run under ThreadSanitizer (ctest label tsan, build-tsan), with DTL_LOG unset, DTL_LOG=debug and
 * DTL_LOG_FILE set (ctest gives each its own process, since the configuration is read once per process);
 * TSan fails the test on any race. Without TSan it still checks that every thread keeps its own message and
 * that a log file gets every line exactly once. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/internal.h"

enum { THREADS = 8, ROUNDS = 200 };

static pthread_barrier_t start;
static atomic_int failures;
static atomic_long failed_calls; /* calls that failed and so logged one line each at info level and above */

#define EXPECT(cond, ...)                                   \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "thread check failed: " __VA_ARGS__); \
      fputc('\n', stderr);                                  \
      atomic_fetch_add(&failures, 1);                       \
    }                                                       \
  } while (0)

/* The last error names this thread's own bad value, whatever the other threads failed with meanwhile. */
static void expect_own_message(int id, int round, const char *what) {
  char own[32];
  snprintf(own, sizeof own, "t%d-r%d", id, round);
  EXPECT(strstr(dtl_last_error(), own) != NULL, "%s: thread %d sees \"%s\"", what, id, dtl_last_error());
}

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  pthread_barrier_wait(&start); /* every thread's first call at once: the first log call of the process */
  dtl_mesh *mesh = NULL;
  dtl_layout *a = NULL, *b = NULL;
  for (int r = 0; r < ROUNDS; r++) {
    char bad[64];
    dtl_dtype t;
    snprintf(bad, sizeof bad, "t%d-r%d", id, r);
    EXPECT(dtl_dtype_parse(bad, &t) == DTL_ERR_INVALID_ARGUMENT, "dtype");
    expect_own_message(id, r, "dtl_dtype_parse");
    dtl_placement p[2];
    int n;
    snprintf(bad, sizeof bad, "R,Sx(t%d-r%d)", id, r);
    EXPECT(dtl_placements_parse(bad, p, 2, &n) == DTL_ERR_INVALID_ARGUMENT, "placements");
    expect_own_message(id, r, "dtl_placements_parse");
    snprintf(bad, sizeof bad, "/nonexistent/t%d-r%d.safetensors", id, r);
    dtl_safetensors *f = NULL;
    EXPECT(dtl_safetensors_open(bad, &f) == DTL_ERR_INVALID_ARGUMENT, "open");
    expect_own_message(id, r, "dtl_safetensors_open");
    atomic_fetch_add(&failed_calls, 3);
    /* Calls that allocate and succeed, on this thread's own objects. */
    EXPECT(dtl_mesh_create_abstract(2, (int[]){2, 2}, NULL, &mesh) == DTL_OK, "mesh: %s", dtl_last_error());
    EXPECT(dtl_layout_create(mesh, DTL_FLOAT32, 2, (int64_t[]){8, 6}, (dtl_placement[]){dtl_shard(0), dtl_shard(1)},
                             &a) == DTL_OK,
           "layout");
    EXPECT(dtl_layout_create(mesh, DTL_FLOAT32, 2, (int64_t[]){8, 6}, (dtl_placement[]){dtl_shard(1), dtl_shard(0)},
                             &b) == DTL_OK,
           "layout");
    dtl_plan *plan = NULL;
    EXPECT(dtl_plan_create(a, b, &plan) == DTL_OK, "plan: %s", dtl_last_error());
    char text[2048];
    EXPECT(dtl_plan_explain(plan, text, sizeof text) == DTL_OK, "explain");
    dtl_cost_model bad_cost = {.mask = DTL_COST_ALPHA, .alpha_s = -1};
    dtl_plan *none = NULL;
    EXPECT(dtl_plan_create_with_cost(a, b, &bad_cost, &none) == DTL_ERR_INVALID_ARGUMENT, "bad cost");
    atomic_fetch_add(&failed_calls, 1);
    (void)dtl__alloc_hook_count(); /* the test hook's counter, read while others allocate */
    dtl_plan_destroy(plan);
    dtl_layout_destroy(a);
    dtl_layout_destroy(b);
    dtl_mesh_destroy(mesh);
  }
  return NULL;
}

/* Lines of the log file holding " dtl INFO error: " (one per failed call). */
static long count_error_lines(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[2048];
  long n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, " dtl INFO error: ")) n++;
  fclose(f);
  return n;
}

int main(int argc, char **argv) {
  /* argv[1], when given, is the DTL_LOG_FILE this run logs to (with DTL_LOG=info or debug): start empty. */
  const char *log_path = argc > 1 ? argv[1] : NULL;
  if (log_path) remove(log_path);
  pthread_barrier_init(&start, NULL, THREADS);
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&start);
  if (log_path) {
    long lines = count_error_lines(log_path), want = atomic_load(&failed_calls);
    EXPECT(lines == want, "log file %s has %ld error lines, expected %ld (one per failed call)", log_path, lines, want);
    remove(log_path);
  }
  int bad = atomic_load(&failures);
  printf("%d threads x %d rounds, DTL_LOG=%s DTL_LOG_FILE=%s: %d failed checks\n", THREADS, ROUNDS,
         getenv("DTL_LOG") ? getenv("DTL_LOG") : "(unset)", log_path ? log_path : "(unset)", bad);
  return bad ? 1 : 0;
}

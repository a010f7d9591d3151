/* SPDX-License-Identifier: Apache-2.0 */
/* The layering of src/, checked: reads every #include "..." of every source under a src/ tree and fails on
 * one that points against the direction CONTRIBUTING.md (Layout and names) gives. Usage: check_layering SRC;
 * prints each include that breaks the rule with its file and line, and exits 1 when there is one, 2 when SRC
 * cannot be read. The table below is the rule; change it only with CONTRIBUTING.md. */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Each area and the areas it may include besides itself ("dtl.h" and "dtl/..." are public and allowed
 * everywhere). Layers: tp, moe, cp -> redistribute, checkpoint -> layout -> comm -> common; compute, attn and quant
 * hold kernels that several layers share and sit beside the layers, on common and the memory interface only
 * (attn above compute). Siblings (tp/moe/cp, redistribute/checkpoint) never include each other. */
static const struct {
  const char *area;
  const char *may_include; /* space-separated */
} rules[] = {
    {"common", ""},
    {"comm", "common"},
    {"layout", "comm common quant"},
    {"redistribute", "layout comm common quant"},
    {"checkpoint", "layout comm common quant"},
    {"tp", "redistribute checkpoint layout comm common attn compute quant"},
    {"moe", "redistribute checkpoint layout comm common attn compute quant"},
    {"cp", "redistribute checkpoint layout comm common attn compute quant"},
    {"compute", "common"},
    {"attn", "compute common"},
    {"quant", "common"},
};

/* The memory interface: the headers of comm/ that declare a communicator's memory (dtl__mem and its host and
 * device operations) and include nothing of comm/ but each other, so the kernels of compute/ and attn/ may
 * use them without depending on the transports. The one exception to "compute and attn on common only". */
static const char *const memory_interface[] = {"comm/memory.h", "comm/device_memory.h"};

static bool is_memory_interface(const char *inc) {
  for (size_t i = 0; i < sizeof memory_interface / sizeof *memory_interface; i++)
    if (!strcmp(inc, memory_interface[i])) return true;
  return false;
}

/* Whether word is one of the space-separated words of list. */
static bool in_list(const char *list, const char *word, size_t n) {
  for (const char *p = list; *p;) {
    while (*p == ' ') p++;
    size_t m = strcspn(p, " ");
    if (m == n && !strncmp(p, word, n)) return true;
    p += m;
  }
  return false;
}

static int violations, files, includes;

/* Why file (area/name) may not include inc, or NULL when it may. */
static const char *why_not(const char *area, const char *file, const char *inc) {
  static char why[256];
  if (!strcmp(inc, "dtl.h") || !strncmp(inc, "dtl/", 4)) return NULL;
  const char *slash = strchr(inc, '/');
  if (!slash) return "an include of src/ names its area (\"area/file.h\")";
  size_t n = (size_t)(slash - inc);
  bool self = strlen(area) == n && !strncmp(area, inc, n);
  if (is_memory_interface(file)) {
    if (!strncmp(inc, "common/", 7) || is_memory_interface(inc)) return NULL;
    return "the memory interface includes only common/ and itself";
  }
  if (self) return NULL;
  for (size_t i = 0; i < sizeof rules / sizeof *rules; i++) {
    if (strcmp(rules[i].area, area)) continue;
    if (in_list(rules[i].may_include, inc, n)) return NULL;
    if ((!strcmp(area, "compute") || !strcmp(area, "attn") || !strcmp(area, "quant")) && is_memory_interface(inc)) return NULL;
    snprintf(why, sizeof why, "%s may include only %s%s%s", area, *rules[i].may_include ? rules[i].may_include : "",
             *rules[i].may_include ? " and " : "",
             !strcmp(area, "compute") || !strcmp(area, "attn") || !strcmp(area, "quant") ? "the memory interface (comm/memory.h, comm/device_memory.h)"
                                                               : "itself");
    return why;
  }
  snprintf(why, sizeof why, "area %s is not in the layering table (tests/layering/check_layering.c)", area);
  return why;
}

static void check_file(const char *path, const char *area, const char *rel) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "%s: cannot read\n", path);
    violations++;
    return;
  }
  files++;
  char line[1024];
  for (int ln = 1; fgets(line, sizeof line, f); ln++) {
    const char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p != '#') continue;
    p++;
    while (*p == ' ' || *p == '\t') p++;
    if (strncmp(p, "include", 7)) continue;
    p += 7;
    while (*p == ' ' || *p == '\t') p++;
    if (*p != '"') continue;
    const char *end = strchr(p + 1, '"');
    if (!end) continue;
    char inc[512];
    snprintf(inc, sizeof inc, "%.*s", (int)(end - p - 1), p + 1);
    includes++;
    const char *why = why_not(area, rel, inc);
    if (why) {
      printf("src/%s:%d: #include \"%s\": %s\n", rel, ln, inc, why);
      violations++;
    }
  }
  fclose(f);
}

static bool is_source(const char *name) {
  static const char *const ext[] = {".c", ".h", ".cu", ".cuh"};
  size_t n = strlen(name);
  for (size_t i = 0; i < sizeof ext / sizeof *ext; i++) {
    size_t m = strlen(ext[i]);
    if (n > m && !strcmp(name + n - m, ext[i])) return true;
  }
  return false;
}

/* The sources under root/area (sub-folders included; rel is the path below root). */
static int walk(const char *root, const char *area, const char *sub) {
  char dir[4096];
  if ((size_t)snprintf(dir, sizeof dir, "%s/%s%s%s", root, area, *sub ? "/" : "", sub) >= sizeof dir) return -1;
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096], rel[4096], below[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path ||
        (size_t)snprintf(below, sizeof below, "%s%s%s", sub, *sub ? "/" : "", e->d_name) >= sizeof below ||
        (size_t)snprintf(rel, sizeof rel, "%s/%s", area, below) >= sizeof rel) {
      fprintf(stderr, "%s/%s: path too long\n", dir, e->d_name);
      violations++;
      continue;
    }
    struct stat st;
    if (stat(path, &st)) continue;
    if (S_ISDIR(st.st_mode)) walk(root, area, below);
    else if (is_source(e->d_name)) check_file(path, area, rel);
  }
  closedir(d);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: check_layering SRC\n");
    return 2;
  }
  DIR *d = opendir(argv[1]);
  if (!d) {
    fprintf(stderr, "check_layering: cannot read %s\n", argv[1]);
    return 2;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    struct stat st;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name) < sizeof path && !stat(path, &st) && S_ISDIR(st.st_mode)) walk(argv[1], e->d_name, "");
  }
  closedir(d);
  if (files == 0) {
    fprintf(stderr, "check_layering: no sources under %s\n", argv[1]);
    return 2;
  }
  printf("check_layering: %d files, %d includes, %d against the layering\n", files, includes, violations);
  return violations ? 1 : 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target of the `dtl` command's argument handling: the input is the argument list, arguments
 * separated by NUL bytes (at most 24), handed to dtl_tool_main with its output captured. Whatever the
 * arguments, the command must return 0, 1 or 2, and everything it prints must be safe on a terminal. */
#define _GNU_SOURCE
#include "dtl_tool.h"
#include "fuzz_input.h"

/* Plan creation checks every rank's scratch, so its time grows with the mesh: a mesh of 80064 ranks takes
 * seconds, which is no defect but would stall the fuzzer. Inputs whose --mesh names more than 4096 ranks are
 * skipped (the digits between the x's multiplied; anything unparsable runs). */
static bool mesh_too_large(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *v = !strncmp(argv[i], "--mesh=", 7) ? argv[i] + 7 : !strcmp(argv[i], "--mesh") && i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) continue;
    double ranks = 1, part = 0;
    for (const char *c = v;; c++) {
      if (*c >= '0' && *c <= '9') part = part * 10 + (*c - '0');
      else {
        ranks *= part;
        part = 0;
        if (*c != 'x') break;
      }
    }
    if (ranks > 4096) return true;
  }
  return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  enum { MAX_ARGS = 24 };
  char *copy = malloc(size + 1), *argv[MAX_ARGS + 2] = {"dtl"};
  if (!copy) return 0;
  memcpy(copy, data, size);
  copy[size] = '\0';
  int argc = 1;
  for (size_t at = 0; at < size && argc <= MAX_ARGS; at += strlen(copy + at) + 1) argv[argc++] = copy + at;
  argv[argc] = NULL;
  /* calibrate initializes MPI and measures the machine: not a parser to fuzz (its options are checked first). */
  if (mesh_too_large(argc, argv) || (argc > 1 && !strcmp(argv[1], "calibrate"))) {
    free(copy);
    return 0;
  }
  char *out = NULL, *err = NULL;
  size_t on = 0, en = 0;
  FILE *fo = open_memstream(&out, &on), *fe = open_memstream(&err, &en);
  FZ_CHECK(fo && fe, "open_memstream");
  int rc = dtl_tool_main(argc, argv, fo, fe);
  fclose(fo);
  fclose(fe);
  FZ_CHECK(rc == 0 || rc == 1 || rc == 2, "exit status %d", rc);
  size_t bad;
  FZ_CHECK(dt_text_safe(out, true, &bad), "stdout: unsafe byte 0x%02x at %zu", (unsigned char)out[bad], bad);
  FZ_CHECK(dt_text_safe(err, true, &bad), "stderr: unsafe byte 0x%02x at %zu", (unsigned char)err[bad], bad);
  FZ_CHECK(rc == 0 || en > 0, "exit status %d without a message", rc);
  free(out);
  free(err);
  free(copy);
  return 0;
}

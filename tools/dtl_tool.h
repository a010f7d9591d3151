/* SPDX-License-Identifier: Apache-2.0 */
/* The `dtl` command as a function, so that tests and the fuzz target run it in-process. */
#ifndef DTL_TOOL_H
#define DTL_TOOL_H

#include <stdio.h>

/* Runs `dtl argv[1] ...` (argv[0] is the program name), writing results to out and messages to err; returns
 * the exit status (0 done, 1 the request cannot be done, 2 bad arguments). */
int dtl_tool_main(int argc, char **argv, FILE *out, FILE *err);

#endif

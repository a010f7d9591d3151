/* SPDX-License-Identifier: Apache-2.0 */
/* The `dtl` program: dtl_tool_main on the standard streams. */
#include "dtl_tool.h"

int main(int argc, char **argv) { return dtl_tool_main(argc, argv, stdout, stderr); }

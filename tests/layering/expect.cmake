# SPDX-License-Identifier: Apache-2.0
# cmake -DCHECKER=... -DTREE=... -DRC=n [-DMATCH=regex] -P expect.cmake: runs check_layering on TREE and fails
# unless it exits RC and (when given) its output matches MATCH: the checker's own test, on fixture trees.
execute_process(COMMAND ${CHECKER} ${TREE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL RC)
  message(FATAL_ERROR "check_layering ${TREE} exited ${rc} (expected ${RC})")
endif()
if(DEFINED MATCH AND NOT out MATCHES "${MATCH}")
  message(FATAL_ERROR "check_layering ${TREE} did not report: ${MATCH}")
endif()

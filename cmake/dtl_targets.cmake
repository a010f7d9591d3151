# SPDX-License-Identifier: Apache-2.0
# Helpers that every sub-folder uses to add programs and tests, so that launching rules (mpirun flags,
# root permission, oversubscription, skip codes) live in one place.

# mpirun for tests, examples and benches: as root it needs the two OMPI_ALLOW variables; on a 2-core
# machine 3+ ranks need --oversubscribe.
set(DTL_MPIEXEC ${MPIEXEC_EXECUTABLE} --oversubscribe --bind-to none)
set(DTL_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    OMPI_MCA_btl=self,vader)
# Every test and example runs with DTL_CHECK=1: a rank with a bad argument or another call fails every rank
# instead of hanging or computing wrong data (tests that need it off set DTL_CHECK=0 before making a comm).
list(APPEND DTL_MPI_ENV DTL_CHECK=1)
if(DTL_SANITIZE)
  list(APPEND DTL_MPI_ENV "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:protect_shadow_gap=0" "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endif()

# dtl_program(NAME SOURCES...): an example, benchmark or tool, linked as a user would link it: against the
# shared library and its public headers (plus OpenBLAS for the dense references some of them compute).
function(dtl_program name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE dtl ${DTL_OPENBLAS_LIB} m)
  target_include_directories(${name} PRIVATE ${DTL_CBLAS_INCLUDE})
endfunction()

# dtl_unit_test(NAME SOURCES... [LABELS l...]): a cmocka test run once without mpirun.
function(dtl_unit_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LABELS" ${ARGN})
  if(NOT T_SOURCES)
    set(T_SOURCES ${T_UNPARSED_ARGUMENTS})
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE dtl_internal cmocka)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "unit;sanitize;${T_LABELS}" ENVIRONMENT "${DTL_MPI_ENV}"
                                          SKIP_RETURN_CODE 77 TIMEOUT 300)
endfunction()

# dtl_mpi_test(NAME SOURCES... NP n... [LABELS l...] [ARGS a...]): one ctest entry per world size, NAME_npN.
function(dtl_mpi_test name)
  cmake_parse_arguments(T "" "" "SOURCES;NP;LABELS;ARGS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE dtl_internal)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common)
  foreach(np ${T_NP})
    add_test(NAME ${name}_np${np} COMMAND ${DTL_MPIEXEC} -n ${np} $<TARGET_FILE:${name}> ${T_ARGS})
    set_tests_properties(${name}_np${np} PROPERTIES LABELS "mpi;sanitize;${T_LABELS}" ENVIRONMENT "${DTL_MPI_ENV}"
                                                    PROCESSORS 2 SKIP_RETURN_CODE 77 TIMEOUT 300)
  endforeach()
endfunction()

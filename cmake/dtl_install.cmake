# SPDX-License-Identifier: Apache-2.0
# `make install`: headers, the shared library, the `dtl` tool (tools/), a CMake package
# (find_package(dtl CONFIG) -> dtl::dtl) and a pkg-config file (dtl.pc), all under the GNUInstallDirs dirs.
include(CMakePackageConfigHelpers)

install(TARGETS dtl EXPORT dtlTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# <dtl/nccl.h> includes nccl.h and cuda_runtime.h: a CPU-only install must not offer it.
set(dtl_header_excludes)
if(NOT DTL_HAVE_NCCL)
  set(dtl_header_excludes PATTERN nccl.h EXCLUDE)
endif()
install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h" ${dtl_header_excludes})
install(FILES ${PROJECT_BINARY_DIR}/include/dtl/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtl)
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(dtl_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/dtl)
install(EXPORT dtlTargets NAMESPACE dtl:: DESTINATION ${dtl_cmake_dir})
configure_package_config_file(cmake/dtlConfig.cmake.in ${PROJECT_BINARY_DIR}/dtlConfig.cmake
                              INSTALL_DESTINATION ${dtl_cmake_dir})
# Before 1.0 a minor version may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dtlConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dtlConfig.cmake ${PROJECT_BINARY_DIR}/dtlConfigVersion.cmake
        DESTINATION ${dtl_cmake_dir})
if(DTL_HAVE_NCCL)
  install(FILES cmake/FindNCCL.cmake DESTINATION ${dtl_cmake_dir})
endif()

# --- dtl.pc --------------------------------------------------------------------------------------------------
# prefix is found from the .pc file's own place (${pcfiledir}), so the package still works after
# `cmake --install --prefix elsewhere`; climbing out of a multiarch libdir such as lib/x86_64-linux-gnu takes
# one more level than lib/. An absolute libdir or includedir cannot move, so it is written as it is.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(DTL_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(DTL_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(DTL_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH dtl_pc_up "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
  string(REGEX REPLACE "/$" "" dtl_pc_up "${dtl_pc_up}")
  set(DTL_PC_PREFIX "\${pcfiledir}/${dtl_pc_up}")
  set(DTL_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(DTL_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()

# dtl_pc_flags(OUT PREFIX ITEMS...): ITEMS as words of one line; with PREFIX "" they are libraries (a bare
# name becomes -lname, paths and flags stay), otherwise PREFIX (-I, -D) goes before each.
function(dtl_pc_flags out prefix)
  set(words)
  foreach(item IN LISTS ARGN)
    if(prefix STREQUAL "" AND NOT item MATCHES "^-" AND NOT IS_ABSOLUTE "${item}")
      list(APPEND words "-l${item}")
    elseif(item)
      list(APPEND words "${prefix}${item}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES words)
  list(JOIN words " " text)
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# MPI comes as the flags FindMPI found for the MPI dtl was built with, not as `Requires:` of a package: the
# MPI implementations name their .pc files differently (ompi-c, mpich), and dtl's ABI is that of the one MPI
# it was built with (MPI_Comm is a pointer in OpenMPI, an int in MPICH). Plain `cc` then builds a dtl
# program; `mpicc` works too. The CUDA runtime and NCCL are public when built, as in the CMake package.
set(dtl_pc_includes ${MPI_C_INCLUDE_DIRS})
set(dtl_pc_libs ${MPI_C_LINK_FLAGS} ${MPI_C_LIBRARIES})
set(dtl_pc_private ${BLAS_LINKER_FLAGS} ${BLAS_LIBRARIES} ${DTL_JANSSON_LIB} m)
if(DTL_HAVE_NCCL)
  list(APPEND dtl_pc_includes ${CUDAToolkit_INCLUDE_DIRS} ${NCCL_INCLUDE_DIR})
  list(APPEND dtl_pc_libs ${CUDA_cudart_LIBRARY} ${NCCL_LIBRARY})
  list(APPEND dtl_pc_private ${CUDA_cublas_LIBRARY} ${CUDA_cublasLt_LIBRARY})
endif()
dtl_pc_flags(dtl_pc_i "-I" ${dtl_pc_includes})
dtl_pc_flags(dtl_pc_d "-D" ${MPI_C_COMPILE_DEFINITIONS})
string(JOIN " " DTL_PC_CFLAGS ${dtl_pc_i} ${dtl_pc_d} ${MPI_C_COMPILE_OPTIONS})
dtl_pc_flags(DTL_PC_LIBS "" ${dtl_pc_libs})
dtl_pc_flags(DTL_PC_LIBS_PRIVATE "" ${dtl_pc_private})
configure_file(cmake/dtl.pc.in ${PROJECT_BINARY_DIR}/dtl.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/dtl.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

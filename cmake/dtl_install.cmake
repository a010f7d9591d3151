# SPDX-License-Identifier: Apache-2.0
# `make install`: headers, the shared library, the `dtl` tool (tools/), a CMake package
# (find_package(dtl CONFIG) -> dtl::dtl) and a pkg-config file (dtl.pc).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS dtl EXPORT dtlTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/dtl/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtl)
install(EXPORT dtlTargets NAMESPACE dtl:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtl)

configure_package_config_file(cmake/dtlConfig.cmake.in ${PROJECT_BINARY_DIR}/dtlConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtl)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dtlConfigVersion.cmake COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dtlConfig.cmake ${PROJECT_BINARY_DIR}/dtlConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtl)
if(DTL_HAVE_NCCL)
  install(FILES cmake/FindNCCL.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtl)
endif()

set(DTL_PC_CFLAGS "")
if(DTL_HAVE_NCCL)
  list(JOIN CUDAToolkit_INCLUDE_DIRS " -I" cuda_inc)
  set(DTL_PC_CFLAGS "-DDTL_HAVE_NCCL=1 -I${cuda_inc}")
endif()
configure_file(cmake/dtl.pc.in ${PROJECT_BINARY_DIR}/dtl.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/dtl.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

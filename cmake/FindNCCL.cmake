# SPDX-License-Identifier: Apache-2.0
# Find module for NCCL, which ships no CMake package: defines NCCL::NCCL, NCCL_INCLUDE_DIR, NCCL_LIBRARY and
# NCCL_VERSION. Installed with dtl so that dtlConfig.cmake can find the same dependency for consumers.
#
# Looks in NCCL_ROOT (variable or environment), then beside the CUDA toolkit (NVIDIA's bundles put NCCL
# there), then in the system paths (Debian's libnccl-dev).
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
             PATH_SUFFIXES lib lib64)
unset(_nccl_hints)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_defs REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${part} +([0-9]+).*" "\\1" NCCL_VERSION_${part} "${_nccl_defs}")
  endforeach()
  set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
  unset(_nccl_defs)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  # nccl.h includes cuda_runtime.h, which need not sit beside it.
  if(TARGET CUDA::cudart)
    set_target_properties(NCCL::NCCL PROPERTIES INTERFACE_LINK_LIBRARIES CUDA::cudart)
  endif()
endif()

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs dtl and builds tests/install/consumer against the install through find_package(dtl CONFIG) and
# through pkg-config, then runs both on 2 ranks. Twice: this build as configured (its CMAKE_INSTALL_LIBDIR),
# and a CPU-only build of the library alone into a multiarch libdir such as lib/x86_64-linux-gnu.
#
# Usage: run.sh SOURCE_DIR BUILD_DIR LIBDIR MULTIARCH_LIBDIR WORK_DIR HAVE_NCCL CMAKE_ARGS... -- LAUNCHER...
# CMAKE_ARGS pick the compilers and the MPI of this build for the consumers and the second build; LAUNCHER is
# the mpiexec command with its flags (run with the launcher's environment).
set -euo pipefail
src=$1 build=$2 libdir=$3 multiarch=$4 work=$5 have_nccl=$6
shift 6
cmake_args=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do cmake_args+=("$1"); shift; done
shift
launch=("$@")
rm -rf "$work" && mkdir -p "$work"

fail() { echo "install_consumer: $*" >&2; exit 1; }

# check_prefix NAME PREFIX LIBDIR HAVE_NCCL: what an installed dtl must offer, and two consumers built on it.
check_prefix() {
  local name=$1 prefix=$2 lib=$3 nccl=$4
  [ -e "$prefix/$lib/libdtl.so.0.1" ] || fail "$name: no $lib/libdtl.so.0.1 (soname major.minor)"
  [ -f "$prefix/$lib/cmake/dtl/dtlConfig.cmake" ] || fail "$name: no $lib/cmake/dtl/dtlConfig.cmake"
  if [ "$nccl" = ON ]; then
    [ -f "$prefix/include/dtl/nccl.h" ] || fail "$name: the NCCL build installs no dtl/nccl.h"
  else
    [ ! -e "$prefix/include/dtl/nccl.h" ] || fail "$name: a CPU-only build installs dtl/nccl.h"
  fi
  "$prefix/bin/dtl" info >/dev/null || fail "$name: the installed dtl tool does not run"

  cmake -S "$src/tests/install/consumer" -B "$work/$name-cmake" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" >/dev/null
  cmake --build "$work/$name-cmake" >/dev/null
  "${launch[@]}" -n 2 "$work/$name-cmake/consumer"

  # pkg-config: its -I and -L must be the real install dirs, however deep the libdir is.
  export PKG_CONFIG_PATH="$prefix/$lib/pkgconfig"
  local cflags libs inc libpath
  cflags=$(pkg-config --cflags dtl)
  libs=$(pkg-config --libs dtl)
  inc=$(printf '%s\n' $cflags | sed -n 's/^-I//p' | head -1)
  libpath=$(printf '%s\n' $libs | sed -n 's/^-L//p' | head -1)
  [ "$(realpath "$inc")" = "$(realpath "$prefix/include")" ] || fail "$name: pkg-config --cflags gives -I$inc"
  [ "$(realpath "$libpath")" = "$(realpath "$prefix/$lib")" ] || fail "$name: pkg-config --libs gives -L$libpath"
  # Plain cc, not mpicc: the .pc carries the MPI flags of the MPI dtl was built with.
  cc -std=c11 "$src/tests/install/consumer/consumer.c" $cflags $libs -Wl,-rpath,"$prefix/$lib" -o "$work/$name-pc"
  "${launch[@]}" -n 2 "$work/$name-pc"
}

cmake --install "$build" --prefix "$work/prefix" >/dev/null
check_prefix default "$work/prefix" "$libdir" "$have_nccl"

cmake -S "$src" -B "$work/multiarch-build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_LIBDIR="$multiarch" \
      -DDTL_WITH_CUDA=OFF -DDTL_BUILD_TESTS=OFF "${cmake_args[@]}" >/dev/null
cmake --build "$work/multiarch-build" --target dtl dtl_tool -j 2 >/dev/null
cmake --install "$work/multiarch-build" --prefix "$work/multiarch" >/dev/null
check_prefix multiarch "$work/multiarch" "$multiarch" OFF
echo "install_consumer: OK ($libdir and $multiarch)"

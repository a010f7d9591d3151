#!/usr/bin/env bash
# Usage: run.sh BUILD_DIR CONSUMER_SRC WORK_DIR MPIEXEC
set -euo pipefail
build=$1 src=$2 work=$3 mpiexec=$4
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# 1. CMake package.
cmake -S "$src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/cmake-build" >/dev/null
"$mpiexec" --oversubscribe -n 2 "$work/cmake-build/consumer"
# 2. pkg-config.
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig:${PKG_CONFIG_PATH:-}"
cc -std=c11 "$src/consumer.c" $(pkg-config --cflags --libs dtl) -Wl,-rpath,"$work/prefix/lib" -o "$work/consumer-pc"
"$mpiexec" --oversubscribe -n 2 "$work/consumer-pc"
echo "install_consumer: OK"

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make gpu-check: everything that needs a GPU, in one go, on a CUDA build BUILD: the tests labelled gpu
# (device kernels, NCCL at world size 1, cuBLAS GEMMs, every TP layer on device, and gpu_examples: the
# examples' flows on an NCCL communicator of one rank), then the bandwidth of dtl's pack/copy and fill
# kernels next to cudaMemcpy/cudaMemset. Prints one summary; exits non-zero on any failure, and 0 with
# "SKIP: no GPU" when there is no device (the parts that need none still run). A gpu test that skips while a
# device is visible (one that needs two devices, say) is no failure: the summary counts and lists it with its
# reason. Bounded to 9 minutes.
set -uo pipefail
build=${1:?usage: gpu_check.sh BUILD}
t0=$(date +%s)
build=$(cd "$build" && pwd)
log=$build/gpu-check
mkdir -p "$log"
probe=$build/tests/gpu/gpu_bandwidth
if [ ! -x "$probe" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "gpu-check: FAIL: a GPU is present but $build has no CUDA/NCCL backend (configure with -DDTL_WITH_CUDA=ON)"
    exit 1
  fi
  echo "gpu-check: SKIP: no GPU (and $build was built without the CUDA/NCCL backend)"
  exit 0
fi
"$probe" --probe
device=$?

# 1. ctest -L gpu. Without a device the tests run their host-only cases and skip the rest.
(cd "$build" && timeout 420 ctest -L gpu --output-on-failure --timeout 300 >"$log/ctest.log" 2>&1)
ctest_rc=$?
passed=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' "$log/ctest.log")
skipped=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*Skipped' "$log/ctest.log")
failed=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Not Run)' "$log/ctest.log")
examples=$(grep -E 'Test +#[0-9]+: gpu_examples' "$log/ctest.log" | sed -E 's/.*(Passed|\*\*\*[A-Za-z]+).*/\1/; s/\*//g')

if [ "$device" != 0 ]; then
  echo "gpu-check: SKIP: no GPU (no CUDA device visible). Built and ran what needs none: ctest -L gpu $passed passed," \
       "$skipped skipped, $failed failed (log: $log/ctest.log)"
  [ "$ctest_rc" = 0 ] || { echo "gpu-check: FAIL: ctest -L gpu failed without a device"; exit 1; }
  exit 0
fi

# 2. The kernels' bandwidth.
timeout 120 "$probe" >"$log/bandwidth.log" 2>&1
bw_rc=$?

status() { [ "$1" = 0 ] && echo ok || echo FAIL; }
fail=0
[ "$ctest_rc" = 0 ] && [ "$failed" = 0 ] || fail=1
[ "$bw_rc" = 0 ] || fail=1
echo
echo "== gpu-check summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(($(date +%s) - t0)) s)"
printf '%-44s %s\n' "ctest -L gpu" "$(status $((ctest_rc + failed))): $passed passed, $failed failed, $skipped skipped (log: $log/ctest.log)"
printf '%-44s %s\n' "examples on an NCCL comm of one rank" "${examples:-missing} (gpu_examples_np1)"
printf '%-44s %s\n' "pack/copy/fill kernels vs cudaMemcpy/Memset" "$(status $bw_rc) (log: $log/bandwidth.log)"
sed 's/^/    /' "$log/bandwidth.log"
# Skips are shown (their tests' skip reasons are in the log) but pass.
[ "$skipped" = 0 ] || grep -E '\*\*\*Skipped' "$log/ctest.log" | sed 's/^/    /'
if [ "$fail" != 0 ]; then
  grep -E '\*\*\*(Failed|Timeout|Exception)|Not Run' "$log/ctest.log" | sed 's/^/    /'
  echo "gpu-check: FAIL"
  exit 1
fi
echo "gpu-check: PASS"

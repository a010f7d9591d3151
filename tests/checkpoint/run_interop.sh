#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Usage: run_interop.sh DTL_PROGRAM INTEROP_PY WORK_DIR. Python writes, dtl reads; dtl writes, Python reads.
# Skipped (77) when python3 with the safetensors and numpy packages is not installed.
set -eu
prog=$1 py=$2 work=$3
if ! python3 -c "import safetensors, numpy" 2>/dev/null; then
  echo "skipped: python3 with the safetensors and numpy packages is not installed (pip install safetensors numpy)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
python3 "$py" write "$work/python.safetensors"
"$prog" check "$work/python.safetensors"
"$prog" write "$work/dtl.safetensors"
python3 "$py" check "$work/dtl.safetensors"
rm -rf "$work"

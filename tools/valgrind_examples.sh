#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make test-valgrind: runs every example of BUILD/examples under valgrind's memcheck on NP MPI ranks
# (quickstart, whose mesh is 2x2, and kv_transfer, whose prefill mesh has 4 ranks, on 4), with OpenMPI's suppression file, and fails when any error record
# (invalid access, uninitialised value, leak) has a stack frame in libdtl; records entirely inside MPI,
# the loader or other libraries are counted but not dtl's to fix. XML per rank lands in BUILD/valgrind.
set -euo pipefail
build=${1:?usage: valgrind_examples.sh BUILD [NP]}
np=${2:-2}
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 1; }
supp=
for f in /usr/share/openmpi/openmpi-valgrind.supp "$(dirname "$(command -v mpiexec)")/../share/openmpi/openmpi-valgrind.supp"; do
  [ -f "$f" ] && { supp=$f; break; }
done
[ -n "$supp" ] || { echo "OpenMPI's openmpi-valgrind.supp not found" >&2; exit 1; }
out=$build/valgrind
rm -rf "$out"
mkdir -p "$out"
echo "valgrind $(valgrind --version | sed 's/valgrind-//'), suppressions $supp, XML in $out"
bad=0
for ex in "$build"/examples/*; do
  [ -f "$ex" ] && [ -x "$ex" ] || continue
  name=$(basename "$ex")
  n=$np
  case $name in quickstart | kv_transfer) n=4 ;; esac # a 2x2 mesh; a prefill mesh of 4
  start=$(date +%s)
  if ! DTL_CHECK=1 "$build/dtl-mpiexec" -n "$n" valgrind --tool=memcheck --suppressions="$supp" --leak-check=full \
      --show-leak-kinds=definite,indirect,possible --num-callers=40 --xml=yes \
      --xml-file="$out/$name.rank%q{OMPI_COMM_WORLD_RANK}.xml" "$ex" >"$out/$name.log" 2>&1; then
    echo "FAIL $name: the example itself failed under valgrind (see $out/$name.log)"
    bad=1
    continue
  fi
  # One <error> element per record; it is dtl's when one of its frames' <obj> is libdtl.
  read -r total mine < <(awk '
    /<error>/ { inside = 1; dtl = 0; text = "" }
    inside { text = text "\n" $0; if ($0 ~ /<obj>[^<]*libdtl\.so/) dtl = 1 }
    /<\/error>/ { inside = 0; total++; if (dtl) { mine++; print text > "/dev/stderr" } }
    END { print total + 0, mine + 0 }' "$out/$name".rank*.xml 2>"$out/$name.dtl-records")
  printf '%-16s %d ranks  %4d s  %4d records, %d through libdtl\n' "$name" "$n" $(($(date +%s) - start)) "$total" "$mine"
  if [ "$mine" -gt 0 ]; then
    bad=1
    grep -E '<kind>|<fn>|<file>|<line>' "$out/$name.dtl-records" | sed 's/^ */    /' | head -60
  fi
done
[ "$bad" = 0 ] && echo "valgrind: no record through libdtl" || echo "valgrind: FAILED"
exit "$bad"

#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs an MPI job that must end through MPI_Abort (test_comm_abort.c): passes when the job exits non-zero after a
# rank printed "aborting", fails when it exits 0 or a rank printed that dtl_comm_abort returned or left a barrier.
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
case $out in *"dtl_comm_abort returned"*|*"left a barrier"*) echo "FAIL: the job went on after dtl_comm_abort"; exit 1;; esac
case $out in *aborting*) ;; *) echo "FAIL: no rank reached dtl_comm_abort"; exit 1;; esac
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0 after dtl_comm_abort"; exit 1; }
echo "PASS: the job ended with status $rc through MPI_Abort"

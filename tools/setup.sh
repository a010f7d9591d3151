#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages dtl needs when they are missing: as root with apt-get, otherwise it says
# which ones to install. Does nothing when all are present. With DTL_NO_INSTALL=1 it never installs: it
# lists what is missing and fails.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "${DTL_NO_INSTALL:-0}" != 0 ] || [ "$(id -u)" -ne 0 ]; then
  echo "dtl: missing packages: ${missing[*]}" >&2
  echo "dtl: run 'sudo apt-get install -y ${missing[*]}' (or make setup as root without DTL_NO_INSTALL)" >&2
  exit 1
fi
echo "dtl: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}"

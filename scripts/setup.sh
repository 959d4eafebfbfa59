#!/usr/bin/env bash
# Installs the Debian packages fsdp needs to build, when they are missing.
# Safe to run again: it installs nothing that is already there.
# The CUDA toolkit and NCCL are not Debian packages here; the build uses them
# when found (/usr/local/cuda) and builds the CPU backend alone otherwise.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in build-essential cmake ninja-build pkg-config libluajit-5.1-dev luajit libpmix-dev libreadline-dev libopenblas-dev libcjson-dev clang libclang-rt-dev python3 gnuplot-nox; do
  have_pkg "$p" || need+=("$p")
done

if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${need[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

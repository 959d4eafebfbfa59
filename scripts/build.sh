#!/usr/bin/env bash
# Configures and builds fsdp into a build directory (default: build/).
#   scripts/build.sh [BUILD_DIR] [extra cmake -D options...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
scripts/setup.sh
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
elif [ $# -gt 0 ]; then
  cmake "$dir" "$@" >/dev/null
fi
cmake --build "$dir" -- -j"$(nproc)"

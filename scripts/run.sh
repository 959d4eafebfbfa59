#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the
# demo on 4 CPU ranks. Arguments replace the default job:
#   scripts/run.sh [-n N] [FILE.lua args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh build
if [ $# -eq 0 ]; then
  set -- -n 4 recipes/demo_collectives.lua
fi
exec build/fsdprun "$@"

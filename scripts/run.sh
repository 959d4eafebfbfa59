#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the
# demo (a tiny Llama trained on 2 CPU ranks). Arguments replace it:
#   scripts/run.sh [-n N] [FILE.lua args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh build
if [ $# -eq 0 ]; then
  set -- -n 2 recipes/tiny.lua
fi
exec build/fsdprun "$@"

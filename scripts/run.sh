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
# how long it took, and on what, so that a run can be compared with the
# README's (measured on one host) and with another machine's
t0=$(date +%s)
rc=0
build/fsdprun "$@" || rc=$?
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)
echo "run.sh: $(( $(date +%s) - t0 )) s on $(nproc) cores of ${cpu:-an unnamed CPU} (exit status $rc)" >&2
exit $rc

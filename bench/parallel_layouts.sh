#!/usr/bin/env bash
# parallel_layouts.sh [BUILD] [RANKS] [args...]: bench/parallel_layouts.lua on
# RANKS CPU ranks (default 4, oversubscribed where the host has fewer
# cores): a 56M Llama at seq 4096 trained at dp_shard=4, dp_shard=1,cp=4 and
# dp_shard=2,tp=2 in one job; tokens/s, and each group's bytes sent per
# step measured against the plan. args: the script's (layouts=a;b;c
# steps=N seq=N layers=N). About 10 minutes on 2 cores (bench/RESULTS.md).
set -u
build=${1:-build} ranks=${2:-4}
shift $(( $# < 2 ? $# : 2 ))
root=$(cd "$(dirname "$0")/.." && pwd)
echo "host: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ); $(git -C "$root" rev-parse --short HEAD)"
FSDPRUN_OVERSUBSCRIBE=1 "$build/fsdprun" -n "$ranks" --timeout 1800 --rank0-only --no-prefix \
  "$root/bench/parallel_layouts.lua" "$@"

#!/usr/bin/env bash
# Runs the safetensors fuzzer for a bounded time from a small seed corpus
# (valid files and near misses), in a scratch directory.
#   tests/fuzz/run.sh FUZZER SECONDS
set -euo pipefail
fuzzer=$1 secs=${2:-30}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus"
seed() { # seed NAME HEADER DATA_BYTES
  local h=$2 n=${#2}
  { printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8 & 255)) $((n >> 16 & 255)) $((n >> 24 & 255)))"
    printf '%s' "$h"; head -c "$3" /dev/zero; } > "$work/corpus/$1"
}
seed empty '{}' 0
seed one '{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}' 16
seed two '{"__metadata__":{"format":"pt"},"x.w":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"y":{"dtype":"I64","shape":[],"data_offsets":[6,14]}}' 14
seed overlap '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}' 6
cd "$work"
"$fuzzer" -max_total_time="$secs" -max_len=4096 -timeout=10 -print_final_stats=1 corpus 2>&1 | tail -n 15

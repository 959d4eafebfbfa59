#!/usr/bin/env bash
# export_weights.sh [BUILD] [RANKS]: bench/export_weights.lua on RANKS CPU
# ranks (default 2), then its streamed folder against the checkpoint
# export's, byte for byte, and loaded by transformers (float64) against our
# logits (tests/lua/hf_logits.lua, tests/scripts/hf_transformers_logits.py:
# within 1e-4 of the largest). Needs torch and transformers in
# FSDP_TEST_PYTHON (scripts/python_env.sh --torch makes them).
set -u
build=${1:-build} ranks=${2:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${FSDP_TEST_PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
FSDPRUN_OVERSUBSCRIBE=1 "$build/fsdprun" -n "$ranks" --timeout 600 "$root/bench/export_weights.lua" "$work" | sed 's/^\[0\] //'
differ=0
for f in "$work"/export/*; do cmp -s "$f" "$work/streamed/${f##*/}" || { echo "differs: ${f##*/}"; differ=1; }; done
echo "streamed folder against the checkpoint export: $([ $differ = 0 ] && echo 'the same bytes' || echo 'DIFFERENT') ($(ls "$work/export" | wc -l) files)"
"$build/fsdp" "$root/tests/lua/hf_logits.lua" "$work/streamed" "$root" "$work/ours.txt" folder >"$work/ours.out" 2>&1 || cat "$work/ours.out"
(cd "$root/tests/scripts" && "$py" hf_transformers_logits.py "$work/streamed" "$work/ours.txt") | grep -v "Loading"

#!/usr/bin/env bash
# offload_stall_probe.sh BUILD OUT [FORM]: the 4.4B offload benchmark with
# fsdp.offload=FORM (default params), which on 2026-11-24 (H100) printed
# nothing for 150 s with FORM params or all while FORM true trained. Runs it
# with FSDP_LOG=debug for at most 240 s; if no step line has appeared after
# 100 s, writes every thread's stack of the rank (gdb when present, else
# /proc's wchan and kernel stacks) to OUT/offload_FORM_stacks.txt.
set -u
build=$1 out=$2 form=${3:-params}
mkdir -p "$out"
log="$out/offload_${form}.log"
FSDP_LOG=debug timeout 240 "$build/fsdprun" -n 1 --rank0-only --host "$build/fsdp" bench/llama4b_offload.lua \
  fsdp.offload="$form" train.steps=3 train.metrics="$out/offload_${form}.jsonl" >"$log" 2>&1 &
job=$!
for _ in $(seq 100); do
  sleep 1
  grep -q "step 1/" "$log" && break
  kill -0 "$job" 2>/dev/null || break
done
if kill -0 "$job" 2>/dev/null && ! grep -q "step 1/" "$log"; then
  st="$out/offload_${form}_stacks.txt"
  for pid in $(pgrep -f "llama4b_offload.lua" | grep -v "^$job$"); do
    echo "== pid $pid: $(tr '\0' ' ' </proc/$pid/cmdline)" >>"$st"
    if command -v gdb >/dev/null; then
      gdb -batch -p "$pid" -ex "thread apply all bt 30" >>"$st" 2>&1
    else
      for t in /proc/$pid/task/*; do
        echo "-- thread ${t##*/} $(cat "$t/comm") wchan=$(cat "$t/wchan" 2>/dev/null)" >>"$st"
        cat "$t/stack" >>"$st" 2>/dev/null
      done
    fi
  done
fi
wait "$job"
rc=$?
tail -20 "$log"
echo "offload=$form: rc $rc (124: still not done after 240 s)"
exit $rc

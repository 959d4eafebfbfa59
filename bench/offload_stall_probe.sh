#!/usr/bin/env bash
# offload_stall_probe.sh BUILD OUT [FORM]: the 4.4B offload benchmark with
# fsdp.offload=FORM (default params), which on 2026-11-24 (H100) printed
# nothing for 150 s with FORM params or all: meta init on one core, found by
# this probe on 2026-11-26 and now spread over the CPU threads
# (bench/RESULTS.md); it stays to time the start-up and catch the next. Runs it
# with FSDP_LOG=debug for at most 240 s, sampling the rank's resident memory
# and its last log line every 5 s into OUT/offload_FORM_samples.txt; if no
# step line has appeared after PROBE_WAIT (100) s, writes every thread's stack of the
# rank (gdb or cuda-gdb when present, else /proc's wchan and kernel stacks)
# to OUT/offload_FORM_stacks.txt and stops the run.
set -u
build=$1 out=$2 form=${3:-params}
mkdir -p "$out"
log="$out/offload_${form}.log"
FSDP_LOG=debug timeout 240 "$build/fsdprun" -n 1 --rank0-only --host "$build/fsdp" bench/llama4b_offload.lua \
  fsdp.offload="$form" train.steps=3 train.metrics="$out/offload_${form}.jsonl" >"$log" 2>&1 &
job=$!
samples="$out/offload_${form}_samples.txt"
for i in $(seq "${PROBE_WAIT:-100}"); do
  sleep 1
  if grep -q "step 1/" "$log"; then echo "first step line after ${i}s" >>"$samples"; break; fi
  kill -0 "$job" 2>/dev/null || break
  if [ $((i % 5)) = 0 ]; then # where the time goes: memory growing (pinning, init) or flat (a wait)
    for pid in $(pgrep -x fsdp); do # the rank (fsdprun and timeout are not)
      echo "${i}s pid $pid $(grep -E '^(VmRSS|VmLck|VmPin)' /proc/$pid/status 2>/dev/null | tr -s ' \n' ' ') cpu $(awk '{print $14 + $15}' /proc/$pid/stat 2>/dev/null) | $(tail -c 200 "$log" | tail -1)" >>"$samples"
    done
  fi
done
if kill -0 "$job" 2>/dev/null && ! grep -q "step 1/" "$log"; then
  st="$out/offload_${form}_stacks.txt"
  for pid in $(pgrep -x fsdp); do # the rank (fsdprun and timeout are not)
    echo "== pid $pid: $(tr '\0' ' ' </proc/$pid/cmdline)" >>"$st"
    dbg=$(command -v gdb || command -v cuda-gdb)
    if [ -n "$dbg" ]; then
      timeout 60 "$dbg" -batch -p "$pid" -ex "thread apply all bt 30" >>"$st" 2>&1
    else
      for t in /proc/$pid/task/*; do
        echo "-- thread ${t##*/} $(cat "$t/comm") wchan=$(cat "$t/wchan" 2>/dev/null)" >>"$st"
        cat "$t/stack" >>"$st" 2>/dev/null
      done
    fi
  done
  pkill -KILL -x fsdp # the stacks are what this run was for; fsdprun then ends
fi
wait "$job"
rc=$?
tail -20 "$log"
echo "offload=$form: rc $rc (124: still not done after 240 s)"
exit $rc

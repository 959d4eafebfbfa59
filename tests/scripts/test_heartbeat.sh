#!/usr/bin/env bash
# test_heartbeat.sh FSDPRUN ROOT: a rank alive but stuck ends the job within
# --heartbeat-timeout (3 s here) plus a little, not after FSDP_COMM_TIMEOUT
# (60 s here) or never: fsdprun names the stuck rank and its last step, not
# the peer waiting for it in a collective. The rank stops itself (SIGSTOP)
# or spins in Lua outside any collective at the start of step 3
# (FSDP_TEST_STALL). A run that is not stuck, with evaluation and
# checkpoints, or with a meta init or step longer than the timeout, is never
# stopped.
set -u
fsdprun=$1
root=$2
. "$(dirname "$0")/checks.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FSDPRUN_OVERSUBSCRIBE=1 FSDP_COMM_TIMEOUT=60
quick="train.eval_every=0 data.seq=32 data.micro_batch=2 train.log_every=1 train.steps=8 train.metrics=$work/m.jsonl"

# stall_case NAME HOW RANK: the job ends in under 12 s (3 s of silence, a
# start of a few seconds), status 1, naming RANK and step 3
stall_case() {
  local t0 t1 rc
  t0=$(date +%s%N)
  FSDP_TEST_STALL=$3:3:$2 "$fsdprun" -n 3 --heartbeat-timeout 3 --grace 2 --timeout 90 "$root/recipes/tiny.lua" $quick \
    >"$work/out" 2>&1
  rc=$?
  t1=$(date +%s%N)
  local ms=$(((t1 - t0) / 1000000))
  check "$1: exit status 1 (got $rc)" "[ $rc = 1 ]"
  check "$1: over in $ms ms (< 12000)" "[ $ms -lt 12000 ]"
  check "$1: names rank $3 and step 3" \
    "grep -Eq '^fsdprun: rank $3 sent no heartbeat for [0-9]+ s \\(last at step 3\\); stopping the job\$' '$work/out'"
  check "$1: names no other rank" "[ \$(grep -c 'sent no heartbeat' '$work/out') = 1 ]"
  [ $failed = 0 ] || cat "$work/out"
}

stall_case "rank 1 SIGSTOPped" stop 1
stall_case "rank 2 spinning in Lua" spin 2

# not stuck: evaluation and synchronous checkpoints between steps
"$fsdprun" -n 2 --heartbeat-timeout 3 --timeout 90 "$root/recipes/tiny.lua" $quick train.eval_every=2 \
  checkpoint.dir="$work/ck" checkpoint.every=2 checkpoint.async=false >"$work/out" 2>&1
rc=$?
check "a healthy run with evaluation and checkpoints: exit 0 (got $rc)" "[ $rc = 0 ]"
check "a healthy run: no heartbeat complaint" "! grep -q 'sent no heartbeat' '$work/out'"

# not stuck: a meta init of several seconds on one thread (64M values at
# ~10M/s) under a 2 s timeout; it beats as it draws. Its step takes 2-6 s
# under ASan too: each unit's gather, reduce and update beat
FSDP_CPU_THREADS=1 "$fsdprun" -n 1 --heartbeat-timeout 2 --timeout 90 "$root/recipes/tiny.lua" $quick train.steps=1 \
  model.hidden_size=1024 model.intermediate_size=4096 model.num_attention_heads=8 model.num_key_value_heads=8 \
  data.micro_batch=1 >"$work/out" 2>&1
rc=$?
check "a long meta init: exit 0 (got $rc)" "[ $rc = 0 ]"
check "a long meta init: no heartbeat complaint" "! grep -q 'sent no heartbeat' '$work/out'" || cat "$work/out"

finish test_heartbeat

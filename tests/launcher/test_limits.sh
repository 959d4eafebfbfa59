#!/usr/bin/env bash
# fsdprun's own limits: no more ranks than slots unless --oversubscribe,
# --timeout fires even while ranks are still starting, and the first rank to
# fail (by time, not by rank number) is the one reported.
. "$(dirname "$0")/lib.sh"
unset FSDPRUN_OVERSUBSCRIBE # the suite sets it for its multi-rank tests
cores=$(nproc)

# ---- slots
refused() { # NAME MESSAGE_REGEX fsdprun-args...
  local name=$1 msg=$2
  shift 2
  "$LAUNCHER" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  check "$name: refused, exit 2 (got $rc)" "[ $rc = 2 ]"
  check "$name: stderr says '$msg'" "grep -Eq -- \"$msg\" '$work/err'"
  check "$name: nothing started" "[ ! -s '$work/out' ]"
}
export CUDA_VISIBLE_DEVICES= # no GPUs: the slots are the cores
refused "$((cores + 1)) ranks on $cores cores" \
  "^fsdprun: $((cores + 1)) ranks, but this host has $cores slots? \\(its cores\\)\\. Give --oversubscribe" \
  -n $((cores + 1)) --host "$PROBE" --marker $MARK
refused "-n 1000" "1000 ranks, but this host has $cores slots?.*--oversubscribe" -n 1000 --host "$PROBE" --marker $MARK
refused "--slots 2, 3 ranks" "3 ranks, but this host has 2 slots \\(--slots\\)" -n 3 --slots 2 --host "$PROBE" --marker $MARK
refused "--slots 0" "--slots expects a number of ranks" -n 1 --slots 0 --host "$PROBE" --marker $MARK
CUDA_VISIBLE_DEVICES=0 refused "a host with one GPU, 2 ranks" "2 ranks, but this host has 1 slot \\(its GPUs\\)" \
  -n 2 --host "$PROBE" --marker $MARK
for how in --oversubscribe FSDPRUN_OVERSUBSCRIBE=1; do
  if [ $how = --oversubscribe ]; then
    "$LAUNCHER" -n $((cores + 1)) --oversubscribe --host "$PROBE" --marker $MARK >"$work/out" 2>"$work/err"
  else
    FSDPRUN_OVERSUBSCRIBE=1 "$LAUNCHER" -n $((cores + 1)) --host "$PROBE" --marker $MARK >"$work/out" 2>"$work/err"
  fi
  rc=$?
  check "$how: $((cores + 1)) ranks run (exit $rc)" "[ $rc = 0 ] && [ \$(grep -c ' ok\$' '$work/out') = $((cores + 1)) ]"
done
no_leftovers "slots" $MARK

# ---- --timeout while the ranks are still starting (2000 take seconds here)
t0=$(ms)
"$LAUNCHER" -n 2000 --oversubscribe --timeout 0.3 --grace 1 --host sleep 30 >"$work/out" 2>"$work/err"
rc=$?
dt=$(($(ms) - t0))
check "--timeout 0.3 while starting 2000 ranks: exit 124 (got $rc)" "[ $rc = 124 ]"
check "--timeout 0.3 while starting 2000 ranks: within 2 s (took $dt ms)" "[ $dt -le 2000 ]"
check "--timeout while starting: says so" \
  "grep -Eq '^fsdprun: the job ran past --timeout 0.3 s while starting the ranks \\([0-9]+ of 2000 started\\)' '$work/err'"
sleep 0.2
check "--timeout while starting: no sleep left" "! pgrep -x -P $$ sleep >/dev/null"

# ---- the first failure by time: rank 1 exits 3, then rank 0 exits 1, both
# while fsdprun is stopped, so it finds both ended at its next look
rank_sh='if [ "$PMIX_RANK" = 1 ]; then sleep 1; exit 3; else sleep 1.6; exit 1; fi'
for round in 1 2; do
  "$LAUNCHER" -n 2 --host sh -c "$rank_sh" >"$work/out" 2>"$work/err" &
  pid=$!
  sleep 0.5
  kill -STOP $pid
  sleep 2.2
  kill -CONT $pid
  wait $pid
  rc=$?
  check "first failure by time ($round): exit 3, rank 1's status (got $rc)" "[ $rc = 3 ]"
  check "first failure by time ($round): rank 1 named" "grep -q '^fsdprun: rank 1 exited with status 3' '$work/err'"
done
no_leftovers "limits" $MARK

finish

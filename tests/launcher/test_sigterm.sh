#!/usr/bin/env bash
# Signals to fsdprun while the ranks sleep: SIGTERM makes it exit 143
# promptly, SIGINT 130, SIGUSR1 (sbatch --signal) 138; the default grace is
# 60 s, a second signal skips it; after a rank failed the others get at most
# 5 s; a signal while the ranks are still starting acts at once; --timeout
# ends the job with 124. No rank, child or temp directory is left.
. "$(dirname "$0")/lib.sh"
dt=0 # how long the last signal_case took

# signal_case NAME SIGNALS(space separated) EXPECTED_RC LIMIT_MS fsdprun-args...
signal_case() {
  local name=$1 sigs=$2 want=$3 limit=$4
  shift 4
  "$LAUNCHER" "$@" >"$work/out" 2>"$work/err" &
  local pid=$! t0 rc
  wait_lines 3 ' ok$' "$work/out" || bad "$name: the 3 ranks did not start within 30 s" # every rank is up
  t0=$(ms)
  for s in $sigs; do
    kill -"$s" $pid
    sleep 0.2
  done
  wait $pid
  rc=$?
  dt=$(($(ms) - t0))
  check "$name: fsdprun exits $want (got $rc)" "[ $rc = $want ]"
  check "$name: within $limit ms (took $dt ms)" "[ $dt -le $limit ]"
  no_leftovers "$name" $MARK
}

signal_case "SIGTERM" TERM 143 3000 -n 3 --host "$PROBE" --sleep 60 --grandchild --marker $MARK
check "SIGTERM: fsdprun says so" "grep -q '^fsdprun: got signal 15 (Terminated); stopping 3 ranks' '$work/err'"
signal_case "SIGINT" INT 130 3000 -n 3 --host "$PROBE" --sleep 60 --marker $MARK
signal_case "SIGUSR1" USR1 138 3000 -n 3 --host "$PROBE" --sleep 60 --marker $MARK
check "SIGUSR1: fsdprun says so" "grep -q '^fsdprun: got signal 10 (User defined signal 1); stopping 3 ranks' '$work/err'" || cat "$work/err"
# ranks that ignore SIGTERM: the grace period, then SIGKILL
signal_case "SIGTERM, ranks ignoring it, --grace 2" TERM 143 4000 -n 3 --grace 2 --host "$PROBE" --sleep 60 --ignore-term --marker $MARK
check "--grace 2: the ranks got SIGKILL only after it ($dt ms)" "[ $dt -ge 1900 ]"
# a second signal: no more grace
signal_case "SIGTERM twice, --grace 30" "TERM TERM" 143 3000 -n 3 --grace 30 --host "$PROBE" --sleep 60 --ignore-term --marker $MARK
check "SIGTERM twice: fsdprun says so" "grep -q 'again; killing the ranks' '$work/err'"

# the default grace: ranks that keep running after SIGTERM (a save under
# way) are not killed for 60 s; a second SIGTERM kills them
"$LAUNCHER" -n 2 --host "$PROBE" --sleep 60 --ignore-term --marker $MARK >"$work/out" 2>"$work/err" &
pid=$!
wait_lines 2 ' ok$' "$work/out"
kill -TERM $pid
sleep 5.5
check "default grace: the ranks still run 5.5 s after SIGTERM" "[ \"\$(leftovers $MARK | wc -l)\" -ge 2 ]"
signal_and_wait $pid TERM
check "default grace: a second SIGTERM ends the job (exit $rc)" "[ $rc = 143 ]"
no_leftovers "default grace" $MARK

# a rank failed: the others cannot finish their step; --grace 100 is not waited
fail_case "rank 1 failed, the others ignoring SIGTERM, --grace 100" 3 '^fsdprun: rank 1 exited with status 3' 7000 \
  -n 3 --grace 100 --host "$PROBE" --rank-to-fail 1 --exit 3 --ignore-term --marker $MARK

# SIGTERM while the ranks are still being started (each fork slowed to
# 85 ms: 150 take 12.7 s): fsdprun stops starting them and ends at once
FSDPRUN_TEST_SLOW_FORK_MS=85 "$LAUNCHER" -n 150 --oversubscribe --host sleep 30 >"$work/out" 2>"$work/err" &
pid=$!
sleep 1
signal_and_wait $pid TERM
check "SIGTERM while starting 150 slowed ranks: exit 143 (got $rc) within 1 s (took $dt ms)" "[ $rc = 143 ] && [ $dt -le 1000 ]"
check "SIGTERM while starting: names the ranks started so far" \
  "grep -Eq '^fsdprun: got signal 15 \(Terminated\); stopping ([1-9]|[1-9][0-9]) ranks?$' '$work/err'"
sleep 0.2
check "SIGTERM while starting: no sleep left" "! pgrep -x -P $$ sleep >/dev/null"

t0=$(ms)
fail_case "--timeout 1" 124 '^fsdprun: the job ran past --timeout 1 s; stopping 2 ranks$' 4000 \
  -n 2 --timeout 1 --host "$PROBE" --sleep 60 --marker $MARK
dt=$(($(ms) - t0))
check "--timeout 1: not before the second ($dt ms)" "[ $dt -ge 950 ]"

finish

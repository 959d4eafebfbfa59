#!/usr/bin/env bash
# Signals to fsdprun while the ranks sleep: SIGTERM makes it exit 143
# promptly, SIGINT 130; a second signal skips the grace period; --timeout
# ends the job with 124. No rank, child or temp directory is left.
. "$(dirname "$0")/lib.sh"
dt=0 # how long the last signal_case took

# signal_case NAME SIGNALS(space separated) EXPECTED_RC LIMIT_MS fsdprun-args...
signal_case() {
  local name=$1 sigs=$2 want=$3 limit=$4
  shift 4
  "$LAUNCHER" "$@" >"$work/out" 2>"$work/err" &
  local pid=$! t0 rc
  # wait until every rank is up (each prints its ok line)
  for _ in $(seq 100); do
    [ "$(grep -c ' ok$' "$work/out" 2>/dev/null)" -ge 3 ] && break
    sleep 0.05
  done
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
# ranks that ignore SIGTERM: the grace period, then SIGKILL
signal_case "SIGTERM, ranks ignoring it, --grace 2" TERM 143 4000 -n 3 --grace 2 --host "$PROBE" --sleep 60 --ignore-term --marker $MARK
check "--grace 2: the ranks got SIGKILL only after it ($dt ms)" "[ $dt -ge 1900 ]"
# a second signal: no more grace
signal_case "SIGTERM twice, --grace 30" "TERM TERM" 143 3000 -n 3 --grace 30 --host "$PROBE" --sleep 60 --ignore-term --marker $MARK
check "SIGTERM twice: fsdprun says so" "grep -q 'again; killing the ranks' '$work/err'"

t0=$(ms)
fail_case "--timeout 1" 124 '^fsdprun: the job ran past --timeout 1 s; stopping 2 ranks$' 4000 \
  -n 2 --timeout 1 --host "$PROBE" --sleep 60 --marker $MARK
dt=$(($(ms) - t0))
check "--timeout 1: not before the second ($dt ms)" "[ $dt -ge 950 ]"

finish

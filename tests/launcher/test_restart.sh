#!/usr/bin/env bash
# fsdprun --max-restarts: a job whose rank fails is started again, after a
# back-off that doubles, up to N times, each restart announced with the rank
# and how it failed; the ranks see FSDP_RESTART_ATTEMPT and
# FSDP_MAX_RESTARTS. Not restarted: a job that succeeded, ran out of
# --timeout, or was stopped by a signal (to fsdprun, during the back-off,
# or to a rank itself). (A training run restarted with train.resume=auto:
# tests/scripts/test_elastic.sh.)
. "$(dirname "$0")/lib.sh"
export FSDPRUN_RESTART_BACKOFF=0.3

# a rank program: prints what it sees; rank 1 fails with status 3 while the
# attempt is below $1 (then every rank succeeds), once rank 0 has printed
# (else, on a loaded machine, rank 0 could be stopped before its line)
export RANK_SEEN="$work/seen"
rank_sh='echo "attempt=${FSDP_RESTART_ATTEMPT-unset} max=${FSDP_MAX_RESTARTS-unset} state=${FSDPRUN_RESTART_STATE-unset} args=$*"
  a=${FSDP_RESTART_ATTEMPT:-x}; [ "$PMIX_RANK" = 0 ] && touch "$RANK_SEEN.$a"
  if [ "$PMIX_RANK" = 1 ] && [ "${FSDP_RESTART_ATTEMPT:-0}" -lt "$1" ]; then
    for i in $(seq 100); do [ -e "$RANK_SEEN.$a" ] && break; sleep 0.05; done; exit 3; fi; sleep 0.1'

t0=$(ms)
"$LAUNCHER" -n 2 --max-restarts 3 --host sh -c "$rank_sh" sh 2 --marker $MARK >"$work/out" 2>"$work/err"
rc=$?
dt=$(($(ms) - t0))
check "fails twice, --max-restarts 3: exit 0 (got $rc)" "[ $rc = 0 ]"
check "two restarts, each naming rank 1 and its status" "[ \"\$(grep -c '^fsdprun: restart [12] of 3 in 0\\.[36] s (rank 1 exited with status 3)$' '$work/err')\" = 2 ]"
check "the back-off doubles: 0.3 s then 0.6 s" "grep -q 'restart 1 of 3 in 0.3 s' '$work/err' && grep -q 'restart 2 of 3 in 0.6 s' '$work/err'"
check "... and is waited ($dt ms >= 900)" "[ $dt -ge 900 ]"
for a in 0 1 2; do
  check "attempt $a: both ranks see FSDP_RESTART_ATTEMPT=$a, FSDP_MAX_RESTARTS=3" \
    "[ \"\$(grep -c '] attempt=$a max=3 state=unset args=2 --marker $MARK$' '$work/out')\" = 2 ]"
done
check "--host: the program's arguments are not changed" "! grep -q 'train.resume' '$work/out'"
no_leftovers "restarted twice" $MARK

fail_case "always failing, --max-restarts 2: the last attempt's status" 3 \
  '^fsdprun: restart 2 of 2 in 0.6 s \(rank 1 exited with status 3\)$' 5000 \
  -n 2 --max-restarts 2 --host sh -c "$rank_sh" sh 9 --marker $MARK
check "always failing: three attempts" "[ \$(grep -c '^fsdprun: rank 1 exited with status 3' '$work/err') = 3 ] && [ \$(grep -c '^fsdprun: restart' '$work/err') = 2 ]"

fail_case "no --max-restarts: not restarted" 3 '^fsdprun: rank 1 exited with status 3' 3000 \
  -n 2 --host sh -c "$rank_sh" sh 9 --marker $MARK
check "no --max-restarts: no restart, no FSDP_RESTART_ATTEMPT" \
  "! grep -q restart '$work/err' && [ \$(grep -c 'attempt=unset max=unset' '$work/out') = 2 ]"

fail_case "PMIx_Abort: restarted" 5 '^fsdprun: restart 1 of 1 in 0.3 s \(rank 1 called PMIx_Abort with status 5\)$' 5000 \
  -n 2 --max-restarts 1 --host "$PROBE" --rank-to-fail 1 --abort --exit 5 --marker $MARK
fail_case "SIGKILL: restarted" 137 '^fsdprun: restart 1 of 1 in 0.3 s \(rank 0 was killed by signal 9 \(Killed\)\)$' 5000 \
  -n 2 --max-restarts 1 --host "$PROBE" --kill-self 9 --marker $MARK

# ranks stopped by a signal of their own (a scheduler signals them): no restart
fail_case "a rank that exits 143: not restarted" 143 '^fsdprun: rank 0 exited with status 143' 3000 \
  -n 2 --max-restarts 3 --host "$PROBE" --exit 143 --marker $MARK
check "exit 143: no restart" "! grep -q restart '$work/err'"
fail_case "a rank killed by SIGUSR1: not restarted" 138 '^fsdprun: rank 0 was killed by signal 10' 3000 \
  -n 2 --max-restarts 3 --host "$PROBE" --kill-self 10 --marker $MARK
check "SIGUSR1: no restart" "! grep -q restart '$work/err'"

# a signal to fsdprun: no restart, whether the ranks run or fsdprun waits
"$LAUNCHER" -n 2 --max-restarts 3 --host "$PROBE" --sleep 60 --marker $MARK >"$work/out" 2>"$work/err" &
pid=$!
wait_lines 2 ' ok$' "$work/out"
signal_and_wait $pid TERM
check "SIGTERM to fsdprun: exit 143 (got $rc), no restart" "[ $rc = 143 ] && ! grep -q restart '$work/err'"
no_leftovers "SIGTERM to fsdprun" $MARK

FSDPRUN_RESTART_BACKOFF=5 "$LAUNCHER" -n 2 --max-restarts 3 --host sh -c "$rank_sh" sh 9 --marker $MARK \
  >"$work/out" 2>"$work/err" &
pid=$!
wait_lines 1 '^fsdprun: restart 1' "$work/err"
signal_and_wait $pid TERM
check "SIGTERM during the back-off: exit 143 (got $rc) within 1 s (took $dt ms)" "[ $rc = 143 ] && [ $dt -le 1000 ]"
check "SIGTERM during the back-off: says so, no second attempt" \
  "grep -q 'before restarting; not restarting' '$work/err' && [ \$(grep -c 'attempt=1' '$work/out') = 0 ]"
no_leftovers "SIGTERM during the back-off" $MARK

# --timeout counts from the first start, across restarts
fail_case "--timeout 1.5, a rank failing every 0.3 s: 124" 124 'timeout' 3500 \
  -n 1 --timeout 1.5 --max-restarts 100 --host sh -c 'sleep 0.3; exit 1' --marker $MARK

for bad in -1 x 1001; do
  "$LAUNCHER" -n 1 --max-restarts $bad --host true >"$work/out" 2>"$work/err"
  rc=$?
  check "--max-restarts $bad: usage error (exit $rc)" "[ $rc = 2 ] && grep -q 'max-restarts expects a number from 0 to 1000' '$work/err'"
done

finish

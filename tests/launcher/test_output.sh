#!/usr/bin/env bash
# 4 ranks start, exchange keys through PMIx, print ok and exit 0; each line
# carries its rank's prefix, stdout and stderr stay apart; --no-prefix and
# --rank0-only; a partial last line is still shown.
. "$(dirname "$0")/lib.sh"

"$LAUNCHER" -n 4 --host "$PROBE" --print-lines 3 --marker $MARK >"$work/out" 2>"$work/err"
rc=$?
check "4 ranks: fsdprun exits 0 (got $rc)" "[ $rc = 0 ]"
for r in 0 1 2 3; do
  check "rank $r: exchange ok, prefixed [$r]" "grep -qx '\[$r\] rank $r of 4 local $r/4 ok' '$work/out'"
  check "rank $r: its 3 stdout lines carry [$r]" "[ \$(grep -c '^\[$r\] rank $r line [0-2]\$' '$work/out') = 3 ]"
  check "rank $r: its 3 stderr lines carry [$r], on stderr" "[ \$(grep -c '^\[$r\] rank $r err [0-2]\$' '$work/err') = 3 ]"
  check "rank $r: partial last line flushed, with a newline" "grep -qx '\[$r\] rank $r partial' '$work/out'"
done
check "stdout has no stderr line" "! grep -q ' err ' '$work/out'"
check "stderr has no stdout line" "! grep -q -e ' line ' -e ' ok' '$work/err'"
check "every line is prefixed" "! grep -v '^\[[0-3]\] ' '$work/out' '$work/err' | grep -q ."
no_leftovers "4 ranks" $MARK

"$LAUNCHER" -n 2 --no-prefix --host "$PROBE" --print-lines 1 --marker $MARK >"$work/out" 2>"$work/err"
rc=$?
check "--no-prefix: exit 0 (got $rc)" "[ $rc = 0 ]"
check "--no-prefix: lines as the ranks wrote them" "grep -qx 'rank 1 of 2 local 1/2 ok' '$work/out' && grep -qx 'rank 0 err 0' '$work/err' && ! grep -q '^\[' '$work/out' '$work/err'"

"$LAUNCHER" -n 3 --rank0-only --host "$PROBE" --print-lines 1 --marker $MARK >"$work/out" 2>"$work/err"
rc=$?
check "--rank0-only: exit 0 (got $rc)" "[ $rc = 0 ]"
check "--rank0-only: stdout is rank 0's only" "[ \$(wc -l <'$work/out') = 3 ] && [ \$(grep -c '^\[0\] ' '$work/out') = 3 ]"
check "--rank0-only: every rank's stderr is kept" "[ \$(wc -l <'$work/err') = 3 ] && grep -q '^\[2\] rank 2 err 0' '$work/err'"

# --option=value spelling, and a one-rank job
"$LAUNCHER" --np=1 --grace=1 --timeout=30 --host "$PROBE" --marker $MARK >"$work/out" 2>"$work/err"
rc=$?
check "--np=1 --grace=1 --timeout=30: exit 0 (got $rc)" "[ $rc = 0 ] && grep -qx '\[0\] rank 0 of 1 local 0/1 ok' '$work/out'"

# the ranks see FSDPRUN=1, and no PMIx variable of an outer launcher
PMIX_NAMESPACE=stale-namespace "$LAUNCHER" -n 2 --no-prefix --host /usr/bin/env >"$work/out" 2>&1
check "ranks get FSDPRUN=1" "[ \$(grep -c '^FSDPRUN=1\$' '$work/out') = 2 ]"
check "ranks get their own PMIX_NAMESPACE and PMIX_RANK" "! grep -q stale-namespace '$work/out' && grep -qx 'PMIX_RANK=1' '$work/out'"
check "ranks get PMIX_MCA_gds=hash" "[ \$(grep -c '^PMIX_MCA_gds=hash\$' '$work/out') = 2 ]"
no_leftovers "options" $MARK

# a rank that leaves a background child (holding its stdout) behind
t0=$(ms)
"$LAUNCHER" -n 2 --grace 2 --host /bin/sh -c "sh -c 'sleep 30; : --marker $MARK' & echo started" >"$work/out" 2>"$work/err"
rc=$? dt=$(($(ms) - t0))
check "a rank's orphan is stopped at the end: exit 0 within 3 s (got $rc, $dt ms)" "[ $rc = 0 ] && [ $dt -lt 3000 ]"
no_leftovers "orphan" $MARK

finish

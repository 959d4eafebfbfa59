#!/usr/bin/env bash
# pmix_probe started directly, with no launcher: PMIx_Init finds no server
# and the probe runs as a singleton, rank 0 of 1, exchange included.
. "$(dirname "$0")/lib.sh"

# no PMIx variables from whatever started this test (an outer launcher)
for v in $(env | grep -o '^PMIX_[A-Za-z0-9_]*' | grep -v '^PMIX_MCA_'); do unset "$v"; done
unset FSDPRUN

t0=$(ms)
out=$("$PROBE" --print-lines 1 --marker $MARK 2>"$work/err")
rc=$?
dt=$(($(ms) - t0))
check "singleton: exit 0 (got $rc)" "[ $rc = 0 ]"
check "singleton: rank 0 of 1, exchange with itself ok" "echo '$out' | grep -qx 'rank 0 of 1 local 0/1 ok (singleton)'"
check "singleton: its output is not prefixed (no launcher)" "echo '$out' | grep -qx 'rank 0 line 0'"
check "singleton: starts quickly (took $dt ms)" "[ $dt -lt 5000 ]"
no_leftovers "singleton" $MARK

# the same probe under fsdprun -n 1 is not a singleton
out=$("$LAUNCHER" -n 1 --no-prefix --host "$PROBE" --marker $MARK 2>&1)
check "under fsdprun -n 1: a real one-rank job" "[ '$out' = 'rank 0 of 1 local 0/1 ok' ]"

finish

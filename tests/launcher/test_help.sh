#!/usr/bin/env bash
# --help documents every option, the exit codes, the environment, and how to
# run on a cluster (srun, prterun) or as a singleton.
. "$(dirname "$0")/lib.sh"

"$LAUNCHER" --help >"$work/out" 2>"$work/err"
rc=$?
check "--help: exit 0 (got $rc), on stdout" "[ $rc = 0 ] && [ -s '$work/out' ] && [ ! -s '$work/err' ]"
for word in -n --np --host --ranks-per-gpu NCCL_HOSTID --no-prefix --rank0-only --grace --timeout --help --version \
  FSDPRUN_HOST TMPDIR FSDPRUN=1 'Exit status' 124 143 \
  'srun --mpi=pmix' 'srun --mpi=list' prterun --allow-run-as-root singleton; do
  check "--help mentions '$word'" "grep -q -- '$word' '$work/out'"
done
"$LAUNCHER" -h >"$work/out2"
check "-h is --help" "cmp -s '$work/out' '$work/out2'"
out=$("$LAUNCHER" --version)
check "--version: '$out'" "echo '$out' | grep -Eq '^fsdprun [0-9]+\\.[0-9]+'"

finish

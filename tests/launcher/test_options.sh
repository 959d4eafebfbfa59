#!/usr/bin/env bash
# Bad command lines: a clear message on stderr and exit status 2, and no
# job started.
. "$(dirname "$0")/lib.sh"
job=$work/job.lua
echo 'print("never run")' >"$job"

# opt_case NAME MESSAGE_REGEX fsdprun-args...
opt_case() {
  local name=$1 msg=$2 before=$failed
  shift 2
  "$LAUNCHER" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  check "$name: exit 2 (got $rc)" "[ $rc = 2 ]"
  check "$name: stderr says '$msg'" "grep -Eq -- \"$msg\" '$work/err'"
  check "$name: nothing on stdout" "[ ! -s '$work/out' ]"
  [ "$failed" = "$before" ] || sed 's/^/    stderr: /' "$work/err"
}

opt_case "-n x" "^fsdprun: -n expects a positive integer, got 'x'\$" -n x "$job"
opt_case "-n 0" "^fsdprun: -n expects a positive integer, got '0'\$" -n 0 "$job"
opt_case "-n -3" "^fsdprun: -n expects a positive integer, got '-3'\$" -n -3 "$job"
opt_case "-n 2.5" "-n expects a positive integer, got '2.5'" -n 2.5 "$job"
opt_case "-n 100000" "at most 4096 ranks" -n 100000 "$job"
opt_case "-n with no value" "^fsdprun: -n expects a number of ranks\$" -n
opt_case "no -n" "give -n N" "$job"
opt_case "missing job file" "^fsdprun: $work/missing.lua not found\$" -n 2 "$work/missing.lua"
opt_case "no job file" "no job file" -n 2
opt_case "unknown option" "^fsdprun: unknown option '--frobnicate'\$" -n 2 --frobnicate "$job"
opt_case "unknown option: the usage follows" "^usage: fsdprun -n N" -n 2 --frobnicate "$job"
opt_case "--grace x" "--grace expects seconds \\(a number >= 0\\), got 'x'" -n 2 --grace x "$job"
opt_case "--timeout -1" "--timeout expects seconds \\(a number >= 0\\), got '-1'" -n 2 --timeout -1 "$job"
opt_case "--grace without a value" "^fsdprun: --grace expects seconds\$" -n 2 --grace
opt_case "--host without a program" "--host expects a program" -n 2 --host
opt_case "--host: a program not in PATH" "cannot run the rank program no-such-program-$$: not found in PATH" \
  -n 2 --host no-such-program-$$
FSDPRUN_HOST=$work/nothing-here opt_case "FSDPRUN_HOST that does not exist" "cannot run the rank program $work/nothing-here" -n 2
no_leftovers "bad options" $MARK

# FSDPRUN_HOST sets the program; --host wins over it
out=$(FSDPRUN_HOST=/bin/echo "$LAUNCHER" -n 1 --no-prefix from env 2>&1)
check "FSDPRUN_HOST runs that program with the arguments as given" "[ '$out' = 'from env' ]"
out=$(FSDPRUN_HOST=/bin/false "$LAUNCHER" -n 1 --no-prefix --host echo from the command line 2>&1)
check "--host (found in PATH) wins over FSDPRUN_HOST" "[ '$out' = 'from the command line' ]"
out=$("$LAUNCHER" -n 1 --no-prefix --host /bin/echo --no-prefix -n 3 2>&1)
check "after --host PROGRAM, options belong to PROGRAM" "[ '$out' = '--no-prefix -n 3' ]"

# --ranks-per-gpu N: a test mode that puts N GPU ranks on each GPU
opt_case "--ranks-per-gpu 0" "--ranks-per-gpu expects a number of ranks per GPU from 1 to 64, got '0'" \
  -n 2 --ranks-per-gpu 0 "$job"
opt_case "--ranks-per-gpu x" "--ranks-per-gpu expects a number of ranks per GPU from 1 to 64, got 'x'" \
  -n 2 --ranks-per-gpu x "$job"
CUDA_VISIBLE_DEVICES= opt_case "--ranks-per-gpu on a host with no GPU" \
  "--ranks-per-gpu 2: this host shows no GPU" -n 2 --ranks-per-gpu 2 "$job"
FSDPRUN_OVERSUBSCRIBE= CUDA_VISIBLE_DEVICES=0 opt_case "--ranks-per-gpu 2 on 1 GPU: 3 ranks are more than its slots" \
  "3 ranks, but this host has 2 slots \(1 GPU x --ranks-per-gpu 2\)" -n 3 --ranks-per-gpu 2 "$job"
show='echo "$NCCL_HOSTID $NCCL_SOCKET_IFNAME $NCCL_IB_DISABLE $NCCL_NET $NCCL_MNNVL_ENABLE $FSDPRUN_RANKS_PER_GPU"'
out=$(CUDA_VISIBLE_DEVICES=0,1 NCCL_HOSTID=outer NCCL_SOCKET_IFNAME=eth7 "$LAUNCHER" -n 4 --ranks-per-gpu 2 \
  --host /bin/sh -c "$show" 2>"$work/err")
check "--ranks-per-gpu 2 on 2 GPUs: 4 ranks run" "[ \$(wc -l <<<'$out') = 4 ]"
for r in 0 1 2 3; do
  check "--ranks-per-gpu: rank $r is its own NCCL host, on sockets (the user's interface kept)" \
    "grep -q '^\[$r\] fsdprun-[0-9]*-rank$r eth7 1 Socket 0 2\$' <<<'$out'"
done
check "--ranks-per-gpu: the job's first line says the test mode is on" \
  "head -1 '$work/err' | grep -q '^fsdprun: test mode --ranks-per-gpu 2: 4 ranks share the GPUs'"
out=$(CUDA_VISIBLE_DEVICES=0 NCCL_HOSTID=outer "$LAUNCHER" -n 1 --no-prefix --host /bin/sh -c "$show" 2>&1)
check "without --ranks-per-gpu the ranks get no NCCL settings (the user's pass through)" "[ '$out' = 'outer     ' ]"

finish

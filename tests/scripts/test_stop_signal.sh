#!/usr/bin/env bash
# test_stop_signal.sh FSDPRUN ROOT: a training run stopped by a signal
# finishes its step, saves a checkpoint synchronously and exits 128+signal,
# saying where it saved; resumed, it continues bit for bit: the losses of the
# stopped-and-resumed run equal an uninterrupted run's (same ranks). Signals
# go to fsdprun (which passes them on to the ranks) and straight to the
# ranks (as srun and mpirun deliver them); SIGUSR1 (sbatch --signal) too.
# A second, different signal ends a rank at once, with nothing saved.
# Where Open MPI's mpirun is installed, SIGUSR1 and SIGTERM to mpirun too;
# where Slurm is, SIGUSR1 and SIGTERM by scancel to a job under srun.
set -u
fsdprun=$1
root=$2
. "$(dirname "$0")/checks.sh"
. "$(dirname "$0")/runs.sh"
steps=100000 # never reached: the schedule follows it, the signal ends the run

# the command that starts 2 ranks (stop_case's launcher)
launch="$fsdprun -n 2 --timeout 120"

# start a run in the background, wait for step 4 in its metrics
start() { # dir
  mkdir -p "$1"
  $launch "$root/recipes/tiny.lua" $quick train.steps=$steps checkpoint.dir="$1/ck" \
    train.metrics="$1/m.jsonl" >"$1/out" 2>&1 &
  pid=$!
  # (up to 60 s: a Slurm step can wait for the node while the job scancel
  # ended before it is still completing; the suite once saw 10 s pass)
  for _ in $(seq 1200); do
    [ "$(wc -l 2>/dev/null <"$1/m.jsonl" || echo 0)" -ge 4 ] && return 0
    sleep 0.05
  done
  bad "$1: the run did not reach step 4"
  return 1
}

# stop_case NAME SIGNAL TARGET(launcher|ranks) EXPECTED_RC
stop_case() {
  local name=$1 sig=$2 target=$3 want=$4 dir="$work/$1"
  start "$dir" || return
  case $target in
  launcher) kill -"$sig" $pid ;;
  ranks) kill -"$sig" $(pgrep -P $pid) ;;
  scancel) scancel --signal="$sig" "$(squeue -h -o %i | head -n 1)" ;; # to the tasks of the job's steps
  esac
  wait $pid
  local rc=$?
  check "$name: exit status $want (got $rc)" "[ $rc = $want ]"
  local n
  n=$(sed -n 's/.*stopped by SIG[A-Z0-9]* after step \([0-9]*\); checkpoint saved at .*/\1/p' "$dir/out" | head -1)
  check "$name: says it stopped after a step and saved" "[ -n '$n' ]"
  [ "$target" = scancel ] || [ "$name" = "SIGTERM to mpirun" ] ||
    check "$name: names SIG$sig as what stopped it" "grep -q 'stopped by SIG$sig after step' '$dir/out'"
  [ -n "$n" ] || { tail -5 "$dir/out"; return; }
  local ck
  ck=$(printf '%s/ck/step-%08d' "$dir" "$n")
  check "$name: $ck is there and latest names it" "[ -d '$ck' ] && grep -q \"step-\$(printf %08d $n)\" '$dir/ck/latest'"
  check "$name: the metrics end at step $n" "[ \"\$(losses '$dir/m.jsonl' | tail -1 | cut -d' ' -f1)\" = $n ]"
  # resume 3 more steps; then the same steps uninterrupted
  "$fsdprun" -n 2 --timeout 120 "$root/recipes/tiny.lua" $quick train.steps=$steps checkpoint.dir="$dir/ck" \
    train.metrics="$dir/m.jsonl" train.resume=auto train.stop_after=$((n + 3)) >"$dir/out2" 2>&1
  check "$name: resumed to step $((n + 3))" "[ \$? = 0 ]"
  "$fsdprun" -n 2 --timeout 120 "$root/recipes/tiny.lua" $quick train.steps=$steps train.metrics="$dir/ref.jsonl" \
    train.stop_after=$((n + 3)) >"$dir/out3" 2>&1
  check "$name: losses of steps 1-$((n + 3)) bit for bit as uninterrupted" \
    "[ \"\$(losses '$dir/m.jsonl')\" = \"\$(losses '$dir/ref.jsonl')\" ] && [ \$(losses '$dir/ref.jsonl' | wc -l) = $((n + 3)) ]"
}

stop_case "SIGTERM to fsdprun" TERM launcher 143
stop_case "SIGINT to fsdprun (Ctrl-C)" INT launcher 130
stop_case "SIGTERM to the ranks" TERM ranks 143
stop_case "SIGUSR1 to the ranks" USR1 ranks 138
if command -v mpirun >/dev/null && mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  # Open MPI 4.1: mpirun forwards SIGUSR1 at once ("mpirun: Forwarding
  # signal 10 to job"); on SIGTERM it sends the ranks SIGCONT, SIGTERM
  # odls_base_sigkill_timeout seconds later, SIGKILL as long after that,
  # and exits 1. mpirun also waits about that long after the ranks ended.
  launch="mpirun --allow-run-as-root --oversubscribe -np 2 --mca odls_base_sigkill_timeout 2 $(dirname "$fsdprun")/fsdp"
  stop_case "SIGUSR1 to mpirun" USR1 launcher 138
  stop_case "SIGTERM to mpirun" TERM launcher 1
  launch="$fsdprun -n 2 --timeout 120"
else
  echo "skipped: SIGUSR1 and SIGTERM to mpirun (Open MPI's mpirun is not installed)"
fi
# Slurm: `scancel --signal` (and `sbatch --signal=USR1@T` ahead of a time
# limit) signals the step's tasks; srun exits with their status. On a
# one-node cluster of the test's own (tests/scripts/slurm_cluster.sh).
if slurm_up; then
  launch="srun --mpi=pmix --kill-on-bad-exit=1 -n 2 $(dirname "$fsdprun")/fsdp"
  stop_case "SIGUSR1 by scancel (srun)" USR1 scancel 138
  stop_case "SIGTERM by scancel (srun)" TERM scancel 143
  launch="$fsdprun -n 2 --timeout 120"
  unset SLURM_CONF
else
  echo "skipped: SIGUSR1 and SIGTERM by scancel ($slurm_why)"
fi

# a second, different signal right after the first: the ranks end at once
dir="$work/twice"
if start "$dir"; then
  ranks=$(pgrep -P $pid)
  kill -TERM $ranks
  kill -INT $ranks
  wait $pid
  rc=$?
  # both may be pending when a rank next runs: the kernel delivers SIGINT
  # (2) first, so either one can be the second, fatal signal
  check "SIGTERM then SIGINT: the job failed (got $rc)" "[ $rc = 130 ] || [ $rc = 143 ]"
  check "SIGTERM then SIGINT: nothing saved" "[ ! -e '$dir/ck/latest' ]"
  check "SIGTERM then SIGINT: fsdprun names the signal" "grep -Eq 'killed by signal (2|15)' '$dir/out'"
  check "SIGTERM then SIGINT: no rank says it stopped cleanly" "! grep -q 'stopped by SIG' '$dir/out'"
fi

finish test_stop_signal

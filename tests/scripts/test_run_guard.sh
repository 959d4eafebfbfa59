#!/usr/bin/env bash
# test_run_guard.sh FSDPRUN ROOT: where a restart, a stop and a second job
# meet a run's checkpoints (issue 36). Each case runs without and with
# `fsdprun --max-restarts 1`:
#   * a fresh run into a checkpoint.dir that holds another run, and a branch
#     from an older checkpoint into it: refused with status 78 (the job's
#     configuration), never restarted, the other run's files untouched;
#   * checkpoint.overwrite=true with rank 0 killed before the old
#     checkpoints are removed: the restart begins the run anew (its losses
#     bit for bit a fresh run's), never the old run's history;
#   * a second job into a directory a running job writes: refused, naming
#     the first job's process; the first goes on;
#   * SIGTERM during a long evaluation (--grace 10): the evaluation ends at
#     the next check, the step is saved, exit 143; resumed, the losses go on
#     bit for bit as an uninterrupted run's; during the export, nothing
#     half-written is left and the run is in its checkpoint; during a
#     checkpoint's load, the directory stays as it was;
#   * a resume whose metrics rewrite fails (a full disk: /dev/full): the run
#     goes on without metrics, saying so, instead of failing every restart.
set -u
fsdprun=$1
root=$2
. "$(dirname "$0")/checks.sh"
. "$(dirname "$0")/runs.sh"
export FSDPRUN_OVERSUBSCRIBE=1 FSDPRUN_RESTART_BACKOFF=0.1 FSDP_COMM_TIMEOUT=60
recipe=$root/recipes/tiny.lua
q="$quick train.log_every=1 schedule.warmup=2"

run() { # OUT fsdprun-args...: status in $rc
  local out=$1
  shift
  timeout 150 "$fsdprun" "$@" >"$out" 2>&1
  rc=$?
}
# the files of a checkpoint directory and their sums (the lock file aside)
sums() { (cd "$1" && find . -type f ! -name .fsdp-lock | sort | xargs md5sum); }

# another run's history: steps 2, 4, 6 in $work/other
run "$work/other.out" -n 2 "$recipe" $q train.steps=6 checkpoint.dir="$work/other" checkpoint.every=2 optimizer.lr=2e-3
check "another run saved steps 2, 4, 6 (status $rc)" "[ $rc = 0 ] && [ -d '$work/other/step-00000006' ]"
sums "$work/other" >"$work/other.sums"
# a fresh run's losses in an empty directory: the reference
run "$work/fresh.out" -n 2 "$recipe" $q train.steps=6 checkpoint.dir="$work/fresh" train.metrics="$work/fresh.jsonl"

for restarts in 0 1; do
  opt=()
  [ $restarts = 1 ] && opt=(--max-restarts 1)
  tag="--max-restarts $restarts"

  # ---- refusals: not restarted, nothing of the other run touched
  run "$work/r1.out" -n 2 "${opt[@]}" "$recipe" $q train.steps=6 checkpoint.dir="$work/other" optimizer.lr=1e-3
  check "$tag: a fresh run into another run's directory: refused with 78 (got $rc)" "[ $rc = 78 ]"
  check "$tag: ... naming the other run's checkpoint" "grep -q 'is newer than step 0, where this run starts' '$work/r1.out'"
  check "$tag: ... never restarted" "! grep -q 'restart 1 of' '$work/r1.out'"
  [ $restarts = 1 ] && check "$tag: ... fsdprun says it does not restart a refusal" \
    "grep -q 'refused the job (status 78: its recipe, arguments or checkpoint.dir); not restarting' '$work/r1.out'"
  run "$work/r2.out" -n 2 "${opt[@]}" "$recipe" $q train.steps=6 checkpoint.dir="$work/other" \
    train.resume="$work/other/step-00000002"
  check "$tag: a branch from step 2 into the directory of steps 2-6: refused with 78 (got $rc)" \
    "[ $rc = 78 ] && ! grep -q 'restart 1 of' '$work/r2.out' && ! grep -q 'nothing to train' '$work/r2.out'"
  check "$tag: the other run's checkpoints and latest unchanged" "sums '$work/other' | cmp -s - '$work/other.sums'"

  printf 'return { model = {\n' >"$work/broken.lua" # a recipe that does not parse
  run "$work/r3.out" -n 2 "${opt[@]}" "$work/broken.lua"
  check "$tag: a recipe file that does not parse: refused with 78 (got $rc), never restarted" \
    "[ $rc = 78 ] && ! grep -q 'restart 1 of' '$work/r3.out' && grep -q 'broken.lua' '$work/r3.out'"

  # ---- overwrite, rank 0 killed before the old checkpoints go
  rm -rf "$work/ow"
  cp -r "$work/other" "$work/ow"
  FSDP_TEST_KILL_AT=0:0:0 run "$work/ow.out" -n 2 "${opt[@]}" "$recipe" $q train.steps=6 checkpoint.dir="$work/ow" \
    checkpoint.overwrite=true train.metrics="$work/ow.jsonl"
  if [ $restarts = 1 ]; then
    check "$tag: overwrite, rank 0 killed before removing the old run: the restart succeeds (status $rc)" "[ $rc = 0 ]"
    check "$tag: ... resumes nothing of the old run" "! grep -q 'resumed from' '$work/ow.out'"
    check "$tag: ... its losses bit for bit a fresh run's" \
      "[ \"\$(losses '$work/ow.jsonl')\" = \"\$(losses '$work/fresh.jsonl')\" ] && [ -n \"\$(losses '$work/fresh.jsonl')\" ]"
  else
    check "$tag: overwrite, rank 0 killed before removing the old run: the job fails (status $rc)" "[ $rc = 137 ]"
    check "$tag: ... the old run's checkpoints still there" "sums '$work/ow' | sed 's| \./| ./|' | cmp -s - '$work/other.sums'"
  fi

  # ---- a second job into a directory a running job writes
  rm -rf "$work/busy" "$work/busy.jsonl"
  "$fsdprun" -n 1 "$recipe" $q train.steps=100000 checkpoint.dir="$work/busy" checkpoint.every=50 \
    train.metrics="$work/busy.jsonl" >"$work/first.out" 2>&1 &
  first=$!
  for _ in $(seq 300); do [ "$(wc -l 2>/dev/null <"$work/busy.jsonl" || echo 0)" -ge 2 ] && break; sleep 0.05; done
  holder=$(sed -n 's/.*pid=\([0-9]*\).*/\1/p' "$work/busy/.fsdp-lock" 2>/dev/null)
  run "$work/second.out" -n 1 "${opt[@]}" "$recipe" $q train.steps=10 checkpoint.dir="$work/busy"
  check "$tag: a second job into a running job's directory: refused with 78 (got $rc)" "[ $rc = 78 ] && [ -n '$holder' ]"
  check "$tag: ... naming the first job's process ($holder)" \
    "grep -q 'checkpoint.dir $work/busy is in use by another job: its rank 0 is process $holder on host' '$work/second.out'"
  check "$tag: ... the first job still runs" "kill -0 $first 2>/dev/null"
  kill -TERM $first
  wait $first
  rc=$?
  check "$tag: ... and stops cleanly, saving (status $rc)" "[ $rc = 143 ] && grep -q 'checkpoint saved at' '$work/first.out'"

  # ---- SIGTERM during a long evaluation
  rm -rf "$work/ev" "$work/ev.jsonl"
  "$fsdprun" -n 2 "${opt[@]}" --grace 10 "$recipe" $q train.steps=9 train.eval_every=6 train.eval_batches=4000 \
    checkpoint.dir="$work/ev" train.metrics="$work/ev.jsonl" >"$work/ev.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q '"step":6,' "$work/ev.jsonl" 2>/dev/null && break; sleep 0.05; done
  sleep 0.3
  kill -TERM $pid
  wait $pid
  rc=$?
  check "$tag: SIGTERM during evaluation: exit 143 (got $rc), not restarted" "[ $rc = 143 ] && ! grep -q 'restart 1 of' '$work/ev.out'"
  check "$tag: ... the evaluation stopped and said so" "grep -q 'eval step 6 | stopped by a signal after [0-9]* of 4000 batches' '$work/ev.out'"
  check "$tag: ... step 6 saved" "grep -q 'stopped by SIGTERM after step 6; checkpoint saved at $work/ev/step-00000006' '$work/ev.out'"
  run "$work/ev2.out" -n 2 "$recipe" $q train.steps=9 train.eval_every=0 checkpoint.dir="$work/ev" train.resume=auto \
    train.metrics="$work/ev.jsonl"
  run "$work/ev3.out" -n 2 "$recipe" $q train.steps=9 train.eval_every=0 train.metrics="$work/evref.jsonl"
  check "$tag: ... resumed, steps 1-9 bit for bit as uninterrupted" \
    "[ \"\$(losses '$work/ev.jsonl')\" = \"\$(losses '$work/evref.jsonl')\" ] && [ \$(losses '$work/ev.jsonl' | wc -l) = 9 ]"

  # ---- a stop during the export (each rank signals itself as it begins:
  # FSDP_TEST_STOP_IN), and during a checkpoint's load
  rm -rf "$work/xp" "$work/xp.hf" "$work/xp.hf.tmp"
  FSDP_TEST_STOP_IN=export run "$work/xp.out" -n 2 "${opt[@]}" "$recipe" $q train.steps=4 checkpoint.dir="$work/xp" \
    checkpoint.export_hf="$work/xp.hf"
  check "$tag: a stop during the export: exit 143 (got $rc), not restarted" "[ $rc = 143 ] && ! grep -q 'restart 1 of' '$work/xp.out'"
  check "$tag: ... nothing half-written left, the run saved, and said so" \
    "[ ! -e '$work/xp.hf' ] && [ ! -e '$work/xp.hf.tmp' ] && [ -d '$work/xp/step-00000004' ] &&
     grep -q 'stopped by SIGTERM after step 4 during the export to $work/xp.hf: nothing exported ($work/xp.hf.tmp removed); checkpoint saved at $work/xp/step-00000004' '$work/xp.out'"
  sums "$work/xp" >"$work/xp.sums"
  FSDP_TEST_STOP_IN=load run "$work/ld.out" -n 2 "${opt[@]}" "$recipe" $q train.steps=8 checkpoint.dir="$work/xp" \
    train.resume=auto
  check "$tag: a stop during a checkpoint's load: exit 143 (got $rc), not restarted, said so" \
    "[ $rc = 143 ] && ! grep -q 'restart 1 of' '$work/ld.out' &&
     grep -q 'stopped by SIGTERM during the load of $work/xp/step-00000004: nothing trained or saved' '$work/ld.out'"
  check "$tag: ... the checkpoint directory as it was" "sums '$work/xp' | cmp -s - '$work/xp.sums'"

  # ---- a full disk for the metrics rewrite at the resume
  rm -rf "$work/md" "$work/md.jsonl"*
  ln -s /dev/full "$work/md.jsonl.resume-tmp" # where the kept records are rewritten
  if [ $restarts = 1 ]; then
    FSDP_TEST_KILL_AT=0:1:6 run "$work/md.out" -n 2 "${opt[@]}" "$recipe" $q train.steps=8 checkpoint.dir="$work/md" \
      checkpoint.every=2 checkpoint.async=false train.metrics="$work/md.jsonl"
  else
    FSDP_TEST_KILL_AT=0:1:6 run "$work/md0.out" -n 2 "$recipe" $q train.steps=8 checkpoint.dir="$work/md" \
      checkpoint.every=2 checkpoint.async=false train.metrics="$work/md.jsonl"
    run "$work/md.out" -n 2 "$recipe" $q train.steps=8 checkpoint.dir="$work/md" train.resume=auto \
      train.metrics="$work/md.jsonl"
  fi
  check "$tag: the metrics rewrite at the resume fails (a full disk): the run goes on to step 8 (status $rc)" \
    "[ $rc = 0 ] && [ -d '$work/md/step-00000008' ]"
  check "$tag: ... saying it goes on without metrics" \
    "grep -q 'warning: train.metrics: cannot rewrite .* this resumed run goes on without metrics' '$work/md.out'"
done
[ -n "${FSDP_KEEP:-}" ] && cp -r "$work" /tmp/run_guard_work
finish test_run_guard

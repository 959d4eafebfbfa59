#!/usr/bin/env bash
# test_elastic.sh FSDPRUN ROOT: a training run that survives its ranks'
# deaths. The tiny recipe (shortened) on 2 ranks with `fsdprun
# --max-restarts 5`: a random rank SIGKILLs itself at the start of a random
# step, three times (FSDP_TEST_KILL_AT, lua/fsdp/restarts.lua); fsdprun
# restarts the job with train.resume=auto each time. The losses in the
# metrics file (one record per step, the last one kept) must equal an
# uninterrupted run's bit for bit. Then the global batch across world sizes
# (issue 35), with the recipe's train.grad_accum (1) and nothing on the
# command line to say the global batch: a run on 2 ranks killed once, with
# no restarts, continued by a new fsdprun on 1 rank (resume=auto), which
# accumulates 2 micro-batches a step to keep the 128 tokens; a run begun
# on 1 rank with train.grad_accum=2, continued on 2 ranks with 1: the
# losses of both within RESHARD_TOL of an uninterrupted 2-rank run's; on 3
# ranks the 2-rank checkpoint is refused (status 78) naming both; a
# train.grad_accum on the command line is honoured, with a warning. And a
# run begun from a checkpoint (train.resume=PATH), killed before it saved,
# is restarted from that checkpoint, not from step 1.
# FSDP_ELASTIC_SEED=N repeats a run's random choices (it prints its seed).
set -u
fsdprun=$1
root=$2
. "$(dirname "$0")/checks.sh"
work=$(mktemp -d)
[ -n "${FSDP_KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
export FSDPRUN_RESTART_BACKOFF=0.05 # the default 1 s, doubling, would be most of the test's time
steps=16
# Different world sizes sum the gradients in another order; fp32 rounding
# then drifts through the AdamW steps. On the fixed text below the 2 -> 1
# rank resume moved the loss by at most 4.8e-7 (2026-11-26, x86 CPU ranks);
# the bound (absolute, on losses of 3 to 5.6: below 4e-6 relative) leaves
# 20x room and still catches a wrong shard, a wrong data position or
# another global batch (each moves the loss by more than 1e-2).
RESHARD_TOL=1e-5

fixed_recipe "$work" "$root" # fixed text, not the repository's changing sources
base="train.eval_every=0 train.log_every=1 data.seq=32 data.micro_batch=2 model.num_hidden_layers=2 schedule.warmup=4
  train.steps=$steps"
common="$base train.global_batch_tokens=256"

run() { # N OUT_PREFIX fsdprun-and-recipe-args...: fsdprun -n N ...; status in $rc
  local n=$1 out=$2
  shift 2
  "$fsdprun" -n "$n" --timeout 120 "$@" >"$out.out" 2>&1
  rc=$?
}

# "STEP LOSS" per step of a metrics file, the last record of a step kept
losses() {
  sed -n 's/^{"step":\([0-9]*\),.*"loss":\([^,}]*\).*/\1 \2/p' "$1" | awk '{ l[$1] = $2 } END { for (s in l) print s, l[s] }' |
    sort -n
}

run 2 "$work/ref" "$work/fixed.lua" $common train.metrics="$work/ref.jsonl"
check "the uninterrupted run (status $rc)" "[ $rc = 0 ] && [ \$(losses '$work/ref.jsonl' | wc -l) = $steps ]"

# ---- three deaths, three restarts, the same losses
seed=${FSDP_ELASTIC_SEED:-$RANDOM}
RANDOM=$seed
every=$((1 + RANDOM % 3))
async=$([ $((RANDOM % 2)) = 0 ] && echo true || echo false)
kills="" step=$((2 + RANDOM % 4)) ranks=""
for attempt in 0 1 2; do
  # each at or after the one before: the attempt that follows a death at
  # step k resumes at step k or earlier, so it reaches its own
  step=$((step + RANDOM % 4))
  r=$((RANDOM % 2))
  kills="$kills${kills:+,}$attempt:$r:$step"
  ranks="$ranks $r"
done
echo "test_elastic: seed $seed: kills (attempt:rank:step) $kills, checkpoint.every=$every, checkpoint.async=$async"
t0=$(date +%s%N)
FSDP_TEST_KILL_AT=$kills run 2 "$work/el" --max-restarts 5 "$work/fixed.lua" $common checkpoint.dir="$work/ck" \
  checkpoint.every=$every checkpoint.async=$async train.metrics="$work/el.jsonl"
dt=$((($(date +%s%N) - t0) / 1000000))
check "--max-restarts 5, three ranks killed: the run succeeds (status $rc, $dt ms)" "[ $rc = 0 ]"
said=$(sed -n 's/^fsdprun: restart \([0-9]\) of 5 in [0-9.e-]* s (rank \([0-9]\) was killed by signal 9 (Killed)).*/\2/p' \
  "$work/el.out" | tr '\n' ' ')
check "fsdprun names each restart's killed rank:$ranks (said: $said)" "[ '$said' = '${ranks# } ' ]"
check "the first restart adds train.resume=auto" "grep -q '^fsdprun: restart 1 of 5 .* with train.resume=auto$' '$work/el.out'"
check "the last attempt's step lines say restart 3/5" "grep -q '^\[0\] step $steps/$steps | .* | restart 3/5' '$work/el.out'"
check "the metrics' last record says attempt 3" "tail -1 '$work/el.jsonl' | grep -q '\"attempt\":3,'"
check "losses of steps 1-$steps bit for bit as uninterrupted" \
  "[ \"\$(losses '$work/el.jsonl')\" = \"\$(losses '$work/ref.jsonl')\" ]"
[ "$(losses "$work/el.jsonl")" = "$(losses "$work/ref.jsonl")" ] ||
  diff <(losses "$work/ref.jsonl") <(losses "$work/el.jsonl") | head -20

# ---- no restarts left: the job fails as the last attempt did
FSDP_TEST_KILL_AT=0:1:3,1:0:3 run 2 "$work/gone" --max-restarts 1 "$work/fixed.lua" $common \
  checkpoint.dir="$work/ck-gone" train.metrics="$work/gone.jsonl"
check "--max-restarts 1, two deaths: status 137 (got $rc)" "[ $rc = 137 ]"
check "--max-restarts 1, two deaths: one restart" "[ \$(grep -c '^fsdprun: restart' '$work/gone.out') = 1 ]"

# ---- the global batch across world sizes: $base leaves it to the recipe's
# train.grad_accum = 1, 2 x 32 x 1 x 2 = 128 tokens a step on 2 ranks
run 2 "$work/ref128" "$work/fixed.lua" $base train.metrics="$work/ref128.jsonl"
check "the uninterrupted 2-rank run of 128 tokens a step (status $rc)" \
  "[ $rc = 0 ] && grep -q '128 tokens per step (2 x 32 x 1 micro-batches x 2 ranks)' '$work/ref128.out'"

# compare REF GOT FROM: "WORST SAME N": the largest |loss diff| after step
# FROM, whether steps 1-FROM are bit for bit the same, how many steps GOT has
compare() {
  awk -v from=$3 'NR == FNR { ref[$1] = $2; next }
    { d = ref[$1] - $2; if (d < 0) d = -d; if ($1 > from && d > w) w = d; if ($1 <= from && ref[$1] != $2) same = "no"; n++ }
    END { printf "%.3g %s %d\n", w, same ? same : "yes", n }' <(losses "$1") <(losses "$2")
}
within() { awk "BEGIN { exit !($1 <= $RESHARD_TOL) }"; }

# killed on 2 ranks, continued on 1: 2 micro-batches a step keep the 128 tokens
k=$((4 + RANDOM % 8))
FSDP_TEST_KILL_AT=0:$((RANDOM % 2)):$k run 2 "$work/two" "$work/fixed.lua" $base checkpoint.dir="$work/ck2" \
  checkpoint.every=2 train.metrics="$work/re.jsonl"
check "killed at step $k on 2 ranks, no restarts: status 137 (got $rc)" "[ $rc = 137 ]"
saved=$(((k - 1) / 2 * 2))
ck_saved="$work/ck2/step-$(printf %08d $saved)"
run 1 "$work/one" "$work/fixed.lua" $base checkpoint.dir="$work/ck2" train.resume=auto train.metrics="$work/re.jsonl"
check "continued on 1 rank (status $rc)" "[ $rc = 0 ]"
check "it resumed from step $saved, $((saved * 4)) windows consumed (4 windows of 32 tokens a step)" \
  "grep -q \"resumed from $ck_saved: step $saved done, $((saved * 4)) windows of data consumed\" '$work/one.out'"
check "it says so: train.grad_accum 1 -> 2 keeps the global batch at 128 tokens" \
  "grep -qF '[0] resume: train.grad_accum 1 -> 2 keeps the global batch of $ck_saved at 128 tokens per step on 1 data-parallel rank instead of 2 (micro_batch x seq x grad_accum x ranks: 2 x 32 x 1 x 2 then, 2 x 32 x 2 x 1 now)' '$work/one.out'"
check "and trains 128 tokens a step on 1 rank" "grep -q '128 tokens per step (2 x 32 x 2 micro-batches x 1 ranks)' '$work/one.out'"
check "its checkpoint records 1 rank x 2 micro-batches = 128 tokens and the windows of all $steps steps" \
  "grep -q '\"consumed\":$((steps * 4)),.*\"dp\":1,\"global_batch_tokens\":128,\"grad_accum\":2,' '$work/ck2/step-$(printf %08d $steps)/index.json'"
worst=$(compare "$work/ref128.jsonl" "$work/re.jsonl" $saved)
echo "test_elastic: 2 ranks -> 1 rank (grad_accum 1 -> 2) after step $saved: worst |loss diff| ${worst%% *} (tolerance $RESHARD_TOL)"
check "steps 1-$saved (2 ranks) bit for bit, all $steps steps there" "[ '${worst#* }' = 'yes $steps' ]"
check "steps $((saved + 1))-$steps (1 rank, 2 micro-batches) within $RESHARD_TOL of 2 ranks (worst ${worst%% *})" \
  "within ${worst%% *}"

# begun on 1 rank with 2 micro-batches (train.grad_accum=2 on the command
# line: a new run's own global batch), continued on 2 ranks with 1
k2=$((2 + RANDOM % 12))
run 1 "$work/up1" "$work/fixed.lua" $base train.grad_accum=2 checkpoint.dir="$work/ck12" checkpoint.every=$k2 \
  train.stop_after=$k2 train.metrics="$work/up.jsonl"
check "1 rank x 2 micro-batches to step $k2 (status $rc)" "[ $rc = 0 ]"
run 2 "$work/up2" "$work/fixed.lua" $base checkpoint.dir="$work/ck12" train.resume=auto train.metrics="$work/up.jsonl"
check "continued on 2 ranks (status $rc)" "[ $rc = 0 ]"
check "it says so: train.grad_accum 2 -> 1 keeps the global batch at 128 tokens" \
  "grep -qF 'resume: train.grad_accum 2 -> 1 keeps the global batch of $work/ck12/step-$(printf %08d $k2) at 128 tokens per step on 2 data-parallel ranks instead of 1' '$work/up2.out'"
worst=$(compare "$work/ref128.jsonl" "$work/up.jsonl" 0)
echo "test_elastic: 1 rank (grad_accum 2) to step $k2, then 2 ranks (1): worst |loss diff| ${worst%% *} (tolerance $RESHARD_TOL)"
check "all $steps steps there, within $RESHARD_TOL of the 2-rank run (worst ${worst%% *})" \
  "[ '${worst##* }' = $steps ] && within ${worst%% *}"

# 3 ranks cannot keep 128 tokens (2 x 32 x 3 = 192 a micro-batch): refused
# before training, as the job's configuration
FSDPRUN_OVERSUBSCRIBE=1 run 3 "$work/three" "$work/fixed.lua" $base train.resume="$ck_saved"
check "the 2-rank checkpoint on 3 ranks: refused with status 78 (got $rc), before step 1" \
  "[ $rc = 78 ] && ! grep -q 'step 1/' '$work/three.out'"
check "... naming the recipe field, 2 and 3 ranks, 128 and 192 tokens, and what keeps it" \
  "grep -qF 'fixed.lua: train.grad_accum: $ck_saved was trained with a global batch of 128 tokens per step on 2 data-parallel ranks (micro_batch x seq x grad_accum x ranks = 2 x 32 x 1 x 2); on 3 ranks one micro-batch is 2 x 32 x 3 = 192 tokens, which does not divide 128. It is kept on 1 or 2 ranks. Or give this run its own: train.grad_accum=1 (192 tokens) on the command line' '$work/three.out'"

# the user's own: train.grad_accum=1 on the command line on 1 rank halves
# the global batch, as asked, and says so
run 1 "$work/own" "$work/fixed.lua" $base train.resume="$ck_saved" train.grad_accum=1 train.metrics="$work/own.jsonl"
check "train.grad_accum=1 on the command line on 1 rank: honoured (status $rc, 64 tokens a step)" \
  "[ $rc = 0 ] && grep -q '64 tokens per step (2 x 32 x 1 micro-batches x 1 ranks)' '$work/own.out'"
check "... with a warning naming the old and the new global batch" \
  "grep -qF '[0] fsdp: warning: train.grad_accum=1 on the command line changes the global batch: 128 tokens per step in $ck_saved, 64 now' '$work/own.out'"

# ---- a restart before the run saved anything begins where the first
# attempt began (its train.resume=PATH), not at step 1. The checkpoint comes
# from another seed, so a fresh start would train differently.
run 2 "$work/src" "$work/fixed.lua" $common train.seed=99 checkpoint.dir="$work/ck-src" checkpoint.every=4 \
  train.stop_after=4 train.metrics="$work/src.jsonl"
from="$work/ck-src/step-00000004"
run 2 "$work/ref2" "$work/fixed.lua" $common train.resume="$from" train.metrics="$work/ref2.jsonl"
check "a run from another seed's step 4, uninterrupted (status $rc)" "[ $rc = 0 ]"
FSDP_TEST_KILL_AT=0:1:7 run 2 "$work/rp" --max-restarts 1 "$work/fixed.lua" $common train.resume="$from" \
  checkpoint.dir="$work/ck-rp" checkpoint.every=100 train.metrics="$work/rp.jsonl"
check "killed at step 7 before any save, restarted: status 0 (got $rc)" "[ $rc = 0 ]"
check "the restart says it begins from $from" "grep -q 'this restart begins from $from, as the first attempt did' '$work/rp.out'"
check "no step 1-4 trained again, steps 5-$steps as the uninterrupted run from $from, bit for bit" \
  "[ \"\$(losses '$work/rp.jsonl')\" = \"\$(losses '$work/ref2.jsonl')\" ] && ! losses '$work/rp.jsonl' | grep -q '^[1-4] '"

finish test_elastic

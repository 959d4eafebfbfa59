#!/usr/bin/env bash
# The multi-rank matrix (issue 39): the same short training job on several
# ranks against 1 rank, case by case, one result line each.
#   scripts/multirank_check.sh BUILD OUT gpu   GPU ranks sharing the GPUs
#       (fsdprun --ranks-per-gpu N), each case against the same job on 1 GPU
#       rank and on N CPU ranks; each rank's peak bytes against its plan;
#       then checkpoints across worlds, a killed rank (under --max-restarts
#       and not), a stopped rank (SIGSTOP, --heartbeat-timeout),
#       one 4-rank step's timeline and the REPL on a 2-rank GPU mesh
#   scripts/multirank_check.sh BUILD OUT cpu   the CPU half: each case on N
#       CPU ranks against 1 CPU rank (no GPU needed; part of the suite)
# MULTIRANK_CASES="name ..." runs only those cases (the names below).
#
# The job: the tiny Llama (4 layers) on fixed text, seq 64, 512 tokens per
# step whatever the ranks (train.global_batch_tokens), 30 steps, lr 1e-3.
# The bounds, per step, on the loss and the grad norm (the grad norm as well:
# AdamW and clipping hide a gradient off by a constant factor from the loss):
#   fp32: 1e-4 relative. Only the order of sums differs between worlds; on
#     x86 CPU ranks 2 and 4 ranks stayed within 1.1e-7 of 1 rank over the 30
#     steps (loss; 1.4e-6 grad norm), and 2 and 4 GPU ranks on one H100
#     within 1.8e-7 (2.0e-6) of 1 GPU rank and of as many CPU ranks
#     (2026-11-28). The planted fp32 mistakes move them by 8e-4 or more.
#   bf16: 1e-2 relative (bf16 keeps 8 bits): 2 and 4 CPU ranks stayed within
#     5.6e-5 (2.6e-3) of 1, GPU ranks within 2.3e-4 (6.2e-3). A wrong shard,
#     a wrong data position, a grad scaled by the world size or a learning
#     rate 10% off move them further.
set -u
build=${1:?usage: multirank_check.sh BUILD OUT gpu|cpu}
out=${2:?usage: multirank_check.sh BUILD OUT gpu|cpu}
mode=${3:-gpu}
root=$(cd "$(dirname "$0")/.." && pwd)
fsdprun=$build/fsdprun
work=$out/multirank
mkdir -p "$work"
export FSDPRUN_OVERSUBSCRIBE=1 # CPU references: more ranks than a small host's cores
. "$root/tests/scripts/checks.sh"

fixed_recipe "$work" "$root"
common="train.eval_every=0 train.log_every=1000 data.seq=64 data.micro_batch=2 train.global_batch_tokens=512
  schedule.warmup=4 train.steps=30 optimizer.lr=1e-3"

# run NAME N DEVICE ARGS...: the job on N ranks; status in $rc, seconds in
# $secs; fsdprun's own options in the array launch_opts
launch_opts=()
# seconds a job may take (each takes a few): a hang costs this, not the lease
limit=${MULTIRANK_TIMEOUT:-90}
run() {
  local name=$1 n=$2 dev=$3
  shift 3
  local share=("${launch_opts[@]}")
  [ "$dev" = cuda ] && [ "$n" -gt 1 ] && share+=(--ranks-per-gpu "$n")
  local t0=$(date +%s%N)
  timeout $((limit + 30)) "$fsdprun" -n "$n" "${share[@]}" --timeout "$limit" "$work/fixed.lua" $common train.device="$dev" \
    train.metrics="$work/$name.jsonl" "$@" >"$work/$name.log" 2>&1
  rc=$?
  secs=$(awk -v t="$(( $(date +%s%N) - t0 ))" 'BEGIN { printf "%.1f", t / 1e9 }')
}

# ref NAME N DEVICE DTYPE: a reference run, once
declare -A ref_rc
ref() {
  local name=$1
  [ -n "${ref_rc[$name]:-}" ] && return
  run "$1" "$2" "$3" fsdp.param_dtype="$4"
  ref_rc[$name]=$rc
  echo "reference $name: status $rc, $secs s, $(grep -o 'loss [0-9.]* -> [0-9.]*' "$work/$name.log" | tail -1)"
}

# against NAME REF TOL: the case's steps against a reference's
against() {
  local why
  why=$(python3 "$root/scripts/compare_losses.py" "$work/$1.jsonl" "$work/$2.jsonl" "$3" 2>&1)
  local c=$?
  echo "vs $2: $why"
  return $c
}

# the bytes each rank measured against its plan (fsdprun --ranks-per-gpu
# makes every rank print them): the worst rank, and whether any rank's peak
# passed its plan (a planner gap)
memory_line() {
  awk '/fsdp: rank [0-9]+ memory: peak/ { for (i = 1; i <= NF; i++) { if ($i == "peak") p = $(i + 1); if ($i == "planned") q = $(i + 1) }
      n++; d = (p - q) / q; if (n == 1 || d > w) { w = d; wr = $4 } if (p > q) over++ }
    END { if (!n) { print "no rank reported its memory"; exit 1 }
      printf "memory: %d ranks, worst rank %s at %+.2f%% of its plan%s\n", n, wr, 100 * w, over ? " (OVER its plan)" : ""
      exit over ? 1 : 0 }' "$1"
}

# name n dtype args...
cases=(
  "z1_fp32_2 2 fp32 fsdp.zero=1" "z2_fp32_2 2 fp32 fsdp.zero=2" "z3_fp32_2 2 fp32 fsdp.zero=3"
  "z1_bf16_2 2 bf16 fsdp.zero=1" "z2_bf16_2 2 bf16 fsdp.zero=2" "z3_bf16_2 2 bf16 fsdp.zero=3"
  "z1_fp32_4 4 fp32 fsdp.zero=1" "z2_fp32_4 4 fp32 fsdp.zero=2" "z3_fp32_4 4 fp32 fsdp.zero=3"
  "z1_bf16_4 4 bf16 fsdp.zero=1" "z2_bf16_4 4 bf16 fsdp.zero=2" "z3_bf16_4 4 bf16 fsdp.zero=3"
  "hsdp_fp32_4 4 fp32 mesh=dp_outer=2,dp_shard=2" "hsdp_bf16_4 4 bf16 mesh=dp_outer=2,dp_shard=2"
  "hfsdp_fp32_4 4 fp32 mesh=dp_outer=2,dp_shard=2 fsdp.hfsdp=true"
  "prefetch0_2 2 fp32 fsdp.prefetch=0" "prefetch2_4 4 fp32 fsdp.prefetch=2"
  "live1_4 4 fp32 fsdp.prefetch=2 fsdp.max_live_units=1"
  "ckfull_2 2 fp32 fsdp.checkpoint=full" "ck2_bf16_4 4 bf16 fsdp.checkpoint=2"
  "recompute_none_2 2 bf16 fsdp.recompute=none" "recompute_mlp_2 2 bf16 fsdp.recompute=mlp"
  "offload_2 2 fp32 fsdp.offload=true" "offload_params_2 2 fp32 fsdp.offload=params"
  "offload_all_2 2 fp32 fsdp.offload=all" "offload_z2_4 4 fp32 fsdp.zero=2 fsdp.offload=true"
  "accum_4 4 fp32 data.micro_batch=1" "accum_bf16_2 2 bf16 data.micro_batch=1"
  # planted: a job that differs must fail the comparison, or the bounds
  # catch nothing: fp32 with the learning rate 2% off or no weight decay,
  # bf16 with the learning rate 10% off (bf16's bound lets weight decay off
  # pass over 30 steps: 8.3e-4 on the loss)
  "planted_lr_2 2 fp32 optimizer.lr=1.02e-3" "planted_wd_4 4 fp32 optimizer.weight_decay=0"
  "planted_lr_bf16_2 2 bf16 optimizer.lr=1.1e-3"
)
want=" ${MULTIRANK_CASES:-} "
in_row=0
for c in "${cases[@]}"; do
  set -- $c
  name=$1 n=$2 dtype=$3
  shift 3
  [ "$want" != "  " ] && [ "${want/ $name /}" = "$want" ] && continue
  tol=$([ "$dtype" = bf16 ] && echo 1e-2 || echo 1e-4)
  if [ "$mode" = gpu ]; then
    ref "gpu1_$dtype" 1 cuda "$dtype"
    ref "cpu${n}_$dtype" "$n" cpu "$dtype"
    run "$name" "$n" cuda fsdp.param_dtype="$dtype" "$@"
  else
    ref "cpu1_$dtype" 1 cpu "$dtype"
    run "$name" "$n" cpu fsdp.param_dtype="$dtype" "$@"
  fi
  if [ $rc != 0 ]; then
    bad "$name ($n ranks, $dtype, $*): status $rc after $secs s: $(grep -v '^\[[0-9]*\] step' "$work/$name.log" | tail -3 | tr '\n' ' ')"
    in_row=$((in_row + 1))
    if [ "$mode" = gpu ] && [ $in_row = 3 ]; then
      # the same cause each time, most likely: say what NCCL says, and stop
      # spending the GPU's minutes on it
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV run nccl_debug 2 cuda fsdp.param_dtype=fp32 train.steps=2
      broken=1
      bad "3 cases failed in a row: the matrix stops; NCCL_DEBUG=INFO of a 2-rank job (status $rc) in $work/nccl_debug.log"
      grep -E 'NCCL (WARN|INFO) (Using|NET|Bootstrap|Channel|comm|init|Duplicate)|WARN|rror' "$work/nccl_debug.log" | head -30
      break
    fi
    continue
  fi
  in_row=0
  detail="" good=1
  if [ "$mode" = gpu ]; then
    line=$(against "$name" "gpu1_$dtype" "$tol") || good=0
    detail="$line; "
    line=$(against "$name" "cpu${n}_$dtype" "$tol") || good=0
    detail="$detail$line; "
    line=$(memory_line "$work/$name.log") || good=0
    detail="$detail$line"
  else
    line=$(against "$name" "cpu1_$dtype" "$tol") || good=0
    detail=$line
  fi
  label="$name ($n ranks, $dtype, $*; bound $tol; $secs s): $detail"
  if [ "${name#planted_}" != "$name" ]; then
    label="planted mistake caught: $label"
    good=$((1 - good))
  fi
  if [ $good = 1 ]; then ok "$label"; else bad "$label"; fi
done

if [ "$mode" = gpu ] && [ -z "${MULTIRANK_CASES:-}" ] && [ -z "${broken:-}" ]; then
  # ---- checkpoints across GPU worlds: 15 steps on 4 ranks at ZeRO 3, then
  # the rest on 4 (bit for bit), 2 and 1 GPU ranks and 2 CPU ranks
  # (within the fp32 bound), each from its own copy of the checkpoint
  rm -rf "$work/ck" "$work/ck_killed" "$work/export4"
  run ck_save 4 cuda fsdp.zero=3 checkpoint.dir="$work/ck" checkpoint.every=15 train.stop_after=15 \
    checkpoint.export_hf="$work/export4"
  check "checkpoint: 15 steps on 4 GPU ranks saved (status $rc, $secs s)" "[ $rc = 0 ] && [ -d '$work/ck' ]"
  for to in "4 cuda 0" "2 cuda 1e-4" "1 cuda 1e-4" "2 cpu 1e-4"; do
    set -- $to
    name=ck_resume_$1_$2
    rm -rf "$work/$name.ck"
    cp -r "$work/ck" "$work/$name.ck"
    cp "$work/ck_save.jsonl" "$work/$name.jsonl"
    run "$name" "$1" "$2" fsdp.zero=3 checkpoint.dir="$work/$name.ck" train.resume=auto
    if [ $rc != 0 ]; then
      bad "checkpoint from 4 GPU ranks resumed on $1 $2 rank(s): status $rc: $(tail -2 "$work/$name.log" | tr '\n' ' ')"
      continue
    fi
    line=$(against "$name" z3_fp32_4 "$3")
    check "checkpoint from 4 GPU ranks resumed on $1 $2 rank(s), against the uninterrupted run (bound $3): $line" "[ $? = 0 ]"
  done
  # ---- a rank SIGKILLed at the start of step 10, --max-restarts 1: the
  # job resumes from step 5's checkpoint and ends as the uninterrupted one
  launch_opts=(--max-restarts 1)
  FSDP_TEST_KILL_AT=0:2:10 FSDPRUN_RESTART_BACKOFF=0.1 run killed 4 cuda fsdp.zero=3 checkpoint.dir="$work/ck_killed" \
    checkpoint.every=5
  launch_opts=()
  line=$(against killed z3_fp32_4 0)
  check "rank 2 of 4 GPU ranks killed at step 10, --max-restarts 1: status $rc in $secs s, bit for bit: $line" \
    "[ $rc = 0 ] && grep -q 'restart 1 of 1' '$work/killed.log' && grep -q 'loss 0.0e+00 at step [0-9]*, grad_norm 0.0e+00' <<<'$line'"
  # ---- a rank killed with no restarts: the job ends, naming it, quickly
  FSDP_TEST_KILL_AT=0:1:10 run killed_norestart 4 cuda fsdp.zero=3
  check "rank 1 of 4 GPU ranks killed at step 10: the job fails (status $rc) in $secs s, naming rank 1" \
    "[ $rc != 0 ] && grep -q 'rank 1 was killed by signal 9' '$work/killed_norestart.log'"
  # ---- a rank stopped (SIGSTOP) at step 10: alive, silent, its peers
  # waiting in NCCL; fsdprun --heartbeat-timeout 3 ends the job, naming it
  launch_opts=(--heartbeat-timeout 3 --grace 2)
  FSDP_TEST_STALL=1:10:stop run stopped 4 cuda fsdp.zero=3
  launch_opts=()
  check "rank 1 of 4 GPU ranks stopped (SIGSTOP) at step 10: the job ends (status $rc) in $secs s, naming it alone" \
    "[ $rc = 1 ] && grep -Eq '^fsdprun: rank 1 sent no heartbeat for [0-9]+ s \(last at step 10\)' '$work/stopped.log' &&
     [ \$(grep -c 'sent no heartbeat' '$work/stopped.log') = 1 ]"
  # ---- one 4-rank step's timeline (train.profile): the overlap
  run profile4 4 cuda fsdp.zero=3 train.steps=4 train.profile="$work/profile4.json"
  check "a 4-rank step's timeline (status $rc): $(grep -h 'profile:' "$work/profile4.log" | head -3 | tr '\n' ' ')" "[ $rc = 0 ]"
  # ---- the live REPL on a 2-rank GPU mesh: what each rank holds, as the
  # same session on 2 CPU ranks shows it (the layout is the device's no
  # matter: the same ranges, the same values at step 2)
  for dev in cpu cuda; do
    share=()
    [ $dev = cuda ] && share=(--ranks-per-gpu 2)
    printf 'units()\nshard(0, "model.norm.weight")\nshard(1, "model.norm.weight")\nshard(1, "model.layers.3.mlp.down_proj.weight")\nmem(1)\n' |
      timeout 120 "$fsdprun" -n 2 "${share[@]}" --repl "$work/fixed.lua" $common train.device=$dev train.steps=2 \
        >"$work/repl2_$dev.log" 2>&1
    grep -E '^rank [01] holds' "$work/repl2_$dev.log" >"$work/repl2_$dev.holds"
  done
  check "REPL on 2 GPU ranks: the shards each rank holds, as on 2 CPU ranks ($(wc -l <"$work/repl2_cuda.holds") lines)" \
    "[ -s '$work/repl2_cpu.holds' ] && cmp -s '$work/repl2_cpu.holds' '$work/repl2_cuda.holds'"
fi
finish "multirank ($mode)"

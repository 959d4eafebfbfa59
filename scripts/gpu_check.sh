#!/usr/bin/env bash
# Runs the GPU checks on a machine with a GPU, from a build made elsewhere
# and carried along (scripts/gpu_bundle.sh makes build-gpu/ and .devlibs/:
# libfsdp.so and the CUDA backend libfsdp_cuda.so side by side):
#   [GPU_CHECK_STAGES="tests train vs_fsdp2 ..."] scripts/gpu_check.sh [BUILD_DIR] [OUT_DIR]
#   scripts/gpu_check.sh --help   this text (nothing run)
# Stages, run in the order GPU_CHECK_STAGES lists them (a lent GPU has
# minutes: put first what must not be missed); each stage's wall time and
# status go to OUT/stages.txt as it ends, so a run cut off still says how
# far it got:
#   tests       test_cuda, test_kernels
#   docs        test_kernels docs alone (seconds): packed rows, the _docs attention
#               and rope_*_at kernels against their CPU twins (tests runs them too;
#               this is for a session that checks only them); skipped, status 0,
#               without test_kernels or a GPU
#   post        post-training on the GPU (issue 47): tests/lua/test_cuda_engine.lua (packed
#               rows and the engine's log-probs against the CPU, a GRPO step against the
#               cross-entropy's, offload / onload by cudaMemGetInfo) and bench/phase_offload.lua
#               (the time of each move of a 1B-shaped state against a device-to-host copy)
#   tp_cp       tensor and context parallelism on GPU ranks (issue 46): test_kernels vocab (the
#               vocab-parallel embedding and cross-entropy kernels against their CPU ops), then
#               tests/scripts/test_cuda_tp.sh: tests/lua/test_cuda_tp.lua on 2 ranks
#               (tp 2, cp 2) and 4 (cp 2 x tp 2) sharing the GPU (fsdprun --ranks-per-gpu), each
#               against one GPU rank (fp32: 10 steps' losses and grad norms within 1e-5; bf16
#               losses within 3e-2); test_kernels stopped after 30 s, each job after 120 s, the
#               two jobs after 270 s: the stage ends within 300 s
#   cp_attention (with GPU_CHECK_BENCH=1) context parallelism's two attentions timed side by
#               side on 2 GPU ranks sharing the GPU (issue 46): bench/parallel_layouts.lua
#               device=cuda at cp 2, seq 16384, 2 layers, ring and all-gather in both orders
#               (bench/RESULTS.md has the CPU ranks' figures); stopped after 240 s
#   tp_overlap  (with GPU_CHECK_BENCH=1) tp 2 on 2 GPU ranks sharing the GPU with the backward's
#               reduce-scatters overlapped with the weight gradients and without (train.tp_overlap,
#               issue 46): bench/parallel_layouts.lua device=cuda seq 8192, 4 layers, both
#               orders; stopped after 150 s
#   multirank   2 and 4 GPU ranks on the GPU at hand (fsdprun --ranks-per-gpu):
#               the matrix of scripts/multirank_check.sh against 1 GPU rank and
#               CPU ranks, checkpoints across worlds, a killed rank, the REPL
#   train       test_cuda_train (the Llama model on the GPU against the CPU ops)
#   generate    fsdp generate on the GPU (fp32, bf16) against the CPU on the demo's
#               export: the same greedy tokens in fp32; tokens/s of each
#   planner     the planner's bytes against the GPU's allocator (test_planner.lua cuda)
#   demos       the demo recipe on the GPU (fp32, bf16) and on CPU ranks (TINY_STEPS, default 400)
#   repl        the live REPL on a GPU mesh
#   adamw       the optimizer-step benchmark (build/bench/bench_adamw)
#   kernels     each kernel against the GEMM and copy ceilings (bench_kernels)
#   offload     the demo with fsdp.offload = true, params, all
#   blas        OpenBLAS's threads on the host's CPU ranks: the size rule against one thread
#   vs_fsdp2    PyTorch FSDP2 against us on the 1B model (bench/llama_vs_fsdp2.sh; ours also
#               with fsdp.recompute=mlp)
#   vs_fsdp2_offload   the same for the 4.4B model, the optimizer offloaded
#   vs_peers    PyTorch FSDP2, Megatron-FSDP and DeepSpeed ZeRO-3 against us on the 1B
#               model, one table (bench/llama_vs_peer.sh; the peers' wheels from
#               .whl/peers, scripts/peer_wheels.sh, installed offline first)
#   vs_peers_offload   the 4.4B model, the optimizer offloaded: us against FSDP2's
#               CPUOffloadPolicy and DeepSpeed's ZeRO-Offload, GPU and host memory
#   timeline    one 1B step as a timeline (train.profile)
#   timeline4   one step of 4 GPU ranks on the GPU at hand (--ranks-per-gpu 4, NCCL over
#               sockets: slow collectives make overlap plain), zero 3 with and without
#               prefetch: the comm track and the share of it hidden behind compute
#   offload_probe      the 4.4B model, param shards offloaded: start-up and 3 steps
#   attention   our attention kernels vs SDPA's cuDNN and flash backends (bench/attention_vs_torch.py)
#   collectives the collective benchmarks and the multi-rank CPU tests
#   host_cpu    the GPU machine's host CPU (issue 38: an Intel Xeon where the suite's
#               machines are AMD): the clock and FLOPs per cycle against each other
#               (bench/cpu_clock.lua), test_peak, OpenBLAS's kernels (test_blas_core),
#               GEMMs against the core's peak on 1 core and all, the demo's first lines
#   host_suite  the whole CPU suite on the host's CPU (scripts/host_suite.sh build-host: carry
#               build-host/, which scripts/gpu_bundle.sh makes)
# GPU_CHECK_STAGE_LIMIT=S stops a stage that runs past S seconds (below).
# Without GPU_CHECK_STAGES: tests post tp_cp multirank train generate planner demos repl adamw
# kernels offload, then with GPU_CHECK_BENCH=1 cp_attention tp_overlap blas vs_fsdp2 vs_fsdp2_offload
# timeline offload_probe attention, then with GPU_CHECK_COLLECTIVES=1
# collectives.
# Libraries the GPU machine lacks (PMIx, LuaJIT, ...) may sit in .devlibs/;
# NCCL is taken from the system or from Python's nvidia-nccl package.
set -uo pipefail
if [ "${1:-}" = --help ]; then # the stages and options above, nothing run
  sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
build=${1:-build}
export FSDPRUN_OVERSUBSCRIBE=1 # CPU checks run more ranks than the one GPU (fsdprun counts GPUs as slots)
out=${2:-${OUT:-/tmp/fsdp-gpu}}
mkdir -p "$out"
bash scripts/gpu_unpack.sh # the folders below, where only gpu_bundle.sh's pack was carried
. scripts/gpu_env.sh "$build"
if [ ! -f "$build/libfsdp_cuda.so" ]; then
  echo "gpu_check: $build/libfsdp_cuda.so is missing: the CUDA backend, built beside libfsdp.so by a CUDA build" >&2
  exit 2
fi
status=0
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "NCCL from: $nccl_dir"
} | tee "$out/machine.txt"

stage_tests() {
  local rc=0
  echo "== test_cuda" | tee "$out/test_cuda.log"
  "$build/tests/test_cuda" 2>&1 | tee -a "$out/test_cuda.log" || rc=1
  echo "== test_kernels" | tee "$out/test_kernels.log"
  "$build/tests/test_kernels" 2>&1 | tee -a "$out/test_kernels.log" || rc=1
  return $rc
}

stage_docs() {
  local log="$out/test_kernels_docs.log" rc=0
  echo "== packed rows: attention_*_docs and rope_*_at against the CPU twins (test_kernels docs)" | tee "$log"
  if [ ! -x "$build/tests/test_kernels" ]; then
    echo "no $build/tests/test_kernels (a build without CUDA): skipped" | tee -a "$log"
    return 0
  fi
  "$build/tests/test_kernels" docs >>"$log" 2>&1 || rc=$?
  sed 1d "$log" | tail -20 # the test's own lines
  [ "$rc" = 77 ] && return 0 # no GPU here: it said so
  return "$rc"
}

stage_post() {
  local rc=0
  echo "== post-training on the GPU (tests/lua/test_cuda_engine.lua)" | tee "$out/post.log"
  "$build/fsdprun" -n 1 --host "$build/fsdp" tests/lua/test_cuda_engine.lua >>"$out/post.log" 2>&1 || rc=1
  echo "== phase offload of a 1B-shaped state (bench/phase_offload.lua device=cuda, fp32 and bf16)" | tee -a "$out/post.log"
  for d in fp32 bf16; do
    "$build/fsdprun" -n 1 --host "$build/fsdp" bench/phase_offload.lua device=cuda param_dtype=$d >>"$out/post.log" 2>&1 || rc=1
  done
  tail -20 "$out/post.log"
  return $rc
}

stage_tp_cp() {
  local log="$out/tp_cp.log" rc=0
  echo "== the vocab-parallel kernels against their CPU ops (test_kernels vocab)" | tee "$log"
  if [ -x "$build/tests/test_kernels" ]; then
    timeout 30 "$build/tests/test_kernels" vocab >>"$log" 2>&1 || rc=1
  else
    echo "no $build/tests/test_kernels: skipped" | tee -a "$log"
  fi
  echo "== tp 2, cp 2, cp 2 x tp 2 on GPU ranks sharing the GPU against one GPU rank (tests/scripts/test_cuda_tp.sh)" |
    tee -a "$log"
  timeout 270 bash tests/scripts/test_cuda_tp.sh "$build/fsdprun" "$PWD" 120 >>"$log" 2>&1 || rc=1
  grep -E "worst|passed|FAILED|skipped|stopped" "$log" | tail -30
  return $rc
}

# bench/parallel_layouts.lua on 2 GPU ranks sharing the GPU: NAME LIMIT_S TITLE ARGS...
# (its table to stdout, the log in OUT/NAME.log)
layouts_on_gpu() {
  local name=$1 limit=$2 title=$3
  shift 3
  echo "== $title (bench/parallel_layouts.lua)"
  timeout "$limit" "$build/fsdprun" -n 2 --ranks-per-gpu 2 --rank0-only --no-prefix --timeout 600 \
    bench/parallel_layouts.lua device=cuda "$@" >"$out/$name.log" 2>&1
  local rc=$?
  sed -n '/parallel_layouts:/,$p' "$out/$name.log"
  [ $rc = 0 ] || tail -20 "$out/$name.log"
  return $rc
}

stage_cp_attention() {
  layouts_on_gpu cp_attention 240 "cp 2 on 2 GPU ranks sharing the GPU: ring against all-gather attention" \
    seq=16384 layers=2 steps=3 \
    "layouts=dp_shard=1,cp=2+all_gather;dp_shard=1,cp=2+ring;dp_shard=1,cp=2+ring;dp_shard=1,cp=2+all_gather"
}

stage_tp_overlap() {
  layouts_on_gpu tp_overlap 150 \
    "tp 2 on 2 GPU ranks sharing the GPU: the backward's reduce-scatters overlapped and not (train.tp_overlap)" \
    seq=8192 layers=4 steps=3 "layouts=dp_shard=1,tp=2+serial;dp_shard=1,tp=2;dp_shard=1,tp=2;dp_shard=1,tp=2+serial"
}

stage_multirank() {
  echo "== several GPU ranks on this GPU (scripts/multirank_check.sh, fsdprun --ranks-per-gpu)"
  bash scripts/multirank_check.sh "$build" "$out" gpu 2>&1 | tee "$out/multirank.txt"
}

stage_train() {
  echo "== the Llama model trained on the GPU vs the CPU ops (tests/lua/test_cuda_train.lua)"
  "$build/fsdprun" -n 1 --host "$build/fsdp" tests/lua/test_cuda_train.lua 2>&1 | tee "$out/test_cuda_train.log"
}

stage_generate() {
  echo "== fsdp generate on the GPU against the CPU (the demo, 200 steps, exported in fp32)"
  local d="$out/generate" rc=0
  mkdir -p "$d"
  "$build/fsdprun" -n 1 --host "$build/fsdp" recipes/tiny.lua train.steps=200 train.eval_every=0 train.device=cpu \
    checkpoint.export_hf="$d/export" checkpoint.export_dtype=fp32 train.metrics="$d/m.jsonl" >"$d/train.log" 2>&1 || rc=1
  for dev in "cpu fp32" "cuda fp32" "cuda bf16"; do
    set -- $dev
    "$build/fsdp" generate "$d/export" --prompt "The shard" --max-new-tokens 64 --greedy --no-stop --print-ids \
      --device $1 --dtype $2 >"$d/$1-$2.out" 2>"$d/$1-$2.err" || rc=1
    echo "$1 $2: $(tail -1 "$d/$1-$2.err")"
  done | tee "$d/summary.txt"
  if [ "$(tail -1 "$d/cpu-fp32.out")" = "$(tail -1 "$d/cuda-fp32.out")" ]; then
    echo "generate: cuda fp32 greedy tokens equal the CPU's" | tee -a "$d/summary.txt"
  else
    echo "generate: FAILED: cuda fp32 greedy tokens differ from the CPU's" | tee -a "$d/summary.txt"
    rc=1
  fi
  return $rc
}

stage_planner() {
  echo "== the planner's bytes against the GPU's allocator (tests/lua/test_planner.lua cuda)"
  "$build/fsdprun" -n 1 --host "$build/fsdp" tests/lua/test_planner.lua . cuda 2>&1 | tee "$out/test_planner_cuda.log"
}

stage_demos() {
  local rc=0 run
  echo "== the demo recipe on one GPU (fp32, then bf16) and on CPU ranks of this machine, same global batch"
  for run in "cuda fp32 1" "cuda bf16 1" "cpu fp32 1"; do
    set -- $run
    "$build/fsdprun" -n "$3" --rank0-only --host "$build/fsdp" recipes/tiny.lua train.device="$1" fsdp.param_dtype="$2" \
      train.steps="$steps" train.log_every=50 train.metrics="$out/tiny_$1_$2.jsonl" 2>&1 | tee "$out/tiny_$1_$2.log" || rc=1
  done
  return $rc
}

stage_repl() {
  echo "== the live REPL on a GPU mesh (its sums go through the device)" | tee "$out/repl_cuda.log"
  printf 'units()\nshard(0, "model.norm.weight")\nmem(0)\n' | timeout 120 "$build/fsdprun" -n 1 --repl --host "$build/fsdp" \
    recipes/tiny.lua train.device=cuda train.steps=2 2>&1 | tee -a "$out/repl_cuda.log"
  grep -q "rank 0 holds model.norm.weight elements \[0, 128)" "$out/repl_cuda.log" || { echo "FAILED: repl on cuda"; return 1; }
}

stage_adamw() {
  echo "== the optimizer step: plain loop, CPU threads, CUDA kernel (bench/bench_adamw.c)" | tee "$out/bench_adamw.log"
  [ -x "$build/bench/bench_adamw" ] || { echo "no $build/bench/bench_adamw"; return 1; }
  "$build/bench/bench_adamw" 67108864 5 2>&1 | tee -a "$out/bench_adamw.log"
}

stage_kernels() {
  echo "== each CUDA kernel vs the GPU's GEMM and copy ceilings (bench/bench_kernels.c)" | tee "$out/bench_kernels.log"
  [ -x "$build/bench/bench_kernels" ] || { echo "no $build/bench/bench_kernels"; return 1; }
  "$build/bench/bench_kernels" 4096 10 2>&1 | tee -a "$out/bench_kernels.log"
}

stage_offload() {
  local rc=0 o
  echo "== the demo recipe on one GPU with the optimizer offloaded, then the param shards, then grads too (fsdp.offload)"
  for o in true params all; do
    timeout 300 "$build/fsdprun" -n 1 --rank0-only --host "$build/fsdp" recipes/tiny.lua train.device=cuda fsdp.offload=$o \
      train.steps="$steps" train.log_every=50 train.metrics="$out/tiny_cuda_offload_$o.jsonl" 2>&1 |
      tee "$out/tiny_cuda_offload_$o.log" || rc=1
  done
  return $rc
}

stage_blas() {
  local n t line
  echo "== OpenBLAS threads on this host's CPU ranks: the size rule against one thread, 1 and 2 ranks (src/ops/blas_threads.c)" |
    tee "$out/blas_threads.txt"
  for n in 1 2; do
    for t in rule 1; do
      line=$( [ $t = rule ] && unset FSDP_BLAS_THREADS || export FSDP_BLAS_THREADS=1
        "$build/fsdprun" -n $n --rank0-only --host "$build/fsdp" recipes/tiny.lua train.device=cpu train.steps=40 \
          train.log_every=40 train.eval_every=0 2>&1 | grep "done:")
      echo "$n rank(s), BLAS threads: $t: $line" | tee -a "$out/blas_threads.txt"
    done
  done
}

stage_vs_fsdp2() {
  echo "== this engine vs PyTorch FSDP2: the 1B model (ours also with fsdp.recompute=mlp, and with each unit's step at its next use: fsdp.overlap_step=true)"
  OUT="$out" OURS_ALSO="fsdp.recompute=mlp; fsdp.overlap_step=true" bash bench/llama_vs_fsdp2.sh "$build" 8 2>&1 | tail -10 | tee "$out/vs_fsdp2.txt"
}

stage_vs_fsdp2_offload() {
  echo "== this engine vs PyTorch FSDP2: the 4.4B model with the optimizer offloaded"
  OUT="$out" bash bench/llama_vs_fsdp2.sh "$build" 6 --offload 2>&1 | tail -6 | tee "$out/vs_fsdp2_offload.txt"
}

# the driver writes its table to OUT/table_NAME.txt; a peer that could not
# run is a line of that table and exit status 3
vs_peers() {
  local name=$1 rc=0
  shift
  OUT="$out" bash bench/llama_vs_peer.sh "$build" "$@" >"$out/vs_peers_$name.log" 2>&1 || rc=$?
  if [ -f "$out/table_$name.txt" ]; then cat "$out/table_$name.txt"; else tail -20 "$out/vs_peers_$name.log"; fi
  return $rc
}

stage_vs_peers() {
  echo "== this engine vs PyTorch FSDP2, Megatron-FSDP and DeepSpeed ZeRO-3: the 1B model (ours also with fsdp.overlap_step=true)"
  OURS_ALSO="fsdp.overlap_step=true" vs_peers llama1b 8 | tee "$out/vs_peers.txt"
}

stage_vs_peers_offload() {
  echo "== this engine vs FSDP2 CPUOffloadPolicy and DeepSpeed ZeRO-Offload: the 4.4B model, the optimizer on the host"
  vs_peers llama4b_offload 6 --offload | tee "$out/vs_peers_offload.txt"
}

stage_timeline() {
  echo "== one step of the 1B model as a timeline (train.profile: where the device waits for the host)"
  "$build/fsdprun" -n 1 --rank0-only --host "$build/fsdp" bench/llama1b.lua train.steps=3 train.profile="$out/profile_llama1b.json" \
    2>&1 | grep "profile:" | tee "$out/profile_llama1b.txt"
}

stage_timeline4() {
  echo "== 4 GPU ranks on one GPU: one step's timeline, the communication hidden behind compute (prefetch 1, then 0)"
  for pf in 1 0; do
    "$build/fsdprun" -n 4 --ranks-per-gpu 4 --rank0-only --host "$build/fsdp" recipes/tiny.lua train.device=cuda \
      train.steps=3 train.eval_every=0 fsdp.zero=3 fsdp.prefetch=$pf train.profile="$out/profile_4ranks_prefetch$pf.json" \
      2>&1 | grep "profile: \(phases\|the comm\)" | sed "s/^/prefetch $pf: /" | tee -a "$out/timeline4.txt"
  done
}

stage_offload_probe() {
  echo "== the 4.4B model with the param shards offloaded: start-up and 3 steps, stacks if no step comes (bench/offload_stall_probe.sh)"
  bash bench/offload_stall_probe.sh "$build" "$out" params 2>&1 | tail -4 | tee "$out/offload_params_probe.txt"
}

stage_attention() {
  echo "== our attention kernels vs PyTorch SDPA's cuDNN and flash backends (bench/attention_vs_torch.py)"
  python3 bench/attention_vs_torch.py "$build" 2>&1 | tee "$out/attention_vs_torch.txt"
}

stage_collectives() {
  local rc=0 dt n
  for dt in fp32 bf16; do
    echo "== bench_collectives --device cuda --dtype $dt (1 rank)"
    "$build/fsdprun" -n 1 --no-prefix --host "$build/bench/bench_collectives" --device cuda --dtype $dt \
      2>&1 | tee "$out/bench_cuda_$dt.txt" || rc=1
  done
  echo "== CPU shared-memory collectives on this machine: 4 and 8 ranks"
  for n in 4 8; do
    "$build/fsdprun" -n $n --no-prefix --host "$build/bench/bench_collectives" --max 67108864 \
      2>&1 | tee "$out/bench_shm_np$n.txt" || rc=1
  done
  echo "== test_collectives, 4 ranks"
  "$build/fsdprun" -n 4 --rank0-only --host "$build/tests/test_collectives" 2>&1 | tail -3 | tee "$out/test_collectives.log" || rc=1
  echo "== units and fully_shard parity, 4 ranks"
  "$build/fsdprun" -n 4 --rank0-only --host "$build/tests/test_units" 2>&1 | tail -2 | tee "$out/test_units.log" || rc=1
  "$build/fsdprun" -n 4 --rank0-only --host "$build/fsdp" tests/lua/test_fully_shard.lua 2>&1 | tail -2 | tee "$out/test_fully_shard.log" || rc=1
  return $rc
}

stage_host_cpu() {
  local d="$out/host_cpu" rc=0
  mkdir -p "$d"
  echo "== the host's CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2-)"
  { lscpu; grep -m1 '^flags' /proc/cpuinfo; env | grep '^OPENBLAS' || true; } >"$d/lscpu.txt" 2>&1
  "$build/fsdp" bench/cpu_clock.lua 9 2>&1 | tee "$d/cpu_clock.txt" || rc=1
  "$build/fsdp" tests/lua/test_peak.lua 2>&1 | tail -4 | tee "$d/test_peak.txt" || rc=1
  bash tests/scripts/test_blas_core.sh "$build/fsdp" 2>&1 | tail -4 | tee "$d/test_blas_core.txt" || rc=1
  FSDP_BLAS_THREADS=1 "$build/fsdp" bench/gemm_peak.lua 2>&1 | tee "$d/gemm_peak_1.txt" || rc=1
  "$build/fsdp" bench/gemm_peak.lua 2>&1 | tee "$d/gemm_peak_all.txt" || rc=1
  OPENBLAS_VERBOSE=2 "$build/fsdprun" -n 2 --host "$build/fsdp" recipes/tiny.lua train.steps=20 train.eval_every=0 \
    train.device=cpu 2>&1 | head -10 | tee "$d/demo.txt"
  return $rc
}

stage_host_suite() {
  echo "== the CPU suite on the host's CPU (scripts/host_suite.sh build-host)"
  bash scripts/host_suite.sh build-host "$out/host_suite" 2>&1 | tail -40
  return "${PIPESTATUS[0]}"
}

steps=${TINY_STEPS:-400}
stages=${GPU_CHECK_STAGES:-}
if [ -z "$stages" ]; then
  stages="tests post tp_cp multirank train generate planner demos repl adamw kernels offload"
  [ "${GPU_CHECK_BENCH:-0}" = 1 ] && stages="$stages cp_attention tp_overlap blas vs_fsdp2 vs_fsdp2_offload timeline offload_probe attention"
  [ "${GPU_CHECK_COLLECTIVES:-0}" = 1 ] && stages="$stages collectives"
fi
for st in $stages; do
  if ! declare -F "stage_$st" >/dev/null; then
    echo "gpu_check: no stage '$st' (see the list at the top of scripts/gpu_check.sh)" >&2
    exit 2
  fi
done
# GPU_CHECK_STAGE_LIMIT=S: a stage still running after S seconds is
# stopped, its whole process group (status 124), and the next one starts:
# one hang (the bounded waits have never run on a GPU) must not spend the
# lease. 0 or unset: no limit.
stage_limit=${GPU_CHECK_STAGE_LIMIT:-0}
run_stage() {
  if [ "$stage_limit" -le 0 ]; then
    "stage_$1"
    return
  fi
  local pid dog rc
  set -m # each its own process group, so a stop reaches every process the stage started
  ("stage_$1") &
  pid=$!
  (exec >/dev/null 2>&1; sleep "$stage_limit"; kill -TERM -- "-$pid"; sleep 5; kill -KILL -- "-$pid") &
  dog=$!
  set +m
  wait "$pid"
  rc=$?
  kill -- "-$dog" 2>/dev/null
  wait "$dog" 2>/dev/null
  if [ "$rc" -ge 128 ]; then
    echo "gpu_check: stage $1 stopped after its $stage_limit s (GPU_CHECK_STAGE_LIMIT)"
    rc=124
  fi
  return "$rc"
}
echo "stage seconds status" > "$out/stages.txt"
for st in $stages; do
  t0=$(date +%s)
  run_stage "$st"
  rc=$?
  [ $rc = 0 ] || status=1
  echo "$st $(( $(date +%s) - t0 )) $rc" | tee -a "$out/stages.txt"
done
exit $status

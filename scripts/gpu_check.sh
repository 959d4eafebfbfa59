#!/usr/bin/env bash
# Runs the GPU checks and benchmarks on a machine with a GPU, from a build
# made elsewhere (scripts/build.sh) and carried along:
#   scripts/gpu_check.sh [BUILD_DIR] [OUT_DIR]
# Libraries the GPU machine lacks (PMIx, LuaJIT, ...) may sit in .devlibs/;
# NCCL is taken from the system or from Python's nvidia-nccl package.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-${OUT:-/tmp/fsdp-gpu}}
mkdir -p "$out"
nccl_dir=$(dirname "$(ldconfig -p | awk '/libnccl.so.2/ {print $NF; exit}')" 2>/dev/null)
if [ -z "$nccl_dir" ] || [ "$nccl_dir" = . ]; then
  nccl_dir=$(dirname "$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)")
fi
export LD_LIBRARY_PATH="$PWD/$build:$PWD/.devlibs:$nccl_dir:${LD_LIBRARY_PATH:-}"
# the GPU machine may have another PMIx whose plugins do not load into ours
export PMIX_MCA_mca_base_component_show_load_errors=0
export FSDP_LIB="$PWD/$build/libfsdp.so" FSDP_HEADER="$PWD/src/fsdp.h" FSDP_LUA_PATH="$PWD/lua"
status=0
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "NCCL from: $nccl_dir"
} | tee "$out/machine.txt"

echo "== test_cuda" | tee "$out/test_cuda.log"
"$build/tests/test_cuda" 2>&1 | tee -a "$out/test_cuda.log" || status=1

for dt in fp32 bf16; do
  echo "== bench_collectives --device cuda --dtype $dt (1 rank)"
  "$build/fsdprun" -n 1 --no-prefix --host "$build/bench/bench_collectives" --device cuda --dtype $dt \
    2>&1 | tee "$out/bench_cuda_$dt.txt" || status=1
done
echo "== CPU shared-memory collectives on this machine: 4 and 8 ranks"
for n in 4 8; do
  "$build/fsdprun" -n $n --no-prefix --host "$build/bench/bench_collectives" --max 67108864 \
    2>&1 | tee "$out/bench_shm_np$n.txt" || status=1
done
echo "== test_collectives, 4 ranks"
"$build/fsdprun" -n 4 --rank0-only --host "$build/tests/test_collectives" 2>&1 | tail -3 | tee "$out/test_collectives.log" || status=1
echo "== units and fully_shard parity, 4 ranks"
"$build/fsdprun" -n 4 --rank0-only --host "$build/tests/test_units" 2>&1 | tail -2 | tee "$out/test_units.log" || status=1
"$build/fsdprun" -n 4 --rank0-only --host "$build/fsdp" tests/lua/test_fully_shard.lua 2>&1 | tail -2 | tee "$out/test_fully_shard.log" || status=1
echo "== demo through the Lua host"
"$build/fsdprun" -n 4 --host "$build/fsdp" recipes/demo_collectives.lua 2>&1 | tee "$out/demo.log" || status=1
exit $status

#!/usr/bin/env bash
# test_cuda_tp.sh FSDPRUN ROOT [SECONDS]: tensor and context parallelism on
# GPU ranks (tests/lua/test_cuda_tp.lua) at 2 ranks (tp 2, then cp 2) and
# at 4 (cp 2 x tp 2), each job's ranks sharing this machine's GPU
# (fsdprun --ranks-per-gpu: NCCL over sockets between them), each against
# one GPU rank. Exits 77 (skipped) where no GPU shows (fsdprun's test mode
# needs one) or the test itself finds no usable CUDA device; each job has
# SECONDS (default 150) before fsdprun stops it. ctest's lua_cuda_tp and
# scripts/gpu_check.sh's stage tp_cp run it.
set -u
fsdprun=$1 root=$2 limit=${3:-150}
if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  echo "test_cuda_tp: no GPU here (/dev/nvidiaN); skipped"
  exit 77
fi
rc=0
for n in 2 4; do
  echo "== test_cuda_tp.lua on $n GPU ranks sharing the GPU"
  "$fsdprun" -n $n --ranks-per-gpu $n --rank0-only --timeout "$limit" "$root/tests/lua/test_cuda_tp.lua"
  r=$?
  [ $r = 77 ] && exit 77 # (no usable CUDA device: it said so)
  [ $r = 0 ] || rc=1
done
exit $rc

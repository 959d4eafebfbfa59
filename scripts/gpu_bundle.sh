#!/usr/bin/env bash
# Prepares what a lent GPU machine runs (scripts/gpu_check.sh build-gpu OUT),
# on a machine without a GPU but with the CUDA toolkit:
#   scripts/gpu_bundle.sh [ARCHS]      (default 90: H100 and H200)
# builds .devbuild/ (RelWithDebInfo, the CUDA backend, warnings as errors),
# copies the engine, the launcher, the GPU tests and benchmarks into
# build-gpu/ (debug info stripped, symbols kept for stacks), and the shared
# libraries the GPU image lacks (PMIx, LuaJIT, OpenBLAS, ...) into .devlibs/
# (scripts/gpu_env.sh puts them on the loader's path there). Both folders are
# git-ignored; carry them: carry = ["build-gpu", ".devlibs", ".whl/peers"],
# the last the peers' wheels for bench/llama_vs_peer.sh (scripts/peer_wheels.sh,
# fetched here when missing). Prints their size: the device tool takes at
# most 64 MiB with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
archs=${1:-90}
scripts/setup.sh
if [ ! -f .devbuild/build.ninja ]; then
  cmake -S . -B .devbuild -G Ninja -DFSDP_CUDA=ON -DFSDP_CUDA_ARCHS="$archs" -DFSDP_WERROR=ON >/dev/null
else
  cmake .devbuild -DFSDP_CUDA_ARCHS="$archs" >/dev/null
fi
cmake --build .devbuild -- -j"$(nproc)"
rm -rf build-gpu .devlibs
mkdir -p build-gpu/tests build-gpu/bench .devlibs
cp .devbuild/libfsdp.so .devbuild/libfsdp_cuda.so .devbuild/fsdp .devbuild/fsdprun build-gpu/
for t in test_cuda test_kernels test_attention test_attention_choice; do
  [ -f ".devbuild/tests/$t" ] && cp ".devbuild/tests/$t" build-gpu/tests/
done
cp .devbuild/bench/bench_* build-gpu/bench/
strip --strip-debug build-gpu/*.so build-gpu/fsdp build-gpu/fsdprun build-gpu/tests/* build-gpu/bench/*
# build-host/: the whole CPU suite, for the GPU machine's host CPU (an Intel
# Xeon, where the suite's own machines are AMD: issue 38), run there by
# scripts/host_suite.sh (gpu_check's stage host_suite). Configured in this
# checkout's path, which host_suite.sh links there; the tests' own objects
# and the debug info left out (a rebuild here makes them again).
if [ ! -f build-host/build.ninja ]; then
  cmake -S . -B build-host -G Ninja -DFSDP_CUDA=OFF -DFSDP_WERROR=ON >/dev/null
fi
cmake --build build-host -- -j"$(nproc)"
find build-host/tests/CMakeFiles -name '*.o' -delete
find build-host -type f \( -name '*.so' -o -perm -u+x \) -exec sh -c \
  'for f; do head -c 4 "$f" | grep -q ELF && strip --strip-debug "$f"; done' sh {} +
# every library these load, less what any Linux or CUDA machine has (libc,
# the compiler's runtime, the driver, CUDA's and NCCL's own): a newer
# libstdc++ from here would also shadow the one PyTorch needs there
for f in build-gpu/fsdp build-gpu/fsdprun build-gpu/*.so build-gpu/tests/* build-gpu/bench/* \
  $(find build-host -maxdepth 2 -type f -perm -u+x ! -name '*.sh'); do
  head -c 4 "$f" | grep -q ELF && LD_LIBRARY_PATH=build-gpu ldd "$f"
done | awk '/=>/ && $3 ~ /^\// {print $1, $3}' | sort -u |
  grep -v -E '^(libc\.|libm\.|libdl|libpthread|librt|ld-linux|libstdc\+\+|libgcc_s|libcuda\.|libnccl|libcublas|libcudnn|libcudart|libfsdp)' |
  while read -r name path; do cp -L "$path" ".devlibs/$name"; done
ls .whl/peers/*.whl >/dev/null 2>&1 || scripts/peer_wheels.sh .whl/peers >/dev/null
du -shc build-gpu .devlibs build-host .whl/peers
# all four in one xz pack (about 16 MiB): the device tool carries 64 MiB
# with the working tree, and the folders take 62; gpu_check.sh and
# host_suite.sh unpack it there (scripts/gpu_unpack.sh)
mkdir -p .devpack
rm -f .devpack/unpacked
tar -cf - build-gpu .devlibs build-host .whl/peers | xz -T0 -6 >.devpack/bundle.tar.xz
du -sh .devpack/bundle.tar.xz
# One device call of at most 600 s, each stage stopped at
# GPU_CHECK_STAGE_LIMIT: first what no GPU has run yet (the units' checked
# states and overlap_step in train, generate's CUDA path, the dry run's
# CUDA branches in planner, tp and cp on GPU ranks in tp_cp), the Intel
# host's CPU (issue 38: the only other vendor a session reaches), the
# 4-rank timeline (NCCL live, so every device wait goes through the
# bounded waits), the peers, the host's whole CPU suite, and last the
# multi-rank matrix (270 s on the H100; its fault cases at its end run the
# bounded waits' abort path), which a second call can take where the
# first ran out
echo "gpu_bundle: carry [\".devpack\"]; on the GPU machine, in one call (timeout_s 600):"
echo "  GPU_CHECK_STAGE_LIMIT=300 TINY_STEPS=100 GPU_CHECK_STAGES=\"tests train generate planner tp_cp host_cpu timeline4 \\"
echo "    vs_peers host_suite multirank vs_peers_offload\" bash scripts/gpu_check.sh build-gpu \$OUT"

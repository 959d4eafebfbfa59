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
# the stages in the order a lent GPU's few minutes should spend them: the
# code no GPU has run yet checked first (the units' checked states and
# overlap_step in train, the bounded device waits in multirank, the dry
# run's CUDA branches in planner), the host's CPU (issue 38: the only Intel
# host a session reaches), then the peers (their wheels installed
# offline from .whl/peers) and the timelines
echo "gpu_bundle: carry [\"build-gpu\", \".devlibs\", \"build-host\"] (the stages without the peers, host_suite"
echo "  among them) or [\"build-gpu\", \".devlibs\", \".whl/peers\"] (vs_peers, vs_peers_offload): 64 MiB in all"
echo "  with the working tree. On the GPU machine:"
echo "  1. GPU_CHECK_STAGES=\"tests train multirank planner host_cpu host_suite timeline4 generate\" \\"
echo "       TINY_STEPS=100 bash scripts/gpu_check.sh build-gpu \$OUT         (build-host carried)"
echo "  2. GPU_CHECK_STAGES=\"vs_peers vs_peers_offload kernels timeline adamw repl demos offload offload_probe\" \\"
echo "       TINY_STEPS=100 bash scripts/gpu_check.sh build-gpu \$OUT         (.whl/peers carried)"

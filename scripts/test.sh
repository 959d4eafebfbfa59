#!/usr/bin/env bash
# The README's second command (and CI's): installs what is missing, builds,
# and runs the whole suite twice: a normal build (with the CUDA backend when
# the toolkit is present; GPU tests skip without a GPU), then a build under
# AddressSanitizer + UndefinedBehaviorSanitizer. Between them it compiles
# the Release build type a user gets from `cmake -DCMAKE_BUILD_TYPE=Release`
# (-O3 finds warnings -O2 does not). Warnings are errors in all three
# (FSDP_WERROR=ON; a user's build leaves it off).
#   FSDP_TEST_SANITIZE=0 scripts/test.sh   skips the sanitizer pass
#   FSDP_TEST_RELEASE=0 scripts/test.sh    skips the Release compile
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

# mpirun, srun and prterun for tests/scripts/test_launchers.sh (skipped,
# saying so, where one cannot be installed)
scripts/setup_launchers.sh
# torch and transformers in the project's Python environment (.venv/), for
# the checks against Hugging Face's own code (test_hf_transformers: the
# export's logits, tokenizer and greedy generate); where it cannot be made
# they skip, saying so. FSDP_TEST_PYTHON set: that python instead.
if [ -z "${FSDP_TEST_PYTHON:-}" ]; then
  if py=$(scripts/python_env.sh --torch); then
    export FSDP_TEST_PYTHON=$py
  else
    echo "test: no torch environment; the checks against transformers will be skipped"
  fi
fi
echo "== build (build/)"
scripts/build.sh build -DFSDP_WERROR=ON
echo "== tests (build/)"
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "${FSDP_TEST_RELEASE:-1}" != 0 ]; then
  # the C engine at -O3 (GCC finds warnings there that -O2 does not); the
  # CUDA backend is compiled by the first build (users' builds do not treat
  # warnings as errors), so this one leaves it out and stays short
  echo "== build Release (build-release/, CPU backend, compiled only)"
  scripts/build.sh build-release -DFSDP_WERROR=ON -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=OFF
fi

if [ "${FSDP_TEST_SANITIZE:-1}" != 0 ]; then
  echo "== build with ASan + UBSan (build-asan/, CPU backend)"
  # The CUDA runtime and ASan do not mix well on machines without a GPU;
  # the CUDA code is compiled and linked by the first build.
  scripts/build.sh build-asan -DFSDP_WERROR=ON -DFSDP_SANITIZE=ON -DFSDP_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
  echo "== tests under ASan + UBSan (build-asan/)"
  # lsan.supp: allocations PMIx and LuaJIT keep for the process's life;
  # the comparisons with transformers ran in the first pass (numbers, not
  # memory: the engine code they cover runs under the sanitizers in test_hf)
  ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 \
  LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  FSDP_TEST_PYTHON=/nonexistent \
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
fi

#!/usr/bin/env bash
# The README's second command (and CI's): installs what is missing, builds,
# and runs the whole suite twice: a normal build (with the CUDA backend when
# the toolkit is present; GPU tests skip without a GPU), then a build under
# AddressSanitizer + UndefinedBehaviorSanitizer (the tests that exercise C
# code: tests/CMakeLists.txt). It also compiles the Release build type a
# user gets from `cmake -DCMAKE_BUILD_TYPE=Release` (-O3 finds warnings -O2
# does not). Warnings are errors in all three (FSDP_WERROR=ON; a user's
# build leaves it off). Tests run side by side, each taking the share of
# the cores it keeps busy (tests/costs.txt); the downloads only the tests
# need, and the Release and sanitizer builds, overlap the rest. It ends with
# one line per pass and the total time.
#   FSDP_TEST_SANITIZE=0 scripts/test.sh   skips the sanitizer pass
#   FSDP_TEST_RELEASE=0 scripts/test.sh    skips the Release compile
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# ctest's slots are quarter cores: each test's PROCESSORS says how many it
# keeps busy (tests/CMakeLists.txt, "scheduling")
slots=$((4 * jobs))
t_start=$SECONDS

# the Debian packages the build needs first (apt-get once at a time); then,
# while the engine compiles, what only the tests need, downloaded beside it:
# mpirun, srun and prterun for tests/scripts/test_launchers.sh (skipped,
# saying so, where one cannot be installed), and torch and transformers in
# the project's Python environment (.venv/) for the checks against Hugging
# Face's own code (test_hf_transformers: the export's logits, tokenizer and
# greedy generate; skipped, saying so, where it cannot be made).
# FSDP_TEST_PYTHON set: that python instead.
scripts/setup.sh
installs=$(mktemp -d)
trap 'rm -rf "$installs"' EXIT
(
  scripts/setup_launchers.sh >"$installs/launchers.log" 2>&1
  if [ -z "${FSDP_TEST_PYTHON:-}" ]; then
    scripts/python_env.sh --torch >"$installs/python" 2>"$installs/python.log" || rm -f "$installs/python"
  fi
) &
installer=$!
echo "== build (build/)"
scripts/build.sh build -DFSDP_WERROR=ON
wait $installer || true
cat "$installs/launchers.log" "$installs/python.log" 2>/dev/null || true # (no python.log: FSDP_TEST_PYTHON was given)
if [ -z "${FSDP_TEST_PYTHON:-}" ]; then
  if [ -s "$installs/python" ]; then
    FSDP_TEST_PYTHON=$(cat "$installs/python")
    export FSDP_TEST_PYTHON
  else
    echo "test: no torch environment; the checks against transformers will be skipped"
  fi
fi
# each pass's ctest line ("100% tests passed, 0 tests failed out of N")
# and its time, repeated at the end; a failing pass does not stop the next
summary=()
run_pass() { # name ctest-args...
  local name=$1 t0=$SECONDS rc=0 line
  shift
  ctest "$@" 2>&1 | tee "$installs/ctest.log" || rc=$?
  line=$(grep -E '^[0-9]+% tests passed' "$installs/ctest.log" | tail -1)
  [ -n "$line" ] || { line="ctest did not finish (status $rc)"; [ $rc != 0 ] || rc=1; }
  summary+=("$name: ${line}, $((SECONDS - t0)) s")
  return $rc
}
status=0
# The Release and sanitizer builds compile at the lowest priority while the
# first pass runs: they take the cores only when its tests leave them idle
# (tests that mostly wait: timeouts, restarts, signals).
#  - Release: the C engine at -O3 (GCC finds warnings there that -O2 does
#    not); the CUDA backend is compiled by the first build (users' builds
#    do not treat warnings as errors), so this one leaves it out.
#  - ASan + UBSan: the CPU backend (the CUDA runtime and ASan do not mix
#    well on machines without a GPU; the first build compiles and links
#    the CUDA code).
later=()
[ "${FSDP_TEST_RELEASE:-1}" != 0 ] &&
  later+=("release|build-release (Release, CPU backend, compiled only)|-DFSDP_WERROR=ON -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=OFF")
[ "${FSDP_TEST_SANITIZE:-1}" != 0 ] &&
  later+=("asan|build-asan (ASan + UBSan, CPU backend)|-DFSDP_WERROR=ON -DFSDP_SANITIZE=ON -DFSDP_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug")
(
  for b in "${later[@]}"; do
    IFS='|' read -r tag what opts <<<"$b"
    # shellcheck disable=SC2086
    if nice -n 19 scripts/build.sh "build-$tag" $opts >"$installs/build-$tag.log" 2>&1; then
      touch "$installs/build-$tag.ok"
    fi
  done
) &
builder=$!
echo "== tests (build/, $((SECONDS - t_start)) s so far; ${#later[@]} more builds at low priority beside them)"
run_pass "tests" --test-dir build --output-on-failure -j"$slots" || status=1
wait $builder || true
for b in "${later[@]}"; do
  IFS='|' read -r tag what opts <<<"$b"
  echo "== build $what"
  if [ -f "$installs/build-$tag.ok" ]; then
    echo "built (warnings are errors: none)"
  else
    cat "$installs/build-$tag.log"
    echo "test: the build $what FAILED"
    summary+=("build $what: FAILED")
    status=1
  fi
done

if [ -f "$installs/build-asan.ok" ]; then
  echo "== tests under ASan + UBSan (build-asan/)"
  # lsan.supp: allocations PMIx and LuaJIT keep for the process's life;
  # the comparisons with transformers ran in the first pass (numbers, not
  # memory: the engine code they cover runs under the sanitizers in test_hf)
  ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 \
  LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  FSDP_TEST_PYTHON=/nonexistent \
    run_pass "tests under ASan + UBSan" --test-dir build-asan --output-on-failure -j"$slots" || status=1
fi
echo "== summary ($(nproc) cores: $(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //'))"
for l in "${summary[@]}"; do echo "$l"; done
echo "test.sh: $([ $status = 0 ] && echo passed || echo FAILED) in $((SECONDS - t_start)) s"
exit $status

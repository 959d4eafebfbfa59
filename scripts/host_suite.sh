#!/usr/bin/env bash
# host_suite.sh [BUILD_DIR] [OUT_DIR]: the CPU suite (ctest) of a build made
# on another machine and carried here, for a host with no compiler set-up
# or package index of its own: the lent GPU machine, whose host CPU (an
# Intel Xeon) is the only other vendor a session reaches (issue 38: no test
# may assume the development machines' AMD cores).
#   scripts/gpu_bundle.sh                    (here: makes build-host/ too)
#   scripts/host_suite.sh build-host $OUT    (there)
# The build's tests name absolute paths (the checkout it was configured in):
# where that path does not exist here it is made a link to this checkout.
# Libraries come from .devlibs/ (scripts/gpu_env.sh); Python from python3
# where it has tokenizers and pyarrow (FSDP_PYTHON), and torch and
# transformers for the checks against Hugging Face (FSDP_TEST_PYTHON).
# Tests that need what the host lacks skip, saying so, as they do anywhere.
# HOST_SUITE_ARGS: more ctest arguments (-R peak: only those tests).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-host}
out=${2:-/tmp/fsdp-host-suite}
mkdir -p "$out"
bash scripts/gpu_unpack.sh # build-host/ and .devlibs/, where only gpu_bundle.sh's pack was carried
cache=$build/CMakeCache.txt
[ -f "$cache" ] || { echo "host_suite: $cache is missing: make $build with scripts/gpu_bundle.sh" >&2; exit 2; }
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")
if [ "$src" != "$PWD" ]; then
  if [ ! -e "$src" ]; then
    mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src" ||
      { echo "host_suite: cannot link $src (where $build was configured) to $PWD" >&2; exit 2; }
    echo "host_suite: $src -> $PWD (the checkout $build was configured in)"
  elif [ "$(cd "$src" && pwd -P)" != "$(pwd -P)" ]; then
    echo "host_suite: $build was configured in $src, which here is another folder: run from there" >&2
    exit 2
  fi
fi
. scripts/gpu_env.sh "$build"
unset FSDP_LIB FSDP_HEADER FSDP_LUA_PATH # the tests set their own
py=$(command -v python3 || true)
if [ -n "$py" ] && "$py" -c "import tokenizers, pyarrow" 2>/dev/null; then export FSDP_PYTHON=$py; fi
if [ -n "$py" ] && "$py" -c "import torch, transformers" 2>/dev/null; then export FSDP_TEST_PYTHON=$py; fi
ctest_bin=$(command -v ctest || true)
if [ -z "$ctest_bin" ] && [ -n "$py" ]; then
  d=$("$py" -c 'import cmake, os; print(cmake.CMAKE_BIN_DIR)' 2>/dev/null) && [ -x "$d/ctest" ] && ctest_bin=$d/ctest
fi
[ -n "$ctest_bin" ] || { echo "host_suite: no ctest here (neither on PATH nor Python's cmake package)" >&2; exit 2; }
# /usr/bin/luajit is the one test of the plain interpreter; a host without it
# says so instead of failing on a missing file
skip=()
[ -x /usr/bin/luajit ] || { skip=(-E '^lua_plain_luajit$'); echo "host_suite: no /usr/bin/luajit: lua_plain_luajit not run"; }
{
  echo "host: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores, $(date -u)"
  echo "FSDP_PYTHON=${FSDP_PYTHON:-none} FSDP_TEST_PYTHON=${FSDP_TEST_PYTHON:-none} OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
} | tee "$out/host.txt"
# shellcheck disable=SC2086 # HOST_SUITE_ARGS is a list of arguments
"$ctest_bin" --test-dir "$build" -j"$((4 * $(nproc)))" --output-on-failure "${skip[@]}" ${HOST_SUITE_ARGS:-} 2>&1 | tee "$out/ctest.log"
rc=${PIPESTATUS[0]}
grep -E '^[0-9]+% tests passed' "$out/ctest.log" | tail -1
exit "$rc"

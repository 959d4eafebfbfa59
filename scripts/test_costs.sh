#!/usr/bin/env bash
# Measures each test of a build alone (wall seconds, and CPU seconds of the
# test and every process it waited for) and writes tests/costs.txt, which
# tests/CMakeLists.txt reads to schedule the suite: the longest start
# first (COST), and each test takes the share of the cores it keeps busy
# (PROCESSORS, in quarter cores: scripts/test.sh runs ctest -j<4 x cores>).
# Run it on an idle machine after adding a test or changing one's length:
#   scripts/test_costs.sh [BUILD_DIR]        (default build/; ~8 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
[ -f "$dir/CTestTestfile.cmake" ] || { echo "test_costs: $dir has no tests (build it first: scripts/build.sh $dir)" >&2; exit 1; }
out=tests/costs.txt
tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.t" "$tmp.time"' EXIT
{
  echo "# test wall_s cpu_s: each test alone, measured by scripts/test_costs.sh"
  echo "# on $(nproc) cores of $(grep -m1 '^model name' /proc/cpuinfo | sed 's/.*: //'), $(date +%Y-%m-%d)"
} >"$tmp"
TIMEFORMAT='%R %U %S'
for t in $(ctest --test-dir "$dir" -N | awk '/Test +#/ {print $3}'); do
  { time ctest --test-dir "$dir" -R "^$t\$" >"$tmp.t" 2>&1; } 2>"$tmp.time" || true
  if grep -q '100% tests passed' "$tmp.t"; then
    awk -v t="$t" '{ printf "%s %.1f %.1f\n", t, $1, $2 + $3 }' "$tmp.time" >>"$tmp"
  else
    echo "test_costs: $t did not pass (or was skipped); not measured" >&2
  fi
done
mv "$tmp" "$out"
echo "test_costs: wrote $out ($(grep -vc '^#' "$out") tests)"

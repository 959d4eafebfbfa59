#!/usr/bin/env bash
# test_bench_cpu.sh FSDP_HOST ROOT: the CPU benchmarks of issue 38 run and
# say what they measured: bench/cpu_clock.lua (the clock and the timed
# multiply-adds, and how far they are from a power of two) and
# bench/gemm_peak.lua on one core. No GEMM shape may run faster than the
# peak it is a share of (2% for timing): a share above that means the
# peak's clock or FLOPs per cycle is too low on this host.
set -u
host=$1
root=$2
. "$(dirname "$0")/checks.sh"
cd "$root"

out=$("$host" bench/cpu_clock.lua 2 2>&1)
rc=$?
check "cpu_clock runs ($rc)" "[ $rc = 0 ]"
check "cpu_clock prints two readings and the peak" \
  "[ \$(grep -c '^[12] ' <<<\"\$out\") = 2 ] && grep -q '^cpu_clock: the MFU.s peak: ' <<<\"\$out\""
check "cpu_clock says how far the multiply-adds are from a power of two" \
  "grep -q '^cpu_clock: the widest multiply-adds. FLOP per cycle, at worst [0-9.]*% from a power of two' <<<\"\$out\" || grep -q '^cpu_clock: no' <<<\"\$out\""
echo "$out"

out=$(FSDP_BLAS_THREADS=1 "$host" bench/gemm_peak.lua 2>&1)
rc=$?
echo "$out"
if [ $rc != 0 ] && grep -q 'no CPU peak here' <<<"$out"; then
  echo "test_bench_cpu: no CPU peak on this machine; gemm_peak skipped"
else
  check "gemm_peak runs ($rc)" "[ $rc = 0 ]"
  check "gemm_peak names its kernels, the peak and its threads" \
    "grep -q '^gemm_peak: OpenBLAS ' <<<\"\$out\" && grep -q '^gemm_peak: peak [0-9.]* GFLOP/s a core: ' <<<\"\$out\" && grep -q '^gemm_peak: 1 thread\$' <<<\"\$out\""
  shares=$(awk '/%$/ { sub("%", "", $NF); print $NF }' <<<"$out")
  check "gemm_peak measured 9 shapes" "[ \$(wc -l <<<\"\$shares\") = 9 ]"
  highest=$(sort -g <<<"$shares" | tail -1)
  check "no GEMM above the timed peak (highest share $highest%)" "awk -v h=\"$highest\" 'BEGIN { exit !(h <= 102) }'"
fi
finish test_bench_cpu

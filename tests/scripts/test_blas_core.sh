#!/usr/bin/env bash
# test_blas_core.sh FSDP_HOST: the OpenBLAS kernels the rank host runs on
# (src/ops/blas_core.c, launcher/fsdp_main.c). OpenBLAS "picking" Prescott
# (FSDP_TEST_BLAS_CORE, as Debian 12's 0.3.21 does on an Emerald Rapids
# Xeon) on a CPU with AVX2 or AVX-512: the host runs itself again with the
# kernels the CPU's features call for (the reference: /proc/cpuinfo's flags,
# read here independently of the engine's CPUID), says so, and they compute
# right; a core the user set is kept; kernels that compute wrong are refused.
set -u
host=$1
. "$(dirname "$0")/checks.sh"
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { [[ "$flags" == *" $1 "* ]]; }
want=""
if has avx512f && has avx512bw && has avx512dq && has avx512vl && has avx2 && has fma; then want=SkylakeX
elif has avx2 && has fma; then want=Haswell
elif has avx; then want=Sandybridge
fi
show='local C = require("fsdp").C; print(os.getenv("OPENBLAS_CORETYPE"), os.getenv("FSDP_BLAS_CORE_FROM"), require("ffi").string(C.fsdp_blas_core()))'

out=$(env -u OPENBLAS_CORETYPE FSDP_TEST_BLAS_CORE=Prescott "$host" -e "$show" 2>&1)
rc=$?
if [ -n "$want" ]; then
  check "Prescott on a CPU that runs $want: the host runs on $want, saying it came from Prescott ($out)" \
    "[ $rc = 0 ] && [ \"\$out\" = \"$want	Prescott	Prescott\" ]"
  note=$(env -u OPENBLAS_CORETYPE FSDP_TEST_BLAS_CORE=Prescott "$host" -e \
    'print(require("ffi").string(require("fsdp").C.fsdp_blas_core_note()))' 2>&1)
  check "the note names the kernels and why: $note" \
    "grep -q '^OpenBLAS $want kernels, chosen for this CPU.s .* (OpenBLAS [0-9.]* took it for Prescott)\$' <<<\"\$note\""
  out=$(env -u OPENBLAS_CORETYPE FSDP_TEST_BLAS_CORE=Prescott FSDP_TEST_BLAS_WRONG=1 "$host" -e 'print("ran")' 2>&1)
  rc=$?
  check "kernels that compute wrong: refused (status $rc), naming them and what to set" \
    "[ $rc = 1 ] && ! grep -q '^ran' <<<\"\$out\" && grep -q 'fsdp: OpenBLAS $want kernels.* give wrong results: a 67x45x131 GEMM' <<<\"\$out\" && grep -q 'set OPENBLAS_CORETYPE' <<<\"\$out\""
else
  check "a CPU without AVX: OpenBLAS's choice stays ($out)" "[ $rc = 0 ] && [[ \"\$out\" == nil* ]]"
fi
out=$(OPENBLAS_CORETYPE=Prescott FSDP_TEST_BLAS_CORE=Prescott "$host" -e "$show" 2>&1)
check "a core the user set is kept ($out)" "[ \"\$out\" = 'Prescott	nil	Prescott' ]"
if [ -n "$want" ] && [ "$want" != Sandybridge ]; then
  note=$(OPENBLAS_CORETYPE=Prescott "$host" -e 'print(require("ffi").string(require("fsdp").C.fsdp_blas_core_note()))' 2>&1)
  check "a core the user set below the CPU's: kept, and the note says faster ones run here ($note)" \
    "grep -q '^OpenBLAS Prescott kernels (OPENBLAS_CORETYPE=Prescott; this CPU.s .* runs faster ones: unset it' <<<\"\$note\""
fi
out=$(env -u OPENBLAS_CORETYPE FSDP_TEST_BLAS_CORE=SkylakeX "$host" -e "$show" 2>&1)
check "the highest core is never replaced ($out)" "[ \"\$out\" = 'nil	nil	SkylakeX' ]"
out=$(env -u OPENBLAS_CORETYPE FSDP_TEST_BLAS_CORE=NeoverseV2 "$host" -e "$show" 2>&1)
check "a core it does not rank is never replaced ($out)" "[ \"\$out\" = 'nil	nil	NeoverseV2' ]"
out=$(env -u OPENBLAS_CORETYPE "$host" -e 'local C = require("fsdp").C; print(C.fsdp_blas_verify())' 2>&1)
check "OpenBLAS's own kernels compute right ($out)" "[ \"\$out\" = 0 ]"
finish test_blas_core

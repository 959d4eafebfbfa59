# The GPU benchmarks' Python and shell scripts (bench/llama_vs_peer.sh and its
# peers), which no GPU-less run executes: they compile and parse, refuse bad
# arguments as they say (tests/scripts/test_bench_scripts.sh; skipped
# without python3)
add_test(NAME bench_scripts COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_bench_scripts.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(bench_scripts PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77)

# The CPU benchmarks of the MFU's peak (bench/cpu_clock.lua, bench/gemm_peak.lua
# on one core): they run, and no GEMM beats the peak (tests/scripts/test_bench_cpu.sh)
add_test(NAME bench_cpu COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_bench_cpu.sh $<TARGET_FILE:fsdp-host>
                                ${CMAKE_SOURCE_DIR})
set_tests_properties(bench_cpu PROPERTIES LABELS unit TIMEOUT 90)

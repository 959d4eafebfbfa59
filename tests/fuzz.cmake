# The safetensors fuzzer (tests/fuzz/): libFuzzer needs clang; it is built
# from the parser's sources with clang's fuzzer, address and undefined
# sanitizers, apart from libfsdp, and run for a bounded time (FSDP_FUZZ_SECONDS).
# Not in the sanitizer build (it brings its own) and skipped without clang.
set(FSDP_FUZZ_SECONDS 30 CACHE STRING "Seconds the fuzz test runs")
find_program(FSDP_CLANG NAMES clang clang-19 clang-16 clang-15 clang-14)
set(fuzz_ok OFF)
if(FSDP_CLANG AND NOT FSDP_SANITIZE)
  # clang alone is not enough: libFuzzer's runtime comes with libclang-rt-dev
  set(probe ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe.c)
  file(WRITE ${probe} "#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
  execute_process(COMMAND ${FSDP_CLANG} -fsanitize=fuzzer,address,undefined ${probe} -o ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe
                  RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(probe_rc EQUAL 0)
    set(fuzz_ok ON)
  else()
    message(STATUS "fsdp: ${FSDP_CLANG} cannot link libFuzzer; the safetensors fuzz test is skipped (scripts/setup.sh installs libclang-rt-dev)")
  endif()
endif()
if(fuzz_ok)
  set(fuzz_bin ${CMAKE_CURRENT_BINARY_DIR}/fuzz_safetensors)
  set(fuzz_werror)
  if(FSDP_WERROR)
    set(fuzz_werror -Werror)
  endif()
  set(fuzz_src ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_safetensors.c ${CMAKE_SOURCE_DIR}/src/io/safetensors.c
      ${CMAKE_SOURCE_DIR}/src/base/error.c ${CMAKE_SOURCE_DIR}/src/base/dtype.c ${CMAKE_SOURCE_DIR}/src/base/heartbeat.c)
  add_custom_command(OUTPUT ${fuzz_bin}
    COMMAND ${FSDP_CLANG} -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
            -Wall -Wextra -Wno-unused-parameter ${fuzz_werror} -I${CMAKE_SOURCE_DIR}/src ${CJSON_CFLAGS} ${fuzz_src}
            ${CJSON_LDFLAGS} -lm -o ${fuzz_bin}
    DEPENDS ${fuzz_src} ${CMAKE_SOURCE_DIR}/src/fsdp_base.h ${CMAKE_SOURCE_DIR}/src/fsdp_io.h ${CMAKE_SOURCE_DIR}/src/io/json_util.h
    COMMENT "fuzz_safetensors (clang, libFuzzer)" VERBATIM)
  add_custom_target(fuzz_safetensors_build ALL DEPENDS ${fuzz_bin})
  add_test(NAME fuzz_safetensors COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run.sh ${fuzz_bin} ${FSDP_FUZZ_SECONDS})
  set_tests_properties(fuzz_safetensors PROPERTIES LABELS unit TIMEOUT 120 PASS_REGULAR_EXPRESSION "Done [0-9]+ runs")
endif()

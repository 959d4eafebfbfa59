# CUDA kernels' logic on the CPU (tests/emu): the tensor-core attention
# kernels (kernels/attention_tc.cuh) under an emulation of warps and WMMA,
# against float64. Needs a C++17 compiler (build-essential has g++); not in
# the sanitizer build (it runs thousands of threads; the normal build covers it).
include(CheckLanguage)
check_language(CXX)
if(CMAKE_CXX_COMPILER AND NOT FSDP_SANITIZE)
  enable_language(CXX)
  add_executable(test_attention_tc_emu emu/test_attention_tc_emu.cpp)
  set_target_properties(test_attention_tc_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
  target_compile_options(test_attention_tc_emu PRIVATE -O2 -Wall -Wextra -Wshadow -Wno-unknown-pragmas
                         $<$<BOOL:${FSDP_WERROR}>:-Werror>)
  target_link_libraries(test_attention_tc_emu PRIVATE Threads::Threads)
  add_test(NAME attention_tc_emu COMMAND test_attention_tc_emu)
  set_tests_properties(attention_tc_emu PROPERTIES LABELS unit TIMEOUT 300)
else()
  message(STATUS "fsdp: test_attention_tc_emu not built (no C++ compiler, or the sanitizer build)")
endif()

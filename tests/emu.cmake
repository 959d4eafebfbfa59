# CUDA kernels' logic on the CPU (tests/emu): the tensor-core attention
# kernels (kernels/attention_tc.cuh) under an emulation of warps and WMMA,
# the gradient sums (kernels/grad_sums.cuh) and the fused cross-entropy
# (kernels/cross_entropy.cuh), against float64; the optimizer kernels
# (kernels/adamw.cuh) against the host's element update. Needs a
# C++17 compiler (build-essential has g++); not in the sanitizer build (it
# runs thousands of threads; the normal build covers it).
include(CheckLanguage)
check_language(CXX)
if(CMAKE_CXX_COMPILER AND NOT FSDP_SANITIZE)
  enable_language(CXX)
  # test_NAME_emu from emu/test_NAME_emu.cpp, as ctest's NAME_emu
  function(fsdp_emu_test name timeout)
    add_executable(test_${name}_emu emu/test_${name}_emu.cpp)
    set_target_properties(test_${name}_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
    target_compile_options(test_${name}_emu PRIVATE -O2 -Wall -Wextra -Wshadow -Wno-unknown-pragmas
                           $<$<BOOL:${FSDP_WERROR}>:-Werror>)
    target_link_libraries(test_${name}_emu PRIVATE Threads::Threads)
    add_test(NAME ${name}_emu COMMAND test_${name}_emu)
    set_tests_properties(${name}_emu PROPERTIES LABELS unit TIMEOUT ${timeout})
  endfunction()
  fsdp_emu_test(attention_tc 300)
  fsdp_emu_test(grad_sums 120) # kernels/grad_sums.cuh: the embedding's and RMSNorm's fp32 gradient sums
  fsdp_emu_test(cross_entropy 120) # kernels/cross_entropy.cuh: the fused loss and gradient
  fsdp_emu_test(adamw 60) # kernels/adamw.cuh: AdamW and SGD, fp32 or split params
  fsdp_emu_test(elementwise 120) # kernels/elementwise.cuh: the residual add, SwiGLU forward and backward
  fsdp_emu_test(rmsnorm 120) # kernels/rmsnorm.cuh: RMSNorm's y, rstd and dx
  fsdp_emu_test(attention_cached 120) # kernels/attention_cached.cuh: generation's attention against a KV cache
  fsdp_emu_test(attention_docs 60) # kernels/attention.cuh, rope.cuh: packed rows (doc_start) and rope at positions
  fsdp_emu_test(attention_pos 60) # kernels/attention.cuh: queries at given positions (context parallelism), vs the CPU op
  target_link_libraries(test_attention_pos_emu PRIVATE fsdp)
  fsdp_emu_test(attention_pos_docs 60) # kernels/attention.cuh: queries at positions from a first key each (packed rows under cp), vs float64 and the CPU op
  target_link_libraries(test_attention_pos_docs_emu PRIVATE fsdp)
  fsdp_emu_test(token_logprobs 60) # kernels/token_logprobs.cuh: per-token logp, entropy and their gradient
  fsdp_emu_test(embedding_slice 60) # kernels/embedding.cuh, grad_sums.cuh: the vocab-parallel embedding, vs the CPU op
  target_link_libraries(test_embedding_slice_emu PRIVATE fsdp)
  fsdp_emu_test(cross_entropy_vocab 60) # kernels/cross_entropy_vocab.cuh: the vocab-parallel loss's passes, vs the CPU op
  target_link_libraries(test_cross_entropy_vocab_emu PRIVATE fsdp)
  fsdp_emu_test(token_logprobs_vocab 60) # kernels/token_logprobs_vocab.cuh: the vocab-parallel log-probs' passes, vs the CPU op
  target_link_libraries(test_token_logprobs_vocab_emu PRIVATE fsdp)
  fsdp_emu_test(attention_merge 60) # kernels/attention_merge.cuh: ring attention's combine by log-sum-exp, vs the CPU op
  target_link_libraries(test_attention_merge_emu PRIVATE fsdp)
else()
  message(STATUS "fsdp: the emulated-kernel tests (tests/emu) not built (no C++ compiler, or the sanitizer build)")
endif()

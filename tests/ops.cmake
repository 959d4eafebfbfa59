# The Llama ops, one test binary per op (tests/c/test_<op>.c), each against a
# float64 reference and central differences (tolerances in each file).
foreach(op embedding rmsnorm rope attention attention_docs attention_pos attention_pos_docs attention_merge attention_cached swiglu residual cross_entropy cross_entropy_vocab token_logprobs token_logprobs_vocab)
  add_executable(test_${op} c/test_${op}.c c/ref.c c/ref_attention.c c/check.c)
  target_compile_options(test_${op} PRIVATE ${FSDP_WARN})
  target_include_directories(test_${op} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR}/c)
  target_link_libraries(test_${op} PRIVATE fsdp m)
  add_test(NAME op_${op} COMMAND test_${op})
  set_tests_properties(op_${op} PROPERTIES LABELS unit TIMEOUT 120)
endforeach()

# GPU tests: built wherever the CUDA backend is; they exit 77 (skipped) on a
# machine without a GPU. scripts/gpu_check.sh runs them on a GPU machine.
if(FSDP_HAVE_CUDA)
  fsdp_c_test(test_cuda)
  target_link_libraries(test_cuda PRIVATE fsdp_cuda)
  add_test(NAME cuda COMMAND test_cuda)
  set_tests_properties(cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
# The CUDA ops against their CPU twins (tests/c/test_kernels.c)
if(FSDP_HAVE_CUDA)
  fsdp_c_test(test_kernels)
  target_link_libraries(test_kernels PRIVATE fsdp_cuda)
  add_test(NAME kernels COMMAND test_kernels)
  set_tests_properties(kernels PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
# The Llama model trained on a GPU against the CPU ops (one rank)
if(FSDP_HAVE_CUDA)
  add_test(NAME lua_cuda_train COMMAND $<TARGET_FILE:fsdprun> -n 1 --timeout 560 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_cuda_train.lua)
  set_tests_properties(lua_cuda_train PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
  # post-training on the GPU: packed rows, the engine's log-probs and step,
  # phase offload by cudaMemGetInfo (tests/lua/test_cuda_engine.lua)
  add_test(NAME lua_cuda_engine COMMAND $<TARGET_FILE:fsdprun> -n 1 --timeout 300 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_cuda_engine.lua)
  set_tests_properties(lua_cuda_engine PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 330)
  # tp 2, cp 2, cp 2 x tp 2 on GPU ranks sharing a GPU, against one GPU rank
  # (tests/scripts/test_cuda_tp.sh runs tests/lua/test_cuda_tp.lua at 2 and 4 ranks)
  add_test(NAME lua_cuda_tp COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_cuda_tp.sh $<TARGET_FILE:fsdprun>
                                    ${CMAKE_SOURCE_DIR} 120)
  set_tests_properties(lua_cuda_tp PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300)
  # the planner's bytes against the GPU's allocator (tests/lua/test_planner.lua cuda)
  add_test(NAME lua_planner_cuda
           COMMAND $<TARGET_FILE:fsdprun> -n 1 --timeout 200 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_planner.lua ${CMAKE_SOURCE_DIR} cuda)
  set_tests_properties(lua_planner_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 240)
endif()
# Which attention kernels a call runs, and cuDNN's loading at run time: on
# any machine (tests/c/test_attention_choice.c), once as is and once with a
# cuDNN library that does not exist
if(FSDP_HAVE_CUDA)
  fsdp_c_test(test_attention_choice)
  target_link_libraries(test_attention_choice PRIVATE fsdp_cuda ${CMAKE_DL_LIBS})
  add_test(NAME attention_choice COMMAND test_attention_choice)
  add_test(NAME attention_choice_no_cudnn COMMAND test_attention_choice)
  set_tests_properties(attention_choice_no_cudnn PROPERTIES ENVIRONMENT "FSDP_CUDNN_LIB=/nonexistent/does-not-exist.so")
  set_tests_properties(attention_choice attention_choice_no_cudnn PROPERTIES LABELS unit TIMEOUT 60)
  # the entry points' NULL checks come before any CUDA call: any machine
  fsdp_c_test(test_cuda_null)
  target_link_libraries(test_cuda_null PRIVATE fsdp_cuda)
  add_test(NAME cuda_null COMMAND test_cuda_null)
  set_tests_properties(cuda_null PROPERTIES LABELS unit TIMEOUT 60)
endif()

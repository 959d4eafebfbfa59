# GPU tests: built wherever the CUDA backend is; they exit 77 (skipped) on a
# machine without a GPU. scripts/gpu_check.sh runs them on a GPU machine.
if(FSDP_HAVE_CUDA)
  fsdp_c_test(test_cuda)
  add_test(NAME cuda COMMAND test_cuda)
  set_tests_properties(cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()

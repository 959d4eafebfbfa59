# Engine tests: one C binary per layer, and the multi-rank collectives test
# started through fsdprun on 1 to 4 CPU ranks.
fsdp_c_test(test_base)
fsdp_c_test(test_device)
fsdp_c_test(test_collectives)
fsdp_c_test(test_comm_cast_chunks)
fsdp_c_test(test_comm_bytes)
fsdp_c_test(test_philox)
fsdp_c_test(test_layout)
fsdp_c_test(test_pool)
fsdp_c_test(test_optim)
fsdp_c_test(test_meta_init)
fsdp_c_test(test_units)
fsdp_c_test(test_units_split)
fsdp_c_test(test_unit_lifecycle)
fsdp_c_test(test_ops)

add_test(NAME base COMMAND test_base)
add_test(NAME device COMMAND test_device)
add_test(NAME philox COMMAND test_philox)
add_test(NAME layout COMMAND test_layout)
add_test(NAME pool COMMAND test_pool)
add_test(NAME comm_cast_chunks COMMAND test_comm_cast_chunks)
add_test(NAME optim COMMAND test_optim)
add_test(NAME ops COMMAND test_ops)
# the CUDA backend missing where libfsdp looks for it (src/device/cuda_loader.c)
add_test(NAME device_no_cuda_backend COMMAND test_device)
set_tests_properties(device_no_cuda_backend PROPERTIES ENVIRONMENT "FSDP_CUDA_LIB=/nonexistent/does-not-exist.so")
set_tests_properties(base device device_no_cuda_backend philox layout pool comm_cast_chunks optim ops PROPERTIES LABELS unit TIMEOUT 60)

foreach(n ${FSDP_LONG_TEST_RANKS})
  add_test(NAME collectives_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 400 --host $<TARGET_FILE:test_collectives>)
  set_tests_properties(collectives_np${n} PROPERTIES LABELS multirank TIMEOUT 450)
endforeach()
# The bytes each rank sends per comm (fsdp_comm_bytes_sent) against the
# ring formula the planner uses, every kind, on 1 to 4 ranks
foreach(n 1 2 3 4)
  add_test(NAME comm_bytes_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 60 --host $<TARGET_FILE:test_comm_bytes>)
  set_tests_properties(comm_bytes_np${n} PROPERTIES LABELS multirank TIMEOUT 90)
endforeach()
# A peer that vanishes, and one that is late past the timeout: the others
# must fail with a message naming it, within seconds, never hang.
add_test(NAME collectives_dead_peer
         COMMAND $<TARGET_FILE:fsdprun> -n 3 --timeout 60 --host $<TARGET_FILE:test_collectives> --dead-peer)
add_test(NAME collectives_late_peer
         COMMAND $<TARGET_FILE:fsdprun> -n 3 --timeout 60 --host $<TARGET_FILE:test_collectives> --late-peer)
set_tests_properties(collectives_dead_peer collectives_late_peer PROPERTIES LABELS multirank TIMEOUT 90)

# Meta init: the gathered shards equal the full model drawn on one rank, for
# any world size and unit grouping.
foreach(n 1 2 3 4)
  add_test(NAME meta_init_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 60 --host $<TARGET_FILE:test_meta_init>)
  set_tests_properties(meta_init_np${n} PROPERTIES LABELS multirank TIMEOUT 90)
endforeach()

# Units: 20 training steps on 1 to 4 ranks, zero 0-3, HSDP 2x2, with and
# without gradient accumulation, against a float64 single-model reference.
foreach(n 1 2 3 4)
  add_test(NAME units_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 200 --host $<TARGET_FILE:test_units>)
  set_tests_properties(units_np${n} PROPERTIES LABELS multirank TIMEOUT 240)
endforeach()
# Split main params (bf16 compute: the compute copy is the fp32 main
# params' high half): bit for bit against fp32 units, one rank and uneven shards.
foreach(n 1 3)
  add_test(NAME units_split_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 60 --host $<TARGET_FILE:test_units_split>)
  set_tests_properties(units_split_np${n} PROPERTIES LABELS multirank TIMEOUT 90)
endforeach()
# a unit's named states: every call out of order refused, changing nothing
foreach(n 1 3)
  add_test(NAME unit_lifecycle_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 60 --host $<TARGET_FILE:test_unit_lifecycle>)
  set_tests_properties(unit_lifecycle_np${n} PROPERTIES LABELS multirank TIMEOUT 90)
endforeach()
# the layers hold: no include reaches up, no include cycle in src/, kernels/,
# launcher/ (scripts/check_layers.py), and the checker fails when one does
add_test(NAME check_layers COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_check_layers.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(check_layers PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77)
# no two files of src/, kernels/ or launcher/ call each other, as the build's
# objects show (scripts/check_calls.py), and the checker finds circles
add_test(NAME check_calls COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_check_calls.sh ${CMAKE_SOURCE_DIR}
                                  ${CMAKE_BINARY_DIR})
set_tests_properties(check_calls PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77)

# Lua front end tests, run by the fsdp rank host.
add_executable(ffi_layout c/ffi_layout.c)
target_include_directories(ffi_layout PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_compile_options(ffi_layout PRIVATE ${FSDP_WARN})

add_test(NAME lua_ffi COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_ffi.lua $<TARGET_FILE:ffi_layout>)
add_test(NAME lua_frontend COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_frontend.lua $<TARGET_FILE:fsdp-host>)
set_tests_properties(lua_ffi lua_frontend PROPERTIES LABELS unit TIMEOUT 60)
foreach(n 1 2 3 4)
  add_test(NAME lua_collectives_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_collectives.lua)
  set_tests_properties(lua_collectives_np${n} PROPERTIES LABELS multirank TIMEOUT 150 RUN_SERIAL ON)
endforeach()
add_test(NAME demo_collectives COMMAND $<TARGET_FILE:fsdprun> -n 4 --timeout 120 ${CMAKE_SOURCE_DIR}/recipes/demo_collectives.lua)
set_tests_properties(demo_collectives PROPERTIES LABELS multirank TIMEOUT 150 RUN_SERIAL ON)

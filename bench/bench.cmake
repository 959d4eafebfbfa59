add_executable(bench_collectives ${CMAKE_CURRENT_SOURCE_DIR}/bench_collectives.c)
target_compile_options(bench_collectives PRIVATE ${FSDP_WARN})
target_link_libraries(bench_collectives PRIVATE fsdp)

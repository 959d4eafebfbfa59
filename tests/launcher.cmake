add_test(NAME launcher
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/launcher/test_launcher.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:fsdp-host>)
set_tests_properties(launcher PROPERTIES LABELS launcher TIMEOUT 120 RUN_SERIAL ON)

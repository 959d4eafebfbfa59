# Launcher tests: shell scripts that drive fsdprun with pmix_probe, a small
# PMIx client that links PMIx only (so they do not depend on the engine), and
# one script that drives it with the real fsdp rank host. Each script prints
# what it checks; see tests/launcher/lib.sh.
add_executable(pmix_probe launcher/pmix_probe.c)
target_compile_options(pmix_probe PRIVATE ${FSDP_WARN})
target_link_libraries(pmix_probe PRIVATE PkgConfig::PMIX)

foreach(t output exit abort killed sigterm singleton options help limits restart)
  add_test(NAME launcher_${t}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launcher/test_${t}.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:pmix_probe>)
  set_tests_properties(launcher_${t} PROPERTIES LABELS launcher TIMEOUT 60)
endforeach()
add_test(NAME launcher_fsdp_host
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launcher/test_fsdp_host.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:fsdp-host>)
set_tests_properties(launcher_fsdp_host PROPERTIES LABELS launcher TIMEOUT 60)
add_test(NAME launcher_env
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launcher/test_launcher_env.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:fsdp-host>)
set_tests_properties(launcher_env PROPERTIES LABELS launcher TIMEOUT 90)
# a rank dying while a CPU group is created leaves no /dev/shm segment once
# fsdprun has returned (tests/launcher/test_shm_cleanup.sh)
add_test(NAME launcher_shm_cleanup
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launcher/test_shm_cleanup.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:fsdp-host>)
set_tests_properties(launcher_shm_cleanup PROPERTIES LABELS launcher TIMEOUT 60)
# the rank host under mpirun, srun --mpi=pmix (a one-node Slurm cluster of
# its own) and prterun: the same losses as under fsdprun, a checkpoint that
# resumes under fsdprun, a killed rank ending the job, a recipe error named
# by every rank (tests/scripts/test_launchers.sh; a launcher not installed
# is skipped, saying so: scripts/setup_launchers.sh installs them). The
# normal pass only: it checks what the launchers do, not our memory.
if(NOT FSDP_SANITIZE)
  add_test(NAME launchers
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_launchers.sh $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
  set_tests_properties(launchers PROPERTIES LABELS "launcher;multirank" TIMEOUT 240)
endif()

# Lua front end tests, run by the fsdp rank host.
add_executable(ffi_layout c/ffi_layout.c)
target_include_directories(ffi_layout PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_compile_options(ffi_layout PRIVATE ${FSDP_WARN})

add_test(NAME lua_ffi COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_ffi.lua $<TARGET_FILE:ffi_layout>)
add_test(NAME lua_frontend COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_frontend.lua $<TARGET_FILE:fsdp-host>)
# no front-end file reads or writes a global beyond Lua's own (a local left
# behind when code moved is a silent nil), found in the compiled bytecode
add_test(NAME lua_globals COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_globals.lua ${CMAKE_SOURCE_DIR})
# the MFU's peaks (lua/fsdp/peak.lua) against hand-computed values
add_test(NAME lua_peak COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_peak.lua)
# fsdp.autograd's ownership rules: gradients, byte counts, errors (lua/fsdp/autograd.lua)
add_test(NAME lua_autograd COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_autograd.lua ${CMAKE_SOURCE_DIR})
# fsdp.profile (train.profile): spans on two clocks, the summary, the trace file
add_test(NAME lua_profile COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_profile.lua ${CMAKE_SOURCE_DIR})
set_tests_properties(lua_ffi lua_globals lua_frontend lua_peak lua_autograd lua_profile PROPERTIES LABELS unit TIMEOUT 60)
foreach(n 1 2 3 4)
  add_test(NAME lua_collectives_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_collectives.lua)
  set_tests_properties(lua_collectives_np${n} PROPERTIES LABELS multirank TIMEOUT 150)
endforeach()
add_test(NAME demo_collectives COMMAND $<TARGET_FILE:fsdprun> -n 4 --timeout 120 ${CMAKE_SOURCE_DIR}/recipes/demo_collectives.lua)
set_tests_properties(demo_collectives PROPERTIES LABELS multirank TIMEOUT 150)

# `require "fsdp"` from a plain LuaJIT, not only from the fsdp host
# (not under the sanitizers: an instrumented library cannot be loaded into an
# uninstrumented luajit unless the ASan runtime is preloaded)
find_program(LUAJIT_EXE luajit)
if(LUAJIT_EXE AND NOT FSDP_SANITIZE)
  add_test(NAME lua_plain_luajit
           COMMAND ${LUAJIT_EXE} -e "local f = require 'fsdp'; local i = f.init(); assert(i.size == 1); local t = f.tensor(3, 'bf16'):fill(1.5); assert(t:get(2) == 1.5); print('plain luajit: ok')")
  set_tests_properties(lua_plain_luajit PROPERTIES LABELS unit TIMEOUT 30
    PASS_REGULAR_EXPRESSION "plain luajit: ok"
    ENVIRONMENT "FSDP_LIB=$<TARGET_FILE:fsdp>;LUA_PATH=${CMAKE_SOURCE_DIR}/lua/?.lua\\;${CMAKE_SOURCE_DIR}/lua/?/init.lua\\;\\;")
endif()

# fully_shard parity: zero 0-3 (and HSDP on 4 ranks) against the unsharded model
foreach(n 1 2 3 4)
  add_test(NAME lua_fully_shard_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_fully_shard.lua)
  set_tests_properties(lua_fully_shard_np${n} PROPERTIES LABELS multirank TIMEOUT 150)
endforeach()

# the Llama model: against a float64 Hugging Face reference, and sharded
# training (zero 1-3, activation checkpointing) against the unsharded model
foreach(n 1 2 3 4)
  add_test(NAME lua_llama_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 200 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_llama.lua)
  set_tests_properties(lua_llama_np${n} PROPERTIES LABELS multirank TIMEOUT 240)
endforeach()
# the trainer: recipes, schedule, data, the pre-flight check, the demo recipe
foreach(n 1 2)
  add_test(NAME lua_trainer_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 300 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_trainer.lua ${CMAKE_SOURCE_DIR})
  set_tests_properties(lua_trainer_np${n} PROPERTIES LABELS multirank TIMEOUT 330)
endforeach()
# packed documents and masked targets: packing, packed rows against each
# document alone, the loss over every target of any rank and micro-batch split
foreach(n 1 2 4)
  add_test(NAME lua_packing_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_packing.lua)
  set_tests_properties(lua_packing_np${n} PROPERTIES LABELS multirank TIMEOUT 150)
endforeach()
# tensor and context parallelism (fsdp.tp, fsdp.cp): tp, cp, dp x tp,
# dp x cp, cp x tp and dp_outer meshes against one rank, 30 steps, ZeRO
# 1-3, recompute, activation checkpointing, tied embeddings; at 8 ranks the
# three (dp_outer, dp_shard, cp, tp) shapes; checkpoints and HF files
# across meshes; slices' meta init; refusals
foreach(n 2 4 8)
  add_test(NAME lua_tp_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --oversubscribe --timeout 150 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_tp.lua)
  set_tests_properties(lua_tp_np${n} PROPERTIES LABELS multirank TIMEOUT 180)
endforeach()
if(FSDP_SANITIZE) # (the options' runs reach no C the shapes' do not)
  set_tests_properties(lua_tp_np2 PROPERTIES ENVIRONMENT FSDP_TEST_QUICK=1)
endif()
# the trainer at tp meshes against 1 rank and dp, refusals, the plan's tp line
add_test(NAME lua_tp_trainer
         COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_tp_trainer.lua $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(lua_tp_trainer PROPERTIES LABELS multirank TIMEOUT 300)
# fsdp.engine and fsdp.losses: log-probs, a loss written over them trained
# exactly (GRPO against the cross-entropy), the losses' derivatives
foreach(n 1 2)
  add_test(NAME lua_engine_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_engine.lua)
  set_tests_properties(lua_engine_np${n} PROPERTIES LABELS multirank TIMEOUT 150)
endforeach()
# recipes/sft_chat.lua: chat SFT from a tokenizer to answers in the chat
# format, the recipe's header as written (tests/scripts/test_sft_chat.sh)
add_test(NAME sft_chat
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_sft_chat.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:fsdp-host>
         ${CMAKE_SOURCE_DIR})
set_tests_properties(sft_chat PROPERTIES LABELS multirank TIMEOUT 300 SKIP_RETURN_CODE 77)
# recipes/grpo_arith.lua: the RL loop in one job, its reward rising
add_test(NAME grpo_arith COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_grpo_arith.sh $<TARGET_FILE:fsdprun>
         ${CMAKE_SOURCE_DIR})
set_tests_properties(grpo_arith PROPERTIES LABELS multirank TIMEOUT 300)
# the metrics plot (gnuplot)
add_test(NAME plot_metrics COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_plot_metrics.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(plot_metrics PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77)
# checkpoints: resume bit for bit, resharding, a rank killed mid-save,
# corruptions, Hugging Face export/import (runs fsdprun itself, 1-4 ranks)
add_test(NAME lua_checkpoint
         COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_checkpoint.lua $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(lua_checkpoint PROPERTIES LABELS multirank TIMEOUT 600)
if(FSDP_SANITIZE) # the resumes that only check numerics stay in the normal pass
  set_tests_properties(lua_checkpoint PROPERTIES ENVIRONMENT FSDP_TEST_QUICK=1)
endif()
# the offloaded optimizer: bit for bit against the optimizer in place, and
# its overlap with the next forward (tests/lua/test_offload.lua)
foreach(n 1 2 4)
  add_test(NAME lua_offload_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_offload.lua)
  set_tests_properties(lua_offload_np${n} PROPERTIES LABELS multirank TIMEOUT 150)
endforeach()
# the planner against the engine's allocations and pool peaks, the policies
# in recipes/policies (tests/lua/test_planner.lua)
foreach(n ${FSDP_LONG_TEST_RANKS})
  add_test(NAME lua_planner_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 200 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_planner.lua ${CMAKE_SOURCE_DIR})
  set_tests_properties(lua_planner_np${n} PROPERTIES LABELS multirank TIMEOUT 240)
  if(FSDP_SANITIZE) # the policies' and offload's training runs: numerics the normal pass checks
    set_tests_properties(lua_planner_np${n} PROPERTIES ENVIRONMENT FSDP_TEST_QUICK=1)
  endif()
endforeach()
# the REPL (offline and live through fsdprun --repl) and `fsdp plan`
add_test(NAME lua_repl
         COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_repl.lua $<TARGET_FILE:fsdp-host> $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(lua_repl PROPERTIES LABELS multirank TIMEOUT 120)
# Hugging Face folders against the model: config.json checked field by
# field, the index deciding the files, a tied head, model.from_hf
foreach(n 1 2)
  add_test(NAME lua_hf_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 200 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_hf.lua)
  set_tests_properties(lua_hf_np${n} PROPERTIES LABELS multirank TIMEOUT 240)
endforeach()
# Teardown by the collector alone, many times, in whatever order the
# finalizers run (tests/lua/test_teardown.lua); under ASan in the sanitizer build
add_test(NAME lua_teardown
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_teardown.sh $<TARGET_FILE:fsdprun> ${CMAKE_CURRENT_SOURCE_DIR}/lua)
set_tests_properties(lua_teardown PROPERTIES LABELS multirank TIMEOUT 300)
# the run's own records and meaningless values (issue 18): metrics across a
# resume, a full disk, non-finite numbers, a diverged run, absurd sizes,
# nested recipe tables
foreach(n 1 2)
  add_test(NAME lua_run_records_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_run_records.lua
                   ${CMAKE_SOURCE_DIR})
  set_tests_properties(lua_run_records_np${n} PROPERTIES LABELS multirank TIMEOUT 150)
endforeach()
# a run stopped by SIGTERM / SIGUSR1 saves and resumes bit for bit; a second
# signal ends it at once (tests/scripts/test_stop_signal.sh)
add_test(NAME stop_signal
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_stop_signal.sh $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(stop_signal PROPERTIES LABELS multirank TIMEOUT 200)
# fsdprun --max-restarts: ranks killed at random steps, the losses bit for
# bit as uninterrupted; killed on 2 ranks, continued on 1 within a tolerance
# (tests/scripts/test_elastic.sh)
add_test(NAME elastic
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_elastic.sh $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(elastic PROPERTIES LABELS multirank TIMEOUT 120)
# NaNs with payload bits read from C memory: plain NaN numbers in Lua
# (LuaJIT's NaN boxing would take them for pointers; tests/lua/test_nan_payload.lua)
add_test(NAME lua_nan_payload
         COMMAND $<TARGET_FILE:fsdprun> -n 2 --timeout 60 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_nan_payload.lua)
set_tests_properties(lua_nan_payload PROPERTIES LABELS multirank TIMEOUT 90)
# faults that must be refused up front, naming what is wrong: non-finite
# weights at load, token ids outside the vocabulary, resumes in another data
# geometry or history, ranks that never reach fsdp.init (tests/lua/test_faults.lua)
add_test(NAME lua_faults
         COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_faults.lua $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(lua_faults PROPERTIES LABELS multirank TIMEOUT 300)
# checkpoints a save or a resume cannot use (issue 18): a full disk on
# `latest` fails every rank at once; `latest` naming a checkpoint that is
# gone is refused; data failing its CRC falls back to the checkpoint before
# (tests/lua/test_resume_faults.lua)
add_test(NAME lua_resume_faults
         COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_resume_faults.lua $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(lua_resume_faults PROPERTIES LABELS multirank TIMEOUT 120)
# a rank alive but stuck (SIGSTOP, spinning in Lua) ends the job within
# fsdprun --heartbeat-timeout, naming it and its last step (tests/scripts/test_heartbeat.sh)
add_test(NAME heartbeat
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_heartbeat.sh $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(heartbeat PROPERTIES LABELS multirank TIMEOUT 120)
# the CPU half of the multi-rank matrix (scripts/multirank_check.sh; its GPU
# half runs on a lent GPU, scripts/gpu_check.sh multirank): a sample of the
# cases on 2 and 4 CPU ranks against 1, within the stated bounds, and the
# planted mistakes caught
add_test(NAME multirank_cpu
         COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/multirank_check.sh ${CMAKE_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/multirank_cpu cpu)
set_tests_properties(multirank_cpu PROPERTIES LABELS multirank TIMEOUT 300
  ENVIRONMENT "MULTIRANK_CASES=z1_fp32_2 z3_bf16_2 hsdp_fp32_4 hfsdp_fp32_4 live1_4 offload_all_2 accum_4 planted_lr_2 planted_wd_4 planted_lr_bf16_2")
# OpenBLAS's kernels: chosen by the CPU's features where OpenBLAS falls back
# to SSE3 ones, checked against float64, a core the user set kept
# (tests/scripts/test_blas_core.sh)
add_test(NAME blas_core COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_blas_core.sh $<TARGET_FILE:fsdp-host>)
set_tests_properties(blas_core PROPERTIES LABELS unit TIMEOUT 60)
# the README's and docs' CPU launch commands run on a 2-core machine
# (tests/scripts/test_doc_commands.sh)
add_test(NAME doc_commands
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_doc_commands.sh $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(doc_commands PROPERTIES LABELS multirank TIMEOUT 300)
# the progress line at a terminal moves every step, through fsdprun
# (tests/scripts/test_progress.sh; skipped without script(1))
add_test(NAME progress
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_progress.sh $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(progress PROPERTIES LABELS multirank TIMEOUT 120 SKIP_RETURN_CODE 77)
# the planner's figures the docs quote are the planner's
# (tests/scripts/test_doc_figures.sh)
add_test(NAME doc_figures COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_doc_figures.sh $<TARGET_FILE:fsdp-host> ${CMAKE_SOURCE_DIR})
set_tests_properties(doc_figures PROPERTIES LABELS unit TIMEOUT 120)
# restarts that never override a refusal, a stop during evaluation, one job
# per checkpoint directory, a full metrics disk at a resume; each with and
# without --max-restarts (tests/scripts/test_run_guard.sh)
add_test(NAME run_guard
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_run_guard.sh $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(run_guard PROPERTIES LABELS multirank TIMEOUT 400)

# generation (lua/fsdp/generate.lua, sample.lua): greedy and sampled tokens
# with the KV cache against the reference without it, stopping, refusals,
# the sampler's draws against float64 probabilities
add_test(NAME lua_generate COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_generate.lua ${CMAKE_SOURCE_DIR})
set_tests_properties(lua_generate PROPERTIES LABELS unit TIMEOUT 60)
# fsdp generate as a user meets it: samples at evaluation, the files a
# checkpoint and an export carry, the same tokens from a checkpoint and its
# export, the byte-level tokenizer read by `tokenizers`, refusals
# (tests/scripts/test_generate.sh)
add_test(NAME generate
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_generate.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:fsdp-host>
                 ${CMAKE_SOURCE_DIR})
set_tests_properties(generate PROPERTIES LABELS multirank TIMEOUT 180)
# recipes/own_data.lua, from a folder of text to a model (tests/scripts/
# test_own_data.sh): a BPE tokenizer, fsdp prepare, training with samples,
# the tokenizer carried to the export, fsdp generate against transformers,
# a fine-tune of a Hugging Face folder; skipped without the Python environment
add_test(NAME own_data
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_own_data.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:fsdp-host>
                 ${CMAKE_SOURCE_DIR})
set_tests_properties(own_data PROPERTIES LABELS multirank TIMEOUT 300 SKIP_RETURN_CODE 77)
# a user's model calling one layer twice in its forward (autograd frames,
# rule 7 of lua/fsdp/autograd.lua): gradients through both calls against
# float64 central differences, sharded over 1 and 2 ranks at ZeRO 0, 2, 3
foreach(n 1 2)
  add_test(NAME lua_shared_layer_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_shared_layer.lua)
  set_tests_properties(lua_shared_layer_np${n} PROPERTIES LABELS multirank TIMEOUT 150)
endforeach()
# a user's own model planned by running it on the counting device
# (fsdp.plan_model): against the allocator, to the byte, on 1 and 2 ranks
foreach(n 1 2)
  add_test(NAME lua_plan_model_np${n}
           COMMAND $<TARGET_FILE:fsdprun> -n ${n} --timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_plan_model.lua)
  set_tests_properties(lua_plan_model_np${n} PROPERTIES LABELS multirank TIMEOUT 150)
endforeach()
# train.tensorboard (lua/fsdp/tensorboard.lua): our event files against
# TensorBoard's own protobuf classes and RecordWriter byte for byte, and
# read back by its EventAccumulator equal to the JSONL metrics, on 2 ranks
# and across a killed run's resume (tests/lua/test_tensorboard.lua;
# skipped without a Python that has tensorboard)
add_test(NAME lua_tensorboard
         COMMAND fsdp-host ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_tensorboard.lua $<TARGET_FILE:fsdprun> ${CMAKE_SOURCE_DIR})
set_tests_properties(lua_tensorboard PROPERTIES LABELS multirank TIMEOUT 120 SKIP_RETURN_CODE 77)

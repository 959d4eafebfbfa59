# The io layer: the token file reader (tests/c/test_token_file.c); the Lua
# data loader over it is tested by tests/lua/test_data.lua (lua.cmake).
fsdp_c_test(test_token_file)
add_test(NAME token_file COMMAND test_token_file)
set_tests_properties(token_file PROPERTIES LABELS unit TIMEOUT 60)
# SHA-256 (a token file manifest's tokenizer fingerprint) against the FIPS
# examples and hashlib's digests (tests/c/test_sha256.c)
fsdp_c_test(test_sha256)
add_test(NAME sha256 COMMAND test_sha256)
set_tests_properties(sha256 PROPERTIES LABELS unit TIMEOUT 60)
# checkpoints: CRC-32C, the writer, the index reader and its corruption
# checks, safetensors headers (tests/c/test_checkpoint_io.c)
fsdp_c_test(test_checkpoint_io)
add_test(NAME checkpoint_io COMMAND test_checkpoint_io)
set_tests_properties(checkpoint_io PROPERTIES LABELS unit TIMEOUT 60)
# the Hugging Face export loaded by transformers itself: the same logits as
# ours, its tokenizer, greedy generate token for token (torch and
# transformers in FSDP_TEST_PYTHON, which scripts/test.sh sets to the
# project's environment, else python3; skipped without them)
add_test(NAME hf_transformers
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_hf_transformers.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:fsdp-host>
                 ${CMAKE_SOURCE_DIR})
set_tests_properties(hf_transformers PROPERTIES LABELS multirank TIMEOUT 300 SKIP_RETURN_CODE 77)
# one job per checkpoint directory: the advisory lock between processes,
# a killed holder leaving none (tests/c/test_dir_lock.c)
fsdp_c_test(test_dir_lock)
add_test(NAME dir_lock COMMAND test_dir_lock)
set_tests_properties(dir_lock PROPERTIES LABELS unit TIMEOUT 60)
# `fsdp prepare` (scripts/prepare_data.py): every input kind gives the ids of
# `tokenizers` called directly, any worker count the same bytes, the engine
# reads uint16 and uint32 files, the manifest's refusals at training start,
# bad input named, interrupted runs leave no train.bin
# (tests/scripts/test_prepare.sh; skipped where scripts/python_env.sh cannot
# make the Python environment)
add_test(NAME prepare
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_prepare.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:fsdp-host>
                 ${CMAKE_SOURCE_DIR})
set_tests_properties(prepare PROPERTIES LABELS multirank TIMEOUT 180 SKIP_RETURN_CODE 77)
# `fsdp prepare --chat` against transformers' own apply_chat_template: the
# ids, the loss mask (generation blocks, and the prefix rule without them),
# --mask all, the document index of every preparation, any worker count the
# same bytes, refusals naming file:line, plain text byte for byte as before
# (tests/scripts/test_prepare_chat.sh, check_chat.py; skipped without
# transformers in FSDP_TEST_PYTHON)
add_test(NAME prepare_chat
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_prepare_chat.sh $<TARGET_FILE:fsdprun> $<TARGET_FILE:fsdp-host>
                 ${CMAKE_SOURCE_DIR})
set_tests_properties(prepare_chat PROPERTIES LABELS multirank TIMEOUT 180 SKIP_RETURN_CODE 77)

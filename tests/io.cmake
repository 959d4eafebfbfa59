# The io layer: the token file reader (tests/c/test_token_file.c); the Lua
# data loader over it is tested by tests/lua/test_data.lua (lua.cmake).
fsdp_c_test(test_token_file)
add_test(NAME token_file COMMAND test_token_file)
set_tests_properties(token_file PROPERTIES LABELS unit TIMEOUT 60)
# checkpoints: CRC-32C, the writer, the index reader and its corruption
# checks, safetensors headers (tests/c/test_checkpoint_io.c)
fsdp_c_test(test_checkpoint_io)
add_test(NAME checkpoint_io COMMAND test_checkpoint_io)
set_tests_properties(checkpoint_io PROPERTIES LABELS unit TIMEOUT 60)

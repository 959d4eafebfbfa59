# The io layer: the token file reader (tests/c/test_token_file.c); the Lua
# data loader over it is tested by tests/lua/test_data.lua (lua.cmake).
fsdp_c_test(test_token_file)
add_test(NAME token_file COMMAND test_token_file)
set_tests_properties(token_file PROPERTIES LABELS unit TIMEOUT 60)

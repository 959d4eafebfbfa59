#!/usr/bin/env bash
# test_teardown.sh FSDPRUN SCRIPT_DIR: tests/lua/test_teardown.lua, many
# times: the collector alone tears a fully_shard model down at the end of
# a script, in whatever order LuaJIT runs the finalizers (it differs from
# run to run), on 1 and 2 ranks; and the same with the mesh freed first,
# and with a Lua error after the step. Each run must end with the expected
# status, at once (a hang is caught by fsdprun's --timeout), and, in the
# sanitizer build, without AddressSanitizer's report of a use after free.
set -u
fsdprun=$1
lua=$2/test_teardown.lua
runs=${FSDP_TEARDOWN_RUNS:-6}
passed=0
failed=0
for n in 1 2; do
  for mode in "" mesh-first error; do
    want=0
    [ "$mode" = error ] && want=1
    for i in $(seq 1 "$runs"); do
      out=$("$fsdprun" -n "$n" --timeout 30 "$lua" $mode 2>&1)
      rc=$?
      if [ "$rc" = "$want" ] && ! grep -q "AddressSanitizer\|timed out\|timeout" <<<"$out"; then
        passed=$((passed + 1))
      else
        failed=$((failed + 1))
        echo "FAILED: $n rank(s), mode '${mode:-collector}', run $i: status $rc (expected $want)"
        echo "$out" | tail -20
      fi
    done
  done
done
echo "test_teardown: $passed passed, $failed failed"
[ "$failed" = 0 ]

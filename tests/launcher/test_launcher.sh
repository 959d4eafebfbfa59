#!/usr/bin/env bash
# Launcher tests: output routing and prefixes, failure handling (exit,
# abort, signal, SIGTERM to fsdprun, --timeout), no leftover processes or
# temp directories, singleton mode, option errors, --help.
#   test_launcher.sh FSDPRUN FSDP_HOST
set -u
FSDPRUN=$1
HOST=$2
export FSDPRUN_HOST= # ignore a caller's setting
unset FSDPRUN_HOST
passed=0
failed=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TMPDIR=$work/tmp
mkdir -p "$TMPDIR"

ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

# a job file that reads its behaviour from its arguments
job=$work/job.lua
cat > "$job" <<'LUA'
local fsdp = require "fsdp"
local ffi = require "ffi"
ffi.cdef "int getpid(void); int kill(int, int);"
local info = fsdp.init()
local r, mode, who = info.rank, arg[1] or "ok", tonumber(arg[2] or -1)
io.stdout:write("out ", r, "\n"); io.stdout:flush()
io.stderr:write("err ", r, "\n"); io.stderr:flush()
if mode == "partial" then io.stdout:write("partial ", r); io.stdout:flush(); os.exit(0) end
if mode == "ok" then os.exit(0) end
if r == who then
  os.execute("sleep 0.3")
  if mode == "exit" then os.exit(3) end
  if mode == "abort" then fsdp.abort(7, "rank asked to abort") end
  if mode == "kill" then ffi.C.kill(ffi.C.getpid(), 9) end
end
os.execute("sleep 30 # launcher-test-marker " .. (arg[3] or ""))
LUA

leftovers() { pgrep -f "launcher-test-marker $1" >/dev/null; }
tmp_empty() { [ -z "$(ls -A "$TMPDIR")" ]; }

# 1. four ranks, prefixes, stdout and stderr apart
"$FSDPRUN" -n 4 "$job" ok >"$work/out" 2>"$work/err"
rc=$?
check "4 ranks exit 0" "[ $rc = 0 ]"
check "stdout has [r] out r for every rank" "[ \$(grep -c '^\[[0-3]\] out [0-3]$' '$work/out') = 4 ] && ! grep -q err '$work/out'"
check "prefix matches the rank" "grep -q '^\[2\] out 2$' '$work/out' && grep -q '^\[3\] err 3$' '$work/err'"
check "stderr has the err lines only" "[ \$(grep -c '^\[[0-3]\] err [0-3]$' '$work/err') = 4 ] && ! grep -q out '$work/err'"
"$FSDPRUN" -n 2 --no-prefix "$job" ok >"$work/out" 2>/dev/null
check "--no-prefix" "grep -qx 'out 1' '$work/out'"
"$FSDPRUN" -n 3 --rank0-only "$job" ok >"$work/out" 2>"$work/err"
check "--rank0-only keeps rank 0's stdout and every stderr" "[ \"\$(cat '$work/out')\" = '[0] out 0' ] && [ \$(wc -l <'$work/err') = 3 ]"
"$FSDPRUN" -n 2 "$job" partial >"$work/out" 2>/dev/null
check "a partial last line is flushed" "grep -qx '\[1\] partial 1' '$work/out'"
check "no temp directory left after success" tmp_empty

# 2-4. a failing rank stops the job within 5 s, named, nothing left behind
fail_case() { # mode expected_rc rank message
  local t0=$SECONDS
  "$FSDPRUN" -n 4 --grace 2 "$job" "$1" "$3" "m$1" >/dev/null 2>"$work/err"
  local rc=$? dt=$((SECONDS - t0))
  check "$1: fsdprun exits $2 (got $rc)" "[ $rc = $2 ]"
  check "$1: within 5 s (took $dt s)" "[ $dt -le 5 ]"
  check "$1: names the rank: $4" "grep -q '$4' '$work/err'"
  sleep 0.2
  check "$1: no rank or child left" "! leftovers m$1"
  check "$1: no temp directory left" tmp_empty
}
fail_case exit 3 2 "rank 2 exited with status 3"
fail_case abort 7 1 "rank 1 called abort (status 7: rank asked to abort)"
fail_case kill 137 0 "rank 0 was killed by signal 9"

# 5. SIGTERM to fsdprun
"$FSDPRUN" -n 3 --grace 1 "$job" wait -1 mterm >/dev/null 2>"$work/err" &
pid=$!
sleep 1
kill -TERM $pid
wait $pid
rc=$?
check "SIGTERM: exit 143 (got $rc)" "[ $rc = 143 ]"
check "SIGTERM: says so" "grep -q 'got Terminated' '$work/err'"
sleep 0.2
check "SIGTERM: no rank or child left" "! leftovers mterm"
check "SIGTERM: no temp directory left" tmp_empty

# ranks that ignore SIGTERM are killed after the grace period
ms() { echo $(($(date +%s%N) / 1000000)); }
"$FSDPRUN" -n 2 --grace 1 --host /bin/sh -c 'trap "" TERM; sleep 30 # launcher-test-marker mgrace' >/dev/null 2>&1 &
pid=$!
sleep 0.5
t0=$(ms)
kill -TERM $pid
wait $pid
dt=$(($(ms) - t0))
check "a rank ignoring SIGTERM gets SIGKILL after --grace 1 (took $dt ms)" "[ $dt -ge 900 ] && [ $dt -le 4000 ] && ! leftovers mgrace"

# --timeout
"$FSDPRUN" -n 2 --timeout 1 --grace 1 "$job" wait -1 mtimeout >/dev/null 2>"$work/err"
rc=$?
check "--timeout: exit 124 (got $rc)" "[ $rc = 124 ] && grep -q 'timeout' '$work/err' && ! leftovers mtimeout"

# 6. singleton: no launcher at all
out=$(env -u FSDPRUN "$HOST" -e 'local i = require("fsdp").init(); print(i.rank, i.size, i.singleton)' 2>&1)
check "singleton: rank 0 of 1 ($out)" "[ \"$out\" = \"0	1	true\" ]"

# 7. option errors
"$FSDPRUN" -n 0 "$job" 2>"$work/err"; rc=$?
check "-n 0: exit 2 with a message" "[ $rc = 2 ] && grep -q 'positive integer' '$work/err'"
"$FSDPRUN" -n x "$job" 2>"$work/err"; rc=$?
check "-n x: exit 2" "[ $rc = 2 ] && grep -q \"got 'x'\" '$work/err'"
"$FSDPRUN" -n 2 "$work/missing.lua" 2>"$work/err"; rc=$?
check "missing file: exit 2 naming it" "[ $rc = 2 ] && grep -q 'missing.lua' '$work/err'"
"$FSDPRUN" --frobnicate 2>"$work/err"; rc=$?
check "unknown option: exit 2" "[ $rc = 2 ] && grep -q \"unknown option '--frobnicate'\" '$work/err'"
"$FSDPRUN" "$job" 2>"$work/err"; rc=$?
check "no -n: exit 2" "[ $rc = 2 ] && grep -q 'give -n N' '$work/err'"

# 8. --help
"$FSDPRUN" --help >"$work/out"
check "--help documents srun, prterun, singleton and every option" \
  "grep -q 'srun --mpi=pmix' '$work/out' && grep -q prterun '$work/out' && grep -q singleton '$work/out' && grep -q -- '--grace' '$work/out' && grep -q -- '--timeout' '$work/out' && grep -q -- '--rank0-only' '$work/out'"

echo "test_launcher: $passed passed, $failed failed"
[ $failed = 0 ]

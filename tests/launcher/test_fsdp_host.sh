#!/usr/bin/env bash
# fsdprun with its default rank program, the fsdp rank host running a Lua
# job file: ranks boot through fsdp.init, a Lua error and fsdp.abort end the
# job, and `fsdp FILE.lua` alone is a singleton.
#   test_fsdp_host.sh FSDPRUN FSDP_HOST
. "$(dirname "$0")/lib.sh"
HOST=$2

job=$work/job.lua
cat >"$job" <<'LUA'
local fsdp = require "fsdp"
local info = fsdp.init()
local mode, who = arg[1] or "ok", tonumber(arg[2] or -1)
print(("rank %d of %d local %d/%d%s"):format(info.rank, info.size, info.local_rank, info.local_size,
  info.singleton and " singleton" or ""))
io.stdout:flush()
if mode == "ok" or info.rank ~= who then
  if mode ~= "ok" then os.execute("sleep 30; : --marker " .. arg[3]) end
  os.exit(0)
end
if mode == "error" then error("rank " .. info.rank .. " fails on purpose") end
if mode == "abort" then fsdp.abort(9, "job asked to abort") end
-- a refusal's message is long (a field, two paths, what to do instead)
if mode == "long" then fsdp.abort(78, "long refusal " .. string.rep("words ", 500) .. "and its end") end
os.execute("sleep 30; : --marker " .. arg[3])
LUA

"$LAUNCHER" -n 3 "$job" ok >"$work/out" 2>"$work/err"
rc=$?
check "3 fsdp ranks: exit 0 (got $rc)" "[ $rc = 0 ]"
for r in 0 1 2; do check "fsdp rank $r: rank $r of 3, prefixed" "grep -qx '\[$r\] rank $r of 3 local $r/3' '$work/out'"; done
no_leftovers "3 fsdp ranks" $MARK

# A Lua error on a rank of several ends the job through fsdp_abort (plain
# srun would ignore an exit status). Under mpirun, srun and prterun, which
# do not print PMIx_Abort's message, the rank prints it itself with its rank
# (tests/scripts/test_launchers.sh); under fsdprun, which does, only fsdprun:
# the message once.
fail_case "a Lua error on rank 1" 1 '^fsdprun: rank 1 called PMIx_Abort with status 1: .*rank 1 fails on purpose' 5000 \
  -n 3 "$job" error 1 $MARK
check "a Lua error on rank 1: the message once" "[ \$(grep -c 'rank 1 fails on purpose' '$work/err') = 1 ]"
fail_case "fsdp.abort on rank 2" 9 '^fsdprun: rank 2 called PMIx_Abort with status 9: job asked to abort' 5000 \
  -n 3 "$job" abort 2 $MARK
check "fsdp.abort on rank 2: the message once" "[ \$(grep -c 'job asked to abort' '$work/err') = 1 ]"
fail_case "a 3000-byte abort message on rank 1" 78 '^fsdprun: rank 1 called PMIx_Abort with status 78: long refusal words .* and its end' 5000 \
  -n 2 "$job" long 1 $MARK

for v in $(env | grep -o '^PMIX_[A-Za-z0-9_]*' | grep -v '^PMIX_MCA_'); do unset "$v"; done
out=$(env -u FSDPRUN "$HOST" "$job" ok 2>&1)
check "fsdp FILE.lua alone: a singleton ($out)" "[ '$out' = 'rank 0 of 1 local 0/1 singleton' ]"

finish

#!/usr/bin/env bash
# What a rank refuses from its launcher and hosts, with the fsdp rank host:
# a singleton whose environment shows several tasks (a launcher without
# PMIx), CPU ranks on several hosts (faked per rank with FSDP_TEST_HOSTS),
# a member that cannot join a group's shared memory, a rank that leaves
# during a fence. Each must fail at once, on every rank, naming the cause.
#   test_launcher_env.sh FSDPRUN FSDP_HOST
. "$(dirname "$0")/lib.sh"
HOST=$2
for v in $(env | grep -o '^PMIX_[A-Za-z0-9_]*' | grep -v '^PMIX_MCA_'); do unset "$v"; done
for v in SLURM_STEP_NUM_TASKS SLURM_NTASKS PMI_SIZE PMI_RANK PMI_FD OMPI_COMM_WORLD_SIZE MV2_COMM_WORLD_SIZE \
  FSDP_SINGLETON FSDP_TEST_HOSTS FSDPRUN; do unset "$v"; done
export FSDP_COMM_TIMEOUT=60 # the old failure mode: waiting this long

job=$work/job.lua
cat >"$job" <<'LUA'
local fsdp = require "fsdp"
local ffi = require "ffi"
ffi.cdef "int setenv(const char *, const char *, int); void _exit(int);"
local mode, dir = arg[1], arg[2]
local info = fsdp.init()
print(("rank %d of %d node %d of %d"):format(info.rank, info.size, info.node_rank, info.num_nodes))
io.stdout:flush()
local ok, e = true, nil
if mode == "group" then
  if dir and info.rank == 1 then ffi.C.setenv("FSDP_SHM_CHUNK", "8192", 1) end -- rank 1 cannot join
  ok, e = pcall(function() fsdp.mesh({ { "dp", info.size } }):group("dp") end)
elseif mode == "leave" then -- rank 1 leaves once the others are inside the fence
  if info.rank == 1 then
    for _ = 1, 200 do
      local n = 0
      for r = 0, info.size - 1 do
        local f = io.open(dir .. "/in." .. r)
        if f then f:close(); n = n + 1 end
      end
      if n == info.size - 1 then break end
      os.execute("sleep 0.05")
    end
    os.execute("sleep 0.5")
    ffi.C._exit(0)
  end
  io.open(dir .. "/in." .. info.rank, "w"):close()
  local rc = fsdp.ffi.C.fsdp_kv_fence(0)
  ok, e = rc == 0, ffi.string(fsdp.ffi.C.fsdp_last_error())
end
print(("rank %d: %s"):format(info.rank, ok and "ok" or tostring(e)))
LUA

# ---- a launcher without PMIx: refused, naming the variable and the flag
for kv in SLURM_STEP_NUM_TASKS=4 SLURM_NTASKS=2 PMI_SIZE=2 PMI_RANK=0 PMI_FD=5 OMPI_COMM_WORLD_SIZE=2; do
  out=$(env "$kv" "$HOST" "$job" none 2>&1)
  rc=$?
  check "singleton with $kv: refused (exit $rc)" "[ $rc != 0 ]"
  check "singleton with $kv: names $kv" "grep -qF '${kv}' <<<\"\$out\""
  check "singleton with $kv: says which launcher gives PMIx" "grep -qF 'srun --mpi=pmix' <<<\"\$out\""
done
out=$(env SLURM_NTASKS=1 SLURM_STEP_NUM_TASKS=1 PMI_SIZE=1 "$HOST" "$job" none 2>&1)
check "singleton with one task: runs" "grep -qx 'rank 0 of 1 node 0 of 1' <<<\"\$out\""
out=$(env SLURM_NTASKS=4 FSDP_SINGLETON=1 "$HOST" "$job" none 2>&1)
check "FSDP_SINGLETON=1 in a job of 4 tasks: runs alone" "grep -qx 'rank 0 of 1 node 0 of 1' <<<\"\$out\""

# ---- CPU ranks on two hosts: every rank fails at once, naming the hosts;
# the node index is dense, from the sorted host names
t0=$(ms)
FSDP_TEST_HOSTS=nb,nb,na,na "$LAUNCHER" -n 4 "$job" group >"$work/out" 2>"$work/err"
dt=$(($(ms) - t0))
check "two hosts: within 10 s (took $dt ms)" "[ $dt -le 10000 ]"
for r in 0 1 2 3; do
  node=$((r < 2 ? 1 : 0))
  check "two hosts: rank $r is node $node of 2" "grep -qx '\[$r\] rank $r of 4 node $node of 2' '$work/out'"
  check "two hosts: rank $r refuses, naming the hosts" \
    "grep -q '^\[$r\] rank $r: .*the CPU transport is one host only.*ranks 0, 1 on nb; ranks 2, 3 on na' '$work/out'"
done
FSDP_TEST_HOSTS=h,h "$LAUNCHER" -n 2 "$job" group >"$work/out" 2>"$work/err"
check "one host named alike: the group works" "[ \$(grep -c ': ok$' '$work/out') = 2 ]"
FSDP_TEST_HOSTS=a,b,c "$LAUNCHER" -n 2 "$job" none >"$work/out" 2>"$work/err"
check "FSDP_TEST_HOSTS of the wrong length: refused" "grep -q 'FSDP_TEST_HOSTS=.* must list 2' '$work/err'"
no_leftovers "hosts" $MARK

# ---- a member that cannot join: the others hear of it at once
t0=$(ms)
"$LAUNCHER" -n 3 "$job" group chunk >"$work/out" 2>"$work/err"
dt=$(($(ms) - t0))
check "a member cannot join: within 10 s (took $dt ms)" "[ $dt -le 10000 ]"
for r in 0 2; do
  check "a member cannot join: rank $r names rank 1" \
    "grep -q '^\[$r\] rank $r: .*rank 1 (member 1) could not join the group: .*FSDP_SHM_CHUNK' '$work/out'"
done

# ---- a rank leaves during a fence: the others name it
mkdir -p "$work/fence"
"$LAUNCHER" -n 3 "$job" leave "$work/fence" >"$work/out" 2>"$work/err"
for r in 0 2; do
  check "a rank leaves during a fence: rank $r names rank 1" \
    "grep -q '^\[$r\] rank $r: kv_fence: rank 1 left the job during the fence' '$work/out'"
done
grep -q ': ok$' "$work/out" && sed 's/^/    out: /' "$work/out"

finish

#!/usr/bin/env bash
# A rank that dies while a CPU group is being created leaves no segment in
# /dev/shm once fsdprun has returned: fsdprun removes the job's segments
# ("fsdp.<its namespace>.*") however the job ends. The deaths come from the
# library's test hook (FSDP_TEST_SHM_DIE=RANK:WHERE): the leader right after
# creating the segment (nobody else knows its name), a member once it has
# mapped it. A good job leaves none either.
#   test_shm_cleanup.sh FSDPRUN FSDP_HOST
. "$(dirname "$0")/lib.sh"
HOST=$2
export FSDP_COMM_TIMEOUT=30

job=$work/job.lua
cat >"$job" <<'LUA'
local fsdp = require "fsdp"
local info = fsdp.init()
local mesh = fsdp.mesh({ { "dp", info.size } })
mesh:group("dp"):barrier()
print("done " .. info.rank)
LUA

segments() { ls /dev/shm 2>/dev/null | grep -c "^fsdp\.fsdprun-$1\." ; }

# run_case NAME HOOK RC: the job on 3 ranks; fsdprun's exit status (RC, or
# "fail": any but 0: a survivor may abort before the dead rank is noticed),
# and this job's segments in /dev/shm afterwards (none)
run_case() {
  local name=$1 hook=$2 want_rc=$3
  FSDP_TEST_SHM_DIE=$hook FSDPRUN_HOST="$HOST" "$LAUNCHER" -n 3 --oversubscribe --grace 1 --timeout 40 "$job" \
    >"$work/out" 2>"$work/err" &
  local pid=$!
  wait $pid
  local rc=$?
  if [ "$want_rc" = fail ]; then
    check "$name: fsdprun fails (got $rc)" "[ $rc != 0 ]"
  else
    check "$name: fsdprun exits $want_rc (got $rc)" "[ $rc = $want_rc ]"
  fi
  local left
  left=$(segments $pid)
  check "$name: no segment of the job left in /dev/shm (found $left)" "[ '$left' = 0 ]"
}

run_case "the leader dies after creating the segment" "0:created" fail
run_case "a member dies after mapping it" "2:mapped" fail
run_case "a good job" "" 0
finish

-- fsdp.restarts: what a training run knows of `fsdprun --max-restarts N`.
-- fsdprun tells the ranks which attempt this is (FSDP_RESTART_ATTEMPT: 0 the
-- first start, k the k-th restart) and how many restarts it allows
-- (FSDP_MAX_RESTARTS). The step lines and the metrics show the attempt when
-- restarts are on (or this is one); otherwise nothing changes.
--
-- FSDP_TEST_KILL_AT = "ATTEMPT:RANK:STEP[,...]": the tests' way to fail a
-- rank: in that attempt, that rank SIGKILLs itself as step STEP begins
-- (STEP 0: once its run is recorded in checkpoint.dir, before a
-- checkpoint.overwrite removes the old checkpoints).
local ffi = require "ffi"

local M = {}

-- {attempt = k, max = N}, or nil when fsdprun has no restarts to tell of
function M.current()
  local attempt = tonumber(os.getenv("FSDP_RESTART_ATTEMPT") or "")
  local max = tonumber(os.getenv("FSDP_MAX_RESTARTS") or "")
  if (attempt or 0) <= 0 and (max or 0) <= 0 then return nil end
  return { attempt = attempt or 0, max = max or 0 }
end

-- the step line's part: " | restart k/N"
function M.suffix(cur)
  return cur and string.format(" | restart %d/%d", cur.attempt, cur.max) or ""
end

-- On a restart by fsdprun (attempt >= 1, train.resume=auto its appended last
-- argument): true and what the first attempt's train.resume was (nil, "auto"
-- or a path): a restart continues its own run (fsdp.dir_lock's record),
-- and where that run never saved, begins as the first attempt did.
-- Otherwise false.
function M.original_resume(recipe, args)
  local cur = M.current()
  if not cur or cur.attempt < 1 or args[#args] ~= "train.resume=auto" then return false end
  local v = type(recipe.train) == "table" and recipe.train.resume or nil
  for i = 1, #args - 1 do v = args[i]:match("^train%.resume=(.*)$") or v end
  return true, v
end

local kills
function M.test_kill(cur, rank, step)
  if kills == nil then
    kills = {}
    for a, r, s in (os.getenv("FSDP_TEST_KILL_AT") or ""):gmatch("(%d+):(%d+):(%d+)") do
      kills[a .. ":" .. r .. ":" .. s] = true
    end
  end
  if kills[string.format("%d:%d:%d", cur and cur.attempt or 0, rank, step)] then
    pcall(ffi.cdef, "int raise(int sig);")
    io.stdout:flush()
    ffi.C.raise(9) -- SIGKILL: no handler, no cleanup, as a node failure
  end
end

return M

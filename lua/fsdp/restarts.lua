-- fsdp.restarts: what a training run knows of `fsdprun --max-restarts N`.
-- fsdprun tells the ranks which attempt this is (FSDP_RESTART_ATTEMPT: 0 the
-- first start, k the k-th restart) and how many restarts it allows
-- (FSDP_MAX_RESTARTS). The step lines and the metrics show the attempt when
-- restarts are on (or this is one); otherwise nothing changes.
--
-- FSDP_TEST_KILL_AT = "ATTEMPT:RANK:STEP[,...]": the tests' way to fail a
-- rank: in that attempt, that rank SIGKILLs itself as step STEP begins.
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

-- The checkpoint the first attempt began from, where it named one: fsdprun
-- appends train.resume=auto to a restart's arguments (their last), which
-- finds nothing until the run has saved in checkpoint.dir; until then a
-- restart begins from that checkpoint again (the trainer), not from step 1.
-- recipe: the recipe's table before the arguments apply; args: its arguments.
function M.first_resume(recipe, args)
  local cur = M.current()
  if not cur or cur.attempt < 1 or args[#args] ~= "train.resume=auto" then return nil end
  local v = type(recipe.train) == "table" and recipe.train.resume or nil
  for i = 1, #args - 1 do v = args[i]:match("^train%.resume=(.*)$") or v end
  return v ~= "auto" and v or nil
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

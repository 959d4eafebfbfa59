-- fsdp.dir_lock: one job per checkpoint directory, and what a restarted job
-- continues. Rank 0 holds an advisory lock on DIR/.fsdp-lock for the job's
-- life (src/io/dir_lock.c: the kernel drops it when the process ends, so a
-- crash leaves none) and writes there who holds it: host, process, fsdprun
-- job (FSDPRUN_JOB_ID, the same across --max-restarts), attempt and run id.
-- A second job into the same directory is refused, naming the first; a
-- restarted job finds its previous attempt's record there, and with it the
-- run it must continue (never another run's history).
--
--   local lock = dir_lock.take(s, dir, where)  -- every rank; raises when held
--   lock.previous                              -- the last holder's record, or nil
--   dir_lock.record(lock, {run = id, attempt = k})
--   dir_lock.release(lock)
local base = require "fsdp.ffi"
local collective = require "fsdp.collective"
local ffi, C = base.ffi, base.C

local M = {}
M.file = ".fsdp-lock"

pcall(ffi.cdef, "int gethostname(char *name, size_t len); int getpid(void);")

local function hostname()
  local buf = ffi.new("char[256]")
  return ffi.C.gethostname(buf, 255) == 0 and ffi.string(buf) or "unknown"
end

-- "key=value key=value" (values without spaces) <-> a table
function M.parse(text)
  if not text or not text:find("=") then return nil end
  local t = {}
  for k, v in text:gmatch("([%w_]+)=(%S+)") do t[k] = v end
  return t
end

function M.format(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do out[#out + 1] = k .. "=" .. tostring(t[k]):gsub("%s", "_") end
  return table.concat(out, " ") .. "\n"
end

-- The refusal of a second job: who holds dir, and what to do.
function M.held_message(dir, holder)
  local h = M.parse(holder) or {}
  return string.format("checkpoint.dir %s is in use by another job: its rank 0 is process %s on host %s (fsdprun job %s, " ..
    "started %s, run %s). Two jobs saving into one directory would replace each other's checkpoints: wait for that job " ..
    "to end (a requeued job still running), or give this one its own checkpoint.dir", dir, h.pid or "?", h.host or "?",
    h.job or "none", h.started or "?", h.run or "?")
end

-- Collective. Raises "where: ..." on every rank when another process holds
-- the lock (or it cannot be taken); returns {fd (rank 0), previous}.
function M.take(s, dir, where)
  local r = collective.world(s)
  local fd, previous, err = -1, nil, nil
  if r == 0 then
    local pfd = ffi.new("int[1]")
    local holder = ffi.new("char[1024]")
    local rc = C.fsdp_dir_lock_take(dir .. "/" .. M.file, pfd, holder, 1024)
    if rc == C.FSDP_EBUSY then
      err = M.held_message(dir, ffi.string(holder))
    elseif rc < 0 then
      err = string.format("checkpoint.dir %s: cannot take its lock: %s", dir, ffi.string(C.fsdp_last_error()))
    else
      fd = pfd[0]
      local buf = ffi.new("char[1024]")
      if C.fsdp_dir_lock_read(fd, buf, 1024) == 0 then previous = ffi.string(buf) end
    end
  end
  -- every rank learns rank 0's verdict and the previous record, the same
  local text = collective.share_text(s, r == 0 and (err and ("!" .. err) or (previous or "")) or nil)
  if text:sub(1, 1) == "!" then error(where .. ": " .. text:sub(2), 0) end
  return { fd = fd, dir = dir, previous = M.parse(text) }
end

-- Rank 0 writes who holds the lock now (fields: run, attempt, ...).
function M.record(lock, fields)
  if not lock or lock.fd < 0 then return end
  local t = { host = hostname(), pid = ffi.C.getpid(), job = os.getenv("FSDPRUN_JOB_ID") or "none",
    started = os.date("!%Y-%m-%dT%H:%M:%SZ") }
  for k, v in pairs(fields or {}) do t[k] = v end
  base.check(C.fsdp_dir_lock_write(lock.fd, M.format(t)), "checkpoint.dir lock")
end

function M.release(lock)
  if lock and lock.fd >= 0 then
    C.fsdp_dir_lock_release(lock.fd)
    lock.fd = -1
  end
end

return M

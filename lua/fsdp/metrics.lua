-- fsdp.metrics: the run's own record, one JSON object per line (JSONL),
-- kept as one history across resumes and honest about what it could not
-- write.
--
--   local m = metrics.open(path, {resumed_at = step})
--   m:record{step = 5, loss = 2.31, ...}   -- false once a write has failed
--   m:close()
--
-- * A resumed run (resumed_at = the checkpoint's step) keeps the records
--   of the steps up to that one and drops those after it (steps the killed
--   run made after its last checkpoint, which this run trains again), so
--   the file reads as one run. The kept part is rewritten beside the file
--   and renamed over it: a crash in between leaves the old file whole.
-- * Numbers that are not finite are written as null, and the record says
--   what they were in "nonfinite": {"loss": "nan", "grad_norm": "inf"}:
--   every JSON reader accepts the line (Python's json rejects a bare inf).
-- * A failed write (a full disk) does not stop training: the first one is
--   reported (the caller says so on the step line), and the file is not
--   written again: at most its last record is cut, never one in the middle.
--   Nor does one at a resume (rewriting the kept records): the run goes on
--   without metrics, saying so.
local M = {}
local Metrics = {}
Metrics.__index = Metrics

local function nonfinite_name(v)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
end

local function quote(s)
  return '"' .. tostring(s):gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end) .. '"'
end

-- One record as a JSON object: "step" first, the other keys sorted; nil
-- values are left out.
function M.encode(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return a == "step" or (b ~= "step" and a < b) end)
  local parts, bad = {}, {}
  for _, k in ipairs(keys) do
    local v, text = t[k], nil
    if type(v) == "number" then
      local nf = nonfinite_name(v)
      if nf then bad[#bad + 1] = quote(k) .. ":" .. quote(nf) end
      text = nf and "null" or (v % 1 == 0 and math.abs(v) < 2 ^ 53 and string.format("%.0f", v) or string.format("%.17g", v))
    elseif type(v) == "boolean" then
      text = tostring(v)
    else
      text = quote(v)
    end
    parts[#parts + 1] = quote(k) .. ":" .. text
  end
  if #bad > 0 then parts[#parts + 1] = '"nonfinite":{' .. table.concat(bad, ",") .. "}" end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- the step a record line belongs to (nil for a damaged line)
local function step_of(line)
  local s = line:match('^{"step":(%d+)[,}]')
  return s and line:sub(-1) == "}" and tonumber(s) or nil
end

-- Keeps the lines of steps <= last in path (rewritten through a temporary
-- file and a rename); returns how many records were dropped.
local function keep_through(path, last, where)
  local f = io.open(path, "rb")
  if not f then return 0 end
  local kept, dropped = {}, 0
  for line in f:lines() do
    local s = step_of(line)
    if s and s <= last then kept[#kept + 1] = line else dropped = dropped + 1 end
  end
  f:close()
  if dropped == 0 then return 0 end
  local tmp = path .. ".resume-tmp"
  local out = io.open(tmp, "wb")
  local ok = out and out:write(#kept > 0 and table.concat(kept, "\n") .. "\n" or "") and out:flush()
  if out then out:close() end
  if not ok or not os.rename(tmp, path) then
    os.remove(tmp)
    error(string.format("%s: train.metrics: cannot rewrite %s to keep the records up to step %d (disk full or read-only?)",
      where, path, last), 0)
  end
  return dropped
end

-- Opens the metrics file: truncated for a fresh run, continued after the
-- kept records for a resumed one (opts.resumed_at). A fresh run that cannot
-- write it is refused (errors name the field). A resumed one goes on
-- without it, as a run whose write failed mid-way does: recovering from a
-- fault must not hang on a full metrics disk (every restart would fail
-- the same way); self.failed says why, for the caller to warn once.
function M.open(path, opts)
  opts = opts or {}
  local where = opts.where or "recipe"
  local dropped = 0
  local ok, err = true, nil
  if opts.resumed_at then ok, err = pcall(function() dropped = keep_through(path, opts.resumed_at, where) end) end
  local f
  if ok then f, err = io.open(path, opts.resumed_at and "ab" or "wb") end
  if not f and not opts.resumed_at then
    error(string.format("%s: train.metrics: cannot write %s (%s)", where, path, tostring(err)), 0)
  end
  return setmetatable({ f = f, path = path, dropped = dropped,
    failed = not f and tostring(err):gsub("^" .. where:gsub("%p", "%%%0") .. ": train%.metrics: ", "") or nil }, Metrics)
end

-- Writes one record; false (and self.failed, the reason) once a write has
-- failed. The caller reports self.failed the first time.
function Metrics:record(t)
  if self.failed then return false end
  local ok, err = self.f:write(M.encode(t), "\n")
  if ok then ok, err = self.f:flush() end
  if not ok then
    self.failed = tostring(err)
    return false
  end
  return true
end

function Metrics:close()
  if self.f then self.f:close() end
  self.f = nil
end

return M

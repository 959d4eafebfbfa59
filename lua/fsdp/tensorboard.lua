-- fsdp.tensorboard: the trainer's scalars as TensorBoard event files
-- (train.tensorboard = DIR), beside fsdp.metrics' JSONL and kept as one
-- history across resumes the same way.
--
--   local tb = tensorboard.open(dir, {resumed_at = step, where = "r.lua"})
--   tb:record{step = 5, loss = 2.31, ...}   -- false once a write has failed
--   tb:close()
--
-- The format is TensorFlow's, written by hand (no TensorFlow, no protobuf
-- library): a file of TFRecords, each the data's length (8 bytes, little
-- endian), that length's masked CRC-32C, the data, the data's masked
-- CRC-32C; each record's data one serialized tensorflow.Event. The first
-- says the format ({wall_time, file_version = "brain.Event:2"}); then one
-- event per metrics record: {wall_time, step, summary = {value = {tag,
-- simple_value}, ...}}, the numbers the record has under M.tags as float32,
-- NaN and inf as they are (TensorBoard reads and plots them).
-- * A fresh run removes the event files an earlier run left in DIR
--   (TensorBoard would show them as this run, each step twice; as
--   train.metrics rewrites its file) and starts
--   events.out.tfevents.<unix seconds>.<host>.
-- * A resumed run (resumed_at = the checkpoint's step) keeps, in every event
--   file in DIR, the events up to that step, and drops the later ones (the
--   killed run's, which this run trains again) and a record cut by the kill
--   or failing its CRCs (with all after it: a file cannot be read past a
--   bad length). A file losing some is written anew beside it and renamed
--   over it, so a crash in between leaves it whole. The run appends to the
--   newest file.
-- * A failed write (a full disk) does not stop training: record returns
--   false and self.failed says why (the caller warns once), and nothing more
--   is written. Nor does one at a resume: the run goes on without events.
--   A fresh run that cannot create DIR or its file is refused, naming the
--   field.
local base = require "fsdp.ffi"
local ffi, C, bit = base.ffi, base.C, require "bit"

local M = {}
local Board = {}
Board.__index = Board

assert(ffi.abi("le"), "fsdp.tensorboard writes little-endian numbers by copying them")
pcall(ffi.cdef, "int gethostname(char *name, size_t len);")
pcall(ffi.cdef, "typedef struct { long sec, usec; } fsdp_tb_timeval; int gettimeofday(fsdp_tb_timeval *tv, void *tz);")

-- a metrics record's fields and their tags (the others are not scalars to plot)
M.tags = {
  loss = "train/loss", val_loss = "val/loss", lr = "train/lr", grad_norm = "train/grad_norm",
  tokens_per_s = "train/tokens_per_s", step_time_s = "train/step_time_s", mfu = "train/mfu",
  gemm_frac = "train/gemm_frac", tokens = "train/tokens", host_step_s = "train/host_step_s",
  mem_bytes = "memory/peak_bytes", mem_reserved_bytes = "memory/reserved_bytes",
}

-- ---- protobuf, the few wire types an Event needs

local function varint(n) -- n: an integer in [0, 2^53)
  local out = {}
  repeat
    local b = n % 128
    n = (n - b) / 128
    out[#out + 1] = string.char(n > 0 and b + 128 or b)
  until n == 0
  return table.concat(out)
end

local function bytes_field(num, s) return string.char(num * 8 + 2) .. varint(#s) .. s end
local function double(v) return ffi.string(ffi.new("double[1]", v), 8) end
local function float(v) return ffi.string(ffi.new("float[1]", v), 4) end

-- One tensorflow.Event: wall_time (1, double), step (2, int64; left out at
-- 0, as proto3 does), file_version (3, string), summary (5: repeated value
-- (1): tag (1, string), simple_value (2, float)). values: {{tag, number}, ...}
function M.event(wall_time, step, values, file_version)
  local parts = { "\9" .. double(wall_time) }
  if step and step ~= 0 then parts[#parts + 1] = "\16" .. varint(step) end
  if file_version then parts[#parts + 1] = bytes_field(3, file_version) end
  if values and #values > 0 then
    local vs = {}
    for i, v in ipairs(values) do vs[i] = bytes_field(1, bytes_field(1, v[1]) .. "\21" .. float(v[2])) end
    parts[#parts + 1] = bytes_field(5, table.concat(vs))
  end
  return table.concat(parts)
end

-- reads a varint at pos of s: its value (exact below 2^53) and the next position
local function read_varint(s, pos)
  local v, scale = 0, 1
  for i = pos, math.min(pos + 9, #s) do
    local b = s:byte(i)
    v = v + (b % 128) * scale
    if b < 128 then return v, i + 1 end
    scale = scale * 128
  end
end

-- the step of an Event's bytes (0 when absent), nil when they do not parse
local function event_step(d)
  local pos, step = 1, 0
  while pos <= #d do
    local key, v
    key, pos = read_varint(d, pos)
    if not key then return nil end
    local wire = key % 8
    if wire == 0 then
      v, pos = read_varint(d, pos)
      if not v then return nil end
      if key == 16 then step = v end
    elseif wire == 1 then pos = pos + 8
    elseif wire == 5 then pos = pos + 4
    elseif wire == 2 then
      v, pos = read_varint(d, pos)
      if not v then return nil end
      pos = pos + v
    else
      return nil
    end
  end
  return pos == #d + 1 and step or nil
end

-- ---- TFRecord

-- CRC-32C rotated and offset, as TFRecord stores it (a CRC of data holding
-- CRCs is then not trivially related to them)
function M.masked_crc(s)
  local c = C.fsdp_crc32c(0, s, #s)
  return (bit.bor(bit.rshift(c, 15), bit.lshift(c, 17)) % 2 ^ 32 + 0xa282ead8) % 2 ^ 32
end

local function le(n, bytes)
  local out = {}
  for i = 1, bytes do
    out[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(out)
end

local function read_le(s, pos, bytes)
  local n = 0
  for i = pos + bytes - 1, pos, -1 do n = n * 256 + s:byte(i) end
  return n
end

function M.frame(data)
  local len = le(#data, 8)
  return len .. le(M.masked_crc(len), 4) .. data .. le(M.masked_crc(data), 4)
end

-- A file's records up to the first that is cut or fails a CRC: {{bytes =
-- the framed record, step = its event's}, ...}, and whether any bytes follow.
function M.records(text)
  local out, pos = {}, 1
  while pos + 11 <= #text do
    local len = text:sub(pos, pos + 7)
    if read_le(text, pos + 8, 4) ~= M.masked_crc(len) then break end
    local n = read_le(len, 1, 8)
    if pos + 15 + n > #text then break end
    local data = text:sub(pos + 12, pos + 11 + n)
    local step = read_le(text, pos + 12 + n, 4) == M.masked_crc(data) and event_step(data)
    if not step then break end
    out[#out + 1] = { bytes = text:sub(pos, pos + 15 + n), step = step }
    pos = pos + 16 + n
  end
  return out, pos <= #text
end

-- ---- the directory

local function is_event_file(name) return name:match("^events%.out%.tfevents%.") ~= nil end

local function list(dir) -- the event files in dir, oldest name first
  local n = tonumber(C.fsdp_fs_list(dir, nil, 0))
  local buf = n > 0 and ffi.new("char[?]", n + 1)
  if n < 0 or (n > 0 and tonumber(C.fsdp_fs_list(dir, buf, n + 1)) < 0) then
    error(string.format("cannot list %s (%s)", dir, ffi.string(C.fsdp_last_error())), 0)
  end
  local names = {}
  for name in (n > 0 and ffi.string(buf, n) or ""):gmatch("([^\n]+)\n") do
    if is_event_file(name) then names[#names + 1] = name end
  end
  table.sort(names)
  return names
end

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then error(string.format("cannot read %s (%s)", path, tostring(err)), 0) end
  local text = f:read("*a")
  f:close()
  return text
end

-- Keeps the events of steps <= last in path (rewritten through tmp and a
-- rename when any go); returns how many went (a damaged tail counts one)
-- and whether the file now holds any record.
local function keep_through(path, last, tmp)
  local recs, tail = M.records(read_file(path))
  local kept = {}
  for _, r in ipairs(recs) do if r.step <= last then kept[#kept + 1] = r.bytes end end
  local dropped = #recs - #kept + (tail and 1 or 0)
  if dropped == 0 then return 0, #kept > 0 end
  local out = io.open(tmp, "wb")
  local ok = out and out:write(table.concat(kept)) and out:flush()
  if out then out:close() end
  if not ok or not os.rename(tmp, path) then
    os.remove(tmp)
    error(string.format("cannot rewrite %s to keep the events up to step %d (disk full or read-only?)", path, last), 0)
  end
  return dropped, #kept > 0
end

local function hostname()
  local buf = ffi.new("char[256]")
  local name = ffi.C.gethostname(buf, 255) == 0 and ffi.string(buf) or ""
  name = name:gsub("[^%w%-_.]", "_")
  return name ~= "" and name or "localhost"
end

local function wall_time()
  local tv = ffi.new("fsdp_tb_timeval")
  if ffi.C.gettimeofday(tv, nil) ~= 0 then return os.time() end
  return tonumber(tv.sec) + tonumber(tv.usec) / 1e6
end

-- The file this run appends to, opened, and how many events the resume
-- dropped: for a fresh run a new file (the old ones removed); for a
-- resumed one the newest file, after every file kept only its events up
-- to resumed_at.
local function open_file(dir, resumed_at)
  if C.fsdp_fs_mkdirs(dir) < 0 then
    error(string.format("cannot create the directory %s (%s)", dir, ffi.string(C.fsdp_last_error())), 0)
  end
  local names, dropped, headerless = list(dir), 0, true
  local tmp = dir .. "/.fsdp-tensorboard.tmp" -- (no "tfevents" in its name: TensorBoard does not read it)
  os.remove(tmp) -- a crash's leftover
  for _, name in ipairs(names) do
    local path = dir .. "/" .. name
    if resumed_at then
      local d, any = keep_through(path, resumed_at, tmp)
      dropped, headerless = dropped + d, not any
    elseif not os.remove(path) then
      error(string.format("cannot remove %s, an earlier run's events", path), 0)
    end
  end
  local path = resumed_at and names[#names] and dir .. "/" .. names[#names] or
    string.format("%s/events.out.tfevents.%d.%s", dir, os.time(), hostname())
  local f, err = io.open(path, resumed_at and "ab" or "wb")
  if not f then error(string.format("cannot write %s (%s)", path, tostring(err)), 0) end
  if headerless and not (f:write(M.frame(M.event(wall_time(), 0, nil, "brain.Event:2"))) and f:flush()) then
    f:close()
    error(string.format("cannot write %s (disk full?)", path), 0)
  end
  return f, path, dropped
end

-- Opens the event file in dir (errors and a resumed run's failures as the
-- header says; self.failed is the reason for the caller to warn once).
function M.open(dir, opts)
  opts = opts or {}
  local ok, f, path, dropped = pcall(open_file, dir, opts.resumed_at)
  if not ok and not opts.resumed_at then
    error(string.format("%s: train.tensorboard: %s", opts.where or "recipe", tostring(f)), 0)
  end
  return setmetatable({ dir = dir, f = ok and f or nil, path = ok and path or nil, dropped = ok and dropped or 0,
    failed = not ok and tostring(f) or nil }, Board)
end

-- One event with the record's numbers under M.tags (sorted by tag); false
-- (and self.failed, the reason) once a write has failed.
-- (fsdp.metrics' record writes and flushes the same way, on purpose apart:
-- one helper shared by both, fed a concatenated string, let Debian's LuaJIT
-- 2.1 (2022) report a write to a full disk as done in ~15% of trainer runs,
-- and never with the JIT off for it; this writer is checked against
-- /dev/full in the trainer and in lua_tensorboard)
function Board:record(t)
  if self.failed then return false end
  local values = {}
  for field, tag in pairs(M.tags) do
    if type(t[field]) == "number" then values[#values + 1] = { tag, t[field] } end
  end
  if #values == 0 then return true end
  table.sort(values, function(a, b) return a[1] < b[1] end)
  local ok, err = self.f:write(M.frame(M.event(wall_time(), t.step, values)))
  if ok then ok, err = self.f:flush() end
  if not ok then
    self.failed = tostring(err)
    return false
  end
  return true
end

function Board:close()
  if self.f then self.f:close() end
  self.f = nil
end

return M

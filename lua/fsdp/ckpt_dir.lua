-- fsdp.ckpt_dir: a checkpoint directory as the trainer and fsdp generate
-- see it: its step-N checkpoints (oldest first), which of them open (index
-- and files checked, no weight read), `latest`, each one's meta, and the one
-- history a directory holds (run ids: a run never saves among another's).
-- fsdp.checkpoint (the save and load protocol) re-exports these.
local base = require "fsdp.ffi"
local collective = require "fsdp.collective"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}

local function last_error() return ffi.string(C.fsdp_last_error()) end


function M.list(dir)
  local n = tonumber(C.fsdp_fs_list(dir, nil, 0))
  check(n, "checkpoint: list '" .. dir .. "'")
  local buf = ffi.new("char[?]", n + 1)
  check(tonumber(C.fsdp_fs_list(dir, buf, n + 1)), "checkpoint: list '" .. dir .. "'")
  local names = {}
  for name in ffi.string(buf, n):gmatch("([^\n]+)\n") do names[#names + 1] = name end
  table.sort(names)
  return names
end

-- the step-* directories under dir, oldest first
function M.step_dirs(dir)
  local steps = {}
  for _, e in ipairs(M.list(dir)) do if e:match("^step%-%d+$") then steps[#steps + 1] = e end end
  return steps
end

function M.exists(path) return C.fsdp_fs_stat(path, nil, nil) == 0 end


-- a whole file's bytes, or nil when it cannot be read
function M.read_text(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local t = f:read("*a")
  f:close()
  return t
end

function M.open(path)
  local h = ffi.new("fsdp_ckpt *[1]")
  local rc = C.fsdp_ckpt_open(path, h)
  if rc < 0 then return nil, last_error() end
  return ffi.gc(h[0], C.fsdp_ckpt_close)
end

-- The newest checkpoint under dir that opens (its index and files check
-- out): the newest step-* directory, which is the one `latest` names unless
-- a save stopped between its rename and `latest`'s update. nil when there
-- is none; the second value says what was skipped and why.
function M.latest(dir)
  local paths, skipped = M.candidates(dir)
  return paths[1], skipped
end

-- Every checkpoint under dir that opens, newest first, and what was skipped
-- (nil: nothing). Opening checks the index, not the data: resume=auto loads
-- the first and falls back to the next when its data is damaged (load's
-- o.skip_damaged), so the data is read once, by the load itself.
function M.candidates(dir)
  local skipped, paths = {}, {}
  local steps = M.step_dirs(dir)
  for i = #steps, 1, -1 do
    local path = dir .. "/" .. steps[i]
    local h, err = M.open(path)
    if h then
      C.fsdp_ckpt_close(ffi.gc(h, nil))
      paths[#paths + 1] = path
    else
      skipped[#skipped + 1] = err
    end
  end
  return paths, #skipped > 0 and table.concat(skipped, "; ") or nil
end

-- The checkpoint name dir/latest holds, or nil when there is no such file:
-- its presence proves that a run saved in dir.
function M.latest_name(dir)
  local t = M.read_text(dir .. "/latest")
  return t and (t:match("^%s*(.-)%s*$")) or nil
end

-- meta values saved with the checkpoint (numbers and strings)
function M.meta_of(h)
  local m = {}
  local num, buf = ffi.new("double[1]"), ffi.new("char[?]", 4096)
  for _, k in ipairs({ "step", "optimizer_step", "consumed", "seed", "world", "zero", "lr", "skipped", "seq", "micro_batch",
    "windows", "dp", "grad_accum", "global_batch_tokens" }) do
    if C.fsdp_ckpt_meta_number(h, k, num) == 0 then m[k] = base.f64(num) end
  end
  for _, k in ipairs({ "optimizer", "param_dtype", "mesh", "model", "run_id" }) do
    if C.fsdp_ckpt_meta_string(h, k, buf, 4096) == 0 then m[k] = ffi.string(buf) end
  end
  return m
end

-- ---- histories ----
-- A checkpoint records the run id of its history (meta.run_id): a new run
-- draws one, a resumed run keeps its checkpoint's. A directory holds one
-- history: a run that would save among another run's checkpoints, or among
-- checkpoints newer than the step it starts from (a branch of an older
-- one), would replace them, re-point `latest` and let keep_last delete the
-- other history's. Checkpoints saved before run ids existed match any run.

-- A new run id, the same on every rank of s (collective): 48 random bits
-- drawn by rank 0, as 12 hex digits. Ranks must agree on it: each one
-- checks checkpoint.dir against it, and a rank that refused alone would
-- leave the others waiting in a collective.
function M.new_run_id(s)
  local bits = 0
  if collective.world(s) == 0 then
    local f, bytes = io.open("/dev/urandom", "rb"), nil
    if f then bytes = f:read(6); f:close() end
    if bytes and #bytes == 6 then
      for i = 1, 6 do bits = bits * 256 + bytes:byte(i) end
    else -- no /dev/urandom: the clock
      bits = math.floor(os.time() * 1e6 + C.fsdp_time_now() * 1e6) % 2 ^ 48
    end
  end
  return string.format("%012x", collective.share_ints(s, 1, { [0] = bits })(0))
end

-- The meta table of the checkpoint at path (its index checked, no weight read)
function M.meta(path)
  local h, err = M.open(path)
  if not h then error(err, 0) end
  local m = M.meta_of(h)
  C.fsdp_ckpt_close(ffi.gc(h, nil))
  return m
end

-- {name, step, run_id (nil: not recorded)} of dir/name, or nil when it
-- does not open (a damaged checkpoint cannot be resumed: nobody's history)
function M.checkpoint_of(dir, name)
  local ok, m = pcall(M.meta, dir .. "/" .. name)
  return ok and { name = name, step = tonumber(name:match("%d+")), run_id = m.run_id } or nil
end

-- the checkpoints in dir that open, oldest first
function M.history(dir)
  local out = {}
  for _, name in ipairs(M.step_dirs(dir)) do out[#out + 1] = M.checkpoint_of(dir, name) end
  return out
end

-- checkpoint.overwrite: a run starting over in dir removes its checkpoints
-- (step-* and latest) first; returns the names removed
function M.clear(dir)
  local steps = M.step_dirs(dir)
  for _, name in ipairs(steps) do check(C.fsdp_fs_remove_tree(dir .. "/" .. name), "checkpoint.overwrite: remove") end
  check(C.fsdp_fs_remove_tree(dir .. "/latest"), "checkpoint.overwrite: remove")
  return steps
end

function M.another_run(dir, c, run_id)
  return string.format("%s/%s belongs to another run (run %s; this run is %s): one checkpoint directory holds one history. " ..
    "Give this run its own checkpoint.dir", dir, c.name, c.run_id, run_id)
end

-- Raises unless run run_id, starting after step `from`, may save into dir:
-- no checkpoint of another run there, and none newer than `from`, but for
-- the names in `damaged` (a set: checkpoints whose data failed its CRC,
-- which this run's saves replace).
function M.check_history(dir, run_id, from, damaged)
  for _, c in ipairs(M.history(dir)) do
    if damaged and damaged[c.name] then
      -- skipped: this run replaces it
    elseif c.step > from then
      error(string.format("%s/%s (run %s) is newer than step %d, where this run starts: saving in %s would replace it or " ..
        "pass it with another history. Go on from the newest with train.resume=auto, or start over: give this run its " ..
        "own checkpoint.dir (a branch from an older checkpoint needs one), or checkpoint.overwrite=true to remove %s's " ..
        "checkpoints first", dir, c.name, c.run_id or "not recorded", from, dir, dir), 0)
    elseif c.run_id and c.run_id ~= run_id then
      error(M.another_run(dir, c, run_id), 0)
    end
  end
end

return M

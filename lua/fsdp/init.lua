-- fsdp: the Lua front end of the engine. `local fsdp = require "fsdp"` in
-- the rank host (`fsdp`, `fsdprun`) or any LuaJIT (with FSDP_LIB and
-- FSDP_HEADER set when the package is used outside the source tree).
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local stream = require "fsdp.stream"
local mesh = require "fsdp.mesh"
local pretty = require "fsdp.pretty"
local nn = require "fsdp.nn"
local shard = require "fsdp.shard"
local ffi, C, check = base.ffi, base.C, base.check

local fsdp = {
  C = C, ffi = ffi, check = check, prefixed = base.prefixed,
  tensor = tensor.new, dtype = tensor.dtype, dtype_name = tensor.dtype_name,
  stream = stream.stream, event = stream.event, memcpy = stream.memcpy,
  mesh = mesh.new, show = pretty.show, render = pretty.render,
  nn = nn, fully_shard = shard.fully_shard,
}

local info

-- Boots the rank (PMIx, or a singleton); idempotent.
function fsdp.init()
  if info then return info end
  local p = ffi.new("fsdp_proc_info")
  local rc = C.fsdp_init(p)
  if rc < 0 then -- the launcher or PMIx, never the caller's code: the message alone, no position
    error(string.format("fsdp.init: %s (%s)", ffi.string(C.fsdp_last_error()), ffi.string(C.fsdp_status_name(rc))), 0)
  end
  info = { rank = p.rank, size = p.size, local_rank = p.local_rank, local_size = p.local_size,
    node_rank = p.node_rank, num_nodes = p.num_nodes, singleton = p.singleton ~= 0,
    device_count = p.device_count, nspace = ffi.string(p.nspace) }
  return info
end

-- Whether the user watches this rank's stdout on a terminal, so a line
-- redrawn with a carriage return (the progress bar) may be drawn: under
-- fsdprun it says so (FSDPRUN_TTY=1: its own stdout is one; the ranks' is a
-- pipe); alone, the rank's own stdout; under other launchers never, since
-- their ranks' stdout can be a pty even when the job's output goes to a
-- file (mpirun). getenv and isatty may be given (tests).
pcall(ffi.cdef, "int isatty(int fd);")
function fsdp.on_terminal(i, getenv, isatty)
  getenv = getenv or os.getenv
  isatty = isatty or function(fd) return ffi.C.isatty(fd) == 1 end
  if getenv("FSDPRUN") then return getenv("FSDPRUN_TTY") == "1" end
  return i.singleton and isatty(1) or false
end

function fsdp.rank() return fsdp.init().rank end
function fsdp.size() return fsdp.init().size end
function fsdp.finalize()
  info = nil
  check(C.fsdp_finalize(), "fsdp.finalize")
end

function fsdp.kv_put(key, value)
  if type(key) ~= "string" or type(value) ~= "string" then
    error(string.format("fsdp.kv_put: expected (key string, value string), got (%s, %s)", type(key), type(value)), 2)
  end
  check(C.fsdp_kv_put(key, value, #value), "fsdp.kv_put '" .. tostring(key) .. "'")
end

function fsdp.kv_fence(timeout_ms) check(C.fsdp_kv_fence(timeout_ms or 0), "fsdp.kv_fence") end

function fsdp.kv_get(rank, key)
  local len = ffi.new("size_t[1]")
  local rc = C.fsdp_kv_get(rank, key, nil, 0, len)
  if rc < 0 and len[0] == 0 then check(rc, "fsdp.kv_get '" .. tostring(key) .. "'") end
  local buf = ffi.new("char[?]", math.max(tonumber(len[0]), 1))
  check(C.fsdp_kv_get(rank, key, buf, len[0], len), "fsdp.kv_get '" .. tostring(key) .. "'")
  return ffi.string(buf, len[0])
end

function fsdp.abort(status, msg) C.fsdp_abort(status or 1, msg or "fsdp.abort") end
function fsdp.now() return C.fsdp_time_now() end

-- The device's memory pool, in bytes and calls ("cpu" or "cuda"):
-- {allocated, peak, reserved, peak_reserved, cached, allocs, frees, cache_hits}
local stat_fields = { "allocated", "peak", "reserved", "peak_reserved", "cached", "allocs", "frees", "cache_hits" }
function fsdp.memory_stats(device)
  local st = ffi.new("fsdp_memory_stats")
  check(C.fsdp_memory_get_stats(tensor.device(device or "cpu"), st), "fsdp.memory_stats")
  local out = {}
  for _, f in ipairs(stat_fields) do out[f] = tonumber(st[f]) end
  return out
end
-- cached blocks back to the device; peaks := current values
function fsdp.memory_empty_cache(device) check(C.fsdp_memory_empty_cache(tensor.device(device or "cpu")), "fsdp.memory_empty_cache") end
function fsdp.memory_reset_peak(device) check(C.fsdp_memory_reset_peak(tensor.device(device or "cpu")), "fsdp.memory_reset_peak") end
function fsdp.version() return ffi.string(C.fsdp_version()) end
-- "cpu", or the current GPU's name ("NVIDIA H100 80GB HBM3")
function fsdp.device_name(device)
  local buf = ffi.new("char[256]")
  check(C.fsdp_device_name(tensor.device(device or "cpu"), buf, 256), "fsdp.device_name")
  return ffi.string(buf)
end

-- The plan of a user's own fsdp.nn model before fully_shard makes it: what
-- every rank will hold, the activations of one step found by running it on
-- the counting device (fsdp.planner.plan_model; docs/PLANNING.md)
function fsdp.plan_model(model, o) return require("fsdp.planner").plan_model(model, o) end
function fsdp.render_plan(p) return require("fsdp.plan_render").render(p) end

return fsdp

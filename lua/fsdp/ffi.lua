-- fsdp.ffi: loads libfsdp and declares its API to the FFI from the public
-- header itself (preprocessor lines and the __cplusplus block stripped), so
-- the Lua view cannot drift from C. check() is the one place where C status
-- codes become Lua errors.
local ffi = require "ffi"

local M = { ffi = ffi }

local here = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".")
local root = here .. "/../.."

local function readable(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

local function find(env, candidates, what)
  local tried = {}
  local v = os.getenv(env)
  if v then
    if readable(v) then return v end
    error(string.format("fsdp: %s=%s is not readable", env, v), 3)
  end
  for _, p in ipairs(candidates) do
    if readable(p) then return p end
    tried[#tried + 1] = p
  end
  error(string.format("fsdp: cannot find %s; tried %s (set %s)", what, table.concat(tried, ", "), env), 3)
end

-- The header minus what ffi.cdef cannot read; its quoted includes (the
-- per-layer parts of the API: fsdp_base.h, fsdp_device.h ...) are read in
-- place, from the same folder, each once however many headers include it
-- (ffi.cdef refuses a type declared twice). seen (optional) collects the
-- files read, in order, as a list and by path.
function M.declarations(path, seen)
  seen = seen or {}
  if seen[path] then return "" end
  seen[path] = true
  seen[#seen + 1] = path
  local dir = path:match("^(.*)/[^/]*$") or "."
  local out, skip = {}, false
  for line in io.lines(path) do
    local inc = line:match('^%s*#%s*include%s+"([^"]+)"')
    if line:match("^%s*#%s*ifdef%s+__cplusplus") then
      skip = true
    elseif skip and line:match("^%s*#%s*endif") then
      skip = false
    elseif inc and not skip then
      out[#out + 1] = M.declarations(dir .. "/" .. inc, seen)
    elseif not skip and not line:match("^%s*#") then
      out[#out + 1] = line
    end
  end
  return table.concat(out, "\n")
end

M.header = find("FSDP_HEADER", { root .. "/src/fsdp.h", root .. "/include/fsdp.h" }, "the header fsdp.h")
M.headers = {} -- the public headers read, fsdp.h first
ffi.cdef(M.declarations(M.header, M.headers))
M.C = ffi.load(find("FSDP_LIB", { root .. "/build/libfsdp.so", root .. "/lib/libfsdp.so" }, "libfsdp.so"))

-- The CUDA backend's public entry points (the fsdp_cuda_* of fsdp_kernels.h)
-- are in libfsdp_cuda.so, which libfsdp opens the first time CUDA is asked
-- for; this loads it on first use, so a CPU job never does.
local cuda_ns
function M.cuda()
  if not cuda_ns then
    local path = M.C.fsdp_cuda_library()
    if path == nil then error("fsdp: " .. ffi.string(M.C.fsdp_last_error()), 2) end
    cuda_ns = ffi.load(ffi.string(path))
  end
  return cuda_ns
end

-- ---- numbers from C memory ----
-- LuaJIT keeps every Lua value in a NaN box: a double whose NaN payload
-- bits are set is taken for a tagged value (nil, a table, a pointer...) as
-- soon as it becomes a Lua number, and using it corrupts the heap. A NaN
-- computed in C keeps the payload of the NaN it came from (weights, data),
-- so every float or double the front end reads out of C memory goes through
-- these readers: the bits are inspected as integers first, and any NaN
-- becomes Lua's own. p is a pointer (or array) of that type, i an index
-- (default 0). tests/lua/test_nan_payload.lua feeds payload NaNs through
-- every caller.
local bit = require "bit"
local band = bit.band
local NAN = 0 / 0 -- computed at run time (LuaJIT folds no NaN): the FPU's default NaN
local u32p = ffi.typeof("const uint32_t *")

function M.f64(p, i)
  i = i or 0
  local w = ffi.cast(u32p, p + i) -- little-endian: w[1] holds sign, exponent and the payload's top bits
  local hi = w[1]
  if band(hi, 0x7ff00000) == 0x7ff00000 and (band(hi, 0xfffff) ~= 0 or w[0] ~= 0) then return NAN end
  return p[i]
end

function M.f32(p, i)
  i = i or 0
  local b = ffi.cast(u32p, p + i)[0]
  if band(b, 0x7f800000) == 0x7f800000 and band(b, 0x7fffff) ~= 0 then return NAN end
  return p[i]
end

-- bf16 and fp16 are uint16_t bits; converted by the engine, NaN excepted
function M.bf16(p, i)
  local h = p[i or 0]
  if band(h, 0x7f80) == 0x7f80 and band(h, 0x7f) ~= 0 then return NAN end
  return M.C.fsdp_bf16_to_f32(h)
end

function M.fp16(p, i)
  local h = p[i or 0]
  if band(h, 0x7c00) == 0x7c00 and band(h, 0x3ff) ~= 0 then return NAN end
  return M.C.fsdp_fp16_to_f32(h)
end

-- by dtype name, for tensors (int32 holds no NaN)
M.readers = { fp32 = M.f32, fp64 = M.f64, bf16 = M.bf16, fp16 = M.fp16, int32 = function(p, i) return p[i or 0] end }

-- "what: message", unless the message already begins so (an error raised
-- by check(..., what) deeper down and caught on the way out)
function M.prefixed(what, message)
  message = tostring(message)
  return message:sub(1, #what + 2) == what .. ": " and message or what .. ": " .. message
end

function M.check(rc, what)
  if rc < 0 then
    error(string.format("%s: %s (%s)", what, ffi.string(M.C.fsdp_last_error()),
      ffi.string(M.C.fsdp_status_name(rc))), 3)
  end
  return rc
end

return M

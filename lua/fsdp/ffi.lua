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
-- per-layer parts of the API, fsdp_ops.h ...) are read in place, from the
-- same folder.
function M.declarations(path)
  local dir = path:match("^(.*)/[^/]*$") or "."
  local out, skip = {}, false
  for line in io.lines(path) do
    local inc = line:match('^%s*#%s*include%s+"([^"]+)"')
    if line:match("^%s*#%s*ifdef%s+__cplusplus") then
      skip = true
    elseif skip and line:match("^%s*#%s*endif") then
      skip = false
    elseif inc and not skip then
      out[#out + 1] = M.declarations(dir .. "/" .. inc)
    elseif not skip and not line:match("^%s*#") then
      out[#out + 1] = line
    end
  end
  return table.concat(out, "\n")
end

M.header = find("FSDP_HEADER", { root .. "/src/fsdp.h", root .. "/include/fsdp.h" }, "the header fsdp.h")
ffi.cdef(M.declarations(M.header))
M.C = ffi.load(find("FSDP_LIB", { root .. "/build/libfsdp.so", root .. "/lib/libfsdp.so" }, "libfsdp.so"))

-- The CUDA backend's public entry points (the fsdp_cuda_* of fsdp_ops.h)
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

function M.check(rc, what)
  if rc < 0 then
    error(string.format("%s: %s (%s)", what, ffi.string(M.C.fsdp_last_error()),
      ffi.string(M.C.fsdp_status_name(rc))), 3)
  end
  return rc
end

return M

-- test_ffi.lua: the FFI's view of the public API (built from the headers
-- themselves: fsdp.h and every per-layer header beside it) must equal C's:
-- struct sizes, field offsets, every constant.
--   fsdp tests/lua/test_ffi.lua PATH/TO/ffi_layout
local fsdp = require "fsdp"
local ffi = fsdp.ffi
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")("test_ffi")
local check, fails = T.check, T.fails

if not arg[1] then error("usage: test_ffi.lua FFI_LAYOUT_BINARY") end
local p = assert(io.popen(arg[1]))
local c = assert(loadstring(p:read("*a")))()
p:close()

for name, size in pairs(c.sizes) do
  local t = name:gsub("^sizeof_", "")
  check(ffi.sizeof(t) == size, string.format("sizeof(%s): C %d, FFI %d", t, size, ffi.sizeof(t)))
end
for _, o in ipairs(c.offsets) do
  local t, f, off = o[1], o[2], o[3]
  local okf, got = pcall(ffi.offsetof, t, f)
  check(okf and got == off, string.format("offsetof(%s, %s): C %d, FFI %s", t, f, off, tostring(got)))
end

-- every public header (src/fsdp*.h) reaches the FFI, each once: fsdp.h
-- includes it, directly or through another
local base = require "fsdp.ffi"
local dir = base.header:match("^(.*)/[^/]*$") or "."
local read = {}
for _, path in ipairs(base.headers) do
  local name = path:match("([^/]*)$")
  check(not read[name], name .. " was read twice")
  read[name] = true
end
local ls = assert(io.popen("ls '" .. dir .. "'"))
local npublic = 0
for name in ls:lines() do
  if name:match("^fsdp[%w_]*%.h$") then
    npublic = npublic + 1
    check(read[name], dir .. "/" .. name .. " is not included by fsdp.h, so the FFI does not see it")
  end
end
ls:close()
check(npublic >= 8 and #base.headers == npublic,
  string.format("the FFI read %d headers of the %d public ones", #base.headers, npublic))

-- every struct the headers define, and every field of it, is in C's lists
-- (a struct or field added to a header but not to ffi_layout.c fails here)
local header = base.declarations(base.header)
local text = header:gsub("/%*.-%*/", " "):gsub("//[^\n]*", " ")
local listed = {}
for _, o in ipairs(c.offsets) do listed[o[1] .. "." .. o[2]] = true end
local nstructs = 0
for tag, body, name in text:gmatch("typedef%s+struct%s+([%w_]+)%s*(%b{})%s*([%w_]+)%s*;") do
  nstructs = nstructs + 1
  check(tag == name, "struct " .. tag .. " is typedef'd as " .. name)
  check(c.sizes["sizeof_" .. name] ~= nil, "sizeof(" .. name .. ") is missing from tests/c/ffi_layout.c")
  for decl in body:sub(2, -2):gmatch("[^;]+") do
    -- "int64_t begin, end", "char nspace[256]", "void *data": the type is the
    -- first word, then declarators separated by commas
    local declarators = decl:match("^%s*[%w_]+%s+(.-)%s*$")
    if declarators then
      for d in declarators:gmatch("[^,]+") do
        local field = d:gsub("%b[]", ""):match("([%w_]+)%s*$")
        check(field and listed[name .. "." .. field],
          string.format("offsetof(%s, %s) is missing from tests/c/ffi_layout.c", name, tostring(field)))
      end
    end
  end
end
check(nstructs >= 8, "found the header's structs (" .. nstructs .. ")")

-- every named enum type too: the FFI passes a parameter of that type as C does
local nenums = 0
for name in text:gmatch("typedef%s+enum%s*[%w_]*%s*%b{}%s*([%w_]+)%s*;") do
  nenums = nenums + 1
  check(c.sizes["sizeof_" .. name] ~= nil, "sizeof(" .. name .. ") is missing from tests/c/ffi_layout.c")
end
check(nenums >= 10, "found the header's enum types (" .. nenums .. ")")

-- every FSDP_* constant declared in the header is known to C's list, and
-- the FFI gives it the same value
local names = {}
for name in text:gmatch("(FSDP_[A-Z0-9_]+)%s*=") do names[#names + 1] = name end
check(#names >= 20, "found the header's constants (" .. #names .. ")")
for _, name in ipairs(names) do
  check(c.constants[name] ~= nil, name .. " is missing from tests/c/ffi_layout.c")
  local okv, v = pcall(function() return fsdp.C[name] end)
  check(okv and tonumber(v) == c.constants[name],
    string.format("%s: C %s, FFI %s", name, tostring(c.constants[name]), tostring(v)))
end
T.finish()

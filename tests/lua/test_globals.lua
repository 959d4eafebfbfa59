-- test_globals.lua: no file of the Lua front end reads or writes a global
-- other than Lua 5.1's own. A misspelt or moved local (a name left behind
-- when code moves between files) is a global read there: nil, with no
-- error, so a branch silently takes its other arm. Found from the compiled
-- bytecode (jit.util: every GGET and GSET of every function, with its
-- line), so it needs no parser of ours; checked on a file made to hold
-- one of each, so the check itself is known to fire.
--   luajit tests/lua/test_globals.lua ROOT
local jutil = require "jit.util"
local vmdef = require "jit.vmdef"

local root = arg[1] or "."
local T = dofile(root .. "/tests/lua/testkit.lua")("test_globals")
local check = T.check

local allowed = {}
for name in ([[_G _VERSION arg assert collectgarbage coroutine debug dofile error gcinfo getfenv getmetatable io
  ipairs jit load loadfile loadstring math module newproxy next os package pairs pcall print rawequal rawget rawset
  require select setfenv setmetatable string table tonumber tostring type unpack xpcall bit]]):gmatch("%S+") do
  allowed[name] = true
end

-- the op's name at bytecode position pc of function fn
local function op_at(fn, pc)
  local ins = jutil.funcbc(fn, pc)
  if not ins then return nil end
  return vmdef.bcnames:sub((ins % 256) * 6 + 1, (ins % 256) * 6 + 6):gsub(" ", ""), ins
end

-- every global a chunk's functions read or write: {line, op, name}
local function globals_of(chunk)
  local found = {}
  local function walk(fn)
    local info = jutil.funcinfo(fn)
    for pc = 1, info.bytecodes - 1 do
      local op, ins = op_at(fn, pc)
      if op == "GGET" or op == "GSET" then
        local d = math.floor(ins / 65536) -- operand D: the constant holding the name
        local name = jutil.funck(fn, -d - 1)
        found[#found + 1] = { line = jutil.funcinfo(fn, pc).currentline, op = op, name = name }
      end
    end
    for i = 1, info.gcconsts or 0 do -- the child functions are among its constants
      local k = jutil.funck(fn, -i)
      if type(k) == "proto" then walk(k) end
    end
  end
  walk(chunk)
  return found
end

local function stray(path)
  local chunk, err = loadfile(path)
  if not chunk then return nil, err end
  local out = {}
  for _, g in ipairs(globals_of(chunk)) do
    if not allowed[g.name] then out[#out + 1] = string.format("%s:%d: %s '%s'", path, g.line, g.op == "GSET" and
      "writes the global" or "reads the global", tostring(g.name)) end
  end
  return out
end

-- the check fires: a file with a stray read and a stray write
local probe = os.tmpname()
local f = assert(io.open(probe, "w"))
f:write("local M = {}\nfunction M.f(x)\n  if on_gpu then return x end\n  counter = 1\n  return print(x)\nend\nreturn M\n")
f:close()
local seen = stray(probe)
os.remove(probe)
check(seen and #seen == 2 and seen[1]:find(":3: reads the global 'on_gpu'", 1, true) and
  seen[2]:find(":4: writes the global 'counter'", 1, true),
  "the checker finds a stray read and a stray write, with their lines: " .. table.concat(seen or {}, "; "))

-- every file of the front end and the bundled recipes' helpers
local files = {}
local p = io.popen("find '" .. root .. "/lua' -name '*.lua' | sort")
for line in p:lines() do files[#files + 1] = line end
p:close()
check(#files > 20, string.format("found the front end's files (%d)", #files))
for _, path in ipairs(files) do
  local out, err = stray(path)
  check(out ~= nil, path .. " compiles: " .. tostring(err))
  check(out == nil or #out == 0, path .. ": no globals beyond Lua's own" .. (out and #out > 0 and
    ":\n  " .. table.concat(out, "\n  ") or ""))
end
T.finish()

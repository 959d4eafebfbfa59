-- test_frontend.lua: the Lua layer on one process: errors carry the C
-- message, tensors convert like the C reference, streams and events order
-- work, meshes validate their shape, the REPL survives errors.
--   fsdp tests/lua/test_frontend.lua PATH/TO/fsdp
local fsdp = require "fsdp"
local ffi, C = fsdp.ffi, fsdp.C
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")("test_frontend")
local check, fails = T.check, T.fails

-- check(): statuses become errors with the C message and the status name
fails(function() fsdp.check(C.fsdp_dtype_from_name("int3"), "dtype") end, "dtype: unknown dtype 'int3'", "check")
fails(function() fsdp.check(C.fsdp_dtype_from_name("int3"), "dtype") end, "FSDP_EINVAL", "status name")

-- tensors: bf16 rounding against a naive round-to-nearest-even in Lua
local function ref_bf16(x)
  if x == 0 then return 0 end
  local m, e = math.frexp(x)          -- x = m * 2^e, 0.5 <= |m| < 1
  local scaled = m * 256              -- 8 significant bits
  local fl = math.floor(scaled)
  local frac = scaled - fl
  local r = (frac > 0.5 or (frac == 0.5 and fl % 2 == 1)) and fl + 1 or fl
  return math.ldexp(r / 256, e)
end
local t = fsdp.tensor(1000, "bf16")
local worst = 0
for i = 0, 999 do
  local x = (i * 0.7371 - 300) * 1.001 ^ i
  x = tonumber(ffi.cast("float", x)) -- the value the C call receives
  t:set(i, x)
  if t:get(i) ~= ref_bf16(x) then worst = worst + 1 end
end
check(worst == 0, "bf16 set/get rounds to nearest even (" .. worst .. " mismatches)")
check(t:numel() == 1000 and t:nbytes() == 2000 and t.dtype == "bf16", "tensor metadata")
local f = fsdp.tensor({ 2, 3 }, "fp32"):fill(1.5)
check(f:get(5) == 1.5 and #f:to_table() == 6, "fill and to_table")
check(tostring(f):find("tensor%(2x3, fp32, cpu%)") ~= nil, "tostring: " .. tostring(f))
local v = f:view(2, { 2, 2 })
v:set(0, 9)
check(f:get(2) == 9 and v:numel() == 4 and v.shape[2] == 2, "a view shares the base's memory")
fails(function() f:view(4, { 3 }) end, "outside the base's 6", "view out of range")
local base2 = fsdp.tensor(4)
local v2 = base2:view(1, 2)
base2:free()
fails(function() v2:get(0) end, "after free", "a view of a freed tensor is an error")
fails(function() f:get(6) end, "out of range [0, 6)", "bounds")
fails(function() fsdp.tensor(4, "int8") end, "unknown dtype 'int8'", "bad dtype")
fails(function() fsdp.tensor({ 2, -1 }) end, "dimension 2 is -1", "bad shape")
local before = fsdp.memory_stats("cpu").allocated
f:free()
f:free() -- idempotent
check(before - fsdp.memory_stats("cpu").allocated == 24, "memory_stats sees the 24 bytes freed")
fails(function() f:get(0) end, "after free", "use after free is an error")
do
  for _ = 1, 200 do fsdp.tensor(1024 * 1024) end -- 800 MiB if the collector never ran
  collectgarbage()
  check(true, "tensors are collected")
end

-- streams and events: a delay on a, a copy on b behind an event
local a, b = fsdp.stream("cpu"), fsdp.stream("cpu")
local e = fsdp.event("cpu")
local src, mid, dst = fsdp.tensor(4096):fill(7), fsdp.tensor(4096):fill(0), fsdp.tensor(4096):fill(0)
a:delay(150000)
mid:copy_from(src, a)
e:record(a)
b:wait(e)
dst:copy_from(mid, b)
check(e:query() == false, "event pending behind the delay")
check(dst:get(4095) == 0, "copy behind the event has not run")
b:synchronize()
check(e:query() == true and dst:get(4095) == 7, "after synchronize the copy saw the delayed write")
fails(function() fsdp.memcpy(fsdp.tensor(3), fsdp.tensor(4)) end, "16 bytes into 12 bytes", "memcpy size check")
a:free(); a:free()
fails(function() a:synchronize() end, "after free", "stream use after free")

-- meshes on a singleton
local info = fsdp.init()
check(info.size == 1 and info.rank == 0 and info.singleton, "singleton identity")
local m = fsdp.mesh({ { "dp", 1 } })
check(m:ndims() == 1 and m:size("dp") == 1 and m:coord("dp") == 0, "1-D mesh")
local g = m:group("dp")
check(g:size() == 1 and g:rank() == 0 and g:members()[1] == 0, "group of one")
local x, y = fsdp.tensor(5, "bf16"):fill(2), fsdp.tensor(5, "fp32")
g:reduce_scatter(y, x, "avg")
g:synchronize()
check(y:get(4) == 2, "reduce_scatter bf16 -> fp32 on one rank")
fails(function() g:all_reduce(y, x) end, "must match", "all_reduce dtype mismatch")
fails(function() g:all_reduce(y, y, "max") end, "op 'max'", "unknown op")
m:free()
fails(function() g:size() end, "mesh of this comm was freed", "comm after its mesh is freed")
check(fsdp.mesh("a=1,b=-1"):ndims() == 2, "string form")
check(fsdp.mesh({ dp = -1 }):size("dp") == 1, "hash form with one key")
fails(function() fsdp.mesh({ a = 1, b = 1 }) end, "ordered list", "hash form with two keys")
fails(function() fsdp.mesh({ { "dp", 2 } }) end, "dp=2 has 2 ranks but the world has 1", "wrong size names the shape")
fails(function() fsdp.mesh("dp:2") end, "'dp:2' is not name=size", "bad string form")
fails(function() fsdp.mesh({ { "dp", 1 } }):group("tp") end, "no dimension 'tp'", "unknown group")

-- key/value exchange with oneself
fsdp.kv_put("greeting", "hello\0world")
fsdp.kv_fence()
check(fsdp.kv_get(0, "greeting") == "hello\0world", "kv round trip keeps bytes")
fails(function() fsdp.kv_get(0, "nothing-here") end, "no key 'nothing-here'", "missing key")

-- the REPL: expressions printed, errors survived, multi-line input
if arg[1] then
  local script = os.tmpname()
  local fh = io.open(script, "w")
  fh:write("1 + 2\nerror('boom')\nfunction sq(v)\n  return v * v\nend\nprint(sq(7))\n{a = 1, b = {2, 3}}\n")
  fh:close()
  local p = io.popen(string.format("%s < %s 2>&1", arg[1], script))
  local out = p:read("*a")
  p:close()
  os.remove(script)
  check(out:find("3\n", 1, true) ~= nil, "REPL prints expressions: " .. out)
  check(out:find("boom", 1, true) ~= nil, "REPL shows the error")
  check(out:find("49\n", 1, true) ~= nil, "REPL continues after an error and reads multi-line input")
  check(out:find("{a = 1, b = {2, 3}}", 1, true) ~= nil, "REPL shows tables readably")
end

T.finish()

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
check(t:get(0) == -300 and t:ptr()[0] == 0xC396, "bf16 bits through ptr()")

-- the other dtypes: fp32 rounds to float, fp64 keeps doubles, fp16 has 11 bits
local t32, t64, t16 = fsdp.tensor(2, "fp32"), fsdp.tensor(2, "fp64"), fsdp.tensor(3, "fp16")
t32:set(0, 0.1); t64:set(0, 0.1); t16:set(0, 1 / 3); t16:set(1, 65504); t16:set(2, 2049)
check(t32:get(0) == tonumber(ffi.cast("float", 0.1)) and t32:get(0) ~= 0.1, "fp32 get/set rounds to float")
check(t64:get(0) == 0.1 and t64:nbytes() == 16, "fp64 get/set is exact")
check(t16:get(0) == 1365 / 4096 and t16:get(1) == 65504 and t16:get(2) == 2048, "fp16 get/set rounds to 11 bits, to even")
check(ffi.typeof(t32:ptr()) == ffi.typeof("float *") and ffi.typeof(t64:ptr()) == ffi.typeof("double *")
  and ffi.typeof(t16:ptr()) == ffi.typeof("uint16_t *"), "typed ptr() per dtype")
check(fsdp.dtype("bf16") == C.FSDP_BF16 and fsdp.dtype_name(C.FSDP_FP16) == "fp16", "dtype and dtype_name")
if C.fsdp_device_available(C.FSDP_CUDA) == 1 then
  local g = fsdp.tensor(4, "fp32", "cuda")
  fails(function() g:get(0) end, "copy it to the cpu first", "get on a cuda tensor")
  g:copy_from(fsdp.tensor(4):fill(3))
  check(fsdp.tensor(4):copy_from(g):get(3) == 3, "copies to and from the GPU")
else
  fails(function() fsdp.tensor(4, "fp32", "cuda") end, "fsdp.tensor", "a cuda tensor without a GPU fails in C")
end
check(t:numel() == 1000 and t:nbytes() == 2000 and t.dtype == "bf16", "tensor metadata")
local f = fsdp.tensor({ 2, 3 }, "fp32"):fill(1.5)
check(f:get(5) == 1.5 and #f:to_table() == 6, "fill and to_table")
check(tostring(f):find("tensor%(2x3, fp32, cpu%)") ~= nil, "tostring: " .. tostring(f))
local v = f:view(2, { 2, 2 })
v:set(0, 9)
check(f:get(2) == 9 and v:numel() == 4 and v.shape[2] == 2, "a view shares the base's memory")
fails(function() f:view(4, { 3 }) end, "outside the base's 6", "view out of range")
-- a shape whose element count overflows int64 (2^70 made a tensor of 0 elements)
fails(function() fsdp.tensor({ 2 ^ 40, 2 ^ 30 }) end, "too many elements", "a shape past 2^48 elements")
-- modules' sizes and eps, named before any parameter exists
local nn = require "fsdp.nn"
fails(function() nn.Linear(0, 5) end, "nn.Linear: in_features = 0; expected a positive integer", "Linear of 0 inputs")
fails(function() nn.Linear(4, "a") end, "nn.Linear: out_features = a; expected a positive integer", "Linear of a string")
fails(function() nn.Embedding(10, 2.5) end, "nn.Embedding: embedding_dim = 2.5; expected a positive integer", "Embedding")
fails(function() nn.RMSNorm(8, -1) end, "nn.RMSNorm: eps = -1; expected a finite number >= 0", "RMSNorm eps")
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
do -- ops check their tensors once, before picking the CPU op or the CUDA kernel
  local ops = require "fsdp.ops"
  local y, a, b = fsdp.tensor(4), fsdp.tensor(4), fsdp.tensor(8)
  local bv = b:view(4, 4)
  b:free()
  fails(function() ops.add(y, a, bv) end, "add: tensor argument 3 used after free()", "an op on a view of a freed tensor")
  a:free()
  fails(function() ops.swiglu_forward(y, a, y) end, "swiglu: tensor argument 2 used after free()", "an op on a freed tensor")
  -- a freed tensor that was on the GPU: the same check, before any CUDA call
  -- (on this machine a CUDA call would fail otherwise: no backend)
  a.device = "cuda"
  fails(function() ops.add(a, y, y) end, "add: tensor argument 1 used after free()", "a freed CUDA tensor, same check")
  fails(function() ops.linear_forward(a, y, nil, nil, 1, 4, 4) end, "Linear forward: tensor argument 1 used after free()",
    "a freed CUDA tensor in Linear")
  y:free()
end
do -- the collector frees what nobody holds (and views keep their base alive)
  collectgarbage()
  local base0 = fsdp.memory_stats("cpu").allocated
  for _ = 1, 100 do local t = fsdp.tensor(1000); t:fill(1) end
  local keep = fsdp.tensor(10):view(2, 3)
  collectgarbage(); collectgarbage()
  check(fsdp.memory_stats("cpu").allocated == base0 + 40, "collected tensors are freed, a view's base is not: " ..
    (fsdp.memory_stats("cpu").allocated - base0))
  check(keep:get(0) ~= nil, "the view still reads its base")
end
do -- 200 tensors of 4 MiB that nobody holds: the collector frees every one
  collectgarbage(); collectgarbage()
  local base0 = fsdp.memory_stats("cpu").allocated
  for _ = 1, 200 do fsdp.tensor(1024 * 1024) end
  collectgarbage(); collectgarbage()
  local left = fsdp.memory_stats("cpu").allocated - base0
  check(left == 0, "unreferenced tensors are freed by the collector (" .. left .. " bytes left)")
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
fails(function() b:wait(a) end, "expected an fsdp.event", "stream:wait checks its argument")
fails(function() a:delay(-1) end, "microseconds must be", "stream:delay checks its argument")
a:free(); a:free()
fails(function() a:synchronize() end, "after free", "stream use after free")
fails(function() dst:copy_from(mid, a) end, "after free", "copy on a freed stream")
e:free(); e:free()
fails(function() e:query() end, "after free", "event use after free")
local host_done = fsdp.event("cpu")
host_done:record()
check(host_done:query() == true, "an event recorded on the host is complete at once")

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
check(m:dims()[1].name == "dp" and m:dims()[1].size == 1, "mesh:dims")
check(m:group({ "dp" }) == g and m:group("world"):size() == 1, "groups are cached; list and 'world' forms")
check(g:name() ~= "" and tostring(m):find("dp", 1, true) ~= nil, "comm:name and mesh:describe")
local z = fsdp.tensor(3):fill(4)
g:all_gather(z, z)
g:broadcast(z, 0)
g:all_reduce(z, z, "sum")
g:barrier()
g:synchronize()
check(z:get(2) == 4, "all_gather, broadcast, all_reduce in place on one rank")
fails(function() g:all_gather(fsdp.tensor(4), z) end, "out has 4 elements, expected 3 (count 3 x 1 ranks)", "all_gather size")
fails(function() g:reduce_scatter(z, fsdp.tensor(4)) end, "in has 4 elements, expected 3", "reduce_scatter size")
fails(function() g:broadcast({}, 0) end, "t must be an fsdp.tensor", "broadcast checks its tensor")
local cs = g:stream()
cs:synchronize()
m:free()
m:free()
fails(function() g:size() end, "mesh of this comm was freed", "comm after its mesh is freed")
fails(function() cs:synchronize() end, "mesh owning this comm stream was freed", "comm stream after its mesh is freed")
fails(function() fsdp.mesh({ { "dp", 1.5 } }) end, "dimension 'dp' has size 1.5", "a fractional size names the dimension")
fails(function() fsdp.mesh("dp=0") end, "dimension 'dp' has size 0", "a zero size names the dimension")
fails(function() fsdp.mesh({ { "a", -1 }, { "b", -1 } }) end, "'a' and 'b' are both -1", "two -1 sizes")
fails(function() fsdp.mesh({ { "dp", 1 } }, { device = "tpu" }) end, "unknown device 'tpu'", "bad device")
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

  -- runs the host with a shell command line; returns its output and exit status
  local function host(args, input)
    local cmd = arg[1] .. " " .. args .. " 2>&1; echo \"rc=$?\""
    local f
    if input then
      f = os.tmpname()
      local h = io.open(f, "w"); h:write(input); h:close()
      cmd = "(" .. cmd .. ") < " .. f
    end
    local pp = io.popen(cmd); local o = pp:read("*a"); pp:close()
    if f then os.remove(f) end
    return o:match("^(.*)rc=(%d+)\n$")
  end
  local o, rc = host("repl", "1, 'x', nil\nfsdp.size()\n1 +\n2\nreturn\n")
  check(rc == "0" and o:find('1\t"x"\tnil\n', 1, true) ~= nil, "REPL prints several results: " .. o)
  check(o:find("\n1\n3\n", 1, true) ~= nil, "REPL preloads fsdp; an unfinished expression continues: " .. o)
  o, rc = host("", "x = {\n")
  check(rc == "0" and o:find("near '<eof>'", 1, true) ~= nil, "input ending inside a chunk reports it: " .. o)
  o, rc = host("", "os.exit(4)\nprint('not reached')\n")
  check(rc == "4" and not o:find("not reached", 1, true), "os.exit at the prompt")

  -- OpenBLAS's idle threads spin 2^4 cycles (the host runs itself again with
  -- OPENBLAS_THREAD_TIMEOUT=4, read as OpenBLAS loads), or what the user set
  local ask = "-e 'local ffi = require \"ffi\"; ffi.cdef \"int openblas_thread_timeout(void);\" " ..
    "print(\"timeout\", ffi.C.openblas_thread_timeout(), os.getenv(\"OPENBLAS_THREAD_TIMEOUT\"))'"
  local function spin(env)  -- (this test's own host has the variable set: not inherited)
    local f = io.popen("env -u OPENBLAS_THREAD_TIMEOUT " .. env .. " " .. arg[1] .. " " .. ask .. " 2>&1")
    local out = f:read("*a"); f:close()
    return out
  end
  o = spin("")
  check(o == "timeout\t4\t4\n", "OpenBLAS's spin is 2^4 cycles: " .. o)
  o = spin("OPENBLAS_THREAD_TIMEOUT=9")
  check(o == "timeout\t9\t9\n", "a spin the user set is kept: " .. o)

  local dir = os.tmpname()
  local job = dir .. ".lua"
  local h = io.open(job, "w")
  h:write("print(arg[0], #arg, arg[1], arg[2], select('#', ...))\n",
    "if arg[1] == 'fail' then local function f() error('deep') end f() end\n",
    "if arg[1] == 'exit' then os.exit(tonumber(arg[2])) end\n")
  h:close()
  o, rc = host(job .. " a b")
  check(rc == "0" and o == job .. "\t2\ta\tb\t2\n", "a job file gets arg and ...: " .. o)
  o, rc = host(job .. " fail")
  check(rc == "1" and o:find("deep", 1, true) and o:find("stack traceback", 1, true), "a failing job: message, traceback, status 1: " .. o)
  o, rc = host(job .. " exit 7")
  check(rc == "7", "os.exit(7) in a job gives status 7")
  -- a table raised as the error names the file; a file returning neither nothing nor a table is warned about
  h = io.open(job, "w"); h:write("if arg[1] == 'table' then error({1}) end\nreturn 42\n"); h:close()
  o, rc = host(job .. " table")
  check(rc == "1" and o:find(job .. " raised a table as its error, not a message", 1, true), "a table as the error: " .. o)
  o, rc = host(job)
  check(rc == "0" and o:find("warning: " .. job .. " returned a number, not a table", 1, true), "a file returning 42: " .. o)
  o, rc = host(dir .. ".missing.lua")
  -- the job's own file missing (or not parsing): its configuration, status
  -- 78, which fsdprun --max-restarts never restarts
  check(rc == "78" and o:find("cannot open", 1, true), "a missing job file: status 78 (got " .. tostring(rc) .. "): " .. o)
  os.remove(job); os.remove(dir)
  o, rc = host("-e \"print(require('fsdp').init().size, arg[1])\" z")
  check(rc == "0" and o == "1\tz\n", "-e runs code with arg: " .. o)
  o, rc = host("-e 'error(\"bad\")'")
  check(rc == "1" and o:find("bad", 1, true), "-e error gives status 1")
  o, rc = host("--version")
  check(rc == "0" and o:match("^fsdp %d+%.%d+"), "--version: " .. o)
  o, rc = host("--help")
  check(rc == "0" and o:find("fsdprun", 1, true) and o:find("FSDP_LUA_PATH", 1, true) and o:find("FSDP_LIB", 1, true)
    and o:find("FSDP_HEADER", 1, true) and o:find("FSDP_LOG", 1, true), "--help documents usage and the environment")
  o, rc = host("--no-such-flag")
  check(rc == "2" and o:find("unknown option", 1, true), "an unknown option: " .. o)
  o, rc = host("-e \"print(package.path:match('^[^;]+'), package.loaded.fsdp)\"")
  check(rc == "0" and o:find("/lua/?.lua\tnil\n", 1, true) ~= nil,
    "package.path starts with the fsdp Lua dir; fsdp is loaded only when required: " .. o)
  local po = io.popen("FSDP_LUA_PATH=/nowhere " .. arg[1] .. " -e \"print(package.path:match('^[^;]+'))\"")
  local pv = po:read("*a"); po:close()
  check(pv == "/nowhere/?.lua\n", "FSDP_LUA_PATH overrides the Lua dir: " .. pv)
end

-- the progress line is drawn only where the user's terminal is the end of
-- this rank's stdout: fsdprun says so; alone, our own stdout; under other
-- launchers (mpirun gives ranks a pty even when its output goes to a file) never
do
  local function env(t) return function(k) return t[k] end end
  local yes, no = function() return true end, function() return false end
  local multi, alone = { singleton = false }, { singleton = true }
  check(fsdp.on_terminal(multi, env { FSDPRUN = "1", FSDPRUN_TTY = "1" }, no), "fsdprun at a terminal: drawn")
  check(not fsdp.on_terminal(multi, env { FSDPRUN = "1" }, yes), "fsdprun into a file: plain lines")
  check(not fsdp.on_terminal(multi, env {}, yes), "mpirun (a pty as the rank's stdout): plain lines")
  check(fsdp.on_terminal(alone, env {}, yes), "a singleton at a terminal: drawn")
  check(not fsdp.on_terminal(alone, env {}, no), "a singleton into a file: plain lines")
end

-- fsdp.job: the trainer's job table takes its declared fields only
do
  local job = require "fsdp.job"
  local J = job.new({ r = {}, B = 2 })
  J.T = 64
  check(J.B == 2 and J.T == 64 and J.sharded == nil, "job: declared fields set and read, unset ones nil")
  fails(function() J.sharde = 1 end, "field 'sharde' is not declared in lua/fsdp/job.lua", "job: a write under an undeclared name")
  fails(function() return J.sharde end, "no field 'sharde'", "job: a read under an undeclared name")
  fails(function() job.new({ x = 1 }) end, "field 'x' is not declared", "job: an undeclared field at creation")
end

-- ops.attention_*_pos (context parallelism, issue 46): the two ranks of cp 2
-- (chunks 0, 3 and 1, 2 of four), each with the whole k, v, are the causal
-- op: their out rows equal its rows, their dk, dv summed its dk, dv
do
  local ops = require "fsdp.ops"
  local B, S, H, Hkv, D = 1, 8, 2, 1, 4
  local function rand(n, seed)
    local t = fsdp.tensor(n)
    for i = 0, n - 1 do t:set(i, math.sin(seed * 7.1 + i * 1.3)) end
    return t
  end
  local q, k, v, r = rand(S * H * D, 1), rand(S * Hkv * D, 2), rand(S * Hkv * D, 3), rand(S * H * D, 4)
  local out, lse, dq, dk, dv = fsdp.tensor(S * H * D), fsdp.tensor(H * S), fsdp.tensor(S * H * D), fsdp.tensor(S * Hkv * D),
    fsdp.tensor(S * Hkv * D)
  ops.attention_forward(out, lse, q, k, v, B, S, H, Hkv, D)
  ops.attention_backward(dq, dk, dv, r, q, k, v, out, lse, B, S, H, Hkv, D)
  local row = H * D
  local sk, sv, worst_out, worst_dkv = {}, {}, 0, 0
  for rank = 0, 1 do
    local pos = fsdp.tensor(4, "int32")
    for i = 0, 1 do pos:set(i, rank * 2 + i); pos:set(2 + i, (3 - rank) * 2 + i) end
    local qr, rr = fsdp.tensor(4 * row), fsdp.tensor(4 * row)
    for i = 0, 3 do
      for c = 0, row - 1 do qr:set(i * row + c, q:get(pos:get(i) * row + c)); rr:set(i * row + c, r:get(pos:get(i) * row + c)) end
    end
    local o, l, gq, gk, gv = fsdp.tensor(4 * row), fsdp.tensor(H * 4), fsdp.tensor(4 * row), fsdp.tensor(S * Hkv * D),
      fsdp.tensor(S * Hkv * D)
    ops.attention_forward_pos(o, l, qr, k, v, pos, B, 4, S, H, Hkv, D)
    ops.attention_backward_pos(gq, gk, gv, rr, qr, k, v, o, l, pos, B, 4, S, H, Hkv, D)
    for i = 0, 3 do
      for c = 0, row - 1 do worst_out = math.max(worst_out, math.abs(o:get(i * row + c) - out:get(pos:get(i) * row + c))) end
    end
    for i = 0, S * Hkv * D - 1 do sk[i] = (sk[i] or 0) + gk:get(i); sv[i] = (sv[i] or 0) + gv:get(i) end
    if rank == 0 then
      pos:set(3, S)
      fails(function() ops.attention_forward_pos(o, l, qr, k, v, pos, B, 4, S, H, Hkv, D) end,
        "attention_forward_pos: q_pos: query 3 at position 8", "a position past the keys is refused, naming the query")
      o.device = "cuda" -- (an error before any CUDA call: there is no backend here)
      fails(function() ops.attention_forward_pos(o, l, qr, k, v, pos, B, 4, S, H, Hkv, D) end,
        "attention_forward_pos: on a GPU, q_pos_dev (the device copy of q_pos) is needed", "on a GPU, the device copy")
      o.device = "cpu"
    end
  end
  for i = 0, S * Hkv * D - 1 do
    worst_dkv = math.max(worst_dkv, math.abs(sk[i] - dk:get(i)), math.abs(sv[i] - dv:get(i)))
  end
  check(worst_out < 1e-6, "attention_forward_pos: each rank's rows are the causal op's (" .. worst_out .. ")")
  check(worst_dkv < 1e-5, "attention_backward_pos: the ranks' dk, dv summed are the causal op's (" .. worst_dkv .. ")")
end

T.finish()

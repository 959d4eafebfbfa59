-- test_nan_payload.lua: NaNs that carry payload bits, read from C memory
-- by the front end, arrive in Lua as plain NaN numbers.
--   fsdprun -n 2 tests/lua/test_nan_payload.lua
-- LuaJIT keeps its values in NaN boxes: a double NaN whose upper bits are
-- set reads as nil, a table, a prototype... and using it corrupts the heap
-- (a segfault). Such NaNs come from C: NaN weights keep their payload
-- through the arithmetic of a forward pass into the loss. Each path by
-- which a number crosses from C into Lua gets them here: the readers of
-- fsdp.ffi, tensors of every dtype (get, to_table, tostring, interpreted
-- and JIT-compiled), the mse and cross-entropy losses, a sharded model's
-- train_step, evaluate and gather (fp32 and bf16 params) over two ranks.
-- Reference: every value read must be a Lua number that is NaN.
local fsdp = require "fsdp"
local base = require "fsdp.ffi"
local ops = require "fsdp.ops"
local ffi, C = fsdp.ffi, fsdp.C

local info = fsdp.init()
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_nan_payload rank %d", info.rank))
local check = T.check

local function is_nan(x) return type(x) == "number" and x ~= x end
-- a part that raises (a broken value used) fails, and the next parts run
local function part(what, fn)
  local ok, err = pcall(fn)
  check(ok, what .. ": " .. tostring(err))
end

-- doubles: the issue's examples, and payloads that land on LuaJIT's type
-- tags (GC64: the top 17 bits; table 0xfffa..., nil 0xffff8..., proto,
-- userdata, the number-like 0xfff9...)
local f64_bits = { "7ff8000000000123", "7ff0000000000001", "fff0000000000001", "fff8000000000123", "fffa000000001234",
  "ffff800000000000", "fffc000000000001", "fffe000000000010", "fff9000000000010", "fff4000000000010", "ffffffffffffffff" }
-- fp32 NaNs whose payload, widened to double, lands on those tags too
local f32_bits = { 0x7fc00123, 0xffd00000, 0xffffffff, 0xffe00000, 0xff800001, 0xfff00001, 0x7f800001 }
local bf16_bits = { 0xffd0, 0xffff, 0xffe0, 0x7fc1, 0xff81 }
local fp16_bits = { 0xffff, 0xfe80, 0xff00, 0x7e01, 0xfc01 }

local function u64(hex)
  return ffi.new("uint64_t", tonumber(hex:sub(1, 8), 16)) * 2 ^ 32 + tonumber(hex:sub(9), 16)
end

-- a tensor of n elements cycling through the patterns (bits written as integers)
local function nan_tensor(dtype, n)
  local t = fsdp.tensor(n, dtype)
  local raw = ffi.cast(dtype == "fp64" and "uint64_t *" or dtype == "fp32" and "uint32_t *" or "uint16_t *", t.data)
  local pats = dtype == "fp64" and f64_bits or dtype == "fp32" and f32_bits or dtype == "bf16" and bf16_bits or fp16_bits
  for i = 0, n - 1 do
    local p = pats[i % #pats + 1]
    raw[i] = dtype == "fp64" and u64(p) or p
  end
  return t
end

-- 1. the readers, and tensors of every dtype: 300 elements, so that the
-- loops below run JIT-compiled as well as interpreted
for _, dtype in ipairs({ "fp64", "fp32", "bf16", "fp16" }) do part(dtype, function()
  local t = nan_tensor(dtype, 300)
  local bad = 0
  for _ = 1, 3 do
    for i = 0, 299 do if not is_nan(t:get(i)) then bad = bad + 1 end end
    for _, x in ipairs(t:to_table()) do if not is_nan(x) then bad = bad + 1 end end
    if #t:to_table() ~= 300 then bad = bad + 1 end
  end
  check(bad == 0, dtype .. ": get and to_table read every payload NaN as a NaN number (" .. bad .. " not)")
  local read, p = base.readers[dtype], t:ptr()
  bad = 0
  for i = 0, 299 do if not is_nan(read(p, i)) then bad = bad + 1 end end
  check(bad == 0, dtype .. ": fsdp.ffi's reader (" .. bad .. " not)")
  check(tostring(t):find("nan, nan", 1, true) ~= nil, dtype .. ": tostring prints them: " .. tostring(t))
  t:free()
end) end
-- finite values and infinities read as they are
local inf = fsdp.tensor(4, "fp32")
inf:set(0, math.huge); inf:set(1, -math.huge); inf:set(2, -2.5); inf:set(3, 0)
check(inf:get(0) == math.huge and inf:get(1) == -math.huge and inf:get(2) == -2.5 and inf:get(3) == 0, "fp32 inf and finite")
local d = ffi.new("double[2]", 1 / 3, -math.huge)
check(base.f64(d) == 1 / 3 and base.f64(d, 1) == -math.huge, "fp64 finite and -inf")

-- 2. the losses computed in C from payload NaNs
part("mse", function()
  local y, tgt = nan_tensor("fp32", 8), fsdp.tensor(8):fill(0)
  local loss, dy = fsdp.nn.mse(y, tgt, 1)
  check(is_nan(loss), "mse: a NaN number")
  dy:free()
end)
part("cross entropy", function()
  local V = 16
  local logits, targets = fsdp.tensor({ 4, V }):fill(0.5), fsdp.tensor(4, "int32"):fill(3)
  local lp = ffi.cast("uint32_t *", logits.data)
  -- each row's first logit (its max, then its exp sum): a NaN whose payload
  -- lands on the table tag once widened, in every row so that the sum keeps it
  for r = 0, 3 do lp[r * V] = 0xffd00000 end
  check(is_nan(ops.cross_entropy(logits, targets, nil, 4, V, -100, 1)), "cross entropy: a NaN number")
end)

-- 3. a sharded model holding payload NaNs in its weights: two ranks
local F = dofile((arg[0]:match("^(.*/)") or "./") .. "mlp_fixture.lua")(fsdp)
local mesh = fsdp.mesh({ { "dp", info.size } })
for _, dtype in ipairs({ "fp32", "bf16" }) do
  local s = fsdp.fully_shard(F.mlp(), { shard = mesh:group("dp"), units = { "Linear" }, zero = 3, seed = 7,
    mixed = { param_dtype = dtype } })
  -- every element of this rank's main params a payload NaN
  for _, u in ipairs(s.units) do
    local n = tonumber(C.fsdp_unit_state_numel(u.handle))
    local t = nan_tensor("fp32", math.max(n, 1))
    fsdp.check(C.fsdp_unit_state_set(u.handle, C.FSDP_STATE_PARAM, 0, n, t:ptr()), "state_set")
    fsdp.check(C.fsdp_unit_state_publish(u.handle), "publish")
    t:free()
  end
  local batches = { F.batch(info.rank, 1, 1) }
  part(dtype .. ": train_step", function()
    local loss, norm, warn = s:train_step(batches, { lr = 1e-2 })
    check(is_nan(loss) and norm == math.huge and warn ~= nil, dtype .. ": train_step's loss is a NaN number, the step skipped")
  end)
  part(dtype .. ": evaluate", function()
    check(is_nan(s:evaluate(batches, function(y, b) return (fsdp.nn.mse(y, b.y)) end)), dtype .. ": evaluate")
  end)
  part(dtype .. ": gather", function()
    local bad = 0
    for _, name in ipairs(F.names) do
      for _, x in ipairs(s:gather(name)) do if not is_nan(x) then bad = bad + 1 end end
    end
    check(bad == 0, dtype .. ": gather reads NaN numbers (" .. bad .. " not)")
  end)
  s:free()
end

collectgarbage()
T.finish()

-- test_plan_model.lua (fsdprun -n W): a user's own fsdp.nn model planned
-- by running it on the counting device (fsdp.plan_model, fsdp.dry_run),
-- against what fully_shard then allocates and a training step then holds.
-- The model calls one Linear three times in its forward (a shared layer:
-- autograd frames) and checkpoints a block of its own:
--   y = D(tanh(A(ck(tanh(A(tanh(A(E(x)))))))))  A shared, ck a checkpointed Sequential
-- For ZeRO 0-3, prefetch 0 and 1, 1 and 2 micro-batches, one unit per
-- Linear: each unit's planned resident bytes equal fsdp_unit_memory_info's,
-- byte for byte; the activations of a step equal the allocator's measured
-- peak above the step's start (garbage collector stopped); the bytes kept
-- between steps (resident, pools, batches) equal what is allocated. Also:
-- the plan renders, unknown options and a batch function are refused by
-- name, and a module that reads a tensor's elements in its forward stops
-- the dry run with a message saying so (never a plan of a wrong model).
local fsdp = require "fsdp"
local nn = fsdp.nn

local info = fsdp.init()
local W, R = info.size, info.rank
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_plan_model rank %d/%d", R, W))
local check, fails = T.check, T.fails

local ROWS, IN, H, OUT = 24, 40, 96, 8
local function model()
  local a = nn.Linear(H, H)
  local block = nn.Sequential(nn.Tanh(), a, nn.Tanh())
  block.checkpoint = true
  return nn.Sequential(nn.Linear(IN, H), a, nn.Tanh(), a, block, nn.Linear(H, OUT))
end
local function batch()
  local x, y = fsdp.tensor({ ROWS, IN }), fsdp.tensor({ ROWS, OUT })
  if not x.meta then
    for i = 0, ROWS * IN - 1 do x:set(i, math.sin(0.37 * i + R)) end
    for i = 0, ROWS * OUT - 1 do y:set(i, math.cos(0.53 * i)) end
  end
  return { x = x, y = y }
end

local mesh = fsdp.mesh({ { "dp_shard", W } })
local function compare(zero, prefetch, K)
  local label = string.format("zero %d, prefetch %d, %d micro-batch%s, %d ranks", zero, prefetch, K, K == 1 and "" or "es", W)
  local opts = { units = { "Linear" }, zero = zero, prefetch = prefetch, micro_batches = K }
  local po = { world = W, batch = batch, where = "my model" }
  for k, v in pairs(opts) do po[k] = v end
  local m = model()
  local p = fsdp.plan_model(m, po)
  collectgarbage()
  collectgarbage()
  local before = fsdp.memory_stats().allocated
  local so = { shard = mesh:group("dp_shard"), seed = 5 }
  for k, v in pairs(opts) do so[k] = v end
  local s = fsdp.fully_shard(m, so)
  check(#p.units == #s.units and #s.units == 3, label .. ": 3 units (the shared Linear once)")
  local bad = T.unit_bytes_diff(fsdp, s, p)
  check(#bad == 0, label .. ": planned resident bytes = allocated: " .. table.concat(bad, "; "))
  local batches = {}
  for k = 1, K do batches[k] = batch() end
  local function step() s:train_step(batches, { lr = 1e-2 }) end
  step() -- (the first makes the lasting state: the optimizer's)
  local act, base = T.measured(fsdp, "cpu", step)
  check(act == p.activations, string.format("%s: activations: planned %d bytes, measured %d", label, p.activations, act))
  local lasting = p.resident_total + p.pools.params + p.pools.grads + p.batches
  check(base - before == lasting, string.format("%s: resident bytes and batches: planned %d, allocated %d", label, lasting,
    base - before))
  for _, b in ipairs(batches) do b.x:free(); b.y:free() end
  s:free()
  return p
end

for zero = 0, 3 do compare(zero, 1, 1) end
compare(3, 0, 2)
local p = compare(2, 1, 2)
check(p.activations > 0 and p.batches == 2 * ROWS * (IN + OUT) * 4, "the batches: " .. tostring(p.batches))

-- the plan as `fsdp plan` prints one
local text = fsdp.render_plan(p)
check(text:find("plan: my model on " .. W .. " ranks", 1, true) and text:find("run on the counting device", 1, true),
  "rendered: " .. text:sub(1, 200))

-- mistakes, named
fails(function() fsdp.plan_model(model(), { batch = batch, zeroo = 3 }) end, "unknown option 'zeroo'", "a misspelt option")
fails(function() fsdp.plan_model(model(), {}) end, "batch must be a function", "no batch")
do -- a module that reads its input's elements: the dry run says so, and plans nothing
  local Peek = { kind = "Peek" }
  Peek.__index = Peek
  function Peek:forward(_, x) self.saved = x:get(0); return x end
  function Peek:backward(_, dy) return dy end
  local bad = nn.Sequential(nn.Linear(IN, OUT), setmetatable({ params = {} }, Peek))
  fails(function() fsdp.plan_model(bad, { batch = batch }) end, "has no memory", "a module reading elements")
  -- and tensors are real again afterwards
  local t = fsdp.tensor(4)
  check(not t.meta and t:fill(2):get(3) == 2, "after a failed dry run, tensors are real")
end
mesh:free()
T.finish()

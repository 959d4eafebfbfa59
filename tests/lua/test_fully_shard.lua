-- test_fully_shard.lua: a small MLP sharded with fsdp.fully_shard (one unit
-- per Linear) trains 20 steps on W ranks (fsdprun -n W) for zero 0-3, HSDP
-- 2x2 when W = 4, with and without gradient accumulation, and matches the
-- same model unsharded (all parameters in one unit, alone on each rank)
-- trained on the global batch: the loss every step and the final weights,
-- fp32, within 1e-5 relative (+1e-6 absolute for weights).
local fsdp = require "fsdp"
local nn = fsdp.nn
local ffi, C = fsdp.ffi, fsdp.C

local info = fsdp.init()
local W, R = info.size, info.rank
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_fully_shard rank %d/%d", R, W))
local check, fails = T.check, T.fails
local F = dofile((arg[0]:match("^(.*/)") or "./") .. "mlp_fixture.lua")(fsdp)
local mlp, batch, names = F.mlp, F.batch, F.names

local opt = { lr = 1e-2, weight_decay = 0.1, clip = 1.0 }

local function run(label, shard, outer, solo, zero, K, o, units)
  local opt = o or opt
  local model = fsdp.fully_shard(mlp(), { shard = shard, outer = outer, units = units or { "Linear" }, zero = zero, seed = 7 })
  local ref = fsdp.fully_shard(mlp(), { shard = solo, zero = 0, seed = 7 })
  check(#model.units == 3 and #ref.units == 1, label .. ": unit grouping")
  local worst = 0
  for t = 1, 20 do
    local mine, all = {}, {}
    for k = 1, K do mine[k] = batch(R, k, t) end
    for g = 0, W - 1 do for k = 1, K do all[#all + 1] = batch(g, k, t) end end
    local l1 = model:train_step(mine, opt)
    local l2 = ref:train_step(all, opt)
    worst = math.max(worst, math.abs(l1 - l2) / math.abs(l2))
  end
  check(worst <= 1e-5, string.format("%s: loss matches every step (worst relative %.2e)", label, worst))
  local bad = 0
  for _, name in ipairs(names) do
    local a, b = model:gather(name), ref:gather(name)
    for i = 1, #b do
      if not (math.abs(a[i] - b[i]) <= 1e-5 * math.abs(b[i]) + 1e-6) then bad = bad + 1 end
    end
  end
  check(bad == 0, string.format("%s: final weights match (%d off)", label, bad))
  model:free()
  ref:free()
  model:free() -- idempotent
end

local mesh = fsdp.mesh({ { "dp", W }, { "solo", 1 } })
local dp, solo = mesh:group("dp"), mesh:group("solo")
for zero = 0, 3 do
  for _, K in ipairs({ 1, 2 }) do run(string.format("W=%d zero %d, %d micro-batches", W, zero, K), dp, nil, solo, zero, K) end
end
run(string.format("W=%d zero 3, SGD with momentum", W), dp, nil, solo, 3, 2,
  { optimizer = "sgd", lr = 0.05, momentum = 0.9, weight_decay = 0.01, clip = 1.0 })
run(string.format("W=%d zero 1, plain SGD", W), dp, nil, solo, 1, 1, { optimizer = "sgd", lr = 0.1 })
-- per-unit zero levels from a policy function
local levels = { ["0"] = 3, ["2"] = 1, ["4"] = 2 }
local per_unit = function(m, path) if m.kind == "Linear" then return path, { zero = levels[path] } end end
run(string.format("W=%d zero 3/1/2 per unit", W), dp, nil, solo, 0, 2, nil, per_unit)
do
  local m = fsdp.fully_shard(mlp(), { shard = dp, units = per_unit })
  local mem = fsdp.ffi.new("fsdp_unit_memory")
  local full = {}
  for i, u in ipairs(m.units) do
    fsdp.check(fsdp.C.fsdp_unit_memory_info(u.handle, mem), "memory_info")
    full[i] = tonumber(mem.params_full)
  end
  check(m.units[1].zero == 3 and m.units[2].zero == 1 and m.units[3].zero == 2, "per-unit zero levels")
  check(full[1] == 0 and full[2] > 0 and full[3] > 0, "zero 3 unit keeps no resident full params, zero 1/2 units do")
  fails(function() fsdp.fully_shard(mlp(), { shard = dp, units = function(mm, p) return p, { zero = 7 } end }) end,
    "zero = 7", "bad per-unit zero")
  m:free()
end
-- overlap_step: each unit's step applied at its next use (the next
-- forward) instead of at the end of train_step, the default on GPUs; on
-- CPU ranks asked for here. The same arithmetic in the same order: the
-- losses, the weights and the optimizer state bit for bit those of the
-- step applied at once (tolerance none), and nothing of the last step lost
-- (the weights and the state are read after it, which applies it).
local function state_of(model)
  local out = {}
  for _, u in ipairs(model.units) do
    local n = tonumber(C.fsdp_unit_state_numel(u.handle))
    for kind = 0, 2 do
      local buf = ffi.new("float[?]", math.max(n, 1))
      fsdp.check(C.fsdp_unit_state_get(u.handle, kind, 0, n, buf), "state_get")
      for i = 0, n - 1 do out[#out + 1] = buf[i] end
    end
  end
  return out
end
for zero = 0, 3 do
  for _, K in ipairs({ 1, 2 }) do
    local label = string.format("W=%d zero %d, %d micro-batches, overlap_step", W, zero, K)
    local made = {}
    for i, overlap in ipairs({ true, false }) do
      made[i] = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = zero, seed = 7, overlap_step = overlap,
        micro_batches = K })
    end
    check(made[1].units[1].config.overlap_step == 1 and made[2].units[1].config.overlap_step == 0,
      label .. ": the units were made so")
    local off = 0
    for t = 1, 5 do
      local mine = {}
      for k = 1, K do mine[k] = batch(R, k, t) end
      if made[1]:train_step(mine, opt) ~= made[2]:train_step(mine, opt) then off = off + 1 end
    end
    for _, name in ipairs(names) do
      local a, b = made[1]:gather(name), made[2]:gather(name)
      for i = 1, #b do if a[i] ~= b[i] then off = off + 1 end end
    end
    local sa, sb = state_of(made[1]), state_of(made[2])
    for i = 1, #sb do if sa[i] ~= sb[i] then off = off + 1 end end
    check(off == 0 and #sa == #sb and #sa > 0, string.format("%s: losses, weights and optimizer state bit for bit the " ..
      "step at once's (%d off)", label, off))
    made[1]:free()
    made[2]:free()
  end
end
fails(function() fsdp.fully_shard(mlp(), { shard = dp, overlap_step = "yes" }) end, "overlap_step = 'yes' (a string)",
  "overlap_step is a boolean")

-- A step's timeline (fsdp.profile) holds each unit's collectives on the
-- comm streams: a reduction per unit per micro-batch that reduces (zero
-- 2-3: each of K; zero 0-1: the last only, the others add up in place and
-- run none), at least one all-gather per unit at zero 3 and none at zero
-- 0-2 (resident params), every span inside the step, and the hidden share
-- between 0 and the whole. Without prefetch no all-gather can overlap a
-- module's work (a CPU rank waits for its unit's gather before computing,
-- and the work is timed from there): its hidden share is exactly 0.
local profile = require "fsdp.profile"
for _, case in ipairs({ { 1, 1 }, { 3, 1 }, { 3, 0 } }) do
  local zero, prefetch = case[1], case[2]
  local model = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = zero, seed = 7, prefetch = prefetch })
  model:train_step({ batch(R, 1, 1), batch(R, 2, 1) }, opt) -- (the first step's set-up out of the way)
  local p = profile.start({ device = "cpu", settle = function() model:synchronize() end })
  model:train_step({ batch(R, 1, 2), batch(R, 2, 2) }, opt)
  p:finish(function() model:synchronize() end)
  local gathers, reduces, inside = {}, {}, true
  for _, sp in ipairs(p.spans) do
    if sp.comm then
      local kind, unit = sp.name:match("^(%S+) (.+)$")
      local t = kind == "all-gather" and gathers or reduces
      t[unit] = (t[unit] or 0) + 1
      inside = inside and sp.dev_begin >= 0 and sp.dev_end >= sp.dev_begin and sp.dev_end <= p.wall + 1e-6
    end
  end
  local ok = true
  for _, u in ipairs(model.units) do
    ok = ok and reduces[u.name] == (zero == 3 and 2 or 1)
    ok = ok and (zero == 3 and (gathers[u.name] or 0) >= 1 or zero < 3 and gathers[u.name] == nil)
  end
  local ov = p:overlap()
  check(ok and inside and ov.comm > 0 and ov.hidden >= 0 and ov.hidden <= ov.comm + 1e-12,
    string.format("W=%d zero %d, prefetch %d, 2 micro-batches: the comm track's gathers and reductions per unit, inside " ..
    "the step; %.0f%% of %.3f ms hidden", W, zero, prefetch, 100 * ov.hidden / math.max(ov.comm, 1e-12), 1e3 * ov.comm))
  if zero == 3 and prefetch == 0 then
    local has_child, g, work = {}, {}, {}
    for _, sp in ipairs(p.spans) do if sp.parent then has_child[sp.parent] = true end end
    for _, sp in ipairs(p.spans) do
      if sp.comm and sp.name:find("^all%-gather") then g[#g + 1] = { sp.dev_begin, sp.dev_end }
      elseif not sp.comm and sp.parent and not has_child[sp] then work[#work + 1] = { sp.dev_ready or sp.dev_begin, sp.dev_end } end
    end
    local hidden = profile.overlap_length(g, work)
    check(#g > 0 and #work > 0 and hidden <= 1e-9, string.format("W=%d zero 3 without prefetch: no all-gather overlaps " ..
      "a module's work (%.2e s)", W, hidden))
  end
  model:free()
end

-- A step that ends in an error part way (its second micro-batch's loss
-- fails, so the first was reduced; or the loss is read after the whole
-- backward, so every unit's grads were reduced) leaves nothing behind: the
-- next step's loss and weights are those of a model that never tried it,
-- bit for bit (the same calls on the same data; tolerance none).
for zero = 0, 3 do
  for _, where in ipairs({ "before the last backward", "after the last backward" }) do
    local label = string.format("W=%d zero %d, a step that failed %s", W, zero, where)
    local model = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = zero, seed = 7 })
    local fresh = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = zero, seed = 7 })
    local k = 0
    local broken = function(y, b, scale)
      k = k + 1
      if where == "before the last backward" and k == 2 then error("loss broke") end
      local loss, dy = nn.mse(y, b.y, scale)
      if where == "after the last backward" then -- read once the backward is done
        loss = { buf = setmetatable({}, { __index = function() error("loss broke") end }) }
      end
      return loss, dy
    end
    fails(function() model:train_step({ batch(R, 1, 1), batch(R, 2, 1) }, { loss = broken }) end, "loss broke",
      label .. ": the step fails")
    local mine = { batch(R, 1, 2), batch(R, 2, 2) }
    local l1, l2 = model:train_step(mine, opt), fresh:train_step(mine, opt)
    local bad = l1 == l2 and 0 or 1
    for _, name in ipairs(names) do
      local a, b = model:gather(name), fresh:gather(name)
      for i = 1, #b do if a[i] ~= b[i] then bad = bad + 1 end end
    end
    check(bad == 0, string.format("%s: the next step is a fresh model's, loss and weights bit for bit (%d off)", label,
      bad))
    model:free()
    fresh:free()
  end
end
if W == 4 then
  local h = fsdp.mesh({ { "dp_outer", 2 }, { "dp_shard", 2 }, { "solo", 1 } })
  run("HSDP 2x2 zero 3, 2 micro-batches", h:group("dp_shard"), h:group("dp_outer"), h:group("solo"), 3, 2)
  run("HSDP 2x2 zero 1, 1 micro-batch", h:group("dp_shard"), h:group("dp_outer"), h:group("solo"), 1, 1)
  local model = fsdp.fully_shard(mlp(), { shard = h:group("dp_shard"), outer = h:group("dp_outer"), hfsdp = true,
    units = { "Linear" }, zero = 3, seed = 7 })
  local ref = fsdp.fully_shard(mlp(), { shard = h:group("solo"), zero = 0, seed = 7 })
  local worst = 0
  for t = 1, 20 do
    local all = {}
    for g = 0, W - 1 do all[#all + 1] = batch(g, 1, t) end
    local l1, l2 = model:train_step({ batch(R, 1, t) }, opt), ref:train_step(all, opt)
    worst = math.max(worst, math.abs(l1 - l2) / math.abs(l2))
  end
  local bad = 0
  for _, name in ipairs(names) do
    local a, b = model:gather(name), ref:gather(name)
    for i = 1, #b do if not (math.abs(a[i] - b[i]) <= 1e-5 * math.abs(b[i]) + 1e-6) then bad = bad + 1 end end
  end
  check(worst <= 1e-5 and bad == 0, string.format("HFSDP 2x2 zero 3: loss (worst %.2e) and weights (%d off) match", worst, bad))
  model:free(); ref:free()
end

-- bf16 params and grads, fp32 reduction and main params, against the fp32
-- unsharded model. Tolerance (bf16): loss within 2e-2 relative every step,
-- final weights within 1e-1 in relative L2 norm over the model (Adam turns
-- bf16 noise in near-zero grads into full-size steps of either sign, so
-- single weights may differ by a few lr); and not equal to the fp32 run, so
-- the bf16 path really ran.
do
  local m = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, seed = 7,
    mixed = { param_dtype = "bf16", reduce_dtype = "fp32" } })
  local ref = fsdp.fully_shard(mlp(), { shard = solo, zero = 0, seed = 7 })
  local worst, differs, d2, r2 = 0, false, 0, 0
  for t = 1, 20 do
    local all = {}
    for g = 0, W - 1 do all[#all + 1] = batch(g, 1, t) end
    local l1 = m:train_step({ batch(R, 1, t) }, opt)
    local l2 = ref:train_step(all, opt)
    worst = math.max(worst, math.abs(l1 - l2) / math.abs(l2))
    differs = differs or l1 ~= l2
  end
  for _, name in ipairs(names) do
    local a, b = m:gather(name), ref:gather(name)
    for i = 1, #b do d2, r2 = d2 + (a[i] - b[i]) ^ 2, r2 + b[i] ^ 2 end
  end
  local worst_w = math.sqrt(d2 / r2)
  check(worst <= 2e-2, string.format("bf16: loss within 2e-2 of fp32 every step (worst %.2e)", worst))
  check(worst_w <= 1e-1, string.format("bf16: weights within 1e-1 relative L2 of fp32 (got %.2e)", worst_w))
  check(differs, "bf16: the run is not the fp32 run")
  if R == 0 then print(string.format("bf16 vs fp32: worst loss relative %.2e, weights relative L2 %.2e", worst, worst_w)) end
  m:free(); ref:free()
  fails(function() fsdp.fully_shard(mlp(), { shard = dp, mixed = { param_dtype = "fp8" } }) end, "param_dtype = 'fp8'",
    "unknown mixed precision dtype")
  -- a misspelt option is refused, not left at its default without a word
  fails(function() fsdp.fully_shard(mlp(), { shard = dp, max_live_unit = 3 }) end,
    "fully_shard: unknown option 'max_live_unit' (expected shard, outer, units,", "a misspelt option")
  fails(function() fsdp.fully_shard(mlp(), { shard = dp, max_live_units = 0 }) end,
    "fully_shard: max_live_units = 0; expected an integer >= 1", "no live buffers")
  fails(function() fsdp.fully_shard(mlp(), { shard = dp, zero = "3" }) end,
    "fully_shard: zero = '3' (a string); expected 0, 1, 2 or 3", "zero as a string")
  fails(function() fsdp.fully_shard(mlp(), { shard = dp, units = 42 }) end,
    "fully_shard: units = 42; expected a list of module kinds or a function", "a policy that is neither")
  fails(function() fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear", "Linaer" } }) end,
    "fully_shard: the units list names 'Linaer', but no module of the model is one (its kinds: ", "a kind the model lacks")
  local mm = fsdp.fully_shard(mlp(), { shard = dp })
  fails(function() mm:train_step({ batch(R, 1, 1) }, { lr = 1e-3, weight_decy = 0.1 }) end,
    "train_step: unknown option 'weight_decy' (expected loss, forward_loss, optimizer,", "a misspelt step option")
  mm:free()
end

-- bf16 reduced in bf16, one micro-batch a step: made for it (micro_batches
-- = 1), the units keep the optimizer's grads in bf16 (compact); the losses
-- and weights of the same model made for any count (fp32 grads), bit for
-- bit. A different count is refused by name.
do
  local function make(mb)
    return fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, seed = 7, micro_batches = mb,
      mixed = { param_dtype = "bf16", reduce_dtype = "bf16" } })
  end
  local a, b = make(1), make(nil)
  check(a.units[1].plan.grads_compact == 1 and b.units[1].plan.grads_compact == 0, "compact grads where made for one micro-batch")
  local same = true
  for t = 1, 5 do
    local la, lb = a:train_step({ batch(R, 1, t) }, opt), b:train_step({ batch(R, 1, t) }, opt)
    same = same and la == lb
  end
  for _, name in ipairs(names) do
    local x, y = a:gather(name), b:gather(name)
    for i = 1, #y do same = same and x[i] == y[i] end
  end
  check(same, "bf16, one micro-batch: compact grads give the losses and weights of fp32 grads, bit for bit")
  fails(function() a:train_step({ batch(R, 1, 9), batch(R, 2, 9) }, opt) end, "made with micro_batches = 1",
    "two micro-batches for a model made for one")
  a:free(); b:free()
  fails(function() make(0) end, "micro_batches = 0", "micro_batches below 1")
end

-- a non-finite gradient skips the step on every rank and names the unit
do
  local m = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, seed = 3 })
  local before = m:gather("4.weight")
  local b = batch(R, 1, 1)
  if R == W - 1 then b.y:set(0, 0 / 0) end -- NaN target on the last rank only
  local loss, norm, warn = m:train_step({ b }, opt)
  -- the NaN enters at the loss, so every unit behind it is named, the last first in model order
  check(warn ~= nil and warn:find("'4' (", 1, true) ~= nil and warn:find("skipped", 1, true) ~= nil,
    "skip names the units: " .. tostring(warn))
  check(norm == math.huge, "norm reported as inf")
  local after = m:gather("4.weight")
  local same = true
  for i = 1, #before do same = same and before[i] == after[i] end
  check(same and m.step_count == 0, "weights unchanged and the step counter did not advance")
  local _, _, warn2 = m:train_step({ batch(R, 1, 2) }, opt)
  check(warn2 == nil and m.step_count == 1, "the next finite step runs as step 1")
  m:free()
end

-- the schedule overlaps: with zero 3, the next unit's all-gather is issued
-- before the current unit computes, and a unit's reduce-scatter is issued
-- before the backward of the unit in front of it
do
  local tr = {}
  local m = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, trace = tr })
  m:train_step({ batch(R, 1, 1) }, opt)
  local first = {}
  for i, e in ipairs(tr) do
    local key = e.op .. ":" .. e.unit .. ":" .. (e.phase or "")
    if not first[key] then first[key] = i end
  end
  check(first["unshard:2:"] and first["compute:0:forward"] and first["unshard:2:"] < first["compute:0:forward"],
    "prefetch: unit 2 gathered before unit 0 computes")
  check(first["unshard:4:"] < first["compute:2:forward"], "prefetch: unit 4 gathered before unit 2 computes")
  check(first["reduce:4:"] < first["compute:2:backward"], "unit 4 reduces while unit 2 runs its backward")
  check(first["reduce:2:"] < first["compute:0:backward"], "unit 2 reduces while unit 0 runs its backward")
  m:free()
end

-- ... and in time: with compute slowed to 40 ms per module, the comm
-- stream's timestamps show unit 2's all-gather running while unit 0
-- computes, and unit 4's reduce-scatter running while unit 2 runs its
-- backward (compared on one rank's monotonic clock)
do
  local ffi = require "ffi"
  pcall(ffi.cdef, "int usleep(unsigned int usec);")
  local function slow(m)
    for _, c in ipairs(m.children) do
      if c.kind == "Linear" then
        local f, b = c.forward, c.backward
        c.forward = function(self, ctx, x) local y = f(self, ctx, x); ffi.C.usleep(40000); return y end
        c.backward = function(self, ctx, dy) local dx = b(self, ctx, dy); ffi.C.usleep(40000); return dx end
      end
    end
    return m
  end
  local tr = {}
  local m = fsdp.fully_shard(slow(mlp()), { shard = dp, units = { "Linear" }, zero = 3, trace = tr })
  m:train_step({ batch(R, 1, 1) }, opt)
  local ev = {}
  for _, e in ipairs(tr) do
    local key = e.op .. ":" .. e.unit .. ":" .. (e.phase or "")
    if not ev[key] then ev[key] = e end
  end
  local g0, g2, c0 = ev["unshard:0:"], ev["unshard:2:"], ev["compute:0:forward"]
  local r4, c4b, c2b = ev["reduce:4:"], ev["compute:4:backward"], ev["compute:2:backward"]
  local function fmt(e, a, b) return string.format("[%.4f, %.4f]", e[a] - g0.begin, e[b] - g0.begin) end
  check(g2.begin >= g0.finish and g2.begin < c0.t1 and g2.finish <= c0.t1,
    "unit 2's all-gather " .. fmt(g2, "begin", "finish") .. " ran within unit 0's forward " .. fmt(c0, "t0", "t1"))
  check(r4.begin >= c4b.t1 - 1e-3 and r4.begin < c2b.t1 and r4.finish <= c2b.t1,
    "unit 4's reduce-scatter " .. fmt(r4, "begin", "finish") .. " ran within unit 2's backward " .. fmt(c2b, "t0", "t1"))
  m:free()
end

-- fsdp.comm_register: the CPU transport registers nothing (the pools and
-- unit buffers still go through the registration path): the same training
do
  for _, zero in ipairs({ 1, 3 }) do
    local a = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = zero, seed = 7, comm_register = "window" })
    local b = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = zero, seed = 7 })
    local same = true
    for t = 1, 3 do same = same and a:train_step({ batch(R, 1, t) }, opt) == b:train_step({ batch(R, 1, t) }, opt) end
    check(same, "zero " .. zero .. ": registered buffers train bit for bit like plain ones")
    a:free(); b:free()
  end
  fails(function() fsdp.fully_shard(mlp(), { shard = dp, comm_register = "yes" }) end, "comm_register = 'yes'",
    "a bad comm_register")
end

-- a loss left on the device (ops.deferred, as cross-entropy's on a GPU) is
-- read once per micro-batch after every backward has been issued (no host
-- wait inside the step), and gives the same loss bit for bit
do
  local ops = require "fsdp.ops"
  local a = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, seed = 7 })
  local b = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, seed = 7 })
  local order = {}
  local bw = a.model.backward
  a.model.backward = function(self, ctx, dy) order[#order + 1] = "backward"; return bw(self, ctx, dy) end
  local function deferred_mse(y, bt, scale)
    local l, dy = nn.mse(y, bt.y, scale)
    return ops.deferred({ read = function() order[#order + 1] = "read"; return l * 4 end }, 1) / 4, dy
  end
  local ok = true
  for t = 1, 3 do
    local mb = { batch(R, 1, t), batch(R, 2, t) }
    local la = a:train_step(mb, { lr = 1e-2, loss = deferred_mse })
    local lb = b:train_step(mb, { lr = 1e-2 })
    ok = ok and la == lb
  end
  check(ok, "a deferred loss trains like a number, bit for bit")
  check(table.concat(order, ",", 1, 4) == "backward,backward,read,read" and #order == 12,
    "deferred losses are read after both micro-batches' backward: " .. table.concat(order, ","))
  local e = a:evaluate({ batch(R, 1, 9) }, function(y, bt) return ops.deferred({ read = function() return 2 * nn.mse(y, bt.y) end }, 0.5) end)
  check(e == b:evaluate({ batch(R, 1, 9) }, function(y, bt) return (nn.mse(y, bt.y)) end), "evaluate reads deferred losses too")
  a:free(); b:free()
end

-- reductions on their own channel: with the reduce comm's stream held up
-- 150 ms once the backward starts, the backward's prefetch of unit 0 (issued
-- after unit 4's reduce-scatter) still completes before that reduction
-- begins; with separate_reduce = false, on one stream, it cannot
do
  local function run_held(separate)
    local tr = {}
    local m = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, trace = tr, separate_reduce = separate })
    local bw = m.model.backward
    m.model.backward = function(self, ctx, dy)
      fsdp.check(fsdp.C.fsdp_stream_delay(fsdp.C.fsdp_comm_stream(m.reduce.handle), 150000), "delay")
      return bw(self, ctx, dy)
    end
    m:train_step({ batch(R, 1, 1) }, opt)
    local gathers, r4 = {}, nil
    for _, e in ipairs(tr) do
      if e.op == "unshard" and e.unit == "0" then gathers[#gathers + 1] = e end
      if e.op == "reduce" and e.unit == "4" then r4 = e end
    end
    m:free()
    return gathers[2], r4
  end
  local g0, r4 = run_held(nil)
  check(g0 and r4 and g0.finish > 0 and g0.finish < r4.begin, string.format(
    "separate reduce channel: unit 0's backward gather ended %.3f s before unit 4's reduce-scatter began",
    g0 and r4 and r4.begin - g0.finish or 0))
  g0, r4 = run_held(false)
  check(g0 and r4 and g0.begin >= r4.begin, "one stream: the gather waits behind the held reduction")
end

-- prefetch depth: with 4 buffers and depth 2 both following units are
-- gathered before unit 0 computes; with 2 buffers the bound stops it at one
do
  local function gathered_before_first_compute(live, depth)
    local tr = {}
    local m = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, trace = tr, max_live_units = live,
      prefetch = depth })
    m:train_step({ batch(R, 1, 1) }, opt)
    local n = 0
    for _, e in ipairs(tr) do
      if e.op == "compute" then break end
      if e.op == "unshard" then n = n + 1 end
    end
    m:free()
    return n
  end
  check(gathered_before_first_compute(4, 2) == 3, "prefetch 2 with 4 buffers: 3 units gathered before the first compute")
  -- (a shard group of one rank gathers nothing: its shards are the units, no buffer bounds them)
  check(gathered_before_first_compute(2, 2) == (W > 1 and 2 or 3), "prefetch 2 with 2 buffers: stops at the bound (2)")
  check(gathered_before_first_compute(4, 0) == 1, "prefetch 0: only the unit itself")
end

-- the layout table names owners of each piece
local s = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3 })
local rows = s:unit_table()
check(#rows == 6 and rows[1].param == "0.weight" and rows[1].numel == 128, "unit_table rows")
check(rows[3].owners:find("0:%[") ~= nil, "unit_table owners: " .. rows[3].owners)
local ok, err = pcall(fsdp.fully_shard, mlp(), { shard = dp, zero = 5 })
check(not ok and tostring(err):find("zero = 5"), "bad zero level is an error: " .. tostring(err))

s:free()
ok, err = pcall(function() s:gather("0.weight") end)
check(not ok and tostring(err):find("was freed"), "use after free is an error: " .. tostring(err))
collectgarbage() -- tensors, through their finalizers
T.finish()

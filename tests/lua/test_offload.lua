-- test_offload.lua: the offloaded optimizer (fsdp.offload, a policy's
-- offload option) on W CPU ranks (fsdprun -n W).
--
--   * the same arithmetic as the optimizer in place: losses every step and
--     final weights bit for bit, for zero 1-3, 1 and 2 micro-batches, AdamW
--     and SGD, bf16 params (the step writes the bf16 shard in the same pass),
--     HSDP 2x2, and offload on some units only; the weights are read right
--     after the last step, while it may still run on the host;
--   * the step overlaps the next forward: with each host step slowed to
--     80 ms (FSDP_TEST_HOST_STEP_DELAY_US), train_step returns before the
--     steps have run, the next forward starts before the last unit's step
--     ends, and each unit's forward starts only after its own step ended;
--   * a bad optimizer argument fails at once, naming the problem, and a
--     step skipped for non-finite grads uses no stale grads afterwards.
local fsdp = require "fsdp"
local ffi = require "ffi"

local info = fsdp.init()
local W, R = info.size, info.rank
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_offload rank %d/%d", R, W))
local check, fails = T.check, T.fails
local F = dofile((arg[0]:match("^(.*/)") or "./") .. "mlp_fixture.lua")(fsdp)
local mlp, batch, names = F.mlp, F.batch, F.names

local adamw = { lr = 1e-2, weight_decay = 0.1, clip = 1.0 }

-- train `steps` steps; the losses, and every weight read right after the last step
local function train(opts, K, opt, steps)
  local m = fsdp.fully_shard(mlp(), opts)
  local losses, weights = {}, {}
  for t = 1, steps do
    local mine = {}
    for k = 1, K do mine[k] = batch(R, k, t) end
    losses[t] = m:train_step(mine, opt)
  end
  for _, n in ipairs(names) do weights[n] = m:gather(n) end
  m:free()
  return losses, weights
end

-- opts with offload on (unless opts.offload says otherwise) against the
-- same opts in place (units_in_place: the grouping without the policy)
local function same(label, opts, K, opt)
  local off, base = { seed = 7, units = { "Linear" }, offload = true }, { seed = 7, units = { "Linear" } }
  for k, v in pairs(opts) do
    if k ~= "units_in_place" then off[k] = v end
    if k ~= "offload" and k ~= "units" and k ~= "units_in_place" then base[k] = v end
  end
  base.units = opts.units_in_place or off.units
  local la, wa = train(base, K, opt, 8)
  local lb, wb = train(off, K, opt, 8)
  local diff = 0
  for t = 1, 8 do if la[t] ~= lb[t] then diff = diff + 1 end end
  for _, n in ipairs(names) do
    for i = 1, #wa[n] do if wa[n][i] ~= wb[n][i] then diff = diff + 1 end end
  end
  check(diff == 0, string.format("%s: offloaded = in place bit for bit (%d values differ)", label, diff))
end

local mesh = fsdp.mesh({ { "dp", W } })
local dp = mesh:group("dp")
for zero = 1, 3 do
  for _, K in ipairs({ 1, 2 }) do
    same(string.format("W=%d zero %d, %d micro-batches", W, zero, K), { shard = dp, zero = zero }, K, adamw)
  end
end
same(string.format("W=%d zero 3, SGD with momentum", W), { shard = dp, zero = 3 }, 2,
  { optimizer = "sgd", lr = 0.05, momentum = 0.9, weight_decay = 0.01, clip = 1.0 })
same(string.format("W=%d zero 2, bf16 params", W), { shard = dp, zero = 2, mixed = { param_dtype = "bf16" } }, 2, adamw)
same(string.format("W=%d zero 3, bf16 params and grads", W),
  { shard = dp, zero = 3, mixed = { param_dtype = "bf16", reduce_dtype = "bf16" } }, 1, adamw)
-- the param shards too (on CPU ranks they are host memory already: the
-- same path as the optimizer alone), from the recipe's table form
same(string.format("W=%d zero 3, offload = {params = true}", W), { shard = dp, zero = 3, offload = { params = true } }, 2, adamw)
-- the grads too: no device grad shard, reductions straight into the host's
for zero = 1, 3 do
  same(string.format("W=%d zero %d, offload = {grads = true}", W, zero), { shard = dp, zero = zero, offload = { grads = true } }, 2, adamw)
end
same(string.format("W=%d zero 3, offload = 'all', bf16", W), { shard = dp, zero = 3, offload = "all", mixed = { param_dtype = "bf16" } },
  2, adamw)
same(string.format("W=%d zero 2, grads offloaded, SGD", W), { shard = dp, zero = 2, offload = "grads" }, 1,
  { optimizer = "sgd", lr = 0.05, momentum = 0.9, weight_decay = 0.01, clip = 1.0 })
-- offload on the middle unit only (a policy's option)
same(string.format("W=%d offload on unit '2' only", W), { shard = dp, zero = 3, offload = false,
  units = function(m, path) if m.kind == "Linear" then return path, { offload = path == "2" } end end,
  units_in_place = { "Linear" } }, 2, adamw)
if W == 4 then
  local h = fsdp.mesh({ { "dp_outer", 2 }, { "dp_shard", 2 } })
  fails(function() fsdp.fully_shard(mlp(), { shard = h:group("dp_shard"), outer = h:group("dp_outer"), units = { "Linear" },
    offload = "grads" }) end, "offloading the grads needs no outer (HSDP) group", "grads offload with HSDP is refused")
  same("HSDP 2x2 zero 3", { shard = h:group("dp_shard"), outer = h:group("dp_outer"), zero = 3 }, 2, adamw)
  same("HSDP 2x2 zero 1", { shard = h:group("dp_shard"), outer = h:group("dp_outer"), zero = 1 }, 1, adamw)
end

-- bad arguments fail in train_step, not later on the host thread
do
  local m = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, offload = true })
  fails(function() m:train_step({ batch(R, 1, 1) }, { lr = 1e-2, beta1 = 1.5 }) end, "beta1",
    "an invalid AdamW argument is reported by train_step")
  m:free()
end

-- non-finite grads skip the step; the next step reads the new grads only
for _, off in ipairs({ true, "grads" }) do
  local a = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, offload = off, seed = 3 })
  local b = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, seed = 3 })
  local bad = batch(R, 1, 1)
  bad.x:set(0, 0 / 0)
  local _, na = a:train_step({ bad }, adamw)
  local _, nb = b:train_step({ bad }, adamw)
  check(na == math.huge and nb == math.huge, "non-finite grads: both skip the step")
  for t = 2, 4 do
    local la, lb = a:train_step({ batch(R, 1, t) }, adamw), b:train_step({ batch(R, 1, t) }, adamw)
    check(la == lb, string.format("after a skipped step, step %d matches in place", t))
  end
  a:free(); b:free()
end

-- the overlap, in time. Every offloaded unit is freed above, so the shared
-- host stream starts again and reads the delay.
do
  pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
  ffi.C.setenv("FSDP_TEST_HOST_STEP_DELAY_US", "80000", 1)
  local tr = {}
  local m = fsdp.fully_shard(mlp(), { shard = dp, units = { "Linear" }, zero = 3, offload = true, trace = tr })
  m:train_step({ batch(R, 1, 1) }, adamw)
  local returned = fsdp.now()
  local mark = #tr
  m:train_step({ batch(R, 1, 2) }, adamw)
  -- the host span of step 1: three units' steps with two 80 ms delays between them
  check(m.host_step_s and m.host_step_s >= 0.15 and m.host_step_s < 5,
    "host_step_s reports the offloaded step's host span: " .. tostring(m.host_step_s))
  local steps, fwd = {}, {}
  for i, e in ipairs(tr) do
    if e.op == "step" and i <= mark then steps[e.unit] = e end
    if e.op == "compute" and e.phase == "forward" and i > mark and not fwd[e.unit] then fwd[e.unit] = e end
  end
  local last = steps["4"]
  check(steps["0"] and steps["2"] and last and last.finish and last.finish > 0, "offloaded steps are traced with their times")
  if last and last.finish then
    check(returned < last.finish - 0.1, string.format("train_step returned %.3f s before the last host step ended", last.finish - returned))
    check(fwd["0"].t0 < last.finish - 0.05,
      string.format("the next forward started %.3f s before the last unit's step ended", last.finish - fwd["0"].t0))
    for _, u in ipairs({ "0", "2", "4" }) do
      check(fwd[u].t0 >= steps[u].finish, "unit '" .. u .. "': its forward waited for its own step")
    end
  end
  m:free()
  ffi.C.setenv("FSDP_TEST_HOST_STEP_DELAY_US", "0", 1)
end

T.finish()

-- test_engine.lua (fsdprun -n W, W = 1 and 2): fsdp.engine, the model
-- driven by a script, and fsdp.losses.
-- 1. logprobs: each position's log-probability of its target and the
--    entropy equal a float64 log-softmax of the model's logits within 1e-6
--    absolute (packed rows included), 0 where there is no target.
-- 2. A loss written over the log-probs trains exactly: GRPO on-policy
--    (ratio 1, no KL) with advantages 1 is the cross-entropy of those
--    targets, so engine:step's update (SGD, lr 1) equals train_step's on
--    the same targets within 1e-6 of its largest element, on W ranks with 1
--    and 2 micro-batches; with a third of the targets clipped (old
--    log-probs that make the ratio 1.5 > 1 + clip) it equals the
--    cross-entropy of the others, scaled by their share (they still count
--    in the mean), likewise.
-- 3. The built-in losses' coefficients are their values' derivatives:
--    GRPO (both clip sides, negative advantages, the KL term) and DPO
--    against float64 central differences (h = 1e-6) within 1e-6 relative
--    + 1e-8.
-- 4. A DPO step runs; a loss returning the wrong coefficients is refused
--    naming the micro-batch.
-- 5. export_weights: to a callback, every tensor in model order in buckets
--    of at most bucket_bytes (a larger tensor alone), its values the
--    gathered ones; to a folder, the checkpoint export's files (bf16) byte
--    for byte; the allocator's peak while streaming at most the largest
--    unit's params; a failing consumer fails it on every rank.
-- 6. Phase offload at zero 3, 2 and 1 (and bf16 params at zero 3, whose fp32
--    staging goes too): offloaded, the allocator holds under
--    5% of what the model held; a forward is refused; onloaded for forwards,
--    the log-probs are the same bits and a step is refused; onloaded, the
--    losses and final weights equal an uninterrupted run's bit for bit.
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local engine = require "fsdp.engine"
local losses = require "fsdp.losses"
local ffi = require "ffi"

local info = fsdp.init()
local W, R = info.size, info.rank
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_engine rank %d/%d", R, W))
local check = T.check

local cfg = llama.config({ hidden_size = 16, intermediate_size = 24, num_attention_heads = 4, num_key_value_heads = 2,
  num_hidden_layers = 2, vocab_size = 23, max_position_embeddings = 64, rope_theta = 10000, rms_norm_eps = 1e-5 })
local V = cfg.vocab_size
local mesh = fsdp.mesh({ { "dp", W }, { "solo", 1 } })
local dp, solo = mesh:group("dp"), mesh:group("solo")

local lcg = T.lcg

local function ids_tensor(list, shape) return T.int32(fsdp, list, shape) end
local function floats(list)
  local t = fsdp.tensor(#list)
  for i, v in ipairs(list) do t:set(i - 1, v) end
  return t
end

-- rows of S tokens of global row numbers: ids, targets (the next token, a
-- fifth masked), advantages 1 where there is a target
local S = 10
local function batch(rows, seed)
  local x, y, adv = {}, {}, {}
  for _, row in ipairs(rows) do
    local rnd = lcg(seed * 1000 + row)
    for j = 1, S do
      x[#x + 1] = rnd(V)
      local t = (rnd(5) == 0) and -100 or rnd(V)
      y[#y + 1], adv[#adv + 1] = t, t == -100 and 0 or 1
    end
  end
  local n = #rows
  return { x = ids_tensor(x, { n, S }), y = ids_tensor(y, { n, S }), advantages = floats(adv) }
end
local function count_of(b)
  local c = 0
  for i = 0, b.y:numel() - 1 do if b.y:get(i) ~= -100 then c = c + 1 end end
  return c
end

---------------------------------------------------------------- 1. logprobs
do
  local m = fsdp.fully_shard(llama.model(cfg), { shard = dp, units = llama.units, zero = 3, seed = 5 })
  local E = engine.new(m, cfg)
  local b = batch({ 2 * R, 2 * R + 1 }, 1)
  b.doc_start = ids_tensor({ 0, 0, 0, 3, 3, 3, 3, 3, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, { 2, S })
  local lp, ent = E:logprobs(b, { entropy = true })
  local logits = {}
  m:evaluate({ b }, function(l)
    for i = 0, l:numel() - 1 do logits[i + 1] = l:get(i) end
    return 0
  end)
  local worst, went = 0, 0
  for i = 0, 2 * S - 1 do
    local mx, z, zx = -math.huge, 0, 0
    for c = 1, V do mx = math.max(mx, logits[i * V + c]) end
    for c = 1, V do
      local e = math.exp(logits[i * V + c] - mx)
      z, zx = z + e, zx + e * logits[i * V + c]
    end
    local lse = mx + math.log(z)
    local t = b.y:get(i)
    local want, wente = t == -100 and 0 or logits[i * V + t + 1] - lse, t == -100 and 0 or lse - zx / z
    worst, went = math.max(worst, math.abs(lp:get(i) - want)), math.max(went, math.abs(ent:get(i) - wente))
  end
  check(worst <= 1e-6 and went <= 1e-6, string.format("logprobs and entropy against float64 (%.2e, %.2e)", worst, went))
  m:free()
end

---------------------------------------------------------------- 2. exact training
local sgd = { optimizer = "sgd", lr = 1, momentum = 0, weight_decay = 0 }
local function delta(before, after)
  local d = {}
  for name, v in pairs(after) do
    d[name] = {}
    for i = 1, #v do d[name][i] = v[i] - before[name][i] end
  end
  return d
end
local function compare(label, a, b, scale)
  local worst, big = 0, 0
  for name, va in pairs(a) do
    for i = 1, #va do
      local want = b[name][i] * scale
      big = math.max(big, math.abs(want))
      worst = math.max(worst, math.abs(va[i] - want))
    end
  end
  check(big > 0 and worst <= 1e-6 * big, string.format("%s: the update within 1e-6 of its largest element (%.2e of %.2e)",
    label, worst, big))
end

for _, K in ipairs({ 1, 2 }) do
  for _, clipped in ipairs({ false, true }) do
    local label = string.format("%d ranks x %d micro-batches%s", W, K, clipped and ", a third clipped" or "")
    local mbs, ces = {}, {}
    for k = 1, K do
      mbs[k] = batch({ (k - 1) * W + R }, 2)
      ces[k] = batch({ (k - 1) * W + R }, 2)
    end
    local a = fsdp.fully_shard(llama.model(cfg), { shard = dp, units = llama.units, zero = 3, seed = 7 })
    local E = engine.new(a, cfg)
    local before = T.params(a)
    local kept, all = 0, 0
    if clipped then -- old log-probs one ratio of 1.5 below the current ones on every third target
      for k = 1, K do
        local lp = E:logprobs(mbs[k])
        local old = fsdp.tensor(lp:numel())
        for i = 0, lp:numel() - 1 do
          local third = i % 3 == 0 and mbs[k].y:get(i) ~= -100
          old:set(i, third and lp:get(i) - math.log(1.5) or lp:get(i))
          if third then ces[k].y:set(i, -100) end -- the cross-entropy leaves them out
        end
        mbs[k].old_logp = old
      end
    end
    for k = 1, K do
      kept, all = kept + count_of(ces[k]), all + count_of(mbs[k])
      ces[k].count = count_of(ces[k])
    end
    local l, _, warn, st = E:step(mbs, losses.grpo({ clip = 0.2 }), sgd)
    check(not warn and l == l, label .. ": the step ran (" .. tostring(warn) .. ")")
    if clipped then check(st.clipped > 0.2, string.format("%s: %.2f of the targets clipped", label, st.clipped)) end
    local da = delta(before, T.params(a))
    a:free()
    local c = fsdp.fully_shard(llama.model(cfg), { shard = dp, units = llama.units, zero = 3, seed = 7 })
    local o = {}
    for key, v in pairs(sgd) do o[key] = v end
    o.loss = function(logits, bb, scale) return llama.loss(logits, bb.y, scale) end
    c:train_step(ces, o)
    local dc = delta(before, T.params(c))
    c:free()
    -- the clipped targets count in the GRPO mean (all of them), not in the cross-entropy's (kept)
    local tk, ta = fsdp.tensor(2), nil
    tk:set(0, kept); tk:set(1, all)
    require("fsdp.shard").all_reduce_host(dp, tk, "sum")
    ta = tk:get(1)
    compare(label .. ": engine:step on GRPO against train_step on the cross-entropy", da, dc, tk:get(0) / ta)
  end
end

---------------------------------------------------------------- 3. derivatives
local function fd_check(label, loss, b, lp, info_)
  local value, coef = loss(lp, b, info_)
  local bad, worst = 0, 0
  for i = 0, lp:numel() - 1 do
    local x = lp:get(i)
    local h = 1e-6
    -- float64 values: lp's own storage is fp32, so the differences run on a float64 copy
    local function at(v)
      local c = fsdp.tensor(lp:numel(), "fp64")
      for j = 0, lp:numel() - 1 do c:set(j, lp:get(j)) end
      c:set(i, v)
      return (loss(c, b, info_))
    end
    local g = (at(x + h) - at(x - h)) / (2 * h)
    local want = coef:get(i)
    worst = math.max(worst, math.abs(g - want))
    if math.abs(g - want) > 1e-6 * math.abs(want) + 1e-8 then bad = bad + 1 end
  end
  check(bad == 0 and value == value, string.format("%s: coefficients are the derivatives (%d off, worst %.2e)", label, bad, worst))
end
do
  local b = batch({ 0, 1 }, 3)
  local n = b.y:numel()
  local rnd = lcg(77)
  local lp, old, ref, adv = fsdp.tensor(n, "fp64"), fsdp.tensor(n), fsdp.tensor(n), fsdp.tensor(n)
  for i = 0, n - 1 do
    local l = -0.2 - rnd(3000) / 1000
    lp:set(i, l)
    old:set(i, l + ({ -0.5, 0, 0.4, -0.05, 0.05 })[i % 5 + 1]) -- ratios outside both sides of the clip, and inside
    ref:set(i, l + (rnd(100) - 50) / 100)
    adv:set(i, (i % 4 == 0) and -0.7 or 1.3)
  end
  b.advantages, b.old_logp, b.ref_logp = adv, old, ref
  local inf = { micro_batches = 1, ranks = 1, targets = count_of(b), sequences = 2 }
  fd_check("grpo, clip 0.2, kl 0.1", losses.grpo({ clip = 0.2, kl = 0.1 }), b, lp, inf)
  fd_check("grpo, clip 0.1 / 0.3 (clip_high)", losses.grpo({ clip = 0.1, clip_high = 0.3 }), b, lp, inf)
  fd_check("dpo, beta 0.5", losses.dpo({ beta = 0.5 }), b, lp, inf)
end

---------------------------------------------------------------- 4. DPO, refusals
do
  local m = fsdp.fully_shard(llama.model(cfg), { shard = dp, units = llama.units, zero = 3, seed = 9 })
  local E = engine.new(m, cfg)
  local b = batch({ 4 * R, 4 * R + 1, 4 * R + 2, 4 * R + 3 }, 4)
  b.ref_logp = E:logprobs(b)
  local l, norm, warn, st = E:step({ b }, losses.dpo({ beta = 0.1 }), { lr = 1e-2 })
  check(not warn and math.abs(l - math.log(2)) < 1e-6 and norm > 0 and st.accuracy == 0,
    string.format("dpo: at the reference the loss is log 2 (%.9f), a gradient (%.3g)", l, norm))
  T.fails(function() E:step({ b }, function(lp) return 0, fsdp.tensor(lp:numel() - 1) end, {}) end,
    "for micro-batch 1; expected a number and a tensor of", "a loss with the wrong coefficients is refused")
  m:free()
end

---------------------------------------------------------------- 5. streamed weights
do
  local hf = require "fsdp.hf"
  local m = fsdp.fully_shard(llama.model(cfg), { shard = dp, units = llama.units, zero = 3, seed = 11 })
  local E = engine.new(m, cfg)
  pcall(ffi.cdef, "int getppid(void);")
  local dir = string.format("/tmp/fsdp-test-engine-%d", ffi.C.getppid()) -- (fsdprun's: the same on every rank)
  if R == 0 then os.execute("rm -rf '" .. dir .. "' && mkdir -p '" .. dir .. "'") end
  -- the callback: buckets in model order, none over bucket_bytes unless one tensor alone, all names
  local names, seen, over, big = {}, {}, 0, 0
  for _, u in ipairs(m.units) do for _, p in ipairs(u.params) do names[#names + 1] = p.name end end
  local largest_unit = 0
  for _, u in ipairs(m.units) do
    local n = 0
    for _, p in ipairs(u.params) do n = n + p.spec.numel end
    largest_unit = math.max(largest_unit, n * 4)
  end
  local values = {}
  local stats = E:export_weights(function(bucket)
    if bucket.bytes > 2000 and #bucket.tensors > 1 then over = over + 1 end
    big = math.max(big, bucket.bytes)
    for _, t in ipairs(bucket.tensors) do
      seen[#seen + 1] = t.name
      local f = ffi.cast("float *", bucket.data + t.offset)
      values[t.name] = { f[0], f[t.numel - 1], t.numel }
    end
  end, { dtype = "fp32", bucket_bytes = 2000 })
  local gathered = {}
  for _, name in ipairs(names) do gathered[name] = m:gather(name) end -- (collective: every rank)
  if R == 0 then
    check(#seen == #names and over == 0 and stats.buckets > 3, string.format("export_weights: %d of %d tensors in %d " ..
      "buckets, %d over 2000 bytes with more than one tensor", #seen, #names, stats.buckets, over))
    local same = true
    for i, name in ipairs(names) do
      local g, v = gathered[name], values[name]
      same = same and seen[i] == name and v and v[1] == g[1] and v[2] == g[#g] and v[3] == #g
    end
    check(same, "export_weights: every tensor in model order, its values the gathered ones")
  end
  -- the folder: the same files as the checkpoint's export (bf16), byte for byte
  E:export_weights(dir .. "/streamed", { dtype = "bf16", bucket_bytes = 3000 })
  hf.export(m, cfg, dir .. "/export", { dtype = "bf16", shard_bytes = 3000 })
  if R == 0 then
    local p = io.popen("cd '" .. dir .. "' && for f in export/*; do cmp -s \"$f\" \"streamed/${f#export/}\" || echo \"$f\"; done; " ..
      "ls export | wc -l; ls streamed | wc -l")
    local out = p:read("*a")
    p:close()
    local differ, a, b = out:match("^(.-)(%d+)\n(%d+)\n$")
    check(differ == "" and a == b and tonumber(a) > 3, "export_weights to a folder: the checkpoint export's files byte " ..
      "for byte (" .. out:gsub("\n", " ") .. ")")
    os.execute("rm -rf '" .. dir .. "'")
  end
  -- a consumer that fails: every rank raises, naming it
  -- memory: the allocator's peak above its start while streaming, at most one unit's full params
  local peak = T.measured(fsdp, "cpu", function() E:export_weights(function() end, { bucket_bytes = 2000 }) end)
  check(peak <= largest_unit, string.format("export_weights holds at most one unit: %d bytes at its peak, the largest " ..
    "unit %d", peak, largest_unit))
  T.fails(function() E:export_weights(function() error("disk full") end, { bucket_bytes = 2000 }) end,
    R == 0 and "disk full" or "export_weights: rank 0 failed", "a failing consumer fails the export on every rank")
  m:free()
end

---------------------------------------------------------------- 6. phase offload
for _, v in ipairs({ { 3, "fp32" }, { 2, "fp32" }, { 1, "fp32" }, { 3, "bf16" } }) do
  local zero, pdt = v[1], v[2]
  local label = "zero " .. zero .. ", " .. pdt
  local opt = { lr = 1e-2, weight_decay = 0.1, clip = 1.0, loss = function(logits, bb, scale) return llama.loss(logits,
    bb.y, scale) end }
  collectgarbage(); collectgarbage()
  local base = fsdp.memory_stats("cpu").allocated
  local function run(offload_at)
    local m = fsdp.fully_shard(llama.model(cfg), { shard = dp, units = llama.units, zero = zero, seed = 13,
      mixed = { param_dtype = pdt, reduce_dtype = "fp32" } })
    local E = engine.new(m, cfg)
    local losses_, held, after, probe = {}, nil, nil, batch({ R }, 9)
    for step = 1, 4 do
      if step == offload_at then
        local lp0 = E:logprobs(probe)
        collectgarbage(); collectgarbage()
        held = fsdp.memory_stats("cpu").allocated - base
        E:offload()
        collectgarbage(); collectgarbage()
        after = fsdp.memory_stats("cpu").allocated - base
        T.fails(function() E:logprobs(probe) end, "onload() first", label .. ": offloaded, a forward is refused")
        E:onload({ params_only = true })
        local lp1 = E:logprobs(probe)
        local same = true
        for i = 0, lp0:numel() - 1 do same = same and lp0:get(i) == lp1:get(i) end
        check(same, label .. ": onloaded for forwards: the same log-probs bit for bit")
        T.fails(function() m:train_step({ batch({ R }, 20 + step) }, opt) end, "onload() of everything first",
          label .. ": a step needs everything onloaded")
        E:onload()
      end
      losses_[step] = m:train_step({ batch({ R }, 20 + step) }, opt)
    end
    local params = T.params(m)
    m:free()
    return losses_, params, held, after
  end
  local l1, p1 = run(nil)
  local l2, p2, held, after = run(3)
  local same = true
  for i = 1, 4 do same = same and l1[i] == l2[i] end
  local ok = T.same_params(p1, p2)
  check(same and ok, label .. ": offloaded and onloaded mid-run, training goes on bit for bit")
  check(held > 0 and after < 0.05 * held, string.format("%s: offloaded, the allocator holds %d bytes of the model's %d " ..
    "(%.1f%%, under 5%%)", label, after, held, 100 * after / held))
end

T.finish()

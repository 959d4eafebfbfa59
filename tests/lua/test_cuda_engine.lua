-- test_cuda_engine.lua (one rank with a GPU; exits 77 without one):
-- post-training on the GPU against the CPU ops.
--   packed rows (rows of 1, 3 and 7 documents) through the Llama on the GPU
--     (the _docs attention and rope_at kernels) and the engine's log-probs
--     (fsdp_cuda_token_logprobs) against the same weights on the CPU ops:
--     within 1e-4 absolute in fp32;
--   an engine step (GRPO, on-policy, advantages 1) against the cross-entropy
--     step on the same targets, on the GPU: the same loss change within 1e-5
--     relative, fp32;
--   phase offload: cudaMemGetInfo's free bytes rise by at least 95% of the
--     units' device rows when offloaded, and fall back when onloaded;
--     onloaded for forwards the log-probs are the same bits; onloaded, the
--     next two steps' losses equal an uninterrupted run's bit for bit.
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local engine = require "fsdp.engine"
local losses = require "fsdp.losses"
local C = fsdp.C

if C.fsdp_device_available(C.FSDP_CUDA) ~= 1 then
  print("test_cuda_engine: no CUDA device here; skipped")
  os.exit(77)
end
local info = fsdp.init()
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_cuda_engine rank %d/%d", info.rank,
  info.size))
local check = T.check
fsdp.check(C.fsdp_device_set(C.FSDP_CUDA, 0), "device")

local cfg = llama.config({ hidden_size = 64, intermediate_size = 96, num_attention_heads = 4, num_key_value_heads = 2,
  num_hidden_layers = 2, vocab_size = 97, max_position_embeddings = 64, rope_theta = 10000, rms_norm_eps = 1e-5 })
local S = 24
local rows = { { 24 }, { 5, 1, 18 }, { 3, 4, 1, 2, 6, 5, 3 } }
local function batch(seed)
  local rnd = T.lcg(seed)
  local x, y, ds, adv = {}, {}, {}, {}
  for _, lens in ipairs(rows) do
    local t = 0
    for _, l in ipairs(lens) do
      for j = 0, l - 1 do
        x[#x + 1], ds[#ds + 1] = rnd(cfg.vocab_size), t
        y[#y + 1] = j < l - 1 and rnd(cfg.vocab_size) or -100
        adv[#adv + 1] = y[#y] == -100 and 0 or 1
      end
      t = t + l
    end
  end
  local b = { x = T.int32(fsdp, x, { #rows, S }), y = T.int32(fsdp, y, { #rows, S }), doc_start = T.int32(fsdp, ds, { #rows, S }),
    advantages = fsdp.tensor(#adv) }
  for i, v in ipairs(adv) do b.advantages:set(i - 1, v) end
  return b
end

local function model_on(device, seed)
  local mesh = fsdp.mesh("dp_shard=1", { device = device })
  return fsdp.fully_shard(llama.model(cfg), { shard = mesh:group("dp_shard"), units = llama.units, zero = 3, seed = seed }), mesh
end

-- packed rows' log-probs: GPU against CPU
do
  local g, gm = model_on("cuda", 3)
  local c, cm = model_on("cpu", 3)
  local b = batch(1)
  local lg, eg = engine.new(g, cfg):logprobs(b, { entropy = true })
  local lc, ec = engine.new(c, cfg):logprobs(b, { entropy = true })
  local worst = 0
  for i = 0, lg:numel() - 1 do
    worst = math.max(worst, math.abs(lg:get(i) - lc:get(i)), math.abs(eg:get(i) - ec:get(i)))
  end
  check(worst <= 1e-4, string.format("packed rows on the GPU: log-probs and entropies within 1e-4 of the CPU's (%.2e)", worst))
  g:free(); c:free(); gm:free(); cm:free()
end

-- an engine step against the cross-entropy step, on the GPU
do
  local sgd = { optimizer = "sgd", lr = 0.5, momentum = 0, weight_decay = 0 }
  local a, am = model_on("cuda", 5)
  local b = batch(2)
  local E = engine.new(a, cfg)
  E:step({ b }, losses.grpo({ clip = 0.2 }), sgd)
  local after_a = E:logprobs(batch(3))
  local c, cmesh = model_on("cuda", 5)
  local bc = batch(2)
  local x = fsdp.tensor({ #rows, S }, "int32", "cuda"):copy_from(bc.x)
  local yd = fsdp.tensor({ #rows, S }, "int32", "cuda"):copy_from(bc.y)
  local count = 0
  for i = 0, bc.y:numel() - 1 do if bc.y:get(i) ~= -100 then count = count + 1 end end
  local o = {}
  for k, v in pairs(sgd) do o[k] = v end
  o.forward_loss = llama.forward_loss(64 * 2 ^ 20)
  c:train_step({ { x = x, y = bc.y, y_dev = yd, doc_start = bc.doc_start, count = count } }, o)
  local after_c = engine.new(c, cfg):logprobs(batch(3))
  local worst = 0
  for i = 0, after_a:numel() - 1 do worst = math.max(worst, math.abs(after_a:get(i) - after_c:get(i))) end
  check(worst <= 1e-5, string.format("GRPO on-policy with advantages 1 steps as the cross-entropy on the GPU (%.2e)", worst))
  a:free(); c:free(); am:free(); cmesh:free()
end

-- phase offload, measured by cudaMemGetInfo
do
  local free_b, total = fsdp.ffi.new("int64_t[1]"), fsdp.ffi.new("int64_t[1]")
  local function free_now()
    fsdp.check(C.fsdp_device_memory_info(C.FSDP_CUDA, free_b, total), "memory info")
    return tonumber(free_b[0])
  end
  local big = llama.config({ hidden_size = 1024, intermediate_size = 2816, num_attention_heads = 8, num_key_value_heads = 4,
    num_hidden_layers = 4, vocab_size = 8192, max_position_embeddings = 64, rope_theta = 10000, rms_norm_eps = 1e-5 })
  local function run(offload_at)
    local mesh = fsdp.mesh("dp_shard=1", { device = "cuda" })
    local m = fsdp.fully_shard(llama.model(big), { shard = mesh:group("dp_shard"), units = llama.units, zero = 3, seed = 7 })
    local E = engine.new(m, big)
    local ls, rose, back, rowbytes = {}, 0, 0, 0
    local mem = fsdp.ffi.new("fsdp_unit_memory")
    for _, u in ipairs(m.units) do
      fsdp.check(C.fsdp_unit_memory_info(u.handle, mem), "memory info")
      rowbytes = rowbytes + tonumber(mem.params_shard + mem.main_params + mem.optimizer + mem.grads_main + mem.params_full +
        mem.grads_full - mem.offloaded)
    end
    local rnd = T.lcg(11)
    local function b()
      local x, y = {}, {}
      for i = 1, 2 * 32 do x[i], y[i] = rnd(big.vocab_size), rnd(big.vocab_size) end
      local xb = T.int32(fsdp, x, { 2, 32 })
      local yb = T.int32(fsdp, y, { 2, 32 })
      return { x = fsdp.tensor({ 2, 32 }, "int32", "cuda"):copy_from(xb), y = yb,
        y_dev = fsdp.tensor({ 2, 32 }, "int32", "cuda"):copy_from(yb) }
    end
    local probe = { x = T.int32(fsdp, { 1, 2, 3, 4 }, { 1, 4 }), y = T.int32(fsdp, { 2, 3, 4, 5 }, { 1, 4 }) }
    for step = 1, 4 do
      if step == offload_at then
        local lp0 = E:logprobs(probe)
        m:synchronize()
        collectgarbage(); collectgarbage()
        local before = free_now()
        E:offload()
        rose = free_now() - before
        E:onload({ params_only = true })
        local lp1 = E:logprobs(probe)
        local same = true
        for i = 0, lp0:numel() - 1 do same = same and lp0:get(i) == lp1:get(i) end
        check(same, "offloaded, onloaded for forwards: the same log-probs bit for bit")
        E:onload()
        back = before - free_now()
      end
      ls[step] = m:train_step({ b() }, { lr = 1e-3, forward_loss = llama.forward_loss(64 * 2 ^ 20) })
    end
    m:free(); mesh:free()
    return ls, rose, back, rowbytes
  end
  local l1 = run(nil)
  local l2, rose, back, rowbytes = run(3)
  local same = true
  for i = 1, 4 do same = same and l1[i] == l2[i] end
  check(same, "offloaded and onloaded mid-run on the GPU: the losses bit for bit")
  check(rose >= 0.95 * rowbytes, string.format("offload: cudaMemGetInfo's free bytes rose %.1f MB, the units' rows %.1f MB " ..
    "(at least 95%%)", rose / 1e6, rowbytes / 1e6))
  print(string.format("test_cuda_engine: offload freed %.1f MB (rows %.1f MB); onload took back %.1f MB", rose / 1e6,
    rowbytes / 1e6, back / 1e6))
end

T.finish()

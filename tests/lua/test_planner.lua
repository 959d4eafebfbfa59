-- test_planner.lua (fsdprun -n W): the planner against reality, and the
-- scripted policies.
--   * the tiny recipe on W ranks for zero 0-3 (and tied embeddings, a policy
--     mixing zero levels with a unit kept gathered after forward, HFSDP on 4
--     ranks): every unit's planned resident bytes equal what the engine
--     allocated (fsdp_unit_memory_info), byte for byte, and the planned
--     peak of live full-unit buffers equals the pools' measured peak after
--     a training step, and the planned activation peak of a micro-batch
--     equals the allocator's measured peak above the step's start, byte for
--     byte, with the garbage collector stopped (activations are freed at
--     their last use, not when Lua collects them), also with activation
--     checkpointing of every layer and every k-th; evaluation (no grads)
--     stays below a fully checkpointed training step;
--   * llama70b at W = 64 against a hand calculation: 70.55B parameters
--     (within 0.1%), and the optimizer bytes per rank from the layout rule
--     (parameters padded to 16 elements, each unit to dp_shard x 32);
--   * each policy in recipes/policies trains the tiny model to the default
--     grouping's losses (within 1e-5: the grouping and the zero levels
--     change only the order of fp32 sums);
--   * the offloaded optimizer (fsdp.offload: host buffers, the step on CPU
--     threads) trains bit for bit like the optimizer in place on CPU ranks;
--   * invalid policies fail naming the module path.
-- FSDP_TEST_QUICK=1 (the sanitizer pass) leaves out the training runs of
-- the policies and the offloaded optimizer.
-- With a second argument "cuda" (one rank with a GPU; exits 77 without
-- one): the resident bytes, pools and activations of a few configurations,
-- bf16 and fp32, planned against the GPU's allocator: what the planner
-- does not know of the CUDA ops shows as a difference, in bytes.
local fsdp = require "fsdp"
local planner = require "fsdp.planner"
local plan_fit = require "fsdp.plan_fit"
local plan_render = require "fsdp.plan_render"
local recipe = require "fsdp.recipe"
local llama = require "fsdp.models.llama"
local tpm = require "fsdp.tp"
local ops = require "fsdp.ops"
local hf_config = require "fsdp.hf_config"
local train = require "fsdp.train"
local ffi, C = fsdp.ffi, fsdp.C

local info = fsdp.init()
local W, R = info.size, info.rank
local root = arg[1] or "."
local device = arg[2] or "cpu"
if device == "cuda" and C.fsdp_device_available(C.FSDP_CUDA) ~= 1 then
  print("test_planner: no CUDA device here; skipped")
  os.exit(77)
end
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_planner rank %d/%d", R, W))
local check, fails = T.check, T.fails

local function tiny(over)
  local r = dofile(root .. "/recipes/tiny.lua")
  r.data.seq, r.data.micro_batch = 32, 2
  r.train.eval_every, r.train.log_every, r.train.metrics = 0, 1000, nil
  r.train.device = device
  for k, v in pairs(over or {}) do
    local sec, field = k:match("^(%w+)%.([%w_]+)$")
    if v == false and field == "corpus" then v = nil end -- (a table cannot hold nil: false takes the corpus out)
    if sec then r[sec][field] = v else r[k] = v end
  end
  return recipe.check(r, "tiny.lua")
end

-- the trainer's way: the plan, then the model sharded by the same policy
local function build(r)
  local mcfg = {}
  for k, v in pairs(r.model) do mcfg[k] = v end
  local cfg = llama.config(mcfg)
  -- on a GPU: the attention workspaces of this GPU's cuDNN plans
  local ws = device == "cuda" and ops.attention_workspace(r.fsdp.param_dtype, r.data.micro_batch, r.data.seq,
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) or nil
  local p = planner.plan(r, { world = W, where = "tiny.lua", attention_workspace = ws })
  local mesh = fsdp.mesh(r.mesh, { device = device })
  local names = {}
  for _, d in ipairs(mesh:dims()) do names[d.name or d[1]] = true end
  -- (tp and cp meshes: the model's slices and chunks, FSDP over dp_shard x cp, as the trainer makes them)
  local tpc, cpc = names.tp and mesh:group("tp") or nil, names.cp and mesh:group("cp") or nil
  local s = fsdp.fully_shard(llama.model(cfg, { checkpoint = r.fsdp.checkpoint, recompute = r.fsdp.recompute,
    tp = tpc and tpm.group(tpc) or nil, cp = cpc and tpm.group(cpc) or nil, cp_attention = r.train.cp_attention }),
    { shard = mesh:group(cpc and "dp_shard,cp" or "dp_shard"), tp = tpc,
    outer = names.dp_outer and mesh:group("dp_outer") or nil, units = planner.policy(r.fsdp.units, "tiny.lua"),
    zero = r.fsdp.zero, prefetch = r.fsdp.prefetch, max_live_units = r.fsdp.max_live_units, hfsdp = r.fsdp.hfsdp,
    offload = r.fsdp.offload, micro_batches = p.grad_accum,
    mixed = { param_dtype = r.fsdp.param_dtype, reduce_dtype = r.fsdp.reduce_dtype } })
  return p, s, cfg
end

-- measure: returns the allocator's peak during the step above its start
-- (with the batches made)
local function one_step(s, cfg, r, measure)
  local B, L = r.data.micro_batch, r.data.seq
  local batches = {}
  for k = 1, r.train.grad_accum do
    local x, y = fsdp.tensor({ B, L }, "int32"), fsdp.tensor({ B, L }, "int32")
    for i = 0, B * L - 1 do x:set(i, (i * 7 + k + R) % cfg.vocab_size); y:set(i, (i * 11 + k + 3 * R) % cfg.vocab_size) end
    batches[k] = { x = x, y = y }
    if device == "cuda" then
      batches[k] = { x = fsdp.tensor({ B, L }, "int32", "cuda"):copy_from(x), y = y,
        y_dev = fsdp.tensor({ B, L }, "int32", "cuda"):copy_from(y) }
    end
    if r.data.pack then -- packed rows (data.pack): documents of 16 tokens, as the loader hands them
      local ds = fsdp.tensor({ B, L }, "int32")
      for i = 0, B * L - 1 do ds:set(i, i % L - i % L % 16) end
      batches[k].doc_start, batches[k].count = ds, B * L
    end
  end
  -- as the trainer does: the head and loss fused over chunks of rows unless train.loss_chunk_mb = 0
  local chunk = r.train.loss_chunk_mb * 2 ^ 20
  local function step()
    s:train_step(batches, { lr = 1e-3, loss = function(logits, b, scale) return llama.loss(logits, b.y, scale, nil, b.y_dev) end,
      forward_loss = chunk > 0 and llama.forward_loss(chunk) or nil })
  end
  -- the batches freed here, not whenever the collector finds them: the next
  -- configuration's bytes kept between steps are measured to the byte
  local function free_batches()
    for _, b in ipairs(batches) do
      for _, t in pairs(b) do if type(t) == "table" then t:free() end end -- (b.count is a number)
    end
  end
  if not measure then
    step()
    return free_batches()
  end
  local peak, base = T.measured(fsdp, device, step)
  free_batches()
  return peak, base
end

local function compare(label, over)
  local r = tiny(over)
  collectgarbage()
  collectgarbage()
  local before = fsdp.memory_stats(device).allocated
  local p, s, cfg = build(r)
  check(#p.units == #s.units, label .. ": unit count")
  if device == "cuda" then
    local e = planner.attention_workspace_estimate(cfg, r.data.micro_batch, r.data.seq, r.fsdp.param_dtype, true)
    print(string.format("%s: attention workspace forward %d, backward %d bytes (the estimate without a GPU: %d)", label,
      p.attention_workspace.forward, p.attention_workspace.backward, e.backward))
  end
  local bad = T.unit_bytes_diff(fsdp, s, p)
  check(#bad == 0, label .. ": planned resident bytes = allocated: " .. table.concat(bad, "; "))
  local scratch = tonumber(C.fsdp_comm_scratch_bytes(s.reduce.handle)) -- the reductions' comm holds it
  check(scratch == p.resident.scratch, string.format("%s: the shared scratch: planned %d, allocated %d", label,
    p.resident.scratch, scratch))
  one_step(s, cfg, r)
  -- CPU ranks with bf16 params: one fp32 staging pair for the whole model,
  -- the largest module's (not a copy per module)
  local staged = s.staging and s.staging.n * 8 or 0
  check(staged == p.resident.staging, string.format("%s: the fp32 staging: planned %d bytes, allocated %d", label,
    p.resident.staging, staged))
  -- again, measured: the first step made the lasting state (optimizer, rope tables);
  -- and the bytes each group's comms sent in it
  local comms, mesh = {}, s.shard.mesh
  for _, c in pairs(mesh.comms) do c:bytes_reset() end
  local act, base = one_step(s, cfg, r, true)
  local function group_bytes(list)
    local seen, b = {}, { all_gather = 0, reduce_scatter = 0, all_reduce = 0, shift = 0 }
    for _, c in ipairs(list) do
      if c and not seen[tostring(c.handle)] then
        seen[tostring(c.handle)] = true
        for k in pairs(b) do b[k] = b[k] + c:bytes_sent(k) end
      end
    end
    return b
  end
  comms.dp = group_bytes({ s.shard, s.reduce, s.outer })
  comms.tp = group_bytes({ s.tp })
  for _, d in ipairs(mesh:dims()) do if d.name == "cp" and d.size > 1 then comms.cp = group_bytes({ mesh:group("cp") }) end end
  for g, planned in pairs({ dp = p.comm, tp = p.comm_tp or {}, cp = p.comm_cp or {} }) do
    for k, m in pairs(comms[g] or {}) do
      -- ((n-1)/n of a buffer is no whole number of bytes: equal to a thousandth of one)
      check(math.abs(m - (planned[k] or 0)) < 1e-3, string.format("%s: %s group's %s: planned %.3f bytes a step, sent %.3f",
        label, g, k, planned[k] or 0, m))
    end
  end
  check(act == p.activations, string.format("%s: activations: planned %d bytes, measured %d", label, p.activations, act))
  -- what stays between steps (the pools too), with the step's batches made: all but the
  -- GPU's fp32 cast block (stream-ordered, outside the allocator's count)
  local lasting = p.resident_total + p.pools.params + p.pools.grads - (device == "cuda" and p.resident.staging or 0) + p.batches
  check(base - before == lasting, string.format("%s: resident bytes and batches: planned %d, allocated %d", label, lasting,
    base - before))
  local pp = s.ppool ~= nil and C.fsdp_pool_peak(s.ppool) or 0
  local gp = s.gpool ~= nil and C.fsdp_pool_peak(s.gpool) or 0
  check(pp == p.pools.peak_params and gp == p.pools.peak_grads and s.live_bound == p.pools.bound,
    string.format("%s: peak live buffers: planned %d params %d grads (bound %d), measured %d, %d (bound %d)", label,
      p.pools.peak_params, p.pools.peak_grads, p.pools.bound, pp, gp, s.live_bound))
  local function same(a, b)
    if #a ~= #b then return false end
    for i = 1, #a do if a[i] ~= b[i] then return false end end
    return true
  end
  check(same(s.slots.params, p.pools.slots.params) and same(s.slots.grads, p.pools.slots.grads),
    label .. ": the pools' slots are the planned ones")
  s:free()
  return p
end

if device == "cuda" then -- the GPU's bytes: the benchmark's settings in small, and fp32
  compare("cuda, bf16, a big tied embedding, zero 3", { ["model.vocab_size"] = 4096, ["model.tie_word_embeddings"] = true,
    ["fsdp.param_dtype"] = "bf16" })
  compare("cuda, bf16, zero 3, recompute mlp", { ["fsdp.param_dtype"] = "bf16", ["fsdp.recompute"] = "mlp" })
  compare("cuda, bf16, zero 3, recompute none", { ["fsdp.param_dtype"] = "bf16", ["fsdp.recompute"] = "none" })
  compare("cuda, bf16, checkpoint every 2nd layer", { ["fsdp.param_dtype"] = "bf16", ["fsdp.checkpoint"] = 2 })
  compare("cuda, bf16, zero 2, 2 micro-batches", { ["fsdp.param_dtype"] = "bf16", ["fsdp.zero"] = 2, ["train.grad_accum"] = 2 })
  compare("cuda, fp32, zero 3, checkpoint full", { ["fsdp.checkpoint"] = "full" })
  T.finish() -- (exits)
end
-- cuDNN's attention workspaces as `fsdp plan` estimates them without a GPU,
-- against what cuDNN 9.19's plans asked for on an H200 (bench/RESULTS.md,
-- 2026-11-27): Llama 3.2 1B's shape at 4096 tokens, the tiny model at 2 x 32
do
  local llama1b = hf_config.model(dofile(root .. "/bench/llama1b.lua").model, "llama1b.lua")
  local e = planner.attention_workspace_estimate(llama1b, 1, 4096, "bf16", true)
  check(e.backward == 1107820800 and e.forward == 256, "cuDNN's workspace estimate, 1B at 4096: " .. e.backward)
  e = planner.attention_workspace_estimate(hf_config.model(dofile(root .. "/recipes/tiny.lua").model, "tiny.lua"), 2, 32,
    "bf16", true)
  check(e.backward == 165120, "cuDNN's workspace estimate, tiny at 2 x 32: " .. e.backward)
  check(planner.attention_workspace_estimate(llama1b, 1, 4096, "fp32", true).backward == 0, "no workspace for fp32")
  -- without determinism, no partial sums: far less
  check(planner.attention_workspace_estimate(llama1b, 1, 4096, "bf16", false).backward < 40 * 2 ^ 20, "atomics' workspace")
end
for zero = 0, 3 do compare("zero " .. zero, { ["fsdp.zero"] = zero }) end
do -- a tied embedding larger than a layer (Llama 3.2 1B's shape in small):
  -- one pool slot of its size, the others a layer's, planned and allocated
  local p = compare("a big tied embedding", { ["model.vocab_size"] = 4096, ["model.tie_word_embeddings"] = true })
  for _, which in ipairs({ "params", "grads" }) do
    local v = p.pools.slots[which]
    local ok = #v == p.pools.bound and v[1] > v[2] or (W == 1 and which == "params" and #v == 0)
    check(ok, string.format("%s slots sized per unit: %s", which, table.concat(v, ", ")))
  end
end
compare("checkpoint full", { ["fsdp.zero"] = 3, ["fsdp.checkpoint"] = "full" })
-- a vocabulary large enough that the head holds the peak: whole logits,
-- then chunks of them (forward_loss)
compare("the whole logits at once (train.loss_chunk_mb = 0)", { ["train.loss_chunk_mb"] = 0, ["model.vocab_size"] = 4096 })
compare("the head and loss over chunks of 20 rows", { ["train.loss_chunk_mb"] = 20 * 4096 * 4 / 2 ^ 20,
  ["model.vocab_size"] = 4096 })
-- a chunk that holds 200 rows runs 128 (whole GPU GEMM tiles): 320 rows
-- as 128, 128 and 64, planned and measured alike
compare("the head over chunks of 200 rows, rounded to 128", { ["train.loss_chunk_mb"] = 200 * 4096 * 4 / 2 ^ 20,
  ["model.vocab_size"] = 4096, ["data.seq"] = 160 })
check(llama.loss_rows(4096, 128256, 2, 256 * 2 ^ 20) == 1024 and llama.loss_rows(300, 50, 4, 2 ^ 20) == 300
  and llama.loss_rows(4096, 32000, 4, 100 * 32000 * 4) == 100, "chunk rows: whole, below 128, multiples of 128")
compare("chunks of 8 rows, checkpoint full, bf16", { ["train.loss_chunk_mb"] = 8 * 4096 * 4 / 2 ^ 20,
  ["fsdp.checkpoint"] = "full", ["fsdp.param_dtype"] = "bf16", ["model.vocab_size"] = 4096 })
do -- and chunking is what makes the difference
  local whole = planner.plan(tiny({ ["train.loss_chunk_mb"] = 0, ["model.vocab_size"] = 4096 }), { world = W })
  local chunked = planner.plan(tiny({ ["train.loss_chunk_mb"] = 20 * 4096 * 4 / 2 ^ 20, ["model.vocab_size"] = 4096 }), { world = W })
  check(chunked.activations < 0.8 * whole.activations, string.format("chunked head: %d bytes planned, whole logits %d",
    chunked.activations, whole.activations))
end
compare("checkpoint every 3rd layer, bf16 reduced in bf16", { ["fsdp.zero"] = 2, ["fsdp.checkpoint"] = 3,
  ["fsdp.param_dtype"] = "bf16", ["fsdp.reduce_dtype"] = "bf16" })
compare("checkpoint every 2nd layer, 2 micro-batches", { ["fsdp.checkpoint"] = 2, ["train.grad_accum"] = 2 })
-- bf16 micro-batches at zero 1 add up in a full fp32 sum (src/shard/unit_plan.c)
compare("zero 1, bf16, 2 micro-batches", { ["fsdp.zero"] = 1, ["fsdp.param_dtype"] = "bf16", ["train.grad_accum"] = 2 })
-- everything kept (fsdp.recompute = "none"), and the light recompute at
-- shapes where attention or the forward holds the peak instead of the MLP
compare("recompute none", { ["fsdp.recompute"] = "none" })
compare("recompute none, checkpoint every 2nd layer, bf16", { ["fsdp.recompute"] = "none", ["fsdp.checkpoint"] = 2,
  ["fsdp.param_dtype"] = "bf16" })
compare("recompute mlp", { ["fsdp.recompute"] = "mlp" })
compare("recompute mlp, checkpoint every 2nd layer, bf16", { ["fsdp.recompute"] = "mlp", ["fsdp.checkpoint"] = 2,
  ["fsdp.param_dtype"] = "bf16" })
compare("recompute mlp, a narrow MLP (attention holds the peak)", { ["fsdp.recompute"] = "mlp", ["model.intermediate_size"] = 32 })
compare("a narrow MLP (intermediate 32)", { ["model.intermediate_size"] = 32 })
-- packed rows: their doc_start and each position's place in its document
compare("packed rows (data.pack)", { ["data.corpus"] = false, ["data.token_file"] = "packed.bin", ["data.pack"] = true })
compare("a narrow MLP, checkpoint full", { ["model.intermediate_size"] = 32, ["fsdp.checkpoint"] = "full" })
compare("a wide MLP, 8 heads of 16, checkpoint every 3rd", { ["model.intermediate_size"] = 1024,
  ["model.num_attention_heads"] = 8, ["model.num_key_value_heads"] = 8, ["fsdp.checkpoint"] = 3 })
-- a recipe that does not fit: advice names only changes that lower the
-- plan, each with its figure (the README's 8B with 2 layers on 2 CPU ranks
-- was told to set zero 3 and checkpoint 'full', which it had, and bf16,
-- which plans the same on CPU ranks)
do
  local r8 = recipe.check({ model = { preset = "llama3_8b", num_hidden_layers = 2 }, mesh = "dp_shard=-1",
    fsdp = { zero = 3, checkpoint = "full", param_dtype = "fp32" }, data = { corpus = { include = { "docs/*.md" } }, seq = 128,
    micro_batch = 4 } }, "r8.lua")
  local base = planner.plan(r8, { world = 2, where = "r8.lua" }).need.total
  local adv = plan_fit.advice(r8, { world = 2, where = "r8.lua" }, false)
  local said = {}
  for i, a in ipairs(adv) do
    said[#said + 1] = a.change
    check(a.bytes < base, string.format("advice '%s' plans less: %.2f < %.2f GiB", a.change, a.bytes / 2 ^ 30, base / 2 ^ 30))
    check(i == 1 or adv[i - 1].bytes <= a.bytes, "advice smallest first")
  end
  local text = table.concat(said, "; ")
  check(adv[1] and adv[1].change == "4 ranks", "the 8B's first advice on 2 CPU ranks: 4 ranks (" .. text .. ")")
  check(not text:find("zero") and not text:find("checkpoint") and not text:find("bf16"),
    "nothing it already has, nor bf16 on CPU ranks: " .. text)
  r8.train.device = "cuda"
  local gpu = plan_fit.advice(r8, { world = 2, where = "r8.lua" }, true)
  local g = {}
  for _, a in ipairs(gpu) do g[#g + 1] = a.change end
  check(table.concat(g, "; "):find("fsdp.offload = 'all'", 1, true) and table.concat(g, "; "):find("bf16", 1, true),
    "on GPUs: offload and bf16 lower the device's part: " .. table.concat(g, "; "))
  -- a cp mesh whose attention is an all-gather: the ring keeps less
  r8.train.device, r8.mesh, r8.data.seq, r8.train.cp_attention = "cpu", "dp_shard=1,cp=2", 1024, "all_gather"
  local cp = plan_fit.advice(r8, { world = 2, where = "r8.lua" }, false)
  local c = {}
  for _, a in ipairs(cp) do c[#c + 1] = a.change end
  check(table.concat(c, "; "):find("train.cp_attention = 'ring'", 1, true), "cp 2, all-gather: the ring advised: " ..
    table.concat(c, "; "))
end
-- the header names the ZeRO levels the units have, not the recipe's alone:
-- a policy that mixes them read "zero 3"
do
  local mixed = plan_render.render(planner.plan(tiny({ ["fsdp.units"] = root .. "/recipes/policies/zero_by_size.lua" }),
    { world = W }))
  check(mixed:find(", zero 2 and 3 (by unit: 2 at 2, 4 at 3), ", 1, true), "a policy mixing ZeRO 2 and 3: the header says so")
  local one = plan_render.render(planner.plan(tiny({ ["fsdp.zero"] = 1 }), { world = W }))
  check(one:find(", zero 1, ", 1, true), "one level: 'zero 1'")
end
-- evaluation frees each layer's activations once the next has run
do
  local r = tiny({ ["fsdp.zero"] = 3 })
  local _, s, cfg = build(r)
  local full = planner.plan(tiny({ ["fsdp.zero"] = 3, ["fsdp.checkpoint"] = "full" }), { world = W }).activations
  local none = planner.plan(r, { world = W }).activations
  local B, L = r.data.micro_batch, r.data.seq
  local x, y = fsdp.tensor({ B, L }, "int32"), fsdp.tensor({ B, L }, "int32")
  for i = 0, B * L - 1 do x:set(i, (i * 5 + R) % cfg.vocab_size); y:set(i, (i * 3 + R) % cfg.vocab_size) end
  local lossfn = function(logits, b) return llama.loss(logits, b.y, 0) end
  s:evaluate({ { x = x, y = y } }, lossfn)
  local peak, _, left = T.measured(fsdp, device, function() s:evaluate({ { x = x, y = y } }, lossfn) end)
  check(peak < full and left < 64, string.format("evaluate: peak %d bytes above the start (a fully checkpointed " ..
    "training step: %d, none: %d), %d left allocated", peak, full, none, left))
  s:free()
end
compare("zero 3, 2 micro-batches, prefetch 2, 3 buffers", { ["fsdp.zero"] = 3, ["train.grad_accum"] = 2, ["fsdp.prefetch"] = 2,
  ["fsdp.max_live_units"] = 3 })
compare("tied embeddings, zero 3", { ["fsdp.zero"] = 3, ["model.tie_word_embeddings"] = true })
for zero = 1, 3 do compare("offload, zero " .. zero, { ["fsdp.zero"] = zero, ["fsdp.offload"] = true, ["train.grad_accum"] = 2 }) end
for zero = 1, 3 do compare("offload with the grads, zero " .. zero, { ["fsdp.zero"] = zero, ["fsdp.offload"] = "grads", ["train.grad_accum"] = 2 }) end
local mixed = function(m, path)
  if m.kind == "LlamaDecoderLayer" then
    local i = tonumber(path:match("(%d+)$"))
    return path, { zero = i % 2 == 0 and 3 or 2, reshard_after_forward = i ~= 0 }
  end
  if path == "model.embed_tokens" then return "embed", { zero = 1 } end
  if path == "lm_head" or path == "model.norm" then return "head" end
end
compare("a policy mixing zero 1-3, one unit kept gathered", { ["fsdp.units"] = mixed })
-- the MLP a unit of its own: its first module (gate_proj) is not the last
-- to run backward (the MLP runs gate's backward before up's), so the unit
-- is reduced after its last backward, not its first module's
local function mlp_units(m, path)
  if m.kind == "LlamaDecoderLayer" or m.kind == "LlamaMLP" then return path end
  if path == "model.embed_tokens" then return "embed" end
  if path == "lm_head" or path == "model.norm" then return "head" end
end
compare("each MLP its own unit", { ["fsdp.units"] = mlp_units })
-- the same nested units without prefetching, and with every layer
-- checkpointed: the MLP's backward makes its layer's norm again (light
-- recompute) or re-runs the layer, entering the layer's unit out of model
-- order, which gathers units more often than a step in model order would
-- (the planner replays the dry run's calls: unit_schedule.replay; at 2
-- ranks, enough to gather, for the suite's time)
for _, o in ipairs(W ~= 2 and {} or { { "prefetch 0", { ["fsdp.prefetch"] = 0 } }, { "checkpoint full", { ["fsdp.checkpoint"] = "full" } },
  { "checkpoint full, prefetch 0", { ["fsdp.checkpoint"] = "full", ["fsdp.prefetch"] = 0 } } }) do
  local over = { ["fsdp.units"] = mlp_units }
  for k, v in pairs(o[2]) do over[k] = v end
  compare("each MLP its own unit, " .. o[1], over)
end
for _, pol in ipairs({ "two_layers_per_unit", "replicate_embeddings", "zero_by_size", "param_budget", "attention_mlp_units" }) do
  compare("policy " .. pol, { ["fsdp.units"] = "recipes/policies/" .. pol .. ".lua" })
end
-- tensor parallelism: each rank's slices, and the tp layers' gathered rows
-- and vocab-parallel loss, planned to the byte
if W == 2 then
  compare("cp 2", { ["mesh"] = "dp_shard=1,cp=2" })
  compare("cp 2, ring attention", { ["mesh"] = "dp_shard=1,cp=2", ["train.cp_attention"] = "ring" })
  compare("cp 2, packed rows (each block's first keys of the queries' documents)", { ["mesh"] = "dp_shard=1,cp=2",
    ["data.corpus"] = false, ["data.token_file"] = "packed.bin", ["data.pack"] = true })
  compare("cp 2, bf16, recompute mlp, checkpoint full", { ["mesh"] = "dp_shard=1,cp=2", ["fsdp.param_dtype"] = "bf16",
    ["fsdp.recompute"] = "mlp", ["fsdp.checkpoint"] = "full" })
  compare("tp 2", { ["mesh"] = "dp_shard=1,tp=2" })
  compare("tp 2, bf16, recompute mlp, the loss over chunks of 64 rows", { ["mesh"] = "dp_shard=1,tp=2",
    ["fsdp.param_dtype"] = "bf16", ["fsdp.recompute"] = "mlp", ["train.loss_chunk_mb"] = 64 * 128 * 4 / 2 ^ 20 })
end
if W == 4 then
  compare("dp_shard 2 x tp 2, checkpoint full", { ["mesh"] = "dp_shard=2,tp=2", ["fsdp.checkpoint"] = "full" })
  compare("cp 2 x tp 2", { ["mesh"] = "dp_shard=1,cp=2,tp=2" })
  compare("dp_shard 2 x cp 2, zero 2, 2 micro-batches", { ["mesh"] = "dp_shard=2,cp=2", ["fsdp.zero"] = 2,
    ["train.grad_accum"] = 2 })
  compare("cp 4, zero 1", { ["mesh"] = "dp_shard=1,cp=4", ["fsdp.zero"] = 1 })
  compare("cp 4, ring attention, checkpoint full", { ["mesh"] = "dp_shard=1,cp=4", ["train.cp_attention"] = "ring",
    ["fsdp.checkpoint"] = "full" })
  compare("tp 4 (each kv head shared by 2 ranks), zero 2, tied", { ["mesh"] = "dp_shard=1,tp=4", ["fsdp.zero"] = 2,
    ["model.tie_word_embeddings"] = true })
  compare("dp_outer 2 x tp 2, the whole logits", { ["mesh"] = "dp_outer=2,dp_shard=1,tp=2", ["train.loss_chunk_mb"] = 0 })
  compare("2x2 HFSDP", { ["mesh"] = "dp_outer=2,dp_shard=2", ["fsdp.hfsdp"] = true })
  compare("2x2 HSDP, offload", { ["mesh"] = "dp_outer=2,dp_shard=2", ["fsdp.offload"] = true })
end

-- the attention a GPU plan chooses (train.attention): "auto" keeps cuDNN's
-- while its deterministic backward's workspace (quadratic in the
-- sequence) stays within 32 GiB, else our own kernels (none); "own" and
-- context parallelism never take one
do
  local function p8(over)
    local r = dofile(root .. "/recipes/llama3_8b.lua")
    for k, v in pairs(over) do local sec, f = k:match("^(%w+)%.([%w_]+)$"); r[sec][f] = v end
    return planner.plan(r, { world = 8, where = "llama3_8b.lua", mesh = over.mesh })
  end
  local short, long = p8({}), p8({ ["data.seq"] = 32768, ["model.max_position_embeddings"] = 32768 })
  check(short.attention_impl == nil and short.attention_workspace.backward > 2 ^ 30 and
    short.attention_workspace.backward < planner.attention_workspace_max,
    "8192 tokens: cuDNN's attention, its workspace in the plan: " .. short.attention_workspace.backward)
  check(long.attention_impl == "own" and long.attention_workspace.backward == 0 and
    long.attention_workspace_from:find("cuDNN's backward would take 128.50 GiB", 1, true) ~= nil,
    "32768 tokens: our own kernels, and the plan says why: " .. long.attention_workspace_from)
  local own = p8({ ["train.attention"] = "own" })
  check(own.attention_impl == "own" and own.attention_workspace.backward == 0 and own.peak < short.peak,
    "train.attention = 'own': no workspace")
  local forced = p8({ ["data.seq"] = 32768, ["model.max_position_embeddings"] = 32768, ["train.attention"] = "cudnn" })
  check(forced.attention_impl == nil and forced.attention_workspace.backward > 100 * 2 ^ 30,
    "train.attention = 'cudnn': its workspace however large")
end

-- llama70b at W = 64 against a hand calculation
do
  local r = dofile(root .. "/recipes/llama70b.lua")
  local p = planner.plan(r, { world = 64, where = "llama70b.lua" })
  check(math.abs(p.n_params / 70.55e9 - 1) < 1e-3, string.format("70B: %.4gB parameters", p.n_params / 1e9))
  local S = 64 -- the recipe shards over every rank
  local function up(x, m) return math.ceil(x / m) * m end
  local h, I, L, V = 8192, 28672, 80, 128256
  local kv = 8 * 128
  local layer = up(h, 16) + up(h * h, 16) + 2 * up(kv * h, 16) + up(h * h, 16) + up(h, 16) + 3 * up(h * I, 16)
  local units = { up(V * h, 16) } -- embed, then the layers, then norm + head
  for _ = 1, L do units[#units + 1] = layer end
  units[#units + 1] = up(h, 16) + up(V * h, 16)
  local opt = 0
  for _, n in ipairs(units) do opt = opt + 2 * 4 * up(n, S * 32) / S end
  check(p.resident.optimizer == opt, string.format("70B optimizer bytes per rank: planned %.0f, by hand %.0f", p.resident.optimizer, opt))
  check(math.abs(p.resident.optimizer / (8 * 70.55e9 / S) - 1) < 1e-3, "70B optimizer bytes ~ 8 x 70.55B / 64")
  check(p.host == 16 * (p.resident.optimizer / 8) + p.resident.host_stage, "offloaded: 16 bytes per owned parameter + staging")
  -- the param shards on the host too (GPUs, zero 3): no device shard; one
  -- staging shard (the largest, bf16) in the shard comm's scratch
  r.train.device = "cuda"
  local pg = planner.plan(r, { world = 64, where = "llama70b.lua" })
  r.fsdp.offload = { params = true }
  local pp = planner.plan(r, { world = 64, where = "llama70b.lua" })
  r.fsdp.offload, r.train.device = true, "cpu"
  local largest = 0
  for _, u in ipairs(pp.units) do largest = math.max(largest, u.shard_numel) end
  check(pp.resident.params_shard == 0 and pg.resident.params_shard > 0, "offload {params = true}: no device param shard")
  check(pg.device_peak - pp.device_peak == pg.resident.params_shard - 2 * largest and pp.host == pg.host,
    string.format("offload {params = true} saves the shard less one staging shard on the device (%.0f MiB)",
      (pg.device_peak - pp.device_peak) / 2 ^ 20))
  local hsdp = planner.plan(r, { world = 64, mesh = "dp_outer=8,dp_shard=8", where = "llama70b.lua" })
  check(math.abs(hsdp.resident.optimizer / (8 * 70.55e9 / 8) - 1) < 1e-3, "HSDP 8 x 8: ~ 8 x 70.55B / 8")
  local t0 = C.fsdp_time_now()
  for _, w in ipairs({ 8, 16, 128, 512, 1024 }) do planner.plan(r, { world = w, where = "llama70b.lua" }) end
  check(C.fsdp_time_now() - t0 < 10, "planning 70B at 8-1024 ranks takes seconds")
end

-- GPUs, bf16 grads reduced into fp32 on 8 ranks: NCCL's input is cast to
-- fp32 through a staging block of chunks (src/dist/comm_cast_chunks.c),
-- 64 Mi fp32 elements here (Llama 3 8B's embedding: 65.7M per rank, in
-- chunks of 8 Mi), not a copy of the whole unit (1.96 GiB); none when the
-- grads reduce in bf16, nor on one rank, nor on CPU ranks (shm sums in fp32)
do
  local r = dofile(root .. "/recipes/llama3_8b.lua")
  local function staging(over, world)
    local x = dofile(root .. "/recipes/llama3_8b.lua")
    for k, v in pairs(over) do x.fsdp[k] = v end
    return planner.plan(x, { world = world or 8, where = "llama3_8b.lua" }).resident.staging
  end
  check(staging({}) == 4 * 8 * 8 * 2 ^ 20, string.format("8B on 8 GPUs: a 256 MiB fp32 block (%.1f MiB)", staging({}) / 2 ^ 20))
  check(staging({ reduce_dtype = "bf16" }) == 0, "8B, bf16 reductions: no fp32 block")
  check(staging({}, 1) == 0, "8B on one GPU: nothing to reduce")
  r.train.device = "cpu"
  local cpu = planner.plan(r, { world = 8, where = "llama3_8b.lua" })
  check(cpu.resident.staging ~= 4 * 8 * 8 * 2 ^ 20, "CPU ranks: their own fp32 staging (the module pair), not NCCL's")
end

-- invalid policies, named by module path
do
  local function bad(units, needle, what)
    fails(function() planner.plan(tiny({ ["fsdp.units"] = units }), { world = W, where = "p.lua" }) end, needle, what)
  end
  bad(function(m, path) if m.kind == "LlamaDecoderLayer" then return path, { zeroo = 2 } end end,
    "module 'model.layers.0' (unit 'model.layers.0') an unknown option 'zeroo'", "an unknown option")
  bad(function(m, path) if path == "model.norm" then return false end end,
    "parameter 'model.norm.weight' of module 'model.norm' is left in no unit", "a parameter in no unit")
  bad(function(m, path) if path == "model.norm" then return "head", { zero = 2 } elseif path == "lm_head" then return "head", { zero = 3 } end end,
    "unit 'head' is given zero = 2 for module 'model.norm' but zero = 3 for module 'lm_head'", "two strategies")
  bad(function(m, path) if m.kind == "LlamaDecoderLayer" then return path, { zero = 5 } end end,
    "unit 'model.layers.0' (module 'model.layers.0'): zero = 5", "a bad zero level")
  bad(function(m, path) if path == "lm_head" then return 42 end end, "returned a number for module 'lm_head'", "not a name")
  bad("recipes/policies/nope.lua", "no such policy file", "a missing policy file")
  -- a misspelt kind in a list would leave the whole model one unit, without a word
  bad({ "LlamaDecoderLayr" }, "p.lua: fsdp.units: the units list names 'LlamaDecoderLayr', but no module of the model is one " ..
    "(its kinds: Embedding, Linear, LlamaAttention, LlamaDecoderLayer,", "a kind the model lacks")
  bad({ "Linear", true }, "fsdp.units: units[2] = true (a boolean); expected a module kind", "a list entry that is no kind")
  bad(function(m, path) if path == "model.embed_tokens" then return "embed", { zero = 0, offload = true } end end,
    "unit 'embed' (module 'model.embed_tokens'): offload needs zero >= 1", "offload at zero 0")
  bad(function(m, path) if path == "model.embed_tokens" then return "embed", { zero = 2, offload = { params = true } } end end,
    "unit 'embed' (module 'model.embed_tokens'): offloading the params (offload = {params = true}) needs zero 3",
    "param offload at zero 2")
  bad(function(m, path) if path == "model.embed_tokens" then return "embed", { offload = { param = true } } end end,
    "expected true, false or {optimizer = true, params = true, grads = true}", "a misspelt offload table")
  -- the world and the mesh given to the planner itself (fsdp plan --world, --mesh)
  fails(function() planner.plan(tiny(), { world = 2 ^ 30, where = "p.lua" }) end,
    "p.lua: world = 1073741824; at most 1048576 ranks are planned", "a world beyond the planner")
  fails(function() planner.plan(tiny(), { world = 4, mesh = "pp=2,dp_shard=-1", where = "p.lua" }) end,
    "p.lua: mesh: dimension 'pp' is not one the trainer knows", "a mesh dimension the trainer does not use")
  fails(function() planner.plan(tiny({ ["fsdp.offload"] = "yes" }), { world = W, where = "p.lua" }) end,
    "offload = yes; expected true, false or {optimizer = true, params = true, grads = true}", "a bad fsdp.offload")
  -- every layer's norms left to a root unit kept resident between the
  -- attention and MLP units: its index-order prefetch cannot fit, and the
  -- message says why (not "raise max_live_units"), in the planner and in
  -- fully_shard alike
  local spread = function(m, path)
    if path == "" then return "norms", { zero = 2 } end
    if m.kind == "LlamaAttention" or m.kind == "LlamaMLP" then return path end
    if path == "model.embed_tokens" then return "embed" end
    if path == "model.norm" or path == "lm_head" then return "head" end
  end
  if W > 1 then -- (one rank gathers nothing)
    bad(spread, "unit 'norms' runs in 8 separate stretches of the forward (unit 'model.layers.0.self_attn' first runs " ..
      "between them)", "a unit spread between others")
    fails(function()
      local cfg = llama.config(tiny().model)
      fsdp.fully_shard(llama.model(cfg), { shard = fsdp.mesh("dp_shard=-1"):group("dp_shard"), units = spread, zero = 3 })
    end, "fully_shard: the schedule does not fit its buffer pools", "fully_shard refuses it before a step")
  end
end

-- each example policy trains like the default grouping (FSDP_TEST_QUICK=1,
-- the sanitizer pass: left to the normal pass; the trainer's and offload's
-- tests run those paths under the sanitizers)
if os.getenv("FSDP_TEST_QUICK") == "1" then
  if R == 0 then print("FSDP_TEST_QUICK=1: the policies' training runs left to the normal pass") end
else
  local function losses(units)
    local args = { "train.steps=4", "data.seq=64", "data.micro_batch=4", "train.eval_every=0", "train.log_every=1000",
      "schedule.warmup=2" }
    if units then args[#args + 1] = "fsdp.units=" .. units end
    local r = dofile(root .. "/recipes/tiny.lua")
    r.train.metrics = nil
    return train.run(r, "tiny.lua", args).losses
  end
  local ref = losses(nil)
  -- the offloaded optimizer (host buffers, the step on CPU threads) is the
  -- same arithmetic: on CPU ranks the same losses bit for bit
  local function losses_with(extra)
    local r = dofile(root .. "/recipes/tiny.lua")
    r.train.metrics = nil
    local args = { "train.steps=4", "data.seq=64", "data.micro_batch=4", "train.eval_every=0", "train.log_every=1000",
      "schedule.warmup=2", "train.grad_accum=2" }
    for _, a in ipairs(extra) do args[#args + 1] = a end
    return train.run(r, "tiny.lua", args).losses
  end
  for z = 1, 3 do
    local a, b = losses_with({ "fsdp.zero=" .. z }), losses_with({ "fsdp.zero=" .. z, "fsdp.offload=true" })
    local same = true
    for s = 1, 4 do same = same and a[s] == b[s] end
    check(same, string.format("zero %d: offload trains bit for bit like the optimizer in place", z))
  end
  for _, pol in ipairs({ "two_layers_per_unit", "replicate_embeddings", "zero_by_size", "param_budget", "attention_mlp_units" }) do
    local l = losses("recipes/policies/" .. pol .. ".lua")
    local worst = 0
    for s = 1, 4 do worst = math.max(worst, math.abs(l[s] - ref[s])) end
    check(worst <= 1e-5, string.format("policy %s: losses within 1e-5 of the default grouping (worst %.2g)", pol, worst))
  end
end

T.finish()

-- test_tp.lua (fsdprun -n W, W = 2, 4 and 8): tensor parallelism with
-- sequence parallelism (fsdp.tp) and context parallelism (fsdp.cp)
-- against one rank.
-- For each mesh of W ranks ((dp_shard, tp) = (1, W), (dp_shard, cp) =
-- (1, W); at W = 4 also dp_shard 2 x tp 2, dp_shard 2 x cp 2, cp 2 x tp 2
-- and dp_outer 2 x tp 2; at W = 8 the (dp_outer, dp_shard, cp, tp) shapes
-- (2,2,2,1), (1,2,2,2) and (2,2,1,2)) and for two models, the tiny
-- recipe's Llama (4 heads, 2 kv heads: at tp = 4 each kv head is shared by
-- two ranks) and a 4-layer GQA Llama (8 heads, 4 kv heads: split), 30
-- AdamW steps at ZeRO 3 (and, at W = 2 and 4, ZeRO 1 and 2, activation
-- checkpointing, recompute "mlp" and "none", tied embeddings, with and
-- without cp; cp's attention is an all-gather, fsdp.cp, and every mesh
-- with cp also runs it as a ring, fsdp.cp_ring; at W = 2 and 4 every cp
-- mesh also trains packed rows, documents of 1 to 6 tokens, each query
-- attending to its own document, the first such mesh also as a ring)
-- equal the same model
-- trained unsharded on one rank over the
-- global batch: each step's loss and grad norm within 1e-5 relative
-- (fp32: other GEMM shapes and sums in another order; measured at most
-- 4.5e-6). AdamW's eps is 1e-6: with 1e-8 its first steps move an element
-- whose gradient is fp32 noise (~1e-9) by lr either way, on one rank as
-- on several, which is no test of the math. Before the first step every
-- parameter's slice holds the values the whole weight has there (the meta
-- init of slices). A mesh that does not split the model is refused naming
-- the field and the sizes that would.
-- Checkpoints hold whole tensors: a run saved after 3 steps at (dp_shard,
-- tp) = (W/2, 2) (at W = 8: (dp_shard, cp, tp) = (2, 2, 2)) resumes at
-- (W, 1), tp W (at 8: cp 2 x tp 4) and on one rank; every resumed run's
-- next 3 losses are within 1e-6 of the uninterrupted run's. The Hugging
-- Face export at tp 2 equals one rank's export of the same checkpoint
-- byte for byte, and importing it at tp = W gives that checkpoint's
-- weights.
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local tpm = require "fsdp.tp"
local ckpt = require "fsdp.checkpoint"
local hf = require "fsdp.hf"
local collective = require "fsdp.collective"

local info = fsdp.init()
local W, R = info.size, info.rank
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_tp rank %d/%d", R, W))
local check = T.check

local tiny = { hidden_size = 128, intermediate_size = 352, num_attention_heads = 4, num_key_value_heads = 2,
  num_hidden_layers = 4, vocab_size = 256, max_position_embeddings = 64, rms_norm_eps = 1e-5 }
local gqa = { hidden_size = 64, intermediate_size = 96, num_attention_heads = 8, num_key_value_heads = 4,
  num_hidden_layers = 4, vocab_size = 128, max_position_embeddings = 64, rms_norm_eps = 1e-5 }

local SEQ, MB, STEPS = 16, 2, 30
local opt = { lr = 5e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-6, weight_decay = 0.1, clip = 1.0 }

-- the global batch of step k: rows of ids and their next-token targets,
-- the same on every rank; dp rank d takes rows [d*MB, (d+1)*MB)
-- packed: rows of documents (lengths 1 to 6, placed by the row and step),
-- each with doc_start, no target across a document's end (-100 at its
-- last token) and the count of targets
local function batch(vocab, k, rows, first, packed)
  local rnd = T.lcg(1000 + k)
  local ids, tg, ds, count = {}, {}, {}, 0
  for r = 0, first + rows - 1 do
    local row = {}
    for t = 0, SEQ do row[t] = math.floor(rnd(2147483648) / 65536) % vocab end -- (the LCG's high bits: its low ones repeat)
    if r >= first then count = count + T.append_row(ids, tg, ds, row, r, k, SEQ, packed) end
  end
  local b = { x = T.int32(fsdp, ids, { rows, SEQ }), y = T.int32(fsdp, tg, { rows * SEQ }) }
  if packed then b.doc_start, b.count = T.int32(fsdp, ds, { rows, SEQ }), count end
  return b
end

local function free(b)
  b.x:free(); b.y:free()
  if b.doc_start then b.doc_start:free() end
end
local steps = llama.step_loss(1 * 2 ^ 20)

-- one rank alone on the whole global batch: the reference losses and norms
local solo_mesh = fsdp.mesh({ { "dp_outer", W }, { "dp_shard", 1 } })
local solo = solo_mesh:group("dp_shard")
-- one rank alone on the whole global batch: each step's loss and grad
-- norm, by model and data-parallel ranks (activation checkpointing and
-- recompute give the same bits, test_llama: one reference serves them)
local references = {}
local function reference(cfg_t, dp, packed)
  local key = tostring(cfg_t) .. "/" .. dp .. (packed and "/packed" or "")
  if references[key] then return references[key] end
  local cfg = llama.config(cfg_t)
  local m = fsdp.fully_shard(llama.model(cfg), { shard = solo, units = llama.units, zero = 3, seed = 7 })
  local out = {}
  for k = 1, STEPS do
    local b = batch(cfg.vocab_size, k, MB * dp, 0, packed)
    local loss, norm = m:train_step({ b }, { forward_loss = steps.forward_loss, lr = opt.lr, beta1 = opt.beta1,
      beta2 = opt.beta2, eps = opt.eps, weight_decay = opt.weight_decay, clip = opt.clip })
    out[k] = { loss, norm }
    free(b)
  end
  m:free()
  references[key] = out
  return out
end

local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-30) end

-- how many of a parameter's values (mine: this rank's, its tp slice sl or
-- whole) differ from the whole weight's at the same place (full)
local function mismatches(mine, full, sl)
  local bad = 0
  for i = 1, #mine do
    local at = i - 1
    if sl then at = (math.floor(at / sl.cols) + sl.row0) * sl.full[2] + at % sl.cols + sl.col0 end
    if mine[i] ~= full[at + 1] then bad = bad + 1 end
  end
  return bad
end

-- A model of cfg on mesh spec (dims, e.g. {{"dp_shard", 2}, {"tp", 2}}):
-- tp and cp groups as the trainer makes them, FSDP over dp_shard (x cp:
-- the cp ranks of a dp rank take its rows' chunks; the model takes whole
-- rows). o: model (llama.model options), zero, seed, alone (dp_outer's
-- ranks each a run of their own). Returns the sharded model, the mesh,
-- the data-parallel ranks and this rank's place among them.
local function build(cfg, spec, o)
  local mesh = fsdp.mesh(spec)
  local names = {}
  for _, d in ipairs(spec) do names[d[1]] = d[2] end
  local tpc, cpc = names.tp and mesh:group("tp"), names.cp and mesh:group("cp")
  local dps = mesh:group("dp_shard")
  local outer = names.dp_outer and not o.alone and mesh:group("dp_outer") or nil
  local mo = { tp = tpc and tpm.group(tpc), cp = cpc and tpm.group(cpc) }
  for k, v in pairs(o.model or {}) do mo[k] = v end
  local m = fsdp.fully_shard(llama.model(cfg, mo), { shard = cpc and mesh:group("dp_shard,cp") or dps, outer = outer,
    tp = tpc, units = llama.units, zero = o.zero or 3, seed = o.seed or 7 })
  return m, mesh, dps:size() * (outer and outer:size() or 1), (outer and outer:rank() * dps:size() or 0) + dps:rank()
end

local function run(name, cfg_t, spec, o)
  local cfg = llama.config(cfg_t)
  local m, mesh, dp, dp_rank = build(cfg, spec, o)
  local want = reference(cfg_t, dp, o.packed)
  -- 1. the slices hold the whole weights' values (before any step)
  if o.slices then
    local bad = 0
    for _, u in ipairs(m.units) do
      for _, p in ipairs(u.params) do
        bad = bad + mismatches(m:gather(p.name), o.slices[p.name], p.spec.slice)
      end
    end
    check(bad == 0, string.format("%s: every slice holds the whole weight's values (%d differ)", name, bad))
  end
  local worst_l, worst_n = 0, 0
  for k = 1, STEPS do
    local b = batch(cfg.vocab_size, k, MB, dp_rank * MB, o.packed)
    local loss, norm = m:train_step({ b }, { forward_loss = steps.forward_loss, lr = opt.lr, beta1 = opt.beta1,
      beta2 = opt.beta2, eps = opt.eps, weight_decay = opt.weight_decay, clip = opt.clip })
    worst_l = math.max(worst_l, rel(loss, want[k][1]))
    worst_n = math.max(worst_n, rel(norm, want[k][2]))
    free(b)
  end
  check(worst_l <= 1e-5 and worst_n <= 1e-5, string.format("%s: %d steps' losses and grad norms equal one rank's " ..
    "(worst %.2g and %.2g relative; tolerance 1e-5)", name, STEPS, worst_l, worst_n))
  if R == 0 then print(string.format("  %s: worst loss %.2g, grad norm %.2g relative", name, worst_l, worst_n)) end
  m:free()
  mesh:free()
end

-- the whole weights of the 1-rank model, by name (for the slice check)
local function whole_params(cfg_t, o)
  local m = fsdp.fully_shard(llama.model(llama.config(cfg_t), o and o.model), { shard = solo, units = llama.units, zero = 3,
    seed = 7 })
  local out = {}
  for _, u in ipairs(m.units) do for _, p in ipairs(u.params) do out[p.name] = m:gather(p.name) end end
  m:free()
  return out
end

local meshes = { { "tp" .. W, { { "dp_shard", 1 }, { "tp", W } } }, { "cp" .. W, { { "dp_shard", 1 }, { "cp", W } } } }
if W == 4 then
  meshes[#meshes + 1] = { "dp_shard2 x tp2", { { "dp_shard", 2 }, { "tp", 2 } } }
  meshes[#meshes + 1] = { "dp_shard2 x cp2", { { "dp_shard", 2 }, { "cp", 2 } } }
  meshes[#meshes + 1] = { "cp2 x tp2", { { "dp_shard", 1 }, { "cp", 2 }, { "tp", 2 } } }
  meshes[#meshes + 1] = { "dp_outer2 x tp2", { { "dp_outer", 2 }, { "dp_shard", 1 }, { "tp", 2 } } }
elseif W == 8 then -- (dp_outer, dp_shard, cp, tp): the seed system's own FSDP test's three shapes
  meshes = { { "(2,2,2,1)", { { "dp_outer", 2 }, { "dp_shard", 2 }, { "cp", 2 } } },
    { "(1,2,2,2)", { { "dp_shard", 2 }, { "cp", 2 }, { "tp", 2 } } },
    { "(2,2,1,2)", { { "dp_outer", 2 }, { "dp_shard", 2 }, { "tp", 2 } } } }
end

-- (FSDP_TEST_QUICK, the sanitizer pass: the packed rows', the engine's and
-- generation's C is the op tests'; their Lua the normal pass's)
local quick = os.getenv("FSDP_TEST_QUICK") == "1"
local packed_ring = false
for _, mm in ipairs(meshes) do
  local label, spec = mm[1], mm[2]
  run("tiny " .. label .. " zero 3", tiny, spec, { slices = W < 8 and whole_params(tiny) or nil })
  run("gqa " .. label .. " zero 3", gqa, spec, { slices = W < 8 and whole_params(gqa) or nil })
  for _, d in ipairs(spec) do -- (cp: attention as a ring too, fsdp.cp_ring; the default is an all-gather)
    if d[1] == "cp" then
      run("gqa " .. label .. " zero 3, ring attention", gqa, spec, { model = { cp_attention = "ring" } })
      if W < 8 and not quick then -- packed rows: every cp mesh of 2 and 4 ranks, the first of each also as a ring
        run("gqa " .. label .. " zero 3, packed rows", gqa, spec, { packed = true })
        if not packed_ring then
          run("tiny " .. label .. " zero 3, packed rows, ring attention", tiny, spec, { packed = true,
            model = { cp_attention = "ring" } })
          packed_ring = true
        end
      end
    end
  end
end
local tied = {}
for k, v in pairs(gqa) do tied[k] = v end
tied.tie_word_embeddings = true
-- (the strategies and options at 2 and 4 ranks; 8 runs the shapes above;
-- FSDP_TEST_QUICK, the sanitizer pass: the shapes and the checkpoints)
if W < 8 and not quick then
  local spec = meshes[#meshes][2]
  run("tiny zero 1", tiny, spec, { zero = 1 })
  run("gqa zero 2, tied embeddings", tied, spec, { zero = 2 })
  run("tiny zero 3, checkpoint full", tiny, spec, { model = { checkpoint = "full" } })
  run("gqa zero 3, recompute mlp", gqa, spec, { model = { recompute = "mlp" } })
  run("gqa zero 3, recompute none", gqa, spec, { model = { recompute = "none" } })
  local cspec = meshes[W == 4 and 5 or 2][2] -- (cp, with tp at W = 4)
  run("tiny cp zero 1", tiny, cspec, { zero = 1 })
  run("gqa cp zero 2, tied embeddings", tied, cspec, { zero = 2 })
  run("tiny cp zero 3, checkpoint full", tiny, cspec, { model = { checkpoint = "full" } })
  run("gqa cp zero 3, recompute mlp", gqa, cspec, { model = { recompute = "mlp" } })
  run("tiny cp zero 1, checkpoint full, ring attention", tiny, cspec, { zero = 1,
    model = { checkpoint = "full", cp_attention = "ring" } })
end

---------------------------------------------------------------- the backward's overlap (W = 2)
-- The weight gradients of a block's column-parallel Linears compute while
-- its sequence-parallel reduce-scatter runs (nn.linears_backward): the tp
-- comm is wrapped to log its reduce-scatters and waits, the dW-only GEMMs
-- (linear_backward with no dx) are logged too. With the overlap each
-- layer's MLP runs 2 of them (gate, up) and its attention 3 (q, k, v)
-- between a reduce-scatter and its wait; without it none, and the losses
-- and grad norms of 3 steps are the same bits (the same GEMMs per weight:
-- tolerance 0).
if W == 2 then
  local ops = require "fsdp.ops"
  local log = {}
  local function logged(comm)
    return setmetatable({}, { __index = function(_, k)
      local f = comm[k]
      if type(f) ~= "function" then return f end
      return function(_, ...)
        if k == "reduce_scatter" or k == "synchronize" then log[#log + 1] = k end
        return f(comm, ...)
      end
    end })
  end
  local lb = ops.linear_backward
  ops.linear_backward = function(dx, ...)
    if dx == nil then log[#log + 1] = "dW" end
    return lb(dx, ...)
  end
  local cfg = llama.config(tiny)
  local function three_steps(overlap)
    local mesh = fsdp.mesh({ { "dp_shard", 1 }, { "tp", 2 } })
    local m = fsdp.fully_shard(llama.model(cfg, { tp = tpm.group(logged(mesh:group("tp"))), tp_overlap = overlap }),
      { shard = mesh:group("dp_shard"), tp = mesh:group("tp"), units = llama.units, zero = 3, seed = 7 })
    local out, windows = {}, {}
    for k = 1, 3 do
      log = {}
      local b = batch(cfg.vocab_size, k, MB, 0)
      out[k] = { m:train_step({ b }, { forward_loss = steps.forward_loss, lr = opt.lr, beta1 = opt.beta1,
        beta2 = opt.beta2, eps = opt.eps, weight_decay = opt.weight_decay, clip = opt.clip }) }
      free(b)
      local open
      for _, e in ipairs(log) do -- each reduce-scatter's dW GEMMs before its wait
        if e == "reduce_scatter" then
          open = 0
        elseif e == "dW" and open then
          open = open + 1
        elseif e == "synchronize" and open then
          if open > 0 then windows[#windows + 1] = open end
          open = nil
        end
      end
    end
    m:free(); mesh:free()
    return out, table.concat(windows, " ")
  end
  local on, won = three_steps(true)
  local off, woff = three_steps(false)
  ops.linear_backward = lb
  local want = {}
  for _ = 1, 3 * tiny.num_hidden_layers do want[#want + 1] = "2 3" end
  check(won == table.concat(want, " "), string.format("with the overlap each layer's backward computes 2 and 3 " ..
    "weight gradients while its reduce-scatters run (got '%s')", won))
  check(woff == "", string.format("without it none (got '%s')", woff))
  local same = true
  for k = 1, 3 do same = same and on[k][1] == off[k][1] and on[k][2] == off[k][2] end
  check(same, "3 steps' losses and grad norms are the same bits with and without the overlap")
end

---------------------------------------------------------------- the post-training engine and generation (W = 2, 4)
-- fsdp.engine at tp 2 and cp 2 (W = 2), cp 2 x tp 2 and tp 4 (W = 4),
-- dp_shard 1, against one rank on the same batch (the 4-layer GQA Llama,
-- its kv heads split; at tp 4 the tiny Llama, whose 2 kv heads are each
-- shared by 2 tp ranks): the log-probs and entropies (the vocabulary split
-- over the tp ranks, fsdp_token_logprobs_vocab_*; each cp rank's tokens
-- gathered, fsdp.cp.join) within 1e-5 absolute (fp32: other GEMM shapes;
-- values of -5 or so), 0 at the ignored targets; then 3 GRPO steps (clip
-- 0.2, a KL term against the first log-probs, old log-probs of the step
-- before, AdamW) whose losses and grad norms are within 1e-5 relative of
-- one rank's, as the training runs above. Before those steps, generation
-- (fsdp.generate over the sharded model, as the trainer's samples): the
-- prompt's last logits within 1e-5 of one rank's, and 10 greedy tokens,
-- with the KV caches and without, equal to one rank's.
if W <= 4 and not quick then
  local function engine_run(spec, cfg)
    local m, mesh
    if spec then
      m, mesh = build(cfg, spec, {})
    else
      m = fsdp.fully_shard(llama.model(cfg), { shard = solo, units = llama.units, zero = 3, seed = 7 })
    end
    local raw = batch(cfg.vocab_size, 1, MB, 0)
    local b = { x = raw.x, y = fsdp.tensor({ MB, SEQ }, "int32") }
    for i = 0, raw.y:numel() - 1 do b.y:set(i, i % 7 == 3 and -100 or raw.y:get(i)) end
    raw.y:free()
    local out = T.generate_then_grpo(fsdp, m, cfg, b, opt)
    if mesh then mesh:free() end
    return out
  end
  local shapes = { { "tp " .. W, { { "dp_shard", 1 }, { "tp", W } } }, { "cp " .. W, { { "dp_shard", 1 }, { "cp", W } } } }
  if W == 4 then -- cp 2 x tp 2, and the tiny Llama's 2 kv heads each shared by 2 of the 4 tp ranks
    shapes = { { "cp 2 x tp 2", { { "dp_shard", 1 }, { "cp", 2 }, { "tp", 2 } } },
      { "tp 4, kv heads shared", { { "dp_shard", 1 }, { "tp", 4 } }, tiny } }
  end
  local wants = {}
  for _, sh in ipairs(shapes) do
    local cfg = llama.config(sh[3] or gqa)
    local key = sh[3] and "tiny" or "gqa"
    wants[key] = wants[key] or engine_run(nil, cfg)
    local want = wants[key]
    local got = engine_run(sh[2], cfg)
    local said = T.engine_compare(got, want, MB * SEQ, "engine at " .. sh[1])
    local gsaid = T.generation_compare(got.gen, want.gen, cfg.vocab_size, "generation at " .. sh[1])
    if R == 0 then print("  " .. said .. "; " .. gsaid) end
  end
end

---------------------------------------------------------------- checkpoints and Hugging Face files
do
  local cfg = llama.config(gqa)
  local function sharded(spec, seed, alone) return build(cfg, spec, { seed = seed, alone = alone }) end
  local function steps_of(m, dp, dp_rank, from, to)
    local out = {}
    for k = from, to do
      local b = batch(cfg.vocab_size, k, MB * W / dp, dp_rank * MB * W / dp)
      out[k] = m:train_step({ b }, { forward_loss = steps.forward_loss, lr = opt.lr, beta1 = opt.beta1,
        beta2 = opt.beta2, eps = opt.eps, weight_decay = opt.weight_decay, clip = opt.clip })
      free(b)
    end
    return out
  end
  local saved_spec = W == 8 and { { "dp_shard", 2 }, { "cp", 2 }, { "tp", 2 } } or { { "dp_shard", W / 2 }, { "tp", 2 } }
  local saved_label = W == 8 and "dp_shard 2 x cp 2 x tp 2" or string.format("dp_shard %d x tp 2", W / 2)
  local m, mesh, dp, dpr = sharded(saved_spec)
  local dir = collective.share_text(m, R == 0 and T.workdir("tp-ckpt") or nil)
  steps_of(m, dp, dpr, 1, 3)
  ckpt.save(m, dir, { step = 3, optimizer = "adamw", meta = { optimizer_step = m.step_count } })
  hf.export(m, cfg, dir .. "/hf-tp2", { dtype = "fp32" })
  local want = steps_of(m, dp, dpr, 4, 6)
  m:free(); mesh:free()
  local path = dir .. "/step-00000003"
  local resumes = { { "dp_shard " .. W, { { "dp_shard", W }, { "tp", 1 } } }, { "tp " .. W, { { "dp_shard", 1 }, { "tp", W } } },
    { "one rank", { { "dp_outer", W }, { "dp_shard", 1 }, { "tp", 1 } } } }
  if W == 8 then resumes[2] = { "cp 2 x tp 4", { { "dp_shard", 1 }, { "cp", 2 }, { "tp", 4 } } } end
  for _, rs in ipairs(resumes) do
    -- (another seed: every value must come from the checkpoint)
    local m2, mesh2, dp2, dpr2 = sharded(rs[2], 99, rs[1] == "one rank")
    ckpt.load(m2, path, { optimizer = "adamw" })
    if rs[1] == "one rank" and R == 0 then hf.export(m2, cfg, dir .. "/hf-one", { dtype = "fp32" }) end
    local got, worst = steps_of(m2, dp2, dpr2, 4, 6), 0
    for k = 4, 6 do worst = math.max(worst, math.abs(got[k] - want[k])) end
    check(worst <= 1e-6, string.format("saved at %s, resumed at %s: 3 losses within 1e-6 of the uninterrupted run " ..
      "(worst %.2g)", saved_label, rs[1], worst))
    if R == 0 then print(string.format("  resumed at %s: worst loss difference %.2g", rs[1], worst)) end
    m2:free(); mesh2:free()
  end
  if R == 0 then -- (one rank's export: rank 0 wrote it alone, its own world of one)
    local same = io.open(dir .. "/hf-tp2/model-00001-of-00001.safetensors", "rb") ~= nil -- (one file at this size)
    for _, f in ipairs({ "model-00001-of-00001.safetensors", "config.json", "model.safetensors.index.json" }) do
      local a, b = io.open(dir .. "/hf-tp2/" .. f, "rb"), io.open(dir .. "/hf-one/" .. f, "rb")
      if a or b then
        same = same and a ~= nil and b ~= nil and a:read("*a") == b:read("*a")
      end
      if a then a:close() end
      if b then b:close() end
    end
    check(same, "the Hugging Face export at tp 2 equals one rank's export of the same checkpoint, byte for byte")
  end
  -- imported at tp = W: the checkpoint's weights (gathered slices against one rank's load)
  local m3, mesh3 = sharded({ { "dp_shard", 1 }, { "tp", W } }, 99)
  hf.import(m3, cfg, dir .. "/hf-tp2", { quiet = true })
  local m4 = fsdp.fully_shard(llama.model(cfg), { shard = solo, units = llama.units, zero = 3, seed = 98 })
  ckpt.load(m4, path, { optimizer = "adamw" })
  local bad = 0
  for _, u in ipairs(m3.units) do
    for _, p in ipairs(u.params) do
      bad = bad + mismatches(m3:gather(p.name), m4:gather(p.name), p.spec.slice)
    end
  end
  check(bad == 0, string.format("the tp 2 export imported at tp %d holds the checkpoint's weights (%d differ)", W, bad))
  m3:free(); mesh3:free(); m4:free()
  solo_mesh:group("world"):barrier() -- (every rank done reading)
  if R == 0 then os.execute("rm -rf '" .. dir .. "'") end
end

-- refusals name the field and the sizes that would work
local bad = {}
for k, v in pairs(gqa) do bad[k] = v end
bad.num_attention_heads, bad.num_key_value_heads, bad.hidden_size = 6, 6, 96
local g3 = tpm.group(nil, 4, 0)
T.fails(function() llama.model(llama.config(bad), { tp = g3 }) end,
  "tp = 4 does not split num_attention_heads = 6 with num_key_value_heads = 6", "6 heads over tp 4 refused")
T.fails(function() llama.model(llama.config(bad), { tp = g3 }) end, "tp sizes that do: 2, 3, 6", "the sizes that would work")
local odd = {}
for k, v in pairs(gqa) do odd[k] = v end
odd.vocab_size = 130
T.fails(function() llama.model(llama.config(odd), { tp = g3 }) end, "tp = 4 does not divide model.vocab_size = 130",
  "a vocabulary tp does not divide")

solo_mesh:free()
T.finish()

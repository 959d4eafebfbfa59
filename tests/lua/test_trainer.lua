-- test_trainer.lua (fsdprun -n W): recipes, the LR schedule, the data
-- loader, the pre-flight memory check and the demo recipe end to end.
--   fsdprun -n 2 tests/lua/test_trainer.lua ROOT
local fsdp = require "fsdp"
local recipe = require "fsdp.recipe"
local schedule = require "fsdp.schedule"
local data = require "fsdp.data"
local train = require "fsdp.train"
local llama = require "fsdp.models.llama"
local planner = require "fsdp.planner"
local C = fsdp.C

local info = fsdp.init()
local W, R = info.size, info.rank
local root = arg[1] or "."
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_trainer rank %d/%d", R, W))
local check, fails = T.check, T.fails

local function tiny() return dofile(root .. "/recipes/tiny.lua") end

-- recipes: defaults, overrides, errors that name the file and the field
do
  local r = recipe.check(recipe.apply_overrides(tiny(), { "train.steps=7", "fsdp.zero=2", "data.seq=32" }, "t.lua"), "t.lua")
  check(r.train.steps == 7 and r.fsdp.zero == 2 and r.data.seq == 32 and r.optimizer.eps == 1e-8, "overrides and defaults")
  local function bad(mod, needle)
    local x = tiny()
    mod(x)
    fails(function() recipe.check(x, "recipes/x.lua") end, needle, "recipe error")
  end
  bad(function(x) x.train.stpes = 3 end, "recipes/x.lua: train.stpes: unknown field (did you mean 'steps'?) (train has:")
  bad(function(x) x.fsdp.zer = 3 end, "fsdp.zer: unknown field (did you mean 'zero'?)")
  bad(function(x) x.optimizer.lrr = 3 end, "optimizer.lrr: unknown field (did you mean 'lr'?)")
  bad(function(x) x.trian = {} end, "unknown section 'trian' (did you mean 'train'?)")
  bad(function(x) x.train.stepsize = 3 end, "train.stepsize: unknown field (train has:") -- far from any: no guess
  do -- two candidates one edit away: no guess either
    check(recipe.did_you_mean("lr", { "la", "lb" }) == "", "two names one edit away: no guess")
    check(recipe.did_you_mean("beta", { "beta1", "beta2" }) == "", "beta: beta1 or beta2: no guess")
    check(recipe.did_you_mean("eps", { "eps" }) == "", "the name itself: no guess")
  end
  bad(function(x) x.fsdp.zero = 5 end, "fsdp.zero = 5; expected 0, 1, 2 or 3")
  bad(function(x) x.optimizer.name = "lion" end, "optimizer.name = lion; expected one of 'adamw', 'sgd'")
  bad(function(x) x.data.seq = "long" end, "data.seq = long; expected an integer")
  -- ranks per GPU: a GPU of its own per task under srun --gpus-per-task=1
  local function env(t) return function(k) return t[k] end end
  for _, c in ipairs({ { 8, 8, {}, 1, "8 ranks, 8 GPUs" }, { 16, 8, {}, 2, "16 ranks on 8 GPUs share them" },
    { 8, 1, { CUDA_VISIBLE_DEVICES = "3" }, 1, "srun --gpus-per-task=1: one GPU each" },
    { 8, 1, { CUDA_VISIBLE_DEVICES = "3", FSDPRUN = "1" }, 8, "fsdprun under CUDA_VISIBLE_DEVICES=3: one GPU for 8" },
    { 8, 1, { CUDA_VISIBLE_DEVICES = "" }, 8, "an empty CUDA_VISIBLE_DEVICES binds nothing" } }) do
    local got = train.ranks_per_gpu(c[1], c[2], env(c[3]))
    check(got == c[4], string.format("ranks_per_gpu: %s: %d (got %s)", c[5], c[4], tostring(got)))
  end
  -- a warmup as long as the run is said, with the rate reached
  do
    local x = tiny()
    x.train.steps, x.schedule.warmup, x.optimizer.lr = 4, 10, 1e-3
    local w = train.warmup_warning(recipe.check(x, "x.lua")) or ""
    check(w:find("schedule.warmup = 10 is not below train.steps = 4: the learning rate rises to 0.0004 at the last step " ..
      "and never reaches optimizer.lr = 0.001", 1, true), "warmup past the run: said: " .. w)
    x.train.steps = 11
    check(train.warmup_warning(recipe.check(x, "x.lua")) == nil, "warmup inside the run: nothing said")
  end
  -- ranks sharing a GPU: refused at once (NCCL would refuse them at the
  -- first group), unless fsdprun's --ranks-per-gpu test mode is on
  check(train.gpu_sharing_refusal(1, 8, 8, env({})) == nil, "one rank per GPU: allowed")
  local why = train.gpu_sharing_refusal(2, 16, 8, env({})) or ""
  check(why:find("16 ranks on this node and 8 GPUs visible: 2 ranks would share a GPU, which NCCL refuses", 1, true) and
    why:find("fsdprun --ranks-per-gpu 2", 1, true), "two ranks per GPU: refused, naming the counts and the test mode: " .. why)
  check(train.gpu_sharing_refusal(4, 4, 1, env({ FSDPRUN_RANKS_PER_GPU = "4" })) == nil,
    "four ranks on one GPU under fsdprun --ranks-per-gpu 4: allowed")
  bad(function(x) x.train.steps = 1e30 end, "train.steps = 1e+30; expected an integer (at most 2^53 in magnitude)")
  bad(function(x) x.train.loss_chunk_mb = -1 end, "train.loss_chunk_mb = -1; expected >= 0")
  bad(function(x) x.extra = {} end, "unknown section 'extra'")
  -- a mesh dimension the trainer does not use would train unsynchronised
  -- replicas (or count ranks twice) without a word
  bad(function(x) x.mesh = "dp_shard=-1,pp=2" end, "recipes/x.lua: mesh: dimension 'pp' is not one the trainer knows")
  -- tp innermost (a tp group is consecutive ranks, one host's); sizes, not -1, but for dp_shard
  bad(function(x) x.mesh = "tp=2,dp_shard=-1" end, "mesh: 'dp_shard' comes after tp; the order is dp_outer, dp_shard, cp, tp")
  bad(function(x) x.mesh = "dp_shard=2,tp=-1" end, "mesh: tp = -1; only dp_shard takes the ranks left")
  do -- "tp=2" or "cp=2" alone: FSDP over the ranks left, as the trainer and the planner read it
    local x = tiny()
    x.mesh = "tp=2"
    check(recipe.check(x, "t.lua").mesh == "dp_shard=-1,tp=2", "mesh tp=2 reads as dp_shard=-1,tp=2")
  end
  -- a tp group across a host boundary is warned of, naming it
  local preflight = require "fsdp.preflight"
  check(preflight.tp_span(2, 8, 16, 2) == nil and preflight.tp_span(4, 8, 16, 2) == nil and preflight.tp_span(4, 6, 12, 1) == nil,
    "tp dividing the ranks per host (or one host): no warning")
  local span = preflight.tp_span(4, 6, 12, 2) or ""
  check(span:find("the tp group of ranks 4-7 spans two hosts (the host boundary is between ranks 5 and 6)", 1, true) ~= nil,
    "tp 4 with 6 ranks per host: " .. span)
  bad(function(x) x.mesh = "dp_shrad=-1" end, "mesh: dimension 'dp_shrad' is not one the trainer knows")
  bad(function(x) x.mesh = "dp_outer=2" end, "mesh: no dp_shard dimension")
  bad(function(x) x.mesh = { { "dp_shard", 1 }, { "dp_shard", -1 } } end, "mesh: dimension 'dp_shard' is given twice")
  bad(function(x) x.model = nil end, "the model section is missing")
  bad(function(x) x.data.token_file = "a.bin" end, "exactly one of corpus")
  bad(function(x) x.data.val_token_file = "v.bin" end, "data.val_token_file applies to data.token_file")
  bad(function(x) x.data.format = "raw_u32" end, "data.format applies to data.token_file")
  fails(function() recipe.apply_overrides({}, { "steps" }, "r.lua") end, "is not section.field=value", "bad override")
  fails(function() llama.config({ hidden_size = 10, intermediate_size = 4, num_attention_heads = 3, num_hidden_layers = 1, vocab_size = 5 }, nil, "r.lua: model") end,
    "r.lua: model: hidden_size 10 is not a multiple of num_attention_heads 3", "model shape error")
  fails(function() llama.config("llama4") end, "unknown preset 'llama4'", "unknown preset")
  -- hostile values: named by field before any op sees them
  local function bad_model(over, needle)
    local m = { hidden_size = 64, intermediate_size = 96, num_attention_heads = 4, num_hidden_layers = 1, vocab_size = 256 }
    for k, v in pairs(over) do m[k] = v end
    fails(function() llama.config(m, nil, "r.lua: model") end, "r.lua: model: " .. needle, needle)
  end
  bad_model({ vocab_size = 1e30 }, "vocab_size = 1e+30; expected an integer up to 2147483647")
  bad_model({ rope_theta = 0 }, "rope_theta = 0; expected > 0")
  bad_model({ rope_theta = 0 / 0 }, "rope_theta = nan; expected a finite number")
  bad_model({ rms_norm_eps = -1 }, "rms_norm_eps = -1; expected >= 0")
  bad_model({ initializer_range = math.huge }, "initializer_range = inf; expected a finite number")
  bad_model({ num_key_value_heads = 0 }, "num_key_value_heads = 0; expected >= 1")
  bad_model({ rope_scaling = { rope_type = "llama3", factor = -8, low_freq_factor = 1, high_freq_factor = 4,
    original_max_position_embeddings = 8192 } }, "rope_scaling.factor = -8; expected a finite number > 0")
  fails(function() llama.config({ hiden_size = 1 }) end, "unknown field 'hiden_size'", "misspelt HF field")
  local r2 = tiny()
  r2.train.global_batch_tokens = 1000
  fails(function() recipe.grad_accum(recipe.check(r2, "g.lua"), 2, "g.lua") end, "is not a multiple of micro_batch x seq", "global batch")
  r2.train.global_batch_tokens = 8 * 128 * 2 * 3
  check(recipe.grad_accum(r2, 2, "g.lua") == 3, "global batch tokens -> 3 micro-batches")
  r2.train.grad_accum = 3
  check(recipe.grad_accum(r2, 2, "g.lua") == 3, "grad_accum agreeing with the global batch")
  r2.train.grad_accum = 2
  fails(function() recipe.grad_accum(r2, 2, "g.lua") end, "g.lua: train.grad_accum = 2 and train.global_batch_tokens = 6144 " ..
    "disagree: 6144 tokens are 3 micro-batches of micro_batch x seq = 8 x 128 on each of 2 data-parallel ranks",
    "grad_accum against the global batch")
  bad(function(x) x.fsdp.reduce_dtype = "bf16" end, "fsdp.reduce_dtype = 'bf16' needs fsdp.param_dtype = 'bf16'")
end

-- a resume keeps its checkpoint's global batch (recipe.resume_grad_accum):
-- grad_accum takes up another world size where it divides, the run is
-- refused where it does not; the user's own batch is honoured with a
-- warning; a checkpoint without the record keeps the recipe's. Every K
-- below is worked out by hand from tokens = micro_batch x seq x K x ranks.
do
  local function rc(args) -- micro_batch 2, seq 32, the recipe's grad_accum 1
    return recipe.check(recipe.apply_overrides(tiny(), T.joined({ "data.micro_batch=2", "data.seq=32" }, args or {}), "r.lua"),
      "r.lua")
  end
  local function saved(dp, k, more) -- the meta a run of micro_batch 2, seq 32 on dp ranks with k micro-batches records
    local m = { dp = dp, world = dp, grad_accum = k, micro_batch = 2, seq = 32, global_batch_tokens = 2 * 32 * k * dp }
    for key, v in pairs(more or {}) do m[key] = v end
    return m
  end
  local function resume(args, dp, m)
    local r = rc(args)
    return recipe.resume_grad_accum(r, dp, m, { where = "r.lua", what = "ck/step-4", explicit = recipe.batch_override(r, args) })
  end
  local k, note = resume({}, 2, saved(4, 1))
  check(k == 2 and note:find("train.grad_accum 1 -> 2 keeps the global batch of ck/step-4 at 256 tokens per step on 2 " ..
    "data-parallel ranks instead of 4", 1, true), "saved on 4 ranks x 1, resumed on 2: 2 micro-batches: " .. tostring(note))
  check(resume({}, 1, saved(4, 1)) == 4, "saved on 4 ranks x 1, resumed on 1: 4")
  k, note = resume({}, 8, saved(4, 2))
  check(k == 1 and note:find("train.grad_accum 2 -> 1", 1, true), "saved on 4 ranks x 2, resumed on 8: 1: " .. tostring(note))
  k, note = resume({}, 2, saved(2, 1))
  check(k == 1 and note == nil, "the same world: the same K, nothing said")
  k, note = resume({}, 2, saved(1, 2))
  check(k == 1 and note:find("train.grad_accum 2 -> 1", 1, true), "saved on 1 rank x 2, resumed on 2: 1: " .. tostring(note))
  k, note = resume({ "data.micro_batch=1" }, 2, saved(2, 1))
  check(k == 2 and note:find("on data.micro_batch 1 instead of 2", 1, true), "half the micro-batch: twice the micro-batches")
  k, note = resume({ "data.seq=64", "data.micro_batch=1" }, 2, saved(2, 1))
  check(k == 1 and note == nil, "seq 32 -> 64 at micro_batch 2 -> 1: 2 x 32 x 1 x 2 = 1 x 64 x 1 x 2 tokens, nothing to say")
  k, note = resume({ "data.seq=64", "data.micro_batch=1" }, 2, saved(2, 2))
  check(k == 2 and note:find("train.grad_accum = 2 as ck/step-4 was trained, not the recipe's 1", 1, true),
    "seq 32 -> 64 at micro_batch 2 -> 1 from 2 micro-batches: 2 again: " .. tostring(note))
  fails(function() resume({}, 3, saved(2, 1)) end, "r.lua: train.grad_accum: ck/step-4 was trained with a global batch of 128 " ..
    "tokens per step on 2 data-parallel ranks (micro_batch x seq x grad_accum x ranks = 2 x 32 x 1 x 2); on 3 ranks one " ..
    "micro-batch is 2 x 32 x 3 = 192 tokens, which does not divide 128. It is kept on 1 or 2 ranks. Or give this run its " ..
    "own: train.grad_accum=1 (192 tokens) on the command line", "2 ranks x 1 -> 3 ranks: refused")
  fails(function() resume({}, 4, saved(2, 1)) end, "It is kept on 1 or 2 ranks, or on 4 with data.micro_batch = 1. Or",
    "2 ranks x 1 -> 4 ranks: refused, a smaller micro-batch named")
  fails(function() resume({ "data.seq=64" }, 2, saved(2, 1)) end, "256 tokens, which does not divide 128. It is kept on 1 " ..
    "rank, or on 2 with data.micro_batch = 1. Or give this run its own: train.grad_accum=1 (256 tokens)",
    "seq 32 -> 64 at the same micro-batch: refused")
  fails(function() resume({}, 2, saved(3, 1)) end, "It is kept on 1 or 3 ranks, or on 2 with data.micro_batch = 1 or 3. Or " ..
    "give this run its own: train.grad_accum=2 (256 tokens) or 1 (128 tokens) on the command line",
    "3 ranks -> 2: 192 tokens in micro-batches of 128: the two nearest named")
  -- the user's own global batch: honoured, with a warning naming both
  k, note = resume({ "train.grad_accum=1" }, 1, saved(2, 1))
  check(k == 1 and note == "warning: train.grad_accum=1 on the command line changes the global batch: 128 tokens per step " ..
    "in ck/step-4, 64 now (micro_batch x seq x grad_accum x ranks: 2 x 32 x 1 x 2 then, 2 x 32 x 1 x 1 now); " ..
    "the step count, the learning-rate schedule and the data position go on as they were",
    "train.grad_accum on the command line: honoured, with a warning: " .. tostring(note))
  k, note = resume({ "train.grad_accum=2" }, 1, saved(2, 1))
  check(k == 2 and note == nil, "train.grad_accum on the command line that keeps the global batch: nothing said")
  k, note = resume({ "train.global_batch_tokens=384" }, 2, saved(2, 1))
  check(k == 3 and note:find("warning: train.global_batch_tokens=384 on the command line changes the global batch: 128 " ..
    "tokens per step in ck/step-4, 384 now", 1, true), "train.global_batch_tokens on the command line: " .. tostring(note))
  local r = rc()
  r.train.global_batch_tokens = 256
  k, note = recipe.resume_grad_accum(r, 2, saved(2, 1), { where = "r.lua", what = "ck/step-4", explicit = recipe.batch_override(r, {}) })
  check(k == 2 and note:find("warning: train.global_batch_tokens = 256 in the recipe changes the global batch: 128", 1, true),
    "train.global_batch_tokens in the recipe: the recipe's, with a warning: " .. tostring(note))
  check(recipe.batch_override(rc({ "train.grad_accum=1" }), { "train.steps=3" }) == nil, "train.grad_accum in the recipe states no batch")
  -- the recipe's grad_accum differs from the checkpoint's, nothing else: the checkpoint's
  r = rc({ "train.grad_accum=3" })
  k, note = recipe.resume_grad_accum(r, 2, saved(2, 1), { where = "r.lua", what = "ck/step-4" })
  check(k == 1 and note:find("train.grad_accum = 1 as ck/step-4 was trained, not the recipe's 3", 1, true),
    "the recipe's grad_accum against the checkpoint's: " .. tostring(note))
  check(r.train.grad_accum == 3, "the recipe is not changed")
  -- a checkpoint saved before the record: the recipe's, as before, and a note
  k, note = resume({}, 1, { world = 2, micro_batch = 2, seq = 32, consumed = 8 })
  check(k == 1 and note:find("ck/step-4 records no global batch (saved before fsdp recorded it): this run's is the recipe's, " ..
    "64 tokens per step", 1, true) and note:find("it was saved on 2 data-parallel ranks and this run has 1", 1, true),
    "an old checkpoint: " .. tostring(note))
  check(resume({}, 2, nil) == 1, "no checkpoint: the recipe's")
end

-- the LR schedule against its formulas
do
  local o = { lr = 1.0, warmup = 10, decay = "cosine", min_lr_ratio = 0.1 }
  check(math.abs(schedule.lr(5, 110, o) - 0.5) < 1e-12, "warmup is linear")
  check(math.abs(schedule.lr(10, 110, o) - 1.0) < 1e-12, "peak at the end of warmup")
  check(math.abs(schedule.lr(60, 110, o) - 0.55) < 1e-12, "cosine halfway = (1 + 0.1) / 2")
  check(math.abs(schedule.lr(110, 110, o) - 0.1) < 1e-12, "cosine ends at min_lr_ratio")
  o.decay = "linear"
  check(math.abs(schedule.lr(60, 110, o) - 0.55) < 1e-12 and math.abs(schedule.lr(35, 110, o) - 0.775) < 1e-12, "linear")
  o.decay = "constant"
  check(schedule.lr(100, 110, o) == 1.0, "constant")
end

-- the data: byte tokens, splits, determinism, sharding, resume
do
  local ds = data.corpus({ root = root, include = { "docs/*.md" }, val_fraction = 0.1 })
  local f = io.open(root .. "/" .. ds.files[1], "rb")
  local head = f:read(16)
  f:close()
  local ok = true
  for i = 1, 16 do ok = ok and ds.tokens[i - 1] == head:byte(i) end
  check(ok and ds.vocab_size == 256, "byte-level tokens of the first file")
  check(ds.splits.train[3] == ds.n - math.floor(ds.n * 0.1), "train split is the first 90%")
  local function take(loader, k)
    local out = {}
    for _ = 1, k do
      local x, y = loader:next()
      for i = 0, x:numel() - 1 do out[#out + 1] = x:get(i) end
      check(y:get(0) == ds.tokens[0] or true, "")
      local shifted = true
      for b = 0, x.shape[1] - 1 do
        for t = 0, x.shape[2] - 2 do shifted = shifted and y:get(b * x.shape[2] + t) == x:get(b * x.shape[2] + t + 1) end
      end
      check(shifted, "y is x shifted by one")
    end
    return out
  end
  local a = take(ds:loader({ batch = 4, seq = 16, seed = 3 }), 10)
  local l1 = ds:loader({ batch = 4, seq = 16, seed = 3 })
  local b = take(l1, 5)
  local l2 = ds:loader({ batch = 4, seq = 16, seed = 3, state = l1:state() })
  for _, v in ipairs(take(l2, 5)) do b[#b + 1] = v end
  local same = #a == #b
  for i = 1, #a do same = same and a[i] == b[i] end
  check(same, "10 batches straight == 5 + resume + 5")
  -- two ranks with batch 2 cover the one-rank batch of 4, window by window
  local solo = take(ds:loader({ batch = 4, seq = 16, seed = 3 }), 1)
  local r0 = take(ds:loader({ batch = 2, seq = 16, seed = 3, rank = 0, world = 2 }), 1)
  local r1 = take(ds:loader({ batch = 2, seq = 16, seed = 3, rank = 1, world = 2 }), 1)
  local union = true
  for w = 0, 3 do
    local src = (w % 2 == 0) and r0 or r1
    local k = math.floor(w / 2)
    for t = 1, 16 do union = union and solo[w * 16 + t] == src[k * 16 + t] end
  end
  check(union, "the ranks' batches interleave into the global batch")
  fails(function() ds:loader({ batch = 1, seq = ds.n, split = "val" }) end, "fewer than one window", "window too long")
  fails(function() data.corpus({ root = root, include = { "no-such-dir/*.md" } }) end, "too few to train on", "empty corpus")
end

-- token files: llm.c headers (uint16, uint32), nanoGPT raw uint16; the
-- loader reads them through the C reader; bad files are refused at open
local function le(v, width)
  local b = {}
  for i = 1, width do b[i] = string.char(v % 256); v = math.floor(v / 256) end
  return table.concat(b)
end
local function write_tokens(path, toks, n, width, header)
  local parts = {}
  if header then
    local h = { le(header[1], 4), le(header[2], 4), le(header[3], 4) }
    parts[1] = table.concat(h) .. string.rep("\0", 1024 - 12)
  end
  for i = 0, n - 1 do parts[#parts + 1] = le(toks[i], width) end
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(parts))
  f:close()
end
do
  local ds = data.corpus({ root = root, include = { "docs/*.md" }, val_fraction = 0.1 })
  local n = math.min(ds.n, 20000)
  local big = {}
  for i = 0, n - 1 do big[i] = ds.tokens[i] * 257 + 70000 end -- above uint16, inside int32
  local p16, p32, praw = os.tmpname(), os.tmpname(), os.tmpname()
  write_tokens(p16, ds.tokens, n, 2, { 20240520, 1, n })
  write_tokens(p32, big, n, 4, { 20240801, 7, n })
  write_tokens(praw, ds.tokens, n, 2, nil)
  local function first_batch(d, seq)
    local x, y = d:loader({ batch = 2, seq = seq, seed = 5 }):next()
    return x, y
  end
  local ref = data.from_tokens(ds.tokens, n, 256, 0.1)
  local rx, ry = first_batch(ref, 32)
  for _, c in ipairs({ { p16, "auto", 1 }, { praw, "raw_u16", 1 }, { p32, "auto", 257 } }) do
    local tf = data.token_file({ path = c[1], format = c[2], val_fraction = 0.1 })
    check(tf.splits.train[3] == ref.splits.train[3] and tf.splits.val[3] == n, c[2] .. ": the same splits as the array")
    local x, y = first_batch(tf, 32)
    local same = true
    for i = 0, x:numel() - 1 do
      local add = c[3] == 257 and 70000 or 0
      same = same and x:get(i) == rx:get(i) * c[3] + add and y:get(i) == ry:get(i) * c[3] + add
    end
    check(same, c[2] .. " (" .. (c[3] == 257 and "uint32" or "uint16") .. "): the loader's batches equal the array's")
    tf:close()
  end
  local tv = data.token_file({ path = p16, val_path = p16 })
  check(tv.splits.train[3] == n and tv.splits.val[3] == n, "val_path: the whole first file trains, the second validates")
  local podd = os.tmpname()
  write_tokens(podd, ds.tokens, 3, 2, nil)
  fails(function() data.token_file({ path = podd, format = "raw_u32" }) end, "not a multiple", "raw_u32 of 6 bytes")
  os.remove(podd)
  fails(function() data.token_file({ path = praw }) end, "bad magic", "a headerless file read as auto")
  fails(function() data.token_file({ path = p16, format = "u8" }) end, "expected auto, raw_u16 or raw_u32", "unknown format")
  fails(function() data.token_file({ path = "/no/such.bin" }) end, "cannot open", "missing file")
  write_tokens(p32, big, n - 1, 4, { 20240801, 7, n })
  fails(function() data.token_file({ path = p32 }) end, "truncated", "truncated file")
  -- the trainer on a token file: the same losses as on the same bytes as a corpus
  local rc = tiny()
  local toks_path = os.tmpname()
  local full = data.corpus({ root = root, include = rc.data.corpus.include, val_fraction = 0.1 })
  write_tokens(toks_path, full.tokens, full.n, 2, { 20240520, 1, full.n })
  local args = { "train.steps=3", "train.log_every=10", "data.seq=32", "data.micro_batch=2", "model.num_hidden_layers=1" }
  local a = train.run(tiny(), "corpus.lua", args)
  args[#args + 1] = "data.token_file=" .. toks_path -- replaces the recipe's corpus
  local b = train.run(tiny(), "tokens.lua", args)
  local same = true
  for s = 1, 3 do same = same and a.losses[s] == b.losses[s] end
  check(same, string.format("training on the token file repeats the corpus run's losses (%.6f %.6f)", a.losses[3], b.losses[3]))
  -- fsdp.overlap_step=true (each unit's step at its next use) from the
  -- command line: the losses of the step at once, bit for bit
  local o = train.run(tiny(), "overlap.lua", T.joined(args, { "fsdp.overlap_step=true" }))
  same = true
  for s = 1, 3 do same = same and o.losses[s] == b.losses[s] end
  check(same, string.format("fsdp.overlap_step=true repeats the losses (%.6f %.6f)", o.losses[3], b.losses[3]))
  -- splits shorter than one window: refused before the first step, naming
  -- the split and the way out (the val split failed at the first
  -- evaluation, after training, with a traceback)
  local short = { "data.token_file=" .. toks_path, "data.seq=32", "model.num_hidden_layers=1", "train.steps=3" }
  -- each refused with a message that starts with the recipe and holds `says`
  local function refused(extra, where, says, what)
    local ok, err = pcall(train.run, tiny(), where, T.joined(short, extra))
    err = tostring(err)
    check(not ok and err:find(where .. ": ", 1, true) == 1 and err:find(says, 1, true) ~= nil, what .. ": " .. err)
  end
  -- a val split of about 32 tokens (33 needed), then a train split of about 16
  refused({ "train.eval_every=2", "data.val_fraction=" .. string.format("%.17g", 32 / full.n) }, "v.lua",
    "fewer than one window of data.seq + 1 = 33; train.eval_every = 2 evaluates on it", "a val split too short")
  refused({ "train.eval_every=0", "data.val_fraction=" .. string.format("%.17g", 1 - 16 / full.n) }, "s.lua",
    "the train split has ", "a train split too short")
  for _, p in ipairs({ p16, p32, praw, toks_path }) do os.remove(p) end
end

-- the pre-flight check refuses what cannot fit, naming the numbers
do
  local r = tiny()
  r.model = { preset = "llama3_70b" }
  r.fsdp.zero = 0
  -- beyond the machine by arithmetic alone (the fp32 weights and AdamW state)
  fails(function() train.run(r, "big.lua", {}) end, "big.lua: the model has 70.55G parameters: its fp32 weights and adamw " ..
    "state alone need " .. string.format("%.1f", 70.55e9 * 12 / W / 2 ^ 30):sub(1, 3), "70B on CPU ranks is refused before planning")
  -- beyond it by the plan (the activations of 65536 x 128 tokens per micro-batch)
  fails(function() train.run(tiny(), "act.lua", { "data.micro_batch=65536" }) end, "act.lua: this recipe needs",
    "a plan beyond the machine is refused, with its parts")
  -- a mesh the world cannot hold: the recipe's mistake, named by its file, no position inside fsdp
  local okm, errm = pcall(train.run, tiny(), "m.lua", { "mesh=dp_shard=3" })
  check(not okm and tostring(errm):find("^m.lua: mesh: dp_shard=3 has 3 ranks but the world has %d") ~= nil
    and not tostring(errm):find("train.lua", 1, true), "a mesh larger than the world: " .. tostring(errm))
  -- a checkpoint.dir that cannot be made: refused before the first step, not at the first save
  fails(function() train.run(tiny(), "ck.lua", { "checkpoint.dir=/proc/fsdp-no-such/ck", "train.steps=2" }) end,
    "ck.lua: checkpoint.dir: cannot create '/proc/fsdp-no-such/ck'", "an unusable checkpoint.dir stops the run at its start")
  -- a token file that is not one: named by the recipe, no position inside fsdp
  local okd, errd = pcall(train.run, tiny(), "d.lua", { "data.token_file=/etc/passwd" })
  check(not okd and tostring(errd):find("^d.lua: data.token_file: token file '/etc/passwd': bad magic") ~= nil,
    "a file that is not a token file: " .. tostring(errd))
  check(math.abs(llama.num_params(llama.config("llama3_70b")) / 70.55e9 - 1) < 1e-3, "70B has 70.55B parameters")
  check(math.abs(llama.num_params(llama.config("llama3_8b")) / 8.03e9 - 1) < 1e-3, "8B has 8.03B parameters")
end

-- the demo recipe, shortened to 20 steps (its schedule follows: 3.5 at the
-- end on 2026-11-27): the loss falls well below ln 256 and the
-- metrics file has a line per step and the eval lines; each step's mfu is
-- the model FLOPs over the step time and train.peak_tflops (all W ranks
-- share this machine's peak), within 1e-12 relative
do
  local path = os.tmpname()
  local r = tiny()
  local out = train.run(r, root .. "/recipes/tiny.lua", { "train.steps=20", "train.eval_every=10", "train.log_every=10",
    "train.metrics=" .. path, "train.peak_tflops=0.04" })
  check(out.first_loss > 5.0 and out.last_loss < 4.0, string.format("the loss falls: %.3f -> %.3f", out.first_loss, out.last_loss))
  check(math.abs(out.peak.flops - 0.04e12 / W) <= 1e-12 * out.peak.flops, "train.peak_tflops, shared by the machine's ranks")
  if R == 0 then
    local steps, evals, mfu_ok = 0, 0, true
    local tokens_step = r.data.micro_batch * r.data.seq * W
    for line in io.lines(path) do
      if line:match('^{"step":%d+,.*"loss":[%d.e+-]+') then
        steps = steps + 1
        local mfu, dt = tonumber(line:match('"mfu":([%d.e+-]+)')), tonumber(line:match('"step_time_s":([%d.e+-]+)'))
        local want = out.flops_per_token * tokens_step / W / dt / (0.04e12 / W)
        mfu_ok = mfu_ok and mfu and math.abs(mfu - want) <= 1e-12 * want and line:match('"gemm_frac":[%d.e+-]+') ~= nil
      end
      if line:match('"val_loss":') then evals = evals + 1 end
    end
    check(steps == 20 and evals == 2, "metrics: 20 step lines and 2 eval lines")
    check(mfu_ok, "metrics: mfu = model FLOPs / (step time x peak), and a gemm_frac")
  end
  os.remove(path)
  fails(function() recipe.check(recipe.apply_overrides(tiny(), { "train.peak_tflops=0" }, "p.lua"), "p.lua") end,
    "p.lua: train.peak_tflops = 0; expected > 0", "a peak of 0")
end

-- without train.peak_tflops a CPU rank divides by this machine's peak (fsdp.peak)
do
  local cpu = require("fsdp.peak").this_cpu()
  local out = train.run(tiny(), "t.lua", { "train.steps=1", "data.seq=32", "data.micro_batch=2", "model.num_hidden_layers=1" })
  if cpu then
    check(math.abs(out.peak.flops - cpu.flops / W) <= 1e-12 * cpu.flops, "the CPU's peak / the machine's ranks")
  else -- a CPU fsdp.peak does not know (not x86): no MFU rather than a made-up one
    check(out.peak.flops == nil, "no CPU peak: no MFU")
  end
end

-- a CPU job never opens the CUDA backend (libfsdp_cuda.so: CUDA runtime,
-- cuBLASLt, NCCL, cuDNN): its ranks start faster and map ~150 MB less
do
  local mapped = {}
  for line in io.lines("/proc/self/maps") do
    local lib = line:match("/(lib[%w_]*cuda[%w_]*%.so[%w.]*)$") or line:match("/(libnccl%.so[%w.]*)$") or
      line:match("/(libcublas[%w]*%.so[%w.]*)$") or line:match("/(libcudnn[%w_]*%.so[%w.]*)$")
    if lib then mapped[lib] = true end
  end
  local names = {}
  for k in pairs(mapped) do names[#names + 1] = k end
  table.sort(names)
  check(#names == 0, "a CPU job maps no CUDA library (mapped: " .. table.concat(names, ", ") .. ")")
end

-- the real models' recipes are valid and describe the published shapes
-- (after the check above: asking for a GPU opens the CUDA backend)
do
  for _, f in ipairs({ "llama3_8b", "llama70b" }) do
    local r = recipe.load(root .. "/recipes/" .. f .. ".lua", {})
    local cfg = llama.config(r.model.preset)
    check(r.fsdp.zero == 3 and r.fsdp.param_dtype == "bf16" and r.train.device == "cuda", f .. ": zero 3, bf16, cuda")
    check(recipe.grad_accum(r, f == "llama70b" and 128 or 8, f) >= 1, f .. ": the global batch divides")
    if C.fsdp_device_available(C.FSDP_CUDA) ~= 1 then
      fails(function() train.run(r, f .. ".lua", {}) end, "no CUDA device can be used here", f .. ": refused without a GPU, with the reason")
      fails(function() train.run(r, f .. ".lua", {}) end, "GiB per rank on", f .. ": ... and the planned memory")
    end
    check(cfg.num_key_value_heads == 8 and cfg.vocab_size == 128256, f .. ": GQA 8 kv heads, 128256 vocab")
  end
end

collectgarbage()
T.finish()

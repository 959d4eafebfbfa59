-- fsdp.recipe: a training recipe is a Lua file that returns a table of
-- sections (model, mesh, fsdp, optimizer, schedule, data, train). This
-- module fills in defaults, applies command-line overrides
-- (train.steps=50 data.seq=64) and checks every field, so that a mistake is
-- reported with the recipe file, the field and what was expected.
local mesh = require "fsdp.mesh"

local M = {}

-- section -> field -> {kind, default}; kind: "int", "number", "string",
-- "boolean", "table", "any", or a list of allowed values
M.schema = {
  model = {}, -- Hugging Face LlamaConfig fields plus `preset` and `from_hf`; checked by fsdp.hf_config.model
  mesh = nil, -- "dp_shard=-1" (the default), "dp_outer=2,dp_shard=-1", or a list of {name, size}
  fsdp = {
    zero = { "int", 3 }, units = { "any", "default" }, prefetch = { "int", 1 }, max_live_units = { "int", 2 },
    meta_init = { "boolean", true }, checkpoint = { "any", "none" }, recompute = { { "light", "mlp", "none" }, "light" },
    hfsdp = { "boolean", false },
    param_dtype = { { "fp32", "bf16" }, "fp32" }, reduce_dtype = { { "fp32", "bf16" }, "fp32" },
    offload = { "any", false }, comm_register = { { "none", "buffer", "window" }, "none" },
    separate_reduce = { "boolean", true }, overlap_step = { "boolean", nil },
  },
  optimizer = {
    name = { { "adamw", "sgd" }, "adamw" }, lr = { "number", 3e-4 }, beta1 = { "number", 0.9 }, beta2 = { "number", 0.95 },
    eps = { "number", 1e-8 }, weight_decay = { "number", 0.1 }, clip = { "number", 1.0 }, momentum = { "number", 0.9 },
  },
  schedule = {
    warmup = { "int", 0 }, decay = { { "cosine", "linear", "constant" }, "cosine" }, min_lr_ratio = { "number", 0.1 },
  },
  data = {
    corpus = { "table", nil }, token_file = { "string", nil }, val_token_file = { "string", nil },
    format = { { "auto", "raw_u16", "raw_u32" }, "auto" }, val_fraction = { "number", 0.1 },
    seq = { "int", 256 }, micro_batch = { "int", 8 }, pack = { "boolean", nil }, split_long = { "boolean", true },
    max_tokens = { "int", nil },
  },
  train = {
    steps = { "int", 100 }, grad_accum = { "int", 1 }, global_batch_tokens = { "int", nil }, seed = { "int", 1234 },
    eval_every = { "int", 0 }, eval_batches = { "int", 4 }, log_every = { "int", 1 }, metrics = { "string", nil },
    tensorboard = { "string", nil },
    device = { { "cpu", "cuda" }, "cpu" }, min_free_fraction = { "number", 0.9 }, resume = { "string", nil },
    stop_after = { "int", nil }, loss_chunk_mb = { "number", 256 }, peak_tflops = { "number", nil },
    max_bad_steps = { "int", 5 }, profile = { "string", nil }, profile_step = { "int", nil },
    sample_tokens = { "int", 0 }, sample_prompt = { "string", nil }, sample_temperature = { "number", 0.8 },
    attention = { { "auto", "cudnn", "own" }, "auto" }, cp_attention = { { "all_gather", "ring" }, "all_gather" },
    tp_overlap = { "boolean", true },
  },
  -- docs/CHECKPOINTS.md
  checkpoint = {
    dir = { "string", nil }, every = { "int", 0 }, keep_last = { "int", 3 }, async = { "boolean", true },
    export_hf = { "string", nil }, export_dtype = { { "bf16", "fp32" }, "bf16" }, export_shard_mb = { "number", 5000 },
    init_hf = { "any", nil }, overwrite = { "boolean", false },
  },
}

-- data.corpus's own fields (fsdp.data.corpus)
M.corpus_schema = { root = { "string", nil }, include = { "table", nil }, val_fraction = { "number", nil } }

local sections = { "model", "mesh", "fsdp", "optimizer", "schedule", "data", "train", "checkpoint" }

-- A recipe table copied all the way down (functions and other values
-- shared), so that overrides applied to the copy leave the original as it is.
function M.copy(v)
  if type(v) ~= "table" then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = M.copy(x) end
  return c
end

local function fail(where, fmt, ...) error(where .. ": " .. string.format(fmt, ...), 0) end

local function describe(kind)
  if type(kind) == "table" then return "one of '" .. table.concat(kind, "', '") .. "'" end
  return ({ int = "an integer (at most 2^53 in magnitude)", number = "a finite number", string = "a string", boolean = "true or false", table = "a table" })[kind] or kind
end

local function ok_kind(kind, v)
  if kind == "any" then return true end
  if type(kind) == "table" then
    for _, a in ipairs(kind) do if v == a then return true end end
    return false
  end
  -- inf and nan are never meant (lr = inf trains NaN from the second step)
  -- integers past 2^53 are not exact in a double (train.steps = 1e30 would
  -- count steps that cannot be told apart)
  if kind == "int" then return type(v) == "number" and v % 1 == 0 and math.abs(v) <= 2 ^ 53 end
  if kind == "number" then return type(v) == "number" and v == v and math.abs(v) ~= math.huge end
  return type(v) == kind
end

-- "a.b=value" strings -> sets t.a.b, the value read as a number, boolean or string
function M.apply_overrides(r, args, where)
  for _, a in ipairs(args or {}) do
    local key, val = tostring(a):match("^([%a_][%w_.]*)=(.*)$")
    if not key then fail(where, "argument '%s' is not section.field=value (e.g. train.steps=50)", tostring(a)) end
    local v
    if val == "true" then v = true elseif val == "false" then v = false else v = tonumber(val) or val end
    local t, parts = r, {}
    for p in key:gmatch("[^.]+") do parts[#parts + 1] = p end
    for i = 1, #parts - 1 do
      if t[parts[i]] == nil then t[parts[i]] = {} end
      if type(t[parts[i]]) ~= "table" then fail(where, "override '%s': %s is not a section", a, parts[i]) end
      t = t[parts[i]]
    end
    t[parts[#parts]] = v
    -- the two data sources exclude each other: the command line's wins
    if key == "data.token_file" and type(r.data) == "table" then r.data.corpus = nil end
  end
  return r
end

-- Whether a and b are one edit apart: a letter added, removed, changed, or
-- two neighbours swapped ("stpes" for "steps").
local function one_edit(a, b)
  if a == b or math.abs(#a - #b) > 1 then return false end
  local i = 1
  while i <= #a and i <= #b and a:sub(i, i) == b:sub(i, i) do i = i + 1 end
  local ra, rb = a:sub(i), b:sub(i)
  return ra:sub(2) == rb:sub(2) or ra:sub(2) == rb or ra == rb:sub(2) or
    (#ra >= 2 and ra:sub(1, 1) == rb:sub(2, 2) and ra:sub(2, 2) == rb:sub(1, 1) and ra:sub(3) == rb:sub(3))
end

-- " (did you mean 'x'?)" when exactly one of names is one edit from name
function M.did_you_mean(name, names)
  local near = {}
  for _, n in ipairs(names) do
    if one_edit(tostring(name), n) then near[#near + 1] = n end
  end
  return #near == 1 and string.format(" (did you mean '%s'?)", near[1]) or ""
end

-- t's fields against schema (unknown ones and kinds refused, naming
-- prefix.field), defaults filled in
local function check_fields(t, schema, prefix, where)
  for k, v in pairs(t) do
    local f = schema[k]
    if not f then
      local names = {}
      for n in pairs(schema) do names[#names + 1] = n end
      table.sort(names)
      fail(where, "%s.%s: unknown field%s (%s has: %s)", prefix, tostring(k), M.did_you_mean(k, names), prefix,
        table.concat(names, ", "))
    end
    if not ok_kind(f[1], v) then fail(where, "%s.%s = %s; expected %s", prefix, k, tostring(v), describe(f[1])) end
  end
  for k, f in pairs(schema) do
    if t[k] == nil then t[k] = f[2] end
  end
end

-- a number field inside [lo, hi] (open ends where lo_open / hi_open)
local function in_range(where, name, v, lo, hi, lo_open, hi_open, why)
  if v == nil then return end
  if (lo and (v < lo or (lo_open and v == lo))) or (hi and (v > hi or (hi_open and v == hi))) then
    fail(where, "%s = %s; expected %s%s, %s%s%s", name, tostring(v), lo_open and "(" or "[", lo and tostring(lo) or "-inf",
      hi and tostring(hi) or "inf", hi_open and ")" or "]", why and " (" .. why .. ")" or "")
  end
end

-- The trainer's mesh: dp_outer (HSDP replicas), dp_shard (FSDP's shards),
-- cp (context parallelism: FSDP shards over dp_shard x cp) and tp (tensor
-- parallelism), in that order:
-- the first outermost, so a tp group is consecutive ranks (one host's,
-- where ranks per host is a multiple of tp). Any other dimension would
-- split the ranks into groups that never exchange grads (two ranks of
-- "dp_shard=-1,foo=2" trained two models) or count ranks twice, so it is
-- refused. Returns the dimensions as fsdp.mesh reads them ({{name, size}, ...}).
local mesh_order = { dp_outer = 1, dp_shard = 2, cp = 3, tp = 4 }
function M.check_mesh(m, where)
  local ok, dims = pcall(mesh.parse_dims, m)
  if not ok then fail(where, "mesh: %s", (tostring(dims):gsub("^.-fsdp%.mesh: ", ""))) end
  local seen, last = {}, 0
  for _, d in ipairs(dims) do
    local n = d[1]
    if not mesh_order[n] then
      fail(where, "mesh: dimension '%s' is not one the trainer knows: dp_outer (HSDP replicas), dp_shard (FSDP's " ..
        "shards), cp (context parallelism) and tp (tensor parallelism), e.g. 'dp_shard=-1' or 'dp_shard=-1,tp=2'", tostring(n))
    end
    if seen[n] then fail(where, "mesh: dimension '%s' is given twice", n) end
    if mesh_order[n] < last then
      fail(where, "mesh: '%s' comes after %s; the order is dp_outer, dp_shard, cp, tp (tp innermost: a tp group is " ..
        "consecutive ranks, on one host)", n, dims[1][1])
    end
    if n ~= "dp_shard" and d[2] == -1 then
      fail(where, "mesh: %s = -1; only dp_shard takes the ranks left (-1), give %s a size", n, n)
    end
    seen[n], last = true, mesh_order[n]
  end
  if not seen.dp_shard and not seen.dp_outer and (seen.cp or seen.tp) then -- ("tp=2": FSDP over the ranks left)
    table.insert(dims, 1, { "dp_shard", -1 })
    seen.dp_shard = true
  end
  if not seen.dp_shard then
    fail(where, "mesh: no dp_shard dimension (the ranks each unit is sharded over); e.g. 'dp_outer=2,dp_shard=-1', " ..
      "or 'dp_outer=2,dp_shard=1' for plain replicas")
  end
  return dims
end

-- the mesh as fsdp.mesh takes it, from check_mesh's dimensions
function M.mesh_spec(dims)
  local parts = {}
  for _, d in ipairs(dims) do parts[#parts + 1] = d[1] .. "=" .. d[2] end
  return table.concat(parts, ",")
end

-- a mesh's size of dimension `name` (1 when it has none; -1 as given)
function M.mesh_size(m, name)
  for _, d in ipairs(mesh.parse_dims(m)) do if d[1] == name then return d[2] end end
  return 1
end

-- The recipe with defaults filled in; errors name "FILE: section.field".
function M.check(r, where)
  if type(r) ~= "table" then fail(where, "a recipe must return a table of sections (%s), got %s", table.concat(sections, ", "), type(r)) end
  local known = {}
  for _, s in ipairs(sections) do known[s] = true end
  for k in pairs(r) do
    if not known[k] then
      fail(where, "unknown section '%s'%s (expected %s)", tostring(k), M.did_you_mean(k, sections), table.concat(sections, ", "))
    end
  end
  if r.model == nil then fail(where, "the model section is missing (e.g. model = {preset = 'llama3_8b'})") end
  if type(r.model) ~= "table" then fail(where, "model must be a table, got %s", type(r.model)) end
  r.mesh = r.mesh or "dp_shard=-1"
  if type(r.mesh) ~= "string" and type(r.mesh) ~= "table" then fail(where, "mesh must be a string like 'dp_outer=2,dp_shard=-1'") end
  r.mesh = M.mesh_spec(M.check_mesh(r.mesh, where))
  -- (what the recipe itself says of the micro-batch's shape, before defaults: data.max_tokens sets it)
  local given = type(r.data) == "table" and { seq = r.data.seq, micro_batch = r.data.micro_batch } or {}
  for _, s in ipairs(sections) do
    local schema = M.schema[s]
    if schema and s ~= "model" then
      r[s] = r[s] or {}
      if type(r[s]) ~= "table" then fail(where, "%s must be a table, got %s", s, type(r[s])) end
      check_fields(r[s], schema, s, where)
    end
  end
  local f, o, d, t = r.fsdp, r.optimizer, r.data, r.train
  if f.zero < 0 or f.zero > 3 then fail(where, "fsdp.zero = %d; expected 0, 1, 2 or 3", f.zero) end
  if f.reduce_dtype == "bf16" and f.param_dtype ~= "bf16" then
    fail(where, "fsdp.reduce_dtype = 'bf16' needs fsdp.param_dtype = 'bf16' (fp32 params reduce their grads in fp32)")
  end
  if f.prefetch < 0 then fail(where, "fsdp.prefetch = %d; expected >= 0", f.prefetch) end
  if f.max_live_units < 1 then fail(where, "fsdp.max_live_units = %d; expected >= 1", f.max_live_units) end
  if not f.meta_init then fail(where, "fsdp.meta_init = false: the engine always initialises each rank's shard only (meta init); leave it true") end
  local ck = f.checkpoint
  if ck ~= "none" and ck ~= "full" and not (type(ck) == "number" and ck >= 1 and ck % 1 == 0) then
    fail(where, "fsdp.checkpoint = %s; expected 'none', 'full' or k >= 1 (every k-th layer)", tostring(ck))
  end
  local u = f.units
  if type(u) ~= "string" and type(u) ~= "table" and type(u) ~= "function" then
    fail(where, "fsdp.units = %s; expected 'default', a list of module kinds, a function(module, path, info) or the path " ..
      "of a Lua file returning one (recipes/policies/)", tostring(u))
  end
  if o.lr <= 0 then fail(where, "optimizer.lr = %g; expected > 0", o.lr) end
  in_range(where, "optimizer.beta1", o.beta1, 0, 1, false, true)
  in_range(where, "optimizer.beta2", o.beta2, 0, 1, false, true)
  in_range(where, "optimizer.eps", o.eps, 0, nil, true, false)
  in_range(where, "optimizer.weight_decay", o.weight_decay, 0, nil)
  in_range(where, "optimizer.momentum", o.momentum, 0, 1, false, true)
  in_range(where, "schedule.min_lr_ratio", r.schedule.min_lr_ratio, 0, 1, false, false,
    "the final learning rate as a fraction of optimizer.lr")
  in_range(where, "train.min_free_fraction", t.min_free_fraction, 0, 1, true, false,
    "the share of the free memory the pre-flight check may plan for")
  if t.eval_batches < 1 then
    fail(where, "train.eval_batches = %d; expected >= 1 (validation batches per evaluation; train.eval_every = 0 turns " ..
      "evaluation off)", t.eval_batches)
  end
  if t.eval_every < 0 then fail(where, "train.eval_every = %d; expected >= 0 (0: no evaluation)", t.eval_every) end
  if t.sample_tokens < 0 then
    fail(where, "train.sample_tokens = %d; expected >= 0 (tokens of text printed at each evaluation; 0: none)", t.sample_tokens)
  end
  if not (t.sample_temperature >= 0 and t.sample_temperature < math.huge) then
    fail(where, "train.sample_temperature = %s; expected a number >= 0 (0: greedy)", tostring(t.sample_temperature))
  end
  if t.profile_step and t.profile_step < 1 then
    fail(where, "train.profile_step = %d; expected >= 1 (the step whose timeline train.profile writes)", t.profile_step)
  end
  if t.profile_step and not t.profile then
    fail(where, "train.profile_step = %d without train.profile (the file the step's timeline is written to)", t.profile_step)
  end
  if t.max_bad_steps < 1 then
    fail(where, "train.max_bad_steps = %d; expected >= 1 (skipped steps in a row that stop the run)", t.max_bad_steps)
  end
  if t.global_batch_tokens and t.global_batch_tokens < 1 then
    fail(where, "train.global_batch_tokens = %d; expected >= 1", t.global_batch_tokens)
  end
  if d.corpus then
    check_fields(d.corpus, M.corpus_schema, "data.corpus", where)
    local inc = d.corpus.include
    if inc ~= nil then
      if #inc == 0 then fail(where, "data.corpus.include: expected a non-empty list of file patterns like 'docs/*.md'") end
      for i, pat in ipairs(inc) do
        if type(pat) ~= "string" then fail(where, "data.corpus.include[%d] = %s; expected a file pattern (a string)", i, tostring(pat)) end
      end
    end
    in_range(where, "data.corpus.val_fraction", d.corpus.val_fraction, 0, 1, false, true)
  end
  if o.clip < 0 then fail(where, "optimizer.clip = %g; expected >= 0 (0: no clipping)", o.clip) end
  if r.schedule.warmup < 0 then fail(where, "schedule.warmup = %d; expected >= 0", r.schedule.warmup) end
  if d.seq < 2 then fail(where, "data.seq = %d; expected >= 2", d.seq) end
  if d.micro_batch < 1 then fail(where, "data.micro_batch = %d; expected >= 1", d.micro_batch) end
  if (d.corpus == nil) == (d.token_file == nil) then fail(where, "data: give exactly one of corpus = {...} or token_file = 'path'") end
  if d.corpus and (d.val_token_file or d.format ~= "auto") then -- (they would be ignored)
    fail(where, "data.%s applies to data.token_file; a corpus keeps its last data.val_fraction for evaluation and is " ..
      "read as bytes", d.val_token_file and "val_token_file" or "format")
  end
  if d.val_fraction < 0 or d.val_fraction >= 1 then fail(where, "data.val_fraction = %g; expected in [0, 1)", d.val_fraction) end
  if d.max_tokens then -- a token budget per micro-batch: one packed row of that many tokens
    if d.max_tokens < 2 then fail(where, "data.max_tokens = %d; expected >= 2 (tokens per micro-batch)", d.max_tokens) end
    if (given.seq and given.seq ~= d.max_tokens) or (given.micro_batch and given.micro_batch ~= 1) then
      fail(where, "data.max_tokens = %d sets each micro-batch to one packed row of %d tokens: leave data.seq (%s) and " ..
        "data.micro_batch (%s) out", d.max_tokens, d.max_tokens, tostring(given.seq), tostring(given.micro_batch))
    end
    if d.pack == false then fail(where, "data.max_tokens packs documents into rows: it cannot go with data.pack = false") end
    if not d.token_file then fail(where, "data.max_tokens packs documents from data.token_file (`fsdp prepare`'s index)") end
    d.seq, d.micro_batch, d.pack = d.max_tokens, 1, true
  end
  if d.corpus and d.pack then -- (its bytes have no document index)
    fail(where, "data.pack applies to data.token_file (documents from `fsdp prepare`'s index); a corpus is one stream")
  end
  if t.steps < 1 then fail(where, "train.steps = %d; expected >= 1", t.steps) end
  if t.grad_accum < 1 then fail(where, "train.grad_accum = %d; expected >= 1", t.grad_accum) end
  if t.log_every < 1 then fail(where, "train.log_every = %d; expected >= 1", t.log_every) end
  if t.stop_after and t.stop_after < 1 then fail(where, "train.stop_after = %d; expected >= 1", t.stop_after) end
  if t.peak_tflops and not (t.peak_tflops > 0) then
    fail(where, "train.peak_tflops = %g; expected > 0 (one device's peak in TFLOP/s, the MFU's denominator)", t.peak_tflops)
  end
  if t.loss_chunk_mb < 0 then
    fail(where, "train.loss_chunk_mb = %g; expected >= 0 (MiB of logits per chunk of the fused head and loss; 0: all at once)",
      t.loss_chunk_mb)
  end
  local ck = r.checkpoint
  if ck.every < 0 then fail(where, "checkpoint.every = %d; expected >= 0 (0: only at the end)", ck.every) end
  if ck.keep_last < 0 then fail(where, "checkpoint.keep_last = %d; expected >= 0 (0: keep all)", ck.keep_last) end
  if ck.export_shard_mb <= 0 then fail(where, "checkpoint.export_shard_mb = %g; expected > 0", ck.export_shard_mb) end
  if ck.init_hf ~= nil and ck.init_hf ~= false and type(ck.init_hf) ~= "string" then
    fail(where, "checkpoint.init_hf = %s; expected the path of a Hugging Face folder, or false (with model.from_hf: " ..
      "its architecture, not its weights)", tostring(ck.init_hf))
  end
  if ck.every > 0 and not ck.dir then fail(where, "checkpoint.every = %d needs checkpoint.dir", ck.every) end
  if t.resume == "auto" and not ck.dir then fail(where, "train.resume = 'auto' needs checkpoint.dir (where to look)") end
  local cp = M.mesh_size(r.mesh, "cp")
  if cp > 1 then -- (context parallelism: each rank its chunks of whole rows, plain or packed)
    local why = require("fsdp.cp").check(d.seq, cp)
    if why then fail(where, "mesh: cp = %d: %s", cp, why) end
    if t.loss_chunk_mb == 0 then
      fail(where, "mesh: cp = %d: train.loss_chunk_mb = 0 (the whole logits) with context parallelism is not built; " ..
        "give it > 0", cp)
    end
  end
  return r
end

-- Loads FILE (a Lua chunk returning the recipe), applies overrides, checks.
function M.load(path, args)
  local chunk, err = loadfile(path)
  if not chunk then error(err, 0) end
  local ok, r = pcall(chunk)
  if not ok then error(path .. ": " .. tostring(r), 0) end
  M.apply_overrides(r, args, path)
  return M.check(r, path)
end

-- Micro-batches per step: train.global_batch_tokens when given (it must
-- divide into micro-batches of data.micro_batch x data.seq on every
-- data-parallel rank, and agree with a train.grad_accum given too), else
-- train.grad_accum.
function M.grad_accum(r, dp, where)
  local t, d = r.train, r.data
  if not t.global_batch_tokens then return t.grad_accum end
  local per = d.micro_batch * d.seq * dp
  local k = t.global_batch_tokens / per
  if k < 1 or k % 1 ~= 0 then
    fail(where, "train.global_batch_tokens = %d is not a multiple of micro_batch x seq x data-parallel ranks = %d x %d x %d = %d",
      t.global_batch_tokens, d.micro_batch, d.seq, dp, per)
  end
  -- both given and disagreeing: neither silently wins (1 is grad_accum's default)
  if t.grad_accum ~= 1 and t.grad_accum ~= k then
    fail(where, "train.grad_accum = %d and train.global_batch_tokens = %d disagree: %d tokens are %d micro-batch%s of " ..
      "micro_batch x seq = %d x %d on each of %d data-parallel ranks; give one of the two", t.grad_accum,
      t.global_batch_tokens, t.global_batch_tokens, k, k == 1 and "" or "es", d.micro_batch, d.seq, dp)
  end
  return k
end

-- Whether this run states its own global batch, and where: train.grad_accum
-- or train.global_batch_tokens on the command line (args), or
-- train.global_batch_tokens in the recipe. A recipe's train.grad_accum is
-- not such a statement: it is the global batch's share of one world size.
-- Returns a description for the log ("train.grad_accum=4 on the command
-- line"), or nil.
function M.batch_override(r, args)
  local said
  for _, a in ipairs(args or {}) do
    local key = tostring(a):match("^(train%.[%a_]+)=")
    if key == "train.grad_accum" or key == "train.global_batch_tokens" then said = tostring(a) end
  end
  if said then return said .. " on the command line" end
  if r.train.global_batch_tokens then
    return string.format("train.global_batch_tokens = %d in the recipe", r.train.global_batch_tokens)
  end
  return nil
end

local function plural(n, one, many) return string.format("%d %s", n, n == 1 and one or (many or one .. "s")) end

-- "2 x 32 x 4 x 2" and the tokens they make
local function shape(B, T, K, dp) return string.format("%d x %d x %d x %d", B, T, K, dp), B * T * K * dp end

-- the divisors of n (an integer >= 1) as a list for a message: "1, 2 or
-- 4", the first `cap` and "..." when there are more
local function divisors(n, cap)
  local low, high = {}, {}
  for d = 1, math.floor(math.sqrt(n) + 0.5) do
    if d * d <= n and n % d == 0 then
      low[#low + 1] = d
      if d * d ~= n then table.insert(high, 1, n / d) end
    end
  end
  for _, d in ipairs(high) do low[#low + 1] = d end
  local more = #low > cap
  local out = {}
  for i = 1, math.min(#low, cap) do out[i] = string.format("%d", low[i]) end
  if more then return table.concat(out, ", ") .. ", ..." end
  return #out == 1 and out[1] or table.concat(out, ", ", 1, #out - 1) .. " or " .. out[#out]
end

local dims = "micro_batch x seq x grad_accum x ranks"

-- Micro-batches per step of a run resumed from a checkpoint on dp
-- data-parallel ranks. saved: the checkpoint's meta (global_batch_tokens,
-- grad_accum, dp or world, micro_batch, seq), nil for a new run;
-- o = {where = recipe file, what = the checkpoint's path, explicit =
-- M.batch_override's}. Returns K and a line for the log (a warning starts
-- "warning: "), or nil. r is not changed.
--   * The checkpoint's global batch (tokens per optimizer step = micro_batch
--     x seq x grad_accum x data-parallel ranks) is kept: grad_accum takes up
--     another number of ranks (or another data.micro_batch or data.seq)
--     where it divides, and the run is refused where it does not, naming
--     both and what would keep it. A step then takes the same windows
--     (micro_batch x grad_accum x ranks of them, however they are split),
--     so the data position, the step counter and the LR schedule go on as
--     they were and only the fp32 summation order differs.
--   * A run that states its own (o.explicit: the user asked) gets it; the
--     line is then a warning with the old and the new global batch.
--   * A checkpoint saved before fsdp recorded its global batch: the
--     recipe's, as before, and a note.
function M.resume_grad_accum(r, dp, saved, o)
  local where, what = o.where, o.what
  local B, T = r.data.micro_batch, r.data.seq
  local K = M.grad_accum(r, dp, where)
  if not saved then return K, nil end
  local now_shape, now_tokens = shape(B, T, K, dp)
  local G = saved.global_batch_tokens
  if not G then
    local sdp = saved.dp or saved.world
    return K, string.format("%s records no global batch (saved before fsdp recorded it): this run's is the recipe's, %d " ..
      "tokens per step (%s = %s)%s", what, now_tokens, dims, now_shape,
      sdp and sdp ~= dp and string.format("; it was saved on %s and this run has %d: set train.grad_accum on the command " ..
        "line to give it the global batch it had", plural(sdp, "data-parallel rank"), dp) or "")
  end
  local sK, sdp, sB, sT = saved.grad_accum, saved.dp or saved.world, saved.micro_batch, saved.seq
  local saved_shape = (sK and sdp and sB and sT) and (shape(sB, sT, sK, sdp)) or "not recorded"
  if o.explicit then
    if now_tokens == G then return K, nil end
    return K, string.format("warning: %s changes the global batch: %d tokens per step in %s, %d now (%s: %s then, %s " ..
      "now); the step count, the learning-rate schedule and the data position go on as they were", o.explicit, G, what,
      now_tokens, dims, saved_shape, now_shape)
  end
  local per = B * T * dp -- tokens of one micro-batch on every rank
  if G % per ~= 0 then
    -- (short: under fsdprun a refusal's message travels in 511 bytes)
    local ways = {}
    if G % (B * T) == 0 then
      ways[#ways + 1] = string.format("on %s rank%s", divisors(G / (B * T), 8), G == B * T and "" or "s")
    end
    if G % (T * dp) == 0 then
      ways[#ways + 1] = string.format("on %d with data.micro_batch = %s", dp, divisors(G / (T * dp), 8))
    end
    local lo = math.floor(G / per)
    error(string.format("%s: train.grad_accum: %s was trained with a global batch of %d tokens per step on %s (%s = %s); " ..
      "on %s one micro-batch is %d x %d x %d = %d tokens, which does not divide %d. %sOr give this run its own: " ..
      "train.grad_accum=%d (%d tokens)%s on the command line", where, what, G, plural(sdp or 0, "data-parallel rank"), dims,
      saved_shape, plural(dp, "rank"), B, T, dp, per, G, #ways > 0 and "It is kept " .. table.concat(ways, ", or ") .. ". " or "",
      lo + 1, (lo + 1) * per, lo >= 1 and string.format(" or %d (%d tokens)", lo, lo * per) or ""), 0)
  end
  local kept = G / per
  if kept == K and kept == sK then return kept, nil end
  local shapes = string.format("%s: %s then, %s now", dims, saved_shape, (shape(B, T, kept, dp)))
  if sK == kept then -- only the recipe's field differs from the checkpoint's
    return kept, string.format("train.grad_accum = %d as %s was trained, not the recipe's %d: the global batch stays %d " ..
      "tokens per step (%s); train.grad_accum=N on the command line sets another", kept, what, K, G, shapes)
  end
  local changed = {}
  if sdp and sdp ~= dp then changed[#changed + 1] = string.format("%s instead of %d", plural(dp, "data-parallel rank"), sdp) end
  if sB and sB ~= B then changed[#changed + 1] = string.format("data.micro_batch %d instead of %d", B, sB) end
  if sT and sT ~= T then changed[#changed + 1] = string.format("data.seq %d instead of %d", T, sT) end
  return kept, string.format("train.grad_accum %s -> %d keeps the global batch of %s at %d tokens per step%s (%s%s); " ..
    "train.grad_accum=N on the command line sets another", sK and string.format("%d", sK) or "?", kept, what, G,
    #changed > 0 and " on " .. table.concat(changed, ", ") or "", shapes,
    sK and K ~= sK and string.format("; the recipe says %d", K) or "")
end

return M

-- test_hf.lua (fsdprun -n W): Hugging Face folders held against the model.
--   fsdprun -n 2 tests/lua/test_hf.lua
-- A small Llama is exported (fp32); copies of the export, changed one
-- thing at a time, are imported into it. Each change that would make the
-- model compute something other than the files' (rope_theta, rope_scaling
-- in either transformers spelling, rms_norm_eps, hidden_act, head_dim,
-- vocab, the shapes, biases, another model type, an untied head into a
-- tied model unless it is the embedding bit for bit) is refused with a
-- message naming the file, the field and both values; what changes nothing
-- (max_position_embeddings, a stale shard the index does not list) is
-- accepted, and the imported weights equal the exported ones bit for bit.
-- Also: JSON floats and the decoder, config.json's float fields, and
-- `model = {from_hf = DIR}` in a recipe (architecture and, by default,
-- weights from DIR: the first loss equals an explicit recipe's with
-- checkpoint.init_hf = DIR bit for bit).
local fsdp = require "fsdp"
local json = require "fsdp.json"
local hf = require "fsdp.hf"
local hf_config = require "fsdp.hf_config"
local llama = require "fsdp.models.llama"
local shard = require "fsdp.shard"
local train = require "fsdp.train"
local ffi, C = fsdp.ffi, fsdp.C

local info = fsdp.init()
local R, W = info.rank, info.size
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_hf rank %d/%d", R, W))
local check, fails = T.check, T.fails

local mesh = fsdp.mesh("dp_shard=-1")
local group = mesh:group("dp_shard")
local function barrier() shard.all_reduce_host(group, fsdp.tensor(1):fill(0), "sum") end

-- one work directory for all ranks: rank 0's pid, shared
pcall(ffi.cdef, "int getpid(void);")
local work
do
  local t = fsdp.tensor(1):fill(R == 0 and ffi.C.getpid() or 0)
  shard.all_reduce_host(group, t, "sum")
  work = string.format("/tmp/fsdp-test-hf-%d", t:get(0))
end
if R == 0 then C.fsdp_fs_remove_tree(work); C.fsdp_fs_mkdirs(work) end
barrier()

local read, write = T.read, T.write

-- ---- JSON: floats written as floats, the decoder ----
do
  local want = { { 8, "8.0" }, { 1, "1.0" }, { 1e-5, "1e-05" }, { 500000, "500000.0" }, { 0.1, "0.1" }, { -2.5, "-2.5" },
    { 1 / 3, "0.3333333333333333" } }
  for _, w in ipairs(want) do
    local got = json.encode(json.float(w[1]))
    check(got == w[2] and tonumber(got) == w[1], string.format("json.float(%.17g) -> %s (want %s)", w[1], got, w[2]))
  end
  check(json.encode(8) == "8", "a plain integer stays an integer")
  local t = json.decode(' {"a": [1, -2.5e3, true, false], "b": {"c": "x\\u00e9\\ud83d\\ude00\\n\\""}, "d": [], "e": null} ')
  check(t.a[1] == 1 and t.a[2] == -2500 and t.a[3] == true and t.a[4] == false and #t.a == 4, "decode: an array")
  check(t.b.c == "x\195\169\240\159\152\128\n\"", "decode: escapes, \\u and a surrogate pair as UTF-8")
  check(json.encode(t.d) == "[]" and t.e == nil, "decode: an empty array stays one, null is nil")
  for _, bad in ipairs({ '{"a":1,}', "[1 2]", '{"a":01}', '"abc', "[1] x", "nul", '"\\x"', "" }) do
    fails(function() json.decode(bad) end, "JSON: ", "decode refuses " .. bad)
  end
end

-- ---- the model and its export ----
local base = { hidden_size = 32, intermediate_size = 64, num_attention_heads = 4, num_key_value_heads = 2,
  num_hidden_layers = 2, vocab_size = 64, max_position_embeddings = 128, rope_theta = 10000, rms_norm_eps = 1e-5,
  tie_word_embeddings = false }
local function cfg_of(over)
  local m = {}
  for k, v in pairs(base) do m[k] = v end
  for k, v in pairs(over or {}) do m[k] = v end
  return llama.config(m)
end
local function model(over, seed)
  local cfg = cfg_of(over)
  return fsdp.fully_shard(llama.model(cfg), { shard = group, units = llama.units, zero = 3, seed = seed or 7 }), cfg
end
local params, same_params = T.params, T.same_params

local src, cfg = model()
local P = params(src)
local ex = work .. "/export"
hf.export(src, cfg, ex, { dtype = "fp32", shard_bytes = 20000 })
src:free()
local config_text = read(ex .. "/config.json")
-- the export's files, in order (several: shard_bytes is small)
local files = {}
do
  local seen = {}
  for _, f in pairs(json.decode(read(ex .. "/model.safetensors.index.json")).weight_map) do
    if not seen[f] then files[#files + 1], seen[f] = f, true end
  end
  table.sort(files)
end
check(#files >= 3, "the export is cut into several files: " .. #files)

-- a copy of the export with config.json changed by edit(t) (nil: removed);
-- made by rank 0, seen by all
local n_copies = 0
local function variant(edit)
  n_copies = n_copies + 1
  local dir = string.format("%s/v%02d", work, n_copies)
  if R == 0 then
    os.execute(string.format("cp -r '%s' '%s'", ex, dir))
    if edit then
      local t = json.decode(config_text)
      edit(t)
      write(dir .. "/config.json", json.encode(t))
    else
      os.remove(dir .. "/config.json")
    end
  end
  barrier()
  return dir
end

local dst = model(nil, 99)
local function imports(dir, o)
  local ok, r = pcall(hf.import, dst, cfg, dir, o or { quiet = true })
  return ok, r
end
local function refused(dir, needles, what, s, c)
  local ok, err = pcall(hf.import, s or dst, c or cfg, dir, { quiet = true })
  local all = not ok
  for _, n in ipairs(needles) do all = all and tostring(err):find(n, 1, true) ~= nil end
  check(all, what .. ": " .. tostring(err))
end

-- the export itself: floats as floats, and read back bit for bit
do
  local fs = hf_config.encode(cfg_of({ rope_scaling = { rope_type = "llama3", factor = 8, low_freq_factor = 1,
    high_freq_factor = 4, original_max_position_embeddings = 64 } }), "bf16")
  for _, want in ipairs({ '"factor":8.0', '"low_freq_factor":1.0', '"high_freq_factor":4.0', '"original_max_position_embeddings":64',
    '"rope_theta":10000.0', '"rms_norm_eps":1e-05', '"initializer_range":0.02', '"hidden_size":32' }) do
    check(fs:find(want, 1, true) ~= nil, "config.json has " .. want .. ": " .. fs)
  end
  check(config_text:find('"rope_theta":10000.0', 1, true) ~= nil, "the export's config.json: rope_theta a float")
  local ok, r = imports(ex)
  check(ok and #r.notes == 0, "the export imports with no warning: " .. tostring(ok and r.notes[1] or r))
  local same, why = same_params(P, params(dst))
  check(same, "export -> import: the same weights bit for bit: " .. tostring(why))
end

-- every disagreement that changes what is computed is refused, naming the
-- file, the field and both values
local path_of = function(dir) return dir .. "/config.json" end
local function disagree(field, value, model_value, edit)
  local dir = variant(edit or function(t) t[field] = value end)
  refused(dir, { path_of(dir) .. " has " .. field .. " = " .. value, "the model has " .. field .. " = " .. model_value },
    field .. " = " .. value .. " refused")
end
disagree("rope_theta", "500000", "10000", function(t) t.rope_theta = 500000 end)
disagree("rms_norm_eps", "1e-06", "1e-05", function(t) t.rms_norm_eps = 1e-6 end)
disagree("head_dim", "16", "8", function(t) t.head_dim = 16 end)
disagree("vocab_size", "65", "64", function(t) t.vocab_size = 65 end)
disagree("hidden_size", "48", "32", function(t) t.hidden_size = 48 end)
disagree("intermediate_size", "96", "64", function(t) t.intermediate_size = 96 end)
disagree("num_attention_heads", "2", "4", function(t) t.num_attention_heads = 2 end)
disagree("num_key_value_heads", "1", "2", function(t) t.num_key_value_heads = 1 end)
disagree("num_hidden_layers", "3", "2", function(t) t.num_hidden_layers = 3 end)
disagree("rope_scaling", "{ rope_type = 'llama3', factor = 8", "none", function(t)
  t.rope_scaling = { rope_type = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
    original_max_position_embeddings = 64 }
end)
-- transformers 5 writes the rotary settings inside rope_parameters
disagree("rope_theta", "500000", "10000", function(t)
  t.rope_theta = nil
  t.rope_parameters = { rope_type = "default", rope_theta = 500000.0 }
end)
disagree("rope_scaling", "{ rope_type = 'llama3', factor = 8", "none", function(t)
  t.rope_theta = nil
  t.rope_parameters = { rope_type = "llama3", rope_theta = 10000.0, factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
    original_max_position_embeddings = 64 }
end)
do
  local dir = variant(function(t)
    t.rope_theta = nil
    t.rope_parameters = { rope_type = "default", rope_theta = 10000.0 }
  end)
  check(imports(dir), "rope_parameters that agree are accepted")
  dir = variant(function(t) t.rope_parameters = { rope_type = "default", rope_theta = 500000.0 } end)
  refused(dir, { "rope_theta = 10000 but rope_parameters.rope_theta = 500000" }, "a config.json that contradicts itself")
end
refused(variant(function(t) t.hidden_act = "gelu" end), { "/config.json: hidden_act = 'gelu'; only 'silu'" }, "hidden_act gelu")
refused(variant(function(t) t.attention_bias = true end), { "/config.json: attention_bias / mlp_bias are not supported" },
  "attention_bias")
refused(variant(function(t) t.mlp_bias = true end), { "/config.json: attention_bias / mlp_bias are not supported" }, "mlp_bias")
refused(variant(function(t) t.model_type = "mistral" end), { "/config.json: model_type = 'mistral'" }, "another model type")
refused(variant(function(t) t.tie_word_embeddings = true end),
  { "has tie_word_embeddings = true; the model has tie_word_embeddings = false" }, "tied files into an untied model")

local no_config
-- what changes nothing computed is accepted: max_position_embeddings warns
-- only when the run's sequences are longer
do
  local dir = variant(function(t) t.max_position_embeddings = 16 end)
  local ok, r = imports(dir, { quiet = true, seq = 8 })
  check(ok and #r.notes == 0, "max_position_embeddings 16 (model: 128), sequences of 8: accepted, no warning")
  ok, r = imports(dir, { quiet = true, seq = 32 })
  check(ok and #r.notes == 1 and r.notes[1]:find("longer than " .. path_of(dir) .. "'s max_position_embeddings = 16", 1, true),
    "sequences of 32: accepted with a warning: " .. tostring(ok and r.notes[1] or r))
  -- no config.json: accepted, saying that nothing could be checked
  dir = variant(nil)
  no_config = dir
  ok, r = imports(dir)
  check(ok and #r.notes == 1 and r.notes[1]:find("has no config.json: nothing but the tensors' names and shapes could be checked",
    1, true), "no config.json: a warning: " .. tostring(ok and r.notes[1] or r))
  check(same_params(P, params(dst)), "... and the weights imported")
end

-- a tied model takes an untied head only when it is the embedding bit for bit
do
  local tied = model({ tie_word_embeddings = true }, 5)
  local tcfg = cfg_of({ tie_word_embeddings = true })
  -- the untied export's head is not its embedding: refused, with or without config.json
  refused(ex, { "lm_head.weight (in ", "differs from model.embed_tokens.weight", "tie_word_embeddings = true" },
    "an untied head into a tied model", tied, tcfg)
  refused(variant(nil), { "differs from model.embed_tokens.weight" }, "... also without config.json", tied, tcfg)
  -- a tied export, then an lm_head.weight that equals the embedding (in its own file, listed in the index)
  local tex = work .. "/tied"
  hf.export(tied, tcfg, tex, { dtype = "fp32", shard_bytes = 1e9 })
  local TP = params(tied)
  local emb = TP["model.embed_tokens.weight"]
  local function with_head(dir, last, last_bits)
    if R == 0 then
      os.execute(string.format("cp -r '%s' '%s'", tex, dir))
      local n = #emb
      local data = ffi.new("float[?]", n)
      for i = 1, n do data[i - 1] = emb[i] end
      if last then data[n - 1] = last end
      if last_bits then ffi.cast("uint32_t *", data)[n - 1] = last_bits end
      local h = json.encode({ ["lm_head.weight"] = { dtype = "F32", shape = { base.vocab_size, base.hidden_size },
        data_offsets = { 0, 4 * n } } })
      h = h .. string.rep(" ", (8 - #h % 8) % 8)
      local len = ffi.new("uint64_t[1]", #h)
      write(dir .. "/head.safetensors", ffi.string(len, 8) .. h .. ffi.string(data, 4 * n))
      local idx = json.decode(read(dir .. "/model.safetensors.index.json"))
      idx.weight_map["lm_head.weight"] = "head.safetensors"
      write(dir .. "/model.safetensors.index.json", json.encode(idx))
      local c = json.decode(read(dir .. "/config.json"))
      c.tie_word_embeddings = false
      write(dir .. "/config.json", json.encode(c))
    end
    barrier()
    return dir
  end
  local t2 = model({ tie_word_embeddings = true }, 6)
  local ok, err = pcall(hf.import, t2, tcfg, with_head(work .. "/tied-equal"), { quiet = true })
  check(ok, "an untied head equal to the embedding is accepted: " .. tostring(err))
  check(same_params(TP, params(t2)), "... and the weights are the embedding's")
  -- its last element one ulp off (found by the rank that holds it; all refuse)
  local ulp = ffi.new("float[1]", emb[#emb])
  ffi.cast("uint32_t *", ulp)[0] = ffi.cast("uint32_t *", ulp)[0] + 1
  local dir = with_head(work .. "/tied-ulp", ulp[0])
  ok, err = pcall(hf.import, t2, tcfg, dir, { quiet = true })
  local says = tostring(err):find("differs from model.embed_tokens.weight (element " .. (#emb - 1), 1, true) ~= nil
  local n = fsdp.tensor(1):fill(says and 1 or 0)
  shard.all_reduce_host(group, n, "sum")
  check(not ok and (says or tostring(err):find("failed (its message says why)", 1, true)) and n:get(0) >= 1,
    "one ulp off in the head's last element: refused on every rank, by the one holding it with the element: " .. tostring(err))
  -- a NaN there whose payload, widened to double, is LuaJIT's table tag:
  -- the message reads it as a plain NaN (issue 19; it crashed the rank)
  dir = with_head(work .. "/tied-nan", nil, 0xffd00123)
  ok, err = pcall(hf.import, t2, tcfg, dir, { quiet = true })
  says = tostring(err):find("differs from model.embed_tokens.weight (element " .. (#emb - 1) .. ": nan vs ", 1, true) ~= nil
  n:fill(says and 1 or 0)
  shard.all_reduce_host(group, n, "sum")
  check(not ok and (says or tostring(err):find("failed (its message says why)", 1, true)) and n:get(0) >= 1,
    "a payload NaN in the head's last element: refused, the message reading it as nan: " .. tostring(err))
  tied:free(); t2:free()
end

-- the index decides which files are read
do
  local dir = variant(function() end)
  if R == 0 then -- a stale extra shard from an export cut otherwise: a copy of a listed one
    os.execute(string.format("cp '%s/%s' '%s/model-00001-of-00099.safetensors'", dir, files[1], dir))
  end
  barrier()
  local ok, err = imports(dir)
  check(ok, "a stale shard the index does not list is not read: " .. tostring(err))
  local i2 = variant(function() end)
  if R == 0 then
    local idx = json.decode(read(i2 .. "/model.safetensors.index.json"))
    idx.weight_map["model.norm.weight"] = files[1]
    write(i2 .. "/model.safetensors.index.json", json.encode(idx))
  end
  barrier()
  refused(i2, { "model.safetensors.index.json puts 'model.norm.weight' in " .. files[1] .. ", but it is in " .. files[#files] },
    "an index that misplaces a tensor")
  local i3 = variant(function() end)
  if R == 0 then os.remove(i3 .. "/" .. files[2]) end
  barrier()
  refused(i3, { "lists " .. files[2], "which is not in " .. i3 }, "an index naming a missing file")
  -- model.safetensors, when there, is the only file read (as transformers does)
  local one = work .. "/one"
  local s1 = model(nil, 3)
  hf.export(s1, cfg, one, { dtype = "fp32", shard_bytes = 1e9 })
  local P1 = params(s1)
  s1:free()
  if R == 0 then
    os.rename(one .. "/model-00001-of-00001.safetensors", one .. "/model.safetensors")
    os.execute(string.format("cp '%s/%s' '%s/stale.safetensors'", ex, files[1], one))
  end
  barrier()
  ok, err = imports(one)
  check(ok and same_params(P1, params(dst)), "model.safetensors alone is read: " .. tostring(err))
end

-- ---- model = {from_hf = DIR} ----
do
  local c, dir = hf_config.model({ from_hf = ex }, "r.lua")
  local same = dir == ex
  for _, k in ipairs(hf_config.compared) do same = same and (k == "rope_scaling" or c[k] == cfg[k]) end
  check(same and c.rope_scaling == nil and c.max_position_embeddings == 128, "from_hf: the architecture is config.json's")
  c = hf_config.model({ from_hf = ex, max_position_embeddings = 4096, rope_theta = 10000 }, "r.lua")
  check(c.max_position_embeddings == 4096, "from_hf: the recipe's max_position_embeddings wins; agreeing fields are fine")
  fails(function() hf_config.model({ from_hf = ex, rope_theta = 500000 }, "r.lua") end,
    ex .. "/config.json has rope_theta = 10000; r.lua: model (with from_hf) has rope_theta = 500000", "from_hf: a disagreement")
  fails(function() hf_config.model({ from_hf = ex, preset = "llama3_8b" }, "r.lua") end, "has hidden_size = 32; r.lua: model",
    "from_hf: a preset that disagrees")
  fails(function() hf_config.model({ from_hf = no_config }, "r.lua") end, "model.from_hf = \"" .. no_config .. "\": there is no",
    "from_hf: a folder without config.json")

  -- the trainer: from_hf alone loads the weights too; the first loss equals
  -- the explicit recipe's with checkpoint.init_hf, and differs from
  -- checkpoint.init_hf = false (the meta init)
  local toks = work .. "/tokens.u16"
  if R == 0 then
    local out, s = {}, 4321
    for _ = 1, 8192 do
      s = (s * 1103515245 + 12345) % 2147483648
      out[#out + 1] = string.char(math.floor(s / 65536) % base.vocab_size, 0)
    end
    write(toks, table.concat(out))
  end
  barrier()
  local function recipe(m, init)
    return { model = m, data = { token_file = toks, format = "raw_u16", seq = 16, micro_batch = 2 },
      train = { steps = 1, log_every = 100 }, checkpoint = { init_hf = init } }
  end
  local a = train.run(recipe({ from_hf = ex }), "from_hf.lua", {})
  local explicit = {}
  for k, v in pairs(base) do explicit[k] = v end
  local b = train.run(recipe(explicit, ex), "explicit.lua", {})
  local c0 = train.run(recipe({ from_hf = ex }, false), "arch_only.lua", {})
  check(a.losses[1] == b.losses[1], string.format("from_hf: the first loss is init_hf's (%.17g vs %.17g)", a.losses[1], b.losses[1]))
  check(c0.losses[1] ~= a.losses[1], string.format("init_hf = false: the meta init (%.17g)", c0.losses[1]))
  fails(function() train.run(recipe(explicit, variant(function(t) t.rope_theta = 500000 end)), "x.lua", {}) end,
    "x.lua: checkpoint.init_hf: hf.import from ", "the trainer refuses a disagreeing folder, naming the field")
  fails(function() train.run(recipe({ from_hf = ex, rms_norm_eps = 1e-6 }), "y.lua", {}) end,
    "y.lua: model (with from_hf) has rms_norm_eps = 1e-06", "the trainer refuses a from_hf recipe that disagrees")
end

-- a full disk: the export fails on every rank, naming the file and the
-- cause once, and leaves nothing behind (no DIR.tmp filling the disk);
-- a 64 KiB tmpfs (root only: skipped where it cannot be mounted)
do
  local full = work .. "/full"
  local mounted = 0
  if R == 0 then
    C.fsdp_fs_mkdirs(full)
    mounted = os.execute("mount -t tmpfs -o size=64k tmpfs '" .. full .. "' 2>/dev/null") == 0 and 1 or 0
  end
  local t = fsdp.tensor(1):fill(mounted)
  shard.all_reduce_host(group, t, "sum")
  if t:get(0) == 1 then
    local big, bcfg = model({ vocab_size = 1024 }) -- 0.3 MB of fp32
    local ok, e = pcall(hf.export, big, bcfg, full .. "/hf", { dtype = "fp32" })
    e = tostring(e)
    check(not ok and e:find("hf.export to " .. full .. "/hf", 1, true), "a full disk: the export fails: " .. e)
    local _, said = e:gsub("hf%.export to ", "")
    check(said == 1, "the export is named once: " .. e)
    if R == 0 then
      check(e:find("No space left on device", 1, true), "rank 0 says why: " .. e)
      check(C.fsdp_fs_list(full, nil, 0) == 0, "nothing is left on the full disk (no hf.tmp)")
    end
    big:free()
    barrier()
    if R == 0 then os.execute("umount '" .. full .. "'") end
  elseif R == 0 then
    print("test_hf: the full-disk export skipped (a tmpfs cannot be mounted here)")
  end
end

dst:free()
barrier()
if R == 0 then C.fsdp_fs_remove_tree(work) end
-- the planner's layouts from the trainer runs are garbage now; collected
-- here, since os.exit (T.finish) leaves without closing the Lua state and
-- LeakSanitizer would report what the collector has not reached yet
collectgarbage("collect")
collectgarbage("collect")
T.finish()

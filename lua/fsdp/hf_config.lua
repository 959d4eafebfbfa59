-- fsdp.hf_config: a Hugging Face folder's config.json, read, written, and
-- held against the Llama model a recipe describes (docs/CHECKPOINTS.md).
--   local cfg, raw, path = hf_config.read(dir)       -- nil, path when dir has no config.json
--   hf_config.check(model_cfg, cfg, path)           -- refuses any disagreement, naming both values
--   local cfg, from = hf_config.model(recipe.model, where)  -- a recipe's model, `from_hf` resolved
--   hf_config.encode(cfg, "bf16")                  -- config.json text for an export
-- A field that does not change a tensor's shape (rope_theta, rms_norm_eps,
-- rope_scaling, ...) can disagree with the weights without any error from
-- the tensors themselves; this is where such a disagreement is caught.
local json = require "fsdp.json"
local llama = require "fsdp.models.llama"

local M = {}

-- The fields that change what the model computes, compared one by one.
-- max_position_embeddings is not among them (it changes nothing computed;
-- the importer warns when the run's sequences are longer), nor
-- initializer_range (loaded weights need no init).
M.compared = { "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
  "head_dim", "vocab_size", "hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings" }

-- config.json fields taken as they are (null: transformers' default)
local plain = { "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
  "vocab_size", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "head_dim", "hidden_act",
  "attention_bias", "mlp_bias", "initializer_range" }
local scaling_numbers = { "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings" }

-- a rope_scaling table reduced to what fsdp's rotary embedding reads; nil for
-- none ("default" rotary)
local function scaling_of(t)
  if type(t) ~= "table" then return nil end
  local kind = t.rope_type or t.type
  if kind == nil or kind == "default" then return nil end
  local s = { rope_type = kind }
  for _, k in ipairs(scaling_numbers) do s[k] = t[k] end
  return s
end

local function same_scaling(a, b)
  if a == nil or b == nil then return a == b end
  if (a.rope_type or a.type) ~= (b.rope_type or b.type) then return false end
  for _, k in ipairs(scaling_numbers) do if a[k] ~= b[k] then return false end end
  return true
end

local function show(v)
  if v == nil then return "none" end
  if type(v) == "number" then
    return v % 1 == 0 and math.abs(v) < 2 ^ 53 and string.format("%.0f", v) or json.encode(json.float(v))
  end
  if type(v) == "string" then return "'" .. v .. "'" end
  if type(v) == "table" then
    local parts = { "rope_type = " .. show(v.rope_type or v.type) }
    for _, k in ipairs(scaling_numbers) do parts[#parts + 1] = k .. " = " .. show(v[k]) end
    return "{ " .. table.concat(parts, ", ") .. " }"
  end
  return tostring(v)
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- dir's config.json as a validated llama config (transformers' defaults
-- for absent fields), the raw fields it was made from, and its path; nil,
-- nil, path when there is none. Both spellings of the rotary settings are
-- read: top-level rope_theta / rope_scaling (transformers 4) and
-- rope_parameters (transformers 5).
function M.read(dir)
  local path = dir:gsub("/+$", "") .. "/config.json"
  local f = io.open(path, "rb")
  if not f then
    if exists(path) then error(path .. ": cannot be read", 0) end
    return nil, nil, path
  end
  local text = f:read("*a")
  f:close()
  local ok, t = pcall(json.decode, text)
  if not ok then error(path .. ": " .. tostring(t), 0) end
  if type(t) ~= "table" then error(path .. ": not a JSON object", 0) end
  if t.model_type ~= nil and t.model_type ~= "llama" then
    error(string.format("%s: model_type = %s; fsdp's model is Llama (model_type 'llama')", path, show(t.model_type)), 0)
  end
  local raw = {}
  for _, k in ipairs(plain) do raw[k] = t[k] end
  local theta, scaling = t.rope_theta, scaling_of(t.rope_scaling)
  local rp = t.rope_parameters
  if rp ~= nil then
    if type(rp) ~= "table" then error(path .. ": rope_parameters is not an object", 0) end
    if rp.rope_theta ~= nil then
      if theta ~= nil and theta ~= rp.rope_theta then
        error(string.format("%s: rope_theta = %s but rope_parameters.rope_theta = %s", path, show(theta), show(rp.rope_theta)), 0)
      end
      theta = rp.rope_theta
    end
    local from_params = scaling_of(rp)
    if t.rope_scaling ~= nil and not same_scaling(scaling, from_params) then
      error(string.format("%s: rope_scaling = %s but rope_parameters says %s", path, show(scaling), show(from_params)), 0)
    end
    scaling = from_params
  end
  raw.rope_theta, raw.rope_scaling = theta, scaling
  local ok2, cfg = pcall(llama.config, nil, raw, path)
  if not ok2 then error(tostring(cfg), 0) end
  return cfg, raw, path
end

-- Refuses (an error naming the file, the field and both values) when the
-- model config `mine` disagrees with `file` (from M.read) on a compared
-- field. partial: compare only the fields `mine` sets (a recipe's own).
-- A model that ties its head to the embedding may take untied files: the
-- importer then requires lm_head.weight to equal the embedding bit for bit.
function M.check(mine, file, path, partial, who)
  who = who or "the model"
  for _, k in ipairs(M.compared) do
    local a, b = mine[k], file[k]
    local differ
    if partial and a == nil then differ = false
    elseif k == "tie_word_embeddings" then differ = b and not a
    elseif k == "rope_scaling" then differ = not same_scaling(a, b)
    else differ = a ~= b end
    if differ then
      local hint = partial and string.format("Leave model.%s out (model.from_hf takes it from the folder) or make it %s.", k, show(b))
        or string.format("Set model.%s = %s, or take the whole architecture from the folder: model = { from_hf = %q }.", k,
          show(b), (path:gsub("/config%.json$", "")))
      error(string.format("%s has %s = %s; %s has %s = %s. %s", path, k, show(b), who, k, show(a), hint), 0)
    end
  end
end

-- A recipe's model section as a llama config. With `from_hf = "DIR"` the
-- architecture is DIR/config.json's; a field the recipe sets as well must
-- agree with it, except max_position_embeddings (the recipe's wins) and
-- tie_word_embeddings = true over untied files (the weights decide).
-- Returns the config and the folder (nil without from_hf).
function M.model(rm, where)
  local own = {}
  for k, v in pairs(rm) do if k ~= "preset" and k ~= "from_hf" then own[k] = v end end
  local function config(preset, fields)
    local ok, c = pcall(llama.config, preset, fields, where .. ": model")
    if not ok then error(tostring(c), 0) end
    return c
  end
  if rm.from_hf == nil then return config(rm.preset, own) end
  local dir = rm.from_hf
  if type(dir) ~= "string" then
    error(string.format("%s: model.from_hf = %s; expected the path of a Hugging Face model folder", where, tostring(dir)), 0)
  end
  local file, raw, path = M.read(dir)
  if not file then error(string.format("%s: model.from_hf = %q: there is no %s to take the architecture from", where, dir, path), 0) end
  local explicit = {}
  if rm.preset then config(rm.preset) end -- an unknown preset's error
  for k, v in pairs(rm.preset and llama.presets[rm.preset] or {}) do explicit[k] = v end
  for k, v in pairs(own) do explicit[k] = v end
  local merged = {}
  for k, v in pairs(raw) do merged[k] = v end
  for k, v in pairs(explicit) do merged[k] = v end
  local cfg = config(nil, merged)
  -- (the recipe's mistake: named by its file first, so the trainer refuses it, status 78)
  local ok, e = pcall(M.check, explicit, file, path, true, where .. ": model (with from_hf)")
  if not ok then error(where .. ": model.from_hf: " .. tostring(e), 0) end
  return cfg, dir
end

-- config.json for an export; float fields are written as floats (500000.0,
-- 8.0), as transformers writes them (older versions check the type)
function M.encode(cfg, dtype)
  local f = json.float
  local c = {
    architectures = { "LlamaForCausalLM" }, model_type = "llama", hidden_act = "silu", attention_bias = false,
    mlp_bias = false, initializer_range = f(cfg.initializer_range or 0.02), use_cache = true,
    torch_dtype = dtype == "bf16" and "bfloat16" or "float32", attention_dropout = f(0),
    hidden_size = cfg.hidden_size, intermediate_size = cfg.intermediate_size, num_attention_heads = cfg.num_attention_heads,
    num_key_value_heads = cfg.num_key_value_heads, num_hidden_layers = cfg.num_hidden_layers, vocab_size = cfg.vocab_size,
    max_position_embeddings = cfg.max_position_embeddings, rms_norm_eps = f(cfg.rms_norm_eps), rope_theta = f(cfg.rope_theta),
    tie_word_embeddings = cfg.tie_word_embeddings and true or false, head_dim = cfg.head_dim,
  }
  if cfg.rope_scaling then
    local rs = {}
    for k, v in pairs(cfg.rope_scaling) do rs[k] = v end
    for _, k in ipairs({ "factor", "low_freq_factor", "high_freq_factor" }) do
      if type(rs[k]) == "number" then rs[k] = f(rs[k]) end
    end
    c.rope_scaling = rs
  end
  return json.encode(c)
end

return M

-- fsdp.generate: text from a trained model (`fsdp generate`, and the
-- trainer's sample at each evaluation). The prompt goes through the model
-- once (prefill), filling each layer's KV cache; then one token a step
-- attends to the cache (fsdp.models.llama's forward_cached), chosen by
-- fsdp.sample (greedy, or temperature / top-k / top-p with a seed), until
-- an end-of-text token or the length. Prompt and output go through the
-- model's tokenizer: its tokenizer.json by the project's Python tool
-- (scripts/prepare_data.py, `tokenizers`), or bytes for a byte-level model.
--
--   local g = generate.open("runs/tiny/ckpt")       -- or a Hugging Face folder
--   local ids, stats = g:generate(g:encode("Once upon"), {max_new_tokens = 40})
--   print(g:decode(ids))
--   g:close()
local fsdp = require "fsdp"
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local ops = require "fsdp.ops"
local llama = require "fsdp.models.llama"
local inference = require "fsdp.inference"
local hf_config = require "fsdp.hf_config"
local hf_files = require "fsdp.hf_files"
local ckpt_dir = require "fsdp.ckpt_dir"
local sample = require "fsdp.sample"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}

local exists = ckpt_dir.exists

-- The project's scripts/ (python_env.sh, prepare_data.py): FSDP_SCRIPTS_DIR,
-- else beside the lua/ this file was loaded from (as `fsdp prepare` finds it)
function M.scripts()
  local env = os.getenv("FSDP_SCRIPTS_DIR")
  if env and env ~= "" then return env end
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local r = src:gsub("/?lua/fsdp/generate%.lua$", "")
  return (r == "" and "." or r) .. "/scripts"
end

-- What SOURCE is: one checkpoint (a step-N directory), a checkpoint
-- directory (its newest checkpoint that opens), or a Hugging Face folder.
-- Returns {checkpoint = path or nil, dir = the folder with config.json and
-- the tokenizer's files}.
function M.resolve(source)
  local s = source:gsub("/+$", "")
  local path
  if exists(s .. "/index.json") then
    path = s
  elseif ckpt_dir.latest_name(s) or #ckpt_dir.candidates(s) > 0 then
    local skipped
    path, skipped = ckpt_dir.latest(s)
    if not path then error(string.format("%s: no checkpoint there opens (%s)", source, tostring(skipped)), 0) end
  elseif exists(s .. "/config.json") then
    return { dir = s }
  else
    error(string.format("%s: neither a checkpoint (step-N/index.json, or a directory of them) nor a Hugging Face " ..
      "model folder (config.json and *.safetensors)", source), 0)
  end
  return { checkpoint = path, dir = path .. "/hf" }
end

-- The tokenizer of a folder's files: tokenizer.json through the Python
-- tool, or bytes (ids 0-255) for a byte-level model without one.
local function tokenizer(dir, files, vocab)
  local py
  local function run(sub, input)
    if not py then
      local env = M.scripts() .. "/python_env.sh"
      local errf = os.tmpname()
      local p = io.popen(string.format("'%s' 2>'%s'", env, errf))
      py = p:read("*l")
      p:close()
      local why = ckpt_dir.read_text(errf) or ""
      os.remove(errf)
      if not py or py == "" then
        error(string.format("%s/tokenizer.json needs the project's Python environment, which could not be made: %s",
          dir, why:gsub("%s+$", "")), 0)
      end
    end
    local inf, outf, errf = os.tmpname(), os.tmpname(), os.tmpname()
    local f = assert(io.open(inf, "wb"))
    f:write(input)
    f:close()
    local cmd = string.format("'%s' '%s/prepare_data.py' %s --tokenizer '%s' <'%s' >'%s' 2>'%s'", py, M.scripts(),
      sub, dir, inf, outf, errf)
    local ok = os.execute(cmd)
    local out, err = ckpt_dir.read_text(outf) or "", ckpt_dir.read_text(errf) or ""
    os.remove(inf); os.remove(outf); os.remove(errf)
    if ok ~= 0 and ok ~= true then error(string.format("%s/tokenizer.json: %s failed: %s", dir, sub, err:gsub("%s+$", "")), 0) end
    return out
  end
  local bytes = vocab <= 256 and (files["tokenizer.json"] == nil or files["tokenizer.json"] == hf_files.byte_tokenizer())
  if files["tokenizer.json"] and not bytes then
    return {
      name = dir .. "/tokenizer.json",
      encode = function(text)
        local ids = {}
        for v in run("encode", text):gmatch("%d+") do ids[#ids + 1] = tonumber(v) end
        return ids
      end,
      decode = function(ids) return run("decode", table.concat(ids, " ")) end,
    }
  end
  if bytes then -- (the byte-level tokenizer.json says the same: ids are bytes)
    return {
      name = "bytes",
      encode = function(text)
        local ids = {}
        for i = 1, #text do ids[i] = text:byte(i) end
        return ids
      end,
      decode = function(ids)
        local parts = {}
        for i, v in ipairs(ids) do parts[i] = string.char(v) end
        return table.concat(parts)
      end,
    }
  end
  return nil
end

local Gen = {}
Gen.__index = Gen

-- o: device ("cpu", "cuda" or "auto": a GPU when there is one), dtype
-- ("fp32" or "bf16"; bf16 only on a GPU). Loads the weights on this process
-- alone (fsdp.inference).
function M.open(source, o)
  o = o or {}
  local info = fsdp.init()
  if info.size ~= 1 then error("fsdp generate runs as one process (this job has " .. info.size .. " ranks)", 0) end
  local src = M.resolve(source)
  if not exists(src.dir .. "/config.json") then
    error(string.format("%s has no config.json: it was saved before checkpoints carried the model's architecture; " ..
      "export it with checkpoint.export_hf from a run of that recipe (train.steps = its step), then generate from the export",
      src.dir), 0)
  end
  local cfg, raw = hf_config.read(src.dir)
  local device = o.device or "auto"
  if device == "auto" then device = C.fsdp_device_count(C.FSDP_CUDA) > 0 and "cuda" or "cpu" end
  if device ~= "cpu" and device ~= "cuda" then error("device = " .. tostring(device) .. "; expected cpu, cuda or auto", 0) end
  local dtype = o.dtype or "fp32"
  if dtype ~= "fp32" and dtype ~= "bf16" then error("dtype = " .. tostring(dtype) .. "; expected fp32 or bf16", 0) end
  if dtype == "bf16" and device ~= "cuda" then error("dtype = bf16 runs on a GPU (CPU ops compute in fp32)", 0) end
  if device == "cuda" then
    if C.fsdp_device_count(C.FSDP_CUDA) < 1 then error("device = cuda, but there is no usable GPU here (--device cpu)", 0) end
    check(C.fsdp_device_set(C.FSDP_CUDA, 0), "select the GPU")
  end
  -- the weights alone, whole (fsdp.inference): no optimizer state or units
  local held = inference.load(llama.model(cfg), src.checkpoint and { checkpoint = src.checkpoint } or { hf = src.dir },
    { device = device, dtype = dtype, tied = cfg.tie_word_embeddings })
  local g = M.wrap(held, cfg, { device = device, dtype = dtype, source = source })
  g.loaded = src.checkpoint or src.dir
  g.files = hf_files.read(src.dir)
  g.eos = hf_files.eos_ids(g.files, raw)
  g.tok = tokenizer(src.dir, g.files, cfg.vocab_size)
  g.owned = true
  return g
end

-- A generator over a model that runs forwards: runner:infer(fn, kv), a
-- sharded model (the trainer's, on every rank of its job: the forward is
-- collective where units are gathered, so every rank generates, the same
-- tokens) or one fsdp.inference holds. o: device, dtype, source (for
-- messages), files (hf_files: the tokenizer's, the end-of-text token), dir
-- (where tokenizer.json is).
function M.wrap(runner, cfg, o)
  o = o or {}
  local g = setmetatable({ s = runner, cfg = cfg, device = o.device or runner.device,
    dtype = o.dtype or runner.param_dtype or runner.dtype, source = o.source or "the model" }, Gen)
  g.files = o.files or {}
  g.eos = hf_files.eos_ids(g.files, nil)
  g.tok = tokenizer(o.dir or ".", g.files, cfg.vocab_size)
  return g
end

-- frees the model when open() made it (a wrapped model is its owner's)
function Gen:close()
  if self.owned and self.s then self.s:free() end
  self.s = nil
end

function Gen:encode(text)
  if not self.tok then
    error(string.format("%s: no tokenizer.json for a vocabulary of %d; give token ids (--ids)", self.source,
      self.cfg.vocab_size), 0)
  end
  return self.tok.encode(text)
end

function Gen:decode(ids)
  if not self.tok then return table.concat(ids, " ") end
  return self.tok.decode(ids)
end

-- the logits row of the last position as fp32 on the host: a pointer and its owner
local function host_row(logits, V)
  local host = tensor.new(V)
  if logits.device ~= "cuda" then
    ffi.copy(host:ptr(), logits:ptr(), V * 4)
  elseif logits.dtype == "fp32" then
    ops.compute_stream():synchronize()
    host:copy_from(logits)
  else
    ops.compute_stream():synchronize()
    local b = tensor.new(V, "bf16"):copy_from(logits)
    check(C.fsdp_convert(host.data, C.FSDP_FP32, b.data, C.FSDP_BF16, V), "generate")
    b:free()
  end
  return host
end

-- ids (a list) as an int32 tensor {1, n} on the model's device
local function ids_tensor(ids, from, to, device)
  local n = to - from + 1
  local t = tensor.new({ 1, n }, "int32")
  for i = from, to do t:ptr()[i - from] = ids[i] end
  if device == "cuda" then
    local d = tensor.new({ 1, n }, "int32", "cuda"):copy_from(t)
    t:free()
    return d
  end
  return t
end

-- The tokens after prompt (a list of ids): o.max_new_tokens (default 64),
-- o.greedy / temperature / top_k / top_p / seed (fsdp.sample), o.stop_at_eos
-- (default true: stop after an end-of-text token, which is kept), o.eos (a
-- list of ids; default the model's), o.no_cache (every step runs the whole
-- sequence again: the reference the KV cache is tested against),
-- o.on_token(id) as each comes. Returns the new ids and {prefill_s,
-- decode_s, tokens, stopped = "eos" | "length"}.
function Gen:generate(prompt, o)
  o = o or {}
  local V, cfg = self.cfg.vocab_size, self.cfg
  if #prompt == 0 then error("generate: the prompt is empty (at least one token is needed)", 0) end
  for i, v in ipairs(prompt) do
    if type(v) ~= "number" or v < 0 or v >= V or v % 1 ~= 0 then
      error(string.format("generate: prompt token %d is %s, outside the vocabulary [0, %d)", i, tostring(v), V), 0)
    end
  end
  local max_new = o.max_new_tokens or 64
  if type(max_new) ~= "number" or max_new < 1 or max_new % 1 ~= 0 then
    error("generate: max_new_tokens = " .. tostring(max_new) .. "; expected an integer >= 1", 0)
  end
  local cap = #prompt + max_new
  if cap > cfg.max_position_embeddings then
    error(string.format("generate: %d prompt tokens + %d new ones pass the model's max_position_embeddings %d", #prompt,
      max_new, cfg.max_position_embeddings), 0)
  end
  local pick = sample.picker(o)
  local eos = {}
  for _, v in ipairs(o.eos or self.eos) do eos[v] = true end
  local stop_at_eos = o.stop_at_eos ~= false
  local seq = {}
  for i, v in ipairs(prompt) do seq[i] = v end
  local kv = not o.no_cache and { pos = 0, cap = cap, layers = {} } or nil
  local out, stats = {}, { tokens = 0, stopped = "length" }
  local t0 = C.fsdp_time_now()
  local ok, e = pcall(function()
    for step = 1, max_new do
      local from = kv and (kv.pos + 1) or 1
      local ids = ids_tensor(seq, from, #seq, self.device)
      local logits = self.s:infer(function(model, ctx) return model:forward_last(ctx, ids) end, kv)
      ids:free()
      local row = host_row(logits, V)
      logits:free()
      local bad = tonumber(C.fsdp_find_nonfinite(row:ptr(), V))
      if bad >= 0 then -- a broken model: said, not sampled from
        error(string.format("generate: the model's logit for token %d is %s at position %d; its weights or inputs are " ..
          "broken", bad, tostring(base.f32(row:ptr(), bad)), #seq), 0)
      end
      local id = pick(row:ptr(), V, #seq)
      row:free()
      if kv then kv.pos = #seq end
      if step == 1 then stats.prefill_s = C.fsdp_time_now() - t0 end
      seq[#seq + 1], out[#out + 1] = id, id
      if o.on_token then o.on_token(id) end
      if stop_at_eos and eos[id] then
        stats.stopped = "eos"
        break
      end
    end
  end)
  if kv then for _, c in pairs(kv.layers) do c.k:free(); c.v:free() end end
  if not ok then error(e, 0) end
  stats.tokens = #out
  stats.decode_s = C.fsdp_time_now() - t0 - (stats.prefill_s or 0)
  return out, stats
end

---------------------------------------------------------------- the command
local usage = [[
usage: fsdp generate SOURCE [--prompt TEXT | --prompt-file FILE | --ids "ID ID ..."] [options]
  SOURCE               a checkpoint directory (its newest checkpoint), one step-N
                       checkpoint, or a Hugging Face model folder (config.json,
                       *.safetensors, tokenizer.json)
  --max-new-tokens N   tokens to generate at most (default 64)
  --greedy             the most likely token every step (the default)
  --temperature T      sample at temperature T (0: greedy)
  --top-k K            sample among the K most likely tokens (0: all)
  --top-p P            sample among the most likely tokens whose mass reaches P
  --seed S             the draws' seed (default 0): the same seed, the same text
  --no-stop            go on past an end-of-text token
  --device D           cpu, cuda or auto (default: a GPU when there is one)
  --dtype D            fp32 (default) or bf16 (GPU)
  --print-ids          also print the new token ids on a line of their own
The prompt and the output go through SOURCE's tokenizer.json (the project's
Python environment, made on first use by scripts/python_env.sh), or bytes
for a byte-level model (vocabulary 256). docs/TRAINING.md, "Sampling".]]

local function parse(args)
  local o = { sampling = {} }
  local i = 1
  local function value(name)
    i = i + 1
    if args[i] == nil then error(name .. " needs a value (fsdp generate --help)", 0) end
    return args[i]
  end
  local function number(name)
    local v = value(name)
    local n = tonumber(v)
    if not n then error(string.format("%s %s: expected a number", name, v), 0) end
    return n
  end
  while i <= #args do
    local a = args[i]
    if a == "--help" or a == "-h" then o.help = true
    elseif a == "--prompt" then o.prompt = value(a)
    elseif a == "--prompt-file" then
      local path = value(a)
      o.prompt = ckpt_dir.read_text(path)
      if not o.prompt then error("--prompt-file " .. path .. ": cannot be read", 0) end
    elseif a == "--ids" then
      o.ids = {}
      for v in value(a):gmatch("%S+") do
        local n = tonumber(v)
        if not n then error("--ids: '" .. v .. "' is not a token id", 0) end
        o.ids[#o.ids + 1] = n
      end
    elseif a == "--max-new-tokens" then o.sampling.max_new_tokens = number(a)
    elseif a == "--greedy" then o.sampling.greedy = true
    elseif a == "--temperature" then o.sampling.temperature = number(a)
    elseif a == "--top-k" then o.sampling.top_k = number(a)
    elseif a == "--top-p" then o.sampling.top_p = number(a)
    elseif a == "--seed" then o.sampling.seed = number(a)
    elseif a == "--no-stop" then o.sampling.stop_at_eos = false
    elseif a == "--device" then o.device = value(a)
    elseif a == "--dtype" then o.dtype = value(a)
    elseif a == "--print-ids" then o.print_ids = true
    elseif a:sub(1, 1) == "-" then error("unknown option '" .. a .. "' (fsdp generate --help)", 0)
    elseif o.source then error("one SOURCE only ('" .. o.source .. "' and '" .. a .. "')", 0)
    else o.source = a end
    i = i + 1
  end
  return o
end

-- `fsdp generate ...`: returns the exit status (2: a wrong command line)
function M.cli(args)
  local ok, o = pcall(parse, args)
  if not ok then
    io.stderr:write("fsdp generate: ", tostring(o), "\n")
    return 2
  end
  if o.help then print(usage); return 0 end
  if not o.source then io.stderr:write(usage, "\n"); return 2 end
  if o.prompt and o.ids then io.stderr:write("fsdp generate: --prompt and --ids: give one\n"); return 2 end
  local g
  local ok2, err = pcall(function()
    sample.picker(o.sampling) -- the sampling options refused before the model is loaded
    g = M.open(o.source, { device = o.device, dtype = o.dtype })
    local prompt = o.ids or g:encode(o.prompt or "")
    if #prompt == 0 then error("the prompt is empty: give --prompt TEXT or --ids", 0) end
    local ids, st = g:generate(prompt, o.sampling)
    local all = {} -- decoded whole: a character may span the prompt's last token and the first new one
    for _, v in ipairs(prompt) do all[#all + 1] = v end
    for _, v in ipairs(ids) do all[#all + 1] = v end
    io.stdout:write(g:decode(all), "\n")
    if o.print_ids then io.stdout:write("ids: ", table.concat(ids, " "), "\n") end
    io.stderr:write(string.format("fsdp generate: %d prompt tokens in %.3f s, %d new in %.3f s (%.1f tokens/s, %s), " ..
      "stopped at %s; model %s on %s (%s), tokenizer %s\n", #prompt, st.prefill_s or 0, st.tokens, st.decode_s,
      st.tokens > 1 and (st.tokens - 1) / math.max(st.decode_s, 1e-9) or 0, "KV cache", st.stopped == "eos" and
      "an end-of-text token" or "the length", g.loaded, g.device, g.dtype, g.tok and g.tok.name or "none"))
  end)
  if g then g:close() end
  if not ok2 then -- (a message for the user: no Lua position in front of it)
    io.stderr:write("fsdp generate: ", (tostring(err):gsub("^[^:\n]+%.lua:%d+: ", "")), "\n")
    return 1
  end
  return 0
end

return M

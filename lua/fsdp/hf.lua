-- fsdp.hf: Hugging Face interchange for Llama models (docs/CHECKPOINTS.md).
--   hf.export(s, cfg, dir, {dtype = "bf16" | "fp32", shard_bytes = 5e9})
--   hf.import(s, cfg, dir)
-- export writes model-0000k-of-0000n.safetensors, model.safetensors.index.json
-- and config.json with Hugging Face's Llama tensor names (fsdp uses the same
-- names, shapes and rotary convention, so no tensor is permuted). Each rank
-- writes its own element ranges straight into the files at their offsets:
-- no rank ever holds more than its shard. import reads, on each rank, only
-- the ranges it holds. Both are collective over the model's ranks.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local json = require "fsdp.json"
local ckpt = require "fsdp.checkpoint"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}

local function last_error() return ffi.string(C.fsdp_last_error()) end
local world, agree = ckpt.world, ckpt.agree

local function config_json(cfg, dtype)
  local c = {
    architectures = { "LlamaForCausalLM" }, model_type = "llama", hidden_act = "silu", attention_bias = false,
    mlp_bias = false, initializer_range = 0.02, use_cache = true, torch_dtype = dtype == "bf16" and "bfloat16" or "float32",
    hidden_size = cfg.hidden_size, intermediate_size = cfg.intermediate_size, num_attention_heads = cfg.num_attention_heads,
    num_key_value_heads = cfg.num_key_value_heads, num_hidden_layers = cfg.num_hidden_layers, vocab_size = cfg.vocab_size,
    max_position_embeddings = cfg.max_position_embeddings, rms_norm_eps = cfg.rms_norm_eps, rope_theta = cfg.rope_theta,
    tie_word_embeddings = cfg.tie_word_embeddings and true or false, head_dim = cfg.head_dim,
  }
  if cfg.rope_scaling then
    local rs = {}
    for k, v in pairs(cfg.rope_scaling) do rs[k] = v end
    c.rope_scaling = rs
  end
  return json.encode(c)
end

-- Which tensors go in which file: in model order, a new file when the
-- current one would pass shard_bytes.
local function plan_files(list, es, shard_bytes)
  local files, cur, size = {}, nil, 0
  for _, e in ipairs(list) do
    local b = e.numel * es
    if not cur or (size > 0 and size + b > shard_bytes) then
      cur = {}
      files[#files + 1] = cur
      size = 0
    end
    cur[#cur + 1] = e
    size = size + b
  end
  for i, f in ipairs(files) do f.name = string.format("model-%05d-of-%05d.safetensors", i, #files) end
  return files
end

-- the header of file f; sets e.data_begin (absolute) for its tensors
local function header(f, dtype)
  local n = #f
  local names, dts, nds, shapes = ffi.new("const char *[?]", n), ffi.new("const char *[?]", n),
    ffi.new("int32_t[?]", n), ffi.new("int64_t[?]", 8 * n)
  local keep = {}
  for i, e in ipairs(f) do
    names[i - 1], dts[i - 1], nds[i - 1] = e.name, dtype, #e.shape
    for k, d in ipairs(e.shape) do shapes[(i - 1) * 8 + k - 1] = d end
    keep[i] = e.name
  end
  local meta = ffi.new("const char *[2]", { "format", "pt" })
  local begins = ffi.new("int64_t[?]", n)
  local len = tonumber(C.fsdp_safetensors_header(n, names, dts, nds, shapes, 1, meta, nil, 0, nil))
  check(len, "hf.export: header")
  local buf = ffi.new("char[?]", len)
  check(tonumber(C.fsdp_safetensors_header(n, names, dts, nds, shapes, 1, meta, buf, len, begins)), "hf.export: header")
  for i, e in ipairs(f) do e.data_begin = tonumber(begins[i - 1]) end
  return buf, len
end

-- o.dtype: "bf16" (default) or "fp32"; o.shard_bytes: the size files are
-- cut at (default 5 GB, as transformers' save_pretrained does).
function M.export(s, cfg, dir, o)
  o = o or {}
  local dtype = o.dtype or "bf16"
  if dtype ~= "bf16" and dtype ~= "fp32" then error("hf.export: dtype '" .. tostring(dtype) .. "' (expected bf16 or fp32)", 2) end
  local st_dtype, es = dtype == "bf16" and "BF16" or "F32", dtype == "bf16" and 2 or 4
  local r = world(s)
  local list = ckpt.catalogue(s)
  local files = plan_files(list, es, o.shard_bytes or 5e9)
  local by_name, file_of = {}, {}
  local total = 0
  for _, f in ipairs(files) do
    local buf, len = header(f, st_dtype)
    f.header, f.header_len = buf, len
    f.bytes = len
    for _, e in ipairs(f) do
      by_name[e.name], file_of[e.name] = e, f
      f.bytes = f.bytes + e.numel * es
      total = total + e.numel * es
    end
  end
  local tmp = dir:gsub("/+$", "") .. ".tmp"
  local what = "hf.export to " .. dir
  local err
  if r == 0 then -- the files at full size, headers in place
    local ok, e = pcall(function()
      check(C.fsdp_fs_remove_tree(tmp), what)
      check(C.fsdp_fs_mkdirs(tmp), what)
      for _, f in ipairs(files) do
        local path = tmp .. "/" .. f.name
        check(C.fsdp_fs_create(path, f.bytes), what)
        check(C.fsdp_fs_pwrite(path, 0, f.header, f.header_len), what)
      end
    end)
    err = not ok and e or nil
  end
  agree(s, err, what)
  -- this rank's ranges, converted and written in place
  local ok, e = pcall(function()
    local touched = {}
    for _, u in ipairs(s.units) do
      for _, pc in ipairs(ckpt.pieces(u, 1)) do
        local name = pc.name
        local len = pc["end"] - pc.begin
        local vals = tensor.new(len)
        check(C.fsdp_unit_state_get(u.handle, C.FSDP_STATE_PARAM, pc.off, len, vals:ptr()), what)
        local out = vals
        if dtype == "bf16" then
          out = tensor.new(len, "bf16")
          check(C.fsdp_convert(out.data, C.FSDP_BF16, vals.data, C.FSDP_FP32, len), what)
        end
        local f = file_of[name]
        local path = tmp .. "/" .. f.name
        check(C.fsdp_fs_pwrite(path, by_name[name].data_begin + pc.begin * es, out.data, len * es), what)
        touched[path] = true
        vals:free()
        if out ~= vals then out:free() end
      end
    end
    for path in pairs(touched) do check(C.fsdp_fs_fsync(path), what) end
  end)
  agree(s, not ok and e or nil, what)
  if r == 0 then
    ok, e = pcall(function()
      local map = {}
      for _, f in ipairs(files) do for _, t in ipairs(f) do map[t.name] = f.name end end
      local idx = json.encode({ metadata = { total_size = total }, weight_map = map })
      check(C.fsdp_fs_write_atomic(tmp .. "/model.safetensors.index.json", idx, #idx), what)
      local cj = config_json(cfg, dtype)
      check(C.fsdp_fs_write_atomic(tmp .. "/config.json", cj, #cj), what)
      check(C.fsdp_fs_remove_tree(dir), what)
      check(C.fsdp_fs_rename(tmp, dir), what)
    end)
    err = not ok and e or nil
  end
  agree(s, err, what)
  return { files = #files, bytes = total }
end

-- every *.safetensors file in dir, opened: name -> {st, index}
local function open_dir(dir)
  local found, handles = {}, {}
  for _, f in ipairs(ckpt.list(dir)) do
    if f:match("%.safetensors$") then
      local h = ffi.new("fsdp_safetensors *[1]")
      if C.fsdp_safetensors_open(dir .. "/" .. f, h) < 0 then
        for _, x in ipairs(handles) do C.fsdp_safetensors_close(x) end
        error(last_error(), 0)
      end
      handles[#handles + 1] = h[0]
      local ent = ffi.new("fsdp_safetensors_entry")
      for i = 0, C.fsdp_safetensors_count(h[0]) - 1 do
        C.fsdp_safetensors_entry_get(h[0], i, ent)
        local name = ffi.string(ent.name)
        if found[name] then
          for _, x in ipairs(handles) do C.fsdp_safetensors_close(x) end
          error(string.format("%s: tensor '%s' is in both %s and %s", dir, name, found[name].file, f), 0)
        end
        local shape = {}
        for k = 0, ent.ndim - 1 do shape[#shape + 1] = tonumber(ent.shape[k]) end
        found[name] = { st = h[0], index = i, file = f, shape = shape, dtype = ffi.string(ent.dtype) }
      end
    end
  end
  if #handles == 0 then error(dir .. ": no .safetensors files", 0) end
  return found, handles
end

-- Initialises s from the safetensors files in dir (any sharding of them):
-- main params from the files, optimizer state zero, optimizer step 0.
function M.import(s, cfg, dir)
  local what = "hf.import from " .. dir
  local list = ckpt.catalogue(s)
  local staged = {}
  local ok, err = pcall(function()
    local found, handles = open_dir(dir)
    local ok2, e2 = pcall(function()
      local want = {}
      for _, e in ipairs(list) do
        want[e.name] = true
        local f = found[e.name]
        if not f then error(string.format("%s: no tensor '%s' (shape %s) in its files", dir, e.name, table.concat(e.shape, "x")), 0) end
        if table.concat(f.shape, "x") ~= table.concat(e.shape, "x") then
          error(string.format("%s: tensor '%s' has shape %s in %s; the model expects %s", dir, e.name,
            table.concat(f.shape, "x"), f.file, table.concat(e.shape, "x")), 0)
        end
      end
      for name, f in pairs(found) do -- tensors the model would silently drop
        local tied_head = name == "lm_head.weight" and cfg.tie_word_embeddings
        if not want[name] and not tied_head and not name:match("rotary_emb%.inv_freq$") then
          error(string.format("%s: tensor '%s' (in %s) is not part of this model (another architecture or size?)", dir, name, f.file), 0)
        end
      end
      for _, u in ipairs(s.units) do
        local n = tonumber(C.fsdp_unit_state_numel(u.handle))
        local buf = tensor.new(math.max(n, 1)):fill(0)
        for _, pc in ipairs(ckpt.pieces(u, 0)) do
          local f = found[pc.name]
          if C.fsdp_safetensors_read(f.st, f.index, pc.begin, pc["end"], buf:ptr() + pc.off) < 0 then
            error(last_error(), 0)
          end
        end
        staged[#staged + 1] = { unit = u, buf = buf, n = n }
      end
    end)
    for _, h in ipairs(handles) do C.fsdp_safetensors_close(h) end
    if not ok2 then error(e2, 0) end
  end)
  agree(s, not ok and err or nil, what)
  for _, g in ipairs(staged) do
    check(C.fsdp_unit_state_set(g.unit.handle, C.FSDP_STATE_PARAM, 0, g.n, g.buf:ptr()), what)
    local z = tensor.new(math.max(g.n, 1)):fill(0)
    check(C.fsdp_unit_state_set(g.unit.handle, C.FSDP_STATE_OPT1, 0, g.n, z:ptr()), what)
    check(C.fsdp_unit_state_set(g.unit.handle, C.FSDP_STATE_OPT2, 0, g.n, z:ptr()), what)
    check(C.fsdp_unit_state_publish(g.unit.handle), what)
    g.buf:free(); z:free()
  end
  s.step_count = 0
end

return M

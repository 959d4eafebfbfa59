-- fsdp.hf: Hugging Face interchange for Llama models (docs/CHECKPOINTS.md).
--   hf.export(s, cfg, dir, {dtype = "bf16" | "fp32", shard_bytes = 5e9, files = {name = bytes}})
--   hf.import(s, cfg, dir, {seq = 4096, quiet = false})  -> {notes = {...}}
-- export writes model-0000k-of-0000n.safetensors, model.safetensors.index.json
-- and config.json with Hugging Face's Llama tensor names (fsdp uses the same
-- names, shapes and rotary convention, so no tensor is permuted), and
-- o.files (the tokenizer's files, generation_config.json). Each rank
-- writes its own element ranges straight into the files at their offsets:
-- no rank ever holds more than its shard. import reads, on each rank, only
-- the ranges it holds. Both are collective over the model's ranks. import
-- holds cfg against the folder's config.json first (fsdp.hf_config).
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local json = require "fsdp.json"
local ckpt = require "fsdp.checkpoint"
local hf_config = require "fsdp.hf_config"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}

local function last_error() return ffi.string(C.fsdp_last_error()) end
local collective = require "fsdp.collective"
local world, agree = collective.world, collective.agree

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
  -- a failed export leaves nothing behind: rank 0 removes the half-written
  -- DIR.tmp (after agree, every rank is done writing into it)
  local function agree_or_clean(e)
    local ok2, failure = pcall(agree, s, e, what)
    if ok2 then return end
    if r == 0 then C.fsdp_fs_remove_tree(tmp) end
    error(failure, 0)
  end
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
  agree_or_clean(err)
  s:synchronize() -- every rank, every unit, before the owners read their pieces (checkpoint.save says why)
  -- this rank's ranges, converted and written in place
  local ok, e = pcall(function()
    local touched = {}
    for _, u in ipairs(s.units) do
      for _, pc in ipairs(ckpt.pieces(u, 1)) do
        collective.stop_check("the export", "export")
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
  agree_or_clean(not ok and e or nil)
  if r == 0 then
    ok, e = pcall(function()
      local map = {}
      for _, f in ipairs(files) do for _, t in ipairs(f) do map[t.name] = f.name end end
      local idx = json.encode({ metadata = { total_size = total }, weight_map = map })
      check(C.fsdp_fs_write_atomic(tmp .. "/model.safetensors.index.json", idx, #idx), what)
      local cj = hf_config.encode(cfg, dtype)
      check(C.fsdp_fs_write_atomic(tmp .. "/config.json", cj, #cj), what)
      for name, bytes in pairs(o.files or {}) do -- the tokenizer and generation_config.json (fsdp.hf_files)
        if name ~= "config.json" then check(C.fsdp_fs_write_atomic(tmp .. "/" .. name, bytes, #bytes), what) end
      end
      check(C.fsdp_fs_remove_tree(dir), what)
      check(C.fsdp_fs_rename(tmp, dir), what)
    end)
    err = not ok and e or nil
  end
  agree_or_clean(err)
  return { files = #files, bytes = total }
end

-- The files transformers would load, in its order of preference:
-- model.safetensors alone; else the files model.safetensors.index.json
-- lists (a stale extra shard beside them is not read); else every
-- *.safetensors file. Returns the names and the index's weight_map (or nil).
local function weight_files(dir)
  local names = ckpt.list(dir)
  local have = {}
  for _, f in ipairs(names) do have[f] = true end
  if have["model.safetensors"] then return { "model.safetensors" } end
  if have["model.safetensors.index.json"] then
    local path = dir .. "/model.safetensors.index.json"
    local ok, idx = pcall(json.decode, ckpt.read_text(path) or "")
    if not ok then error(path .. ": " .. tostring(idx), 0) end
    if type(idx) ~= "table" or type(idx.weight_map) ~= "table" then error(path .. ": no weight_map object", 0) end
    local files, seen = {}, {}
    for name, f in pairs(idx.weight_map) do
      if type(f) ~= "string" then error(string.format("%s: weight_map['%s'] is not a file name", path, name), 0) end
      if not have[f] then error(string.format("%s: lists %s (for '%s'), which is not in %s", path, f, name, dir), 0) end
      if not seen[f] then files[#files + 1], seen[f] = f, true end
    end
    table.sort(files)
    return files, idx.weight_map
  end
  local files = {}
  for _, f in ipairs(names) do if f:match("%.safetensors$") then files[#files + 1] = f end end
  return files
end

-- the weight files of dir, opened: name -> {st, index, file, shape, dtype}
local function open_dir(dir)
  local found, handles = {}, {}
  local files, map = weight_files(dir)
  local function fail(msg)
    for _, x in ipairs(handles) do C.fsdp_safetensors_close(x) end
    error(msg, 0)
  end
  for _, f in ipairs(files) do
    local h = ffi.new("fsdp_safetensors *[1]")
    if C.fsdp_safetensors_open(dir .. "/" .. f, h) < 0 then fail(last_error()) end
    handles[#handles + 1] = h[0]
    local ent = ffi.new("fsdp_safetensors_entry")
    for i = 0, C.fsdp_safetensors_count(h[0]) - 1 do
      C.fsdp_safetensors_entry_get(h[0], i, ent)
      local name = ffi.string(ent.name)
      if found[name] then fail(string.format("%s: tensor '%s' is in both %s and %s", dir, name, found[name].file, f)) end
      local shape = {}
      for k = 0, ent.ndim - 1 do shape[#shape + 1] = tonumber(ent.shape[k]) end
      found[name] = { st = h[0], index = i, file = f, shape = shape, dtype = ffi.string(ent.dtype) }
    end
  end
  for name, f in pairs(map or {}) do
    if not found[name] or found[name].file ~= f then
      fail(string.format("%s/model.safetensors.index.json puts '%s' in %s, but %s", dir, name, f,
        found[name] and ("it is in " .. found[name].file) or "that file does not have it"))
    end
  end
  if #handles == 0 then error(dir .. ": no .safetensors files", 0) end
  return found, handles
end
M.open_dir = open_dir -- (fsdp.inference reads whole tensors through it)

-- A tied model takes an untied file's lm_head.weight only when it is the
-- embedding bit for bit (else the model would compute with other weights
-- than the files'). Each rank compares the embedding ranges it holds
-- (pc: a piece of model.embed_tokens.weight).
local function check_tied_head(dir, found, pc)
  local head, emb = found["lm_head.weight"], found["model.embed_tokens.weight"]
  if table.concat(head.shape, "x") ~= table.concat(emb.shape, "x") then
    error(string.format("%s: lm_head.weight (in %s) has shape %s, the embedding %s, but the model ties them " ..
      "(tie_word_embeddings = true)", dir, head.file, table.concat(head.shape, "x"), table.concat(emb.shape, "x")), 0)
  end
  local n = pc["end"] - pc.begin
  local a, b = tensor.new(n), tensor.new(n)
  local ok = C.fsdp_safetensors_read(head.st, head.index, pc.begin, pc["end"], a:ptr()) >= 0
    and C.fsdp_safetensors_read(emb.st, emb.index, pc.begin, pc["end"], b:ptr()) >= 0
  local fa, fb = ffi.cast("float *", a:ptr()), ffi.cast("float *", b:ptr())
  local ua, ub = ffi.cast("uint32_t *", fa), ffi.cast("uint32_t *", fb)
  local msg = not ok and last_error() or nil
  for i = 0, ok and n - 1 or -1 do
    if ua[i] ~= ub[i] then
      msg = string.format("%s: lm_head.weight (in %s) differs from model.embed_tokens.weight (element %d: %.9g vs %.9g), but " ..
        "the model ties them (tie_word_embeddings = true), so the files' head would be dropped. Set " ..
        "model.tie_word_embeddings = false", dir, head.file, pc.begin + i, base.f32(fa, i), base.f32(fb, i))
      break
    end
  end
  a:free(); b:free()
  if msg then error(msg, 0) end
end

-- What dir/config.json says against cfg: refuses a disagreement; returns
-- the warnings (none refuse).
local function check_config(cfg, dir, seq)
  local file, _, path = hf_config.read(dir)
  if not file then
    return { string.format("%s has no config.json: nothing but the tensors' names and shapes could be checked (the " ..
      "model's rope_theta, rope_scaling, rms_norm_eps and hidden_act are taken to be the files')", dir) }
  end
  hf_config.check(cfg, file, path)
  if seq and seq > file.max_position_embeddings then
    return { string.format("sequences of %d tokens are longer than %s's max_position_embeddings = %d (positions past it " ..
      "were never trained)", seq, path, file.max_position_embeddings) }
  end
  return {}
end

-- Initialises s from the safetensors files in dir (any sharding of them):
-- main params from the files, optimizer state zero, optimizer step 0.
-- cfg (the model's llama config) must agree with dir/config.json where
-- there is one (fsdp.hf_config.check). o.seq: the run's sequence length
-- (a warning when past config.json's max_position_embeddings); o.quiet:
-- rank 0 does not print the warnings. Returns {notes = warnings}.
function M.import(s, cfg, dir, o)
  o = o or {}
  local what = "hf.import from " .. dir
  local list, by_name = ckpt.catalogue(s)
  local staged, notes, guard = {}, {}, ckpt.finite_guard()
  local ok, err = pcall(function()
    notes = check_config(cfg, dir, o.seq)
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
          guard.scan(by_name[pc.name], 0, pc.begin, buf:ptr() + pc.off, pc["end"] - pc.begin)
          if pc.name == "model.embed_tokens.weight" and cfg.tie_word_embeddings and found["lm_head.weight"] then
            check_tied_head(dir, found, pc)
          end
        end
        staged[#staged + 1] = { unit = u, buf = buf, n = n }
      end
    end)
    for _, h in ipairs(handles) do C.fsdp_safetensors_close(h) end
    if not ok2 then error(e2, 0) end
  end)
  agree(s, not ok and err or nil, what)
  local bad = guard.verdict(s, list, { "param" })
  if bad then
    for _, g in ipairs(staged) do g.buf:free() end
    error(string.format("%s: %s", what, bad), 0)
  end
  for _, g in ipairs(staged) do
    check(C.fsdp_unit_state_set(g.unit.handle, C.FSDP_STATE_PARAM, 0, g.n, g.buf:ptr()), what)
    local z = tensor.new(math.max(g.n, 1)):fill(0)
    check(C.fsdp_unit_state_set(g.unit.handle, C.FSDP_STATE_OPT1, 0, g.n, z:ptr()), what)
    check(C.fsdp_unit_state_set(g.unit.handle, C.FSDP_STATE_OPT2, 0, g.n, z:ptr()), what)
    check(C.fsdp_unit_state_publish(g.unit.handle), what)
    g.buf:free(); z:free()
  end
  s.step_count = 0
  if not o.quiet and world(s) == 0 then
    for _, n in ipairs(notes) do print(what .. ": warning: " .. n) end
    io.stdout:flush()
  end
  return { notes = notes }
end

M.plan_files, M.header = plan_files, header -- (fsdp.weight_stream writes files as these do)
return M

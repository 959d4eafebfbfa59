-- fsdp.weight_stream: a sharded model's full weights streamed out under
-- their Hugging Face names, one unit at a time, in buckets: to a Lua
-- callback (a rollout engine's weight sync) or to a safetensors folder.
-- fsdp.engine's export_weights (docs/TRAINING.md, "Post-training").
--
-- Each unit is gathered as a forward gathers it (ZeRO 3: its all-gather
-- into a pool buffer; resident units as they are), its parameters copied
-- (cast to o.dtype) into rank 0's bucket, and resharded before the next:
-- beyond the bucket, a unit at most is held. A bucket is the tensors in
-- model order up to o.bucket_bytes (one larger tensor goes alone), the
-- rule fsdp.hf's export cuts files by, so a folder's files are the
-- buckets. Collective: every rank calls it; rank 0 alone emits. A
-- consumer's or a write's failure is agreed on by every rank after the
-- last unit (none is left waiting in a gather) and raised on all.
local fsdp_ffi = require "fsdp.ffi"
local hooks = require "fsdp.unit_hooks"
local ckpt = require "fsdp.checkpoint"
local collective = require "fsdp.collective"
local hf = require "fsdp.hf"
local hf_config = require "fsdp.hf_config"
local json = require "fsdp.json"
local ffi, C, check = fsdp_ffi.ffi, fsdp_ffi.C, fsdp_ffi.check

local M = {}

local dtypes = { bf16 = { C.FSDP_BF16, 2, "BF16" }, fp32 = { C.FSDP_FP32, 4, "F32" } }

-- emit(bucket) on rank 0 for each bucket: {tensors = {{name, shape, numel,
-- offset (bytes into data)}, ...}, bytes, data (a uint8_t pointer, valid
-- during the call), dtype}. Returns {buckets, bytes, largest_bucket}.
function M.stream(s, o, emit)
  o = o or {}
  local dtype = o.dtype or "bf16"
  local dt = dtypes[dtype]
  if not dt then error("export_weights: dtype '" .. tostring(dtype) .. "' (expected bf16 or fp32)", 3) end
  local cap = o.bucket_bytes or 512 * 2 ^ 20
  if type(cap) ~= "number" or cap < 1 then error("export_weights: bucket_bytes = " .. tostring(cap) .. "; expected > 0", 3) end
  local r = collective.world(s)
  local in_dt = s.param_dtype == "bf16" and C.FSDP_BF16 or C.FSDP_FP32
  local es_in = s.param_dtype == "bf16" and 2 or 4
  local list = ckpt.catalogue(s)
  local largest, total = 0, 0
  for _, e in ipairs(list) do
    largest, total = math.max(largest, e.numel * dt[2]), total + e.numel * dt[2]
  end
  local buf, staging, staging_bytes
  if r == 0 then buf = ffi.new("uint8_t[?]", math.max(math.min(cap, total), largest, 1)) end
  local cur, stats, failed = { tensors = {}, bytes = 0 }, { buckets = 0, bytes = 0, largest_bucket = 0 }, nil
  local function flush()
    if #cur.tensors == 0 then return end
    stats.buckets, stats.bytes = stats.buckets + 1, stats.bytes + cur.bytes
    stats.largest_bucket = math.max(stats.largest_bucket, cur.bytes)
    if not failed then
      local ok, e = pcall(emit, { tensors = cur.tensors, bytes = cur.bytes, data = buf, dtype = dtype })
      if not ok then failed = tostring(e) end
    end
    cur = { tensors = {}, bytes = 0 }
  end
  s:synchronize()
  for _, u in ipairs(s.units) do
    hooks.unshard(u)
    check(C.fsdp_unit_wait(u.handle, nil), "export_weights: unit '" .. u.name .. "'")
    if r == 0 then
      local base = ffi.cast("uint8_t *", C.fsdp_unit_params(u.handle))
      for _, p in ipairs(u.params) do
        local n = p.spec.numel
        local b = n * dt[2]
        if cur.bytes > 0 and cur.bytes + b > cap then flush() end
        local src = base + p.offset * es_in
        if s.device == "cuda" then -- to the host first: one parameter's bytes at a time
          if not staging or staging_bytes < n * es_in then staging, staging_bytes = ffi.new("uint8_t[?]", n * es_in), n * es_in end
          check(C.fsdp_memcpy(staging, src, n * es_in, nil), "export_weights: '" .. p.name .. "'")
          src = staging
        end
        check(C.fsdp_convert(buf + cur.bytes, dt[1], src, in_dt, n), "export_weights: '" .. p.name .. "'")
        cur.tensors[#cur.tensors + 1] = { name = p.name, shape = p.spec.shape or { n }, numel = n, offset = cur.bytes }
        cur.bytes = cur.bytes + b
      end
    end
    hooks.reshard(u, s)
  end
  if r == 0 then flush() end
  collective.agree(s, failed, "export_weights")
  return stats
end

-- To a Hugging Face folder: the buckets as safetensors files (named as
-- save_pretrained names its shards), the index, config.json and o.files
-- (the tokenizer's, fsdp.hf_files); written as DIR.tmp and renamed into
-- place, or nothing when it fails.
function M.to_folder(s, cfg, dir, o)
  o = o or {}
  local dtype = o.dtype or "bf16"
  local dt = dtypes[dtype]
  if not dt then error("export_weights: dtype '" .. tostring(dtype) .. "' (expected bf16 or fp32)", 2) end
  local r = collective.world(s)
  local files = hf.plan_files(ckpt.catalogue(s), dt[2], o.bucket_bytes or 512 * 2 ^ 20)
  local tmp, what = dir:gsub("/+$", "") .. ".tmp", "export_weights to " .. dir
  local k, map, total = 0, {}, 0
  if r == 0 then
    check(C.fsdp_fs_remove_tree(tmp), what)
    check(C.fsdp_fs_mkdirs(tmp), what)
  end
  local ok, e = pcall(M.stream, s, o, function(bucket)
    k = k + 1
    local f = files[k]
    if not f or #f ~= #bucket.tensors then error(what .. ": bucket " .. k .. " is not file " .. k .. " of the plan", 0) end
    local head, hlen = hf.header(f, dt[3])
    local path = tmp .. "/" .. f.name
    check(C.fsdp_fs_create(path, hlen + bucket.bytes), what)
    check(C.fsdp_fs_pwrite(path, 0, head, hlen), what)
    check(C.fsdp_fs_pwrite(path, hlen, bucket.data, bucket.bytes), what)
    check(C.fsdp_fs_fsync(path), what)
    for _, t in ipairs(bucket.tensors) do map[t.name] = f.name end
    total = total + bucket.bytes
  end)
  if ok and r == 0 then
    ok, e = pcall(function()
      local idx = json.encode({ metadata = { total_size = total }, weight_map = map })
      check(C.fsdp_fs_write_atomic(tmp .. "/model.safetensors.index.json", idx, #idx), what)
      local cj = hf_config.encode(cfg, dtype)
      check(C.fsdp_fs_write_atomic(tmp .. "/config.json", cj, #cj), what)
      for name, bytes in pairs(o.files or {}) do
        if name ~= "config.json" then check(C.fsdp_fs_write_atomic(tmp .. "/" .. name, bytes, #bytes), what) end
      end
      check(C.fsdp_fs_remove_tree(dir), what)
      check(C.fsdp_fs_rename(tmp, dir), what)
    end)
  end
  local agreed, failure = pcall(collective.agree, s, not ok and tostring(e) or nil, what)
  if not agreed then
    if r == 0 then C.fsdp_fs_remove_tree(tmp) end
    error(failure, 0)
  end
  return { files = #files, bytes = total }
end

return M

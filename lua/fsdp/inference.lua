-- fsdp.inference: a model held whole for inference (fsdp generate): one
-- tensor per parameter, read from a checkpoint's params or a Hugging Face
-- folder's safetensors, bound to the modules as fully_shard binds its
-- views; no optimizer state, no gradients, no unit buffers: 4 bytes a
-- parameter in fp32 (CPU or GPU) or 2 in bf16 (GPU), where a one-rank
-- training job holds 16. Every parameter is checked for its shape and for
-- a NaN or infinity (refused naming the tensor and element), and a tensor
-- the model does not have is refused, as hf.import and checkpoint.load do.
--
--   local held = inference.load(model, {checkpoint = path} | {hf = dir}, {device = "cuda", dtype = "bf16"})
--   local y = held:infer(function(model, ctx) return model:forward_last(ctx, ids) end, kv)
--   held:free()
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local nn = require "fsdp.nn"
local binding = require "fsdp.binding"
local autograd = require "fsdp.autograd"
local hf = require "fsdp.hf"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}

local function last_error() return ffi.string(C.fsdp_last_error()) end
local function shape_str(shape) return table.concat(shape, "x") end

-- every parameter the model owns, in model order: {name, numel, shape, module, key}
local function catalogue(model)
  local list = {}
  nn.walk(model, function(m, path)
    for _, p in ipairs(m.params or {}) do
      list[#list + 1] = { name = path .. "." .. p.name, numel = p.numel, shape = p.shape or { p.numel }, module = m,
        key = p.name }
    end
  end)
  return list
end

-- a reader of whole fp32 tensors from a checkpoint or a folder:
-- read(e, dst) fills dst (float *) with e's values; shape_of(name); names(); close()
local function checkpoint_reader(path)
  local h = ffi.new("fsdp_ckpt *[1]")
  if C.fsdp_ckpt_open(path, h) < 0 then error(path .. ": " .. last_error(), 0) end
  local c = h[0]
  local shapes = {}
  local name_p, nd, dims = ffi.new("const char *[1]"), ffi.new("int[1]"), ffi.new("int64_t[8]")
  for i = 0, C.fsdp_ckpt_tensor_count(c) - 1 do
    check(C.fsdp_ckpt_tensor_info(c, i, name_p, nd, dims), path)
    local s = {}
    for k = 0, nd[0] - 1 do s[#s + 1] = tonumber(dims[k]) end
    shapes[ffi.string(name_p[0])] = s
  end
  return {
    where = path,
    shapes = shapes,
    read = function(e, dst)
      if C.fsdp_ckpt_read(c, e.name, "param", 0, e.numel, dst) < 0 then error(last_error(), 0) end
    end,
    close = function() C.fsdp_ckpt_close(c) end,
  }
end

local function folder_reader(dir)
  local found, handles = hf.open_dir(dir)
  local shapes = {}
  for name, f in pairs(found) do shapes[name] = f.shape end
  return {
    where = dir,
    shapes = shapes,
    file_of = function(name) return found[name].file end,
    read = function(e, dst)
      local f = found[e.name]
      if C.fsdp_safetensors_read(f.st, f.index, 0, e.numel, dst) < 0 then error(last_error(), 0) end
    end,
    close = function() for _, x in ipairs(handles) do C.fsdp_safetensors_close(x) end end,
  }
end

local Held = {}
Held.__index = Held

-- source: {checkpoint = path} or {hf = dir}; o.device ("cpu" | "cuda"),
-- o.dtype ("fp32" | "bf16", bf16 on cuda only), o.tied (the model computes
-- its head with the embedding: a folder's lm_head.weight is then not read)
function M.load(model, source, o)
  o = o or {}
  local device, dtype = o.device or "cpu", o.dtype or "fp32"
  if dtype == "bf16" and device ~= "cuda" then error("inference: bf16 weights compute on a GPU (CPU ops are fp32)", 0) end
  local rd = source.checkpoint and checkpoint_reader(source.checkpoint) or folder_reader(source.hf)
  local held = setmetatable({ model = model, device = device, dtype = dtype, params = {}, bytes = 0 }, Held)
  local ok, err = pcall(function()
    local list, want = catalogue(model), {}
    for _, e in ipairs(list) do
      want[e.name] = true
      local s = rd.shapes[e.name]
      if not s then error(string.format("%s: no tensor '%s' (shape %s)", rd.where, e.name, shape_str(e.shape)), 0) end
      if shape_str(s) ~= shape_str(e.shape) then
        error(string.format("%s: tensor '%s' has shape %s; the model expects %s", rd.where, e.name, shape_str(s),
          shape_str(e.shape)), 0)
      end
    end
    for name in pairs(rd.shapes) do -- tensors the model would silently drop
      local tied_head = name == "lm_head.weight" and o.tied
      if not want[name] and not tied_head and not name:match("rotary_emb%.inv_freq$") then
        error(string.format("%s: tensor '%s' is not part of this model (another architecture or size?)", rd.where, name), 0)
      end
    end
    local host = nil
    for _, e in ipairs(list) do
      if not host or host:numel() < e.numel then
        if host then host:free() end
        host = tensor.new(e.numel)
      end
      local hp = host:ptr()
      rd.read(e, hp)
      local bad = tonumber(C.fsdp_find_nonfinite(hp, e.numel))
      if bad >= 0 then
        error(string.format("%s: tensor '%s' element %d is %s; refusing to compute with it", rd.where, e.name, bad,
          tostring(base.f32(hp, bad))), 0)
      end
      local t = tensor.new(e.shape, dtype, device)
      if device == "cuda" then
        if dtype == "fp32" then
          check(C.fsdp_memcpy(t.data, hp, e.numel * 4, nil), "inference: " .. e.name)
        else
          local b = tensor.new(e.numel, "bf16")
          check(C.fsdp_convert(b.data, C.FSDP_BF16, hp, C.FSDP_FP32, e.numel), "inference: " .. e.name)
          check(C.fsdp_memcpy(t.data, b.data, e.numel * 2, nil), "inference: " .. e.name)
          b:free()
        end
      else
        ffi.copy(t.data, hp, e.numel * 4)
      end
      held.params[e.name] = t
      held.bytes = held.bytes + t:nbytes()
      -- the CPU ops take float *; the CUDA ones the compute dtype's void * (fsdp.binding)
      binding.bind_one(e.module, e.key, device == "cuda" and t.data or ffi.cast("float *", t.data), dtype)
    end
    if host then host:free() end
    -- a module computing with another's weights (a tied head) gets its pointers
    nn.walk(model, function(m)
      if m.shares then binding.share(m) end
    end)
  end)
  rd.close()
  if not ok then
    held:free()
    error(err, 0)
  end
  return held
end

-- fn(model, ctx) without grads: ctx binds nothing (the weights are bound
-- once) and carries kv, the KV cache (fsdp.models.llama's forward_cached);
-- returns fn's results (tensors move to the caller)
function Held:infer(fn, kv)
  if not self.params then error("inference: the model was freed", 2) end
  local ctx = { no_grad = true, kv = kv, enter = function() end, leave = function() end }
  return autograd.scope(fn, self.model, ctx)
end

function Held:free()
  for _, t in pairs(self.params or {}) do t:free() end
  self.params = nil
  if self.model.release then self.model:release() end
end

return M

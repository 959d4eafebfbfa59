-- fsdp.tensor: contiguous buffers of fp32/bf16/fp16/fp64/int32 elements, 1 to 4-D,
-- on the CPU or a GPU, allocated by the engine. Freed at once by t:free()
-- (idempotent), by fsdp.autograd's rules when allocated inside a module's
-- forward or backward, or else by the garbage collector.
-- Inside M.counting (fsdp.dry_run) every new tensor is a meta tensor: its
-- shape, dtype and device, no memory; its bytes are counted from tensor.new
-- to free, and fsdp.ops do no work on it, so a model's real code run there
-- says what it would hold at each moment, and nothing more.
local base = require "fsdp.ffi"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}
local Tensor = {}
Tensor.__index = Tensor

local dtypes = { fp32 = C.FSDP_FP32, bf16 = C.FSDP_BF16, fp16 = C.FSDP_FP16, fp64 = C.FSDP_FP64, int32 = C.FSDP_INT32 }
local dtype_names = {}
for k, v in pairs(dtypes) do dtype_names[tonumber(v)] = k end
local ctypes = { fp32 = "float *", bf16 = "uint16_t *", fp16 = "uint16_t *", fp64 = "double *", int32 = "int32_t *" }
local devices = { cpu = C.FSDP_CPU, cuda = C.FSDP_CUDA }

function M.dtype(name)
  local v = dtypes[name]
  if not v then error(string.format("unknown dtype '%s' (expected fp32, bf16, fp16, fp64 or int32)", tostring(name)), 2) end
  return v
end

function M.dtype_name(v) return dtype_names[tonumber(v)] end

function M.device(name)
  local v = devices[name]
  if not v then error(string.format("unknown device '%s' (expected cpu or cuda)", tostring(name)), 2) end
  return v
end

-- the counting device: bytes held by meta tensors now, and the most held
-- since counting began (nil: tensors are real)
local counter = nil

local function release(t)
  if t.meta then
    if t.data ~= nil and t.counted and counter then counter.allocated = counter.allocated - t.n * t.esize end
    t.data = nil
  elseif t.data ~= nil then
    C.fsdp_tensor_free(ffi.gc(t.c, nil)) -- a view frees nothing
    t.data = nil
  end
end

local function wrap(c, shape, dtype, device)
  local t = setmetatable({ c = c, shape = shape, dtype = dtype, device = device, n = tonumber(C.fsdp_tensor_numel(c)),
    dtype_id = c.dtype, device_id = c.device, data = c.data }, Tensor)
  t.esize = tonumber(C.fsdp_dtype_size(t.dtype_id))
  return t
end

-- a tensor of the counting device: its bytes held from now until freed
local function meta(shape, dtype, device, n, base)
  local t = setmetatable({ meta = true, shape = shape, dtype = dtype, device = device, n = n,
    esize = tonumber(C.fsdp_dtype_size(dtypes[dtype])),
    data = true, base = base }, Tensor)
  -- only the counted device's bytes (a GPU's plan leaves the host's out)
  if not base and device == counter.device then
    t.counted = true
    counter.allocated = counter.allocated + n * t.esize
    if counter.allocated > counter.peak then counter.peak = counter.allocated end
  end
  return t
end

-- fn(...) with every tensor made by tensor.new a meta tensor; c = {device,
-- allocated, peak} (bytes on that device; both may start above 0) is
-- updated as they come and go.
-- Nests not: a count is of one run.
function M.counting(c, fn, ...)
  if counter then error("tensor.counting: a count is already running", 2) end
  counter = c
  local ok, a, b = pcall(fn, ...)
  counter = nil
  if not ok then error(a, 0) end
  return a, b
end
function M.is_counting() return counter ~= nil end

-- bytes held for a moment on the counting device (a kernel's workspace
-- taken from the allocator while it runs): the peak sees them, nothing stays
function M.count_transient(bytes)
  if counter and counter.allocated + bytes > counter.peak then counter.peak = counter.allocated + bytes end
end

-- fsdp.tensor(n | {d1, d2, ...}, dtype = "fp32", device = "cpu")
function M.new(shape, dtype, device)
  dtype, device = dtype or "fp32", device or "cpu"
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" or #shape < 1 or #shape > 4 then
    error("fsdp.tensor: shape must be a size or a list of 1 to 4 sizes", 2)
  end
  local numel = 1
  for i, d in ipairs(shape) do
    if type(d) ~= "number" or d < 0 or d % 1 ~= 0 then
      error(string.format("fsdp.tensor: dimension %d is %s; expected an integer >= 0", i, tostring(d)), 2)
    end
    numel = numel * d
  end
  if counter then
    M.dtype(dtype); M.device(device) -- (the names checked as for a real one)
    local t = meta(shape, dtype, device, numel)
    if M.on_new then M.on_new(t) end
    return t
  end
  local c = ffi.new("fsdp_tensor")
  local dims = ffi.new("int64_t[4]", shape)
  check(C.fsdp_tensor_alloc(c, M.device(device), M.dtype(dtype), #shape, dims), "fsdp.tensor")
  -- the C struct carries a C finalizer: a Lua closure over t would make a
  -- cycle through LuaJIT's finalizer table (no ephemerons) and t would
  -- never be collected
  ffi.gc(c, C.fsdp_tensor_free)
  local t = wrap(c, shape, dtype, device)
  if M.on_new then M.on_new(t) end -- fsdp.autograd: the open scope owns it
  return t
end

function Tensor:free() release(self) end

-- A tensor over elements [offset, offset + numel(shape)) of this one, no copy.
-- It keeps this tensor alive; using it after this one is freed is an error.
function Tensor:view(offset, shape)
  if self.data == nil then error("tensor:view: tensor used after free()", 2) end
  if type(shape) == "number" then shape = { shape } end
  if self.meta then
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    if offset < 0 or offset + n > self.n then
      error(string.format("tensor:view: elements [%d, %d) of a tensor of %d", offset, offset + n, self.n), 2)
    end
    return meta(shape, self.dtype, self.device, n, self)
  end
  local c = ffi.new("fsdp_tensor")
  check(C.fsdp_tensor_view(c, self.c, offset, #shape, ffi.new("int64_t[4]", shape)), "tensor:view")
  local v = wrap(c, shape, self.dtype, self.device)
  v.base = self
  return v
end
function Tensor:numel() return self.n end
function Tensor:nbytes() return self.n * self.esize end

local function dead(t) return t.data == nil or (t.base ~= nil and dead(t.base)) end
M.dead = dead -- true once t (or the tensor it views) is freed

function Tensor:ptr()
  if self.meta then error("a meta tensor (fsdp.dry_run) has no memory: this code reads or writes elements", 2) end
  if dead(self) then error("tensor used after free() (of it or of the tensor it views)", 2) end
  return ffi.cast(ctypes[self.dtype], self.data)
end

local function host_only(t, what)
  if t.device ~= "cpu" then error(what .. ": the tensor is on " .. t.device .. "; copy it to the cpu first", 3) end
  if dead(t) then error(what .. ": tensor used after free() (of it or of the tensor it views)", 3) end
end

local function bounds(t, i, what)
  if type(i) ~= "number" or i < 0 or i >= t.n or i % 1 ~= 0 then
    error(string.format("%s: index %s out of range [0, %d)", what, tostring(i), t.n), 3)
  end
end

function Tensor:get(i)
  host_only(self, "tensor:get")
  bounds(self, i, "tensor:get")
  return base.readers[self.dtype](self:ptr(), i) -- a NaN read as Lua's own (ffi.lua)
end

function Tensor:set(i, v)
  host_only(self, "tensor:set")
  bounds(self, i, "tensor:set")
  local p = self:ptr()
  if self.dtype == "bf16" then p[i] = C.fsdp_f32_to_bf16(v)
  elseif self.dtype == "fp16" then p[i] = C.fsdp_f32_to_fp16(v)
  else p[i] = v end
end

function Tensor:fill(v)
  host_only(self, "tensor:fill")
  local p = self:ptr()
  local bits = v
  if self.dtype == "bf16" then bits = C.fsdp_f32_to_bf16(v) elseif self.dtype == "fp16" then bits = C.fsdp_f32_to_fp16(v) end
  for i = 0, self.n - 1 do p[i] = bits end
  return self
end

function Tensor:to_table()
  local out = {}
  for i = 0, self.n - 1 do out[i + 1] = self:get(i) end
  return out
end

-- An error (at the caller's caller) unless t is a tensor whose memory is live.
function M.need_live(t, what, which)
  if getmetatable(t) ~= Tensor then
    error(string.format("%s: %s must be an fsdp.tensor, got %s", what, which, type(t)), 3)
  end
  if dead(t) then error(string.format("%s: %s used after free() (of it or of the tensor it views)", what, which), 3) end
end

-- self <- src (same number of bytes), on stream s or at once. With a stream
-- the copy is asynchronous: keep both tensors referenced until it is done.
function Tensor:copy_from(src, s)
  M.need_live(self, "tensor:copy_from", "dst")
  M.need_live(src, "tensor:copy_from", "src")
  if src:nbytes() ~= self:nbytes() then
    error(string.format("tensor:copy_from: %d bytes into %d bytes", src:nbytes(), self:nbytes()), 2)
  end
  if self.meta or src.meta then
    if not (self.meta and src.meta) then error("tensor:copy_from: between a meta tensor and a real one", 2) end
    return self
  end
  local sh = nil
  if s ~= nil then
    if type(s) ~= "table" or not s.live then error("tensor:copy_from: the stream must be an fsdp.stream or nil", 2) end
    sh = s:live("tensor:copy_from")
  end
  check(C.fsdp_memcpy(self.data, src.data, self:nbytes(), sh), "tensor:copy_from")
  return self
end

function Tensor:__tostring()
  local dims = table.concat(self.shape, "x")
  local head = {}
  if self.meta then return string.format("tensor(%s, %s, %s, meta)", dims, self.dtype, self.device) end
  if self.device == "cpu" and self.data ~= nil then
    for i = 0, math.min(self.n, 6) - 1 do head[#head + 1] = string.format("%.6g", self:get(i)) end
    if self.n > 6 then head[#head + 1] = "..." end
  end
  return string.format("tensor(%s, %s, %s)%s", dims, self.dtype, self.device,
    #head > 0 and (" [" .. table.concat(head, ", ") .. "]") or "")
end

M.Tensor = Tensor
return M

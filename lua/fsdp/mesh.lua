-- fsdp.mesh: named dimensions over the ranks, and a communicator per group.
--   fsdp.mesh({{"dp_outer", 2}, {"dp_shard", -1}}, {device = "cpu"})
--   fsdp.mesh("dp_outer=2,dp_shard=-1")          (the CLI's --mesh form)
--   fsdp.mesh({dp = 4})                          (one dimension)
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local stream = require "fsdp.stream"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}
local Mesh, Comm = {}, {}
Mesh.__index, Comm.__index = Mesh, Comm

local function parse_dims(spec)
  local dims = {}
  if type(spec) == "string" then
    for item in spec:gmatch("[^,%s]+") do
      local name, size = item:match("^([%a_][%w_]*)=(%-?%d+)$")
      if not name then error(string.format("fsdp.mesh: '%s' is not name=size (e.g. dp_outer=2,dp_shard=-1)", item), 3) end
      dims[#dims + 1] = { name, tonumber(size) }
    end
  elseif type(spec) == "table" and #spec > 0 then
    for i, d in ipairs(spec) do
      if type(d) ~= "table" or type(d[1]) ~= "string" or type(d[2]) ~= "number" then
        error(string.format("fsdp.mesh: dimension %d must be {name, size}, e.g. {'dp_shard', 4}", i), 3)
      end
      dims[#dims + 1] = { d[1], d[2] }
    end
    for k in pairs(spec) do
      if type(k) ~= "number" then
        error(string.format("fsdp.mesh: key '%s' in the list of dimensions; give only {name, size} pairs", tostring(k)), 3)
      end
    end
  elseif type(spec) == "table" then
    for name, size in pairs(spec) do dims[#dims + 1] = { name, size } end
    if #dims > 1 then
      error("fsdp.mesh: give dimensions as an ordered list, e.g. {{'dp_outer',2},{'dp_shard',4}} " ..
        "(Lua tables with names as keys have no order)", 3)
    end
  end
  if #dims == 0 then error("fsdp.mesh: no dimensions given", 3) end
  for _, d in ipairs(dims) do
    local size = d[2]
    if type(size) ~= "number" or size % 1 ~= 0 or (size < 1 and size ~= -1) then
      error(string.format("fsdp.mesh: dimension '%s' has size %s; expected a positive integer or -1 (the rest)",
        tostring(d[1]), tostring(size)), 3)
    end
  end
  return dims
end

function M.new(spec, opts)
  opts = opts or {}
  local dims = parse_dims(spec)
  local names = ffi.new("const char *[?]", #dims)
  local sizes = ffi.new("int64_t[?]", #dims)
  local keep = {}
  for i, d in ipairs(dims) do
    keep[i] = d[1]
    names[i - 1] = d[1]
    sizes[i - 1] = d[2]
  end
  local p = ffi.new("fsdp_mesh *[1]")
  check(C.fsdp_mesh_create(#dims, names, sizes, tensor.device(opts.device or "cpu"), p), "fsdp.mesh")
  return setmetatable({ handle = ffi.gc(p[0], C.fsdp_mesh_destroy), device = opts.device or "cpu", comms = {},
    names = keep }, Mesh)
end

local function live(m, what)
  if m.handle == nil then error(what .. ": mesh used after free()", 3) end
  return m.handle
end

function Mesh:free()
  if self.handle ~= nil then
    for _, c in pairs(self.comms) do c.handle = nil end
    C.fsdp_mesh_destroy(ffi.gc(self.handle, nil))
    self.handle = nil
  end
end

function Mesh:ndims() return C.fsdp_mesh_ndims(live(self, "mesh:ndims")) end

function Mesh:dims()
  local h, out = live(self, "mesh:dims"), {}
  for i = 0, C.fsdp_mesh_ndims(h) - 1 do
    out[#out + 1] = { name = ffi.string(C.fsdp_mesh_dim_name(h, i)), size = tonumber(C.fsdp_mesh_dim_size(h, i)) }
  end
  return out
end

local function dim_index(m, name, what)
  return check(C.fsdp_mesh_dim_index(live(m, what), name), what)
end

function Mesh:size(name) return tonumber(C.fsdp_mesh_dim_size(self.handle, dim_index(self, name, "mesh:size"))) end
function Mesh:coord(name) return tonumber(C.fsdp_mesh_coord(self.handle, dim_index(self, name, "mesh:coord"))) end

-- mesh:group("dp_shard"), mesh:group("dp_outer,dp_shard"), mesh:group({"dp_outer", "dp_shard"}), mesh:group("world");
-- mesh:group(names, k): the same members' communicator on channel k (1..7),
-- with its own stream, so that its collectives run beside channel 0's
function Mesh:group(names, channel)
  if type(names) == "table" then names = table.concat(names, ",") end
  names = names or "world"
  local h = live(self, "mesh:group")
  local p = ffi.new("fsdp_comm *[1]")
  check(C.fsdp_mesh_group_channel(h, names, channel or 0, p), "mesh:group")
  local key = tostring(ffi.cast("uintptr_t", p[0]))
  local c = self.comms[key]
  if not c then
    c = setmetatable({ handle = p[0], mesh = self, device = self.device, dims = names, channel = channel or 0 }, Comm)
    self.comms[key] = c
  end
  return c
end

function Mesh:describe()
  local buf = ffi.new("char[?]", 8192)
  check(C.fsdp_mesh_describe(live(self, "mesh:describe"), buf, 8192), "mesh:describe")
  return ffi.string(buf)
end
Mesh.__tostring = Mesh.describe

-- ---- communicators ----
local function comm(c, what)
  if c.handle == nil then error(what .. ": the mesh of this comm was freed", 3) end
  return c.handle
end

function Comm:rank() return C.fsdp_comm_rank(comm(self, "comm:rank")) end
function Comm:size() return C.fsdp_comm_size(comm(self, "comm:size")) end
function Comm:name() return ffi.string(C.fsdp_comm_name(comm(self, "comm:name"))) end
function Comm:members()
  local h, out = comm(self, "comm:members"), {}
  for i = 0, C.fsdp_comm_size(h) - 1 do out[#out + 1] = C.fsdp_comm_member(h, i) end
  return out
end
function Comm:stream() return stream.borrow(C.fsdp_comm_stream(comm(self, "comm:stream")), self.device, self) end
function Comm:__tostring() return string.format("comm(%s: member %d of %d)", self:name(), self:rank(), self:size()) end

local ops = { sum = C.FSDP_SUM, avg = C.FSDP_AVG }
local function op_of(op, what)
  local v = ops[op or "sum"]
  if not v then error(string.format("%s: op '%s' (expected 'sum' or 'avg')", what, tostring(op)), 3) end
  return v
end

local function need_tensor(t, what, which, c)
  if getmetatable(t) ~= tensor.Tensor then
    error(string.format("%s: %s must be an fsdp.tensor, got %s", what, which, type(t)), 3)
  end
  if tensor.dead(t) then
    error(string.format("%s: %s used after free()", what, which), 3)
  end
  if t.device ~= c.device then
    error(string.format("%s: %s is on %s but the comm's mesh is on %s", what, which, t.device, c.device), 3)
  end
end

-- Buffers of collectives still in flight stay referenced (so the collector
-- cannot free them under the comm's worker) until comm:synchronize().
local function hold(c, a, b)
  local f = c.inflight
  if not f then f = {}; c.inflight = f end
  f[#f + 1] = a
  if b then f[#f + 1] = b end
end

function Comm:all_gather(out, inp)
  local h = comm(self, "comm:all_gather")
  need_tensor(out, "comm:all_gather", "out", self); need_tensor(inp, "comm:all_gather", "in", self)
  local n, size = inp:numel(), C.fsdp_comm_size(h)
  if out:numel() ~= n * size then
    error(string.format("comm:all_gather: out has %d elements, expected %d (count %d x %d ranks)", out:numel(), n * size, n, size), 2)
  end
  if out.dtype ~= inp.dtype then error("comm:all_gather: out is " .. out.dtype .. ", in is " .. inp.dtype, 2) end
  check(C.fsdp_comm_all_gather(h, out.data, inp.data, n, inp.dtype_id), "comm:all_gather")
  hold(self, out, inp)
end

function Comm:reduce_scatter(out, inp, op)
  local h = comm(self, "comm:reduce_scatter")
  need_tensor(out, "comm:reduce_scatter", "out", self); need_tensor(inp, "comm:reduce_scatter", "in", self)
  local n, size = out:numel(), C.fsdp_comm_size(h)
  if inp:numel() ~= n * size then
    error(string.format("comm:reduce_scatter: in has %d elements, expected %d (count %d x %d ranks)", inp:numel(), n * size, n, size), 2)
  end
  check(C.fsdp_comm_reduce_scatter(h, out.data, out.dtype_id, inp.data, inp.dtype_id, n, op_of(op, "comm:reduce_scatter")),
    "comm:reduce_scatter")
  hold(self, out, inp)
end

function Comm:all_reduce(out, inp, op)
  local h = comm(self, "comm:all_reduce")
  need_tensor(out, "comm:all_reduce", "out", self); need_tensor(inp, "comm:all_reduce", "in", self)
  if out:numel() ~= inp:numel() or out.dtype ~= inp.dtype then
    error(string.format("comm:all_reduce: out is %d x %s, in is %d x %s; they must match", out:numel(), out.dtype, inp:numel(), inp.dtype), 2)
  end
  check(C.fsdp_comm_all_reduce(h, out.data, inp.data, inp:numel(), inp.dtype_id, op_of(op, "comm:all_reduce")), "comm:all_reduce")
  hold(self, out, inp)
end

function Comm:broadcast(t, root)
  local h = comm(self, "comm:broadcast")
  need_tensor(t, "comm:broadcast", "t", self)
  check(C.fsdp_comm_broadcast(h, t.data, t:numel(), t.dtype_id, root or 0), "comm:broadcast")
  hold(self, t)
end

-- comm:shift(out, inp, dist): this member sends inp to member (me + dist)
-- mod n and receives out from member (me - dist) mod n (ring attention's
-- blocks); dist defaults to 1, may be negative; out and inp separate
function Comm:shift(out, inp, dist)
  local h = comm(self, "comm:shift")
  need_tensor(out, "comm:shift", "out", self); need_tensor(inp, "comm:shift", "in", self)
  if out:numel() ~= inp:numel() or out.dtype ~= inp.dtype then
    error(string.format("comm:shift: out is %d x %s, in is %d x %s; they must match", out:numel(), out.dtype, inp:numel(), inp.dtype), 2)
  end
  dist = dist or 1
  if type(dist) ~= "number" or dist % 1 ~= 0 or math.abs(dist) >= 2 ^ 31 then
    error("comm:shift: dist must be an integer (a C int), got " .. tostring(dist), 2)
  end
  check(C.fsdp_comm_shift(h, out.data, inp.data, inp:numel(), inp.dtype_id, dist), "comm:shift")
  hold(self, out, inp)
end

-- Drops the hold on the buffers of the collectives issued so far without
-- waiting for them: for a caller that has ordered every later use of their
-- memory after them itself (a GPU's compute stream waiting on an event the
-- comm's stream recorded after them: fsdp.tp)
function Comm:release_held() self.inflight = nil end

-- Returns when every member has reached it (the C call only enqueues it,
-- like the other collectives): "rank 0 prepares, the others wait" holds
function Comm:barrier()
  check(C.fsdp_comm_barrier(comm(self, "comm:barrier")), "comm:barrier")
  self:synchronize()
end
function Comm:synchronize()
  local rc = C.fsdp_comm_synchronize(comm(self, "comm:synchronize"))
  self.inflight = nil
  check(rc, "comm:synchronize")
end
function Comm:set_timeout(s) check(C.fsdp_comm_set_timeout(comm(self, "comm:set_timeout"), s), "comm:set_timeout") end

-- What this rank sent on the comm since it was made or last reset
-- (fsdp_comm_bytes_sent: every collective issued on it, whoever issued
-- it, counted by the ring convention the planner uses: (n-1)/n of the
-- full buffer for an all-gather, a reduce-scatter or a broadcast,
-- 2(n-1)/n for an all-reduce; a shift's whole buffer, 0 for a copy).
-- comm:bytes_sent("all_gather") is one kind's bytes; comm:bytes_sent() a
-- table of every kind's and their total.
-- comm:calls(kind) likewise counts the collectives; comm:bytes_reset()
-- sets both back to 0.
local kinds = { all_gather = C.FSDP_COMM_ALL_GATHER, reduce_scatter = C.FSDP_COMM_REDUCE_SCATTER,
  all_reduce = C.FSDP_COMM_ALL_REDUCE, broadcast = C.FSDP_COMM_BROADCAST, shift = C.FSDP_COMM_SHIFT,
  total = C.FSDP_COMM_KINDS }
M.comm_kinds = { "all_gather", "reduce_scatter", "all_reduce", "broadcast", "shift" }
local function counts(c, kind, what, read)
  local h = comm(c, what)
  if kind == nil then
    local out = {}
    for k, v in pairs(kinds) do out[k] = tonumber(read(h, v)) end
    return out
  end
  local v = kinds[kind]
  if not v then
    error(string.format("%s: kind '%s' (expected all_gather, reduce_scatter, all_reduce, broadcast, shift or total)", what,
      tostring(kind)), 3)
  end
  return tonumber(read(h, v))
end
function Comm:bytes_sent(kind) return counts(self, kind, "comm:bytes_sent", C.fsdp_comm_bytes_sent) end
function Comm:calls(kind) return counts(self, kind, "comm:calls", C.fsdp_comm_calls) end
function Comm:bytes_reset() check(C.fsdp_comm_bytes_reset(comm(self, "comm:bytes_reset")), "comm:bytes_reset") end

M.Mesh, M.Comm = Mesh, Comm
M.parse_dims = parse_dims

return M

-- fsdp.nn: Torch7-style modules. A module declares its parameters (name,
-- size, init rule, no-decay) without memory; fully_shard places them in
-- units and binds pointers into the units' full buffers before each use.
-- forward(ctx, x) and backward(ctx, dy) call ctx:enter/leave around every
-- child so that the FSDP schedule (unshard, prefetch, reshard, reduce) runs
-- at unit boundaries. Activations follow their input's device and dtype
-- (fsdp.ops dispatches: CPU fp32, or CUDA in the units' compute dtype).
-- Modules never free: a forward puts what its backward needs in m.saved,
-- and fsdp.autograd's rules free every activation at its last use.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local ops = require "fsdp.ops"
local autograd = require "fsdp.autograd"
local profile = require "fsdp.profile"
local tpm = require "fsdp.tp"
local C, check = base.C, base.check

local nn = {}

local function class(kind)
  local c = { kind = kind }
  c.__index = c
  return c
end
nn.class = class -- (a module's class: its methods, and kind, the name policies and profiles see)

-- a ctx that does nothing: run a module with bound params and no sharding
local plain = { enter = function() end, leave = function() end }

-- a module's size: a positive integer, else an error naming the module and
-- the argument at the caller's caller (nn.Linear(0, 5) made a weight of no
-- elements; nn.Linear("a", 5) failed on arithmetic inside nn.lua)
local function size_arg(v, what)
  if type(v) ~= "number" or v < 1 or v % 1 ~= 0 or v > 2 ^ 40 then
    error(string.format("%s = %s; expected a positive integer", what, tostring(v)), 3)
  end
end

---------------------------------------------------------------- Linear
local Linear = class("Linear")
-- opts.std (init), opts.bias (default true). Tensor parallelism
-- (fsdp.tp): opts.tp = a tp group and opts.parallel =
--   "column"   this rank holds its part of the output features (rows of
--              the weight): its input is every row, its output its columns;
--   "row"      its part of the input features (columns of the weight):
--              its output is a partial sum, added up over the group;
--   "replicated"  every rank holds the whole weight and computes with
--              rows opts.rows = {first, count} of it (a kv projection
--              shared by tp ranks); its gradient is summed over the group.
nn.Linear = function(inp, out, opts)
  size_arg(inp, "nn.Linear: in_features")
  size_arg(out, "nn.Linear: out_features")
  opts = opts or {}
  local m = setmetatable({ inp = inp, out = out }, Linear)
  local w = { name = "weight", numel = inp * out, shape = { out, inp }, init = { "normal", 0, opts.std or 0.02 } }
  m.params = { w }
  local par, g = opts.parallel, opts.tp
  if par ~= nil then
    if not g then error(string.format("nn.Linear: parallel = '%s' needs opts.tp, a tp group (fsdp.tp.group)", tostring(par)), 2) end
    if opts.bias ~= false then error("nn.Linear: a tensor-parallel Linear has no bias here (give bias = false)", 2) end
    m.tp, m.parallel = g, par
    if par == "column" then
      local first, c = g:part(out)
      m.out, w.shape, w.numel = c, { c, inp }, c * inp
      w.slice = tpm.slice({ out, inp }, first, c, 0, inp)
    elseif par == "row" then
      local first, c = g:part(inp)
      m.inp, w.shape, w.numel = c, { out, c }, out * c
      w.slice = tpm.slice({ out, inp }, 0, out, first, c)
    elseif par == "replicated" then
      local r = opts.rows
      if type(r) ~= "table" or r[1] < 0 or r[2] < 1 or r[1] + r[2] > out then
        error("nn.Linear: parallel = 'replicated' needs opts.rows = {first, count} within its " .. out .. " outputs", 2)
      end
      m.rows, m.out, w.replicated = r, r[2], true
    else
      error(string.format("nn.Linear: parallel = '%s'; expected 'column', 'row' or 'replicated'", tostring(par)), 2)
    end
  elseif opts.bias ~= false then
    m.params[2] = { name = "bias", numel = out, shape = { out }, init = { "constant", 0 }, no_decay = true }
  end
  return m
end

-- the input's shape with its last dimension replaced
local function with_last(shape, d)
  local s = {}
  for i = 1, #shape - 1 do s[i] = shape[i] end
  s[#s + 1] = d
  return s
end
nn.with_last = with_last

-- the weight it computes with: a replicated one's rows
local function weight(m)
  local w = m.bound.weight
  if m.rows and w ~= nil then return w + m.rows[1] * m.inp end
  return w
end

function Linear:forward(ctx, x)
  local n = x:numel() / self.inp
  if n % 1 ~= 0 or x.shape[#x.shape] ~= self.inp then
    error(string.format("Linear(%d -> %d): input of shape %s does not end in %d", self.inp, self.out,
      table.concat(x.shape, "x"), self.inp), 2)
  end
  local y = ops.like(x, with_last(x.shape, self.out))
  ops.linear_forward(y, x, weight(self), self.bound.bias, n, self.inp, self.out)
  self.saved = { x = x }
  return y
end

-- self.dx_into (set by the caller, used once): a tensor of x's shape to
-- write dx into (rows of a larger gradient) instead of a new one.
-- A backward in two calls (nn.linears_backward's overlap):
-- backward_input(ctx, dy) returns dx alone, then the module's backward
-- (nn.call, its hooks) adds dW alone and returns nil. A replicated
-- Linear (its dW all-reduced over the tp group) has no split.
function Linear:backward_input(ctx, dy)
  local x = self.saved.x
  local dx = self.dx_into or ops.like(x)
  self.dx_into = nil
  ops.linear_backward(dx, nil, nil, dy, x, weight(self), x:numel() / self.inp, self.inp, self.out)
  self.input_done = true
  return dx
end

function Linear:backward(ctx, dy)
  local x = self.saved.x
  local n = x:numel() / self.inp
  if self.input_done then
    self.input_done = nil
    ops.linear_backward(nil, self.grad.weight, self.grad.bias, dy, x, self.bound.weight, n, self.inp, self.out)
    return nil
  end
  local dx = self.dx_into or ops.like(x)
  self.dx_into = nil
  if self.rows then -- every tp rank's rows' gradients, summed into the whole weight's
    local first, inp = self.rows[1], self.inp
    tpm.reduce_grad(self.tp, self.grad.weight, self.params[1].numel, function(dw)
      ops.linear_backward(dx, dw and dw + first * inp, nil, dy, x, weight(self), n, inp, self.out)
    end, dy)
    return dx
  end
  ops.linear_backward(dx, self.grad.weight, self.grad.bias, dy, x, self.bound.weight, n, self.inp, self.out)
  return dx
end

---------------------------------------------------------------- Tanh
local Tanh = class("Tanh")
nn.Tanh = function() return setmetatable({ params = {} }, Tanh) end

function Tanh:forward(ctx, x)
  local y = ops.like(x)
  ops.tanh_forward(y, x)
  self.saved = { y = y }
  return y
end

function Tanh:backward(ctx, dy)
  local dx = ops.like(dy)
  ops.tanh_backward(dx, dy, self.saved.y)
  return dx
end

---------------------------------------------------------------- Sequential
local Sequential = class("Sequential")
nn.Sequential = function(...)
  return setmetatable({ params = {}, children = { ... } }, Sequential)
end

function Sequential:forward(ctx, x, phase)
  return nn.forward_chain(ctx or plain, self.children, x, phase)
end

function Sequential:backward(ctx, dy)
  return nn.backward_chain(ctx or plain, self.children, dy)
end

-- Depth-first walk in model order: fn(module, path) for every module. A
-- module's children are named by m.child_names[i] when it has them (as
-- Hugging Face names submodules), else by their position from 0 (PyTorch's
-- Sequential). fn may return false to skip a module's children. A module
-- that appears more than once (a shared layer) is visited once, at its
-- first path, as PyTorch names a shared module's parameters once.
function nn.walk(m, fn, path, seen)
  path, seen = path or "", seen or {}
  if seen[m] then return end
  seen[m] = true
  if fn(m, path) == false then return end
  local names = m.child_names
  for i, c in ipairs(m.children or {}) do
    local name = names and names[i] or tostring(i - 1)
    nn.walk(c, fn, path == "" and name or (path .. "." .. name), seen)
  end
end

-- {module = its path} for every module of m (nn.walk's names)
function nn.paths(m)
  local out = {}
  nn.walk(m, function(mod, path) out[mod] = path end)
  return out
end

-- Runs child c of m under the schedule's hooks (unshard, bind, reduce) and
-- fsdp.autograd's rules (phase "backward" consumes x, the gradient). The
-- hooks' own allocations (bf16 scratch) are nobody's activations.
local function hooked(ctx, c, phase, fn, ...)
  local p = profile.active -- (train.profile: this call is a span of the step's timeline)
  if p then p:enter(p:name_of(c), phase) end
  autograd.untracked(ctx.enter, ctx, c, phase)
  if p then p:ready() end -- (its unit gathered and waited for: compute from here)
  local y = fn(...)
  autograd.untracked(ctx.leave, ctx, c, phase)
  if p then p:leave() end
  return y
end

function nn.call(ctx, c, phase, x)
  phase = phase or "forward"
  if phase == "backward" then return hooked(ctx, c, phase, autograd.backward, ctx, c, x) end
  return hooked(ctx, c, phase, autograd.forward, ctx, c, x, phase)
end
nn.plain = plain

-- The input gradient of Linears that read one input (a block's q, k and v
-- projections; gate and up): the sum of their dx, in mods' order. gather
-- (a tensor-parallel block's GatherRows, or nil) then reduce-scatters it
-- to this rank's rows. With gather.tp.overlap (fsdp.tp's default) the
-- Linears' weight gradients compute while that reduce-scatter runs
-- (Megatron's overlap of the sequence-parallel reduce-scatter with the
-- weight-gradient GEMMs): dx first (Linear:backward_input, its weight
-- bound, no grads), the module's backward with dW alone in the
-- reduce-scatter's meanwhile. The same GEMMs in the same order per
-- weight: the same bits as without the overlap. Each dy is consumed;
-- let_go (optional, a tensor: the Linears' input made again by
-- nn.bring_back) is consumed once nothing reads it.
local function splits(c)
  return c.backward_input ~= nil and not c.rows and not c.ck_input and type(c.saved) == "table" and c.saved.x ~= nil
end

function nn.linears_backward(ctx, mods, dys, gather, let_go)
  local overlap = gather and gather.tp.overlap
  local dx, later = nil, {}
  for i, c in ipairs(mods) do
    local part
    if overlap and splits(c) then
      part = hooked(ctx, c, "backward_input", autograd.scope, c.backward_input, c, ctx, dys[i])
      later[#later + 1] = i
    else
      part = nn.call(ctx, c, "backward", dys[i])
    end
    if dx then ops.add(dx, dx, part) else dx = part end
  end
  if #later == 0 then
    if let_go then autograd.consume(let_go) end
    if not gather then return dx end
    return nn.call(ctx, gather, "backward", dx)
  end
  gather.meanwhile = function()
    for _, i in ipairs(later) do nn.call(ctx, mods[i], "backward", dys[i]) end
    if let_go then autograd.consume(let_go) end -- (their saved x: read by their dW)
  end
  return nn.call(ctx, gather, "backward", dx)
end

-- Light recompute (fsdp.recompute = "light"): Linears that read the output
-- of a cheap module (an RMSNorm) let go of it once their forward has run,
-- and src:output_again() makes it again, bit for bit, right before their
-- backward. Call let_go(readers) after the readers' forward; bring_back
-- before their backward returns the tensor made again (consume it after
-- their backward), or nil when they kept it (light recompute off, or a
-- forward without grads).
function nn.let_go(readers)
  for _, m in ipairs(readers) do autograd.done(m, "x") end
end

-- via (optional): a module the output goes through to the readers (a
-- tensor-parallel block's GatherRows), run again too.
function nn.bring_back(ctx, src, readers, via)
  local s = readers[1].saved
  if type(s) ~= "table" then error("nn.bring_back: the readers saved nothing (no forward with grads before this backward)", 2) end
  if s.x ~= nil then return nil end
  local x = hooked(ctx, src, "recompute", src.output_again, src)
  if via then
    local y = nn.call(ctx, via, "recompute", x)
    autograd.consume(x)
    x = y
  end
  for _, m in ipairs(readers) do m.saved.x = x end
  return x
end

-- x through mods in order; each intermediate output is released once the
-- next module has run (kept only if that module saved it)
function nn.forward_chain(ctx, mods, x, phase)
  for i, c in ipairs(mods) do
    local y = nn.call(ctx, c, phase, x)
    if i > 1 and y ~= x then autograd.consume(x) end
    x = y
  end
  return x
end

-- dy back through mods (given in forward order), last first; each
-- gradient is consumed by the module it is given to
function nn.backward_chain(ctx, mods, dy)
  for i = #mods, 1, -1 do dy = nn.call(ctx, mods[i], "backward", dy) end
  return dy
end

-- y = x + f(x), f the chain mods; written over f(x) when nothing else
-- holds it (one activation less; the same bits: addition commutes)
function nn.residual(ctx, mods, x, phase)
  local f = nn.forward_chain(ctx, mods, x, phase)
  if f ~= x and autograd.alone(f) then
    ops.add(f, x, f)
    return f
  end
  local y = ops.like(x)
  ops.add(y, x, f)
  if f ~= x then autograd.consume(f) end
  return y
end

-- the gradient of nn.residual: dy + f'(dy) (dy kept for the sum)
function nn.residual_backward(ctx, mods, dy)
  autograd.retain(dy)
  local d = nn.backward_chain(ctx, mods, dy)
  ops.add(d, d, dy)
  autograd.release(dy)
  return d
end

---------------------------------------------------------------- Embedding
local Embedding = class("Embedding")
-- opts.std (init); opts.tp (a tp group): vocab-parallel, this rank holds
-- its part of the rows, and its output is a partial sum over the group
-- (zero rows for the ids it does not hold)
nn.Embedding = function(vocab, dim, opts)
  size_arg(vocab, "nn.Embedding: num_embeddings")
  size_arg(dim, "nn.Embedding: embedding_dim")
  opts = opts or {}
  local m = setmetatable({ vocab = vocab, dim = dim, params = {} }, Embedding)
  local w = { name = "weight", numel = vocab * dim, shape = { vocab, dim }, init = { "normal", 0, opts.std or 0.02 } }
  m.params[1] = w
  if opts.tp then
    local first, rows = opts.tp:part(vocab)
    m.tp, m.first, m.rows = opts.tp, first, rows
    w.shape, w.numel, w.slice = { rows, dim }, rows * dim, tpm.slice({ vocab, dim }, first, rows, 0, dim)
  end
  return m
end

-- ids: an int32 tensor {B, T}; returns {B, T, dim}
function Embedding:forward(ctx, ids)
  if ids.dtype ~= "int32" then error("Embedding: token ids must be an int32 tensor, got " .. ids.dtype, 2) end
  -- the output's dtype: the units' compute dtype on CUDA (set by fully_shard), fp32 on CPU
  local y = tensor.new({ ids.shape[1], ids.shape[2] or 1, self.dim }, ids.device == "cuda" and self.act_dtype or "fp32", ids.device)
  ops.embedding_forward(y, ids, self.bound.weight, ids:numel(), self.vocab, self.dim, self.first, self.rows)
  self.saved = { ids = ids }
  return y
end

function Embedding:backward(ctx, dy)
  local ids = self.saved.ids
  ops.embedding_backward(self.grad.weight, dy, ids, ids:numel(), self.vocab, self.dim, self.first, self.rows)
  return nil -- no gradient for token ids
end

---------------------------------------------------------------- RMSNorm
local RMSNorm = class("RMSNorm")
-- opts.tp (a tp group): the norm of sequence-parallel rows; every tp rank
-- holds the whole weight, and its gradient is summed over the group
nn.RMSNorm = function(dim, eps, opts)
  size_arg(dim, "nn.RMSNorm: dim")
  if eps ~= nil and not (type(eps) == "number" and eps >= 0 and eps < math.huge) then
    error(string.format("nn.RMSNorm: eps = %s; expected a finite number >= 0", tostring(eps)), 2)
  end
  local m = setmetatable({ dim = dim, eps = eps or 1e-6, params = {}, tp = opts and opts.tp }, RMSNorm)
  m.params[1] = { name = "weight", numel = dim, shape = { dim }, init = { "constant", 1 }, no_decay = true,
    replicated = m.tp and true or nil }
  return m
end

function RMSNorm:forward(ctx, x)
  local n = x:numel() / self.dim
  local y, rstd = ops.like(x), tensor.new(n, "fp32", x.device)
  ops.rmsnorm_forward(y, rstd, x, self.bound.weight, n, self.dim, self.eps)
  self.saved = { x = x, rstd = rstd }
  return y
end

-- the forward's output again, from the input it saved (nn.bring_back);
-- the saved rstd is written over with the same bits
function RMSNorm:output_again()
  local s = self.saved
  local n = s.x:numel() / self.dim
  local y = ops.like(s.x)
  ops.rmsnorm_forward(y, s.rstd, s.x, self.bound.weight, n, self.dim, self.eps)
  return y
end

function RMSNorm:backward(ctx, dy)
  local s = self.saved
  local n = s.x:numel() / self.dim
  local dx = ops.like(s.x)
  if self.tp then
    tpm.reduce_grad(self.tp, self.grad.weight, self.dim, function(dw)
      ops.rmsnorm_backward(dx, dw, dy, s.x, self.bound.weight, s.rstd, n, self.dim)
    end, dy)
    return dx
  end
  ops.rmsnorm_backward(dx, self.grad.weight, dy, s.x, self.bound.weight, s.rstd, n, self.dim)
  return dx
end

-- mean squared error and its gradient (scaled, e.g. by 1 / micro-batches)
function nn.mse(y, target, scale)
  local dy = tensor.new(y.shape)
  if dy.meta then return 0, dy end -- (a dry run: the bytes, no value)
  local loss = base.ffi.new("double[1]")
  check(C.fsdp_mse_forward_backward(loss, dy:ptr(), y:ptr(), target:ptr(), y:numel(), scale or 1), "mse")
  return base.f64(loss), dy
end

return nn

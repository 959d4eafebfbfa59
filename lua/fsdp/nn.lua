-- fsdp.nn: Torch7-style modules. A module declares its parameters (name,
-- size, init rule, no-decay) without memory; fully_shard places them in
-- units and binds pointers into the units' full buffers before each use.
-- forward(ctx, x) and backward(ctx, dy) call ctx:enter/leave around every
-- child so that the FSDP schedule (unshard, prefetch, reshard, reduce) runs
-- at unit boundaries. CPU, fp32 for now.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local C, check = base.C, base.check

local nn = {}

local function class(kind)
  local c = { kind = kind }
  c.__index = c
  return c
end

-- a ctx that does nothing: run a module with bound params and no sharding
local plain = { enter = function() end, leave = function() end }

---------------------------------------------------------------- Linear
local Linear = class("Linear")
nn.Linear = function(inp, out, opts)
  opts = opts or {}
  local m = setmetatable({ inp = inp, out = out }, Linear)
  m.params = { { name = "weight", numel = inp * out, init = { "normal", 0, opts.std or 0.02 } } }
  if opts.bias ~= false then
    m.params[2] = { name = "bias", numel = out, init = { "constant", 0 }, no_decay = true }
  end
  return m
end

function Linear:forward(ctx, x)
  local n = x:numel() / self.inp
  if n % 1 ~= 0 then error(string.format("Linear(%d -> %d): input has %d elements, not a multiple of %d", self.inp, self.out, x:numel(), self.inp), 2) end
  local y = tensor.new({ n, self.out })
  check(C.fsdp_linear_forward(y:ptr(), x:ptr(), self.bound.weight, self.bound.bias, n, self.inp, self.out), "Linear forward")
  self.saved = x
  return y
end

function Linear:backward(ctx, dy)
  local x = self.saved
  local n = x:numel() / self.inp
  local dx = tensor.new({ n, self.inp })
  check(C.fsdp_linear_backward(dx:ptr(), self.grad.weight, self.grad.bias, dy:ptr(), x:ptr(), self.bound.weight, n,
    self.inp, self.out), "Linear backward")
  self.saved = nil
  return dx
end

---------------------------------------------------------------- Tanh
local Tanh = class("Tanh")
nn.Tanh = function() return setmetatable({ params = {} }, Tanh) end

function Tanh:forward(ctx, x)
  local y = tensor.new(x.shape)
  check(C.fsdp_tanh_forward(y:ptr(), x:ptr(), x:numel()), "Tanh forward")
  self.saved = y
  return y
end

function Tanh:backward(ctx, dy)
  local dx = tensor.new(dy.shape)
  check(C.fsdp_tanh_backward(dx:ptr(), dy:ptr(), self.saved:ptr(), dy:numel()), "Tanh backward")
  self.saved = nil
  return dx
end

---------------------------------------------------------------- Sequential
local Sequential = class("Sequential")
nn.Sequential = function(...)
  return setmetatable({ params = {}, children = { ... } }, Sequential)
end

function Sequential:forward(ctx, x)
  ctx = ctx or plain
  for _, c in ipairs(self.children) do
    ctx:enter(c, "forward")
    x = c:forward(ctx, x)
    ctx:leave(c, "forward")
  end
  return x
end

function Sequential:backward(ctx, dy)
  ctx = ctx or plain
  for i = #self.children, 1, -1 do
    local c = self.children[i]
    ctx:enter(c, "backward")
    dy = c:backward(ctx, dy)
    ctx:leave(c, "backward")
  end
  return dy
end

-- Depth-first walk: fn(module, path) for every module; children of a
-- Sequential are named by their position from 0, as in PyTorch.
function nn.walk(m, fn, path)
  path = path or ""
  fn(m, path)
  for i, c in ipairs(m.children or {}) do
    nn.walk(c, fn, path == "" and tostring(i - 1) or (path .. "." .. (i - 1)))
  end
end

-- mean squared error and its gradient (scaled, e.g. by 1 / micro-batches)
function nn.mse(y, target, scale)
  local dy = tensor.new(y.shape)
  local loss = base.ffi.new("double[1]")
  check(C.fsdp_mse_forward_backward(loss, dy:ptr(), y:ptr(), target:ptr(), y:numel(), scale or 1), "mse")
  return loss[0], dy
end

return nn

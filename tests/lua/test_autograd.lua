-- test_autograd.lua: fsdp.autograd's ownership rules on small parameter-free
-- layers written the way a user writes one (no :free() anywhere), checked
-- against hand-derived gradients (float64, 1e-6 relative) and against the
-- allocator's byte counts with the garbage collector stopped:
--   * temporaries go when their op returns, saved tensors when the
--     module's backward has run, gradients when consumed; a step leaves
--     nothing allocated;
--   * no_grad retains nothing; a checkpointed module keeps only its input
--     and gives the same gradients bit for bit;
--   * using a tensor after the rules released it is an error, and an error
--     inside a forward closes every scope and frees what they held;
--   * autograd.done lets a running backward drop what it no longer needs,
--     and autograd.take hands it a saved tensor to write over;
--   * a module called several times in one forward (a shared layer) gives
--     each call's backward its own saved tensors (frames): the gradient of
--     as many distinct modules, bit for bit, checkpointed or not;
--   * the model files contain no :free().
local fsdp = require "fsdp"
local nn, ops, tensor = fsdp.nn, require "fsdp.ops", require "fsdp.tensor"
local autograd = require "fsdp.autograd"

fsdp.init()
local dir = arg[0]:match("^(.*/)") or "./"
local T = dofile(dir .. "testkit.lua")("test_autograd")
local check, fails = T.check, T.fails
local root = arg[1] or dir .. "../.."

local N = 1000 -- elements per activation (4000 bytes in fp32)
local B = 4 * N

local function allocated() return fsdp.memory_stats("cpu").allocated end

-- y = x * x (saves x); dx = 2 x dy
local Square = { kind = "Square" }
Square.__index = Square
local function square() return setmetatable({ params = {} }, Square) end
function Square:forward(ctx, x)
  local y = ops.like(x)
  local px, py = x:ptr(), y:ptr()
  for i = 0, x:numel() - 1 do py[i] = px[i] * px[i] end
  self.saved = { x = x }
  return y
end
function Square:backward(ctx, dy)
  local x = self.saved.x
  local dx = ops.like(x)
  local px, pd, pdx = x:ptr(), dy:ptr(), dx:ptr()
  for i = 0, x:numel() - 1 do pdx[i] = 2 * px[i] * pd[i] end
  return dx
end

-- y = 3 x through a temporary (2x, then + x); saves nothing
local Triple = { kind = "Triple" }
Triple.__index = Triple
local function triple() return setmetatable({ params = {} }, Triple) end
function Triple:forward(ctx, x)
  local t, y = ops.like(x), ops.like(x)
  ops.add(t, x, x)
  ops.add(y, t, x)
  return y
end
function Triple:backward(ctx, dy)
  local t, dx = ops.like(dy), ops.like(dy)
  ops.add(t, dy, dy)
  ops.add(dx, t, dy)
  return dx
end

-- a user's residual block: y = x + 3 (x^2)^2 ... as nn.residual of a chain
local Block = { kind = "Block" }
Block.__index = Block
local function block(checkpoint)
  return setmetatable({ params = {}, checkpoint = checkpoint, children = { square(), triple(), square() } }, Block)
end
function Block:forward(ctx, x, phase) return nn.residual(ctx, self.children, x, phase) end
function Block:backward(ctx, dy) return nn.residual_backward(ctx, self.children, dy) end

local function input()
  local x = tensor.new(N)
  for i = 0, N - 1 do x:set(i, 0.3 + 0.5 * math.sin(0.37 * i)) end
  return x
end
-- f(x) = x + (3 x^2)^2 = x + 9 x^4: f' = 1 + 36 x^3; with dy = 1 + i/N
local function expected(i, x) return (1 + 36 * x ^ 3) * (1 + i / N) end

-- one forward and backward of two blocks in a chain, in one scope
local function step(m, probe)
  local x = input()
  local base = allocated()
  fsdp.memory_reset_peak("cpu")
  local dx = autograd.scope(function()
    local y = nn.forward_chain(nn.plain, m, x)
    if probe then probe.after_forward = allocated() - base end
    local dy = ops.like(y)
    for i = 0, N - 1 do dy:set(i, 1 + i / N) end
    return nn.backward_chain(nn.plain, m, dy)
  end)
  local st = fsdp.memory_stats("cpu")
  return x, dx, st.peak - base, st.allocated - base
end

collectgarbage()
collectgarbage("stop")

-- 1. gradients, and nothing left but the returned gradient
do
  local probe = {}
  local m = { block(), block() }
  local x, dx, peak, left = step(m, probe)
  -- reference: f applied twice, in float64
  local worst = 0
  for i = 0, N - 1 do
    local x0 = x:get(i)
    local x1 = x0 + 9 * x0 ^ 4
    local g = (1 + 36 * x0 ^ 3) * (1 + 36 * x1 ^ 3) * (1 + i / N)
    worst = math.max(worst, math.abs(dx:get(i) - g) / math.abs(g))
  end
  check(worst < 1e-5, string.format("two residual blocks: gradient vs float64 (worst relative %.2e)", worst))
  check(left == B, string.format("after the step only the input's gradient is allocated: %d bytes (expected %d)", left, B))
  -- after forward, per block: the saved x of the two Squares (the block's
  -- input and Triple's output... x^2 from the first Square feeds Triple,
  -- which saves nothing, so it goes) = input (caller's) + 3x^2 (saved by
  -- the second Square); block outputs: block 1's output is block 2's input
  -- (saved by its first Square), block 2's is the result.
  -- Allocated by the scope: block 1: 3x^2 (B); its output (B); block 2:
  -- 3x^2 (B); its output (B) = 4 B.
  check(probe.after_forward == 4 * B, string.format("after forward: %d bytes retained (expected %d)", probe.after_forward, 4 * B))
  check(m[1].children[1].held == nil and m[1].children[1].saved == nil, "what a module saved is released after its backward")
  check(autograd.depth() == 0, "every scope closed")
  dx:free()
end

-- 1b. one block called twice in the chain (a shared layer, rule 7): each
-- call's backward gets what that call saved: the gradient of two distinct
-- blocks bit for bit, the same bytes retained after forward, nothing left
-- after the step; checkpointed, and a block shared three times, the same
do
  local _, d1 = step({ block(), block() })
  local b = block()
  local probe = {}
  local _, d2, _, left = step({ b, b }, probe)
  local same = true
  for i = 0, N - 1 do same = same and d1:get(i) == d2:get(i) end
  check(same, "a block called twice: the gradient of two distinct blocks, bit for bit")
  check(probe.after_forward == 4 * B, string.format("a block called twice: %d bytes after forward (expected %d)",
    probe.after_forward, 4 * B))
  check(left == B, string.format("a block called twice: %d bytes left after the step (expected %d)", left, B))
  check(b.frames == nil and b.children[1].frames == nil and b.held == nil, "a shared block: no frame left after the step")
  local bc = block(true)
  local _, d3 = step({ bc, bc })
  same = true
  for i = 0, N - 1 do same = same and d1:get(i) == d3:get(i) end
  check(same, "a checkpointed block called twice: the same gradient bit for bit")
  local _, e3 = step({ block(), block(), block() })
  local s3 = block()
  local _, f3, _, left3 = step({ s3, s3, s3 })
  same = true
  for i = 0, N - 1 do same = same and e3:get(i) == f3:get(i) end
  check(same and left3 == B, "a block called three times: three blocks' gradient bit for bit, nothing left")
  d1:free(); d2:free(); d3:free(); e3:free(); f3:free()
end

-- 2. no_grad: nothing retained; each temporary and intermediate goes at once
do
  local x = input()
  local base = allocated()
  fsdp.memory_reset_peak("cpu")
  local ctx = { enter = function() end, leave = function() end, no_grad = true }
  local y = autograd.scope(function() return nn.forward_chain(ctx, { block(), block() }, x) end)
  local st = fsdp.memory_stats("cpu")
  check(st.allocated - base == B, string.format("no_grad: only the output stays (%d bytes)", st.allocated - base))
  -- the largest point: inside block 2 with block 1's output (its input),
  -- Square 1's output, Triple's temporary and output: 4 B
  check(st.peak - base <= 4 * B, string.format("no_grad: peak %d bytes (at most %d)", st.peak - base, 4 * B))
  y:free()
end

-- 3. checkpointing: only the input kept, the same gradient bit for bit
do
  local _, d1 = step({ block(), block() })
  local probe = {}
  local _, d2, _, left = step({ block(true), block(true) }, probe)
  local same = true
  for i = 0, N - 1 do same = same and d1:get(i) == d2:get(i) end
  check(same, "checkpointed blocks give the same gradient bit for bit")
  -- block 1's output (block 2's checkpointed input) and block 2's output
  check(probe.after_forward == 2 * B, string.format("checkpointed: %d bytes after forward (expected %d)", probe.after_forward, 2 * B))
  check(left == B, string.format("checkpointed: %d bytes left after the step", left))
  d1:free(); d2:free()
end

-- 4. a tensor kept outside m.saved is gone by backward: an error, not a read of freed memory
do
  local Sneaky = setmetatable({ kind = "Sneaky" }, { __index = Triple })
  Sneaky.__index = Sneaky
  function Sneaky:forward(ctx, x)
    self.tmp = ops.like(x) -- a temporary, not saved
    ops.add(self.tmp, x, x)
    return Triple.forward(self, ctx, x)
  end
  function Sneaky:backward(ctx, dy)
    ops.add(dy, dy, self.tmp)
    return Triple.backward(self, ctx, dy)
  end
  local x = input()
  fails(function()
    autograd.scope(function()
      local m = setmetatable({ params = {} }, Sneaky)
      local y = nn.call(nn.plain, m, "forward", x)
      return nn.call(nn.plain, m, "backward", y)
    end)
  end, "used after free", "a temporary used after its op returned")
  check(autograd.depth() == 0, "scopes closed after the error")
end

-- 5. an error in the middle of a forward frees what the open scopes held
do
  local Boom = { kind = "Boom" }
  Boom.__index = Boom
  function Boom:forward(ctx, x) ops.like(x); error("boom at layer 2", 0) end
  local x = input()
  local base = allocated()
  local ok, err = pcall(autograd.scope, function()
    return nn.forward_chain(nn.plain, { block(), setmetatable({ params = {} }, Boom) }, x)
  end)
  check(not ok and err == "boom at layer 2", "the error goes on unchanged: " .. tostring(err))
  check(autograd.depth() == 0, "every scope closed after the error")
  -- block 1 retained what it saved for a backward that never comes: released
  -- by its next forward (or with the module); its scopes' temporaries are gone
  check(allocated() - base <= B, string.format("after the error: %d bytes left (at most block 1's saved %d)", allocated() - base, B))
end

-- y = 3x, saving a = 2x (sections 6 and 6b)
local function saves_a(self, ctx, x)
  local a, y = ops.like(x), ops.like(x)
  ops.add(a, x, x)
  ops.add(y, a, x)
  self.saved = { a = a }
  return y
end

-- one forward and backward of a fresh module of class k in a scope, on a
-- new input; returns the allocator's count before it and y[7]
local function round_trip(k)
  local x = input()
  local base, y7 = allocated(), nil
  autograd.scope(function()
    local m = setmetatable({ params = {} }, k)
    local y = nn.call(nn.plain, m, "forward", x)
    y7 = y:get(7)
    nn.call(nn.plain, m, "backward", y)
  end)
  return base, y7
end

-- 6. autograd.done: what a running backward no longer needs goes at once
do
  local Two = { kind = "Two", forward = saves_a }
  Two.__index = Two
  local seen = {}
  function Two:backward(ctx, dy)
    local a = self.saved.a
    local before = allocated()
    autograd.done(self, "a")
    seen.dropped = before - allocated()
    seen.gone = tensor.dead(a) and self.saved.a == nil
    return ops.like(dy)
  end
  local base = round_trip(Two)
  check(seen.dropped == B and seen.gone, string.format("done() frees a saved tensor at once (%s bytes)", tostring(seen.dropped)))
  check(allocated() == base, "nothing left after done() and the scope")
end

-- 6b. autograd.take: a saved tensor the running backward writes over (its
-- gradient, in place) belongs to that backward's scope: it goes when
-- consumed, and is no longer the module's
do
  local Over = { kind = "Over", forward = saves_a }
  Over.__index = Over
  local seen = {}
  function Over:backward(ctx, dy)
    local before = allocated()
    local a = autograd.take(self, "a")
    ops.add(a, dy, dy) -- the gradient, written over the saved tensor
    seen.kept = allocated() == before and not tensor.dead(a) and self.saved.a == nil
    seen.value = a:get(7)
    autograd.consume(a)
    seen.gone = tensor.dead(a)
    return ops.like(dy)
  end
  local base, y7 = round_trip(Over)
  seen.want = 2 * y7
  check(seen.kept and seen.value == seen.want and seen.gone,
    string.format("take() hands a saved tensor to the backward, which writes over it and consumes it (%s, %s = %s, %s)",
      tostring(seen.kept), tostring(seen.value), tostring(seen.want), tostring(seen.gone)))
  check(allocated() == base, "nothing left after take() and the scope")
  fails(function()
    autograd.take(setmetatable({ saved = { n = 3 }, held = {} }, Over), "n")
  end, "autograd.take: 'n' is not a saved tensor", "take() of something not saved")
end

collectgarbage("restart")

-- 7. no model file frees by hand
for _, f in ipairs({ "lua/fsdp/models/llama.lua", "lua/fsdp/nn.lua" }) do
  local h = assert(io.open(root .. "/" .. f))
  local src = h:read("*a")
  h:close()
  check(not src:find(":free()", 1, true), f .. " contains no :free()")
end

T.finish()

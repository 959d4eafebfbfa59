-- fsdp.autograd: who owns an activation, and when its memory goes. Model
-- code (fsdp.nn modules, lua/fsdp/models/llama.lua, a user's layer) never
-- frees a tensor; these rules do, deterministically, and the planner's
-- dry run (fsdp.dry_run: the model run on meta tensors) counts by them.
--
-- 1. Scopes. A module's forward or backward run through nn.call (and any
--    fn run by autograd.scope) is a scope: every tensor allocated while it
--    runs belongs to it. When it returns, the tensor it returns moves to the
--    enclosing scope (outside every scope: to the caller, as a plain
--    tensor); everything else it owns is released. Temporaries are thus
--    scoped to the op that made them.
-- 2. Saved for backward. What a module's forward puts in m.saved (a
--    tensor, or a table whose values are tensors or other values) is
--    retained when the forward returns, and released when the module's
--    backward has returned. Without grads (ctx.no_grad) nothing is retained.
-- 3. Checkpointing. A module with m.checkpoint keeps only its input: its
--    descendants retain nothing in forward, and its backward first re-runs
--    its forward ("recompute" phase) with saving on.
-- 4. Gradients. A backward consumes the gradient it is given: once the
--    module's backward has returned, the caller's reference is released. A
--    residual branch that needs the gradient again retains it
--    (nn.residual_backward does).
-- 5. Chains. nn.forward_chain releases each intermediate output once the
--    next module has run (what that module saved keeps it alive).
-- 6. Memory goes when nothing retains it: a reference count per tensor (a
--    view counts on the tensor it views). A released tensor is freed at
--    once; using it afterwards is an error on every device (tensor.lua).
-- 7. Frames. A module may be called any number of times in one forward (a
--    shared layer): each call's saved tensors are a frame of their own,
--    and the backward of each call gets its own (the calls' backwards run
--    in reverse order). A forward runs inside one scope with its backward
--    (the trainer's micro-batch) for this to hold; a frame left from an
--    earlier scope (a backward that never came) is released by the next
--    forward.
--
-- Why reference counts and scopes, not llm.c's single planned block: our
-- modules are written in Lua by users, with shapes known only at run time,
-- so the lifetimes are derived from how the code runs rather than laid out
-- by hand; the caching allocator under tensor.new already reuses freed
-- blocks of the same sizes step after step, which is what the single block
-- buys llm.c.
local tensor = require "fsdp.tensor"

local M = {}
local Tensor = tensor.Tensor
local stack = {}   -- open scopes, innermost last; a scope is a list of owned tensors (false once moved out)
local suspended = 0 -- > 0: allocations are nobody's (persistent buffers, schedule state)
local dropping = 0  -- > 0: inside a checkpointed forward: nothing is saved
-- bumped when the outermost scope closes: one micro-batch's forward and
-- backward run in one (the trainer's scope), so a module called again in
-- the same epoch is a shared module called twice in one forward (rule 7)
local epoch = 0

local function is_tensor(t) return getmetatable(t) == Tensor end
local function root(t)
  while t.base do t = t.base end
  return t
end

local function own(sc, t)
  local n = #sc + 1
  sc[n] = t
  t.owner, t.slot = sc, n
end

-- tensor.new's hook: a new tensor belongs to the innermost scope
tensor.on_new = function(t)
  local sc = stack[#stack]
  if sc and suspended == 0 then
    t.refs = 1
    own(sc, t)
  end
end

function M.retain(t)
  t = root(t)
  if t.refs then t.refs = t.refs + 1 end
end

function M.release(t)
  t = root(t)
  if t.refs then
    t.refs = t.refs - 1
    if t.refs == 0 then
      t.refs = nil
      t:free()
    end
  end
end

-- the reference of the scope that owns t (if one does) is given up
function M.consume(t)
  t = root(t)
  local sc = t.owner
  if sc then
    sc[t.slot] = false
    t.owner, t.slot = nil, nil
    M.release(t)
  end
end

-- true when only the innermost scope holds t (no save, no other scope):
-- its owner may write over it (nn.residual adds in place)
function M.alone(t)
  if not is_tensor(t) or t.base then return false end
  return t.refs == 1 and t.owner ~= nil and t.owner == stack[#stack]
end

local function open()
  local sc = {}
  stack[#stack + 1] = sc
  return sc
end

-- keep: what the scope returns (a tensor or anything else); it moves to the
-- enclosing scope, the rest is released
local function close(sc, keep, keep2)
  if stack[#stack] ~= sc then error("autograd: scopes closed out of order", 2) end
  stack[#stack] = nil
  if #stack == 0 then epoch = epoch + 1 end
  local parent = stack[#stack]
  local k1 = is_tensor(keep) and root(keep) or nil
  local k2 = is_tensor(keep2) and root(keep2) or nil
  for i = 1, #sc do
    local t = sc[i]
    if t then
      t.owner, t.slot = nil, nil
      if t == k1 or t == k2 then
        if parent then own(parent, t) end -- else the caller's, as a plain tensor
      else
        M.release(t)
      end
    end
  end
end

-- A program error ("file.lua:12: ...") keeps the traceback of where it
-- happened (the scope rethrows it); a message meant for the user (no
-- position) goes on unchanged, as fsdp's own error printer does.
local function where(err)
  if type(err) == "string" and err:match("^[^\n:]+:%d+:") and not err:find("\nstack traceback:", 1, true) then
    return debug.traceback(err, 2)
  end
  return err
end

-- On an error, the scopes above depth are released (their tensors freed
-- unless retained) and the error goes on.
local function unwind(depth, err)
  while #stack > depth do close(stack[#stack]) end
  error(err, 0)
end

-- fn(...) as a scope; returns what fn returns (its first two results may be
-- tensors, which move to the enclosing scope). An error closes the scope.
function M.scope(fn, ...)
  local depth = #stack
  local sc = open()
  local ok, a, b, c = xpcall(fn, where, ...)
  if not ok then unwind(depth, a) end
  close(sc, a, b)
  return a, b, c
end

-- fn(...) with tracking off: what it allocates is nobody's (caches,
-- persistent scratch, the schedule's own buffers)
function M.untracked(fn, ...)
  suspended = suspended + 1
  local ok, a, b = xpcall(fn, where, ...)
  suspended = suspended - 1
  if not ok then error(a, 0) end
  return a, b
end

local function release_all(list)
  if list then for i = 1, #list do M.release(list[i]) end end
end

-- retain what m saved (rule 2), in a fixed order (the keys sorted)
local function hold(m)
  local s, held = m.saved, {}
  if is_tensor(s) then
    held[1] = s
  elseif type(s) == "table" then
    local keys = {}
    for k, v in pairs(s) do if is_tensor(v) then keys[#keys + 1] = tostring(k) end end
    table.sort(keys)
    for _, k in ipairs(keys) do held[#held + 1] = s[k] end
  end
  for i = 1, #held do M.retain(held[i]) end
  m.held = held
end

-- What m's backward, still running, no longer needs of m.saved (keys): let
-- go now rather than when it returns. Only a hint for a lower peak (the
-- MLP drops gate and up before its projections' backward); reading them
-- afterwards is an error, and without it nothing leaks.
function M.done(m, ...)
  local s, held = m.saved, m.held
  if type(s) ~= "table" or not held then return end
  for i = 1, select("#", ...) do
    local k = select(i, ...)
    local t = s[k]
    if is_tensor(t) then
      s[k] = nil
      for j = 1, #held do
        if held[j] == t then
          table.remove(held, j)
          M.release(t)
          break
        end
      end
    end
  end
end

-- What m's backward, still running, takes over from m.saved[key]: no
-- longer saved but owned by the innermost scope like a tensor made there,
-- so it can be written over (the MLP writes its gate and up gradients
-- over gate and up) and goes when consumed or when the scope closes.
function M.take(m, key)
  local s, held = m.saved, m.held
  local t = type(s) == "table" and s[key] or nil
  if not is_tensor(t) or t.base or not held then error("autograd.take: '" .. tostring(key) .. "' is not a saved tensor", 2) end
  s[key] = nil
  for j = 1, #held do
    if held[j] == t then
      table.remove(held, j)
      own(stack[#stack], t) -- the saved reference becomes the scope's
      return t
    end
  end
  error("autograd.take: '" .. tostring(key) .. "' is not held", 2)
end

-- Rule 7 (frames): what one call of a module saved is its frame (m.saved,
-- m.held, m.ck_input). A module called again while a frame of this epoch
-- waits for its backward (a shared layer, weights used twice) puts that
-- frame on m.frames; backward runs the calls in reverse order, so each
-- backward takes the newest frame and gives the module back the one below.
local function push_frame(m)
  local fs = m.frames or {}
  fs[#fs + 1] = { saved = m.saved, held = m.held, ck_input = m.ck_input }
  m.frames, m.saved, m.held, m.ck_input = fs, nil, nil, nil
end
local function pop_frame(m)
  local fs = m.frames
  local f = fs and fs[#fs]
  if not f then return end
  fs[#fs] = nil
  m.saved, m.held, m.ck_input = f.saved, f.held, f.ck_input
  if #fs == 0 then m.frames = nil end
end
-- frames of an earlier epoch, whose backward never came (an error, a
-- forward alone): released
local function drop_frames(m)
  release_all(m.held)
  if m.ck_input then M.release(m.ck_input) end
  m.held, m.ck_input = nil, nil
  for _, f in ipairs(m.frames or {}) do
    release_all(f.held)
    if f.ck_input then M.release(f.ck_input) end
  end
  m.frames = nil
end

-- m:forward(ctx, x, phase) under rules 1-3 and 7
function M.forward(ctx, m, x, phase)
  local pushed = false
  if m.epoch ~= epoch then
    if m.held or m.ck_input or m.frames then drop_frames(m) end
  elseif m.held or m.ck_input then
    push_frame(m) -- called again in this forward: the first call's frame waits for its backward
    pushed = true
  end
  local saving = not ctx.no_grad and dropping == 0
  local ck = saving and m.checkpoint and phase == "forward"
  local depth = #stack
  local sc = open()
  if ck then dropping = dropping + 1 end
  local ok, y = xpcall(m.forward, where, m, ctx, x, phase)
  if ck then dropping = dropping - 1 end
  if not ok then unwind(depth, y) end
  if ck then
    m.saved = nil
    M.retain(x)
    m.ck_input = x
    m.epoch = epoch
  elseif saving then
    hold(m)
    m.epoch = epoch
  else
    m.saved = nil
    if pushed then pop_frame(m) end -- this call kept nothing: the earlier call's frame is the module's again
  end
  close(sc, y)
  return y
end

-- m:backward(ctx, dy) under rules 1-4
function M.backward(ctx, m, dy)
  local depth = #stack
  local sc = open()
  local ok, dx = xpcall(function()
    local x = m.ck_input
    if x then -- checkpointed: recompute the forward, saving this time
      m.ck_input = nil
      M.consume(M.forward(ctx, m, x, "recompute"))
      M.release(x)
    end
    return m:backward(ctx, dy)
  end, where)
  if not ok then unwind(depth, dx) end
  release_all(m.held)
  m.held, m.saved = nil, nil
  pop_frame(m) -- an earlier call's frame, for its own backward
  if dy ~= nil and dx ~= dy and is_tensor(dy) then M.consume(dy) end
  close(sc, dx)
  return dx
end

-- how many scopes are open (tests: 0 between steps)
function M.depth() return #stack end

return M

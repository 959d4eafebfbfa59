-- fsdp.unit_schedule: when each unit is gathered, prefetched and
-- resharded (M.switch_unit, one piece of code for the run and its replay),
-- the replay of a step's schedule against the pools (M.simulate), and the
-- pools' slot sizes and bound. fsdp.shard runs it; the planner replays it.
local base = require "fsdp.ffi"
local ffi, C = base.ffi, base.C

local M = {}

-- The schedule when compute moves from unit cur to unit u; one piece of
-- code for the run (Ctx:enter) and its replay (M.simulate): the previous
-- unit is resharded unless it stays gathered until its backward, u is
-- gathered, and the units that run next (following ones in forward,
-- preceding ones in backward) are prefetched up to u.prefetch (or the
-- model's), stopping at the first that cannot be (the pool's bound). Not
-- from a module that borrows another unit's params (shares): that unit
-- runs out of order, and its neighbours are not next.
-- In backward the previous unit's backward is not done (a done one was
-- resharded), so it runs again: it stays gathered when u already holds its
-- buffer, as resharding it frees no slot u needs and only gathers it again
-- (a nested unit: the MLP's backward makes its layer's norm again, light
-- recompute; both went back and forth, gathered twice).
-- eng.unshard(unit, is_prefetch) -> true when gathered; eng.reshard(unit);
-- eng.holds(unit) -> true when it holds a gathered (or gathering) buffer.
function M.switch_unit(cur, u, forward, shares, prefetch, units, eng)
  if cur and cur.zero == 3 then
    local keep = forward and not cur.reshard_after_forward or not forward and eng.holds(u)
    if not keep then eng.reshard(cur) end
  end
  local ok = eng.unshard(u, false)
  local dir = forward and 1 or -1
  for d = 1, shares and 0 or (u.prefetch or prefetch) do
    local nxt = units[u.index + d * dir]
    if not nxt or not eng.unshard(nxt, true) then break end
  end
  return ok
end

-- A pool as the replay sees it: its slots' sizes and which are taken, each
-- request given the slot src/shard/pool.c would give (fsdp_pool_pick).
local function sim_pool(slots)
  local n = #slots
  local bytes, taken = ffi.new("int64_t[?]", math.max(n, 1)), ffi.new("uint8_t[?]", math.max(n, 1))
  for i, b in ipairs(slots) do bytes[i - 1] = b end
  local p = { live = 0, peak = 0 }
  function p.take(b)
    local i = C.fsdp_pool_pick(n, bytes, taken, b)
    if i < 0 then return nil end
    taken[i] = 1
    p.live = p.live + 1
    p.peak = math.max(p.peak, p.live)
    return i
  end
  function p.give(i)
    taken[i] = 0
    p.live = p.live - 1
  end
  return p
end

-- Full-unit buffers live at once when each micro-batch runs its forward
-- and backward, by replaying the schedule (M.switch_unit, as Ctx runs it)
-- on unit state alone, with pools of these slots ({params = {bytes...},
-- grads = {...}}): {params = peak param buffers, grads = peak grad buffers,
-- gathers = {[unit] = all-gathers per micro-batch}}, or nil and the
-- reason when a unit finds no slot it fits when it must have one.
-- units' param buffers as the replays see them: switch_unit's engine over
-- pool P, counting each unit's all-gathers into gathers
local function sim_engine(P, gathers)
  local held, eng = {}, {}
  function eng.unshard(u)
    if u.zero ~= 3 or held[u] then return true end
    if u.plan.pool_params == 0 then held[u] = -1; return true end -- one rank: the shard is the full unit
    local i = P.take(tonumber(u.plan.pool_params))
    if not i then return false end
    held[u] = i
    gathers[u] = (gathers[u] or 0) + 1
    return true
  end
  function eng.reshard(u)
    if held[u] and held[u] >= 0 then P.give(held[u]) end
    held[u] = nil
  end
  function eng.holds(u) return held[u] ~= nil and held[u] >= 0 end
  return eng
end

function M.simulate(a, prefetch, slots)
  local P, G = sim_pool(slots.params), sim_pool(slots.grads)
  local gheld, cur = {}, nil
  local eng = sim_engine(P, {})
  local function enter(v, forward)
    local u = v.unit
    if cur ~= u then
      if not M.switch_unit(cur, u, forward, v.shares, prefetch, a.units, eng) then
        return string.format("unit '%s' cannot be gathered: no free param buffer fits it (%d of %d in use)", u.name,
          P.live, #slots.params)
      end
      cur = u
    end
    if not forward and u.plan.pool_grads > 0 and not gheld[u] then
      gheld[u] = G.take(tonumber(u.plan.pool_grads))
      if not gheld[u] then
        return string.format("unit '%s' cannot take a grad buffer: no free one fits it (%d of %d in use)", u.name,
          G.live, #slots.grads)
      end
    end
  end
  for _, v in ipairs(a.visits) do
    local e = enter(v, true)
    if e then return nil, e end
  end
  for i = #a.visits, 1, -1 do
    local v = a.visits[i]
    local e = enter(v, false)
    if e then return nil, e end
    if v.module == v.unit.first then -- its backward is done: reshard, reduce (the grad buffer goes back)
      if v.unit.zero == 3 then eng.reshard(v.unit) end
      cur = nil
      if gheld[v.unit] then G.give(gheld[v.unit]); gheld[v.unit] = nil end
    end
  end
  return { params = P.peak, grads = G.peak }
end

-- The all-gathers of one micro-batch by the module calls as it ran them
-- (trace: {module, phase, leave} in call order, fsdp.dry_run's record of
-- the model run on the counting device): Ctx:enter and Ctx:leave
-- (fsdp.unit_hooks) replayed on unit state, with pools of these slots. It
-- sees what M.simulate's model order does not: a unit entered again out
-- of that order (light recompute making a layer's norm again inside its
-- nested MLP unit's backward, a checkpointed layer's re-run), whose
-- gathers depend on prefetch. Returns {[unit] = gathers}, or nil and why.
function M.replay(a, prefetch, slots, trace)
  local P, gathers, pending, cur = sim_pool(slots.params), {}, {}, nil
  local eng = sim_engine(P, gathers)
  for _, e in ipairs(trace) do
    local m, phase = e[1], e[2]
    local u = a.unit_of[m]
    if u and not e[3] then
      if cur ~= u then
        if not M.switch_unit(cur, u, phase == "forward", m.shares, prefetch, a.units, eng) then
          return nil, string.format("unit '%s' cannot be gathered: no free param buffer fits it", u.name)
        end
        cur = u
      end
      if phase == "forward" then pending[u] = (pending[u] or 0) + 1 end
    elseif u and phase == "backward" then -- (its last backward: resharded, reduced)
      pending[u] = (pending[u] or 1) - 1
      if pending[u] == 0 then
        if u.zero == 3 then eng.reshard(u) end
        cur = nil
      end
    end
  end
  return gathers
end

-- The pools' slots for assignment a (units planned: M.plan_units) and
-- bound `live`: the sizes of the `live` largest units that borrow from
-- each pool (a 501 MiB tied embedding and 116 MiB layers need one big slot
-- and small ones, not all big), when the replayed schedule fits them;
-- else `live` slots of the largest size (a bound that fits any order).
-- Returns slots ({params = {...}, grads = {...}}), the replay's peak, and
-- the reason when even those do not fit (peak nil).
function M.pool_slots(a, prefetch, live)
  -- each slot is as big as the allocator's block for it (what it holds
  -- anyway): units within a block of each other (a tied-off head and the
  -- embedding, 2 KiB apart) get slots of one size, any of which
  -- fsdp_pool_acquire may hand out (the one already free, src/shard/pool.c)
  local function sizes(field)
    local v = {}
    for _, u in ipairs(a.units) do
      local b = tonumber(u.plan[field])
      if b > 0 then v[#v + 1] = tonumber(C.fsdp_memory_block_bytes(b)) end
    end
    table.sort(v, function(x, y) return x > y end)
    return v
  end
  local p, g = sizes("pool_params"), sizes("pool_grads")
  local function top(v)
    local out = {}
    for i = 1, math.min(live, #v) do out[i] = v[i] end
    return out
  end
  local function even(v)
    local out = {}
    for i = 1, #v > 0 and live or 0 do out[i] = v[1] end
    return out
  end
  local fitted = { params = top(p), grads = top(g) }
  local peak = M.simulate(a, prefetch, fitted)
  if peak then return fitted, peak end
  local uniform = { params = even(p), grads = even(g) }
  local why
  peak, why = M.simulate(a, prefetch, uniform)
  if not peak then why = why .. M.interleaved(a) end
  return uniform, peak, why
end

-- Why a schedule may not fit however many buffers: a unit whose modules
-- run in several stretches, others' units between them (every layer's
-- norms left to the root's unit while attention and MLP have their own).
-- Prefetches follow the unit list, not those stretches. Returns the
-- advice to append to the replay's reason (when every unit runs as one
-- stretch: more buffers).
function M.interleaved(a)
  local runs, last, between = {}, nil, {}
  for _, v in ipairs(a.visits) do
    if not v.shares and v.unit ~= last then
      runs[v.unit] = (runs[v.unit] or 0) + 1
      if runs[v.unit] == 2 and last then between[v.unit] = last end
      last = v.unit
    end
  end
  for _, u in ipairs(a.units) do
    if (runs[u] or 0) > 1 then
      return string.format("; unit '%s' runs in %d separate stretches of the forward (unit '%s' first runs between " ..
        "them): prefetches follow the order units first run, so give its modules to the units they run next to " ..
        "(recipes/policies/attention_mlp_units.lua does this for the layers' norms)", u.name, runs[u], between[u].name)
    end
  end
  return " (raise fsdp.max_live_units)"
end

local function sum(v)
  local t = 0
  for _, b in ipairs(v) do t = t + b end
  return t
end
M.sum = sum

-- The pools' bound: max_live_units, raised so that units kept gathered
-- between forward and backward (reshard_after_forward = false) fit with
-- the current unit and one prefetched
function M.pool_bound(a, max_live)
  local kept = 0
  for _, u in ipairs(a.units) do if u.zero == 3 and not u.reshard_after_forward then kept = kept + 1 end end
  return math.max(max_live or 2, kept > 0 and kept + 2 or 0)
end

return M

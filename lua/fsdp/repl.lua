-- fsdp.repl: the prompt's shard-layout helpers (docs/PLANNING.md).
-- Offline (`fsdp repl RECIPE.lua --world 512`): the recipe's plan, built on
-- the meta device; nothing is allocated.
--   units()            the units: zero level, parameters, shard size, bytes per rank
--   layout(u)          unit u (index or name): each parameter's offset, shape, owners
--                      (tp meshes: each tp rank's slice of the whole weight, the
--                      owners' ranges in the whole weight; layout(u, t): tp rank t's)
--   owner(p, i)        which rank holds element i of parameter p, and where
--                      (tp meshes: i of the whole weight; which tp rank's slice)
--   rank(r)            everything rank r holds, unit by unit
--   mem(r)             rank r's memory (planned; measured too in a live run)
--   plan{world = W, mesh = ..., zero = ..., ...}  a plan with other options
--   plan{model = m, batch = fn, world = W, ...}     any fsdp.nn model's plan
--                      (fsdp.plan_model: fully_shard's options), no recipe needed
--   use(p)             the plan the helpers read from now on
--   diff(a, b)         what changes between two plans
-- Live (`fsdprun -n N --repl RECIPE.lua [--break-at STEP]`): the trainer
-- stops and rank 0 reads commands that every rank runs, so these also work:
--   gather(name)       the full parameter, as an fp32 tensor of its shape
--                      (tp meshes: the whole weight, its slices put together)
--   shard(r, name)     rank r's piece of it (fp32 main values; tp: of its slice)
--   stats(name)        min, max, mean, norm, non-finite count
--   continue(k)        train k more steps, then prompt again
-- Leaving the prompt (Ctrl-D, quit()) ends the run cleanly.
local base = require "fsdp.ffi"
local planner = require "fsdp.planner"
local plan_render = require "fsdp.plan_render"
local plan_cli = require "fsdp.plan_cli"
local pretty = require "fsdp.pretty"
local recipe = require "fsdp.recipe"
local tensor = require "fsdp.tensor"
local ffi, C, check = base.ffi, base.C, base.check

pcall(ffi.cdef, "int isatty(int fd);")

local M = {}
local state = {} -- recipe (raw table), where, plan, world, mesh; live: the run

-- a value the prompt prints as text and code can still read (.data)
local Text = { __tostring = function(t) return t.text end }
local function text(s, data) return setmetatable({ text = s, data = data }, Text) end

local function need_plan(p)
  p = p or state.plan
  if not p then error("no recipe loaded: start `fsdp repl RECIPE.lua [--world W]`, or pass a plan made by plan{...}", 3) end
  return p
end

local function find_unit(p, u)
  for _, x in ipairs(p.units) do
    if x.index == u or x.name == u then return x end
  end
  error(string.format("no unit %s (units() lists them)", tostring(u)), 3)
end

local function find_param(p, name)
  for _, u in ipairs(p.units) do
    for i, q in ipairs(u.params) do if q.name == name then return u, i, q end end
  end
  error(string.format("no parameter '%s' (layout(u) lists a unit's parameters)", tostring(name)), 3)
end

function M.units(p)
  p = need_plan(p)
  return text(plan_render.table(plan_render.unit_rows(p)), p.units)
end

-- ---- tensor parallelism: what each tp rank holds of a whole weight ----
-- The plan is built at tp rank 0 (planner.plan: every tp rank's units have
-- the same sizes); a parameter's spec says whether it is a slice of a whole
-- weight (spec.slice: rows [row0, row0 + rows) x cols [col0, col0 + cols)
-- of full = {R, C}; tp rank t's is the same shifted by t slices along the
-- dimension split) or a weight every tp rank holds whole (spec.replicated,
-- or no slice). World rank = (replica x S + shard rank) x tp + tp rank, S
-- the shard group's size (dp_shard x cp: shard rank = dp_shard rank x cp +
-- cp rank), tp innermost (the mesh's order).
local tp_size = function(p) return p.tp or 1 end
local specs = setmetatable({}, { __mode = "k" }) -- plan -> {param name -> spec}
local function spec_of(p, name)
  local by = specs[p]
  if not by then
    by = {}
    for _, au in ipairs(p.assignment and p.assignment.units or {}) do
      for _, q in ipairs(au.params) do by[q.name] = q.spec end
    end
    specs[p] = by
  end
  return by[name]
end

-- the slice tp rank t holds (nil: whole on every tp rank)
local function slice_at(p, name, t)
  local spec = tp_size(p) > 1 and spec_of(p, name)
  local sl = spec and spec.slice
  if not sl then return nil end
  local split_rows, split_cols = sl.rows < sl.full[1], sl.cols < sl.full[2]
  return { full = sl.full, row0 = split_rows and t * sl.rows or sl.row0, rows = sl.rows,
    col0 = split_cols and t * sl.cols or sl.col0, cols = sl.cols }
end

local function slice_text(sl)
  local r = string.format("rows [%d,%d)", sl.row0, sl.row0 + sl.rows)
  local c = string.format("cols [%d,%d)", sl.col0, sl.col0 + sl.cols)
  local what = sl.cols == sl.full[2] and r or sl.rows == sl.full[1] and c or (r .. " x " .. c)
  return string.format("%s of %dx%d", what, sl.full[1], sl.full[2])
end

-- elements [b, e) of a parameter (of the slice sl, or of the whole weight
-- without one) as the part of the whole weight they are: an element range
-- where contiguous there (a slice of whole rows); else the rows x cols block
-- when they are whole rows of the slice, else its first and last elements'
-- (row, col)
local function whole_range(sl, b, e)
  if not sl then return string.format("[%d,%d)", b, e) end
  if sl.cols == sl.full[2] then
    local o = (sl.row0 * sl.full[2]) + sl.col0
    return string.format("[%d,%d)", o + b, o + e)
  end
  local r0, c0 = sl.row0 + math.floor(b / sl.cols), sl.col0 + b % sl.cols
  local r1, c1 = sl.row0 + math.floor((e - 1) / sl.cols), sl.col0 + (e - 1) % sl.cols
  if b % sl.cols == 0 and e % sl.cols == 0 then
    return string.format("rows [%d,%d) x cols [%d,%d)", r0, r1 + 1, sl.col0, sl.col0 + sl.cols)
  end
  return string.format("(%d,%d)..(%d,%d)", r0, c0, r1, c1)
end

local function world_rank(p, replica, sr, t) return (replica * p.shard + sr) * tp_size(p) + t end

-- layout(u [, t] [, p]): with tp, every tp rank's slices (or tp rank t's)
function M.layout(u, t, p)
  if type(t) ~= "number" then t, p = nil, t end
  p = need_plan(p)
  u = find_unit(p, u)
  local P = tp_size(p)
  if t and (t < 0 or t >= P or t % 1 ~= 0) then
    error(string.format("layout(u, t): tp rank %s; this plan's are 0 to %d", tostring(t), P - 1), 2)
  end
  local pieces = {} -- param -> {{shard rank, begin, end}}
  for r = 0, p.shard - 1 do
    for _, pc in ipairs(planner.pieces(p, u, r)) do
      pieces[pc.param] = pieces[pc.param] or {}
      local o = pieces[pc.param]
      o[#o + 1] = { r, pc.begin, pc["end"] }
    end
  end
  local function owners(name, sl)
    local o = {}
    for k, pc in ipairs(pieces[name] or {}) do o[k] = string.format("%d:%s", pc[1], whole_range(sl, pc[2], pc[3])) end
    return #o <= 6 and table.concat(o, " ") or
      (table.concat({ o[1], o[2], o[3] }, " ") .. string.format(" ... (%d ranks) ... ", #o) .. o[#o])
  end
  local head = string.format("unit %d '%s': zero %d, %d elements + %d padding = %d shards of %d", u.index, u.name, u.zero,
    u.numel, u.total_numel - u.numel, p.shard, u.shard_numel)
  if P == 1 then
    local rows = { { "param", "shape", "numel", "offset", "owners (shard rank: element range)" } }
    for _, q in ipairs(u.params) do
      rows[#rows + 1] = { q.name, table.concat(q.shape, "x"), q.numel, q.offset, owners(q.name) }
    end
    return text(head .. "\n" .. plan_render.table(rows), u)
  end
  local rows = { { "param", "shape", "numel", "offset", "tp", "holds", "owners (shard rank: range of the whole weight)" } }
  local from, to = t or 0, t or P - 1
  for _, q in ipairs(u.params) do
    local first = { q.name, table.concat(q.shape, "x"), q.numel, q.offset }
    if not slice_at(p, q.name, 0) then
      rows[#rows + 1] = { first[1], first[2], first[3], first[4], t and tostring(t) or "all", "whole", owners(q.name) }
    else
      for r = from, to do
        local sl = slice_at(p, q.name, r)
        local row = r == from and first or { "", "", "", "" }
        rows[#rows + 1] = { row[1], row[2], row[3], row[4], tostring(r), slice_text(sl), owners(q.name, sl) }
      end
    end
  end
  local formula = p.outer > 1 and string.format("(replica x %d + shard rank) x %d + tp rank", p.shard, P) or
    string.format("shard rank x %d + tp rank", P)
  return text(string.format("%s on each of %d tp ranks (world rank = %s)\n", head, P, formula) .. plan_render.table(rows), u)
end

function M.owner(name, index, p)
  p = need_plan(p)
  local u, i, q = find_param(p, name)
  local sl = slice_at(p, name, 0)
  local numel = sl and sl.full[1] * sl.full[2] or q.numel
  if type(index) ~= "number" or index < 0 or index >= numel or index % 1 ~= 0 then
    error(string.format("owner: index %s outside '%s' (0 to %d%s)", tostring(index), name, numel - 1,
      sl and ", the whole weight's elements" or ""), 2)
  end
  -- with a slice: the tp rank whose slice has it, and its place there
  local t, k, where = nil, index, ""
  if sl then
    local row, col = math.floor(index / sl.full[2]), index % sl.full[2]
    t = sl.cols < sl.full[2] and math.floor(col / sl.cols) or math.floor(row / sl.rows)
    sl = slice_at(p, name, t)
    k = (row - sl.row0) * sl.cols + col - sl.col0
    where = string.format(" (row %d, col %d of %dx%d) is in tp rank %d's slice (%s) as its element %d:", row, col,
      sl.full[1], sl.full[2], t, slice_text(sl), k)
  elseif tp_size(p) > 1 then
    where = string.format(" is held whole by each of the %d tp ranks:", tp_size(p))
  end
  local pc = ffi.new("fsdp_layout_piece")
  check(C.fsdp_layout_owner(u.layout, i - 1, k, pc), "owner")
  local r, at = pc.rank, tonumber(pc.shard_offset)
  local lo, hi = k, k + 1 -- the run of this parameter on that rank
  for _, x in ipairs(planner.pieces(p, u, r)) do
    if x.param == name then lo, hi = x.begin, x["end"] end
  end
  local world = {}
  for o = 0, p.outer - 1 do
    for tr = t or 0, t or tp_size(p) - 1 do world[#world + 1] = world_rank(p, o, r, tr) end
  end
  local ranks = ""
  if #world > 1 then
    ranks = string.format("; world ranks %s (one per %s)", table.concat(world, ", "),
      (p.outer > 1 and not sl and tp_size(p) > 1) and "dp_outer replica and tp rank" or p.outer > 1 and "dp_outer replica" or
      "tp rank")
  elseif tp_size(p) > 1 then
    ranks = string.format("; world rank %d", world[1])
  end
  local held = sl and string.format("%s of the whole weight", whole_range(sl, lo, hi)) or
    string.format("elements [%d, %d) of it", lo, hi)
  return text(string.format("%s[%d]%s%s element %d of shard rank %d's shard of unit '%s' (that rank holds %s)%s", name,
    index, where, where == "" and " is" or "", at, r, u.name, held, ranks),
    { rank = r, unit = u.name, shard_offset = at, begin = lo, ["end"] = hi, tp_rank = t, slice_index = sl and k or nil,
      world = world })
end

function M.rank(r, p)
  p = need_plan(p)
  if type(r) ~= "number" or r < 0 or r >= p.world or r % 1 ~= 0 then
    error(string.format("rank: %s is not a rank of this plan (0 to %d)", tostring(r), p.world - 1), 2)
  end
  local P = tp_size(p)
  local t, sr, replica = r % P, math.floor(r / P) % p.shard, math.floor(r / (P * p.shard))
  local rows = { { "unit", "param", P > 1 and "elements (of the whole weight)" or "elements", "count", "at in shard" } }
  local total = 0
  for _, u in ipairs(p.units) do
    for _, pc in ipairs(planner.pieces(p, u, sr)) do
      local range = P > 1 and whole_range(slice_at(p, pc.param, t), pc.begin, pc["end"]) or
        string.format("[%d, %d)", pc.begin, pc["end"])
      rows[#rows + 1] = { u.name, pc.param, range, pc["end"] - pc.begin, pc.shard_offset }
      total = total + pc["end"] - pc.begin
    end
  end
  return text(string.format("rank %d: %sshard rank %d, replica %d of %d; %s parameter elements, %s resident, %s at peak\n", r,
    P > 1 and string.format("tp rank %d of %d, ", t, P) or "", sr, replica, p.outer, pretty.count(total),
    pretty.bytes(p.resident_total), pretty.bytes(p.peak)) .. plan_render.table(rows),
    { elements = total, tp_rank = t, shard_rank = sr, replica = replica })
end

-- measured bytes of the live run on this rank, by the units' own accounts
local function measured()
  local s = state.live.sharded
  local m = ffi.new("fsdp_unit_memory")
  local t = { params_full = 0, params_shard = 0, main_params = 0, optimizer = 0, grads_full = 0, grads_main = 0, scratch = 0 }
  for _, u in ipairs(s.units) do
    check(C.fsdp_unit_memory_info(u.handle, m), "mem")
    for k in pairs(t) do t[k] = t[k] + tonumber(m[k]) end
  end
  -- the shared scratch is the comms' (the reductions', and the shard
  -- group's when separate), not any unit's
  t.scratch = t.scratch + tonumber(C.fsdp_comm_scratch_bytes(s.reduce.handle))
  if s.shard ~= s.reduce then t.scratch = t.scratch + tonumber(C.fsdp_comm_scratch_bytes(s.shard.handle)) end
  return t
end

function M.mem(r, p)
  p = need_plan(p)
  local rows = plan_render.memory_rows(p)
  if state.live and p == state.plan then
    local t = measured()
    rows[1][#rows[1] + 1] = "measured (this rank)"
    local sums = { t.params_full + t.params_shard, t.main_params, t.optimizer, t.grads_full + t.grads_main, t.scratch }
    for i, v in ipairs(sums) do rows[i + 1][#rows[i + 1] + 1] = pretty.bytes(v) end
    local stats = ffi.new("fsdp_memory_stats")
    check(C.fsdp_memory_get_stats(tensor.device(state.live.sharded.device), stats), "mem")
    rows[#rows + 1] = { "allocator (this rank)", pretty.bytes(tonumber(stats.allocated)), "allocated now",
      "peak " .. pretty.bytes(tonumber(stats.peak)) }
  end
  return text(string.format("rank %s (every rank holds the same bytes):\n", tostring(r or 0)) .. plan_render.table(rows), p)
end

local plan_keys = { zero = "fsdp", units = "fsdp", prefetch = "fsdp", max_live_units = "fsdp", checkpoint = "fsdp", recompute = "fsdp",
  param_dtype = "fsdp", reduce_dtype = "fsdp", hfsdp = "fsdp", micro_batch = "data", seq = "data",
  global_batch_tokens = "train", grad_accum = "train" }

-- plan{model = m, batch = fn, world = W, ...}: a user's own fsdp.nn model,
-- planned by running one micro-batch of it on the counting device
local function plan_model(o)
  local mo = {}
  for k, v in pairs(o) do if k ~= "model" then mo[k] = v end end
  mo.world = mo.world or state.world
  mo.mesh = mo.mesh or state.mesh
  local ok, p = pcall(planner.plan_model, o.model, mo)
  if not ok then error("plan{model = ...}: " .. tostring(p):gsub("^[^:\n]+:%d+: ", ""), 3) end
  return setmetatable(p, { __tostring = plan_render.render })
end

-- plan{world = W, mesh = "dp_outer=2,dp_shard=-1", zero = 2, ["model.num_hidden_layers"] = 2, ...}
function M.plan(o)
  o = o or {}
  if o.model ~= nil then return plan_model(o) end
  if not state.recipe then error("plan{}: no recipe loaded (fsdp repl RECIPE.lua), and no model = (plan{model = m, " ..
    "batch = fn, world = W}: any fsdp.nn model)", 2) end
  local r = recipe.copy(state.recipe)
  for k, v in pairs(o) do
    if k ~= "world" and k ~= "mesh" then
      local sec, field = tostring(k):match("^([%a_]+)%.([%w_]+)$")
      if not sec then sec, field = plan_keys[k], k end
      if not sec then error(string.format("plan{}: unknown option '%s' (world, mesh, %s, or 'section.field')", tostring(k),
        "zero, units, prefetch, max_live_units, checkpoint, recompute, param_dtype, micro_batch, seq, ..."), 2) end
      r[sec] = r[sec] or {}
      r[sec][field] = v
    end
  end
  local p = planner.plan(r, { world = o.world or state.world, mesh = o.mesh or state.mesh, where = state.where })
  return setmetatable(p, { __tostring = plan_render.render })
end

local function is_plan(x) return type(x) == "table" and type(x.resident) == "table" and type(x.units) == "table" end

-- the plan units(), layout(), owner(), rank() and mem() read when given none
function M.use(p)
  if not is_plan(p) then
    error("use(p): a plan, e.g. use(plan{model = m, batch = fn, world = 8}) or use(plan{world = 64}); got " .. type(p), 2)
  end
  state.plan = p
  return text(string.format("the helpers read this plan now: %s on %d ranks, %d units, %s per rank at peak",
    p.where or "?", p.world, #p.units, pretty.bytes(p.peak)))
end

function M.diff(a, b)
  if not (is_plan(a) and is_plan(b)) then
    error(string.format("diff(a, b): two plans, e.g. diff(plan{world = 64}, plan{world = 128}); got %s and %s", type(a),
      type(b)), 2)
  end
  return text(plan_render.diff(a, b))
end

M.help_text = [[helpers (docs/PLANNING.md):
  units()          the units: zero level, parameters, shard, bytes per rank
  layout(u)        unit u (index or name): each parameter's offset, shape and owners (tp: each tp rank's slice;
                   layout(u, t): tp rank t's only)
  owner(p, i)      which rank holds element i of parameter p (tp: of the whole weight; which tp rank's slice)
  rank(r)          everything rank r holds
  mem(r)           rank r's memory: planned (and measured in a live run)
  plan{world = W, mesh = "dp_outer=2,dp_shard=-1", zero = 2, ...}   re-plan with other options
  plan{model = m, batch = fn, world = W, zero = 3, units = {...}}   any fsdp.nn model (no recipe needed)
  use(p)           the plan the helpers above read from now on
  diff(a, b)       what changes between two plans
live (fsdprun --repl): gather(name), shard(r, name), stats(name), continue(k), step(); quit() or Ctrl-D ends the run;
  engine()         the run's model as fsdp.engine drives it: engine():logprobs{x = ids, y = targets}, step, offload, ...]]

function M.help() return text(M.help_text) end

local function install(live)
  for _, k in ipairs({ "units", "layout", "owner", "rank", "mem", "plan", "use", "diff", "help" }) do _G[k] = M[k] end
  if live then for _, k in ipairs({ "gather", "shard", "stats", "continue", "step", "quit", "engine" }) do _G[k] = M[k] end end
end

-- `fsdp repl [RECIPE.lua] [--world W] [--mesh SPEC] [section.field=value ...]`
function M.setup(args)
  local o = plan_cli.parse_args(args, "repl", false, "(fsdp --help)")
  if o.help then print(M.help_text) return 0 end
  state.world, state.mesh = o.world, o.mesh
  install(false)
  if not o.path then return 0 end
  local path, r = o.path, recipe.load(o.path, o.over)
  state.recipe, state.where = recipe.copy(r), path
  state.plan = planner.plan(recipe.copy(r), { world = state.world, mesh = state.mesh, where = path })
  if ffi.C.isatty(0) == 1 then
    print(string.format("%s on %d ranks: %d units, %s per rank at peak; help() lists the helpers", path, state.world,
      #state.plan.units, pretty.bytes(state.plan.peak)))
  end
  return 0
end

-- ---- live: the trainer's prompt ----

local function world_comm() return state.live.world end

-- a host tensor summed over the world: on a GPU mesh the comm takes device
-- tensors only, and fsdp.shard's helper goes through the device. A
-- broadcast is a sum to which only the root adds (exact: small integers)
local function sum_over_world(t) require("fsdp.shard").all_reduce_host(world_comm(), t, "sum") end

-- rank 0's string (nil: end of input) on every rank
local function broadcast_string(s)
  local root = world_comm():rank() == 0
  local n = tensor.new(1):fill(root and (s and #s or -1) or 0)
  sum_over_world(n)
  local len = n:get(0)
  if len < 0 then return nil end
  local t = tensor.new(math.max(len, 1)):fill(0)
  if root then for i = 1, len do t:set(i - 1, s:byte(i)) end end
  sum_over_world(t)
  local bytes = {}
  for i = 1, len do bytes[i] = string.char(t:get(i - 1)) end
  return table.concat(bytes)
end

local function read_line(prompt)
  if ffi.C.isatty(0) == 1 or os.getenv("FSDPRUN_TTY") == "1" then
    io.write(prompt)
    io.flush()
  end
  return io.read("*l")
end

-- compile as `return CHUNK` (printed) when that works, else as a statement
local function compile(chunk)
  local fn, err = loadstring("return " .. chunk, "=prompt")
  if fn then return fn end
  fn, err = loadstring(chunk, "=prompt")
  return fn, err
end

-- rank 0 reads a whole chunk (continuation lines while it is unfinished)
local function read_chunk()
  local line = read_line(string.format("fsdp[step %d]> ", state.live.step))
  if not line then return nil end
  local chunk = line
  while true do
    local fn, err = compile(chunk)
    if fn or not tostring(err):find("'<eof>'$") then return chunk end
    local more = read_line(">> ")
    if not more then return chunk end
    chunk = chunk .. "\n" .. more
  end
end

-- the whole parameter's values (a Lua array): with tp, each tp rank's slice
-- (as the live model's spec says) put in its place: the ranks of the first
-- data-parallel coordinate write theirs, tp rank 0 a weight every tp rank
-- holds whole; summed over the world (exact: one writer an element)
local function whole_values(name)
  local live, p = state.live, state.plan
  local v = live.sharded:gather(name)
  local P = tp_size(p)
  if P == 1 then return v end
  local sl
  for _, u in ipairs(live.sharded.units) do
    for _, q in ipairs(u.params) do if q.name == name then sl = q.spec.slice end end
  end
  local n = sl and sl.full[1] * sl.full[2] or #v
  local t = tensor.new(n):fill(0)
  if live.rank < P and (sl or live.rank == 0) then
    local w = t:ptr()
    for i = 0, #v - 1 do
      w[sl and (sl.row0 + math.floor(i / sl.cols)) * sl.full[2] + sl.col0 + i % sl.cols or i] = v[i + 1]
    end
  end
  sum_over_world(t)
  local out = {}
  for i = 1, n do out[i] = t:get(i - 1) end
  return out
end

function M.gather(name)
  local _, _, q = find_param(state.plan, name)
  local v = whole_values(name)
  local sl = slice_at(state.plan, name, 0)
  local t = tensor.new(sl and sl.full or q.shape)
  local p = t:ptr()
  for i = 1, #v do p[i - 1] = v[i] end
  return t
end

function M.shard(r, name)
  local live = state.live
  local s = live.sharded
  local me, n = live.rank, live.size
  if type(r) ~= "number" or r < 0 or r >= n or r % 1 ~= 0 then error(string.format("shard: rank %s (0 to %d)", tostring(r), n - 1), 2) end
  find_param(state.plan, name)
  -- rank r's held range of the parameter (of its tp slice, with tp): its
  -- element range, then the values
  local lo, hi, vals = 0, 0, nil
  s:synchronize() -- every rank, every unit: rank r alone reading would settle only its units (checkpoint.save says why)
  if me == r then
    for _, u in ipairs(s.units) do
      local k = C.fsdp_unit_state_pieces(u.handle, 0, nil, 0)
      local ps = ffi.new("fsdp_layout_piece[?]", math.max(k, 1))
      C.fsdp_unit_state_pieces(u.handle, 0, ps, k)
      for i = 0, k - 1 do
        if u.params[ps[i].param + 1].name == name then
          lo, hi = tonumber(ps[i].begin), tonumber(ps[i]["end"])
          vals = tensor.new(math.max(hi - lo, 1))
          check(C.fsdp_unit_state_get(u.handle, C.FSDP_STATE_PARAM, ps[i].shard_offset, hi - lo, vals:ptr()), "shard")
        end
      end
    end
  end
  -- offsets past 2^24 are not exact in fp32: each goes as two 20-bit halves
  local range = tensor.new(4):fill(0)
  if me == r then
    range:set(0, math.floor(lo / 2 ^ 20)); range:set(1, lo % 2 ^ 20)
    range:set(2, math.floor(hi / 2 ^ 20)); range:set(3, hi % 2 ^ 20)
  end
  sum_over_world(range)
  lo, hi = range:get(0) * 2 ^ 20 + range:get(1), range:get(2) * 2 ^ 20 + range:get(3)
  local t = tensor.new(math.max(hi - lo, 1)):fill(0)
  if me == r and vals then t:copy_from(vals) end
  sum_over_world(t)
  local out = {}
  for i = 1, hi - lo do out[i] = t:get(i - 1) end
  local head = {}
  for i = 1, math.min(#out, 6) do head[i] = string.format("%.6g", out[i]) end
  local sl, whole = slice_at(state.plan, name, r % tp_size(state.plan)), nil
  if sl and hi > lo then whole = whole_range(sl, lo, hi) end
  return text(string.format("rank %d holds %s elements [%d, %d)%s%s", r, name, lo, hi,
    sl and string.format(" of its tp slice (%s)%s", slice_text(sl), whole and ", " .. whole .. " of the whole weight" or "") or "",
    hi > lo and (": " .. table.concat(head, " ") .. (#out > 6 and " ..." or "")) or " (none of it)"),
    { begin = lo, ["end"] = hi, values = out, whole = whole })
end

function M.stats(name)
  find_param(state.plan, name)
  local v = whole_values(name)
  local mn, mx, sum, sq, bad = math.huge, -math.huge, 0, 0, 0
  for i = 1, #v do
    local x = v[i]
    if x ~= x or x == math.huge or x == -math.huge then bad = bad + 1
    else
      mn, mx, sum, sq = math.min(mn, x), math.max(mx, x), sum + x, sq + x * x
    end
  end
  local n = #v - bad
  local st = { min = mn, max = mx, mean = n > 0 and sum / n or 0, norm = math.sqrt(sq), nonfinite = bad, numel = #v }
  return text(string.format("%s: min %.6g max %.6g mean %.6g norm %.6g non-finite %d (of %d)", name, st.min, st.max, st.mean,
    st.norm, bad, #v), st)
end

function M.continue(k)
  k = k or 1
  if type(k) ~= "number" or k < 1 or k % 1 ~= 0 then error("continue(k): k steps, an integer >= 1", 2) end
  state.live.resume = k
  return text(string.format("training %d more step%s", k, k == 1 and "" or "s"))
end

function M.step() return state.live.step end
-- the run's model as fsdp.engine drives it (post-training: logprobs,
-- step on a loss, offload / onload, export_weights); collective, as every
-- command here runs on every rank
function M.engine()
  local live = state.live
  live.engine = live.engine or require("fsdp.engine").new(live.sharded, live.cfg)
  return live.engine
end
function M.quit() state.live.quit = true end

-- The trainer's prompt. live: {sharded, recipe, where, step, rank, size,
-- world (a comm over every rank)}. Returns the steps to train before the
-- next prompt, or nil: end the run.
function M.live(live)
  state.live = live
  if not state.plan then
    state.recipe, state.where, state.world = recipe.copy(live.recipe), live.where, live.size
    state.plan = planner.plan(recipe.copy(live.recipe), { world = live.size, where = live.where })
  end
  install(true)
  live.resume, live.quit = nil, nil
  if live.rank == 0 then
    print(string.format("fsdp: stopped after step %d; commands run on every rank (help() lists them); continue(k) trains on, " ..
      "Ctrl-D or quit() ends the run", live.step))
    io.stdout:flush()
  end
  while true do
    local chunk = ""
    if live.rank == 0 then chunk = read_chunk() end
    chunk = broadcast_string(chunk)
    if chunk == nil then break end
    local fn, err = compile(chunk)
    if not fn then
      if live.rank == 0 then io.stderr:write(tostring(err), "\n") end
    else
      local res = { pcall(fn) }
      if live.rank == 0 then
        if not res[1] then io.stderr:write(tostring(res[2]), "\n")
        elseif #res > 1 then pretty.show(unpack(res, 2, table.maxn(res))) end
        io.stdout:flush()
      end
    end
    if live.resume then return live.resume end
    if live.quit then break end
  end
  if live.rank == 0 then print(string.format("fsdp: the prompt was left; ending the run after step %d", live.step)) end
  return nil
end

return M

-- fsdp.units: which parameters go in which FSDP unit (a policy over the
-- model's modules, per-unit options, checked) and each unit's layout and
-- buffer plan as the engine will make them. fully_shard (fsdp.shard) and
-- the planner (fsdp.planner) share it, so a plan is the run's own.
local base = require "fsdp.ffi"
local nn = require "fsdp.nn"
local bit = require "bit"
local tensor = require "fsdp.tensor"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}

local function policy_of(units)
  if type(units) == "function" then return units end
  if units ~= nil and type(units) ~= "table" then
    error(string.format("units = %s; expected a list of module kinds or a function(module, path, info) -> unit name",
      tostring(units)), 0)
  end
  local kinds, seen = {}, {}
  for i, k in ipairs(units or {}) do
    if type(k) ~= "string" then
      error(string.format("units[%d] = %s (a %s); expected a module kind such as \"Linear\" or \"LlamaDecoderLayer\"",
        i, tostring(k), type(k)), 0)
    end
    kinds[k] = true
  end
  local function policy(m, path)
    seen[m.kind] = true
    if kinds[m.kind] then return path end
  end
  -- a kind no module has is a typo, not a wish for one big unit: name it
  -- and the kinds the model has
  local function check_matched()
    for _, k in ipairs(units or {}) do
      if not seen[k] then
        local have = {}
        for kind in pairs(seen) do have[#have + 1] = kind end
        table.sort(have)
        error(string.format("fully_shard: the units list names '%s', but no module of the model is one (its kinds: %s)",
          k, table.concat(have, ", ")), 0)
      end
    end
  end
  return policy, check_matched
end

-- Options a policy may give a unit (its second return value)
M.unit_options = { zero = true, prefetch = true, reshard_after_forward = true, offload = true }

-- fsdp.offload (or a unit's offload option) as the engine's bits
-- (fsdp_offload_bits), 0: none. true, {optimizer = true} or "optimizer":
-- 1, the fp32 main params, the optimizer state and the grads it reads in
-- host memory, the step on CPU threads. {params = true} ("params"): + 2,
-- the compute-dtype param shard too (zero 3; on GPUs gathered from the
-- host). {grads = true} ("grads"): + 4, no fp32 grad shard on the device
-- (reductions land in the host's; no HSDP). "all": 7. nil for anything else.
local offload_words = { optimizer = 1, params = 3, grads = 5, all = 7 }
function M.offload_mode(v)
  if v == nil or v == false then return 0 end
  if v == true then return 1 end
  if type(v) == "number" and v >= 0 and v <= 7 and v % 1 == 0 then return v end
  if type(v) == "string" then return offload_words[v] end -- the command line: fsdp.offload=params
  if type(v) ~= "table" then return nil end
  local bits = 0
  for k, x in pairs(v) do
    if (k ~= "optimizer" and k ~= "params" and k ~= "grads") or type(x) ~= "boolean" then return nil end
  end
  if v.params then bits = bits + 2 end
  if v.grads then bits = bits + 4 end
  if bits > 0 or v.optimizer ~= false then bits = bits + 1 end -- params or grads imply the optimizer
  return bits
end

-- Groups a model's parameters into units by a policy, in model order,
-- without allocating anything (fully_shard and the planner both use it).
-- Each module with parameters goes to the policy's unit for it, else the
-- unit of its nearest ancestor the policy named (a decoder layer's linears
-- join the layer's unit), else "root". A policy returns a unit name (and
-- optionally options), nil to inherit, or false to refuse the module a
-- unit (an error if it has parameters). It is called as policy(module,
-- path, info), info = {kind, path, numel (its subtree's parameters), own
-- (its own)}, in model order, the root ("") first. Returns
--   {units = {{name, index, modules, params = {{module, spec, name, index}}, zero, prefetch,
--     reshard_after_forward, first}}, unit_of = {[module] = unit}, order = {modules},
--    visits = {{module, unit}} (forward order, shared-parameter modules included)}
function M.assign(model, opts)
  opts = opts or {}
  local zero = opts.zero or 3
  local policy, check_matched = policy_of(opts.units)
  local default_offload = M.offload_mode(opts.offload)
  if not default_offload then
    error("fully_shard: offload = " .. tostring(opts.offload) .. "; expected true, false or {optimizer = true, params = true, " ..
      "grads = true}", 0)
  end
  local a = { units = {}, unit_of = {}, order = {}, visits = {} }
  local by_name, first_path = {}, {}
  local function check_opts(uname, uopts, path)
    if uopts == nil then return end
    if type(uopts) ~= "table" then
      error(string.format("fully_shard: the units policy gave module '%s' options of type %s; expected a table", path, type(uopts)), 0)
    end
    for k, v in pairs(uopts) do
      if not M.unit_options[k] then
        error(string.format("fully_shard: the units policy gave module '%s' (unit '%s') an unknown option '%s' (expected zero, " ..
          "prefetch, reshard_after_forward, offload)", path, uname, tostring(k)), 0)
      end
      if k == "zero" and v ~= 0 and v ~= 1 and v ~= 2 and v ~= 3 then
        error(string.format("fully_shard: unit '%s' (module '%s'): zero = %s; expected 0, 1, 2 or 3", uname, path, tostring(v)), 0)
      end
      if k == "prefetch" and (type(v) ~= "number" or v < 0 or v % 1 ~= 0) then
        error(string.format("fully_shard: unit '%s' (module '%s'): prefetch = %s; expected an integer >= 0", uname, path, tostring(v)), 0)
      end
      if k == "reshard_after_forward" and type(v) ~= "boolean" then
        error(string.format("fully_shard: unit '%s' (module '%s'): reshard_after_forward = %s; expected true or false", uname, path, tostring(v)), 0)
      end
      if k == "offload" and not M.offload_mode(v) then
        error(string.format("fully_shard: unit '%s' (module '%s'): offload = %s; expected true, false or {optimizer = true, " ..
          "params = true, grads = true}", uname, path, tostring(v)), 0)
      end
    end
  end
  local function add(m, path, uname, uopts)
    local u = by_name[uname]
    if not u then
      u = { name = uname, modules = {}, params = {}, index = #a.units + 1, opts = {}, path = path }
      by_name[uname] = u
      first_path[uname] = path
      a.units[#a.units + 1] = u
    end
    -- options may come with any of the unit's modules; they must agree
    for k, v in pairs(uopts or {}) do
      if k == "offload" then v = M.offload_mode(v) end -- compared by meaning, not by table identity
      if u.opts[k] ~= nil and u.opts[k] ~= v then
        error(string.format("fully_shard: unit '%s' is given %s = %s for module '%s' but %s = %s for module '%s': one unit, " ..
          "one strategy", uname, k, tostring(u.opts[k]), u.opts_from[k], k, tostring(v), path), 0)
      end
      u.opts[k] = v
      u.opts_from = u.opts_from or {}
      u.opts_from[k] = path
    end
    u.zero = u.opts.zero or zero
    local mode = u.opts.offload or default_offload
    u.offload, u.offload_params, u.offload_grads = mode >= 1, bit.band(mode, 2) ~= 0, bit.band(mode, 4) ~= 0
    u.offload_bits = mode
    -- (the config's rules, offload's among them, are the engine's:
    -- fsdp_unit_config_check, run by plan_units for each unit)
    u.prefetch = u.opts.prefetch
    u.reshard_after_forward = u.opts.reshard_after_forward ~= false
    u.modules[#u.modules + 1] = m
    for _, p in ipairs(m.params) do
      u.params[#u.params + 1] = { module = m, spec = p, name = (path == "" and "" or path .. ".") .. p.name,
        index = #u.params + 1 }
    end
    a.unit_of[m] = u
    a.order[#a.order + 1] = m
  end
  -- the policy's third argument: {kind, path, numel = the module's and its
  -- descendants' parameter count, own = its own parameters' count}
  local subtree, own = {}, {}
  local function numel(m)
    local n = 0
    for _, p in ipairs(m.params or {}) do n = n + p.numel end
    own[m] = n
    for _, c in ipairs(m.children or {}) do n = n + numel(c) end
    subtree[m] = n
    return n
  end
  numel(model)
  -- one walk in model order; a module's unit comes from the nearest policy
  -- decision on its path
  local decided = {}
  nn.walk(model, function(m, path)
    local parent = decided[path:match("^(.*)%.[^.]*$") or (path ~= "" and "" or nil) or false]
    local info = { kind = m.kind, path = path, numel = subtree[m], own = own[m] }
    local ok, uname, uopts = pcall(policy, m, path, info)
    if not ok then error(string.format("fully_shard: the units policy failed on module '%s' (%s): %s", path, tostring(m.kind), tostring(uname)), 0) end
    if uname ~= nil and uname ~= false and type(uname) ~= "string" then
      error(string.format("fully_shard: the units policy returned a %s for module '%s' (%s); expected a unit name, nil or false",
        type(uname), path, tostring(m.kind)), 0)
    end
    if uname then check_opts(uname, uopts, path) end
    local d
    if uname == false then d = { refused = true } elseif uname then d = { name = uname, opts = uopts } else d = parent end
    decided[path] = d
    if #(m.params or {}) > 0 then
      if d and d.refused then
        error(string.format("fully_shard: parameter '%s' of module '%s' is left in no unit (the units policy returned false " ..
          "for it or an ancestor); every parameter needs a unit", (path == "" and "" or path .. ".") .. m.params[1].name, path), 0)
      end
      add(m, path, d and d.name or "root", d and d.opts)
    end
  end)
  if check_matched then check_matched() end
  -- a module that shares another's parameters (tied embeddings: m.shares)
  -- runs in that module's unit, bound to the same buffers
  nn.walk(model, function(m, path)
    if m.shares then
      local u = a.unit_of[m.shares]
      if not u then error(string.format("fully_shard: module '%s' shares the parameters of a module outside the model", path), 0) end
      a.unit_of[m] = u
    end
    if a.unit_of[m] then a.visits[#a.visits + 1] = { module = m, unit = a.unit_of[m], shares = m.shares ~= nil } end
  end)
  -- the replay (unit_schedule.simulate) reduces a unit after the backward
  -- of its first module in model order (the run: after its last backward)
  for _, u in ipairs(a.units) do u.first = u.modules[1] end
  return a
end

-- Each unit's layout (src/shard/layout.c) and buffer plan (src/shard/
-- unit_plan.c) as fully_shard creates it: u.layout, u.plan (fsdp_unit_plan),
-- u.config (fsdp_unit_config). o: shard_ranks, outer_ranks (1: none),
-- hfsdp, device ("cpu" or "cuda"), param_dtype, reduce_dtype ("fp32" or
-- "bf16"), comm_register (an fsdp_comm_reg_mode), micro_batches (per step
-- when fixed, nil: any), overlap_step (each unit's step applied at its next
-- use, where the unit allows: not offloaded, no hfsdp). Returns the pools' buffer
-- sizes: {params = bytes or 0, grads = bytes or 0} (the largest unit's
-- that borrows one; 0: no unit needs the pool).
function M.plan_units(a, o)
  local R = o.hfsdp and o.outer_ranks or 1
  local dev = o.device == "cuda" and C.FSDP_CUDA or C.FSDP_CPU
  local pools = { params = 0, grads = 0 }
  for _, u in ipairs(a.units) do
    local numels = ffi.new("int64_t[?]", math.max(#u.params, 1))
    for i, p in ipairs(u.params) do numels[i - 1] = p.spec.numel end
    local lp = ffi.new("fsdp_layout *[1]")
    -- HFSDP splits each shard R ways: shards a multiple of R
    check(C.fsdp_layout_create(#u.params, numels, o.shard_ranks, C.FSDP_PARAM_ALIGN, C.FSDP_SHARD_ALIGN * R, lp),
      "fully_shard: unit '" .. u.name .. "' layout")
    u.layout = ffi.gc(lp[0], C.fsdp_layout_destroy)
    u.config = ffi.new("fsdp_unit_config", { zero = u.zero, compute_dtype = tensor.dtype(o.param_dtype),
      reduce_dtype = tensor.dtype(o.reduce_dtype), grad_op = C.FSDP_AVG, param_align = C.FSDP_PARAM_ALIGN,
      shard_align = C.FSDP_SHARD_ALIGN, hfsdp = o.hfsdp and 1 or 0, offload = u.offload_bits or 0,
      comm_register = o.comm_register or 0, micro_batches = o.micro_batches or 0,
      overlap_step = (o.overlap_step and not o.hfsdp and (u.offload_bits or 0) == 0) and 1 or 0 })
    u.plan = ffi.new("fsdp_unit_plan")
    -- the engine's plan, after the engine's checks of the config (one set of rules for plans and units)
    check(C.fsdp_unit_plan_make(u.config, u.layout, dev, o.outer_ranks or 1, 0, u.plan),
      string.format("fully_shard: unit '%s' (module '%s')", u.name, u.path or u.name))
    pools.params = math.max(pools.params, tonumber(u.plan.pool_params))
    pools.grads = math.max(pools.grads, tonumber(u.plan.pool_grads))
  end
  return pools
end

-- CPU ranks with bf16 params compute in fp32: the running module's weights
-- and grads are staged as fp32, in one pair of buffers the size of the
-- largest module's parameters (shard.lua's cpu_staging). Their bytes; 0 on
-- a GPU or with fp32 params.
function M.cpu_staging_bytes(a, device, param_dtype)
  if device == "cuda" or param_dtype ~= "bf16" then return 0 end
  local per_module, most = {}, 0
  for _, u in ipairs(a.units) do
    for _, q in ipairs(u.params) do per_module[q.module] = (per_module[q.module] or 0) + q.spec.numel end
  end
  for _, n in pairs(per_module) do most = math.max(most, n) end
  return 8 * most
end

return M

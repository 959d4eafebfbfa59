-- fsdp.fully_shard: group a model's parameters into FSDP units by a policy
-- and train it sharded.
--   local s = fsdp.fully_shard(model, { shard = comm, outer = comm_or_nil,
--     units = {"Linear"} | function(module, path) -> unit name | nil,
--     zero = 3, max_live_units = 2, prefetch = 1, seed = 1234,
--     offload = false,    -- true: optimizer state in host memory, the step on CPU threads;
--                         -- {params = true}: the param shards too (zero 3, GPUs)
--     micro_batches = nil,  -- the count every train_step takes, when fixed: 1 lets
--                         -- bf16 units keep the optimizer's grads in bf16 (src/shard/unit_plan.c)
--     overlap_step = nil }) -- true: each unit's optimizer step is applied at the unit's next
--                         -- use (the next forward), beside the compute on a GPU (units not
--                         -- offloaded, no hfsdp); the same results bit for bit. Off until a
--                         -- GPU run has timed it (scripts/gpu_check.sh vs_fsdp2)
--   local loss = s:train_step(micro_batches, {lr = 1e-3, ...})
-- Parameters of modules the policy leaves out go to a unit named "root".
-- A policy function may return a second value with per-unit options:
--   function(m, path) if m.kind == "Linear" then return path, {zero = 2} end end
local base = require "fsdp.ffi"
local nn = require "fsdp.nn"
local autograd = require "fsdp.autograd"
local tensor = require "fsdp.tensor"
local ops = require "fsdp.ops"
local profile = require "fsdp.profile"
local hooks = require "fsdp.unit_hooks"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}
local Sharded = {}
Sharded.__index = Sharded

local init_kinds = { normal = C.FSDP_INIT_NORMAL, uniform = C.FSDP_INIT_UNIFORM, constant = C.FSDP_INIT_CONSTANT }

-- the assignment (fsdp.units), the schedule (fsdp.unit_schedule) and its
-- hooks around each module (fsdp.unit_hooks) live in their own files; the
-- first two's functions stay reachable here (shard.assign, shard.simulate, ...)
local units = require "fsdp.units"
local sched = require "fsdp.unit_schedule"
for _, k in ipairs({ "unit_options", "offload_mode", "assign", "plan_units" }) do M[k] = units[k] end
for _, k in ipairs({ "switch_unit", "simulate", "replay", "pool_slots", "sum", "pool_bound" }) do M[k] = sched[k] end

local function shown(v) return type(v) == "string" and string.format("'%s' (a string)", v) or tostring(v) end

-- A check of what(opts)'s keys against names: any other key is an error at
-- what's caller (a misspelt max_live_unit or weight_decy would otherwise
-- leave its default in place without a word)
local function options_of(what, names)
  local known = {}
  for _, k in ipairs(names) do known[k] = true end
  return function(opts)
    for k in pairs(opts) do
      if not known[k] then
        error(string.format("%s: unknown option '%s' (expected %s)", what, tostring(k), table.concat(names, ", ")), 3)
      end
    end
  end
end
local check_shard_opts = options_of("fully_shard", { "shard", "outer", "units", "zero", "max_live_units", "prefetch",
  "seed", "offload", "micro_batches", "mixed", "hfsdp", "reduce", "separate_reduce", "comm_register", "trace",
  "overlap_step", "tp" })
local check_step_opts = options_of("train_step", { "loss", "forward_loss", "optimizer", "lr", "beta1", "beta2", "eps",
  "weight_decay", "momentum", "clip" })

function M.fully_shard(model, opts)
  opts = opts or {}
  check_shard_opts(opts)
  if not opts.shard then error("fully_shard: opts.shard (the shard group's comm, e.g. mesh:group('dp_shard')) is required", 2) end
  local zero = opts.zero or 3
  if zero ~= 0 and zero ~= 1 and zero ~= 2 and zero ~= 3 then
    error("fully_shard: zero = " .. shown(zero) .. "; expected 0, 1, 2 or 3", 2)
  end
  local max_live = opts.max_live_units
  if max_live ~= nil and (type(max_live) ~= "number" or max_live < 1 or max_live % 1 ~= 0) then
    error("fully_shard: max_live_units = " .. shown(max_live) .. "; expected an integer >= 1 (full-unit buffers alive at once)", 2)
  end
  local mixed = opts.mixed or {}
  local pdt, rdt = mixed.param_dtype or "fp32", mixed.reduce_dtype or "fp32"
  if (pdt ~= "fp32" and pdt ~= "bf16") or (rdt ~= "fp32" and rdt ~= pdt) then
    error(string.format("fully_shard: mixed = {param_dtype = '%s', reduce_dtype = '%s'}; expected param_dtype fp32 or bf16 " ..
      "and reduce_dtype fp32 or the param dtype", pdt, rdt), 2)
  end
  -- opts.tp: the tp group's comm when the model is tensor-parallel (fsdp.tp):
  -- the grad norm and the stop signal are agreed over it too
  local tp = opts.tp and opts.tp:size() > 1 and opts.tp or nil
  local s = setmetatable({ model = model, shard = opts.shard, outer = opts.outer, zero = zero, tp = tp,
    step_count = 0, trace = opts.trace, param_dtype = pdt,
    prefetch = opts.prefetch or 1, hfsdp = opts.hfsdp and true or false, device = opts.shard.device or "cpu" }, Sharded)
  -- CUDA: the ops run on fsdp.ops' compute stream; units order their
  -- collectives against it with events. CPU: the calling thread computes.
  s.cs = s.device == "cuda" and ops.compute_stream():live("fully_shard") or nil
  -- the reductions run on their own communicator (the shard group on
  -- channel 1: its own stream, and on GPUs its own NCCL communicator), so
  -- a unit's reduce-scatter and the next unit's all-gather overlap;
  -- opts.separate_reduce = false keeps them on opts.shard
  if opts.reduce then
    s.reduce = opts.reduce
  elseif opts.separate_reduce ~= false and opts.shard.mesh and opts.shard.dims then
    s.reduce = opts.shard.mesh:group(opts.shard.dims, 1)
  else
    s.reduce = opts.shard
  end
  if s.hfsdp and not opts.outer then error("fully_shard: hfsdp shards the optimizer over opts.outer, which is missing", 2) end
  if type(s.prefetch) ~= "number" or s.prefetch < 0 or s.prefetch % 1 ~= 0 then
    error("fully_shard: prefetch = " .. shown(s.prefetch) .. "; expected an integer >= 0", 2)
  end
  local mb = opts.micro_batches
  if mb ~= nil and (type(mb) ~= "number" or mb < 1 or mb % 1 ~= 0) then
    error("fully_shard: micro_batches = " .. tostring(mb) .. "; expected nil (any count) or the count per step, an integer >= 1", 2)
  end
  s.micro_batches = mb
  local overlap = opts.overlap_step
  if overlap ~= nil and type(overlap) ~= "boolean" then
    error("fully_shard: overlap_step = " .. shown(overlap) .. "; expected true, false or nil (off)", 2)
  end
  local ok, a = pcall(M.assign, model, { units = opts.units, zero = zero, offload = opts.offload, hfsdp = s.hfsdp })
  if not ok then error(base.prefixed("fully_shard", a), 2) end
  if not s.tp then -- (a tensor-parallel model's slices and shared weights need the tp group's collectives)
    for _, u in ipairs(a.units) do
      for _, p in ipairs(u.params) do
        if p.spec.slice or p.spec.replicated then
          error(string.format("fully_shard: parameter '%s' is a tensor-parallel %s (fsdp.tp): give opts.tp, the tp " ..
            "group's comm", p.name, p.spec.slice and "slice" or "weight every tp rank holds"), 2)
        end
      end
    end
  end
  s.units, s.unit_of, s.order, s.assignment = a.units, a.unit_of, a.order, a
  -- opts.comm_register: the buffers the collectives use, registered with the
  -- shard group's transport (NCCL user buffers or symmetric windows)
  local reg = ({ none = 0, buffer = C.FSDP_REG_BUFFER, window = C.FSDP_REG_WINDOW })[opts.comm_register or "none"]
  if not reg then
    error("fully_shard: comm_register = '" .. tostring(opts.comm_register) .. "'; expected 'none', 'buffer' or 'window'", 2)
  end
  -- each unit's layout and buffer plan; the pools' buffers as big as the
  -- largest unit that borrows from them
  M.plan_units(a, { shard_ranks = opts.shard:size(), outer_ranks = opts.outer and opts.outer:size() or 1,
    hfsdp = s.hfsdp, device = s.device, param_dtype = pdt, reduce_dtype = rdt, comm_register = reg, micro_batches = mb,
    overlap_step = overlap })
  local live = M.pool_bound(a, opts.max_live_units)
  local slots, fits, why = M.pool_slots(a, s.prefetch, live)
  if not fits then error("fully_shard: the schedule does not fit its buffer pools: " .. why, 2) end
  local pp, gp = ffi.new("fsdp_pool *[1]"), ffi.new("fsdp_pool *[1]")
  local dev = tensor.device(s.device)
  local function pool(v, out, what)
    if #v == 0 then return end
    local b = ffi.new("int64_t[?]", #v, v)
    check(C.fsdp_pool_create(dev, #v, b, out), "fully_shard: " .. what)
  end
  pool(slots.params, pp, "param pool")
  pool(slots.grads, gp, "grad pool")
  -- the param pool is gathered into (shard), the grad pool reduced from (reduce)
  for _, pc in ipairs(reg ~= 0 and { { pp[0], opts.shard }, { gp[0], s.reduce } } or {}) do
    local p = pc[1]
    if p ~= nil then
      local rc = C.fsdp_pool_register(p, pc[2].handle, reg)
      if rc < 0 then C.fsdp_pool_destroy(pp[0]); C.fsdp_pool_destroy(gp[0]) end
      check(rc, "fully_shard: registering the unit buffer pools")
    end
  end
  s.live_bound, s.slots = live, slots
  s.ppool, s.gpool = pp[0], gp[0]
  -- one finalizer for the lot, so units go before the pools they borrow
  -- from; it holds the handles (s.res), not s: a closure over s would be a
  -- cycle through LuaJIT's finalizer table that is never collected
  local res = { units = s.units, ppool = s.ppool, gpool = s.gpool }
  s.res = res
  s.gc = ffi.gc(ffi.new("char[1]"), function() M.release(res) end)
  for _, u in ipairs(s.units) do
    local n = #u.params
    local names, numels = ffi.new("const char *[?]", n), ffi.new("int64_t[?]", n)
    local rules, nd = ffi.new("fsdp_init_rule[?]", n), ffi.new("uint8_t[?]", n)
    u.keep = {}
    for i, p in ipairs(u.params) do
      u.keep[i] = p.name
      names[i - 1], numels[i - 1] = p.name, p.spec.numel
      local init = p.spec.init
      local kind = init_kinds[init[1]]
      if not kind then error(string.format("fully_shard: parameter '%s' has init '%s' (expected normal, uniform or constant)", p.name, tostring(init[1])), 2) end
      rules[i - 1].kind, rules[i - 1].a, rules[i - 1].b = kind, init[2] or 0, init[3] or 0
      local sl = p.spec.slice -- (a tensor-parallel slice: the values the full weight has there)
      if sl then
        rules[i - 1].cols, rules[i - 1].gcols, rules[i - 1].row0, rules[i - 1].col0 = sl.cols, sl.full[2], sl.row0, sl.col0
        s.tp_sliced = true
      end
      nd[i - 1] = p.spec.no_decay and 1 or 0
      if p.spec.replicated and s.tp then
        u.replicated = u.replicated or ffi.new("uint8_t[?]", n)
        u.replicated[i - 1] = 1
      end
    end
    local spec = ffi.new("fsdp_unit_spec", { name = u.name, nparams = n, param_names = names, numels = numels,
      rules = rules, no_decay = nd, seed = opts.seed or 1234, shard = opts.shard.handle, reduce = s.reduce.handle,
      outer = opts.outer and opts.outer.handle or nil, param_pool = s.ppool, grad_pool = s.gpool, config = u.config })
    local h = ffi.new("fsdp_unit *[1]")
    u.tp_rank = s.tp and s.tp:rank() or 0 -- (checkpoints: tp rank 0 saves what every tp rank holds whole)
    check(C.fsdp_unit_create(spec, h), "fully_shard: unit '" .. u.name .. "'")
    u.handle = h[0]
    local layout = C.fsdp_unit_layout(u.handle)
    for i, p in ipairs(u.params) do p.offset = tonumber(C.fsdp_layout_param_offset(layout, i - 1)) end
  end
  return s
end

-- Frees the units and their pools now (idempotent; the collector does it
-- otherwise). The model cannot train afterwards.
function M.release(res)
  for _, u in ipairs(res.units) do
    if u.handle ~= nil then C.fsdp_unit_destroy(u.handle) end
    u.handle = nil
  end
  if res.ppool ~= nil then C.fsdp_pool_destroy(res.ppool) end
  if res.gpool ~= nil then C.fsdp_pool_destroy(res.gpool) end
  res.ppool, res.gpool = nil, nil
end

function Sharded:free()
  M.release(self.res)
  if self.staging then
    self.staging.w:free()
    self.staging.g:free()
    self.staging = nil
  end
  if self.model.release then self.model:release() end
  self.freed = true
  self.ppool, self.gpool = nil, nil
end

-- One optimizer step over micro-batches {{x = tensor, y = tensor}, ...}:
-- forward, loss, backward per micro-batch, reduce, clip, AdamW.
-- opt.loss(y, batch, scale) -> loss, dy (default: MSE against batch.y);
-- scale is 1 / micro-batches, for dy. Or opt.forward_loss(model, ctx,
-- batch, scale) -> loss: the model computes its output and loss itself
-- (and keeps the gradient to start model:backward(ctx) from), e.g. Llama's
-- forward_loss, which never holds the full logits. The loss may be a number or an
-- ops.deferred (a GPU's, still on the device): every micro-batch's is read
-- once, after the last backward has been issued.
-- With offloaded units, self.host_step_s is how long the previous step's
-- optimizer ran on the host, first unit's start to last unit's end (it
-- overlapped this step's forward; nil before the first).
-- Returns the loss averaged over micro-batches and data-parallel ranks, the
-- global grad norm, and, when some gradient, the loss or the norm was not
-- finite, a message saying which (naming the units): the step is then
-- skipped on every rank and the step counter does not advance.
local function live(s, what)
  if s.freed then error(what .. ": the sharded model was freed", 3) end
end

-- all-reduce a small CPU tensor over comm (through the device for NCCL)
local function all_reduce_host(comm, t, op)
  if comm.device == "cuda" then
    local d = tensor.new(t.shape, t.dtype, "cuda"):copy_from(t)
    comm:all_reduce(d, d, op)
    comm:synchronize()
    t:copy_from(d)
    d:free()
  else
    comm:all_reduce(t, t, op)
    comm:synchronize()
  end
end
M.all_reduce_host = all_reduce_host

-- fn(...) as a span of the step's timeline when one is recorded (fsdp.profile)
local function span(name, fn, ...)
  local p = profile.active
  if p then return p:span(name, "step", fn, ...) end
  return fn(...)
end

-- Waits for all the work of every unit and of the compute stream.
function Sharded:synchronize()
  live(self, "synchronize")
  for _, u in ipairs(self.units) do check(C.fsdp_unit_synchronize(u.handle), "unit '" .. u.name .. "' synchronize") end
  if self.cs then check(C.fsdp_stream_synchronize(self.cs), "synchronize") end
end

-- One micro-batch of K: forward, loss, backward under ctx (the schedule's
-- hooks; fsdp.dry_run's counting ctx). It is one autograd scope: whatever
-- is left of it when the backward has run is freed then (fsdp.autograd),
-- not by the collector. Returns the loss, on a GPU still on the device
-- (ops.deferred).
-- weight: the micro-batch's share of the step's targets (token_weights; 1
-- when every micro-batch has as many). b.doc_start (packed rows) goes to
-- the model's forward with the ids.
function M.micro_batch(model, ctx, b, K, opt, weight)
  local scale = (weight or 1) / K
  return autograd.scope(function()
    if opt.forward_loss then -- the model's own forward and loss (Llama's fused head), then backward from there
      local loss = span("forward + loss", opt.forward_loss, model, ctx, b, scale)
      span("backward", model.backward, model, ctx)
      return loss
    end
    local lossfn = opt.loss or function(y, bb, sc) return nn.mse(y, bb.y, sc) end
    local y = span("forward", model.forward, model, ctx, b.x, b.doc_start)
    local loss, dy = span("loss", lossfn, y, b, scale)
    span("backward", model.backward, model, ctx, dy) -- (consumes dy)
    return loss
  end)
end

-- A step that ended in an error (a model's or a loss's, in the REPL or a
-- caller's pcall) leaves its units' grads accumulating or reduced
-- (fsdp_unit_states). The next step drops them and says so: its grads are
-- then exactly a fresh step's (test_fully_shard), never the sum of both.
-- (Params it left gathered are used and resharded by the next step's
-- schedule as any gathered unit is.)
local states = ffi.new("int[2]")
local function drop_unfinished(self)
  local left = 0
  for _, u in ipairs(self.units) do
    check(C.fsdp_unit_states(u.handle, states, states + 1), "unit '" .. u.name .. "' states")
    if states[1] ~= C.FSDP_GRADS_CLEAN then left = left + 1 end
  end
  if left == 0 then return end
  io.stderr:write(string.format("fsdp: the last train_step ended in an error part way; the grads it left in %d of %d " ..
    "units are dropped, not added to this step's\n", left, #self.units))
  self:synchronize()
  for _, u in ipairs(self.units) do check(C.fsdp_unit_zero_grad(u.handle), "unit '" .. u.name .. "' zero_grad") end
end

-- Each micro-batch's loss is the mean over its targets (b.count of them:
-- masked or packed rows have fewer than their tokens, and the counts then
-- differ between micro-batches and ranks). Weighting micro-batch k by
-- w_k = count_k * K * W / N (N: the targets of all K micro-batches of all W
-- data-parallel ranks; one small all-reduce) makes the step's loss the
-- mean over all N targets and its gradient independent of how the targets
-- fall into micro-batches and ranks. With equal counts every w_k is
-- exactly 1: the same bits as no weighting. nil when a batch has no count.
function M.token_weights(s, batches)
  local K = #batches
  for _, b in ipairs(batches) do
    if type(b.count) ~= "number" then return nil end
  end
  local local_n = 0
  for _, b in ipairs(batches) do local_n = local_n + b.count end
  local N = M.sum_ints(s, 1, { [0] = local_n })[0]
  local W, w = s.shard:size() * (s.outer and s.outer:size() or 1), {}
  for k, b in ipairs(batches) do w[k] = N > 0 and b.count * K * W / N or 0 end
  return w, N
end

-- Non-negative integers below 2^50 (vals: {[i] = v} for i in 0 .. n - 1,
-- missing ones 0), summed element by element over the data-parallel ranks
-- (the shard group, then the outer one) exactly: the collectives reduce
-- fp32, exact below 2^24, so each goes as five 10-bit chunks (exact sums
-- up to 16384 ranks). Returns the sums, 0-based. Its tensor is freed at
-- once (the planner counts a step's bytes to the byte). all_ranks: over
-- the tp group too (fsdp.collective's phases; the data-parallel ranks'
-- sums, token_weights', leave it: tp ranks hold the same batch).
function M.sum_ints(s, n, vals, all_ranks)
  local t = tensor.new(math.max(5 * n, 1)):fill(0)
  for i, v in pairs(vals) do
    if type(v) ~= "number" or v < 0 or v >= 2 ^ 50 or v % 1 ~= 0 then
      error("sum_ints: " .. tostring(v) .. " is not an integer in [0, 2^50)", 2)
    end
    for c = 0, 4 do t:set(5 * i + c, math.floor(v / 1024 ^ c) % 1024) end
  end
  all_reduce_host(s.shard, t, "sum")
  if s.outer then all_reduce_host(s.outer, t, "sum") end
  if all_ranks and s.tp then all_reduce_host(s.tp, t, "sum") end
  local out = {}
  for i = 0, n - 1 do
    local v = 0
    for c = 0, 4 do v = v + t:get(5 * i + c) * 1024 ^ c end
    out[i] = v
  end
  t:free()
  return out
end

function Sharded:train_step(batches, opt)
  live(self, "train_step")
  opt = opt or {}
  check_step_opts(opt)
  drop_unfinished(self)
  -- clip 0 is "no clipping", as the recipe's optimizer.clip = 0 says (not
  -- a scale of 0 that would leave every weight where it was without a word)
  local c = opt.clip
  if c ~= nil and not (type(c) == "number" and c >= 0 and c < math.huge) then
    error("train_step: clip = " .. shown(c) .. "; expected a number >= 0 (the largest grad norm; 0 or nil: none)", 2)
  end
  local K, total, parts = #batches, 0, {}
  if self.micro_batches and K ~= self.micro_batches then
    error(string.format("train_step: %d micro-batches, but fully_shard was made with micro_batches = %d", K,
      self.micro_batches), 2)
  end
  local weights, targets = M.token_weights(self, batches)
  self.step_targets = targets
  for k, b in ipairs(batches) do
    parts[k] = M.micro_batch(self.model, setmetatable({ s = self, sync = k == K, pending = {} }, hooks.Ctx), b, K, opt,
      weights and weights[k])
  end
  -- global grad norm and non-finite counts: every unit's share, one
  -- all-reduce over the shard group (HSDP replicas hold the same shards)
  local nu = #self.units
  -- ... and whether a stop signal reached any rank (fsdp_stop_signal), so
  -- that every rank stops after the same step, with no collective more
  local p = profile.active
  if p then p:enter("grads: wait, norm, loss", "step") end
  local sums = tensor.new(2 * nu + 2)
  local first, last = math.huge, 0
  for i, u in ipairs(self.units) do
    check(C.fsdp_unit_synchronize(u.handle), "unit '" .. u.name .. "' synchronize")
    hooks.comm_times(u, u.reduce_trace, "reduce")
    hooks.comm_times(u, u.step_trace, "step") -- the previous step, on the host
    u.reduce_trace, u.step_trace = nil, nil
    if u.offload then -- the previous step's host span (self.host_step_s)
      local b, e = hooks.unit_times(u, "step_begin", "step_end")
      if e > 0 then first, last = math.min(first, b), math.max(last, e) end
    end
    local sq, bad = ffi.new("double[1]"), ffi.new("int64_t[1]")
    check(C.fsdp_unit_grad_norm_get(u.handle, sq, bad), "grad norm")
    local norm2 = base.f64(sq)
    if u.replicated then -- (tp) params every tp rank holds whole: their share counted once over the group
      check(C.fsdp_unit_grad_sumsq_params(u.handle, u.replicated, sq), "grad norm")
      norm2 = norm2 - base.f64(sq) * (1 - 1 / self.tp:size())
    end
    sums:set(i - 1, norm2)
    sums:set(nu + i - 1, tonumber(bad[0]))
  end
  if last > 0 then self.host_step_s = last - first end
  for k = 1, K do total = total + ops.value(parts[k]) * (weights and weights[k] or 1) / K end
  sums:set(2 * nu, total)
  sums:set(2 * nu + 1, C.fsdp_stop_signal())
  all_reduce_host(self.shard, sums, "sum")
  if self.tp then -- (the tp ranks' slices: their norms add up; the loss is the same on each)
    local loss_here = sums:get(2 * nu)
    all_reduce_host(self.tp, sums, "sum")
    sums:set(2 * nu, loss_here)
  end
  local norm2 = 0
  for i = 0, nu - 1 do norm2 = norm2 + sums:get(i) end
  local loss = sums:get(2 * nu) / self.shard:size()
  if self.hfsdp then -- replicas hold different parts of the grads: sum those too
    all_reduce_host(self.outer, sums, "sum")
    norm2 = 0
    for i = 0, nu - 1 do norm2 = norm2 + sums:get(i) end
    loss = sums:get(2 * nu) / (self.shard:size() * self.outer:size())
  elseif self.outer then
    local l = tensor.new(2); l:set(0, loss); l:set(1, sums:get(2 * nu + 1))
    all_reduce_host(self.outer, l, "avg")
    loss = l:get(0)
    sums:set(2 * nu + 1, l:get(1))
  end
  -- the signal this rank got, else -1: another rank's
  self.stop_signal = sums:get(2 * nu + 1) > 0 and (C.fsdp_stop_signal() > 0 and C.fsdp_stop_signal() or -1) or nil
  local norm = math.sqrt(norm2)
  if p then p:leave() end
  -- non-finite grads anywhere: every rank skips the step, and says where
  local bad_units = {}
  for i, u in ipairs(self.units) do
    if sums:get(nu + i - 1) > 0 then bad_units[#bad_units + 1] = string.format("'%s' (%d values)", u.name, sums:get(nu + i - 1)) end
  end
  -- a non-finite loss (all ranks see the same, it was summed) or a grad
  -- norm that overflowed: the same
  local finite = function(v) return v == v and v ~= math.huge and v ~= -math.huge end
  local why = #bad_units > 0 and "non-finite gradients in units " .. table.concat(bad_units, ", ") or
    not finite(loss) and "the loss is " .. tostring(loss) or not finite(norm) and "the grad norm is " .. tostring(norm) or nil
  if why then
    for _, u in ipairs(self.units) do check(C.fsdp_unit_zero_grad(u.handle), "zero_grad") end
    self.skipped = (self.skipped or 0) + 1
    return loss, (#bad_units == 0 and finite(norm)) and norm or math.huge, why .. "; step skipped"
  end
  local clip = (opt.clip or 0) > 0 and math.min(1, opt.clip / (norm + 1e-6)) or 1
  self.step_count = self.step_count + 1
  -- offloaded units step on the host while the next forward runs; their
  -- trace entries get their times once that step has been waited for
  for _, u in ipairs(self.units) do
    if u.offload then u.step_trace = hooks.trace(self, "step", u) end
  end
  local optimizer = opt.optimizer or "adamw"
  if p then p:enter("optimizer", "step") end
  if optimizer == "adamw" then
    local cfg = ffi.new("fsdp_adamw_config", { lr = opt.lr or 1e-3, beta1 = opt.beta1 or 0.9,
      beta2 = opt.beta2 or 0.999, eps = opt.eps or 1e-8, weight_decay = opt.weight_decay or 0 })
    for _, u in ipairs(self.units) do
      check(C.fsdp_unit_step(u.handle, self.step_count, cfg, clip), "unit '" .. u.name .. "' step")
    end
  elseif optimizer == "sgd" then
    for _, u in ipairs(self.units) do
      check(C.fsdp_unit_step_sgd(u.handle, self.step_count, opt.lr or 1e-2, opt.momentum or 0, opt.weight_decay or 0, clip),
        "unit '" .. u.name .. "' step")
    end
  else
    error("train_step: optimizer '" .. tostring(optimizer) .. "' (expected 'adamw' or 'sgd')", 2)
  end
  if p then -- the steps run on the units' streams: waited for here, so that the span holds them
    self:synchronize()
    p:leave()
  end
  return loss, norm
end

-- Phase offload (fsdp.engine, post-training): every unit's params, grads
-- and optimizer state copied to host memory and their device memory freed
-- (fsdp_unit_offload), the pools' full buffers and the allocator's cached
-- blocks given back; onload(params_only) brings back everything, or the
-- compute params alone for a forward-only phase (no grads, no optimizer:
-- a step then needs onload()). Training after onload() goes on bit for bit.
-- Not collective. Returns the bytes the allocator holds afterwards.
function Sharded:offload()
  live(self, "offload")
  self:synchronize()
  for _, u in ipairs(self.units) do check(C.fsdp_unit_offload(u.handle), "unit '" .. u.name .. "' offload") end
  if self.ppool ~= nil then check(C.fsdp_pool_park(self.ppool), "offload: the param pool") end
  if self.gpool ~= nil then check(C.fsdp_pool_park(self.gpool), "offload: the grad pool") end
  if self.staging then -- (CPU ranks, bf16 params: the fp32 copies of a module, made again at its next call)
    self.staging.w:free()
    self.staging.g:free()
    self.staging = nil
  end
  check(C.fsdp_memory_empty_cache(self.device == "cuda" and C.FSDP_CUDA or C.FSDP_CPU), "offload: the allocator's cache")
  self.placed = "host"
end

function Sharded:onload(params_only)
  live(self, "onload")
  if self.ppool ~= nil then check(C.fsdp_pool_unpark(self.ppool), "onload: the param pool") end
  if self.gpool ~= nil and not params_only then check(C.fsdp_pool_unpark(self.gpool), "onload: the grad pool") end
  for _, u in ipairs(self.units) do
    check(C.fsdp_unit_onload(u.handle, params_only and 1 or 0), "unit '" .. u.name .. "' onload")
  end
  self.placed = params_only and "params" or nil
end

-- Forward only over batches, under the same schedule (no grads, no
-- reduction): the mean of lossfn(y, batch) over batches and data-parallel
-- ranks (opt.forward_loss(model, ctx, batch, 1): the model's own forward
-- and loss instead, as in train_step). The last unit is resharded afterwards.
-- Whether a stop signal (fsdp_stop_signal) reached any rank: every rank
-- learns the same (one small all-reduce over the world). The signal this
-- rank got, -1 for another rank's, or nil.
function Sharded:stop_agreed()
  local f = tensor.new(1)
  f:set(0, C.fsdp_stop_signal() > 0 and 1 or 0)
  all_reduce_host(self.shard, f, "sum")
  if self.outer then all_reduce_host(self.outer, f, "sum") end
  if self.tp then all_reduce_host(self.tp, f, "sum") end
  if f:get(0) == 0 then return nil end
  return C.fsdp_stop_signal() > 0 and C.fsdp_stop_signal() or -1
end

-- after forwards without grads: the last unit resharded (ZeRO 3), and any
-- prefetched but unused unit's gather landed and resharded
local function forward_done(s, ctx, what)
  if ctx.cur and ctx.cur.zero == 3 then hooks.reshard(ctx.cur, s) end
  for _, u in ipairs(s.units) do
    if u.gathered then
      check(C.fsdp_unit_wait(u.handle, s.cs), what)
      hooks.reshard(u, s)
    end
  end
end

-- fn(model, ctx) without grads, the units gathered as its modules run
-- (generation: ctx.kv is kv, the KV cache that fsdp.models.llama's
-- attention fills and reads); returns fn's results (tensors move to the
-- caller). Not collective beyond what the forward itself gathers.
function Sharded:infer(fn, kv)
  live(self, "infer")
  local ctx = setmetatable({ s = self, no_grad = true, kv = kv }, hooks.Ctx)
  local a, b = autograd.scope(fn, self.model, ctx)
  forward_done(self, ctx, "infer")
  return a, b
end

-- The loss over batches, averaged over them and the data-parallel ranks.
-- opt.stop_every = n: every n batches the ranks agree whether a stop signal
-- came (a long evaluation must not outlast a scheduler's grace period):
-- then it ends there, self.stop_signal is set as train_step sets it, and
-- the second result is the number of batches evaluated.
function Sharded:evaluate(batches, lossfn, opt)
  live(self, "evaluate")
  local total, parts = 0, {}
  local ctx = setmetatable({ s = self, no_grad = true }, hooks.Ctx) -- nothing is saved: activations go as they are used
  local every, done = opt and opt.stop_every, #batches
  for k, b in ipairs(batches) do
    if every and k > 1 and (k - 1) % every == 0 then
      local sig = self:stop_agreed()
      if sig then
        self.stop_signal, done = sig, k - 1
        break
      end
    end
    parts[k] = autograd.scope(function()
      if opt and opt.forward_loss then return opt.forward_loss(self.model, ctx, b, 1) end
      local y = self.model:forward(ctx, b.x, b.doc_start)
      local loss = lossfn(y, b)
      return loss, type(loss) == "table" and y or nil -- (a deferred loss may still read y: it outlives the scope)
    end)
  end
  forward_done(self, ctx, "evaluate")
  local counted = true -- batches with b.count: the mean over all their targets, as train_step's
  for k = 1, done do counted = counted and type(batches[k].count) == "number" end
  if counted then
    local l = tensor.new(2)
    for k = 1, done do total = total + ops.value(parts[k]) * batches[k].count end
    l:set(0, total)
    l:set(1, 0)
    for k = 1, done do l:set(1, l:get(1) + batches[k].count) end
    all_reduce_host(self.shard, l, "sum")
    if self.outer then all_reduce_host(self.outer, l, "sum") end
    return l:get(1) > 0 and l:get(0) / l:get(1) or 0, done
  end
  for k = 1, done do total = total + ops.value(parts[k]) / done end
  local l = tensor.new(1)
  l:set(0, total)
  all_reduce_host(self.shard, l, "avg")
  if self.outer then all_reduce_host(self.outer, l, "avg") end
  return l:get(0), done
end

-- The full values of a parameter (a Lua table), gathered if need be.
function Sharded:gather(name)
  live(self, "gather")
  for _, u in ipairs(self.units) do
    for _, p in ipairs(u.params) do
      if p.name == name then
        hooks.unshard(u)
        check(C.fsdp_unit_wait(u.handle, nil), "gather")
        local es = self.param_dtype == "fp32" and 4 or 2
        -- this parameter's elements; on CUDA copied to the host first
        local src, out = ffi.cast("uint8_t *", C.fsdp_unit_params(u.handle)) + p.offset * es, {}
        if self.device == "cuda" then
          local host = ffi.new("uint8_t[?]", p.spec.numel * es)
          check(C.fsdp_memcpy(host, src, p.spec.numel * es, nil), "gather")
          src = host
        end
        if self.param_dtype == "fp32" then
          local f, f32 = ffi.cast("float *", src), base.f32
          for i = 0, p.spec.numel - 1 do out[i + 1] = f32(f, i) end
        else
          local h, bf16 = ffi.cast("uint16_t *", src), base.bf16
          for i = 0, p.spec.numel - 1 do out[i + 1] = bf16(h, i) end
        end
        hooks.reshard(u, self)
        return out
      end
    end
  end
  error("gather: no parameter '" .. tostring(name) .. "'", 2)
end

-- The layout, for printing: unit, parameter, size, offset, per-rank ranges.
function Sharded:unit_table()
  live(self, "unit_table")
  local rows = {}
  for _, u in ipairs(self.units) do
    local layout = C.fsdp_unit_layout(u.handle)
    local W = self.shard:size()
    for i, p in ipairs(u.params) do
      local owners = {}
      for r = 0, W - 1 do
        local n = C.fsdp_layout_rank_pieces(layout, r, nil, 0)
        local pieces = ffi.new("fsdp_layout_piece[?]", math.max(n, 1))
        C.fsdp_layout_rank_pieces(layout, r, pieces, n)
        for k = 0, n - 1 do
          if pieces[k].param == i - 1 then
            owners[#owners + 1] = string.format("%d:[%d,%d)", r, tonumber(pieces[k].begin), tonumber(pieces[k]["end"]))
          end
        end
      end
      rows[#rows + 1] = { unit = u.name, param = p.name, numel = p.spec.numel, offset = p.offset, owners = table.concat(owners, " ") }
    end
  end
  return rows
end

return M

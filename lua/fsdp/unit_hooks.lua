-- fsdp.unit_hooks: the FSDP schedule as hooks around each module call
-- (nn.call runs Ctx:enter and Ctx:leave; a Ctx is one micro-batch's): at a
-- unit boundary the unit just left is resharded and this one gathered, with
-- the next ones prefetched (fsdp.unit_schedule decides which); a module's
-- parameter and grad pointers are bound into its unit's full buffers; after
-- a unit's last backward its grads are reduced. Also the schedule's record
-- (fully_shard's opts.trace) and the timeline's comm spans (fsdp.profile:
-- each collective's timed events on its comm stream, fsdp_unit_probe).
-- fsdp.shard builds the units and drives steps through these.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local profile = require "fsdp.profile"
local streams = require "fsdp.stream"
local sched = require "fsdp.unit_schedule"
local ffi, C, check = base.ffi, base.C, base.check

local binding = require "fsdp.binding"

local M = {}

-- CPU ranks with bf16 params: the fp32 copies of the running module's
-- weights and grads, one pair of buffers for the whole model (one module
-- runs at a time), grown to the largest module's parameters (the planner
-- counts it: units.cpu_staging_bytes). Returns float pointers.
local function cpu_staging(s, n)
  local st = s.staging
  if not st or st.n < n then
    if st then st.w:free(); st.g:free() end
    st = { n = n, w = tensor.new(n), g = tensor.new(n) }
    s.staging = st
  end
  return st.w:ptr(), st.g:ptr()
end

-- Bind a module's parameter (and grad) pointers into its unit's full
-- buffers (fsdp.binding's protocol). The ops compute in fp32: with bf16 params on CPU ranks the
-- module gets fp32 copies (cpu_staging), and its fp32 grads are added into
-- the bf16 grad buffer (one rounding) when it leaves the backward
-- (flush_grads).
local function bind(s, m, with_grads)
  local u = s.unit_of[m]
  local w = C.fsdp_unit_params(u.handle)
  local g
  if with_grads then
    local gp = ffi.new("void *[1]")
    check(C.fsdp_unit_grads(u.handle, s.cs, gp), "unit '" .. u.name .. "' grads")
    g = gp[0]
  end
  local bound, grad, flush = {}, {}, {}
  local owner = binding.owner(m)
  local sw, sg, at -- CPU bf16: the staging, and where the next parameter goes in it
  if s.param_dtype ~= "fp32" and s.device ~= "cuda" then
    local n = 0
    for _, p in ipairs(u.params) do if p.module == owner then n = n + p.spec.numel end end
    sw, sg = cpu_staging(s, n)
    at = 0
  end
  for _, p in ipairs(u.params) do
    if p.module == owner then
      local name, n = p.spec.name, p.spec.numel
      if s.param_dtype == "fp32" or s.device == "cuda" then -- views into the unit's full buffers (no copy)
        local v = ffi.new("fsdp_tensor")
        local shape = ffi.new("int64_t[1]", n)
        check(C.fsdp_unit_param_view(u.handle, p.index - 1, C.FSDP_VIEW_PARAM, 1, shape, v), "bind '" .. p.name .. "'")
        -- CPU ops take float *; the CUDA ones take the compute dtype's void *
        bound[name] = s.device == "cuda" and v.data or ffi.cast("float *", v.data)
        if g then
          check(C.fsdp_unit_param_view(u.handle, p.index - 1, C.FSDP_VIEW_GRAD, 1, shape, v), "bind '" .. p.name .. "' grad")
          grad[name] = s.device == "cuda" and v.data or ffi.cast("float *", v.data)
        end
      else
        local pw, pg = sw + at, sg + at
        at = at + n
        check(C.fsdp_convert(pw, C.FSDP_FP32, ffi.cast("uint16_t *", w) + p.offset, C.FSDP_BF16, n), "bind")
        bound[name] = pw
        if g then
          ffi.fill(pg, n * 4, 0)
          grad[name] = pg
          flush[#flush + 1] = { dst = ffi.cast("uint16_t *", g) + p.offset, src = pg, n = n }
        end
      end
    end
  end
  binding.bind(m, bound, grad, s.param_dtype, flush)
end

local function flush_grads(m)
  for _, f in ipairs(m.flush or {}) do
    check(C.fsdp_accumulate(f.dst, C.FSDP_BF16, f.src, C.FSDP_FP32, f.n), "grads")
  end
  m.flush = nil
end

-- opts.trace (a table) collects the schedule in the order it is issued:
-- {op = "unshard" | "compute" | "reduce" | "step", unit = name, phase = ...},
-- with times (fsdp.now() seconds): compute t0, t1 on this thread; unshard
-- and reduce begin, finish: when the comm stream ran the all-gather or the
-- reduction; step begin, finish: when an offloaded unit's optimizer step
-- ran on the host (filled in once that work has been waited for: the
-- step's in the next train_step).
local function trace(s, op, u, phase)
  if not s.trace then return nil end
  local e = { op = op, unit = u.name, phase = phase }
  s.trace[#s.trace + 1] = e
  return e
end

local times = ffi.new("fsdp_unit_times")
local function time_of(field) -- (read as every double from C is: ffi.lua)
  return base.f64(ffi.cast("double *", times), ffi.offsetof("fsdp_unit_times", field) / 8)
end
local function comm_times(u, e, which)
  if not e then return end
  check(C.fsdp_unit_times_get(u.handle, times), "unit '" .. u.name .. "' times")
  e.begin, e.finish = time_of(which .. "_begin"), time_of(which .. "_end")
end

-- train.profile: a unit's collective as a span of the comm streams, from
-- the two timed events it records there (fsdp_unit_probe); kept when the
-- call ran one (a gather already done or a micro-batch that only adds up
-- runs none)
local function probe(u, which)
  local p = profile.active
  if not p then return nil end
  local b, e = streams.event(p.device, true), streams.event(p.device, true)
  check(C.fsdp_unit_probe(u.handle, which, b.handle, e.handle), "unit '" .. u.name .. "' probe")
  return { p = p, b = b, e = e }
end
local function probed(u, which, pr, name)
  if not pr then return end
  if check(C.fsdp_unit_probe(u.handle, which, nil, nil), "unit '" .. u.name .. "' probe") == 1 and profile.active == pr.p then
    pr.p:comm(name .. " " .. u.name, pr.b, pr.e)
  else
    pr.b:free()
    pr.e:free()
  end
end

-- zero 3: start gathering u's params unless already there (or at the
-- pool's bound); a no-op for the resident levels. A prefetch also skips a
-- unit whose offloaded step still runs on the host (rather than wait here).
local function unshard(u, s, prefetch)
  local pr = probe(u, C.FSDP_PROBE_GATHER)
  local rc = (prefetch and C.fsdp_unit_prefetch or C.fsdp_unit_unshard)(u.handle)
  probed(u, C.FSDP_PROBE_GATHER, pr, "all-gather")
  check(rc, "unit '" .. u.name .. "' unshard")
  if rc == 0 and not u.gathered and s and u.zero == 3 then
    u.gathered = true
    u.gather_trace = trace(s, "unshard", u)
  end
  return rc == 0
end

local function reshard(u, s)
  u.gathered = false
  check(C.fsdp_unit_reshard(u.handle, s and s.cs or nil), "unit '" .. u.name .. "' reshard")
end

-- the real units as sched.switch_unit drives them
local function engine(s)
  if not s.eng then
    s.eng = { unshard = function(u, prefetch) return unshard(u, s, prefetch) end, reshard = function(u) reshard(u, s) end,
      holds = function(u) return u.zero == 3 and u.gathered == true and u.plan.pool_params > 0 end }
  end
  return s.eng
end

-- The schedule, as hooks around each module.
local Ctx = {}
Ctx.__index = Ctx

function Ctx:enter(m, phase)
  local s = self.s
  local u = s.unit_of[m]
  if not u then return end
  -- phases: "forward", "backward", and "recompute" (activation
  -- checkpointing re-runs a unit's forward inside its backward: params
  -- bound, no grads, prefetching in the backward direction)
  local forward = phase == "forward"
  if self.cur ~= u then
    sched.switch_unit(self.cur, u, forward, m.shares, s.prefetch, s.units, engine(s))
    check(C.fsdp_unit_wait(u.handle, s.cs), "unit '" .. u.name .. "' wait")
    comm_times(u, u.gather_trace, "gather")
    u.gather_trace = nil
    self.cur = u
  end
  bind(s, m, phase == "backward")
  -- a unit's backward is over when every forward call it made has had
  -- its backward (not when its first module's has: a module may run its
  -- children's backward in any order, e.g. the MLP's gate before up)
  if phase == "forward" and not self.no_grad then self.pending[u] = (self.pending[u] or 0) + 1 end
  local e = trace(s, "compute", u, phase)
  if e then e.t0 = C.fsdp_time_now(); self.computing = e end
end

function Ctx:leave(m, phase)
  if self.computing then self.computing.t1 = C.fsdp_time_now(); self.computing = nil end
  local u = self.s.unit_of[m]
  if phase == "backward" and u then flush_grads(m) end
  if phase ~= "backward" or not u then return end
  local left = (self.pending[u] or 1) - 1
  self.pending[u] = left
  if left == 0 then
    if u.zero == 3 then reshard(u, self.s) end
    self.cur = nil
    local pr = probe(u, C.FSDP_PROBE_REDUCE)
    local rc = C.fsdp_unit_reduce(u.handle, self.s.cs, self.sync and 1 or 0)
    probed(u, C.FSDP_PROBE_REDUCE, pr, "reduce")
    check(rc, "unit '" .. u.name .. "' reduce")
    -- the last micro-batch: its share of the grad norm, queued behind the
    -- reduction, computed while the other units run their backward
    if self.sync then check(C.fsdp_unit_grad_norm_start(u.handle), "unit '" .. u.name .. "' grad norm") end
    u.reduce_trace = trace(self.s, "reduce", u)
  end
end

M.Ctx = Ctx
M.unshard, M.reshard, M.trace, M.comm_times = unshard, reshard, trace, comm_times
-- a unit's comm-stream time stamps (fsdp_unit_times' fields, e.g. "step_begin", "step_end"), from one read
function M.unit_times(u, a, b)
  check(C.fsdp_unit_times_get(u.handle, times), "unit '" .. u.name .. "' times")
  return time_of(a), time_of(b)
end

return M

-- fsdp.profile: a timeline of one training step with no external tool
-- (the recipe's train.profile; docs/TRAINING.md). Every module call
-- (nn.call) and each phase of the step is a span, timed twice: on the host,
-- when the call was issued, and on the compute stream, when the device
-- reached its start and its end (timed events). Written as a Chrome trace
-- (ui.perfetto.dev, chrome://tracing), summed by module, and checked for
-- the device waiting on the host: an event the device reaches as soon as
-- the host records it found the stream empty (launch gaps, what a CUDA
-- graph of the layer would remove). On CPU ranks the ops run as they are
-- issued, so the device track is the host's. The units' all-gathers and
-- reductions are spans of the comm streams (timed events the units record
-- there: fsdp_unit_probe), and the report says how much of their time the
-- compute stream spent inside a module at once: the communication hidden.
local base = require "fsdp.ffi"
local streams = require "fsdp.stream"
local json = require "fsdp.json"
local C = base.C

local M = { active = nil } -- the profile being recorded, if any (nn.call looks)
local P = {}
P.__index = P

-- o.device ("cpu" | "cuda"), o.stream (the compute stream; nil on CPU),
-- o.names (module table -> its path), o.settle (waits for every stream the
-- step may still use, so that the device is idle when both clocks start)
function M.start(o)
  if M.active then error("fsdp.profile: a profile is already being recorded", 2) end
  if o.settle then o.settle() end
  if o.stream then o.stream:synchronize() end
  local p = setmetatable({ device = o.device, stream = o.stream, names = o.names or {}, spans = {}, open = {} }, P)
  p.origin = streams.event(o.device, true)
  p.origin:record(o.stream)
  p.t0 = C.fsdp_time_now()
  M.active = p
  return p
end

function P:name_of(m) return self.names[m] or m.name or m.kind or "module" end

function P:enter(name, cat)
  local e = streams.event(self.device, true)
  e:record(self.stream)
  local s = { name = name, cat = cat or "", parent = self.open[#self.open], host_begin = C.fsdp_time_now() - self.t0, ev_begin = e }
  self.spans[#self.spans + 1] = s
  self.open[#self.open + 1] = s
end

-- The innermost open span's work begins here: what came before it in the
-- span was the schedule's (its unit's gather waited for, its params bound)
function P:ready()
  local s = self.open[#self.open]
  if not s then error("fsdp.profile: ready() outside a span", 2) end
  s.ev_ready = streams.event(self.device, true)
  s.ev_ready:record(self.stream)
end

function P:leave()
  local s = table.remove(self.open)
  if not s then error("fsdp.profile: leave() without enter()", 2) end
  s.ev_end = streams.event(self.device, true)
  s.ev_end:record(self.stream)
  s.host_end = C.fsdp_time_now() - self.t0
end

-- A collective on a comm stream, between two timed events it recorded
-- there (fsdp_unit_probe): a span of its own track, no parent, issued now.
function P:comm(name, ev_begin, ev_end)
  local t = C.fsdp_time_now() - self.t0
  self.spans[#self.spans + 1] = { name = name, cat = "comm", comm = true, host_begin = t, host_end = t,
    ev_begin = ev_begin, ev_end = ev_end }
end

-- a run that failed while recording: nothing more is recorded
function M.abandon() M.active = nil end

-- fn(...) as one span (all its results, nils included)
local function pack(...) return { n = select("#", ...), ... } end
function P:span(name, cat, fn, ...)
  self:enter(name, cat)
  local r = pack(fn(...))
  self:leave()
  return unpack(r, 1, r.n)
end

-- Waits for the device (o.settle again, then the stream), reads every
-- event, and frees them. The spans get dev_begin, dev_end (seconds from the
-- start on the compute stream) and host_begin, host_end (on the host).
function P:finish(settle)
  M.active = nil
  while #self.open > 0 do self:leave() end -- (an error left spans open)
  if settle then settle() end
  if self.stream then self.stream:synchronize() end
  self.wall = C.fsdp_time_now() - self.t0
  for _, s in ipairs(self.spans) do -- (all complete: recorded on the stream just waited for, or on none)
    s.dev_begin, s.dev_end = self.origin:seconds_to(s.ev_begin), self.origin:seconds_to(s.ev_end)
    s.ev_begin:free()
    s.ev_end:free()
    s.ev_begin, s.ev_end = nil, nil
    if s.ev_ready then
      s.dev_ready = self.origin:seconds_to(s.ev_ready)
      s.ev_ready:free()
      s.ev_ready = nil
    end
  end
  self.origin:free()
  return self
end

-- a span's time less its children's, on each clock
local function exclusive(p)
  for _, s in ipairs(p.spans) do
    s.dev_excl, s.host_excl = s.dev_end - s.dev_begin, s.host_end - s.host_begin
  end
  for _, s in ipairs(p.spans) do
    local up = s.parent
    if up then
      up.dev_excl = up.dev_excl - (s.dev_end - s.dev_begin)
      up.host_excl = up.host_excl - (s.host_end - s.host_begin)
    end
  end
end

-- The measure of a set of intervals {{a, b}, ...}: their union's length
-- (the list is left as it was)
function M.union_length(list)
  local iv = {}
  for i, v in ipairs(list) do iv[i] = v end
  table.sort(iv, function(x, y) return x[1] < y[1] end)
  local total, lo, hi = 0, nil, nil
  for _, v in ipairs(iv) do
    if hi == nil or v[1] > hi then
      if hi then total = total + (hi - lo) end
      lo, hi = v[1], v[2]
    elseif v[2] > hi then
      hi = v[2]
    end
  end
  if hi then total = total + (hi - lo) end
  return total
end

-- |A ∩ B| for two sets of intervals: |A| + |B| - |A ∪ B|
function M.overlap_length(a, b)
  local all = {}
  for _, v in ipairs(a) do all[#all + 1] = v end
  for _, v in ipairs(b) do all[#all + 1] = v end
  return M.union_length(a) + M.union_length(b) - M.union_length(all)
end

-- How much of the comm streams' time the compute stream spent inside a
-- module's work (a span with no span inside it, from its ready point on:
-- before that it waited for its unit's params): {comm, hidden, kinds =
-- {name -> seconds}} in seconds, each kind's and all comm's as unions.
function P:overlap()
  local has_child, comm, compute, kinds = {}, {}, {}, {}
  for _, s in ipairs(self.spans) do if s.parent then has_child[s.parent] = true end end
  for _, s in ipairs(self.spans) do
    if s.comm then
      comm[#comm + 1] = { s.dev_begin, s.dev_end }
      local kind = s.name:match("^(%S+)")
      kinds[kind] = kinds[kind] or {}
      table.insert(kinds[kind], { s.dev_begin, s.dev_end })
    elseif not has_child[s] and s.parent then
      compute[#compute + 1] = { s.dev_ready or s.dev_begin, s.dev_end }
    end
  end
  local out = { comm = M.union_length(comm), hidden = M.overlap_length(comm, compute), kinds = {} }
  for k, v in pairs(kinds) do out.kinds[k] = M.union_length(v) end
  return out
end

-- The spans summed by module with the layer index taken out
-- (model.layers.*.mlp), heaviest on the device first: {key, cat, calls,
-- dev, host} in seconds; and the events the device reached within
-- `starved_s` of their issue, of all.
function P:summary(starved_s)
  exclusive(self)
  starved_s = starved_s or 20e-6
  local by, rows, starved, events = {}, {}, 0, 0
  for _, s in ipairs(self.spans) do
    local key = s.name:gsub("%.%d+%.", ".*."):gsub("%.%d+$", ".*")
    local k = key .. "\0" .. s.cat
    local r = by[k]
    if not r then
      r = { key = key, cat = s.cat, calls = 0, dev = 0, host = 0 }
      by[k] = r
      rows[#rows + 1] = r
    end
    r.calls, r.dev, r.host = r.calls + 1, r.dev + s.dev_excl, r.host + s.host_excl
    for _, pair in ipairs(s.comm and {} or { { s.dev_begin, s.host_begin }, { s.dev_end, s.host_end } }) do
      events = events + 1
      if pair[1] - pair[2] < starved_s then starved = starved + 1 end
    end
  end
  table.sort(rows, function(a, b) return a.dev > b.dev end)
  return rows, starved, events
end

-- The summary as text: the step, then the `top` heaviest rows.
function P:report(top)
  local rows, starved, events = self:summary()
  local dev_sum = 0
  for _, r in ipairs(rows) do if r.cat ~= "comm" then dev_sum = dev_sum + r.dev end end
  local out = {
    string.format("profile: %d spans; the step took %.3f ms (host, until the device was done); the %s was inside " ..
      "spans for %.3f ms", #self.spans, 1e3 * self.wall, self.stream and "compute stream" or "host", 1e3 * dev_sum),
  }
  local phases = {}
  for _, s in ipairs(self.spans) do
    if not s.parent and not s.comm then phases[#phases + 1] = string.format("%s %.3f", s.name, 1e3 * (s.dev_end - s.dev_begin)) end
  end
  out[#out + 1] = "profile: phases (ms): " .. table.concat(phases, ", ")
  local ov = self:overlap()
  if ov.comm > 0 then
    local kinds = {}
    for k, v in pairs(ov.kinds) do kinds[#kinds + 1] = string.format("%s %.3f", k, 1e3 * v) end
    table.sort(kinds)
    out[#out + 1] = string.format("profile: the comm streams were busy %.3f ms (%s); %.0f%% of it hidden behind " ..
      "compute (a module running), %.3f ms exposed", 1e3 * ov.comm, table.concat(kinds, ", "), 100 * ov.hidden / ov.comm,
      1e3 * (ov.comm - ov.hidden))
  end
  if self.stream then
    out[#out + 1] = string.format("profile: the device reached %d of %d span edges within 20 us of the host issuing " ..
      "them (it had run out of work there: launch-bound where that is most)", starved, events)
  end
  out[#out + 1] = string.format("profile: %-44s %-9s %6s %11s %11s", "module (own time, children excluded)", "phase", "calls",
    self.stream and "device ms" or "ms", self.stream and "host ms" or "")
  for i = 1, math.min(top or 15, #rows) do
    local r = rows[i]
    out[#out + 1] = string.format("profile: %-44s %-9s %6d %11.3f %11s", r.key, r.cat, r.calls, 1e3 * r.dev,
      self.stream and string.format("%.3f", 1e3 * r.host) or "")
  end
  return (table.concat(out, "\n"):gsub(" +\n", "\n"):gsub(" +$", ""))
end

-- The spans as a Chrome trace (times in microseconds): thread 1 the host,
-- thread 2 the compute stream, thread 3 the comm streams; meta goes into
-- otherData.
function P:trace(meta)
  local ev = {
    { name = "thread_name", ph = "M", pid = 0, tid = 1, args = { name = "host (issue)" } },
  }
  if self.stream then ev[2] = { name = "thread_name", ph = "M", pid = 0, tid = 2, args = { name = "device (compute stream)" } } end
  ev[#ev + 1] = { name = "thread_name", ph = "M", pid = 0, tid = 3, args = { name = "comm streams (gathers, reductions)" } }
  local us = function(t) return math.floor(t * 1e9 + 0.5) / 1e3 end
  for _, s in ipairs(self.spans) do
    if s.comm then
      ev[#ev + 1] = { name = s.name, cat = s.cat, ph = "X", pid = 0, tid = 3, ts = us(s.dev_begin), dur = us(s.dev_end - s.dev_begin) }
    else
      ev[#ev + 1] = { name = s.name, cat = s.cat, ph = "X", pid = 0, tid = 1, ts = us(s.host_begin), dur = us(s.host_end - s.host_begin) }
    end
    if self.stream and not s.comm then
      ev[#ev + 1] = { name = s.name, cat = s.cat, ph = "X", pid = 0, tid = 2, ts = us(s.dev_begin), dur = us(s.dev_end - s.dev_begin) }
    end
  end
  return json.encode({ traceEvents = ev, displayTimeUnit = "ms", otherData = meta or {} })
end

return M

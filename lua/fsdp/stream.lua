-- fsdp.stream / fsdp.event: ordered work queues and the points between them
-- (see docs/COLLECTIVES.md). On CPU a stream is a worker thread.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}
local Stream, Event = {}, {}
Stream.__index, Event.__index = Stream, Event

-- Wraps a stream the engine owns (a comm's): no finalizer. owner (the comm)
-- is kept referenced; once its handle is gone (mesh freed) the stream is too.
function M.borrow(handle, device, owner)
  return setmetatable({ handle = handle, device = device, borrowed = true, owner = owner }, Stream)
end

function M.stream(device)
  device = device or "cpu"
  local p = ffi.new("fsdp_stream *[1]")
  check(C.fsdp_stream_create(tensor.device(device), p), "fsdp.stream")
  return setmetatable({ handle = ffi.gc(p[0], C.fsdp_stream_destroy), device = device }, Stream)
end

function Stream:free()
  if self.handle ~= nil and not self.borrowed then
    C.fsdp_stream_destroy(ffi.gc(self.handle, nil))
  end
  self.handle = nil
end

local function live(s, what)
  if s.handle == nil then error(what .. ": used after free()", 3) end
  if s.owner and s.owner.handle == nil then error(what .. ": the mesh owning this comm stream was freed", 3) end
  return s.handle
end

-- The C handle, or an error naming `what` if the stream or event is gone.
function Stream:live(what) return live(self, what) end
function Event:live(what) return live(self, what) end

function Stream:synchronize() check(C.fsdp_stream_synchronize(live(self, "stream:synchronize")), "stream:synchronize") end
function Stream:wait(e)
  if getmetatable(e) ~= Event then error("stream:wait: expected an fsdp.event, got " .. type(e), 2) end
  check(C.fsdp_stream_wait_event(live(self, "stream:wait"), live(e, "stream:wait")), "stream:wait")
end
function Stream:delay(us)
  if type(us) ~= "number" or us < 0 then error("stream:delay: microseconds must be a number >= 0, got " .. tostring(us), 2) end
  check(C.fsdp_stream_delay(live(self, "stream:delay"), us), "stream:delay")
end
function Stream:__tostring() return string.format("stream(%s%s)", self.device, self.borrowed and ", comm" or "") end

-- fsdp.event(device, true): a timed event, whose completions can be
-- compared (e:seconds_to(f)); for timelines (fsdp.profile)
function M.event(device, timed)
  device = device or "cpu"
  local p = ffi.new("fsdp_event *[1]")
  check((timed and C.fsdp_event_create_timed or C.fsdp_event_create)(tensor.device(device), p), "fsdp.event")
  return setmetatable({ handle = ffi.gc(p[0], C.fsdp_event_destroy), device = device }, Event)
end

function Event:free()
  if self.handle ~= nil then C.fsdp_event_destroy(ffi.gc(self.handle, nil)) end
  self.handle = nil
end

-- e:record(stream) marks the point; e:record() completes it now
function Event:record(s)
  if s ~= nil and getmetatable(s) ~= Stream then error("event:record: expected an fsdp.stream or nil, got " .. type(s), 2) end
  check(C.fsdp_event_record(live(self, "event:record"), s and live(s, "event:record") or nil), "event:record")
end
function Event:query() return check(C.fsdp_event_query(live(self, "event:query")), "event:query") == 1 end
function Event:synchronize() check(C.fsdp_event_synchronize(live(self, "event:synchronize")), "event:synchronize") end

-- seconds from this event's last completed record to e's (both timed,
-- both completed: synchronize first)
local seconds = ffi.new("double[1]")
function Event:seconds_to(e)
  if getmetatable(e) ~= Event then error("event:seconds_to: expected an fsdp.event, got " .. type(e), 2) end
  check(C.fsdp_event_elapsed(live(self, "event:seconds_to"), live(e, "event:seconds_to"), seconds), "event:seconds_to")
  return base.f64(seconds)
end

function M.memcpy(dst, src, s) return dst:copy_from(src, s) end

return M

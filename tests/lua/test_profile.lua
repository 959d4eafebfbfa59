-- test_profile.lua: fsdp.profile (train.profile), on CPU ranks:
--   * spans timed on two clocks: a span's own time is its length less its
--     children's (checked against the same times summed in float64 here),
--     a CPU stream's work shows on the device track and not on the host's
--     (a 60 ms pause enqueued between two records: device >= 55 ms, host
--     < 30 ms), and an edge the device reaches at once counts as starved,
--     one behind the pause does not;
--   * spans summed by module with the layer index taken out;
--   * the Chrome trace: every span on each track, in microseconds;
--   * the length of a union of intervals and of an overlap (the share of
--     communication hidden behind compute) against a brute force;
--   * train.profile on the tiny recipe: the file, spans of every decoder
--     layer's modules in both phases, the step's phases, each unit's
--     all-gathers and reduction on the comm track, the same losses as the
--     run without it; bad fields and an unwritable path.
local fsdp = require "fsdp"
local profile = require "fsdp.profile"
local json = require "fsdp.json"
local streams = require "fsdp.stream"
local train = require "fsdp.train"
local C = require("fsdp.ffi").C

fsdp.init()
local dir = arg[0]:match("^(.*/)") or "./"
local T = dofile(dir .. "testkit.lua")("test_profile")
local check, fails = T.check, T.fails
local root = arg[1] or dir .. "../.."
local work = T.workdir("profile")

local function spin(seconds) -- host time passes inside a span
  local t = C.fsdp_time_now()
  while C.fsdp_time_now() - t < seconds do end
end

-- 1. nesting and own time, host only (no stream: the device track is the host's)
do
  local outer, inner = {}, {}
  local p = profile.start({ device = "cpu", names = { [outer] = "model.layers.3.mlp", [inner] = "model.layers.3.mlp.up_proj" } })
  fails(function() profile.start({ device = "cpu" }) end, "already being recorded", "one profile at a time")
  p:enter(p:name_of(outer), "forward")
  spin(0.004)
  p:span(p:name_of(inner), "forward", spin, 0.006)
  spin(0.002)
  p:leave()
  p:enter(p:name_of({ kind = "Linear" }), "backward")
  local a, b, n = p:span("inner", "backward", function() return nil, 2 end)
  check(a == nil and b == 2 and n == nil, "a span returns all its function's results, nils included")
  p:leave()
  p:finish()
  check(profile.active == nil, "finish() ends the recording")
  local s = p.spans
  check(#s == 4 and s[2].parent == s[1] and s[1].parent == nil and s[3].parent == nil and s[4].parent == s[3],
    "spans nest as entered")
  local rows = p:summary()
  local want = (s[1].host_end - s[1].host_begin) - (s[2].host_end - s[2].host_begin)
  local by = {}
  for _, r in ipairs(rows) do by[r.key .. "/" .. r.cat] = r end
  local mlp, up = by["model.layers.*.mlp/forward"], by["model.layers.*.mlp.up_proj/forward"]
  check(mlp and up and by["Linear/backward"], "rows keyed by module path without the layer index, and by phase")
  check(mlp and math.abs(mlp.host - want) < 1e-12, "own time = length - children's")
  check(up and up.host >= 0.006 and mlp.host >= 0.006, string.format("own times cover the spins (%.4f, %.4f)", up and up.host or -1,
    mlp and mlp.host or -1))
  check(rows[1] == mlp or rows[1] == up, "rows sorted heaviest first")
  check(math.abs(s[1].dev_begin - s[1].host_begin) < 1e-3 and math.abs(s[1].dev_end - s[1].host_end) < 1e-3 and
    s[1].dev_end - s[1].dev_begin >= 0.012, "without a stream the device track is the host's")
end

-- 2. a CPU stream: work enqueued between two records is device time, not host time
do
  local st = streams.stream("cpu")
  local p = profile.start({ device = "cpu", stream = st })
  p:enter("queued", "forward")
  st:delay(60000)
  p:leave()
  p:finish()
  local s = p.spans[1]
  local dev, host = s.dev_end - s.dev_begin, s.host_end - s.host_begin
  check(dev >= 0.055 and host < 0.03, string.format("the device track holds the stream's 60 ms (device %.4f, host %.4f)", dev, host))
  -- (a CPU stream's worker wakes in ~0.1 ms, a GPU in microseconds: 5 ms here)
  local _, starved, events = p:summary(0.005)
  check(events == 2 and starved == 1, "the first edge, reached at once on an idle stream, counts as starved; the end, " ..
    "behind the pause, does not: " .. starved)
  local tr = json.decode(p:trace({ step = 7 }))
  local xs = {}
  for _, e in ipairs(tr.traceEvents) do if e.ph == "X" then xs[#xs + 1] = e end end
  check(#xs == 2 and tr.otherData.step == 7, "one event per span on each track, and the meta data")
  local d = xs[2] and xs[2].tid == 2 and xs[2].dur or -1
  check(math.abs(d - 1e6 * dev) < 0.01, string.format("durations in microseconds (%.3f vs %.3f)", d, 1e6 * dev))
  check(p:report(5):find("launch-bound", 1, true) ~= nil, "the report says what a starved edge means")
  st:free()
end

-- 3. leave() without enter(), and abandon()
do
  local p = profile.start({ device = "cpu" })
  fails(function() p:leave() end, "leave() without enter()", "an unmatched leave")
  p:enter("open", "forward")
  profile.abandon()
  check(profile.active == nil, "abandon() ends the recording (a run that failed)")
end

-- 4. the measure of interval unions and of an overlap, against a brute
-- force over the elementary segments between all endpoints (exact to 1e-12)
do
  local seed = 12345
  local function rnd() seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648 end
  local function brute(a, b)
    local xs = {}
    for _, v in ipairs(a) do xs[#xs + 1] = v[1]; xs[#xs + 1] = v[2] end
    for _, v in ipairs(b or {}) do xs[#xs + 1] = v[1]; xs[#xs + 1] = v[2] end
    table.sort(xs)
    local function inside(set, x) for _, v in ipairs(set) do if v[1] <= x and x <= v[2] then return true end end return false end
    local ua, both = 0, 0
    for i = 1, #xs - 1 do
      local mid = (xs[i] + xs[i + 1]) / 2
      if inside(a, mid) then
        ua = ua + (xs[i + 1] - xs[i])
        if b and inside(b, mid) then both = both + (xs[i + 1] - xs[i]) end
      end
    end
    return ua, both
  end
  local worst = 0
  for _ = 1, 200 do
    local a, b = {}, {}
    for _ = 1, 1 + math.floor(rnd() * 8) do local x = rnd(); a[#a + 1] = { x, x + rnd() * 0.3 } end
    for _ = 1, 1 + math.floor(rnd() * 8) do local x = rnd(); b[#b + 1] = { x, x + rnd() * 0.3 } end
    local ua, both = brute(a, b)
    worst = math.max(worst, math.abs(profile.union_length(a) - ua), math.abs(profile.overlap_length(a, b) - both))
  end
  check(worst < 1e-12, string.format("union and overlap lengths of 200 random interval sets as the brute force's (worst %.1e)",
    worst))
  check(profile.union_length({}) == 0 and profile.overlap_length({ { 0, 1 } }, {}) == 0, "empty sets measure 0")
  -- a large model's step has tens of thousands of spans: no list is unpacked
  local many, half = {}, {}
  for i = 1, 30000 do many[i] = { 2 * i, 2 * i + 1 } end
  for i = 1, 15000 do half[i] = { 2 * i + 0.5, 2 * i + 2 } end
  local ok, n = pcall(profile.union_length, many)
  local ok2, o = pcall(profile.overlap_length, many, half)
  check(ok and n == 30000 and ok2 and o == 15000 * 0.5 and many[1][1] == 2,
    "30000 intervals: union 30000, overlap 7500, the list untouched: " .. tostring(n) .. ", " .. tostring(o))
end

-- 5. train.profile on the tiny recipe
local function tiny() return dofile(root .. "/recipes/tiny.lua") end
local args = { "train.steps=3", "train.log_every=10", "data.seq=32", "data.micro_batch=2", "model.num_hidden_layers=2" }
local plain = train.run(tiny(), "plain.lua", args)
local path = work .. "/sub/trace.json"
local a2 = { unpack(args) }
a2[#a2 + 1] = "train.profile=" .. path
local prof = train.run(tiny(), "prof.lua", a2)
local same = true
for s = 1, 3 do same = same and plain.losses[s] == prof.losses[s] end
check(same, "profiling changes no loss, bit for bit")
local f = io.open(path)
local tr = f and json.decode(f:read("*a"))
if f then f:close() end
check(tr and tr.otherData.step == 2, "the second step is profiled by default, into a new folder")
local seen = {}
for _, e in ipairs(tr and tr.traceEvents or {}) do seen[e.name .. "/" .. (e.cat or "")] = true end
for _, want in ipairs({ "model.layers.0.mlp.down_proj/forward", "model.layers.1.mlp.down_proj/backward",
  "model.layers.1.self_attn/backward", "model.embed_tokens/forward", "forward + loss/step", "backward/step",
  "optimizer/step", "grads: wait, norm, loss/step" }) do
  check(seen[want], "the trace has " .. want)
end
-- the units' collectives on the comm streams' track: each unit's
-- all-gathers and its reduction, inside the step, ends after beginnings
local comm_spans, sane = {}, true
for _, e in ipairs(tr and tr.traceEvents or {}) do
  if e.cat == "comm" then
    comm_spans[e.name] = true
    sane = sane and e.tid == 3 and e.dur >= 0 and e.ts >= 0
  end
end
for _, want in ipairs({ "all-gather model.layers.0", "all-gather model.layers.1", "reduce model.layers.0",
  "reduce model.layers.1", "reduce embed", "all-gather head" }) do
  check(comm_spans[want], "the trace's comm track has " .. want)
end
check(sane, "comm spans on their own track (3), with lengths >= 0")
a2[#a2] = "train.profile_step=3"
fails(function() train.run(tiny(), "p.lua", a2) end, "train.profile_step = 3 without train.profile", "a step without a file")
a2[#a2] = "train.profile_step=0"
a2[#a2 + 1] = "train.profile=" .. path
fails(function() train.run(tiny(), "p.lua", a2) end, "train.profile_step = 0; expected >= 1", "a step below 1")
-- a folder that cannot be made: a warning, and the run trains on
a2[#a2 - 1] = "train.profile_step=3"
a2[#a2] = "train.profile=/proc/fsdp-no-such/trace.json"
local ok, out = pcall(train.run, tiny(), "p.lua", a2)
check(ok and out.losses[3] == plain.losses[3], "an unwritable train.profile does not stop training: " .. tostring(out))
os.execute("rm -rf '" .. work .. "'")
T.finish()

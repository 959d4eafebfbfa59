-- test_collectives.lua: the Lua bindings of the collectives on several ranks
-- (fsdprun -n N fsdp tests/lua/test_collectives.lua). The C test
-- (tests/c/test_collectives.c) covers the transport in depth; this one checks
-- that what Lua passes down (counts, dtypes, ops, groups of a 2-D mesh) is
-- right, against a reference computed in Lua in float64.
-- Tolerance: inputs are multiples of 1/4 below 8, so sums are exact in fp32
-- and bf16 and compared exactly; averages to 1e-6 (fp32) or 2^-8 (bf16) relative.
local fsdp = require "fsdp"

local info = fsdp.init()
local W, R = info.size, info.rank
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_collectives.lua rank %d/%d", R, W))
local check, fails = T.check, T.fails

local function value(r, i) return ((r * 131 + i * 7) % 61 - 30) * 0.25 end

local function close(got, want, dtype, op)
  if got ~= got then return false end
  if op == "sum" then return got == want end
  local rel = dtype == "fp32" and 1e-6 or 1 / 256
  return math.abs(got - want) <= rel * math.abs(want) + 1e-30
end

local function run_on(comm, label)
  local n, me, members = comm:size(), comm:rank(), comm:members()
  for _, dtype in ipairs { "fp32", "bf16" } do
    for _, count in ipairs { 0, 1, 5, 1001 } do
      for _, op in ipairs { "sum", "avg" } do
        -- all_reduce
        if count > 0 then
          local x, y = fsdp.tensor(count, dtype), fsdp.tensor(count, dtype)
          for i = 0, count - 1 do x:set(i, value(R, i)) end
          comm:all_reduce(y, x, op)
          comm:synchronize()
          local ok = true
          for i = 0, count - 1 do
            local s = 0
            for _, r in ipairs(members) do s = s + value(r, i) end
            if op == "avg" then s = s / n end
            ok = ok and close(y:get(i), s, dtype, op)
          end
          check(ok, string.format("%s all_reduce %s %s n=%d", label, dtype, op, count))
          -- reduce_scatter: piece j of rank r's input holds value(r, j*count + i)
          local big = fsdp.tensor(count * n, dtype)
          for i = 0, count * n - 1 do big:set(i, value(R, i)) end
          local out = fsdp.tensor(count, op == "avg" and "fp32" or dtype)
          comm:reduce_scatter(out, big, op)
          comm:synchronize()
          ok = true
          for i = 0, count - 1 do
            local s = 0
            for _, r in ipairs(members) do s = s + value(r, me * count + i) end
            if op == "avg" then s = s / n end
            ok = ok and close(out:get(i), s, out.dtype, op)
          end
          check(ok, string.format("%s reduce_scatter %s->%s %s n=%d", label, dtype, out.dtype, op, count))
        end
      end
      if count > 0 then
        local x = fsdp.tensor(count, dtype)
        for i = 0, count - 1 do x:set(i, value(R, i)) end
        local all = fsdp.tensor(count * n, dtype)
        comm:all_gather(all, x)
        comm:synchronize()
        local ok = true
        for j, r in ipairs(members) do
          for i = 0, count - 1 do ok = ok and all:get((j - 1) * count + i) == value(r, i) end
        end
        check(ok, string.format("%s all_gather %s n=%d", label, dtype, count))
        local b = fsdp.tensor(count, dtype)
        if me == n - 1 then for i = 0, count - 1 do b:set(i, value(R, i)) end else b:fill(0) end
        comm:broadcast(b, n - 1)
        comm:synchronize()
        ok = true
        for i = 0, count - 1 do ok = ok and b:get(i) == value(members[n], i) end
        check(ok, string.format("%s broadcast %s n=%d", label, dtype, count))
        -- shift: member (me - dist) mod n's x arrives (dist nil: 1)
        for _, dist in ipairs { 1, -1, 2, n } do
          local y = fsdp.tensor(count, dtype)
          comm:shift(y, x, dist ~= 1 and dist or nil)
          comm:synchronize()
          local src = members[(me - dist) % n + 1]
          ok = true
          for i = 0, count - 1 do ok = ok and y:get(i) == value(src, i) end
          check(ok, string.format("%s shift %s n=%d dist=%d", label, dtype, count, dist))
        end
      end
    end
  end
  comm:barrier()
  comm:synchronize()
  -- comm:barrier() returns once every member has reached it: the last
  -- member comes 0.3 s late, the others wait for it
  if n > 1 then
    local t0 = fsdp.C.fsdp_time_now()
    if me == n - 1 then os.execute("sleep 0.3") end
    comm:barrier()
    local waited = fsdp.C.fsdp_time_now() - t0
    if me ~= n - 1 then check(waited >= 0.25, string.format("%s barrier waits for the last member (%.2f s)", label, waited)) end
  end
end

local dims = W % 2 == 0 and { { "outer", 2 }, { "inner", -1 } } or { { "inner", -1 } }
local mesh = fsdp.mesh(dims)
check(#mesh:dims() == #dims, "mesh dims")
local inner = mesh:group("inner")
check(inner:size() == (W % 2 == 0 and W / 2 or W), "inner group size")
run_on(inner, "inner")
if W % 2 == 0 then
  local outer = mesh:group("outer")
  check(outer:size() == 2 and outer:rank() == mesh:coord("outer"), "outer group")
  run_on(outer, "outer")
  local flat = mesh:group("outer,inner")
  check(flat:size() == W and flat:rank() == R, "flattened group")
end
local world = mesh:group("world")
run_on(world, "world")

-- the bytes this rank sent (comm:bytes_sent): every collective run_on
-- issued, by the ring convention, and back to 0 after a reset
do
  world:bytes_reset()
  local z = world:bytes_sent()
  check(z.total == 0 and z.all_gather == 0 and world:calls("total") == 0, "bytes_sent after a reset: 0")
  local count, n = 1000, world:size()
  local x, full = fsdp.tensor(count), fsdp.tensor(count * n)
  world:all_gather(full, x)
  world:reduce_scatter(x, full, "sum")
  world:all_reduce(x, x, "sum")
  world:all_reduce(fsdp.tensor(count, "bf16"), fsdp.tensor(count, "bf16"), "sum")
  world:broadcast(x, 0)
  world:shift(fsdp.tensor(count), x)
  world:synchronize()
  local s = world:bytes_sent()
  local ag, ar, sh = (n - 1) * count * 4, 2 * (n - 1) / n * count * 6, n > 1 and count * 4 or 0
  check(s.all_gather == ag and s.reduce_scatter == ag and math.abs(s.all_reduce - ar) <= 1e-9 * ar and
    math.abs(s.broadcast - ag / n) <= 1e-9 * ag and s.shift == sh and
    math.abs(s.total - (2 * ag + ar + ag / n + sh)) <= 1e-9 * s.total,
    string.format("bytes_sent by kind on %d ranks: %s %s %s %s %s", n, s.all_gather, s.reduce_scatter, s.all_reduce,
      s.broadcast, s.shift))
  check(world:calls("all_reduce") == 2 and world:calls("shift") == 1 and world:calls("total") == 6, "calls by kind")
  check(world:bytes_sent("all_gather") == ag, "bytes_sent of one kind")
  local okk, e = pcall(world.bytes_sent, world, "gather")
  check(not okk and tostring(e):find("kind 'gather'"), "an unknown kind is an error: " .. tostring(e))
end

-- Lua-side argument checks name what is wrong
local ok, err = pcall(function() world:all_gather(fsdp.tensor(1), fsdp.tensor(1)) end)
check(W == 1 and ok or (not ok and tostring(err):find("expected")), "all_gather size mismatch is an error: " .. tostring(err))
ok, err = pcall(function() world:shift(fsdp.tensor(2), fsdp.tensor(3)) end)
check(not ok and tostring(err):find("must match"), "shift size mismatch is an error: " .. tostring(err))
local same = fsdp.tensor(4)
ok, err = pcall(function() world:shift(same, same) end)
check(not ok and tostring(err):find("overlap"), "shift in place is an error: " .. tostring(err))
ok, err = pcall(function() mesh:group("nope") end)
check(not ok and tostring(err):find("no dimension 'nope'"), "unknown group: " .. tostring(err))

mesh:free()
mesh:free() -- idempotent
T.finish()

-- demo_collectives.lua: the engine's ranks start, build a device mesh and
-- talk. Run it with `fsdprun -n 4 recipes/demo_collectives.lua` (the README's
-- first command does). Each rank prints where it sits in the mesh; rank 0
-- prints the results of each collective, checked against the answer worked
-- out locally, and the bandwidth of a 64 MiB all-reduce.
local fsdp = require "fsdp"

local info = fsdp.init()
local W, R = info.size, info.rank
local dims = (W % 2 == 0 and W >= 4) and { { "dp_outer", 2 }, { "dp_shard", -1 } } or { { "dp_shard", -1 } }
local mesh = fsdp.mesh(dims, { device = "cpu" })
local shard = mesh:group("dp_shard")
local world = mesh:group("world")
if R == 0 then print(mesh:describe()) end
print(string.format("rank %d of %d: local rank %d, mesh coordinates %s, dp_shard group %s = {%s}",
  R, W, info.local_rank,
  #dims == 2 and string.format("(dp_outer=%d, dp_shard=%d)", mesh:coord("dp_outer"), mesh:coord("dp_shard"))
    or string.format("(dp_shard=%d)", mesh:coord("dp_shard")),
  shard:name(), table.concat(shard:members(), ",")))

local function say(fmt, ...) if R == 0 then print(string.format(fmt, ...)) end end
local function expect(ok, what) if not ok then error("rank " .. R .. ": wrong result: " .. what) end end

-- all_reduce over the world: the sum of (rank + 1) is W(W+1)/2
local x = fsdp.tensor(1, "fp32")
x:set(0, R + 1)
world:all_reduce(x, x, "sum")
world:synchronize()
expect(x:get(0) == W * (W + 1) / 2, "all_reduce")
say("all_reduce(sum of rank+1) over %d ranks = %g", W, x:get(0))

-- all_gather along dp_shard: every member's global rank, in member order
local mine = fsdp.tensor(1, "fp32")
mine:set(0, R)
local all = fsdp.tensor(shard:size(), "fp32")
shard:all_gather(all, mine)
shard:synchronize()
for i, r in ipairs(shard:members()) do expect(all:get(i - 1) == r, "all_gather") end
say("all_gather along dp_shard on rank 0: {%s}", table.concat(all:to_table(), ","))

-- reduce_scatter along dp_shard, bf16 gradients reduced into an fp32 shard
local n = shard:size()
local grads = fsdp.tensor(4 * n, "bf16")
for i = 0, 4 * n - 1 do grads:set(i, 0.5 * (i % 4) + R) end
local gshard = fsdp.tensor(4, "fp32")
shard:reduce_scatter(gshard, grads, "avg")
shard:synchronize()
local rsum = 0
for _, r in ipairs(shard:members()) do rsum = rsum + r end
for i = 0, 3 do expect(math.abs(gshard:get(i) - (0.5 * i + rsum / n)) < 1e-6, "reduce_scatter") end
say("reduce_scatter(avg, bf16 -> fp32) along dp_shard on rank 0: {%s}", table.concat(gshard:to_table(), ","))

-- 64 MiB all_reduce: time and bus bandwidth
local big = fsdp.tensor(16 * 1024 * 1024, "fp32")
big:fill(1)
world:all_reduce(big, big, "sum")
world:synchronize()
world:barrier()
world:synchronize()
local now = function() return fsdp.C.fsdp_time_now() end
local reps = 3
local t = now()
for _ = 1, reps do world:all_reduce(big, big, "avg") end
world:synchronize()
local dt = (now() - t) / reps
expect(big:get(12345) == W, "64 MiB all_reduce")
say("all_reduce of 64 MiB over %d ranks: %.1f ms, bus bandwidth %.2f GB/s (shared memory)",
  W, dt * 1e3, 64 * 1048576 / dt * 2 * (W - 1) / math.max(W, 1) / 1e9)
say("demo done: %d ranks started, formed a mesh, and every collective checked out", W)
mesh:free()

-- test_shared_layer.lua: a user's model that calls one layer twice in its
-- forward (weights used twice, as a shared or looped block is), sharded
-- with fsdp.fully_shard on W ranks (fsdprun -n W), one unit per Linear, at
-- ZeRO 0, 2 and 3 (the shared unit gathered for each call, its gradients
-- reduced once after both backwards):
--   y = B(tanh(A(tanh(A(x)))))  A: Linear(6, 6), B: Linear(6, 3)
-- Its parameters are named once (A's at its first place, "0"); one SGD step
-- (lr 1, no momentum, decay, and clip = 0: no clipping) gives the gradient of the ranks'
-- mean MSE as w_before - w_after, held to central differences of the same
-- loss computed in float64 from the gathered weights (h = 1e-5), within
-- 2e-4 relative to the largest gradient (the step's fp32 rounding).
local fsdp = require "fsdp"
local nn = fsdp.nn

local info = fsdp.init()
local W, R = info.size, info.rank
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_shared_layer rank %d/%d", R, W))
local check = T.check

local ROWS, IN, OUT = 3, 6, 3
local function model()
  local a = nn.Linear(IN, IN, { std = 0.5 })
  return nn.Sequential(a, nn.Tanh(), a, nn.Tanh(), nn.Linear(IN, OUT, { std = 0.5 }))
end
local names = { "0.weight", "0.bias", "4.weight", "4.bias" }
local function batch(g)
  local x, y = fsdp.tensor({ ROWS, IN }), fsdp.tensor({ ROWS, OUT })
  for i = 0, ROWS * IN - 1 do x:set(i, math.sin(0.7 * g + 0.31 * i)) end
  for i = 0, ROWS * OUT - 1 do y:set(i, 0.5 * math.cos(0.5 * g + 0.41 * i)) end
  return { x = x, y = y }
end

-- the loss in float64 from weights p (name -> Lua array), over every rank's batch
local function loss64(p)
  local function linear(w, b, x, n_in, n_out)
    local y = {}
    for r = 0, ROWS - 1 do
      for o = 0, n_out - 1 do
        local s = b[o + 1]
        for i = 0, n_in - 1 do s = s + w[o * n_in + i + 1] * x[r * n_in + i + 1] end
        y[r * n_out + o + 1] = s
      end
    end
    return y
  end
  local function tanh(v)
    local y = {}
    for i, e in ipairs(v) do y[i] = math.tanh(e) end
    return y
  end
  local total = 0
  for g = 0, W - 1 do
    local b = batch(g)
    local x, t = b.x:to_table(), b.y:to_table()
    local h = tanh(linear(p["0.weight"], p["0.bias"], x, IN, IN))
    h = tanh(linear(p["0.weight"], p["0.bias"], h, IN, IN))
    local y = linear(p["4.weight"], p["4.bias"], h, IN, OUT)
    local s = 0
    for i = 1, #y do s = s + (y[i] - t[i]) ^ 2 end
    total = total + s / #y
  end
  return total / W
end

local mesh = fsdp.mesh({ { "dp", W } })
for _, zero in ipairs({ 0, 2, 3 }) do
  local s = fsdp.fully_shard(model(), { shard = mesh:group("dp"), units = { "Linear" }, zero = zero, seed = 11 })
  check(#s.units == 2, string.format("zero %d: the shared Linear is one unit (%d units)", zero, #s.units))
  local before = {}
  for _, n in ipairs(names) do before[n] = s:gather(n) end
  s:train_step({ batch(R) }, { optimizer = "sgd", lr = 1, momentum = 0, weight_decay = 0, clip = 0 })
  local worst, big = 0, 0
  for _, n in ipairs(names) do
    local after = s:gather(n)
    for i = 1, #after do
      local g = before[n][i] - after[i]
      local p = {}
      for k, v in pairs(before) do p[k] = { unpack(v) } end
      local h = 1e-5
      p[n][i] = before[n][i] + h
      local lp = loss64(p)
      p[n][i] = before[n][i] - h
      local want = (lp - loss64(p)) / (2 * h)
      worst, big = math.max(worst, math.abs(g - want)), math.max(big, math.abs(want))
    end
  end
  check(worst <= 2e-4 * big, string.format("zero %d, %d ranks: the gradient through both calls vs float64 central " ..
    "differences (worst %.2e of %.2e)", zero, W, worst, big))
  s:free()
end
mesh:free()
T.finish()

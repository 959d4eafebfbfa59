-- fsdp.sample: the next token from one row of logits, as Hugging Face's
-- generate chooses it: greedy (the first largest logit, as torch.argmax),
-- or drawn from the softmax after its warpers in its order: temperature,
-- then top-k, then top-p (the smallest set of most likely tokens whose
-- probabilities reach top_p, at least one kept). Draws come from
-- Philox-4x32-10 keyed by the seed and counted by the draw's index: the
-- same seed gives the same tokens on every machine and device.
--
--   local pick = sample.picker({temperature = 0.8, top_k = 50, top_p = 0.95, seed = 1})
--   local id = pick(logits, V, i)   -- logits: a float/double pointer or a Lua array (0-based)
local base = require "fsdp.ffi"
local ffi, C = base.ffi, base.C

local M = {}

-- uniform in [0, 1) for draw i under seed (53 bits from two words)
function M.uniform(seed, i)
  local ctr, key, out = ffi.new("uint32_t[4]"), ffi.new("uint32_t[2]"), ffi.new("uint32_t[4]")
  ctr[0], ctr[1] = i % 2 ^ 32, math.floor(i / 2 ^ 32)
  key[0], key[1] = seed % 2 ^ 32, math.floor(seed / 2 ^ 32) % 2 ^ 32
  C.fsdp_philox4x32_10(ctr, key, out)
  return (math.floor(tonumber(out[0]) / 2 ^ 11) * 2 ^ 32 + tonumber(out[1])) / 2 ^ 53
end

-- the index of the first largest of x[0 .. V-1]
function M.argmax(x, V)
  local best, at = -math.huge, 0
  for j = 0, V - 1 do
    local v = x[j]
    if v > best then best, at = v, j end
  end
  return at
end

local function check_opts(o)
  local t, k, p = o.temperature, o.top_k, o.top_p
  if t ~= nil and not (type(t) == "number" and t >= 0 and t < math.huge) then
    error("temperature = " .. tostring(t) .. "; expected a number >= 0 (0: greedy)", 3)
  end
  if k ~= nil and not (type(k) == "number" and k >= 0 and k % 1 == 0) then
    error("top_k = " .. tostring(k) .. "; expected an integer >= 0 (0: off)", 3)
  end
  if p ~= nil and not (type(p) == "number" and p > 0 and p <= 1) then
    error("top_p = " .. tostring(p) .. "; expected a number in (0, 1] (1: off)", 3)
  end
  if o.seed ~= nil and not (type(o.seed) == "number" and o.seed >= 0 and o.seed % 1 == 0 and o.seed < 2 ^ 53) then
    error("seed = " .. tostring(o.seed) .. "; expected an integer >= 0", 3)
  end
end

-- the k-th largest of x[j] for j in idx (#idx > k): a min-heap of the k
-- largest seen, O(#idx log k) (a sort of a 128k vocabulary per token took
-- 85 ms in LuaJIT)
local function kth_largest(x, idx, k)
  local h = {}
  local function down(i)
    while true do
      local l, r, m = 2 * i, 2 * i + 1, i
      if l <= k and h[l] < h[m] then m = l end
      if r <= k and h[r] < h[m] then m = r end
      if m == i then return end
      h[i], h[m] = h[m], h[i]
      i = m
    end
  end
  for q = 1, k do h[q] = x[idx[q]] end
  for q = math.floor(k / 2), 1, -1 do down(q) end
  for q = k + 1, #idx do
    local v = x[idx[q]]
    if v > h[1] then
      h[1] = v
      down(1)
    end
  end
  return h[1]
end

-- A function(logits, V, i) -> token id: greedy when o.greedy or
-- temperature 0 (or absent), else a draw with o.seed (default 0) at index i.
function M.picker(o)
  o = o or {}
  check_opts(o)
  local temp = o.temperature or 0
  if o.greedy or temp == 0 then return function(x, V) return M.argmax(x, V) end end
  local top_k, top_p, seed = o.top_k or 0, o.top_p or 1, o.seed or 0
  return function(x, V, i)
    -- the candidates: tokens within 40 / temperature of the largest logit
    -- (the others' probabilities are below e^-40 of the top one's: never
    -- drawn but for a chance under 1e-12 for the whole vocabulary), then
    -- with top-k the k largest of those (every token tied with the k-th
    -- stays, as transformers' TopKLogitsWarper keeps them)
    local mx = -math.huge
    for j = 0, V - 1 do if x[j] > mx then mx = x[j] end end
    local cut, idx = mx - 40 * temp, {}
    for j = 0, V - 1 do if x[j] >= cut then idx[#idx + 1] = j end end
    local function largest(m) -- the m largest candidates, and those tied with the m-th
      local kth, kept = kth_largest(x, idx, m), {}
      for _, j in ipairs(idx) do if x[j] >= kth then kept[#kept + 1] = j end end
      return kept
    end
    if top_k > 0 and #idx > top_k then idx = largest(top_k) end
    local total -- the candidates' mass (top-p's denominator), before it keeps only the likeliest
    if top_p < 1 then -- only the most likely tokens can be in top-p's set: 64, 256, ... of them until their mass is
      local m = 64
      total = 0
      for _, j in ipairs(idx) do total = total + math.exp((x[j] - mx) / temp) end
      while m < #idx do
        local kept, mass = largest(m), 0
        for _, j in ipairs(kept) do mass = mass + math.exp((x[j] - mx) / temp) end
        if mass >= top_p * total then idx = kept; break end
        m = m * 4
      end
    end
    table.sort(idx, function(a, b) -- largest first; ties: the smaller id first
      local xa, xb = x[a], x[b]
      if xa ~= xb then return xa > xb end
      return a < b
    end)
    local n = #idx
    local probs, sum = {}, 0
    for r = 1, n do
      local e = math.exp((x[idx[r]] - mx) / temp)
      probs[r], sum = e, sum + e
    end
    if top_p < 1 then -- the most likely tokens until their mass reaches top_p
      local acc, keep = 0, n
      for r = 1, n do
        acc = acc + probs[r] / total
        if acc >= top_p then keep = r; break end
      end
      n, sum = keep, 0
      for r = 1, n do sum = sum + probs[r] end
    end
    local u, acc = M.uniform(seed, i) * sum, 0
    for r = 1, n do
      acc = acc + probs[r]
      if u < acc then return idx[r] end
    end
    return idx[n]
  end
end

return M

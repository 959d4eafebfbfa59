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

-- A function(logits, V, i) -> token id: greedy when o.greedy or
-- temperature 0 (or absent), else a draw with o.seed (default 0) at index i.
function M.picker(o)
  o = o or {}
  check_opts(o)
  local temp = o.temperature or 0
  if o.greedy or temp == 0 then return function(x, V) return M.argmax(x, V) end end
  local top_k, top_p, seed = o.top_k or 0, o.top_p or 1, o.seed or 0
  return function(x, V, i)
    -- candidates by logit, largest first (ties: the smaller id first)
    local idx = {}
    for j = 0, V - 1 do idx[j + 1] = j end
    table.sort(idx, function(a, b)
      local xa, xb = x[a], x[b]
      if xa ~= xb then return xa > xb end
      return a < b
    end)
    local n = V
    if top_k > 0 and top_k < n then
      -- as transformers' TopKLogitsWarper: every token tied with the k-th stays
      local kth = x[idx[top_k]]
      n = top_k
      while n < V and x[idx[n + 1]] == kth do n = n + 1 end
    end
    local mx, probs, sum = x[idx[1]] / temp, {}, 0
    for r = 1, n do
      local e = math.exp(x[idx[r]] / temp - mx)
      probs[r], sum = e, sum + e
    end
    if top_p < 1 then -- the most likely tokens until their mass reaches top_p
      local acc, keep = 0, n
      for r = 1, n do
        acc = acc + probs[r] / sum
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

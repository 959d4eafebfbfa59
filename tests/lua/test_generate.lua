-- test_generate.lua ROOT: fsdp.generate and fsdp.sample on one CPU rank.
-- A Llama of the tiny recipe's shape with random weights drawn wide
-- (initializer_range 0.5, so that the logits are far from ties):
--   * greedy with the KV cache gives the tokens, token for token, of the
--     reference that runs the whole sequence again every step (no cache);
--     the cached logits of the last step within 1e-5 (relative to the
--     largest) of the reference's
--   * sampling (temperature, top-k, top-p) with a seed: the same tokens
--     with and without the cache, the same seed twice the same, another
--     seed other tokens; top_k = 1 is greedy
--   * the end-of-text token stops it (kept as the last token); the length
--     past max_position_embeddings, an empty prompt, an id outside the
--     vocabulary and bad sampling options are refused naming the value
--   * the model held whole (fsdp.inference) from an export and from a
--     checkpoint: the sharded model's tokens, 4 bytes a parameter, a NaN in
--     the files refused naming the tensor and element
--   * fsdp.sample's draws against float64 probabilities: 20000 draws over
--     six fixed logits at temperature 0.7 with top-k 4 and top-p 0.9, each
--     token's frequency within 0.012 of its probability (4 sigma), the
--     tokens top-k / top-p remove never drawn
local root = arg[1]
package.path = root .. "/tests/lua/?.lua;" .. package.path
local T = dofile(root .. "/tests/lua/testkit.lua")("test_generate")
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local generate = require "fsdp.generate"
local sample = require "fsdp.sample"
local tensor = require "fsdp.tensor"
fsdp.init()

local spec = dofile(root .. "/recipes/tiny.lua").model
spec.initializer_range = 0.5
spec.max_position_embeddings = 64
local cfg = llama.config(spec)
local mesh = fsdp.mesh("dp_shard=-1")
local s = fsdp.fully_shard(llama.model(cfg), { shard = mesh:group("dp_shard"), units = llama.units, zero = 3, seed = 7 })
local g = generate.wrap(s, cfg, { source = "test model" })
local prompt = { 72, 101, 108, 108, 111, 44, 32 }

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- greedy: cache against no cache
local a = g:generate(prompt, { max_new_tokens = 40 })
local b = g:generate(prompt, { max_new_tokens = 40, no_cache = true })
T.check(#a == 40 and same(a, b), "greedy with the KV cache equals the reference without: " .. table.concat(a, " ") ..
  " / " .. table.concat(b, " "))
local distinct = {}
for _, v in ipairs(a) do distinct[v] = true end
local nd = 0
for _ in pairs(distinct) do nd = nd + 1 end
T.check(nd >= 5, "the greedy tokens vary (" .. nd .. " distinct): the comparison means something")

-- the last step's logits, cached and not
local seq = {}
for i, v in ipairs(prompt) do seq[i] = v end
for i = 1, 39 do seq[#seq + 1] = a[i] end
local function last_logits(kv, from)
  local ids = tensor.new({ 1, #seq - from + 1 }, "int32")
  for i = from, #seq do ids:ptr()[i - from] = seq[i] end
  local y = s:infer(function(model, ctx) return model:forward_last(ctx, ids) end, kv)
  local out = {}
  for j = 0, cfg.vocab_size - 1 do out[j] = y:ptr()[j] end
  y:free(); ids:free()
  return out
end
local kv = { pos = 0, cap = #seq, layers = {} }
local saved = seq
seq = {}
for i = 1, #saved - 1 do seq[i] = saved[i] end
last_logits(kv, 1) -- the prefill of all but the last token
kv.pos = #seq
seq = saved
local cached, full = last_logits(kv, #seq), last_logits(nil, 1)
for _, c in pairs(kv.layers) do c.k:free(); c.v:free() end
local err, big = 0, 0
for j = 0, cfg.vocab_size - 1 do
  err = math.max(err, math.abs(cached[j] - full[j]))
  big = math.max(big, math.abs(full[j]))
end
T.check(err <= 1e-5 * big, string.format("cached logits within 1e-5 of the reference (%.3g of %.3g)", err, big))

-- sampling
local o = { temperature = 0.9, top_k = 40, top_p = 0.95, seed = 11, max_new_tokens = 30 }
local s1 = g:generate(prompt, o)
local s2 = g:generate(prompt, { temperature = 0.9, top_k = 40, top_p = 0.95, seed = 11, max_new_tokens = 30, no_cache = true })
local s3 = g:generate(prompt, { temperature = 0.9, top_k = 40, top_p = 0.95, seed = 12, max_new_tokens = 30 })
T.check(same(s1, s2), "sampled with a seed: the same tokens with and without the cache")
T.check(same(s1, g:generate(prompt, o)), "sampled: the same seed, the same tokens")
T.check(not same(s1, s3), "sampled: another seed, other tokens")
T.check(same(g:generate(prompt, { temperature = 1, top_k = 1, seed = 3, max_new_tokens = 20 }), { unpack(a, 1, 20) }),
  "top_k = 1 is greedy")

-- end of text
local eos = a[6]
local first = 6
for i = 1, 6 do if a[i] == eos then first = i; break end end
local e, st = g:generate(prompt, { max_new_tokens = 40, eos = { eos } })
T.check(#e == first and e[#e] == eos and st.stopped == "eos", "stops after the end-of-text token, which is kept (" .. #e .. ")")
local e2, st2 = g:generate(prompt, { max_new_tokens = 10, eos = { eos }, stop_at_eos = false })
T.check(#e2 == 10 and st2.stopped == "length", "stop_at_eos = false goes on to the length")

-- refusals
T.fails(function() g:generate(prompt, { max_new_tokens = 60 }) end, "pass the model's max_position_embeddings 64",
  "7 + 60 tokens past 64 positions")
T.fails(function() g:generate({}, {}) end, "the prompt is empty", "an empty prompt")
T.fails(function() g:generate({ 1, 256 }, {}) end, "prompt token 2 is 256, outside the vocabulary [0, 256)", "an id past the vocabulary")
T.fails(function() g:generate(prompt, { temperature = -1, max_new_tokens = 5 }) end, "temperature = -1", "a negative temperature")
T.fails(function() g:generate(prompt, { temperature = 1, top_p = 0, max_new_tokens = 5 }) end, "top_p = 0", "top_p 0")
T.fails(function() g:generate(prompt, { temperature = 1, top_k = 1.5, max_new_tokens = 5 }) end, "top_k = 1.5", "a fractional top_k")

-- fsdp.sample's draws against float64 probabilities
local logits = { [0] = 2.0, 1.5, 1.4, 0.3, -1.0, 1.45 }
local temp, k, p = 0.7, 4, 0.9
local order = { 0, 1, 5, 2, 3, 4 } -- by logit
local probs, sum = {}, 0
for r = 1, k do probs[order[r]] = math.exp(logits[order[r]] / temp); sum = sum + probs[order[r]] end
local acc, keep = 0, k
for r = 1, k do
  acc = acc + probs[order[r]] / sum
  if acc >= p then keep = r; break end
end
local want, wsum = {}, 0
for r = 1, keep do wsum = wsum + probs[order[r]] end
for r = 1, keep do want[order[r]] = probs[order[r]] / wsum end
local counts, n = {}, 20000
for i = 1, n do
  local pick = sample.picker({ temperature = temp, top_k = k, top_p = p, seed = 5 })
  local id = pick(logits, 6, i)
  counts[id] = (counts[id] or 0) + 1
end
for id = 0, 5 do
  local f, w = (counts[id] or 0) / n, want[id] or 0
  T.check(math.abs(f - w) <= 0.012, string.format("token %d drawn %.4f of the time; probability %.4f", id, f, w))
end
T.check(sample.argmax({ [0] = 1, 3, 3, 2 }, 4) == 1, "argmax: the first of equal largest logits")
-- top-p alone over 300 slowly falling logits: a nucleus past the sampler's
-- first 64 and 256 candidates; no draw outside it, the mean id within 4
-- sigma of float64's
do
  local V, tp, temp2 = 300, 0.9, 1.0
  local lg, pr, tot = {}, {}, 0
  for j = 0, V - 1 do lg[j] = -0.01 * j; pr[j] = math.exp(lg[j] / temp2); tot = tot + pr[j] end
  local acc, last = 0, V - 1
  for j = 0, V - 1 do
    acc = acc + pr[j] / tot
    if acc >= tp then last = j; break end
  end
  local z, mean, sq = 0, 0, 0
  for j = 0, last do z = z + pr[j] end
  for j = 0, last do mean = mean + j * pr[j] / z; sq = sq + j * j * pr[j] / z end
  local sd = math.sqrt(sq - mean * mean)
  local pick = sample.picker({ temperature = temp2, top_p = tp, seed = 8 })
  local sum, top, draws = 0, 0, 20000
  for i = 1, draws do
    local id = pick(lg, V, i)
    sum, top = sum + id, math.max(top, id)
  end
  T.check(top <= last and top >= last - 5, string.format("top-p 0.9 over 300 logits: draws up to id %d (the nucleus ends at %d)",
    top, last))
  T.check(math.abs(sum / draws - mean) <= 4 * sd / math.sqrt(draws), string.format("top-p: mean id %.2f, float64 %.2f",
    sum / draws, mean))
end

-- the model held whole (fsdp.inference, what fsdp generate loads): from an
-- fp32 export and from a checkpoint of the same weights, the same greedy
-- tokens as the sharded model; 4 bytes a parameter and no more; a NaN in
-- the files refused naming the tensor and the element
local hf = require "fsdp.hf"
local hf_config = require "fsdp.hf_config"
local checkpoint = require "fsdp.checkpoint"
local work = T.workdir("generate")
hf.export(s, cfg, work .. "/export", { dtype = "fp32" })
checkpoint.save(s, work .. "/ck", { step = 1, files = { ["config.json"] = hf_config.encode(cfg, "fp32") } })
local n_params = llama.num_params(cfg)
for _, src in ipairs({ work .. "/export", work .. "/ck" }) do
  local h = generate.open(src, { device = "cpu" })
  T.check(same(h:generate(prompt, { max_new_tokens = 40 }), a), "held whole from " .. src .. ": the sharded model's greedy tokens")
  T.check(h.s.bytes == 4 * n_params, string.format("held whole: %d bytes for %d parameters (4 each, no optimizer state)",
    h.s.bytes, n_params))
  h:close()
end
os.execute(string.format("cp -r '%s/export' '%s/nan'", work, work))
local f = assert(io.open(work .. "/nan/model-00001-of-00001.safetensors", "r+b"))
local hl = f:read(8)
local len = 0
for i = 8, 1, -1 do len = len * 256 + hl:byte(i) end
f:seek("set", 8 + len + 4 * 5) -- the sixth element of the file's first tensor
f:write("\0\0\192\127")          -- a quiet NaN, little-endian
f:close()
T.fails(function() generate.open(work .. "/nan", { device = "cpu" }) end, "element 5 is nan; refusing to compute with it",
  "a NaN in the weights")
os.execute("rm -rf '" .. work .. "'")

g:close()
s:free()
mesh:free()
T.finish()

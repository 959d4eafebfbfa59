-- grpo_arith.lua: reinforcement learning in one job, on CPU ranks
-- (docs/TRAINING.md, "Post-training: GRPO"). The policy samples its own
-- answers with the engine's sampler and the current weights (KV cache), a
-- rule rewards them, and GRPO updates it (fsdp.engine, fsdp.losses.grpo):
-- no separate inference engine. The task: "a+b=" for digits a and b, the
-- answer in digits then a newline; reward 1 for the right sum, 0.1 for a
-- number that is wrong, 0 otherwise.
--   build/fsdprun -n 2 recipes/grpo_arith.lua                 (about 3 minutes on 2 cores)
--   build/fsdprun -n 2 recipes/grpo_arith.lua steps=60 metrics=runs/grpo/metrics.jsonl
-- A byte-level Llama starts from random weights and first learns the format
-- and the sums whose first number is at most 4 by supervised steps (warmup,
-- its rows through the same engine, with the cross-entropy); then each step
-- of GRPO takes `prompts` questions per rank over all 100 sums, samples
-- `group` answers to each at temperature 1, and rewards them; an answer's
-- advantage is its reward less its group's mean, over the group's standard
-- deviation (groups all right or all wrong teach nothing and are left
-- out). It prints the mean reward every 10 steps and, at the end, the mean
-- of the first 20 steps and of the last 20. Arguments: KEY=VALUE for the
-- fields of `o` below.
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local engine = require "fsdp.engine"
local losses = require "fsdp.losses"
local generate = require "fsdp.generate"
local json = require "fsdp.json"

local o = { steps = 150, warmup = 60, prompts = 8, group = 8, lr = 1e-3, warmup_lr = 3e-3, clip = 0.2, kl = 0,
  temperature = 1.0, seed = 1, metrics = nil, zero = 3 }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if not k or o[k] == nil and k ~= "metrics" then
    error(string.format("grpo_arith.lua: argument '%s'; expected KEY=VALUE with KEY one of steps, warmup, prompts, group, " ..
      "lr, warmup_lr, clip, kl, temperature, seed, metrics, zero", a), 0)
  end
  o[k] = k == "metrics" and v or tonumber(v)
  if o[k] == nil then error(string.format("grpo_arith.lua: %s = '%s'; expected a number", k, v), 0) end
end

local info = fsdp.init()
local R, W = info.rank, info.size
local mesh = fsdp.mesh("dp_shard=-1")
local cfg = llama.config({ hidden_size = 64, intermediate_size = 176, num_attention_heads = 4, num_key_value_heads = 2,
  num_hidden_layers = 2, vocab_size = 256, max_position_embeddings = 16, rope_theta = 10000, rms_norm_eps = 1e-5 })
local model = fsdp.fully_shard(llama.model(cfg), { shard = mesh:group("dp_shard"), units = llama.units, zero = o.zero,
  seed = o.seed })
local E = engine.new(model, cfg)
local gen = generate.wrap(model, cfg, {})
local say = function(...) if R == 0 then print(string.format(...)); io.stdout:flush() end end

-- the rows: prompt and answer bytes, targets on the answer only
local T = 8 -- "a+b=" (4) and up to 3 answer bytes ("18\n"), and one to spare
local function bytes(s)
  local t = {}
  for i = 1, #s do t[i] = s:byte(i) end
  return t
end
local function rows_batch(rows)
  local B = #rows
  local x, y = fsdp.tensor({ B, T }, "int32"), fsdp.tensor({ B, T }, "int32")
  local adv = fsdp.tensor(B * T)
  for r, row in ipairs(rows) do
    local toks = {}
    for _, v in ipairs(row.prompt) do toks[#toks + 1] = v end
    for _, v in ipairs(row.answer) do toks[#toks + 1] = v end
    for t = 0, T - 1 do
      local i = (r - 1) * T + t
      x:set(i, toks[t + 1] or 10)
      -- position t predicts token t + 1: a target when that token is the answer's
      local target = t + 1 >= #row.prompt and t + 1 < #toks
      y:set(i, target and toks[t + 2] or -100)
      adv:set(i, target and (row.adv or 1) or 0)
    end
  end
  return { x = x, y = y, advantages = adv }
end

-- the task
local rng = 12345 + 7919 * (o.seed + R)
local function rand(n)
  rng = (rng * 1103515245 + 12345) % 2147483648
  return rng % n
end
local function question(a, b) return bytes(string.format("%d+%d=", a, b)) end
local function reward(a, b, answer)
  local s = string.char(unpack(answer))
  local digits = s:match("^(%d+)\n") or s:match("^(%d+)$")
  if not digits then return 0 end
  return tonumber(digits) == a + b and 1 or 0.1
end

local records = {}
local function record(t)
  records[#records + 1] = t
  if R == 0 and o.metrics then
    local f = io.open(o.metrics, #records == 1 and "w" or "a")
    if f then f:write(json.encode(t), "\n"); f:close() end
  end
end

-- warm-up: supervised steps (the cross-entropy of the answers) on the sums
-- whose first number is at most 4
for step = 1, o.warmup do
  local rows = {}
  for _ = 1, o.prompts * 2 do
    local a, b = rand(5), rand(10)
    rows[#rows + 1] = { prompt = question(a, b), answer = bytes(tostring(a + b) .. "\n") }
  end
  local b = rows_batch(rows)
  local lr = o.warmup_lr * math.min(1, step / 10)
  local loss = model:train_step({ b }, { lr = lr, clip = 1.0, weight_decay = 0,
    loss = function(logits, bb, scale) return llama.loss(logits, bb.y, scale) end })
  if step % 50 == 0 or step == o.warmup then say("warmup %d/%d | cross-entropy %.4f", step, o.warmup, loss) end
end

-- GRPO
local function mean_of(t, from, to)
  local s, n = 0, 0
  for i = from, to do s, n = s + t[i], n + 1 end
  return n > 0 and s / n or 0
end
local rewards = {}
for step = 1, o.steps do
  local t0 = fsdp.C.fsdp_time_now()
  local rows, total, right, n = {}, 0, 0, 0
  for p = 1, o.prompts do
    local a, b = rand(10), rand(10)
    local q = question(a, b)
    local group = {}
    for g = 1, o.group do
      -- every rank makes as many forwards (a fixed length, cut at the newline
      -- afterwards): the units' gathers are collective
      local ids = gen:generate(q, { max_new_tokens = 3, temperature = o.temperature, stop_at_eos = false,
        seed = ((o.seed * 100003 + step) * 64 + R) * 4096 + p * 64 + g })
      local ans = {}
      for _, v in ipairs(ids) do
        ans[#ans + 1] = v
        if v == 10 then break end
      end
      local r = reward(a, b, ans)
      group[g] = { prompt = q, answer = ans, r = r }
      total, n = total + r, n + 1
      if r == 1 then right = right + 1 end
    end
    local mu, var = 0, 0
    for _, g in ipairs(group) do mu = mu + g.r / #group end
    for _, g in ipairs(group) do var = var + (g.r - mu) ^ 2 / #group end
    if var > 0 then
      for _, g in ipairs(group) do
        g.adv = (g.r - mu) / (math.sqrt(var) + 1e-4)
        rows[#rows + 1] = g
      end
    end
  end
  -- every rank steps, with at least one row (a row of advantage 0 changes nothing)
  if #rows == 0 then rows[1] = { prompt = question(0, 0), answer = bytes("0\n"), adv = 0 } end
  local loss, norm, warn, st = E:step({ rows_batch(rows) }, losses.grpo({ clip = o.clip, kl = o.kl }),
    { lr = o.lr, clip = 1.0, weight_decay = 0 })
  -- the step's mean reward over every rank
  local t = fsdp.tensor(2)
  t:set(0, total); t:set(1, n)
  require("fsdp.shard").all_reduce_host(mesh:group("dp_shard"), t, "sum")
  rewards[step] = t:get(0) / t:get(1)
  record({ step = step, reward = rewards[step], loss = loss, grad_norm = norm, clipped = st and st.clipped,
    step_time_s = fsdp.C.fsdp_time_now() - t0, skipped = warn and true or nil })
  if step % 10 == 0 or step == o.steps then
    say("grpo step %d/%d | reward %.3f (last 10: %.3f) | loss %.4f | gnorm %.3f | %.2f s", step, o.steps, rewards[step],
      mean_of(rewards, math.max(1, step - 9), step), loss, norm, fsdp.C.fsdp_time_now() - t0)
  end
end
local k = math.min(20, math.floor(o.steps / 2))
local first, last = mean_of(rewards, 1, k), mean_of(rewards, o.steps - k + 1, o.steps)
say("grpo: mean reward of the first %d steps %.3f, of the last %d %.3f (%+.3f)", k, first, k, last, last - first)
model:free()

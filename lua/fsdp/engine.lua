-- fsdp.engine: a sharded causal language model driven from a script, for
-- post-training (docs/TRAINING.md, "Post-training"): per-token
-- log-probabilities forward only, and optimizer steps on a loss written in
-- Lua over them (fsdp.losses: GRPO's clipped objective with a KL term, DPO).
--
--   local engine = require "fsdp.engine"
--   local E = engine.new(sharded, cfg, {chunk_bytes = 256 * 2^20})
--   local lp, ent = E:logprobs(batch, {entropy = true})
--   local loss, norm, warn, stats = E:step({batch, ...}, losses.grpo{clip = 0.2, kl = 0.04}, {lr = 1e-5, ...})
--   E:export_weights("out/", {dtype = "bf16"}) or E:export_weights(function(bucket) ... end, {bucket_bytes = 2^29})
--   E:offload(); ...; E:onload() (or E:onload({params_only = true}) for forwards only)
--
-- A batch is {x = ids, y = targets (-100: no target), doc_start = packed
-- rows' layout or nil, and the loss's own fields}: int32 {B, T} CPU
-- tensors (the engine copies what a GPU needs). logprobs returns fp32 CPU
-- tensors of B * T values (row-major; 0 where y is -100). Collective: every
-- rank calls them together, each with its own batches.
--
-- step runs two passes per micro-batch: the log-probs without grads (the
-- loss needs them all before its gradient is known: DPO's sums, the
-- step's target count), then the forward and backward whose head gradient
-- is the loss's coef (onehot - softmax) per position (fsdp_token_logprobs):
-- a third more compute than a plain training step, the price of a loss
-- that is any Lua function of the log-probs. The optimizer, clipping,
-- skipped steps and the returned loss and norm are fully_shard's
-- train_step's; stats: what the loss reported, averaged over the
-- micro-batches and ranks.
local tensor = require "fsdp.tensor"
local shard = require "fsdp.shard"

local M = {}
local Engine = {}
Engine.__index = Engine

function M.new(sharded, cfg, o)
  o = o or {}
  if type(sharded) ~= "table" or not sharded.train_step then error("engine.new: expected a sharded model (fsdp.fully_shard)", 2) end
  if type(cfg) ~= "table" or not cfg.vocab_size then error("engine.new: expected the model's config (llama.config)", 2) end
  return setmetatable({ s = sharded, cfg = cfg, device = sharded.device, chunk_bytes = o.chunk_bytes }, Engine)
end

local IGNORE = -100

-- the targets of a batch that count, each checked against the vocabulary
local function targets_of(b, V, what)
  if type(b) ~= "table" or type(b.x) ~= "table" or type(b.y) ~= "table" then
    error(what .. ": a batch is {x = ids, y = targets, ...} (int32 {B, T} tensors)", 3)
  end
  local n = b.y:numel()
  if b.x:numel() ~= n then error(string.format("%s: %d ids but %d targets", what, b.x:numel(), n), 3) end
  local y, count, rows, T = b.y:ptr(), 0, 0, b.y.shape[#b.y.shape]
  local row_has = false
  for i = 0, n - 1 do
    local v = y[i]
    if i % T == 0 then
      if row_has then rows = rows + 1 end
      row_has = false
    end
    if v ~= IGNORE then
      if v < 0 or v >= V then
        error(string.format("%s: target %d at position %d is outside the vocabulary [0, %d)", what, v, i, V), 3)
      end
      count, row_has = count + 1, true
    end
  end
  if row_has then rows = rows + 1 end
  return count, rows
end

-- the batch as the model takes it on this engine's device
local function placed(self, b)
  if self.device ~= "cuda" then return b end
  local p = {}
  for k, v in pairs(b) do p[k] = v end
  p.x = tensor.new(b.x.shape, "int32", "cuda"):copy_from(b.x)
  p.y_dev = tensor.new(b.y.shape, "int32", "cuda"):copy_from(b.y)
  return p
end

local function to_host(t)
  if t == nil or t.device ~= "cuda" then return t end
  require("fsdp.ops").compute_stream():synchronize() -- (the kernels that wrote it ran there)
  return tensor.new(t.shape, t.dtype):copy_from(t)
end

-- Forward only: each position's log-probability of its target (and with
-- o.entropy the entropy of its distribution), fp32 CPU tensors of B * T.
function Engine:logprobs(b, o)
  o = o or {}
  targets_of(b, self.cfg.vocab_size, "engine:logprobs")
  local lp, en = self.s:infer(function(model, ctx)
    local p = placed(self, b)
    local a, e = model:forward_logprobs(ctx, p.x, b.y, { targets_dev = p.y_dev, doc_start = b.doc_start,
      entropy = o.entropy, chunk_bytes = self.chunk_bytes })
    return to_host(a), to_host(e)
  end)
  return lp, en
end

-- the step's targets and sequences, summed over the data-parallel ranks
-- exactly (one all-reduce). The cp ranks of a data-parallel rank, in its
-- shard group, hold the same batch: each counted once.
local function cp_size(s) return s.model.cp and s.model.cp.size or 1 end

local function global_counts(s, counts, rows)
  local n, r = 0, 0
  for k = 1, #counts do n, r = n + counts[k], r + rows[k] end
  local sums = shard.sum_ints(s, 2, { [0] = n, [1] = r })
  return sums[0] / cp_size(s), sums[1] / cp_size(s)
end

-- One optimizer step on loss (fsdp.losses) over the micro-batches; opt:
-- train_step's (lr, optimizer, clip, ...). Returns the loss (the mean of
-- the loss's values over micro-batches and ranks), the grad norm, a
-- warning when the step was skipped, and the loss's stats averaged.
function Engine:step(batches, loss, opt)
  if type(batches) ~= "table" or #batches == 0 then error("engine:step: expected a list of micro-batches", 2) end
  if type(loss) ~= "function" then error("engine:step: loss must be a function (lp, batch, info) -> value, coef (fsdp.losses)", 2) end
  local K, V = #batches, self.cfg.vocab_size
  local counts, rows = {}, {}
  for k, b in ipairs(batches) do counts[k], rows[k] = targets_of(b, V, "engine:step: micro-batch " .. k) end
  local N, S = global_counts(self.s, counts, rows)
  -- the data-parallel ranks (with cp the shard group holds each one's cp
  -- ranks, which compute parts of the same batch)
  local cpn = cp_size(self.s)
  local W = self.s.shard:size() / cpn * (self.s.outer and self.s.outer:size() or 1)
  local info = { micro_batches = K, ranks = W, targets = N, sequences = S }
  -- pass 1: the log-probs, the loss and its coefficients
  local work, stats = {}, {}
  for k, b in ipairs(batches) do
    local lp = self:logprobs(b)
    local value, coef, st = loss(lp, b, info)
    if type(value) ~= "number" or type(coef) ~= "table" or not coef.numel or coef:numel() ~= lp:numel() then
      error(string.format("engine:step: the loss returned %s, %s for micro-batch %d; expected a number and a tensor of %d " ..
        "coefficients (d value / d lp)", type(value), type(coef), k, lp:numel()), 2)
    end
    -- the step's gradient is the mean over micro-batches: 1 / K of each;
    -- with cp, times cp: each cp rank's tokens' gradient is averaged over
    -- the shard group, cp ranks included, where the tokens' parts add up
    local c = tensor.new(coef:numel())
    local cp, src = c:ptr(), coef:ptr()
    for i = 0, coef:numel() - 1 do cp[i] = src[i] * cpn / K end
    if self.device == "cuda" then c = tensor.new(c.shape, "fp32", "cuda"):copy_from(c) end
    work[k] = { b = b, coef = c, value = value }
    for name, v in pairs(st or {}) do stats[name] = (stats[name] or 0) + v / K end
  end
  -- pass 2: forward and backward with those coefficients
  local mb = {}
  for k, w in ipairs(work) do
    local p = placed(self, w.b)
    mb[k] = { x = p.x, y = w.b.y, y_dev = p.y_dev, doc_start = w.b.doc_start, coef = w.coef, value = w.value }
  end
  local o = {}
  for key, v in pairs(opt or {}) do o[key] = v end
  local chunk = self.chunk_bytes
  o.loss = nil
  o.forward_loss = function(model, ctx, b)
    model:forward_loss(ctx, b.x, b.y, { coef = b.coef, targets_dev = b.y_dev, doc_start = b.doc_start, chunk_bytes = chunk })
    return b.value
  end
  local value, norm, warn = self.s:train_step(mb, o)
  -- stats: averaged over ranks too
  local names = {}
  for name in pairs(stats) do names[#names + 1] = name end
  table.sort(names)
  if #names > 0 then
    local t = tensor.new(#names)
    for i, name in ipairs(names) do t:set(i - 1, stats[name]) end
    shard.all_reduce_host(self.s.shard, t, "avg")
    if self.s.outer then shard.all_reduce_host(self.s.outer, t, "avg") end
    for i, name in ipairs(names) do stats[name] = t:get(i - 1) end
  end
  return value, norm, warn, stats
end

-- Phase offload: the params, grads and optimizer state in host memory and
-- the device's memory given back (while a rollout engine generates), then
-- onload: everything, or with o.params_only the compute params alone (a
-- forward-only phase: logprobs, sampling); a step needs a full onload. Not
-- collective; fully_shard's offload and onload.
function Engine:offload() return self.s:offload() end
function Engine:onload(o) return self.s:onload(o and o.params_only) end

-- The full weights under their Hugging Face names, streamed one unit at a
-- time in buckets of o.bucket_bytes (default 512 MiB), cast to o.dtype
-- ("bf16", the default, or "fp32"), to consumer: a folder (safetensors
-- files, the index, config.json and o.files, as the checkpoint's export
-- writes them) or a function(bucket) called on rank 0 for each bucket
-- ({tensors = {{name, shape, numel, offset}}, bytes, data, dtype}; data
-- is valid only during the call). Collective. fsdp.weight_stream.
function Engine:export_weights(consumer, o)
  local ws = require "fsdp.weight_stream"
  if type(consumer) == "string" then return ws.to_folder(self.s, self.cfg, consumer, o) end
  if type(consumer) ~= "function" then
    error("engine:export_weights: consumer must be a folder (a string) or a function(bucket)", 2)
  end
  return ws.stream(self.s, o, consumer)
end

return M

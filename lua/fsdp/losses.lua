-- fsdp.losses: losses written over per-token log-probabilities, for
-- fsdp.engine's step (post-training). A loss is a function
--   loss(lp, batch, info) -> value, coef[, stats]
-- lp: this micro-batch's log-probability of each position's target (an
-- fp32 CPU tensor of B * T, row-major; 0 where y is -100); batch: the
-- micro-batch with its own fields (advantages, old and reference
-- log-probs, as tensors of B * T); info = {micro_batches = K, ranks = W,
-- targets = N (every target of the step: all micro-batches, all ranks),
-- sequences = S (rows with a target, likewise)}. value: this micro-batch's
-- share of the step's loss, coef: d value / d lp (an fp32 CPU tensor of
-- B * T). The engine averages value and the gradients over the K
-- micro-batches and W ranks, so a loss that is a mean over all N targets
-- returns sum over its own targets times K W / N (the built-ins do).
local tensor = require "fsdp.tensor"

local M = {}

local IGNORE = -100

local function field(batch, name, n, what)
  local t = batch[name]
  if t == nil then return nil end
  if type(t) ~= "table" or not t.numel or t:numel() ~= n then
    error(string.format("%s: batch.%s must be a tensor of %d values (one per position, B x T)", what, name, n), 3)
  end
  return t:ptr()
end

-- PPO's clipped objective as GRPO uses it, per token, with a KL penalty
-- towards a reference policy (Schulman's k3 estimator, as GRPO's paper):
--   l_t = -min(r A, clip(r, 1 - clip, 1 + clip_high) A) + kl (e^(ref - lp) - (ref - lp) - 1),
--   r = e^(lp - old), the mean over every target of the step.
-- batch.advantages (required), batch.old_logp (default: lp itself, r = 1:
-- the on-policy step), batch.ref_logp (required when kl > 0). stats: the
-- share of targets clipped, the mean ratio and the mean KL (this micro-batch's).
function M.grpo(o)
  o = o or {}
  local eps_lo, eps_hi, beta = o.clip or 0.2, o.clip_high or o.clip or 0.2, o.kl or 0
  return function(lp, batch, info)
    local n = lp:numel()
    local what = "losses.grpo"
    local y = batch.y:ptr()
    local A = field(batch, "advantages", n, what)
    if not A then error(what .. ": batch.advantages is required (one per position)", 2) end
    local old, ref = field(batch, "old_logp", n, what), field(batch, "ref_logp", n, what)
    if beta ~= 0 and not ref then error(what .. ": kl = " .. beta .. " needs batch.ref_logp", 2) end
    local scale = info.targets > 0 and info.micro_batches * info.ranks / info.targets or 0
    local coef = tensor.new(n)
    local lpp, cp = lp:ptr(), coef:ptr()
    local value, clipped, ratios, kls, cnt = 0, 0, 0, 0, 0
    for i = 0, n - 1 do
      local c = 0
      if y[i] ~= IGNORE then
        local l, a = lpp[i], A[i]
        local r = old and math.exp(l - old[i]) or 1
        local rc = math.min(math.max(r, 1 - eps_lo), 1 + eps_hi)
        local li, di
        if r * a <= rc * a then -- the unclipped term is the smaller: it counts
          li, di = -r * a, -r * a
        else -- the clipped one, constant in lp outside the range
          li, di = -rc * a, 0
          clipped = clipped + 1
        end
        if beta ~= 0 then
          local d = ref[i] - l
          local e = math.exp(d)
          li, di = li + beta * (e - d - 1), di + beta * (1 - e)
          kls = kls + e - d - 1
        end
        value, c = value + li * scale, di * scale
        ratios, cnt = ratios + r, cnt + 1
      end
      cp[i] = c
    end
    return value, coef, { clipped = cnt > 0 and clipped / cnt or 0, ratio = cnt > 0 and ratios / cnt or 1,
      kl = cnt > 0 and kls / cnt or 0 }
  end
end

-- DPO (Rafailov et al.) over pairs: rows 2k and 2k + 1 of a micro-batch are
-- a prompt's chosen and rejected answers (targets only on the answers),
-- batch.ref_logp the reference model's log-probs. Per pair
--   l = -log sigmoid(beta ((pi_c - ref_c) - (pi_r - ref_r))),
-- pi and ref the sums over a row's targets; the mean over every pair of
-- the step (info.sequences / 2 of them). stats: the share of pairs the
-- policy ranks right, and the mean margin.
function M.dpo(o)
  o = o or {}
  local beta = o.beta or 0.1
  return function(lp, batch, info)
    local n = lp:numel()
    local what = "losses.dpo"
    local B = batch.y.shape[1]
    local T = n / B
    if B % 2 ~= 0 then error(what .. ": a micro-batch of " .. B .. " rows; DPO needs pairs (chosen, rejected)", 2) end
    local ref = field(batch, "ref_logp", n, what)
    if not ref then error(what .. ": batch.ref_logp is required (the reference model's log-probs)", 2) end
    local y, lpp = batch.y:ptr(), lp:ptr()
    local pairs_all = info.sequences / 2
    local scale = pairs_all > 0 and info.micro_batches * info.ranks / pairs_all or 0
    local coef = tensor.new(n):fill(0)
    local cp = coef:ptr()
    local value, right, margins = 0, 0, 0
    local function sums(row)
      local p, r = 0, 0
      for t = row * T, row * T + T - 1 do
        if y[t] ~= IGNORE then p, r = p + lpp[t], r + ref[t] end
      end
      return p, r
    end
    for k = 0, B / 2 - 1 do
      local pc, rc = sums(2 * k)
      local pr, rr = sums(2 * k + 1)
      local z = beta * ((pc - rc) - (pr - rr))
      -- -log sigmoid(z) = log(1 + e^-z), stably; its derivative -sigmoid(-z)
      local l = z > 0 and math.log(1 + math.exp(-z)) or -z + math.log(1 + math.exp(z))
      local g = -1 / (1 + math.exp(z))
      value = value + l * scale
      for t = 2 * k * T, 2 * k * T + T - 1 do if y[t] ~= IGNORE then cp[t] = g * beta * scale end end
      for t = (2 * k + 1) * T, (2 * k + 1) * T + T - 1 do if y[t] ~= IGNORE then cp[t] = -g * beta * scale end end
      if z > 0 then right = right + 1 end
      margins = margins + z / beta
    end
    return value, coef, { accuracy = right / (B / 2), margin = margins / (B / 2) }
  end
end

return M

-- fsdp.schedule: the learning rate at each step (1-based): linear warmup
-- from lr / warmup to lr over `warmup` steps, then decay to
-- min_lr_ratio * lr at the last step: cosine (half a period), linear, or
-- constant (no decay).
local M = {}

function M.lr(step, steps, o)
  local lr, warmup = o.lr, o.warmup or 0
  if step <= warmup then return lr * step / warmup end
  local min = lr * (o.min_lr_ratio or 0)
  local span = steps - warmup
  local p = span > 0 and (step - warmup) / span or 1
  if o.decay == "constant" then return lr end
  if o.decay == "linear" then return lr - (lr - min) * p end
  return min + (lr - min) * 0.5 * (1 + math.cos(math.pi * p))
end

return M

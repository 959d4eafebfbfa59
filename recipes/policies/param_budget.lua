-- param_budget.lua: consecutive decoder layers packed into units of at
-- most BUDGET parameters (at least one layer each), so that every all-gather
-- moves about the same amount however the layers are sized; the embeddings
-- and the final norm with the head keep their own units.
--   fsdprun -n 2 recipes/tiny.lua fsdp.units=recipes/policies/param_budget.lua
local BUDGET = 400000 -- parameters per unit

local unit, size, count
return function(m, path, info)
  if path == "" then unit, size, count = nil, 0, 0 end -- the root comes first: a new grouping
  if m.kind == "LlamaDecoderLayer" then
    if not unit or size + info.numel > BUDGET then
      count = count + 1
      unit, size = "layers." .. count, 0
    end
    size = size + info.numel
    return unit
  end
  if path == "model.embed_tokens" then return "embed" end
  if path == "model.norm" or path == "lm_head" then return "head" end
end

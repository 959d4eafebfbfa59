-- zero_by_size.lua: one unit per decoder layer, embeddings, and norm with
-- head; a unit under SMALL parameters keeps its full params resident (zero
-- 2: no all-gather in forward or backward, grads still sharded), a larger
-- one is fully sharded (zero 3). SMALL trades memory for fewer collectives:
-- raise it until the planner (`fsdp plan`) says the peak no longer fits.
--   fsdprun -n 2 recipes/tiny.lua fsdp.units=recipes/policies/zero_by_size.lua
local SMALL = 100000 -- parameters

return function(m, path, info)
  local unit
  if m.kind == "LlamaDecoderLayer" then unit = path
  elseif path == "model.embed_tokens" then unit = "embed"
  elseif path == "model.norm" or path == "lm_head" then unit = "head"
  else return nil end
  -- the head unit is the norm and the head together: the head decides
  if path == "model.norm" then return unit end
  return unit, { zero = info.numel < SMALL and 2 or 3 }
end

-- two_layers_per_unit.lua: decoder layers 0-1 in one unit, 2-3 in the
-- next, ...: half the all-gathers of one layer per unit, each twice as big
-- (fewer, larger collectives; more memory in flight). The embeddings and
-- the final norm with the head keep their own units.
--   fsdprun -n 2 recipes/tiny.lua fsdp.units=recipes/policies/two_layers_per_unit.lua
-- A policy sees every module in model order: policy(module, path, info),
-- info = {kind, path, numel, own}; it returns a unit name (and options), nil
-- to inherit its parent's unit, or false (docs/PLANNING.md).
return function(m, path, info)
  local i = path:match("^model%.layers%.(%d+)$")
  if i then return string.format("layers.%d-%d", i - i % 2, i - i % 2 + 1) end
  if path == "model.embed_tokens" then return "embed" end
  if path == "model.norm" or path == "lm_head" then return "head" end
end

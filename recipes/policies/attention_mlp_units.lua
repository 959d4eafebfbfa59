-- attention_mlp_units.lua: each decoder layer as two units, its input norm
-- with its attention and its second norm with its MLP: all-gathers half a
-- layer in size, twice as many (for layers whose full buffer is too large
-- to hold two of). Each unit runs as one stretch, so gathers, prefetches
-- and reductions stay in execution order. The embeddings, and the final
-- norm with the head, keep their own units.
--   fsdprun -n 2 recipes/tiny.lua fsdp.units=recipes/policies/attention_mlp_units.lua
return function(m, path, info)
  local layer, part = path:match("^(model%.layers%.%d+)%.([%w_]+)$")
  if part == "input_layernorm" or part == "self_attn" then return layer .. ".attention" end
  if part == "post_attention_layernorm" or part == "mlp" then return layer .. ".mlp" end
  if path == "model.embed_tokens" then return "embed" end
  if path == "model.norm" or path == "lm_head" then return "head" end
end

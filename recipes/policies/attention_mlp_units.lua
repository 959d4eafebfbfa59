-- attention_mlp_units.lua: each decoder layer's attention and MLP as units
-- of their own, the two norms of every layer with the final norm and the
-- head in the root's unit: all-gathers half a layer in size (for layers
-- whose full buffer is too large to hold two of), more of them; the
-- embeddings keep their own unit.
--   fsdprun -n 2 recipes/tiny.lua fsdp.units=recipes/policies/attention_mlp_units.lua
return function(m, path, info)
  if m.kind == "LlamaAttention" or m.kind == "LlamaMLP" then return path end
  if path == "model.embed_tokens" then return "embed" end
end

-- replicate_embeddings.lua: the embedding table and the head (with the
-- final norm) replicated on every rank (zero 0: no all-gather before use,
-- an all-reduce of their grads once per step), the decoder layers sharded
-- with the recipe's zero level. Worth it when the vocabulary is small next
-- to the layers, or the network is slow for small, latency-bound gathers.
--   fsdprun -n 2 recipes/tiny.lua fsdp.units=recipes/policies/replicate_embeddings.lua
return function(m, path, info)
  if m.kind == "LlamaDecoderLayer" then return path end
  if path == "model.embed_tokens" then return "embed", { zero = 0 } end
  if path == "model.norm" or path == "lm_head" then return "head", { zero = 0 } end
end

-- fsdp.plan: what a Llama recipe needs per rank, from arithmetic alone (no
-- allocation): the resident bytes of params, grads and optimizer state at
-- the recipe's ZeRO level, the full-unit buffers in flight, and activations
-- for one micro-batch. The trainer's pre-flight check uses it.
local llama = require "fsdp.models.llama"

local M = {}

-- bytes per rank; opts: zero, world (shard group size), param_bytes (4 or 2),
-- micro_batch, seq, checkpoint ("none" | "full" | k), max_live_units
function M.llama_memory(cfg, o)
  local W, z, pb = o.world, o.zero, o.param_bytes or 4
  local n = llama.num_params(cfg)
  local h, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
  local kv = cfg.num_key_value_heads * cfg.head_dim
  local layer = llama.num_params({ hidden_size = h, intermediate_size = I, num_attention_heads = cfg.num_attention_heads,
    num_key_value_heads = cfg.num_key_value_heads, head_dim = cfg.head_dim, num_hidden_layers = 1, vocab_size = 0,
    tie_word_embeddings = true })
  local biggest = math.max(layer, cfg.vocab_size * h)
  local shard = n / W
  local m = {}
  m.params = (z <= 2 and n or shard) * pb + (pb == 2 and shard * 4 or 0) -- compute copy (+ fp32 main when bf16)
  if pb == 4 then m.params = m.params + (z >= 1 and shard * 4 or 0) end   -- fp32 main shard besides full params
  m.grads = (z <= 1 and n * pb or 0) + (z == 0 and n * 4 or shard * 4)
  m.optimizer = 2 * 4 * (z == 0 and n or shard)
  m.unit_buffers = (o.max_live_units or 2) * biggest * pb * (z == 3 and 2 or 1) -- params (zero 3) and grads
  -- activations per token per layer, as the CPU modules save them (fp32):
  -- layer input, two norm outputs, q, k, v, attention output, residual,
  -- gate, up, swiglu output; checkpointed layers keep only their input
  local T = o.micro_batch * o.seq
  local per_layer = (6 * h + 2 * kv + 3 * I) * 4
  local ck, keep = o.checkpoint or "none", 0
  for i = 1, L do
    local on = ck == "full" or (type(ck) == "number" and (i - 1) % ck == 0)
    keep = keep + (on and h * 4 or per_layer)
  end
  m.activations = T * (keep + (ck ~= "none" and per_layer or 0) + 2 * cfg.vocab_size * 4 + 2 * h * 4)
  m.total = m.params + m.grads + m.optimizer + m.unit_buffers + m.activations
  return m
end

function M.gib(b) return b / 2 ^ 30 end

return M

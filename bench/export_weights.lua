-- export_weights.lua DIR [bucket_mb=N] [layers=N]: fsdp.engine's streamed
-- export of a ~110M-parameter Llama (hidden 768, 12 layers, 12 heads,
-- SwiGLU 2048, vocab 32000, tied) on the ranks fsdprun starts (zero 3):
-- to DIR/streamed (bf16, buckets of bucket_mb, default 64) and, for
-- comparison, the checkpoint export to DIR/export. Prints the time of
-- each, the allocator's peak above its start while streaming against the
-- largest unit's full params, and the host bucket. bench/export_weights.sh
-- runs it, compares the folders byte for byte and loads the streamed one
-- in transformers.
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local engine = require "fsdp.engine"
local hf = require "fsdp.hf"
local C = fsdp.C
local dir = arg and arg[1]
if not dir then error("export_weights.lua DIR [bucket_mb=N] [layers=N]", 0) end
local o = { bucket_mb = 64, layers = 12 }
for i = 2, #arg do
  local k, v = arg[i]:match("^([%w_]+)=(%d+)$")
  if not k or not o[k] then error("export_weights.lua: argument '" .. arg[i] .. "'", 0) end
  o[k] = tonumber(v)
end
local info = fsdp.init()
local cfg = llama.config({ hidden_size = 768, intermediate_size = 2048, num_attention_heads = 12, num_key_value_heads = 12,
  num_hidden_layers = o.layers, vocab_size = 32000, max_position_embeddings = 256, rope_theta = 10000, rms_norm_eps = 1e-5,
  tie_word_embeddings = true })
local mesh = fsdp.mesh("dp_shard=-1")
local s = fsdp.fully_shard(llama.model(cfg), { shard = mesh:group("dp_shard"), units = llama.units, zero = 3, seed = 1 })
local E = engine.new(s, cfg)
local largest = 0
for _, u in ipairs(s.units) do
  local n = 0
  for _, p in ipairs(u.params) do n = n + p.spec.numel end
  largest = math.max(largest, n * 4)
end
collectgarbage(); collectgarbage()
local t0 = C.fsdp_time_now()
local stats
local peak = 0
do
  collectgarbage("stop")
  fsdp.memory_reset_peak("cpu")
  local start = fsdp.memory_stats("cpu").allocated
  stats = E:export_weights(dir .. "/streamed", { dtype = "bf16", bucket_bytes = o.bucket_mb * 2 ^ 20 })
  peak = fsdp.memory_stats("cpu").peak - start
  collectgarbage("restart")
end
local t_stream = C.fsdp_time_now() - t0
t0 = C.fsdp_time_now()
hf.export(s, cfg, dir .. "/export", { dtype = "bf16", shard_bytes = o.bucket_mb * 2 ^ 20 })
local t_export = C.fsdp_time_now() - t0
if info.rank == 0 then
  print(string.format("export_weights: %.1fM parameters on %d ranks; streamed %d files, %.1f MB bf16 in %.2f s; the " ..
    "checkpoint export in %.2f s; allocator peak above the start while streaming %.1f MB (the largest unit's params %.1f " ..
    "MB fp32); host bucket %d MiB", llama.num_params(cfg) / 1e6, info.size, stats.files, stats.bytes / 1e6, t_stream,
    t_export, peak / 1e6, largest / 1e6, o.bucket_mb))
end
s:free()

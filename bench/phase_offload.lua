-- phase_offload.lua [device=cpu|cuda] [layers=N] [param_dtype=fp32|bf16]: how
-- long engine:offload() and onload() take for the state of a model of
-- Llama 3.2 1B's shape (bench/llama1b.lua: hidden 2048, SwiGLU 8192, 32 / 8
-- heads, vocab 128256, tied; its 16 layers cut to `layers`, default 2, so
-- that the state and its host copy fit a small machine), against a plain
-- copy of the same bytes on the same machine in the same run (host memcpy
-- between warm buffers on CPU ranks; device-to-host on a GPU): the ratio
-- is what to read. One rank, zero 3, AdamW (params, grads, two moments).
--   build/fsdprun -n 1 bench/phase_offload.lua
-- Prints one line per move: bytes, seconds, GB/s, and the ratio to the copy.
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local engine = require "fsdp.engine"
local C = fsdp.C

local o = { device = "cpu", layers = 2, param_dtype = "fp32" }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if not k or o[k] == nil then error("phase_offload.lua: argument '" .. a .. "'; expected device=, layers=, param_dtype=", 0) end
  o[k] = tonumber(v) or v
end
local info = fsdp.init()
local dev = o.device == "cuda" and C.FSDP_CUDA or C.FSDP_CPU
if o.device == "cuda" then fsdp.check(C.fsdp_device_set(C.FSDP_CUDA, 0), "device") end
local cfg = llama.config({ hidden_size = 2048, intermediate_size = 8192, num_attention_heads = 32, num_key_value_heads = 8,
  num_hidden_layers = o.layers, vocab_size = 128256, max_position_embeddings = 256, rope_theta = 500000,
  rms_norm_eps = 1e-5, tie_word_embeddings = true })
local mesh = fsdp.mesh("dp_shard=-1", { device = o.device })
local s = fsdp.fully_shard(llama.model(cfg), { shard = mesh:group("dp_shard"), units = llama.units, zero = 3,
  mixed = { param_dtype = o.param_dtype, reduce_dtype = "fp32" } })
local E = engine.new(s, cfg)
-- one step, so that the grads and both moments exist
local B, T = 1, 64
local x, y = fsdp.tensor({ B, T }, "int32"), fsdp.tensor({ B, T }, "int32")
for i = 0, B * T - 1 do x:set(i, (i * 7919) % cfg.vocab_size); y:set(i, (i * 104729 + 1) % cfg.vocab_size) end
local b = { x = o.device == "cuda" and fsdp.tensor({ B, T }, "int32", "cuda"):copy_from(x) or x, y = y }
if o.device == "cuda" then b.y_dev = fsdp.tensor({ B, T }, "int32", "cuda"):copy_from(y) end
s:train_step({ b }, { lr = 1e-4, forward_loss = llama.forward_loss(64 * 2 ^ 20) })
s:synchronize()
collectgarbage(); collectgarbage()
local held = 0
local mem = fsdp.ffi.new("fsdp_unit_memory")
for _, u in ipairs(s.units) do
  fsdp.check(C.fsdp_unit_memory_info(u.handle, mem), "memory info")
  held = held + tonumber(mem.params_full + mem.params_shard + mem.main_params + mem.optimizer + mem.grads_full +
    mem.grads_main - mem.offloaded)
end
local before = fsdp.memory_stats(o.device).allocated
-- the copy to compare with: the same bytes, in pieces of 256 MiB
local chunk = 256 * 2 ^ 20
local src = fsdp.ffi.new("uint8_t[?]", chunk)
local dst = fsdp.ffi.new("uint8_t[?]", chunk)
fsdp.ffi.fill(src, chunk, 1); fsdp.ffi.fill(dst, chunk, 2)
local dsrc = nil
if o.device == "cuda" then
  local p = fsdp.ffi.new("void *[1]")
  fsdp.check(C.fsdp_alloc(C.FSDP_CUDA, chunk, p), "alloc")
  dsrc = p[0]
end
local t0 = C.fsdp_time_now()
local moved = 0
while moved < held do
  fsdp.check(C.fsdp_memcpy(dst, dsrc or src, chunk, nil), "copy")
  moved = moved + chunk
end
local copy_s = (C.fsdp_time_now() - t0) * held / moved
-- twice: the first offload allocates the host copies, later ones reuse them
t0 = C.fsdp_time_now()
E:offload()
local first_s = C.fsdp_time_now() - t0
E:onload()
t0 = C.fsdp_time_now()
E:offload()
local off_s = C.fsdp_time_now() - t0
collectgarbage(); collectgarbage()
local after = fsdp.memory_stats(o.device).allocated
local free_dev, total_dev = fsdp.ffi.new("int64_t[1]"), fsdp.ffi.new("int64_t[1]")
C.fsdp_device_memory_info(dev, free_dev, total_dev)
t0 = C.fsdp_time_now()
E:onload()
local on_s = C.fsdp_time_now() - t0
local loss = s:train_step({ b }, { lr = 1e-4, forward_loss = llama.forward_loss(64 * 2 ^ 20) })
local function line(what, secs)
  return string.format("%-8s %8.3f GB in %7.3f s: %6.2f GB/s, %5.2fx the plain copy (%.3f s)", what, held / 1e9, secs,
    held / 1e9 / secs, secs / copy_s, copy_s)
end
if info.rank == 0 then
  print(string.format("phase_offload: %s, %s params, %d layers of the 1B shape (%.2fB parameters): the state on the " ..
    "device %.3f GB (the units' rows), the allocator %.3f GB before offload, %.4f GB after (%.2f%%)%s",
    o.device, o.param_dtype, o.layers, llama.num_params(cfg) / 1e9, held / 1e9, before / 1e9, after / 1e9,
    100 * after / before, o.device == "cuda" and string.format("; cudaMemGetInfo free %.2f of %.2f GB",
    tonumber(free_dev[0]) / 1e9, tonumber(total_dev[0]) / 1e9) or ""))
  print(line("offload 1", first_s))
  print(line("offload", off_s))
  print(line("onload", on_s))
  print(string.format("a step after onload: loss %.4f", loss))
end
s:free()

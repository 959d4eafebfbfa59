-- test_cuda_train.lua (one rank with a GPU; exits 77 without one): the
-- Llama model trained by fully_shard on CUDA (NCCL comm, kernels/, cuBLASLt,
-- the units' device path) against the same model on the CPU ops.
--   fp32 on the GPU: the loss every step within 1e-4 relative of the CPU's,
--     at zero 0, 1, 2 and 3 (with activation checkpointing at zero 3);
--   bf16 params and activations: within 3e-2 relative (bf16 has 8 bits);
--   the same with the optimizer offloaded to the host (fsdp.offload), and
--   with the param shards too (offload = {params = true});
--   the weights gathered back to the host after training agree likewise;
--   a step recorded by fsdp.profile: the same losses, device spans nested;
--   the light and mlp recomputes against keeping everything: the same losses;
--   bf16 with one micro-batch per step, the grads kept in bf16 (compact,
--   zero 1 and 3) against the same run with fp32 grads: the same losses and
--   weights bit for bit;
--   bf16 with two micro-batches at zero 1 (summed in a full fp32 buffer,
--   each micro-batch's bf16 grads zeroed for the next) against zero 2
--   (summed into the fp32 shard): the same losses and weights bit for bit;
--   overlap_step (each unit's step applied on the shard stream at its next
--   use, beside the next forward's compute) against the step at once, at
--   zero 0-3: the same losses and weights bit for bit.
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local profile = require "fsdp.profile"
local ops = require "fsdp.ops"
local C = fsdp.C

if C.fsdp_device_available(C.FSDP_CUDA) ~= 1 then
  print("test_cuda_train: no CUDA device here; skipped")
  os.exit(77)
end
local info = fsdp.init()
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_cuda_train rank %d/%d", info.rank, info.size))
local check = T.check
fsdp.check(C.fsdp_device_set(C.FSDP_CUDA, 0), "device")

local cfg = llama.config({ hidden_size = 64, intermediate_size = 96, num_attention_heads = 4, num_key_value_heads = 2,
  num_hidden_layers = 2, vocab_size = 97, max_position_embeddings = 64, rope_theta = 10000, rms_norm_eps = 1e-5 })
local B, S = 2, 24

local function batch(g, device)
  local x, y = fsdp.tensor({ B, S }, "int32"), fsdp.tensor({ B, S }, "int32")
  for i = 0, B * S - 1 do
    x:set(i, (g * 7 + i * 5 + (i * i) % 7) % cfg.vocab_size)
    y:set(i, (g * 11 + i * 3 + 1) % cfg.vocab_size)
  end
  local b = { x = x, y = y }
  if device == "cuda" then
    b.x = fsdp.tensor({ B, S }, "int32", "cuda"):copy_from(x)
    b.y_dev = fsdp.tensor({ B, S }, "int32", "cuda"):copy_from(y)
  end
  return b
end

local cpu_mesh = fsdp.mesh({ { "dp", 1 } })
local gpu_mesh = fsdp.mesh({ { "dp", 1 } }, { device = "cuda" })
local opt = { lr = 3e-3, weight_decay = 0.1, clip = 1.0,
  loss = function(logits, b, scale) return llama.loss(logits, b.y, scale, nil, b.y_dev) end }

-- single: one micro-batch per step, "fixed" (fully_shard told so: compact
-- bf16 grads) or "any"; nil: two per step
local function run(mesh, device, zero, dtype, ck, offload, profile_at, recompute, single, overlap)
  local model = llama.model(cfg, { checkpoint = ck, recompute = recompute })
  local m = fsdp.fully_shard(model, { shard = mesh:group("dp"), units = llama.units,
    zero = zero, seed = 7, mixed = { param_dtype = dtype }, offload = offload,
    micro_batches = single == "fixed" and 1 or nil, overlap_step = overlap })
  local losses, prof = {}, nil
  for t = 1, 6 do
    if t == profile_at then
      prof = profile.start({ device = device, stream = ops.compute_stream(), names = fsdp.nn.paths(model),
        settle = function() m:synchronize() end })
    end
    losses[t] = m:train_step(single and { batch(t, device) } or { batch(t, device), batch(t + 100, device) }, opt)
    if t == profile_at then prof:finish(function() m:synchronize() end) end
  end
  if profile_at then losses.profile = prof end
  local w = m:gather("model.layers.1.mlp.down_proj.weight")
  m:free()
  return losses, w
end

local ref, wref = run(cpu_mesh, "cpu", 3, "fp32", "none")
check(ref[6] < ref[1], string.format("the CPU run learns (%.4f -> %.4f)", ref[1], ref[6]))
local function compare(label, losses, w, tol)
  local worst = 0
  for t = 1, #ref do worst = math.max(worst, math.abs(losses[t] - ref[t]) / ref[t]) end
  check(worst <= tol, string.format("%s: loss every step within %.0e of the CPU run (worst %.2e)", label, tol, worst))
  local scale, err = 0, 0
  for i = 1, #wref do scale = math.max(scale, math.abs(wref[i])); err = math.max(err, math.abs(w[i] - wref[i])) end
  check(err <= tol * 10 * scale, string.format("%s: trained weights agree (max error %.2e of %.2e)", label, err, scale))
end
for _, z in ipairs({ 0, 1, 2, 3 }) do
  local l, w = run(gpu_mesh, "cuda", z, "fp32", z == 3 and "full" or "none")
  compare("cuda fp32 zero " .. z, l, w, 1e-4)
end
local l, w = run(gpu_mesh, "cuda", 3, "bf16", "none")
compare("cuda bf16 zero 3", l, w, 3e-2)
-- a step's timeline (train.profile) on the GPU: the same losses bit for
-- bit, and every span's device times ordered and inside its parent's
local lp = run(gpu_mesh, "cuda", 3, "bf16", "none", nil, 3)
local same = true
for t = 1, 6 do same = same and lp[t] == l[t] end
check(same, "profiling step 3 changes no loss")
-- the light recompute (the default) remakes norms and SwiGLU in backward
-- with the same kernels: the losses of keeping everything, bit for bit
local lk = run(gpu_mesh, "cuda", 3, "bf16", "none", nil, nil, "none")
same = true
for t = 1, 6 do same = same and lk[t] == l[t] end
check(same, "bf16: the light recompute gives the losses of recompute = 'none' bit for bit")
-- recompute "mlp" runs the gate and up GEMMs again (cuBLASLt: the same
-- algorithm for the same shapes, so the same bits)
local lm = run(gpu_mesh, "cuda", 3, "bf16", "none", nil, nil, "mlp")
same = true
for t = 1, 6 do same = same and lm[t] == l[t] end
check(same, "bf16: recompute mlp gives the losses of recompute = 'none' bit for bit")
for _, z in ipairs({ 1, 3 }) do
  local la, wa = run(gpu_mesh, "cuda", z, "bf16", "none", nil, nil, nil, "any")
  local lc, wc = run(gpu_mesh, "cuda", z, "bf16", "none", nil, nil, nil, "fixed")
  same = #wa == #wc
  for t = 1, 6 do same = same and la[t] == lc[t] end
  for i = 1, #wa do same = same and wa[i] == wc[i] end
  check(same, "bf16 zero " .. z .. ", one micro-batch: grads kept in bf16 give the losses and weights of fp32 grads, bit for bit")
end
do
  local l1, w1 = run(gpu_mesh, "cuda", 1, "bf16", "none")
  local l2, w2 = run(gpu_mesh, "cuda", 2, "bf16", "none")
  same = #w1 == #w2
  for t = 1, 6 do same = same and l1[t] == l2[t] end
  for i = 1, #w1 do same = same and w1[i] == w2[i] end
  check(same, "bf16, two micro-batches: zero 1's fp32 sums give zero 2's losses and weights, bit for bit")
end
for z = 0, 3 do
  local la, wa = run(gpu_mesh, "cuda", z, "bf16", "none", nil, nil, nil, nil, false)
  local lo, wo = run(gpu_mesh, "cuda", z, "bf16", "none", nil, nil, nil, nil, true)
  same = #wa == #wo
  for t = 1, 6 do same = same and la[t] == lo[t] end
  for i = 1, #wa do same = same and wa[i] == wo[i] end
  check(same, "bf16 zero " .. z .. ": overlap_step gives the losses and weights of the step at once, bit for bit")
end
local ordered, inside, down = true, true, 0
for _, sp in ipairs(lp.profile.spans) do
  ordered = ordered and sp.dev_begin >= -1e-6 and sp.dev_end >= sp.dev_begin
  local up = sp.parent
  if up then inside = inside and sp.dev_begin >= up.dev_begin - 1e-6 and sp.dev_end <= up.dev_end + 1e-6 end
  if sp.name == "model.layers.1.mlp.down_proj" and sp.cat == "backward" then down = sp.dev_end - sp.dev_begin end
end
check(#lp.profile.spans > 20 and ordered and inside, "device spans ordered and nested: " .. #lp.profile.spans .. " spans")
check(down > 0, string.format("the down projection's backward took device time (%.1f us)", down * 1e6))
-- the optimizer offloaded: state in pinned host memory, grads copied down,
-- the step on CPU threads, the compute shard copied up
for _, z in ipairs({ 1, 3 }) do
  l, w = run(gpu_mesh, "cuda", z, "fp32", "none", true)
  compare("cuda fp32 zero " .. z .. ", optimizer offloaded", l, w, 1e-4)
end
l, w = run(gpu_mesh, "cuda", 3, "bf16", "none", true)
compare("cuda bf16 zero 3, optimizer offloaded", l, w, 3e-2)
-- the param shards on the host too: copied up before every all-gather
l, w = run(gpu_mesh, "cuda", 3, "fp32", "full", { params = true })
compare("cuda fp32 zero 3, optimizer and params offloaded", l, w, 1e-4)
l, w = run(gpu_mesh, "cuda", 3, "bf16", "none", { params = true })
compare("cuda bf16 zero 3, optimizer and params offloaded", l, w, 3e-2)
-- and the grads: reductions written into pinned host memory by the kernels
for _, z in ipairs({ 1, 3 }) do
  l, w = run(gpu_mesh, "cuda", z, "fp32", "none", { grads = true })
  compare("cuda fp32 zero " .. z .. ", optimizer and grads offloaded", l, w, 1e-4)
end
l, w = run(gpu_mesh, "cuda", 3, "bf16", "none", "all")
compare("cuda bf16 zero 3, everything offloaded", l, w, 3e-2)
local st = fsdp.memory_stats("cuda")
check(st.peak > 0, "the CUDA pool served the run")
T.finish()

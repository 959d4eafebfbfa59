-- fsdp.plan_fit: a plan against a machine. Whether the plan of a recipe or
-- a model fits the memory free now (the trainer's pre-flight check, and a
-- user's before fully_shard), a lower bound from arithmetic alone for
-- models too large to plan, and which single changes to a recipe that
-- does not fit would plan less (docs/PLANNING.md, docs/TRAINING.md).
--   local ok, why = require("fsdp.plan_fit").fits(fsdp.plan_model(model, o))
local base = require "fsdp.ffi"
local recipe = require "fsdp.recipe"
local llama = require "fsdp.models.llama"
local planner = require "fsdp.planner"
local gib = require("fsdp.pretty").gib
local ffi, C, check = base.ffi, base.C, base.check

local M = {}

-- A lower bound of the bytes per rank, from arithmetic alone: the fp32 main
-- params and the optimizer's state exist once (zero >= 1) or on every
-- rank, at best spread over all `world` ranks. The trainer compares it with
-- the machine before planning (a plan of an absurd model is itself costly).
function M.floor_bytes(cfg, r, world)
  local per_param = 4 + (r.optimizer.name == "adamw" and 8 or 4)
  return llama.num_params(cfg) * per_param / world
end

-- The pre-flight check of plan p against this machine's free memory now:
-- on a GPU its device part against the GPU's, the offloaded part against
-- the host's; on CPU ranks the whole against the host's. o: ranks (this
-- machine's ranks sharing the device; 1), host_ranks (sharing the host;
-- ranks), min_free_fraction (of the free bytes a rank may plan on; 0.9).
-- Returns true, or false, a message naming what is needed and what is
-- there, and the bytes: {want, have} (the trainer adds its advice).
function M.fits(p, o)
  o = o or {}
  local frac, ranks = o.min_free_fraction or 0.9, o.ranks or 1
  local function free(dev, share)
    local f, t = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
    check(C.fsdp_device_memory_info(dev, f, t), "memory info")
    return tonumber(f[0]) * frac / share
  end
  local need, gpu = p.need, p.device == "cuda"
  local have = free(gpu and C.FSDP_CUDA or C.FSDP_CPU, ranks)
  local want = gpu and need.device or need.total
  if want > have then
    return false, string.format("%s: this %s needs %.2f GiB per rank%s (params %.2f, grads %.2f, optimizer %.2f, unit buffers " ..
      "%.2f, activations %.2f), and this %s has %.2f GiB free for each of its %d ranks.", p.where,
      p.kind == "model" and "model" or "recipe", gib(want),
      gpu and need.host > 0 and string.format(" on the GPU (and %.2f GiB offloaded to host memory)", gib(need.host)) or "",
      gib(need.params), gib(need.grads), gib(need.optimizer), gib(need.unit_buffers), gib(need.activations),
      gpu and "GPU" or "machine", gib(have), ranks), { want = want, have = have }
  end
  if gpu and need.host > 0 then
    local host_ranks = o.host_ranks or ranks
    local host = free(C.FSDP_CPU, host_ranks)
    if need.host > host then
      return false, string.format("%s: fsdp.offload keeps %.2f GiB per rank in host memory, and this machine has %.2f GiB free " ..
        "for each of its %d ranks. Use more machines, or offload fewer units (a policy's offload option).", p.where,
        gib(need.host), gib(host), host_ranks), { want = need.host, have = host, host = true }
    end
  end
  return true
end

-- What would make recipe r fit when its plan does not: each single change
-- that lowers the planned bytes per rank (the device's part on a GPU,
-- o.device_only), with the figure it gives, smallest first. o: the plan's
-- options (world, where, mesh). Changes the recipe already has, and ones
-- that plan no lower (bf16 on CPU ranks, which compute in fp32), are left
-- out. Returns { {change = "fsdp.zero = 3", bytes = n}, ... }.
function M.advice(r, o, device_only)
  local function need(x, world)
    local ok, p = pcall(planner.plan, x, { world = world or o.world, where = o.where, mesh = world and "dp_shard=-1" or o.mesh })
    if not ok then return nil end
    return device_only and p.need.device or p.need.total
  end
  local base = need(r)
  local f, d = r.fsdp, r.data
  local tries = {}
  local function try(change, args, world)
    local x = recipe.apply_overrides(recipe.copy(r), args, o.where)
    local n = need(x, world)
    if n and base and n < base then tries[#tries + 1] = { change = change, bytes = n } end
  end
  if f.zero ~= 3 then try("fsdp.zero = 3", { "fsdp.zero=3" }) end
  if f.checkpoint ~= "full" then try("fsdp.checkpoint = 'full'", { "fsdp.checkpoint=full" }) end
  if f.recompute ~= "mlp" then try("fsdp.recompute = 'mlp'", { "fsdp.recompute=mlp" }) end
  if f.param_dtype ~= "bf16" then try("fsdp.param_dtype = 'bf16'", { "fsdp.param_dtype=bf16" }) end
  if device_only and f.offload ~= "all" then try("fsdp.offload = 'all'", { "fsdp.offload=all" }) end
  -- (a cp mesh: ring attention keeps 1/cp of the keys and values for the backward)
  local okm, _, _, _, cp = pcall(planner.mesh_sizes, o.mesh or r.mesh, o.world or 1, o.where or "recipe")
  if okm and cp > 1 and r.train.cp_attention ~= "ring" then try("train.cp_attention = 'ring'", { "train.cp_attention=ring" }) end
  if d.micro_batch > 1 then
    local mb = math.floor(d.micro_batch / 2)
    local args = { "data.micro_batch=" .. mb }
    if r.train.global_batch_tokens then args[2] = "train.global_batch_tokens=" .. r.train.global_batch_tokens end
    try(string.format("data.micro_batch = %d", mb), args)
  end
  if d.seq >= 64 then try(string.format("data.seq = %d", d.seq / 2), { "data.seq=" .. math.floor(d.seq / 2) }) end
  if (o.world or 1) * 2 <= planner.max_world then try(string.format("%d ranks", 2 * (o.world or 1)), {}, 2 * (o.world or 1)) end
  table.sort(tries, function(a, b) return a.bytes < b.bytes end)
  return tries
end

return M

-- fsdp.planner: what a recipe (or any fsdp.nn model: plan_model) needs on
-- every rank, with no allocation and no launch: the model, grouped into
-- units by the recipe's policy exactly as fully_shard groups it, each unit's
-- layout computed by the engine (src/shard/layout.c), and the bytes each
-- ZeRO level keeps resident per unit (the same buffers src/shard/unit.c
-- allocates), the full-unit buffer pools, the peak number of full buffers
-- live at once (the schedule replayed), the activations of one step (the
-- model run on the counting device: fsdp.dry_run),
-- and the communication volume per step. `fsdp plan`, the REPL and the
-- trainer's pre-flight check all use it (docs/PLANNING.md).
--   local p = planner.plan(recipe_table, {world = 64, mesh = "dp_outer=8,dp_shard=8", where = "r.lua"})
--   print(planner.render(p)); planner.json(p)
local base = require "fsdp.ffi"
local recipe = require "fsdp.recipe"
local llama = require "fsdp.models.llama"
local hf_config = require "fsdp.hf_config"
local shard = require "fsdp.shard"
local units_lib = require "fsdp.units" -- (units: the recipe's field in this file)
local json = require "fsdp.json"
local tensor = require "fsdp.tensor"
local dry_run = require "fsdp.dry_run"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}

local REG = { none = 0, buffer = C.FSDP_REG_BUFFER, window = C.FSDP_REG_WINDOW }

function M.gib(b) return b / 2 ^ 30 end

-- dims of a mesh spec for world ranks: shard group size S, outer size R
function M.mesh_sizes(spec, world, where)
  local dims = recipe.check_mesh(spec, where)
  local known, rest = 1, nil
  for _, d in ipairs(dims) do
    if d[2] == -1 then
      if rest then error(where .. ": mesh: only one dimension may be -1", 0) end
      rest = d
    else
      known = known * d[2]
    end
  end
  if rest then
    if world % known ~= 0 then error(string.format("%s: mesh: %d ranks do not divide by the other dimensions' %d", where, world, known), 0) end
    rest[2] = world / known
  elseif known ~= world then
    error(string.format("%s: mesh %s has %d ranks, the world %d", where, type(spec) == "string" and spec or "(table)", known, world), 0)
  end
  local S, R = nil, 1 -- (check_mesh: dp_shard is there, and dp_outer is the only other)
  for _, d in ipairs(dims) do
    if d[1] == "dp_shard" then S = d[2] else R = d[2] end
  end
  return S, R
end

-- The recipe's units policy as fully_shard takes it: "default" (Llama's),
-- a list of module kinds, a function, or a path to a Lua file returning one
-- (relative to the working directory or the repository root).
function M.policy(units, where)
  if units == "default" or units == nil then return llama.units end
  if type(units) == "string" then
    local root = debug.getinfo(1, "S").source:match("^@(.*)/lua/fsdp/[^/]*$") or "."
    local path = units
    local f = io.open(path)
    if not f and units:sub(1, 1) ~= "/" then path = root .. "/" .. units; f = io.open(path) end
    if not f then error(string.format("%s: fsdp.units = '%s': no such policy file (give 'default', a list of kinds, a function, " ..
      "or a path such as recipes/policies/two_layers_per_unit.lua)", where, units), 0) end
    f:close()
    local chunk, err = loadfile(path)
    if not chunk then error(string.format("%s: fsdp.units: %s", where, err), 0) end
    local ok, fn = pcall(chunk)
    if not ok or type(fn) ~= "function" then
      error(string.format("%s: fsdp.units: %s must return a function(module, path), got %s", where, path, ok and type(fn) or tostring(fn)), 0)
    end
    return fn
  end
  return units
end

-- A micro-batch of ids and targets {B, T} for a dry run, as the trainer
-- makes them: ids on the device, targets on the host (counted), and on a
-- GPU their device copy; packed rows (data.pack) their doc_start on the host
local function llama_batch(B, T, device, packed)
  return function()
    local b = { x = tensor.new({ B, T }, "int32", device), y = tensor.new({ B, T }, "int32") }
    if device == "cuda" then b.y_dev = tensor.new({ B, T }, "int32", "cuda") end
    if packed then b.doc_start = tensor.new({ B, T }, "int32") end
    return b
  end
end

-- cuDNN's attention workspaces where no GPU can be asked (`fsdp plan` on a
-- laptop): its deterministic backward (FSDP_CUDNN_DETERMINISTIC, the
-- default) keeps fp32 partial sums of dq for each block of 128 keys (the
-- sequence padded to whole blocks), and either backward one dq in fp32 and
-- a float per row and head, 256 bytes besides (their alignment). Measured on
-- an H200 with cuDNN 9.19 (bench/RESULTS.md, 2026-11-27), to the byte: Llama
-- 3.2 1B's attention at sequence 4096, 1107820800 bytes; 4 heads of 32 at
-- 2 x 32 tokens, 165120; each forward 256. Our own kernels (fp32) take none.
function M.attention_workspace_estimate(cfg, B, T, param_dtype, deterministic)
  if param_dtype ~= "bf16" then return { forward = 0, backward = 0 } end
  local H, D = cfg.num_attention_heads, cfg.head_dim
  local blocks = math.ceil(T / 128)
  local partial = deterministic and B * H * blocks * 128 * D * 4 * blocks or 0
  return { forward = 256, backward = partial + B * H * T * D * 4 + B * H * T * 4 + 256 }
end

-- The plan of model, grouped into units (a: shard.assign's), in p (where,
-- world, shard S, outer R, hfsdp, grad_accum K, device): what each unit
-- holds (the engine's unit plans), the shared scratch and staging, the
-- pools, the activations of one step found by running it (fsdp.dry_run),
-- and the communication per step. s: param_dtype, reduce_dtype,
-- comm_register, separate_reduce, prefetch, max_live_units; the dry run's
-- batch, loss, forward_loss and attention_workspace.
local function plan_assigned(p, model, a, s)
  local where, S, R, hf, K, f = p.where, p.shard, p.outer, p.hfsdp, p.grad_accum, s
  local ces = f.param_dtype == "bf16" and 2 or 4
  local res = f.reduce_dtype == "bf16" and 2 or 4
  local max_scratch, max_stage, max_nccl_stage = 0, 0, 0
  local resident = { params_full = 0, params_shard = 0, main_params = 0, optimizer = 0, grads_full = 0, grads_main = 0, scratch = 0,
    host_stage = 0, offloaded = 0 }
  local gpu = p.device == "cuda"
  -- (the engine's plan of each unit, after its checks of the config: a
  -- refusal there is the recipe's, named by its file)
  local ok, err = pcall(shard.plan_units, a, { shard_ranks = S, outer_ranks = R, hfsdp = hf, device = p.device,
    param_dtype = f.param_dtype, reduce_dtype = f.reduce_dtype, comm_register = REG[f.comm_register or "none"] or 0,
    micro_batches = K })
  if not ok then error(where .. ": " .. tostring(err):gsub("^[^:\n]+:%d+: ", ""):gsub(" %(FSDP_EINVAL%)$", ""), 0) end
  for _, u in ipairs(a.units) do
    -- what the unit holds on every rank: the engine's own plan (src/shard/unit_plan.c)
    local l, plan = u.layout, u.plan
    local Su, Tu = tonumber(plan.shard_numel), tonumber(plan.total_numel)
    local z, n_opt = u.zero, tonumber(plan.opt_numel)
    local function row(b) return tonumber(plan.rows[b].bytes) end
    local mem = {
      params_full = row(C.FSDP_UBUF_PARAMS_FULL), params_shard = row(C.FSDP_UBUF_PARAM_SHARD),
      main_params = row(C.FSDP_UBUF_MAIN_PARAMS), optimizer = row(C.FSDP_UBUF_OPT1) + row(C.FSDP_UBUF_OPT2),
      grads_full = row(C.FSDP_UBUF_GRADS_FULL), grads_main = row(C.FSDP_UBUF_MAIN_GRADS) + row(C.FSDP_UBUF_GRAD_ACCUM) +
        row(C.FSDP_UBUF_GRADS_SUM),
      scratch = 0, -- shared: below
      host_stage = row(C.FSDP_UBUF_HOST_STAGE), offloaded = 0 }
    -- of those, what lives in host memory (offload)
    for b = 0, C.FSDP_UBUF_COUNT - 1 do
      if plan.rows[b].held == C.FSDP_HELD_HOST then mem.offloaded = mem.offloaded + row(b) end
    end
    if plan.main_split ~= 0 then p.split_units = (p.split_units or 0) + 1 end
    if plan.grads_compact ~= 0 then p.compact_units = (p.compact_units or 0) + 1 end
    local total = 0
    for k, v in pairs(mem) do
      resident[k] = resident[k] + v
      if k ~= "offloaded" then total = total + v end -- a part of the others, not more
    end
    local params = {}
    for i, q in ipairs(u.params) do
      params[i] = { name = q.name, shape = q.spec.shape or { q.spec.numel }, numel = q.spec.numel,
        offset = tonumber(C.fsdp_layout_param_offset(l, i - 1)) }
    end
    p.units[#p.units + 1] = { name = u.name, index = u.index, zero = z, layout = l, shard_numel = Su, total_numel = Tu,
      numel = tonumber(C.fsdp_layout_numel_used(l)), n_opt = n_opt, mem = mem, bytes = total, params = params,
      prefetch = u.prefetch or f.prefetch, reshard_after_forward = u.reshard_after_forward }
    max_scratch = math.max(max_scratch, tonumber(plan.reduce_scratch))
    max_stage = math.max(max_stage, tonumber(plan.gather_stage))
    -- NCCL's fp32 block for bf16 grads reduce-scattered into fp32, as the
    -- unit's plan says (src/shard/unit_plan.c: cast_stage)
    max_nccl_stage = math.max(max_nccl_stage, tonumber(plan.cast_stage))
  end
  -- one fp32 staging shard per rank, shared by the units (their reductions
  -- run one after another on the shard group's stream)
  resident.scratch = max_scratch
  -- units with their param shard on the host copy it up into the shard
  -- comm's scratch before each all-gather: a second one when reductions
  -- have their own comm (fsdp.separate_reduce), else the same
  if max_stage > 0 and f.separate_reduce ~= false then resident.scratch = resident.scratch + max_stage end
  -- staging: CPU ranks with bf16 params, the fp32 copies of the running
  -- module's weights and grads; GPUs, NCCL's fp32 cast block
  resident.staging = gpu and max_nccl_stage or units_lib.cpu_staging_bytes(a, p.device, f.param_dtype)
  p.resident = resident
  local bound = shard.pool_bound(a, f.max_live_units)
  local slots, peak, why = shard.pool_slots(a, f.prefetch, bound)
  if not peak then error(where .. ": the schedule does not fit its buffer pools: " .. why, 0) end
  p.pools = { bound = bound, slots = slots, params = shard.sum(slots.params), grads = shard.sum(slots.grads),
    peak_params = peak.params, peak_grads = peak.grads }
  -- activations: one micro-batch of the model run on the counting device
  -- (fsdp.dry_run), as the trainer runs it
  local d = dry_run.step(model, { device = p.device, act_dtype = f.param_dtype, micro_batches = K,
    attention_workspace = s.attention_workspace, batch = s.batch, loss = s.loss, forward_loss = s.forward_loss })
  p.activations = d.activations
  -- lasting from the first step: the model's caches (Llama's rope tables)
  resident.rope = d.lasting
  -- each unit's grad-norm sums on the device, as its plan says (src/shard/unit_plan.c)
  resident.norm_sums = 0
  for _, u in ipairs(a.units) do resident.norm_sums = resident.norm_sums + tonumber(u.plan.norm_sums) end
  -- the step's batches: ids and targets, int32 (on GPUs their device copies)
  p.batches = K * d.batch
  local sum = 0
  for k, v in pairs(resident) do if k ~= "offloaded" then sum = sum + v end end
  p.resident_total = sum
  p.transient = p.pools.params + p.pools.grads + p.activations + p.batches
  p.peak = sum + p.transient
  p.host = resident.offloaded          -- of the peak, what lives in host memory
  p.device_peak = p.peak - p.host
  -- the trainer's pre-flight summary
  p.need = { params = resident.params_full + resident.params_shard + resident.main_params,
    grads = resident.grads_full + resident.grads_main + resident.scratch + resident.staging, optimizer = resident.optimizer,
    unit_buffers = p.pools.params + p.pools.grads, activations = p.activations, total = p.peak,
    device = p.device_peak, host = p.host }
  -- communication per rank per step: bytes each rank sends in ring
  -- algorithms ((n-1)/n of the buffer for all-gather and reduce-scatter,
  -- twice that for all-reduce), summed over the step's collectives
  local ag, rs, ar = 0, 0, 0
  for i, u in ipairs(p.units) do
    local au = a.units[i]
    local gathers = u.zero == 3 and (peak.gathers[au] or 0) * K or 0
    ag = ag + gathers * (S - 1) * u.shard_numel * ces
    if u.zero == 1 or u.zero == 2 then ag = ag + (S - 1) * u.shard_numel * ces end -- new params after the step
    if u.zero >= 2 then rs = rs + K * (S - 1) * u.shard_numel * res
    elseif u.zero == 1 then rs = rs + (S - 1) * u.shard_numel * res
    else ar = ar + 2 * (S - 1) * u.shard_numel * res end
    if R > 1 then
      if hf then
        rs = rs + (R - 1) * u.n_opt * 4
        ag = ag + (R - 1) * u.n_opt * ces
      else
        ar = ar + 2 * (R - 1) / R * u.n_opt * 4
      end
    end
  end
  p.comm = { all_gather = ag, reduce_scatter = rs, all_reduce = ar }
  return p
end

-- The plan of recipe r (a table, checked here) on o.world ranks.
-- o: world (default 1), mesh (overrides r.mesh), where (for messages),
-- strict (the trainer's: a global batch that does not divide is an error;
-- otherwise a warning in p.warnings, planned with 1 micro-batch).
M.max_layers = 4096
M.max_world = 1048576

-- A lower bound of the bytes per rank, from arithmetic alone: the fp32 main
-- params and the optimizer's state exist once (zero >= 1) or on every
-- rank, at best spread over all `world` ranks. The trainer compares it with
-- the machine before planning (a plan of an absurd model is itself costly).
function M.floor_bytes(cfg, r, world)
  local per_param = 4 + (r.optimizer.name == "adamw" and 8 or 4)
  return llama.num_params(cfg) * per_param / world
end

function M.plan(r, o)
  o = o or {}
  local where = o.where or "recipe"
  r = recipe.check(r, where)
  local W = o.world or 1
  if W < 1 or W % 1 ~= 0 then error(string.format("%s: world = %s; expected a positive integer", where, tostring(W)), 0) end
  -- (the plan's work grows with the ranks: a million plans in seconds)
  if W > M.max_world then error(string.format("%s: world = %s; at most %d ranks are planned", where, tostring(W), M.max_world), 0) end
  local S, R = M.mesh_sizes(o.mesh or r.mesh, W, where)
  local f = r.fsdp
  local cfg = hf_config.model(r.model, where)
  -- the plan runs every layer on the counting device (0.65 ms and 65 KB
  -- each, llama70b's shape; 4096 layers take 3 s): refuse a depth no model
  -- has before it costs minutes
  if cfg.num_hidden_layers > M.max_layers then
    error(string.format("%s: model.num_hidden_layers = %d; at most %d are planned (the largest published models have a " ..
      "few hundred layers)", where, cfg.num_hidden_layers, M.max_layers), 0)
  end
  local model = llama.model(cfg, { checkpoint = f.checkpoint, recompute = f.recompute })
  local ok, a = pcall(shard.assign, model, { units = M.policy(f.units, where), zero = f.zero, offload = f.offload, hfsdp = f.hfsdp })
  if not ok then error(where .. ": fsdp.units: " .. tostring(a):gsub("^fully_shard: ", ""), 0) end
  local hf = f.hfsdp
  if hf and R == 1 then error(where .. ": fsdp.hfsdp = true needs a dp_outer mesh dimension above 1", 0) end
  local ces = f.param_dtype == "bf16" and 2 or 4
  local dp = S * R
  local B, T = r.data.micro_batch, r.data.seq
  local okK, K = pcall(recipe.grad_accum, r, dp, where)
  local warnings = {}
  if not okK then -- the trainer refuses this; a plan still says what the rest would cost
    if o.strict then error(K, 0) end
    warnings[1] = tostring(K) .. "; planned with 1 micro-batch per step"
    K = 1
  end
  local p = { where = where, world = W, shard = S, outer = R, hfsdp = hf, zero = f.zero, param_dtype = f.param_dtype,
    cfg = cfg, n_params = llama.num_params(cfg), units = {}, micro_batch = B, seq = T, grad_accum = K,
    checkpoint = f.checkpoint, recompute = f.recompute, prefetch = f.prefetch, max_live_units = f.max_live_units, assignment = a,
    mesh = type(o.mesh or r.mesh) == "string" and (o.mesh or r.mesh) or "custom", warnings = warnings, device = r.train.device }
  local gpu = r.train.device == "cuda"
  -- the attention kernels' workspaces: as this GPU's cuDNN plans them
  -- (o.attention_workspace, from ops.attention_workspace), else estimated
  local ws = nil
  if gpu then
    ws = o.attention_workspace
    p.attention_workspace_from = ws and "cuDNN's plan on this GPU" or "estimated: no GPU asked"
    ws = ws or M.attention_workspace_estimate(cfg, B, T, f.param_dtype, os.getenv("FSDP_CUDNN_DETERMINISTIC") ~= "0")
    if r.data.pack then -- packed rows run our own kernels, which take no workspace (fsdp_cuda_attention_forward_docs)
      ws, p.attention_workspace_from = { forward = 0, backward = 0 }, "none: packed rows run our own kernels"
    end
    p.attention_workspace = ws
  end
  local chunk = r.train.loss_chunk_mb * 2 ^ 20
  p.loss_rows = chunk > 0 and llama.loss_rows(B * T, cfg.vocab_size, gpu and ces or 4, chunk) or B * T
  local step_loss = llama.step_loss(chunk)
  return plan_assigned(p, model, a, { param_dtype = f.param_dtype, reduce_dtype = f.reduce_dtype,
    comm_register = f.comm_register, separate_reduce = f.separate_reduce, prefetch = f.prefetch,
    max_live_units = f.max_live_units, batch = llama_batch(B, T, r.train.device, r.data.pack), loss = step_loss.loss,
    forward_loss = step_loss.forward_loss, attention_workspace = ws })
end

-- The plan of any fsdp.nn model (a user's own, a shared layer, any
-- policy's grouping): what fsdp.fully_shard(model, o) holds on every rank
-- of o.world, with one step's activations found by running the model's
-- forward, loss and backward on the counting device (fsdp.dry_run: no
-- memory, no work). Call it before fully_shard, for the pre-flight check
-- (planner.fits) or to print (planner.render). o: fully_shard's options
-- as it takes them (units, zero, offload, hfsdp, prefetch, max_live_units,
-- mixed = {param_dtype, reduce_dtype}, micro_batches, separate_reduce,
-- comm_register), and
--   world (1), mesh (a spec, "dp_shard=-1"), device ("cpu" or "cuda")
--   batch: function() returning one micro-batch {x = fsdp.tensor(...), y = ...}
--          (made inside the dry run: fsdp.tensor gives meta tensors there)
--   loss, forward_loss: train_step's (default: MSE against batch.y)
--   attention_workspace, where (names the model in messages)
local model_options = { "units", "zero", "offload", "hfsdp", "prefetch", "max_live_units", "mixed", "micro_batches",
  "separate_reduce", "comm_register", "overlap_step", "world", "mesh", "device", "batch", "loss", "forward_loss", "attention_workspace", "where" }
function M.plan_model(model, o)
  o = o or {}
  local where = o.where or "model"
  local known = {}
  for _, k in ipairs(model_options) do known[k] = true end
  for k in pairs(o) do
    if not known[k] then
      error(string.format("planner.plan_model: unknown option '%s' (expected %s)", tostring(k), table.concat(model_options, ", ")), 2)
    end
  end
  if type(o.batch) ~= "function" then
    error("planner.plan_model: batch must be a function returning one micro-batch ({x = fsdp.tensor(...), y = ...})", 2)
  end
  local W = o.world or 1
  if type(W) ~= "number" or W < 1 or W % 1 ~= 0 or W > M.max_world then
    error(string.format("planner.plan_model: world = %s; expected an integer from 1 to %d", tostring(W), M.max_world), 2)
  end
  local device = o.device or "cpu"
  if device ~= "cpu" and device ~= "cuda" then error("planner.plan_model: device = " .. tostring(device) .. "; expected cpu or cuda", 2) end
  local mesh = o.mesh or "dp_shard=-1"
  local S, R = M.mesh_sizes(mesh, W, where)
  local mixed = o.mixed or {}
  local pdt, rdt = mixed.param_dtype or "fp32", mixed.reduce_dtype or "fp32"
  local zero = o.zero or 3
  local ok, a = pcall(shard.assign, model, { units = o.units, zero = zero, offload = o.offload, hfsdp = o.hfsdp })
  if not ok then error(where .. ": " .. tostring(a):gsub("^fully_shard: ", ""), 0) end
  if o.hfsdp and R == 1 then error(where .. ": hfsdp needs a dp_outer mesh dimension above 1", 0) end
  local n = 0
  for _, u in ipairs(a.units) do for _, q in ipairs(u.params) do n = n + q.spec.numel end end
  local p = { kind = "model", where = where, world = W, shard = S, outer = R, hfsdp = o.hfsdp and true or false, zero = zero,
    param_dtype = pdt, n_params = n, units = {}, grad_accum = o.micro_batches or 1, prefetch = o.prefetch or 1,
    max_live_units = o.max_live_units, assignment = a, mesh = mesh, warnings = {}, device = device }
  return plan_assigned(p, model, a, { param_dtype = pdt, reduce_dtype = rdt, comm_register = o.comm_register,
    separate_reduce = o.separate_reduce, prefetch = p.prefetch, max_live_units = o.max_live_units, batch = o.batch,
    loss = o.loss, forward_loss = o.forward_loss, attention_workspace = o.attention_workspace })
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
      p.kind == "model" and "model" or "recipe", M.gib(want),
      gpu and need.host > 0 and string.format(" on the GPU (and %.2f GiB offloaded to host memory)", M.gib(need.host)) or "",
      M.gib(need.params), M.gib(need.grads), M.gib(need.optimizer), M.gib(need.unit_buffers), M.gib(need.activations),
      gpu and "GPU" or "machine", M.gib(have), ranks), { want = want, have = have }
  end
  if gpu and need.host > 0 then
    local host_ranks = o.host_ranks or ranks
    local host = free(C.FSDP_CPU, host_ranks)
    if need.host > host then
      return false, string.format("%s: fsdp.offload keeps %.2f GiB per rank in host memory, and this machine has %.2f GiB free " ..
        "for each of its %d ranks. Use more machines, or offload fewer units (a policy's offload option).", p.where,
        M.gib(need.host), M.gib(host), host_ranks), { want = need.host, have = host, host = true }
    end
  end
  return true
end

-- pieces rank r (world rank) holds in unit u of plan p: {param, begin, end, shard_offset}
function M.pieces(p, u, r)
  local sr = r % p.shard
  local n = C.fsdp_layout_rank_pieces(u.layout, sr, nil, 0)
  local ps = ffi.new("fsdp_layout_piece[?]", math.max(n, 1))
  C.fsdp_layout_rank_pieces(u.layout, sr, ps, n)
  local out = {}
  for i = 0, n - 1 do
    out[#out + 1] = { param = u.params[ps[i].param + 1].name, begin = tonumber(ps[i].begin), ["end"] = tonumber(ps[i]["end"]),
      shard_offset = tonumber(ps[i].shard_offset) }
  end
  return out
end

local function human(n)
  if n >= 1e9 then return string.format("%.2fB", n / 1e9) end
  if n >= 1e6 then return string.format("%.2fM", n / 1e6) end
  if n >= 1e3 then return string.format("%.1fk", n / 1e3) end
  return string.format("%d", n)
end
M.human = human

-- "2 x 116.01 MiB + 501.00 MiB": a pool's slots, equal ones counted
local function slot_list(v)
  if #v == 0 then return "none" end
  local out, i = {}, 1
  while i <= #v do
    local j = i
    while j < #v and v[j + 1] == v[i] do j = j + 1 end
    out[#out + 1] = (j > i and (j - i + 1) .. " x " or "") .. M.bytes(v[i])
    i = j + 1
  end
  return table.concat(out, " + ")
end

local function bytes(b)
  if b >= 2 ^ 30 then return string.format("%.2f GiB", b / 2 ^ 30) end
  if b >= 2 ^ 20 then return string.format("%.2f MiB", b / 2 ^ 20) end
  if b >= 2 ^ 10 then return string.format("%.1f KiB", b / 2 ^ 10) end
  return string.format("%d B", b)
end
M.bytes = bytes

-- A text table: rows of cells, the first row the header; numbers right-aligned
function M.table(rows)
  local w = {}
  for _, row in ipairs(rows) do
    for i, c in ipairs(row) do w[i] = math.max(w[i] or 0, #tostring(c)) end
  end
  local out = {}
  for k, row in ipairs(rows) do
    local cells = {}
    for i, c in ipairs(row) do
      local s = tostring(c)
      local right = k > 1 and i > 1 and s:match("^%-?[%d.]+%s?%a*$") -- numbers and sizes

      cells[i] = right and string.rep(" ", w[i] - #s) .. s or s .. string.rep(" ", w[i] - #s)
    end
    out[#out + 1] = "  " .. table.concat(cells, "  "):gsub("%s+$", "")
  end
  return table.concat(out, "\n")
end

-- a row's note for what n of the units do ("resident" where none does);
-- fmt's %s is where: "" (every unit) or " in n of N units"
local function units_note(p, n, fmt)
  n = n or 0
  if n == 0 then return "resident" end
  return string.format(fmt, n == #p.units and "" or string.format(" in %d of %d units", n, #p.units))
end

function M.memory_rows(p)
  local m = p.resident
  local rows = {
    { "what", "bytes per rank", "" },
    { "params (compute copy)", bytes(m.params_full + m.params_shard), "resident" },
    -- split: bf16 units keep only the low 16 bits of each fp32 main param
    -- (src/base/bf16_split.h); compact: the optimizer's grads in bf16
    { "main params (fp32)", bytes(m.main_params), units_note(p, p.split_units,
      "resident: the low 16 bits%s, the high 16 being the compute copy") },
    { "optimizer state", bytes(m.optimizer), "resident" },
    { "grads", bytes(m.grads_full + m.grads_main), units_note(p, p.compact_units,
      "resident: bf16%s (one micro-batch, reduced in bf16 or not at all: nothing for fp32 to add)") },
    { "comm scratch", bytes(m.scratch), "resident, shared by the units: the reduce staging (and the param staging of host-held shards)" },
    { "host staging (offload)", bytes(m.host_stage), "resident, host" },
    { "unit buffer pools", bytes(p.pools.params + p.pools.grads), string.format("params %s, grads %s; live at once: %d params, %d grads",
      slot_list(p.pools.slots.params), slot_list(p.pools.slots.grads), p.pools.peak_params, p.pools.peak_grads) },
    { "activations", bytes(p.activations), p.kind == "model" and "one micro-batch, run on the counting device (fsdp.dry_run)" or
      string.format("micro-batch %d x %d, checkpoint %s, recompute %s, logits %s%s",
      p.micro_batch, p.seq, tostring(p.checkpoint), p.recompute, p.loss_rows < p.micro_batch * p.seq and string.format("in chunks of %d rows", p.loss_rows) or "whole",
      p.attention_workspace and string.format("; attention workspace %s (%s)", bytes(p.attention_workspace.backward),
        p.attention_workspace_from) or "") },
    { p.kind == "model" and "model caches, batches" or "rope tables, batches", bytes(m.rope + m.norm_sums + p.batches),
      string.format("resident: %s %s%s; the step's %s %s", p.kind == "model" and "what the first step makes for the next" or
      "rope's tables", bytes(m.rope), m.norm_sums > 0 and ", the units' grad-norm sums " .. bytes(m.norm_sums) or "",
      p.kind == "model" and "batches" or "ids and targets", bytes(p.batches)) },
    { "peak", bytes(p.peak), p.host > 0 and string.format("%s on the device, %s in host memory (offload)", bytes(p.device_peak),
      bytes(p.host)) or "" },
  }
  if m.staging > 0 then -- after the host staging
    table.insert(rows, 8, p.device == "cuda" and { "fp32 staging (NCCL, bf16)", bytes(m.staging),
      "resident: bf16 grads cast to fp32, a chunk of each rank's slice at a time, for the reduce-scatters" } or
      { "fp32 staging (CPU, bf16)", bytes(m.staging),
      "resident: the running module's weights and grads in fp32 for the CPU ops, one pair for all" })
  end
  return rows
end

-- One row per unit, but a run of units that differ only in a trailing
-- number (model.layers.0 .. model.layers.79) and in nothing the table
-- shows is one row: "model.layers.0-79 x80".
function M.unit_rows(p)
  local rows = { { "#", "unit", "zero", "params", "shard", "compute", "main", "optimizer", "grads", "total" } }
  local run -- {first, last unit, prefix, first and last number, cells}
  local function flush()
    if not run then return end
    local n = run.last_n - run.first_n + 1
    local idx = n > 1 and (run.first.index .. "-" .. run.last.index) or run.first.index
    local name = n > 1 and string.format("%s%d-%d x%d", run.prefix, run.first_n, run.last_n, n) or run.first.name
    local row = { idx, name }
    for _, c in ipairs(run.cells) do row[#row + 1] = c end
    rows[#rows + 1] = row
    run = nil
  end
  for _, u in ipairs(p.units) do
    local m = u.mem
    local cells = { u.zero, human(u.numel), human(u.shard_numel), bytes(m.params_full + m.params_shard), bytes(m.main_params),
      bytes(m.optimizer), bytes(m.grads_full + m.grads_main + m.scratch), bytes(u.bytes) }
    local prefix, num = u.name:match("^(.-)(%d+)$")
    num = tonumber(num)
    local same = run and prefix == run.prefix and num == run.last_n + 1 and table.concat(cells, "|") == table.concat(run.cells, "|")
    if same then
      run.last, run.last_n = u, num
    else
      flush()
      run = { first = u, last = u, prefix = prefix or false, first_n = num or 0, last_n = num or 0, cells = cells }
    end
  end
  flush()
  return rows
end

-- Elements each rank owns (padding left out): equal up to padding; the
-- ranks are listed in runs of equal counts
function M.rank_rows(p)
  local runs = {}
  for r = 0, p.shard - 1 do
    local n = 0
    for _, u in ipairs(p.units) do
      for _, pc in ipairs(M.pieces(p, u, r)) do n = n + pc["end"] - pc.begin end
    end
    local last = runs[#runs]
    if last and last.n == n then last.to = r else runs[#runs + 1] = { from = r, to = r, n = n } end
  end
  local rows = { { "shard ranks", "parameter elements owned", "bytes per rank" } }
  for _, run in ipairs(runs) do
    rows[#rows + 1] = { run.from == run.to and tostring(run.from) or (run.from .. "-" .. run.to), human(run.n), bytes(p.peak) }
  end
  return rows
end

-- What would make recipe r fit when its plan does not: each single change
-- that lowers the planned bytes per rank (the device's part on a GPU,
-- o.device_only), with the figure it gives, smallest first. o: the plan's
-- options (world, where, mesh). Changes the recipe already has, and ones
-- that plan no lower (bf16 on CPU ranks, which compute in fp32), are left
-- out. Returns { {change = "fsdp.zero = 3", bytes = n}, ... }.
function M.advice(r, o, device_only)
  local function need(x, world)
    local ok, p = pcall(M.plan, x, { world = world or o.world, where = o.where, mesh = world and "dp_shard=-1" or o.mesh })
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
  if d.micro_batch > 1 then
    local mb = math.floor(d.micro_batch / 2)
    local args = { "data.micro_batch=" .. mb }
    if r.train.global_batch_tokens then args[2] = "train.global_batch_tokens=" .. r.train.global_batch_tokens end
    try(string.format("data.micro_batch = %d", mb), args)
  end
  if d.seq >= 64 then try(string.format("data.seq = %d", d.seq / 2), { "data.seq=" .. math.floor(d.seq / 2) }) end
  if (o.world or 1) * 2 <= M.max_world then try(string.format("%d ranks", 2 * (o.world or 1)), {}, 2 * (o.world or 1)) end
  table.sort(tries, function(a, b) return a.bytes < b.bytes end)
  return tries
end

-- "zero 3", or for a policy that mixes levels "zero 0, 2 and 3 (by unit:
-- 1 at 0, 2 at 2, 4 at 3)": the recipe's fsdp.zero alone would misstate it
function M.zero_text(p)
  local count, levels = {}, {}
  for _, u in ipairs(p.units) do
    if not count[u.zero] then levels[#levels + 1] = u.zero end
    count[u.zero] = (count[u.zero] or 0) + 1
  end
  if #levels <= 1 then return "zero " .. tostring(levels[1] or p.zero) end
  table.sort(levels)
  local names, by = {}, {}
  for i, z in ipairs(levels) do
    names[i] = tostring(z)
    by[i] = string.format("%d at %d", count[z], z)
  end
  return string.format("zero %s and %s (by unit: %s)", table.concat(names, ", ", 1, #names - 1), names[#names],
    table.concat(by, ", "))
end

function M.render(p)
  local out = {}
  for _, w in ipairs(p.warnings or {}) do out[#out + 1] = "warning: " .. w end
  out[#out + 1] = string.format("plan: %s on %d ranks (mesh %s: dp_shard %d x dp_outer %d%s), %s, %s params; %s parameters " ..
    "in %d units; %d micro-batch%s%s per step", p.where, p.world, p.mesh, p.shard, p.outer, p.hfsdp and ", hfsdp" or "",
    M.zero_text(p), p.param_dtype, human(p.n_params), #p.units, p.grad_accum, p.grad_accum == 1 and "" or "es",
    p.kind == "model" and "" or string.format(" of %d x %d", p.micro_batch, p.seq))
  out[#out + 1] = "memory per rank (every rank holds the same bytes):"
  out[#out + 1] = M.table(M.memory_rows(p))
  out[#out + 1] = string.format("communication per rank per step (bytes sent, ring algorithms): all-gather %s, reduce-scatter %s, all-reduce %s",
    bytes(p.comm.all_gather), bytes(p.comm.reduce_scatter), bytes(p.comm.all_reduce))
  out[#out + 1] = "units:"
  out[#out + 1] = M.table(M.unit_rows(p))
  out[#out + 1] = "ranks (of the shard group; replicas hold the same):"
  out[#out + 1] = M.table(M.rank_rows(p))
  return table.concat(out, "\n")
end

function M.json(p)
  local units = {}
  for _, u in ipairs(p.units) do
    local params = {}
    for _, q in ipairs(u.params) do params[#params + 1] = { name = q.name, shape = json.array(q.shape), numel = q.numel, offset = q.offset } end
    units[#units + 1] = { name = u.name, zero = u.zero, numel = u.numel, shard_numel = u.shard_numel, total_numel = u.total_numel,
      bytes = u.mem, params = json.array(params) }
  end
  return json.encode({ recipe = p.where, world = p.world, dp_shard = p.shard, dp_outer = p.outer, hfsdp = p.hfsdp, zero = p.zero,
    param_dtype = p.param_dtype, parameters = p.n_params, micro_batches = p.grad_accum, resident = p.resident,
    split_main_units = p.split_units or 0,
    pools = p.pools, activations = p.activations, checkpoint = p.checkpoint, recompute = p.recompute, peak = p.peak, comm = p.comm,
    attention_workspace = p.attention_workspace, attention_workspace_from = p.attention_workspace_from, batches = p.batches,
    units = json.array(units) })
end

-- Lines of difference between two plans: the totals, then units whose bytes differ
function M.diff(a, b)
  local rows = { { "", "A", "B", "B - A" } }
  local function row(name, x, y) if x ~= y then rows[#rows + 1] = { name, bytes(x), bytes(y), (y >= x and "+" or "-") .. bytes(math.abs(y - x)) } end end
  for _, k in ipairs({ "params_full", "params_shard", "main_params", "optimizer", "grads_full", "grads_main", "scratch", "staging" }) do
    row(k, a.resident[k] or 0, b.resident[k] or 0)
  end
  row("unit buffer pools", a.pools.params + a.pools.grads, b.pools.params + b.pools.grads)
  row("activations", a.activations, b.activations)
  row("peak", a.peak, b.peak)
  row("all-gather / step", a.comm.all_gather, b.comm.all_gather)
  row("reduce-scatter / step", a.comm.reduce_scatter, b.comm.reduce_scatter)
  row("all-reduce / step", a.comm.all_reduce, b.comm.all_reduce)
  local out = { string.format("A: %d ranks, zero %d, %d units; B: %d ranks, zero %d, %d units", a.world, a.zero, #a.units, b.world, b.zero, #b.units) }
  out[#out + 1] = #rows > 1 and M.table(rows) or "  (the same bytes)"
  return table.concat(out, "\n")
end

-- `fsdp plan RECIPE.lua --world W [--mesh SPEC] [--json] [section.field=value ...]`
M.usage = [[usage: fsdp plan RECIPE.lua [--world W] [--mesh dp_outer=R,dp_shard=S] [--json] [section.field=value ...]
Builds the recipe's model (nothing is allocated, nothing launched), groups it into units by its policy and
prints, per rank: the resident bytes of params, main params, optimizer state and grads, the full-unit buffer
pools and how many buffers are live at once, the activations of a step (one micro-batch of the model run on a
counting device: shapes and bytes, no memory, no work), the peak, the
communication per step, a table of units and the elements each rank owns. --json prints the same as JSON.
--world defaults to 1; --mesh overrides the recipe's mesh.]]

-- The options `fsdp plan` and `fsdp repl` share: [RECIPE] --world W
-- --mesh SPEC [--json] section.field=value...; who names the command in
-- errors, usage follows them. Returns {path, world, mesh, json, over, help}.
function M.parse_args(args, who, allow_json, usage)
  usage = usage or M.usage
  local o = { world = 1, over = {} }
  local i = 1
  while i <= #args do
    local a = args[i]
    local key, val = a:match("^(%-%-[%w-]+)=(.*)$")
    key = key or a
    if key == "--world" or key == "--mesh" then
      if not val then i = i + 1; val = args[i] end
      if val == nil then error(string.format("fsdp %s: %s needs a value\n%s", who, key, usage), 0) end
      if key == "--world" then
        o.world = tonumber(val)
        if not o.world then error(string.format("fsdp %s: --world needs a number\n%s", who, usage), 0) end
      else
        o.mesh = val
      end
    elseif key == "--json" and allow_json then o.json = true
    elseif key == "-h" or key == "--help" then o.help = true
    elseif a:sub(1, 2) == "--" then error(string.format("fsdp %s: unknown option '%s'\n%s", who, a, usage), 0)
    elseif not o.path then o.path = a
    else o.over[#o.over + 1] = a end
    i = i + 1
  end
  return o
end

function M.cli(args)
  local o = M.parse_args(args, "plan", true)
  if o.help then print(M.usage) return 0 end
  if not o.path then error("fsdp plan: which recipe?\n" .. M.usage, 0) end
  local p = M.plan(recipe.load(o.path, o.over), { world = o.world, mesh = o.mesh, where = o.path })
  print(o.json and M.json(p) or M.render(p))
  return 0
end

return M

-- fsdp.planner: what a recipe (or any fsdp.nn model: plan_model) needs on
-- every rank, with no allocation and no launch: the model, grouped into
-- units by the recipe's policy exactly as fully_shard groups it, each unit's
-- layout computed by the engine (src/shard/layout.c), and the bytes each
-- ZeRO level keeps resident per unit (the same buffers src/shard/unit.c
-- allocates), the full-unit buffer pools, the peak number of full buffers
-- live at once (the schedule replayed), the activations of one step (the
-- model run on the counting device: fsdp.dry_run),
-- and the communication volume per step. `fsdp plan` (fsdp.plan_cli), the
-- REPL and the trainer's pre-flight check (fsdp.plan_fit) all use it; the
-- plan is data here, its text and JSON are fsdp.plan_render's
-- (docs/PLANNING.md).
--   local p = planner.plan(recipe_table, {world = 64, mesh = "dp_outer=8,dp_shard=8", where = "r.lua"})
--   print(require("fsdp.plan_render").render(p))
local base = require "fsdp.ffi"
local recipe = require "fsdp.recipe"
local llama = require "fsdp.models.llama"
local hf_config = require "fsdp.hf_config"
local shard = require "fsdp.shard"
local units_lib = require "fsdp.units" -- (units: the recipe's field in this file)
local tensor = require "fsdp.tensor"
local dry_run = require "fsdp.dry_run"
local tpm = require "fsdp.tp"
local pretty = require "fsdp.pretty"
local ffi, C = base.ffi, base.C

local M = {}

local REG = { none = 0, buffer = C.FSDP_REG_BUFFER, window = C.FSDP_REG_WINDOW }

-- dims of a mesh spec for world ranks: dp_shard's size S, outer size R,
-- tp size P, cp size Cp (FSDP shards over S x Cp)
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
  local S, R, P, Cp = nil, 1, 1, 1 -- (check_mesh: dp_shard is there; dp_outer, cp and tp the others)
  for _, d in ipairs(dims) do
    if d[1] == "dp_shard" then S = d[2] elseif d[1] == "dp_outer" then R = d[2] elseif d[1] == "tp" then P = d[2]
    elseif d[1] == "cp" then Cp = d[2] end
  end
  return S, R, P, Cp
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
  -- (each unit's all-gathers: the module calls of the dry run's
  -- micro-batch replayed against the pools, as the run makes them)
  local gathered, why2 = shard.replay(a, f.prefetch, slots, d.trace)
  if not gathered then error(where .. ": the schedule does not fit its buffer pools: " .. why2, 0) end
  local ag, rs, ar = 0, 0, 0
  for i, u in ipairs(p.units) do
    local au = a.units[i]
    local gathers = u.zero == 3 and (gathered[au] or 0) * K or 0
    ag = ag + gathers * (S - 1) * u.shard_numel * ces
    if u.zero == 1 or u.zero == 2 then ag = ag + (S - 1) * u.shard_numel * ces end -- new params after the step
    if u.zero >= 2 then rs = rs + K * (S - 1) * u.shard_numel * res
    elseif u.zero == 1 then rs = rs + (S - 1) * u.shard_numel * res
    else ar = ar + 2 * (S - 1) / S * u.total_numel * res end -- (ZeRO 0 all-reduces the unpadded grads)
    if R > 1 then
      if hf then
        rs = rs + (R - 1) * u.n_opt * 4
        ag = ag + (R - 1) * u.n_opt * ces
      else
        ar = ar + 2 * (R - 1) / R * u.n_opt * 4
      end
    end
  end
  -- the step's scalars (fsdp.shard's train_step): each unit's grad norm
  -- and non-finite count, the loss and the stop flag, fp32, summed over
  -- the shard group and the tp group (hfsdp: the outer one too; else the
  -- outer one averages the loss and the flag)
  local scalars = (2 * #p.units + 2) * 4
  ar = ar + 2 * (S - 1) / S * scalars
  if R > 1 then ar = ar + 2 * (R - 1) / R * (hf and scalars or 8) end
  -- packed rows' batches count their targets: the step's total, summed
  -- over the data-parallel ranks as five fp32 (fsdp.shard.sum_ints); so
  -- do a chat mask's, which no plan knows of (20 bytes a step)
  if p.packed then ar = ar + 2 * (S - 1) / S * 20 + 2 * (R - 1) / R * 20 end
  p.comm = { all_gather = ag, reduce_scatter = rs, all_reduce = ar }
  -- the tp group's: what one micro-batch's tp layers sent in the dry run
  -- (their all-gathers and reduce-scatters of rows, the vocab-parallel
  -- loss's, the shared weights' grads), K of them, and the step's scalars
  local P = p.tp or 1
  if P > 1 then
    p.comm_tp = {}
    for k, v in pairs(d.tp_sent) do p.comm_tp[k] = K * v end
    p.comm_tp.all_reduce = (p.comm_tp.all_reduce or 0) + 2 * (P - 1) / P * scalars
  end
  if (p.cp or 1) > 1 then -- the cp group's: the keys' and values' all-gathers, their grads' reduce-scatters
    p.comm_cp = {}
    for k, v in pairs(d.cp_sent) do p.comm_cp[k] = K * v end
  end
  return p
end

-- train.attention = "auto": cuDNN's attention unless its backward's
-- workspace would pass this (it is 16 GiB for Llama 3 70B at 8192 tokens,
-- 257 GiB at 32768); past it our own kernels, which need none
M.attention_workspace_max = 32 * 2 ^ 30


-- the most layers and ranks a plan takes (below, where they are refused)
M.max_layers = 4096
M.max_world = 1048576

-- The plan of recipe r (a table, checked here) on o.world ranks.
-- o: world (default 1), mesh (overrides r.mesh), where (for messages),
-- strict (the trainer's: a global batch that does not divide is an error;
-- otherwise a warning in p.warnings, planned with 1 micro-batch).
function M.plan(r, o)
  o = o or {}
  local where = o.where or "recipe"
  r = recipe.check(r, where)
  local W = o.world or 1
  if W < 1 or W % 1 ~= 0 then error(string.format("%s: world = %s; expected a positive integer", where, tostring(W)), 0) end
  -- (the plan's work grows with the ranks: a million plans in seconds)
  if W > M.max_world then error(string.format("%s: world = %s; at most %d ranks are planned", where, tostring(W), M.max_world), 0) end
  local S0, R, P, Cp = M.mesh_sizes(o.mesh or r.mesh, W, where)
  local S = S0 * Cp -- (FSDP's shard group: dp_shard x cp)
  local f = r.fsdp
  local cfg = hf_config.model(r.model, where)
  if P > 1 then
    local why = llama.tp_check(cfg, P)
    if why then error(string.format("%s: mesh: %s", where, why), 0) end
  end
  -- the plan runs every layer on the counting device (0.65 ms and 65 KB
  -- each, llama70b's shape; 4096 layers take 3 s): refuse a depth no model
  -- has before it costs minutes
  if cfg.num_hidden_layers > M.max_layers then
    error(string.format("%s: model.num_hidden_layers = %d; at most %d are planned (the largest published models have a " ..
      "few hundred layers)", where, cfg.num_hidden_layers, M.max_layers), 0)
  end
  -- (tensor parallelism: tp rank 0's slices; every tp rank holds as many bytes)
  local model = llama.model(cfg, { checkpoint = f.checkpoint, recompute = f.recompute,
    tp = P > 1 and tpm.group(nil, P, 0) or nil, cp = Cp > 1 and tpm.group(nil, Cp, 0) or nil,
    cp_attention = r.train.cp_attention,
    tp_overlap = r.train.tp_overlap })
  local ok, a = pcall(shard.assign, model, { units = M.policy(f.units, where), zero = f.zero, offload = f.offload, hfsdp = f.hfsdp })
  if not ok then error(where .. ": fsdp.units: " .. tostring(a):gsub("^fully_shard: ", ""), 0) end
  local hf = f.hfsdp
  if hf and R == 1 then error(where .. ": fsdp.hfsdp = true needs a dp_outer mesh dimension above 1", 0) end
  local ces = f.param_dtype == "bf16" and 2 or 4
  local dp = S0 * R -- (data-parallel ranks: cp and tp ranks share theirs)
  local B, T = r.data.micro_batch, r.data.seq
  local okK, K = pcall(recipe.grad_accum, r, dp, where)
  local warnings = {}
  if not okK then -- the trainer refuses this; a plan still says what the rest would cost
    if o.strict then error(K, 0) end
    warnings[1] = tostring(K) .. "; planned with 1 micro-batch per step"
    K = 1
  end
  local p = { where = where, world = W, shard = S, dp_shard = S0, outer = R, tp = P, cp = Cp, hfsdp = hf, zero = f.zero, param_dtype = f.param_dtype,
    cfg = cfg, n_params = llama.num_params(cfg), units = {}, micro_batch = B, seq = T, grad_accum = K,
    checkpoint = f.checkpoint, recompute = f.recompute, prefetch = f.prefetch, max_live_units = f.max_live_units, assignment = a,
    mesh = type(o.mesh or r.mesh) == "string" and (o.mesh or r.mesh) or "custom", warnings = warnings, device = r.train.device,
    packed = r.data.pack or nil }
  local gpu = r.train.device == "cuda"
  -- the attention kernels' workspaces: as this GPU's cuDNN plans them
  -- (o.attention_workspace, from ops.attention_workspace), else estimated
  local ws = nil
  if gpu then
    ws = o.attention_workspace
    p.attention_workspace_from = ws and "cuDNN's plan on this GPU" or "estimated: no GPU asked"
    ws = ws or M.attention_workspace_estimate(cfg, B, T, f.param_dtype, os.getenv("FSDP_CUDNN_DETERMINISTIC") ~= "0")
    -- which attention runs (p.attention_impl, which the trainer sets): our
    -- own kernels take no workspace; cuDNN's backward takes one that grows
    -- with the square of the sequence, so past M.attention_workspace_max
    -- ("auto") ours run, and the plan says so
    local none = { forward = 0, backward = 0 }
    local choice = r.train.attention
    if r.data.pack then -- packed rows run our own kernels, which take no workspace (fsdp_cuda_attention_forward_docs)
      ws, p.attention_workspace_from = none, "none: packed rows run our own kernels"
    elseif Cp > 1 then
      ws, p.attention_workspace_from = none, "none: context parallelism runs our own kernels (queries at their positions)"
    elseif choice == "own" then
      ws, p.attention_workspace_from, p.attention_impl = none, "none: train.attention = 'own'", "own"
    elseif choice == "auto" and ws.backward > M.attention_workspace_max then
      p.attention_workspace_from = string.format("none: cuDNN's backward would take %s (it grows with the square of the " ..
        "sequence), above %s: our own kernels run (train.attention = 'auto')", pretty.bytes(ws.backward),
        pretty.bytes(M.attention_workspace_max))
      ws, p.attention_impl = none, "own"
    end
    p.attention_workspace = ws
  end
  local chunk = r.train.loss_chunk_mb * 2 ^ 20
  p.loss_rows = chunk > 0 and llama.loss_rows(B * T / Cp, cfg.vocab_size / P, gpu and ces or 4, chunk) or B * T
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
-- (fsdp.plan_fit.fits) or to print (fsdp.plan_render.render). o:
-- fully_shard's options as it takes them (units, zero, offload, hfsdp,
-- prefetch, max_live_units, mixed = {param_dtype, reduce_dtype},
-- micro_batches, separate_reduce, comm_register), and
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
  local S, R, P, Cp = M.mesh_sizes(mesh, W, where)
  if P > 1 or Cp > 1 then
    error(where .. ": mesh: plan_model plans data-parallel meshes; a tp or cp mesh is planned for a recipe (fsdp plan)", 0)
  end
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

return M

-- fsdp.preflight: a job refused before anything is allocated, saying why
-- and what would fit: the GPU it needs and the ranks that may share one,
-- the model's weights and optimizer state against the machine by
-- arithmetic (before a plan of an absurd model costs minutes), then the
-- planner's need per rank against the memory free now, with the single
-- changes of the recipe that plan less. And a schedule that never reaches
-- its learning rate, said.
local fsdp = require "fsdp"
local planner = require "fsdp.planner"
local plan_fit = require "fsdp.plan_fit"
local llama = require "fsdp.models.llama"
local schedule = require "fsdp.schedule"
local pretty = require "fsdp.pretty"
local ffi, C, check = fsdp.ffi, fsdp.C, fsdp.check
local gib = pretty.gib

local M = {}

-- The ranks of this node that share one GPU (its free memory and its peak
-- are divided among them): local_size / visible GPUs when every local rank
-- sees the node's GPUs (fsdprun, which binds none, or a launcher that sets
-- no CUDA_VISIBLE_DEVICES), but 1 when another launcher gives each task
-- its own (srun --gpus-per-task=1: one GPU visible, ndev = 1, while
-- local_size is 8; dividing by 8 would refuse recipes that fit and print
-- an MFU 8x too high). getenv: os.getenv (tests pass their own).
function M.ranks_per_gpu(local_size, ndev, getenv)
  getenv = getenv or os.getenv
  if ndev >= local_size then return 1 end
  local vis = getenv("CUDA_VISIBLE_DEVICES")
  if vis and vis ~= "" and not getenv("FSDPRUN") then return 1 end
  return math.ceil(local_size / ndev)
end

-- Ranks sharing a GPU are refused before NCCL sees them (it would refuse
-- them at the first group, "Duplicate GPU detected"), unless fsdprun's
-- --ranks-per-gpu test mode gave each its own NCCL host id. nil: allowed.
function M.gpu_sharing_refusal(per_gpu, local_size, ndev, getenv)
  getenv = getenv or os.getenv
  if per_gpu <= 1 or getenv("FSDPRUN_RANKS_PER_GPU") then return nil end
  return string.format("%d ranks on this node and %d GPU%s visible: %d ranks would share a GPU, which NCCL refuses. " ..
    "Start at most %d rank%s per node (or one GPU per task: srun --gpus-per-task=1); to check multi-rank GPU code on " ..
    "fewer GPUs (a test, not for speed), fsdprun --ranks-per-gpu %d", local_size, ndev, ndev == 1 and "" or "s", per_gpu,
    ndev, ndev == 1 and "" or "s", per_gpu)
end

-- A warmup as long as the run: the learning rate never reaches
-- optimizer.lr (a short test of a long recipe, or a mistake): say so, with
-- the rate it does reach. nil when the warmup ends inside the run.
function M.warmup_warning(r)
  local w, steps = r.schedule.warmup, r.train.steps
  if w < steps or steps < 1 then return nil end
  local o = r.optimizer
  local top = schedule.lr(steps, steps, { lr = o.lr, warmup = w, decay = r.schedule.decay, min_lr_ratio = r.schedule.min_lr_ratio })
  return string.format("schedule.warmup = %d is not below train.steps = %d: the learning rate rises to %.3g at the last " ..
    "step and never reaches optimizer.lr = %.3g", w, steps, top, o.lr)
end

-- train.device = "cuda": this rank's GPU selected, or the job refused
-- (no GPU here, with what the recipe would need on GPU machines; ranks
-- that would share one). Returns the ranks sharing this rank's GPU.
function M.select_gpu(r, where, info)
  if C.fsdp_device_available(C.FSDP_CUDA) ~= 1 then
    -- planned on this many ranks, or sharded over them all when the
    -- recipe's mesh needs more ranks than this job has
    local ok, p = pcall(planner.plan, r, { world = info.size, where = where })
    if not ok then p = planner.plan(r, { world = info.size, where = where, mesh = "dp_shard=-1" }) end
    local need = p.need
    error(string.format("%s: train.device = 'cuda', but no CUDA device can be used here (none is visible, or fsdp was " ..
      "built without CUDA). The recipe needs %.2f GiB per rank on %d ranks (params %.2f, grads %.2f, optimizer %.2f, unit " ..
      "buffers %.2f, activations %.2f). Run it on GPU machines, or try a small model with train.device=cpu.", where,
      gib(need.total), info.size, gib(need.params), gib(need.grads),
      gib(need.optimizer), gib(need.unit_buffers), gib(need.activations)), 0)
  end
  local ndev = C.fsdp_device_count(C.FSDP_CUDA)
  check(C.fsdp_device_set(C.FSDP_CUDA, info.local_rank % ndev), "select the GPU")
  local per = M.ranks_per_gpu(info.local_size, ndev)
  local why = M.gpu_sharing_refusal(per, info.local_size, ndev)
  if why then error(where .. ": train.device = 'cuda': " .. why, 0) end
  return per
end

-- Arithmetic first: a model far beyond this machine (its fp32 weights and
-- optimizer state alone, at best spread over every rank) is refused
-- before it is planned.
function M.floor(r, cfg, where, info)
  local floor = plan_fit.floor_bytes(cfg, r, info.size)
  local function total_of(dev)
    local free, total = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
    check(C.fsdp_device_memory_info(dev, free, total), "memory info")
    return tonumber(total[0])
  end
  local cuda = r.train.device == "cuda"
  local mem = total_of(C.FSDP_CPU) + (cuda and total_of(C.FSDP_CUDA) * C.fsdp_device_count(C.FSDP_CUDA) or 0)
  if floor * info.local_size > mem then
    error(string.format("%s: the model has %s parameters: its fp32 weights and %s state alone need %.1f GiB per rank over " ..
      "%d ranks, and this machine has %.1f GiB in all for its %d ranks. Check model.num_hidden_layers, hidden_size, " ..
      "intermediate_size and vocab_size, or use more machines.", where, pretty.count(llama.num_params(cfg)), r.optimizer.name,
      floor / 2 ^ 30, info.size, mem / 2 ^ 30, info.local_size), 0)
  end
end

-- The plan's need per rank against what this machine has free (on GPUs:
-- the device part against the GPU, the offloaded part against the host's
-- memory: plan_fit.fits); refused with only the changes that lower the
-- plan, each with what it plans and whether it then fits.
function M.memory(r, plan, where, info, ranks_per_device)
  local fits, why, bytes = plan_fit.fits(plan, { ranks = ranks_per_device, host_ranks = info.local_size,
    min_free_fraction = r.train.min_free_fraction })
  if fits then return end
  if bytes.host then error(why, 0) end
  local tips = {}
  for _, a in ipairs(plan_fit.advice(r, { world = info.size, where = where }, r.train.device == "cuda")) do
    tips[#tips + 1] = string.format("%s: %.2f GiB%s", a.change, gib(a.bytes), a.bytes <= bytes.have and " (fits)" or "")
  end
  error(why .. " " .. (#tips > 0 and "Each of these alone plans less per rank: " .. table.concat(tips, "; ") .. "." or
    "No single change of the recipe plans less: use more machines, or a smaller model."), 0)
end

-- A tp group is consecutive ranks (tp innermost); when the ranks per host
-- are no multiple of tp, some group spans two hosts and its collectives at
-- every layer cross the network: the warning for the first such group,
-- naming the boundary, or nil. (Hosts hold per_host ranks each, in order.)
function M.tp_span(tp, per_host, world, num_nodes)
  if tp <= 1 or num_nodes <= 1 or per_host % tp == 0 then return nil end
  for g0 = 0, world - 1, tp do
    local b = (math.floor(g0 / per_host) + 1) * per_host -- the next host's first rank
    if b < g0 + tp and b < world then
      return string.format("mesh tp = %d with %d ranks per host: the tp group of ranks %d-%d spans two hosts (the " ..
        "host boundary is between ranks %d and %d); its collectives at every layer then cross the network. Give a tp " ..
        "that divides the ranks per host.", tp, per_host, g0, g0 + tp - 1, b - 1, b)
    end
  end
end

return M

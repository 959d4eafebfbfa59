-- fsdp.dry_run: the activation memory of a training step, found by running
-- it. One micro-batch runs as train_step runs it (shard.micro_batch: the
-- model's own forward, loss and backward, under fsdp.autograd's rules) on
-- the counting device: every tensor is a meta tensor (shape, dtype, no
-- memory; fsdp.tensor), the ops do no work (fsdp.ops), and the bytes held
-- are counted from each allocation to its last use. So the peak is the one
-- the real step reaches on the allocator, to the byte (test_planner holds
-- the two equal), for Llama or any fsdp.nn model, with nothing written
-- twice: a change to a model changes its plan.
--
-- No unit schedule runs: the modules get empty bindings (parameters are
-- the units' buffers, which the planner counts from the engine's unit
-- plans), and a module's act_dtype is set as fully_shard's bind sets it.
--
--   local r = dry_run.step(model, { device = "cuda", act_dtype = "bf16", micro_batches = 4,
--     batch = function() return { x = fsdp.tensor({ 2, 64 }, "int32", "cuda"), y = ... } end,
--     forward_loss = llama.forward_loss(chunk) })   -- or loss = function(y, b, scale) ... end
--   r.activations, r.lasting, r.left
local tensor = require "fsdp.tensor"
local ops = require "fsdp.ops"
local shard = require "fsdp.shard"
local binding = require "fsdp.binding"
local tp = require "fsdp.tp"
local cp = require "fsdp.cp"

local M = {}

-- the ctx of a dry run: modules are bound to nothing (fsdp.binding; their
-- parameters' pointers are nil, no op reads them), and what this changes
-- on it are put back afterwards (touched). While c.trace is a table, each
-- call's entry and exit go there ({module, phase[, true on exit]}: the
-- order unit_schedule.replay replays).
local function counting_ctx(act_dtype, touched)
  local c = { dry = true }
  function c.enter(_, m, phase)
    if not touched[m] then touched[m] = binding.save(m) end
    binding.bind(m, {}, {}, act_dtype)
    if c.trace then c.trace[#c.trace + 1] = { m, phase or "forward" } end
  end
  function c.leave(_, m, phase)
    if c.trace then c.trace[#c.trace + 1] = { m, phase or "forward", true } end
  end
  return c
end

-- every tensor of a batch (a tensor, or a table of them) freed
local function free_batch(b)
  if type(b) ~= "table" then return end
  if getmetatable(b) == tensor.Tensor then return b:free() end
  for _, t in pairs(b) do free_batch(t) end
end

-- What one training step of model holds, from its micro-batches. o:
--   device        "cpu" or "cuda": whose bytes are counted (default "cpu")
--   act_dtype     the compute dtype bound modules get (fully_shard's
--                 param_dtype; CPU ops compute in fp32 regardless)
--   micro_batches K (default 1)
--   batch()       a micro-batch, {x = ..., y = ...}, made inside the count
--                 (its tensors are meta tensors; not counted as activations)
--   loss, forward_loss   as train_step's options
--   attention_workspace  {forward, backward} bytes of the GPU attention
--                 kernels (the step's shape: ops.attention_workspace)
-- Returns { activations = the peak above the step's start (with what the
-- micro-batches before the last leave until the step ends), lasting = the
-- bytes the first step makes for every later one (caches: Llama's rope
-- tables), left = what one micro-batch leaves until the step ends (a
-- GPU's loss sums), batch = the bytes of one micro-batch on the device,
-- tp_sent = {all_gather, reduce_scatter, all_reduce}: bytes one
-- micro-batch's tensor-parallel collectives send (fsdp.tp), cp_sent the
-- same of its context-parallel ones (fsdp.cp), trace = its module calls
-- in order (unit_schedule.replay) }.
function M.step(model, o)
  local K = o.micro_batches or 1
  local device = o.device or "cpu"
  if type(o.batch) ~= "function" then error("dry_run.step: batch must be a function returning a micro-batch", 2) end
  local touched = {}
  local ctx = counting_ctx(o.act_dtype or "fp32", touched)
  local opt = { loss = o.loss, forward_loss = o.forward_loss }
  local c = { device = device, allocated = 0, peak = 0 }
  local batch
  local function one()
    local before = c.allocated
    local b = o.batch()
    local start = c.allocated
    batch = start - before
    c.peak = start
    local loss = shard.micro_batch(model, ctx, b, K, opt)
    local peak, left = c.peak - start, c.allocated - start
    ops.value(loss) -- (a GPU's sums go)
    free_batch(b)
    return peak, left
  end
  ops.counting_workspace = o.attention_workspace
  local ok, r = pcall(tensor.counting, c, function()
    -- the first step makes what lasts (caches); the second is the one
    -- measured, as test_planner measures the real step after a first
    one()
    local lasting = c.allocated
    local was = {}
    for k, v in pairs(tp.sent) do was["tp" .. k] = v end
    for k, v in pairs(cp.sent) do was["cp" .. k] = v end
    ctx.trace = {}
    local peak, left = one()
    local trace = ctx.trace
    ctx.trace = nil
    -- (tensor and context parallelism: one micro-batch's collectives, bytes this rank sends)
    local tp_sent, cp_sent = {}, {}
    for k, v in pairs(tp.sent) do tp_sent[k] = v - was["tp" .. k] end
    for k, v in pairs(cp.sent) do cp_sent[k] = v - was["cp" .. k] end
    return { activations = peak + (K - 1) * left, lasting = lasting, left = left, batch = batch, tp_sent = tp_sent,
      cp_sent = cp_sent, trace = trace }
  end)
  ops.counting_workspace = nil
  -- the model as it was: no bindings of ours, no meta caches
  for m, was in pairs(touched) do binding.restore(m, was) end
  if model.release then model:release() end
  if not ok then error(r, 0) end
  return r
end

return M

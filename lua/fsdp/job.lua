-- fsdp.job: the trainer's job, declared. fsdp.train builds one table (the
-- recipe, the mesh, the data, the sharded model, the checkpoint manager)
-- and fsdp.train_loop works on it; every field it may hold is named here
-- with what it is, and the table refuses any other: a field read or
-- written under a name declared nowhere (a typo, or a field a change
-- forgot to declare) is an error naming it, not a silent nil.
-- A post-training script holds the same state through fsdp.engine (its
-- `sharded` and `cfg`); `engine` here is that engine over the run's model.
local M = {}

M.fields = {
  -- the recipe and the rank
  r = "the checked recipe (recipe.check), overrides applied",
  where = "the recipe's path, for messages",
  owned = "what fsdp.train must free when the job ends (the sharded model, the directory lock, training begun)",
  info = "fsdp.init()'s rank, size, local rank and size",
  device = "train.device: cpu or cuda",
  ranks_per_device = "ranks sharing one GPU (fsdprun --ranks-per-gpu), or the host's ranks",
  say = "say(fmt, ...): rank 0's line on stdout",
  progress = "progress(line): rank 0's progress line, redrawn in place",
  tty = "rank 0 writes to a terminal (the progress bar)",
  -- the shape of a step
  cfg = "the model's config (llama.config, Hugging Face LlamaConfig fields)",
  B = "data.micro_batch: rows per micro-batch",
  T = "data.seq: tokens per row",
  K = "micro-batches per step (train.grad_accum, or what keeps a resumed global batch)",
  tokens_step = "tokens per optimizer step over every rank (B x T x K x dp)",
  -- the mesh
  mesh = "the device mesh",
  shard = "the group FSDP shards over: dp_shard (x cp)",
  outer = "the dp_outer group (HSDP replicas), or nil",
  dp = "data-parallel ranks (dp_shard x dp_outer)",
  dp_rank = "this rank's place among them",
  tp = "the tp group's comm (tensor parallelism), or nil at tp = 1",
  tpg = "the tp group as the model takes it (fsdp.tp.group), or nil",
  cp = "the cp group's comm (context parallelism), or nil at cp = 1",
  cpg = "the cp group as the model takes it, or nil",
  restart = "fsdprun --max-restarts: which attempt this is (fsdp.restarts)",
  -- memory, before anything is allocated
  plan = "the planner's plan of this job (fsdp.planner)",
  need = "the plan's bytes per rank",
  -- data, model, weights
  ds = "the dataset (fsdp.data): windows, or packed rows",
  train_loader = "the training split's loader, at its resumed position",
  model = "the Llama model (fsdp.models.llama)",
  sharded = "the model sharded (fsdp.fully_shard)",
  engine = "fsdp.engine over the sharded model (the REPL's engine(), post-training's calls)",
  cm = "the checkpoint manager (fsdp.checkpoint_manager)",
  start = "the first step this run trains (after a resume, the one after the checkpoint's)",
  resumed = "the checkpoint resumed from, or nil",
  seed = "train.seed, or the resumed checkpoint's",
  stopped_loading = "a stop signal that came while the weights loaded",
  carried = "the tokenizer's files carried to checkpoints and the export (fsdp.hf_files)",
  carried_from = "the folder they came from",
  carry = "every file a checkpoint's hf/ folder and the export hold beside the weights",
  -- the loop
  last = "the last step this run trains (train.steps, or train.stop_after)",
  loss_fn = "train_step's loss over whole logits (train.loss_chunk_mb = 0)",
  forward_loss = "train_step's fused head and loss over chunks of rows",
  stats = "what the loop measured: times, tokens, losses, the peak",
  metrics = "rank 0's metrics file (fsdp.metrics), or nil",
  tensorboard = "rank 0's TensorBoard writer (fsdp.tensorboard), or nil",
  sampler = "the sampler of train.sample_tokens (fsdp.generate), or nil",
  sample_prompt = "its prompt's ids",
  flops_tok = "model FLOPs per token (the MFU's numerator)",
  the_peak = "the hardware's peak the MFU divides by (fsdp.peak)",
  gemm_rate = "a GEMM rate measured at the start (gemm_frac)",
  profile_step = "the step train.profile records, or nil",
  live = "the REPL's view of the live run (fsdprun --repl)",
  next_break = "the step the REPL stops at next, or nil",
  -- how it ended
  stopped = "the REPL ended the run",
  signalled = "{signal, step, saved} when a stop signal ended it",
}

-- A job table: the fields given, and every other declared field settable
-- later; any undeclared name, read or written, is an error naming it.
function M.new(init)
  local t, store = {}, {}
  for k, v in pairs(init or {}) do
    if not M.fields[k] then error("fsdp.job: field '" .. tostring(k) .. "' is not declared in lua/fsdp/job.lua", 2) end
    store[k] = v
  end
  return setmetatable(t, {
    __index = function(_, k)
      if M.fields[k] then return store[k] end
      error("fsdp.job: no field '" .. tostring(k) .. "' (lua/fsdp/job.lua declares the job's fields)", 2)
    end,
    __newindex = function(_, k, v)
      if not M.fields[k] then error("fsdp.job: field '" .. tostring(k) .. "' is not declared in lua/fsdp/job.lua", 2) end
      store[k] = v
    end,
  })
end

return M

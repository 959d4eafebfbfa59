-- llama70b.lua: Llama 3 70B (80 layers, hidden 8192, 64 heads / 8 kv heads,
-- SwiGLU 28672, vocab 128256, rope theta 500000), 70.55B parameters.
-- ZeRO-3 over every GPU, bf16 params, fp32 gradient reduction, full
-- activation checkpointing; 4M-token global batches of 8192-token sequences.
-- The optimizer state is offloaded to host memory (fsdp.offload = true):
-- on 4 nodes of 8 80 GB GPUs that leaves the most room for longer sequences
-- and larger micro-batches; fsdp.offload=false plans within a few GiB of
-- what the pre-flight check allows there, and fits easily from 8 nodes on.
-- What each choice plans per GPU and in host memory, at 16 to 64 GPUs:
-- docs/PLANNING.md (the suite holds those figures to the planner), or
-- `fsdp plan recipes/llama70b.lua --world 32 train.device=cuda`.
--   srun --mpi=pmix -N 4 --ntasks-per-node 8 fsdp recipes/llama70b.lua data.token_file=/data/train.bin
return {
  model = { preset = "llama3_70b" },
  mesh = "dp_shard=-1",
  fsdp = { zero = 3, units = "default", meta_init = true, prefetch = 1, max_live_units = 2, checkpoint = "full",
    param_dtype = "bf16", reduce_dtype = "fp32", offload = true },
  optimizer = { name = "adamw", lr = 1.5e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 1.0 },
  schedule = { warmup = 2000, decay = "cosine", min_lr_ratio = 0.1 },
  data = { token_file = "data/train.bin", val_token_file = "data/val.bin", seq = 8192, micro_batch = 1 },
  train = { steps = 100000, global_batch_tokens = 4194304, seed = 1234, eval_every = 1000, eval_batches = 16,
    log_every = 1, metrics = "runs/llama70b/metrics.jsonl", device = "cuda", resume = "auto" },
  -- every 500 steps in the background; a new job resumes where the last
  -- one stopped (docs/CHECKPOINTS.md)
  checkpoint = { dir = "runs/llama70b/ckpt", every = 500, keep_last = 3, async = true },
}

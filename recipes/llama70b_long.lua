-- llama70b_long.lua: Llama 3.1 70B (128k positions through Llama-3 rope
-- scaling) trained on 131072-token sequences on 512 GPUs (64 nodes of 8):
-- context parallelism over 8 ranks (each holds 2 of a sequence's 16
-- chunks, 16384 tokens: every per-token layer on 1/8 of the sequence,
-- attention all-gathering the keys and values), tensor parallelism over
-- the 8 GPUs of a node (heads, MLP and vocabulary split; norms and
-- residuals on 1/8 of the rows), FSDP over dp_shard x cp = 64 ranks;
-- 32 sequences (4M tokens) per step as 4 micro-batches on each of the 8
-- data-parallel groups. No attention workspace: context parallelism runs
-- our own kernels, whose memory grows linearly with the sequence.
-- What it plans per GPU: docs/PLANNING.md ("Long sequences"), or
--   fsdp plan recipes/llama70b_long.lua --world 512
-- (tensor and context parallelism are checked on CPU ranks; their GPU path
-- has not run on a GPU yet: scripts/gpu_check.sh, stage tp_cp)
--   srun --mpi=pmix -N 64 --ntasks-per-node 8 fsdp recipes/llama70b_long.lua data.token_file=/data/long.bin
return {
  model = { preset = "llama3_1_70b" },
  mesh = "dp_shard=8,cp=8,tp=8",
  fsdp = { zero = 3, units = "default", meta_init = true, prefetch = 1, max_live_units = 2, checkpoint = "full",
    param_dtype = "bf16", reduce_dtype = "fp32", offload = true },
  optimizer = { name = "adamw", lr = 1.5e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 1.0 },
  schedule = { warmup = 200, decay = "cosine", min_lr_ratio = 0.1 },
  data = { token_file = "data/train.bin", val_token_file = "data/val.bin", seq = 131072, micro_batch = 1 },
  train = { steps = 2000, global_batch_tokens = 4194304, seed = 1234, eval_every = 200, eval_batches = 4,
    log_every = 1, metrics = "runs/llama70b_long/metrics.jsonl", device = "cuda", resume = "auto" },
  checkpoint = { dir = "runs/llama70b_long/ckpt", every = 100, keep_last = 3, async = true },
}

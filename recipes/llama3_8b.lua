-- llama3_8b.lua: Llama 3 8B (Hugging Face meta-llama/Meta-Llama-3-8B shapes:
-- 32 layers, hidden 4096, 32 heads / 8 kv heads, SwiGLU 14336, vocab 128256,
-- rope theta 500000), 8.03B parameters, ZeRO-3 with bf16 params and fp32
-- reduction, full activation checkpointing, on GPU ranks:
--   fsdprun -n 8 recipes/llama3_8b.lua data.token_file=/data/fineweb_train.bin
-- Data: pre-tokenised Llama 3 token files (llm.c format, uint32 ids).
-- Its plan per GPU: `fsdp plan recipes/llama3_8b.lua --world 8 train.device=cuda`.
return {
  model = { preset = "llama3_8b" },
  mesh = "dp_shard=-1",
  fsdp = { zero = 3, units = "default", meta_init = true, prefetch = 1, max_live_units = 2, checkpoint = "full",
    param_dtype = "bf16", reduce_dtype = "fp32" },
  optimizer = { name = "adamw", lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 1.0 },
  schedule = { warmup = 2000, decay = "cosine", min_lr_ratio = 0.1 },
  data = { token_file = "data/train.bin", val_token_file = "data/val.bin", seq = 8192, micro_batch = 1 },
  train = { steps = 100000, global_batch_tokens = 4194304, seed = 1234, eval_every = 1000, eval_batches = 16,
    log_every = 1, metrics = "runs/llama3_8b/metrics.jsonl", device = "cuda" },
}

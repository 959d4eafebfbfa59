-- llama4b_offload.lua: the offload benchmark's model, a Llama-3-style 4.4B
-- (hidden 3072, 40 layers, 24 heads / 8 kv heads of 128, SwiGLU 8192,
-- vocab 128256, tied embeddings), sequence 4096, bf16, zero 3, activation
-- checkpointing, one GPU. In place it needs about 85 GiB (`fsdp plan
-- bench/llama4b_offload.lua --world 1 fsdp.offload=false`): more than an
-- 80 GB GPU has; with the optimizer offloaded about 36 GiB stay on the
-- device and 74 GiB go to pinned host memory. bench/llama_vs_fsdp2.sh
-- --offload trains it here and with PyTorch FSDP2's CPUOffloadPolicy.
return {
  model = {
    hidden_size = 3072, intermediate_size = 8192, num_attention_heads = 24, num_key_value_heads = 8, head_dim = 128,
    num_hidden_layers = 40, vocab_size = 128256, max_position_embeddings = 4096, rope_theta = 500000,
    rms_norm_eps = 1e-5, tie_word_embeddings = true,
  },
  mesh = "dp_shard=-1",
  fsdp = { zero = 3, units = "default", prefetch = 1, max_live_units = 2, checkpoint = "full", param_dtype = "bf16",
    reduce_dtype = "fp32", offload = true },
  optimizer = { name = "adamw", lr = 3e-4, beta1 = 0.9, beta2 = 0.95, weight_decay = 0.1, clip = 1.0 },
  schedule = { warmup = 2, decay = "cosine" },
  data = { corpus = { include = { "README.md", "docs/*.md", "src/*.h", "src/*/*.c", "lua/fsdp/*.lua" } }, seq = 4096,
    micro_batch = 1, val_fraction = 0.05 },
  train = { steps = 6, device = "cuda", log_every = 1, metrics = "runs/bench/llama4b_offload.jsonl" },
}

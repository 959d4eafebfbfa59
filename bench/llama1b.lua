-- llama1b.lua: the benchmark model, Llama 3.2 1B's shape (hidden 2048, 16
-- layers, 32 heads / 8 kv heads, SwiGLU 8192, vocab 128256, tied
-- embeddings, 1.24B parameters), sequence 4096, bf16, zero 3, one GPU.
-- bench/llama_vs_fsdp2.sh trains it here and with PyTorch FSDP2 side by side.
return {
  model = {
    hidden_size = 2048, intermediate_size = 8192, num_attention_heads = 32, num_key_value_heads = 8,
    num_hidden_layers = 16, vocab_size = 128256, max_position_embeddings = 4096, rope_theta = 500000,
    rms_norm_eps = 1e-5, tie_word_embeddings = true,
  },
  mesh = "dp_shard=-1",
  fsdp = { zero = 3, units = "default", prefetch = 1, max_live_units = 2, checkpoint = "none", param_dtype = "bf16",
    reduce_dtype = "fp32" },
  optimizer = { name = "adamw", lr = 3e-4, beta1 = 0.9, beta2 = 0.95, weight_decay = 0.1, clip = 1.0 },
  schedule = { warmup = 2, decay = "cosine" },
  data = { corpus = { include = { "README.md", "docs/*.md", "src/*.h", "src/*/*.c", "lua/fsdp/*.lua" } }, seq = 4096,
    micro_batch = 1, val_fraction = 0.05 },
  train = { steps = 8, device = "cuda", log_every = 1, metrics = "runs/bench/llama1b.jsonl" },
}

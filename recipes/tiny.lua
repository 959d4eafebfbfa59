-- tiny.lua: the demo. A small Llama (byte-level vocabulary, 4 layers,
-- grouped-query attention) trained on this project's own documentation and
-- sources, sharded with ZeRO-3 over the CPU ranks fsdprun starts:
--   fsdprun -n 2 recipes/tiny.lua                 (about a minute on 2 cores)
--   fsdprun -n 2 recipes/tiny.lua train.steps=50 fsdp.zero=2
-- The loss starts near ln 256 = 5.55 (uniform over bytes) and falls well
-- below it; each evaluation prints a sample of what the model writes. Metrics go to runs/tiny/metrics.jsonl (plot them with
-- scripts/plot_metrics.sh runs/tiny/metrics.jsonl runs/tiny/metrics.png).
return {
  model = {
    hidden_size = 128, intermediate_size = 352, num_attention_heads = 4, num_key_value_heads = 2,
    num_hidden_layers = 4, vocab_size = 256, max_position_embeddings = 512, rope_theta = 10000,
    rms_norm_eps = 1e-5, tie_word_embeddings = false,
  },
  mesh = "dp_shard=-1",
  fsdp = { zero = 3, units = "default", meta_init = true, prefetch = 1, max_live_units = 2, checkpoint = "none" },
  optimizer = { name = "adamw", lr = 3e-3, beta1 = 0.9, beta2 = 0.95, weight_decay = 0.1, clip = 1.0 },
  schedule = { warmup = 10, decay = "cosine", min_lr_ratio = 0.1 },
  data = {
    corpus = { include = { "README.md", "docs/*.md", "src/*.h", "src/*/*.c", "lua/fsdp/*.lua", "recipes/*.lua" } },
    seq = 128, micro_batch = 8, val_fraction = 0.05,
  },
  train = { steps = 400, grad_accum = 1, seed = 1234, eval_every = 100, eval_batches = 4, log_every = 20,
    metrics = "runs/tiny/metrics.jsonl", sample_tokens = 64, sample_prompt = "The shard" },
}

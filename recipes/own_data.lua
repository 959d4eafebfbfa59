-- own_data.lua: from a folder of text to a model that writes it, the path a
-- user follows with their own data (docs/TRAINING.md, "From your own text to
-- a model"): a byte-level BPE tokenizer trained by Hugging Face `tokenizers`
-- on this project's docs, the docs tokenized with it, a small Llama trained
-- on 2 CPU ranks (a sample printed at each evaluation), a checkpoint, and an
-- export that transformers loads with its tokenizer:
--   build/fsdp prepare train-tokenizer --vocab-size 2048 --out runs/own/tokenizer README.md docs/*.md
--   build/fsdp prepare --tokenizer runs/own/tokenizer --out runs/own/data README.md docs/*.md
--   build/fsdprun -n 2 recipes/own_data.lua
--   build/fsdp generate runs/own/ckpt --prompt "The shard" --max-new-tokens 60
-- With a downloaded Llama instead: its folder as --tokenizer, and
-- model = { from_hf = "models/Llama-3.2-1B" } below (the architecture and
-- weights: a fine-tune); the trainer checks that the data was tokenized
-- with that folder's tokenizer.json.
return {
  model = {
    hidden_size = 128, intermediate_size = 352, num_attention_heads = 4, num_key_value_heads = 2,
    num_hidden_layers = 4, vocab_size = 2048, max_position_embeddings = 512, rope_theta = 10000,
    rms_norm_eps = 1e-5, tie_word_embeddings = true,
  },
  mesh = "dp_shard=-1",
  fsdp = { zero = 3 },
  optimizer = { name = "adamw", lr = 3e-3, weight_decay = 0.1, clip = 1.0 },
  schedule = { warmup = 10, decay = "cosine", min_lr_ratio = 0.1 },
  data = { token_file = "runs/own/data/train.bin", val_token_file = "runs/own/data/val.bin", seq = 128, micro_batch = 8 },
  train = { steps = 300, eval_every = 100, eval_batches = 2, log_every = 20, metrics = "runs/own/metrics.jsonl",
    sample_tokens = 40, sample_prompt = "The shard" },
  checkpoint = { dir = "runs/own/ckpt", every = 100, export_hf = "runs/own/export", export_dtype = "fp32" },
}

-- sft_chat.lua: supervised fine-tuning of a Hugging Face model on chat
-- conversations (docs/TRAINING.md, "Post-training: chat SFT"). The
-- conversations (JSONL, Hugging Face's `messages` format) are rendered
-- with the model folder's own chat template and tokenized by `fsdp prepare
-- --chat`, which also writes which tokens are the assistant's (the loss
-- mask) and where each conversation starts; the trainer packs whole
-- conversations into rows of data.seq (none sees another) and trains on
-- the assistant's tokens alone. Here on 2 CPU ranks, from a small model of
-- this project's docs (recipes/own_data.lua, with a ChatML tokenizer) to one
-- that answers in the chat format, on recipes/data/chat_arith.jsonl (made by
-- recipes/data/make_chat_arith.py):
--   build/fsdp prepare train-tokenizer --vocab-size 2048 --chat-template chatml --out runs/chat/tokenizer README.md docs/*.md
--   build/fsdp prepare --tokenizer runs/chat/tokenizer --out runs/chat/data README.md docs/*.md
--   build/fsdprun -n 2 recipes/own_data.lua data.token_file=runs/chat/data/train.bin data.val_token_file=runs/chat/data/val.bin checkpoint.dir=runs/chat/base_ckpt checkpoint.export_hf=runs/chat/base train.metrics=runs/chat/base.jsonl
--   build/fsdp prepare --chat --tokenizer runs/chat/base --out runs/chat/sft_data recipes/data/chat_arith.jsonl
--   build/fsdprun -n 2 recipes/sft_chat.lua
--   build/fsdp generate runs/chat/sft --greedy --prompt $'<|im_start|>user\nWhat is 12 plus 30?<|im_end|>\n<|im_start|>assistant\n'
-- With a downloaded chat model instead: its folder as --tokenizer of the
-- fourth command and as model.from_hf below (the trainer checks that the
-- data was tokenized with that folder's tokenizer.json).
return {
  model = { from_hf = "runs/chat/base" },
  mesh = "dp_shard=-1",
  fsdp = { zero = 3 },
  optimizer = { name = "adamw", lr = 1e-3, weight_decay = 0.0, clip = 1.0 },
  schedule = { warmup = 5, decay = "cosine", min_lr_ratio = 0.1 },
  -- data.pack is on for chat data (a loss mask beside the token file)
  data = { token_file = "runs/chat/sft_data/train.bin", val_token_file = "runs/chat/sft_data/val.bin", seq = 128,
    micro_batch = 4 },
  train = { steps = 120, eval_every = 60, eval_batches = 2, log_every = 20, metrics = "runs/chat/sft.jsonl",
    sample_tokens = 16, sample_temperature = 0.1,
    sample_prompt = "<|im_start|>user\nWhat is 12 plus 30?<|im_end|>\n<|im_start|>assistant\n" },
  checkpoint = { dir = "runs/chat/sft_ckpt", every = 120, export_hf = "runs/chat/sft", export_dtype = "fp32" },
}

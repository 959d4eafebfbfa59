"""The PyTorch FSDP2 side of bench/cpu_vs_fsdp2.sh, on CPU ranks over gloo:
a Hugging Face LlamaForCausalLM of the given shape, fp32, fully_shard per
decoder layer and at the root (ZeRO-3, as our recipe's fsdp.zero = 3),
AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1, clip 1.0 as
recipes/tiny.lua), batch x seq tokens per rank of random ids, torch threads
= cores / ranks (each of our ranks gets the same share). Started by
torch.distributed.run; rank 0 prints one JSON line: tokens_per_s over all
ranks (the median step after the first), step seconds.
  python3 -m torch.distributed.run --nproc-per-node N bench/fsdp2_llama_cpu.py \
     STEPS BATCH SEQ HIDDEN INTER LAYERS HEADS KV_HEADS VOCAB TIED"""
import json, os, statistics, sys, time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

steps, B, T, h, inter, layers, heads, kv, vocab = (int(a) for a in sys.argv[1:10])
tied = sys.argv[10] == "1"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
torch.manual_seed(1234)
cfg = LlamaConfig(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=max(T, 512), rope_theta=10000.0,
                  rms_norm_eps=1e-5, tie_word_embeddings=tied, attn_implementation="sdpa")
model = LlamaForCausalLM(cfg)
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
g = torch.Generator().manual_seed(rank)
times = []
for step in range(steps):
    ids = torch.randint(0, vocab, (B, T), generator=g)
    t0 = time.perf_counter()
    out = model(input_ids=ids, labels=ids)  # (the model shifts the labels)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss = out.loss.detach()
    dist.all_reduce(loss)
    times.append(time.perf_counter() - t0)
if rank == 0:
    med = statistics.median(times[1:])
    print(json.dumps({"tokens_per_s": world * B * T / med, "step_s": med, "loss": loss.item() / world}))
dist.destroy_process_group()

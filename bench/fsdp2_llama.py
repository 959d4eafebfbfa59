"""The PyTorch FSDP2 side of bench/llama_vs_fsdp2.sh: the same model shape
(Hugging Face LlamaForCausalLM built from the recipe's fields: bench/llama1b.lua,
or bench/llama4b_offload.lua with --offload), the same batch, byte-level
tokens from the same files, fully_shard per decoder layer and at the root
with bf16 params and fp32 reductions; fused AdamW on the GPU, or with
--offload CPUOffloadPolicy (params, grads and the optimizer on the host,
AdamW on the CPU) and activation checkpointing, as the recipe has.
Prints one JSON line: tokens_per_s (steps after the first), peak memory.
  python3 bench/fsdp2_llama.py STEPS SEQ [--offload]"""
import glob, json, os, sys, time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

steps, seq = int(sys.argv[1]), int(sys.argv[2])
offload = "--offload" in sys.argv[3:]
# the recipes' shapes (bench/llama1b.lua, bench/llama4b_offload.lua)
shape = dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=40, num_attention_heads=24,
             num_key_value_heads=8, head_dim=128) if offload else \
    dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29511")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("nccl")
torch.cuda.set_device(0)
cfg = LlamaConfig(**shape, vocab_size=128256, max_position_embeddings=seq, rope_theta=500000.0,
                  rms_norm_eps=1e-5, tie_word_embeddings=True, attn_implementation="sdpa")
# offload: built on the host (the fp32 model does not fit the GPU), sharded there
with torch.device("cpu" if offload else "cuda"):
    model = LlamaForCausalLM(cfg)
if offload:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
extra = {"offload_policy": CPUOffloadPolicy(pin_memory=True)} if offload else {}
for layer in model.model.layers:
    fully_shard(layer, mp_policy=mp, **extra)
fully_shard(model, mp_policy=mp, **extra)
# fused AdamW runs on the GPU; with the params on the host, the CPU foreach one
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                        **({"foreach": True} if offload else {"fused": True}))

files = sorted(set(sum((glob.glob(p) for p in ["README.md", "docs/*.md", "src/*.h", "src/*/*.c", "lua/fsdp/*.lua"]), [])))
data = torch.tensor(list(b"\n\n".join(open(f, "rb").read() for f in files)), dtype=torch.long)
torch.cuda.reset_peak_memory_stats()
times = []
for step in range(steps):
    off = (step * seq) % (len(data) - seq - 1)
    x = data[off:off + seq].view(1, seq).cuda()
    y = data[off + 1:off + seq + 1].view(1, seq).cuda()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    logits = model(input_ids=x).logits
    loss = F.cross_entropy(logits.view(-1, cfg.vocab_size).float(), y.view(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    print(f"fsdp2 step {step + 1}: loss {loss.item():.4f}, {times[-1]:.3f} s", flush=True)
tps = seq * (len(times) - 1) / sum(times[1:])
print(json.dumps({"engine": "pytorch-fsdp2", "tokens_per_s": tps, "peak_bytes": torch.cuda.max_memory_allocated(),
                  "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                  "offload": offload, "torch": torch.__version__}))
dist.destroy_process_group()

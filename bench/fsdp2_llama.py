"""The PyTorch FSDP2 side of bench/llama_vs_peer.sh: the same model shape
(Hugging Face LlamaForCausalLM built from the recipe's fields: bench/llama1b.lua,
or bench/llama4b_offload.lua with --offload), the same batch, byte-level
tokens from the same files, fully_shard per decoder layer and at the root
with bf16 params and fp32 reductions; fused AdamW on the GPU, or with
--offload CPUOffloadPolicy (params, grads and the optimizer on the host,
AdamW on the CPU) and activation checkpointing, as the recipe has.
Prints one JSON line: tokens_per_s (steps after the first), peak memory.
  python3 bench/fsdp2_llama.py STEPS SEQ [--offload] [--cpu-smoke]"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc

args = pc.Args(sys.argv[1:])
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from transformers import LlamaForCausalLM

pc.init_dist(args)
cfg = pc.llama_config(args)
# offload: built on the host (the fp32 model does not fit the GPU), sharded there
with torch.device("cpu" if args.offload else args.device):
    model = LlamaForCausalLM(cfg)
if args.offload:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
extra = {"offload_policy": CPUOffloadPolicy(pin_memory=not args.smoke)} if args.offload else {}
for layer in model.model.layers:
    fully_shard(layer, mp_policy=mp, **extra)
fully_shard(model, mp_policy=mp, **extra)
# fused AdamW runs on the GPU; with the params on the host, the CPU foreach one
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                        **({"foreach": True} if args.offload or args.smoke else {"fused": True}))


def step(x, y):
    loss = pc.lm_loss(model(input_ids=x).logits, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


tps = pc.timed_loop("fsdp2", args, step)
pc.report("pytorch-fsdp2", args, tps)
torch.distributed.destroy_process_group()

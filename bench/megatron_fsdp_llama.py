"""The Megatron-FSDP side of bench/llama_vs_peer.sh (PyPI megatron-fsdp,
0.6.1 as scripts/peer_wheels.sh fetches it): the same Hugging Face
LlamaForCausalLM, batch, tokens and loop as bench/fsdp2_llama.py, sharded
by megatron_fsdp.fully_shard, model and optimizer together as its README
shows:
- ZeRO-3 ("optim_grads_params"), each LlamaDecoderLayer an FSDP unit;
- bf16 compute params (the module is cast to bf16: its native dtype is
  the compute dtype), fp32 main params for the optimizer, gradients
  accumulated and reduced in fp32 (main_grads_dtype, grad_comm_dtype);
- gradient reduce-scatter and param all-gather overlapped (its defaults),
  per-token loss (no gradient scaling pass: the Megatron-FSDP user guide's
  recommendation, the same gradients on one rank);
- its persistent double buffers for the units' gathers (fsdp_double_buffer,
  recommended by the guide; MFSDP_DOUBLE_BUFFER=0 turns them off), falling
  back to its allocator for a bucket that does not fit them (the root's
  embedding is larger than a layer); nccl_ub is left off: its README says
  it takes effect only inside Megatron-Core;
- torch's fused AdamW (no TransformerEngine here) wrapped by its
  optimizer hooks (fully_shard_optimizer, through fully_shard).
Gradient clipping as Megatron-LM clips: the norm over each rank's local
fp32 gradient shards, summed over the ranks. No CPU offload: fully_shard
0.6.1 has none, so --offload exits 3 saying so.
  python3 bench/megatron_fsdp_llama.py STEPS SEQ [--cpu-smoke]"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc

args = pc.Args(sys.argv[1:])
if args.offload:
    print("megatron_fsdp: no CPU offload in megatron_fsdp.fully_shard 0.6.1", file=sys.stderr)
    sys.exit(3)
mfsdp = pc.need("megatron_fsdp", "megatron_fsdp")
import torch
import torch.distributed as dist
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

pc.init_dist(args)
cfg = pc.llama_config(args)
with torch.device(args.device):
    model = LlamaForCausalLM(cfg)
# params only: the rotary buffer stays fp32, as FSDP2 and ours keep it
for p in model.parameters():
    p.data = p.data.to(torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                        **({"foreach": True} if args.smoke else {"fused": True}))
double_buffer = os.environ.get("MFSDP_DOUBLE_BUFFER", "1") == "1"
# its own mesh would be a CUDA one; a CPU mesh takes --cpu-smoke past that
# to the first thing Megatron-FSDP itself needs CUDA for
mesh = {}
if args.smoke:
    from torch.distributed.device_mesh import init_device_mesh
    mesh = dict(device_mesh=init_device_mesh("cpu", (1, 1), mesh_dim_names=("fsdp", "tp")), dp_shard_dim="fsdp",
                tp_dim="tp")
model, opt = mfsdp.fully_shard(
    model, opt, fsdp_unit_modules=[LlamaDecoderLayer], zero_dp_strategy="optim_grads_params",
    mixed_precision_policy=mfsdp.MixedPrecisionPolicy(main_params_dtype=torch.float32,
                                                      main_grads_dtype=torch.float32,
                                                      grad_comm_dtype=torch.float32),
    calculate_per_token_loss=True, fsdp_double_buffer=double_buffer,
    fsdp_db_use_persist_buf_on_alloc_fail=double_buffer, **mesh)
params = [p for g in opt.param_groups for p in g["params"]]


@torch.no_grad()
def clip(max_norm):
    grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params if p.grad is not None]
    sq = torch.stack([g.float().norm() for g in grads]).square().sum()
    dist.all_reduce(sq)
    coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, coef)


def step(x, y):
    loss = pc.lm_loss(model(input_ids=x).logits, y)
    loss.backward()
    clip(1.0)
    opt.step()
    opt.zero_grad()
    return loss


tps = pc.timed_loop("megatron_fsdp", args, step)
pc.report("megatron-fsdp", args, tps, megatron_fsdp=mfsdp.__version__, double_buffer=double_buffer)
dist.destroy_process_group()

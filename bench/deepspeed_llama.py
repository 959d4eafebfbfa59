"""The DeepSpeed side of bench/llama_vs_peer.sh (PyPI deepspeed, the
version scripts/peer_wheels.sh builds): the same Hugging Face
LlamaForCausalLM, batch, tokens and loop as bench/fsdp2_llama.py, under
deepspeed.initialize with the config its docs give for ZeRO-3:
- ZeRO stage 3, the model built inside deepspeed.zero.Init (partitioned
  as it is made, through transformers' HfDeepSpeedConfig), bf16 with fp32
  master weights, gradients reduced in fp32 (communication_data_type;
  DeepSpeed's bf16 default would reduce in bf16), overlap_comm and
  contiguous_gradients, its default buckets;
- AdamW from the config: DeepSpeed's FusedAdam, which its JIT compiles on
  first use; where that cannot build, torch's fused AdamW (torch_adam),
  the error printed; the JSON line names the one that ran;
- gradient clipping 1.0 by the engine (gradient_clipping).
--offload: ZeRO-Offload of the optimizer and the params to pinned host
memory (offload_optimizer, offload_param), its CPU Adam (DeepSpeedCPUAdam,
JIT-compiled) or, where that cannot build, torch's AdamW on the host
(zero_force_ds_cpu_optimizer off); activation checkpointing as the recipe.
DS_OFFLOAD_PARAM=0 offloads the optimizer only. --cpu-smoke: DeepSpeed's
CPU accelerator (DS_ACCELERATOR=cpu) and gloo, where its JIT builds the
CPU twins of FusedAdam and CPU Adam.
  python3 bench/deepspeed_llama.py STEPS SEQ [--offload] [--cpu-smoke]"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc

args = pc.Args(sys.argv[1:])
if args.smoke:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
ds = pc.need("deepspeed", "deepspeed")
import torch
from transformers import AutoModelForCausalLM

pc.init_dist(args)


def builds(builder):
    """Whether DeepSpeed's JIT builds (or finds) the op; prints why not."""
    try:
        builder().load()
        return True
    except Exception as e:
        print(f"deepspeed: {builder.__name__} does not build: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return False


adamw = dict(lr=3e-4, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1)
zero = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True}
config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
          "bf16": {"enabled": True}, "communication_data_type": "fp32", "zero_optimization": zero,
          "steps_per_print": 1 << 30, "wall_clock_breakdown": False}
if args.offload:
    pin = not args.smoke
    zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if os.environ.get("DS_OFFLOAD_PARAM", "1") == "1":
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
if args.offload:
    from deepspeed.ops.op_builder import CPUAdamBuilder
    optimizer = "DeepSpeedCPUAdam" if builds(CPUAdamBuilder) else "torch.optim.AdamW (host)"
    if optimizer != "DeepSpeedCPUAdam":
        adamw["torch_adam"] = True
        config["zero_force_ds_cpu_optimizer"] = False
else:
    from deepspeed.ops.op_builder import FusedAdamBuilder
    optimizer = "FusedAdam" if builds(FusedAdamBuilder) else "torch.optim.AdamW (fused)"
    if optimizer != "FusedAdam":
        adamw.update(torch_adam=True, fused=True)
config["optimizer"] = {"type": "AdamW", "params": adamw}

cfg = pc.llama_config(args)
# Hugging Face's own way to ZeRO-3 outside its Trainer: with this object
# alive, from_config builds the model inside deepspeed.zero.Init and
# initialises the weights gathered (a bare zero.Init would leave them at
# torch's defaults: loss 60, not 5.5). It needs accelerate; without it the
# model is built whole and deepspeed.initialize partitions it.
try:
    from transformers.integrations import HfDeepSpeedConfig
    hf_ds = HfDeepSpeedConfig(config)
    init = "zero.Init"
except Exception as e:
    print(f"deepspeed: model built whole, then partitioned: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    init = "whole"
model = AutoModelForCausalLM.from_config(cfg)
if args.offload:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
engine, _, _, _ = ds.initialize(model=model, model_parameters=model.parameters(), config=config)


def step(x, y):
    loss = pc.lm_loss(engine(input_ids=x).logits, y)
    engine.backward(loss)
    engine.step()
    return loss


tps = pc.timed_loop("deepspeed", args, step)
pc.report("deepspeed", args, tps, deepspeed=ds.__version__, optimizer=optimizer, init=init,
          offload_param="offload_param" in zero)
torch.distributed.destroy_process_group()

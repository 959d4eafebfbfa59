"""hf_transformers_logits.py DIR OURS: loads the Hugging Face folder DIR with
transformers' LlamaForCausalLM (float64), runs it on the ids in OURS (written
by tests/lua/hf_logits.lua: B*T ids, then the logits) and compares the
logits. Passes when the largest difference is under 1e-4 of the largest
logit (fp32 arithmetic against float64). Exit 77: torch or transformers
missing. In one process (hf_jobs.py) transformers' logits of a folder on
the same ids are computed once: the checks of one folder imported at
several meshes compare against the same run.
hf_transformers_logits.py --make DIR FROM [llama3]: writes DIR with
transformers' save_pretrained: a LlamaForCausalLM of FROM's config.json with
random weights (seed 0), as a model from the Hub would come; "llama3": with
Llama 3.1's rotary scaling (rope_type llama3, rope_theta 500000; original
context 64 so that it turns most rotary pairs at these 48 positions) and a
head_dim (48) that is not hidden_size / heads (32)."""
import sys

try:
    import torch
    from transformers import LlamaForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)


def make(out, src, variant=None):
    from transformers import LlamaConfig
    torch.manual_seed(0)
    cfg = LlamaConfig.from_pretrained(src)
    if variant == "llama3":
        cfg = LlamaConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                          num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                          num_hidden_layers=cfg.num_hidden_layers, vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps,
                          max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=False, head_dim=48,
                          rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():  # the default init's norms are all ones: perturb them too
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    m.save_pretrained(out)
    print(f"written {out} ({sum(p.numel() for p in m.parameters())} parameters)")
    return 0


_refs = {}  # transformers' logits by (folder, ids)


def compare(d, ours_path):
    B, T = 2, 48
    vals = [float(l) for l in open(ours_path)]
    ids = torch.tensor([int(v) for v in vals[: B * T]]).view(B, T)
    ours = torch.tensor(vals[B * T :], dtype=torch.float64)
    key = (d, tuple(ids.reshape(-1).tolist()))
    if key not in _refs:  # (one load and forward per folder and ids in a process: tests/scripts/hf_jobs.py)
        model = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float64)
        model.eval()
        with torch.no_grad():
            _refs[key] = model(ids).logits.reshape(-1)
    ref = _refs[key]
    if ref.numel() != ours.numel():
        print(f"FAILED: {ours.numel()} logits from fsdp, {ref.numel()} from transformers")
        return 1
    scale = ref.abs().max().item()
    err = (ref - ours).abs().max().item()
    print(f"transformers {__import__('transformers').__version__}: {ref.numel()} logits, largest |difference| {err:.3e} "
          f"of largest |logit| {scale:.3e} ({err / scale:.2e} relative; bound 1e-4)")
    return 0 if err <= 1e-4 * scale else 1


def main(argv):
    if argv[0] == "--make":
        return make(argv[1], argv[2], argv[3] if len(argv) > 3 else None)
    return compare(argv[0], argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

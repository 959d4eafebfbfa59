"""hf_generate.py DIR PROMPT_IDS OURS_IDS: transformers' greedy
generate on the Hugging Face folder DIR (LlamaForCausalLM in float64, its
KV cache) from the prompt ids, held to the ids `fsdp generate` chose
(space-separated, the same count of new tokens). Token for token; where
they part, the step must be a near tie in float64 (the two largest logits
within 1e-4 of the largest's magnitude: fp32 noise may pick either),
else it fails naming the step and both tokens. Exit 0 equal, 1 differ.
hf_generate.py --make DIR FROM: a model with FROM's config.json and
tokenizer, random weights drawn wide (initializer_range 0.5: logits far
from ties, greedy tokens that vary), saved by transformers into DIR."""
import sys

import torch
from transformers import LlamaForCausalLM


def make(out, src):
    import json
    import shutil
    from transformers import LlamaConfig
    with open(src + "/config.json") as f:
        fields = json.load(f)
    fields["initializer_range"] = 0.5
    fields.pop("torch_dtype", None)
    fields.pop("dtype", None)
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(**fields)).float()
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        try:
            shutil.copy(src + "/" + name, out + "/" + name)
        except FileNotFoundError:
            pass
    return 0


def main(argv):
    if argv[0] == "--make":
        return make(argv[1], argv[2])
    folder, prompt, ours = argv[0], [int(v) for v in argv[1].split()], [int(v) for v in argv[2].split()]
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float64)
    model.eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(ours), min_new_tokens=len(ours),
                             do_sample=False, num_beams=1, pad_token_id=0, eos_token_id=None)
    theirs = out[0, len(prompt):].tolist()
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a == b:
            continue
        with torch.no_grad():
            logits = model(torch.tensor([prompt + theirs[:i]])).logits[0, -1]
        top = torch.topk(logits, 2).values
        gap = float(top[0] - top[1])
        scale = float(logits.abs().max())
        if gap <= 1e-4 * scale:
            print(f"equal for {i} tokens; at token {i} a near tie in float64 (gap {gap:.3g}): ours {a}, transformers {b}")
            return 0
        print(f"FAILED: token {i}: ours {a}, transformers {b} (their top-2 gap {gap:.3g}, logits up to {scale:.3g})")
        print("ours:        ", ours)
        print("transformers:", theirs)
        return 1
    print(f"equal: {len(ours)} tokens, token for token")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

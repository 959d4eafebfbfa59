"""hf_packed.py DIR OURS: packed rows against transformers. OURS (written by
tests/lua/hf_packed.lua) holds packed rows of documents, their targets
(some masked, -100) and our log-probability of each target and our loss.
transformers' LlamaForCausalLM (float64) runs each document alone; its
log-probabilities of the same targets must equal ours within 1e-4 of the
largest |log-probability| (the HF logits test's bound), and torch's
cross-entropy over every document's targets with labels -100 where masked
(the sum over documents, divided by the count) must equal our loss within
1e-5 relative. Exit 77: torch or transformers missing."""
import math
import sys

try:
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)


def main(argv):
    d, ours_path = argv
    vals = [l.strip() for l in open(ours_path)]
    B, T = int(vals[0]), int(vals[1])
    n = B * T
    ids = [int(v) for v in vals[2:2 + n]]
    ds = [int(v) for v in vals[2 + n:2 + 2 * n]]
    ys = [int(v) for v in vals[2 + 2 * n:2 + 3 * n]]
    lps = [float(v) for v in vals[2 + 3 * n:2 + 4 * n]]
    our_loss = float(vals[2 + 4 * n])
    model = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float64)
    model.eval()
    worst, scale, docs, total, count = 0.0, 0.0, 0, 0.0, 0
    for b in range(B):
        t = 0
        while t < T:
            e = t
            while e < T and ds[b * T + e] == t:
                e += 1
            if e - t >= 1 and not all(ys[b * T + i] == -100 for i in range(t, e)):
                doc = torch.tensor(ids[b * T + t:b * T + e]).view(1, -1)
                with torch.no_grad():
                    logits = model(doc).logits[0]
                lp = F.log_softmax(logits, dim=-1)
                labels = torch.tensor(ys[b * T + t:b * T + e])
                total += F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum").item()
                for j in range(e - t):
                    y = ys[b * T + t + j]
                    if y == -100:
                        continue
                    ref = lp[j, y].item()
                    scale = max(scale, abs(ref))
                    worst = max(worst, abs(ref - lps[b * T + t + j]))
                    count += 1
                docs += 1
            t = e
    ref_loss = total / count
    print(f"transformers {__import__('transformers').__version__}: {docs} documents alone, {count} targets; largest "
          f"|log-prob difference| {worst:.3e} of largest |log-prob| {scale:.3e} (bound 1e-4 of it); loss {our_loss:.9f}, "
          f"torch's cross-entropy with -100 labels {ref_loss:.9f} ({abs(our_loss - ref_loss) / ref_loss:.2e} relative; bound 1e-5)")
    ok = worst <= 1e-4 * scale and abs(our_loss - ref_loss) <= 1e-5 * ref_loss and count > 0 and not math.isnan(our_loss)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

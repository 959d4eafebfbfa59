"""What the peers' sides of bench/llama_vs_peer.sh share, so that each peer
differs from the others only in how it shards and steps: the shapes
(bench/llama1b.lua, bench/llama4b_offload.lua, and a tiny one for
--cpu-smoke), byte-level tokens from the same files as the recipes'
data.corpus, the timed loop and its one JSON line.
  python3 bench/<peer>_llama.py STEPS SEQ [--offload] [--cpu-smoke]
--cpu-smoke (or PEER_CPU_SMOKE=1): gloo, the CPU, a 2-layer tiny shape, so
that a machine without a GPU runs each peer as far as the peer allows.
As a program it measures a command's host memory:
  python3 bench/peer_common.py --maxrss FILE -- COMMAND...
runs COMMAND and writes {"max_rss_bytes": N} to FILE: the largest
resident set of COMMAND and of each process under it that it waited for
(the kernel keeps that maximum, not a sum: one rank, one figure)."""
import glob, json, os, resource, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the recipes' data.corpus.include
CORPUS = ["README.md", "docs/*.md", "src/*.h", "src/*/*.c", "lua/fsdp/*.lua"]
SHAPES = {
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8),
    "llama4b_offload": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=40, num_attention_heads=24,
                            num_key_value_heads=8, head_dim=128),
    # byte-level ids need only 256 rows; small enough for a few CPU steps
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256),
}


class Args:
    """STEPS SEQ [--offload] [--cpu-smoke]: the shape follows from the mode."""

    def __init__(self, argv):
        pos = [a for a in argv if not a.startswith("--")]
        flags = {a for a in argv if a.startswith("--")}
        unknown = flags - {"--offload", "--cpu-smoke"}
        if len(pos) != 2 or unknown:
            sys.exit(f"usage: {os.path.basename(sys.argv[0])} STEPS SEQ [--offload] [--cpu-smoke]"
                     + (f" (unknown {' '.join(sorted(unknown))})" if unknown else ""))
        self.steps, self.seq = int(pos[0]), int(pos[1])
        self.offload = "--offload" in flags
        self.smoke = "--cpu-smoke" in flags or os.environ.get("PEER_CPU_SMOKE") == "1"
        self.shape = "tiny" if self.smoke else "llama4b_offload" if self.offload else "llama1b"
        self.device = "cpu" if self.smoke else "cuda"


def need(module, peer):
    """Imports a peer's package, or exits 3 with one line saying why (the
    bench prints it as the reason the peer was skipped)."""
    import importlib
    try:
        return importlib.import_module(module)
    except Exception as e:  # an ImportError, or a peer that fails while importing
        print(f"{peer}: cannot import {module}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(3)


def init_dist(args):
    """One rank: NCCL and GPU 0, or gloo on the CPU for --cpu-smoke."""
    import torch
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("gloo" if args.smoke else "nccl")
    if not args.smoke:
        torch.cuda.set_device(0)


def llama_config(args):
    from transformers import LlamaConfig
    shape = dict(vocab_size=128256)
    shape.update(SHAPES[args.shape])
    return LlamaConfig(**shape, max_position_embeddings=args.seq, rope_theta=500000.0, rms_norm_eps=1e-5,
                       tie_word_embeddings=True, attn_implementation="sdpa")


def tokens():
    """The corpus's bytes as one long tensor of ids, as our data loader reads it."""
    import torch
    files = sorted(set(sum((glob.glob(os.path.join(ROOT, p)) for p in CORPUS), [])))
    return torch.tensor(list(b"\n\n".join(open(f, "rb").read() for f in files)), dtype=torch.long)


def lm_loss(logits, y):
    import torch.nn.functional as F
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def timed_loop(tag, args, step):
    """Runs step(x, y) -> loss for args.steps batches (one sequence each,
    consecutive windows of the corpus) and returns tokens/s over the steps
    after the first (it compiles, allocates and warms caches)."""
    import torch
    data = tokens()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.steps):
        off = (i * args.seq) % (len(data) - args.seq - 1)
        x = data[off:off + args.seq].view(1, args.seq).to(args.device)
        y = data[off + 1:off + args.seq + 1].view(1, args.seq).to(args.device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(x, y)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        print(f"{tag} step {i + 1}: loss {loss.item():.4f}, {times[-1]:.3f} s", flush=True)
    steady = times[1:] or times
    return args.seq * len(steady) / sum(steady)


def report(engine, args, tps, **extra):
    """The one JSON line the bench reads: GPU memory as torch's caching
    allocator saw it (all three engines allocate through it), and this
    process's peak resident set."""
    import torch
    cuda = args.device == "cuda"
    line = {"engine": engine, "tokens_per_s": tps,
            "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
            "offload": args.offload}
    line.update(extra)
    line["torch"] = torch.__version__
    # ru_maxrss is in KiB on Linux
    line["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if args.smoke:
        line["cpu_smoke"] = True
    print(json.dumps(line), flush=True)


def maxrss_main(argv):
    if len(argv) < 4 or argv[0] != "--maxrss" or argv[2] != "--":
        sys.exit("usage: peer_common.py --maxrss FILE -- COMMAND...")
    rc = subprocess.call(argv[3:])
    with open(argv[1], "w") as f:
        json.dump({"max_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}, f)
    return rc


if __name__ == "__main__":
    sys.exit(maxrss_main(sys.argv[1:]))

"""Our attention kernels vs PyTorch's fused ones, one process, one GPU: causal
grouped-query attention in bf16 at the shapes of Llama 3.2 1B (32 heads, 8 kv
heads of 64) and Llama 3 8B (32 / 8 of 128), one sequence of 2048, 4096 and
8192 tokens. Ours: fsdp_cuda_attention_forward / _backward from libfsdp.so
(ctypes), each kernel choice of fsdp_cuda_attention_impl_set (SIMPLE: the
fp32 CUDA-core kernels, kernels/attention.cu; TENSOR_CORES: kernels/
attention_tc.cu; CUDNN: cuDNN's fused attention through our entry points,
kernels/attention_cudnn.cpp). Theirs: F.scaled_dot_product_attention(is_causal=True)
under sdpa_kernel(CUDNN_ATTENTION) and under sdpa_kernel(FLASH_ATTENTION).
All on the same buffers: q, dout [B,T,H,D], k, v [B,T,Hkv,D] as our API wants
them; torch gets [B,H,T,D] transposed views of them (what a Llama block
hands it), so neither side copies. Forward and backward are timed
separately (CUDA events on the default stream, median of REPEATS after
WARMUP); every kernel's out, dq, dk, dv are checked against each torch
backend that runs, and the exit status is 1 when one is off by more than
2e-2 of the reference's largest value (or NaN). Needs torch and a GPU
(prints a line and exits 0 without them); run it after
`. scripts/gpu_env.sh BUILD` so that libfsdp's libraries load.
  python3 bench/attention_vs_torch.py [BUILD (build)] [--lib PATH] [--repeats N] ..."""
import argparse, ctypes, datetime, os, statistics, sys, warnings

FSDP_CUDA, FSDP_BF16 = 1, 1                   # src/fsdp.h
FSDP_ATTN_SIMPLE, FSDP_ATTN_TENSOR_CORES, FSDP_ATTN_CUDNN = 1, 2, 3  # src/fsdp_kernels.h
IMPLS = [("simple", FSDP_ATTN_SIMPLE), ("tc", FSDP_ATTN_TENSOR_CORES), ("fsdp-cudnn", FSDP_ATTN_CUDNN)]
OURS = [e for e, _ in IMPLS]
SHAPES = [("llama3.2-1b", 32, 8, 64), ("llama3-8b", 32, 8, 128)]  # name, H, Hkv, D
TOL = 2e-2


class FsdpError(RuntimeError):
    """a libfsdp call returned a negative FSDP_E* status"""


class Unavailable(Exception):
    """a torch backend refused the shape"""


class Fsdp:
    """The few entry points of libfsdp.so this needs, argtypes as in src/fsdp.h
    and src/fsdp_kernels.h (every pointer is a void *; fsdp_stream * is NULL)."""

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(path)
        vp, i64, i32, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int
        for name, args, res in [
                ("fsdp_version", [], ctypes.c_char_p), ("fsdp_last_error", [], ctypes.c_char_p),
                ("fsdp_status_name", [ci], ctypes.c_char_p), ("fsdp_device_set", [ci, ci], ci),
                ("fsdp_cuda_library", [], ctypes.c_char_p)]:
            f = getattr(lib, name)
            f.argtypes, f.restype = args, res
        # the kernels are in the CUDA backend, libfsdp_cuda.so, which libfsdp opens
        cuda = lib.fsdp_cuda_library()
        if not cuda:
            raise OSError(f"no CUDA backend: {(lib.fsdp_last_error() or b'').decode(errors='replace')}")
        self.cu = ctypes.CDLL(cuda.decode())
        for name, args, res in [
                ("fsdp_cuda_attention_impl_set", [ci], ci),
                # out, lse, q, k, v, batch, seq, heads, kv_heads, head_dim, dtype, stream
                ("fsdp_cuda_attention_forward", [vp] * 5 + [i64] * 5 + [i32, vp], ci),
                # dq, dk, dv, dout, q, k, v, out, lse, batch, seq, heads, kv_heads, head_dim, dtype, stream
                ("fsdp_cuda_attention_backward", [vp] * 9 + [i64] * 5 + [i32, vp], ci)]:
            f = getattr(self.cu, name)
            f.argtypes, f.restype = args, res

    def check(self, rc, what):
        if rc < 0:  # FSDP_E*: the message is in fsdp_last_error()
            name = (self.lib.fsdp_status_name(rc) or b"?").decode()
            raise FsdpError(f"{what}: {name} ({rc}): {(self.lib.fsdp_last_error() or b'').decode(errors='replace')}")
        return rc

    def forward(self, o, sh):
        B, T, H, Hkv, D = sh.dims
        self.check(self.cu.fsdp_cuda_attention_forward(o.out.data_ptr(), o.lse.data_ptr(), sh.q.data_ptr(),
                                                        sh.k.data_ptr(), sh.v.data_ptr(), B, T, H, Hkv, D,
                                                        FSDP_BF16, None), "fsdp_cuda_attention_forward")

    def backward(self, o, sh):
        B, T, H, Hkv, D = sh.dims
        self.check(self.cu.fsdp_cuda_attention_backward(
            o.dq.data_ptr(), o.dk.data_ptr(), o.dv.data_ptr(), sh.dout.data_ptr(), sh.q.data_ptr(), sh.k.data_ptr(),
            sh.v.data_ptr(), o.out.data_ptr(), o.lse.data_ptr(), B, T, H, Hkv, D, FSDP_BF16, None),
            "fsdp_cuda_attention_backward")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n  python3")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("build", nargs="?", default="build", help="the build folder (default: build)")
    p.add_argument("--lib", help="libfsdp.so to load (default: BUILD/libfsdp.so)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per measurement; the median is shown (20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before them (3)")
    p.add_argument("--seqs", default="2048,4096,8192", help="sequence lengths, comma-separated (2048,4096,8192)")
    a = p.parse_args()
    if a.repeats < 1 or a.warmup < 0:
        p.error("--repeats must be at least 1, --warmup at least 0")
    return a


def main():
    args = parse()
    try:
        import torch
    except ImportError:
        print("attention_vs_torch: no PyTorch here (import torch fails); nothing to compare")
        return 0
    if not torch.cuda.is_available():
        print(f"attention_vs_torch: no CUDA device here (torch {torch.__version__}); nothing to compare")
        return 0
    import torch.nn.functional as F
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        print(f"attention_vs_torch: torch {torch.__version__} lacks torch.nn.attention.sdpa_kernel (2.3+); "
              "nothing to compare")
        return 0

    # torch first: its tensors create the primary context, which libfsdp's
    # runtime then shares; our calls pass stream NULL, the legacy default
    # stream, so torch must be on it too (events and ordering)
    torch.cuda.init()
    torch.empty(1, device="cuda")
    assert torch.cuda.current_stream().cuda_stream == 0, "run on torch's default stream"
    lib_path = os.path.abspath(args.lib or os.path.join(args.build, "libfsdp.so"))
    try:
        fsdp = Fsdp(lib_path)
    except OSError as e:
        print(f"attention_vs_torch: cannot load {lib_path}: {e} (run `. scripts/gpu_env.sh BUILD` first)")
        return 1
    # no fsdp_init needed for the kernels; this only points libfsdp's runtime
    # at torch's GPU
    fsdp.check(fsdp.lib.fsdp_device_set(FSDP_CUDA, torch.cuda.current_device()), "fsdp_device_set")
    backends = [("cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None)),
                ("flash", getattr(SDPBackend, "FLASH_ATTENTION", None))]

    def timed(fn):
        for _ in range(args.warmup):
            fn()
        ev = lambda: torch.cuda.Event(enable_timing=True)
        evs = [(ev(), ev()) for _ in range(args.repeats)]
        for a, b in evs:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in evs)

    def why(e, caught):
        # sdpa's reasons for refusing a backend come as warnings before "No available kernel"
        # (the other backends' "runtime disabled" among them: sdpa_kernel did that)
        msgs = [str(w.message).split(" (Triggered internally")[0].strip() for w in caught]
        msgs = [m for m in msgs if not any(s in m for s in ("not used because", "runtime disabled"))]
        return " ".join((msgs[:2] or [str(e)])).replace("\n", " ")[:200]

    def run_ours(code, sh):
        """fwd ms, bwd ms, {out, dq, dk, dv} of the first (checked) call"""
        fsdp.check(fsdp.cu.fsdp_cuda_attention_impl_set(code), "fsdp_cuda_attention_impl_set")
        o = argparse.Namespace(out=torch.empty_like(sh.q), lse=torch.empty(sh.B, sh.H, sh.T, device="cuda"),
                               dq=torch.empty_like(sh.q), dk=torch.empty_like(sh.k), dv=torch.empty_like(sh.v))
        for t in vars(o).values():
            t.fill_(float("nan"))  # poison: anything left unwritten shows up as NaN
        fsdp.forward(o, sh)
        fsdp.backward(o, sh)
        torch.cuda.synchronize()
        got = {n: getattr(o, n).clone() for n in ("out", "dq", "dk", "dv")}
        return timed(lambda: fsdp.forward(o, sh)), timed(lambda: fsdp.backward(o, sh)), got

    def run_torch(backend, sh):
        """fwd ms, bwd ms (None + reason when only the forward runs), results in
        our layout, note; Unavailable when the backend refuses the forward"""
        if backend is None:
            raise Unavailable("this torch has no such SDPBackend")
        leaf = lambda t: t.transpose(1, 2).detach().requires_grad_()  # [B,H,T,D] view, same storage
        qt, dout_t, G, note = leaf(sh.q), sh.dout.transpose(1, 2), sh.H // sh.Hkv, ""
        with sdpa_kernel([backend]), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:  # native GQA (torch 2.5+) where the backend takes it
                kt, vt, kw = leaf(sh.k), leaf(sh.v), {"enable_gqa": True}
                fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, **kw)
                out = fn()
            except (RuntimeError, TypeError) as e:  # TypeError: a torch without enable_gqa
                note = f"K/V repeated to {sh.H} heads, outside the timing (enable_gqa: {why(e, caught)})"
                caught.clear()
                kt, vt = [t.transpose(1, 2).repeat_interleave(G, 1).detach().requires_grad_() for t in (sh.k, sh.v)]
                kw = {}
                try:
                    out = fn()
                except RuntimeError as e2:
                    raise Unavailable(why(e2, caught))
            fwd = timed(fn)
            out = fn()  # the graph the backward timings re-run (retain_graph)
            grad = lambda: torch.autograd.grad(out, (qt, kt, vt), dout_t, retain_graph=True)
            try:
                dq, dk, dv = grad()
                bwd = timed(grad)
            except RuntimeError as e:
                return fwd, None, {"out": out.transpose(1, 2)}, f"backward n/a: {why(e, caught)}"
        if kt.shape[1] != sh.Hkv:  # repeated K/V: sum each group's grads back onto its kv head
            dk, dv = [d.float().unflatten(1, (sh.Hkv, G)).sum(2) for d in (dk, dv)]
        got = {"out": out, "dq": dq, "dk": dk, "dv": dv}
        got = {n: t.transpose(1, 2) for n, t in got.items()}
        return fwd, bwd, got, note

    def err(x, ref):  # NaN anywhere in x gives NaN
        x, ref = x.float(), ref.float()
        return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()

    def errors(res, e, keys):  # "key vs backend" -> err of engine e, for each torch backend that ran
        return {f"{k} vs {r}": err(res[e][2][k], res[r][2][k]) for r in ("cudnn", "flash") if r in res and e in res
                for k in keys if k in res[r][2]}

    def cell(x, fmt):  # fixed width, "n/a" for a missing value
        return f"{x:{fmt}}" if x is not None else f"{'n/a':>{len(format(0.0, fmt))}}"

    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"# attention_vs_torch {now:%Y-%m-%d %H:%M} UTC, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}, fsdp {fsdp.lib.fsdp_version().decode()}")
    print("# causal bf16, B=1; q, dout [B,T,H,D], k, v [B,T,Hkv,D]; torch on transposed views of the same buffers; "
          f"ms = median of {args.repeats} after {args.warmup} warm-ups (CUDA events)")
    print("# simple, tc: our fp32-core and tensor-core kernels; fsdp-cudnn: cuDNN's fused attention through our "
          "entry points (the default where it applies); cudnn, flash: torch SDPA's backends")
    print("# TF/s from causal FLOPs: fwd 4*B*H*T*T*D/2 (QK^T and PV, half the scores), bwd 2.5 x fwd; "
          "ours/cudnn, ours/flash = the time of our default (fsdp-cudnn, else tc) / theirs (< 1: ours faster)")
    print("# err = max|ours - torch| / max|torch|, worst over cudnn and flash (bwd: over dq, dk, dv); "
          f"fails above {TOL:g} or NaN")
    eng = OURS + ["cudnn", "flash"]
    print(f"{'model':12} {'D':>4} {'T':>5} {'pass':4} |" + "".join(f"{e + ' ms':>14}" for e in eng) + " |" +
          "".join(f"{e:>11}" for e in eng) + " TF/s |" + f"{'ours/cudnn':>11}{'ours/flash':>11} |" +
          "".join(f"{'err ' + e:>16}" for e in OURS))
    status, notes = 0, []
    for name, H, Hkv, D in SHAPES:
        for T in [int(s) for s in args.seqs.split(",")]:
            gen = torch.Generator(device="cuda").manual_seed(T + D)
            rnd = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=gen)
            sh = argparse.Namespace(B=1, T=T, H=H, Hkv=Hkv, D=D, dims=(1, T, H, Hkv, D), q=rnd(1, T, H, D),
                                    k=rnd(1, T, Hkv, D), v=rnd(1, T, Hkv, D), dout=rnd(1, T, H, D))
            tag, res = f"{name} T={T}", {}  # res: engine -> (fwd ms, bwd ms, results in our layout)
            for e, code in IMPLS:
                try:
                    res[e] = run_ours(code, sh)
                except FsdpError as x:  # ours failing is a failure, but the other columns still run
                    status = 1
                    notes.append(f"# {tag} {e}: FAILED: {x}")
            for e, backend in backends:
                try:
                    fwd, bwd, got, note = run_torch(backend, sh)
                    res[e] = (fwd, bwd, got)
                    if note:
                        notes.append(f"# {tag} {e}: {note}")
                except Unavailable as x:
                    notes.append(f"# {tag} {e}: n/a: {x}")
            fwd_flops = 4 * sh.B * H * T * T * D / 2
            for i, pas, keys, flops in [(0, "fwd", ["out"], fwd_flops), (1, "bwd", ["dq", "dk", "dv"], 2.5 * fwd_flops)]:
                ms = {e: res[e][i] if e in res else None for e in eng}
                tf = {e: None if ms[e] is None else flops / ms[e] / 1e9 for e in eng}
                ours = ms["fsdp-cudnn"] if ms["fsdp-cudnn"] is not None else ms["tc"]
                ratio = {e: None if ours is None or ms[e] is None else ours / ms[e] for e in ("cudnn", "flash")}
                worst = {}
                for e in OURS:
                    errs = errors(res, e, keys)
                    worst[e] = max(errs.values(), key=lambda v: float("inf") if v != v else v) if errs else None
                    if worst[e] is not None and not worst[e] <= TOL:
                        status = 1
                        notes.append(f"# {tag} {e} {pas}: FAIL: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
                print(f"{name:12} {D:4d} {T:5d} {pas:4} |" + "".join(cell(ms[e], "14.3f") for e in eng) + " |" +
                      "".join(cell(tf[e], "11.1f") for e in eng) + "      |" + cell(ratio["cudnn"], "11.3f") +
                      cell(ratio["flash"], "11.3f") + " |" + "".join(cell(worst[e], "16.2e") for e in OURS),
                      flush=True)
            del sh, res
            torch.cuda.empty_cache()
    for n in notes:
        print(n)
    print(f"# {'FAIL' if status else 'ok'}")
    return status


if __name__ == "__main__":
    sys.exit(main())

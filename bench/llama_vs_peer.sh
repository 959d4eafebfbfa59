#!/usr/bin/env bash
# One command, one GPU: trains bench/llama1b.lua (Llama 3.2 1B's shape, seq
# 4096, bf16, zero 3) with this engine and then the same shape, batch and
# tokens with each peer named (default all three):
#   fsdp2          PyTorch FSDP2 (bench/fsdp2_llama.py)
#   megatron_fsdp  Megatron-FSDP's fully_shard (bench/megatron_fsdp_llama.py)
#   deepspeed      DeepSpeed ZeRO-3 (bench/deepspeed_llama.py)
# and prints one table: tokens/s, MFU (the same FLOP count and the same peak
# for all: the GPU's datasheet, lua/fsdp/peak.lua; n/a for a GPU not in its
# table), peak memory (the bytes the buffers asked for, as
# torch.cuda.max_memory_allocated counts them), reserved memory (what the
# allocator held from the device, rounding and cache included), host memory
# (the peak resident set of the process: ours through bench/peer_common.py
# --maxrss, a peer's as it reports it, which leaves out the compilers its
# JIT starts), and
# a line `ratio ours/<peer>: tokens/s X, peak memory Y, reserved Z` per peer.
# A peer that cannot import or run is skipped with its error line; then the
# exit status is 3 (0 when every peer ran).
# --offload: the same with the optimizer offloaded to the host, on a model
# that does not fit an 80 GB GPU without it (bench/llama4b_offload.lua,
# 4.4B), against FSDP2's CPUOffloadPolicy and DeepSpeed's ZeRO-Offload
# (Megatron-FSDP 0.6.1 has no offload), all with activation checkpointing;
# the ratio lines add the host memory.
# --cpu-smoke: the whole bench on CPU ranks with a 2-layer tiny shape, seq 64
# (the peers as far as each runs without a GPU).
# The peers' packages: scripts/peer_wheels.sh downloads them here; where
# .whl/peers (PEER_WHEELS) holds wheels, they are installed offline beside
# the machine's torch first (once: scripts/peer_wheels.sh --install).
# OURS_ALSO="fsdp.recompute=mlp; fsdp.checkpoint=2": our side run again
# with each ;-separated set of overrides, one row each (each peer runs once).
# PEER_TIMEOUT (s, default 900) bounds each peer's run; PYTHON (python3).
#   bench/llama_vs_peer.sh [BUILD_DIR] [STEPS] [--offload] [--cpu-smoke] [PEER...]
set -euo pipefail
cd "$(dirname "$0")/.."
pos=() peers=() mode= smoke=
for a in "$@"; do
  case $a in
    --offload) mode=--offload ;;
    --cpu-smoke) smoke=--cpu-smoke ;;
    fsdp2 | megatron_fsdp | deepspeed) peers+=("$a") ;;
    -*) echo "llama_vs_peer.sh: unknown option '$a' (expected --offload, --cpu-smoke)" >&2; exit 2 ;;
    *) pos+=("$a") ;;
  esac
done
[ ${#pos[@]} -le 2 ] || { echo "llama_vs_peer.sh: unknown peer '${pos[2]}' (fsdp2, megatron_fsdp, deepspeed)" >&2; exit 2; }
build=${pos[0]:-build}
steps=${pos[1]:-8}
out=${OUT:-runs/bench}
py=${PYTHON:-python3}
seq=4096
recipe=bench/llama1b.lua name=llama1b title="Llama 3.2 1B shape, seq 4096, batch 1, bf16, one GPU"
if [ "$mode" = --offload ]; then
  recipe=bench/llama4b_offload.lua name=llama4b_offload
  title="Llama-3-style 4.4B, seq 4096, batch 1, bf16, optimizer offloaded to the host, one GPU"
  [ ${#peers[@]} -gt 0 ] || peers=(fsdp2 deepspeed)
fi
[ ${#peers[@]} -gt 0 ] || peers=(fsdp2 megatron_fsdp deepspeed)
ours=()
if [ -n "$smoke" ]; then
  # peer_common.py's "tiny" shape, on the CPU
  seq=64 name=${name}_smoke title="tiny Llama (2 layers, hidden 64), seq 64, CPU"
  ours=(model.hidden_size=64 model.intermediate_size=128 model.num_hidden_layers=2 model.num_attention_heads=4
    model.num_key_value_heads=2 model.head_dim=16 model.vocab_size=256 model.max_position_embeddings=64 data.seq=64
    train.device=cpu)
fi
[ -n "$smoke" ] || [ -f "$build/CMakeCache.txt" ] || . scripts/gpu_env.sh "$build" # a carried build
wheels=${PEER_WHEELS:-.whl/peers}
# a set that does not install (another Python's wheels) leaves the peers
# to what python has: each then says what it misses
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  if site=$(PYTHON="$py" bash scripts/peer_wheels.sh --install "$wheels"); then
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
  else
    echo "llama_vs_peer.sh: the wheels in $wheels did not install (above)"
  fi
fi
mkdir -p "$out"
# ours TAG OVERRIDE...: one run of our side, its metrics, log and host memory
ours_run() {
  local tag=$1
  shift
  "$py" bench/peer_common.py --maxrss "$out/ours_$tag.rss" -- "$build/fsdprun" -n 1 --rank0-only --host \
    "$build/fsdp" "$recipe" train.steps="$steps" train.metrics="$out/$tag.jsonl" "${ours[@]}" "$@" 2>&1 |
    tee "$out/ours_$tag.log"
  variants+=("$out/$tag.jsonl=$out/ours_$tag.rss=${*:-defaults}")
}
variants=()
ours_run "$name"
IFS=';' read -ra also <<< "${OURS_ALSO:-}"
for i in "${!also[@]}"; do
  read -ra over <<< "${also[$i]}"
  [ ${#over[@]} -gt 0 ] && ours_run "${name}_also$i" "${over[@]}"
done
peer_run() { timeout "${PEER_TIMEOUT:-900}" "$py" "bench/$1_llama.py" "$steps" "$seq" $mode $smoke 2>&1 | tee "$2"; }
runs=()
for p in "${peers[@]}"; do
  log="$out/${p}_$name.log"
  rc=0
  peer_run "$p" "$log" || rc=$?
  if [ "$p" = megatron_fsdp ] && ! grep -q '^{' "$log" && [ "${MFSDP_DOUBLE_BUFFER:-1}" = 1 ] && [ $rc != 3 ]; then
    # its double buffers are the guide's advice, not its default: without them
    mv "$log" "$out/${p}_${name}_double_buffer.log"
    echo "megatron_fsdp: failed with fsdp_double_buffer (log: $out/${p}_${name}_double_buffer.log); again without"
    rc=0
    MFSDP_DOUBLE_BUFFER=0 peer_run "$p" "$log" || rc=$?
  fi
  runs+=("$p=$rc=$log")
done
"$py" - "$title" "$mode" "${runs[*]}" "${variants[@]}" <<'PY' | tee "$out/table_$name.txt"
import json, os, re, sys
title, mode, runs, variants = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
offload = mode == "--offload"
pct = lambda m: f"{100 * m:6.1f}%" if m is not None else "    n/a"
gib = lambda b: f"{b / 2**30:9.2f}" if b is not None else "      n/a"
def host(path):
    try:
        return json.load(open(path))["max_rss_bytes"]
    except (OSError, ValueError, KeyError):
        return None
def why(log, rc):
    """The line that says why a peer gave no result: its own one-line
    refusal, else the exception a traceback ends with, else its last line."""
    lines = [l.strip() for l in open(log, errors="replace") if l.strip()] if os.path.exists(log) else []
    for l in reversed(lines):
        if re.match(r"^(megatron_fsdp|deepspeed|fsdp2): ", l):
            return l
    for l in reversed(lines):
        if re.search(r"(^|\]: )([\w.]+\.)?\w*(Error|Exception|Interrupt)\b", l):
            return re.sub(r"^\[rank\d+\]: ", "", l)
    if rc == "124":
        return f"timed out after {os.environ.get('PEER_TIMEOUT', '900')} s"
    return (lines[-1] if lines else "no output") + f" (exit {rc})"
print(f"\n# {title} (steps after the first)")
print(f"{'engine':16} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9} {'reserved':>9} {'host GiB':>9}")
ours = []
for v in variants:
    path, rss_path, label = v.split("=", 2)
    rows = [json.loads(l) for l in open(path) if '"tokens_per_s"' in l]
    steady = rows[1:] or rows
    tps = len(steady) / sum(1 / r["tokens_per_s"] for r in steady)
    mfu = sum(r["mfu"] for r in steady) / len(steady) if all(r.get("mfu") is not None for r in steady) else None
    rss = host(rss_path)
    ours.append(dict(label=label, tps=tps, mfu=mfu, mem=max(r["mem_bytes"] for r in rows),
                     held=max(r.get("mem_reserved_bytes", 0) for r in rows), rss=rss))
    print(f"{'fsdp (ours)':16} {tps:10.0f} {pct(mfu)} {gib(ours[-1]['mem'])} {gib(ours[-1]['held'])} {gib(rss)}  {label}")
names = {"fsdp2": "pytorch fsdp2", "megatron_fsdp": "megatron-fsdp", "deepspeed": "deepspeed"}
theirs, skipped = [], []
for run in runs:
    peer, rc, log = run.split("=", 2)
    got = [json.loads(l) for l in open(log, errors="replace") if l.startswith("{")] if os.path.exists(log) else []
    if not got:
        skipped.append((peer, why(log, rc)))
        continue
    t = got[-1]
    # same FLOPs per token, same peak: a peer's MFU from ours
    mfu = ours[0]["mfu"] * t["tokens_per_s"] / ours[0]["tps"] if ours[0]["mfu"] else None
    rss = t.get("peak_rss_bytes")
    version = f"{peer} {t[peer]}" if peer in t else f"torch {t['torch']}"
    theirs.append((peer, t, rss))
    print(f"{names[peer]:16} {t['tokens_per_s']:10.0f} {pct(mfu)} {gib(t['peak_bytes'])} {gib(t['peak_reserved_bytes'])}"
          f" {gib(rss)}  {version}" + (f", {t['optimizer']}" if "optimizer" in t else ""))
for peer, t, rss in theirs:
    for o in ours:
        r = lambda a, b: f"{a / b:.3f}" if a is not None and b else "n/a"
        line = (f"ratio ours/{peer}: tokens/s {r(o['tps'], t['tokens_per_s'])}, peak memory {r(o['mem'], t['peak_bytes'])},"
                f" reserved {r(o['held'], t['peak_reserved_bytes'])}")
        if offload:
            line += f", host memory {r(o['rss'], rss)}"
        print(line + (f"  ({o['label']})" if len(ours) > 1 else ""))
for peer, reason in skipped:
    print(f"{peer}: skipped: {reason}")
sys.exit(3 if skipped else 0)
PY

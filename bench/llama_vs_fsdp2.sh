#!/usr/bin/env bash
# One command, one GPU: trains bench/llama1b.lua (Llama 3.2 1B's shape, seq
# 4096, bf16, zero 3) with this engine and then the same shape, batch and
# tokens with PyTorch FSDP2 (bench/fsdp2_llama.py), and prints tokens/s,
# MFU (the same FLOP count and the same peak for both: the GPU's datasheet,
# lua/fsdp/peak.lua; n/a for a GPU not in its table)
# and peak memory side by side, with the ratios: the bytes the buffers asked
# for (torch.cuda.max_memory_allocated) and the bytes the allocator held
# from the device, rounding and cache included (max_memory_reserved).
# --offload: the same with the optimizer offloaded to the host, on a model
# that does not fit an 80 GB GPU without it (bench/llama4b_offload.lua,
# 4.4B; FSDP2 with CPUOffloadPolicy), both with activation checkpointing.
# OURS_ALSO="fsdp.recompute=mlp; fsdp.checkpoint=2": our side run again
# with each ;-separated set of overrides, one row each (FSDP2 runs once).
#   bench/llama_vs_fsdp2.sh [BUILD_DIR] [STEPS] [--offload]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-8}
mode=${3:-}
out=${OUT:-runs/bench}
recipe=bench/llama1b.lua name=llama1b title="Llama 3.2 1B shape, seq 4096, batch 1, bf16, one GPU"
if [ "$mode" = --offload ]; then
  recipe=bench/llama4b_offload.lua name=llama4b_offload
  title="Llama-3-style 4.4B, seq 4096, batch 1, bf16, optimizer offloaded to the host, one GPU"
elif [ -n "$mode" ]; then
  echo "llama_vs_fsdp2.sh: unknown option '$mode' (expected --offload)" >&2
  exit 2
fi
[ -f "$build/CMakeCache.txt" ] || . scripts/gpu_env.sh "$build" # a carried build
mkdir -p "$out"
"$build/fsdprun" -n 1 --rank0-only --host "$build/fsdp" "$recipe" train.steps="$steps" \
  train.metrics="$out/$name.jsonl" 2>&1 | tee "$out/ours_$name.log"
python3 bench/fsdp2_llama.py "$steps" 4096 $mode 2>&1 | tee "$out/fsdp2_$name.log"
variants=("$out/$name.jsonl=defaults")
IFS=';' read -ra also <<< "${OURS_ALSO:-}"
for i in "${!also[@]}"; do
  read -ra over <<< "${also[$i]}"
  [ ${#over[@]} -gt 0 ] || continue
  "$build/fsdprun" -n 1 --rank0-only --host "$build/fsdp" "$recipe" train.steps="$steps" \
    train.metrics="$out/${name}_also$i.jsonl" "${over[@]}" 2>&1 | tee "$out/ours_${name}_also$i.log"
  variants+=("$out/${name}_also$i.jsonl=${over[*]}")
done
python3 - "$out/fsdp2_$name.log" "$title" "${variants[@]}" <<'PY'
import json, sys
theirs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
pct = lambda m: f"{100 * m:6.1f}%" if m is not None else "    n/a"
print(f"\n# {sys.argv[2]} (steps after the first)")
print(f"{'engine':16} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9} {'reserved':>9}")
ratios = []
for v in sys.argv[3:]:
    path, label = v.split("=", 1)
    rows = [json.loads(l) for l in open(path) if '"tokens_per_s"' in l]
    steady = rows[1:] or rows
    tps = len(steady) / sum(1 / r["tokens_per_s"] for r in steady)
    mfu = sum(r["mfu"] for r in steady) / len(steady) if all(r.get("mfu") is not None for r in steady) else None
    mem = max(r["mem_bytes"] for r in rows)
    held = max(r.get("mem_reserved_bytes", 0) for r in rows)
    if len(ratios) == 0:  # same FLOPs per token, same peak: FSDP2's MFU from ours
        their_mfu = mfu * theirs["tokens_per_s"] / tps if mfu else None
    print(f"{'fsdp (ours)':16} {tps:10.0f} {pct(mfu)} {mem / 2**30:9.2f} {held / 2**30:9.2f}  {label}")
    ratios.append((label, tps / theirs["tokens_per_s"], mem / theirs["peak_bytes"],
                   held / theirs["peak_reserved_bytes"]))
print(f"{'pytorch fsdp2':16} {theirs['tokens_per_s']:10.0f} {pct(their_mfu)} {theirs['peak_bytes'] / 2**30:9.2f}"
      f" {theirs['peak_reserved_bytes'] / 2**30:9.2f}")
for label, t, m, h in ratios:
    print(f"ratio ours/fsdp2: tokens/s {t:.3f}, peak memory {m:.3f}, reserved {h:.3f}  ({label})")
PY

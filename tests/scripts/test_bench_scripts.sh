#!/usr/bin/env bash
# The GPU benchmarks' scripts stay runnable where no GPU checks them: the
# Python ones compile, the shell ones parse, bench/llama_vs_peer.sh refuses
# an unknown peer before it runs anything, Megatron-FSDP's side refuses
# --offload saying why (exit 3, the line the bench prints), and
# peer_common.py --maxrss reports a child's peak resident set. Needs no
# torch and no peer. Exit 77 (skipped) only when python3 is absent.
set -u
root=$1
command -v python3 >/dev/null || { echo "python3 not installed: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
python3 - "$root" "$tmp" <<'PY' || fail=1
import glob, os, py_compile, sys
root, tmp = sys.argv[1:]
files = sorted(glob.glob(os.path.join(root, "bench", "*.py")))
assert files, "no bench/*.py"
for i, f in enumerate(files):
    py_compile.compile(f, cfile=os.path.join(tmp, f"{i}.pyc"), doraise=True)
print(f"{len(files)} bench scripts compile")
PY
for f in "$root"/bench/*.sh "$root"/scripts/peer_wheels.sh "$root"/scripts/gpu_check.sh "$root"/scripts/gpu_bundle.sh; do
  bash -n "$f" || { echo "FAILED: $f does not parse"; fail=1; }
done
rc=0
bash "$root/bench/llama_vs_peer.sh" build 8 nosuchpeer >"$tmp/out" 2>&1 || rc=$?
[ $rc = 2 ] && grep -q "unknown peer 'nosuchpeer'" "$tmp/out" ||
  { echo "FAILED: llama_vs_peer.sh with an unknown peer: exit $rc: $(cat "$tmp/out")"; fail=1; }
rc=0
python3 "$root/bench/megatron_fsdp_llama.py" 2 64 --offload >"$tmp/out" 2>&1 || rc=$?
[ $rc = 3 ] && grep -q "^megatron_fsdp: no CPU offload" "$tmp/out" ||
  { echo "FAILED: megatron_fsdp_llama.py --offload: exit $rc: $(cat "$tmp/out")"; fail=1; }
python3 "$root/bench/peer_common.py" --maxrss "$tmp/rss.json" -- python3 -c 'b = bytearray(64 << 20)' || fail=1
python3 -c 'import json, sys; n = json.load(open(sys.argv[1]))["max_rss_bytes"]; sys.exit(0 if n >= 64 << 20 else f"max_rss_bytes {n} < 64 MiB")' \
  "$tmp/rss.json" || { echo "FAILED: peer_common.py --maxrss"; fail=1; }
[ $fail = 0 ] && echo "bench scripts: ok"
exit $fail

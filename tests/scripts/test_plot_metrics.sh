#!/usr/bin/env bash
# plot_metrics.sh renders a metrics file into a PNG (signature and a
# non-trivial size checked) and refuses a file without loss lines.
# Exit 77 (skipped) only when gnuplot is absent.
set -u
root=$1
command -v gnuplot >/dev/null || { echo "gnuplot not installed: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for s in $(seq 1 30); do
  printf '{"step":%d,"loss":%s,"lr":0.001,"tokens_per_s":%d}\n' "$s" "$(awk -v s="$s" 'BEGIN{print 5.5-s*0.1}')" $((1000 + s))
  [ $((s % 10)) -eq 0 ] && printf '{"step":%d,"val_loss":%s}\n' "$s" "$(awk -v s="$s" 'BEGIN{print 5.6-s*0.1}')"
done >"$tmp/m.jsonl"
fail=0
"$root/scripts/plot_metrics.sh" "$tmp/m.jsonl" "$tmp/m.png" || fail=1
sig=$(head -c 8 "$tmp/m.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')
[ "$sig" = "89504e470d0a1a0a" ] || { echo "FAILED: not a PNG ($sig)"; fail=1; }
[ "$(stat -c %s "$tmp/m.png" 2>/dev/null || echo 0)" -gt 10000 ] || { echo "FAILED: PNG too small"; fail=1; }
echo '{"step":1,"lr":0.1}' >"$tmp/bad.jsonl"
if "$root/scripts/plot_metrics.sh" "$tmp/bad.jsonl" "$tmp/bad.png" 2>"$tmp/err"; then echo "FAILED: accepted a file without loss"; fail=1; fi
grep -q 'has no "loss" lines' "$tmp/err" || { echo "FAILED: message: $(cat "$tmp/err")"; fail=1; }
# as text: every curve is there, with evaluation and without it (the
# training curve was lost with the validation line when none was evaluated)
"$root/scripts/plot_metrics.sh" "$tmp/m.jsonl" - >"$tmp/with.txt" || fail=1
grep -v val_loss "$tmp/m.jsonl" >"$tmp/noval.jsonl"
"$root/scripts/plot_metrics.sh" "$tmp/noval.jsonl" - >"$tmp/without.txt" || fail=1
for w in train validation throughput; do
  grep -q "$w" "$tmp/with.txt" || { echo "FAILED: with evaluation: no '$w' curve"; fail=1; }
done
for w in train throughput; do
  grep -q "$w" "$tmp/without.txt" || { echo "FAILED: without evaluation: no '$w' curve"; fail=1; }
done
grep -q validation "$tmp/without.txt" && { echo "FAILED: without evaluation: a validation curve"; fail=1; }
[ $fail -eq 0 ] && echo "plot_metrics: ok"
exit $fail

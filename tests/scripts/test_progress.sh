#!/usr/bin/env bash
# test_progress.sh FSDPRUN ROOT: a training run's progress line at a
# terminal (script(1) gives fsdprun one) moves every step, redrawn in place
# ("\r\033[K" through fsdprun, prefixed), and every log_every steps stays as
# a line; into a pipe only the log lines come, whole. Exit 77 without
# script(1).
set -u
fsdprun=$1
root=$2
. "$(dirname "$0")/checks.sh"
command -v script >/dev/null || { echo "script(1) is not installed: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args="$root/recipes/tiny.lua train.steps=6 train.log_every=3 train.eval_every=0 data.seq=32 data.micro_batch=2"
script -qec "$fsdprun -n 2 $args" /dev/null >"$work/tty" 2>&1
# one record per redraw or line: split at carriage returns and newlines
tr '\r' '\n' <"$work/tty" | sed 's/^\x1b\[K//' >"$work/records"
for k in 1 2 3 4 5 6; do
  check "at a terminal: step $k/6 drawn" "grep -q '^\[0\] \[[#.]*\] step $k/6 |' '$work/records'"
done
redraws=$(grep -ao $'\r\x1b\[K\[0\] \[' "$work/tty" | wc -l)
check "at a terminal: the bar is redrawn in place (\\r\\033[K), $redraws times for 6 steps" "[ $redraws -ge 6 ]"
check "at a terminal: steps 3 and 6 stay as lines" \
  "grep -aq 'step 3/6 | .*eta [^|]*\$' '$work/tty' && grep -aq 'step 6/6 | .*eta [^|]*\$' '$work/tty'"
"$fsdprun" -n 2 $args >"$work/pipe" 2>&1
check "into a pipe: only the log lines (steps 3 and 6), no bar" \
  "[ \"\$(grep -o 'step [0-9]/6' '$work/pipe' | tr '\n' ' ')\" = 'step 3/6 step 6/6 ' ] && ! grep -q \$'\\r' '$work/pipe'"
finish test_progress

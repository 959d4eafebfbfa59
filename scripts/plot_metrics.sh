#!/usr/bin/env bash
# Renders a trainer's metrics file (JSON Lines, train.metrics in a recipe) as
# a PNG: the training loss (and validation loss where evaluated) over steps
# on top, throughput (tokens/s) below. Needs gnuplot (Debian: gnuplot-nox;
# scripts/setup.sh installs it).
#   scripts/plot_metrics.sh runs/tiny/metrics.jsonl runs/tiny/metrics.png
#   scripts/plot_metrics.sh runs/tiny/metrics.jsonl -    (as text, on the terminal)
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: scripts/plot_metrics.sh METRICS.jsonl OUT.png|-" >&2
  exit 2
fi
in=$1 out=$2
[ -r "$in" ] || { echo "plot_metrics: cannot read $in" >&2; exit 1; }
command -v gnuplot >/dev/null || { echo "plot_metrics: gnuplot is not installed (apt-get install gnuplot-nox, or scripts/setup.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# one column file per series: "step value" (the trainer writes flat objects
# with numeric fields, so a field is "name":number)
field() { sed -n "s/.*\"step\":\([0-9]*\).*\"$1\":\([-0-9.eE+]*\).*/\1 \2/p" "$in"; }
field loss >"$tmp/loss"
field val_loss >"$tmp/val"
field tokens_per_s >"$tmp/tps"
[ -s "$tmp/loss" ] || { echo "plot_metrics: $in has no \"loss\" lines (is it a trainer metrics file?)" >&2; exit 1; }
# the loss plot's series: the training curve, and the validation points
# where the run evaluated (gnuplot refuses an empty data file)
series="\"$tmp/loss\" using 1:2 with lines lw 2 title \"train\""
[ -s "$tmp/val" ] && series="$series, \"$tmp/val\" using 1:2 with linespoints pt 7 lw 2 title \"validation\""
if [ "$out" = - ]; then # a terminal: text
  terminal='set terminal dumb size 100,40'
  output=''
else
  terminal='set terminal pngcairo size 900,700 noenhanced'
  output="set output \"$out\""
fi
cat >"$tmp/plot.gp" <<GP
$terminal
$output
set multiplot layout 2,1 title "$(basename "$in")"
set grid
set key below
set xlabel "step"
set ylabel "loss"
plot $series
set ylabel "tokens/s"
plot "$tmp/tps" using 1:2 with lines lw 2 title "throughput"
unset multiplot
GP
gnuplot "$tmp/plot.gp"
[ "$out" = - ] || echo "plot_metrics: wrote $out"

#!/usr/bin/env bash
# test_doc_commands.sh FSDPRUN ROOT: the launch commands the README and
# docs/ show for the CPU demos run on the machine the README describes (2
# cores, no GPU): every `fsdprun -n N` / `scripts/run.sh -n N` of
# recipes/tiny.lua or a recipes/demo_*.lua starts at most 2 ranks or says
# --oversubscribe (fsdprun refuses more ranks than cores; the 8B and 70B
# recipes' commands are for GPU machines); the README's own commands run,
# recipes cut to 2 steps, and so does its example recipe (3 steps); every
# code block that is a whole job runs as written.
set -u
fsdprun=$1
root=$2
. "$(dirname "$0")/checks.sh"
unset FSDPRUN_OVERSUBSCRIBE # (a suite's setting would hide the refusal)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root" || exit 1

# every documented launch: file:line: command
grep -noE '(scripts/run\.sh|fsdprun) -n ?[0-9]+[^`#|]*' README.md docs/*.md |
  grep -E 'recipes/(tiny|demo_[a-z_]*)\.lua' >"$work/cmds"
check "the docs show launch commands ($(wc -l <"$work/cmds") found)" "[ -s '$work/cmds' ]"
while IFS= read -r line; do
  n=$(sed -E 's/.* -n ?([0-9]+).*/\1/' <<<"$line")
  check "at most 2 ranks, or --oversubscribe: $line" "[ $n -le 2 ] || grep -q -- '--oversubscribe' <<<'$line'"
done <"$work/cmds"

# the README's commands that start a job, as a reader would type them (the
# build's fsdprun for scripts/run.sh, which builds first); --repl waits for
# a person and job.lua is a placeholder
grep -oE '(scripts/run\.sh|build/fsdprun) -n ?[0-9]+ [^`#|]*' README.md | grep -v -e '--repl' -e 'job\.lua' |
  sed -E 's/ +$//' | sort -u >"$work/readme"
while IFS= read -r cmd; do
  set -- $cmd
  shift
  extra=()
  grep -q 'recipes/tiny.lua' <<<"$cmd" && extra=(train.steps=2 train.eval_every=0 train.metrics="$work/m.jsonl")
  timeout 120 "$fsdprun" "$@" "${extra[@]}" >"$work/out" 2>&1
  rc=$?
  check "README: '$cmd' runs here (status $rc)" "[ $rc = 0 ]"
  [ $rc = 0 ] || tail -3 "$work/out"
done <"$work/readme"
# the README's example recipe trains here too (3 steps)
awk '/A file that returns a table is a recipe/ { on = 1 } on && /^```lua/ { inb = 1; next } inb && /^```/ { exit } inb' \
  README.md >"$work/readme_recipe.lua"
check "the README's example recipe found ($(wc -l <"$work/readme_recipe.lua") lines)" "grep -q '^return {' '$work/readme_recipe.lua'"
timeout 200 "$fsdprun" -n 2 "$work/readme_recipe.lua" train.steps=3 train.eval_every=0 train.metrics="$work/r.jsonl" \
  >"$work/out" 2>&1
rc=$?
check "README: its example recipe trains 3 steps on 2 ranks here (status $rc)" "[ $rc = 0 ] && grep -q '^\[0\] done: 3 steps' '$work/out'"
[ $rc = 0 ] || tail -3 "$work/out"
# every code block of the README and docs/ that is a whole job (it starts
# with `local fsdp = require "fsdp"`) runs on 2 ranks as it is written
for f in README.md docs/*.md; do
  awk -v out="$work/job" -v f="$(basename "$f" .md)" '
    /^```lua/ { on = 1; n++; buf = ""; next }
    /^```/ { if (on && buf ~ /^local fsdp = require "fsdp"/) { file = out "." f "." n ".lua"; printf "%s", buf > file; close(file) } on = 0; next }
    on { buf = buf $0 "\n" }' "$f"
done
jobs=$(ls "$work"/job.*.lua 2>/dev/null)
check "the docs hold whole jobs ($(wc -w <<<"$jobs") found)" "[ -n \"\$jobs\" ]"
for j in $jobs; do
  name=$(basename "$j" .lua)
  timeout 120 "$fsdprun" -n 2 "$j" >"$work/out" 2>&1
  rc=$?
  check "${name#job.} (block ${name##*.}): runs on 2 ranks as written (status $rc)" "[ $rc = 0 ]"
  [ $rc = 0 ] || tail -3 "$work/out"
done
finish test_doc_commands

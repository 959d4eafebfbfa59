#!/usr/bin/env bash
# test_doc_figures.sh FSDP_HOST ROOT: every figure the docs quote from the
# planner is the planner's. A docs table row "| `fsdp plan ARGS` | D GiB |
# H GiB |" is run (fsdp plan ARGS --json) and D (on the device) and H (in
# host memory) must match its output to the two decimals shown.
set -u
host=$1
root=$2
. "$(dirname "$0")/checks.sh"
cd "$root" || exit 1
rows=$(grep -hE '^\| `fsdp plan [^`]*` \| [0-9.]+ GiB \| [0-9.]+ GiB \|$' docs/*.md README.md)
check "the docs quote plans ($(grep -c . <<<"$rows") rows)" "[ -n \"\$rows\" ]"
while IFS= read -r row; do
  [ -n "$row" ] || continue
  args=$(sed -E 's/^\| `fsdp plan ([^`]*)`.*/\1/' <<<"$row")
  want=$(sed -E 's/.*` \| ([0-9.]+) GiB \| ([0-9.]+) GiB \|$/\1 \2/' <<<"$row")
  got=$("$host" plan $args --json 2>&1 | python3 -c '
import json, sys
d = json.load(sys.stdin)
off = d["resident"]["offloaded"]
print("%.2f %.2f" % ((d["peak"] - off) / 2**30, off / 2**30))' 2>&1)
  check "fsdp plan $args: $want GiB as the docs say (the planner: $got)" "[ '$got' = '$want' ]"
done <<<"$rows"
finish test_doc_figures

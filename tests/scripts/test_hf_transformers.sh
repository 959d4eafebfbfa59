#!/usr/bin/env bash
# test_hf_transformers.sh FSDPRUN FSDP ROOT: what a user checks first, with
# Hugging Face's own code: the demo trained on 2 ranks for 30 steps and
# exported (checkpoint.export_hf: fp32 with its own head, bf16 with the head
# tied to the embedding), loaded by transformers'
# LlamaForCausalLM.from_pretrained in float64, gives the logits our model
# gives on the same ids (tests/lua/hf_logits.lua) within 1e-4 of the largest
# (tests/scripts/hf_transformers_logits.py); and a model transformers writes
# (save_pretrained, random weights) imported gives its logits too. Needs
# torch and transformers
# in FSDP_TEST_PYTHON (default python3); skipped (77) without them.
set -u
fsdprun=$1 fsdp=$2 root=$3
. "$(dirname "$0")/checks.sh"
py=${FSDP_TEST_PYTHON:-python3}
if ! "$py" -c "import torch, transformers" 2>/dev/null; then
  echo "skipped: no torch and transformers in $py (set FSDP_TEST_PYTHON)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FSDPRUN_OVERSUBSCRIBE=1
# fp32 with the head its own; bf16 with the head tied to the embedding
for v in "fp32 untied false" "bf16 tied true"; do
  set -- $v
  d="$work/$1-$2"
  "$fsdprun" -n 2 --timeout 120 "$root/recipes/tiny.lua" train.steps=30 train.eval_every=0 train.log_every=30 \
    data.seq=64 model.tie_word_embeddings=$3 checkpoint.export_hf="$d" checkpoint.export_dtype=$1 >"$work/train.out" 2>&1
  check "$1 $2: the demo trains and exports" "[ -f '$d/config.json' ]" || cat "$work/train.out"
  "$fsdp" "$root/tests/lua/hf_logits.lua" "$d" "$root" "$work/ours.txt" $2 >"$work/ours.out" 2>&1
  check "$1 $2: our logits on the export" "[ -s '$work/ours.txt' ]" || cat "$work/ours.out"
  "$py" "$root/tests/scripts/hf_transformers_logits.py" "$d" "$work/ours.txt" >"$work/cmp.out" 2>&1
  rc=$?
  grep -v "Loading weights" "$work/cmp.out"
  check "$1 $2: transformers' logits on the export equal ours" "[ $rc = 0 ]"
  rm -f "$work/ours.txt"
done
# the other way: a folder written by transformers (save_pretrained, random
# weights) imported by our model
"$py" "$root/tests/scripts/hf_transformers_logits.py" --make "$work/from-hf" "$work/fp32-untied" >"$work/make.out" 2>&1
check "transformers writes a model" "[ -f '$work/from-hf/config.json' ]" || cat "$work/make.out"
"$fsdp" "$root/tests/lua/hf_logits.lua" "$work/from-hf" "$root" "$work/ours.txt" >"$work/ours.out" 2>&1
check "our model imports transformers' folder" "[ -s '$work/ours.txt' ]" || cat "$work/ours.out"
"$py" "$root/tests/scripts/hf_transformers_logits.py" "$work/from-hf" "$work/ours.txt" >"$work/cmp.out" 2>&1
rc=$?
grep -v "Loading weights" "$work/cmp.out"
check "transformers' model imported: its logits equal ours" "[ $rc = 0 ]"
finish test_hf_transformers

#!/usr/bin/env bash
# test_hf_transformers.sh FSDPRUN FSDP ROOT: what a user checks first, with
# Hugging Face's own code: the demo trained on 2 ranks for 30 steps and
# exported (checkpoint.export_hf: fp32 with its own head, bf16 with the head
# tied to the embedding), loaded by transformers'
# LlamaForCausalLM.from_pretrained in float64, gives the logits our model
# gives on the same ids (tests/lua/hf_logits.lua) within 1e-4 of the largest
# (tests/scripts/hf_transformers_logits.py); and a model transformers writes
# (save_pretrained, random weights) imported gives its logits too. The
# export is a whole folder: AutoTokenizer loads its byte-level tokenizer;
# fsdp generate's greedy tokens equal transformers' generate token for token
# (tests/scripts/hf_generate.py) on the export and on a model with wide
# random weights. Needs torch and transformers in FSDP_TEST_PYTHON (default
# python3; scripts/test.sh sets the project's .venv); skipped (77) without them.
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
# Llama 3.1's rotary scaling and a head_dim that is not hidden / heads, as
# transformers writes them (rope_parameters): imported, our logits equal
# theirs; exported again by us (rope_theta, rope_scaling and head_dim in our
# config.json), transformers reads the same model. The control: the same
# folder with the scaling taken out gives other logits (the check sees it).
"$py" "$root/tests/scripts/hf_transformers_logits.py" --make "$work/llama3" "$work/fp32-untied" llama3 >"$work/make.out" 2>&1
check "transformers writes a llama3-scaled model" "[ -f '$work/llama3/config.json' ]" || cat "$work/make.out"
rm -f "$work/ours.txt"
"$fsdp" "$root/tests/lua/hf_logits.lua" "$work/llama3" "$root" "$work/ours.txt" folder "$work/llama3-ours" >"$work/ours.out" 2>&1
check "our model imports it, its architecture from config.json" "[ -s '$work/ours.txt' ]" || cat "$work/ours.out"
for d in llama3 llama3-ours; do
  "$py" "$root/tests/scripts/hf_transformers_logits.py" "$work/$d" "$work/ours.txt" >"$work/cmp.out" 2>&1
  rc=$?
  grep -v "Loading weights" "$work/cmp.out"
  check "rope_type llama3, head_dim 48 ($d): transformers' logits equal ours" "[ $rc = 0 ]"
done
check "our export says head_dim 48 and rope_type llama3" \
  "grep -q '\"head_dim\": *48' '$work/llama3-ours/config.json' && grep -q '\"rope_type\": *\"llama3\"' '$work/llama3-ours/config.json'"
cp -r "$work/llama3" "$work/unscaled"
"$py" -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['rope_parameters'] = {'rope_type': 'default', 'rope_theta': 500000.0}; c.pop('rope_scaling', None); json.dump(c, open(p, 'w'))" "$work/unscaled/config.json"
"$py" "$root/tests/scripts/hf_transformers_logits.py" "$work/unscaled" "$work/ours.txt" >"$work/cmp.out" 2>&1
rc=$?
grep -v "Loading weights" "$work/cmp.out"
check "control: without the scaling transformers' logits differ from ours" "[ $rc = 1 ]"
# an export is a whole Hugging Face folder: transformers' AutoTokenizer
# loads its byte-level tokenizer (each byte its own id) and generates
"$py" - "$work/fp32-untied" >"$work/tok.out" 2>&1 <<'PY'
import sys
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
text = "héllo, wörld\n"
ids = t(text)["input_ids"]
assert ids == list(text.encode()), ids
assert t.decode(ids) == text
print("AutoTokenizer: ok")
PY
check "AutoTokenizer loads the export's tokenizer: ids are the bytes" "grep -q 'AutoTokenizer: ok' '$work/tok.out'" ||
  cat "$work/tok.out"
# fsdp generate's greedy tokens (KV cache, fp32) against transformers'
# generate (float64, its KV cache) token for token: on the trained export,
# and on a model with wide random weights (tokens that vary)
"$py" "$root/tests/scripts/hf_generate.py" --make "$work/wide" "$work/fp32-untied" >"$work/make.out" 2>&1
check "transformers writes a wide random model" "[ -f '$work/wide/config.json' ]" || cat "$work/make.out"
prompt="84 104 101 32 115 104 97 114 100"
for d in fp32-untied wide; do
  ours=$("$fsdp" generate "$work/$d" --ids "$prompt" --max-new-tokens 48 --greedy --no-stop --print-ids 2>"$work/gen.err" |
    sed -n 's/^ids: //p')
  check "$d: fsdp generate makes 48 tokens" "[ \$(echo '$ours' | wc -w) = 48 ]" || cat "$work/gen.err"
  "$py" "$root/tests/scripts/hf_generate.py" "$work/$d" "$prompt" "$ours" >"$work/cmp.out" 2>&1
  rc=$?
  grep -v "Loading weights" "$work/cmp.out"
  check "$d: transformers' greedy generate gives our tokens" "[ $rc = 0 ]"
done
finish test_hf_transformers

#!/usr/bin/env bash
# test_own_data.sh FSDPRUN FSDP ROOT: recipes/own_data.lua, the path from a
# folder of text to a model that writes it, as the recipe's header and
# docs/TRAINING.md tell it: the header's four commands run as written in a
# folder laid out as a fresh clone (no runs/): a BPE tokenizer trained by
# `tokenizers` on the docs, the docs tokenized with it (fsdp prepare), 2 ranks
# (40 steps instead of 300) with samples at the evaluations, a checkpoint and
# an fp32 export, fsdp generate from the checkpoint; then
#   * the checkpoint's hf/ folder and the export carry the tokenizer's files
#     byte for byte, and generation_config.json's end-of-text id
#   * fsdp generate from the checkpoint and from the export: the same
#     tokens; the prompt's ids are `fsdp prepare encode`'s
#   * with torch and transformers (FSDP_TEST_PYTHON, else skipped saying so):
#     AutoTokenizer on the export gives `fsdp prepare encode`'s ids, and
#     transformers' greedy generate gives our tokens (hf_generate.py); and a
#     fine-tune of a "downloaded" Llama (a folder transformers writes, with
#     the tokenizer beside its weights): its data prepared with that folder,
#     model.from_hf, a sample, an export transformers generates from as we do
# Skipped (77) where the project's Python environment cannot be made.
set -u
fsdprun=$1 fsdp=$2 root=$3
. "$(dirname "$0")/checks.sh"
python_env_or_skip "$root"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FSDPRUN_OVERSUBSCRIBE=1
cd "$root" || exit 1
docs=(README.md docs/*.md)
# The recipe's header commands, as written, in a folder laid out as a fresh
# clone (build/, recipes/, README.md, docs/; no runs/): the first one makes
# runs/own/ itself. Read from the recipe, so the test follows its header;
# only the training is shortened (40 steps, evaluations at 20 and 40).
clone=$work/clone
fresh_clone "$clone" "$fsdp" "$fsdprun" "$root"
mapfile -t header < <(sed -n 's/^--   \(build\/.*\)$/\1/p' recipes/own_data.lua)
check "the recipe's header names 4 commands (${#header[@]})" "[ ${#header[@]} = 4 ]"
short="train.steps=40 train.eval_every=20 checkpoint.every=40"
for i in "${!header[@]}"; do
  c=${header[$i]}
  case $c in build/fsdprun*) c="$c $short" ;; esac
  (cd "$clone" && bash -c "$c") >"$work/header$i.out" 2>&1
  check "as written in a fresh clone: $c" "[ $? = 0 ]" || tail -5 "$work/header$i.out"
done
own=$clone/runs/own
cp "$work/header2.out" "$work/train.out"
check "recipes/own_data.lua trains 40 steps on it" "grep -q '^\[0\] done: 40 steps' '$work/train.out'" || tail -5 "$work/train.out"
check "fsdp generate from the header: the prompt through the tokenizer, text out" \
  "grep -q '^fsdp generate: [0-9]* prompt tokens' '$work/header3.out'" ||
  cat "$work/header3.out"
check "a sample at each evaluation, through the BPE tokenizer" \
  "[ \$(grep -c '^\[0\] sample step [24]0 | The shard' '$work/train.out') = 2 ]" || grep sample "$work/train.out"
for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
  check "the checkpoint and the export carry $f as the tokenizer folder has it" \
    "cmp -s '$own/tokenizer/$f' '$own/ckpt/step-00000040/hf/$f' && cmp -s '$own/tokenizer/$f' '$own/export/$f'"
done
a=$("$fsdp" generate "$own/ckpt" --prompt "The shard" --max-new-tokens 24 --greedy --no-stop --print-ids 2>"$work/gen.err" |
  sed -n 's/^ids: //p')
b=$("$fsdp" generate "$own/export" --prompt "The shard" --max-new-tokens 24 --greedy --no-stop --print-ids 2>/dev/null |
  sed -n 's/^ids: //p')
check "fsdp generate: 24 tokens from the checkpoint, the same from the export" "[ \$(echo '$a' | wc -w) = 24 ] && [ '$a' = '$b' ]" ||
  { cat "$work/gen.err"; echo "$a / $b"; }
prompt=$(printf 'The shard' | "$fsdp" prepare encode --tokenizer "$own/tokenizer")
check "the prompt went through the tokenizer: $(echo $prompt | wc -w) ids, as fsdp prepare encode gives" \
  "grep -q \"^fsdp generate: $(echo $prompt | wc -w) prompt tokens .*tokenizer .*hf/tokenizer.json\" '$work/gen.err'" ||
  cat "$work/gen.err"

py=${FSDP_TEST_PYTHON:-python3}
if ! "$py" -c "import torch, transformers" 2>/dev/null; then
  echo "skipped: the checks with transformers (no torch and transformers in $py; scripts/test.sh sets FSDP_TEST_PYTHON)"
  finish test_own_data
  exit
fi
T=$'\t'
# in one Python process (tests/scripts/hf_jobs.py): AutoTokenizer on the
# export, transformers' greedy generate on it, and a "downloaded" Llama: a
# folder as transformers writes one, its tokenizer beside the weights (here
# the one trained above), for a fine-tune
hf_jobs "$py" "$work/py1" "tokenizer${T}hf_tokenizer.py${T}$own/export${T}The shard${T}$prompt" \
  "generate${T}hf_generate.py${T}$own/export${T}$prompt${T}$a" "make${T}hf_generate.py${T}--make${T}$work/llama${T}$own/export"
check "AutoTokenizer on the export gives fsdp prepare's ids" "[ $(job_rc "$work/py1" tokenizer) = 0 ]"
check "transformers' greedy generate on the export gives our tokens" "[ $(job_rc "$work/py1" generate) = 0 ]"
check "a 'downloaded' Llama folder (transformers' save_pretrained, with its tokenizer)" \
  "[ -f '$work/llama/config.json' ] && [ -f '$work/llama/tokenizer.json' ]" || job_rc "$work/py1" make
"$fsdp" prepare --tokenizer "$work/llama" --out "$work/ftdata" "${docs[@]}" >"$work/prep.out" 2>&1
check "the data prepared with the model's own tokenizer" "[ -s '$work/ftdata/train.bin' ]" || cat "$work/prep.out"
# a recipe's vocab_size (1024) against the folder's (2048): refused as a
# configuration (status 78), naming both
"$fsdprun" -n 2 --timeout 120 recipes/own_data.lua model.from_hf="$work/llama" model.vocab_size=1024 \
  data.token_file="$work/ftdata/train.bin" \
  train.metrics="$work/ft0.jsonl" >"$work/ft0.out" 2>&1
rc=$?
check "a recipe field against the folder's config.json: status 78 ($rc), both named" \
  "[ $rc = 78 ] && grep -q 'model.from_hf: .*llama/config.json has vocab_size = 2048; .*has vocab_size = 1024' '$work/ft0.out'" ||
  tail -3 "$work/ft0.out"
"$fsdprun" -n 2 --timeout 120 recipes/own_data.lua model.from_hf="$work/llama" data.token_file="$work/ftdata/train.bin" \
  data.val_token_file="$work/ftdata/val.bin" data.seq=64 train.steps=20 train.eval_every=20 train.metrics="$work/ft.jsonl" \
  checkpoint.dir="$work/ftck" checkpoint.every=20 checkpoint.export_hf="$work/ftexport" >"$work/ft.out" 2>&1
check "fine-tuned from model.from_hf: initial weights from the folder, a sample, an export" \
  "grep -q 'initial weights from $work/llama' '$work/ft.out' && grep -q '^\[0\] sample step 20 | The shard' '$work/ft.out' && [ -f '$work/ftexport/tokenizer.json' ]" ||
  tail -5 "$work/ft.out"
c=$("$fsdp" generate "$work/ftexport" --prompt "The shard" --max-new-tokens 24 --greedy --no-stop --print-ids 2>/dev/null |
  sed -n 's/^ids: //p')
hf_jobs "$py" "$work/py2" "generate${T}hf_generate.py${T}$work/ftexport${T}$prompt${T}$c"
check "transformers' greedy generate on the fine-tune's export gives our tokens" "[ $(job_rc "$work/py2" generate) = 0 ]"
finish test_own_data

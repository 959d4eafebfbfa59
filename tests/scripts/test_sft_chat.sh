#!/usr/bin/env bash
# test_sft_chat.sh FSDPRUN FSDP ROOT: recipes/sft_chat.lua, supervised
# fine-tuning on chat data, as the recipe's header tells it: its commands
# run as written in a folder laid out as a fresh clone (no runs/; the base
# model's pretraining shortened to 60 steps): a ChatML BPE tokenizer
# (train-tokenizer --chat-template chatml), the docs tokenized and a base
# model trained on them and exported, recipes/data/chat_arith.jsonl
# prepared with --chat (the loss mask and document index beside the
# tokens), the fine-tune (packed rows, the assistant's tokens as targets),
# and fsdp generate on its export; then
#   * the trainer packed the conversations and trained on the mask
#   * the fine-tune's loss falls to under half its first value
#   * its sample at the end opens an answer ("N plus M is K") and closes
#     the turn (<|im_end|>); fsdp generate from its export answers in the
#     whole format ("N plus M is K." then <|im_end|>) and stops there
#   * the base model's answer to the same prompt is not of that form: the
#     fine-tune changed it
#   * data.max_tokens: refused beside the recipe's own data.seq, naming it;
#     with them made to agree, rows of that many tokens train
# Skipped (77) where the project's Python environment cannot be made.
set -u
fsdprun=$1 fsdp=$2 root=$3
. "$(dirname "$0")/checks.sh"
python_env_or_skip "$root"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FSDPRUN_OVERSUBSCRIBE=1
cd "$root" || exit 1
clone=$work/clone
fresh_clone "$clone" "$fsdp" "$fsdprun" "$root"
mapfile -t header < <(sed -n 's/^--   \(build\/.*\)$/\1/p' recipes/sft_chat.lua)
check "the recipe's header names 6 commands (${#header[@]})" "[ ${#header[@]} = 6 ]"
for i in "${!header[@]}"; do
  c=${header[$i]}
  case $c in build/fsdprun*own_data*) c="$c train.steps=60 train.eval_every=60" ;; esac
  (cd "$clone" && bash -c "$c") >"$work/header$i.out" 2>&1
  check "as written in a fresh clone: ${c:0:90}..." "[ $? = 0 ]" || tail -5 "$work/header$i.out"
done
chat=$clone/runs/chat
check "prepare --chat wrote the loss mask and the document index" \
  "[ -s '$chat/sft_data/train.mask' ] && [ -s '$chat/sft_data/train.idx' ]" || ls "$chat/sft_data"
sft=$work/header4.out
check "the fine-tune packs the conversations and trains on the mask" \
  "grep -q '^\[0\] data: [0-9]* pieces of documents packed into [0-9]* rows of 128 tokens .*the loss mask says' '$sft'" ||
  grep -E '^\[0\] (data|fsdp):' "$sft"
read -r first last < <(sed -n 's/^\[0\] done: .*loss \([0-9.]*\) -> \([0-9.]*\);.*/\1 \2/p' "$sft")
check "its loss falls to under half: ${first:-?} -> ${last:-?}" "awk -v a='${first:-0}' -v b='${last:-9}' 'BEGIN { exit !(b < a / 2) }'"
form='[0-9]+ (plus|minus) [0-9]+ is [0-9]+\.<\|im_end\|>'
# (the sample, fp32 at temperature 0.1, opens an answer and closes the
# turn; its tail after "N op M is K" varies with the base model, which
# the repository's own docs train: a docs edit changed it to "... is 3 is
# 2.". The export's greedy answer below is held to the whole form.)
opened='[0-9]+ (plus|minus) [0-9]+ is [0-9]+[^<]*<\|im_end\|>'
check "its last sample answers in the chat format" \
  "grep -E '^\[0\] sample step 120 \| .*<\|im_start\|>assistant\\\\n$opened\$' '$sft'" || grep sample "$sft"
gen=$work/header5.out
check "fsdp generate on its export answers in the format and stops at <|im_end|>" \
  "tail -1 '$gen' | grep -Eq '^$form\$'" || tail -3 "$gen"
prompt=$'<|im_start|>user\nWhat is 12 plus 30?<|im_end|>\n<|im_start|>assistant\n'
"$fsdp" generate "$chat/base" --greedy --max-new-tokens 16 --prompt "$prompt" >"$work/base.out" 2>"$work/base.err"
answer=$(awk 'seen { printf "%s\\n", $0 } /^<\|im_start\|>assistant$/ { seen = 1 }' "$work/base.out")
check "the base model answered otherwise: the fine-tune changed it ('${answer:0:60}')" \
  "grep -q 'prompt tokens' '$work/base.err' && ! printf '%s' '$answer' | grep -Eq '^$form'" || cat "$work/base.err"
# data.max_tokens: one packed row of that many tokens a micro-batch
(cd "$clone" && build/fsdprun -n 2 recipes/sft_chat.lua data.max_tokens=512 train.steps=6 train.eval_every=0 \
  train.metrics="$work/mt.jsonl" checkpoint.dir="$work/mtck" checkpoint.export_hf="$work/mtx") >"$work/mt0.out" 2>&1
check "data.max_tokens with the recipe's data.seq and micro_batch is refused, naming them" \
  "grep -q 'data.max_tokens = 512 sets each micro-batch to one packed row of 512 tokens: leave data.seq (128) and data.micro_batch (4) out' '$work/mt0.out'" ||
  tail -3 "$work/mt0.out"
(cd "$clone" && build/fsdprun -n 2 recipes/sft_chat.lua data.max_tokens=1024 data.seq=1024 data.micro_batch=1 train.steps=6 \
  train.eval_every=0 train.metrics="$work/mt.jsonl" checkpoint.dir="$work/mtck" checkpoint.export_hf="$work/mtx") >"$work/mt.out" 2>&1
check "data.max_tokens=1024: rows of 1024 tokens, past the model's 512 positions (each conversation's restart), 6 steps" \
  "grep -q 'packed into [0-9]* rows of 1024 tokens' '$work/mt.out' && grep -q '^\[0\] done: 6 steps' '$work/mt.out'" ||
  tail -5 "$work/mt.out"
finish test_sft_chat

#!/usr/bin/env bash
# test_generate.sh FSDPRUN FSDP ROOT: fsdp generate as a user meets it.
# The tiny recipe on fixed text, 2 ranks, 40 steps, a checkpoint and an fp32
# export, train.sample_tokens at the evaluations:
#   * each evaluation prints a sample line; the checkpoint's hf/ folder and
#     the export hold config.json, a byte-level tokenizer.json and
#     generation_config.json
#   * `fsdp generate` from the checkpoint directory, from its step-N folder
#     and from the export give the same tokens (the same weights: fp32
#     export), greedy and sampled with a seed; the same seed twice the same
#     text, the text is the prompt and then the new tokens' bytes
#   * the byte-level tokenizer.json, read by Hugging Face `tokenizers`
#     (the project's Python environment), gives each byte its own value as
#     id, and back (skipped, saying so, where that environment cannot be made)
#   * refusals, each naming what was wrong: an unknown option (status 2),
#     a folder that is neither a checkpoint nor a model, a checkpoint saved
#     before checkpoints carried config.json, a length past the model's
#     positions, an id outside the vocabulary, a damaged checkpoint (its
#     checksum), and a train.sample_prompt longer than the model's positions
#     (status 78, before training)
set -u
fsdprun=$1 fsdp=$2 root=$3
. "$(dirname "$0")/checks.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FSDPRUN_OVERSUBSCRIBE=1
fixed_recipe "$work" "$root"
"$fsdprun" -n 2 --timeout 120 "$work/fixed.lua" train.steps=40 train.eval_every=20 train.log_every=20 data.seq=64 \
  train.sample_tokens=24 train.sample_prompt="the shard" checkpoint.dir="$work/ck" checkpoint.every=40 \
  checkpoint.export_hf="$work/export" checkpoint.export_dtype=fp32 train.metrics="$work/m.jsonl" >"$work/train.out" 2>&1
check "the run trains and exports" "[ -f '$work/export/config.json' ]" || cat "$work/train.out"
check "a sample line at each evaluation, from the prompt" \
  "[ \$(grep -c '\\[0\\] sample step [24]0 | the shard' '$work/train.out') = 2 ]" || grep sample "$work/train.out"
for f in config.json tokenizer.json tokenizer_config.json generation_config.json; do
  check "the checkpoint carries $f" "[ -s '$work/ck/step-00000040/hf/$f' ]"
  check "the export holds $f" "[ -s '$work/export/$f' ]"
done

gen() { "$fsdp" generate "$@" --print-ids 2>"$work/gen.err"; }
for mode in "--greedy" "--temperature 0.9 --top-k 20 --top-p 0.9 --seed 3"; do
  a=$(gen "$work/ck" --prompt "the unit" --max-new-tokens 30 $mode | sed -n 's/^ids: //p')
  b=$(gen "$work/ck/step-00000040" --prompt "the unit" --max-new-tokens 30 $mode | sed -n 's/^ids: //p')
  c=$(gen "$work/export" --prompt "the unit" --max-new-tokens 30 $mode | sed -n 's/^ids: //p')
  check "$mode: 30 tokens from the checkpoint" "[ \$(echo '$a' | wc -w) = 30 ]" || cat "$work/gen.err"
  check "$mode: the step folder and the export give the same tokens" "[ '$a' = '$b' ] && [ '$a' = '$c' ]" ||
    printf '%s\n%s\n%s\n' "$a" "$b" "$c"
done
t1=$(gen "$work/export" --prompt "the unit" --max-new-tokens 20 --temperature 1 --seed 9)
t2=$(gen "$work/export" --prompt "the unit" --max-new-tokens 20 --temperature 1 --seed 9)
check "the same seed, the same text" "[ '$t1' = '$t2' ]"
gen "$work/export" --prompt "the unit" --max-new-tokens 20 --temperature 1 --seed 9 >"$work/t1"
ids=$(sed -n '$s/^ids: //p' "$work/t1")
sed '$d' "$work/t1" >"$work/text" # the text, then a line of ids
{ printf 'the unit'; for v in $ids; do printf "\\$(printf '%03o' "$v")"; done; printf '\n'; } >"$work/want"
check "the text is the prompt and the new tokens' bytes" "cmp -s '$work/text' '$work/want'" || od -c "$work/text" | head
check "generate says what it did" "grep -q '8 prompt tokens in .* 20 new in .*tokenizer bytes' '$work/gen.err'" || cat "$work/gen.err"

if py=$("$root/scripts/python_env.sh" 2>"$work/env.err"); then
  "$py" - "$work/export" >"$work/tok.out" 2>&1 <<'PY'
import sys
from tokenizers import Tokenizer
t = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
every = bytes(range(256))
text = every.decode("latin-1") + "héllo wörld\n\t\"\\"
ids = t.encode(text).ids
assert t.get_vocab_size() == 256, t.get_vocab_size()
assert ids == list(text.encode()), ids[:20]
assert t.decode(ids) == text
print("byte-level tokenizer: ok")
PY
  check "the byte-level tokenizer.json gives each byte its value as id, and back (tokenizers)" \
    "grep -q 'byte-level tokenizer: ok' '$work/tok.out'" || cat "$work/tok.out"
else
  echo "skipped: the tokenizers check (the project's Python environment: $(tail -1 "$work/env.err"))"
fi

"$fsdp" generate "$work/export" --bogus >/dev/null 2>"$work/e1"
rc=$?
check "an unknown option: status 2, named" "[ $rc = 2 ] && grep -q \"unknown option '--bogus'\" '$work/e1'" || cat "$work/e1"
mkdir -p "$work/empty"
"$fsdp" generate "$work/empty" --prompt x >/dev/null 2>"$work/e2"
check "a folder that is neither: named" "grep -q 'neither a checkpoint' '$work/e2'" || cat "$work/e2"
cp -r "$work/ck" "$work/old" && rm -rf "$work/old/step-00000040/hf"
"$fsdp" generate "$work/old" --prompt x >/dev/null 2>"$work/e3"
check "a checkpoint without hf/config.json: says so and what to do" \
  "grep -q 'has no config.json: it was saved before' '$work/e3'" || cat "$work/e3"
"$fsdp" generate "$work/export" --prompt x --max-new-tokens 600 >/dev/null 2>"$work/e4"
check "past max_position_embeddings: refused naming it" "grep -q \"pass the model's max_position_embeddings 512\" '$work/e4'" ||
  cat "$work/e4"
"$fsdp" generate "$work/export" --ids "1 999" >/dev/null 2>"$work/e5"
check "an id outside the vocabulary: named" "grep -q 'prompt token 2 is 999, outside the vocabulary' '$work/e5'" || cat "$work/e5"
"$fsdp" generate "$work/export" --prompt x --temperature -1 >/dev/null 2>"$work/e8"
check "a bad sampling option: named, with no Lua position" "grep -qx 'fsdp generate: temperature = -1; expected a number >= 0 (0: greedy)' '$work/e8'" ||
  cat "$work/e8"
# a damaged checkpoint: a flipped byte in a rank's file is found by its
# checksum and named, not sampled from
cp -r "$work/ck" "$work/bad"
f=$(ls "$work/bad/step-00000040"/rank-*.bin | head -1)
printf '\377' | dd of="$f" bs=1 seek=4096 conv=notrunc 2>/dev/null
"$fsdp" generate "$work/bad" --prompt x >/dev/null 2>"$work/e6"
rc=$?
check "a damaged checkpoint: refused (status $rc), the file and its checksum named" \
  "[ $rc = 1 ] && grep -q 'rank-00000.bin' '$work/e6' && grep -qi 'crc' '$work/e6'" || cat "$work/e6"
# a sample prompt longer than the model's positions: refused before training (78)
"$fsdprun" -n 2 --timeout 60 "$work/fixed.lua" train.steps=2 data.seq=64 model.max_position_embeddings=64 \
  train.sample_tokens=8 train.eval_every=1 train.sample_prompt="$(printf 'x%.0s' $(seq 80))" train.metrics="$work/m2.jsonl" \
  >"$work/e7" 2>&1
rc=$?
check "train.sample_prompt past max_position_embeddings: refused before training (status $rc), named" \
  "[ $rc = 78 ] && grep -q 'train.sample_prompt is 80 tokens; the model.s max_position_embeddings is 64' '$work/e7'" ||
  tail -3 "$work/e7"
finish test_generate

#!/usr/bin/env bash
# test_prepare_chat.sh FSDPRUN FSDP ROOT: `fsdp prepare --chat` (issue 47)
# against transformers' own apply_chat_template, and the document index
# (.idx) every preparation writes. The inputs and the comparisons are
# tests/scripts/check_chat.py's:
#   * a small BPE with chat special tokens; three templates (Llama 3's shape,
#     ChatML, Llama 2's with a default system prompt and raise_exception),
#     each with {% generation %} blocks and without, their text in
#     tokenizer_config.json (a string, a list of named templates) or
#     chat_template.jinja; conversations: multi-turn, system prompts,
#     unicode, special-token text in content, no assistant turn, a token
#     that starts in the template's text and ends in the assistant's; read
#     from JSONL, .jsonl.gz and parquet;
#   * our ids are apply_chat_template(tokenize=True)'s; our mask its
#     assistant_masks (return_assistant_tokens_mask) on the templates with
#     blocks, and the prefix rule gives the same mask on those without;
#     --mask all; the .idx offsets and the split; the manifest's chat fields;
#   * 1 and 3 workers: the same bytes (.bin, .idx, .mask, manifest);
#   * refusals, one line, status 1, no traceback, no OUT: a folder without a
#     template, --tokenizer bytes, a template whose generation prompt is not
#     what its history renders, raise_exception on a bad role order
#     (file:line named), malformed conversations (file:line, message index);
#   * plain text: train.bin and val.bin byte for byte those of the tool
#     before .idx existed (its scripts/prepare_data.py from git, where the
#     checkout has the history), and .idx cuts them into the documents.
# Needs transformers, tokenizers, pyarrow and jinja2 in FSDP_TEST_PYTHON
# (scripts/test.sh sets the project's torch environment; default python3),
# which `fsdp prepare` runs with too (FSDP_PYTHON); skipped (77) without them.
set -u
fsdprun=$1 fsdp=$2 root=$3
. "$(dirname "$0")/checks.sh"
py=${FSDP_TEST_PYTHON:-python3}
if ! "$py" -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, sys.argv[1:])))" \
  transformers tokenizers pyarrow jinja2 2>/dev/null; then
  echo "skipped: no transformers (with tokenizers, pyarrow, jinja2) in $py (set FSDP_TEST_PYTHON)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FSDP_PYTHON=$py
chk="$(dirname "$0")/check_chat.py"
prep() { "$fsdp" prepare "$@"; }
"$py" "$chk" make "$work" "$root"

# ---- the six templates, each from another input kind; --mask all; plain text
frac=0.25
made=0
for v in "llama3 convs.jsonl" "llama3-plain convs.parquet" "chatml convs.jsonl.gz" "chatml-plain convs.jsonl" \
  "sys convs.parquet" "sys-plain convs.jsonl"; do
  set -- $v
  prep --chat --tokenizer "$work/tok_$1" --out "$work/o_$1" --val-fraction $frac --workers 1 "$work/$2" 2>"$work/p.err" &&
    made=$((made + 1)) || tail -n 3 "$work/p.err"
done
check "--chat: six preparations, three templates with and without generation blocks ($made made)" "[ $made = 6 ]"
prep --chat --mask all --tokenizer "$work/tok_chatml" --out "$work/o_chatml-all" --val-fraction $frac --workers 1 "$work/convs.jsonl" 2>"$work/p.err" ||
  tail -n 3 "$work/p.err"
prep --tokenizer "$work/tok_llama3" --out "$work/o_text" --val-fraction $frac --workers 1 "$work/text" 2>"$work/p.err" ||
  tail -n 3 "$work/p.err"

# ---- against transformers: one Python process (importing it takes a few seconds)
"$py" "$chk" check "$work" $frac >"$work/check.out" 2>"$work/check.err"
rc=$?
while IFS= read -r line; do
  case $line in
    ok:\ *) ok "${line#ok: }" ;;
    FAILED:\ *) bad "${line#FAILED: }" ;;
  esac
done <"$work/check.out"
check "check_chat.py ran to its end (status $rc)" "[ $rc = 0 ] || grep -q '^FAILED' '$work/check.out'" ||
  tail -n 5 "$work/check.err"

# ---- any worker count: the same bytes
export FSDP_PREPARE_CHUNK_DOCS=2 # several chunks in flight
for v in llama3 sys-plain; do
  for w in 1 3; do
    prep --chat --tokenizer "$work/tok_$v" --out "$work/w${w}_$v" --val-fraction $frac --workers $w "$work/convs.jsonl" 2>/dev/null
  done
  same=1
  for f in train.bin val.bin train.idx val.idx train.mask val.mask manifest.json; do
    cmp -s "$work/w1_$v/$f" "$work/w3_$v/$f" || same=0
  done
  check "$v: 1 and 3 workers write the same train/val .bin, .idx, .mask and manifest.json" "[ $same = 1 ]"
done
unset FSDP_PREPARE_CHUNK_DOCS

# ---- refusals
refused() { # NAME PATTERN OUT args...: status 1, one line matching PATTERN, no traceback, no OUT
  local name=$1 pattern=$2 out=$3
  shift 3
  prep --out "$out" "$@" 2>"$work/r.err" >/dev/null
  local rc=$?
  check "$name (status $rc)" "[ $rc = 1 ] && grep -q -- \"$pattern\" '$work/r.err' && ! grep -q Traceback '$work/r.err' &&
    [ ! -e '$out' ] && [ \$(wc -l <'$work/r.err') = 1 ]" || cat "$work/r.err"
}
refused "a folder without a chat template: refused, naming it" \
  "^fsdp prepare: --chat: $work/tok_none has no chat template (tokenizer_config.json chat_template or chat_template.jinja)\$" \
  "$work/r1" --chat --tokenizer "$work/tok_none" "$work/convs.jsonl"
refused "--chat --tokenizer bytes: refused" "--chat: --tokenizer bytes has no chat template" \
  "$work/r2" --chat --tokenizer bytes "$work/convs.jsonl"
refused "a template whose generation prompt is not what its history renders: refused, naming it and the message" \
  "convs.jsonl:1: message 1: the chat template ($work/tok_think/tokenizer_config.json chat_template) does not render" \
  "$work/r3" --chat --tokenizer "$work/tok_think" --workers 1 "$work/convs.jsonl"
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}' \
  '{"messages": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]}' >"$work/roles.jsonl"
refused "raise_exception in the template (roles out of order): refused, naming file:line and its message" \
  "$work/roles.jsonl:2: the chat template ($work/tok_sys/chat_template.jinja) refuses this conversation: Conversation roles must alternate" \
  "$work/r4" --chat --tokenizer "$work/tok_sys" --workers 2 "$work/roles.jsonl"
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}]}' \
  '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 5}]}' >"$work/bad1.jsonl"
refused "a message whose content is not a string: refused, naming file:line and the message index" \
  "$work/bad1.jsonl:2: message 1: field 'content' is a JSON int, expected a string" \
  "$work/r5" --chat --tokenizer "$work/tok_chatml" "$work/bad1.jsonl"
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}]}' '{"messages": [{"content": "who?"}]}' >"$work/bad2.jsonl"
refused "a message without a role: refused, naming file:line and the message index" \
  "$work/bad2.jsonl:2: message 0: no field 'role' (the object has: content)" \
  "$work/r6" --chat --tokenizer "$work/tok_chatml" "$work/bad2.jsonl"
printf '%s\n' '{"messages": "hello"}' >"$work/bad3.jsonl"
refused "messages that are not a list: refused, naming file:line" \
  "$work/bad3.jsonl:1: field 'messages' is a JSON str, expected a list of messages" \
  "$work/r7" --chat --tokenizer "$work/tok_chatml" "$work/bad3.jsonl"

# ---- plain text: the bytes of the tool before .idx (scripts/prepare_data.py
# at a commit before it), where this checkout has its history
old=9388a7c195795485c5caa7915154389cc64c6012
if git -C "$root" show "$old:scripts/prepare_data.py" >"$work/old_prepare.py" 2>/dev/null; then
  "$py" "$work/old_prepare.py" --tokenizer "$work/tok_llama3" --out "$work/o_text_old" --val-fraction $frac --workers 1 \
    "$work/text" 2>/dev/null
  check "plain text: train.bin and val.bin byte for byte those of the tool before .idx (git $old)" \
    "cmp -s '$work/o_text/train.bin' '$work/o_text_old/train.bin' && cmp -s '$work/o_text/val.bin' '$work/o_text_old/val.bin'"
else
  echo "skipped: plain text byte for byte against the tool before .idx (no git history of $old in $root)"
fi
finish test_prepare_chat

#!/usr/bin/env bash
# test_hf_transformers.sh FSDPRUN FSDP ROOT: what a user checks first, with
# Hugging Face's own code: the demo trained on 2 ranks for 30 steps and
# exported (checkpoint.export_hf: fp32 with its own head, bf16 with the head
# tied to the embedding), loaded by transformers'
# LlamaForCausalLM.from_pretrained in float64, gives the logits our model
# gives on the same ids (tests/lua/hf_logits.lua) within 1e-4 of the largest
# (tests/scripts/hf_transformers_logits.py); and a model transformers writes
# (save_pretrained, random weights; 4 heads, 2 kv heads) imported gives its
# logits too, and so it does at tensor and context parallel meshes: tp 2
# (kv heads split), cp 2 (its attention all-gathered, and as a ring), cp 2
# x tp 2 and tp 4 (each kv head shared by two tp ranks), within the same
# bound (the cp ranks' rows placed at their sequence positions by
# fsdp.cp.positions). The
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
T=$'\t'
# Our side first, then transformers' checks in two Python processes
# (tests/scripts/hf_jobs.py): what ours must read from transformers is made
# in the first, what transformers must read from ours checked in the second.
# fp32 with the head its own; bf16 with the head tied to the embedding
for v in "fp32 untied false" "bf16 tied true"; do
  set -- $v
  d="$work/$1-$2"
  "$fsdprun" -n 2 --timeout 120 "$root/recipes/tiny.lua" train.steps=30 train.eval_every=0 train.log_every=30 \
    data.seq=64 model.tie_word_embeddings=$3 checkpoint.export_hf="$d" checkpoint.export_dtype=$1 >"$work/train.out" 2>&1
  check "$1 $2: the demo trains and exports" "[ -f '$d/config.json' ]" || cat "$work/train.out"
  "$fsdp" "$root/tests/lua/hf_logits.lua" "$d" "$root" "$work/ours-$1.txt" $2 >"$work/ours.out" 2>&1
  check "$1 $2: our logits on the export" "[ -s '$work/ours-$1.txt' ]" || cat "$work/ours.out"
done
# an export is a whole Hugging Face folder: transformers' AutoTokenizer
# loads its byte-level tokenizer (each byte its own id) and decodes back
text=$'h\xc3\xa9llo, w\xc3\xb6rld\n'
bytes=$(printf '%s' "$text" | od -An -tu1 | tr -s ' \n' '  ' | sed 's/^ //; s/ $//')
# the other way: folders transformers writes (save_pretrained, random
# weights) for our model to import: as from the Hub; with Llama 3.1's
# rotary scaling and a head_dim that is not hidden / heads (rope_parameters);
# with wide random weights (generated tokens that vary)
hf_jobs "$py" "$work/py1" \
  "fp32${T}hf_transformers_logits.py${T}$work/fp32-untied${T}$work/ours-fp32.txt" \
  "bf16${T}hf_transformers_logits.py${T}$work/bf16-tied${T}$work/ours-bf16.txt" \
  "tokenizer${T}hf_tokenizer.py${T}$work/fp32-untied${T}$text${T}$bytes" \
  "make_from_hf${T}hf_transformers_logits.py${T}--make${T}$work/from-hf${T}$work/fp32-untied" \
  "make_llama3${T}hf_transformers_logits.py${T}--make${T}$work/llama3${T}$work/fp32-untied${T}llama3" \
  "make_wide${T}hf_generate.py${T}--make${T}$work/wide${T}$work/fp32-untied"
for v in "fp32 untied" "bf16 tied"; do
  set -- $v
  check "$1 $2: transformers' logits on the export equal ours" "[ $(job_rc "$work/py1" $1) = 0 ]"
done
check "AutoTokenizer loads the export's tokenizer: ids are the bytes" "[ $(job_rc "$work/py1" tokenizer) = 0 ]"
check "transformers writes a model" "[ -f '$work/from-hf/config.json' ]" || job_rc "$work/py1" make_from_hf
check "transformers writes a llama3-scaled model" "[ -f '$work/llama3/config.json' ]" || job_rc "$work/py1" make_llama3
check "transformers writes a wide random model" "[ -f '$work/wide/config.json' ]" || job_rc "$work/py1" make_wide

"$fsdp" "$root/tests/lua/hf_logits.lua" "$work/from-hf" "$root" "$work/ours-from-hf.txt" >"$work/ours.out" 2>&1
check "our model imports transformers' folder" "[ -s '$work/ours-from-hf.txt' ]" || cat "$work/ours.out"
# the same folder imported at tp and cp meshes (2 and 4 ranks): whole logits
# with tp, each rank's chunks put at their positions with cp (hf_logits.lua)
# (cp2ring: attention over the cp ranks as a ring, fsdp.cp_ring; else an all-gather)
meshes="tp2:2:dp_shard=1,tp=2 cp2:2:dp_shard=1,cp=2 cp2ring:2:dp_shard=1,cp=2:ring cp2tp2:4:dp_shard=1,cp=2,tp=2"
meshes="$meshes tp4:4:dp_shard=1,tp=4"
for m in $meshes; do
  IFS=: read -r name n spec way <<<"$m"
  "$fsdprun" -n "$n" --oversubscribe --timeout 120 "$root/tests/lua/hf_logits.lua" "$work/from-hf" "$root" \
    "$work/ours-$name.txt" "mesh=$spec" ${way:+"cp_attention=$way"} >"$work/ours.out" 2>&1
  check "our model imports it at mesh $spec${way:+, $way attention}" "[ -s '$work/ours-$name.txt' ]" || cat "$work/ours.out"
done
# packed rows (several documents a row, masked targets) on that model
"$fsdp" "$root/tests/lua/hf_packed.lua" "$work/from-hf" "$work/ours-packed.txt" >"$work/ours.out" 2>&1
check "our model runs packed rows" "[ -s '$work/ours-packed.txt' ]" || cat "$work/ours.out"
# llama3: imported, its architecture from config.json, and exported again by
# us (rope_theta, rope_scaling and head_dim in our config.json); the
# control: the same folder with the scaling taken out gives other logits
"$fsdp" "$root/tests/lua/hf_logits.lua" "$work/llama3" "$root" "$work/ours-llama3.txt" folder "$work/llama3-ours" >"$work/ours.out" 2>&1
check "our model imports it, its architecture from config.json" "[ -s '$work/ours-llama3.txt' ]" || cat "$work/ours.out"
check "our export says head_dim 48 and rope_type llama3" \
  "grep -q '\"head_dim\": *48' '$work/llama3-ours/config.json' && grep -q '\"rope_type\": *\"llama3\"' '$work/llama3-ours/config.json'"
cp -r "$work/llama3" "$work/unscaled"
"$py" -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['rope_parameters'] = {'rope_type': 'default', 'rope_theta': 500000.0}; c.pop('rope_scaling', None); json.dump(c, open(p, 'w'))" "$work/unscaled/config.json"
# fsdp generate's greedy tokens (KV cache, fp32) against transformers'
# generate (float64, its KV cache) token for token: on the trained export,
# and on the model with wide random weights
prompt="84 104 101 32 115 104 97 114 100"
for d in fp32-untied wide; do
  "$fsdp" generate "$work/$d" --ids "$prompt" --max-new-tokens 48 --greedy --no-stop --print-ids 2>"$work/gen.err" |
    sed -n 's/^ids: //p' >"$work/gen-$d.txt"
  check "$d: fsdp generate makes 48 tokens" "[ \$(wc -w <'$work/gen-$d.txt') = 48 ]" || cat "$work/gen.err"
done
hf_jobs "$py" "$work/py2" \
  "from_hf${T}hf_transformers_logits.py${T}$work/from-hf${T}$work/ours-from-hf.txt" \
  "from_hf_tp2${T}hf_transformers_logits.py${T}$work/from-hf${T}$work/ours-tp2.txt" \
  "from_hf_cp2${T}hf_transformers_logits.py${T}$work/from-hf${T}$work/ours-cp2.txt" \
  "from_hf_cp2ring${T}hf_transformers_logits.py${T}$work/from-hf${T}$work/ours-cp2ring.txt" \
  "from_hf_cp2tp2${T}hf_transformers_logits.py${T}$work/from-hf${T}$work/ours-cp2tp2.txt" \
  "from_hf_tp4${T}hf_transformers_logits.py${T}$work/from-hf${T}$work/ours-tp4.txt" \
  "llama3${T}hf_transformers_logits.py${T}$work/llama3${T}$work/ours-llama3.txt" \
  "llama3-ours${T}hf_transformers_logits.py${T}$work/llama3-ours${T}$work/ours-llama3.txt" \
  "unscaled${T}hf_transformers_logits.py${T}$work/unscaled${T}$work/ours-llama3.txt" \
  "gen_fp32-untied${T}hf_generate.py${T}$work/fp32-untied${T}$prompt${T}$(cat "$work/gen-fp32-untied.txt")" \
  "gen_wide${T}hf_generate.py${T}$work/wide${T}$prompt${T}$(cat "$work/gen-wide.txt")" \
  "packed${T}hf_packed.py${T}$work/from-hf${T}$work/ours-packed.txt"
check "transformers' model imported: its logits equal ours" "[ $(job_rc "$work/py2" from_hf) = 0 ]"
for m in $meshes; do
  IFS=: read -r name n spec way <<<"$m"
  check "imported at mesh $spec${way:+, $way attention}: transformers' logits equal ours" \
    "[ $(job_rc "$work/py2" from_hf_$name) = 0 ]"
done
check "packed rows: each document's log-probs are transformers' on it alone; the masked loss is torch's" \
  "[ $(job_rc "$work/py2" packed) = 0 ]"
for d in llama3 llama3-ours; do
  check "rope_type llama3, head_dim 48 ($d): transformers' logits equal ours" "[ $(job_rc "$work/py2" $d) = 0 ]"
done
check "control: without the scaling transformers' logits differ from ours" "[ $(job_rc "$work/py2" unscaled) = 1 ]"
for d in fp32-untied wide; do
  check "$d: transformers' greedy generate gives our tokens" "[ $(job_rc "$work/py2" gen_$d) = 0 ]"
done
finish test_hf_transformers

#!/usr/bin/env bash
# test_prepare.sh FSDPRUN FSDP ROOT: `fsdp prepare` (scripts/prepare_data.py,
# issue 35). Every comparison is exact equality of token ids.
#   * train-tokenizer on docs/*.md (vocabulary 512): the same tokenizer.json
#     twice; transformers' AutoTokenizer loads it (where FSDP_TEST_PYTHON has
#     transformers; said and skipped otherwise);
#   * the same documents as .txt files, JSONL, parquet, a hub-style folder
#     (data/*.parquet beside a README.md) and a save_to_disk folder (Arrow
#     IPC): train.bin's ids are those of `tokenizers` called here directly,
#     each document's encoding followed by the end-of-text id, for the
#     trained tokenizer and for `bytes`;
#   * 1 and 3 workers: byte-identical files; the validation split is the
#     documents the stated hash rule picks;
#   * --dtype uint32 and --format raw: the engine's reader (fsdp.data) gives
#     the same ids as from the uint16 file; a short training run reads each;
#   * refusals at training start, status 78 naming the recipe field, the
#     manifest and both values: model.vocab_size below the manifest's, a
#     model.from_hf folder whose tokenizer.json is another's, data.format
#     not the file's, a file that is not the manifest's;
#   * bad input: a JSONL line that is not JSON, one without the field
#     (file:line named, no traceback); an existing OUT without --force;
#   * an interrupted run (SIGTERM, SIGKILL mid-way): no OUT/train.bin; a
#     killed run's leftovers removed by the next;
#   * encode and decode: the ids of `tokenizers`, the text back.
# Needs the project's Python environment (scripts/python_env.sh): skipped
# (77) when it cannot be made.
set -u
fsdprun=$1 fsdp=$2 root=$3
. "$(dirname "$0")/checks.sh"
. "$(dirname "$0")/runs.sh"
export FSDPRUN_OVERSUBSCRIBE=1
if ! py=$(bash "$root/scripts/python_env.sh" 2>"$work/env.err"); then
  echo "skipped: the Python environment could not be made: $(tail -n 1 "$work/env.err")"
  exit 77
fi
prep() { "$fsdp" prepare "$@"; }

# ---- FSDP_PYTHON: a ready Python used as it is, or refused naming what it lacks
out=$(FSDP_PYTHON="$py" bash "$root/scripts/python_env.sh" 2>&1)
check "FSDP_PYTHON with tokenizers and pyarrow: used as it is ($out)" "[ \"\$out\" = \"$py\" ]"
printf '#!/bin/sh\necho "ModuleNotFoundError: No module named tokenizers" >&2\nexit 1\n' >"$work/nopy"
chmod +x "$work/nopy"
out=$(FSDP_PYTHON="$work/nopy" bash "$root/scripts/python_env.sh" 2>&1)
rc=$?
check "FSDP_PYTHON without them: refused, naming them ($out)" \
  "[ $rc = 1 ] && grep -q 'FSDP_PYTHON=.*cannot import tokenizers, pyarrow: ModuleNotFoundError' <<<\"\$out\""

# ---- a tokenizer of our own
prep train-tokenizer --vocab-size 512 --out "$work/tok" "$root"/docs/*.md 2>"$work/tt.err"
check "train-tokenizer writes tokenizer.json, tokenizer_config.json, special_tokens_map.json" \
  "[ -f '$work/tok/tokenizer.json' ] && [ -f '$work/tok/tokenizer_config.json' ] && [ -f '$work/tok/special_tokens_map.json' ]" ||
  cat "$work/tt.err"
prep train-tokenizer --vocab-size 512 --out "$work/tok2" "$root"/docs/*.md 2>/dev/null
check "... the same tokenizer.json for the same inputs" "cmp -s '$work/tok/tokenizer.json' '$work/tok2/tokenizer.json'"
prep train-tokenizer --vocab-size 400 --out "$work/tok400" "$root"/docs/*.md 2>/dev/null
tpy=${FSDP_TEST_PYTHON:-python3}
if "$tpy" -c "import transformers" 2>/dev/null; then
  "$tpy" - "$work/tok" >"$work/auto.out" 2>&1 <<'EOF'
import sys
from transformers import AutoTokenizer
from tokenizers import Tokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
s = "Sharded units gather before forward; ünïcödé 日本 <|end_of_text|> end"
ref = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json").encode(s, add_special_tokens=False).ids
assert t.encode(s, add_special_tokens=False) == ref and t.eos_token == "<|end_of_text|>" and t.decode(ref) == s
print("ok")
EOF
  check "... transformers' AutoTokenizer loads it: the same ids, eos, text back" "grep -qx ok '$work/auto.out'" || cat "$work/auto.out"
else
  echo "skipped: AutoTokenizer loads train-tokenizer's folder (no transformers in $tpy; set FSDP_TEST_PYTHON)"
fi

# ---- the documents in every input kind, and the reference ids
cat >"$work/ref.py" <<'EOF'
# ref.py make DIR SRC...: documents (paragraphs of SRC, a few of our own, an
#   empty one, one spelling a special token) written as DIR/txt/*.txt, docs.jsonl, docs.parquet,
#   hub/data/*.parquet + hub/README.md, saved/ (save_to_disk's layout);
#   DIR/docs.json: the documents
# ref.py ids DIR TOK EOT FRACTION: the reference train and val ids, one line
#   each: tokenizers' ids of each non-empty document (text spelling a special
#   token is text: encode_special_tokens), then EOT; document i
#   validates when splitmix64(i) < FRACTION * 2^64 (the last one if none)
# ref.py read FILE: the ids of a token file in llm.c's format
import json, os, struct, sys
cmd, d = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
if cmd == "make":
    import pyarrow as pa, pyarrow.parquet as pq
    docs = []
    for src in sys.argv[3:]:
        docs += [p for p in open(src, encoding="utf-8").read().split("\n\n") if p.strip()][:25]
    docs[3:3] = ["", "ünïcödé 日本語 🙂 tabs\tand \"quotes\"\nand a second line\n", "<|end_of_text|> as text"]
    json.dump(docs, open(f"{d}/docs.json", "w"))
    os.makedirs(f"{d}/txt")
    for i, t in enumerate(docs):
        open(f"{d}/txt/d{i:04d}.txt", "w", encoding="utf-8").write(t)
    with open(f"{d}/docs.jsonl", "w", encoding="utf-8") as f:
        for i, t in enumerate(docs):
            f.write(json.dumps({"id": i, "content": t}) + ("\n\n" if i == 5 else "\n"))  # a blank line is skipped
    table = pa.table({"id": list(range(len(docs))), "content": docs})
    pq.write_table(table, f"{d}/docs.parquet", row_group_size=17)
    os.makedirs(f"{d}/hub/data")
    h = len(docs) // 2
    pq.write_table(table.slice(0, h), f"{d}/hub/data/train-00000-of-00002.parquet")
    pq.write_table(table.slice(h), f"{d}/hub/data/train-00001-of-00002.parquet")
    open(f"{d}/hub/README.md", "w").write("# a dataset card: not data\n")
    os.makedirs(f"{d}/saved")
    with pa.OSFile(f"{d}/saved/data-00000-of-00001.arrow", "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for b in table.to_batches(max_chunksize=13):
            w.write_batch(b)
    json.dump({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": None}, open(f"{d}/saved/state.json", "w"))
    json.dump({"features": {"content": {"dtype": "string"}}}, open(f"{d}/saved/dataset_info.json", "w"))
elif cmd == "ids":
    tok, eot, frac = sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    docs = [t for t in json.load(open(f"{d}/docs.json")) if t]
    if tok == "bytes":
        enc = [list(t.encode("utf-8")) for t in docs]
    else:
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file(f"{tok}/tokenizer.json")
        tk.encode_special_tokens = True
        enc = [tk.encode(t, add_special_tokens=False).ids for t in docs]
    def splitmix64(i):
        m = (1 << 64) - 1
        z = (i + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)
    val = [splitmix64(i) < int(frac * 2**64) for i in range(len(docs))]
    if frac > 0 and not any(val):
        val[-1] = True
    for want in (False, True):
        print(" ".join(str(x) for e, v in zip(enc, val) if v == want for x in e + [eot]))
elif cmd == "read":
    b = open(d, "rb").read()
    magic, version, n = struct.unpack("<3i", b[:12])
    w = {(20240520, 1): 2, (20240801, 7): 4}[(magic, version)]
    body = b[1024:]
    assert len(body) == n * w, "count"
    print(" ".join(map(str, struct.unpack(f"<{len(body) // w}{'H' if w == 2 else 'I'}", body))))
EOF
in=$work/in
mkdir -p "$in"
"$py" "$work/ref.py" make "$in" "$root/docs/TRAINING.md" "$root/docs/ARCHITECTURE.md" "$root/README.md"
"$py" "$work/ref.py" ids "$in" "$work/tok" 0 0 | head -n 1 >"$work/ref_tok.txt"
"$py" "$work/ref.py" ids "$in" bytes 0 0 | head -n 1 >"$work/ref_bytes.txt"
# the engine's reader: every id of a token file through fsdp.data, as Lua reads it for training
cat >"$work/read.lua" <<'EOF'
local data = require "fsdp.data"
local path, format, out = arg[1], arg[2], arg[3]
local ds = data.token_file({ path = path, format = format, vocab_size = 512 })
local src, n = ds.splits.train[1], ds.splits.train[3]
local buf = require("ffi").new("int32_t[?]", n)
src.read(0, n, buf)
local ids = {}
for i = 0, n - 1 do ids[#ids + 1] = tostring(buf[i]) end
local f = io.open(out, "w")
f:write(table.concat(ids, " "), "\n")
f:close()
EOF
engine_ids() { "$fsdp" "$work/read.lua" "$1" "${2:-auto}" "$work/engine.txt" >/dev/null 2>&1 && cat "$work/engine.txt"; }
ids_of() { "$py" "$work/ref.py" read "$1"; }

# ---- every input kind, the trained tokenizer and bytes
for kind in "txt $in/txt" "jsonl $in/docs.jsonl --field content" "parquet $in/docs.parquet --field content" \
  "hub $in/hub --field content" "saved $in/saved --field content"; do
  set -- $kind
  name=$1
  shift
  prep --tokenizer "$work/tok" --out "$work/o_$name" --val-fraction 0 --workers 2 "$@" 2>"$work/p.err"
  check "$name: train.bin holds tokenizers' ids of each document then the end-of-text id" \
    "[ \"\$(ids_of '$work/o_$name/train.bin')\" = \"\$(cat '$work/ref_tok.txt')\" ]" || tail -n 3 "$work/p.err"
  prep --tokenizer bytes --out "$work/b_$name" --val-fraction 0 --workers 2 "$@" 2>"$work/p.err"
  check "$name, bytes: the UTF-8 bytes of each document then 0" \
    "[ \"\$(ids_of '$work/b_$name/train.bin')\" = \"\$(cat '$work/ref_bytes.txt')\" ]" || tail -n 3 "$work/p.err"
done
check "hub: the folder's README.md is not read as data" "! grep -q README '$work/o_hub/manifest.json'"
"$py" - "$work" "$in" >"$work/manifest.out" 2>&1 <<'EOF'
import hashlib, json, sys
w, d = sys.argv[1], sys.argv[2]
docs = json.load(open(f"{d}/docs.json"))
m = json.load(open(f"{w}/o_txt/manifest.json"))
assert m["tokenizer"]["sha256"] == hashlib.sha256(open(f"{w}/tok/tokenizer.json", "rb").read()).hexdigest()
assert (m["vocab_size"], m["eot_id"], m["dtype"], m["file_format"]) == (512, 0, "uint16", "llmc")
assert m["splits"]["train"]["documents"] == len([t for t in docs if t]) and "val" not in m["splits"]
assert m["splits"]["train"]["bytes"] == 1024 + 2 * m["splits"]["train"]["tokens"]
assert len(m["inputs"]) == len(docs) and m["documents_empty_skipped"] == 1
b = json.load(open(f"{w}/b_txt/manifest.json"))
assert (b["tokenizer"]["sha256"], b["vocab_size"], b["eot_id"]) == ("bytes", 256, 0)
print("ok")
EOF
check "the manifest: tokenizer sha256 (hashlib's), vocabulary, end of text, dtype, splits, inputs" \
  "grep -qx ok '$work/manifest.out'" || cat "$work/manifest.out"

# ---- workers, the split, the widths the engine reads
export FSDP_PREPARE_CHUNK_DOCS=3 # many chunks, in flight at once
for w in 1 3; do
  prep --tokenizer "$work/tok" --out "$work/w$w" --val-fraction 0.2 --workers $w "$in/docs.jsonl" --field content 2>/dev/null
done
check "1 and 3 workers: train.bin, val.bin and manifest.json byte for byte" \
  "cmp -s '$work/w1/train.bin' '$work/w3/train.bin' && cmp -s '$work/w1/val.bin' '$work/w3/val.bin' &&
   cmp -s '$work/w1/manifest.json' '$work/w3/manifest.json'"
"$py" "$work/ref.py" ids "$in" "$work/tok" 0 0.2 >"$work/ref_split.txt"
check "--val-fraction 0.2: train.bin and val.bin are the documents the hash rule picks" \
  "[ \"\$(ids_of '$work/w3/train.bin')\" = \"\$(sed -n 1p '$work/ref_split.txt')\" ] &&
   [ \"\$(ids_of '$work/w3/val.bin')\" = \"\$(sed -n 2p '$work/ref_split.txt')\" ] && [ -n \"\$(sed -n 2p '$work/ref_split.txt')\" ]"
prep --tokenizer "$work/tok" --out "$work/u32" --dtype uint32 --val-fraction 0 "$in/docs.jsonl" --field content 2>/dev/null
prep --tokenizer "$work/tok" --out "$work/raw" --format raw --val-fraction 0 "$in/docs.jsonl" --field content 2>/dev/null
check "the engine reads train.bin (uint16): tokenizers' ids" "[ \"\$(engine_ids '$work/o_jsonl/train.bin')\" = \"\$(cat '$work/ref_tok.txt')\" ]"
check "--dtype uint32: magic 20240801; the engine reads the same ids" \
  "[ \"\$(od -An -t d4 -N 4 '$work/u32/train.bin' | tr -d ' ')\" = 20240801 ] &&
   [ \"\$(engine_ids '$work/u32/train.bin')\" = \"\$(cat '$work/ref_tok.txt')\" ]"
check "--format raw: headerless; the engine reads the same ids with data.format raw_u16" \
  "[ \$(stat -c %s '$work/raw/train.bin') = \$(( \$(stat -c %s '$work/o_jsonl/train.bin') - 1024 )) ] &&
   [ \"\$(engine_ids '$work/raw/train.bin' raw_u16)\" = \"\$(cat '$work/ref_tok.txt')\" ]"

# ---- training on it, and the refusals at training start
recipe=$root/recipes/tiny.lua
train() { # OUT args...: status in $rc
  local out=$1
  shift
  timeout 120 "$fsdprun" -n 1 "$recipe" $quick train.steps=2 "$@" >"$out" 2>&1
  rc=$?
}
train "$work/t1.out" data.token_file="$work/w3/train.bin" data.val_token_file="$work/w3/val.bin" model.vocab_size=512 \
  train.eval_every=2 train.eval_batches=1
check "a short run trains on train.bin and evaluates on val.bin (status $rc)" "[ $rc = 0 ] && grep -q 'val_loss' '$work/t1.out'" ||
  tail -n 5 "$work/t1.out"
train "$work/t2.out" data.token_file="$work/u32/train.bin" model.vocab_size=512
check "... and on the uint32 file (status $rc)" "[ $rc = 0 ] && grep -q 'step 2/2' '$work/t2.out'" || tail -n 5 "$work/t2.out"
train "$work/t3.out" data.token_file="$work/b_txt/train.bin" data.val_fraction=0.1
check "... and on the bytes file with the byte model (status $rc)" "[ $rc = 0 ] && grep -q 'step 2/2' '$work/t3.out'" ||
  tail -n 5 "$work/t3.out"
train "$work/r1.out" data.token_file="$work/w3/train.bin" model.vocab_size=300
check "model.vocab_size = 300 under a 512-id manifest: refused with 78 (got $rc), naming both and the manifest" \
  "[ $rc = 78 ] && grep -q \"data.token_file = '$work/w3/train.bin': $work/w3/manifest.json records a tokenizer of 512 ids .*model.vocab_size = 300\" '$work/r1.out'" ||
  tail -n 3 "$work/r1.out"
train "$work/r2.out" data.token_file="$work/w3/train.bin" model.vocab_size=512 data.format=raw_u16
check "data.format = raw_u16 for an llm.c file: refused with 78 (got $rc)" \
  "[ $rc = 78 ] && grep -q \"data.format = 'raw_u16', and $work/w3/manifest.json says the file is in llm.c's format\" '$work/r2.out'"
cp -r "$work/w3" "$work/grown"
printf 'xx' >>"$work/grown/val.bin"
train "$work/r3.out" data.token_file="$work/grown/train.bin" data.val_token_file="$work/grown/val.bin" model.vocab_size=512
check "a file of another size than its manifest records: refused with 78 (got $rc)" \
  "[ $rc = 78 ] && grep -q \"data.val_token_file = '$work/grown/val.bin': [0-9]* bytes, and $work/grown/manifest.json records\" '$work/r3.out'"
# a Hugging Face folder: the model exported by a short run, with a tokenizer.json beside it
train "$work/x.out" data.token_file="$work/w3/train.bin" model.vocab_size=512 train.steps=1 checkpoint.export_hf="$work/hf"
cp "$work/tok400/tokenizer.json" "$work/hf/"
sha_m=$(sha256sum <"$work/tok/tokenizer.json" | cut -c1-64)
sha_f=$(sha256sum <"$work/tok400/tokenizer.json" | cut -c1-64)
train "$work/r4.out" data.token_file="$work/w3/train.bin" model.vocab_size=512 model.from_hf="$work/hf"
check "model.from_hf with another tokenizer.json: refused with 78 (got $rc), naming the field, the manifest, both sha256" \
  "[ $rc = 78 ] && grep -q \"$work/w3/manifest.json records the tokenizer $work/tok (sha256 $sha_m), and model.from_hf = '$work/hf' has a tokenizer.json of sha256 $sha_f\" '$work/r4.out'" ||
  tail -n 3 "$work/r4.out"
cp "$work/tok/tokenizer.json" "$work/hf/"
train "$work/r5.out" data.token_file="$work/w3/train.bin" model.vocab_size=512 model.from_hf="$work/hf"
check "... with the data's own tokenizer.json: trains (status $rc)" "[ $rc = 0 ] && grep -q 'initial weights from' '$work/r5.out'" ||
  tail -n 3 "$work/r5.out"

# ---- bad input, an existing OUT
printf '{"content": "one"}\n{"content": "two"}\n{"content": "three"\n' >"$work/bad.jsonl"
prep --tokenizer bytes --out "$work/bad" --field content "$work/bad.jsonl" 2>"$work/bad.err"
rc=$?
check "a JSONL line that is not JSON: refused (status $rc) naming file:line, no traceback, no OUT" \
  "[ $rc = 1 ] && grep -q '^fsdp prepare: $work/bad.jsonl:3: not JSON' '$work/bad.err' && ! grep -q Traceback '$work/bad.err' &&
   [ ! -e '$work/bad' ]"
printf '{"content": "one"}\n{"text": "two"}\n' >"$work/bad2.jsonl"
prep --tokenizer bytes --out "$work/bad" --field content "$work/bad2.jsonl" 2>"$work/bad.err"
rc=$?
check "a JSONL line without the field: refused (status $rc) naming file:line and the field" \
  "[ $rc = 1 ] && grep -q \"$work/bad2.jsonl:2: no field 'content' (the object has: text)\" '$work/bad.err' && ! grep -q Traceback '$work/bad.err'"
prep --tokenizer bytes --out "$work/pq_bad" --field text "$in/docs.parquet" 2>"$work/bad.err"
check "a parquet file without the column: refused naming the file and its columns" \
  "grep -q \"$in/docs.parquet: no column 'text' (it has: id, content)\" '$work/bad.err'"
(cd "$work/o_txt" && md5sum train.bin manifest.json) >"$work/o_txt.sums"
prep --tokenizer bytes --out "$work/o_txt" "$in/txt" 2>"$work/ex.err"
rc=$?
check "an existing OUT without --force: refused (status $rc), left as it was" \
  "[ $rc = 1 ] && grep -q 'o_txt exists; give --force to replace it' '$work/ex.err' && (cd '$work/o_txt' && md5sum -c --quiet '$work/o_txt.sums')"
prep --tokenizer bytes --out "$work/o_txt" --force --val-fraction 0 "$in/txt" 2>/dev/null
check "... with --force: replaced" "cmp -s '$work/o_txt/train.bin' '$work/b_txt/train.bin'"
touch "$work/o_txt/notes.txt"
prep --tokenizer bytes --out "$work/o_txt" --force "$in/txt" 2>"$work/ex.err"
check "... --force over a folder holding other files: refused" "grep -q 'holds files this tool does not write (notes.txt)' '$work/ex.err'"
# OUT's missing folders are made (a fresh clone has no runs/); a file in
# their way is refused, naming it
prep --tokenizer bytes --out "$work/new/deeper/o_txt" --val-fraction 0 "$in/txt" 2>"$work/ex.err"
check "an OUT whose folders do not exist yet: they are made" "cmp -s '$work/new/deeper/o_txt/train.bin' '$work/b_txt/train.bin'" ||
  cat "$work/ex.err"
touch "$work/afile"
prep --tokenizer bytes --out "$work/afile/o_txt" "$in/txt" 2>"$work/ex.err"
rc=$?
check "... a file where a folder of OUT should be: refused (status $rc) naming it" \
  "[ $rc = 1 ] && grep -q -- '--out $work/afile/o_txt: cannot make its folder $work/afile' '$work/ex.err' && ! grep -q Traceback '$work/ex.err'" ||
  cat "$work/ex.err"

# ---- interrupted runs leave no train.bin
FSDP_PREPARE_TEST_SIGNAL=TERM:2 prep --tokenizer "$work/tok" --out "$work/int" --workers 2 "$in/txt" 2>"$work/int.err"
rc=$?
check "SIGTERM mid-way: status 143 (got $rc), no OUT, no temporary folder left" \
  "[ $rc = 143 ] && [ ! -e '$work/int' ] && [ -z \"\$(ls -d '$work'/int.tmp-* 2>/dev/null)\" ] && grep -q 'stopped by SIGTERM' '$work/int.err'"
FSDP_PREPARE_TEST_SIGNAL=KILL:2 prep --tokenizer "$work/tok" --out "$work/int" --workers 2 "$in/txt" >/dev/null 2>&1
rc=$?
check "SIGKILL mid-way: no OUT; the leftover is named .tmp and holds no train.bin (status $rc)" \
  "[ $rc = 137 ] && [ ! -e '$work/int' ] && ls -d '$work'/int.tmp-* >/dev/null 2>&1 && [ -z \"\$(find '$work'/int.tmp-* -name train.bin)\" ]"
workers_left() { ps -eo args | grep -F -- "--out $work/int " | grep -v grep; }
for _ in $(seq 20); do workers_left >/dev/null || break; sleep 0.1; done
check "... its worker processes ended with it" "! workers_left"
prep --tokenizer "$work/tok" --out "$work/int" --val-fraction 0 "$in/txt" 2>/dev/null
check "... the next run succeeds and removes the leftover" \
  "cmp -s '$work/int/train.bin' '$work/o_jsonl/train.bin' && [ -z \"\$(ls -d '$work'/int.tmp-* 2>/dev/null)\" ]"
unset FSDP_PREPARE_CHUNK_DOCS

# ---- encode, decode
doc=$("$py" -c "import json; print(json.load(open('$in/docs.json'))[4], end='')")
printf '%s' "$doc" >"$work/doc.txt"
"$py" - "$work/tok" "$work/doc.txt" >"$work/doc_ref.txt" <<'EOF'
import sys
from tokenizers import Tokenizer
print(" ".join(map(str, Tokenizer.from_file(sys.argv[1] + "/tokenizer.json").encode(open(sys.argv[2], encoding="utf-8").read(), add_special_tokens=False).ids)))
EOF
prep encode --tokenizer "$work/tok" <"$work/doc.txt" >"$work/enc.txt"
check "encode: tokenizers' ids on one line" "cmp -s '$work/enc.txt' '$work/doc_ref.txt'"
prep decode --tokenizer "$work/tok" <"$work/enc.txt" >"$work/dec.txt"
check "decode: the text back" "cmp -s '$work/dec.txt' '$work/doc.txt'"
check "encode --bos: the bos id (0: <|end_of_text|>) first" \
  "[ \"\$(prep encode --tokenizer '$work/tok' --bos <'$work/doc.txt')\" = \"0 \$(cat '$work/doc_ref.txt')\" ]"
check "bytes: encode gives the UTF-8 bytes, decode the text back" \
  "[ \"\$(printf 'h\\303\\251' | prep encode --tokenizer bytes)\" = '104 195 169' ] &&
   [ \"\$(echo 104 195 169 | prep decode --tokenizer bytes)\" = 'hé' ]"
echo "1 2 99999" | prep decode --tokenizer "$work/tok" >/dev/null 2>"$work/dec.err"
check "decode: an id outside the vocabulary is refused, naming it" "grep -q 'id 99999 is outside the vocabulary of 512 ids' '$work/dec.err'"
# a full disk (a 64 KiB tmpfs; root only, skipped where it cannot be
# mounted): status 1, the file being written and the reason named, nothing left
mkdir -p "$work/small"
if mount -t tmpfs -o size=64k tmpfs "$work/small" 2>/dev/null; then
  prep --tokenizer bytes --out "$work/small/data" "$root/README.md" "$root"/docs/*.md >/dev/null 2>"$work/full.err"
  rc=$?
  check "a full disk: status 1 ($rc), the file and 'No space left on device' named, nothing left" \
    "[ $rc = 1 ] && grep -q 'small/data.tmp-[0-9]*/train.bin.tmp: No space left on device' '$work/full.err' && [ -z \"\$(ls -A '$work/small')\" ]" ||
    cat "$work/full.err"
  umount "$work/small"
else
  echo "skipped: the full-disk check (a tmpfs cannot be mounted here)"
fi
finish test_prepare

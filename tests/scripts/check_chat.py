"""check_chat.py: the inputs and the checks of tests/scripts/test_prepare_chat.sh
(`fsdp prepare --chat`, scripts/prepare_data.py), against transformers'
own apply_chat_template.

  check_chat.py make WORK ROOT   a small BPE (tokenizers, trained on a few KB of
      ROOT/README.md and the conversations) with chat special tokens; one
      tokenizer folder per template (WORK/tok_NAME: tokenizer.json,
      tokenizer_config.json, maybe chat_template.jinja and
      special_tokens_map.json): llama3, chatml and sys (a default system
      prompt, raise_exception on a bad role order), each with {% generation %}
      blocks around the assistant's text and its end token, and as NAME-plain
      without them; WORK/tok_think (its generation prompt is not what the
      history renders: the prefix rule cannot hold) and WORK/tok_none (no
      template). The conversations as WORK/convs.jsonl, .jsonl.gz and
      .parquet; WORK/text/*.txt for the plain-text run.
  check_chat.py check WORK FRACTION   with transformers (AutoTokenizer): each
      WORK/o_NAME made from tok_NAME with --val-fraction FRACTION holds, per
      conversation in the split the hash rule gives, apply_chat_template's
      ids (tokenize=True), and a mask equal to its assistant_masks
      (return_assistant_tokens_mask=True, return_dict=True) on the template
      with generation blocks: for NAME-plain, the prefix rule's mask equals
      the block version's; o_chatml-all (--mask all): ones; the .idx offsets,
      the manifest's chat fields; WORK/o_text (plain text): its .idx the
      documents' tokenizers ids plus the end-of-text id.
Prints one line per check, "ok: ..." or "FAILED: ...", and exits 1 if one failed.
"""
import gzip
import hashlib
import json
import os
import re
import struct
import sys

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<|im_start|>", "<|im_end|>", "<s>", "</s>"]

# Llama 3's shape: bos, header ids, the content trimmed, <|eot_id|>
LLAMA3 = r"""{{- bos_token }}{{ strftime_now('') }}
{%- for message in messages %}
{%- if false %}{% continue %}{% endif %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}
{%- if message['role'] == 'assistant' %}
{%- generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}
{%- else %}
{{- message['content'] | trim + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""
# ChatML: a name as tojson writes it, reasoning (under any of its names) as <think>
CHATML = r"""{%- for message in messages %}
{%- if false %}{% break %}{% endif %}
{{- '<|im_start|>' + message['role'] }}
{%- if message.name is defined %}{{ ' ' + message.name | tojson }}{% endif %}
{{- '\n' }}
{%- if message['role'] == 'assistant' %}
{%- generation %}
{%- if message.thinking is defined %}{{ '<think>' + message.thinking + '</think>' }}{% endif %}
{{- message['content'] + '<|im_end|>' }}
{%- endgeneration %}
{{- '\n' }}
{%- else %}
{{- message['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
# Llama 2's shape: a default system prompt when the conversation has none,
# raise_exception when user and assistant do not alternate (and when tools
# or documents, which apply_chat_template passes as None, are anything else)
SYS = r"""{%- if tools is not none or documents is not none %}{{ raise_exception('tools and documents: none') }}{% endif %}
{%- if messages[0]['role'] == 'system' %}
{%- set system = messages[0]['content'] %}{% set rest = messages[1:] %}
{%- else %}
{%- set system = 'Tu es un assistant serviable. Réponds brièvement.' %}{% set rest = messages %}
{%- endif %}
{%- for message in rest %}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
{%- endif %}
{%- if loop.first %}{% set content = '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + message['content'] %}
{%- else %}{% set content = message['content'] %}{% endif %}
{%- if message['role'] == 'user' %}
{{- bos_token + '[INST] ' + content | trim + ' [/INST]' }}
{%- else %}
{%- generation %}{{ ' ' + content | trim + ' ' + eos_token }}{% endgeneration %}
{%- endif %}
{%- endfor %}
"""
# the generation prompt opens an empty <think> block the history never shows
THINK = r"""{%- for message in messages %}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' }}{% endif %}
"""

CONVS = [
    [{"role": "user", "content": "What is a shard?"}, {"role": "assistant", "content": "A piece of a tensor."}],
    [{"role": "system", "content": "You answer about FSDP."},
     {"role": "user", "content": "Why gather before forward?"},
     {"role": "assistant", "content": "Each rank holds a shard; the layer needs all of it."},
     {"role": "user", "content": "And after backward?", "name": None},
     {"role": "assistant", "content": "The gradients are reduced and scattered.\nEach rank keeps its part."}],
    [{"role": "user", "content": "Ünïcödé — 日本語 🙂 tabs\tand \"quotes\"", "name": "Zoë"},
     {"role": "assistant", "content": "Réponse: 東京 🚀 ok", "reasoning": "the user wrote unicode"}],
    [{"role": "user", "content": "What do <|im_end|> and <|eot_id|> mean?"},
     {"role": "assistant", "content": "They end a turn: <|im_end|> here, <|eot_id|> there. <s>"}],
    [{"role": "user", "content": "A question nobody answers."}],
    [{"role": "user", "content": "Say something with spaces first."},
     {"role": "assistant", "content": "  two leading spaces, and a trailing period."}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "ok?"}, {"role": "assistant", "content": "ok"},
     {"role": "user", "content": "sure?"}, {"role": "assistant", "content": "Yes, sure. 100%."}],
    [{"role": "user", "content": "Last one: numbers 3.14159 and 2718."},
     {"role": "assistant", "content": "Pi and e, more or less.", "reasoning_content": "digits"}],
]
# (template, blocks): each variant's folder layout is chosen in make()
VARIANTS = {"llama3": LLAMA3, "chatml": CHATML, "sys": SYS}


def strip_blocks(t):
    return re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", t)


def splitmix64(i):
    m = (1 << 64) - 1
    z = (i + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def split_of(n, frac):
    val = [splitmix64(i) < int(frac * 2**64) for i in range(n)]
    if frac > 0 and not any(val) and n >= 2:
        val[-1] = True
    return ["val" if v else "train" for v in val]


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)


def make(work, root):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()[:6000]
    # "\n " learned as one token: in "assistant\n  two leading spaces" it
    # starts in the template's text and ends in the assistant's
    corpus = [text] + [m["content"] for c in CONVS for m in c] * 3 + ["a list:\n  indented\n  again\n"] * 20
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tj = tk.to_str()
    decoder = {str(tk.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                        "single_word": False, "special": True} for s in SPECIALS}

    def folder(name, config, files=()):
        d = os.path.join(work, "tok_" + name)
        os.makedirs(d)
        open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8").write(tj)
        write_json(os.path.join(d, "tokenizer_config.json"),
                   dict({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1000000,
                         "clean_up_tokenization_spaces": False}, **config))
        for n, content in files:
            if isinstance(content, str):
                open(os.path.join(d, n), "w", encoding="utf-8").write(content)
            else:
                write_json(os.path.join(d, n), content)

    llama = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "added_tokens_decoder": decoder}
    # the config has added_tokens_decoder: transformers reads no special_tokens_map.json, nor do we
    ignored_map = ("special_tokens_map.json", {"bos_token": "<s>", "eos_token": "</s>"})
    folder("llama3", dict(llama, chat_template=LLAMA3), [ignored_map])
    # chat_template.jinja wins over the config's chat_template, in transformers and here
    folder("llama3-plain", dict(llama, chat_template="BOGUS {{ messages }}"), [("chat_template.jinja", strip_blocks(LLAMA3))])
    chatml = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "added_tokens_decoder": decoder}
    folder("chatml", dict(chatml, chat_template=[{"name": "tool_use", "template": "TOOLS"},
                                                 {"name": "default", "template": CHATML}]))
    folder("chatml-plain", dict(chatml, chat_template=strip_blocks(CHATML)))
    # no added_tokens_decoder: the tokens come from special_tokens_map.json (objects: their content)
    tokmap = ("special_tokens_map.json", {"bos_token": {"content": "<s>", "lstrip": False, "normalized": False,
                                                        "rstrip": False, "single_word": False},
                                          "eos_token": {"content": "</s>", "lstrip": False, "normalized": False,
                                                        "rstrip": False, "single_word": False}})
    folder("sys", {}, [tokmap, ("chat_template.jinja", SYS)])
    folder("sys-plain", {"chat_template": strip_blocks(SYS)}, [tokmap])
    folder("think", dict(chatml, chat_template=THINK))
    folder("none", llama)

    lines = [json.dumps({"id": i, "messages": c}, ensure_ascii=False) + "\n" for i, c in enumerate(CONVS)]
    open(os.path.join(work, "convs.jsonl"), "w", encoding="utf-8").write("".join(lines))
    with gzip.open(os.path.join(work, "convs.jsonl.gz"), "wt", encoding="utf-8") as f:
        f.write("".join(lines))
    pq.write_table(pa.table({"id": list(range(len(CONVS))), "messages": CONVS}), os.path.join(work, "convs.parquet"),
                   row_group_size=3)
    os.makedirs(os.path.join(work, "text"))
    for i, c in enumerate(CONVS):
        open(os.path.join(work, "text", f"d{i}.txt"), "w", encoding="utf-8").write("\n".join(m["content"] for m in c))


class Checks:
    def __init__(self):
        self.failed = 0

    def __call__(self, name, ok, why=""):
        print(f"ok: {name}" if ok else f"FAILED: {name}{': ' + why if why else ''}")
        self.failed += not ok


def read_out(d, s):
    """a split of an output folder: its ids (llm.c's header), its .idx and .mask"""
    b = open(os.path.join(d, s + ".bin"), "rb").read()
    magic, version, n = struct.unpack("<3i", b[:12])
    w = {(20240520, 1): 2, (20240801, 7): 4}[(magic, version)]
    assert len(b) == 1024 + n * w, f"{d}/{s}.bin: {len(b)} bytes for {n} tokens"
    ids = list(struct.unpack(f"<{n}{'H' if w == 2 else 'I'}", b[1024:]))
    ib = open(os.path.join(d, s + ".idx"), "rb").read()
    idx = list(struct.unpack(f"<{len(ib) // 8}Q", ib))
    mp = os.path.join(d, s + ".mask")
    mask = open(mp, "rb").read() if os.path.exists(mp) else None
    return ids, idx, mask


def documents(d, n, frac, c):
    """the documents of an output folder in input order: [(ids, mask)], and
    whether its files are whole (idx from 0 to the token count, as many masks as tokens)"""
    m = json.load(open(os.path.join(d, "manifest.json")))
    where = split_of(n, frac)
    got = {}
    for s in ("train", "val"):
        if s not in m["splits"]:
            got[s] = []
            continue
        ids, idx, mask = read_out(d, s)
        e = m["splits"][s]
        c(f"{d}: {s}.idx: {e['documents']} documents + 1 offsets, 0 first, the token count ({len(ids)}) last, rising",
          len(idx) == e["documents"] + 1 and idx[0] == 0 and idx[-1] == len(ids) == e["tokens"]
          and all(a <= b for a, b in zip(idx, idx[1:])) and e["index"] == s + ".idx", f"{idx}")
        if mask is not None:
            c(f"{d}: {s}.mask: a byte per token, 0 or 1", len(mask) == len(ids) and set(mask) <= {0, 1}
              and e["mask"] == s + ".mask")
        got[s] = [(ids[a:b], list(mask[a:b]) if mask is not None else None) for a, b in zip(idx, idx[1:])]
    order = []
    for s in where:
        order.append(got[s].pop(0) if got[s] else None)
    c(f"{d}: each split holds the documents the hash rule gives it", all(x is not None for x in order)
      and not got["train"] and not got["val"])
    return order, m


def check(work, frac):
    from transformers import AutoTokenizer

    c = Checks()
    convs = [json.loads(line)["messages"] for line in open(os.path.join(work, "convs.jsonl"), encoding="utf-8")]
    n = len(convs)
    ref = {}  # transformers' (ids, assistant mask) per template with blocks
    for name in VARIANTS:
        t = AutoTokenizer.from_pretrained(os.path.join(work, "tok_" + name))
        ref[name] = []
        for msgs in convs:
            o = t.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            ref[name].append((list(o["input_ids"]), list(o["assistant_masks"])))
        tp = AutoTokenizer.from_pretrained(os.path.join(work, f"tok_{name}-plain"))
        plain = [list(tp.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]) for msgs in convs]
        c(f"{name}: the template without generation blocks renders the same ids (transformers)",
          plain == [r[0] for r in ref[name]])
        c(f"{name}: the conversations have targets and non-targets (transformers' masks)",
          all(1 in r[1] and 0 in r[1] for i, r in enumerate(ref[name]) if any(m["role"] == "assistant" for m in convs[i])))

        for variant in (name, name + "-plain"):
            d = os.path.join(work, "o_" + variant)
            docs, m = documents(d, n, frac, c)
            ids_ok = [got[0] == want[0] for got, want in zip(docs, ref[name])]
            c(f"{variant}: our ids are apply_chat_template(tokenize=True)'s, every conversation", all(ids_ok),
              f"conversations {[i for i, ok in enumerate(ids_ok) if not ok]} differ; first: ours "
              f"{next((g[0] for g, ok in zip(docs, ids_ok) if not ok), None)} theirs "
              f"{next((w[0] for w, ok in zip(ref[name], ids_ok) if not ok), None)}")
            rule = "its generation blocks (assistant_masks)" if variant == name else \
                "the prefix rule: transformers' assistant_masks on the template with blocks"
            mask_ok = [got[1] == want[1] for got, want in zip(docs, ref[name])]
            c(f"{variant}: our mask is {rule}, every conversation", all(mask_ok),
              f"conversations {[i for i, ok in enumerate(mask_ok) if not ok]} differ; first: ours "
              f"{next((g[1] for g, ok in zip(docs, mask_ok) if not ok), None)} theirs "
              f"{next((w[1] for w, ok in zip(ref[name], mask_ok) if not ok), None)}")
            ch = m.get("chat", {})
            tdir = os.path.join(work, "tok_" + variant)
            if os.path.exists(os.path.join(tdir, "chat_template.jinja")):
                text, origin = open(os.path.join(tdir, "chat_template.jinja"), encoding="utf-8").read(), "chat_template.jinja"
            else:
                t = json.load(open(os.path.join(tdir, "tokenizer_config.json"), encoding="utf-8"))["chat_template"]
                text = t if isinstance(t, str) else {x["name"]: x["template"] for x in t}["default"]
                origin = "tokenizer_config.json chat_template" + ("" if isinstance(t, str) else " (the one named 'default')")
            targets = {s: sum(sum(x[1]) for x, w in zip(docs, split_of(n, frac)) if w == s) for s in m["splits"]}
            no_asst = sum(not any(mm["role"] == "assistant" for mm in msgs) for msgs in convs)
            want = {"template_sha256": hashlib.sha256(text.encode()).hexdigest(), "template_from": origin,
                    "mask": "assistant", "generation_blocks": variant == name, "target_tokens": targets,
                    "masked_tokens": {s: m["splits"][s]["tokens"] - targets[s] for s in m["splits"]},
                    "documents_without_targets": no_asst}
            diff = {k: (ch.get(k), v) for k, v in want.items() if ch.get(k) != v}
            c(f"{variant}: the manifest's chat fields (template sha256 and source, mask, blocks, targets per split, "
              f"conversations without targets), tool version 2, no end-of-text id",
              not diff and m["tool"].endswith(" 2") and m["eot_id"] is None and m["special_tokens_in_text"] == "tokens",
              f"manifest vs expected: {diff}")

    docs, m = documents(os.path.join(work, "o_chatml-all"), n, frac, c)
    c("--mask all: the same ids, every mask byte 1, the manifest says mask all",
      [x[0] for x in docs] == [r[0] for r in ref["chatml"]] and all(set(x[1]) == {1} for x in docs)
      and m["chat"]["mask"] == "all" and sum(m["chat"]["masked_tokens"].values()) == 0)

    # plain text: each document's tokenizers ids, then the end-of-text id, and .idx says where
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(os.path.join(work, "tok_llama3", "tokenizer.json"))
    tk.encode_special_tokens = True  # text spelling a special token is text, as before
    texts = [open(os.path.join(work, "text", f"d{i}.txt"), encoding="utf-8").read() for i in range(n)]
    eot = tk.token_to_id("<|eot_id|>")
    docs, m = documents(os.path.join(work, "o_text"), n, frac, c)
    want = [tk.encode(t, add_special_tokens=False).ids + [eot] for t in texts]
    c("plain text: .idx cuts train.bin and val.bin into the documents: tokenizers' ids then the end-of-text id",
      [x[0] for x in docs] == want and "mask" not in m["splits"]["train"] and "chat" not in m
      and not os.path.exists(os.path.join(work, "o_text", "train.mask")))
    return 1 if c.failed else 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    else:
        sys.exit(check(sys.argv[2], float(sys.argv[3])))

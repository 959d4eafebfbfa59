#!/usr/bin/env python3
"""check_safetensors.py DIR...: checks a Hugging Face export written by fsdp
against the published formats, with nothing but the standard library (an
independent reader of what src/io/safetensors.c writes):

  * each model-0000k-of-0000n.safetensors: 8-byte little-endian header
    length N, an N-byte UTF-8 JSON object padded with spaces, data offsets
    that tile the data exactly, dtype sizes matching shapes, all values
    finite;
  * model.safetensors.index.json: metadata.total_size equal to the sum of
    the tensors' bytes, weight_map naming every tensor's file, and nothing
    else;
  * config.json: a LlamaForCausalLM config, float fields written as floats,
    whose shapes agree with the tensors (embedding, layers, projections,
    tied head or not).
Prints "ok DIR" per directory; exits 1 with the first fault otherwise."""
import json
import math
import os
import re
import struct
import sys

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def fail(msg):
    print("check_safetensors: " + msg)
    sys.exit(1)


def values(dtype, raw):
    if dtype == "F32":
        return struct.unpack("<%df" % (len(raw) // 4), raw)
    if dtype == "BF16":
        hs = struct.unpack("<%dH" % (len(raw) // 2), raw)
        return struct.unpack("<%df" % len(hs), struct.pack("<%dI" % len(hs), *[h << 16 for h in hs]))
    return ()


def check_file(path):
    data = open(path, "rb").read()
    if len(data) < 8:
        fail(path + ": shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        fail(path + ": header length past the end")
    text = data[8 : 8 + n].decode("utf-8")
    if not text.startswith("{") or text.rstrip(" ") != text.rstrip(" ").rstrip():
        fail(path + ": header must be a JSON object padded with spaces")
    header = json.loads(text)
    body = data[8 + n :]
    spans, tensors = [], {}
    for name, t in header.items():
        if name == "__metadata__":
            if not all(isinstance(v, str) for v in t.values()):
                fail(path + ": __metadata__ values must be strings")
            continue
        if set(t) != {"dtype", "shape", "data_offsets"}:
            fail("%s: %s has keys %s" % (path, name, sorted(t)))
        b, e = t["data_offsets"]
        numel = math.prod(t["shape"])
        if t["dtype"] not in SIZES or numel * SIZES[t["dtype"]] != e - b:
            fail("%s: %s: dtype/shape do not match its %d bytes" % (path, name, e - b))
        vals = values(t["dtype"], body[b:e])
        if any(v != v or v in (float("inf"), float("-inf")) for v in vals):
            fail("%s: %s has non-finite values" % (path, name))
        spans.append((b, e, name))
        tensors[name] = (t["shape"], e - b)
    spans.sort()
    at = 0
    for b, e, name in spans:
        if b != at:
            fail("%s: %s starts at %d, expected %d (overlap or hole)" % (path, name, b, at))
        at = e
    if at != len(body):
        fail("%s: %d data bytes, the tensors cover %d" % (path, len(body), at))
    return tensors


def check_dir(d):
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    pat = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors$")
    if not files or any(not pat.match(f) for f in files):
        fail(d + ": expected model-0000k-of-0000n.safetensors files, found %s" % files)
    total = int(pat.match(files[0]).group(2))
    if [int(pat.match(f).group(1)) for f in files] != list(range(1, total + 1)):
        fail(d + ": file numbers are not 1..%d" % total)
    where, tensors = {}, {}
    for f in files:
        for name, v in check_file(os.path.join(d, f)).items():
            if name in tensors:
                fail("%s: %s is in two files" % (d, name))
            tensors[name], where[name] = v, f
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    if index["weight_map"] != where:
        fail(d + ": weight_map does not match the files' contents")
    if index["metadata"]["total_size"] != sum(b for _, b in tensors.values()):
        fail(d + ": metadata.total_size is not the tensors' total bytes")
    cfg = json.load(open(os.path.join(d, "config.json")))
    if cfg.get("architectures") != ["LlamaForCausalLM"] or cfg.get("model_type") != "llama":
        fail(d + ": config.json is not a LlamaForCausalLM config")
    # float fields are floats, ints ints (older transformers versions check the type)
    rs = cfg.get("rope_scaling") or {}
    for name, v, kind in [(k, cfg.get(k), float) for k in ("rope_theta", "rms_norm_eps", "initializer_range")] + \
            [(k, cfg.get(k), int) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")] + \
            [("rope_scaling." + k, rs.get(k), float) for k in ("factor", "low_freq_factor", "high_freq_factor") if k in rs]:
        if type(v) is not kind:
            fail("%s: config.json's %s = %r is not %s" % (d, name, v, "a float" if kind is float else "an int"))
    h, i, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg.get("head_dim", h // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    want = {"model.embed_tokens.weight": [V, h], "model.norm.weight": [h]}
    if not cfg["tie_word_embeddings"]:
        want["lm_head.weight"] = [V, h]
    for l in range(L):
        p = "model.layers.%d." % l
        want.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                     p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
                     p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
                     p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                     p + "mlp.down_proj.weight": [h, i]})
    got = {n: s for n, (s, _) in tensors.items()}
    if got != want:
        fail("%s: tensors differ from a Llama of this config: missing %s, extra %s, reshaped %s" % (
            d, sorted(set(want) - set(got)), sorted(set(got) - set(want)),
            sorted(n for n in want if n in got and got[n] != want[n])))
    print("ok " + d)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        fail("usage: check_safetensors.py DIR...")
    for d in sys.argv[1:]:
        check_dir(d)

#!/usr/bin/env python3
"""prepare_data.py: text in, token files the fsdp trainer reads out (`fsdp prepare`).

  fsdp prepare --tokenizer DIR|bytes --out OUT INPUT...      token files + manifest
  fsdp prepare --chat --tokenizer DIR --out OUT INPUT...     conversations: + loss masks
  fsdp prepare encode --tokenizer DIR|bytes [--bos]          stdin text -> ids on one line
  fsdp prepare decode --tokenizer DIR|bytes                  stdin ids  -> text
  fsdp prepare train-tokenizer --vocab-size N --out DIR INPUT...  a byte-level BPE

Inputs: .txt files (one document each, or split at --doc-separator), .md
(given by name only: a folder's README.md is a dataset card, not data),
JSONL (.jsonl, .json given by name; one object per line, --field names the
text), parquet and Arrow (a column named by --field; `datasets`'
save_to_disk folders are read with Arrow's IPC reader), .gz of .txt/.jsonl,
and folders, walked in sorted order for those kinds (dot entries skipped).

Output (docs/TRAINING.md, "Preparing your data"): OUT/train.bin and
OUT/val.bin in llm.c's format (src/io/token_file.c reads it: a 256-int32
header, magic 20240520 for uint16 ids, 20240801 for uint32), or headerless
with --format raw, OUT/train.idx and OUT/val.idx (each split's document
index: documents + 1 little-endian uint64 token offsets, 0 first, then the
end of each document) and OUT/manifest.json. Each document is its ids, then
the end-of-text id (the tokenizer's eos; with `bytes`, byte 0 by default:
the byte vocabulary has no spare id, and NUL, unlike a newline, does not
occur in text). Document i (0-based, input order, empty ones skipped) goes
to validation when splitmix64(i) / 2^64 < --val-fraction; when that picks
none among two or more documents, the last one validates.

--chat: each input record is a conversation (`messages`: a list of
{"role", "content"} objects, Hugging Face datasets' format), rendered by the
tokenizer folder's own chat template as transformers' apply_chat_template
renders it (jinja2, the same sandbox, filters and globals) and tokenized
with special tokens recognised; no end-of-text id unless --eot-id. OUT/
train.mask and OUT/val.mask hold one byte per token: 1 where the token is a
training target (the assistant's turns: the template's {% generation %}
blocks, else the text each assistant message adds to the rendering), 0
elsewhere; --mask all: 1 everywhere.

Tokenization is Hugging Face `tokenizers` (scripts/python_env.sh pins it);
the ids are the same for any --workers: the documents go to the workers in
chunks and come back in order. User mistakes end with one line naming the
file, line or field, and exit status 1 (2 for a bad option).
"""
import argparse
import array
import collections
import gzip
import hashlib
import json
import os
import signal
import shutil
import sys
import time
import zlib

TOOL_VERSION = "2"  # 2: the document index (.idx) beside every split; --chat
MANIFEST_FORMAT = 1
LLMC = {"uint16": (20240520, 1), "uint32": (20240801, 7)}  # (magic, version), as llm.c writes them
HEADER_INTS = 256
INT32_MAX = 2**31 - 1
BYTES_EOT = 0
WALK_KINDS = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".parquet", ".arrow")
NAMED_KINDS = WALK_KINDS + (".md", ".json", ".json.gz")
CHAT_WALK_KINDS = (".jsonl", ".jsonl.gz", ".parquet", ".arrow")  # --chat: records, not text files
CHAT_NAMED_KINDS = CHAT_WALK_KINDS + (".json", ".json.gz")
# documents go to the workers in chunks of about this size (the tests make
# them small, FSDP_PREPARE_CHUNK_DOCS, so that a small input has many)
CHUNK_CHARS, CHUNK_DOCS = 1 << 20, int(os.environ.get("FSDP_PREPARE_CHUNK_DOCS", "512"))
PROG = "fsdp prepare"
# the names a message's reasoning goes by, in transformers' order of preference
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# the variables a template sees for the special tokens the folder names
# (transformers' special_tokens_map: these attributes, when set)
SPECIAL_TOKEN_VARS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
JINJA2_MIN = (3, 1, 6)  # older jinja2 has known sandbox escapes; templates are code from the Hub


class UserError(Exception):
    """a mistake in the input or the options: reported as one line, no traceback"""


def fail(msg):
    raise UserError(msg)


# ---- tokenizers ----------------------------------------------------------

def _token_name(v):
    # tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _read_json(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as e:
        fail(f"{path}: not valid JSON ({e})")


class Tok:
    """a tokenizer: a Hugging Face folder's tokenizer.json, or the raw UTF-8 bytes"""

    def __init__(self, spec, allow_special=True):
        self.spec = spec
        if spec == "bytes":
            self.kind, self.tk, self.vocab_size = "bytes", None, 256
            self.path, self.sha256 = "bytes", "bytes"
            self.eos, self.eos_from = BYTES_EOT, "byte 0 (the bytes tokenizer has no spare id; NUL does not occur in text)"
            self.bos, self.bos_from = None, None
            return
        from tokenizers import Tokenizer

        self.kind = "hf"
        if not os.path.isdir(spec):
            fail(f"--tokenizer {spec}: not a folder (expected a Hugging Face model folder with tokenizer.json, or 'bytes')")
        self.path = os.path.abspath(spec)
        tj = os.path.join(spec, "tokenizer.json")
        try:
            with open(tj, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            fail(f"--tokenizer {spec}: no tokenizer.json in it (a Hugging Face folder has one; "
                 "`fsdp prepare train-tokenizer` makes one)")
        self.sha256 = hashlib.sha256(raw).hexdigest()
        try:
            self.tk = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # the library's own message says what it could not read
            fail(f"{tj}: the tokenizers library cannot read it: {e}")
        self.vocab_size = self.tk.get_vocab_size(with_added_tokens=True)
        # text spelling a special token ("<|end_of_text|>" in a web page) is
        # text in a document, as tiktoken's encode_ordinary has it for llm.c
        # and nanoGPT: only the end-of-text id this tool adds ends a document
        self.tk.encode_special_tokens = not allow_special
        self.eos, self.eos_from = self._special(spec, "eos")
        self.bos, self.bos_from = self._special(spec, "bos")

    def _special(self, d, which):
        """the folder's eos or bos id: tokenizer_config.json's token, else
        generation_config.json's id, else config.json's (a list: its first)"""
        tc = _read_json(os.path.join(d, "tokenizer_config.json")) or {}
        name = _token_name(tc.get(f"{which}_token"))
        if name is not None:
            i = self.tk.token_to_id(name)
            if i is None:
                fail(f"{os.path.join(d, 'tokenizer_config.json')}: {which}_token {name!r} is not in tokenizer.json's vocabulary")
            return i, f"tokenizer_config.json {which}_token {name!r}"
        for f in ("generation_config.json", "config.json"):
            v = (_read_json(os.path.join(d, f)) or {}).get(f"{which}_token_id")
            if isinstance(v, list) and v:
                v = v[0]
            if isinstance(v, int) and not isinstance(v, bool):
                return v, f"{f} {which}_token_id"
        return None, None

    def encode_batch(self, texts):
        if self.tk is None:
            return [t.encode("utf-8") for t in texts]
        return [e.ids for e in self.tk.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_offsets(self, texts):
        """each text's ids and each id's (start, end) in the text, in characters"""
        return [(e.ids, e.offsets) for e in self.tk.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        if self.tk is None:
            return bytes(ids)
        return self.tk.decode(ids, skip_special_tokens=False)


# ---- inputs: files and folders -> documents ------------------------------

def kind_of(path, kinds):
    low = path.lower()
    for k in sorted(kinds, key=len, reverse=True):  # .jsonl.gz before .gz-less kinds
        if low.endswith(k):
            return k
    return None


def walk(folder, kinds=WALK_KINDS):
    """the data files under a folder, sorted; a save_to_disk folder's Arrow
    files in its state.json order"""
    out = []
    for d, dirs, names in os.walk(folder):
        dirs[:] = sorted(n for n in dirs if not n.startswith("."))
        state = _read_json(os.path.join(d, "state.json")) if "state.json" in names else None
        listed = [f.get("filename") for f in (state or {}).get("_data_files", []) if isinstance(f, dict)]
        if listed and all(isinstance(n, str) and n in names for n in listed):
            out += [os.path.join(d, n) for n in listed]
            names = [n for n in names if not n.endswith(".arrow")]
        out += [os.path.join(d, n) for n in sorted(names) if not n.startswith(".") and kind_of(n, kinds)]
    return out


def input_files(inputs, chat=False):
    walk_kinds, named = (CHAT_WALK_KINDS, CHAT_NAMED_KINDS) if chat else (WALK_KINDS, NAMED_KINDS)
    files = []
    for p in inputs:
        if os.path.isdir(p):
            found = walk(p, walk_kinds)
            if not found:
                fail(f"{p}: no {', '.join(walk_kinds)} files in this folder")
            files += found
        elif os.path.isfile(p):
            if chat and kind_of(p, NAMED_KINDS) and not kind_of(p, named):
                fail(f"{p}: --chat reads conversations from JSONL, parquet or Arrow records (a list of messages "
                     f"in the field --field names), not text files")
            if not kind_of(p, named):
                fail(f"{p}: unknown kind of file (expected {', '.join(named)}, or a folder of them)")
            files.append(p)
        else:
            fail(f"{p}: no such file or folder")
    return files


def _open_binary(path):
    raw = open(path, "rb")
    return raw, (gzip.open(raw) if path.lower().endswith(".gz") else raw)


def _utf8(path, data, where=""):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{path}{where}: not UTF-8 text (byte {e.start}: {data[e.start:e.start + 4]!r})")


def _json_kind(v):
    return "null" if v is None else "a JSON " + type(v).__name__


def conversation(v, where, field):
    """(where, messages) for a record's messages, checked: a non-empty list of
    objects with string role and content. The messages go to the template as
    transformers' apply_chat_template passes them: fields that are null
    dropped, a reasoning field also under `thinking` and `reasoning_content`."""
    if not isinstance(v, list):
        fail(f"{where}: field '{field}' is {_json_kind(v)}, expected a list of messages "
             f"({{\"role\": ..., \"content\": ...}} objects); --field names the messages' field")
    if not v:
        fail(f"{where}: field '{field}' is an empty list: a conversation needs at least one message")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            fail(f"{where}: message {i} is {_json_kind(m)}, expected an object with string fields 'role' and 'content'")
        for k in ("role", "content"):
            if k not in m:
                have = ", ".join(sorted(map(str, m))[:12]) or "no fields"
                fail(f"{where}: message {i}: no field '{k}' (the object has: {have})")
            if not isinstance(m[k], str):
                hint = " (content parts are not read: give the text as a string)" if isinstance(m[k], list) else ""
                fail(f"{where}: message {i}: field '{k}' is {_json_kind(m[k])}, expected a string{hint}")
        m = {k: x for k, x in m.items() if x is not None}
        for k in REASONING_FIELDS:  # the first of these set names the message's reasoning
            if m.get(k) is not None:
                r = m[k]
                m = dict({"thinking": r}, **m)  # `thinking` first unless the message has it
                m["reasoning_content"] = r
                break
        out.append(m)
    return where, out


def _jsonl_docs(path, field, chat=False):
    raw, f = _open_binary(path)
    with raw, f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            text = _utf8(path, line, f":{n}")
            if n == 1:
                text = text.lstrip("\ufeff")  # a byte order mark is no part of the JSON
            try:
                obj = json.loads(text)
            except ValueError as e:
                fail(f"{path}:{n}: not JSON ({e}); expected one object per line with a string field '{field}'")
            if not isinstance(obj, dict):
                fail(f"{path}:{n}: a JSON {type(obj).__name__}, expected an object with a string field '{field}'")
            if field not in obj:
                have = ", ".join(sorted(obj)[:12]) or "no fields"
                fail(f"{path}:{n}: no field '{field}' (the object has: {have}); --field names the "
                     f"{'messages' if chat else 'text'}' field")
            v = obj[field]
            if chat:
                yield conversation(v, f"{path}:{n}", field), raw.tell()
                continue
            if not isinstance(v, str):
                fail(f"{path}:{n}: field '{field}' is {'null' if v is None else 'a JSON ' + type(v).__name__}, expected a string")
            yield v, raw.tell()


def _column_docs(path, batches, names, field, pos, chat=False):
    """the strings of column `field` from Arrow record batches (--chat: its
    lists of messages)"""
    if field not in names:
        fail(f"{path}: no column '{field}' (it has: {', '.join(names)}); --field names the "
             f"{'messages' if chat else 'text'}' column")
    import pyarrow as pa

    row = 0
    want, one = ("lists of messages", "a list of messages") if chat else ("strings", "a string")
    for b in batches:
        col = b.column(b.schema.get_field_index(field))
        t = col.type
        if chat:
            good = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t)
        else:
            good = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
        if not good:
            fail(f"{path}: column '{field}' holds {t}, expected {want}")
        if col.null_count:
            first = next(i for i, v in enumerate(col.is_valid().to_pylist()) if not v)
            fail(f"{path}: row {row + first}: column '{field}' is null, expected {one}")
        for i, v in enumerate(col.to_pylist()):
            yield (conversation(v, f"{path}: row {row + i}", field) if chat else v), pos()
        row += len(col)


def _parquet_docs(path, field, chat=False):
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        fail(f"{path}: not a parquet file ({e})")
    size, rows, seen = os.path.getsize(path), max(pf.metadata.num_rows, 1), [0]

    def batches():
        for b in pf.iter_batches(batch_size=1024, columns=[field]):
            seen[0] += b.num_rows
            yield b
    yield from _column_docs(path, batches(), pf.schema_arrow.names, field, lambda: size * seen[0] // rows, chat)


def _arrow_docs(path, field, chat=False):
    import pyarrow as pa

    src = pa.memory_map(path)
    try:  # save_to_disk writes the IPC stream format; other tools the file format
        reader = pa.ipc.open_stream(src)
        batches = iter(reader)
    except pa.ArrowInvalid:
        try:
            src.seek(0)
            reader = pa.ipc.open_file(src)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid as e:
            fail(f"{path}: not an Arrow IPC stream or file ({e})")
    with src:
        yield from _column_docs(path, batches, reader.schema.names, field, src.tell, chat)


def _text_docs(path, sep):
    raw, f = _open_binary(path)
    with raw, f:
        text = _utf8(path, f.read()).lstrip("\ufeff")  # nor of the text
    size = os.path.getsize(path)
    for d in (text.split(sep) if sep else [text]):
        yield d, size


def documents(path, args):
    """(text, bytes of the file read so far) for each document of one input
    file; --chat: ((where, messages), bytes read)"""
    k = kind_of(path, NAMED_KINDS)
    chat = getattr(args, "chat", False)
    if k in (".jsonl", ".jsonl.gz", ".json", ".json.gz"):
        docs = _jsonl_docs(path, args.field, chat)
    elif k == ".parquet":
        docs = _parquet_docs(path, args.field, chat)
    elif k == ".arrow":
        docs = _arrow_docs(path, args.field, chat)
    else:
        docs = _text_docs(path, args.doc_separator)
    try:
        yield from docs
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:  # a cut or corrupt .gz
        fail(f"{path}: {e}")


# ---- chat: the template, rendering, the loss mask -----------------------

def find_template(d):
    """(template text, where it came from) from a tokenizer folder, where
    transformers' from_pretrained finds it: chat_template.jinja first, else
    tokenizer_config.json's chat_template (a string, or a list of
    {"name", "template"} objects of which "default" is taken)"""
    jf = os.path.join(d, "chat_template.jinja")
    if os.path.isfile(jf):
        with open(jf, "rb") as f:
            return _utf8(jf, f.read()), "chat_template.jinja"
    tc = os.path.join(d, "tokenizer_config.json")
    t = (_read_json(tc) or {}).get("chat_template")
    if isinstance(t, str):
        return t, "tokenizer_config.json chat_template"
    if isinstance(t, list):
        named = {x.get("name"): x.get("template") for x in t if isinstance(x, dict)}
        if isinstance(named.get("default"), str):
            return named["default"], "tokenizer_config.json chat_template (the one named 'default')"
        fail(f"{tc}: chat_template lists templates named {', '.join(map(str, named)) or 'nothing'} and none named "
             "'default', the one --chat takes")
    if t is not None:
        fail(f"{tc}: chat_template is {_json_kind(t)}, expected a string or a list of {{\"name\", \"template\"}} objects")
    fail(f"--chat: {d} has no chat template (tokenizer_config.json chat_template or chat_template.jinja)")


def special_token_strings(d, tk):
    """the special tokens a template sees as bos_token, eos_token, ...: as
    transformers reads them, tokenizer_config.json's (a string, or an object's
    content), with special_tokens_map.json's over them when the config has
    no added_tokens_decoder (its legacy layout); pad_token else tokenizer.json's padding"""
    tc = _read_json(os.path.join(d, "tokenizer_config.json")) or {}
    out = {k: _token_name(tc.get(k)) for k in SPECIAL_TOKEN_VARS}
    if "added_tokens_decoder" not in tc:
        sm = _read_json(os.path.join(d, "special_tokens_map.json")) or {}
        out.update({k: _token_name(sm[k]) for k in SPECIAL_TOKEN_VARS if k in sm})
    if out["pad_token"] is None and tk.padding:
        out["pad_token"] = tk.padding.get("pad_token")
    return {k: v for k, v in out.items() if v is not None}


GENERATION_TAG = r"\{\%-?\s*generation\s*-?\%\}"  # a template that marks the assistant's text


class ChatTemplate:
    """A chat template compiled as transformers' apply_chat_template compiles
    it (our own code, the same behaviour): jinja2's immutable sandbox with
    trim_blocks and lstrip_blocks, loop controls, `{% generation %}` blocks,
    transformers' tojson (no HTML escaping, indent/separators/sort_keys
    options), raise_exception, strftime_now, and dict and namespace that
    reach no attribute starting with an underscore."""

    def __init__(self, text, origin, variables):
        try:
            import jinja2
        except ImportError:
            fail("--chat needs jinja2 (scripts/python_env.sh installs it; with FSDP_PYTHON: pip install jinja2==3.1.6)")
        have = tuple(int(x) for x in jinja2.__version__.split(".")[:3] if x.isdigit())
        if have < JINJA2_MIN:
            fail(f"--chat needs jinja2 3.1.6 or later (a chat template is code, run in jinja2's sandbox); "
                 f"this Python has {jinja2.__version__}")
        import re
        self.text, self.origin, self.variables = text, origin, variables
        self.sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
        self.has_blocks = re.search(GENERATION_TAG, text) is not None
        self.jinja2_version = jinja2.__version__
        env = _chat_environment(jinja2)
        self.env = env
        try:
            self.t = env.from_string(text)
        except jinja2.TemplateSyntaxError as e:
            fail(f"{origin}: the chat template does not compile: line {e.lineno}: {_one_line(e.message)}")

    def render(self, messages, add_generation_prompt=False, spans=None):
        """the text; with spans (a list), the (start, end) of each generation
        block's output, in the order the blocks end"""
        kw = dict(self.variables, messages=messages, tools=None, documents=None,
                  add_generation_prompt=add_generation_prompt)
        if spans is None:
            return self.t.render(**kw)
        pieces = self.env.fsdp_track = _Track(spans)
        try:
            for piece in self.t.generate(**kw):
                pieces.add(piece)
        finally:
            self.env.fsdp_track = None
        return "".join(pieces.pieces)

    def conversation(self, where, messages, mask):
        """the rendered text and the assistant's spans of it (None for --mask all)"""
        import jinja2

        try:
            if mask == "all":
                return self.render(messages), None
            if self.has_blocks:
                spans = []
                return self.render(messages, spans=spans), spans
            text = self.render(messages)
            spans = []
            for i, m in enumerate(messages):
                if m["role"] != "assistant":
                    continue
                before = self.render(messages[:i], add_generation_prompt=True)
                upto = self.render(messages[:i + 1])
                if not (text.startswith(before) and text.startswith(upto)):
                    fail(f"{where}: message {i}: the chat template ({self.origin}) does not render the conversation "
                         f"up to this assistant message (with the generation prompt, then with the message) as the "
                         "start of the whole conversation, so the assistant's text cannot be found in it: use a "
                         "template with {% generation %} blocks around the assistant's text, or --mask all")
                end = max(len(before), len(upto.rstrip()))  # the end of turn is trained, what follows it is not
                if end > len(before):
                    spans.append((len(before), end))
            return text, spans
        except self.env.fsdp_raised as e:
            fail(f"{where}: the chat template ({self.origin}) refuses this conversation: {_one_line(e.message)}")
        except (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as e:
            fail(f"{where}: the chat template ({self.origin}) fails on this conversation: {type(e).__name__}: "
                 f"{_one_line(e)}")


def _one_line(msg):
    return " ".join(str(msg).split())


class _Track:
    """what a template has written so far, for {% generation %} blocks to
    record where they start"""

    def __init__(self, spans):
        self.spans, self.pieces, self.length = spans, [], 0

    def add(self, piece):
        self.pieces.append(piece)
        self.length += len(piece)


def _chat_environment(jinja2):
    import datetime
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Raised(jinja2.TemplateError):
        """a template's raise_exception("...")"""

    class Generation(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %}: the block's output, its place
        recorded while a render tracks it. As in transformers, it starts at
        the length of what the template has yielded when the block has run
        (its own output not yet: a block inside a macro or a {% set %} is
        placed where the output stood when it ran)."""
        tags = {"generation"}

        def parse(self, parser):
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_block"), [], [], body).set_lineno(line)

        def _block(self, caller):
            out = caller()
            track = self.environment.fsdp_track
            if track is not None:
                track.spans.append((track.length, track.length + len(out)))
            return out

    def raise_exception(message):
        raise Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    class DictMaker:
        """dict(...) in a template; the dict class itself stays out of reach"""

        def __call__(self, *a, **kw):
            return dict(*a, **kw)

        def fromkeys(self, *a, **kw):
            return dict.fromkeys(*a, **kw)

    def no_private(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not set the attribute {name!r} of a namespace")

    class Namespace(jinja2.utils.Namespace):
        """namespace(...): jinja2's, refusing names that start with an underscore"""

        def __init__(*args, **kwargs):  # jinja2's signature: namespace(self=...) stays a field
            self, rest = args[0], args[1:]
            fields = dict(*rest, **kwargs)
            for k in fields:
                no_private(k)
            jinja2.utils.Namespace.__init__(self, fields)

        def __setitem__(self, name, value):
            no_private(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.extend(fsdp_track=None, fsdp_raised=Raised)
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=DictMaker(),
                       namespace=Namespace)
    return env


def token_mask(offsets, spans):
    """1 for each token whose (start, end) overlaps a span, as transformers'
    return_assistant_tokens_mask marks them (the spans in order)"""
    m, k = bytearray(len(offsets)), 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if end > spans[k][0]:
            m[t] = 1
    return m


# ---- workers -------------------------------------------------------------

_worker = {}
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _worker_init(spec, allow_special, dtype, bos, eot, chat=None):
    _worker.update(tok=Tok(spec, allow_special), dtype=dtype, bos=bos, eot=eot, chat=None)
    if chat is not None:  # (template text, where from, its variables, mask)
        _worker.update(chat=ChatTemplate(*chat[:3]), mask=chat[3])


def _pool_worker_init(parent, *init_args):
    # the parent alone acts on Ctrl-C and SIGTERM (its cleanup ends the
    # pool); a worker ends with it, even when it is killed with SIGKILL
    # (a worker left waiting on the pool's queue would live on, holding
    # the terminal or the pipe its parent wrote to)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a SIGTERM sent already ends it here
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the prctl: nobody would send it
        os._exit(1)
    _worker_init(*init_args)


def _pack(ids):
    """a document's ids, with bos before and eot after when set, packed
    little-endian in the output dtype"""
    w = _worker
    a = array.array("H" if w["dtype"] == "uint16" else "I")
    if w["bos"] is not None:
        a.append(w["bos"])
    a.extend(ids)
    if w["eot"] is not None:
        a.append(w["eot"])
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def _encode_chunk(texts):
    """(packed ids, None, None) for each document"""
    return [(_pack(ids), None, None) for ids in _worker["tok"].encode_batch(texts)]


def _chat_chunk(convs):
    """(packed ids, loss mask bytes, targets) for each conversation: rendered
    by the template, tokenized as transformers' apply_chat_template(tokenize=
    True) does (no special tokens added, the ones written recognised), the
    mask 1 on the assistant's tokens (bos and eot this tool adds: 0), or on
    every token with --mask all"""
    w = _worker
    rendered = [w["chat"].conversation(where, msgs, w["mask"]) for where, msgs in convs]
    for (where, _), (text, _) in zip(convs, rendered):
        if not text:
            fail(f"{where}: the chat template ({w['chat'].origin}) renders nothing for this conversation")
    texts = [t for t, _ in rendered]
    if w["mask"] == "all":
        encoded = [(ids, None) for ids in w["tok"].encode_batch(texts)]
    else:
        encoded = w["tok"].encode_offsets(texts)
    out = []
    for (_, spans), (ids, offsets) in zip(rendered, encoded):
        m = bytearray(b"\x01") * len(ids) if spans is None else token_mask(offsets, spans)
        edge = b"\x01" if spans is None else b"\x00"
        if w["bos"] is not None:
            m[:0] = edge
        if w["eot"] is not None:
            m += edge
        out.append((_pack(ids), bytes(m), sum(m)))
    return out


def ordered_map(fn, chunks, workers, init_args):
    """fn over chunks in order; at most 2 x workers chunks in flight, so that
    reading stays just ahead of tokenizing whatever the input's size
    (multiprocessing's own imap reads its whole input ahead)"""
    if workers <= 1:
        _worker_init(*init_args)
        for c in chunks:
            yield fn(c)
        return
    import multiprocessing as mp

    # The workers start with the stop signals blocked, until their handlers
    # are the default ones. Else the parent's pool.terminate() (an input
    # mistake found at once), its SIGTERM reaching a worker just forked, could
    # be lost: Python drops the signals it caught in a child before its fork
    # returned, and the worker, alive, would wait for a task forever, its
    # parent waiting for it to end (seen with a bad line 2, 1 run in ~10).
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        pool = mp.get_context("fork").Pool(workers, _pool_worker_init, (os.getpid(),) + tuple(init_args))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    try:
        pending = collections.deque()
        for c in chunks:
            pending.append(pool.apply_async(fn, (c,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
        pool.close()
    finally:
        pool.terminate()
        pool.join()


# ---- output ----------------------------------------------------------------

class RawWriter:
    """a headerless file written as path (a name the caller renames later):
    a split's document index or loss mask"""

    def __init__(self, path):
        self.path = path
        self.f = open(path, "wb")

    def write(self, b):
        self._io(self.f.write, b)

    def _io(self, fn, *a):
        try:
            return fn(*a)
        except OSError as e:  # a full disk: named by the file being written
            e.filename = e.filename or self.path
            raise

    def close(self):
        self._io(self.f.flush)
        self._io(os.fsync, self.f.fileno())
        self.f.close()


def u64(n):
    return n.to_bytes(8, "little")


class TokenWriter(RawWriter):
    """one split's token file, written as path (a name the caller renames later)"""

    def __init__(self, path, dtype, fmt):
        super().__init__(path)
        self.dtype, self.fmt = dtype, fmt
        self.width = 2 if dtype == "uint16" else 4
        self.count = 0
        if fmt == "llmc":
            self.f.write(bytes(HEADER_INTS * 4))  # the header, filled in at close

    def write(self, b):
        self.count += len(b) // self.width
        if self.fmt == "llmc" and self.count > INT32_MAX:
            fail(f"{os.path.basename(self.path)[:-4]}: more than {INT32_MAX} tokens, beyond the llm.c header's int32 "
                 "count; give --format raw (headerless: the recipe then says data.format = 'raw_u16' or 'raw_u32'), "
                 "or prepare the inputs in parts")
        super().write(b)

    def close(self):
        if self.fmt == "llmc":
            magic, version = LLMC[self.dtype]
            h = array.array("i", [magic, version, self.count] + [0] * (HEADER_INTS - 3))
            if sys.byteorder != "little":
                h.byteswap()
            self.f.seek(0)
            self._io(self.f.write, h.tobytes())
        super().close()


def splitmix64(i):
    z = (i + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


class Progress:
    """one line on stderr redrawn in place: share of the input bytes read,
    tokens, tokens/s and the time left by bytes"""

    def __init__(self, total, on):
        self.total, self.on, self.t0, self.last = max(total, 1), on, time.monotonic(), 0.0

    def show(self, done, tokens, final=False):
        now = time.monotonic()
        if not self.on or (not final and now - self.last < 0.1):
            return
        self.last = now
        dt, frac = max(now - self.t0, 1e-9), min(done / self.total, 1.0)
        eta = dt * (1 - frac) / frac if frac > 0 else 0
        bar = "#" * int(frac * 24)
        sys.stderr.write(f"\r\x1b[Kprepare {frac * 100:5.1f}% [{bar:<24}] {human(done)}B/{human(self.total)}B | "
                         f"{human(tokens)} tokens | {human(tokens / dt)} tok/s | "
                         f"{'done in ' + clock(dt) if final else 'eta ' + clock(eta)}")
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def human(x):
    for unit in ("", "k", "M", "G", "T"):
        if abs(x) < 1000 or unit == "T":
            return f"{x:.0f}{unit}" if unit == "" else f"{x:.2f}{unit}"
        x /= 1000


def clock(s):
    s = int(s + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


# ---- the output folder, whole or not at all ------------------------------

OUR_FILES = {"train.bin", "val.bin", "train.idx", "val.idx", "train.mask", "val.mask", "manifest.json"}


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class OutDir:
    """OUT made as OUT.tmp-PID beside it and renamed into place at the end:
    an interrupted run leaves no OUT (a signal removes the temporary folder;
    SIGKILL leaves it, named .tmp, and the next run removes it)"""

    def __init__(self, out, force, ours):
        self.out = os.path.normpath(out)
        parent = os.path.dirname(self.out) or "."
        if not os.path.isdir(parent):  # missing folders are made, as the trainer makes its outputs'
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as e:
                fail(f"--out {out}: cannot make its folder {parent} ({e.strerror or e})")
        if os.path.lexists(self.out):
            if not force:
                fail(f"--out {out} exists; give --force to replace it")
            if not os.path.isdir(self.out):
                fail(f"--out {out} is a file, not a folder this tool made; not replacing it")
            other = sorted(set(os.listdir(self.out)) - ours)
            if other:
                fail(f"--out {out} holds files this tool does not write ({', '.join(other[:5])}); not replacing it")
        base = os.path.basename(self.out)
        for n in os.listdir(parent):  # a run killed with SIGKILL left its temporary folder
            if n.startswith(base + ".tmp-") and n[len(base) + 5:].isdigit() and not _alive(int(n[len(base) + 5:])):
                shutil.rmtree(os.path.join(parent, n), ignore_errors=True)
        self.tmp = f"{self.out}.tmp-{os.getpid()}"
        os.mkdir(self.tmp)
        self.done = False

    def path(self, name):
        return os.path.join(self.tmp, name)

    def commit(self):
        fd = os.open(self.tmp, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        old = None
        if os.path.lexists(self.out):
            old = f"{self.out}.old-{os.getpid()}"
            os.rename(self.out, old)
        os.rename(self.tmp, self.out)
        self.done = True
        if old:
            shutil.rmtree(old)

    def cleanup(self):
        if not self.done:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _stop_on_signals():
    """SIGTERM and SIGHUP end the run as Ctrl-C does: through the cleanup"""
    def handler(sig, frame):
        raise KeyboardInterrupt(sig)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def _test_hook(chunks_done):
    # FSDP_PREPARE_TEST_SIGNAL=SIG:N: this process sends itself SIG after its
    # N-th chunk is written (tests/scripts/test_prepare.sh: an interrupted run)
    hook = os.environ.get("FSDP_PREPARE_TEST_SIGNAL")
    if hook:
        sig, n = hook.split(":")
        if chunks_done == int(n):
            os.kill(os.getpid(), getattr(signal, "SIG" + sig))
            time.sleep(1)


# ---- prepare -----------------------------------------------------------------

def chunked(files, args, state):
    """documents in chunks of about CHUNK_CHARS; counts files' documents and bytes read"""
    texts, chars = [], 0
    for fi, path in enumerate(files):
        for text, pos in documents(path, args):
            state["pos"] = state["before"][fi] + pos
            if not text:
                state["empty"] += 1
                continue
            state["docs_per_file"][fi] += 1
            texts.append(text)
            chars += len(text) if isinstance(text, str) else sum(len(m["content"]) for m in text[1])
            if chars >= CHUNK_CHARS or len(texts) >= CHUNK_DOCS:
                yield texts
                texts, chars = [], 0
        state["pos"] = state["before"][fi + 1]
    if texts:
        yield texts


def chat_setup(args, tok):
    """--chat: the template and what it is rendered with, checked before any input is read"""
    if tok.kind == "bytes":
        fail("--chat: --tokenizer bytes has no chat template; give a Hugging Face folder that has one")
    if args.allow_special is False:
        fail("--chat with --no-allow-special: the chat template's own special tokens (<|im_start|>, ...) would be "
             "tokenized as text")
    text, origin = find_template(args.tokenizer)
    tpl = ChatTemplate(text, os.path.join(args.tokenizer, origin), special_token_strings(args.tokenizer, tok.tk))
    return tpl, origin


def prepare(args):
    chat = args.chat
    if args.allow_special is None:
        args.allow_special = chat  # a template writes <|im_start|> meaning the token
    if args.field is None:
        args.field = "messages" if chat else "text"
    if args.mask is not None and not chat:
        fail("--mask: a loss mask is for --chat data; plain text trains on every token")
    args.mask = args.mask or "assistant"
    tok = Tok(args.tokenizer, args.allow_special)
    tpl = origin = None
    if chat:
        tpl, origin = chat_setup(args, tok)
    if args.val_fraction < 0 or args.val_fraction >= 1:
        fail(f"--val-fraction {args.val_fraction}: expected a fraction in [0, 1)")
    if args.eot_id == "none":
        eot, eot_from = None, "none (--eot-id none)"
    elif args.eot_id is not None:
        try:
            eot = int(args.eot_id)
        except ValueError:
            fail(f"--eot-id {args.eot_id}: expected a token id or 'none'")
        eot_from = "--eot-id"
    elif chat:
        eot, eot_from = None, "none (--chat: the template ends each turn)"
    else:
        eot, eot_from = tok.eos, tok.eos_from
        if eot is None:
            fail(f"--tokenizer {args.tokenizer}: no eos token in tokenizer_config.json, generation_config.json or "
                 "config.json; give --eot-id ID (or --eot-id none: documents run into each other)")
    if eot is not None and not 0 <= eot < tok.vocab_size:
        fail(f"end-of-text id {eot} ({eot_from}) is outside the vocabulary of {tok.vocab_size} ids")
    bos = None
    if args.bos:
        if tok.bos is None:
            fail(f"--bos: the tokenizer {args.tokenizer} has no bos token")
        bos = tok.bos
    dtype = args.dtype if args.dtype != "auto" else ("uint16" if tok.vocab_size <= 65536 else "uint32")
    if dtype == "uint16" and tok.vocab_size > 65536:
        fail(f"--dtype uint16: the vocabulary has {tok.vocab_size} ids, more than uint16 holds; use uint32")
    workers = args.workers if args.workers is not None else len(os.sched_getaffinity(0))
    if workers < 1:
        fail(f"--workers {workers}: expected at least 1")
    files = input_files(args.inputs, chat)
    sizes = [os.path.getsize(p) for p in files]
    before = [0]
    for s in sizes:
        before.append(before[-1] + s)

    out = OutDir(args.out, args.force, OUR_FILES)
    _stop_on_signals()
    results = None
    try:
        w = {s: TokenWriter(out.path(s + ".bin.tmp"), dtype, args.format) for s in ("train", "val")}
        idx = {s: RawWriter(out.path(s + ".idx.tmp")) for s in ("train", "val")}
        masks = {s: RawWriter(out.path(s + ".mask.tmp")) for s in ("train", "val")} if chat else {}
        for s in idx:
            idx[s].write(u64(0))
        docs, targets, no_targets = {"train": 0, "val": 0}, {"train": 0, "val": 0}, {"train": 0, "val": 0}

        def put(split, doc):
            b, m, t = doc
            w[split].write(b)
            idx[split].write(u64(w[split].count))  # the document's end: the next one's start
            docs[split] += 1
            if chat:
                masks[split].write(m)
                targets[split] += t
                no_targets[split] += t == 0

        state = {"pos": 0, "before": before, "empty": 0, "docs_per_file": [0] * len(files)}
        bar = Progress(before[-1], args.progress or sys.stderr.isatty())
        threshold = int(args.val_fraction * 2**64)
        held, index, tokens = None, 0, 0  # the latest document, written once the next one comes
        init = (args.tokenizer, args.allow_special, dtype, bos, eot)
        if chat:
            init += ((tpl.text, tpl.origin, tpl.variables, args.mask),)
        results = ordered_map(_chat_chunk if chat else _encode_chunk, chunked(files, args, state), workers, init)
        for n, chunk in enumerate(results, 1):
            for d in chunk:
                if held is not None:
                    put(*held)
                held = ("val" if splitmix64(index) < threshold else "train", d)
                index += 1
                tokens += len(d[0]) // w["train"].width
            bar.show(state["pos"], tokens)
            _test_hook(n)
        results.close()
        if held is None:
            fail(f"no text in {', '.join(args.inputs)}: every document is empty")
        if args.val_fraction > 0 and docs["val"] == 0 and held[0] == "train" and index >= 2:
            held = ("val", held[1])  # at least one document validates
        put(*held)
        bar.show(before[-1], tokens, final=True)
        if docs["train"] == 0:
            fail(f"all {index} documents went to validation (--val-fraction {args.val_fraction}); nothing to train on")
        for s in ("train", "val"):
            for f in (w[s], idx[s]) + ((masks[s],) if chat else ()):
                f.close()
        splits = {}
        for s in ("train", "val"):
            named = {"file": s + ".bin", "index": s + ".idx"}
            if chat:
                named["mask"] = s + ".mask"
            if docs[s]:
                for f, name in zip((w[s], idx[s], masks.get(s)), named.values()):
                    os.rename(f.path, out.path(name))
                splits[s] = dict(named, documents=docs[s], tokens=w[s].count,
                                 bytes=os.path.getsize(out.path(s + ".bin")))
            else:
                for f in (w[s], idx[s], masks.get(s)):
                    if f is not None:
                        os.remove(f.path)
        import tokenizers

        manifest = {
            "format": "fsdp-token-manifest", "format_version": MANIFEST_FORMAT,
            "tool": f"scripts/prepare_data.py {TOOL_VERSION}", "tokenizers_version": tokenizers.__version__,
            "tokenizer": {"kind": tok.kind, "path": tok.path, "name": os.path.basename(tok.path), "sha256": tok.sha256},
            "vocab_size": tok.vocab_size, "eot_id": eot, "eot_from": eot_from, "bos_id": bos,
        "special_tokens_in_text": "tokens" if args.allow_special else "text",
            "dtype": dtype, "file_format": args.format,
            "split": {"val_fraction": args.val_fraction,
                      "rule": "document i (0-based, input order, empty ones skipped) validates when "
                              "splitmix64(i) / 2^64 < val_fraction; with none picked among two or more "
                              "documents, the last one validates"},
            "splits": splits,
            "index_format": "X.idx: documents + 1 little-endian uint64 token offsets into X.bin's tokens: 0, then "
                            "the end of each document (document i is tokens [idx[i], idx[i+1]))",
            "documents_empty_skipped": state["empty"],
            "field": args.field, "doc_separator": args.doc_separator,
            "inputs": [{"path": p, "bytes": s, "documents": d} for p, s, d in zip(files, sizes, state["docs_per_file"])],
        }
        if chat:
            manifest["chat"] = {
                "template_sha256": tpl.sha256, "template_from": origin, "jinja2_version": tpl.jinja2_version,
                "mask": args.mask, "generation_blocks": tpl.has_blocks,
                "mask_rule": ("every token" if args.mask == "all" else
                              "tokens overlapping the template's {% generation %} blocks" if tpl.has_blocks else
                              "tokens overlapping the text each assistant message adds to the rendering, trailing "
                              "whitespace left out"),
                "mask_format": "X.mask: one byte per token of X.bin, 1 where the token is a training target, else 0",
                "target_tokens": {s: targets[s] for s in splits},
                "masked_tokens": {s: splits[s]["tokens"] - targets[s] for s in splits},
                "documents_without_targets": sum(no_targets[s] for s in splits),
            }
        with open(out.path("manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        out.commit()
    finally:
        if results is not None:
            results.close()  # the workers end here when something failed
        out.cleanup()
    parts = ", ".join(f"{s} {v['documents']} document{'s' * (v['documents'] != 1)} {v['tokens']} tokens"
                      for s, v in splits.items())
    print(f"{PROG}: wrote {out.out}: {parts} ({dtype}, vocabulary {tok.vocab_size}, end of text "
          f"{'none' if eot is None else eot})", file=sys.stderr)
    if chat:
        c = manifest["chat"]
        print(f"{PROG}: --chat: template {origin}; mask {args.mask}"
              f"{' (generation blocks)' if args.mask == 'assistant' and tpl.has_blocks else ''}: "
              f"{sum(c['target_tokens'].values())} of {tokens} tokens are targets", file=sys.stderr)
        if c["documents_without_targets"]:
            print(f"{PROG}: --chat: {c['documents_without_targets']} conversation"
                  f"{'s' * (c['documents_without_targets'] != 1)} without an assistant turn (no targets; kept)",
                  file=sys.stderr)
    if "val" not in splits:
        print(f"{PROG}: no val.bin: {'--val-fraction 0' if args.val_fraction == 0 else 'one document'}; the trainer's "
              "data.val_fraction holds out the end of train.bin", file=sys.stderr)
    return 0


# ---- encode, decode ----------------------------------------------------------

def encode(args):
    tok = Tok(args.tokenizer)
    data = sys.stdin.buffer.read()
    ids = list(data) if tok.kind == "bytes" else tok.encode_batch([_utf8("stdin", data)])[0]
    if args.bos:
        if tok.bos is None:
            fail(f"--bos: the tokenizer {args.tokenizer} has no bos token")
        ids = [tok.bos] + ids
    sys.stdout.buffer.write((" ".join(map(str, ids)) + "\n").encode())
    return 0


def decode(args):
    tok = Tok(args.tokenizer)
    ids = []
    for n, word in enumerate(sys.stdin.read().split(), 1):
        try:
            i = int(word)
        except ValueError:
            fail(f"stdin: word {n} is {word[:20]!r}, not a token id")
        if not 0 <= i < tok.vocab_size:
            fail(f"stdin: word {n}: id {i} is outside the vocabulary of {tok.vocab_size} ids (0 to {tok.vocab_size - 1})")
        ids.append(i)
    out = tok.decode(ids)
    sys.stdout.buffer.write(out if isinstance(out, bytes) else out.encode("utf-8"))  # UTF-8 whatever the locale
    return 0


# ---- train-tokenizer -----------------------------------------------------------

SPECIAL = "<|end_of_text|>"


# train-tokenizer --chat-template NAME: a chat template written into
# tokenizer_config.json, its special tokens trained in (the ids after
# <|end_of_text|>), its end of turn an end-of-text id of generation_config.json
CHAT_TEMPLATES = {
    "chatml": {
        "tokens": ["<|im_start|>", "<|im_end|>"], "end_of_turn": "<|im_end|>",
        "template": "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                    "{% endif %}",
    },
}


def train_tokenizer(args):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if args.vocab_size < 257:
        fail(f"--vocab-size {args.vocab_size}: at least 257 (the 256 bytes and {SPECIAL})")
    files = input_files(args.inputs)
    out = OutDir(args.out, args.force, {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "generation_config.json"})
    _stop_on_signals()
    try:
        def texts():
            for p in files:
                for t, _ in documents(p, args):
                    if t:
                        yield t
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
        chat = CHAT_TEMPLATES.get(args.chat_template) if args.chat_template else None
        specials = [SPECIAL] + (chat["tokens"] if chat else [])
        trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, min_frequency=args.min_frequency, show_progress=False,
                                      special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tk.train_from_iterator(texts(), trainer)
        tk.save(out.path("tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL, "eos_token": SPECIAL,
                  "unk_token": None, "add_bos_token": False, "add_eos_token": False,
                  "clean_up_tokenization_spaces": False, "model_max_length": 1_000_000_000}
        # generate (ours and transformers') stops at the end-of-text id: a
        # model trained on data this tokenizer made carries the file along;
        # a chat template's end of turn stops it too
        eot = tk.token_to_id(SPECIAL)
        eos = eot
        if chat:
            config["chat_template"] = chat["template"]
            config["additional_special_tokens"] = chat["tokens"]
            eos = [eot, tk.token_to_id(chat["end_of_turn"])]
        for name, obj in (("tokenizer_config.json", config),
                          ("special_tokens_map.json", {"bos_token": SPECIAL, "eos_token": SPECIAL}),
                          ("generation_config.json", {"bos_token_id": eot, "eos_token_id": eos})):
            with open(out.path(name), "w") as f:
                json.dump(obj, f, indent=1)
                f.write("\n")
        out.commit()
    finally:
        out.cleanup()
    print(f"{PROG}: wrote {out.out}: a byte-level BPE of {tk.get_vocab_size(with_added_tokens=True)} ids "
          f"({', '.join(f'{t} = {tk.token_to_id(t)}' for t in specials)})"
          f"{'; chat template ' + args.chat_template if chat else ''}", file=sys.stderr)
    return 0


# ---- command line --------------------------------------------------------------

def _separator(s):
    # --doc-separator '\n\n': the shell passes the backslashes; these escapes are understood
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in "nt\\r":
            out.append({"n": "\n", "t": "\t", "\\": "\\", "r": "\r"}[s[i + 1]])
            i += 2
        else:
            out.append(s[i])
            i += 1
    if not out:
        raise argparse.ArgumentTypeError("an empty separator")
    return "".join(out)


def _input_options(p, chat=False):
    if chat:
        p.add_argument("--field", help="the text's field in JSONL, its column in parquet/Arrow (default: text; with "
                                       "--chat: the conversation's field, default messages)")
    else:
        p.add_argument("--field", default="text", help="the text's field in JSONL, its column in parquet/Arrow (default: text)")
    p.add_argument("--doc-separator", type=_separator, metavar="SEP",
                   help="split .txt/.md files into documents at SEP (\\n and \\t understood: '\\n\\n' splits at blank "
                        "lines); default: a text file is one document")


def parsers():
    tok_help = "a Hugging Face model folder with tokenizer.json, or 'bytes' (ids = the UTF-8 bytes, vocabulary 256)"
    main = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Tokenize text into the token files fsdp trains on: OUT/train.bin, OUT/val.bin (llm.c's format), "
                    "their document indexes OUT/train.idx, OUT/val.idx (little-endian uint64 token offsets: 0, then "
                    "each document's end), with --chat their loss masks OUT/train.mask, OUT/val.mask (a byte per "
                    "token, 1: a target), and OUT/manifest.json. Then: fsdprun -n N RECIPE.lua "
                    "data.token_file=OUT/train.bin data.val_token_file=OUT/val.bin",
        epilog="other commands (each has --help):\n"
               f"  {PROG} encode --tokenizer DIR|bytes [--bos]   UTF-8 text on stdin -> ids on one line\n"
               f"  {PROG} decode --tokenizer DIR|bytes           ids on stdin -> text\n"
               f"  {PROG} train-tokenizer --vocab-size N --out DIR INPUT...   a byte-level BPE tokenizer folder\n"
               "docs/TRAINING.md, 'Preparing your data', has the whole story.")
    main.add_argument("inputs", nargs="+", metavar="INPUT",
                      help="files (.txt, .md, .jsonl, .json, .parquet, .arrow, .txt.gz, .jsonl.gz) or folders of them")
    main.add_argument("--tokenizer", required=True, metavar="DIR|bytes", help=tok_help)
    main.add_argument("--out", "-o", required=True, metavar="OUT", help="the folder to write (must not exist, see --force; missing parent folders are made)")
    _input_options(main, chat=True)
    main.add_argument("--chat", action="store_true",
                      help="the inputs are conversations: JSONL (or parquet/Arrow) records whose 'messages' field is a "
                           "list of {\"role\", \"content\"} objects (Hugging Face datasets' format), each rendered by "
                           "the tokenizer folder's chat template (chat_template.jinja, or tokenizer_config.json's "
                           "chat_template) as transformers' apply_chat_template renders it (jinja2), tokenized with "
                           "the special tokens it writes taken as tokens: one document each, no end-of-text id "
                           "unless --eot-id; also writes OUT/train.mask and OUT/val.mask, the loss mask (--mask)")
    main.add_argument("--mask", choices=("assistant", "all"),
                      help="--chat's loss mask, one byte per token, 1 for a training target: assistant (default): "
                           "the assistant's turns, as the template's {%% generation %%} blocks mark them, else the "
                           "text each assistant message adds to the rendering (its end-of-turn token included, the "
                           "whitespace after it not); all: every token")
    main.add_argument("--eot-id", metavar="ID|none",
                      help="the end-of-text id after each document (default: the tokenizer's eos; bytes: 0; "
                           "--chat: none)")
    main.add_argument("--bos", action="store_true", help="the tokenizer's bos id before each document")
    main.add_argument("--allow-special", action=argparse.BooleanOptionalAction,
                      help="text spelling a special token (<|end_of_text|>) becomes that token (default: it is "
                           "ordinary text, as tiktoken's encode_ordinary; with --chat it is the token, as in "
                           "transformers' apply_chat_template)")
    main.add_argument("--val-fraction", type=float, default=0.01,
                      help="share of the documents for OUT/val.bin, chosen by a hash of their index (default 0.01)")
    main.add_argument("--workers", type=int,
                      help="processes that tokenize (default: every core this process may use); any count gives the "
                           "same bytes")
    main.add_argument("--dtype", choices=("auto", "uint16", "uint32"), default="auto",
                      help="token width (default auto: uint16 up to 65536 ids, else uint32)")
    main.add_argument("--format", choices=("llmc", "raw"), default="llmc",
                      help="llmc: llm.c's 1024-byte header (data.format = 'auto'); raw: headerless, as nanoGPT "
                           "(data.format = 'raw_u16' or 'raw_u32'; no 2^31-token limit)")
    main.add_argument("--force", action="store_true", help="replace OUT when it exists (only a folder of this tool's files)")
    main.add_argument("--progress", action="store_true", help="draw the progress line even when stderr is not a terminal")

    enc = argparse.ArgumentParser(prog=PROG + " encode", description="UTF-8 text on stdin -> its ids, space-separated, "
                                  "one line on stdout (no bos or eos unless --bos)")
    enc.add_argument("--tokenizer", required=True, metavar="DIR|bytes", help=tok_help)
    enc.add_argument("--bos", action="store_true", help="put the tokenizer's bos id first")
    dec = argparse.ArgumentParser(prog=PROG + " decode", description="space-separated ids on stdin -> the text on stdout "
                                  "(special tokens kept)")
    dec.add_argument("--tokenizer", required=True, metavar="DIR|bytes", help=tok_help)
    tr = argparse.ArgumentParser(prog=PROG + " train-tokenizer",
                                 description="train a byte-level BPE (Hugging Face tokenizers; deterministic for the same "
                                             f"inputs) with the special token {SPECIAL} as bos and eos; writes "
                                             "DIR/tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json "
                                             "(transformers' AutoTokenizer loads DIR)")
    tr.add_argument("inputs", nargs="+", metavar="INPUT", help="as for preparing: files or folders")
    tr.add_argument("--vocab-size", type=int, required=True, help="ids in all: 256 bytes, the special token, merges")
    tr.add_argument("--out", "-o", required=True, metavar="DIR", help="the folder to write (must not exist, see --force; missing parent folders are made)")
    tr.add_argument("--min-frequency", type=int, default=2, help="a pair seen fewer times is never merged (default 2)")
    tr.add_argument("--force", action="store_true", help="replace DIR when it exists (only a folder of this tool's files)")
    tr.add_argument("--chat-template", choices=sorted(CHAT_TEMPLATES),
                    help="write this chat template into tokenizer_config.json and train its special tokens in "
                         "(chatml: <|im_start|>, <|im_end|>; <|im_end|> also ends generation), so that `fsdp prepare "
                         "--chat` can render conversations with the folder")
    _input_options(tr)
    return {"prepare": (main, prepare), "encode": (enc, encode), "decode": (dec, decode),
            "train-tokenizer": (tr, train_tokenizer)}


def main(argv):
    # the tokenizer's own threads stay off: --workers processes use the cores
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    cmds = parsers()
    name = argv[0] if argv and argv[0] in cmds and argv[0] != "prepare" else "prepare"
    parser, fn = cmds[name]
    args = parser.parse_args(argv[1:] if name != "prepare" else argv)
    try:
        return fn(args)
    except UserError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        sig = e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT
        print(f"\n{PROG}: stopped by {signal.Signals(sig).name}; nothing written", file=sys.stderr)
        return 128 + sig
    except BrokenPipeError:
        return 1
    except OSError as e:  # an input that cannot be read, a full disk: the file and the reason
        print(f"{PROG}: {e.filename + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""hf_tokenizer.py DIR TEXT IDS: transformers' AutoTokenizer loads the
tokenizer of the Hugging Face folder DIR (an export of ours), encodes TEXT
to IDS (space-separated: the ids our side gives) and decodes them back to
TEXT. Exit 0 equal, 1 differ."""
import sys


def main(argv):
    from transformers import AutoTokenizer
    folder, text, want = argv[0], argv[1], [int(v) for v in argv[2].split()]
    t = AutoTokenizer.from_pretrained(folder)
    ids = t(text)["input_ids"]
    print("ids:", " ".join(map(str, ids)))
    if ids != want:
        print(f"FAILED: AutoTokenizer gives {ids}, ours {want}")
        return 1
    back = t.decode(ids)
    if back != text:
        print(f"FAILED: decoded back to {back!r}, not {text!r}")
        return 1
    print("AutoTokenizer: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

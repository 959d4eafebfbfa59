#!/usr/bin/env python3
"""make_chat_arith.py: writes chat_arith.jsonl beside it, the small chat file
recipes/sft_chat.lua fine-tunes on: conversations in Hugging Face's
`messages` format (role, content) about sums and differences of small
numbers, answered in one fixed style, some with a system prompt, some of
two turns. Deterministic (seeded): running it again gives the same bytes."""
import json
import os
import random

SYSTEMS = ["You are a careful calculator.", "Answer with one short sentence.", "You help with arithmetic."]
ASK = ["What is {a} plus {b}?", "How much is {a} + {b}?", "Add {a} and {b}.", "What is {a} minus {b}?",
       "How much is {a} - {b}?", "Take {b} from {a}."]


def turn(rng):
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    k = rng.randrange(len(ASK))
    if k >= 3:
        a, b = max(a, b), min(a, b)
        return ASK[k].format(a=a, b=b), f"{a} minus {b} is {a - b}."
    return ASK[k].format(a=a, b=b), f"{a} plus {b} is {a + b}."


def main():
    rng = random.Random(20261129)
    out = []
    for i in range(400):
        msgs = []
        if i % 3 == 0:
            msgs.append({"role": "system", "content": SYSTEMS[rng.randrange(len(SYSTEMS))]})
        for _ in range(2 if i % 4 == 1 else 1):
            q, a = turn(rng)
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        out.append(json.dumps({"messages": msgs}, ensure_ascii=False))
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_arith.jsonl"), "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

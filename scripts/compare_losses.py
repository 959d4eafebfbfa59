#!/usr/bin/env python3
"""compare_losses.py RUN.jsonl REF.jsonl TOL: whether two training runs
(their metrics files) took the same steps: per step, the loss and the grad
norm of RUN within relative TOL of REF's (the grad norm too, because AdamW
and clipping hide a gradient off by a constant factor from the loss alone).
Prints one line: "max rel loss X at step S, grad_norm Y at step T, N steps"
and exits 0 when within TOL, 1 when not, 2 when a file is missing, damaged
or the two have different steps (a run that stopped early)."""
import json
import sys


def steps_of(path):
    out = {}
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                try:
                    rec = json.loads(line)
                except ValueError:
                    raise SystemExit(f"{path}:{n}: not a JSON record")
                if "loss" in rec:  # the last record of a step wins (a resumed run's history)
                    out[rec["step"]] = (rec["loss"], rec.get("grad_norm"))
    except OSError as e:
        print(f"cannot read {path}: {e.strerror}")
        sys.exit(2)
    return out


def rel(a, b):
    if a is None or b is None:
        return float("inf")  # a non-finite value (written as null) is never close
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    run, ref, tol = steps_of(sys.argv[1]), steps_of(sys.argv[2]), float(sys.argv[3])
    if not ref or sorted(run) != sorted(ref):
        print(f"different steps: {len(run)} in {sys.argv[1]}, {len(ref)} in {sys.argv[2]}")
        sys.exit(2)
    worst = {0: (0.0, 0), 1: (0.0, 0)}
    for s in sorted(ref):
        for k in (0, 1):
            d = rel(run[s][k], ref[s][k])
            if d > worst[k][0] or d != d:
                worst[k] = (d, s)
    print("max rel loss %.1e at step %d, grad_norm %.1e at step %d, %d steps" %
          (worst[0][0], worst[0][1], worst[1][0], worst[1][1], len(ref)))
    sys.exit(0 if worst[0][0] <= tol and worst[1][0] <= tol else 1)


if __name__ == "__main__":
    main()

"""TensorBoard's side of tests/lua/test_tensorboard.lua: the event files
fsdp.tensorboard writes, read by the `tensorboard` package itself.

  test_tensorboard.py unit CASES BIN NONFINITE_DIR
      BIN (our TFRecords of the events CASES lists) equals, byte for byte,
      the same events serialized by TensorBoard's protobuf classes and
      framed by its RecordWriter; the event file in NONFINITE_DIR reads
      back nan, inf and -inf
  test_tensorboard.py compare TB_DIR METRICS.jsonl
      TB_DIR holds one event file, read to its end with every CRC checked;
      EventAccumulator finds each scalar of the JSONL under its tag, at the
      same steps, each step once, equal to the value rounded to float32

Prints what differs and exits 1; exits 0 when all holds.
"""
import glob
import io
import json
import math
import os
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.tensorflow_stub import errors
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New
from tensorboard.summary.writer.record_writer import RecordWriter

# the JSONL fields plotted, and their tags (docs/TRAINING.md)
TAGS = {
    "loss": "train/loss", "val_loss": "val/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
    "tokens_per_s": "train/tokens_per_s", "step_time_s": "train/step_time_s", "mfu": "train/mfu",
    "gemm_frac": "train/gemm_frac", "tokens": "train/tokens", "host_step_s": "train/host_step_s",
    "mem_bytes": "memory/peak_bytes", "mem_reserved_bytes": "memory/reserved_bytes",
}
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
bad = []


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def accumulate(d):
    ea = EventAccumulator(d, size_guidance={"scalars": 0})
    ea.Reload()
    return ea, {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


def unit(cases, binary, nonfinite_dir):
    out = io.BytesIO()
    w = RecordWriter(out)
    for line in open(cases):
        f = line.split()
        ev = event_pb2.Event(wall_time=float(f[0]), step=int(f[1]))
        if f[2] != "-":
            ev.file_version = f[2]
        for tag, v in zip(f[3::2], f[4::2]):
            ev.summary.value.add(tag=tag, simple_value=float(v))
        w.write(ev.SerializeToString())
    ours = open(binary, "rb").read()
    if ours != out.getvalue():
        at = next((i for i, (a, b) in enumerate(zip(ours, out.getvalue())) if a != b), min(len(ours), len(out.getvalue())))
        bad.append("unit: %d bytes written, TensorBoard's are %d; first difference at byte %d" % (len(ours), len(out.getvalue()), at))
    _, got = accumulate(nonfinite_dir)
    want = {"train/loss": math.nan, "train/grad_norm": math.inf, "train/lr": -math.inf, "val/loss": 1.5}
    for tag, v in want.items():
        if len(got.get(tag, [])) != 1 or got[tag][0][0] != 7 or not same(got[tag][0][1], v):
            bad.append("nonfinite: %s is %s, expected [(7, %r)]" % (tag, got.get(tag), v))


def strict_records(path):
    """every record of path, its CRCs checked (EventAccumulator stops
    silently at a bad one); the count, or a failure noted"""
    r = PyRecordReader_New(path.encode(), 0, b"", None)
    n = 0
    while True:
        try:
            r.GetNext()
        except errors.OutOfRangeError:
            return n
        except errors.DataLossError as e:
            bad.append("%s: record %d: %s" % (path, n + 1, e))
            return n
        n += 1


def compare(d, metrics):
    files = sorted(glob.glob(os.path.join(d, "*tfevents*")))
    if len(files) != 1:
        bad.append("%s: %d event files, expected 1: %s" % (d, len(files), files))
    records = sum(strict_records(f) for f in files)
    want = {}
    lines = 0
    for line in open(metrics):
        rec = json.loads(line)
        lines += 1
        for field, v in rec.items():
            if field in TAGS and (v is not None or field in rec.get("nonfinite", {})):
                v = NONFINITE[rec["nonfinite"][field]] if v is None else v
                want.setdefault(TAGS[field], []).append((rec["step"], f32(v)))
    if records != lines + 1:
        bad.append("%s: %d records, expected %d (the file version and one per metrics line)" % (d, records, lines + 1))
    ea, got = accumulate(d)
    if ea.file_version != 2.0:
        bad.append("file_version %r, expected brain.Event:2" % ea.file_version)
    for tag in sorted(set(want) | set(got)):
        w, g = want.get(tag, []), got.get(tag, [])
        steps = [s for s, _ in g]
        if len(set(steps)) != len(steps):
            bad.append("%s: steps more than once: %s" % (tag, steps))
        if [s for s, _ in w] != steps:
            bad.append("%s: steps %s, the metrics' %s" % (tag, steps, [s for s, _ in w]))
        else:
            for (s, a), (_, b) in zip(g, w):
                if not same(a, b):
                    bad.append("%s step %d: %r, the metrics' %r as float32" % (tag, s, a, b))
    print("compare %s: %d tags, %d scalars" % (d, len(got), sum(len(v) for v in got.values())))


if __name__ == "__main__":
    {"unit": unit, "compare": compare}[sys.argv[1]](*sys.argv[2:])
    for b in bad:
        print("FAILED:", b)
    sys.exit(1 if bad else 0)

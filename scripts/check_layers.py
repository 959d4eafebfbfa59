#!/usr/bin/env python3
"""check_layers.py: the engine's layers hold (docs/ARCHITECTURE.md).

Lists every `#include "..."` of the C, CUDA and C++ files in src/,
kernels/ and launcher/, gives each file a layer by where it is, and fails
on an include that reaches up (a file may include only files of its own
layer or below), on any cycle of includes, and on a file that has no layer
(a new folder or public header must be given its place here first).

  base 0 < device 1 = kernels 1 < dist 2 < shard 3 < ops 4 < io 5 < api 6 < launcher 7

kernels/ sits beside device: the CUDA backend library is the device
layer's CUDA files and the kernels, which use each other (a stream's
delay is a kernel; the kernels run on the device's streams); both are
below dist and shard, which run kernels through the device layer's table.

The public headers belong to their layer (src/fsdp_base.h to base,
src/fsdp_device.h to device, ...); src/fsdp.h, which includes them all, is
the api layer's, for users: nothing inside the engine includes it.

An include is looked up beside the file, then in src/ (the include path
of every target).

  scripts/check_layers.py [--list] [--root DIR]
    --list  print every include between files of the engine, with their layers
    --root  check another tree (default: this script's repository)
Exit status 1 with one line per fault, 0 when there is none.
"""
import os
import re
import sys

ORDER = ["base", "device", "dist", "shard", "ops", "io", "api", "launcher"]
RANK = {name: i for i, name in enumerate(ORDER)}
RANK["kernels"] = RANK["device"]
PUBLIC = {"fsdp_base.h": "base", "fsdp_device.h": "device", "fsdp_kernels.h": "kernels", "fsdp_dist.h": "dist",
          "fsdp_shard.h": "shard", "fsdp_ops.h": "ops", "fsdp_io.h": "io", "fsdp.h": "api"}
TOPS = ("src", "kernels", "launcher")
SOURCES = (".c", ".h", ".cu", ".cuh", ".cpp")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(rel):
    """the layer of a file (path relative to the root), None if it has none"""
    parts = rel.split("/")
    if parts[0] in ("kernels", "launcher"):
        return parts[0]
    if parts[0] == "src":
        if len(parts) == 2:
            return PUBLIC.get(parts[1])
        if parts[1] in RANK:
            return parts[1]
    return None


def files(root):
    for top in TOPS:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs.sort()
            for n in sorted(names):
                if n.endswith(SOURCES):
                    yield os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/")


def resolve(root, rel, name):
    """the file an include names, relative to root, or None (a system header)"""
    for base in (os.path.dirname(os.path.join(root, rel)), os.path.join(root, "src")):
        target = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(target):
            return os.path.relpath(target, root).replace(os.sep, "/")
    return None


def cycles(graph):
    """every include cycle, once each, as a list of files"""
    found, state, stack = [], {}, []

    def visit(f):
        state[f] = 1
        stack.append(f)
        for g in graph.get(f, ()):
            if state.get(g) == 1:
                found.append(stack[stack.index(g):] + [g])
            elif g not in state:
                visit(g)
        stack.pop()
        state[f] = 2

    for f in sorted(graph):
        if f not in state:
            visit(f)
    return found


def check(root, listing=False, out=sys.stdout):
    """the faults of the tree at root, as lines; prints the listing if asked"""
    bad, edges, graph = [], 0, {}
    for rel in files(root):
        src = layer_of(rel)
        if src is None:
            bad.append(f"{rel}: has no layer (scripts/check_layers.py places src/<layer>/, the public headers, "
                       f"kernels/ and launcher/)")
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = resolve(root, rel, m.group(1))
                if target is None:
                    continue
                graph.setdefault(rel, []).append(target)
                dst = layer_of(target)
                if dst is None:
                    continue  # outside the engine (tests/emu, .deps): not a layer
                edges += 1
                if listing:
                    print(f"{rel}:{lineno}: {src} -> {dst} ({m.group(1)})", file=out)
                if RANK[dst] > RANK[src]:
                    bad.append(f"{rel}:{lineno}: {src} includes {m.group(1)}, of the {dst} layer above it")
    loops = cycles(graph)
    bad += ["include cycle: " + " -> ".join(c) for c in loops]
    return bad, edges, len(loops)


def main(argv):
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if "--root" in argv:
        i = argv.index("--root")
        if i + 1 >= len(argv):
            print("check_layers: --root needs a directory", file=sys.stderr)
            return 2
        root = argv[i + 1]
    if not os.path.isdir(os.path.join(root, "src")):
        print(f"check_layers: {root} has no src/", file=sys.stderr)
        return 2
    bad, edges, loops = check(root, listing="--list" in argv)
    for b in bad:
        print(b)
    upward = sum(1 for b in bad if " above it" in b)
    print(f"check_layers: {edges} includes between layers, {upward} upward, {loops} cycles, "
          f"{len(bad) - upward - loops} files without a layer", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

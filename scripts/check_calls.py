#!/usr/bin/env python3
"""check_calls.py: no two files of the engine or the launcher call each other.

check_layers.py holds the includes to the layers; this holds the calls.
From a build's object files (nm: the functions each defines and the ones
it calls), a file calls another when it uses a symbol the other defines. A
circle of such calls among the files of src/, kernels/ and launcher/
(boot.c calling comm.c calling boot.c) means neither can be read, tested
or changed alone: it fails, naming the files and the functions of each
edge. Files of one library only (the linker resolves the rest).

  scripts/check_calls.py BUILD_DIR      the objects of libfsdp, libfsdp_cuda and fsdprun there
  scripts/check_calls.py FILE.o ...     these objects, as one library (the checker's own test)
Exit status 1 with the circles, 0 when there is none.
"""
import collections
import glob
import os
import subprocess
import sys

TARGETS = ("fsdp.dir", "fsdp_cuda.dir", "fsdprun.dir")


def objects(args):
    """{library: [(file name, object path)]}"""
    if len(args) == 1 and os.path.isdir(args[0]):
        libs = {}
        for t in TARGETS:
            top = os.path.join(args[0], "CMakeFiles", t)
            objs = sorted(glob.glob(os.path.join(top, "**", "*.o"), recursive=True))
            libs[t] = [(os.path.relpath(o, top)[:-2], o) for o in objs]
        return libs
    return {"objects": [(os.path.basename(o)[:-2], o) for o in args]}


def graph_of(objs):
    defs, uses = {}, collections.defaultdict(set)
    for name, path in objs:
        out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBRW":
                defs[parts[2]] = name
            elif len(parts) == 2 and parts[0] == "U":
                uses[name].add(parts[1])
    graph = collections.defaultdict(dict)
    for f, used in uses.items():
        for sym in used:
            g = defs.get(sym)
            if g and g != f:
                graph[f].setdefault(g, []).append(sym)
    return graph


def circles(graph):
    """the strongly connected components of more than one file (Tarjan)"""
    index, low, on, stack, found, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    bad = 0
    for lib, objs in objects(argv).items():
        if not objs:
            continue
        graph = graph_of(objs)
        for comp in circles(graph):
            bad += 1
            print(f"{lib}: a call circle among {', '.join(comp)}:")
            for f in comp:
                for g in sorted(graph[f]):
                    if g in comp:
                        print(f"  {f} calls {g}: {', '.join(sorted(graph[f][g])[:5])}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
